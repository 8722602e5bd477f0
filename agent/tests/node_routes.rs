//! `--node-routes` against real kernels' routing tables: three node network namespaces on
//! one L2 segment (a bridge in a fourth, "segment" namespace; 192.168.77.0/24 exists only
//! inside them), Nodes with InternalIPs and IPAMBlocks in the in-process API server, and
//! the route manager of each node running in this process against its node's namespace,
//! reading the cluster as the agent's service account of that node; after a restart,
//! node-a's is the whole agent (`run::run` with `node_routes`).
//!
//! Needs root and iproute2 (with `-j`) and ping; skips with a reason otherwise. Every
//! namespace is removed on every exit path (the [`Namespaces`] guard), the managers stop
//! when dropped, and no address or route is ever configured outside the namespaces.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use common::chain::{Namespaces, output, run};
use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::json;
use tidepool_agent::routes::{self, NodeRoutes};
use tidepool_agent::run::Settings;
use tidepool_api as api;
use tidepool_metrics as m;

/// This process's namespaces: `tprt<pid>-<name>` (other tests' never collide).
fn ns(name: &str) -> String {
    format!("tprt{}-{name}", std::process::id())
}

fn root() -> bool {
    output("id", &["-u"]).stdout == b"0\n"
}

/// The segment: a bridge in its own namespace, one veth per node namespace to it, each
/// node's end `eth0` with 192.168.77.<i>/24, and `lo` up.
fn segment(namespaces: &Namespaces, nodes: &[&str]) {
    let seg = ns("seg");
    namespaces.add(&seg);
    run("ip", &["-n", &seg, "link", "add", "br0", "type", "bridge"]);
    run("ip", &["-n", &seg, "link", "set", "br0", "up"]);
    for (i, node) in nodes.iter().enumerate() {
        let n = ns(node);
        namespaces.add(&n);
        let port = format!("p{i}");
        run(
            "ip",
            &[
                "-n", &seg, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &n,
            ],
        );
        run(
            "ip",
            &["-n", &seg, "link", "set", &port, "master", "br0", "up"],
        );
        let addr = format!("192.168.77.{}/24", i + 1);
        run("ip", &["-n", &n, "addr", "add", &addr, "dev", "eth0"]);
        run("ip", &["-n", &n, "link", "set", "eth0", "up"]);
        run("ip", &["-n", &n, "link", "set", "lo", "up"]);
    }
}

/// The routes of `node`'s namespace marked with `proto` in `table`, as "dst via gateway".
fn routes_in(node: &str, proto: &str, table: &str) -> BTreeSet<String> {
    let out = run(
        "ip",
        &[
            "-n",
            &ns(node),
            "-j",
            "route",
            "show",
            "table",
            table,
            "proto",
            proto,
        ],
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("ip -j route: JSON");
    v.as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "{} via {}",
                r["dst"].as_str().unwrap_or("?"),
                r["gateway"].as_str().unwrap_or("-")
            )
        })
        .collect()
}

fn owned(node: &str) -> BTreeSet<String> {
    routes_in(node, "0x7d", "main")
}

fn set(routes: &[&str]) -> BTreeSet<String> {
    routes.iter().map(|r| r.to_string()).collect()
}

/// Waits until `node`'s owned routes are `want`.
async fn converges(node: &str, want: &[&str]) {
    let want = set(want);
    eventually(&format!("{node}'s routes to be {want:?}"), || {
        let done = owned(node) == want;
        async move { done.then_some(()) }
    })
    .await;
}

/// A Node with `internal` as its InternalIP; its UID (server-assigned).
async fn create_node(admin: &kube::Client, name: &str, internal: &[&str]) -> String {
    let addresses: Vec<_> = internal
        .iter()
        .map(|a| json!({ "type": "InternalIP", "address": a }))
        .chain([json!({ "type": "Hostname", "address": name })])
        .collect();
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name },
        "status": { "addresses": addresses },
    }))
    .unwrap();
    let made = Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    made.metadata.uid.expect("a uid")
}

/// `tidepool_agent_node_route_ops_total{op, outcome}` as recorded so far (all managers;
/// the debugging recorder's snapshot drains counters, so they are summed here).
struct Ops {
    snap: Snapshotter,
    seen: std::sync::Mutex<std::collections::BTreeMap<(String, String), u64>>,
}

