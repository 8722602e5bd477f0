//! `tidepool-operator run`'s runtime against the in-process API server, with RBAC on and the
//! operator's own role (`deploy/operator/rbac.yaml`): Nodes get IPAMNodes and blocks, waiting
//! pods are served, and deleting a Node gives its blocks back. Real time, short intervals,
//! poll-until-deadline.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};
use tidepool_api as api;
use tidepool_ipam::{AddrSet, EngineConfig};
use tidepool_operator::runtime::{self, Settings};
use tidepool_tests::{ApiServer, Config};

fn settings() -> Settings {
    operator_settings()
}

/// [`settings`] with `node_reclaim_grace` set to `grace`.
fn with_node_grace(grace: Duration) -> Settings {
    Settings {
        engine: EngineConfig {
            node_reclaim_grace: grace,
            ..settings().engine
        },
        ..settings()
    }
}

/// Starts the operator's runtime as the operator's service account; dropping the sender
/// stops it.
async fn start_operator(
    server: &ApiServer,
    s: Settings,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    log_to_test_output();
    let client = server.client(OPERATOR).await.expect("operator client");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        runtime::run(client, s, async {
            let _ = stopped.await;
        })
        .await
        .expect("the operator runs and stops cleanly");
    });
    (stop, task)
}

/// An IPPool `name` over `cidrs` with the block sizes `block_size` (`{"ipv4": 28}`).
fn pool_json(name: &str, cidrs: &[&str], block_size: Value) -> Value {
    json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"cidrs": cidrs, "blockSize": block_size},
    })
}

/// Creates [`pool_json`]'s IPPool.
async fn create_pool(admin: &kube::Client, name: &str, cidrs: &[&str], block_size: Value) {
    create_object(admin, pool_json(name, cidrs, block_size)).await;
}

async fn add_node(admin: &kube::Client, name: &str) -> String {
    let n = create_object(
        admin,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
    )
    .await;
    n.metadata.uid.expect("a uid")
}

async fn add_pod(admin: &kube::Client, name: &str, node: &str) {
    create_object(
        admin,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
        }),
    )
    .await;
}

/// A user's change of the `default` pool's CIDRs: a merge patch of the spec, as `kubectl
/// patch` makes it (a read-modify-replace would race the operator's status writes: 409).
async fn set_pool_cidrs(admin: &kube::Client, cidrs: &[&str]) {
    let pools: Api<api::IPPool> = Api::all(admin.clone());
    let patch = kube::api::Patch::Merge(json!({"spec": {"cidrs": cidrs}}));
    pools
        .patch("default", &kube::api::PatchParams::default(), &patch)
        .await
        .expect("patch the pool's CIDRs");
}

/// The node's blocks as the server has them, with every address they hold.
async fn blocks_of(admin: &kube::Client, node: &str) -> (usize, AddrSet) {
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    let list = blocks
        .list(&ListParams::default())
        .await
        .expect("list blocks");
    let mine: Vec<&api::IPAMBlock> = list.items.iter().filter(|b| b.spec.node == node).collect();
    let mut addrs = AddrSet::new();
    for b in &mine {
        addrs.insert_net(&b.spec.cidr.0.parse().expect("a CIDR"));
    }
    (mine.len(), addrs)
}

/// Waits until `node` holds a block.
async fn until_blocks(admin: &kube::Client, node: &str) {
    let what = format!("{node}'s block");
    eventually(Duration::from_secs(20), &what, || async move {
        (blocks_of(admin, node).await.0 >= 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_get_ipamnodes_and_blocks_for_their_waiting_pods() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["10.20.0.0/16"], json!({"ipv4": 28})).await;
    let mut uids = BTreeMap::new();
    for n in ["node-a", "node-b"] {
        uids.insert(n, add_node(&admin, n).await);
    }
    // node-a has 20 pods waiting for an address: 20 + 8 pre-allocated = two /28s at least
    for i in 0..20 {
        add_pod(&admin, &format!("p{i}"), "node-a").await;
    }
    let (stop, task) = start_operator(&server, settings()).await;

    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    for (n, uid) in &uids {
        let obj = eventually(Duration::from_secs(20), "an IPAMNode per Node", || {
            let api = ipamnodes.clone();
            async move { api.get_opt(n).await.ok().flatten() }
        })
        .await;
        assert_eq!(
            &obj.spec.node_uid, uid,
            "the IPAMNode carries its Node's UID"
        );
        let fins = obj.metadata.finalizers.unwrap_or_default();
        assert!(
            fins.contains(&api::names::FINALIZER.to_string()),
            "{fins:?}"
        );
    }
    let (blocks_a, addrs_a) = eventually(Duration::from_secs(20), "node-a's blocks", || {
        let admin = admin.clone();
        async move {
            let (n, a) = blocks_of(&admin, "node-a").await;
            (a.total() >= 28).then_some((n, a))
        }
    })
    .await;
    assert!(blocks_a >= 2, "{blocks_a} blocks");
    let (_, addrs_b) = eventually(Duration::from_secs(20), "node-b's pre-allocation", || {
        let admin = admin.clone();
        async move {
            let (n, a) = blocks_of(&admin, "node-b").await;
            (n >= 1).then_some((n, a))
        }
    })
    .await;
    assert!(
        addrs_a.intersection(&addrs_b).is_empty(),
        "no address granted twice"
    );
    // every block is the operator's: finalizer, the node's UID, the pool
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    for b in blocks.list(&ListParams::default()).await.unwrap().items {
        assert_eq!(b.spec.node_uid, uids[b.spec.node.as_str()]);
        assert_eq!(b.spec.pool, "default");
        assert!(
            b.metadata
                .finalizers
                .unwrap_or_default()
                .contains(&api::names::FINALIZER.to_string())
        );
    }
    // each IPAMNode names the pool its blocks come from (`status.pools`, the POOL column)
    for n in uids.keys() {
        let pools = eventually(Duration::from_secs(20), "status.pools written", || {
            let api = ipamnodes.clone();
            async move {
                let obj = api.get_opt(n).await.ok().flatten()?;
                obj.status.filter(|s| !s.pools.is_empty()).map(|s| s.pools)
            }
        })
        .await;
        assert_eq!(pools, ["default"], "{n}");
    }
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_gives_its_blocks_back() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["fd00:10::/64"], json!({"ipv6": 120})).await;
    add_node(&admin, "node-a").await;
    let s = with_node_grace(Duration::from_millis(500));
    let (stop, task) = start_operator(&server, s).await;
    until_blocks(&admin, "node-a").await;
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    // no pod is bound to it: after the node grace its blocks and its IPAMNode go
    eventually(Duration::from_secs(20), "node-a's blocks gone", || {
        let admin = admin.clone();
        async move { (blocks_of(&admin, "node-a").await.0 == 0).then_some(()) }
    })
    .await;
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    gone(&ipamnodes, "node-a", Duration::from_secs(20)).await;
    let pods: Api<Pod> = Api::all(admin.clone());
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// `node`'s IPAMNode's `Deleting` condition (status True), as (reason, message); None
/// while it has none (or the object is gone).
async fn deleting(ipamnodes: &Api<api::IPAMNode>, node: &str) -> Option<(String, String)> {
    let o = ipamnodes.get_opt(node).await.ok()??;
    let c = o.status.map(|s| s.conditions).unwrap_or_default();
    let d = c
        .into_iter()
        .find(|c| c.type_ == api::names::condition::DELETING)?;
    assert_eq!(d.status, "True", "{d:?}");
    Some((d.reason, d.message))
}

/// Waits until `node`'s IPAMNode says it waits for `reason`; returns the message.
async fn deleting_for(ipamnodes: &Api<api::IPAMNode>, node: &str, reason: &str) -> String {
    let what = format!("{node}'s IPAMNode Deleting for {reason}");
    eventually(Duration::from_secs(20), &what, || async move {
        let (r, m) = deleting(ipamnodes, node).await?;
        (r == reason).then_some(m)
    })
    .await
}

/// An IPAMNode whose deletion waits says why in its `Deleting` condition: deleted while
/// its Node exists (`NodeExists`), then its Node deleted while a pod is still bound to it
/// (`PodsStillBound`), then the pod gone but the node grace not yet passed
/// (`WaitingForReclaimGrace`); after the grace its blocks and the object go. Until the
/// Node goes, its blocks stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipamnode_whose_deletion_waits_says_why() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["10.36.0.0/16"], json!({"ipv4": 28})).await;
    add_node(&admin, "node-a").await;
    add_pod(&admin, "p0", "node-a").await;
    let s = with_node_grace(Duration::from_secs(3));
    let (stop, task) = start_operator(&server, s).await;
    until_blocks(&admin, "node-a").await;
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    // the pass claims the block before it writes the IPAMNode: wait for both
    eventually(Duration::from_secs(20), "node-a's IPAMNode", || async {
        ipamnodes.get_opt("node-a").await.ok()?.map(|_| ())
    })
    .await;
    assert_eq!(deleting(&ipamnodes, "node-a").await, None);
    // a user deletes the IPAMNode: the finalizer holds it while its Node exists
    ipamnodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    let m = deleting_for(&ipamnodes, "node-a", "NodeExists").await;
    assert!(m.contains("node-a"), "{m}");
    assert!(blocks_of(&admin, "node-a").await.0 >= 1, "its block stays");
    // its Node goes while p0 is still bound to it
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    let m = deleting_for(&ipamnodes, "node-a", "PodsStillBound").await;
    assert!(m.contains("1 pod"), "{m}");
    // p0 goes: the node grace is what it waits for now
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    pods.delete("p0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let m = deleting_for(&ipamnodes, "node-a", "WaitingForReclaimGrace").await;
    assert!(m.contains("3s"), "{m}");
    // once the grace has passed, nothing holds it: its blocks and the object go
    eventually(Duration::from_secs(20), "node-a's blocks gone", || {
        let admin = admin.clone();
        async move { (blocks_of(&admin, "node-a").await.0 == 0).then_some(()) }
    })
    .await;
    gone(&ipamnodes, "node-a", Duration::from_secs(20)).await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A Node deleted while no operator runs: the next operator finds its IPAMNode without a
/// Node and gives everything back after the node grace (no pod is bound to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_while_no_operator_ran_gives_its_blocks_back() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["10.35.0.0/16"], json!({"ipv4": 28})).await;
    add_node(&admin, "node-a").await;
    add_node(&admin, "node-b").await;
    let s = || with_node_grace(Duration::from_millis(500));
    let (stop, task) = start_operator(&server, s()).await;
    eventually(Duration::from_secs(20), "both nodes' blocks", || {
        let admin = admin.clone();
        async move {
            let a = blocks_of(&admin, "node-a").await.0;
            let b = blocks_of(&admin, "node-b").await.0;
            (a >= 1 && b >= 1).then_some(())
        }
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    let (stop, task) = start_operator(&server, s()).await;
    eventually(Duration::from_secs(20), "node-a's blocks gone", || {
        let admin = admin.clone();
        async move { (blocks_of(&admin, "node-a").await.0 == 0).then_some(()) }
    })
    .await;
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    gone(&ipamnodes, "node-a", Duration::from_secs(20)).await;
    assert!(
        blocks_of(&admin, "node-b").await.0 >= 1,
        "node-b keeps its block"
    );
    assert!(ipamnodes.get_opt("node-b").await.unwrap().is_some());
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// The node side's write of `status.used` (server-side apply as the agent's field manager):
/// the whole map it owns, as the agent writes it (through [`apply_node_side`], which first
/// waits for the IPAMNode, as the agent does).
async fn write_used(admin: &kube::Client, node: &str, used: &BTreeMap<String, (String, String)>) {
    let entries: serde_json::Map<String, Value> = used
        .iter()
        .map(|(addr, (uid, pod))| {
            let e = json!({
                "podUID": uid, "namespace": "default", "pod": pod,
                "containerID": format!("cid-{pod}"), "ifname": "eth0",
                "since": "2026-11-24T10:00:00Z",
            });
            (addr.clone(), e)
        })
        .collect();
    apply_node_side(admin, node, json!({"used": entries})).await;
}

/// A server-side apply of `status` to `node`'s IPAMNode as the agent's field manager, once
/// the IPAMNode exists (the operator's pass claims a block before it creates the object; an
/// apply to the status subresource of no object is a 404, as on kube-apiserver).
async fn apply_node_side(admin: &kube::Client, node: &str, status: Value) {
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually(Duration::from_secs(20), "the IPAMNode", || {
        let ipamnodes = ipamnodes.clone();
        async move { ipamnodes.get_opt(node).await.ok()? }
    })
    .await;
    let body = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": {"name": node},
        "status": status,
    });
    let pp = kube::api::PatchParams::apply(api::names::AGENT_MANAGER);
    ipamnodes
        .patch_status(node, &pp, &kube::api::Patch::Apply(&body))
        .await
        .expect("the node side's status apply");
}

/// Pods record their addresses through a test node side; deleted pods' addresses are
/// reclaimed after the grace (tombstones naming the exact allocation, an event on the
/// IPAMNode), the node side's answer ends the handshake, and the node side's concurrent
/// writes never lose an entry to the operator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_pods_addresses_are_reclaimed_and_no_entry_is_lost() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["10.40.0.0/16"], json!({"ipv4": 27})).await;
    add_node(&admin, "node-a").await;
    let s = Settings {
        engine: EngineConfig {
            reclaim: tidepool_ipam::ReclaimConfig {
                grace: Duration::from_millis(300),
                min_age: Duration::from_millis(300),
            },
            ..settings().engine
        },
        ..settings()
    };
    let (stop, task) = start_operator(&server, s).await;
    let (_, pool) = eventually(Duration::from_secs(20), "node-a's block", || {
        let admin = admin.clone();
        async move {
            let (n, a) = blocks_of(&admin, "node-a").await;
            (n >= 1).then_some((n, a))
        }
    })
    .await;
    // ten pods, each recorded on one of the node's addresses
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mut used = BTreeMap::new();
    for (i, addr) in pool.iter().skip(1).take(10).enumerate() {
        let name = format!("p{i}");
        add_pod(&admin, &name, "node-a").await;
        let uid = pods.get(&name).await.unwrap().metadata.uid.unwrap();
        used.insert(addr.to_string(), (uid, name));
        write_used(&admin, "node-a", &used).await;
    }
    // four go; their addresses get tombstones naming their exact allocation
    let gone: Vec<String> = used.keys().take(4).cloned().collect();
    for a in &gone {
        let pod = used[a].1.clone();
        pods.delete(&pod, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let obj = eventually(Duration::from_secs(20), "four tombstones", || {
        let api = ipamnodes.clone();
        async move {
            let o = api.get("node-a").await.ok()?;
            (o.spec.reclaim.len() == 4).then_some(o)
        }
    })
    .await;
    for a in &gone {
        let t = &obj.spec.reclaim[a];
        assert_eq!(t.pod_uid, used[a].0);
        assert_eq!(t.container_id, format!("cid-{}", used[a].1));
        assert_eq!(
            (t.ifname.as_str(), t.reason),
            ("eth0", api::ReclaimReason::PodDeleted)
        );
    }
    // the node side's entries all survived the operator's writes
    let st = obj.status.clone().unwrap();
    assert_eq!(st.used.len(), 10, "{:?}", st.used.keys());
    // the node side answers: entries gone, reclaimed acks; the tombstones then go
    let mut left = used.clone();
    for a in &gone {
        left.remove(a);
    }
    write_used(&admin, "node-a", &left).await;
    let answers: serde_json::Map<String, Value> = gone
        .iter()
        .map(|a| {
            let v = json!({"podUID": used[a].0, "containerID": format!("cid-{}", used[a].1),
                "ifname": "eth0", "outcome": "reclaimed"});
            (a.clone(), v)
        })
        .collect();
    let body = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": {"name": "node-a"},
        "status": {"reclaimAck": answers},
    });
    let pp = kube::api::PatchParams::apply("tidepool-agent-acks");
    ipamnodes
        .patch_status("node-a", &pp, &kube::api::Patch::Apply(&body))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "the tombstones answered and gone",
        || {
            let api = ipamnodes.clone();
            async move {
                let o = api.get("node-a").await.ok()?;
                o.spec.reclaim.is_empty().then_some(())
            }
        },
    )
    .await;
    let o = ipamnodes.get("node-a").await.unwrap();
    assert_eq!(
        o.status.unwrap().used.len(),
        6,
        "the other six entries stay"
    );
    // the reclaim is on record as an event of the IPAMNode and of each gone pod (by UID)
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(admin.clone(), "default");
    let mut on: Vec<(String, String)> = vec![("IPAMNode".into(), "node-a".into())];
    on.extend(gone.iter().map(|a| ("Pod".to_string(), used[a].1.clone())));
    eventually(
        Duration::from_secs(20),
        "IPAddressGarbageCollected events on the IPAMNode and the pods",
        || {
            let (events, on, used) = (events.clone(), on.clone(), used.clone());
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                let seen: Vec<(String, String, Option<String>)> = list
                    .items
                    .iter()
                    .filter(|e| e.reason.as_deref() == Some(api::names::reason::GARBAGE_COLLECTED))
                    .filter_map(|e| e.regarding.clone())
                    .map(|r| {
                        (
                            r.kind.unwrap_or_default(),
                            r.name.unwrap_or_default(),
                            r.uid,
                        )
                    })
                    .collect();
                on.iter()
                    .all(|(kind, name)| {
                        seen.iter().any(|(k, n, uid)| {
                            let pod_uid = used.values().find(|(_, p)| p == name).map(|(u, _)| u);
                            k == kind && n == name && (kind != "Pod" || uid.as_ref() == pod_uid)
                        })
                    })
                    .then_some(())
            }
        },
    )
    .await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// Reclaim timings short enough for a test: 300 ms of grace and of minimum age.
fn fast_reclaim() -> Settings {
    Settings {
        engine: EngineConfig {
            reclaim: tidepool_ipam::ReclaimConfig {
                grace: Duration::from_millis(300),
                min_age: Duration::from_millis(300),
            },
            ..settings().engine
        },
        ..settings()
    }
}

/// A pool, node-a, the operator with [`fast_reclaim`], and node-a's block.
async fn reclaim_cluster(cidr: &str) -> (ApiServer, kube::Client, Stop, AddrSet) {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &[cidr], json!({"ipv4": 27})).await;
    add_node(&admin, "node-a").await;
    let stop = start_operator(&server, fast_reclaim()).await;
    let (_, pool) = eventually(Duration::from_secs(20), "node-a's block", || {
        let admin = admin.clone();
        async move {
            let (n, a) = blocks_of(&admin, "node-a").await;
            (n >= 1).then_some((n, a))
        }
    })
    .await;
    (server, admin, stop, pool)
}

