//! The decision (pure): which allocations a cycle frees, from what the runtime and the API
//! server showed ([`Evidence`]) and what the cycle before saw ([`Memory`]).
//!
//! A cycle frees nothing at all unless every source of evidence is there: the netns
//! directory visible and populated (an empty one is what a missing mount looks like), the
//! CNI result cache visible and of the layout we know, the pods listed. Then an allocation
//! is a candidate when its sandbox shows no sign of life:
//! - it is older than the evidence (an ADD after the probe has no cache entry yet);
//! - no cache entry names its (containerID, ifname) — libcni writes one after every ADD
//!   that succeeded and removes it on DEL;
//! - the netns it was added with (`CNI_NETNS`), if recorded, is not in the netns directory;
//! - no live pod with its UID lists any of its addresses.
//!
//! A candidate is freed only when it was one in the cycle before too (so one racing ADD or
//! a watch that lags cannot free it), at most `max_frees` per cycle — the rest wait, still
//! seen, for the next cycles.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use tidepool_ipam::PodUid;

use crate::pods::LivePods;
use crate::state::{AllocKey, Allocation};

/// What the runtime's netns directory showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Netns {
    /// Missing or unreadable (not mounted?): why.
    Invisible(String),
    /// There, with no entry (a missing mount looks like this too).
    Empty,
    /// The entries' names (`cni-<uuid>` for containerd and CRI-O).
    Populated(BTreeSet<String>),
}

/// What the runtime's CNI result cache showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cache {
    /// Missing or unreadable: why.
    Invisible(String),
    /// No entry reads as libcni's `<networkName>-<containerID>-<ifname>` JSON: why.
    UnknownLayout(String),
    /// The entries' names, the layout confirmed.
    Known(BTreeSet<String>),
}

/// One cycle's evidence.
#[derive(Debug, Clone)]
pub struct Evidence {
    /// When the probe started: only allocations older than this are judged.
    pub taken_at: SystemTime,
    pub netns: Netns,
    pub cache: Cache,
    /// `None`: the pods have not been listed.
    pub pods: Option<Arc<LivePods>>,
}

/// Why a cycle freed nothing at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    NetnsInvisible(String),
    NetnsEmpty,
    CacheInvisible(String),
    CacheUnknownLayout(String),
    PodsNotListed,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocked::NetnsInvisible(why) => write!(f, "the netns directory is not visible: {why}"),
            Blocked::NetnsEmpty => write!(f, "the netns directory is empty (not mounted?)"),
            Blocked::CacheInvisible(why) => {
                write!(f, "the CNI result cache is not visible: {why}")
            }
            Blocked::CacheUnknownLayout(why) => {
                write!(f, "the CNI result cache's layout is unknown: {why}")
            }
            Blocked::PodsNotListed => write!(f, "the node's pods have not been listed"),
        }
    }
}

/// One allocation as a cycle saw it (the same key re-added later is another one).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Sighting {
    key: AllocKey,
    uid: PodUid,
    since: SystemTime,
}

/// What the cycles so far saw: the previous cycle's candidates and since when each was one.
#[derive(Debug, Clone, Default)]
pub struct Memory {
    cycle: u64,
    seen: BTreeMap<Sighting, u64>,
}

impl Memory {
    /// The cycles decided so far.
    pub fn cycles(&self) -> u64 {
        self.cycle
    }
}

/// An allocation to free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Free {
    pub key: AllocKey,
    pub uid: PodUid,
    pub addrs: Vec<IpAddr>,
    /// The first of the consecutive cycles it was a candidate in.
    pub first_seen: u64,
}

/// What a cycle decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// This cycle's number (from 1).
    pub cycle: u64,
    /// Set when the evidence is incomplete: then nothing is a candidate or freed.
    pub blocked: Option<Blocked>,
    /// Candidates this cycle (freed or not).
    pub candidates: usize,
    pub free: Vec<Free>,
    /// Candidates seen twice or more but over the cap: freed in a later cycle.
    pub deferred: usize,
}

/// Decides one cycle over the state's `allocations`; `memory` moves on to this cycle.
pub fn decide<'a>(
    allocations: impl IntoIterator<Item = (&'a AllocKey, &'a Allocation)>,
    ev: &Evidence,
    memory: &mut Memory,
    max_frees: usize,
) -> Decision {
    memory.cycle += 1;
    let cycle = memory.cycle;
    let (netns, cache, pods) = match complete(ev) {
        Ok(v) => v,
        Err(blocked) => {
            // the cycles must be consecutive: a gap in the evidence starts over
            memory.seen.clear();
            return Decision {
                cycle,
                blocked: Some(blocked),
                candidates: 0,
                free: Vec::new(),
                deferred: 0,
            };
        }
    };
    let mut seen = BTreeMap::new();
    let mut free = Vec::new();
    let mut deferred = 0;
    for (key, a) in allocations {
        let dead = a.since < ev.taken_at
            && !cached(cache, key)
            && !netns_lives(netns, a.netns.as_deref())
            && !a.addrs.iter().any(|x| pods.lists(a.pod.uid, x));
        if !dead {
            continue;
        }
        let s = Sighting {
            key: key.clone(),
            uid: a.pod.uid,
            since: a.since,
        };
        let Some(&first_seen) = memory.seen.get(&s) else {
            seen.insert(s, cycle);
            continue;
        };
        if free.len() < max_frees {
            free.push(Free {
                key: key.clone(),
                uid: a.pod.uid,
                addrs: a.addrs.clone(),
                first_seen,
            });
        } else {
            deferred += 1;
            seen.insert(s, first_seen);
        }
    }
    let candidates = seen.len() + free.len();
    memory.seen = seen;
    Decision {
        cycle,
        blocked: None,
        candidates,
        free,
        deferred,
    }
}

/// The evidence's parts when every one is there.
fn complete(ev: &Evidence) -> Result<(&BTreeSet<String>, &BTreeSet<String>, &LivePods), Blocked> {
    let netns = match &ev.netns {
        Netns::Invisible(why) => return Err(Blocked::NetnsInvisible(why.clone())),
        Netns::Empty => return Err(Blocked::NetnsEmpty),
        Netns::Populated(n) => n,
    };
    let cache = match &ev.cache {
        Cache::Invisible(why) => return Err(Blocked::CacheInvisible(why.clone())),
        Cache::UnknownLayout(why) => return Err(Blocked::CacheUnknownLayout(why.clone())),
        Cache::Known(n) => n,
    };
    let pods = ev.pods.as_deref().ok_or(Blocked::PodsNotListed)?;
    Ok((netns, cache, pods))
}

/// Whether a cache entry names attachment `key` (`<networkName>-<containerID>-<ifname>`,
/// any network). Compared by name, so an entry being written counts as well; a name that
/// only looks like it (a container ID ending in another's) keeps an allocation, never frees
/// one. Names × allocations: a node's few hundred of each.
fn cached(names: &BTreeSet<String>, key: &AllocKey) -> bool {
    let suffix = format!("-{}-{}", key.container_id, key.ifname);
    names
        .iter()
        .any(|n| n.len() > suffix.len() && n.ends_with(&suffix))
}

/// Whether the allocation's recorded netns is still in the netns directory (by file name:
/// the agent may see the host's directory mounted elsewhere).
fn netns_lives(entries: &BTreeSet<String>, recorded: Option<&str>) -> bool {
    recorded
        .and_then(|p| Path::new(p).file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| entries.contains(n))
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
