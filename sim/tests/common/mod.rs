//! Helpers shared by the engine and scenario tests (each test file includes this module).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidepool_ipam::NodeStore;
use tidepool_ipam::Watermarks;
use tidepool_ipam::{
    IpamNode, NodeName, PodUid, ReclaimAck, ReleaseAck, ReleaseState, Tombstone, WatermarkOverrides,
};
use tidepool_sim::{Invariants, SimSource, World, WorldConfig};
use tokio::time::Instant;

/// Watermarks (pre, min, max, max_above).
pub fn wm(pre: u32, min: u32, max: u32, above: u32) -> Watermarks {
    Watermarks {
        pre_allocate: pre,
        min_allocate: min,
        max_allocate: max,
        max_above_watermark: above,
    }
}

/// Per-node overrides setting every field.
pub fn overrides(pre: u32, min: u32, max: u32, above: u32) -> WatermarkOverrides {
    WatermarkOverrides {
        pre_allocate: Some(pre),
        min_allocate: Some(min),
        max_allocate: Some(max),
        max_above_watermark: Some(above),
    }
}

/// A world whose engine uses these watermarks everywhere.
pub fn config(w: Watermarks) -> WorldConfig {
    let mut cfg = WorldConfig::default();
    cfg.engine.watermarks = w;
    cfg
}

/// Advances virtual time.
pub async fn advance(d: Duration) {
    tokio::time::sleep(d).await;
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The node's IPAMNode, which must exist.
pub fn ipam_node(world: &World, name: &str) -> Arc<IpamNode> {
    world
        .node(name)
        .unwrap_or_else(|| panic!("no IPAMNode {name}"))
}

/// The node's pool size as its IPAMNode shows it (0 if the object does not exist).
pub fn pool(world: &World, name: &str) -> usize {
    world
        .node(name)
        .map_or(0, |n| n.operator.addresses.total() as usize)
}

/// `used` entries of the node (0 if the object does not exist).
pub fn used(world: &World, name: &str) -> usize {
    world.node(name).map_or(0, |n| n.node.used.len())
}

/// Addresses the node has marked for release.
pub fn marked(world: &World, name: &str) -> Vec<IpAddr> {
    world.node(name).map_or_else(Vec::new, |n| {
        n.operator
            .release
            .iter()
            .filter(|(_, s)| **s == ReleaseState::MarkedForRelease)
            .map(|(a, _)| a)
            .collect()
    })
}

/// Addresses the source says the node holds.
pub fn granted_to(world: &World, name: &str) -> Vec<IpAddr> {
    world
        .source
        .granted()
        .into_iter()
        .filter(|(_, n)| &**n == name)
        .map(|(a, _)| a)
        .collect()
}

/// Mutating source calls so far.
pub fn source_calls(world: &World) -> u64 {
    world.source.calls().0
}

/// Schedules `n` pods on `node`.
pub fn schedule(world: &World, node: &NodeName, n: usize) -> Vec<PodUid> {
    (0..n).map(|_| world.schedule_pod(node)).collect()
}

/// Deletes (cleanly, with a DEL) the last `n` pods of `node`.
pub fn delete_last(world: &World, node: &str, n: usize) -> Vec<PodUid> {
    let pods = world.pods_on(node);
    let gone: Vec<PodUid> = pods.iter().rev().take(n).copied().collect();
    for uid in &gone {
        world.delete_pod(*uid, false);
    }
    gone
}

/// Advances time in `step`s until `pred` holds, at most `limit`. Returns the time it
/// took (a multiple of `step`), or panics naming `what`.
pub async fn wait_until(
    what: &str,
    limit: Duration,
    step: Duration,
    mut pred: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        if pred() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(step).await;
    }
}

/// Settles the world (at most `limit`) and asserts it did.
pub async fn settle(world: &World, limit: Duration) {
    let ok = world.settle(limit).await;
    assert!(
        ok,
        "world did not settle within {limit:?}: waiting {}, summaries {:?}",
        world.waiting(),
        world.manager.summaries()
    );
}

/// The observer's invariants so far (no end-of-run check), asserted zero.
pub fn assert_no_violations<S: tidepool_sim::SimSource>(world: &World<S>) {
    let inv = world.observer.invariants();
    assert_eq!(
        inv,
        Invariants::default(),
        "invariants broken: {:?}",
        world.observer.violations()
    );
}

/// The observer's end-of-run check (lost addresses included), asserted zero.
pub fn assert_finish_clean(world: &World) {
    let inv = world
        .observer
        .finish(&world.source.grants(), &world.store.list());
    assert_eq!(
        inv,
        Invariants::default(),
        "invariants broken: {:?}",
        world.observer.violations()
    );
}

/// Every node's IPAMNode pool equals what the source granted it.
pub fn assert_pools_match_source(world: &World) {
    for n in world.store.list() {
        let mut want = granted_to(world, &n.name);
        want.sort();
        let have: Vec<IpAddr> = n.operator.addresses.iter().collect();
        assert_eq!(have, want, "node {} pool differs from the source", n.name);
    }
}

/// One change the recorder saw appear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Tombstone(IpAddr, Tombstone),
    ReclaimAck(IpAddr, ReclaimAck),
    Mark(IpAddr),
    Released(IpAddr),
    ReleaseAck(IpAddr, ReleaseAck),
}

/// Records every tombstone, reclaim answer, release mark and release answer as it appears
/// in the store, with the virtual time it appeared. It reads the store on each change
/// event, so it sees every state that lasts until the runtime's next turn (the engine's
/// passes are at least `min_pass_interval` apart, so a tombstone or a mark always does).
#[derive(Clone)]
pub struct Recorder {
    log: Arc<Mutex<Vec<(Instant, NodeName, Seen)>>>,
    start: Instant,
}

