//! Issue 25, "Start-up in a large cluster" and "A hung response stalls a watch for ever":
//! the operator against a server whose LIST pages are slow, hang in the middle of their
//! body, and whose continue tokens expire.
//!
//! - a hung LIST of pods is given up after the client's read timeout and the watch lists
//!   again after kube's backoff;
//! - start-up waits for a list that keeps advancing, however long it takes in all;
//! - `check` lists again once after an expired continue token, then reports;
//! - a large cluster (5,000 pods here, 100,000 in the ignored test) with per-page latency
//!   and continue tokens that expire after 3 s: the operator binary starts (its peak RSS is
//!   printed) and `check` completes.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/common/mod.rs"]
mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use tidepool_api as api;
use tidepool_operator::runtime::{self, Settings};
use tidepool_tests::{ApiServer, Config, TargetedFault};

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

/// A fault of the operator's LISTs of `resource`.
fn on_lists(resource: &str) -> TargetedFault {
    TargetedFault {
        identity: OPERATOR.into(),
        resource: resource.into(),
        verbs: ["list".to_string()].into(),
        ..Default::default()
    }
}

async fn add_node(admin: &kube::Client, name: &str) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let node = from(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}));
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("node");
}

/// IPPools `pool-0` … of /24s in 10.0.0.0/8.
async fn add_pools(admin: &kube::Client, n: usize) {
    let pools = (0..n).map(|i| {
        from(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": format!("pool-{i}")},
            "spec": {"cidrs": [format!("10.{}.{}.0/24", i / 256, i % 256)], "blockSize": {"ipv4": 28}},
        }))
    });
    create_all(&Api::<api::IPPool>::all(admin.clone()), pools).await;
}

/// Creates every object through `api`, 32 requests at a time.
async fn create_all<K>(api: &Api<K>, objects: impl Iterator<Item = K>)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    futures::stream::iter(objects)
        .map(|o| async move { api.create(&PostParams::default(), &o).await.map(|_| ()) })
        .buffer_unordered(32)
        .try_collect::<()>()
        .await
        .expect("create");
}

/// Runs the operator's runtime through `client` until the returned sender is dropped.
fn start_operator(
    client: kube::Client,
    s: Settings,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), tidepool_operator::Error>>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(runtime::run(client, s, async {
        let _ = stopped.await;
    }));
    (stop, task)
}

