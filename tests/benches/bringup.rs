//! Issue 13's measured bring-up: N nodes × P pods on the cluster pool, the operator's
//! runtime in-process against the in-process API server (RBAC on, the operator's own role).
//! A benchmark, not a test: it prints what it measured and asserts no timing.
//!
//! ```text
//! cargo bench -p tidepool-tests --bench bringup [-- --nodes 1000 --pods-per-node 30 --qps 200 --burst 100 --delete-rate 0]
//! ```
//! (or `BRINGUP_NODES`, `BRINGUP_PODS_PER_NODE`, `BRINGUP_QPS`, `BRINGUP_BURST`,
//! `BRINGUP_DELETE_RATE`; tracing goes to stderr under `RUST_LOG`, default `warn`).
//!
//! 1. The server, the CRDs, the operator's RBAC, a /12 IPv4 pool in /27 blocks, N Nodes and
//!    P pending pods per node (bound, no podIPs).
//! 2. The runtime starts; every 200 ms the IPAMBlocks and IPAMNodes are listed until every
//!    node's blocks hold ≥ P + 8 addresses and its IPAMNode exists with `status.allocated`
//!    at that target. The server's request counters and the engine's metrics (a debugging
//!    recorder: passes are runs of the `pool-maintainer` trigger, kube tokens are waits on
//!    the kube budget) give the writes per node and per pass.
//! 3. A test node side records every pod in `status.used` (one apply per node), 10% of the
//!    pods are deleted, and a watch of the IPAMNodes notes when each deleted pod's address
//!    gets its tombstone in `spec.reclaim` (a watch, not a poll: listing 1,000 IPAMNodes
//!    with 30 entries each every 200 ms took a good part of the two cores). The deletions
//!    go all at once, or `--delete-rate` per second: the in-process server's delete scans
//!    every object for dependents (~25 ms under its store lock at 30,000 pods), so 3,000
//!    deletions at once hold the server for over a minute.
//! 4. The process's memory at each phase's end (VmRSS, VmHWM, the live heap of a counting
//!    allocator; the heap freed when the operator stops); then a PodIndex and a store
//!    cache are built from the listed objects under that allocator (heap per pod, per
//!    IPAMNode, per block).
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../tests/common/mod.rs"]
mod common;
mod shared;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::Event;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::json;
use shared::{PodRec, node_name, proc_kib, quantile, sockets, sorted, used_entry};
use tidepool_api as api;
use tidepool_ipam::{AddrSet, EngineConfig, ReclaimConfig, SchedulingMode};
use tidepool_operator::index::{PodGetter, PodIndex};
use tidepool_operator::runtime::{self, Settings};
use tidepool_operator::store::Cache;
use tidepool_sim::alloc::CountingAllocator;
use tidepool_tests::{ApiServer, Config};

const OPERATOR: &str = "system:serviceaccount:tidepool:tidepool-operator";
const POOL_CIDR: &str = "10.0.0.0/12";
const BLOCK_PREFIX: u8 = 27;
/// Requests the bench keeps in flight while it creates, records and deletes.
const CONCURRENCY: usize = 32;
const POLL: Duration = Duration::from_millis(200);
const RECLAIM: Duration = Duration::from_secs(1);
/// How long the bench waits after the bring-up and after recording `status.used`.
const SETTLE: Duration = Duration::from_secs(3);
const WRITE_VERBS: &[&str] = &["create", "update", "patch", "apply", "delete"];

// ---- a counting allocator: live heap bytes ----

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

fn live_heap() -> isize {
    ALLOCATOR.live_bytes()
}

// ---- warnings and errors the operator logs ----

static WARNINGS: AtomicU64 = AtomicU64::new(0);
static ERRORS: AtomicU64 = AtomicU64::new(0);

struct CountLevels;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountLevels {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        match *e.metadata().level() {
            tracing::Level::ERROR => ERRORS.fetch_add(1, Ordering::Relaxed),
            tracing::Level::WARN => WARNINGS.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }
}

fn init_tracing() {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(CountLevels)
        .init();
}

