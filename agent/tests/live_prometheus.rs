//! The dashboard and the alert rules against a real Prometheus (issue 17, "Tests in CI"):
//! Debian's `prometheus` on a loopback port scrapes, once a second, three targets at once:
//! - `tidepool-operator simulate --realtime` (a dual-stack cluster pool with churn, crashed
//!   pods and lost nodes),
//! - `tidepool-operator run` (leader election on) against the in-process API server with
//!   RBAC on, nodes node-a and node-b and pods on node-a,
//! - the `tidepool-agent` binary of node-a, whose pods get their addresses through the real
//!   plugin; one pod is then deleted without a DEL (reclaimed through the agent) and node-b
//!   is deleted (its blocks released), so allocation, release, reclaim and leader metrics
//!   move.
//!
//! Then, through Prometheus's HTTP API: every dashboard query (its variables given values
//! that select real series) and every alert expression parses and returns data (an alert
//! kept quiet by its threshold is checked without it: [`promql::data_parts`]); every
//! selector they name matches series Prometheus holds, labels and values included, and
//! every grouping label is on them; `promtool check metrics` accepts every target's
//! /metrics. Each query's outcome is printed, so gaps are visible at a glance.
//!
//! Nothing needs root: the agent runs without `--node-routes` and the plugin is called for
//! IPAM only. Every process is stopped when the test ends, also on failure.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;
// The PromQL helpers and the bundle's queries live with the deploy checks (tests crate);
// Cargo shares no test modules between crates, so they are included by path.
#[path = "../../tests/tests/deploy/promql.rs"]
mod promql;
#[path = "../../tests/tests/deploy/queries.rs"]
mod queries;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::agent_process::start_agent;
use common::e2e::{Proc, Tuning, operator_bin, operator_command};
use common::prometheus::{self, Prometheus, Sample, Target, free_port, get, http};
use common::*;
use kube::api::{Api, DeleteParams};
use serde_json::json;

/// How often Prometheus scrapes.
const SCRAPE_INTERVAL: &str = "1s";

/// `$__rate_interval`: Grafana's is at least four scrape intervals and grows with the
/// dashboard's time range; a window longer than the whole run makes every rate and quantile
/// see every event of it.
const RATE_INTERVAL: &str = "5m";

/// The jobs, named as components/servicemonitor names them (the alert rules select the
/// agents' by it); the simulation's is a job of its own.
const JOB_SIM: &str = "tidepool-simulate";
const JOB_OPERATOR: &str = "tidepool-operator";
const JOB_AGENT: &str = "tidepool-agent";

/// The operator and agent binaries' metrics and probe addresses.
struct Ports {
    sim: std::net::SocketAddr,
    operator: std::net::SocketAddr,
    agent: std::net::SocketAddr,
    agent_health: std::net::SocketAddr,
}

/// The cluster label a Prometheus shared by several clusters puts on every series (the
/// dashboard's `$cluster` selects it): one value here, so every panel sees every target.
const CLUSTER: &str = "test";

/// The targets with the labels the Prometheus Operator attaches through
/// components/servicemonitor (`namespace` on every series, `node` on the agents'), and the
/// cluster's. The simulation is a cluster of its own: another namespace, so its leader
/// does not count as a second leader of the real operator.
fn targets(p: &Ports) -> Vec<Target> {
    let cluster = ("cluster", CLUSTER.to_owned());
    vec![
        Target {
            job: JOB_SIM,
            addr: p.sim,
            labels: vec![("namespace", "tidepool-sim".into()), cluster.clone()],
        },
        Target {
            job: JOB_OPERATOR,
            addr: p.operator,
            labels: vec![("namespace", "tidepool".into()), cluster.clone()],
        },
        Target {
            job: JOB_AGENT,
            addr: p.agent,
            labels: vec![
                ("namespace", "tidepool".into()),
                ("node", "node-a".into()),
                cluster,
            ],
        },
    ]
}

