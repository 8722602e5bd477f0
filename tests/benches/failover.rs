//! Issue 14's measured failover and hand-over: two replicas of the operator's runtime with
//! leader election against the in-process API server (RBAC on, each replica the operator's
//! service account on its own node, as in tests/operator_ha.rs), N runs of each case, each on
//! a fresh cluster (an IPv4 pool in /28 blocks, 3 Nodes with 2 pods each, served by the
//! first leader before the case starts). A benchmark, not a test: it prints what it measured
//! against the issue's targets and asserts nothing.
//!
//! Failover time depends on two phases within a retry period: when the follower last looked
//! at the Lease relative to the leader's renewals, and when the leader fails relative to
//! both. Left alone, a scripted set-up fixes both (every run measured the same ±20 ms), so
//! run i starts the follower `f(i) × retry` after the first replica leads and acts
//! `g(i) × retry` after the set-up, with f and g the fractional parts of i·0.618… and
//! i·0.414… (low-discrepancy sequences: 20 runs cover both phases evenly, the same each time).
//!
//! ```text
//! cargo bench -p tidepool-tests --bench failover [-- --runs 20 --lease 15s --renew 10s --retry 2s --cases kill,deposed,sigterm]
//! ```
//! (or `FAILOVER_RUNS`, `FAILOVER_LEASE`, `FAILOVER_RENEW`, `FAILOVER_RETRY`,
//! `FAILOVER_CASES`; the defaults are the operator's flag defaults; a quick run:
//! `-- --lease 2s --renew 1s --retry 250ms`; the operators' log goes to stderr under
//! `RUST_LOG`, default `error,kube_client=off`: kube's client logs every refused renewal and
//! every connection a killed replica left behind as an error).
//!
//! Every time below comes from the server's log of accepted writes (the instant a write was
//! stored, with its identity), measured from an instant the bench takes:
//! - **kill**: the leader's `run` task is aborted (the process killed), and a new Node with a
//!   pod is created at once. From the abort to the follower's first accepted Lease write
//!   (the takeover), to its first accepted IPAM write (an IPAMNode or IPAMBlock), and until
//!   the new Node's block is listed (polled every 20 ms). Target: the takeover within lease
//!   duration + retry period.
//! - **deposed**: while a Node with a pod arrives every 300 ms (the leader has writes to
//!   make up to the end), the server refuses the leader's Lease updates with 503; its other
//!   writes pass. From the fault to the follower's first accepted Lease write; the old
//!   leader's writes accepted after the new leader's first write (target 0); the old
//!   leader's last accepted write after its last accepted renewal (it must stop at its renew
//!   deadline; a write sent just before may land up to the write timeout later); and whether
//!   its `run` ended with "leader election lost".
//! - **sigterm**: the leader's shutdown signal. From the signal to the follower's first
//!   accepted Lease write (target 3 s), and whether the holder was cleared on the way (a
//!   watch of the Lease sees the old holder, then none, then the new one) with the old
//!   leader's `run` ending Ok.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../tests/common/mod.rs"]
mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{OPERATOR, create_object, operator_cluster};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use serde_json::json;
use tidepool_api as api;
use tidepool_ipam::{EngineConfig, SchedulingMode};
use tidepool_operator::Error;
use tidepool_operator::leader::{DEFAULT_LEASE_NAME, LeaderConfig};
use tidepool_operator::runtime::{self, Election, Settings};
use tidepool_tests::{AcceptedWrite, ApiServer, Faults, TargetedFault};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NS: &str = "tidepool";
const LEASES: &str = "leases.coordination.k8s.io";
const NODES: usize = 3;
const PODS_PER_NODE: usize = 2;
/// How long the first leader may take to serve the cluster, and a new leader a new Node.
const SERVE: Duration = Duration::from_secs(60);
/// Waited on top of a bound before a run is given up as failed.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);
/// The deposed case's load: a new Node with a pod this often.
const LOAD_EVERY: Duration = Duration::from_millis(300);
const POLL: Duration = Duration::from_millis(20);

// ---- options ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Kill,
    Deposed,
    Sigterm,
}

#[derive(Debug, Clone)]
struct Opts {
    runs: usize,
    lease: Duration,
    renew: Duration,
    retry: Duration,
    cases: Vec<Case>,
}