impl Ops {
    fn get(&self, op: &str, outcome: &str) -> u64 {
        let mut seen = self.seen.lock().unwrap();
        for (ck, _, _, v) in self.snap.snapshot().into_vec() {
            let (_, key) = ck.into_parts();
            let DebugValue::Counter(n) = v else { continue };
            if key.name() != m::AGENT_NODE_ROUTE_OPS_TOTAL {
                continue;
            }
            let label = |k: &str| {
                key.labels()
                    .find(|l| l.key() == k)
                    .map(|l| l.value().to_owned())
                    .unwrap_or_default()
            };
            *seen
                .entry((label(m::route_op::KEY), label(m::route_outcome::KEY)))
                .or_default() += n;
        }
        seen.get(&(op.to_owned(), outcome.to_owned()))
            .copied()
            .unwrap_or(0)
    }
}

/// `--node-routes` in `node`'s namespace, checked every 300 ms.
fn config(node: &str) -> routes::Config {
    routes::Config {
        netns: Some(PathBuf::from(format!("/run/netns/{}", ns(node)))),
        interval: Duration::from_millis(300),
    }
}

/// The route manager of `node` in its namespace, as that node's agent.
async fn manager(server: &tidepool_tests::ApiServer, node: &str) -> NodeRoutes {
    let client = server.client(&agent_on(node)).await.unwrap();
    NodeRoutes::start(client, node, config(node))
        .await
        .expect("the route manager starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_nodes_blocks_are_routed_and_pods_ping_across_the_segment() {
    if !root() {
        eprintln!("skipped: this test needs root (network namespaces)");
        return;
    }
    // the only test of this binary: its recorder is the process's
    let recorder = DebuggingRecorder::new();
    let ops = Ops {
        snap: recorder.snapshotter(),
        seen: Default::default(),
    };
    recorder.install().expect("the test's recorder");
    let namespaces = Namespaces::default();
    segment(&namespaces, &["node-a", "node-b", "node-c"]);
    let (server, admin) = cluster().await;
    let a = create_node(&admin, "node-a", &["192.168.77.1"]).await;
    let b = create_node(&admin, "node-b", &["192.168.77.2"]).await;
    let c = create_node(&admin, "node-c", &["192.168.77.3"]).await;
    create_block(&admin, "10.77.1.0/28", "node-a", &a, false).await;
    create_block(&admin, "10.77.2.0/28", "node-b", &b, false).await;
    create_block(&admin, "10.77.2.16/28", "node-b", &b, true).await;
    create_block(&admin, "10.77.3.0/28", "node-c", &c, false).await;
    // node-b has no IPv6 InternalIP: its IPv6 block gets no route
    create_block(&admin, "fd77:2::/124", "node-b", &b, false).await;
    // an earlier node-c's block (another nodeUID), and a block of a Node that is gone
    create_block(&admin, "10.77.3.16/28", "node-c", UID_OLD, false).await;
    create_block(&admin, "10.77.9.0/28", "node-gone", UID_B, false).await;

    let n1 = ns("node-a");
    // before the agent: a foreign route to a look-alike prefix (another protocol), one of
    // ours in another table (not the main table: not ours), and a stale route of ours
    run(
        "ip",
        &[
            "-n",
            &n1,
            "route",
            "add",
            "10.77.8.0/28",
            "via",
            "192.168.77.3",
            "proto",
            "static",
        ],
    );
    run(
        "ip",
        &[
            "-n",
            &n1,
            "route",
            "add",
            "10.77.2.0/28",
            "via",
            "192.168.77.3",
            "table",
            "100",
            "proto",
            "0x7d",
        ],
    );
    run(
        "ip",
        &[
            "-n",
            &n1,
            "route",
            "add",
            "10.77.7.0/28",
            "via",
            "192.168.77.2",
            "proto",
            "0x7d",
        ],
    );
    let foreign = routes_in("node-a", "static", "main");
    let other_table = routes_in("node-a", "0x7d", "100");
    assert_eq!(other_table, set(&["10.77.2.0/28 via 192.168.77.3"]));
    // node-c: a foreign route to node-a's block itself, in the main table — node-c's
    // manager cannot add its own there (the kernel refuses, counted as an error), and must
    // leave it alone
    let n3 = ns("node-c");
    run(
        "ip",
        &[
            "-n",
            &n3,
            "route",
            "add",
            "10.77.1.0/28",
            "via",
            "192.168.77.2",
            "proto",
            "static",
        ],
    );

    let ma = manager(&server, "node-a").await;
    let mb = manager(&server, "node-b").await;
    let _mc = manager(&server, "node-c").await;
    // the stale owned route is gone, the other nodes' blocks routed, node-a's own not
    converges(
        "node-a",
        &[
            "10.77.2.0/28 via 192.168.77.2",
            "10.77.2.16/28 via 192.168.77.2",
            "10.77.3.0/28 via 192.168.77.3",
        ],
    )
    .await;
    converges(
        "node-b",
        &[
            "10.77.1.0/28 via 192.168.77.1",
            "10.77.3.0/28 via 192.168.77.3",
        ],
    )
    .await;
    assert!(
        routes_in("node-a", "0x7d", "main")
            .iter()
            .all(|r| !r.starts_with("fd77"))
    );
    converges(
        "node-c",
        &[
            "10.77.2.0/28 via 192.168.77.2",
            "10.77.2.16/28 via 192.168.77.2",
        ],
    )
    .await;
    eventually("node-c's refused add counted", || {
        let refused = ops.get(m::route_op::ADD, m::route_outcome::ERROR);
        async move { (refused >= 1).then_some(()) }
    })
    .await;
    assert_eq!(
        routes_in("node-c", "static", "main"),
        set(&["10.77.1.0/28 via 192.168.77.2"])
    );
    // a: 3, b: 2, c: 2 (and its refused one)
    assert!(ops.get(m::route_op::ADD, m::route_outcome::OK) >= 7);
    // a's stale route
    assert!(ops.get(m::route_op::DELETE, m::route_outcome::OK) >= 1);

    // a pod-like address of node-a's block reaches one of node-b's across the segment,
    // through the routes alone (no other route to 10.77.0.0/16 exists in either namespace)
    let nb = ns("node-b");
    run(
        "ip",
        &["-n", &n1, "addr", "add", "10.77.1.5/32", "dev", "lo"],
    );
    run(
        "ip",
        &["-n", &nb, "addr", "add", "10.77.2.5/32", "dev", "lo"],
    );
    let ping = output(
        "ip",
        &[
            "netns",
            "exec",
            &n1,
            "ping",
            "-c",
            "1",
            "-W",
            "2",
            "-I",
            "10.77.1.5",
            "10.77.2.5",
        ],
    );
    assert!(
        ping.status.success(),
        "10.77.1.5 (node-a) → 10.77.2.5 (node-b): {}",
        String::from_utf8_lossy(&ping.stdout)
    );

    // a block deleted → its route goes, everywhere
    Api::<api::IPAMBlock>::all(admin.clone())
        .delete("v4-10-77-3-0-28", &DeleteParams::default())
        .await
        .unwrap();
    converges(
        "node-a",
        &[
            "10.77.2.0/28 via 192.168.77.2",
            "10.77.2.16/28 via 192.168.77.2",
        ],
    )
    .await;
    converges("node-b", &["10.77.1.0/28 via 192.168.77.1"]).await;

    // node-b's InternalIP changes → its routes follow
    let moved = json!({ "status": { "addresses": [{ "type": "InternalIP", "address": "192.168.77.12" }] } });
    Api::<Node>::all(admin.clone())
        .patch_status("node-b", &PatchParams::default(), &Patch::Merge(&moved))
        .await
        .unwrap();
    converges(
        "node-a",
        &[
            "10.77.2.0/28 via 192.168.77.12",
            "10.77.2.16/28 via 192.168.77.12",
        ],
    )
    .await;

    // a route of ours someone removed comes back at the next periodic pass
    run(
        "ip",
        &["-n", &n1, "route", "del", "10.77.2.0/28", "proto", "0x7d"],
    );
    converges(
        "node-a",
        &[
            "10.77.2.0/28 via 192.168.77.12",
            "10.77.2.16/28 via 192.168.77.12",
        ],
    )
    .await;

    // a restart: stopped (its routes stay), a stale route of ours added meanwhile, started
    drop(ma);
    tokio::time::sleep(Duration::from_millis(100)).await;
    run(
        "ip",
        &[
            "-n",
            &n1,
            "route",
            "add",
            "10.77.6.0/28",
            "via",
            "192.168.77.3",
            "proto",
            "0x7d",
        ],
    );
    assert!(owned("node-a").contains("10.77.2.0/28 via 192.168.77.12"));
    // this time as the agent runs it (`run::run` with --node-routes), node-a's own agent
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        node_routes: Some(config("node-a")),
        ..running::agent_settings(dir.path())
    };
    let client = server.client(&agent_on("node-a")).await.unwrap();
    let agent = running::RunningAgent::start(client, &settings).await;
    converges(
        "node-a",
        &[
            "10.77.2.0/28 via 192.168.77.12",
            "10.77.2.16/28 via 192.168.77.12",
        ],
    )
    .await;

    // what is not ours was never touched
    assert_eq!(routes_in("node-a", "static", "main"), foreign);
    assert!(foreign.contains("10.77.8.0/28 via 192.168.77.3"));
    assert_eq!(routes_in("node-a", "0x7d", "100"), other_table);
    agent.stop().await;
    // the agent stopped: its routes stay
    assert!(owned("node-a").contains("10.77.2.0/28 via 192.168.77.12"));
    drop(mb);
}
