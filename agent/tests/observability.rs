//! The `tidepool-agent` binary's metrics, probes and log format, seen from outside: started
//! with `--metrics-addr` and `--health-addr` on loopback ports and `--log-format json`
//! against the in-process API server, before its IPAMNode exists. `/healthz` answers at once,
//! `/readyz` only once it serves; `/metrics` has every agent series from the start (at zero),
//! its build info and the standard process metrics, and none of the operator's; the CNI requests the real plugin makes move the counters by
//! exactly what was done, and the address gauge follows the allocations. With Debian's
//! `prometheus` installed, promtool accepts the exposition and a real Prometheus scrapes it.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use common::agent_process::start_agent;
use common::prometheus::{self, free_port, get, http};
use common::*;
use kube::api::{Api, PostParams};
use serde_json::json;
use tidepool_api as api;
use tidepool_metrics as m;

const POD_1: &str = "0badc0de-0000-4000-8000-000000000001";
const POD_2: &str = "0badc0de-0000-4000-8000-000000000002";
const STRANGER: &str = "0badc0de-0000-4000-8000-0000000000ff";

/// The exposition's samples: `name{labels}` as written → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample line");
            (series.to_owned(), value.parse().expect("a number"))
        })
        .collect()
}

/// `name{k="v",...}` as the exporter writes a series (labels in the table's order).
fn series(name: &str, labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return name.to_owned();
    }
    let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", l.join(","))
}

/// Every series the agent registers at zero, as the exposition names them (a histogram by
/// its `_count`).
fn agent_series() -> Vec<String> {
    let mut out = Vec::new();
    for d in m::AGENT {
        let name = match d.kind {
            m::Kind::Histogram => format!("{}_count", d.name),
            _ => d.name.to_owned(),
        };
        for s in d.series() {
            out.push(series(&name, &s));
        }
    }
    out
}

fn requests(verb: &str, outcome: &str) -> String {
    series(
        m::AGENT_CNI_REQUESTS_TOTAL,
        &[("verb", verb), ("outcome", outcome)],
    )
}

fn agent_ips(family: &str, state: &str) -> String {
    series(m::AGENT_IPS, &[("family", family), ("state", state)])
}

fn writes(outcome: &str) -> String {
    series(m::AGENT_STATUS_WRITES_TOTAL, &[("outcome", outcome)])
}

/// The IPAMNode node-a and its block, as the operator creates them.
async fn create_node_a(server: &tidepool_tests::ApiServer, admin: &kube::Client) {
    let operator = server.client(OPERATOR).await.expect("operator client");
    let node: api::IPAMNode = serde_json::from_value(json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": { "name": "node-a" },
        "spec": { "nodeUID": UID_A },
    }))
    .expect("IPAMNode");
    Api::<api::IPAMNode>::all(operator)
        .create(&PostParams::default(), &node)
        .await
        .expect("create node-a");
    create_block(admin, "10.250.0.16/28", "node-a", UID_A, false).await;
}

