//! GPU and network profiles, kernel efficiency tables and the cost queries planners and the
//! simulator share.

/// A hardware profile (placeholder until the loader lands).
#[derive(Debug, Clone, PartialEq)]
pub struct Hardware {
    /// Profile name.
    pub name: String,
}
