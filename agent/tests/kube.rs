//! The agent's API-server side against the in-process API server with RBAC and the
//! agent's own-node admission policy on (deploy/agent/rbac.yaml): the watch sees only its
//! node's objects, a publish writes exactly the node side's fields and leaves the
//! operator's alone, publishing batches under load, and an agent bound to one node is
//! refused on another's.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
#[path = "../../tests/tests/system/mod.rs"]
mod common;

use common::*;
use tidepool_agent::kube::{
    AgentReady, KubeError, NodeSide, NodeSideSource, NodeWatch, PublishConfig, Publisher,
    block_status_body, node_status_body,
};
use tidepool_api as api;
use tidepool_api::convert::{AllocationNames, Allocations, node_from_api, parse_uid};
use tidepool_api::names::{AGENT_MANAGER, OPERATOR_MANAGER};
use tidepool_ipam::{
    AllocationId, NodeSideFields, NodeUid, PodUid, ReclaimAck, ReclaimOutcome, ReleaseAck,
    UsedEntry,
};
use tidepool_tests::{ADMIN, ApiServer};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Waits (5 s at most) until `f` holds of the watch.
async fn until(w: &NodeWatch, what: &str, f: impl Fn(&NodeWatch) -> bool) {
    let mut changes = w.changes();
    tokio::time::timeout(Duration::from_secs(5), async {
        while !f(w) {
            changes.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

#[tokio::test]
async fn the_watch_sees_only_its_nodes_objects() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.0.0.0/28", "node-a", UID_A, false).await;
    create_block(&admin, "10.0.0.16/28", "node-a", UID_A, true).await;
    // a block of an earlier Node named node-a, and one of node-b
    create_block(&admin, "10.0.0.32/28", "node-a", UID_OLD, false).await;
    create_block(&admin, "10.0.0.48/28", "node-b", UID_B, false).await;

    let client = server.client(&agent_on("node-a")).await.unwrap();
    let w = NodeWatch::start(client.clone(), "node-a");
    let node = w.wait_for_node(Duration::from_secs(5)).await.unwrap();
    assert!(w.is_ready());
    assert_eq!(w.node_uid(), parse_uid(UID_A).map(NodeUid));
    assert_eq!(&*node.name, "node-a");
    let pool = &node.operator.addresses;
    assert!(pool.contains(&ip("10.0.0.1")) && pool.contains(&ip("10.0.0.17")));
    assert!(
        !pool.contains(&ip("10.0.0.33")),
        "a foreign nodeUID's block"
    );
    assert!(!pool.contains(&ip("10.0.0.49")), "another node's block");
    assert_eq!(pool.total(), 32);
    assert!(node.operator.release.get(&ip("10.0.0.17")).is_some());
    assert_eq!(w.blocks().len(), 2);

    // a new block arrives, a block goes
    create_block(&admin, "10.0.0.64/28", "node-a", UID_A, false).await;
    create_block(&admin, "10.0.0.80/28", "node-b", UID_B, false).await;
    until(&w, "the new block", |w| w.blocks().len() == 3).await;
    Api::<api::IPAMBlock>::all(admin.clone())
        .delete("v4-10-0-0-0-28", &DeleteParams::default())
        .await
        .unwrap();
    until(&w, "the deleted block gone", |w| w.blocks().len() == 2).await;
    let node = w.current().unwrap();
    assert!(!node.operator.addresses.contains(&ip("10.0.0.1")));
    assert!(!node.operator.addresses.contains(&ip("10.0.0.81")));

    // an IPAMNode that never comes
    let c = NodeWatch::start(client, "node-c");
    match c.wait_for_node(Duration::from_millis(300)).await {
        Err(KubeError::NodeMissing { node, .. }) => assert_eq!(node, "node-c"),
        other => panic!("expected NodeMissing, got {other:?}"),
    }
    assert!(c.is_ready() && c.current().is_none());
}

/// The IPPool list failing (the pools' watch behind the blocks', as separate watches may
/// be on a real server): until it is done, the agent projects nothing, so it neither
/// leaves its blocks out as of an unknown pool nor has a status written from that view;
/// once it is, its blocks are its pool.
#[tokio::test]
async fn blocks_listed_before_their_pool_are_not_judged() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.0.0.0/28", "node-a", UID_A, false).await;
    server.update_faults(|f| {
        f.targeted = vec![tidepool_tests::TargetedFault {
            identity: agent_on("node-a"),
            resource: "ippools.ipam.tidepool.dev".into(),
            verbs: ["list".to_string()].into(),
            error_code: Some(503),
            ..Default::default()
        }];
    });
    let client = server.client(&agent_on("node-a")).await.unwrap();
    let w = NodeWatch::start(client, "node-a");
    let listed = |resource: &str| server.request_count("list", resource) > 0;
    tokio::time::timeout(Duration::from_secs(5), async {
        while !(listed("ipamnodes.ipam.tidepool.dev") && listed("ipamblocks.ipam.tidepool.dev")) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the IPAMNode and IPAMBlock lists");
    // time for both answers to be taken in
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w.is_ready(), "ready before the IPPool list");
    assert!(
        w.current().is_none(),
        "a node projected before its pools were listed"
    );
    assert!(w.blocks().is_empty());
    server.update_faults(|f| f.targeted.clear());
    let node = w.wait_for_node(Duration::from_secs(10)).await.unwrap();
    assert!(node.operator.addresses.contains(&ip("10.0.0.1")));
    assert_eq!(node.operator.addresses.total(), 16);
}

/// A [`NodeSideSource`] held in memory.
#[derive(Clone, Default)]
struct Memory(Arc<Mutex<Option<NodeSide>>>);

impl Memory {
    fn set(&self, side: NodeSide) {
        *self.0.lock().unwrap() = Some(side);
    }
}

impl NodeSideSource for Memory {
    async fn read(&self) -> Option<NodeSide> {
        self.0.lock().unwrap().clone()
    }
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

/// `n` pods, each one address from 10.0.0.0/28, a cooldown, both acks, a block answer.
fn side(n: u8) -> NodeSide {
    let mut fields = NodeSideFields::default();
    let mut allocations = Allocations::new();
    for i in 0..n {
        let cid = format!("containerd://{i:02}");
        let id = AllocationId::new(&cid, "eth0");
        allocations.insert(id, AllocationNames::new(&cid, "eth0"));
        let e = UsedEntry {
            pod_uid: PodUid(u128::from(i) + 1),
            pod: tidepool_ipam::PodName::new("ns", &format!("p{i}")),
            allocation: id,
            since: at(u64::from(i)).into(),
        };
        fields.used.insert(IpAddr::from([10, 0, 0, 1 + i]), e);
    }
    fields.cooldown.insert(ip("10.0.0.15"), at(300));
    fields
        .release_ack
        .insert(ip("10.0.0.14"), ReleaseAck::DoNotRelease);
    let old = AllocationId::new("containerd://gone", "eth0");
    allocations.insert(old, AllocationNames::new("containerd://gone", "eth0"));
    fields.reclaim_ack.insert(
        ip("10.0.0.13"),
        ReclaimAck {
            pod_uid: PodUid(99),
            allocation: old,
            outcome: ReclaimOutcome::Stale,
        },
    );
    NodeSide {
        fields,
        allocations,
        pools: BTreeMap::new(),
        ready: Some(AgentReady::serving()),
        block_acks: BTreeMap::from([("v4-10-0-0-0-28".to_string(), ReleaseAck::DoNotRelease)]),
    }
}

async fn published(p: &Publisher, after: u64) {
    let mut rx = p.published();
    tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|n| *n > after))
        .await
        .expect("published in time")
        .unwrap();
}

/// The operator's own writes on node-a: spec (a tombstone) and its status condition.
async fn operator_writes(server: &ApiServer) {
    let nodes: Api<api::IPAMNode> = Api::all(server.client(OPERATOR).await.unwrap());
    let pp = PatchParams::apply(OPERATOR_MANAGER);
    let spec = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": { "name": "node-a" },
        "spec": { "nodeUID": UID_A, "reclaim": { "10.0.0.13": {
            "podUID": PodUid(99).to_string(), "containerID": "containerd://gone",
            "ifname": "eth0", "reason": "pod-deleted" } } },
    });
    nodes
        .patch("node-a", &pp, &Patch::Apply(&spec))
        .await
        .unwrap();
    let status = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": { "name": "node-a" },
        "status": { "allocated": 16, "ipv4": { "allocated": "16" }, "conditions": [{ "type": "Blocked", "status": "False",
            "reason": "AtTarget", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z" }] },
    });
    nodes
        .patch_status("node-a", &pp, &Patch::Apply(&status))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_publish_writes_exactly_the_node_sides_fields() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.0.0.0/28", "node-a", UID_A, true).await;
    operator_writes(&server).await;
    let client = server.client(&agent_on("node-a")).await.unwrap();
    let w = NodeWatch::start(client.clone(), "node-a");
    w.wait_for_node(Duration::from_secs(5)).await.unwrap();
    let source = Memory::default();
    let p = Publisher::start(client, w, source.clone(), PublishConfig::default());
    let before = *p.published().borrow();
    source.set(side(3));
    p.publish();
    published(&p, before).await;

    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let obj = nodes.get("node-a").await.unwrap();
    let (view, bad) = node_from_api(&obj);
    assert!(bad.is_empty(), "{bad:?}");
    // the operator reads back exactly what the agent holds
    assert_eq!(view.node.node, side(3).fields);
    let st = obj.status.as_ref().unwrap();
    assert_eq!(st.in_use, Some(3));
    // the operator's fields survive: its tombstone, its count, its condition
    assert!(obj.spec.reclaim.contains_key("10.0.0.13"));
    assert_eq!(st.allocated, Some(16));
    // each family's figures, from their two writers
    let v4 = st.ipv4.as_ref().expect("status.ipv4");
    assert_eq!(v4.allocated.as_deref(), Some("16"));
    assert_eq!(v4.used.as_deref(), Some("3"));
    let types: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, vec!["Blocked", "AgentReady"]);
    // the agent owns status fields only
    let agent_fields = obj
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some(AGENT_MANAGER))
        .map(|m| {
            (
                m.subresource.clone(),
                m.fields_v1.as_ref().unwrap().0.clone(),
            )
        })
        .collect::<Vec<_>>();
    assert_eq!(agent_fields.len(), 1, "{agent_fields:?}");
    assert_eq!(agent_fields[0].0.as_deref(), Some("status"));
    assert!(agent_fields[0].1.get("f:spec").is_none());
    // the block's answer
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    let b = blocks.get("v4-10-0-0-0-28").await.unwrap();
    assert_eq!(
        b.status.and_then(|s| s.release_ack),
        Some(api::BlockAck::DoNotRelease)
    );

    // fewer pods, no block answer: what is no longer sent is gone
    let mut smaller = side(1);
    smaller.block_acks.clear();
    let before = *p.published().borrow();
    source.set(smaller.clone());
    p.publish();
    published(&p, before).await;
    let obj = nodes.get("node-a").await.unwrap();
    assert_eq!(node_from_api(&obj).0.node.node, smaller.fields);
    assert!(obj.spec.reclaim.contains_key("10.0.0.13"));
    let b = blocks.get("v4-10-0-0-0-28").await.unwrap();
    assert_eq!(b.status.and_then(|s| s.release_ack), None);
    assert_eq!(b.spec.release, Some(api::BlockRelease::MarkedForRelease));
}

