//! Pod-ready latency through the whole system (issue 16; BENCHMARKS.md): from a pod seen
//! bound by its kubelet stand-in to its status written Running with its address (the
//! sandbox's namespace, ptp → tidepool-cni → the agent, the status patch), p50 and p99,
//! on the e2e harness (`agent/tests/common/e2e.rs`: the API server in-process, the
//! operator and agent binaries, nodes as network namespaces). Printed, never asserted.
//! Root only; the operator binary must be built (`cargo build -p tidepool-operator`).
//!
//! ```text
//! cargo build -p tidepool-operator --bin tidepool-operator
//! cargo bench -p tidepool-agent --bench ready
//! # env: READY_PODS (100, the warm case's pods, one at a time), READY_BURST (200)
//! ```
//!
//! Cases:
//! - warm: one node whose pool is pre-allocated; pods created one at a time;
//! - fresh: a node added, one pod bound to it at once (its IPAMNode and first block
//!   created on the way), repeated on new nodes;
//! - burst: READY_BURST pods created at once on three warm nodes.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::e2e::{Cluster, Tuning};
use common::kubelet::{Backoff, Kubelet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

/// p50 and p99 in ms.
fn percentiles(mut d: Vec<Duration>) -> (f64, f64) {
    d.sort();
    let at = |q: f64| {
        let i = ((d.len() as f64 - 1.0) * q).round() as usize;
        d[i].as_secs_f64() * 1000.0
    };
    (at(0.5), at(0.99))
}

async fn create_pod(admin: &kube::Client, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "pause"}]},
    }))
    .expect("a pod");
    Api::<Pod>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
}

/// Waits until the kubelet has `n` latencies recorded (120 s at most).
async fn until_ready(k: &Kubelet, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while k.record(|r| r.ready_latency.len()) < n {
        assert!(Instant::now() < deadline, "pods did not become ready");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn row(case: &str, lat: &[Duration]) {
    let (p50, p99) = percentiles(lat.to_vec());
    println!("| {case} | {} | {p50:.0} ms | {p99:.0} ms |", lat.len());
}

async fn bench() {
    let warm_pods: usize = env_or("READY_PODS", 100);
    let burst: usize = env_or("READY_BURST", 200);
    let mut cluster = Cluster::start("rdy", Tuning::default()).await;
    cluster
        .kubectl
        .apply(
            &json!({
                "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
                "metadata": {"name": "default"},
                "spec": {"cidrs": ["10.77.0.0/18"], "blockSize": {"ipv4": 26}},
            })
            .to_string(),
        )
        .await;
    cluster.start_operator();
    cluster.add_node("node-a").await;
    let kubelet = Kubelet::start(
        cluster.admin.clone(),
        cluster.runtimes(),
        cluster.ns.clone(),
        &cluster.tag,
        Backoff {
            first: Duration::from_secs(1),
            cap: Duration::from_secs(10),
        },
    );
    println!("| case | pods | p50 | p99 |\n|---|---|---|---|");

    // warm: one pod at a time on node-a
    create_pod(&cluster.admin, "warm-0").await;
    until_ready(&kubelet, 1).await;
    for i in 1..=warm_pods {
        create_pod(&cluster.admin, &format!("warm-{i}")).await;
        until_ready(&kubelet, i + 1).await;
    }
    let all = kubelet.record(|r| r.ready_latency.clone());
    row("warm node, one pod at a time", &all[1..]);

    // fresh: each new node gets one pod at once (the scheduler prefers the empty node)
    let mut fresh = Vec::new();
    for (i, n) in ["node-b", "node-c"].into_iter().enumerate() {
        cluster.add_node(n).await;
        kubelet.add_node(cluster.nodes[n].rt.clone());
        let before = kubelet.record(|r| r.ready_latency.len());
        create_pod(&cluster.admin, &format!("fresh-{i}")).await;
        until_ready(&kubelet, before + 1).await;
        fresh.push(kubelet.record(|r| *r.ready_latency.last().expect("one")));
    }
    row("fresh node, its first pod", &fresh);

    // burst: many pods at once on the three nodes
    let before = kubelet.record(|r| r.ready_latency.len());
    for i in 0..burst {
        create_pod(&cluster.admin, &format!("burst-{i}")).await;
    }
    until_ready(&kubelet, before + burst).await;
    let all = kubelet.record(|r| r.ready_latency.clone());
    row(&format!("burst of {burst} on 3 nodes"), &all[before..]);
    let failed = kubelet.record(|r| r.failed_adds);
    println!("failed ADDs (retried): {failed}");
}