/// `simulate --realtime`: a small dual-stack cluster pool (so IPv6 series have data too),
/// its IPv4 pool scarce, at wall-clock speed with pod churn, crashed pods and lost nodes; it runs far longer than
/// the test, which stops it.
fn simulate(dir: &Path, metrics: std::net::SocketAddr) -> Proc {
    let mut cmd = Command::new(operator_bin());
    cmd.env_clear()
        .args(["simulate", "--realtime", "--seed", "17"])
        .args(["--metrics-addr", &metrics.to_string()])
        .args(["--nodes", "6", "--pods-per-node", "10", "--churn", "20"])
        .args(["--crash-rate", "0.2", "--node-churn", "360"])
        .args(["--duration", "30m"])
        .args([
            "--source",
            "cluster-pool",
            "--dual-stack",
            "--per-node-metrics",
        ])
        // a /24 the 60 pods and their cooldowns press past --scarcity-enter 0.15: the
        // IPv4 pool is scarce, so the scarcity metrics move too
        .args(["--pool-cidr", "10.240.0.0/24,fd00:10::/112"])
        .args(["--scarcity-enter", "0.15", "--scarcity-exit", "0.1"])
        .args(["--resync-interval", "2s", "--excess-ip-release-delay", "2s"])
        .args(["--reclaim-grace", "1s", "--reclaim-min-age", "1s"])
        .args(["--reuse-cooldown", "2s", "--node-reclaim-grace", "2s"]);
    Proc::spawn("simulate", cmd, dir.join("simulate.log"))
}

/// A pod bound to `node`, not yet started (no address): its UID.
async fn pending_pod(admin: &kube::Client, name: &str, node: &str) -> String {
    let pod = create_object(
        admin,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
        }),
    )
    .await;
    pod.metadata.uid.expect("a uid")
}

/// The cluster the operator runs against: the default IPPool and node-a.
async fn cluster_objects(admin: &kube::Client) {
    create_ipv4_pool(admin, "default", &["10.250.0.0/16"], 28).await;
    create_node(admin, "node-a").await;
}

async fn create_node(admin: &kube::Client, name: &str) {
    create_object(
        admin,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
    )
    .await;
}

/// `sum(increase(selector[window]))`: what a counter grew by within the panels' window, as
/// Prometheus saw it (between two scrapes, which is what rates and quantiles need).
fn increased(selector: &str) -> String {
    format!("sum(increase({selector}[{RATE_INTERVAL}]))")
}