#[tokio::test]
async fn a_burst_of_publishes_makes_few_writes() {
    let (server, _admin) = cluster().await;
    let identity = agent_on("node-a");
    let client = server.client(&identity).await.unwrap();
    let w = NodeWatch::start(client.clone(), "node-a");
    w.wait_for_node(Duration::from_secs(5)).await.unwrap();
    let source = Memory::default();
    let p = Publisher::start(client, w, source.clone(), PublishConfig::default());
    // 100 changes, one every 3 ms: ~300 ms of load
    let started = std::time::Instant::now();
    for i in 0..100u8 {
        let mut s = side(i % 14);
        s.block_acks.clear();
        source.set(s);
        p.publish();
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let load = started.elapsed();
    let last = {
        let mut s = side(99 % 14);
        s.block_acks.clear();
        s
    };
    let nodes: Api<api::IPAMNode> = Api::all(server.client(ADMIN).await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let obj = nodes.get("node-a").await.unwrap();
            if node_from_api(&obj).0.node.node == last.fields {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the last state is published");
    let writes = server
        .accepted_writes()
        .into_iter()
        .filter(|w| w.identity == identity && w.resource.starts_with("ipamnodes"))
        .count();
    eprintln!("{writes} status writes for 100 publishes over {load:?}");
    // at most one write per 100 ms of load, plus the one that ends it
    let bound = usize::try_from(load.as_millis() / 100).unwrap() + 2;
    assert!(
        (1..=bound).contains(&writes) && writes < 20,
        "{writes} writes for 100 publishes over {load:?}"
    );
}

#[tokio::test]
async fn the_agent_is_refused_on_another_nodes_objects() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.0.0.0/28", "node-a", UID_A, true).await;
    create_block(&admin, "10.0.0.16/28", "node-b", UID_B, true).await;
    let agent = server.client(&agent_on("node-a")).await.unwrap();
    let nodes: Api<api::IPAMNode> = Api::all(agent.clone());
    let blocks: Api<api::IPAMBlock> = Api::all(agent.clone());
    let pp = PatchParams::apply(AGENT_MANAGER).force();
    let s = side(1);
    let body = |name: &str| {
        node_status_body(
            name,
            &s.fields,
            &s.allocations,
            &s.pools,
            s.ready.as_ref(),
            at(0),
        )
    };
    nodes
        .patch_status("node-a", &pp, &Patch::Apply(body("node-a")))
        .await
        .expect("its own node");
    let policy = "ValidatingAdmissionPolicy 'tidepool-agent-own-node' with binding \
                  'tidepool-agent-own-node' denied request";
    match nodes
        .patch_status("node-b", &pp, &Patch::Apply(body("node-b")))
        .await
    {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert_eq!(
                e.message,
                format!(
                    "ipamnodes.ipam.tidepool.dev \"node-b\" is forbidden: {policy}: agent on \
                     node node-a may not write ipamnodes node-b"
                )
            );
        }
        other => panic!("expected the policy's refusal, got {other:?}"),
    }
    // blocks: its own node's answered, another node's refused
    let ack = |name: &str| block_status_body(name, Some(ReleaseAck::ReadyForRelease));
    blocks
        .patch_status("v4-10-0-0-0-28", &pp, &Patch::Apply(ack("v4-10-0-0-0-28")))
        .await
        .expect("its own block");
    match blocks
        .patch_status(
            "v4-10-0-0-16-28",
            &pp,
            &Patch::Apply(ack("v4-10-0-0-16-28")),
        )
        .await
    {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(
                e.message.ends_with(&format!(
                    "{policy}: agent on node node-a may not write ipamblocks v4-10-0-0-16-28"
                )),
                "{}",
                e.message
            );
        }
        other => panic!("expected the policy's refusal, got {other:?}"),
    }
    // RBAC: no spec writes at all, even on its own node
    let spec = Patch::Merge(json!({ "spec": { "release": {} } }));
    match nodes.patch("node-a", &PatchParams::default(), &spec).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("expected 403, got {other:?}"),
    }
}