impl Opts {
    fn leader_config(&self, identity: &str) -> LeaderConfig {
        LeaderConfig {
            lease_duration: self.lease,
            renew_deadline: self.renew,
            retry_period: self.retry,
            name: DEFAULT_LEASE_NAME.into(),
            namespace: NS.into(),
            identity: identity.into(),
        }
    }

    /// The issue's failover target: lease duration + retry period.
    fn failover_target(&self) -> Duration {
        self.lease + self.retry
    }
}

fn opts() -> Opts {
    let get = common::setting;
    let duration = |flag: &str, env: &str, default: &str| -> Duration {
        let v = get(flag, env, default);
        humantime::parse_duration(&v)
            .unwrap_or_else(|e| panic!("{flag} ({env}): not a duration: {v}: {e}"))
    };
    let runs = get("--runs", "FAILOVER_RUNS", "20");
    let cases = get("--cases", "FAILOVER_CASES", "kill,deposed,sigterm")
        .split(',')
        .map(|c| match c.trim() {
            "kill" => Case::Kill,
            "deposed" => Case::Deposed,
            "sigterm" => Case::Sigterm,
            other => panic!("--cases (FAILOVER_CASES): unknown case {other}"),
        })
        .collect();
    let o = Opts {
        runs: runs
            .parse()
            .unwrap_or_else(|_| panic!("--runs (FAILOVER_RUNS): not a number: {runs}")),
        lease: duration("--lease", "FAILOVER_LEASE", "15s"),
        renew: duration("--renew", "FAILOVER_RENEW", "10s"),
        retry: duration("--retry", "FAILOVER_RETRY", "2s"),
        cases,
    };
    if let Err(e) = o.leader_config("a").validate() {
        panic!("the leader-election durations: {e}");
    }
    o
}

/// The command that ran this bench, as it can be typed again.
fn command() -> String {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let env: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("FAILOVER_"))
        .map(|(k, v)| format!("{k}={v} "))
        .collect();
    let mut cmd = format!(
        "{}cargo bench -p tidepool-tests --bench failover",
        env.concat()
    );
    if !args.is_empty() {
        cmd.push_str(" -- ");
        cmd.push_str(&args.join(" "));
    }
    cmd
}

// ---- replicas ----

/// The server identity of replica `name`: the operator's service account on that node.
fn sa(name: &str) -> String {
    format!("{OPERATOR}@{name}")
}

/// One operator replica; sending on (or dropping) `stop` is its SIGTERM.
struct Replica {
    name: String,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), Error>>,
}

