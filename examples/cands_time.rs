use fcp::hardware::Hardware;
use fcp::plan::Mask;
use fcp::planners::{hybrid, Fcp, PlanContext};
use fcp::sim::ComputeModel;
use fcp::trace::{pack, PackMode, PackOptions, Trace};
use fcp::Model;
use std::time::Instant;
fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let trace = Trace::from_csv_str(&std::fs::read_to_string(&a[0]).unwrap()).unwrap();
    let ranks: u32 = a[1].parse().unwrap();
    let hw = Hardware::load(&a[2]).unwrap();
    let model = Model::load("llama3-70b").unwrap();
    let packed = pack(
        &trace,
        &PackOptions {
            mode: PackMode::Budget,
            ranks,
            tokens_per_rank: 32768,
            context: None,
        },
    )
    .unwrap();
    let batch = &packed.batches[0];
    let ctx = PlanContext {
        ranks,
        tokens_per_rank: 32768,
        mask: Mask::Causal,
        model: &model,
        hardware: &hw,
    };
    let profile = hw.kernel_profile().unwrap();
    let mut cm = ComputeModel::new(&hw, &profile, &model);
    for block in [2048u64, 4096] {
        for relay in [false, true] {
            let f = Fcp {
                block,
                relay,
                ..Fcp::default()
            };
            let t0 = Instant::now();
            let d = f.distribute(batch, &ctx).unwrap();
            let t1 = Instant::now();
            let nrep = Fcp { repair: false, ..f }.distribute(batch, &ctx).unwrap();
            let t1b = Instant::now();
            let p = f.build(batch, &ctx, &d.assignment.owned, d.cap, |_| {});
            let t2 = Instant::now();
            let e = hybrid::estimate(&p, &ctx, &mut cm).unwrap();
            let t3 = Instant::now();
            let e2 = hybrid::estimate(&p, &ctx, &mut cm).unwrap();
            let t4 = Instant::now();
            let _ = (nrep, e2);
            println!("block {block} relay {relay}: distribute {:.1} ms (no repair {:.1}) build {:.1} estimate {:.1} (warm {:.1}) est {:.1}",
          (t1-t0).as_secs_f64()*1e3, (t1b-t1).as_secs_f64()*1e3, (t2-t1b).as_secs_f64()*1e3, (t3-t2).as_secs_f64()*1e3, (t4-t3).as_secs_f64()*1e3, e*1e3);
        }
    }
}
