//! The lifecycle rules under paused time: the count refresh sleeps while nothing changes,
//! rewrites a stale count a second after a change and retries a failed write each second;
//! an IPAMNode without its Node is reclaimed after the node grace; a Node re-created while
//! its old incarnation's reclaim is under way starts afresh.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::budget::{Api, Budget};
use crate::clock::TokioClock;
use crate::config::EngineConfig;
use crate::error::{ErrorClass, IpamError};
use crate::gate::Gate;
use crate::maintainer::tests::info;
use crate::manager::{EngineDeps, NodeManager};
use crate::pods::MemoryPodView;
use crate::source::MemorySource;
use crate::store::{EventType, MemoryNodeStore, NodeStore, ObjectKind, StoreEvent, Writer};
use crate::types::{
    Family, IpamNode, NodeInfo, NodeName, NodeUid, OperatorFields, PerFamily, ResourceVersion,
};
use crate::vocab::EventReason;

/// A store that records counts: the in-memory one, with every call counted and the stale
/// counts set by the test.
#[derive(Clone, Default)]
struct CountingStore {
    inner: MemoryNodeStore,
    /// Every call of the engine, of any method.
    calls: Arc<AtomicU64>,
    stale: Arc<Mutex<BTreeSet<NodeName>>>,
    /// Count writes to fail before one succeeds.
    failing: Arc<AtomicU32>,
    /// Each count write tried: the node and when.
    tries: Arc<Mutex<Vec<(NodeName, Instant)>>>,
    /// How long an IPAMNode's removal takes (milliseconds).
    remove_ms: Arc<AtomicU64>,
}

impl CountingStore {
    fn call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn tries(&self) -> Vec<String> {
        self.tries
            .lock()
            .iter()
            .map(|(n, _)| n.to_string())
            .collect()
    }
}

impl NodeStore for CountingStore {
    fn cached(&self, name: &str) -> Option<Arc<IpamNode>> {
        self.call();
        self.inner.cached(name)
    }

    async fn get(&self, name: &str) -> Result<Option<Arc<IpamNode>>, IpamError> {
        self.call();
        self.inner.get(name).await
    }

    async fn apply_operator<G: Gate>(
        &self,
        name: &NodeName,
        node_uid: NodeUid,
        fields: OperatorFields,
        gate: &mut G,
    ) -> Result<Arc<IpamNode>, IpamError> {
        self.call();
        self.inner
            .apply_operator(name, node_uid, fields, gate)
            .await
    }

    async fn remove<G: Gate>(&self, name: &str, gate: &mut G) -> Result<(), IpamError> {
        self.call();
        sleep_ms(self.remove_ms.load(Ordering::Relaxed)).await;
        self.inner.remove(name, gate).await
    }

    fn event(&self, object: &str, type_: EventType, reason: EventReason, message: String) {
        self.call();
        self.inner.event(object, type_, reason, message);
    }

    fn stale_counts(&self) -> Vec<NodeName> {
        self.call();
        self.stale.lock().iter().cloned().collect()
    }

    async fn refresh_count<G: Gate>(&self, name: &str, gate: &mut G) -> Result<bool, IpamError> {
        self.call();
        gate.request().await?;
        self.tries.lock().push((name.into(), Instant::now()));
        let fail = self
            .failing
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if fail.is_ok() {
            return Err(IpamError::Store {
                op: "refresh-count",
                name: name.to_string(),
                class: ErrorClass::Transient,
                message: "the write failed".into(),
            });
        }
        Ok(self.stale.lock().remove(name))
    }
}

/// A leading engine over `store` and a source of 64 IPv4 addresses (pre-allocate 2, the
/// node grace 5 s); the leader signal's sender is returned to keep it open.
fn manager<N: NodeStore>(
    source: &MemorySource,
    store: N,
) -> (
    NodeManager<MemorySource, N, MemoryPodView>,
    watch::Sender<bool>,
) {
    let (leader, rx) = watch::channel(true);
    let mut cfg = EngineConfig::default();
    cfg.watermarks.pre_allocate = 2;
    cfg.node_reclaim_grace = Duration::from_secs(5);
    let deps = EngineDeps {
        source: source.clone(),
        store,
        pods: MemoryPodView::new(Duration::ZERO),
        clock: Arc::new(TokioClock::new()),
        source_budget: Budget::unlimited(Api::Source),
        kube_budget: Budget::unlimited(Api::Kube),
        leader: rx,
    };
    let mgr = NodeManager::new(deps, cfg).expect("a valid config");
    (mgr, leader)
}

fn source() -> MemorySource {
    MemorySource::new(&[Family::V4], PerFamily { v4: 64, v6: 0 }, 1)
}