type Stop = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
);

/// Issue 25: the operator's pod watch runs behind (held back by the server) while the node
/// side records a new pod. Its index never saw the pod, but the live lookup is a GET by the
/// entry's namespace and name: no tombstone is written, however long past min-age + grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_pod_watch_never_tombstones_a_live_pod() {
    let (server, admin, (stop, task), pool) = reclaim_cluster("10.41.0.0/16").await;
    server.lag_watch(OPERATOR, "pods", tidepool_tests::Hold::Paused);
    add_pod(&admin, "late", "node-a").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let uid = pods.get("late").await.unwrap().metadata.uid.unwrap();
    let gets = server.request_count("get", "pods");
    let addr = pool.iter().nth(1).unwrap().to_string();
    write_used(
        &admin,
        "node-a",
        &BTreeMap::from([(addr.clone(), (uid, "late".into()))]),
    )
    .await;
    // two rounds of observations past min-age + grace, each ending in a GET that finds the
    // pod running
    eventually(Duration::from_secs(20), "two live GETs of the pod", || {
        let n = server.request_count("get", "pods");
        async move { (n >= gets + 2).then_some(()) }
    })
    .await;
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let o = ipamnodes.get("node-a").await.unwrap();
    assert!(o.spec.reclaim.is_empty(), "{:?}", o.spec.reclaim);
    server.resume_watch(OPERATOR, "pods");
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// The node side's `status.reclaimAck` (its own field manager: `used` stays as written).
async fn apply_acks(admin: &kube::Client, acks: Value) {
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let body = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": {"name": "node-a"},
        "status": {"reclaimAck": acks},
    });
    let pp = kube::api::PatchParams::apply("tidepool-agent-acks");
    ipamnodes
        .patch_status("node-a", &pp, &kube::api::Patch::Apply(&body))
        .await
        .expect("the node side's answers");
}

