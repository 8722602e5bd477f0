//! Between the CRD types (`tidepool_api`) and the engine's (`tidepool_ipam`): what a watch
//! or a GET gives becomes the engine's [`IpamNode`](tidepool_ipam::IpamNode) and
//! [`IpamBlock`](tidepool_ipam::IpamBlock); what the engine writes becomes apply bodies.
//! Pure functions: no client here.
//!
//! Malformed entries (an address that does not parse, a UID that is not one) are reported
//! and skipped; nothing is deleted because of them: the engine never sees the entry, so it
//! neither reclaims nor grants on it, and the operator's applies leave the node side's
//! fields alone.

mod block;
mod node;
mod time;

pub use block::{block_for_create, block_from_api, block_mark_body};
pub use node::{Allocations, NodeView, node_from_api, spec_body, status_body};

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
