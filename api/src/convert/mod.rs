//! Reading the CRD objects as the engine's types: what a watch or a GET gives becomes the
//! engine's [`IpamNode`](tidepool_ipam::IpamNode) and [`IpamBlock`](tidepool_ipam::IpamBlock).
//! Pure functions: no client here.
//!
//! Why here: the operator and the node agent must read IPAMNodes and IPAMBlocks the same way
//! (an agent that read `status.used` differently from the operator would disagree with it
//! about which address is whose), and the agent must not depend on the operator crate. This
//! crate already defines the objects and both binaries depend on it; it gains a dependency
//! on `tidepool-ipam`, which depends on nothing of tidepool's but `tidepool-metrics`, so
//! there is no cycle, and a crate of its own for four small files would add a name and no
//! separation. The reading side lives here, and the writing side's vocabulary (`write`: the
//! engine's marks, answers and reasons as the objects' enums, a condition, the envelope of an
//! apply); the apply bodies themselves (the operator's spec and status, a claim, a block
//! mark; the agent's status and block answers) stay with their writers, built from the typed
//! objects.
//!
//! Malformed entries (an address that does not parse, a UID that is not one) are reported
//! and skipped; nothing is deleted because of them: the engine never sees the entry, so it
//! neither reclaims nor grants on it, and the writers' applies leave the other side's fields
//! alone.

mod block;
mod names;
mod node;
mod pool;
mod time;
mod uid;
mod write;

pub use block::block_from_api;
pub use names::AllocationNames;
pub use node::{AgentReady, Allocations, HeldCount, NodeView, node_from_api};
pub use pool::{pool_config, pool_spec, pool_watermarks, readable_count, readable_usage, selector};
pub use time::{from_system, to_system};
pub use uid::parse_uid;
pub use write::{apply_envelope, condition};

/// One entry that could not be read, with where it was and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// `ipamnode/NAME` or `ipamblock/NAME`.
    pub object: String,
    /// The field path, e.g. `status.used["10.0.0.x"]`.
    pub field: String,
    pub reason: String,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.object, self.field, self.reason)
    }
}

/// Collects what could not be read of one object.
pub(crate) struct Report<'a> {
    object: &'a str,
    found: Vec<Malformed>,
}

impl<'a> Report<'a> {
    pub(crate) fn new(object: &'a str) -> Self {
        Self {
            object,
            found: Vec::new(),
        }
    }

    /// Records `field` as malformed and gives `None`, so a caller can `?`-skip it.
    pub(crate) fn bad<T>(&mut self, field: String, reason: impl Into<String>) -> Option<T> {
        self.found.push(Malformed {
            object: self.object.to_string(),
            field,
            reason: reason.into(),
        });
        None
    }

    pub(crate) fn finish(self) -> Vec<Malformed> {
        self.found
    }
}
