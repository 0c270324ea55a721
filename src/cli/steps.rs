//! `--steps S`: how many windows a stretch of S training steps takes, and what is priced when
//! the trace holds fewer. Shared by `fcp compare` and `fcp tpcp`, so both count, refuse and
//! say the same things.

use anyhow::{bail, Result};

use super::common::plural;

/// Default `--batches` without `--steps`.
pub const DEFAULT_BATCHES: usize = 4;

/// The windows to plan: `--batches` (default [`DEFAULT_BATCHES`]), or with `--steps` every
/// step's windows (`micro-batches × dp` each, `step`). An explicit `--batches` that is not
/// that many is refused: the steps would share or skip windows.
pub fn batches_wanted(
    batches: Option<usize>,
    steps: Option<usize>,
    step: Option<(u32, u32)>,
) -> Result<usize> {
    let (Some(s), Some((m, dp))) = (steps, step) else {
        return Ok(batches.unwrap_or(DEFAULT_BATCHES));
    };
    let per = u64::from(m) * u64::from(dp);
    let all = usize::try_from((s as u64).saturating_mul(per)).unwrap_or(usize::MAX);
    match batches {
        Some(b) if b != all => bail!(
            "--steps {s} prices {s} steps of {per} windows each (--micro-batches {m} × --dp {dp}): --batches must be {all}, or left out"
        ),
        _ => Ok(all),
    }
}

/// Keep the whole steps of `per` windows that the packed trace holds, up to `steps`, and
/// say so when it holds fewer than asked: the last part-step's windows are left out rather
/// than priced as a step of repeated windows. With no whole step, the windows stay as they
/// are (one step drawn from them in turn, as without `--steps`). `unit` names a window
/// (singular, plural) as the command calls it. Returns the steps priced.
pub fn whole_steps<T>(
    windows: &mut Vec<T>,
    steps: usize,
    per: usize,
    from: usize,
    unit: (&str, &str),
) -> usize {
    let whole = windows.len() / per.max(1);
    if whole >= steps {
        return steps;
    }
    let from = from_words(from);
    if whole == 0 {
        eprintln!(
            "note: the trace holds {}{from}, short of one step's {per}: one step is priced, its {} drawn in turn",
            plural(windows.len() as u32, unit.0, unit.1),
            unit.1
        );
        return 1;
    }
    let left = windows.len() - whole * per;
    eprintln!(
        "note: the trace holds {}{from}: {} of {per} priced, not {steps}{}",
        plural(windows.len() as u32, unit.0, unit.1),
        plural(whole as u32, "whole step", "whole steps"),
        if left > 0 {
            format!(
                " (the last {} left out)",
                plural(left as u32, unit.0, unit.1)
            )
        } else {
            String::new()
        }
    );
    windows.truncate(whole * per);
    whole
}

/// The note when a step of `needed` windows (`per` micro-batches on each of `dp` replicas)
/// trains only the first of the `simulated` ones (`unit`: what they are called): the other
/// columns cover them all.
pub fn first_windows_note(needed: u64, simulated: usize, per: u32, dp: u32, unit: &str) {
    if simulated as u64 > needed {
        eprintln!(
            "note: the step trains the first {needed} of the {simulated} {unit} (--micro-batches {per} × --dp {dp}); the table's other columns cover them all"
        );
    }
}

/// ` from batch K` after a count of batches, when the comparison starts past the first.
pub fn from_words(from: usize) -> String {
    if from > 0 {
        format!(" from batch {from}")
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_set_the_batches_and_refuse_another_count() {
        assert_eq!(batches_wanted(None, None, None).unwrap(), DEFAULT_BATCHES);
        assert_eq!(batches_wanted(Some(7), None, Some((4, 2))).unwrap(), 7);
        // --steps without a step to repeat is clap's to refuse; here it changes nothing.
        assert_eq!(batches_wanted(Some(7), Some(3), None).unwrap(), 7);
        assert_eq!(batches_wanted(None, Some(3), Some((4, 2))).unwrap(), 24);
        assert_eq!(batches_wanted(Some(24), Some(3), Some((4, 2))).unwrap(), 24);
        let e = batches_wanted(Some(23), Some(3), Some((4, 2))).unwrap_err();
        assert!(e.to_string().contains("--batches must be 24"), "{e}");
        // No overflow on absurd counts: the trace runs out first.
        assert_eq!(
            batches_wanted(None, Some(usize::MAX), Some((u32::MAX, u32::MAX))).unwrap(),
            usize::MAX
        );
    }

    #[test]
    fn a_trace_short_of_the_steps_keeps_its_whole_steps() {
        let unit = ("batch", "batches");
        let mut b: Vec<usize> = (0..11).collect();
        assert_eq!(whole_steps(&mut b, 5, 4, 0, unit), 2);
        assert_eq!(b.len(), 8);
        let mut b: Vec<usize> = (0..3).collect();
        assert_eq!(whole_steps(&mut b, 5, 4, 0, unit), 1);
        assert_eq!(b.len(), 3);
        let mut b: Vec<usize> = (0..20).collect();
        assert_eq!(whole_steps(&mut b, 5, 4, 0, unit), 5);
        assert_eq!(b.len(), 20);
    }
}