/// The plugin run once off the runtime's threads.
async fn cni(cmd: &'static str, container: &'static str, uid: &'static str, conf: &str) -> Run {
    let conf = conf.to_owned();
    blocking(move || plugin(cmd, container, uid, &conf)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exports_its_metrics_and_probes_from_the_start() {
    let (server, admin) = empty_cluster().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = settings(dir.path());
    let kubeconfig = dir.path().join("kubeconfig");
    server
        .write_kubeconfig(&agent_on("node-a"), &kubeconfig)
        .expect("kubeconfig");
    let (metrics, health) = (free_port(), free_port());
    let agent = start_agent(dir.path(), &kubeconfig, metrics, health);
    let client = http();

    // up but not ready: no IPAMNode yet, so nothing restored and no socket
    eventually("/healthz answers", || async {
        get(&client, health, "/healthz")
            .await
            .filter(|(c, _)| *c == 200)
    })
    .await;
    let (code, _) = get(&client, health, "/readyz").await.expect("/readyz");
    assert_eq!(code, 503, "not ready before it serves");
    assert!(marker(&s.restored_marker).is_none());
    let (code, text) = get(&client, metrics, "/metrics").await.expect("/metrics");
    assert_eq!(code, 200);
    let start = samples(&text);
    for want in agent_series() {
        assert_eq!(start.get(&want), Some(&0.0), "{want} at zero:\n{text}");
    }
    let own = |k: &String| {
        k.starts_with("tidepool_agent_")
            || k.starts_with("tidepool_build_info{")
            || k.starts_with("process_")
    };
    assert!(
        start.keys().all(own),
        "only the agent's series, its build info and process_*; no tidepool_ipam_*:\n{text}"
    );
    process_metrics::assert_process_series(&text, env!("CARGO_PKG_VERSION"));
    assert!(!text.contains("tidepool_leader"), "{text}");

    // the operator creates node-a and its block: the agent restores, publishes, serves
    create_node_a(&server, &admin).await;
    eventually("/readyz ready", || async {
        get(&client, health, "/readyz")
            .await
            .filter(|(c, _)| *c == 200)
    })
    .await;
    assert!(
        marker(&s.restored_marker).is_some(),
        "ready only once restored"
    );

    let conf = config(&s);
    let a1 = cni("ADD", "c1", POD_1, &conf).await.addr();
    let a2 = cni("ADD", "c2", POD_2, &conf).await.addr();
    assert_ne!(a1, a2);
    assert_eq!(cni("DEL", "c1", STRANGER, &conf).await.code, 0, "stale");
    assert_eq!(cni("DEL", "c1", POD_1, &conf).await.code, 0, "freed");
    assert_eq!(cni("DEL", "c1", POD_1, &conf).await.code, 0, "unknown now");
    assert_eq!(cni("STATUS", "", "", &conf).await.code, 0);
    assert_eq!(
        cni("CHECK", "c9", POD_1, &conf).await.error_code(),
        tidepool_agent::cni::proto::code::GENERIC,
        "no allocation"
    );

    // the pod left holding an address is published (status writes are asynchronous)
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually("c2's address in status.used", || async {
        let n = nodes.get("node-a").await.ok()?;
        let used: Vec<String> = n.status?.used.keys().cloned().collect();
        (used == [a2.clone()]).then_some(())
    })
    .await;
    let after = eventually("the last status write counted", || async {
        let (_, text) = get(&client, metrics, "/metrics").await?;
        let now = samples(&text);
        // the restore's write, then at least one per change that reached the server
        (now[&writes("ok")] >= 2.0).then_some(text)
    })
    .await;
    let now = samples(&after);
    let exactly: &[(String, f64)] = &[
        (requests("add", "ok"), 2.0),
        (requests("add", "error"), 0.0),
        (requests("del", "ok"), 1.0),
        (requests("del", "stale"), 1.0),
        (requests("del", "unknown"), 1.0),
        (requests("del", "error"), 0.0),
        (requests("status", "ok"), 1.0),
        (requests("check", "error"), 1.0),
        (requests("check", "ok"), 0.0),
        (requests("gc", "ok"), 0.0),
        (
            series(
                "tidepool_agent_cni_duration_seconds_count",
                &[("verb", "add")],
            ),
            2.0,
        ),
        (
            series(
                "tidepool_agent_cni_duration_seconds_count",
                &[("verb", "del")],
            ),
            3.0,
        ),
        // one pod holds an address, the freed one cools down, the block is the pool
        (agent_ips("ipv4", "used"), 1.0),
        (agent_ips("ipv4", "cooldown"), 1.0),
        (agent_ips("ipv4", "pool"), 16.0),
        (agent_ips("ipv4", "marked"), 0.0),
        (agent_ips("ipv6", "pool"), 0.0),
        (writes("error"), 0.0),
        (writes("conflict"), 0.0),
    ];
    for (series, want) in exactly {
        assert_eq!(now.get(series), Some(want), "{series}:\n{after}");
    }
    // a histogram, with buckets: the fastest bucket bounds are sub-millisecond
    assert!(
        after.contains("tidepool_agent_cni_duration_seconds_bucket{verb=\"add\",le=\"0.0005\"}"),
        "{after}"
    );
    let add_inf = series(
        "tidepool_agent_cni_duration_seconds_bucket",
        &[("verb", "add"), ("le", "+Inf")],
    );
    assert_eq!(now.get(&add_inf), Some(&2.0), "{after}");

    promtool_accepts(&after);
    prometheus_scrapes(metrics).await;

    let (status, log) = agent.stop().await;
    assert!(status.success(), "exit {status:?}:\n{log}");
    log_is_json_lines(&log);
}

/// `--log-format json`: one JSON object per line, the start-up steps among them.
fn log_is_json_lines(log: &str) {
    let mut messages = Vec::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: not JSON: {line}"));
        assert!(v["level"].is_string(), "{line}");
        if let Some(m) = v["fields"]["message"].as_str() {
            messages.push(m.to_owned());
        }
    }
    for want in ["serving /metrics", "serving", "stopped"] {
        assert!(
            messages.iter().any(|m| m == want),
            "{want:?} not logged: {messages:?}"
        );
    }
}

/// promtool (Debian package `prometheus`) accepts the agent's exposition without findings;
/// skipped with a note when it is not installed.
fn promtool_accepts(text: &str) {
    if !prometheus::installed() {
        eprintln!("skipping the promtool check: Debian's prometheus is not installed");
        return;
    }
    if let Err(findings) = prometheus::promtool_check_metrics(text) {
        panic!("promtool: {findings}");
    }
}

/// A real Prometheus (`/usr/bin/prometheus`, Debian package `prometheus`) on a loopback port
/// scrapes the agent: its target is up and it reads the ADD counter. Skipped with a note when
/// it is not installed.
async fn prometheus_scrapes(agent_metrics: SocketAddr) {
    if !prometheus::installed() {
        eprintln!("skipping the Prometheus scrape: /usr/bin/prometheus is not installed");
        return;
    }
    let target = prometheus::Target {
        job: "agent",
        addr: agent_metrics,
        labels: Vec::new(),
    };
    let prom = prometheus::Prometheus::start(&[target], "1s");
    let value = |s: &[prometheus::Sample]| s.first().map(|s| s.value);
    let up = prom
        .until("the agent scraped", r#"up{job="agent"}"#, |s| !s.is_empty())
        .await;
    assert_eq!(value(&up), Some(1.0), "the agent target is up");
    let adds = prom
        .until(
            "the ADD counter read",
            r#"tidepool_agent_cni_requests_total{job="agent",verb="add",outcome="ok"}"#,
            |s| !s.is_empty(),
        )
        .await;
    assert_eq!(
        value(&adds),
        Some(2.0),
        "Prometheus read the agent's ADD counter"
    );
}
