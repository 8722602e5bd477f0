//! `tidepool-operator check` against the in-process API server, with RBAC on and the
//! operator's own role (`deploy/operator/rbac.yaml`): a cluster holding a duplicate, a leak,
//! an orphan block, an address outside its pod's pool and a reclaim candidate is reported as
//! such, through the library function
//! the binary calls and through the binary itself (table and JSON, exit status 1), and the
//! server counts no write while it runs.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tidepool_api as api;
use tidepool_operator::check::{self, ProblemKind};
use tidepool_tests::ApiServer;

const WRITES: [&str; 6] = [
    "create",
    "update",
    "patch",
    "apply",
    "delete",
    "deletecollection",
];
const GONE_NODE_UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
const DELETED_POD_UID: &str = "11111111-2222-4333-8444-555555555555";

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

async fn add_node(admin: &kube::Client, name: &str) -> String {
    let nodes: Api<Node> = Api::all(admin.clone());
    let n = nodes
        .create(
            &PostParams::default(),
            &from(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})),
        )
        .await
        .expect("node");
    n.metadata.uid.expect("a uid")
}

/// A pod bound to `node`; with `ip`, Running with that address (the status written as the
/// kubelet would, through the status subresource).
async fn add_pod(admin: &kube::Client, name: &str, node: &str, ip: Option<&str>) -> String {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let p = pods
        .create(
            &PostParams::default(),
            &from(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
            })),
        )
        .await
        .expect("pod");
    if let Some(ip) = ip {
        let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("pod status");
    }
    p.metadata.uid.expect("a uid")
}

async fn add_block(admin: &kube::Client, cidr: &str, node: &str, node_uid: &str) {
    let name = tidepool_ipam::pool::block_name(&cidr.parse().unwrap());
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    blocks
        .create(
            &PostParams::default(),
            &from(json!({
                "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
                "metadata": {"name": name},
                "spec": {"pool": "default", "cidr": cidr, "node": node, "nodeUID": node_uid},
            })),
        )
        .await
        .expect("block");
}

/// An IPAMNode (created as the operator would) whose `status.used` the node side wrote
/// through the status subresource: (address, pod name, pod UID).
async fn add_ipam_node(
    admin: &kube::Client,
    name: &str,
    node_uid: &str,
    used: &[(&str, &str, &str)],
) {
    let api: Api<api::IPAMNode> = Api::all(admin.clone());
    api.create(
        &PostParams::default(),
        &from(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": {"name": name},
            "spec": {"nodeUID": node_uid},
        })),
    )
    .await
    .expect("ipamnode");
    let used: serde_json::Map<String, Value> = used
        .iter()
        .map(|(addr, pod, uid)| {
            let e = json!({"podUID": uid, "namespace": "default", "pod": pod,
                "containerID": format!("containerd://{pod}"), "ifname": "eth0",
                "since": "2026-01-01T00:00:00Z"});
            (addr.to_string(), e)
        })
        .collect();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"used": used}})),
    )
    .await
    .expect("ipamnode status");
}

/// Two live nodes and a gone one's block; node-a records a pod that no longer exists
/// (reclaim candidate), an address outside its blocks (leak) and a pod whose entry names
/// pool `blue` in its block of pool `default` (outside its pool); node-b records node-a's
/// pod's address for a pod of its own (duplicate).
async fn troubled_cluster(admin: &kube::Client) {
    let pools: Api<api::IPPool> = Api::all(admin.clone());
    pools
        .create(
            &PostParams::default(),
            &from(json!({
                "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
                "metadata": {"name": "default"},
                "spec": {"cidrs": ["10.30.0.0/16"], "blockSize": {"ipv4": 28}},
            })),
        )
        .await
        .expect("pool");
    let a = add_node(admin, "node-a").await;
    let b = add_node(admin, "node-b").await;
    let pa = add_pod(admin, "pa", "node-a", Some("10.30.0.1")).await;
    let pl = add_pod(admin, "pl", "node-a", None).await;
    let pb = add_pod(admin, "pb", "node-b", Some("10.30.0.17")).await;
    let px = add_pod(admin, "px", "node-b", None).await;
    let pw = add_pod(admin, "pw", "node-a", None).await;
    add_block(admin, "10.30.0.0/28", "node-a", &a).await;
    add_block(admin, "10.30.0.16/28", "node-b", &b).await;
    add_block(admin, "10.30.0.32/28", "node-gone", GONE_NODE_UID).await;
    add_ipam_node(
        admin,
        "node-a",
        &a,
        &[
            ("10.30.0.1", "pa", &pa),
            ("10.30.0.2", "gone", DELETED_POD_UID),
            ("10.30.5.5", "pl", &pl),
            ("10.30.0.3", "pw", &pw),
        ],
    )
    .await;
    // the pool pw's ADD chose, as the node side writes it
    let blue = json!({"status": {"used": {"10.30.0.3": {"pool": "blue"}}}});
    Api::<api::IPAMNode>::all(admin.clone())
        .patch_status("node-a", &PatchParams::default(), &Patch::Merge(blue))
        .await
        .expect("pw's pool");
    add_ipam_node(
        admin,
        "node-b",
        &b,
        &[("10.30.0.17", "pb", &pb), ("10.30.0.1", "px", &px)],
    )
    .await;
}

