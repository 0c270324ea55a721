//! `fcp verify`: check a plan file. Exit 0 valid, 1 invalid, 2 unreadable.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde_json::json;

use fcp::plan::{check_numeric, verify, NumericOptions, Plan};

use super::Exit;

/// Arguments of `fcp verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Plan file (`-` for stdin).
    plan: PathBuf,
    /// Also execute the plan on small random tensors and compare with dense attention.
    #[arg(long)]
    numeric: bool,
    /// Numeric check: at most this many query rows per document (boundary rows always).
    #[arg(long, default_value_t = 2048)]
    max_rows: usize,
    /// Numeric check: failure threshold on the max absolute error (f64).
    #[arg(long, default_value_t = 1e-9)]
    tolerance: f64,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: VerifyArgs) -> Result<()> {
    if !(a.tolerance.is_finite() && a.tolerance >= 0.0) {
        anyhow::bail!("--tolerance must be a number ≥ 0, got {}", a.tolerance);
    }
    let plan = Plan::load(&a.plan)?;
    let violations = verify(&plan);
    // Only run tensors through a plan that is structurally sound.
    let numeric = (a.numeric && violations.is_empty())
        .then(|| {
            check_numeric(
                &plan,
                &NumericOptions {
                    max_rows_per_doc: a.max_rows,
                    ..NumericOptions::default()
                },
            )
        })
        .transpose()?;
    let numeric_ok = numeric
        .as_ref()
        .is_none_or(|r| r.max_abs_error <= a.tolerance);
    let valid = violations.is_empty() && numeric_ok;
    if a.json {
        let out = json!({
            "valid": valid,
            "scheme": plan.scheme.name,
            "violations": violations.iter().map(|v| json!({"kind": format!("{:?}", v.kind), "message": v.message})).collect::<Vec<_>>(),
            "numeric": numeric.as_ref().map(|r| json!({
                "max_abs_error": r.max_abs_error,
                "rows_checked": r.rows_checked,
                "rows_distinct": r.rows_distinct,
                "rows_total": r.rows_total,
                "rows_uncovered": r.rows_uncovered,
                "tolerance": a.tolerance,
            })),
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for v in &violations {
            outln!("violation: {v}");
        }
        if let Some(r) = &numeric {
            outln!(
                "numeric: max abs error {:.3e} over {} of {} query rows{} (tolerance {:.0e}){}",
                r.max_abs_error,
                r.rows_distinct,
                r.rows_total,
                if r.rows_checked > r.rows_distinct {
                    format!(", {} checks of a row and a head segment", r.rows_checked)
                } else {
                    String::new()
                },
                a.tolerance,
                if r.rows_uncovered > 0 {
                    format!(", {} rows got no output", r.rows_uncovered)
                } else {
                    String::new()
                }
            );
        }
        outln!(
            "{}: {} ({} ranks, {} docs, {} tasks, {} transfers{}){}",
            a.plan.display(),
            if valid { "valid" } else { "INVALID" },
            plan.num_ranks,
            plan.documents.len(),
            plan.num_tasks(),
            plan.transfers.len(),
            super::common::receivers(&plan),
            if violations.is_empty() {
                String::new()
            } else {
                format!(", {} violations", violations.len())
            }
        );
    }
    if valid {
        Ok(())
    } else {
        Err(Exit(1).into())
    }
}
