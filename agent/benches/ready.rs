//! Pod-ready latency through the whole system (issue 16; BENCHMARKS.md): from a pod seen
//! bound by its kubelet stand-in to its status written Running with its address (the
//! sandbox's namespace, ptp → tidepool-cni → the agent, the status patch), p50 and p99,
//! on the e2e harness (`tests/tests/system/e2e.rs`: the API server in-process, the
//! operator and agent binaries, nodes as network namespaces). Printed, never asserted.
//! Root only; the operator binary must be built (`cargo build -p tidepool-operator`).
//!
//! ```text
//! cargo build -p tidepool-operator --bin tidepool-operator
//! cargo bench -p tidepool-agent --bench ready
//! # env: READY_PODS (100, the warm case's pods, one at a time), READY_BURST (200),
//! #      READY_FRESH_NODES (10) × READY_FRESH_PODS (10), READY_COLD_POOLS (100)
//! ```
//!
//! Cases:
//! - warm: one node whose pool is pre-allocated; pods created one at a time;
//! - burst: READY_BURST pods created at once on three warm nodes;
//! - fresh: issue 16's fresh node. READY_FRESH_PODS pods are bound to a node (its
//!   kubelet stand-in ready) before its Node object exists, so the operator has granted it
//!   nothing; then the Node is registered (kubectl) and its agent started at once, as its
//!   DaemonSet pod would be. Each pod waits for the IPAMNode, the first block and the agent.
//!   Repeated on READY_FRESH_NODES new nodes; also printed: how long the registration took
//!   (kubectl, counted in the latency) and when each agent served.
//! - cold pool: issue 29's first pod of a pool on a node that holds no block of it (see
//!   [`cold_pools`]), READY_COLD_POOLS times.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::e2e::{Cluster, Tuning};
use common::figures::{env_or, p50_p99_ms};
use common::kubelet::{Backoff, Kubelet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

async fn create_pod(admin: &kube::Client, name: &str) {
    create_annotated_pod(admin, name, json!({})).await;
}

/// A pod of namespace `default` with `annotations`, for the scheduler stand-in to bind.
async fn create_annotated_pod(admin: &kube::Client, name: &str, annotations: serde_json::Value) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "image": "pause"}]},
    }))
    .expect("a pod");
    Api::<Pod>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
}