impl Replica {
    async fn start(server: &ApiServer, name: &str, o: &Opts) -> Replica {
        let client = server.client(&sa(name)).await.expect("client");
        let kube_config = server.kube_config(&sa(name)).await.expect("kube config");
        let s = Settings {
            engine: EngineConfig {
                resync_interval: Duration::from_secs(2),
                min_pass_interval: Duration::from_millis(50),
                ..EngineConfig::default()
            },
            scheduling: SchedulingMode::Priority,
            kube_api_qps: 200.0,
            kube_api_burst: 100,
            node_selector: Default::default(),
            sync_timeout: Duration::from_secs(60),
            health_addr: None,
            seed: name.bytes().map(u64::from).sum(),
            taint_exhausted_nodes: false,
            agent_ready_grace: tidepool_operator::runtime::DEFAULT_AGENT_READY_GRACE,
            agent_pods: tidepool_operator::runtime::default_agent_pods(),
            election: Some(Election {
                config: o.leader_config(name),
                kube_config,
            }),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(runtime::run(client, s, async move {
            let _ = stopped.await;
        }));
        Replica {
            name: name.into(),
            stop: Some(stop),
            task,
        }
    }

    /// SIGTERM; Ok if `run` then ended Ok within a minute, else how it ended.
    async fn shut_down(mut self) -> Result<(), String> {
        drop(self.stop.take());
        match tokio::time::timeout(Duration::from_secs(60), &mut self.task).await {
            Ok(Ok(r)) => r.map_err(|e| e.to_string()),
            Ok(Err(e)) => Err(format!("run's task: {e}")),
            Err(_) => {
                self.task.abort();
                Err("run did not end within a minute".into())
            }
        }
    }
}

// ---- the cluster ----

/// The fractional part of `i × x`: run i's phase (see the module's notes).
fn phase(i: usize, x: f64) -> f64 {
    (i as f64 * x).fract()
}

/// Run i's two phases: the follower's start and the case's action, after the set-up.
fn phases(i: usize, o: &Opts) -> (Duration, Duration) {
    (
        o.retry.mul_f64(phase(i, 0.618_033_988_749_895)),
        o.retry.mul_f64(phase(i, 0.414_213_562_373_095)),
    )
}

/// A fresh cluster served by a leader, with a follower that has synced.
struct Cluster {
    server: ApiServer,
    admin: kube::Client,
    leader: Replica,
    follower: Replica,
    /// The Lease's holders as a watch sees them, each change once ("" = released).
    holders: Arc<Mutex<Vec<String>>>,
}

async fn cluster(o: &Opts, run: usize) -> Result<Cluster, String> {
    let (follower_after, act_after) = phases(run, o);
    let (server, admin) = operator_cluster().await;
    create_object(
        &admin,
        json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": "default"},
            "spec": {"cidrs": ["10.128.0.0/12"], "blockSize": {"ipv4": 28}},
        }),
    )
    .await;
    for i in 0..NODES {
        node_with_pods(&admin, &format!("n{i}"), PODS_PER_NODE).await;
    }
    let holders = lease_history(&admin);
    let leader = Replica::start(&server, "a", o).await;
    wait_for(SERVE, || async {
        holder(&admin).await.filter(|h| h == "a")
    })
    .await
    .ok_or("the first replica never led")?;
    tokio::time::sleep(follower_after).await;
    let mut replicas = vec![leader, Replica::start(&server, "b", o).await];
    let all_served = wait_for(SERVE, || async {
        let served = blocks(&admin).await;
        (0..NODES)
            .all(|i| served.contains(&format!("n{i}")))
            .then_some(())
    })
    .await;
    all_served.ok_or("the first leader did not serve the cluster")?;
    let holder = holder(&admin)
        .await
        .ok_or("nobody holds the Lease while the cluster is served")?;
    let i = replicas
        .iter()
        .position(|r| r.name == holder)
        .ok_or_else(|| format!("the Lease names {holder}"))?;
    let leader = replicas.remove(i);
    let follower = replicas.pop().expect("two replicas");
    // the follower's watches have listed by now; give it a moment more
    tokio::time::sleep(Duration::from_secs(1) + act_after).await;
    Ok(Cluster {
        server,
        admin,
        leader,
        follower,
        holders,
    })
}

/// A Node with `pods` pods waiting on it.
async fn node_with_pods(admin: &kube::Client, name: &str, pods: usize) {
    create_object(
        admin,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
    )
    .await;
    for k in 0..pods {
        create_object(
            admin,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{name}-p{k}"), "namespace": "default"},
                "spec": {"nodeName": name, "containers": [{"name": "c", "image": "pause"}]},
            }),
        )
        .await;
    }
}

/// The nodes that have a block.
async fn blocks(admin: &kube::Client) -> Vec<String> {
    let api: Api<api::IPAMBlock> = Api::all(admin.clone());
    api.list(&ListParams::default())
        .await
        .map(|l| l.items.into_iter().map(|b| b.spec.node).collect())
        .unwrap_or_default()
}

async fn holder(admin: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let l = leases.get_opt(DEFAULT_LEASE_NAME).await.ok()??;
    l.spec?.holder_identity.filter(|h| !h.is_empty())
}

fn lease_history(admin: &kube::Client) -> Arc<Mutex<Vec<String>>> {
    let out = Arc::new(Mutex::new(Vec::new()));
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={DEFAULT_LEASE_NAME}"));
    let mut events = watcher(leases, cfg).applied_objects().boxed();
    let sink = out.clone();
    tokio::spawn(async move {
        while let Some(Ok(l)) = events.next().await {
            let h = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            let mut v = sink.lock();
            if v.last() != Some(&h) {
                v.push(h);
            }
        }
    });
    out
}

/// Polls `f` every 20 ms until it returns Some, or None after `limit`.
async fn wait_for<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

// ---- the server's log of accepted writes ----

fn is_lease(w: &AcceptedWrite) -> bool {
    w.resource == LEASES
}

/// IPAMNodes (and their status) and IPAMBlocks.
fn is_ipam(w: &AcceptedWrite) -> bool {
    w.resource.contains(".ipam.tidepool.dev")
}