/// Writes the server counted, by (verb, resource).
fn writes(server: &ApiServer) -> Vec<((String, String), u64)> {
    server
        .requests()
        .into_iter()
        .filter(|((verb, _), n)| WRITES.contains(&verb.as_str()) && *n > 0)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_the_troubles_and_writes_nothing() {
    let (server, admin) = operator_cluster().await;
    troubled_cluster(&admin).await;
    let operator = server.client(OPERATOR).await.expect("operator client");
    server.reset_counters();

    let report = check::io::run(&operator)
        .await
        .expect("the check runs with the operator's role");

    assert_eq!(writes(&server), vec![], "the check wrote");
    for resource in [
        "ippools.ipam.tidepool.dev",
        "ipamnodes.ipam.tidepool.dev",
        "ipamblocks.ipam.tidepool.dev",
        "nodes",
        "pods",
    ] {
        assert_eq!(
            server.request_count("list", resource),
            1,
            "one list of {resource}: {:?}",
            server.requests()
        );
    }

    let kinds: Vec<&str> = report.problems.iter().map(|p| p.kind.as_str()).collect();
    assert!(
        kinds
            .iter()
            .all(|k| ["duplicate", "leaked", "orphan-block", "outside-pool"].contains(k)),
        "{:#?}",
        report.problems
    );
    // the duplicate: 10.30.0.1 in status.used of both nodes
    let dup = report
        .of_kind(ProblemKind::Duplicate)
        .find(|p| p.objects == ["ipamnode/node-a", "ipamnode/node-b"])
        .unwrap_or_else(|| panic!("{:#?}", report.problems));
    assert_eq!(dup.address, Some("10.30.0.1".parse().unwrap()));
    // the leak: node-a's 10.30.5.5 lies in none of its blocks
    let leaks: Vec<_> = report.of_kind(ProblemKind::Leaked).collect();
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    assert_eq!(leaks[0].objects, vec!["ipamnode/node-a"]);
    assert_eq!(leaks[0].address, Some("10.30.5.5".parse().unwrap()));
    // the orphan: node-gone's block
    let orphans: Vec<_> = report.of_kind(ProblemKind::OrphanBlock).collect();
    assert_eq!(orphans.len(), 1, "{orphans:#?}");
    assert_eq!(orphans[0].objects, vec!["ipamblock/v4-10-30-0-32-28"]);
    assert!(orphans[0].detail.contains("no Node node-gone exists"));
    // pw's address: in node-a's block of pool default, its entry names blue
    let outside: Vec<_> = report.of_kind(ProblemKind::OutsidePool).collect();
    assert_eq!(outside.len(), 1, "{outside:#?}");
    assert_eq!(
        outside[0].objects,
        vec!["ipamnode/node-a", "ipamblock/v4-10-30-0-0-28"]
    );
    assert_eq!(
        (outside[0].address, outside[0].pool.as_deref()),
        (Some("10.30.0.3".parse().unwrap()), Some("blue"))
    );
    assert!(
        outside[0].detail.contains("default/pw") && outside[0].detail.contains("of pool default"),
        "{}",
        outside[0].detail
    );
    // the reclaim candidate: a pod that no longer exists (and only it: pa is Running with
    // its address, pl and px are Pending)
    assert_eq!(
        report.reclaim_candidates.len(),
        1,
        "{:#?}",
        report.reclaim_candidates
    );
    let c = &report.reclaim_candidates[0];
    assert_eq!(
        (c.node.as_str(), c.address.to_string(), c.reason),
        ("node-a", "10.30.0.2".to_string(), "pod-deleted")
    );
    assert_eq!(c.pod_uid, DELETED_POD_UID);
    // usage: three /28s of the /16 granted, six entries inside it
    let usage = &report.pools[0];
    assert_eq!((usage.pool.as_str(), usage.family), ("default", "ipv4"));
    let blocks = usage.blocks.as_ref().unwrap();
    assert_eq!(
        (blocks.allocated.as_str(), blocks.capacity.as_str()),
        ("3", "4096")
    );
    assert_eq!(usage.in_use, 6);
    assert_eq!(report.summary.pods, 5);
    assert!(report.needs_attention());
    assert_eq!(report.exit_code(), 1);

    // the binary, as the operator's service account
    let dir = std::env::temp_dir().join(format!("tidepool-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(OPERATOR, &kubeconfig).unwrap();
    let bin = operator_binary().await;
    server.reset_counters();

    let out = run(
        &bin,
        &["check", "--kubeconfig", kubeconfig.to_str().unwrap()],
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "Checking IPAM for inconsistencies...",
        "Found 1 IP pool (1 valid).",
        "Found 3 IPAM blocks, 2 IPAM nodes recording 6 addresses in use, 2 Nodes and 5 Pods.",
        "Found 1 reclaim candidate (informational: the operator reclaims these itself",
        "Found 1 leaked entry (an address used outside its node's blocks).",
        "Found 1 orphan block (its Node is gone or has another UID).",
        "Found 1 address outside its pod's pool (the pool its entry names).",
        "Found 0 addresses in no pool (their block's pool is missing or invalid).",
        "Found 0 malformed entries.",
        "need a person.",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    let pool_row = text
        .lines()
        .find(|l| l.starts_with("default "))
        .unwrap_or_else(|| panic!("no pool row:\n{text}"));
    assert!(
        pool_row.contains("10.30.0.0/16") && pool_row.contains("3/4096"),
        "{pool_row}"
    );
    let problem_row = |kind: &str| text.lines().any(|l| l.starts_with(kind));
    assert!(problem_row("duplicate ") && problem_row("leaked ") && problem_row("orphan-block "));
    assert!(problem_row("outside-pool "), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("node-a")
            && l.contains("10.30.0.2")
            && l.contains("pod-deleted"))
    );

    let out = run(
        &bin,
        &[
            "check",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).expect("--output json is JSON");
    assert_eq!(v["summary"]["needs_attention"], true);
    assert_eq!(v["summary"]["problems"]["leaked"], 1);
    assert_eq!(v["summary"]["problems"]["orphan-block"], 1);
    assert_eq!(v["summary"]["problems"]["outside-pool"], 1);
    assert_eq!(v["summary"]["problems"]["no-pool"], 0);
    assert_eq!(v["summary"]["reclaim_candidates"], 1);
    assert_eq!(v["reclaim_candidates"][0]["address"], "10.30.0.2");

    assert_eq!(writes(&server), vec![], "the binary wrote");
    assert_eq!(server.request_count("list", "pods"), 2);

    // an unreachable server is an error: exit status 2
    drop(server);
    let out = run(
        &bin,
        &[
            "check",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--timeout",
            "1s",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("error: "));
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs the binary with `args`, at most a minute.
async fn run(bin: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(bin);
    cmd.args(args).env_remove("KUBECONFIG");
    for (k, _) in std::env::vars() {
        if k.starts_with("TIDEPOOL_") {
            cmd.env_remove(k);
        }
    }
    let task = tokio::task::spawn_blocking(move || cmd.output().expect("run the binary"));
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("the binary finished in time")
        .expect("join")
}

/// The binary cargo built for this test.
async fn operator_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tidepool-operator"))
}
