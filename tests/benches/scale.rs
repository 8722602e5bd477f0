//! Issue 31's operator at Kubernetes' limits: N nodes × P pods on the cluster pool, the
//! operator's own binary (`tidepool-operator run`) in its own process against the
//! in-process API server (RBAC on, the operator's service account), so that the memory and
//! CPU read from /proc are the operator's alone. A benchmark, not a test: it prints what it
//! measured and asserts no timing.
//!
//! ```text
//! cargo build --release -p tidepool-operator
//! cargo bench -p tidepool-tests --bench scale [-- --nodes 5000 --pods-per-node 30 --churn 10m]
//! ```
//! (flags or `SCALE_*`; the operator binary is `target/release/tidepool-operator` beside the
//! bench, or `SCALE_OPERATOR_BIN`; its JSON log goes to `target/scale-operator.log`).
//!
//! 1. **Empty baseline.** The operator starts on a cluster with its CRDs, RBAC and pool but
//!    no Node and no pod; its RSS once synced, then it stops.
//! 2. **Bring-up.** N Nodes and P pending pods per node (bound, no podIPs); the operator
//!    starts; a watch of the IPAMBlocks and IPAMNodes tells when every node's blocks hold
//!    P + 8 addresses and its IPAMNode shows them in `status.allocated`. Against the kube
//!    budget's lower bound, from the first write.
//! 3. **Recording.** A test node side records every pod in `status.used` (an apply per
//!    node, as the agent's manager).
//! 4. **Churn.** For `--churn`: `--rate` pod deletions (grace 0) and as many creations per
//!    second, and `--node-recreations` Node deletions each followed by the Node's
//!    re-creation a second later, spread over it (even ones keep their pods bound, as a
//!    kubelet restart does; odd ones have their pods deleted first, as a drain). The node
//!    side gives each new pod an address of its node's blocks (none used or cooling), answers
//!    tombstones (`reclaimed`, or `live` for a pod the bench has not deleted: a violation),
//!    drops an answer once its tombstone is gone, and writes each changed node's status at
//!    most once a second (the agent's batching). Deleted pods' tombstones are timed from the
//!    delete's answer to the watch event that shows them.
//! 5. **Failover** (`--failover`, on by default: every operator runs with leader election
//!    on). A second operator starts as a standby; once its `/readyz` answers, the leader is
//!    killed (SIGKILL) and 50 pods are deleted. The new leader's first Lease and IPAM writes
//!    after the kill, its quorum relist (its log), whether it wrote before that relist ended,
//!    and the deleted pods' tombstones; its log goes to `target/scale-operator-b.log`.
//! 6. **What the server saw:** every LIST the operator sent (limit, resourceVersion, items,
//!    bytes), the writes, the watch bytes delivered to the operator; the IPAMNode's size
//!    with 110 and 250 `used` entries.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../tests/common/mod.rs"]
mod common;
mod shared;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::watcher;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use shared::{PodRec, create_node, node_name, proc_kib, quantile, sockets, sorted, used_entry};
use tidepool_api as api;
use tidepool_ipam::AddrSet;
use tidepool_tests::{ApiServer, Config};

const OPERATOR: &str = "system:serviceaccount:tidepool:tidepool-operator";
const POOL_CIDR: &str = "10.0.0.0/10";
const BLOCK_PREFIX: u8 = 27;
/// Requests the bench keeps in flight while it creates, records and deletes.
const CONCURRENCY: usize = 32;
/// The node side's reuse cooldown (the engine's default).
const COOLDOWN: Duration = Duration::from_secs(30);
/// A pod is deleted in the churn only once recorded this long (past the reclaim min age).
const MIN_LIFE: Duration = Duration::from_secs(30);
const SETTLE: Duration = Duration::from_secs(3);
const IPAMNODES: &str = "ipamnodes.ipam.tidepool.dev";
const WRITES: &[&str] = &["create", "update", "patch", "apply", "delete"];

// ---- options ----

#[derive(Debug, Clone)]
struct Opts {
    nodes: usize,
    pods_per_node: usize,
    qps: f64,
    burst: u32,
    churn: Duration,
    /// Pod deletions (and creations) per second in the churn.
    rate: f64,
    node_recreations: usize,
    grace: Duration,
    min_age: Duration,
    /// Leader election on, and a failover after the churn.
    failover: bool,
}

fn opts() -> Opts {
    let get = common::setting;
    let num = |flag: &str, env: &str, default: &str| -> f64 {
        let v = get(flag, env, default);
        v.parse()
            .unwrap_or_else(|_| panic!("{flag} ({env}): not a number: {v}"))
    };
    let dur = |flag: &str, env: &str, default: &str| -> Duration {
        let v = get(flag, env, default);
        humantime::parse_duration(&v).unwrap_or_else(|e| panic!("{flag} ({env}): {v}: {e}"))
    };
    Opts {
        nodes: num("--nodes", "SCALE_NODES", "5000") as usize,
        pods_per_node: num("--pods-per-node", "SCALE_PODS_PER_NODE", "30") as usize,
        qps: num("--qps", "SCALE_QPS", "200"),
        burst: num("--burst", "SCALE_BURST", "100") as u32,
        churn: dur("--churn", "SCALE_CHURN", "10m"),
        rate: num("--rate", "SCALE_RATE", "100"),
        node_recreations: num("--node-recreations", "SCALE_NODE_RECREATIONS", "50") as usize,
        grace: dur("--reclaim-grace", "SCALE_RECLAIM_GRACE", "5s"),
        min_age: dur("--reclaim-min-age", "SCALE_RECLAIM_MIN_AGE", "10s"),
        failover: get("--failover", "SCALE_FAILOVER", "true") == "true",
    }
}

impl Opts {
    fn target(&self) -> u128 {
        shared::target(self.pods_per_node)
    }

    fn writes_needed(&self) -> u64 {
        shared::writes_needed(self.nodes, self.pods_per_node, BLOCK_PREFIX)
    }

    fn lower_bound(&self) -> f64 {
        shared::lower_bound(self.writes_needed(), self.burst, self.qps)
    }
}

// ---- the operator's process ----

/// The directory of the release build: target/release/deps/scale-… → target/release.
fn release_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's path");
    (exe.parent().and_then(Path::parent))
        .expect("the target directory")
        .to_path_buf()
}