/// Someone else changed `node`'s blocks.
fn block_event(node: &str) -> StoreEvent {
    StoreEvent {
        kind: ObjectKind::IpamBlock,
        name: node.into(),
        resource_version: ResourceVersion::counter(1_000),
        writer: Writer::User,
        deleted: false,
    }
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Once a node has settled, a day passes with no call of the store at all: the count
/// refresh (whose every wake-up lists the stale counts) and the maintainer sleep. A pass
/// then wakes it: the count it made stale is rewritten a second later.
#[tokio::test(start_paused = true)]
async fn the_count_refresh_sleeps_while_nothing_changes() {
    let store = CountingStore::default();
    let (mgr, _leader) = manager(&source(), store.clone());
    mgr.spawn_count_refresh();
    mgr.upsert_node(info("a"));
    sleep_ms(10_000).await;
    assert!(
        store.inner.cached("a").is_some(),
        "the node's first pass wrote"
    );
    let calls = store.calls();
    sleep_ms(24 * 3600 * 1000).await;
    assert_eq!(store.calls(), calls, "a store call while nothing changed");
    assert!(store.tries().is_empty());
    store.stale.lock().insert("a".into());
    mgr.on_pod_event("a"); // the node's pass runs, and may change its count
    sleep_ms(1_100).await;
    assert_eq!(store.tries(), ["a"]);
    assert!(store.stale.lock().is_empty());
}

type Manager = NodeManager<MemorySource, CountingStore, MemoryPodView>;

/// A started count refresh, settled; then `b`'s count goes stale, its first `failing`
/// writes to fail, and a store event says its blocks changed. Returns when.
async fn stale_count(failing: u32) -> (CountingStore, Manager, watch::Sender<bool>, Instant) {
    let store = CountingStore::default();
    let (mgr, leader) = manager(&source(), store.clone());
    mgr.spawn_count_refresh();
    sleep_ms(5_000).await;
    store.stale.lock().insert("b".into());
    store.failing.store(failing, Ordering::Relaxed);
    mgr.on_store_event(&block_event("b"));
    (store, mgr, leader, Instant::now())
}

/// How long after `changed` each count write was tried.
fn tries_after(store: &CountingStore, changed: Instant) -> Vec<Duration> {
    let tries = store.tries.lock();
    tries.iter().map(|(_, t)| *t - changed).collect()
}

/// A stale count is rewritten a second after the store event that made it so, once; an
/// IPAMNode the engine does not manage too.
#[tokio::test(start_paused = true)]
async fn a_changed_count_is_refreshed_a_second_after_the_change() {
    let (store, _mgr, _leader, changed) = stale_count(0).await;
    sleep_ms(60_000).await;
    assert_eq!(tries_after(&store, changed), [Duration::from_secs(1)]);
    assert_eq!(store.tries(), ["b"]);
    assert!(store.stale.lock().is_empty());
}

/// A count whose write fails is tried again each second until it is written, then no more.
#[tokio::test(start_paused = true)]
async fn a_failed_count_refresh_is_retried_each_second() {
    let (store, _mgr, _leader, changed) = stale_count(2).await;
    sleep_ms(3_500).await;
    let secs = |s| Duration::from_secs(s);
    assert_eq!(tries_after(&store, changed), [secs(1), secs(2), secs(3)]);
    assert!(store.stale.lock().is_empty(), "the third try wrote");
    sleep_ms(3600 * 1000).await;
    assert_eq!(store.tries.lock().len(), 3, "no try once written");
}

/// An IPAMNode whose Node the informer does not know when it has listed (deleted while
/// no operator ran) is reclaimed after the node grace: its addresses go back to the
/// source and the IPAMNode goes. One whose Node is there is left alone.
#[tokio::test(start_paused = true)]
async fn an_ipamnode_without_its_node_is_reclaimed_after_the_grace() {
    let (source, store) = (source(), MemoryNodeStore::new());
    let (before, _leader) = manager(&source, store.clone());
    before.upsert_node(info("gone"));
    before.upsert_node(info("kept"));
    sleep_ms(10_000).await;
    before.shutdown();
    let gone = NodeName::from("gone");
    let held = source.held_by(&gone);
    assert!(held >= 2, "the node's addresses before the restart");
    let (after, _leader) = manager(&source, store.clone());
    let orphans = after.nodes_synced(|n| n == "kept");
    assert_eq!(orphans, std::slice::from_ref(&gone));
    assert_eq!(
        after.node_names(),
        std::slice::from_ref(&gone),
        "only the orphan is managed"
    );
    sleep_ms(4_500).await;
    assert_eq!(
        source.held_by(&gone),
        held,
        "reclaimed before the node grace"
    );
    assert!(store.cached("gone").is_some());
    sleep_ms(1_500).await;
    assert_eq!(source.held_by(&gone), 0);
    assert!(store.cached("gone").is_none(), "the IPAMNode went");
    assert!(after.node_names().is_empty());
    assert!(source.held_by(&NodeName::from("kept")) >= 2);
    assert!(store.cached("kept").is_some());
}

/// A Node re-created under its name (a new UID) while its old incarnation's whole-node
/// reclaim is under way (its IPAMNode's removal in flight): the maintainer does not end
/// with the reclaim, and the new Node gets a fresh IPAMNode with its UID and addresses.
#[tokio::test(start_paused = true)]
async fn a_node_re_created_during_its_reclaim_starts_afresh() {
    let (source, store) = (source(), CountingStore::default());
    store.remove_ms.store(1_000, Ordering::Relaxed);
    let (mgr, _leader) = manager(&source, store.clone());
    let name = NodeName::from("n");
    mgr.upsert_node(info("n"));
    sleep_ms(1_000).await;
    assert!(source.held_by(&name) >= 2);
    mgr.delete_node("n");
    // the grace (5 s) passes, the addresses go back and the removal starts
    sleep_ms(5_500).await;
    assert_eq!(source.held_by(&name), 0, "reclaimed after the grace");
    let new = NodeInfo {
        uid: NodeUid(8),
        ..info("n")
    };
    mgr.upsert_node(new);
    sleep_ms(3_000).await;
    assert_eq!(mgr.node_names(), vec![name.clone()], "still maintained");
    let obj = store.cached("n").expect("a fresh IPAMNode");
    assert_eq!(obj.node_uid, NodeUid(8));
    assert!(source.held_by(&name) >= 2, "the new Node's addresses");
}