/// Issue 25: the node side answers a tombstone `live` (its pod runs there): the operator
/// drops the tombstone, reports `IPAddressGarbageCollectionFailed` naming the pod, and
/// tombstones that allocation again only after another GET finds the pod gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_answered_live_is_dropped_and_reported() {
    let (server, admin, (stop, task), pool) = reclaim_cluster("10.42.0.0/16").await;
    add_pod(&admin, "ghost", "node-a").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let uid = pods.get("ghost").await.unwrap().metadata.uid.unwrap();
    let addr = pool.iter().nth(1).unwrap().to_string();
    write_used(
        &admin,
        "node-a",
        &BTreeMap::from([(addr.clone(), (uid.clone(), "ghost".into()))]),
    )
    .await;
    // force-deleted from the API while its sandbox still runs on the node
    pods.delete("ghost", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually(Duration::from_secs(20), "the tombstone", || {
        let api = ipamnodes.clone();
        let addr = addr.clone();
        async move {
            api.get("node-a")
                .await
                .ok()?
                .spec
                .reclaim
                .get(&addr)
                .cloned()
        }
    })
    .await;
    let gets = server.request_count("get", "pods");
    let answer = json!({addr.clone(): {"podUID": uid, "containerID": "cid-ghost",
        "ifname": "eth0", "outcome": "live"}});
    apply_acks(&admin, answer).await;
    eventually(Duration::from_secs(20), "the tombstone dropped", || {
        let api = ipamnodes.clone();
        let addr = addr.clone();
        async move {
            let o = api.get("node-a").await.ok()?;
            (!o.spec.reclaim.contains_key(&addr)).then_some(())
        }
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(admin.clone(), "default");
    eventually(
        Duration::from_secs(20),
        "IPAddressGarbageCollectionFailed",
        || {
            let events = events.clone();
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .iter()
                    .any(|e| {
                        e.reason.as_deref() == Some(api::names::reason::GARBAGE_COLLECTION_FAILED)
                            && e.type_.as_deref() == Some("Warning")
                            && e.note
                                .as_deref()
                                .is_some_and(|n| n.contains("default/ghost"))
                    })
                    .then_some(())
            }
        },
    )
    .await;
    // the node side drops its answer with the tombstone; the pod is still gone by GET: a
    // new tombstone comes, but only after a new GET
    apply_acks(&admin, json!({})).await;
    eventually(Duration::from_secs(20), "the tombstone again", || {
        let api = ipamnodes.clone();
        let addr = addr.clone();
        async move {
            api.get("node-a")
                .await
                .ok()?
                .spec
                .reclaim
                .get(&addr)
                .cloned()
        }
    })
    .await;
    assert!(
        server.request_count("get", "pods") > gets,
        "a new GET first"
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// Answers every release mark on the node's blocks `ready-for-release`, as a node side with
/// none of their addresses in use does.
async fn answer_marks(admin: &kube::Client, node: &str) {
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    let list = blocks.list(&ListParams::default()).await.unwrap();
    for b in list.items.iter().filter(|b| b.spec.node == node) {
        let answered = b.status.as_ref().and_then(|s| s.release_ack).is_some();
        if b.spec.release.is_some() && !answered {
            let body = json!({
                "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
                "metadata": {"name": b.metadata.name},
                "status": {"releaseAck": "ready-for-release"},
            });
            let pp = kube::api::PatchParams::apply(api::names::AGENT_MANAGER);
            let name = b.metadata.name.clone().unwrap();
            let _ = blocks
                .patch_status(&name, &pp, &kube::api::Patch::Apply(&body))
                .await;
        }
    }
}

/// A dual-stack pool gives each node a block of each family; a CIDR added at runtime serves
/// the nodes once one removed has drained (its blocks marked, answered, deleted, and never
/// granted again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_pools_and_cidrs_changed_at_runtime() {
    let (server, admin) = operator_cluster().await;
    let pool = |cidrs: &[&str]| pool_json("default", cidrs, json!({"ipv4": 28, "ipv6": 124}));
    create_object(&admin, pool(&["10.50.0.0/24", "fd00:50::/64"])).await;
    add_node(&admin, "node-a").await;
    let (stop, task) = start_operator(&server, settings()).await;
    let fam = |a: &AddrSet| {
        (
            a.len(tidepool_ipam::Family::V4),
            a.len(tidepool_ipam::Family::V6),
        )
    };
    eventually(Duration::from_secs(20), "a block of each family", || {
        let admin = admin.clone();
        async move {
            let (_, a) = blocks_of(&admin, "node-a").await;
            let (v4, v6) = fam(&a);
            (v4 > 0 && v6 > 0).then_some(())
        }
    })
    .await;
    // the IPv4 CIDR is replaced at runtime
    set_pool_cidrs(&admin, &["10.51.0.0/24", "fd00:50::/64"]).await;
    let old: ipnet::IpNet = "10.50.0.0/24".parse().unwrap();
    let new: ipnet::IpNet = "10.51.0.0/24".parse().unwrap();
    let addrs = eventually(
        Duration::from_secs(30),
        "the old CIDR drained, the new one serving",
        || {
            let admin = admin.clone();
            async move {
                answer_marks(&admin, "node-a").await;
                let (_, a) = blocks_of(&admin, "node-a").await;
                let has = |net: &ipnet::IpNet| a.iter().any(|x| net.contains(&x));
                (!has(&old) && has(&new)).then_some(a)
            }
        },
    )
    .await;
    assert!(fam(&addrs).1 > 0, "the IPv6 block stays");
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// The IP families follow the pools at runtime (docs/operations.md "Install" applies the bundle, then the
/// IPPool): an operator started with no IPPool serves the first one created, and a CIDR of a
/// new family added to it, without a restart and without waiting for a resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_created_after_the_start_is_served_and_a_new_family_too() {
    let (server, admin) = operator_cluster().await;
    add_node(&admin, "node-a").await;
    add_pod(&admin, "p0", "node-a").await;
    let mut s = settings();
    // no resync within the test: the pool watch alone must bring the new families
    s.engine.resync_interval = Duration::from_secs(600);
    let (stop, task) = start_operator(&server, s).await;
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually(Duration::from_secs(20), "node-a's IPAMNode", || {
        let api = ipamnodes.clone();
        async move { api.get_opt("node-a").await.ok().flatten() }
    })
    .await;
    let fam = |a: &AddrSet| {
        (
            a.len(tidepool_ipam::Family::V4),
            a.len(tidepool_ipam::Family::V6),
        )
    };
    assert_eq!(blocks_of(&admin, "node-a").await.0, 0, "no pool, no block");
    create_pool(
        &admin,
        "default",
        &["10.60.0.0/24"],
        json!({"ipv4": 28, "ipv6": 124}),
    )
    .await;
    eventually(Duration::from_secs(20), "an IPv4 block for node-a", || {
        let admin = admin.clone();
        async move { (fam(&blocks_of(&admin, "node-a").await.1).0 > 0).then_some(()) }
    })
    .await;
    set_pool_cidrs(&admin, &["10.60.0.0/24", "fd00:60::/64"]).await;
    let addrs = eventually(Duration::from_secs(20), "an IPv6 block for node-a", || {
        let admin = admin.clone();
        async move {
            let (_, a) = blocks_of(&admin, "node-a").await;
            (fam(&a).1 > 0).then_some(a)
        }
    })
    .await;
    assert!(fam(&addrs).0 > 0, "the IPv4 block stays: {addrs:?}");
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// The operator serving node-a from an IPPool of `cidr`, and node-a's first block with an
/// address a pod uses (in node-a's `status.used`): the block's name.
async fn a_block_in_use(server: &ApiServer, admin: &kube::Client, cidr: &str) -> (String, Stop) {
    create_pool(admin, "default", &[cidr], json!({"ipv4": 28})).await;
    add_node(admin, "node-a").await;
    let stop = start_operator(server, settings()).await;
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    let first = eventually(Duration::from_secs(20), "node-a's block", || {
        let blocks = blocks.clone();
        async move {
            let list = blocks.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|b| b.spec.node == "node-a")
        }
    })
    .await;
    add_pod(admin, "p0", "node-a").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let uid = pods.get("p0").await.unwrap().metadata.uid.unwrap();
    let net: ipnet::IpNet = first.spec.cidr.0.parse().unwrap();
    let addr = AddrSet::of_net(&net).iter().nth(1).unwrap().to_string();
    let used = BTreeMap::from([(addr, (uid, "p0".to_string()))]);
    write_used(admin, "node-a", &used).await;
    (first.metadata.name.unwrap(), stop)
}

/// `kubectl delete ipamblock` of a block in use: the block stays Terminating (the operator's
/// finalizer) and is marked for release; the node gets another block meanwhile; once the
/// node side lets go (the pod gone, ready-for-release), the block goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_block_in_use_stays_until_it_is_free() {
    let (server, admin) = operator_cluster().await;
    let (name, (stop, task)) = a_block_in_use(&server, &admin, "10.60.0.0/24").await;
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());

    blocks
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    // marked for release, still there, and the node topped up from another block
    eventually(
        Duration::from_secs(20),
        "the deleted block marked, a new one granted",
        || {
            let (blocks, admin, name) = (blocks.clone(), admin.clone(), name.clone());
            async move {
                let b = blocks.get_opt(&name).await.ok()??;
                let marked = b.spec.release.is_some() && b.metadata.deletion_timestamp.is_some();
                (marked && blocks_of(&admin, "node-a").await.0 >= 2).then_some(())
            }
        },
    )
    .await;
    // the node side answers do-not-release while the address is used: the block stays
    let body = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
        "metadata": {"name": name},
        "status": {"releaseAck": "do-not-release"},
    });
    let pp = kube::api::PatchParams::apply(api::names::AGENT_MANAGER);
    blocks
        .patch_status(&name, &pp, &kube::api::Patch::Apply(&body))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        blocks.get_opt(&name).await.unwrap().is_some(),
        "in use: it stays"
    );
    // the pod goes, the node side lets go of the block: it goes
    write_used(&admin, "node-a", &BTreeMap::new()).await;
    let body = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
        "metadata": {"name": name},
        "status": {"releaseAck": "ready-for-release"},
    });
    blocks
        .patch_status(&name, &pp, &kube::api::Patch::Apply(&body))
        .await
        .unwrap();
    gone(&blocks, &name, Duration::from_secs(20)).await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// Faults from the server while nodes come up: write errors (500s), throttling (429 with