// ---- options ----

#[derive(Debug, Clone)]
struct Opts {
    nodes: usize,
    pods_per_node: usize,
    qps: f64,
    burst: u32,
    /// Pod deletions per second in the reclaim phase (0: all at once).
    delete_rate: f64,
}

fn opts() -> Opts {
    let get = common::setting;
    let num = |flag: &str, env: &str, default: &str| -> f64 {
        let v = get(flag, env, default);
        v.parse()
            .unwrap_or_else(|_| panic!("{flag} ({env}): not a number: {v}"))
    };
    Opts {
        nodes: num("--nodes", "BRINGUP_NODES", "1000") as usize,
        pods_per_node: num("--pods-per-node", "BRINGUP_PODS_PER_NODE", "30") as usize,
        qps: num("--qps", "BRINGUP_QPS", "200"),
        burst: num("--burst", "BRINGUP_BURST", "100") as u32,
        delete_rate: num("--delete-rate", "BRINGUP_DELETE_RATE", "0"),
    }
}

impl Opts {
    fn target(&self) -> u128 {
        shared::target(self.pods_per_node)
    }

    fn block_addresses(&self) -> u128 {
        1 << (32 - BLOCK_PREFIX)
    }

    fn writes_needed(&self) -> u64 {
        shared::writes_needed(self.nodes, self.pods_per_node, BLOCK_PREFIX)
    }

    fn lower_bound(&self) -> f64 {
        shared::lower_bound(self.writes_needed(), self.burst, self.qps)
    }
}

// ---- the cluster ----

/// The server with RBAC on, the default watch window (1,000 events per resource), watches
/// that last an hour (none ends during the bench, so none resumes from an old
/// resourceVersion), fast bookmarks, the three CRDs established and the operator's role
/// granted.
async fn cluster() -> (ApiServer, kube::Client) {
    common::operator_cluster_with(Config {
        rbac: true,
        watch_window: 1000,
        bookmark_interval: Duration::from_millis(200),
        min_request_timeout: Duration::from_secs(3600),
        namespace_finalize_delay: Duration::from_millis(100),
        kubelet_delay: Some(Duration::from_millis(100)),
        ..Config::default()
    })
    .await
}

/// The pool, the Nodes and their pods; returns the pods with their UIDs.
async fn populate(admin: &kube::Client, o: &Opts) -> Vec<PodRec> {
    shared::create_pool(admin, POOL_CIDR, BLOCK_PREFIX).await;
    shared::create_nodes(admin, o.nodes, CONCURRENCY).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let all = (0..o.nodes).flat_map(|n| (0..o.pods_per_node).map(move |k| (n, k)));
    futures::stream::iter(all)
        .map(|(n, k)| {
            let pods = pods.clone();
            async move {
                let rec = PodRec {
                    name: format!("p-{n:05}-{k:03}"),
                    node: node_name(n),
                    uid: String::new(),
                };
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": rec.name, "namespace": "default"},
                    "spec": {"nodeName": rec.node, "containers": [{"name": "c", "image": "pause"}]},
                }))
                .expect("a pod");
                let created = pods.create(&PostParams::default(), &pod).await?;
                let uid = created.metadata.uid.expect("a uid");
                Ok::<_, kube::Error>(PodRec { uid, ..rec })
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
        .expect("pods")
}

fn settings(o: &Opts) -> Settings {
    Settings {
        engine: EngineConfig {
            reclaim: ReclaimConfig {
                grace: RECLAIM,
                min_age: RECLAIM,
            },
            ..EngineConfig::default()
        },
        scheduling: SchedulingMode::Priority,
        kube_api_qps: o.qps,
        kube_api_burst: o.burst,
        node_selector: Default::default(),
        sync_timeout: Duration::from_secs(300),
        health_addr: None,
        seed: 7,
        taint_exhausted_nodes: false,
        agent_ready_grace: tidepool_operator::runtime::DEFAULT_AGENT_READY_GRACE,
        agent_pods: tidepool_operator::runtime::default_agent_pods(),
        election: None,
    }
}