/// Waits until the operator has made `node`'s IPAMNode: its engine runs, so it synced.
async fn ipamnode_made(admin: &kube::Client, node: &str, within: Duration) {
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually(within, &format!("the IPAMNode {node}"), || {
        let api = ipamnodes.clone();
        async move { api.get_opt(node).await.ok().flatten() }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_pod_list_is_given_up_after_the_read_timeout() {
    let (server, admin) = operator_cluster().await;
    add_node(&admin, "node-a").await;
    server.update_faults(|f| {
        f.targeted = vec![TargetedFault {
            hang_after_bytes: Some(64),
            ..on_lists("pods")
        }]
    });
    let read_timeout = Duration::from_secs(2);
    let config = server.kube_config(OPERATOR).await.expect("config");
    let client = tidepool_api::client::client(config, read_timeout).expect("client");
    let (_stop, task) = start_operator(client, operator_settings());
    eventually(Duration::from_secs(20), "the pod list hung", || async {
        (server.request_count("list", "pods") >= 1).then_some(())
    })
    .await;
    server.update_faults(|f| f.targeted.clear());
    let hung = Instant::now();
    // the read timeout, kube's first backoff (at most 1.6 s), the engine's start
    ipamnode_made(&admin, "node-a", Duration::from_secs(15)).await;
    assert!(!task.is_finished(), "the operator runs");
    assert!(
        server.request_count("list", "pods") >= 2,
        "the pods were listed again"
    );
    assert!(
        hung.elapsed() >= read_timeout - Duration::from_millis(100),
        "not given up before the timeout: {:?}",
        hung.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_waits_for_a_list_that_keeps_advancing() {
    let (server, admin) = operator_cluster().await;
    add_node(&admin, "node-a").await;
    add_pools(&admin, 250).await; // three pages of 100
    server.update_faults(|f| {
        f.targeted = vec![TargetedFault {
            latency: Duration::from_secs(2),
            ..on_lists("ippools.ipam.tidepool.dev")
        }]
    });
    let client = server.client(OPERATOR).await.expect("client");
    let s = Settings {
        sync_timeout: Duration::from_secs(3),
        ..operator_settings()
    };
    let t0 = Instant::now();
    let (_stop, task) = start_operator(client, s);
    ipamnode_made(&admin, "node-a", Duration::from_secs(30)).await;
    assert!(!task.is_finished(), "the operator runs");
    assert!(
        t0.elapsed() >= Duration::from_secs(6),
        "the three pages took longer than the sync timeout"
    );
    assert_eq!(server.request_count("list", "ippools.ipam.tidepool.dev"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_fails_naming_a_list_that_stalls() {
    let (server, admin) = operator_cluster().await;
    server.update_faults(|f| {
        f.targeted = vec![TargetedFault {
            hang_after_bytes: Some(10),
            ..on_lists("ippools.ipam.tidepool.dev")
        }]
    });
    let client = server.client(OPERATOR).await.expect("client");
    let s = Settings {
        sync_timeout: Duration::from_secs(2),
        ..operator_settings()
    };
    let (_stop, task) = start_operator(client, s);
    let e = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("start-up failed in time")
        .expect("join")
        .expect_err("start-up fails");
    assert_eq!(
        e.to_string(),
        "ippools did not sync: no page or event for 2s (is the API server reachable, are the CRDs installed, may the operator list them?)"
    );
    drop(admin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_lists_again_once_after_an_expired_continue_token() {
    let (server, admin) = operator_cluster_with(Config {
        rbac: true,
        continue_max_age: Some(Duration::from_secs(1)),
        ..fast_config()
    })
    .await;
    add_pools(&admin, 501).await; // two pages of 500
    let slow = TargetedFault {
        latency: Duration::from_millis(1500),
        ..on_lists("ippools.ipam.tidepool.dev")
    };
    server.update_faults(|f| f.targeted = vec![slow.clone()]);
    let operator = server.client(OPERATOR).await.expect("client");
    // every second page comes after its token expired: the check lists twice, then reports
    server.reset_counters();
    let e = tidepool_operator::check::io::run(&operator)
        .await
        .expect_err("the list cannot complete");
    assert!(e.to_string().contains("ippools"), "{e}");
    assert_eq!(
        server.request_count("list", "ippools.ipam.tidepool.dev"),
        4,
        "two tries of two pages"
    );
    // the second try succeeds once the pages are fast again
    server.reset_counters();
    let expired_before = expired(&server);
    let check = tokio::spawn(async move { tidepool_operator::check::io::run(&operator).await });
    eventually(Duration::from_secs(20), "a token expired", || async {
        (expired(&server) > expired_before).then_some(())
    })
    .await;
    server.update_faults(|f| f.targeted.clear());
    let report = check.await.expect("join").expect("the second try lists");
    assert_eq!(report.summary.ippools, 501);
    assert_eq!(server.request_count("list", "ippools.ipam.tidepool.dev"), 4);
}

/// The 410s the server has answered.
fn expired(server: &ApiServer) -> usize {
    server
        .failed_requests()
        .iter()
        .filter(|r| r.code == 410)
        .count()
}

/// An ephemeral port that is free now.
fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// An HTTP GET's status code.
fn get_code(addr: SocketAddr, path: &str) -> Option<u16> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split(' ').nth(1)?.parse().ok()
}

/// The child's peak resident set (`VmHWM`), in MiB.
fn peak_rss_mib(child: &Child) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).expect("status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib / 1024.0
}

/// Kills the operator child when dropped.
struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `pods` pending pods on `pods / 100` Nodes (no IPPool: nothing is granted, the test is
/// the start-up), created through the API.
async fn large_cluster(admin: &kube::Client, pods: usize) {
    let nodes = pods.div_ceil(100);
    for n in 0..nodes {
        add_node(admin, &format!("node-{n}")).await;
    }
    let all = (0..pods).map(|i| {
        from(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p-{i}"), "namespace": "default",
                "labels": {"app": format!("app-{}", i % 50)}},
            "spec": {"nodeName": format!("node-{}", i % nodes),
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        }))
    });
    create_all(&Api::<Pod>::namespaced(admin.clone(), "default"), all).await;
}

/// `pods` pods, 100 ms per LIST page of the operator's, continue tokens that expire after
/// 3 s: the operator binary becomes ready within its 60 s sync timeout, and `check`
/// completes. Returns the operator's peak RSS once ready, in MiB.
async fn large_cluster_starts_and_checks(pods: usize) -> f64 {
    let (server, admin) = operator_cluster_with(Config {
        rbac: true,
        continue_max_age: Some(Duration::from_secs(3)),
        ..fast_config()
    })
    .await;
    let t0 = Instant::now();
    large_cluster(&admin, pods).await;
    eprintln!("{pods} pods created in {:?}", t0.elapsed());
    server.update_faults(|f| {
        f.targeted = ["pods", "nodes", "ipamnodes.ipam.tidepool.dev"]
            .into_iter()
            .chain(["ipamblocks.ipam.tidepool.dev", "ippools.ipam.tidepool.dev"])
            .map(|r| TargetedFault {
                latency: Duration::from_millis(100),
                ..on_lists(r)
            })
            .collect()
    });
    let dir = std::env::temp_dir().join(format!("tidepool-large-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("operator");
    server
        .write_kubeconfig(OPERATOR, &kubeconfig)
        .expect("kubeconfig");
    let (metrics, health) = (free_port(), free_port());
    let bin = env!("CARGO_BIN_EXE_tidepool-operator");
    let child = Command::new(bin)
        .args(["run", "--leader-elect=false", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--metrics-addr", &metrics.to_string()])
        .args(["--health-addr", &health.to_string()])
        .args(["--sync-timeout", "60s"])
        .env("TIDEPOOL_LOG_LEVEL", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tidepool-operator");
    let mut op = Operator(child);
    let mut stderr = op.0.stderr.take().expect("stderr");
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(180);
    let ready = loop {
        if let Ok(Some(status)) = op.0.try_wait() {
            break Err(format!("the operator exited ({status})"));
        }
        if Instant::now() >= deadline {
            break Err("the operator was not ready in time".to_string());
        }
        let code = tokio::task::spawn_blocking(move || get_code(health, "/readyz"))
            .await
            .ok()
            .flatten();
        if code == Some(200) {
            break Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let rss = peak_rss_mib(&op.0);
    if let Err(why) = ready {
        drop(op);
        panic!("{why}:\n{}", log.join().unwrap());
    }
    eprintln!(
        "{pods} pods: the operator ready in {:?}, peak RSS {rss:.1} MiB",
        t0.elapsed()
    );
    check_completes(bin, &kubeconfig, pods).await;
    drop(op);
    let _ = std::fs::remove_dir_all(&dir);
    rss
}

/// `check -o json` as the operator finishes and counts every pod.
async fn check_completes(bin: &str, kubeconfig: &Path, pods: usize) {
    let mut cmd = Command::new(bin);
    cmd.args(["check", "-o", "json", "--timeout", "30s", "--kubeconfig"])
        .arg(kubeconfig);
    let t0 = Instant::now();
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run check"))
        .await
        .expect("join");
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "check failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["summary"]["pods"], pods, "{report}");
    eprintln!("check completed in {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_cluster_with_slow_pages_and_expiring_tokens_starts() {
    large_cluster_starts_and_checks(5_000).await;
}

/// The figure in BENCHMARKS.md: `cargo test --release -p tidepool-operator --test
/// slow_lists -- --ignored --nocapture a_cluster_of_100000_pods`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "100,000 pods take minutes to create; run by hand for BENCHMARKS.md"]
async fn a_cluster_of_100000_pods_starts_and_checks() {
    large_cluster_starts_and_checks(100_000).await;
}
