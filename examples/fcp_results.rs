//! Regenerates the tables of `docs/results/fcp.md` from the simulator.
//!
//! ```text
//! cargo run --release --example fcp_results -- imbalance [--batches 2] [--traces magi,wlb-llm,lognormal]
//!     [--ranks 16,64,128,256] [--blocks 1024,2048,4096,8192] [--spec fcp]
//! cargo run --release --example fcp_results -- scaling [--batches 1] [--traces magi]
//!     [--ranks 16,64,128,256] [--schemes fcp,ring,zigzag,bytescale,magi,llama3]
//! ```
//!
//! Batches come from `fcp::trace::generate(source, docs, seed 1)` packed with `--pack budget`
//! at 32K tokens per rank (the FCP paper's setting, §6.1), on h100 / llama3-70b, causal — the
//! same batches `fcp compare --trace <generated file> --ranks N` plans.

use std::time::Instant;

use fcp::hardware::Hardware;
use fcp::plan::Mask;
use fcp::planners::{planner_for, Fcp, PlanContext, SchemeSpec};
use fcp::sim::{PassSel, Simulator};
use fcp::trace::{generate, pack, Batch, PackMode, PackOptions, Source};
use fcp::Model;

const TPR: u64 = 32 * 1024;

fn arg(args: &[String], key: &str, default: &str) -> String {
    args.windows(2)
        .find(|w| w[0] == key)
        .map_or(default.to_string(), |w| w[1].clone())
}

fn list<T: std::str::FromStr>(s: &str) -> Vec<T> {
    s.split(',').filter_map(|x| x.trim().parse().ok()).collect()
}

