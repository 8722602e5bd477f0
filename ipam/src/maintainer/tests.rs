//! The executor on the in-memory source, store and pods, under paused time: a pass claims,
//! runs the release handshake, confirms reclaims, marks, writes once, and says why a node
//! is blocked.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::budget::{Api, Budget};
use crate::clock::TokioClock;
use crate::config::EngineConfig;
use crate::manager::{EngineDeps, NodeManager};
use crate::pods::MemoryPodView;
use crate::source::MemorySource;
use crate::store::{MemoryNodeStore, NodeStore};
use crate::types::{
    AllocationId, Family, IpamNode, NodeInfo, NodeName, NodeUid, PerFamily, PodName, PodUid,
    ReclaimAck, ReclaimOutcome, ReleaseAck, ReleaseState, UsedEntry, WatermarkOverrides,
};
use crate::vocab::{Blocked, ConditionReason, ConditionType, EventReason};
use crate::watermarks::Watermarks;

pub(super) type Manager = NodeManager<MemorySource, MemoryNodeStore, MemoryPodView>;

pub(super) struct Rig {
    pub mgr: Manager,
    pub source: MemorySource,
    pub store: MemoryNodeStore,
    pub pods: MemoryPodView,
    _leader: watch::Sender<bool>,
}

/// A leading engine over a source of `capacity` IPv4 addresses, pre-allocate 2, release on
/// after 10 s, reclaim after two observations 1 s apart.
pub(super) fn rig(capacity: u64) -> Rig {
    rig_with(capacity, |_| {})
}

/// [`rig`] with its settings changed by `edit`.
pub(super) fn rig_with(capacity: u64, edit: impl FnOnce(&mut EngineConfig)) -> Rig {
    let source = MemorySource::new(
        &[Family::V4],
        PerFamily {
            v4: capacity,
            v6: 0,
        },
        1,
    );
    let store = MemoryNodeStore::new();
    let pods = MemoryPodView::new(Duration::ZERO);
    let (leader, rx) = watch::channel(true);
    let mut cfg = EngineConfig {
        watermarks: Watermarks {
            pre_allocate: 2,
            ..Watermarks::default()
        },
        ..EngineConfig::default()
    };
    cfg.release.enabled = true;
    cfg.release.delay = Duration::from_secs(10);
    cfg.reclaim.grace = Duration::from_secs(1);
    cfg.reclaim.min_age = Duration::ZERO;
    edit(&mut cfg);
    let deps = EngineDeps {
        source: source.clone(),
        store: store.clone(),
        pods: pods.clone(),
        clock: Arc::new(TokioClock::new()),
        source_budget: Budget::unlimited(Api::Source),
        kube_budget: Budget::unlimited(Api::Kube),
        leader: rx,
    };
    let mgr = NodeManager::new(deps, cfg).expect("a valid config");
    Rig {
        mgr,
        source,
        store,
        pods,
        _leader: leader,
    }
}

/// A schedulable Node of `name`.
pub(crate) fn info(name: &str) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        uid: NodeUid(7),
        allocatable_pods: 110,
        cordoned: false,
        terminating: false,
    }
}