/// When the server first accepted a write of replica `name` after `after` that `pred` picks.
fn first_write(
    server: &ApiServer,
    name: &str,
    after: Instant,
    pred: fn(&AcceptedWrite) -> bool,
) -> Option<Instant> {
    server
        .accepted_writes()
        .into_iter()
        .find(|w| w.identity == sa(name) && w.at > after && pred(w))
        .map(|w| w.at)
}

/// Writes of `old` the server accepted after the first write of `new` after `after`.
fn old_writes_after_new(server: &ApiServer, old: &str, new: &str, after: Instant) -> usize {
    let all = server.accepted_writes();
    let Some(first_new) = all
        .iter()
        .find(|w| w.identity == sa(new) && w.at > after)
        .map(|w| w.at)
    else {
        return 0;
    };
    all.iter()
        .filter(|w| w.identity == sa(old) && w.at > first_new)
        .count()
}

// ---- the cases ----

#[derive(Debug, Default)]
struct Kill {
    lease_write: f64,
    ipam_write: f64,
    served: f64,
    old_after_new: usize,
}

async fn kill(o: &Opts, run: usize) -> Result<Kill, String> {
    let c = cluster(o, run).await?;
    let (old, new) = (c.leader, c.follower);
    old.task.abort();
    let t0 = Instant::now();
    node_with_pods(&c.admin, "n-new", 1).await;
    let lease_at = wait_for(o.failover_target() + GIVE_UP_AFTER, || async {
        first_write(&c.server, &new.name, t0, is_lease)
    })
    .await
    .ok_or("the follower never took over")?;
    let served_at = wait_for(SERVE, || async {
        blocks(&c.admin)
            .await
            .iter()
            .any(|n| n == "n-new")
            .then(Instant::now)
    })
    .await
    .ok_or("the new node was never served")?;
    let ipam_at = first_write(&c.server, &new.name, t0, is_ipam).ok_or("no IPAM write")?;
    let r = Kill {
        lease_write: secs(t0, lease_at),
        ipam_write: secs(t0, ipam_at),
        served: secs(t0, served_at),
        old_after_new: old_writes_after_new(&c.server, &old.name, &new.name, t0),
    };
    let _ = new.shut_down().await;
    Ok(r)
}

#[derive(Debug, Default)]
struct Deposed {
    takeover: f64,
    ipam_write: f64,
    old_after_new: usize,
    /// The old leader's last accepted write (not of the Lease) after its last renewal.
    last_old_after_renewal: f64,
    lost: bool,
}

