//! The operator crate's one error enum.

/// Errors of the operator's library half.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--node-selector` could not be parsed or uses what is not supported; names the
    /// whole input and the requirement at fault.
    #[error("invalid --node-selector {input:?}: {reason}")]
    NodeSelector { input: String, reason: String },
}