/// Starts the operator's runtime as its service account; sending on the sender stops it.
async fn start_operator(
    server: &ApiServer,
    s: Settings,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let client = server.client(OPERATOR).await.expect("operator client");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        runtime::run(client, s, async {
            let _ = stopped.await;
        })
        .await
        .expect("the operator runs and stops cleanly");
    });
    (stop, task)
}

// ---- what the server holds ----

/// Every IPAMBlock, by node: its addresses and its block count; and the addresses two
/// blocks share (must be none).
struct Blocks {
    by_node: HashMap<String, (usize, AddrSet)>,
    total: usize,
    overlapping: u128,
}

async fn blocks(admin: &kube::Client) -> Blocks {
    let list = Api::<api::IPAMBlock>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list blocks");
    let mut by_node: HashMap<String, (usize, AddrSet)> = HashMap::new();
    let mut all = AddrSet::new();
    let mut overlapping = 0;
    for b in &list.items {
        let net: ipnet::IpNet = b.spec.cidr.0.parse().expect("a CIDR");
        let set = AddrSet::of_net(&net);
        overlapping += all.intersection(&set).total();
        all.union_with(&set);
        let e = by_node.entry(b.spec.node.clone()).or_default();
        e.0 += 1;
        e.1.union_with(&set);
    }
    Blocks {
        by_node,
        total: list.items.len(),
        overlapping,
    }
}

fn at_target(b: &Blocks, o: &Opts) -> usize {
    b.by_node
        .values()
        .filter(|(_, a)| a.total() >= o.target())
        .count()
}

/// Operator writes counted by the server, by (verb, resource).
fn writes(server: &ApiServer) -> BTreeMap<(String, String), u64> {
    server
        .requests()
        .into_iter()
        .filter(|((verb, _), _)| WRITE_VERBS.contains(&verb.as_str()))
        .collect()
}

/// What the engine recorded since the last snapshot: maintainer runs (passes), resync
/// runs, kube budget tokens and the engine's API calls by (api, op).
#[derive(Default, Debug)]
struct Engine {
    passes: u64,
    resyncs: u64,
    kube_tokens: u64,
    calls: BTreeMap<String, u64>,
}

fn engine_metrics(snap: &Snapshotter) -> Engine {
    let mut e = Engine::default();
    for (key, _, _, value) in snap.snapshot().into_vec() {
        let k = key.key();
        let label = |name: &str| {
            k.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_string())
                .unwrap_or_default()
        };
        match (k.name(), value) {
            (tidepool_metrics_names::TRIGGER_DURATION, DebugValue::Histogram(v)) => {
                match label("trigger").as_str() {
                    "pool-maintainer" => e.passes += v.len() as u64,
                    "resync" => e.resyncs += v.len() as u64,
                    _ => {}
                }
            }
            (tidepool_metrics_names::API_WAIT, DebugValue::Histogram(v))
                if label("api") == "kube" =>
            {
                e.kube_tokens += v.len() as u64;
            }
            (tidepool_metrics_names::API_REQUESTS, DebugValue::Counter(n)) => {
                let op = format!("{} {} {}", label("api"), label("op"), label("outcome"));
                *e.calls.entry(op).or_default() += n;
            }
            _ => {}
        }
    }
    e
}

/// The metric names (tidepool-metrics is not a dependency of this crate; the names are
/// part of the operator's documented interface, `tidepool_metrics::*`).
mod tidepool_metrics_names {
    pub const TRIGGER_DURATION: &str = "tidepool_ipam_trigger_duration_seconds";
    pub const API_WAIT: &str = "tidepool_ipam_api_wait_seconds";
    pub const API_REQUESTS: &str = "tidepool_ipam_api_requests_total";
}

// ---- phase 2: the bring-up ----

/// The writes the server counted and what the engine recorded since the last call; both
/// start again from zero.
struct Phase {
    writes: BTreeMap<(String, String), u64>,
    engine: Engine,
}

fn phase(server: &ApiServer, metrics: &Snapshotter) -> Phase {
    let p = Phase {
        writes: writes(server),
        engine: engine_metrics(metrics),
    };
    server.reset_counters();
    p
}

