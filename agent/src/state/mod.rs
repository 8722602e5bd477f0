//! The agent's durable node state (DESIGN.md "Node agent": one agent per node, durable
//! before it answers, boot-scoped allocations, the DEL spool).
//!
//! - [`StateDir`] locks `--state-dir` before anything else ([`DirLock`]) and loads and
//!   saves the checkpoint there;
//! - [`NodeState`] is `ipam`'s node side keyed by (containerID, ifname) — allocations,
//!   cooldowns and acks, with the rules that change them, the simulator's too — and the
//!   agent's own part: boot IDs, netns paths, pod names (pure; time passed in);
//! - the checkpoint (`checkpoint.json`, format below) is saved through [`Fs`] as temp
//!   file, fsync, rename, fsync of the directory; [`RecordingFs`] records those calls and models a power loss for the tests;
//! - [`drain_spool`] reads the DELs the plugin spooled while the agent was down;
//! - [`NodeState::adopt`] rebuilds the state after a corrupt checkpoint from the node side
//!   the agent had published.
//!
//! # Checkpoint format
//! ```json
//! {"version":2,"minReaderVersion":1,
//!  "allocations":[{"containerID":"…","ifname":"eth0","podUID":"…","namespace":"default",
//!    "pod":"web-0","addresses":["10.0.0.5"],"since":1764000000000,"bootID":"…",
//!    "netns":"/var/run/netns/cni-…","network":"pods"}],
//!  "cooldown":{"10.0.0.4":1764000030000},
//!  "releaseAck":[{"first":"10.0.1.0","last":"10.0.1.15","ack":"ready-for-release"}],
//!  "blockReleaseAck":{"node-a-10-0-1-0-28":"do-not-release"},
//!  "reclaimAck":{"10.0.0.7":{"podUID":"…","containerID":"…","ifname":"eth0","outcome":"stale"}}}
//! ```
//! Times are Unix milliseconds. An agent of format N reads N and N−1, and one of N−1 reads
//! N (new formats only add fields with defaults); `minReaderVersion` lets a format refuse
//! older readers. A format this agent does not read is refused, never misread.

mod adopt;
mod boot;
mod checkpoint;
mod dir;
mod error;
mod format;
#[cfg(test)]
mod format_prev;
mod fs;
mod lock;
mod model;
mod recording;
mod spool;
#[cfg(test)]
mod test_dir;

pub use adopt::Adopted;
pub use boot::{BOOT_ID_PATH, read_boot_id};
pub use checkpoint::{CHECKPOINT_FILE, CORRUPT_PREFIX, Loaded, Origin, TEMP_FILE};
pub use dir::StateDir;
pub use error::{Result, StateError};
pub use format::{FORMAT_VERSION, MIN_READER_VERSION};
pub use fs::{Fs, FsFile, StdFs};
pub use lock::{DirLock, LOCK_FILE};
pub use model::{
    AddrPools, AllocKey, Allocation, Attachment, NodeState, PodRef, ReclaimAnswer, parse_pod_uid,
    pool_families,
};
pub use recording::{Op, OpKind, RecordingFs};
pub use spool::{Drained, SPOOL_VERSION, SpooledDel, Unreadable, drain_spool, spooled};
pub use tidepool_ipam::node::{Added, DelOutcome};