/// Retry-After), latency, and watches closed early with a short watch window (so resumes
/// hit 410 Gone and relist). Every node still reaches its target, nothing is granted twice,
/// and once the faults stop `check` finds nothing that needs a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_from_the_server_lose_nothing() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["10.70.0.0/20"], json!({"ipv4": 28})).await;
    let nodes: Vec<String> = (0..6).map(|i| format!("node-{i}")).collect();
    for n in &nodes {
        add_node(&admin, n).await;
        for p in 0..10 {
            add_pod(&admin, &format!("{n}-p{p}"), n).await;
        }
    }
    let writes: std::collections::BTreeSet<String> = ["create", "patch", "apply", "delete"]
        .map(String::from)
        .into();
    server.set_faults(tidepool_tests::Faults {
        error_rate: 0.3,
        error_code: 500,
        error_verbs: writes.clone(),
        latency: Duration::from_millis(5),
        watch_max: Some(Duration::from_millis(700)),
        ..Default::default()
    });
    let s = Settings {
        engine: EngineConfig {
            backoff: tidepool_ipam::BackoffConfig {
                min: Duration::from_millis(50),
                max: Duration::from_millis(500),
                ..Default::default()
            },
            ..settings().engine
        },
        ..settings()
    };
    let (stop, task) = start_operator(&server, s).await;
    // Until a block create has met a 500 (more creates sent than blocks exist): a fixed
    // sleep let a slow start under load pass the whole phase without one (seen in CI).
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    eventually(
        Duration::from_secs(30),
        "a block create failed by a 500",
        || {
            let (blocks, server) = (blocks.clone(), &server);
            async move {
                let held = blocks.list(&ListParams::default()).await.ok()?.items.len() as u64;
                let sent = server.request_count("create", "ipamblocks.ipam.tidepool.dev");
                (sent > held).then_some(())
            }
        },
    )
    .await;
    // then throttling with Retry-After, and a forced close of every watch
    server.set_faults(tidepool_tests::Faults {
        error_rate: 0.3,
        error_code: 429,
        retry_after_secs: 1,
        error_verbs: writes,
        latency: Duration::from_millis(5),
        watch_max: Some(Duration::from_millis(700)),
        ..Default::default()
    });
    server.close_watches();
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.set_faults(Default::default());
    let all = eventually(Duration::from_secs(40), "every node at target", || {
        let (admin, nodes) = (admin.clone(), nodes.clone());
        async move {
            let mut all = Vec::new();
            for n in &nodes {
                let (_, a) = blocks_of(&admin, n).await;
                if a.total() < 18 {
                    return None;
                }
                all.push(a);
            }
            Some(all)
        }
    })
    .await;
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert!(a.intersection(b).is_empty(), "an address granted twice");
        }
    }
    // the faults were felt: more block creates were sent than blocks exist
    let held = blocks
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len() as u64;
    let sent = server.request_count("create", "ipamblocks.ipam.tidepool.dev");
    assert!(
        sent > held,
        "{sent} creates for {held} blocks: no fault was met"
    );
    let client = server.client(OPERATOR).await.unwrap();
    let report = tidepool_operator::check::io::run(&client)
        .await
        .expect("check");
    assert!(
        !report.needs_attention(),
        "{}",
        tidepool_operator::check::table(&report)
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// The CRDs deleted while pods hold addresses (their objects gone with them), then
/// reinstalled: the operator never grants a block over an address a live pod holds — the
/// same rule by which a cluster that already has addresses is adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crds_deleted_and_reinstalled_grant_nothing_twice() {
    // the objects go at once with their CRDs, finalizers or not (as if an admin stripped
    // them); the drain a terminating CRD gets is crd_deletion_drains_the_blocks'
    let (server, admin) = operator_cluster_with(Config {
        rbac: true,
        crd_cleanup_interval: None,
        ..fast_config()
    })
    .await;
    // two /28 blocks in all
    let pool = pool_json("default", &["10.80.0.0/27"], json!({"ipv4": 28}));
    create_object(&admin, pool.clone()).await;
    add_node(&admin, "node-a").await;
    let (stop, task) = start_operator(&server, settings()).await;
    let (_, held) = eventually(Duration::from_secs(20), "node-a's block", || {
        let admin = admin.clone();
        async move {
            let (n, a) = blocks_of(&admin, "node-a").await;
            (n == 1).then_some((n, a))
        }
    })
    .await;
    // two running pods hold addresses of node-a's block
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let ips: Vec<String> = held.iter().skip(1).take(2).map(|a| a.to_string()).collect();
    for (i, ip) in ips.iter().enumerate() {
        let name = format!("p{i}");
        add_pod(&admin, &name, "node-a").await;
        let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
        pods.patch_status(
            &name,
            &Default::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .expect("pod status");
    }
    stop.send(()).unwrap();
    task.await.unwrap();

    // the CRDs go, and every IPPool, IPAMNode and IPAMBlock with them; then come back
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in api::crds() {
        let name = crd.metadata.name.clone().unwrap();
        crds.delete(&name, &DeleteParams::default()).await.unwrap();
        gone(&crds, &name, Duration::from_secs(10)).await;
    }
    for crd in api::crds() {
        let name = crd.metadata.name.clone().unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
        let established = await_condition(crds.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(Duration::from_secs(10), established)
            .await
            .unwrap()
            .unwrap();
    }
    create_object(&admin, pool).await;
    add_node(&admin, "node-b").await;
    let (stop, task) = start_operator(&server, settings()).await;
    // both nodes want a block; one of the two holds the pods' addresses: only the other goes
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    eventually(Duration::from_secs(20), "one block granted", || {
        let blocks = blocks.clone();
        async move {
            let n = blocks.list(&ListParams::default()).await.ok()?.items.len();
            (n == 1).then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let list = blocks.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(
        list.len(),
        1,
        "the block with the pods' addresses is never granted"
    );
    let net: ipnet::IpNet = list[0].spec.cidr.0.parse().unwrap();
    for ip in &ips {
        assert!(
            !net.contains(&ip.parse::<std::net::IpAddr>().unwrap()),
            "{ip} granted over"
        );
    }
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// IPPool status shows capacity, allocated and free per family; a pool overlapping an older
/// one gets `Valid=False` with the reason and a warning event, while the other pool serves.
/// Waits for an `InvalidPool` event on each of `pools`.
async fn invalid_pool_events(admin: &kube::Client, pools: &[&str]) {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(admin.clone(), "default");
    eventually(Duration::from_secs(20), "an InvalidPool event each", || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            let of = |pool: &&str| {
                list.items.iter().any(|e| {
                    e.reason.as_deref() == Some("InvalidPool")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(*pool)
                })
            };
            pools.iter().all(of).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_status_and_an_overlapping_pool() {
    let (server, admin) = operator_cluster().await;
    let pool = |name: &str, cidr: &str| pool_json(name, &[cidr], json!({"ipv4": 28}));
    create_object(&admin, pool("default", "10.90.0.0/24")).await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // a later creationTimestamp
    create_object(&admin, pool("late", "10.90.0.0/25")).await;
    add_node(&admin, "node-a").await;
    let (stop, task) = start_operator(&server, settings()).await;
    let pools: Api<api::IPPool> = Api::all(admin.clone());
    let st = eventually(Duration::from_secs(20), "the default pool's usage", || {
        let pools = pools.clone();
        async move {
            let st = pools.get("default").await.ok()?.status?;
            let v4 = st.ipv4.clone()?;
            (v4.allocated != "0").then_some(st)
        }
    })
    .await;
    let v4 = st.ipv4.unwrap();
    // 16 blocks of 16, less the network and broadcast addresses; one block granted
    assert_eq!((v4.capacity.as_str(), v4.allocated.as_str()), ("254", "16"));
    assert_eq!(v4.free, "238");
    assert!(st.ipv6.is_none());
    assert_eq!(st.conditions[0].status, "True");
    let late = eventually(Duration::from_secs(20), "the late pool invalid", || {
        let pools = pools.clone();
        async move { pools.get("late").await.ok()?.status }
    })
    .await;
    let c = &late.conditions[0];
    assert_eq!((c.type_.as_str(), c.status.as_str()), ("Valid", "False"));
    assert!(c.message.contains("default"), "{}", c.message);
    invalid_pool_events(&admin, &["late"]).await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A pool whose status holds counts turns invalid (a CIDR added that overlaps an older
/// pool): its status write still succeeds, `Valid=False` with the reason, and the counts
/// it no longer serves go whole — a status apply that leaves `ipv4` out removes the object
/// the operator owned, never leaving `ipv4: {}` behind for the schema's required fields to
/// refuse (a log once showed "Required value" every 2 s after a pool turned invalid).
/// kube-apiserver: "If you remove a field from a manifest and apply that manifest,
/// Server-Side Apply checks if there are any other field managers that also own the field.
/// If the field is not owned by any other field managers, it is either deleted from the live
/// object or reset to its default value" (kubernetes.io, Server-Side Apply, Field
/// management); the operator writes IPPool status only by apply, so it owns `ipv4` alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_turning_invalid_keeps_a_coherent_status() {
    let (server, admin) = operator_cluster().await;
    let pool = |name: &str, cidr: &str| pool_json(name, &[cidr], json!({"ipv4": 28}));
    create_object(&admin, pool("default", "10.92.0.0/24")).await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // a later creationTimestamp
    create_object(&admin, pool("late", "10.93.0.0/24")).await;
    let (stop, task) = start_operator(&server, settings()).await;
    let pools: Api<api::IPPool> = Api::all(admin.clone());
    let valid = |name: &'static str, want: &'static str| {
        let pools = pools.clone();
        move || {
            let pools = pools.clone();
            async move {
                let st = pools.get(name).await.ok()?.status?;
                let c = st.conditions.iter().find(|c| c.type_ == "Valid")?;
                (c.status == want).then_some(st)
            }
        }
    };
    let st = eventually(Duration::from_secs(20), "late valid", valid("late", "True")).await;
    assert!(st.ipv4.is_some(), "counts while valid: {st:?}");
    let patch = json!({"spec": {"cidrs": ["10.93.0.0/24", "10.92.0.0/25"]}});
    pools
        .patch("late", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("a CIDR added");
    let st = eventually(
        Duration::from_secs(20),
        "late invalid",
        valid("late", "False"),
    )
    .await;
    let c = st.conditions.iter().find(|c| c.type_ == "Valid").unwrap();
    assert!(c.message.contains("default"), "{}", c.message);
    assert_eq!(st.ipv4, None, "no counts for a pool not served: {st:?}");
    // the raw object too: no empty `ipv4` left behind
    let raw: Api<kube::api::DynamicObject> = Api::all_with(
        admin.clone(),
        &kube::api::ApiResource::erase::<api::IPPool>(&()),
    );
    let obj = raw.get("late").await.expect("late");
    assert_eq!(
        obj.data["status"].get("ipv4"),
        None,
        "{:?}",
        obj.data["status"]
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// The IPPool CRD as it was before its CEL rules (only `blockSize`'s immutability kept).
fn without_cel_rules(crd: &CustomResourceDefinition) -> CustomResourceDefinition {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Array(rules)) = m.get_mut("x-kubernetes-validations") {
                    rules.retain(|r| r["rule"] == "self == oldSelf");
                    if rules.is_empty() {
                        m.remove("x-kubernetes-validations");
                    }
                }
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(crd).unwrap();
    strip(&mut v);
    serde_json::from_value(v).unwrap()
}

/// Replaces the IPPool CRD's spec with `from`'s.
async fn replace_ippool_crd(admin: &kube::Client, from: &CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let name = "ippools.ipam.tidepool.dev";
    let mut crd = crds.get(name).await.expect("the IPPool CRD");
    crd.spec = from.spec.clone();
    crds.replace(name, &PostParams::default(), &crd)
        .await
        .expect("replace the IPPool CRD");
}

/// IPPools the server accepts today but the operator cannot use: host bits, a block size
/// shorter than the CIDR. The CRD's CEL rules refuse them now, so they are created the way a
/// real cluster still holds them: while the CRD had no rules (created before an upgrade; the
/// new CRD applied over them leaves stored objects as they are). Each gets `Valid=False`
/// with the reason and an `InvalidPool` event; the node the invalid pool serves is `Blocked`
/// with reason `PoolInvalid` (not `Exhausted`) until the pool is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_pool_is_invalid_and_blocks_its_nodes_as_such() {
    let (server, admin) = operator_cluster().await;
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let with_rules = crds.get("ippools.ipam.tidepool.dev").await.unwrap();
    replace_ippool_crd(&admin, &without_cel_rules(&with_rules)).await;
    create_pool(&admin, "default", &["10.2.0.1/16"], json!({"ipv4": 28})).await;
    create_pool(&admin, "short", &["10.3.0.0/24"], json!({"ipv4": 16})).await;
    replace_ippool_crd(&admin, &with_rules).await;
    add_node(&admin, "node-a").await;
    add_pod(&admin, "p0", "node-a").await;
    let (stop, task) = start_operator(&server, settings()).await;
    let pools: Api<api::IPPool> = Api::all(admin.clone());
    for (pool, says) in [("default", "host bits set"), ("short", "shorter than")] {
        let st = eventually(Duration::from_secs(20), "the pool's status", || {
            let pools = pools.clone();
            async move { pools.get(pool).await.ok()?.status }
        })
        .await;
        let c = &st.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Valid", "False", "Invalid"),
            "{pool}"
        );
        assert!(c.message.contains(says), "{pool}: {}", c.message);
    }
    invalid_pool_events(&admin, &["default", "short"]).await;
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let blocked = |want: Option<&'static str>| {
        let api = ipamnodes.clone();
        move || {
            let api = api.clone();
            async move {
                let st = api.get("node-a").await.ok()?.status?;
                let b = st.conditions.iter().find(|c| c.type_ == "Blocked");
                (b.map(|b| b.reason.as_str()) == want).then_some(())
            }
        }
    };
    let why = "node-a blocked for its invalid pool";
    eventually(Duration::from_secs(20), why, blocked(Some("PoolInvalid"))).await;
    assert_eq!(blocks_of(&admin, "node-a").await.0, 0);
    // the pool fixed: node-a is served
    set_pool_cidrs(&admin, &["10.2.0.0/16"]).await;
    eventually(Duration::from_secs(20), "node-a unblocked", blocked(None)).await;
    eventually(Duration::from_secs(20), "node-a's block", || {
        let admin = admin.clone();
        async move { (blocks_of(&admin, "node-a").await.0 > 0).then_some(()) }
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A Node deleted with no pod bound to it and re-created under its name after the node grace:
/// the old incarnation's whole-node reclaim runs (its blocks given back, its IPAMNode gone),
/// then the new Node gets a fresh IPAMNode with its UID and blocks of its own. (Re-created
/// while pods stay bound, the node is adopted instead: `agent/tests/with_operator.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_re_created_after_its_reclaim_starts_afresh() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["10.100.0.0/24"], json!({"ipv4": 28})).await;
    let old_uid = add_node(&admin, "node-a").await;
    let s = with_node_grace(Duration::from_millis(800));
    let (stop, task) = start_operator(&server, s).await;
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually(Duration::from_secs(20), "the old Node's block", || {
        let (blocks, old) = (blocks.clone(), old_uid.clone());
        async move {
            let l = blocks.list(&ListParams::default()).await.ok()?.items;
            l.into_iter().find(|b| b.spec.node_uid == old)
        }
    })
    .await;
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "the whole-node reclaim", || {
        let (blocks, ipamnodes) = (blocks.clone(), ipamnodes.clone());
        async move {
            let l = blocks.list(&ListParams::default()).await.ok()?.items;
            let gone = ipamnodes.get_opt("node-a").await.ok()?.is_none();
            (gone && l.is_empty()).then_some(())
        }
    })
    .await;
    let new_uid = add_node(&admin, "node-a").await;
    assert_ne!(old_uid, new_uid);
    let fresh = eventually(
        Duration::from_secs(20),
        "a fresh IPAMNode and block",
        || {
            let (blocks, ipamnodes, new) = (blocks.clone(), ipamnodes.clone(), new_uid.clone());
            async move {
                let l = blocks.list(&ListParams::default()).await.ok()?.items;
                let new_block = !l.is_empty() && l.iter().all(|b| b.spec.node_uid == new);
                let obj = ipamnodes.get_opt("node-a").await.ok()??;
                new_block.then_some(obj)
            }
        },
    )
    .await;
    assert_eq!(fresh.spec.node_uid, new_uid);
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// Every IPPool in deploy/examples, applied as docs/operations.md's install applies them (after the
/// operator started), ends `Valid=True` and is granted from: a node labelled `pool=gpu` gets
/// IPv4 blocks of `gpu`, the others of `default`, and every node IPv6 blocks of the
/// dual-stack `default` (issue 28: the shipped default pool was once refused, silently).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_pool_is_valid_and_granted_from() {
    let (server, admin) = operator_cluster().await;
    add_node(&admin, "worker-1").await;
    let gpu_node = create_object(
        &admin,
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "worker-2", "labels": {"pool": "gpu"}}}),
    )
    .await;
    assert!(gpu_node.metadata.uid.is_some());
    add_pod(&admin, "p1", "worker-1").await;
    add_pod(&admin, "p2", "worker-2").await;
    // the examples are applied one by one: a pass between `default` and `gpu` may grant
    // worker-2 a block of `default`, which then drains (a short delay, and its mark answered
    // below as a node side with nothing in use answers)
    let mut s = settings();
    s.engine.release.delay = Duration::from_millis(200);
    let (stop, task) = start_operator(&server, s).await;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).expect("deploy/examples") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("an example");
            let obj: Value = serde_saphyr::from_str(&text).expect("YAML");
            assert_eq!(obj["kind"], "IPPool", "{}", path.display());
            names.push(
                obj["metadata"]["name"]
                    .as_str()
                    .expect("a name")
                    .to_string(),
            );
            create_object(&admin, obj).await;
        }
    }
    names.sort();
    assert_eq!(names, ["default", "gpu"]);
    let pools: Api<api::IPPool> = Api::all(admin.clone());
    for name in &names {
        eventually(Duration::from_secs(20), "the pool Valid=True", || {
            let (pools, name) = (pools.clone(), name.clone());
            async move {
                let p = pools.get(&name).await.ok()?;
                let conds = p.status?.conditions;
                let valid = conds.iter().find(|c| c.type_ == "Valid")?;
                (valid.status == "True").then_some(())
            }
        })
        .await;
    }
    let examples = |name: &str| -> Vec<ipnet::IpNet> {
        let text = std::fs::read_to_string(format!("{dir}/ippool-{name}.yaml")).expect("example");
        let obj: Value = serde_saphyr::from_str(&text).expect("YAML");
        let cidrs = obj["spec"]["cidrs"].as_array().expect("cidrs");
        cidrs
            .iter()
            .map(|c| c.as_str().unwrap().parse().unwrap())
            .collect()
    };
    // per node, the pool of each family: gpu serves IPv4 only, so worker-2's IPv6 comes
    // from the default pool
    let want = [
        ("worker-1", "default", "default"),
        ("worker-2", "gpu", "default"),
    ];
    for (node, v4, v6) in want {
        let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
        let what = format!("{node}'s blocks of both families, of {v4} and {v6}");
        let held = eventually(Duration::from_secs(20), &what, || {
            let blocks = blocks.clone();
            let admin = admin.clone();
            async move {
                answer_marks(&admin, node).await;
                let l = blocks.list(&ListParams::default()).await.ok()?.items;
                let mine: Vec<api::IPAMBlock> =
                    l.into_iter().filter(|b| b.spec.node == node).collect();
                let fams: std::collections::BTreeSet<bool> =
                    mine.iter().map(|b| b.spec.cidr.0.contains(':')).collect();
                let pool_of =
                    |b: &api::IPAMBlock| if b.spec.cidr.0.contains(':') { v6 } else { v4 };
                let settled = mine.iter().all(|b| b.spec.pool == pool_of(b));
                (fams.len() == 2 && settled).then_some(mine)
            }
        })
        .await;
        for b in &held {
            let net: ipnet::IpNet = b.spec.cidr.0.parse().unwrap();
            let pool = if b.spec.cidr.0.contains(':') { v6 } else { v4 };
            let cidrs = examples(pool);
            assert_eq!(b.spec.pool, pool, "{node}: {net}");
            assert!(
                cidrs.iter().any(|c| c.contains(&net)),
                "{node}: {net} outside {cidrs:?}"
            );
        }
    }
    // the counts for people (`kubectl get ippools`): the /64's capacity is 2^64, its free
    // count three significant digits; IPv4's capacity (a /14 less a /24) exact
    let status = eventually(Duration::from_secs(20), "the grants counted", || {
        let pools = pools.clone();
        async move {
            let status = pools.get("default").await.ok()?.status?;
            let free: u128 = status.ipv6.as_ref()?.free.parse().ok()?;
            (free < 1 << 64).then_some(status)
        }
    })
    .await;
    let v6 = status.ipv6.expect("IPv6 counts");
    let readable = v6.readable.expect("readable IPv6 counts");
    assert_eq!(readable.capacity, "2^64");
    assert_eq!(readable.free, "1.84e19", "{}", v6.free);
    let v4 = status.ipv4.expect("IPv4 counts");
    let readable = v4.readable.expect("readable IPv4 counts");
    assert!(v4.capacity.parse::<u32>().expect("a count") < 1_000_000);
    assert_eq!(readable.capacity, v4.capacity, "below a million, exact");
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A node's `spec.pools` (a user's choice in its IPAMNode) wins over the `default` pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_spec_pools_choose_its_pool() {
    let (server, admin) = operator_cluster().await;
    let pool = |name: &str, cidr: &str| pool_json(name, &[cidr], json!({"ipv4": 28}));
    create_object(&admin, pool("default", "10.110.0.0/24")).await;
    create_object(&admin, pool("gpu", "10.111.0.0/24")).await;
    add_node(&admin, "node-a").await;
    let uid = add_node(&admin, "node-b").await;
    // node-b's IPAMNode exists before the operator starts, naming its pool
    create_object(
        &admin,
        json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": {"name": "node-b"},
            "spec": {"nodeUID": uid, "pools": {"ipv4": "gpu"}},
        }),
    )
    .await;
    let (stop, task) = start_operator(&server, settings()).await;
    let gpu: ipnet::IpNet = "10.111.0.0/24".parse().unwrap();
    for (node, in_gpu) in [("node-a", false), ("node-b", true)] {
        let a = eventually(Duration::from_secs(20), "a block", || {
            let admin = admin.clone();
            async move {
                let (n, a) = blocks_of(&admin, node).await;
                (n >= 1).then_some(a)
            }
        })
        .await;
        assert!(
            a.iter().all(|x| gpu.contains(&x) == in_gpu),
            "{node}: {a:?}"
        );
    }
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A node whose pool is exhausted while its pods wait gets `Blocked` (reason `Exhausted`),
/// a `PoolExhausted` event and (`--taint-exhausted-nodes`) the exhaustion taint beside the
/// taint it had; a CIDR added to the pool unblocks it, and the condition and our taint go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_node_is_blocked_until_the_pool_grows() {
    let (server, admin) = operator_cluster().await;
    grant_taint_exhausted_nodes(&admin).await;
    let pool = |cidrs: &[&str]| pool_json("default", cidrs, json!({"ipv4": 28}));
    // one block in all
    create_object(&admin, pool(&["10.120.0.0/28"])).await;
    add_node(&admin, "node-a").await;
    let s = Settings {
        taint_exhausted_nodes: true,
        ..settings()
    };
    let (stop, task) = start_operator(&server, s).await;
    eventually(Duration::from_secs(20), "node-a's block", || {
        let admin = admin.clone();
        async move { (blocks_of(&admin, "node-a").await.0 == 1).then_some(()) }
    })
    .await;
    let other = json!({"key": "example.com/gpu", "value": "true", "effect": "NoSchedule"});
    create_object(
        &admin,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"},
               "spec": {"taints": [other]}}),
    )
    .await;
    add_pod(&admin, "p0", "node-b").await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let taints = |name: &'static str| {
        let nodes = nodes.clone();
        async move {
            let n = nodes.get(name).await.expect("the node");
            let t = n.spec.and_then(|s| s.taints).unwrap_or_default();
            t.into_iter().map(|t| (t.key, t.effect)).collect::<Vec<_>>()
        }
    };
    let gpu = ("example.com/gpu".to_string(), "NoSchedule".to_string());
    let exhausted = (
        "ipam.tidepool.dev/exhausted".to_string(),
        "NoSchedule".to_string(),
    );
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let blocked = |want: bool| {
        let api = ipamnodes.clone();
        move || {
            let api = api.clone();
            async move {
                let o = api.get("node-b").await.ok()?;
                let c = o.status.map(|s| s.conditions).unwrap_or_default();
                let b = c.into_iter().find(|c| c.type_ == "Blocked");
                match (want, b) {
                    (true, Some(b)) if b.status == "True" => Some(Some(b)),
                    (false, None) => Some(None),
                    _ => None,
                }
            }
        }
    };
    let b = eventually(Duration::from_secs(20), "node-b blocked", blocked(true)).await;
    assert_eq!(b.unwrap().reason, "Exhausted");
    let want = vec![gpu.clone(), exhausted.clone()];
    eventually(Duration::from_secs(20), "node-b tainted", || {
        let (t, want) = (taints("node-b"), want.clone());
        async move { (t.await == want).then_some(()) }
    })
    .await;
    assert_eq!(taints("node-a").await, vec![], "node-a has its block");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(admin.clone(), "default");
    eventually(Duration::from_secs(20), "a PoolExhausted event", || {
        let events = events.clone();
        async move {
            let l = events.list(&ListParams::default()).await.ok()?;
            l.items
                .iter()
                .any(|e| e.reason.as_deref() == Some("PoolExhausted"))
                .then_some(())
        }
    })
    .await;
    // the pool grows: node-b gets a block and is no longer blocked
    set_pool_cidrs(&admin, &["10.120.0.0/28", "10.121.0.0/28"]).await;
    eventually(Duration::from_secs(20), "node-b unblocked", blocked(false)).await;
    assert_eq!(blocks_of(&admin, "node-b").await.0, 1);
    eventually(Duration::from_secs(20), "node-b's taint gone", || {
        let (t, want) = (taints("node-b"), vec![gpu.clone()]);
        async move { (t.await == want).then_some(()) }
    })
    .await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// The node side's `AgentReady` condition on `node`'s IPAMNode, applied as the agent does.
