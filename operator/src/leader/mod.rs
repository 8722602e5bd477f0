//! Leader election on Kubernetes' own terms (client-go's model, DESIGN.md "Operator
//! binary"): a Lease in the operator's namespace, followers that time the record on their
//! own monotonic clock and take over only after a full lease duration without a change, a
//! leader that renews every retry period and has one step-down instant (its last successful
//! renewal's start + renew deadline) that every write path checks through [`Leadership`].
//!
//! - [`decide`]: the rules as pure functions (acquire, renew, wait, step down).
//! - [`lease`]: the Lease's own client (no retries, short timeouts) and its I/O.
//! - [`run_elector`]: the loop; it returns "leader election lost" when the renew deadline
//!   passes without a renewal, and releases the Lease on shutdown.
//!
//! - [`Fence`]: what every write of `run` passes through.

mod config;
pub mod decide;
mod elector;
mod fence;
mod leadership;
pub mod lease;

pub use config::{DEFAULT_LEASE_NAME, LeaderConfig, default_identity};
pub use elector::run_elector;
pub use fence::{Fence, Fenced};
pub use leadership::{Leadership, WriteGuard, count_refused_write};

/// An error and its causes on one line, for logs.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}