/// Whether the kubelet has `n` latencies recorded within `limit`.
async fn ready_within(k: &Kubelet, n: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while k.record(|r| r.ready_latency.len()) < n {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
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
    let (p50, p99) = p50_p99_ms(lat.to_vec());
    println!("| {case} | {} | {p50:.0} ms | {p99:.0} ms |", lat.len());
}

async fn bench() {
    let warm_pods: usize = env_or("READY_PODS", 100);
    let burst: usize = env_or("READY_BURST", 200);
    let mut cluster = Cluster::start("rdy", Tuning::default()).await;
    cluster.apply_pool(&["10.77.0.0/18"], 26).await;
    cluster.start_operator();
    cluster.add_node("node-a").await;
    let kubelet = cluster.start_kubelet(Backoff {
        first: Duration::from_secs(1),
        cap: Duration::from_secs(10),
    });
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

    // burst: many pods at once on three nodes (two more added and served first)
    for n in ["node-b", "node-c"] {
        cluster.add_node(n).await;
        kubelet.add_node(cluster.nodes[n].rt.clone());
    }
    let before = kubelet.record(|r| r.ready_latency.len());
    let failed_before = kubelet.record(|r| r.failed_adds);
    for i in 0..burst {
        create_pod(&cluster.admin, &format!("burst-{i}")).await;
    }
    until_ready(&kubelet, before + burst).await;
    let all = kubelet.record(|r| r.ready_latency.clone());
    row(&format!("burst of {burst} on 3 nodes"), &all[before..]);
    let failed = kubelet.record(|r| r.failed_adds) - failed_before;
    println!("burst: failed ADDs (retried): {failed}");

    ensure_operator(&mut cluster).await;
    fresh_nodes(&mut cluster, &kubelet).await;
    ensure_operator(&mut cluster).await;
    cold_pools(&cluster, &kubelet).await;
}

/// Restarts the operator if it exited, as Kubernetes restarts its container, and waits
/// until the new one leads: on 2 shared cores the burst can starve the one replica's Lease
/// renewal (renew deadline 1 s), and a replica that loses the lead exits.
async fn ensure_operator(cluster: &mut Cluster) {
    if cluster.operators.iter_mut().any(|o| o.running()) {
        return;
    }
    let last = cluster
        .operators
        .last()
        .map(|o| o.tail(12))
        .unwrap_or_default();
    println!("the operator had exited; the end of its log:\n{last}\nrestarted");
    cluster.start_operator();
    let new = cluster.operators.len() - 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    while cluster.leader().await != new {
        assert!(
            Instant::now() < deadline,
            "the restarted operator does not lead"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 16's fresh node (module docs), on READY_FRESH_NODES new nodes.
async fn fresh_nodes(cluster: &mut Cluster, kubelet: &Kubelet) {
    let nodes: usize = env_or("READY_FRESH_NODES", 10);
    let per_node: usize = env_or("READY_FRESH_PODS", 10);
    let failed_before = kubelet.record(|r| r.failed_adds);
    let (mut lat, mut registering, mut serving) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..nodes {
        let node = format!("fresh-{i}");
        kubelet.add_node(cluster.wire_node_host(&node));
        let before = kubelet.record(|r| r.ready_latency.len());
        // bound before the Node object exists: the operator cannot have granted anything
        let creates =
            (0..per_node).map(|j| create_bound_pod(&cluster.admin, format!("{node}-{j}"), &node));
        futures::future::join_all(creates).await;
        let created = Instant::now();
        cluster.register_node(&node).await;
        registering.push(created.elapsed());
        cluster.start_agent(&node);
        cluster.until_serving(&node).await;
        serving.push(created.elapsed());
        until_ready(kubelet, before + per_node).await;
        lat.extend(kubelet.record(|r| r.ready_latency[before..].to_vec()));
    }
    row(
        &format!("fresh node, {per_node} pods bound before it registers"),
        &lat,
    );
    let (r50, r99) = p50_p99_ms(registering);
    let (s50, s99) = p50_p99_ms(serving);
    let failed = kubelet.record(|r| r.failed_adds) - failed_before;
    println!(
        "fresh: {nodes} nodes; from the pods bound: Node registered (kubectl apply + status \
         patch) p50 {r50:.0} ms, max {r99:.0} ms; its agent serving p50 {s50:.0} ms, max \
         {s99:.0} ms; failed ADDs (retried): {failed}"
    );
}

/// Issue 29's cold pool (DESIGN.md "Pools per namespace and per pod"): a pod whose
/// annotation names a pool its node holds no block of, on an idle operator with its default
/// flags. The waiting pod is the pool's demand on its node, so the block is claimed while
/// its ADD waits. READY_COLD_POOLS pools, each created and seen Valid first (the operator
/// idle again), then one pod naming it; one at a time.
async fn cold_pools(cluster: &Cluster, kubelet: &Kubelet) {
    let pools: usize = env_or("READY_COLD_POOLS", 100);
    assert!(
        pools <= 192,
        "READY_COLD_POOLS: at most 192 (a /24 each in 10.77.64.0/18 and up)"
    );
    let failed_before = kubelet.record(|r| r.failed_adds);
    let mut lat = Vec::new();
    for i in 0..pools {
        let pool = format!("cold-{i}");
        // inside the agents' --pod-network (10.77.0.0/16), beside the warm pool's /18
        let cidr = format!("10.77.{}.0/24", 64 + i);
        create_valid_pool(&cluster.admin, &pool, &cidr).await;
        let before = kubelet.record(|r| r.ready_latency.len());
        let names = json!({"ipam.tidepool.dev/pools": pool});
        let pod = format!("cold-pod-{i}");
        create_annotated_pod(&cluster.admin, &pod, names).await;
        if !ready_within(kubelet, before + 1, Duration::from_secs(60)).await {
            let blocks = cluster
                .kubectl
                .ok(&["get", "ipamblocks", "-o", "wide"], None)
                .await;
            let jp = "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase}{'\\n'}{end}";
            let pods = cluster.kubectl.ok(&["get", "pods", "-o", jp], None).await;
            let nodes = cluster
                .kubectl
                .ok(&["get", "ipamnodes", "-o", "yaml"], None)
                .await;
            let pods = format!("{pods}\nipamnodes:\n{nodes}");
            let op = cluster
                .operators
                .last()
                .map(|o| o.tail(40))
                .unwrap_or_default();
            let logs = cluster.logs_matching(&[pod.clone(), pool.clone(), "failed".into()]);
            panic!(
                "{pod} (pool {pool}, #{i}) did not become ready; blocks:\n{blocks}\npods:\n{pods}\n\
                 operator:\n{op}\nlogs:\n{logs}"
            );
        }
        lat.extend(kubelet.record(|r| r.ready_latency[before..].to_vec()));
    }
    row("first pod of a pool its node holds no block of", &lat);
    let failed = kubelet.record(|r| r.failed_adds) - failed_before;
    println!("cold pools: {pools} pools; failed ADDs (retried): {failed}");
}

/// IPPool `name` over `cidr` in /28 blocks, once the operator has found it Valid.
async fn create_valid_pool(admin: &kube::Client, name: &str, cidr: &str) {
    let pools: Api<tidepool_api::IPPool> = Api::all(admin.clone());
    let pool: tidepool_api::IPPool = serde_json::from_value(json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"cidrs": [cidr], "blockSize": {"ipv4": 28}},
    }))
    .expect("a pool");
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create the pool");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = pools.get(name).await.expect("the pool");
        let conditions = p.status.map(|s| s.conditions).unwrap_or_default();
        if (conditions.iter()).any(|c| c.type_ == "Valid" && c.status == "True") {
            return;
        }
        assert!(Instant::now() < deadline, "pool {name} never Valid");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pod bound to `node` at its creation (`spec.nodeName`, as after a Binding).
async fn create_bound_pod(admin: &kube::Client, name: String, node: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
    }))
    .expect("a pod");
    Api::<Pod>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
}