async fn set_agent_ready(admin: &kube::Client, node: &str, ready: bool, reason: &str) {
    let condition = json!({
        "type": "AgentReady", "status": if ready { "True" } else { "False" },
        "reason": reason, "message": format!("{reason} for the test"),
        "lastTransitionTime": "2026-11-25T10:00:00Z",
    });
    apply_node_side(admin, node, json!({"conditions": [condition]})).await;
}

/// A pool over `cidr`, `nodes`, and the operator with an `--agent-ready-grace` of 1 s, once
/// it made their IPAMNodes.
async fn agent_ready_cluster(
    cidr: &str,
    nodes: [&str; 3],
) -> (
    ApiServer,
    kube::Client,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &[cidr], json!({"ipv4": 28})).await;
    for n in nodes {
        add_node(&admin, n).await;
    }
    let s = Settings {
        agent_ready_grace: Duration::from_secs(1),
        ..settings()
    };
    let (stop, task) = start_operator(&server, s).await;
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually(Duration::from_secs(20), "the IPAMNodes", || {
        let api = ipamnodes.clone();
        async move {
            let l = api.list(&ListParams::default()).await.ok()?;
            (l.items.len() == 3).then_some(())
        }
    })
    .await;
    (server, admin, stop, task)
}

/// Issue 16's bad input: pods wait on node-a, whose agent never wrote `AgentReady`, and on
/// node-c, whose agent says `False`: each IPAMNode gets a Warning `AgentNotReady` event
/// naming the node, its waiting pods and (node-c) the agent's reason; node-b, whose agent
/// is ready, gets none although its pod waits as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_waiting_on_a_node_without_a_ready_agent_raise_an_agent_not_ready_event() {
    let (_server, admin, stop, task) =
        agent_ready_cluster("10.122.0.0/24", ["node-a", "node-b", "node-c"]).await;
    set_agent_ready(&admin, "node-b", true, "Serving").await;
    set_agent_ready(&admin, "node-c", false, "NodeWait").await;
    // node-b's pod first: had node-b been taken for stuck, its event would come first
    add_pod(&admin, "p-b", "node-b").await;
    add_pod(&admin, "p-a1", "node-a").await;
    add_pod(&admin, "p-a2", "node-a").await;
    add_pod(&admin, "p-c", "node-c").await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(admin.clone(), "default");
    let on = |list: &[k8s_openapi::api::events::v1::Event], node: &str| {
        list.iter()
            .filter(|e| e.reason.as_deref() == Some("AgentNotReady"))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
            .cloned()
            .collect::<Vec<_>>()
    };
    let list = eventually(
        Duration::from_secs(30),
        "AgentNotReady on node-a and node-c",
        || {
            let events = events.clone();
            async move {
                let l = events.list(&ListParams::default()).await.ok()?.items;
                (!on(&l, "node-a").is_empty() && !on(&l, "node-c").is_empty()).then_some(l)
            }
        },
    )
    .await;
    let a = on(&list, "node-a").remove(0);
    assert_eq!(a.type_.as_deref(), Some("Warning"));
    let r = a.regarding.as_ref().expect("regarding");
    assert_eq!(r.kind.as_deref(), Some("IPAMNode"));
    let note = a.note.clone().unwrap_or_default();
    for words in [
        "2 pod(s) on node node-a",
        "no AgentReady condition",
        "tidepool-agent DaemonSet pod on node node-a",
    ] {
        assert!(note.contains(words), "{words:?} not in {note:?}");
    }
    let c = on(&list, "node-c").remove(0).note.unwrap_or_default();
    assert!(
        c.contains("1 pod(s) on node node-c")
            && c.contains("AgentReady=False, reason NodeWait: NodeWait for the test"),
        "{c}"
    );
    let l = events.list(&ListParams::default()).await.expect("events");
    assert_eq!(on(&l.items, "node-b"), vec![], "node-b's agent is ready");
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A tidepool-agent pod on `node` (the deploy bundle's label, host network) whose Ready
/// condition is `ready`, as its kubelet reports it from the `/readyz` probe.
async fn add_agent_pod(admin: &kube::Client, node: &str, ready: bool) {
    let name = format!("tidepool-agent-{node}");
    create_object(
        admin,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default",
                "labels": {"app.kubernetes.io/name": "tidepool-agent"}},
            "spec": {"nodeName": node, "hostNetwork": true,
                "containers": [{"name": "agent", "image": "tidepool-agent"}]},
        }),
    )
    .await;
    let status = if ready { "True" } else { "False" };
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let patch = json!({"status": {"phase": "Running", "podIP": "192.168.0.9",
        "podIPs": [{"ip": "192.168.0.9"}],
        "conditions": [{"type": "Ready", "status": status}]}});
    pods.patch_status(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(patch),
    )
    .await
    .expect("the agent pod's status");
}

