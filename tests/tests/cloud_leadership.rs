//! For cloud sources a deposed leader makes no release call (issue 14): the engine's
//! leader signal is a REAL elector's (`Leadership::subscribe()` of `run_elector` against the
//! in-process API server), not a flag flipped by hand as in `sim/tests/leadership.rs`.
//!
//! Real time with short durations (lease 2 s, renew deadline 1 s, retry 250 ms). Two
//! replicas, each an elector (the operator's service account on its own node) and an engine
//! on one simulated cloud (sim-cloud, m5.4xlarge, 20 ms per call), one store and one pod API,
//! whose node sides answer the release handshake (the simulated world; its own engine never
//! leads). The cloud's unassign is unconditional, so safety rests on the lease (DESIGN.md
//! "Release handshake"). Each engine's source records when each release call was made.
//!
//! The node's pods go one every 100 ms (reuse cooldown 50 ms, release delay 100 ms), so
//! excess keeps appearing and the leader keeps releasing. Once it has released, the server
//! refuses its Lease updates (503) while its reads pass: it steps down at its renew deadline
//! without knowing it was deposed, the other replica takes over a lease duration after the
//! last renewal (a second later) and makes the releases. Pods keep going all the while, so
//! releases fall due in that second with no one allowed to make them: an engine that went
//! on after its step-down instant would release within it (with the leader signal forced
//! to stay true, this test fails so).
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use parking_lot::Mutex;
use tidepool_ipam::{
    AddrSet, Api, Budget, Clock, EngineConfig, EngineDeps, Family, Gate, IpSource, IpamError,
    MemoryNodeStore, MemoryPodView, NodeInfo, NodeManager, NodeName, PerFamily, PodUid, Quota,
    ReleaseState, SchedulingMode, Ungated, Watermarks,
};
use tidepool_operator::Error;
use tidepool_operator::leader::{DEFAULT_LEASE_NAME, LeaderConfig, Leadership, run_elector};
use tidepool_sim::cloud::{InstanceType, SimCloud};
use tidepool_sim::{World, WorldConfig};
use tidepool_tests::{AcceptedWrite, ApiServer, Faults, TargetedFault};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_millis(250);
const NS: &str = "tidepool";
const LEASES: &str = "leases.coordination.k8s.io";
const NODE: &str = "node-a";
const PODS: usize = 50;
/// One pod goes every this long.
const DELETE_EVERY: Duration = Duration::from_millis(100);
const REUSE_COOLDOWN: Duration = Duration::from_millis(50);
const RELEASE_DELAY: Duration = Duration::from_millis(100);
/// The pod informer's lag (the world's and the engines' second event of a deletion).
const CACHE_LAG: Duration = Duration::from_millis(50);

type Engine = NodeManager<Recorded, MemoryNodeStore, MemoryPodView>;

/// One release call an engine made on the cloud.
#[derive(Debug, Clone)]
struct ReleaseCall {
    /// When the engine called the source (the request goes out at once).
    at: Instant,
    /// When the cloud answered; None while under way.
    ended: Option<Instant>,
    addrs: AddrSet,
    ok: Option<bool>,
}

/// The shared cloud as one replica's engine sees it: every call passes through, and each
/// release call is recorded when it is made and when it is answered.
#[derive(Clone)]
struct Recorded {
    cloud: SimCloud,
    releases: Arc<Mutex<Vec<ReleaseCall>>>,
}

impl Recorded {
    fn new(cloud: SimCloud) -> Self {
        Recorded {
            cloud,
            releases: Arc::default(),
        }
    }

    fn releases(&self) -> Vec<ReleaseCall> {
        self.releases.lock().clone()
    }
}

impl IpSource for Recorded {
    fn name(&self) -> tidepool_metrics::Source {
        self.cloud.name()
    }

    fn families(&self) -> &[Family] {
        self.cloud.families()
    }

    fn grant_size(&self, family: Family) -> u128 {
        self.cloud.grant_size(family)
    }

    fn prepare_allocation(&self, node: &NodeName, family: Family, want: u64, limit: u64) -> u64 {
        self.cloud.prepare_allocation(node, family, want, limit)
    }