/// The first `k` budget-packed batches of a generated trace.
pub fn batches(source: &str, ranks: u32, k: usize) -> Vec<Batch> {
    let src = Source::from_name(source).unwrap();
    let budget = ranks as u64 * TPR;
    let docs = (budget as usize * (k + 1) / 1500).max(1000);
    let trace = generate(&src, docs, 1).unwrap();
    let packed = pack(
        &trace,
        &PackOptions {
            mode: PackMode::Budget,
            ranks,
            tokens_per_rank: TPR,
            context: None,
        },
    )
    .unwrap();
    packed.batches.into_iter().take(k).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().cloned().unwrap_or_default();
    let nb: usize = arg(&args, "--batches", "2").parse().unwrap();
    let traces: Vec<String> = list(&arg(&args, "--traces", "magi,wlb-llm,lognormal"));
    let ranks: Vec<u32> = list(&arg(&args, "--ranks", "16,64,128,256"));
    let hw = Hardware::load("h100").unwrap();
    let model = Model::load("llama3-70b").unwrap();
    let sim = Simulator::new(hw.clone(), model.clone()).unwrap();
    match mode.as_str() {
        "imbalance" => {
            let blocks: Vec<u64> = list(&arg(&args, "--blocks", "1024,2048,4096,8192"));
            let spec = arg(&args, "--spec", "fcp");
            // Diagnostic: plan with a looser per-rank token cap than the batches were packed
            // for (does the cap bound the balance?).
            let slack: f64 = arg(&args, "--cap-slack", "0").parse().unwrap();
            println!("| trace | N | block | compute_imb | comm_imb | f_imb (LPT) | heaviest-block bound | attn ms | MFU | plan ms |");
            println!("|---|---|---|---|---|---|---|---|---|---|");
            for t in &traces {
                for &n in &ranks {
                    let bs = batches(t, n, nb);
                    for &block in &blocks {
                        let ctx = PlanContext {
                            ranks: n,
                            tokens_per_rank: (TPR as f64 * (1.0 + slack)) as u64,
                            mask: Mask::Causal,
                            model: &model,
                            hardware: &hw,
                            judge: fcp::planners::Judge::default(),
                        };
                        let mut f = Fcp::from_spec(&SchemeSpec::parse(&spec).unwrap()).unwrap();
                        f.block = block;
                        let (mut ci, mut cm, mut fi, mut bnd, mut ms, mut mfu, mut pm) =
                            (0.0, 0.0, 0.0, 0.0f64, 0.0, 0.0, 0.0);
                        for b in &bs {
                            let t0 = Instant::now();
                            let plan = fcp::planners::Planner::plan(&f, b, &ctx).unwrap();
                            pm += t0.elapsed().as_secs_f64() * 1e3;
                            let d = f.distribute(b, &ctx).unwrap();
                            let loads = &d.assignment.loads;
                            let mean = loads.iter().sum::<f64>() / loads.len() as f64;
                            let top = d.heaviest_unit.max(mean);
                            bnd = bnd.max((top - mean) / top);
                            fi += fcp::plan::imbalance(loads);
                            let r = sim.simulate(&plan, PassSel::Both).unwrap();
                            ci += r.metrics.compute_imbalance;
                            cm += r.metrics.comm_imbalance;
                            ms += r.metrics.attention_time_ms;
                            mfu += r.metrics.mfu;
                        }
                        let k = bs.len() as f64;
                        println!(
                            "| {t} | {n} | {}K | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.3} | {:.1} |",
                            block / 1024,
                            ci / k,
                            cm / k,
                            fi / k,
                            bnd,
                            ms / k,
                            mfu / k,
                            pm / k
                        );
                    }
                }
            }
        }
        "scaling" => {
            let schemes: Vec<String> =
                arg(&args, "--schemes", "fcp,ring,zigzag,bytescale,magi,llama3")
                    .split(';')
                    .flat_map(|s| fcp::report::parse_scheme_list(&[s.to_string()]).unwrap())
                    .collect();
            for t in &traces {
                println!("\n{t}: attention MFU (fwd+bwd), mean over {nb} batch(es)\n");
                println!("| N | {} |", schemes.join(" | "));
                println!("|---|{}", "---|".repeat(schemes.len()));
                for &n in &ranks {
                    let bs = batches(t, n, nb);
                    let ctx = PlanContext {
                        ranks: n,
                        tokens_per_rank: TPR,
                        mask: Mask::Causal,
                        model: &model,
                        hardware: &hw,
                        judge: fcp::planners::Judge::default(),
                    };
                    let mut row = format!("| {n} |");
                    for s in &schemes {
                        let p = planner_for(s).unwrap();
                        let t0 = Instant::now();
                        let mut mfu = 0.0;
                        let mut ok = true;
                        for b in &bs {
                            match p.plan(b, &ctx).map_err(|e| e.to_string()).and_then(|plan| {
                                sim.simulate(&plan, PassSel::Both)
                                    .map_err(|e| e.to_string())
                            }) {
                                Ok(r) => mfu += r.metrics.mfu,
                                Err(e) => {
                                    eprintln!("{s} N={n}: {e}");
                                    ok = false;
                                }
                            }
                        }
                        eprintln!("{t} {s} N={n}: {:.1} s", t0.elapsed().as_secs_f64());
                        if ok {
                            row += &format!(" {:.3} |", mfu / bs.len() as f64);
                        } else {
                            row += " – |";
                        }
                    }
                    println!("{row}");
                }
            }
        }
        "debug" => {
            let n = ranks[0];
            let block: u64 = arg(&args, "--block", "4096").parse().unwrap();
            let spec = arg(&args, "--spec", "fcp");
            let bs = batches(&traces[0], n, 1);
            let ctx = PlanContext {
                ranks: n,
                tokens_per_rank: TPR,
                mask: Mask::Causal,
                model: &model,
                hardware: &hw,
                judge: fcp::planners::Judge::default(),
            };
            let mut f = Fcp::from_spec(&SchemeSpec::parse(&spec).unwrap()).unwrap();
            f.block = block;
            let plan = fcp::planners::Planner::plan(&f, &bs[0], &ctx).unwrap();
            let d = f.distribute(&bs[0], &ctx).unwrap();
            {
                use fcp::planners::fcp::blocks;
                let b = &bs[0];
                let mut units = blocks::make_units(b, block, Mask::Causal);
                blocks::set_comm(&mut units, &b.doc_lens, block, Mask::Causal);
                let mut c: Vec<f64> = units.iter().map(|u| u.comm).collect();
                let mc = c.iter().sum::<f64>() / n as f64;
                c.sort_by(|a, b| b.total_cmp(a));
                let mut lens = b.doc_lens.clone();
                lens.sort_unstable_by(|a, b| b.cmp(a));
                println!(
                    "top unit comm / mean rank comm: {:?}; longest docs {:?}",
                    c.iter().take(5).map(|x| x / mc).collect::<Vec<_>>(),
                    &lens[..5]
                );
            }
            let r = sim.simulate(&plan, PassSel::Both).unwrap();
            let est = &d.assignment.comm;
            let me = est.iter().sum::<f64>() / est.len() as f64;
            let bytes: Vec<f64> = r
                .ranks
                .iter()
                .map(|x| (x.bytes_sent + x.bytes_recv) as f64)
                .collect();
            let mb = bytes.iter().sum::<f64>() / bytes.len() as f64;
            let ml = d.assignment.loads.iter().sum::<f64>() / est.len() as f64;
            for i in 0..est.len() {
                println!(
                    "{i:4} est {:.2} sim {:.2} load {:.2} tokens {}",
                    est[i] / me,
                    bytes[i] / mb,
                    d.assignment.loads[i] / ml,
                    d.assignment.tokens[i]
                );
            }
        }
        "time" => {
            // Median planning time per spec (one core), for quick A/B of planner options.
            let specs: Vec<String> = arg(&args, "--specs", "fcp")
                .split(';')
                .map(String::from)
                .collect();
            for t in &traces {
                for &n in &ranks {
                    let b = &batches(t, n, 1)[0];
                    let ctx = PlanContext {
                        ranks: n,
                        tokens_per_rank: TPR,
                        mask: Mask::Causal,
                        model: &model,
                        hardware: &hw,
                        judge: fcp::planners::Judge::default(),
                    };
                    for spec in &specs {
                        let f = Fcp::from_spec(&SchemeSpec::parse(spec).unwrap()).unwrap();
                        let mut ms: Vec<f64> = (0..7)
                            .map(|_| {
                                let t0 = Instant::now();
                                if args.iter().any(|a| a == "--distribute") {
                                    f.distribute(b, &ctx).unwrap();
                                } else {
                                    fcp::planners::Planner::plan(&f, b, &ctx).unwrap();
                                }
                                t0.elapsed().as_secs_f64() * 1e3
                            })
                            .collect();
                        ms.sort_by(f64::total_cmp);
                        println!("{t} N={n} {spec}: median {:.1} ms", ms[3]);
                    }
                }
            }
        }
        _ => eprintln!("usage: fcp_results imbalance|scaling [options] (see the file's header)"),
    }
}