async fn deposed(o: &Opts, run: usize) -> Result<Deposed, String> {
    let c = cluster(o, run).await?;
    let (old, new) = (c.leader, c.follower);
    let load = {
        let admin = c.admin.clone();
        tokio::spawn(async move {
            for i in 0.. {
                node_with_pods(&admin, &format!("m{i}"), 1).await;
                tokio::time::sleep(LOAD_EVERY).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.server.set_faults(Faults {
        targeted: vec![TargetedFault {
            identity: sa(&old.name),
            resource: LEASES.into(),
            verbs: ["update".to_string()].into(),
            error_code: Some(503),
            ..TargetedFault::default()
        }],
        ..Faults::default()
    });
    let t0 = Instant::now();
    let lease_at = wait_for(o.failover_target() + GIVE_UP_AFTER, || async {
        first_write(&c.server, &new.name, t0, is_lease)
    })
    .await;
    let ended = tokio::time::timeout(o.renew + GIVE_UP_AFTER, old.task).await;
    // the new leader serves the load that came meanwhile
    let ipam_at = wait_for(SERVE, || async {
        first_write(&c.server, &new.name, t0, is_ipam)
    })
    .await;
    load.abort();
    c.server.set_faults(Faults::default());
    let lease_at = lease_at.ok_or("the follower never took over")?;
    let ipam_at = ipam_at.ok_or("the new leader made no IPAM write")?;
    let lost = matches!(ended, Ok(Ok(Err(Error::LeadershipLost { .. }))));
    let old_writes: Vec<AcceptedWrite> = c
        .server
        .accepted_writes()
        .into_iter()
        .filter(|w| w.identity == sa(&old.name))
        .collect();
    let last_renewal = old_writes
        .iter()
        .rfind(|w| is_lease(w))
        .ok_or("the old leader never wrote the Lease")?
        .at;
    let last_old = old_writes
        .iter()
        .rfind(|w| !is_lease(w))
        .ok_or("the old leader never wrote")?
        .at;
    let r = Deposed {
        takeover: secs(t0, lease_at),
        ipam_write: secs(t0, ipam_at),
        old_after_new: old_writes_after_new(&c.server, &old.name, &new.name, t0),
        last_old_after_renewal: secs(last_renewal, last_old),
        lost,
    };
    let _ = new.shut_down().await;
    Ok(r)
}

#[derive(Debug, Default)]
struct Sigterm {
    handover: f64,
    /// The old leader's `run` ended Ok after this long.
    stopped: f64,
    cleared: bool,
    ended_ok: bool,
}

async fn sigterm(o: &Opts, run: usize) -> Result<Sigterm, String> {
    let c = cluster(o, run).await?;
    let (old, new) = (c.leader, c.follower);
    let old_name = old.name.clone();
    let t0 = Instant::now();
    let stopping = tokio::spawn(async move {
        let r = old.shut_down().await;
        (r, Instant::now())
    });
    let lease_at = wait_for(o.failover_target() + GIVE_UP_AFTER, || async {
        first_write(&c.server, &new.name, t0, is_lease)
    })
    .await
    .ok_or("the follower never took over")?;
    let (ended, stopped_at) = stopping.await.map_err(|e| e.to_string())?;
    let history = wait_for(Duration::from_secs(5), || {
        let h = c.holders.lock().clone();
        let done = h.last() == Some(&new.name);
        async move { done.then_some(h) }
    })
    .await
    .ok_or("the Lease watch never saw the new holder")?;
    // the old holder, then none, then the new one
    let cleared = history
        .windows(3)
        .any(|w| w[0] == old_name && w[1].is_empty() && w[2] == new.name);
    let r = Sigterm {
        handover: secs(t0, lease_at),
        stopped: secs(t0, stopped_at),
        cleared,
        ended_ok: ended.is_ok(),
    };
    let _ = new.shut_down().await;
    Ok(r)
}

fn secs(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}

// ---- the report ----

fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

/// One row: p50 and max of `v` seconds against a target in seconds (None: informational).
fn row(what: &str, v: &[f64], target: Option<f64>) {
    let max = quantile(v, 1.0);
    let (t, met) = match target {
        Some(t) => (
            format!("≤ {t:.2} s"),
            if v.is_empty() {
                "no"
            } else if max <= t {
                "yes"
            } else {
                "no"
            }
            .to_string(),
        ),
        None => ("-".into(), "-".into()),
    };
    println!(
        "  {what:<58} {:>4} {:>9} {:>9} {t:>11} {met:>5}",
        v.len(),
        format!("{:.3} s", quantile(v, 0.5)),
        format!("{max:.3} s"),
    );
}

/// A row of counts per run (p50 and max) whose target is 0.
fn zero_row(what: &str, counts: &[usize]) {
    let mut v = counts.to_vec();
    v.sort_unstable();
    let p50 = v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0);
    let max = v.last().copied().unwrap_or(0);
    let met = if !v.is_empty() && max == 0 {
        "yes"
    } else {
        "no"
    };
    println!(
        "  {what:<58} {:>4} {p50:>9} {max:>9} {:>11} {met:>5}",
        v.len(),
        "0"
    );
}

/// A row of runs that met a condition (target: all of them).
fn runs_row(what: &str, met: usize, n: usize) {
    let ok = if n > 0 && met == n { "yes" } else { "no" };
    println!(
        "  {what:<58} {n:>4} {:>9} {:>9} {:>11} {ok:>5}",
        "-",
        format!("{met}/{n}"),
        "all"
    );
}

fn header(title: &str) {
    println!("{title}");
    println!(
        "  {:<58} {:>4} {:>9} {:>9} {:>11} {:>5}",
        "", "runs", "p50", "max", "target", "met"
    );
}

fn report_kill(o: &Opts, r: &[Kill], failed: &[String]) {
    let t = o.failover_target().as_secs_f64();
    header("kill (the leader's run task aborted; a new Node with a pod created at once):");
    row(
        "kill → the new leader's first accepted Lease write",
        &r.iter().map(|k| k.lease_write).collect::<Vec<_>>(),
        Some(t),
    );
    row(
        "kill → its first accepted IPAM write",
        &r.iter().map(|k| k.ipam_write).collect::<Vec<_>>(),
        Some(t),
    );
    row(
        "kill → the new Node's block listed (20 ms polls)",
        &r.iter().map(|k| k.served).collect::<Vec<_>>(),
        None,
    );
    zero_row(
        "old leader's writes accepted after the new leader's first",
        &r.iter().map(|k| k.old_after_new).collect::<Vec<_>>(),
    );
    failures(failed);
}

fn report_deposed(o: &Opts, r: &[Deposed], failed: &[String]) {
    let t = o.failover_target().as_secs_f64();
    header("deposed (503 on the leader's Lease updates only; a Node with a pod every 300 ms):");
    row(
        "fault → the new leader's first accepted Lease write",
        &r.iter().map(|d| d.takeover).collect::<Vec<_>>(),
        Some(t),
    );
    row(
        "fault → its first accepted IPAM write",
        &r.iter().map(|d| d.ipam_write).collect::<Vec<_>>(),
        None,
    );
    zero_row(
        "old leader's writes accepted after the new leader's first",
        &r.iter().map(|d| d.old_after_new).collect::<Vec<_>>(),
    );
    let bound = (o.renew + o.leader_config("a").write_timeout()).as_secs_f64();
    row(
        "old leader's last accepted write after its last renewal",
        &r.iter()
            .map(|d| d.last_old_after_renewal)
            .collect::<Vec<_>>(),
        Some(bound),
    );
    runs_row(
        "old leader's run ended with 'leader election lost'",
        r.iter().filter(|d| d.lost).count(),
        r.len(),
    );
    failures(failed);
}

fn report_sigterm(r: &[Sigterm], failed: &[String]) {
    header("sigterm (the leader's shutdown signal):");
    row(
        "signal → the follower's first accepted Lease write",
        &r.iter().map(|s| s.handover).collect::<Vec<_>>(),
        Some(3.0),
    );
    row(
        "signal → the old leader's run ended",
        &r.iter().map(|s| s.stopped).collect::<Vec<_>>(),
        None,
    );
    runs_row(
        "holder cleared, then taken; the old leader's run ended Ok",
        r.iter().filter(|s| s.cleared && s.ended_ok).count(),
        r.len(),
    );
    failures(failed);
}

fn failures(failed: &[String]) {
    for f in failed {
        println!("  FAILED RUN: {f}");
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

// ---- main ----

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error,kube_client=off"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() {
    let o = opts();
    init_tracing();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench(o));
}

/// Runs `case` `o.runs` times, printing each run's result to stderr.
async fn runs<T: std::fmt::Debug, F, Fut>(o: &Opts, name: &str, case: F) -> (Vec<T>, Vec<String>)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for i in 1..=o.runs {
        match case(i).await {
            Ok(r) => {
                eprintln!("{name} {i}/{}: {r:?}", o.runs);
                ok.push(r);
            }
            Err(e) => {
                eprintln!("{name} {i}/{}: FAILED: {e}", o.runs);
                failed.push(format!("{name} run {i}: {e}"));
            }
        }
    }
    (ok, failed)
}

async fn bench(o: Opts) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let started = Instant::now();
    let load_before = loadavg();
    let mut kills = None;
    let mut depositions = None;
    let mut sigterms = None;
    for case in &o.cases {
        match case {
            Case::Kill => kills = Some(runs(&o, "kill", |i| kill(&o, i)).await),
            Case::Deposed => depositions = Some(runs(&o, "deposed", |i| deposed(&o, i)).await),
            Case::Sigterm => sigterms = Some(runs(&o, "sigterm", |i| sigterm(&o, i)).await),
        }
    }
    let wt = o.leader_config("a").write_timeout();
    println!("{}", command());
    println!(
        "leader election: lease {:?}, renew deadline {:?}, retry {:?} (write timeout {wt:?}); \
         {} runs per case, each on a fresh cluster ({NODES} Nodes × {PODS_PER_NODE} pods, two \
         replicas); {cores} cores, load average {load_before} before, {} after; {:.0} s in all",
        o.lease,
        o.renew,
        o.retry,
        o.runs,
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    if let Some((r, f)) = &kills {
        report_kill(&o, r, f);
    }
    if let Some((r, f)) = &depositions {
        report_deposed(&o, r, f);
    }
    if let Some((r, f)) = &sigterms {
        report_sigterm(r, f);
    }
}