/// `SCALE_OPERATOR_BIN` (a relative path from the repository root: cargo runs the bench in
/// `tests/`), else the release build beside the bench.
fn operator_bin() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root");
    std::env::var_os("SCALE_OPERATOR_BIN")
        .map(|p| root.join(p))
        .unwrap_or_else(|| release_dir().join("tidepool-operator"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One operator process; its memory, sockets and CPU read from /proc.
struct Operator {
    child: Child,
    pid: String,
    metrics: SocketAddr,
    health: SocketAddr,
    log: PathBuf,
    started: SystemTime,
}

#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    at: f64,
    rss_kib: u64,
    hwm_kib: u64,
    sockets: usize,
    cpu: f64,
}

impl Operator {
    fn spawn(kubeconfig: &Path, o: &Opts, log: &Path) -> Operator {
        let bin = operator_bin();
        assert!(
            bin.is_file(),
            "{} not found: `cargo build --release -p tidepool-operator` first, or set SCALE_OPERATOR_BIN",
            bin.display()
        );
        let metrics: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let health: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let secs = |d: Duration| format!("{}ms", d.as_millis());
        let election: &[&str] = match o.failover {
            true => &[
                "--leader-elect=true",
                "--leader-elect-resource-namespace",
                "tidepool",
            ],
            false => &["--leader-elect=false"],
        };
        let started = SystemTime::now();
        let child = Command::new(&bin)
            .args(["run", "--log-format", "json"])
            .args(election)
            .args(["--log-level", "info"])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--metrics-addr", &metrics.to_string()])
            .args(["--health-addr", &health.to_string()])
            .args(["--kube-api-qps", &o.qps.to_string()])
            .args(["--kube-api-burst", &o.burst.to_string()])
            .args(["--reclaim-grace", &secs(o.grace)])
            .args(["--reclaim-min-age", &secs(o.min_age)])
            // the bench's node side sets no AgentReady condition
            .args(["--agent-ready-grace", "1h"])
            .args(["--sync-timeout", "10m"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("the operator's log"))
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        Operator {
            pid: child.id().to_string(),
            child,
            metrics,
            health,
            log: log.to_owned(),
            started,
        }
    }

    fn sample(&self, t0: Instant) -> Sample {
        sample(&self.pid, t0)
    }

    /// Log lines so far.
    fn log_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// When it first logged a message starting with `prefix` (the line's timestamp).
    fn logged_at(&self, prefix: &str) -> Option<SystemTime> {
        self.log_lines().iter().find_map(|l| {
            let msg = l.pointer("/fields/message")?.as_str()?;
            if !msg.starts_with(prefix) {
                return None;
            }
            let ts: jiff::Timestamp = l.get("timestamp")?.as_str()?.parse().ok()?;
            Some(SystemTime::from(ts))
        })
    }

    /// From the process's start to its "synced; the engine runs" line.
    fn synced_after(&self) -> Option<Duration> {
        let at = self.logged_at("synced")?;
        at.duration_since(self.started).ok()
    }

    /// Waits until `/readyz` answers 200 (a standby: its caches synced).
    async fn wait_ready(&self, limit: Duration) -> Duration {
        let t = Instant::now();
        while http_get(self.health, "/readyz").0 != 200 {
            assert!(
                t.elapsed() < limit,
                "the operator was not ready within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        t.elapsed()
    }

    async fn wait_synced(&self, limit: Duration) -> Duration {
        let t = Instant::now();
        loop {
            if let Some(d) = self.synced_after() {
                return d;
            }
            assert!(
                t.elapsed() < limit,
                "the operator did not sync within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Warnings and errors logged (besides the Warning events it records, which its event
    /// recorder also logs), and the first few of them.
    fn warnings(&self) -> (usize, usize, Vec<String>) {
        let lines = self.log_lines();
        let level = |l: &Value, want: &str| l.get("level").and_then(Value::as_str) == Some(want);
        let event = |l: &Value| {
            l.get("target").and_then(Value::as_str) == Some("tidepool_operator::store::events")
        };
        let bad: Vec<&Value> = lines
            .iter()
            .filter(|l| (level(l, "WARN") || level(l, "ERROR")) && !event(l))
            .collect();
        let errors = bad.iter().filter(|l| level(l, "ERROR")).count();
        let first = bad.iter().take(5).map(|l| l.to_string()).collect();
        (bad.len() - errors, errors, first)
    }

    /// `tidepool_*` counters and histogram counts from its /metrics, summed by name and
    /// the one label given.
    fn metric(&self, name: &str, label: Option<(&str, &str)>) -> f64 {
        let (_, text) = http_get(self.metrics, "/metrics");
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (key, v) = l.rsplit_once(' ')?;
                let (n, labels) = key.split_once('{').unwrap_or((key, ""));
                let want = label.is_none_or(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")));
                (n == name && want).then(|| v.parse::<f64>().ok())?
            })
            .sum()
    }

    /// SIGKILL: no Lease released, no write finished.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then up to a minute for it to end.
    fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.pid]).status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("the operator did not stop within a minute of SIGTERM: killed");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sample(pid: &str, t0: Instant) -> Sample {
    Sample {
        at: t0.elapsed().as_secs_f64(),
        rss_kib: proc_kib(pid, "VmRSS"),
        hwm_kib: proc_kib(pid, "VmHWM"),
        sockets: sockets(pid),
        cpu: shared::cpu_time(pid).as_secs_f64(),
    }
}

/// The status and body of a GET (0 and nothing when it cannot connect).
fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = (out.split(' ').nth(1)).and_then(|c| c.parse().ok());
    let (_, body) = out.split_once("\r\n\r\n").unwrap_or_default();
    (status.unwrap_or(0), body.to_string())
}

/// Samples the operator's process every second until the flag is set.
fn sampler(
    op: &Operator,
    t0: Instant,
) -> (Arc<Mutex<Vec<Sample>>>, Arc<std::sync::atomic::AtomicBool>) {
    let out = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (o, s, pid) = (out.clone(), stop.clone(), op.pid.clone());
    std::thread::spawn(move || {
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            o.lock().push(sample(&pid, t0));
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    (out, stop)
}

// ---- the cluster ----

async fn cluster() -> (ApiServer, kube::Client) {
    common::operator_cluster_with(Config {
        rbac: true,
        watch_window: 1000,
        bookmark_interval: Duration::from_secs(1),
        min_request_timeout: Duration::from_secs(3600),
        namespace_finalize_delay: Duration::from_millis(100),
        kubelet_delay: Some(Duration::from_millis(100)),
        ..Config::default()
    })
    .await
}

async fn create_pod(pods: &Api<Pod>, name: String, node: String) -> Result<PodRec, kube::Error> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
    }))
    .expect("a pod");
    let created = pods.create(&PostParams::default(), &pod).await?;
    let uid = created.metadata.uid.expect("a uid");
    Ok(PodRec { name, node, uid })
}

/// The Nodes and their pending pods, with progress every 10,000 objects.
async fn populate(admin: &kube::Client, o: &Opts) -> Vec<PodRec> {
    shared::create_nodes(admin, o.nodes, CONCURRENCY).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let all = (0..o.nodes).flat_map(|n| (0..o.pods_per_node).map(move |k| (n, k)));
    let t = Instant::now();
    let mut out = Vec::with_capacity(o.nodes * o.pods_per_node);
    let mut stream = futures::stream::iter(all)
        .map(|(n, k)| create_pod(&pods, format!("p-{n:05}-{k:03}"), node_name(n)))
        .buffer_unordered(CONCURRENCY);
    while let Some(p) = stream.next().await {
        out.push(p.expect("a pod"));
        if out.len() % 10_000 == 0 {
            eprintln!(
                "[{:6.1} s] {} pods created",
                t.elapsed().as_secs_f64(),
                out.len()
            );
        }
    }
    out
}

// ---- the bench's view: IPAMBlocks and IPAMNodes, tombstones timed ----

/// Each tombstone's (node, address, pod UID) and when the bench's watch first showed it.
type Tombstones = Arc<Mutex<HashMap<(String, String, String), Instant>>>;

struct View {
    blocks: Store<api::IPAMBlock>,
    ipamnodes: Store<api::IPAMNode>,
    tombstones: Tombstones,
}

async fn view(admin: &kube::Client) -> View {
    let (blocks, w) = reflector::store();
    let stream = reflector::reflector(w, watcher(Api::all(admin.clone()), Default::default()));
    tokio::spawn(stream.for_each(|_| async {}));
    let (ipamnodes, w) = reflector::store();
    let tombstones = Tombstones::default();
    let seen = tombstones.clone();
    let stream = reflector::reflector(w, watcher(Api::all(admin.clone()), Default::default()))
        .applied_objects()
        .for_each(move |n: Result<api::IPAMNode, _>| {
            let now = Instant::now();
            if let Ok(n) = n {
                let name = n.metadata.name.clone().unwrap_or_default();
                let mut s = seen.lock();
                for (addr, t) in &n.spec.reclaim {
                    s.entry((name.clone(), addr.clone(), t.pod_uid.clone()))
                        .or_insert(now);
                }
            }
            async {}
        });
    tokio::spawn(stream);
    blocks.wait_until_ready().await.expect("the block watch");
    ipamnodes
        .wait_until_ready()
        .await
        .expect("the IPAMNode watch");
    View {
        blocks,
        ipamnodes,
        tombstones,
    }
}

impl View {
    /// Each node's addresses: the union of its blocks.
    fn addresses(&self) -> HashMap<String, AddrSet> {
        let mut by_node: HashMap<String, AddrSet> = HashMap::new();
        for b in self.blocks.state() {
            let Ok(net) = b.spec.cidr.0.parse::<ipnet::IpNet>() else {
                continue;
            };
            by_node
                .entry(b.spec.node.clone())
                .or_default()
                .union_with(&AddrSet::of_net(&net));
        }
        by_node
    }

    /// Nodes whose blocks hold the target, and IPAMNodes whose `status.allocated` does.
    fn at_target(&self, o: &Opts) -> (usize, usize) {
        let blocks = self
            .addresses()
            .values()
            .filter(|a| a.total() >= o.target())
            .count();
        let target = o.target() as i64;
        let nodes = self
            .ipamnodes
            .state()
            .iter()
            .filter(|n| n.status.as_ref().and_then(|s| s.allocated) >= Some(target))
            .count();
        (blocks, nodes)
    }
}

// ---- phase 2: bring-up ----

struct BringUp {
    first_write: Option<Duration>,
    done: Option<Duration>,
    blocks: usize,
}

async fn bring_up(server: &ApiServer, v: &View, o: &Opts, t0: Instant) -> BringUp {
    let timeout = Duration::from_secs(1800);
    let mut first_write = None;
    let mut last_print = Instant::now();
    loop {
        // the counters were reset at the start, and the bench writes nothing until done; the
        // leader election's Lease writes come before the quorum relist and are not IPAM's
        let written = |(verb, resource): &(String, String)| {
            WRITES.contains(&verb.as_str()) && !resource.starts_with("leases")
        };
        if first_write.is_none() && server.requests().keys().any(written) {
            first_write = Some(t0.elapsed());
        }
        let (b, n) = v.at_target(o);
        let out_of_time = t0.elapsed() > timeout;
        if (b == o.nodes && n == o.nodes) || out_of_time {
            return BringUp {
                first_write,
                done: (!out_of_time).then(|| t0.elapsed()),
                blocks: v.blocks.state().len(),
            };
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "[{:6.1} s] {b} of {} nodes' blocks and {n} IPAMNodes at target",
                t0.elapsed().as_secs_f64(),
                o.nodes
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---- the test node side ----

/// A node's side: its `used` entries, tombstone answers and cooldowns, and pods waiting
/// for an address. As the agent (`ipam`'s `NodeSide::tidy`), it writes nothing for an
/// ended cooldown or for an answer whose tombstone is gone (bar a `live` one): those go
/// with its next write for a pod.
#[derive(Default)]
struct NodeState {
    /// The UID of the IPAMNode last seen: a new one (the object re-created) has none of
    /// this node side's status, which is written again.
    uid: String,
    used: BTreeMap<String, (PodRec, Instant)>,
    /// Address → (answer, its outcome).
    acks: BTreeMap<String, (Value, &'static str)>,
    /// Answers whose tombstone is gone, to drop with the next write.
    settled: HashSet<String>,
    /// Address → the end of its cooldown (the wall clock, as the status carries it).
    cooling: BTreeMap<String, SystemTime>,
    waiting: VecDeque<(PodRec, Instant)>,
    /// The node side's pods just given an address, with their creation's answer.
    started: Vec<Instant>,
    dirty: bool,
}

#[derive(Default)]
struct NodeSideStats {
    writes: u64,
    bytes: u64,
    pods_started: u64,
    start_latency: Vec<f64>,
    live_tombstones: Vec<String>,
    reclaimed: u64,
    stale: u64,
}

#[derive(Default)]
struct World {
    nodes: HashMap<String, NodeState>,
    /// UIDs of the pods the bench deleted.
    deleted: HashSet<String>,
    stats: NodeSideStats,
}

impl World {
    /// A pod of `node` recorded for at least `MIN_LIFE` and not yet deleted: its address.
    fn deletable(&self, node: &str, now: Instant) -> Option<String> {
        let s = self.nodes.get(node)?;
        let (addr, _) = s.used.iter().find(|(_, (p, at))| {
            now.duration_since(*at) >= MIN_LIFE && !self.deleted.contains(&p.uid)
        })?;
        Some(addr.clone())
    }
}

/// One round of the node side: answer tombstones, give waiting pods addresses; returns the
/// status bodies of the nodes that changed.
fn node_side_round(w: &mut World, v: &View, now: Instant) -> Vec<(String, Value)> {
    let wall = SystemTime::now();
    let addrs = v.addresses();
    for n in v.ipamnodes.state() {
        let name = n.metadata.name.clone().unwrap_or_default();
        let Some(s) = w.nodes.get_mut(&name) else {
            continue;
        };
        let uid = n.metadata.uid.clone().unwrap_or_default();
        if s.uid != uid {
            s.uid = uid;
            s.dirty = true;
        }
        answer_tombstones(s, &n.spec.reclaim, &w.deleted, &mut w.stats, &name, wall);
    }
    let mut bodies = Vec::new();
    for (name, s) in &mut w.nodes {
        if let Some(a) = addrs.get(name).filter(|_| !s.waiting.is_empty()) {
            let cooling = |ip: &String| s.cooling.get(ip).is_some_and(|until| *until > wall);
            let free: Vec<String> = a
                .iter()
                .map(|ip| ip.to_string())
                .filter(|ip| !s.used.contains_key(ip) && !cooling(ip))
                .take(s.waiting.len())
                .collect();
            for ip in free {
                let (p, created) = s.waiting.pop_front().expect("as many waiting");
                s.cooling.remove(&ip);
                s.used.insert(ip, (p, now));
                s.started.push(created);
                s.dirty = true;
            }
        }
        if std::mem::take(&mut s.dirty) {
            // what needed no write of its own goes with this one
            s.cooling.retain(|_, until| *until > wall);
            for a in std::mem::take(&mut s.settled) {
                s.acks.remove(&a);
            }
            bodies.push((name.clone(), status_body(name, s)));
        }
    }
    bodies
}

/// Answers `node`'s tombstones: `reclaimed` for a pod the bench deleted (its address into
/// cooldown until `wall` + the cooldown), `live` for one it did not, `stale` otherwise.
/// Once a tombstone is gone, a `live` answer goes at once (the operator waits for that),
/// the others with the next write.
fn answer_tombstones(
    s: &mut NodeState,
    reclaim: &BTreeMap<String, api::TombstoneSpec>,
    deleted: &HashSet<String>,
    stats: &mut NodeSideStats,
    node: &str,
    wall: SystemTime,
) {
    let answers = |ack: &Value, t: &api::TombstoneSpec| {
        ack["podUID"] == t.pod_uid.as_str() && ack["containerID"] == t.container_id.as_str()
    };
    for (addr, t) in reclaim {
        let answered = s.acks.get(addr).is_some_and(|(ack, _)| answers(ack, t));
        if answered && !s.settled.contains(addr) {
            continue;
        }
        let outcome = match s.used.get(addr) {
            Some((p, _)) if p.uid == t.pod_uid && deleted.contains(&p.uid) => "reclaimed",
            Some((p, _)) if p.uid == t.pod_uid => {
                (stats.live_tombstones)
                    .push(format!("{node} {addr} pod {} ({:?})", p.name, t.reason));
                "live"
            }
            _ => "stale",
        };
        if outcome == "reclaimed" {
            s.used.remove(addr);
            s.cooling.insert(addr.clone(), wall + COOLDOWN);
            stats.reclaimed += 1;
        } else if outcome == "stale" {
            stats.stale += 1;
        }
        let ack = json!({"podUID": t.pod_uid, "containerID": t.container_id, "ifname": t.ifname, "outcome": outcome});
        s.acks.insert(addr.clone(), (ack, outcome));
        s.settled.remove(addr);
        s.dirty = true;
    }
    let gone: Vec<(String, bool)> = (s.acks.iter())
        .filter(|(a, (ack, _))| !reclaim.get(*a).is_some_and(|t| answers(ack, t)))
        .map(|(a, (_, outcome))| (a.clone(), *outcome == "live"))
        .collect();
    for (addr, live) in gone {
        if live {
            s.acks.remove(&addr);
            s.dirty = true;
        } else {
            s.settled.insert(addr);
        }
    }
}

fn status_body(node: &str, s: &NodeState) -> Value {
    let used: serde_json::Map<String, Value> = s
        .used
        .iter()
        .map(|(a, (p, _))| (a.clone(), used_entry(p)))
        .collect();
    let cooldown: serde_json::Map<String, Value> = s
        .cooling
        .iter()
        .map(|(a, until)| (a.clone(), json!(api::convert::from_system(*until))))
        .collect();
    let acks: serde_json::Map<String, Value> = (s.acks.iter())
        .map(|(a, (ack, _))| (a.clone(), ack.clone()))
        .collect();
    json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": {"name": node},
        "status": {"used": used, "reclaimAck": acks, "cooldown": cooldown},
    })
}

/// Applies the bodies as the agent's manager (forced), up to `CONCURRENCY` at once; a node
/// whose IPAMNode is gone (re-created) is written again in a later round.
async fn apply_status(
    admin: &kube::Client,
    bodies: Vec<(String, Value)>,
) -> (u64, u64, Vec<String>) {
    let api: Api<api::IPAMNode> = Api::all(admin.clone());
    let pp = PatchParams::apply(api::names::AGENT_MANAGER).force();
    let results: Vec<(String, u64, bool)> = futures::stream::iter(bodies)
        .map(|(node, body)| {
            let (api, pp) = (api.clone(), pp.clone());
            async move {
                let bytes = serde_json::to_vec(&body).map_or(0, |b| b.len() as u64);
                let ok = api
                    .patch_status(&node, &pp, &Patch::Apply(&body))
                    .await
                    .is_ok();
                (node, bytes, ok)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let writes = results.iter().filter(|r| r.2).count() as u64;
    let bytes = results.iter().filter(|r| r.2).map(|r| r.1).sum();
    let failed = results.into_iter().filter(|r| !r.2).map(|r| r.0).collect();
    (writes, bytes, failed)
}

/// The node side, once a second until `stop`.
async fn node_side(
    admin: kube::Client,
    world: Arc<Mutex<World>>,
    v: Arc<View>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let now = Instant::now();
        let bodies = node_side_round(&mut world.lock(), &v, now);
        let (writes, bytes, failed) = apply_status(&admin, bodies).await;
        let answered = Instant::now();
        {
            let mut w = world.lock();
            for node in failed {
                if let Some(s) = w.nodes.get_mut(&node) {
                    s.dirty = true;
                }
            }
            let mut lat = Vec::new();
            for s in w.nodes.values_mut() {
                lat.extend(
                    s.started
                        .drain(..)
                        .map(|c| answered.duration_since(c).as_secs_f64()),
                );
            }
            w.stats.pods_started += lat.len() as u64;
            w.stats.start_latency.extend(lat);
            w.stats.writes += writes;
            w.stats.bytes += bytes;
        }
        tokio::time::sleep_until((now + Duration::from_secs(1)).into()).await;
    }
}

// ---- phase 4: churn ----

/// A deletion: the pod, the address it held, when the delete was answered.
struct Deletion {
    node: String,
    addr: String,
    uid: String,
    answered: Instant,
}

async fn delete_pod(
    admin: &kube::Client,
    world: &Mutex<World>,
    node: &str,
    addr: &str,
) -> Option<Deletion> {
    let p = world.lock().nodes.get(node)?.used.get(addr)?.0.clone();
    let api: Api<Pod> = Api::namespaced(admin.clone(), "default");
    api.delete(&p.name, &DeleteParams::default().grace_period(0))
        .await
        .ok()?;
    let mut w = world.lock();
    w.deleted.insert(p.uid.clone());
    Some(Deletion {
        node: node.into(),
        addr: addr.into(),
        uid: p.uid,
        answered: Instant::now(),
    })
}

/// Deletes and creates `rate` pods a second each for `churn`.
async fn churn_pods(
    admin: &kube::Client,
    world: &Mutex<World>,
    o: &Opts,
) -> (Vec<Deletion>, usize) {
    let start = tokio::time::Instant::now();
    let n = (o.churn.as_secs_f64() * o.rate) as usize;
    let at = |i: usize| start + Duration::from_secs_f64(i as f64 / o.rate);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mut rng = SmallRng::seed_from_u64(7);
    let nodes = o.nodes;
    let deletes = futures::stream::iter(0..n)
        .map(|i| async move {
            tokio::time::sleep_until(at(i)).await;
            // the i-th deletion tries nodes from a stride through them
            let (node, addr) = (0..64).find_map(|k| {
                let node = node_name((i * 7919 + k * 104_729) % nodes);
                let addr = world.lock().deletable(&node, Instant::now())?;
                Some((node, addr))
            })?;
            delete_pod(admin, world, &node, &addr).await
        })
        .buffer_unordered(CONCURRENCY)
        .filter_map(|d| async move { d })
        .collect::<Vec<_>>();
    let targets: Vec<usize> = (0..n).map(|_| rng.random_range(0..nodes)).collect();
    let creates = futures::stream::iter(targets.into_iter().enumerate())
        .map(|(i, node)| {
            let pods = pods.clone();
            async move {
                tokio::time::sleep_until(at(i)).await;
                let p = create_pod(&pods, format!("c-{i:07}"), node_name(node)).await;
                let created = Instant::now();
                let p = p.ok()?;
                let mut w = world.lock();
                w.nodes
                    .entry(p.node.clone())
                    .or_default()
                    .waiting
                    .push_back((p, created));
                Some(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .filter_map(|c| async move { c })
        .count();
    futures::join!(deletes, creates)
}

/// Deletes and re-creates `o.node_recreations` Nodes spread over the churn; odd ones have
/// their pods deleted first. Returns the deletions and how many Node re-creations failed.
async fn recreate_nodes(
    admin: &kube::Client,
    world: &Mutex<World>,
    o: &Opts,
) -> (Vec<Deletion>, usize) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let mut deletions = Vec::new();
    let mut failed = 0;
    if o.node_recreations == 0 {
        return (deletions, failed);
    }
    let every = o.churn / o.node_recreations as u32;
    let start = tokio::time::Instant::now();
    for k in 0..o.node_recreations {
        tokio::time::sleep_until(start + every * k as u32 + every / 2).await;
        let name = node_name((k * 97 + 13) % o.nodes);
        if k % 2 == 1 {
            let addrs: Vec<String> = world
                .lock()
                .nodes
                .get(&name)
                .map(|s| s.used.keys().cloned().collect())
                .unwrap_or_default();
            for a in addrs {
                deletions.extend(delete_pod(admin, world, &name, &a).await);
            }
        }
        let gone = nodes.delete(&name, &DeleteParams::default()).await.is_ok();
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !gone || create_node(&nodes, &name).await.is_err() {
            failed += 1;
        }
    }
    (deletions, failed)
}

/// Every minute: pods deleted and given an address so far, tombstones seen.
async fn churn_progress(world: Arc<Mutex<World>>, v: Arc<View>, t: Instant) {
    loop {
        tokio::time::sleep(Duration::from_secs(60)).await;
        let (deleted, started) = {
            let w = world.lock();
            (w.deleted.len(), w.stats.pods_started)
        };
        eprintln!(
            "[{:6.1} s of churn] {deleted} pods deleted, {started} given an address, {} tombstones seen",
            t.elapsed().as_secs_f64(),
            v.tombstones.lock().len()
        );
    }
}

// ---- the report ----

/// From each delete's answer to its tombstone's first sight, sorted (seconds); and how many
/// deletions have none yet.
fn tombstone_latencies(t: &Tombstones, deletions: &[Deletion]) -> (Vec<f64>, usize) {
    let s = t.lock();
    let at = |d: &Deletion| {
        s.get(&(d.node.clone(), d.addr.clone(), d.uid.clone()))
            .copied()
    };
    let l = sorted(
        deletions
            .iter()
            .filter_map(|d| Some(at(d)?.saturating_duration_since(d.answered).as_secs_f64())),
    );
    let missing = deletions.len() - l.len();
    (l, missing)
}

fn kib_per_pod(kib: u64, base: u64, pods: usize) -> f64 {
    (kib.saturating_sub(base) * 1024) as f64 / pods.max(1) as f64
}

fn print_lists(server: &ApiServer) {
    let mut by: BTreeMap<(String, String, String), (u64, usize, u64)> = BTreeMap::new();
    for l in server
        .lists()
        .into_iter()
        .filter(|l| l.identity == OPERATOR)
    {
        let limit = l.limit.map_or("none".into(), |n| n.to_string());
        let e = by
            .entry((l.resource, limit, l.resource_version))
            .or_default();
        e.0 += 1;
        e.1 = e.1.max(l.items);
        e.2 = e.2.max(l.bytes);
    }
    println!(
        "the operator's LISTs (resource, limit, resourceVersion: count, most items and bytes in one response):"
    );
    let mut over = 0;
    for ((res, limit, rv), (n, items, bytes)) in &by {
        let above = limit.parse::<u64>().map_or(true, |l| l > 500);
        if rv != "0" && above {
            over += n;
        }
        println!(
            "  {res:<32} limit {limit:<5} rv {rv:<8} {n:>5} lists, at most {items} items, {bytes} bytes"
        );
    }
    println!("  paginated LISTs with a limit above 500 or none: {over}");
}

// ---- main ----

fn main() {
    let o = opts();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench(o));
}

async fn bench(o: Opts) {
    let dir = std::env::temp_dir().join(format!("tidepool-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let log = (release_dir().parent())
        .expect("the target directory")
        .join("scale-operator.log");
    let (server, admin) = cluster().await;
    let kubeconfig = dir.join("kubeconfig");
    server
        .write_kubeconfig(OPERATOR, &kubeconfig)
        .expect("the operator's kubeconfig");
    shared::create_pool(&admin, POOL_CIDR, BLOCK_PREFIX).await;
    let empty = empty_baseline(&kubeconfig, &o, &log).await;

    let t = Instant::now();
    let pods = populate(&admin, &o).await;
    println!(
        "populated: {} Nodes, {} pods in {:.1} s",
        o.nodes,
        pods.len(),
        t.elapsed().as_secs_f64()
    );
    let v = Arc::new(view(&admin).await);
    server.reset_counters();
    let t0 = Instant::now();
    let op = Operator::spawn(&kubeconfig, &o, &log);
    let (samples, sampling) = sampler(&op, t0);
    let b = bring_up(&server, &v, &o, t0).await;
    tokio::time::sleep(SETTLE).await;
    print_bring_up(&o, &b, &op, &server, &samples, empty, pods.len(), t0);

    let world = Arc::new(Mutex::new(World::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let side = tokio::spawn(node_side(admin.clone(), world.clone(), v.clone(), stop_rx));
    record(&world, &pods).await;
    // past the min life and the reclaim min age
    tokio::time::sleep(MIN_LIFE.max(o.min_age) + SETTLE).await;
    world.lock().stats = NodeSideStats::default();
    server.reset_counters();

    let churn_t0 = t0.elapsed().as_secs_f64();
    let cpu0 = op.sample(t0).cpu;
    let c = churn(&admin, &world, &v, &o).await;
    let cpu = op.sample(t0).cpu - cpu0;
    let writes = server.requests();
    print_churn(&o, &c, &v, cpu);
    print_rss(&samples.lock(), churn_t0);
    print_node_side(&world.lock(), &server);
    print_writes("  writes (all writers) in the churn:", &writes);
    sampling.store(true, std::sync::atomic::Ordering::Relaxed);
    let (warnings, errors, first) = op.warnings();
    println!("operator log: {warnings} warnings, {errors} errors");
    for l in first {
        println!("  {l}");
    }
    if o.failover {
        let log = log.with_file_name("scale-operator-b.log");
        failover(&server, &admin, &world, &v, (&kubeconfig, &log), &o, op).await;
    } else {
        op.stop();
    }
    let _ = stop_tx.send(true);
    let _ = side.await;
    print_lists(&server);
    ipamnode_sizes(&admin, &pods).await;
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- phase 5: failover ----

/// Pods deleted at the leader's kill, whose tombstones the new leader writes.
const FAILOVER_DELETIONS: usize = 50;

/// A second operator starts as a standby; once ready, the leader is killed (SIGKILL) and
/// `FAILOVER_DELETIONS` pods are deleted. Reports the standby's memory, the new leader's
/// first Lease and first IPAM write after the kill, its quorum relist, any write of its
/// before that relist ended (there must be none), and the deleted pods' tombstones.
async fn failover(
    server: &ApiServer,
    admin: &kube::Client,
    world: &Mutex<World>,
    v: &View,
    (kubeconfig, log): (&Path, &Path),
    o: &Opts,
    leader: Operator,
) {
    let t = Instant::now();
    let b = Operator::spawn(kubeconfig, o, log);
    let ready = b.wait_ready(Duration::from_secs(600)).await;
    tokio::time::sleep(SETTLE).await;
    let standby = b.sample(t);
    let victims: Vec<(String, String)> = (0..o.nodes)
        .filter_map(|i| {
            let node = node_name(i * 7919 % o.nodes);
            let addr = world.lock().deletable(&node, Instant::now())?;
            Some((node, addr))
        })
        .take(FAILOVER_DELETIONS)
        .collect();
    let (killed, killed_at) = (Instant::now(), SystemTime::now());
    leader.kill();
    let deletions: Vec<Deletion> = futures::stream::iter(victims)
        .map(|(node, addr)| async move { delete_pod(admin, world, &node, &addr).await })
        .buffer_unordered(CONCURRENCY)
        .filter_map(|d| async move { d })
        .collect()
        .await;
    let deadline = Instant::now() + Duration::from_secs(120) + o.grace + o.min_age;
    while tombstone_latencies(&v.tombstones, &deletions).1 > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = b.sample(t);
    let relist = b.logged_at("leading");
    let synced = b.logged_at("synced");
    let writes: Vec<_> = (server.accepted_writes().into_iter())
        .filter(|w| w.identity == OPERATOR && w.at > killed)
        .collect();
    let since = |w: &tidepool_tests::AcceptedWrite| w.at.duration_since(killed).as_secs_f64();
    let lease = writes.iter().find(|w| w.resource.starts_with("leases"));
    let ipam = writes.iter().find(|w| w.resource.contains("tidepool.dev"));
    let early = (writes.iter())
        .filter(|w| !w.resource.starts_with("leases"))
        .filter(|w| synced.is_none_or(|s| killed_at + w.at.duration_since(killed) < s))
        .count();
    let secs_from_kill = |at: Option<SystemTime>| {
        at.and_then(|a| a.duration_since(killed_at).ok())
            .map_or("never".to_string(), |d| format!("{:.2} s", d.as_secs_f64()))
    };
    let (l, missing) = tombstone_latencies(&v.tombstones, &deletions);
    println!(
        "failover: the standby was ready {:.1} s after its start, RSS {} KiB (VmHWM {} KiB); the leader killed",
        ready.as_secs_f64(),
        standby.rss_kib,
        standby.hwm_kib
    );
    println!(
        "  kill → the new leader's first Lease write {}, its quorum relist from {} to {}, its first IPAM write {}",
        lease.map_or("never".to_string(), |w| format!("{:.2} s", since(w))),
        secs_from_kill(relist),
        secs_from_kill(synced),
        ipam.map_or("never".to_string(), |w| format!("{:.2} s", since(w))),
    );
    println!("  its writes (Lease aside) before its relist ended: {early} (must be 0)");
    println!(
        "  {} pods deleted at the kill → tombstone: p50 {:.2} s, max {:.2} s; {missing} never seen",
        deletions.len(),
        quantile(&l, 0.5),
        quantile(&l, 1.0)
    );
    println!(
        "  the new leader after: RSS {} KiB (VmHWM {} KiB), {} sockets",
        after.rss_kib, after.hwm_kib, after.sockets
    );
    b.stop();
}

/// The operator on the CRDs and the pool alone: its memory once synced; then it stops.
async fn empty_baseline(kubeconfig: &Path, o: &Opts, log: &Path) -> Sample {
    let op = Operator::spawn(kubeconfig, o, log);
    let synced = op.wait_synced(Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let empty = op.sample(Instant::now());
    op.stop();
    println!(
        "empty cluster: the operator synced {:.2} s after its start; RSS {} KiB (VmHWM {} KiB), {} sockets",
        synced.as_secs_f64(),
        empty.rss_kib,
        empty.hwm_kib,
        empty.sockets
    );
    empty
}

#[allow(clippy::too_many_arguments)] // one report of one phase
fn print_bring_up(
    o: &Opts,
    b: &BringUp,
    op: &Operator,
    server: &ApiServer,
    samples: &Mutex<Vec<Sample>>,
    empty: Sample,
    pods: usize,
    t0: Instant,
) {
    let after = op.sample(t0);
    let lb = o.lower_bound();
    let secs = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
    let (fw, done) = (secs(b.first_write), secs(b.done));
    println!(
        "bring-up: {} nodes × {} pods, /{BLOCK_PREFIX} blocks of {POOL_CIDR}, kube budget {} qps burst {}",
        o.nodes, o.pods_per_node, o.qps, o.burst
    );
    println!(
        "  writes needed {}; lower bound {lb:.2} s; synced {:.2} s, first write {fw:.2} s, done {done:.2} s after the start: {:.2} s from the first write = {:.2}× the bound; {} blocks",
        o.writes_needed(),
        secs(op.synced_after()),
        done - fw,
        (done - fw) / lb,
        b.blocks
    );
    print_writes(
        "  writes (all writers) until 3 s after done:",
        &server.requests(),
    );
    println!(
        "  operator: passes {}, kube tokens {}; CPU {:.1} s",
        op.metric(
            "tidepool_ipam_trigger_duration_seconds_count",
            Some(("trigger", "pool-maintainer"))
        ),
        op.metric(
            "tidepool_ipam_api_wait_seconds_count",
            Some(("api", "kube"))
        ),
        after.cpu
    );
    let s = samples.lock();
    let relist_peak = s.iter().map(|s| s.hwm_kib).max().unwrap_or(0);
    println!(
        "  operator memory: RSS {} KiB after the bring-up ({:.0} B per pod above the empty {} KiB); VmHWM (the relist peak) {} KiB ({:.0} B per pod); sockets now {}, at most {}",
        after.rss_kib,
        kib_per_pod(after.rss_kib, empty.rss_kib, pods),
        empty.rss_kib,
        relist_peak,
        kib_per_pod(relist_peak, empty.rss_kib, pods),
        after.sockets,
        s.iter().map(|s| s.sockets).max().unwrap_or(0)
    );
    if b.done.is_none() {
        println!("  NOT DONE in 30 minutes");
    }
}

/// Hands every pod to the node side and waits (5 minutes at most) until all are recorded.
async fn record(world: &Mutex<World>, pods: &[PodRec]) {
    {
        let mut w = world.lock();
        for p in pods {
            let s = w.nodes.entry(p.node.clone()).or_default();
            s.waiting.push_back((p.clone(), Instant::now()));
        }
    }
    let t = Instant::now();
    while world.lock().stats.pods_started < pods.len() as u64
        && t.elapsed() < Duration::from_secs(300)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "recorded: {} pods in status.used in {:.1} s",
        world.lock().stats.pods_started,
        t.elapsed().as_secs_f64()
    );
}

/// What the churn did.
struct Churn {
    took: Duration,
    deletions: Vec<Deletion>,
    /// The pods deleted with their drained Nodes.
    drained: Vec<Deletion>,
    created: usize,
    node_failures: usize,
}

/// The churn, then a drain until every deletion's tombstone is seen (grace, min age and a
/// minute at most).
async fn churn(admin: &kube::Client, world: &Arc<Mutex<World>>, v: &Arc<View>, o: &Opts) -> Churn {
    let t = Instant::now();
    let progress = tokio::spawn(churn_progress(world.clone(), v.clone(), t));
    let ((deletions, created), (drained, node_failures)) =
        futures::join!(churn_pods(admin, world, o), recreate_nodes(admin, world, o));
    progress.abort();
    let took = t.elapsed();
    let drain = Instant::now() + o.grace + o.min_age + Duration::from_secs(60);
    while Instant::now() < drain {
        let waiting = tombstone_latencies(&v.tombstones, &deletions).1
            + tombstone_latencies(&v.tombstones, &drained).1;
        if waiting == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Churn {
        took,
        deletions,
        drained,
        created,
        node_failures,
    }
}

fn print_churn(o: &Opts, c: &Churn, v: &View, cpu: f64) {
    let took = c.took.as_secs_f64();
    println!(
        "churn: {took:.0} s, {} pods deleted and {} created ({:.1} a second each), {} Node re-creations ({} failed, {} pods deleted with them)",
        c.deletions.len(),
        c.created,
        c.created as f64 / took,
        o.node_recreations,
        c.node_failures,
        c.drained.len()
    );
    for (what, d) in [
        ("the churn's", &c.deletions),
        ("the drained nodes'", &c.drained),
    ] {
        let (l, missing) = tombstone_latencies(&v.tombstones, d);
        println!(
            "  {what} deletion → tombstone (grace {:?}, min age {:?}): p50 {:.2} s, p99 {:.2} s, max {:.2} s over {}; {missing} never seen",
            o.grace,
            o.min_age,
            quantile(&l, 0.5),
            quantile(&l, 0.99),
            quantile(&l, 1.0),
            l.len()
        );
    }
    let events = c.deletions.len() + c.drained.len() + c.created;
    println!(
        "  operator CPU {cpu:.1} s in the churn: {:.2} ms per pod event ({events} creations and deletions)",
        cpu * 1000.0 / events.max(1) as f64
    );
}

/// The operator's RSS at minute 2 of the churn and at its end, and every minute.
fn print_rss(s: &[Sample], churn_t0: f64) {
    let at = |t: f64| {
        s.iter()
            .find(|x| x.at >= churn_t0 + t)
            .copied()
            .unwrap_or_default()
    };
    let (m2, end) = (at(120.0), s.last().copied().unwrap_or_default());
    println!(
        "  operator RSS at minute 2 of the churn {} KiB, at its end {} KiB ({:+} KiB); sockets at most {}",
        m2.rss_kib,
        end.rss_kib,
        end.rss_kib as i64 - m2.rss_kib as i64,
        s.iter().map(|x| x.sockets).max().unwrap_or(0)
    );
    let mut line = String::from("  RSS every minute of the churn (KiB):");
    let mut k = 0.0;
    while let Some(x) = s.iter().find(|x| x.at >= churn_t0 + k) {
        line.push_str(&format!(" {}", x.rss_kib));
        k += 60.0;
    }
    println!("{line}");
}

/// The node side's pod starts, writes and tombstone answers in the churn, and the watch
/// bytes the server delivered to the operator per pod start.
fn print_node_side(w: &World, server: &ApiServer) {
    let st = &w.stats;
    let l = sorted(st.start_latency.iter().copied());
    let waiting: usize = w.nodes.values().map(|s| s.waiting.len()).sum();
    let per_start = |n: u64| n as f64 / st.pods_started.max(1) as f64;
    println!(
        "  node side: {} pods given an address (creation → recorded p50 {:.2} s, p99 {:.2} s), {waiting} still waiting; {} status writes ({:.2} per pod start), {} bytes ({:.0} per pod start); {} reclaimed, {} stale, {} live tombstones",
        st.pods_started,
        quantile(&l, 0.5),
        quantile(&l, 0.99),
        st.writes,
        per_start(st.writes),
        st.bytes,
        per_start(st.bytes),
        st.reclaimed,
        st.stale,
        st.live_tombstones.len()
    );
    for l in st.live_tombstones.iter().take(10) {
        println!("  LIVE POD TOMBSTONED: {l}");
    }
    println!(
        "  watch bytes to the operator per pod start: IPAMNodes {:.0}, pods {:.0}",
        per_start(server.watch_bytes(IPAMNODES, OPERATOR)),
        per_start(server.watch_bytes("pods", OPERATOR))
    );
}

fn print_writes(title: &str, w: &BTreeMap<(String, String), u64>) {
    println!("{title}");
    for ((verb, res), n) in w {
        if WRITES.contains(&verb.as_str()) {
            println!("    {verb:<8} {res:<40} {n:>8}");
        }
    }
}

/// The IPAMNode's size as the server stores it (managedFields included) with 110 and 250
/// `used` entries, written by the node side's manager (the operator stopped).
async fn ipamnode_sizes(admin: &kube::Client, pods: &[PodRec]) {
    let node = &pods[0].node;
    let api: Api<api::IPAMNode> = Api::all(admin.clone());
    let pp = PatchParams::apply(api::names::AGENT_MANAGER).force();
    for n in [30usize, 110, 250] {
        let used: serde_json::Map<String, Value> = (0..n)
            .map(|i| {
                let p = PodRec {
                    name: format!("size-{i:03}"),
                    node: node.clone(),
                    uid: format!("00000000-0000-0000-0000-{i:012}"),
                };
                (format!("10.255.{}.{}", i / 256, i % 256), used_entry(&p))
            })
            .collect();
        let body = json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": {"name": node}, "status": {"used": used},
        });
        let ok = api.patch_status(node, &pp, &Patch::Apply(&body)).await;
        let got = api.get(node).await;
        if let (Ok(_), Ok(obj)) = (ok, got) {
            let size = serde_json::to_vec(&obj).map_or(0, |b| b.len());
            let mf = serde_json::to_vec(&obj.metadata.managed_fields).map_or(0, |b| b.len());
            println!(
                "IPAMNode with {n} used entries: {size} bytes as JSON, of which managedFields {mf}; a status apply of them {} bytes",
                serde_json::to_vec(&body).map_or(0, |b| b.len())
            );
        }
    }
}
