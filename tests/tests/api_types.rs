//! tidepool's CRDs (crate tidepool-api) against the in-process API server through the kube
//! client: the generated CRDs are accepted and established, the typed resources round-trip,
//! the status subresource and a field selector on the blocks' selectable fields work.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use tidepool_api::{
    BlockAck, BlockRelease, IPAMBlock, IPAMBlockSpec, IPAMBlockStatus, IPAMNode, IPAMNodeSpec,
    IPPool, IPPoolSpec, Watermarks,
};

async fn install(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in tidepool_api::crds() {
        let name = crd.metadata.name.clone().unwrap();
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("CRD accepted");
        tokio::time::timeout(
            Duration::from_secs(10),
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .expect("established in time")
        .expect("await condition");
    }
}

fn block(name: &str, cidr: &str, node: &str) -> IPAMBlock {
    IPAMBlock::new(
        name,
        IPAMBlockSpec {
            pool: "default".into(),
            cidr: serde_json::from_value(serde_json::json!(cidr)).unwrap(),
            node: node.into(),
            node_uid: format!("uid-{node}"),
            release: None,
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_resources_round_trip_through_the_server() {
    let (_server, client) = start().await;
    install(&client).await;
    let pp = PostParams::default();

    let pools: Api<IPPool> = Api::all(client.clone());
    let spec: IPPoolSpec = serde_json::from_value(serde_json::json!({
        "cidrs": ["10.0.0.0/16", "fd00::/64"], "nodeSelector": {"pool": "a"}
    }))
    .unwrap();
    pools
        .create(&pp, &IPPool::new("a", spec.clone()))
        .await
        .unwrap();
    let got = pools.get("a").await.unwrap();
    assert_eq!(got.spec.block_size.ipv4, 28, "the schema default");
    assert_eq!(got.spec, spec, "defaults are what the type's defaults are");

    let nodes: Api<IPAMNode> = Api::all(client.clone());
    let n = IPAMNode::new(
        "n1",
        IPAMNodeSpec {
            node_uid: "uid-n1".into(),
            watermarks: Some(Watermarks {
                pre_allocate: Some(16),
                ..Watermarks::default()
            }),
            ..IPAMNodeSpec::default()
        },
    );
    nodes.create(&pp, &n).await.unwrap();
    assert_eq!(nodes.get("n1").await.unwrap().spec, n.spec);

    let blocks: Api<IPAMBlock> = Api::all(client.clone());
    blocks
        .create(&pp, &block("v4-10-0-0-0-28", "10.0.0.0/28", "n1"))
        .await
        .unwrap();
    blocks
        .create(&pp, &block("v4-10-0-0-16-28", "10.0.0.16/28", "n2"))
        .await
        .unwrap();
    // a second create of a name is refused: the claim
    let again = blocks
        .create(&pp, &block("v4-10-0-0-0-28", "10.0.0.0/28", "n2"))
        .await;
    assert_eq!(code(&again.unwrap_err()), 409);
    // the mark on the spec, the answer on the status subresource
    let mut marked = blocks.get("v4-10-0-0-0-28").await.unwrap();
    marked.spec.release = Some(BlockRelease::MarkedForRelease);
    marked.metadata.managed_fields = None;
    blocks
        .replace("v4-10-0-0-0-28", &pp, &marked)
        .await
        .unwrap();
    let status = serde_json::json!({"status": IPAMBlockStatus {
        release_ack: Some(BlockAck::ReadyForRelease),
    }});
    blocks
        .patch_status(
            "v4-10-0-0-0-28",
            &PatchParams::default(),
            &Patch::Merge(status),
        )
        .await
        .unwrap();
    let b = blocks.get("v4-10-0-0-0-28").await.unwrap();
    assert_eq!(b.spec.release, Some(BlockRelease::MarkedForRelease));
    assert_eq!(
        b.status.unwrap().release_ack,
        Some(BlockAck::ReadyForRelease)
    );
    // the agent's watch: its node's blocks only, by the CRD's selectable field
    for (selector, want) in [
        ("spec.node=n2", "v4-10-0-0-16-28"),
        ("spec.nodeUID=uid-n1", "v4-10-0-0-0-28"),
    ] {
        let l = blocks
            .list(&ListParams::default().fields(selector))
            .await
            .unwrap();
        let names: Vec<_> = l
            .items
            .iter()
            .map(|b| b.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, [want], "{selector}");
    }
}

/// A watch on the blocks' selectable field sees its node's blocks only (the agent's watch), and
/// a field the CRD does not declare is refused as the real server refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_selectable_field_sees_its_node_only() {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let (_server, client) = start().await;
    install(&client).await;
    let blocks: Api<IPAMBlock> = Api::all(client.clone());
    let mut events = blocks
        .watch(
            &WatchParams::default().fields("spec.node=n1").timeout(10),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    let pp = PostParams::default();
    blocks
        .create(&pp, &block("v4-10-0-0-16-28", "10.0.0.16/28", "n2"))
        .await
        .unwrap();
    blocks
        .create(&pp, &block("v4-10-0-0-0-28", "10.0.0.0/28", "n1"))
        .await
        .unwrap();
    blocks
        .delete("v4-10-0-0-0-28", &Default::default())
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
            Ok(Some(Ok(WatchEvent::Added(b)))) => seen.push(("ADDED", b.metadata.name.unwrap())),
            Ok(Some(Ok(WatchEvent::Deleted(b)))) => {
                seen.push(("DELETED", b.metadata.name.unwrap()))
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("watch ended early: {other:?}"),
        }
    }
    let n1 = "v4-10-0-0-0-28".to_string();
    assert_eq!(seen, [("ADDED", n1.clone()), ("DELETED", n1)]);

    let e = blocks
        .list(&ListParams::default().fields("spec.cidr=10.0.0.0/28"))
        .await
        .expect_err("spec.cidr is not a selectable field");
    let s = status(&e);
    assert_eq!(s.code, 400, "{s:?}");
    assert!(
        s.message.contains("field label not supported: spec.cidr"),
        "{}",
        s.message
    );
}

/// An IPPool's blockSize is immutable (issue 25, "Who may change spec.nodeUID"): the CRD's
/// rule `self == oldSelf` refuses a change, in the real server's words (kubernetes/
/// apiextensions-apiserver `pkg/apiserver/schema/cel/validation.go` `validateExpressions`),
/// whoever writes it, by update, merge patch or apply; the schema default makes sure a pool
/// created without one has an old value. Other changes pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ippools_block_size_cannot_change() {
    let (_server, client) = start().await;
    install(&client).await;
    let pools: Api<IPPool> = Api::all(client.clone());
    let spec: IPPoolSpec =
        serde_json::from_value(serde_json::json!({"cidrs": ["10.9.0.0/16"]})).unwrap();
    pools
        .create(&PostParams::default(), &IPPool::new("p", spec))
        .await
        .unwrap();
    let says = "IPPool.ipam.tidepool.dev \"p\" is invalid: spec.blockSize: Invalid value: \
                \"object\": blockSize is immutable: create a new pool for another block size";
    let mut changed = pools.get("p").await.unwrap();
    changed.spec.block_size.ipv4 = 27;
    let err = pools
        .replace("p", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422, "{err}");
    assert_eq!(status(&err).message, says);
    let patch = serde_json::json!({"spec": {"blockSize": {"ipv6": 120}}});
    let err = pools
        .patch("p", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_err();
    assert_eq!(status(&err).message, says);
    let apply = serde_json::json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
        "spec": {"cidrs": ["10.9.0.0/16"], "blockSize": {"ipv4": 26, "ipv6": 124}}});
    let err = pools
        .patch(
            "p",
            &PatchParams::apply("admin").force(),
            &Patch::Apply(&apply),
        )
        .await
        .unwrap_err();
    assert_eq!(status(&err).message, says);
    // the same block size, other changes: accepted
    let grow = serde_json::json!({"spec": {"cidrs": ["10.9.0.0/16", "10.10.0.0/16"],
        "blockSize": {"ipv4": 28}}});
    let grown = pools
        .patch("p", &PatchParams::default(), &Patch::Merge(&grow))
        .await
        .unwrap();
    assert_eq!(grown.spec.cidrs.len(), 2);
    assert_eq!(grown.spec.block_size.ipv4, 28);
}

/// A value of an enum that a later release adds.
const LATER: &str = "from-a-later-release";

/// This release's CRDs with [`LATER`] added to every enum (a later release's CRDs: the
/// change additive, as within v1alpha1 every change is).
fn later_crds() -> Vec<CustomResourceDefinition> {
    fn widen(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::Array(e)) = m.get_mut("enum") {
                    e.push(serde_json::json!(LATER));
                }
                m.values_mut().for_each(widen);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(widen),
            _ => {}
        }
    }
    tidepool_api::crds()
        .into_iter()
        .map(|crd| {
            let mut v = serde_json::to_value(crd).unwrap();
            widen(&mut v);
            serde_json::from_value(v).unwrap()
        })
        .collect()
}