pub(super) async fn run_for(secs: u64) {
    for _ in 0..secs * 10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Rig {
    pub(super) fn node(&self, name: &str) -> Arc<IpamNode> {
        self.store.cached(name).expect("the IPAMNode")
    }

    pub(super) fn addresses(&self, name: &str) -> Vec<IpAddr> {
        self.node(name).operator.addresses.iter().collect()
    }

    fn blocked(&self, name: &str) -> Option<ConditionReason> {
        let node = self.node(name);
        let c = node.operator.conditions.iter();
        c.filter(|c| c.type_ == ConditionType::Blocked && c.status)
            .map(|c| c.reason)
            .next()
    }

    /// Pods waiting on `name`, `n` of them from uid `first`.
    pub(super) fn schedule(&self, name: &str, first: u128, n: u128) {
        for uid in first..first + n {
            self.pods.add(PodUid(uid), NodeName::from(name));
        }
        self.mgr.on_pod_event(name);
    }

    /// The node side gives pod `uid` the address `addr` (its `used` entry) and the pod runs.
    pub(super) fn start_pod(&self, name: &str, uid: u128, addr: IpAddr) {
        self.store.apply_node(&NodeName::from(name), |f| {
            f.used.insert(
                addr,
                UsedEntry {
                    pod_uid: PodUid(uid),
                    pod: PodName::new("ns", &format!("p{uid}")),
                    allocation: AllocationId(uid as u64),
                    since: SystemTime::UNIX_EPOCH.into(),
                },
            );
        });
        self.pods.set_running(PodUid(uid), [addr]);
        self.mgr.on_pod_event(name);
    }
}

/// A node with pods waiting claims them and pre-allocate in one call, written once.
#[tokio::test(start_paused = true)]
async fn a_pass_claims_for_waiting_pods_and_writes_once() {
    let r = rig(64);
    r.schedule("n", 1, 3);
    r.mgr.upsert_node(info("n"));
    run_for(2).await;
    assert_eq!(r.addresses("n").len(), 5, "3 waiting + pre-allocate 2");
    assert_eq!(r.source.calls().0, 1, "one allocate for all 5");
    let writes = r.store.operator_writes();
    r.mgr.on_pod_event("n");
    run_for(2).await;
    assert_eq!(r.store.operator_writes(), writes, "nothing new: no write");
    assert_eq!(
        r.node("n").node_uid,
        NodeUid(7),
        "written for the Node's UID"
    );
    assert_eq!(r.blocked("n"), None);
    let s = r.mgr.summary("n").expect("a summary");
    assert_eq!((s.needed(), s.blocked), (0, None));
}

/// Excess persists past the delay: the pass marks it; the node side's ready-for-release
/// answer makes the next pass release it at the source and record it released.
#[tokio::test(start_paused = true)]
async fn excess_is_marked_then_released_through_the_handshake() {
    let r = rig(64);
    r.schedule("n", 1, 4);
    r.mgr.upsert_node(info("n"));
    run_for(2).await;
    assert_eq!(r.addresses("n").len(), 6);
    // the pods go before using their addresses: 4 of 6 are excess
    for uid in 1..=4 {
        r.pods.delete(PodUid(uid));
    }
    r.mgr.on_pod_event("n");
    run_for(5).await;
    assert!(
        r.node("n").operator.release.is_empty(),
        "not before the delay"
    );
    run_for(20).await;
    let marked: Vec<IpAddr> = (r.node("n").operator.release)
        .keys_where(|s| *s == ReleaseState::MarkedForRelease)
        .iter()
        .collect();
    assert_eq!(marked.len(), 4, "the excess is marked");
    assert_eq!(r.source.calls().0, 1, "nothing released unanswered");

    r.store.apply_node(&"n".into(), |f| {
        for a in &marked {
            f.release_ack.insert(*a, ReleaseAck::ReadyForRelease);
        }
    });
    r.mgr.on_pod_event("n");
    run_for(2).await;
    assert_eq!(r.source.calls().0, 2, "one release call");
    assert_eq!(r.source.held_by(&"n".into()), 2);
    let node = r.node("n");
    assert_eq!(node.operator.addresses.total(), 2);
    for a in &marked {
        assert_eq!(node.operator.release.get(a), Some(&ReleaseState::Released));
    }
}

/// A pod gone from the cache, its address still in `used`: observed twice, confirmed by a
/// live lookup, tombstoned; the node side's answer drops the tombstone and is reported.
#[tokio::test(start_paused = true)]
async fn a_gone_pod_is_confirmed_tombstoned_and_its_answer_reported() {
    let r = rig(64);
    r.schedule("n", 1, 1);
    r.mgr.upsert_node(info("n"));
    run_for(2).await;
    let addr = r.addresses("n")[0];
    r.start_pod("n", 1, addr);
    run_for(2).await;
    assert!(r.node("n").operator.reclaim.is_empty(), "a live pod");

    r.pods.delete(PodUid(1));
    r.mgr.on_pod_event("n");
    run_for(5).await;
    let t = *r.node("n").operator.reclaim.get(&addr).expect("tombstoned");
    assert_eq!((t.pod_uid, t.allocation), (PodUid(1), AllocationId(1)));

    r.store.apply_node(&"n".into(), |f| {
        f.used.remove(&addr);
        let ack = ReclaimAck {
            pod_uid: PodUid(1),
            allocation: AllocationId(1),
            outcome: ReclaimOutcome::Reclaimed,
        };
        f.reclaim_ack.insert(addr, ack);
    });
    r.mgr.on_pod_event("n");
    run_for(2).await;
    assert!(r.node("n").operator.reclaim.is_empty(), "answered: dropped");
    assert_eq!(r.store.event_count(EventReason::GarbageCollected), 1);
}

/// A failed write fails the pass; the retry writes what the pass had.
#[tokio::test(start_paused = true)]
async fn a_failed_write_is_retried() {
    let r = rig(64);
    r.store.fail_next_operator_writes(1);
    r.schedule("n", 1, 1);
    r.mgr.upsert_node(info("n"));
    run_for(1).await;
    assert!(r.store.cached("n").is_none(), "the first write failed");
    run_for(30).await;
    assert_eq!(r.addresses("n").len(), 3);
    assert_eq!(r.source.held_by(&"n".into()), 3, "no address claimed twice");
}

/// Each way a node needing addresses is blocked is its `Blocked` reason: the pool
/// exhausted (with its event), the cap, a cordon, invalid overrides.
#[tokio::test(start_paused = true)]
async fn blocked_reasons_follow_what_stops_the_node() {
    let r = rig(2);
    r.schedule("full", 1, 4);
    r.mgr.upsert_node(info("full"));
    run_for(2).await;
    assert_eq!(
        r.blocked("full"),
        Some(ConditionReason::Blocked(Blocked::Exhausted))
    );
    assert_eq!(r.store.event_count(EventReason::PoolExhausted), 1);
    let s = r.mgr.summary("full").expect("a summary");
    assert_eq!(s.blocked, Some(Blocked::Exhausted));

    let r = rig(64);
    r.schedule("capped", 1, 4);
    r.mgr.upsert_node(NodeInfo {
        allocatable_pods: 2,
        ..info("capped")
    });
    run_for(2).await;
    assert_eq!(r.addresses("capped").len(), 2);
    // the pass that claimed planned before it; the next one sees the cap
    r.mgr.on_pod_event("capped");
    run_for(2).await;
    assert_eq!(
        r.blocked("capped"),
        Some(ConditionReason::Blocked(Blocked::AtCap))
    );

    r.schedule("cordoned", 10, 1);
    r.mgr.upsert_node(NodeInfo {
        cordoned: true,
        ..info("cordoned")
    });
    run_for(2).await;
    assert!(r.addresses("cordoned").is_empty());
    assert_eq!(
        r.blocked("cordoned"),
        Some(ConditionReason::Blocked(Blocked::Cordoned))
    );

    r.schedule("bad", 20, 1);
    r.mgr.upsert_node(info("bad"));
    run_for(2).await;
    r.store.set_watermarks(
        &"bad".into(),
        WatermarkOverrides {
            min_allocate: Some(9),
            max_allocate: Some(3),
            ..WatermarkOverrides::default()
        },
    );
    r.schedule("bad", 21, 5);
    run_for(2).await;
    assert_eq!(r.addresses("bad").len(), 3, "nothing new while invalid");
    assert_eq!(
        r.blocked("bad"),
        Some(ConditionReason::Blocked(Blocked::InvalidSpec))
    );
    let node = r.node("bad");
    let valid = node.operator.conditions.iter();
    let valid = valid
        .filter(|c| c.type_ == ConditionType::WatermarksValid)
        .map(|c| (c.status, c.reason))
        .collect::<Vec<_>>();
    assert_eq!(valid, [(false, ConditionReason::InvalidWatermarks)]);
    assert_eq!(r.store.event_count(EventReason::InvalidWatermarks), 1);
}

/// A maintainer between passes holds its node's memory, not a pass: the pass's future
/// (kilobytes, with the store's and the source's calls inline) is boxed for the pass only.
/// An operator keeps one idle maintainer per node; unboxed, each took 11 KB at 5,000 nodes
/// (issue 31's heap profile), a third of the operator's heap.
#[tokio::test(start_paused = true)]
async fn an_idle_maintainer_holds_no_pass() {
    let r = rig(4);
    let (trigger, rx) =
        crate::trigger::trigger(tidepool_metrics::Trigger::PoolMaintainer, Duration::ZERO);
    let h = Arc::new(crate::shared::NodeHandle::new(info("a"), trigger));
    let task = super::run(r.mgr.shared().clone(), h, rx);
    let local = std::mem::size_of::<super::Local>();
    let size = std::mem::size_of_val(&task);
    assert!(
        size <= local + 512,
        "{size} bytes idle, of which the node's memory {local}"
    );
}