/// Issue 27, defect 7: a crashed agent cannot withdraw its `AgentReady=True`, so the
/// operator also reads its pod's Ready condition (the pod watch it runs anyway): pods
/// waiting on node-a, whose agent pod is not Ready, raise `AgentNotReady` after the grace
/// although the condition says True; node-b, whose agent pod is Ready, gets none. And a
/// hostNetwork pod without an address (node-d) is no pod waiting ("What counts as
/// waiting"): no event for a node with no agent at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_pod_that_is_not_ready_raises_agent_not_ready_despite_its_condition() {
    let (_server, admin, stop, task) =
        agent_ready_cluster("10.123.0.0/24", ["node-a", "node-b", "node-d"]).await;
    set_agent_ready(&admin, "node-a", true, "Serving").await;
    set_agent_ready(&admin, "node-b", true, "Serving").await;
    add_agent_pod(&admin, "node-b", true).await;
    // node-b's and node-d's pods first: were either taken for stuck, its event came first
    add_pod(&admin, "p-b", "node-b").await;
    create_object(
        &admin,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "exporter-d", "namespace": "default"},
            "spec": {"nodeName": "node-d", "hostNetwork": true,
                "containers": [{"name": "c", "image": "exporter"}]}}),
    )
    .await;
    add_agent_pod(&admin, "node-a", false).await;
    add_pod(&admin, "p-a", "node-a").await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(admin.clone(), "default");
    let on = |list: &[k8s_openapi::api::events::v1::Event], node: &str| {
        list.iter()
            .filter(|e| e.reason.as_deref() == Some("AgentNotReady"))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
            .filter_map(|e| e.note.clone())
            .collect::<Vec<_>>()
    };
    let notes = eventually(Duration::from_secs(30), "AgentNotReady on node-a", || {
        let events = events.clone();
        async move {
            let l = events.list(&ListParams::default()).await.ok()?.items;
            let notes = on(&l, "node-a");
            (!notes.is_empty()).then_some(notes)
        }
    })
    .await;
    assert!(
        notes[0].contains("1 pod(s) on node node-a")
            && notes[0].contains("its agent pod is not Ready")
            && notes[0].contains("-l app.kubernetes.io/name=tidepool-agent"),
        "{}",
        notes[0]
    );
    let l = events.list(&ListParams::default()).await.expect("events");
    assert_eq!(
        on(&l.items, "node-b"),
        Vec::<String>::new(),
        "its agent pod is Ready"
    );
    assert_eq!(
        on(&l.items, "node-d"),
        Vec::<String>::new(),
        "no pod waits on node-d"
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}

const IPAMNODES: &str = "ipamnodes.ipam.tidepool.dev";
const IPAMBLOCKS: &str = "ipamblocks.ipam.tidepool.dev";

/// Holds the operator's requests of `verbs` on `resource` for `latency`: its writes are in
/// flight that long (a slow server, or a pass that built its write before a change).
fn hold_operator(server: &ApiServer, resource: &str, verbs: &[&str], latency: Duration) {
    server.update_faults(|f| {
        f.targeted.push(tidepool_tests::TargetedFault {
            identity: OPERATOR.into(),
            resource: resource.into(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            latency,
            ..Default::default()
        })
    });
}

/// Waits until the server has received one more `verb` on `resource` than `before` (the
/// request is then in flight, held by [`hold_operator`]).
async fn in_flight(server: &ApiServer, verb: &str, resource: &str, before: u64) {
    eventually(
        Duration::from_secs(20),
        "the operator's request in flight",
        || async { (server.request_count(verb, resource) > before).then_some(()) },
    )
    .await;
}

/// A force-delete: the finalizers stripped, then a delete that removes the object at once.
async fn force_delete<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let strip = kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}}));
    api.patch(name, &kube::api::PatchParams::default(), &strip)
        .await
        .expect("strip the finalizers");
    // (a deleted object without finalizers is gone already)
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(e) => assert_eq!(code(&e), 404, "delete: {e}"),
    }
}

/// The operator's writes of `resource`'s object `name` stored after `since`, as verbs.
fn operator_writes_since(
    server: &ApiServer,
    resource: &str,
    name: &str,
    since: std::time::Instant,
) -> Vec<String> {
    server
        .accepted_writes()
        .into_iter()
        .filter(|w| w.at > since && w.identity == OPERATOR)
        .filter(|w| w.resource == resource && w.name == name)
        .map(|w| w.verb)
        .collect()
}

/// An IPAMNode, then an IPAMBlock, force-deleted (finalizer stripped) while the operator's
/// apply to it is in flight: the apply carries the object's uid, so it never brings the
/// object back (409 "uid mismatch"); the IPAMNode of the Node, which still exists, is created
/// again by POST with a new uid, the node side republishes its entries to it, and the
/// deleted block's CIDR is not granted again while an entry of a running pod lies in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_deleted_objects_are_not_brought_back_by_a_late_apply() {
    let (server, admin) = operator_cluster().await;
    // four /28 blocks
    create_pool(&admin, "default", &["10.110.0.0/26"], json!({"ipv4": 28})).await;
    add_node(&admin, "node-a").await;
    let s = Settings {
        engine: EngineConfig {
            reclaim: tidepool_ipam::ReclaimConfig {
                grace: Duration::from_millis(300),
                min_age: Duration::from_millis(300),
            },
            ..settings().engine
        },
        ..settings()
    };
    let (stop, task) = start_operator(&server, s).await;
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    let first = eventually(Duration::from_secs(20), "node-a's block", || {
        let blocks = blocks.clone();
        async move {
            let list = blocks.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|b| b.spec.node == "node-a")
        }
    })
    .await;
    let net: ipnet::IpNet = first.spec.cidr.0.parse().unwrap();
    // two pods on addresses of the block; p1 runs and lists its address
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let addrs: Vec<String> = AddrSet::of_net(&net)
        .iter()
        .skip(1)
        .take(2)
        .map(|a| a.to_string())
        .collect();
    let mut used = BTreeMap::new();
    for (i, addr) in addrs.iter().enumerate() {
        let name = format!("p{i}");
        add_pod(&admin, &name, "node-a").await;
        let uid = pods.get(&name).await.unwrap().metadata.uid.unwrap();
        used.insert(addr.clone(), (uid, name));
    }
    let running =
        json!({"status": {"phase": "Running", "podIP": addrs[1], "podIPs": [{"ip": addrs[1]}]}});
    pods.patch_status(
        "p1",
        &Default::default(),
        &kube::api::Patch::Merge(&running),
    )
    .await
    .unwrap();
    write_used(&admin, "node-a", &used).await;

    // p0 goes: the operator's tombstone apply is held in flight while the IPAMNode is
    // force-deleted
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let old_uid = ipamnodes.get("node-a").await.unwrap().metadata.uid.unwrap();
    hold_operator(
        &server,
        IPAMNODES,
        &["apply", "create"],
        Duration::from_secs(1),
    );
    let before = server.request_count("apply", IPAMNODES);
    pods.delete("p0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    in_flight(&server, "apply", IPAMNODES, before).await;
    force_delete(&ipamnodes, "node-a").await;
    let deleted_at = std::time::Instant::now();
    let again = eventually(Duration::from_secs(20), "node-a's IPAMNode again", || {
        let ipamnodes = ipamnodes.clone();
        async move { ipamnodes.get_opt("node-a").await.ok()? }
    })
    .await;
    assert_ne!(
        again.metadata.uid.as_deref(),
        Some(old_uid.as_str()),
        "a new object"
    );
    let writes = operator_writes_since(&server, IPAMNODES, "node-a", deleted_at);
    assert_eq!(
        writes.first().map(String::as_str),
        Some("create"),
        "created by POST, never by the late apply: {writes:?}"
    );
    // the node side republishes its entries to the new object; the operator keeps them
    used.remove(&addrs[0]);
    write_used(&admin, "node-a", &used).await;
    eventually(
        Duration::from_secs(20),
        "the entries on the new IPAMNode",
        || {
            let (ipamnodes, kept) = (ipamnodes.clone(), addrs[1].clone());
            async move {
                let o = ipamnodes.get("node-a").await.ok()?;
                let st = o.status?;
                (st.used.contains_key(&kept) && o.metadata.finalizers.is_some()).then_some(())
            }
        },
    )
    .await;
    server.set_faults(Default::default());

    // the block: deleted, so the operator drains it; its mark apply is held in flight while
    // the block is force-deleted
    let name = first.metadata.name.clone().unwrap();
    hold_operator(&server, IPAMBLOCKS, &["apply"], Duration::from_secs(1));
    let before = server.request_count("apply", IPAMBLOCKS);
    blocks
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    in_flight(&server, "apply", IPAMBLOCKS, before).await;
    force_delete(&blocks, &name).await;
    let deleted_at = std::time::Instant::now();
    server.set_faults(Default::default());
    // another node wants a block; the deleted one's CIDR holds p1's entry and podIP
    add_node(&admin, "node-b").await;
    eventually(Duration::from_secs(20), "node-b's block", || {
        let admin = admin.clone();
        async move { (blocks_of(&admin, "node-b").await.0 >= 1).then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let list = blocks.list(&ListParams::default()).await.unwrap().items;
    let over: Vec<String> = list
        .iter()
        .filter(|b| b.spec.cidr.0 == first.spec.cidr.0)
        .map(|b| format!("{} for {}", b.spec.cidr.0, b.spec.node))
        .collect();
    assert!(over.is_empty(), "granted over a used address: {over:?}");
    let writes = operator_writes_since(&server, IPAMBLOCKS, &name, deleted_at);
    assert!(
        writes.is_empty(),
        "the late mark brought the block back: {writes:?}"
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// The operator forces its applies and sends only its own fields: a user's `spec.pools`
/// (a merge patch, as `kubectl patch` sends it) keeps its value and its owner through the
/// operator's applies; and a `spec.nodeUID` someone else wrote (here on a cluster without
/// the bundle's admission policy) is taken back, never a conflict retried for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_forces_its_own_fields_and_leaves_the_users() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["10.120.0.0/24"], json!({"ipv4": 28})).await;
    let node_uid = add_node(&admin, "node-a").await;
    let (stop, task) = start_operator(&server, settings()).await;
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually(Duration::from_secs(20), "node-a's IPAMNode", || {
        let ipamnodes = ipamnodes.clone();
        async move { ipamnodes.get_opt("node-a").await.ok()? }
    })
    .await;
    let kubectl_patch = kube::api::PatchParams {
        field_manager: Some("kubectl-patch".into()),
        ..Default::default()
    };
    let pools = kube::api::Patch::Merge(json!({"spec": {"pools": {"ipv4": "default"}}}));
    ipamnodes
        .patch("node-a", &kubectl_patch, &pools)
        .await
        .unwrap();
    // someone writes nodeUID (the old example did); the bundle's policy would refuse it
    let vaps: Api<kube::api::DynamicObject> = Api::all_with(
        admin.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicyBinding",
            ),
            "validatingadmissionpolicybindings",
        ),
    );
    vaps.delete("tidepool-node-uid", &DeleteParams::default())
        .await
        .unwrap();
    let placeholder = "6f1c2a9e-3b7d-4c1a-9e2f-0a1b2c3d4e5f";
    let wrong = kube::api::Patch::Merge(json!({"spec": {"nodeUID": placeholder}}));
    eventually(Duration::from_secs(10), "the policy binding gone", || {
        let (ipamnodes, wrong) = (ipamnodes.clone(), wrong.clone());
        let pp = kubectl_patch.clone();
        async move { ipamnodes.patch("node-a", &pp, &wrong).await.ok() }
    })
    .await;
    let fixed = eventually(Duration::from_secs(20), "the Node's UID back", || {
        let (ipamnodes, node_uid) = (ipamnodes.clone(), node_uid.clone());
        async move {
            let o = ipamnodes.get("node-a").await.ok()?;
            (o.spec.node_uid == node_uid).then_some(o)
        }
    })
    .await;
    assert_eq!(
        fixed.spec.pools.as_ref().and_then(|p| p.ipv4.as_deref()),
        Some("default"),
        "the user's pools stay"
    );
    let owners = |field: &str| -> Vec<String> {
        fixed
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| {
                m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.pointer(&format!("/f:spec/f:{field}")).is_some())
            })
            .filter_map(|m| m.manager.clone())
            .collect()
    };
    assert_eq!(
        owners("pools"),
        ["kubectl-patch"],
        "{:?}",
        fixed.metadata.managed_fields
    );
    assert_eq!(owners("nodeUID"), [api::names::OPERATOR_MANAGER]);
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// Deleting the IPAMBlock CRD (DESIGN.md "Protection against deletion"): the server deletes
/// each block, and a block deleted so drains like a removed CIDR. The operator keeps its
/// finalizer while the node side answers do-not-release, takes it off after
/// ready-for-release, and the CRD goes once its last block has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_deletion_drains_the_blocks() {
    let (server, admin) = operator_cluster().await;
    let (name, (stop, task)) = a_block_in_use(&server, &admin, "10.130.0.0/24").await;
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());

    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let crd_name = IPAMBLOCKS.to_string();
    crds.delete(&crd_name, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "the block deleted and marked",
        || {
            let (blocks, name) = (blocks.clone(), name.clone());
            async move {
                let b = blocks.get_opt(&name).await.ok()??;
                (b.metadata.deletion_timestamp.is_some() && b.spec.release.is_some()).then_some(())
            }
        },
    )
    .await;
    let pp = kube::api::PatchParams::apply(api::names::AGENT_MANAGER);
    let ack = |answer: &str| {
        json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
            "metadata": {"name": name},
            "status": {"releaseAck": answer},
        })
    };
    blocks
        .patch_status(&name, &pp, &kube::api::Patch::Apply(&ack("do-not-release")))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b = blocks
        .get_opt(&name)
        .await
        .unwrap()
        .expect("in use: the block stays");
    assert_eq!(
        b.metadata.finalizers,
        Some(vec![api::names::FINALIZER.to_string()])
    );
    assert!(
        crds.get_opt(&crd_name).await.unwrap().is_some(),
        "the CRD waits"
    );
    // meanwhile the operator's claims of other blocks are refused (405), not granted
    let refused = server
        .failed_requests()
        .into_iter()
        .filter(|f| f.identity == OPERATOR && f.verb == "create" && f.resource == IPAMBLOCKS)
        .count();
    assert!(refused > 0, "{:?}", server.failed_requests());
    // the pod goes, the node side lets go: the block goes, then the CRD
    write_used(&admin, "node-a", &BTreeMap::new()).await;
    blocks
        .patch_status(
            &name,
            &pp,
            &kube::api::Patch::Apply(&ack("ready-for-release")),
        )
        .await
        .unwrap();
    gone(&crds, &crd_name, Duration::from_secs(30)).await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// The notes of the operator's events (issue 25, "Events"), through its recorder to the
