//! What the operator benches (`bringup`, `scale`) share: the cluster's names and pod
//! records, the node side's `used` entries, a process's memory and sockets from /proc, and
//! quantiles.

#![allow(dead_code)] // each bench uses its part
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tidepool_api as api;

/// The engine's default `pre_allocate`.
pub const PRE_ALLOCATE: usize = 8;

/// Addresses a node's blocks hold at the bring-up's end: its pods and the pre-allocation.
pub fn target(pods_per_node: usize) -> u128 {
    (pods_per_node + PRE_ALLOCATE) as u128
}

/// Kube writes a bring-up needs: per node one IPAMNode create, its status apply (a create
/// drops status) and the blocks that cover pods + pre-allocation.
pub fn writes_needed(nodes: usize, pods_per_node: usize, block_prefix: u8) -> u64 {
    let blocks = target(pods_per_node).div_ceil(1 << (32 - block_prefix)) as u64;
    nodes as u64 * (2 + blocks)
}

/// The kube budget's lower bound on `writes`: (writes − burst) / qps.
pub fn lower_bound(writes: u64, burst: u32, qps: f64) -> f64 {
    (writes as f64 - f64::from(burst)).max(0.0) / qps
}

/// The IPPool `default`: `cidr` in blocks of `/prefix`.
pub async fn create_pool(admin: &kube::Client, cidr: &str, prefix: u8) {
    let pool: api::IPPool = serde_json::from_value(json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": "default"},
        "spec": {"cidrs": [cidr], "blockSize": {"ipv4": prefix}},
    }))
    .expect("a pool");
    Api::<api::IPPool>::all(admin.clone())
        .create(&PostParams::default(), &pool)
        .await
        .expect("the pool");
}

/// A Node named `name`.
pub async fn create_node(nodes: &Api<Node>, name: &str) -> Result<Node, kube::Error> {
    let n: Node = serde_json::from_value(json!({"metadata": {"name": name}})).expect("a node");
    nodes.create(&PostParams::default(), &n).await
}

/// Nodes `node_name(0..n)`, `concurrency` requests at once.
pub async fn create_nodes(admin: &kube::Client, n: usize, concurrency: usize) {
    let nodes: Api<Node> = Api::all(admin.clone());
    futures::stream::iter(0..n)
        .map(|i| {
            let nodes = nodes.clone();
            async move { create_node(&nodes, &node_name(i)).await }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await
        .expect("nodes");
}

/// A Node's name in the benches.
pub fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

/// A pod of a bench: bound to its node, pending, no podIPs.
#[derive(Clone, Debug)]
pub struct PodRec {
    pub name: String,
    pub node: String,
    pub uid: String,
}

/// The node side's `status.used` entry for `p`. Its containerID has the shape of
/// containerd's and CRI-O's sandbox IDs (64 lowercase hex digits: the pod's UID twice), so
/// the operator's memory per entry is what a real cluster's costs.
pub fn used_entry(p: &PodRec) -> Value {
    let hex = p.uid.replace('-', "");
    json!({
        "podUID": p.uid, "namespace": "default", "pod": p.name,
        "containerID": format!("{hex}{hex}"), "ifname": "eth0",
        "since": "2026-11-24T10:00:00Z",
    })
}

/// A field of /proc/`pid`/status in KiB (VmHWM: peak RSS, VmRSS: now); `pid` may be `self`.
pub fn proc_kib(pid: &str, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0)
}

/// Open sockets of a process (/proc/`pid`/fd links to `socket:[…]`).
pub fn sockets(pid: &str) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with("socket:"))
        .count()
}

/// User and system CPU time of a process so far (/proc/`pid`/stat, in clock ticks of
/// 1/100 s, the kernel's `USER_HZ` on every Linux architecture tidepool builds for).
pub fn cpu_time(pid: &str) -> Duration {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // the fields after the command's closing parenthesis: state is field 3, utime 14, stime 15
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// The `p` quantile of sorted values (NaN when there are none).
pub fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

pub fn sorted(v: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    v
}