/// Version skew (issue 25): IPAMNodes and IPAMBlocks written by a later release, carrying
/// enum values this build does not know, are listed (kube decodes a LIST page whole: one
/// unreadable object would stop the watch) and read as "no answer yet": the unknown mark,
/// tombstone, answers and block mark are left out; `live` is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_of_a_later_release_are_listed_and_read_as_no_answer_yet() {
    use serde_json::json;
    use tidepool_api::convert::{block_from_api, node_from_api};

    let (_server, client) = start().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in later_crds() {
        let name = crd.metadata.name.clone().unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
        tokio::time::timeout(
            Duration::from_secs(10),
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .expect("established in time")
        .unwrap();
    }
    const UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
    let tomb = |reason: &str| json!({"podUID": UID, "containerID": "c1", "ifname": "eth0", "reason": reason});
    let ack = |outcome: &str| json!({"podUID": UID, "containerID": "c1", "ifname": "eth0", "outcome": outcome});
    let node = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": {"name": "n1"},
        "spec": {"nodeUID": UID, "addresses": ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
            "release": {"10.0.0.1": LATER, "10.0.0.2": "marked-for-release"},
            "reclaim": {"10.0.0.1": tomb(LATER), "10.0.0.2": tomb("pod-deleted")}},
    });
    let status = json!({"status": {
        "releaseAck": {"10.0.0.1": LATER, "10.0.0.2": "do-not-release"},
        "reclaimAck": {"10.0.0.1": ack(LATER), "10.0.0.2": ack("live")},
    }});
    let block = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
        "metadata": {"name": "v4-10-0-0-0-28"},
        "spec": {"pool": "default", "cidr": "10.0.0.0/28", "node": "n1", "nodeUID": UID,
            "release": LATER},
    });
    let pp = PatchParams::default();
    let nodes: Api<IPAMNode> = Api::all(client.clone());
    let blocks: Api<IPAMBlock> = Api::all(client.clone());
    create_object(&client, node).await;
    nodes
        .patch_status("n1", &pp, &Patch::Merge(&status))
        .await
        .unwrap();
    create_object(&client, block).await;
    let block_status = json!({"status": {"releaseAck": LATER}});
    blocks
        .patch_status("v4-10-0-0-0-28", &pp, &Patch::Merge(&block_status))
        .await
        .unwrap();

    // a LIST of each decodes whole
    let n = nodes.list(&ListParams::default()).await.unwrap().items;
    let b = blocks.list(&ListParams::default()).await.unwrap().items;
    let (view, bad) = node_from_api(&n[0]);
    assert!(bad.is_empty(), "{bad:?}");
    let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
    let op = &view.node.operator;
    assert_eq!(op.release.keys().total(), 1, "the known mark only");
    assert!(op.release.get(&ip("10.0.0.2")).is_some());
    assert_eq!(op.reclaim.keys().collect::<Vec<_>>(), vec![&ip("10.0.0.2")]);
    let side = &view.node.node;
    assert_eq!(side.release_ack.keys().total(), 1, "the known answer only");
    assert_eq!(side.reclaim_ack.len(), 1);
    assert_eq!(
        side.reclaim_ack[&ip("10.0.0.2")].outcome,
        tidepool_ipam::ReclaimOutcome::Live
    );
    let block = block_from_api(&b[0]).unwrap();
    assert!(!block.release, "an unknown mark is no mark");
    assert_eq!(block.ack, None, "an unknown answer is no answer yet");
    // and through serde alone
    let obj: IPAMBlock = serde_json::from_value(serde_json::to_value(&b[0]).unwrap()).unwrap();
    assert_eq!(obj.spec.release, Some(BlockRelease::Unknown));
    assert_eq!(obj.status.unwrap().release_ack, Some(BlockAck::Unknown));
}