/// in-process server: a note over the server's 1024-byte limit (kubernetes/kubernetes
/// pkg/apis/core/validation/events.go, `NoteLengthLimit`) is stored cut on a character
/// boundary instead of being refused, and a new note with the same reason on the same object
/// reaches the API (kube-runtime 5.0.0 src/events.rs keys its series on the reason, not the
/// note), while the same note repeated still folds into one series; a series whose event
/// was deleted on the server starts a new event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_notes_fit_the_limit_and_a_changed_note_reaches_the_api() {
    use std::num::NonZeroU32;

    use k8s_openapi::api::events::v1::Event;
    use tidepool_ipam::EventType;
    use tidepool_operator::store::Events;

    let (server, client) = start().await;
    let hundred = NonZeroU32::new(100).unwrap();
    let events = Events::new(client.clone(), hundred, hundred);
    let api: Api<Event> = Api::namespaced(client, "default");
    let stored = |api: Api<Event>| async move {
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("AgentNotReady"))
            .map(|e| {
                let count = e.series.map_or(1, |s| s.count);
                (e.note.unwrap_or_default(), count)
            })
            .collect::<Vec<_>>()
    };
    let emit = |note: String| {
        events.emit(
            "IPAMNode",
            "node-a",
            EventType::Warning,
            tidepool_ipam::EventReason::AgentNotReady,
            note,
        );
    };

    // "é" is two bytes: the note is 2,012 bytes long
    let long = format!("agent: {}", "é".repeat(1000)) + "!";
    emit(long.clone());
    let notes = eventually(Duration::from_secs(10), "the long note stored", || {
        let api = api.clone();
        async move { Some(stored(api).await).filter(|n| !n.is_empty()) }
    })
    .await;
    let cut = &notes[0].0;
    assert!(cut.len() <= 1024, "{} bytes", cut.len());
    assert!(long.starts_with(cut.trim_end_matches('…')), "{cut}");

    emit("agent: ready soon".into());
    eventually(Duration::from_secs(10), "the changed note stored", || {
        let api = api.clone();
        async move {
            let notes = stored(api).await;
            notes
                .iter()
                .any(|(n, _)| n == "agent: ready soon")
                .then_some(())
        }
    })
    .await;

    // Sent again (until the recorder has cached the first, which it does just after the
    // create returns), it bumps that event's series.
    eventually(
        Duration::from_secs(10),
        "the repeat folded into a series",
        || {
            emit("agent: ready soon".into());
            let api = api.clone();
            async move {
                let notes = stored(api).await;
                notes
                    .iter()
                    .any(|(n, count)| n == "agent: ready soon" && *count >= 2)
                    .then_some(())
            }
        },
    )
    .await;

    // The series' event gone from the server (events expire there): the next repeat is a
    // new event, not a patch of the missing one. A merge patch of a missing object is 404 on
    // kube-apiserver, events too, whose strategy allows create on update
    // (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go: `jsonPatcher`'s
    // `createNewObject` answers NotFound); the in-process server answers the same.
    // (Repeats go on while the test polls, so the new event may already count more than
    // one: it is told apart by its name.)
    let lp = ListParams::default();
    let mut gone = Vec::new();
    for e in api.list(&lp).await.unwrap().items {
        if e.note.as_deref() == Some("agent: ready soon") {
            let name = e.metadata.name.unwrap();
            api.delete(&name, &DeleteParams::default()).await.unwrap();
            gone.push(name);
        }
    }
    assert!(!gone.is_empty());
    eventually(
        Duration::from_secs(10),
        "a new event after the old one went",
        || {
            emit("agent: ready soon".into());
            let (api, gone) = (api.clone(), gone.clone());
            async move {
                let items = api.list(&ListParams::default()).await.unwrap().items;
                items
                    .into_iter()
                    .filter(|e| e.note.as_deref() == Some("agent: ready soon"))
                    .any(|e| !gone.contains(e.metadata.name.as_ref().unwrap()))
                    .then_some(())
            }
        },
    )
    .await;
    server.shutdown();
}

/// A node holding a /64 (2^64 addresses, more than `status.allocated`'s int64 holds): once
/// its status is written, a change of nothing it counts means no status apply (issue 27,
/// defect 3: the clamped count was compared unclamped, so every store event, here a label
/// put on the IPAMNode each second as any node's churn would, re-applied it). Its
/// per-family counts are the exact decimal figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_holding_a_slash_64_is_not_rewritten_while_nothing_changes() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["fd00:20::/60"], json!({"ipv6": 64})).await;
    add_node(&admin, "node-a").await;
    let (stop, task) = start_operator(&server, settings()).await;
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let counted = eventually(Duration::from_secs(20), "node-a's counts", || {
        let ipamnodes = ipamnodes.clone();
        async move {
            let st = ipamnodes.get("node-a").await.ok()?.status?;
            let v6 = st.ipv6.clone()?;
            (v6.allocated.as_deref() == Some("18446744073709551616")).then_some(st)
        }
    })
    .await;
    assert_eq!(counted.allocated, Some(i64::MAX), "the old count, clamped");
    let v4 = counted.ipv4.expect("both families are counted");
    assert_eq!(v4.allocated.as_deref(), Some("0"));
    // a second or two for the writes under way, then several refresh periods in which the
    // IPAMNode changes (a label) but nothing the operator counts does
    tokio::time::sleep(Duration::from_secs(2)).await;
    let since = std::time::Instant::now();
    let status = format!("{IPAMNODES}/status");
    let applies = || server.request_count("apply", &status);
    let before = applies();
    for i in 0..4 {
        let label = json!({"metadata": {"labels": {"touched": i.to_string()}}});
        let pp = kube::api::PatchParams::default();
        ipamnodes
            .patch("node-a", &pp, &kube::api::Patch::Merge(&label))
            .await
            .expect("label the IPAMNode");
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    assert_eq!(
        applies() - before,
        0,
        "status applies while no count changed"
    );
    let writes = operator_writes_since(&server, &status, "node-a", since);
    assert!(writes.is_empty(), "nothing changed, yet: {writes:?}");
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A pod `name` of namespace `ns` bound to `node`.
async fn add_pod_in(admin: &kube::Client, ns: &str, name: &str, node: &str) {
    create_object(
        admin,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
        }),
    )
    .await;
}

/// How many of `node`'s blocks come from `pool`.
async fn blocks_of_pool(admin: &kube::Client, node: &str, pool: &str) -> usize {
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    let list = blocks.list(&ListParams::default()).await.expect("list");
    (list.items.iter())
        .filter(|b| b.spec.node == node && b.spec.pool == pool)
        .count()
}

/// Waits until `node` holds a block of `pool`.
async fn until_pool_block(admin: &kube::Client, node: &str, pool: &str) {
    let what = format!("a block of {pool} for {node}");
    eventually(Duration::from_secs(20), &what, || async move {
        (blocks_of_pool(admin, node, pool).await > 0).then_some(())
    })
    .await;
}

/// DESIGN.md "Pools per namespace and per pod": a waiting pod whose namespace a pool's
/// namespaceSelector selects is demand for that pool on its node, so the operator claims a
/// block of it before any ADD; the other namespaces' pods take the default pool; and a
/// namespace relabelled while its pods wait re-plans their nodes at once (the resync is
/// off: the Namespace watch alone must do it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaces_waiting_pods_get_blocks_of_the_pool_that_selects_it() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["10.80.0.0/24"], json!({"ipv4": 28})).await;
    let mut blue = pool_json("blue", &["10.81.0.0/24"], json!({"ipv4": 28}));
    blue["spec"]["namespaceSelector"] = json!({"matchLabels": {"team": "blue"}});
    create_object(&admin, blue).await;
    for (ns, team) in [("team-blue", "blue"), ("team-red", "red")] {
        let labels = json!({"team": team});
        let obj = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": labels}});
        create_object(&admin, obj).await;
    }
    add_node(&admin, "node-a").await;
    add_pod_in(&admin, "team-red", "red-0", "node-a").await;
    let mut s = settings();
    s.engine.resync_interval = Duration::from_secs(600);
    let (stop, task) = start_operator(&server, s).await;
    until_pool_block(&admin, "node-a", "default").await;
    assert_eq!(blocks_of_pool(&admin, "node-a", "blue").await, 0);

    add_pod_in(&admin, "team-blue", "blue-0", "node-a").await;
    until_pool_block(&admin, "node-a", "blue").await;
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    for b in blocks.list(&ListParams::default()).await.unwrap().items {
        let cidr = if b.spec.pool == "blue" {
            "10.81."
        } else {
            "10.80."
        };
        assert!(b.spec.cidr.0.starts_with(cidr), "{b:?}");
    }

    // team-red joins blue while node-b's pod waits: node-b gets a blue block
    add_node(&admin, "node-b").await;
    add_pod_in(&admin, "team-red", "red-1", "node-b").await;
    until_pool_block(&admin, "node-b", "default").await;
    assert_eq!(blocks_of_pool(&admin, "node-b", "blue").await, 0);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    let relabel = Patch::Merge(json!({"metadata": {"labels": {"team": "blue"}}}));
    (namespaces.patch("team-red", &PatchParams::default(), &relabel))
        .await
        .expect("relabel team-red");
    until_pool_block(&admin, "node-b", "blue").await;
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// Sets (or with `None` removes) `ns`'s `ipam.tidepool.dev/pools` annotation, as `kubectl
/// annotate` does.
async fn annotate_namespace(admin: &kube::Client, ns: &str, pools: Option<&str>) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    let patch = json!({"metadata": {"annotations": {"ipam.tidepool.dev/pools": pools}}});
    (namespaces.patch(ns, &PatchParams::default(), &Patch::Merge(patch)))
        .await
        .expect("annotate the namespace");
}

/// Waits until `node` holds no block of `pool`, answering release marks as a node side
/// with nothing in use would.
async fn until_pool_gone(admin: &kube::Client, node: &str, pool: &str) {
    let what = format!("{node}'s blocks of {pool} given back");
    eventually(Duration::from_secs(30), &what, || async move {
        answer_marks(admin, node).await;
        (blocks_of_pool(admin, node, pool).await == 0).then_some(())
    })
    .await;
}

