//! Reconcile against the container runtime (DESIGN.md "Node agent"): an allocation whose
//! sandbox is gone without a DEL (a runtime that lost it, containerd#5768; a DEL that never
//! came, cri-o#4727) is freed — only on positive evidence, never because something could
//! not be seen.
//!
//! - [`mod@decide`]: the decision, pure: which allocations a cycle frees from the evidence and
//!   the cycle before (every rule there);
//! - [`probe`]: the I/O — the runtime's netns directory and libcni's result cache read;
//! - [`Tracker`]: what the cycles remember (the last candidates) and report (on the
//!   agent's socket, `GET /v1/reconcile`).
//!
//! The agent runs a cycle at start (before it publishes: it frees nothing then, a candidate
//! needs two) and every [`Config::interval`]; a freed allocation goes to cooldown through
//! DEL's path, durable before it is published ([`crate::serve::Agent::reconcile`]).

pub mod decide;
pub mod probe;
mod report;

use std::path::PathBuf;
use std::time::Duration;

pub use decide::{Blocked, Cache, Decision, Evidence, Free, Memory, Netns, decide};
pub use report::Tracker;

/// Where the runtime keeps network namespaces (containerd and CRI-O: `cni-<uuid>` here;
/// `/run/netns` is the same directory on most systems).
pub const DEFAULT_NETNS_DIR: &str = "/var/run/netns";
/// libcni's result cache (`<cacheDir>/results`, cacheDir `/var/lib/cni` by default).
pub const DEFAULT_CNI_CACHE_DIR: &str = "/var/lib/cni/results";
/// How often reconcile runs.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// The most allocations one cycle frees.
pub const DEFAULT_MAX_FREES: usize = 16;

/// Reconcile's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The runtime's netns directory (as the agent sees it: the host's, mounted).
    pub netns_dir: PathBuf,
    /// libcni's result cache directory (as the agent sees it).
    pub cni_cache_dir: PathBuf,
    /// Between two cycles (a candidate is freed at its second cycle).
    pub interval: Duration,
    /// The most allocations one cycle frees.
    pub max_frees: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            netns_dir: DEFAULT_NETNS_DIR.into(),
            cni_cache_dir: DEFAULT_CNI_CACHE_DIR.into(),
            interval: DEFAULT_INTERVAL,
            max_frees: DEFAULT_MAX_FREES,
        }
    }
}