    async fn allocate<G: Gate>(
        &self,
        node: &NodeName,
        family: Family,
        count: u64,
        gate: &mut G,
    ) -> Result<AddrSet, IpamError> {
        self.cloud.allocate(node, family, count, gate).await
    }

    fn prepare_release(&self, node: &NodeName, free: &AddrSet, max: u64) -> AddrSet {
        self.cloud.prepare_release(node, free, max)
    }

    async fn release<G: Gate>(
        &self,
        node: &NodeName,
        addrs: &AddrSet,
        gate: &mut G,
    ) -> Result<(), IpamError> {
        // the call starts once admitted
        gate.request().await?;
        let i = {
            let mut calls = self.releases.lock();
            calls.push(ReleaseCall {
                at: Instant::now(),
                ended: None,
                addrs: addrs.clone(),
                ok: None,
            });
            calls.len() - 1
        };
        let r = self.cloud.release(node, addrs, &mut Ungated).await;
        let mut calls = self.releases.lock();
        calls[i].ended = Some(Instant::now());
        calls[i].ok = Some(r.is_ok());
        r
    }

    async fn describe(&self, node: &NodeName) -> Result<AddrSet, IpamError> {
        self.cloud.describe(node).await
    }

    fn quota(&self) -> PerFamily<Quota> {
        self.cloud.quota()
    }

    fn machine_gone(&self, node: &NodeName) -> bool {
        self.cloud.machine_gone(node)
    }
}

/// The server identity of replica `name`: the operator's service account on that node.
fn sa(name: &str) -> String {
    format!("{OPERATOR}@{name}")
}

/// One replica: its elector (a real one, against the server) and its engine, whose leader
/// signal is the elector's.
struct Replica {
    name: String,
    leadership: Leadership,
    stop: Option<oneshot::Sender<()>>,
    elector: JoinHandle<Result<(), Error>>,
    engine: Engine,
    source: Recorded,
}

impl Replica {
    async fn start(server: &ApiServer, world: &World<SimCloud>, name: &str) -> Replica {
        let config = LeaderConfig {
            lease_duration: LEASE,
            renew_deadline: RENEW,
            retry_period: RETRY,
            name: DEFAULT_LEASE_NAME.into(),
            namespace: NS.into(),
            identity: name.into(),
        };
        let leadership = Leadership::new(&config);
        let source = Recorded::new(world.source.clone());
        let engine = engine(world, source.clone(), leadership.subscribe());
        let kube_config = server.kube_config(&sa(name)).await.expect("kube config");
        let (stop, stopped) = oneshot::channel::<()>();
        let elector = tokio::spawn(run_elector(
            config,
            kube_config,
            leadership.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Replica {
            name: name.into(),
            leadership,
            stop: Some(stop),
            elector,
            engine,
            source,
        }
    }
}

/// An engine on the world's cloud, store and pods, fed the store's events as an informer
/// would, leading while `leader` says so.
fn engine(world: &World<SimCloud>, source: Recorded, leader: watch::Receiver<bool>) -> Engine {
    let engine = NodeManager::new(
        EngineDeps {
            source,
            store: world.store.clone(),
            pods: world.pods.clone(),
            clock: world.clock.clone() as Arc<dyn Clock>,
            source_budget: Budget::new(Api::Source, 10.0, 2, SchedulingMode::Priority)
                .expect("a source budget"),
            kube_budget: Budget::new(Api::Kube, 50.0, 100, SchedulingMode::Priority)
                .expect("a kube budget"),
            leader,
        },
        engine_config(),
    )
    .expect("an engine");
    let mut events = world.store.subscribe();
    let informer = engine.clone();
    tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            informer.on_store_event(&ev);
        }
    });
    engine.spawn_resync_loop();
    engine
}

fn engine_config() -> EngineConfig {
    let mut cfg = EngineConfig {
        resync_interval: Duration::from_secs(1),
        ..EngineConfig::default()
    };
    cfg.watermarks = Watermarks {
        pre_allocate: 2,
        ..Watermarks::default()
    };
    cfg.release.delay = RELEASE_DELAY;
    cfg
}