struct BringUp {
    /// From the runtime's start until every node's blocks held its target (None: not in
    /// time).
    blocks_done: Option<Duration>,
    /// … and until every node's IPAMNode also existed with `status.allocated` at target
    /// (its create and status apply done).
    done: Option<Duration>,
    /// From the runtime's start to the first write the server saw.
    first_write: Option<Duration>,
    nodes_at_target: usize,
    ipamnodes_at_target: usize,
    blocks: Blocks,
}

/// IPAMNodes whose `status.allocated` shows the target.
async fn ipamnodes_at_target(admin: &kube::Client, o: &Opts) -> usize {
    let list = Api::<api::IPAMNode>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list ipamnodes");
    let target = o.target() as i64;
    list.items
        .iter()
        .filter(|n| n.status.as_ref().and_then(|s| s.allocated) >= Some(target))
        .count()
}

/// Lists the blocks and the IPAMNodes every 200 ms until every node is at target (or
/// `timeout`); between two lists the server's counters are read every 10 ms for the
/// operator's first write.
async fn bring_up(server: &ApiServer, admin: &kube::Client, o: &Opts, t0: Instant) -> BringUp {
    let timeout = Duration::from_secs(900);
    let (mut first_write, mut blocks_done) = (None, None);
    let mut last_print = Instant::now();
    loop {
        let b = blocks(admin).await;
        let n = at_target(&b, o);
        if n == o.nodes && blocks_done.is_none() {
            blocks_done = Some(t0.elapsed());
        }
        let m = ipamnodes_at_target(admin, o).await;
        let out_of_time = t0.elapsed() > timeout;
        if (n == o.nodes && m == o.nodes) || out_of_time {
            return BringUp {
                blocks_done,
                done: (!out_of_time).then(|| t0.elapsed()),
                first_write,
                nodes_at_target: n,
                ipamnodes_at_target: m,
                blocks: b,
            };
        }
        if last_print.elapsed() > Duration::from_secs(5) {
            eprintln!(
                "[{:6.1} s] {n} of {} nodes' blocks and {m} IPAMNodes at target, {} blocks",
                t0.elapsed().as_secs_f64(),
                o.nodes,
                b.total
            );
            last_print = Instant::now();
        }
        let next = Instant::now() + POLL;
        while Instant::now() < next {
            if first_write.is_none() && !writes(server).is_empty() {
                first_write = Some(t0.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

// ---- phase 3: reclaim after pod deletions ----

/// The node side's `status.used`: each pod of a node on one of its addresses, one apply
/// per node. Returns each pod's address.
async fn record_used(admin: &kube::Client, pods: &[PodRec], b: &Blocks) -> HashMap<String, String> {
    let mut by_node: BTreeMap<&str, Vec<&PodRec>> = BTreeMap::new();
    for p in pods {
        by_node.entry(p.node.as_str()).or_default().push(p);
    }
    let mut addr_of = HashMap::new();
    let mut bodies = Vec::new();
    for (node, ps) in by_node {
        let addrs = &b.by_node.get(node).expect("the node has blocks").1;
        let mut used = serde_json::Map::new();
        for (p, a) in ps.iter().zip(addrs.iter()) {
            addr_of.insert(p.name.clone(), a.to_string());
            used.insert(a.to_string(), used_entry(p));
        }
        bodies.push((node.to_string(), used));
    }
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let pp = PatchParams::apply(api::names::AGENT_MANAGER);
    futures::stream::iter(bodies)
        .map(|(node, used)| {
            let (api, pp) = (ipamnodes.clone(), pp.clone());
            async move {
                let body = json!({
                    "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
                    "metadata": {"name": node}, "status": {"used": used},
                });
                api.patch_status(&node, &pp, &Patch::Apply(&body)).await
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await
        .expect("the node side's status applies");
    addr_of
}

/// Every tenth pod (three of each node's 30).
fn to_delete(pods: &[PodRec]) -> Vec<PodRec> {
    let k = |p: &PodRec| -> usize { p.name.rsplit('-').next().unwrap().parse().unwrap() };
    pods.iter().filter(|p| k(p) % 10 == 0).cloned().collect()
}

/// A deleted pod: when its delete was sent and when the server answered it (the pod gone).
struct Deleted {
    pod: PodRec,
    sent: Instant,
    answered: Instant,
}

/// Deletes the pods (grace 0, up to `CONCURRENCY` requests in flight): all at once when
/// `rate` is 0, else the i-th at i / `rate` seconds.
async fn delete_pods(admin: &kube::Client, pods: Vec<PodRec>, rate: f64) -> Vec<Deleted> {
    let api: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let start = tokio::time::Instant::now();
    futures::stream::iter(pods.into_iter().enumerate())
        .map(|(i, pod)| {
            let api = api.clone();
            async move {
                if rate > 0.0 {
                    tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate))
                        .await;
                }
                let sent = Instant::now();
                api.delete(&pod.name, &DeleteParams::default().grace_period(0))
                    .await?;
                let answered = Instant::now();
                Ok::<_, kube::Error>(Deleted {
                    pod,
                    sent,
                    answered,
                })
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
        .expect("pod deletions")
}

/// When each (IPAMNode, address) tombstone was first seen in `spec.reclaim`.
type Tombstones = std::sync::Arc<parking_lot::Mutex<HashMap<(String, String), Instant>>>;

/// Watches the IPAMNodes (as admin) and notes the arrival of every tombstone; returns
/// once the watch has listed.
async fn watch_tombstones(admin: &kube::Client) -> (Tombstones, tokio::task::JoinHandle<()>) {
    let seen = Tombstones::default();
    let (listed, ready) = tokio::sync::oneshot::channel::<()>();
    let api: Api<api::IPAMNode> = Api::all(admin.clone());
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut stream = kube::runtime::watcher(api, Default::default()).boxed();
        while let Some(ev) = stream.next().await {
            let now = Instant::now();
            match ev {
                Ok(Event::Apply(n) | Event::InitApply(n)) => {
                    let name = n.metadata.name.clone().unwrap_or_default();
                    let mut seen = out.lock();
                    for addr in n.spec.reclaim.keys() {
                        seen.entry((name.clone(), addr.clone())).or_insert(now);
                    }
                }
                Ok(Event::InitDone) => {
                    if let Some(l) = listed.take() {
                        let _ = l.send(());
                    }
                }
                Ok(_) => {}
                Err(e) => eprintln!("the bench's IPAMNode watch: {e}"),
            }
        }
    });
    ready.await.expect("the IPAMNode watch lists");
    (seen, task)
}

struct Reclaim {
    deleted: usize,
    /// From the first delete sent to the last answered.
    deleting: Duration,
    /// Each delete request's time, sorted (seconds).
    delete_requests: Vec<f64>,
    /// From each delete's answer to its tombstone's watch event, sorted (seconds).
    latencies: Vec<f64>,
    /// One line per deleted pod whose tombstone never came.
    missing: Vec<String>,
    used_entries: usize,
    phase: Phase,
}

/// Deletes every tenth pod and measures the time from each deletion (the server's
/// answer) to its address's tombstone arriving on a watch of the IPAMNodes.
async fn reclaim(
    server: &ApiServer,
    admin: &kube::Client,
    o: &Opts,
    pods: &[PodRec],
    addr_of: &HashMap<String, String>,
    metrics: &Snapshotter,
) -> Reclaim {
    let (seen, watch) = watch_tombstones(admin).await;
    let started = Instant::now();
    let deleted = delete_pods(admin, to_delete(pods), o.delete_rate).await;
    let deleting = started.elapsed();
    let key = |p: &PodRec| (p.node.clone(), addr_of[&p.name].clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let all = {
            let s = seen.lock();
            deleted.iter().all(|d| s.contains_key(&key(&d.pod)))
        };
        if all {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watch.abort();
    let p = phase(server, metrics);
    let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    let (latencies, missing) = {
        let s = seen.lock();
        let latencies = sorted(deleted.iter().filter_map(|d| {
            let at = s.get(&key(&d.pod))?;
            Some(secs(d.answered, *at))
        }));
        let missing: Vec<&Deleted> = deleted
            .iter()
            .filter(|d| !s.contains_key(&key(&d.pod)))
            .collect();
        (latencies, missing)
    };
    let mut notes = Vec::new();
    for d in missing {
        notes.push(explain_missing(admin, &d.pod, &addr_of[&d.pod.name]).await);
    }
    Reclaim {
        deleted: deleted.len(),
        deleting,
        delete_requests: sorted(deleted.iter().map(|d| secs(d.sent, d.answered))),
        latencies,
        missing: notes,
        used_entries: used_entries(admin).await,
        phase: p,
    }
}

/// What the server holds for a deleted pod whose tombstone never came.
async fn explain_missing(admin: &kube::Client, p: &PodRec, addr: &str) -> String {
    let node = Api::<api::IPAMNode>::all(admin.clone())
        .get(&p.node)
        .await
        .expect("the IPAMNode");
    let pod = Api::<Pod>::namespaced(admin.clone(), "default")
        .get_opt(&p.name)
        .await
        .expect("get pod");
    let used = node.status.as_ref().and_then(|s| s.used.get(addr));
    format!(
        "{} {addr} (pod {} uid {}): pod on the server: {}; used entry: {}; tombstones now: {:?}",
        p.node,
        p.name,
        p.uid,
        pod.is_some(),
        used.map_or("none".into(), |u| format!(
            "pod {} uid {}",
            u.pod, u.pod_uid
        )),
        node.spec.reclaim.keys().collect::<Vec<_>>(),
    )
}

/// `status.used` entries on the server (the node side's; none may be lost).
async fn used_entries(admin: &kube::Client) -> usize {
    let list = Api::<api::IPAMNode>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list ipamnodes");
    list.items
        .iter()
        .map(|n| n.status.as_ref().map_or(0, |s| s.used.len()))
        .sum()
}

// ---- phase 4: heap per object in the indexes ----

struct NoServer;

impl PodGetter for NoServer {
    fn get(&self, _: &str, _: &str) -> BoxFuture<'static, Result<Option<Pod>, kube::Error>> {
        Box::pin(async { Ok(None) })
    }
}

struct Memory {
    pods: usize,
    per_pod_index: f64,
    per_pod_listed: f64,
    ipamnodes: usize,
    per_ipamnode: f64,
    blocks: usize,
    per_block: f64,
}

/// Lists every pod, IPAMNode and block (the server quiet: the operator stopped), then
/// counts the live heap a PodIndex and a store cache hold after a relist of them.
async fn memory(admin: &kube::Client) -> Memory {
    let pods = Api::<Pod>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list pods")
        .items;
    let start = live_heap();
    let copy = pods.clone();
    let per_pod_listed = (live_heap() - start) as f64 / pods.len().max(1) as f64;
    drop(copy);
    let nodes = Api::<api::IPAMNode>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list ipamnodes")
        .items;
    let blocks = Api::<api::IPAMBlock>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list blocks")
        .items;
    let start = live_heap();
    let idx = PodIndex::new(NoServer);
    relist(&pods, |ev| drop(idx.apply(ev)));
    let index_bytes = live_heap() - start;
    let start = live_heap();
    let mut cache = Cache::default();
    relist(&nodes, |ev| drop(cache.apply_node_event(ev)));
    let node_bytes = live_heap() - start;
    let start = live_heap();
    relist(&blocks, |ev| drop(cache.apply_block_event(ev)));
    let block_bytes = live_heap() - start;
    let per = |b: isize, n: usize| b as f64 / n.max(1) as f64;
    Memory {
        pods: pods.len(),
        per_pod_index: per(index_bytes, pods.len()),
        per_pod_listed,
        ipamnodes: nodes.len(),
        per_ipamnode: per(node_bytes, nodes.len()),
        blocks: blocks.len(),
        per_block: per(block_bytes, blocks.len()),
    }
}

/// Init, one InitApply per object (a clone, dropped by the index if not kept), InitDone.
fn relist<K: Clone>(objs: &[K], mut apply: impl FnMut(&Event<K>)) {
    apply(&Event::Init);
    for o in objs {
        apply(&Event::InitApply(o.clone()));
    }
    apply(&Event::InitDone);
}

// ---- the report ----

fn print_phase(title: &str, p: &Phase, nodes: usize) {
    let passes = p.engine.passes;
    println!("{title}");
    println!(
        "  {:<8} {:<32} {:>8} {:>9} {:>9}",
        "verb", "resource", "count", "per node", "per pass"
    );
    let mut total = 0;
    for ((verb, res), n) in &p.writes {
        total += n;
        println!(
            "  {verb:<8} {res:<32} {n:>8} {:>9.3} {:>9.3}",
            *n as f64 / nodes as f64,
            *n as f64 / passes.max(1) as f64
        );
    }
    println!(
        "  {:<8} {:<32} {total:>8} {:>9.3} {:>9.3}",
        "all",
        "",
        total as f64 / nodes as f64,
        total as f64 / passes.max(1) as f64
    );
    let e = &p.engine;
    println!(
        "  engine: {} maintainer passes, {} resyncs, {} kube budget tokens",
        e.passes, e.resyncs, e.kube_tokens
    );
    for (call, n) in &e.calls {
        println!("    tidepool_ipam_api_requests_total{{{call}}} {n}");
    }
}

fn print_bring_up(o: &Opts, b: &BringUp, setup: Duration, p: &Phase) {
    let lb = o.lower_bound();
    println!(
        "bring-up: {} nodes × {} pods, /{BLOCK_PREFIX} blocks of {POOL_CIDR}, kube budget {} qps burst {} (setup took {:.1} s)",
        o.nodes,
        o.pods_per_node,
        o.qps,
        o.burst,
        setup.as_secs_f64()
    );
    println!(
        "  writes needed: {} nodes × (1 IPAMNode create + 1 status apply + {} block creates) = {}; lower bound ({} − {}) / {} = {lb:.2} s",
        o.nodes,
        o.target().div_ceil(o.block_addresses()),
        o.writes_needed(),
        o.writes_needed(),
        o.burst,
        o.qps
    );
    let secs = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
    let (fw, bd, d) = (secs(b.first_write), secs(b.blocks_done), secs(b.done));
    // the burst covers every write: no bound to compare with
    let x = |t: f64| {
        if lb > 0.0 {
            format!("{:.2}×", t / lb)
        } else {
            "-".into()
        }
    };
    println!(
        "  from the runtime's start: first write {fw:.2} s; every node's blocks at target {bd:.2} s ({} the bound); every IPAMNode created with status.allocated at target {d:.2} s ({}; {:.2} s = {} from the first write)",
        x(bd),
        x(d),
        d - fw,
        x(d - fw)
    );
    if b.done.is_none() {
        println!(
            "  NOT DONE: {} nodes' blocks and {} IPAMNodes of {} at target when the bench gave up",
            b.nodes_at_target, b.ipamnodes_at_target, o.nodes
        );
    }
    let max_blocks = b
        .blocks
        .by_node
        .values()
        .map(|(n, _)| *n)
        .max()
        .unwrap_or(0);
    println!(
        "  {} blocks on {} nodes (at most {max_blocks} on one), {} addresses in more than one block",
        b.blocks.total,
        b.blocks.by_node.len(),
        b.blocks.overlapping
    );
    print_phase(
        &format!("  writes from the start until {SETTLE:?} after the last node was done:"),
        p,
        o.nodes,
    );
}

fn print_reclaim(o: &Opts, r: &Reclaim) {
    let l = &r.latencies;
    let pace = if o.delete_rate > 0.0 {
        format!("{} per second", o.delete_rate)
    } else {
        "all at once".to_string()
    };
    let d = &r.delete_requests;
    println!(
        "reclaim: {} pods deleted (grace 0, {pace}) in {:.2} s (a delete request took p50 {:.3} s, max {:.3} s); reclaim grace {RECLAIM:?} and min age {RECLAIM:?}; the delete's answer → the tombstone's watch event:",
        r.deleted,
        r.deleting.as_secs_f64(),
        quantile(d, 0.5),
        quantile(d, 1.0)
    );
    println!(
        "  p50 {:.2} s, p99 {:.2} s, max {:.2} s over {} tombstones; {} never seen; {} status.used entries on the server at the end (of {})",
        quantile(l, 0.5),
        quantile(l, 0.99),
        quantile(l, 1.0),
        l.len(),
        r.missing.len(),
        r.used_entries,
        o.nodes * o.pods_per_node
    );
    for m in &r.missing {
        println!("  NEVER RECLAIMED: {m}");
    }
    print_phase(
        "  writes the server counted in this phase (the pod deletes are the bench's):",
        &r.phase,
        o.nodes,
    );
}

fn print_memory(m: &Memory) {
    println!("memory:");
    println!(
        "  peak RSS (VmHWM, whole process: API server with every object, operator, bench) {} KiB",
        proc_kib("self", "VmHWM")
    );
    println!(
        "  PodIndex: {:.0} B per pod ({} pods; a copy of the listed Pod objects {:.0} B each)",
        m.per_pod_index, m.pods, m.per_pod_listed
    );
    println!(
        "  store cache: {:.0} B per IPAMNode ({}), {:.0} B per IPAMBlock ({})",
        m.per_ipamnode, m.ipamnodes, m.per_block, m.blocks
    );
    println!(
        "  operator log: {} warnings, {} errors",
        WARNINGS.load(Ordering::Relaxed),
        ERRORS.load(Ordering::Relaxed)
    );
}

// ---- main ----

fn main() {
    ALLOCATOR.start();
    let o = opts();
    init_tracing();
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    recorder.install().expect("metrics recorder");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench(o, snap));
}

async fn bench(o: Opts, snap: Snapshotter) {
    let t_setup = Instant::now();
    let (server, admin) = cluster().await;
    let pods = populate(&admin, &o).await;
    let setup = t_setup.elapsed();
    let _ = phase(&server, &snap);
    checkpoint("the cluster populated, before the runtime starts");
    let t0 = Instant::now();
    let (stop, task) = start_operator(&server, settings(&o)).await;
    let b = bring_up(&server, &admin, &o, t0).await;
    tokio::time::sleep(SETTLE).await;
    print_bring_up(&o, &b, setup, &phase(&server, &snap));
    checkpoint("the bring-up done");
    if b.done.is_none() {
        finish(stop, task, &admin).await;
        return;
    }
    // the node side records every pod; the operator sees the entries for longer than the
    // min age before the deletions
    let addr_of = record_used(&admin, &pods, &b.blocks).await;
    tokio::time::sleep(SETTLE).await;
    print_phase(
        &format!("status.used recorded (one apply per node by the bench) and {SETTLE:?} after:"),
        &phase(&server, &snap),
        o.nodes,
    );
    let r = reclaim(&server, &admin, &o, &pods, &addr_of, &snap).await;
    print_reclaim(&o, &r);
    checkpoint("the reclaims done");
    finish(stop, task, &admin).await;
}

/// The process's memory now (API server, operator and bench together), and its open
/// sockets (both ends of every client connection to the in-process server).
fn checkpoint(when: &str) {
    println!(
        "memory when {when}: VmRSS {} KiB, VmHWM {} KiB, live heap {} KiB; {} sockets open",
        proc_kib("self", "VmRSS"),
        proc_kib("self", "VmHWM"),
        live_heap() / 1024,
        sockets("self")
    );
}

async fn finish(
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    admin: &kube::Client,
) {
    let _ = stop.send(());
    task.await.expect("the operator stopped");
    // its tasks end on their next poll
    tokio::time::sleep(Duration::from_secs(2)).await;
    checkpoint("the operator stopped (its heap freed: the difference is the operator's)");
    let m = memory(admin).await;
    print_memory(&m);
}