/// DESIGN.md "Pools per namespace and per pod": a pool created while the operator runs is
/// used for the waiting pods that name it with no restart; a namespace annotation changed
/// while its pod waits moves the demand to the new pool, and the old pool's block, claimed
/// for that pod, is not stranded: it goes back (the release handshake, answered as a node
/// side with nothing in use answers); a dual-stack pod takes IPv4 from one pool and IPv6
/// from another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_named_by_a_namespace_follow_its_annotation_without_a_stranded_block() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["10.90.0.0/24"], json!({"ipv4": 28})).await;
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant"}});
    create_object(&admin, ns).await;
    annotate_namespace(&admin, "tenant", Some("blue")).await;
    add_node(&admin, "node-a").await;
    add_pod_in(&admin, "tenant", "web-0", "node-a").await;
    let mut s = settings();
    s.engine.release.delay = Duration::from_millis(200);
    let (stop, task) = start_operator(&server, s).await;
    until_pool_block(&admin, "node-a", "default").await;
    assert_eq!(
        blocks_of_pool(&admin, "node-a", "blue").await,
        0,
        "no pool blue yet"
    );

    // the pool the namespace names appears: its block comes with no restart
    create_pool(&admin, "blue", &["10.91.0.0/24"], json!({"ipv4": 28})).await;
    until_pool_block(&admin, "node-a", "blue").await;

    // the namespace moves to green while the pod waits: green's block comes, blue's goes
    create_pool(&admin, "green", &["10.92.0.0/24"], json!({"ipv4": 28})).await;
    annotate_namespace(&admin, "tenant", Some("green")).await;
    until_pool_block(&admin, "node-a", "green").await;
    until_pool_gone(&admin, "node-a", "blue").await;

    // IPv4 from green, IPv6 from a pool of its own
    create_pool(&admin, "six", &["fd00:93::/64"], json!({"ipv6": 124})).await;
    annotate_namespace(&admin, "tenant", Some("green,six")).await;
    until_pool_block(&admin, "node-a", "six").await;
    assert_eq!(blocks_of_pool(&admin, "node-a", "green").await, 1);
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// `node`'s `status.poolUsage` as (pool, family, allocated, blocked).
async fn pool_usage(admin: &kube::Client, node: &str) -> Vec<(String, String, String, bool)> {
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let Ok(o) = nodes.get(node).await else {
        return Vec::new();
    };
    let usage = o.status.map(|s| s.pool_usage).unwrap_or_default();
    (usage.into_iter())
        .map(|u| (u.name, u.family, u.allocated, u.blocked))
        .collect()
}

/// `ns`'s events of `reason` (their notes, each once), as a pod's events are recorded.
async fn event_notes(admin: &kube::Client, ns: &str, reason: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), ns);
    let list = events.list(&ListParams::default()).await.expect("events");
    (list.items.into_iter())
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

/// DESIGN.md "Pools per namespace and per pod": a pool exhausted for a node blocks only its
/// own pods there. The node's `status.poolUsage` says which pool (and what each holds), the
/// `Blocked` condition names it with the reason `PoolsBlocked`, which is no reason for the
/// exhaustion taint (a NoSchedule taint would repel every pod); the waiting pod gets a
/// `PoolUnavailable` event, as does a pod whose annotation names a pool its namespace may
/// not use (never a fall-through to another pool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_blocks_only_its_own_pods_and_says_so() {
    let (server, admin) = operator_cluster().await;
    grant_taint_exhausted_nodes(&admin).await;
    create_pool(&admin, "default", &["10.95.0.0/24"], json!({"ipv4": 28})).await;
    // blue: one block in all, for namespaces labelled team=blue
    let mut blue = pool_json("blue", &["10.96.0.0/28"], json!({"ipv4": 28}));
    blue["spec"]["namespaceSelector"] = json!({"matchLabels": {"team": "blue"}});
    create_object(&admin, blue).await;
    for (ns, team) in [("team-blue", "blue"), ("team-red", "red")] {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"team": team}}});
        create_object(&admin, obj).await;
    }
    add_node(&admin, "node-a").await;
    add_node(&admin, "node-b").await;
    add_pod_in(&admin, "team-blue", "blue-a", "node-a").await;
    let s = Settings {
        taint_exhausted_nodes: true,
        ..settings()
    };
    let (stop, task) = start_operator(&server, s).await;
    until_pool_block(&admin, "node-a", "blue").await;

    add_pod_in(&admin, "team-blue", "blue-b", "node-b").await;
    add_pod_in(&admin, "team-red", "red-b", "node-b").await;
    // a pod naming a pool its namespace may not use
    create_object(
        &admin,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "sneaky", "namespace": "team-red",
                         "annotations": {"ipam.tidepool.dev/pools": "blue"}},
            "spec": {"nodeName": "node-b", "containers": [{"name": "c", "image": "pause"}]}}),
    )
    .await;
    until_pool_block(&admin, "node-b", "default").await;
    let want = vec![
        (
            "blue".to_string(),
            "ipv4".to_string(),
            "0".to_string(),
            true,
        ),
        ("default".into(), "ipv4".into(), "16".into(), false),
    ];
    eventually(Duration::from_secs(20), "node-b's pool usage", || async {
        (pool_usage(&admin, "node-b").await == want).then_some(())
    })
    .await;
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let status = nodes.get("node-b").await.unwrap().status.unwrap();
    let blocked = status.conditions.iter().find(|c| c.type_ == "Blocked");
    let blocked = blocked.expect("a Blocked condition");
    assert_eq!(
        (&*blocked.status, &*blocked.reason),
        ("True", "PoolsBlocked")
    );
    assert!(blocked.message.ends_with("blue (ipv4)"), "{blocked:?}");
    assert_eq!(blocks_of_pool(&admin, "node-b", "blue").await, 0);
    let a = pool_usage(&admin, "node-a").await;
    assert!(
        a.contains(&("blue".into(), "ipv4".into(), "16".into(), false)),
        "node-a holds blue's only block: {a:?}"
    );
    let notes = || async {
        let mut n = event_notes(&admin, "team-blue", "PoolUnavailable").await;
        n.extend(event_notes(&admin, "team-red", "PoolUnavailable").await);
        (n.len() == 2).then_some(n)
    };
    let notes = eventually(Duration::from_secs(20), "two PoolUnavailable events", notes).await;
    assert!(
        notes.iter().any(|n| n.contains("no ipv4 address left")),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.contains("which the pod may not use")),
        "{notes:?}"
    );
    let node_b: Api<Node> = Api::all(admin.clone());
    let taints = node_b
        .get("node-b")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.taints);
    assert_eq!(taints, None, "another pool's exhaustion taints nothing");
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// DESIGN.md "Pools per namespace and per pod": an IPPool deleted while a pod runs on an
/// address of it drains without dropping that address: the busy block stays (and
/// `status.poolUsage` still counts it), nothing is tombstoned; once the pod is gone and
/// the node side's entry with it, the block goes back (its mark answered as a node side with
/// nothing in use answers), and the namespace's new pods take the default pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_deleted_while_in_use_drains_without_dropping_an_address() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["10.97.0.0/24"], json!({"ipv4": 28})).await;
    let mut blue = pool_json("blue", &["10.98.0.0/24"], json!({"ipv4": 28}));
    blue["spec"]["namespaceSelector"] = json!({"matchLabels": {"team": "blue"}});
    create_object(&admin, blue).await;
    let ns = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "team-blue", "labels": {"team": "blue"}}});
    create_object(&admin, ns).await;
    add_node(&admin, "node-a").await;
    add_pod_in(&admin, "team-blue", "web-0", "node-a").await;
    let mut s = settings();
    s.engine.release.delay = Duration::from_millis(200);
    let (stop, task) = start_operator(&server, s).await;
    until_pool_block(&admin, "node-a", "blue").await;

    // the node side gives web-0 the blue block's first address
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    let list = blocks.list(&ListParams::default()).await.unwrap().items;
    let block = list.iter().find(|b| b.spec.pool == "blue").unwrap();
    let net: ipnet::IpNet = block.spec.cidr.0.parse().unwrap();
    let addr = net.hosts().next().unwrap().to_string();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "team-blue");
    let uid = pods.get("web-0").await.unwrap().metadata.uid.unwrap();
    let entry = json!({"podUID": uid, "namespace": "team-blue", "pod": "web-0",
        "containerID": "cid-web-0", "ifname": "eth0", "since": "2026-11-27T10:00:00Z",
        "pool": "blue"});
    apply_node_side(&admin, "node-a", json!({"used": {addr.clone(): entry}})).await;
    let busy = (
        "blue".to_string(),
        "ipv4".to_string(),
        "16".to_string(),
        false,
    );
    eventually(Duration::from_secs(20), "blue counted in use", || async {
        let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
        let st = nodes.get("node-a").await.ok()?.status?;
        let u = st.pool_usage.iter().find(|u| u.name == "blue")?;
        let got = (
            u.name.clone(),
            u.family.clone(),
            u.allocated.clone(),
            u.blocked,
        );
        (got == busy && u.used == "1").then_some(())
    })
    .await;

    // blue is deleted while web-0 runs: its block and web-0's entry stay, untombstoned
    let ippools: Api<api::IPPool> = Api::all(admin.clone());
    ippools
        .delete("blue", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        blocks_of_pool(&admin, "node-a", "blue").await,
        1,
        "the busy block stays"
    );
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let node = nodes.get("node-a").await.unwrap();
    assert!(
        node.spec.reclaim.is_empty(),
        "nothing tombstoned: {:?}",
        node.spec.reclaim
    );
    let used = node.status.unwrap().used;
    assert!(used.contains_key(&addr), "web-0 keeps its address");

    // web-0 goes, and its entry with it: the block drains
    pods.delete("web-0", &DeleteParams::default())
        .await
        .unwrap();
    apply_node_side(&admin, "node-a", json!({"used": {}})).await;
    until_pool_gone(&admin, "node-a", "blue").await;
    assert!(server.request_count("delete", "ipamblocks.ipam.tidepool.dev") >= 1);
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A nearly full pool takes an idle block back from one node to serve pods waiting on
/// another (issue 30). A /26 in /28 blocks holds 4 blocks; with pre-allocate 20, node-a and
/// node-b, one pod each, take two blocks each; node-c then joins with 10 pods and finds the
/// pool empty. The
/// pressure, (used + waiting + cooldown) / capacity, passes `--scarcity-enter` (set low here:
/// no node side writes `used`, so only the waiting pods count): the pool turns `Scarce` with
/// a `PoolScarce` event; a and b keep no pre-allocation while c's pods wait, so each marks
/// its whole idle block after `--scarcity-release-delay`; once a node side answers, the
/// block is deleted (with its resourceVersion precondition) and node-c claims it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scarce_pool_takes_an_idle_block_back_for_another_node() {
    let (server, admin) = operator_cluster().await;
    create_pool(&admin, "default", &["10.99.0.0/26"], json!({"ipv4": 28})).await;
    add_node(&admin, "node-a").await;
    add_node(&admin, "node-b").await;
    add_pod(&admin, "a-0", "node-a").await;
    add_pod(&admin, "b-0", "node-b").await;
    let mut s = settings();
    s.engine.watermarks.pre_allocate = 20;
    s.engine.scarcity.enter = 0.15;
    s.engine.scarcity.exit = 0.1;
    s.engine.scarcity.release_delay = Duration::from_millis(500);
    let (stop, task) = start_operator(&server, s).await;
    let two_each = || async {
        let a = blocks_of_pool(&admin, "node-a", "default").await;
        let b = blocks_of_pool(&admin, "node-b", "default").await;
        (a == 2 && b == 2).then_some(())
    };
    eventually(
        Duration::from_secs(20),
        "two blocks each on a and b",
        two_each,
    )
    .await;

    // node-c joins with 10 pods: the pool is empty
    for i in 0..10 {
        add_pod(&admin, &format!("c-{i}"), "node-c").await;
    }
    add_node(&admin, "node-c").await;
    let ippools: Api<api::IPPool> = Api::all(admin.clone());
    let scarce = || async {
        let st = ippools.get("default").await.ok()?.status?;
        let c = st.conditions.into_iter().find(|c| c.type_ == "Scarce")?;
        (c.status == "True").then_some(c)
    };
    let c = eventually(Duration::from_secs(20), "Scarce=True", scarce).await;
    assert!(c.message.contains("ipv4: pressure"), "{c:?}");
    let served = || async {
        answer_marks(&admin, "node-a").await;
        answer_marks(&admin, "node-b").await;
        (blocks_of_pool(&admin, "node-c", "default").await > 0).then_some(())
    };
    eventually(Duration::from_secs(30), "node-c gets a block back", served).await;
    let a = blocks_of_pool(&admin, "node-a", "default").await;
    let b = blocks_of_pool(&admin, "node-b", "default").await;
    assert!(a + b < 4, "an idle block went back: a {a}, b {b}");
    assert!(server.request_count("delete", "ipamblocks.ipam.tidepool.dev") >= 1);
    let events = event_notes(&admin, "default", "PoolScarce").await;
    assert!(
        events.iter().any(|n| n.contains("warm pools give way")),
        "{events:?}"
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}
