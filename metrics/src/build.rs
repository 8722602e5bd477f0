//! What `tidepool_build_info` says of a binary: its version and the commit it was built from.

/// A binary's version and commit, as [`crate::record::build_info`] exports them. Made by
/// [`crate::build_info!`] in the binary's own crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildInfo {
    /// The crate's Cargo version.
    pub version: &'static str,
    /// The abbreviated commit, or `unknown` when built outside a git checkout.
    pub commit: &'static str,
}

/// The calling crate's [`BuildInfo`]: its `CARGO_PKG_VERSION`, and the `TIDEPOOL_COMMIT` its
/// build script sets (operator/build.rs, which the agent's package uses too). A macro, so
/// that both are read where the binary is compiled.
#[macro_export]
macro_rules! build_info {
    () => {
        $crate::BuildInfo {
            version: env!("CARGO_PKG_VERSION"),
            commit: env!("TIDEPOOL_COMMIT"),
        }
    };
}