fn positive(s: &[Sample]) -> bool {
    s.iter().any(|s| s.value > 0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_every_binary_and_every_panel_and_alert_has_data() {
    assert!(
        prometheus::installed(),
        "{} not found: install Debian's prometheus (scripts/test.sh does); this test does not skip",
        prometheus::PROMETHEUS_BIN
    );
    let (server, admin) = empty_cluster().await;
    cluster_objects(&admin).await;
    let p1 = pending_pod(&admin, "p1", "node-a").await;
    let p2 = pending_pod(&admin, "p2", "node-a").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let ports = Ports {
        sim: free_port(),
        operator: free_port(),
        agent: free_port(),
        agent_health: free_port(),
    };
    let prom = Prometheus::start(&targets(&ports), SCRAPE_INTERVAL);

    // the three binaries (each stopped when dropped, in reverse order)
    let _sim = simulate(dir.path(), ports.sim);
    let op_kubeconfig = dir.path().join("operator.kubeconfig");
    server
        .write_kubeconfig(OPERATOR, &op_kubeconfig)
        .expect("kubeconfig");
    let mut op_cmd = operator_command(
        "operator-0",
        &op_kubeconfig,
        &Tuning::default(),
        &ports.operator.to_string(),
    );
    // the per-node panels read `tidepool_ipam_node_ips`
    op_cmd.arg("--per-node-metrics");
    let operator = Proc::spawn("operator", op_cmd, dir.path().join("operator.log"));
    let agent_kubeconfig = dir.path().join("agent.kubeconfig");
    server
        .write_kubeconfig(&agent_on("node-a"), &agent_kubeconfig)
        .expect("kubeconfig");
    let agent = start_agent(
        dir.path(),
        &agent_kubeconfig,
        ports.agent,
        ports.agent_health,
    );
    let s = settings(dir.path());
    // the operator elects itself, gives node-a its IPAMNode and a block, the agent restores
    eventually_within(
        Duration::from_secs(90),
        "node-a's agent serving",
        || async { marker(&s.restored_marker) },
    )
    .await;
    // Prometheus sees a counter's increase only from its first scrape on: every target is
    // scraped, and the agent's counters at zero, before the scenario moves them
    every_target_is_up(&prom).await;
    let adds = format!(
        r#"tidepool_agent_cni_requests_total{{job="{JOB_AGENT}", verb="add", outcome="ok"}}"#
    );
    prom.until("the agent scraped before its first ADD", &adds, |s| {
        s.len() == 1 && s[0].value == 0.0
    })
    .await;

    // node-b joins: the operator grants its block while Prometheus watches
    create_node(&admin, "node-b").await;
    let allocated = increased(&format!(
        r#"tidepool_ipam_ips_allocated_total{{job="{JOB_OPERATOR}"}}"#
    ));
    prom.until(
        "the operator allocated node-b's block",
        &allocated,
        positive,
    )
    .await;

    // node-a's pods start through the real plugin; p2's sandbox is torn down by its runtime
    // (DEL), p1's pod is deleted without one: the operator's tombstone, answered by the agent, reclaims it
    let conf = config(&s);
    let cni = |cmd: &'static str, c: &'static str, uid: String| {
        let conf = conf.clone();
        blocking(move || plugin(cmd, c, &uid, &conf))
    };
    let a1 = cni("ADD", "c1", p1.clone()).await.addr();
    let a2 = cni("ADD", "c2", p2.clone()).await.addr();
    // the kubelet's part: the pods run with their addresses
    running::set_pod_ips(&admin, "p1", "Running", &[&a1]).await;
    running::set_pod_ips(&admin, "p2", "Running", &[&a2]).await;
    assert_eq!(cni("DEL", "c2", p2).await.code, 0);
    let nodes: Api<tidepool_api::IPAMNode> = Api::all(admin.clone());
    eventually("p1's address published", || async {
        let st = nodes.get("node-a").await.ok()?.status?;
        st.used.contains_key(&a1).then_some(())
    })
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), "default");
    pods.delete("p1", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete p1");
    // node-b goes: after --node-reclaim-grace its blocks go back to the pool
    let k8s_nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    k8s_nodes
        .delete("node-b", &DeleteParams::default())
        .await
        .expect("delete node-b");

    the_metrics_moved(&prom).await;
    let mut failures = promtool_accepts_every_target(&ports).await;
    let vars = variables(&prom).await;
    failures.extend(panels_have_data(&prom, &vars).await);
    failures.extend(alerts_have_data(&prom).await);
    assert!(
        failures.is_empty(),
        "{} failures:\n{}\n--- operator ---\n{}",
        failures.len(),
        failures.join("\n"),
        operator.tail(20)
    );
    let (status, log) = agent.stop().await;
    assert!(status.success(), "the agent's exit {status:?}:\n{log}");
}

/// Every target scraped and up.
async fn every_target_is_up(prom: &Prometheus) {
    for job in [JOB_SIM, JOB_OPERATOR, JOB_AGENT] {
        let q = format!(r#"up{{job="{job}"}} == 1"#);
        prom.until(&format!("{job} up"), &q, |s| s.len() == 1).await;
    }
}

/// What the rest of the scenario did, as Prometheus saw it: the operator released node-b's
/// blocks, reclaimed p1's address (through the agent) and leads; the agent answered the
/// ADDs and the DEL; the simulation runs (its reclaims and releases come at their own pace,
/// too late to wait for: a lost node's Node object goes a minute after the machine).
/// Counters are waited on with [`increased`].
async fn the_metrics_moved(prom: &Prometheus) {
    for (what, q) in [
        (
            "the operator released node-b's blocks",
            increased(&format!(
                r#"tidepool_ipam_ips_released_total{{job="{JOB_OPERATOR}"}}"#
            )),
        ),
        (
            "the operator reclaimed p1's address",
            increased(&format!(
                r#"tidepool_ipam_reclaims_total{{job="{JOB_OPERATOR}", reason="pod-deleted", outcome="reclaimed"}}"#
            )),
        ),
        (
            "the operator leads",
            format!(r#"tidepool_leader{{job="{JOB_OPERATOR}"}}"#),
        ),
        (
            "the operator's leadership began",
            format!(r#"tidepool_leader_transitions_total{{job="{JOB_OPERATOR}"}}"#),
        ),
        (
            "the simulation runs its resyncs",
            increased(&format!(r#"tidepool_ipam_resync_total{{job="{JOB_SIM}"}}"#)),
        ),
        (
            "the agent's DEL freed",
            increased(&format!(
                r#"tidepool_agent_cni_requests_total{{job="{JOB_AGENT}", verb="del", outcome="ok"}}"#
            )),
        ),
    ] {
        let started = std::time::Instant::now();
        prom.until(what, &q, positive).await;
        println!("seen: {what} ({:.1} s)", started.elapsed().as_secs_f64());
    }
    let adds = format!(
        r#"tidepool_agent_cni_requests_total{{job="{JOB_AGENT}", verb="add", outcome="ok"}}"#
    );
    prom.until("the agent's two ADDs", &adds, |s| {
        s.len() == 1 && s[0].value == 2.0
    })
    .await;
}

/// `promtool check metrics` on every target's /metrics: the failures.
async fn promtool_accepts_every_target(p: &Ports) -> Vec<String> {
    let client = http();
    let mut failures = Vec::new();
    for (job, addr) in [
        (JOB_SIM, p.sim),
        (JOB_OPERATOR, p.operator),
        (JOB_AGENT, p.agent),
    ] {
        let (code, text) = get(&client, addr, "/metrics")
            .await
            .unwrap_or_else(|| panic!("{job}'s /metrics at {addr} does not answer"));
        assert_eq!(code, 200, "{job}'s /metrics");
        match prometheus::promtool_check_metrics(&text) {
            Ok(()) => println!("promtool check metrics: {job}: accepted"),
            Err(findings) => failures.push(format!("promtool check metrics: {job}: {findings}")),
        }
    }
    failures
}

/// The dashboard's variables with values that select real series: each `label_values`
/// variable its first value in Prometheus (which must have one), `$__rate_interval`
/// [`RATE_INTERVAL`].
async fn variables(prom: &Prometheus) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::from([("__rate_interval".to_owned(), RATE_INTERVAL.to_owned())]);
    for (name, metric, label) in queries::label_values_variables(&queries::dashboard()) {
        // a variable's query may name the variables before it (`{cluster=~"$cluster"}`)
        let metric = substitute(&metric, &vars);
        let values = prom
            .label_values(&metric, &label)
            .await
            .unwrap_or_else(|e| panic!("variable {name}: {e}"));
        println!("variable ${name} = label_values({metric}, {label}): {values:?}");
        let first = values
            .first()
            .unwrap_or_else(|| panic!("variable {name}: no value of {label} on {metric}"));
        vars.insert(name, first.clone());
    }
    vars
}

/// `expr` with Grafana's `$name` and `${name}` replaced by `vars` (longest names first,
/// so `$__rate_interval` is not read as another).
fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> String {
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut out = expr.to_owned();
    for n in names {
        out = out
            .replace(&format!("${{{n}}}"), &vars[n])
            .replace(&format!("${n}"), &vars[n]);
    }
    out
}

/// A query's outcome: how many series, how many with a number (not NaN).
struct Outcome {
    series: usize,
    numbers: usize,
}

impl Outcome {
    fn has_data(&self) -> bool {
        self.numbers > 0
    }
    fn describe(&self) -> String {
        match (self.series, self.numbers) {
            (0, _) => "NO DATA".into(),
            (s, 0) => format!("NO DATA ({s} series, all NaN)"),
            (s, n) => format!("data ({s} series, {n} numbers)"),
        }
    }
}

async fn evaluate(prom: &Prometheus, expr: &str) -> Result<Outcome, String> {
    let samples = prom.query(expr).await?;
    Ok(Outcome {
        series: samples.len(),
        numbers: samples.iter().filter(|s| !s.value.is_nan()).count(),
    })
}

/// What `expr` names that Prometheus does not hold: a selector no series matches (its
/// metric, a label or a value is not exported), a matcher's label on none of the series
/// of its metric, a grouping label on none of the expression's series.
async fn names_missing(prom: &Prometheus, expr: &str) -> Vec<String> {
    let names = match promql::names(expr) {
        Ok(n) => n,
        Err(e) => return vec![e],
    };
    let mut problems = Vec::new();
    let mut keys: BTreeSet<String> = BTreeSet::new();
    for sel in &names.selectors {
        let of_metric = prom
            .series(&sel.name)
            .await
            .unwrap_or_else(|e| panic!("series of {}: {e}", sel.name));
        let metric_keys: BTreeSet<&String> = of_metric.iter().flat_map(|s| s.keys()).collect();
        for (label, _, _) in &sel.matchers {
            if !metric_keys.contains(label) {
                problems.push(format!("{} has no series with label {label}", sel.name));
            }
        }
        let matchers: Vec<String> = sel
            .matchers
            .iter()
            .map(|(l, op, v)| format!("{l}{op}{}", serde_json::to_string(v).expect("a string")))
            .collect();
        let selector = format!("{}{{{}}}", sel.name, matchers.join(","));
        let matched = prom
            .series(&selector)
            .await
            .unwrap_or_else(|e| panic!("series of {selector}: {e}"));
        if matched.is_empty() {
            problems.push(format!("no series matches {selector}"));
        }
        keys.extend(of_metric.into_iter().flat_map(|s| s.into_keys()));
    }
    for g in &names.grouping {
        if !keys.contains(g) {
            problems.push(format!("grouping label {g} is on none of the series"));
        }
    }
    problems
}

/// Every panel query, its variables substituted: prints its outcome; the failures.
async fn panels_have_data(prom: &Prometheus, vars: &BTreeMap<String, String>) -> Vec<String> {
    let mut failures = Vec::new();
    println!("\ndashboard queries ({RATE_INTERVAL} for $__rate_interval):");
    for q in queries::panel_queries(&queries::dashboard()) {
        let expr = substitute(&q.expr, vars);
        let id = format!("panel {:?} {}", q.title, q.ref_id);
        if expr.contains('$') {
            failures.push(format!("{id}: a variable without a value in {expr}"));
            continue;
        }
        let outcome = evaluate(prom, &expr).await;
        let shown = match &outcome {
            Ok(o) => o.describe(),
            Err(e) => format!("ERROR {e}"),
        };
        println!("  {shown:<32} {id}: {expr}");
        match outcome {
            Ok(o) if o.has_data() => {}
            Ok(o) => failures.push(format!("{id}: {} for {expr}", o.describe())),
            Err(e) => failures.push(format!("{id}: {e}")),
        }
        for p in names_missing(prom, &expr).await {
            failures.push(format!("{id}: {p}"));
        }
    }
    failures
}

/// Every alert: its expression parses (firing or quiet is printed), and each of its data
/// parts ([`promql::data_parts`]: the expression without its outermost threshold) returns
/// data and names only what Prometheus holds. The failures.
async fn alerts_have_data(prom: &Prometheus) -> Vec<String> {
    let mut failures = Vec::new();
    println!("\nalert expressions:");
    for (name, expr) in queries::alerts(&queries::rules()) {
        let one_line = |e: &str| e.split_whitespace().collect::<Vec<_>>().join(" ");
        match evaluate(prom, &expr).await {
            Ok(o) => {
                let state = if o.series > 0 { "firing" } else { "quiet" };
                println!("  {state:<32} alert {name}: {}", one_line(&expr));
            }
            Err(e) => failures.push(format!("alert {name}: {e}")),
        }
        for part in promql::data_parts(&expr) {
            let outcome = evaluate(prom, &part).await;
            let shown = match &outcome {
                Ok(o) => o.describe(),
                Err(e) => format!("ERROR {e}"),
            };
            println!("  {shown:<32}   without its threshold: {}", one_line(&part));
            match outcome {
                Ok(o) if o.has_data() => {}
                Ok(o) => failures.push(format!("alert {name}: {} for {part}", o.describe())),
                Err(e) => failures.push(format!("alert {name}: {e}")),
            }
            for p in names_missing(prom, &part).await {
                failures.push(format!("alert {name}: {p}"));
            }
        }
    }
    failures
}