/// A world on sim-cloud whose own engine never leads: the replicas' engines do the work.
fn world() -> World<SimCloud> {
    let cfg = WorldConfig {
        max_pods: 232,
        reuse_cooldown: REUSE_COOLDOWN,
        cache_lag: CACHE_LAG,
        engine: engine_config(),
        ..WorldConfig::default()
    };
    let world = World::start_with(cfg, |w, observer, _store| {
        Ok(SimCloud::for_nodes(10, 16, w.seed)?
            .with_instance_type(InstanceType::by_name("m5.4xlarge")?)
            .with_latency(Duration::from_millis(20))
            .with_hook(observer))
    })
    .expect("a world");
    world.leader.send(false).expect("the world's engine");
    world
}

/// The pod informer of every engine: an event now and one when the cache shows the change.
fn pod_events(engines: &[Engine], node: &NodeName) {
    for e in engines {
        e.on_pod_event(node);
        let (e, node) = (e.clone(), node.clone());
        tokio::spawn(async move {
            tokio::time::sleep(CACHE_LAG).await;
            e.on_pod_event(&node);
        });
    }
}

fn lease_writes_of(server: &ApiServer, name: &str) -> Vec<AcceptedWrite> {
    server
        .accepted_writes()
        .into_iter()
        .filter(|w| w.resource == LEASES && w.identity == sa(name))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_makes_no_release_call_on_the_cloud() {
    let (server, _admin) = operator_cluster().await;
    let world = world();
    let mut replicas = vec![
        Replica::start(&server, &world, "a").await,
        Replica::start(&server, &world, "b").await,
    ];
    let old = eventually(Duration::from_secs(5), "one replica leads", || {
        let leading: Vec<usize> = (0..replicas.len())
            .filter(|i| replicas[*i].leadership.is_leading())
            .collect();
        async move { (leading.len() == 1).then(|| leading[0]) }
    })
    .await;
    let old = replicas.remove(old);
    let new = replicas.pop().expect("two replicas");
    let engines = [old.engine.clone(), new.engine.clone()];

    // One node with its pods, all running: the leader claims pods + 2.
    let node = world.add_node(NODE);
    let info = NodeInfo {
        name: node.clone(),
        uid: world.node_uid(NODE).expect("its uid"),
        allocatable_pods: 232,
        cordoned: false,
        terminating: false,
    };
    for e in &engines {
        e.upsert_node(info.clone());
    }
    let pods: Vec<PodUid> = (0..PODS)
        .map(|_| {
            let p = world.schedule_pod(&node);
            pod_events(&engines, &node);
            p
        })
        .collect();
    eventually(Duration::from_secs(10), "every pod runs", || {
        let used = world.node(NODE).map_or(0, |n| n.node.used.len());
        async move { (used == PODS).then_some(()) }
    })
    .await;
    assert!(old.source.releases().is_empty() && new.source.releases().is_empty());

    // The pods go one by one: excess appears again and again.
    let deleted_at: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let deleting = {
        let (world, engines, node) = (world.clone(), engines.clone(), node.clone());
        let deleted_at = deleted_at.clone();
        tokio::spawn(async move {
            for p in pods {
                world.delete_pod(p, false);
                deleted_at.lock().push(Instant::now());
                pod_events(&engines, &node);
                tokio::time::sleep(DELETE_EVERY).await;
            }
        })
    };
    eventually(
        Duration::from_secs(10),
        "the leader releases on the cloud",
        || {
            let done = old.source.releases().iter().any(|c| c.ok == Some(true));
            async move { done.then_some(()) }
        },
    )
    .await;

    // Deposed without knowing it: only its Lease updates are refused.
    server.set_faults(Faults {
        targeted: vec![TargetedFault {
            identity: sa(&old.name),
            resource: LEASES.into(),
            verbs: ["update".to_string()].into(),
            error_code: Some(503),
            ..TargetedFault::default()
        }],
        ..Faults::default()
    });
    let faulted = Instant::now();
    // its last step-down instant, polled from its handle until it no longer leads
    let mut step_down_at = None;
    let stopped = eventually(
        RENEW + RETRY + Duration::from_secs(1),
        "it steps down",
        || {
            if let Some(d) = old.leadership.step_down_instant() {
                step_down_at = Some(d);
            }
            let leads = old.leadership.is_leading();
            async move { (!leads).then(Instant::now) }
        },
    )
    .await;
    let step_down_at = step_down_at.expect("it led");
    let ended = tokio::time::timeout(Duration::from_secs(2), old.elector)
        .await
        .expect("the deposed elector ends")
        .expect("its task");
    assert!(
        matches!(ended, Err(Error::LeadershipLost { .. })),
        "{ended:?}"
    );
    let last_renewal = lease_writes_of(&server, &old.name)
        .last()
        .expect("it renewed")
        .at;
    assert!(step_down_at.into_std() <= last_renewal + RENEW);

    eventually(Duration::from_secs(8), "the other replica leads", || {
        let leads = new.leadership.is_leading();
        async move { leads.then_some(()) }
    })
    .await;
    let took_over = Instant::from_std(lease_writes_of(&server, &new.name)[0].at);
    assert!(
        !deleting.is_finished(),
        "pods still go when the new leader takes over"
    );
    deleting.await.expect("the deletions");
    // the new leader finishes the handshakes: every pod gone, 2 addresses left, no mark open
    eventually(Duration::from_secs(20), "the releases are done", || {
        let n = world.node(NODE).expect("the node");
        let done = n.node.used.is_empty()
            && n.operator.addresses.total() == 2
            && n.operator
                .release
                .iter()
                .all(|(_, s)| *s != ReleaseState::MarkedForRelease);
        async move { done.then_some(()) }
    })
    .await;
    // time for a late call of the deposed engine, which keeps running
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.set_faults(Faults::default());

    let by_old = old.source.releases();
    let by_new = new.source.releases();
    // pods deleted after the step-down instant whose addresses were past the reuse cooldown
    // and the release delay before the new leader took over: releases due while no one led
    let fell_due = deleted_at
        .lock()
        .iter()
        .filter(|d| **d >= step_down_at && **d + REUSE_COOLDOWN + RELEASE_DELAY < took_over)
        .count();
    // seconds from the fault (negative: before it)
    let since = |t: Instant| {
        if t >= faulted {
            (t - faulted).as_secs_f64()
        } else {
            -(faulted - t).as_secs_f64()
        }
    };
    eprintln!(
        "fault at 0; step-down instant {:.3} s (seen {:.3} s); the new leader's first Lease \
         write {:.3} s; {fell_due} pods' addresses fell due for release in between",
        since(step_down_at),
        since(stopped),
        since(took_over),
    );
    for (who, calls) in [("old", &by_old), ("new", &by_new)] {
        for c in calls {
            eprintln!(
                "  {who} leader's release call at {:+.3} s: {} addresses, ok {:?}",
                since(c.at),
                c.addrs.total(),
                c.ok
            );
        }
    }

    assert!(
        by_old
            .iter()
            .any(|c| c.at < step_down_at && c.ok == Some(true)),
        "the old leader released before it stepped down"
    );
    let late: Vec<&ReleaseCall> = by_old.iter().filter(|c| c.at >= step_down_at).collect();
    assert!(
        late.is_empty(),
        "the deposed leader called release after its step-down instant: {late:?}"
    );
    for c in &by_old {
        let answered = c.ended.expect("answered");
        assert!(
            answered < took_over,
            "an old leader's release was answered after the new leader took over: {c:?}"
        );
    }
    assert!(fell_due >= 3, "releases fell due while no one led");
    assert!(
        !by_new.is_empty()
            && by_new
                .iter()
                .all(|c| c.at >= took_over && c.ok == Some(true)),
        "the new leader released, and only while leading: {by_new:?}"
    );
    let held = world.source.describe(&node).await.expect("describe");
    assert_eq!(held.total(), 2, "the cloud holds what the node keeps");
    assert!(
        world.observer.invariants().ok(),
        "{:?}",
        world.observer.violations()
    );

    drop(new.stop);
    tokio::time::timeout(Duration::from_secs(5), new.elector)
        .await
        .expect("the new leader's elector stops")
        .expect("its task")
        .expect("a shutdown ends Ok");
    drop(old.stop);
    old.engine.shutdown();
    new.engine.shutdown();
    world.shutdown();
}