/// The IPAMNode deleted and created again (a new Node UID: the node re-registered): the
/// publisher writes the whole node side to the new object without being asked, since its
/// last write went to the old one.
#[tokio::test]
async fn a_recreated_ipamnode_gets_the_node_side_again() {
    let (server, admin) = cluster().await;
    let client = server.client(&agent_on("node-a")).await.unwrap();
    let w = NodeWatch::start(client.clone(), "node-a");
    w.wait_for_node(Duration::from_secs(5)).await.unwrap();
    let source = Memory::default();
    let p = Publisher::start(client, w.clone(), source.clone(), PublishConfig::default());
    let before = *p.published().borrow();
    let mut two = side(2);
    two.block_acks.clear(); // no block in this test
    source.set(two.clone());
    p.publish();
    published(&p, before).await;

    // the operator removes the old IPAMNode (no finalizer here) and creates the new one
    let operator = server.client(OPERATOR).await.unwrap();
    let nodes: Api<api::IPAMNode> = Api::all(operator.clone());
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    let new_uid = "0d0d0d0d-0000-4000-8000-00000000000d";
    let obj: api::IPAMNode = serde_json::from_value(json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": { "name": "node-a" },
        "spec": { "nodeUID": new_uid },
    }))
    .unwrap();
    nodes
        .create(&kube::api::PostParams::default(), &obj)
        .await
        .unwrap();
    until(&w, "the new IPAMNode", |w| {
        w.node_uid() == parse_uid(new_uid).map(NodeUid)
    })
    .await;
    // no publish() asked: the publisher notices the new object and writes to it
    let admin_nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let obj = admin_nodes.get("node-a").await.unwrap();
        if node_from_api(&obj).0.node.node == two.fields {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the new IPAMNode never got the node side: {:?}",
            obj.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A block answered and then deleted (the operator took it back) before the write: the
/// agent's status apply to it is answered 404, as a real server's status subresource
/// answers (it never creates; the agent's RBAC has no `create`), and publishing goes on;
/// so it does past a block that moved to another node (the own-node policy's 422).
#[tokio::test]
async fn an_answer_for_a_block_that_is_gone_does_not_stall_publishing() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.0.1.0/28", "node-b", UID_B, true).await;
    let client = server.client(&agent_on("node-a")).await.unwrap();
    let blocks: Api<api::IPAMBlock> = Api::all(client.clone());
    let body = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
        "metadata": { "name": "v4-10-0-0-0-28" },
        "status": { "releaseAck": "do-not-release" },
    });
    let gone = blocks
        .patch_status(
            "v4-10-0-0-0-28",
            &PatchParams::apply(AGENT_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .expect_err("no such block");
    assert!(
        matches!(&gone, kube::Error::Api(s) if s.code == 404),
        "{gone:?}"
    );

    let w = NodeWatch::start(client.clone(), "node-a");
    w.wait_for_node(Duration::from_secs(5)).await.unwrap();
    let source = Memory::default();
    let p = Publisher::start(client, w, source.clone(), PublishConfig::default());
    let before = *p.published().borrow();
    // answers block v4-10-0-0-0-28, which does not exist, and node-b's block (refused)
    let mut two = side(2);
    two.block_acks
        .insert("v4-10-0-1-0-28".into(), ReleaseAck::ReadyForRelease);
    source.set(two);
    p.publish();
    published(&p, before).await;
    let mut three = side(3);
    three.block_acks.clear();
    let before = *p.published().borrow();
    source.set(three.clone());
    p.publish();
    published(&p, before).await;
    let nodes: Api<api::IPAMNode> = Api::all(server.client(OPERATOR).await.unwrap());
    let obj = nodes.get("node-a").await.unwrap();
    assert_eq!(node_from_api(&obj).0.node.node, three.fields);
    let theirs = Api::<api::IPAMBlock>::all(admin)
        .get("v4-10-0-1-0-28")
        .await
        .unwrap();
    assert_eq!(theirs.status.and_then(|s| s.release_ack), None);
}

/// The pod watch, as the agent's service account (its RBAC lists and watches pods): only
/// the pods bound to its node, terminal ones not live, podIPs as the kubelet sets them, a
/// deleted pod gone.
#[tokio::test]
async fn the_pod_watch_sees_its_nodes_live_pods() {
    use common::running::{pod_on, set_pod_ips};
    use tidepool_agent::kube::PodWatch;

    let (server, admin) = cluster().await;
    let here = pod_on(
        &admin,
        "here",
        "node-a",
        "Running",
        &["10.0.0.1", "fd00::1"],
    )
    .await;
    let done = pod_on(&admin, "done", "node-a", "Failed", &["10.0.0.2"]).await;
    let there = pod_on(&admin, "there", "node-b", "Running", &["10.0.0.3"]).await;
    let client = server.client(&agent_on("node-a")).await.unwrap();
    let w = PodWatch::start(client, "node-a");
    let live = w.synced(Duration::from_secs(5)).await.unwrap();
    let uid = |s: &str| PodUid(parse_uid(s).unwrap());
    assert_eq!(live.len(), 1);
    assert!(live.lists(uid(&here), &ip("fd00::1")));
    assert!(!live.has(uid(&done)), "terminal");
    assert!(!live.has(uid(&there)), "another node's");
    let listed: Vec<IpAddr> = live.addresses().iter().copied().collect();
    assert_eq!(listed, vec![ip("10.0.0.1"), ip("fd00::1")]);

    // a new pod gets its address; the first one is deleted
    let new = pod_on(&admin, "new", "node-a", "Pending", &[]).await;
    set_pod_ips(&admin, "new", "Running", &["10.0.0.4"]).await;
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), "default")
        .delete("here", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let live = w.live().unwrap();
        if !live.has(uid(&here)) && live.lists(uid(&new), &ip("10.0.0.4")) {
            assert_eq!(live.len(), 1);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{live:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls the server's IPAMNode `node-a` until `f` holds of it (5 s at most).
async fn until_published(admin: &kube::Client, what: &str, f: impl Fn(&api::IPAMNode) -> bool) {
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n = nodes.get("node-a").await.unwrap();
        if f(&n) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {:?}",
            n.status
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An admin's `kubectl patch` of the tombstone on `addr` (`None`: removed).
async fn patch_tombstone(admin: &kube::Client, addr: &str, tomb: Option<serde_json::Value>) {
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let pp = PatchParams {
        field_manager: Some("kubectl-patch".into()),
        ..PatchParams::default()
    };
    let patch = json!({ "spec": { "reclaim": { addr: tomb } } });
    nodes
        .patch("node-a", &pp, &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The agent as `run` puts it together on node-a (node and pod watches, the state, the
/// publisher), its pod `web` created first; `cooldown`: the reuse cooldown.
struct Running {
    agent: tidepool_agent::serve::Agent,
    w: NodeWatch,
    state: tidepool_agent::serve::SharedState,
    pods: tidepool_agent::kube::PodWatch,
    publisher: Publisher,
    /// Pod `web`'s UID.
    uid: String,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn start(server: &ApiServer, admin: &kube::Client, cooldown: Duration) -> Self {
        use tidepool_agent::kube::PodWatch;
        use tidepool_agent::serve::{Agent, Config, PodNetworks};
        use tidepool_agent::state::StateDir;

        create_block(admin, "10.0.0.0/28", "node-a", UID_A, false).await;
        let pod = create_object(
            admin,
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "pause"}]}}),
        )
        .await;
        let uid = pod.metadata.uid.unwrap();
        let client = server.client(&agent_on("node-a")).await.unwrap();
        let w = NodeWatch::start(client.clone(), "node-a");
        w.wait_for_node(Duration::from_secs(5)).await.unwrap();
        let pods = PodWatch::start(client.clone(), "node-a");
        let live = pods.synced(Duration::from_secs(5)).await.unwrap();
        assert!(live.has(tidepool_agent::state::parse_pod_uid(&uid).unwrap()));
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(tmp.path().join("state")).unwrap();
        let loaded = dir.load("boot-1", SystemTime::now(), cooldown).unwrap();
        let state = tidepool_agent::serve::SharedState::new(loaded.state);
        let publisher = Publisher::start(
            client,
            w.clone(),
            tidepool_agent::run::Published::new(state.clone(), AgentReady::serving()),
            PublishConfig::default(),
        );
        let config = Config {
            pod_networks: Some(std::sync::Arc::new(
                PodNetworks::new(["10.0.0.0/16".parse().unwrap()]).unwrap(),
            )),
            empty_pool_wait: Duration::from_millis(10),
        };
        let agent = Agent::with_pods(
            state.clone(),
            dir,
            Arc::new(w.clone()),
            Arc::new(pods.clone()),
            Arc::new(publisher.clone()),
            config,
        );
        Running {
            agent,
            w,
            state,
            pods,
            publisher,
            uid,
            _dir: tmp,
        }
    }

    /// CNI ADD of `cid` for pod `web`: its address.
    async fn add(&self, cid: &str) -> String {
        let req: tidepool_agent::serve::CniRequest = serde_json::from_value(json!({
            "containerID": cid, "ifname": "eth0", "netns": "/var/run/netns/x",
            "podNamespace": "default", "podName": "web", "podUID": self.uid,
            "cniVersion": "1.0.0", "config": {}}))
        .unwrap();
        let r = self.agent.add(req).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let a = r.body["ips"][0]["address"].as_str().unwrap().to_owned();
        a.split('/').next().unwrap().to_owned()
    }

    /// What the answer loop does once (`run`'s `answer_loop`, each second and on changes).
    async fn answer(&self) {
        (self.agent)
            .answer_operator(self.w.blocks(), self.w.allocations())
            .await
            .unwrap();
    }
}

/// Issue 25: a tombstone written by hand on a running pod's exact allocation (as a
/// lagging operator would) is answered `live` by the agent's rules (`ipam`'s
/// `tombstone_outcome`): nothing is freed, and the address stays allocated and published.
/// A tombstone on a replaced sandbox of the same pod is still reclaimed.
#[tokio::test]
async fn a_tombstone_on_a_running_pods_allocation_is_answered_live() {
    let (server, admin) = cluster().await;
    let r = Running::start(&server, &admin, Duration::from_secs(30)).await;
    let (w, state, uid) = (&r.w, &r.state, &r.uid);
    let first = r.add("c1").await;
    let tomb = |reason: &str| json!({"podUID": uid, "containerID": "c1", "ifname": "eth0", "reason": reason});
    let answer = || async {
        until(w, "the tombstone seen", |w| {
            w.current().is_some_and(|n| !n.operator.reclaim.is_empty())
        })
        .await;
        r.answer().await;
    };

    // the pod runs with its only sandbox: live, nothing freed, still published as used
    patch_tombstone(&admin, &first, Some(tomb("pod-deleted"))).await;
    answer().await;
    let a: IpAddr = first.parse().unwrap();
    {
        let st = state.live().lock().await;
        assert_eq!(st.reclaim_acks()[&a].outcome, ReclaimOutcome::Live);
        assert!(st.owner(&a).is_some(), "still allocated");
        assert!(st.cooldowns().is_empty());
    }
    until_published(&admin, "the live answer and the entry", |n| {
        let st = n.status.clone().unwrap_or_default();
        st.reclaim_ack
            .get(&first)
            .is_some_and(|r| r.outcome == api::ReclaimOutcome::Live)
            && st.used.get(&first).is_some_and(|e| e.pod_uid == *uid)
    })
    .await;

    // the tombstone goes (the operator drops it); a new sandbox of the pod gets another
    // address; a tombstone on the replaced sandbox's is reclaimed
    patch_tombstone(&admin, &first, None).await;
    until(w, "the tombstone gone", |w| {
        w.current().is_some_and(|n| n.operator.reclaim.is_empty())
    })
    .await;
    r.answer().await;
    let second = r.add("c2").await;
    assert_ne!(first, second);
    patch_tombstone(&admin, &first, Some(tomb("sandbox-replaced"))).await;
    answer().await;
    {
        let st = state.live().lock().await;
        assert_eq!(st.reclaim_acks()[&a].outcome, ReclaimOutcome::Reclaimed);
        assert!(
            st.owner(&a).is_none(),
            "the replaced sandbox's address is freed"
        );
        assert!(st.owner(&second.parse().unwrap()).is_some());
    }
    until_published(&admin, "the reclaim", |n| {
        let st = n.status.clone().unwrap_or_default();
        st.reclaim_ack
            .get(&first)
            .is_some_and(|r| r.outcome == api::ReclaimOutcome::Reclaimed)
            && !st.used.contains_key(&first)
            && st.used.contains_key(&second)
    })
    .await;
}

/// Issue 31: a pod's life costs its node two status writes, its start and its end,
/// whichever way it ends (a DEL, or the answer to a tombstone). The end of its address's
/// cooldown and the going of its answer, once the operator dropped the tombstone, go with
/// the next write the node makes for another pod. Counted as the API server counts
/// requests (`apiserver_request_total`: verb and resource).
#[tokio::test]
async fn a_pods_life_is_two_status_writes() {
    const STATUS: &str = "ipamnodes.ipam.tidepool.dev/status";
    let cooldown = Duration::from_secs(1);
    let (server, admin) = cluster().await;
    let r = Running::start(&server, &admin, cooldown).await;
    // the state as restored, published first (as `run` does)
    let before = *r.publisher.published().borrow();
    r.publisher.publish();
    published(&r.publisher, before).await;
    let writes = || server.request_count("apply", STATUS);
    let base = writes();
    let status = |n: &api::IPAMNode| n.status.clone().unwrap_or_default();

    // a pod starts and ends with a DEL: two writes
    let first = r.add("c1").await;
    until_published(&admin, "c1 used", |n| status(n).used.contains_key(&first)).await;
    let del: tidepool_agent::serve::CniRequest = serde_json::from_value(json!({
        "containerID": "c1", "ifname": "eth0", "podUID": r.uid, "cniVersion": "1.0.0",
        "config": {}}))
    .unwrap();
    assert_eq!(r.agent.del(del).await.status, 200);
    until_published(&admin, "c1 in cooldown", |n| {
        let st = status(n);
        !st.used.contains_key(&first) && st.cooldown.contains_key(&first)
    })
    .await;
    assert_eq!(writes() - base, 2, "{:?}", server.requests());

    // its cooldown ends; the answer loop goes round: nothing to write
    tokio::time::sleep(cooldown + Duration::from_millis(200)).await;
    for _ in 0..3 {
        r.answer().await;
    }
    tokio::time::sleep(PublishConfig::default().interval * 3).await;
    assert_eq!(writes() - base, 2, "the cooldown's end wrote");
    let ended = r.state.live().lock().await.cooldowns().len();
    assert_eq!(ended, 1, "kept until the next write");

    // the next pod's start carries the cooldown's end; it ends by a tombstone (its pod
    // deleted without a DEL): two writes again, the tombstone's going none
    let second = r.add("c2").await;
    until_published(&admin, "c2 used, c1's cooldown gone", |n| {
        let st = status(n);
        st.used.contains_key(&second) && st.cooldown.is_empty()
    })
    .await;
    assert_eq!(writes() - base, 3);
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), "default")
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    // the operator tombstones it once it sees the pod gone; so does the node's pod watch
    let uid = tidepool_agent::state::parse_pod_uid(&r.uid).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while r.pods.live().is_none_or(|p| p.has(uid)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the pod watch still lists web"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tomb =
        json!({"podUID": r.uid, "containerID": "c2", "ifname": "eth0", "reason": "pod-deleted"});
    patch_tombstone(&admin, &second, Some(tomb)).await;
    until(&r.w, "the tombstone seen", |w| {
        w.current().is_some_and(|n| !n.operator.reclaim.is_empty())
    })
    .await;
    r.answer().await;
    let outcome = r.state.live().lock().await.reclaim_acks()[&second.parse().unwrap()].outcome;
    assert_eq!(outcome, ReclaimOutcome::Reclaimed);
    until_published(&admin, "the reclaim", |n| {
        let st = status(n);
        !st.used.contains_key(&second) && st.reclaim_ack.contains_key(&second)
    })
    .await;
    let answered = writes() - base;
    patch_tombstone(&admin, &second, None).await;
    until(&r.w, "the tombstone gone", |w| {
        w.current().is_some_and(|n| n.operator.reclaim.is_empty())
    })
    .await;
    tokio::time::sleep(cooldown + Duration::from_millis(200)).await;
    for _ in 0..3 {
        r.answer().await;
    }
    tokio::time::sleep(PublishConfig::default().interval * 3).await;
    assert_eq!(
        writes() - base,
        answered,
        "the tombstone's or the cooldown's going wrote"
    );
    let st = r.state.live().lock().await;
    assert_eq!((st.reclaim_acks().len(), st.cooldowns().len()), (1, 1));
}
