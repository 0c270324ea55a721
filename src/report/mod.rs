//! Comparing schemes and rendering results for people (tables, plots) and programs (JSON, CSV).

mod ablation;
mod compare;
pub mod plot;
mod stats;
mod table;
pub mod validate;

pub use ablation::{ablation, ablation_table, AblationRow, ABLATION_STEPS};
pub use compare::{
    compare, parse_scheme_list, price_steps, CompareOptions, CompareRow, PricedSteps, StepsSummary,
};
pub use stats::{mean, percentile};
pub use table::{
    compare_csv, compare_table, fits_word, human_bytes, rate, shown, shown_when_long, tenths,
    trimmed,
};
pub use validate::{validate, Measured, ValidateError, ValidationReport};