impl Recorder {
    pub fn start(world: &World) -> Recorder {
        let rec = Recorder {
            log: Arc::default(),
            start: Instant::now(),
        };
        let mut events = world.store.subscribe();
        let store = world.store.clone();
        let log = rec.log.clone();
        tokio::spawn(async move {
            let mut last: BTreeMap<NodeName, BTreeSet<SeenKey>> = BTreeMap::new();
            while let Some(ev) = events.recv().await {
                let now = Instant::now();
                let Some(node) = store.cached(&ev.name) else {
                    last.remove(&ev.name);
                    continue;
                };
                let mut cur = BTreeSet::new();
                for (a, t) in &node.operator.reclaim {
                    cur.insert(SeenKey(Seen::Tombstone(*a, *t)));
                }
                for (a, k) in &node.node.reclaim_ack {
                    cur.insert(SeenKey(Seen::ReclaimAck(*a, *k)));
                }
                for (a, s) in node.operator.release.iter() {
                    cur.insert(SeenKey(match s {
                        ReleaseState::MarkedForRelease => Seen::Mark(a),
                        ReleaseState::Released => Seen::Released(a),
                    }));
                }
                for (a, k) in node.node.release_ack.iter() {
                    cur.insert(SeenKey(Seen::ReleaseAck(a, *k)));
                }
                let prev = last.entry(ev.name.clone()).or_default();
                let mut log = log.lock().unwrap();
                for k in cur.difference(prev) {
                    log.push((now, ev.name.clone(), k.0.clone()));
                }
                *prev = cur;
            }
        });
        rec
    }

    /// Everything seen on `node`, with the time since the recorder started.
    pub fn on(&self, node: &str) -> Vec<(Duration, Seen)> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, n, _)| &**n == node)
            .map(|(t, _, s)| (t.duration_since(self.start), s.clone()))
            .collect()
    }

    /// Tombstones seen on `node`, with their time.
    pub fn tombstones(&self, node: &str) -> Vec<(Duration, IpAddr, Tombstone)> {
        self.on(node)
            .into_iter()
            .filter_map(|(t, s)| match s {
                Seen::Tombstone(a, k) => Some((t, a, k)),
                _ => None,
            })
            .collect()
    }

    /// Reclaim answers seen on `node`.
    pub fn reclaim_acks(&self, node: &str) -> Vec<(Duration, IpAddr, ReclaimAck)> {
        self.on(node)
            .into_iter()
            .filter_map(|(t, s)| match s {
                Seen::ReclaimAck(a, k) => Some((t, a, k)),
                _ => None,
            })
            .collect()
    }

    /// Release marks seen on `node`.
    pub fn marks(&self, node: &str) -> Vec<(Duration, IpAddr)> {
        self.on(node)
            .into_iter()
            .filter_map(|(t, s)| match s {
                Seen::Mark(a) => Some((t, a)),
                _ => None,
            })
            .collect()
    }

    /// Release answers seen on `node`.
    pub fn release_acks(&self, node: &str) -> Vec<(Duration, IpAddr, ReleaseAck)> {
        self.on(node)
            .into_iter()
            .filter_map(|(t, s)| match s {
                Seen::ReleaseAck(a, k) => Some((t, a, k)),
                _ => None,
            })
            .collect()
    }

    /// Time since the recorder started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

/// `Seen` ordered for set differences.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SeenKey(Seen);

impl SeenKey {
    fn key(&self) -> (u8, IpAddr, u128, u8) {
        match &self.0 {
            Seen::Tombstone(a, t) => (0, *a, t.pod_uid.0, t.reason as u8),
            Seen::ReclaimAck(a, k) => (1, *a, k.pod_uid.0, k.outcome as u8),
            Seen::Mark(a) => (2, *a, 0, 0),
            Seen::Released(a) => (3, *a, 0, 0),
            Seen::ReleaseAck(a, k) => (4, *a, 0, *k as u8),
        }
    }
}

impl PartialOrd for SeenKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SeenKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// The cluster-pool source as the simulated world runs it.
pub type Pool = tidepool_ipam::pool::ClusterPoolSource<tidepool_ipam::MemoryNodeStore>;

/// The pool `default` over `cidrs`, with the default block sizes and no exclusions.
pub fn pool_spec(cidrs: &[&str]) -> tidepool_ipam::pool::PoolSpec {
    tidepool_ipam::pool::PoolSpec::parse(
        tidepool_ipam::pool::DEFAULT_POOL,
        cidrs,
        tidepool_ipam::pool::DEFAULT_BLOCK_SIZE,
        &[] as &[&str],
    )
    .unwrap()
}

/// A world on the cluster pool `default` over `cidrs`; each block write of its engine takes
/// `latency`.
pub fn pool_world(cfg: WorldConfig, cidrs: &[&str], latency: Duration) -> World<Pool> {
    let spec = pool_spec(cidrs);
    World::start_with(cfg, move |w, _obs, store| {
        Ok(tidepool_ipam::pool::ClusterPoolSource::new(
            store.clone(),
            vec![tidepool_ipam::pool::PoolConfig::new(spec)],
            w.seed,
        )
        .with_latency(latency))
    })
    .unwrap()
}

/// The pods of `node` whose address lies in `cidr`.
pub fn pods_in(w: &World<Pool>, node: &str, cidr: &ipnet::IpNet) -> Vec<PodUid> {
    w.node(node).map_or_else(Vec::new, |n| {
        n.node
            .used
            .iter()
            .filter(|(a, _)| cidr.contains(a))
            .map(|(_, e)| e.pod_uid)
            .collect()
    })
}
