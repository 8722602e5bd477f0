//! The agent (`tidepool_agent::run::run`) against the in-process API server with RBAC and
//! the own-node policy on, as the agent's service account, driven by the real
//! `tidepool-cni` binary, with temp directories standing in for the runtime's netns
//! directory and libcni's result cache (no root needed: directories and files):
//! - reconcile frees nothing while the netns directory is missing, however many cycles run;
//!   once it is populated, an allocation with no cache entry and no live pod listing it is
//!   freed at its second cycle and cools down in `status.used`'s stead — while one with a
//!   cache entry and one whose live pod lists its address stay;
//! - with no checkpoint, a live pod's podIP is never handed out (the pool filled), and is
//!   again once the pod is gone; a terminal pod's is;
//! - after a corrupt checkpoint the published `status.used` and cooldowns are adopted: the
//!   same key gets its address back, no other key gets an adopted or cooling address, the
//!   rebuild is saved, and each entry's `pool` is kept (published again, and in the
//!   checkpoint), an entry without one published without one.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::path::Path;

use common::running::*;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use tidepool_api as api;

const POD: &str = "0badc0de-0000-4000-8000-000000000001";
const POD2: &str = "0badc0de-0000-4000-8000-000000000002";
/// node-a's block: 16 addresses, none reserved (the pod network is 10.250.0.0/16).
const BLOCK: &str = "10.250.0.16/28";

/// A libcni result-cache entry for (`c`, eth0) of network `pods`.
fn cache_entry(dir: &Path, c: &str) {
    std::fs::create_dir_all(dir).expect("cache dir");
    let entry = json!({"kind": "cniCacheV1", "containerId": c, "ifName": "eth0",
        "networkName": "pods", "config": "", "result": {"cniVersion": "1.1.0"}});
    std::fs::write(dir.join(format!("pods-{c}-eth0")), entry.to_string()).expect("entry");
}

async fn add(config: &str, c: &str, uid: &str) -> Run {
    let (config, c, uid) = (config.to_owned(), c.to_owned(), uid.to_owned());
    blocking(move || plugin("ADD", &c, &uid, &config)).await
}

/// The cycles reconcile has run so far.
async fn cycles(sock: &Path) -> u64 {
    agent_get(sock, "/v1/reconcile").await["cycles"]
        .as_u64()
        .expect("cycles")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_frees_on_positive_evidence_only_and_at_the_second_cycle() {
    let (server, admin) = cluster().await;
    create_block(&admin, BLOCK, "node-a", UID_A, false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = agent_settings(dir.path());
    let cache = s.reconcile.cni_cache_dir.clone();
    // another sandbox's entry: the cache's layout is libcni's
    cache_entry(&cache, "c-other");
    let live_uid = pod_on(&admin, "live", "node-a", "Running", &[]).await;
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let agent = RunningAgent::start(client, &s).await;
    let config = config(&s);

    let dead = add(&config, "c-dead", POD).await.addr();
    let cached = add(&config, "c-cached", POD2).await.addr();
    cache_entry(&cache, "c-cached");
    let live = add(&config, "c-live", &live_uid).await.addr();
    set_pod_ips(&admin, "live", "Running", &[&live]).await;
    let all = {
        let mut v = vec![dead.clone(), cached.clone(), live.clone()];
        v.sort();
        v
    };
    eventually("the three published", || async {
        let mut used = node_a_status(&admin).await.0;
        used.sort();
        (used == all).then_some(())
    })
    .await;

    // no netns directory (the mount missing): several cycles free nothing
    let from = cycles(&s.socket).await;
    eventually("four more cycles", || async {
        (cycles(&s.socket).await >= from + 4).then_some(())
    })
    .await;
    let report = agent_get(&s.socket, "/v1/reconcile").await;
    let blocked = report["last"]["blocked"].as_str().unwrap_or_default();
    assert!(blocked.contains("netns directory"), "{report}");
    assert_eq!(report["recentFrees"], json!([]), "{report}");
    let mut used = node_a_status(&admin).await.0;
    used.sort();
    assert_eq!(used, all, "nothing freed without the netns directory");

    // an empty one is no better
    std::fs::create_dir_all(&s.reconcile.netns_dir).expect("netns dir");
    let from = cycles(&s.socket).await;
    eventually("three more cycles", || async {
        (cycles(&s.socket).await >= from + 3).then_some(())
    })
    .await;
    assert_eq!(node_a_status(&admin).await.0.len(), 3);

    // populated (another sandbox's netns): the dead one goes, at its second cycle
    let populated_at = cycles(&s.socket).await;
    std::fs::write(s.reconcile.netns_dir.join("cni-1234"), "").expect("netns");
    eventually("the dead allocation freed into cooldown", || async {
        let (used, cooling) = node_a_status(&admin).await;
        (!used.contains(&dead) && cooling.contains(&dead)).then_some(())
    })
    .await;
    let report = agent_get(&s.socket, "/v1/reconcile").await;
    let frees = report["recentFrees"].as_array().expect("frees");
    assert_eq!(frees.len(), 1, "{report}");
    let f = &frees[0];
    assert_eq!(f["containerID"], "c-dead");
    assert_eq!(f["addresses"], json!([dead]));
    let first = f["firstSeenCycle"].as_u64().expect("first");
    assert!(first > populated_at, "{report}");
    assert_eq!(f["cycle"].as_u64(), Some(first + 1), "{report}");

    // the cached one and the live pod's stay, cycle after cycle
    let from = cycles(&s.socket).await;
    eventually("three more cycles", || async {
        (cycles(&s.socket).await >= from + 3).then_some(())
    })
    .await;
    let mut used = node_a_status(&admin).await.0;
    used.sort();
    let mut kept = vec![cached.clone(), live.clone()];
    kept.sort();
    assert_eq!(used, kept);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_checkpoint_a_live_pods_address_is_never_handed_out() {
    let (server, admin) = cluster().await;
    create_block(&admin, BLOCK, "node-a", UID_A, false).await;
    // pods the node had before this agent's first start: a running one, a finished one,
    // and one of another node listing an address of node-a's block (not this node's pod)
    pod_on(&admin, "running", "node-a", "Running", &["10.250.0.20"]).await;
    pod_on(&admin, "done", "node-a", "Succeeded", &["10.250.0.22"]).await;
    pod_on(&admin, "elsewhere", "node-b", "Running", &["10.250.0.23"]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = agent_settings(dir.path());
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let agent = RunningAgent::start(client, &s).await;
    let config = config(&s);

    let mut given = Vec::new();
    for i in 0..20 {
        let r = add(&config, &format!("c{i}"), POD).await;
        if r.code != 0 {
            assert_eq!(r.error_code(), 11, "the pool is empty: {}", r.stdout);
            break;
        }
        given.push(r.addr());
    }
    assert_eq!(given.len(), 15, "16 addresses, one a live pod's: {given:?}");
    assert!(!given.contains(&"10.250.0.20".to_owned()), "{given:?}");
    assert!(
        given.contains(&"10.250.0.22".to_owned()),
        "a terminal pod's is free"
    );
    assert!(
        given.contains(&"10.250.0.23".to_owned()),
        "another node's pod's is"
    );

    // the pod goes: its address is free again
    Api::<Pod>::namespaced(admin.clone(), "default")
        .delete("running", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the pod");
    let after = eventually("the address given once the pod is gone", || async {
        let r = add(&config, "c-after", POD).await;
        (r.code == 0).then(|| r.addr())
    })
    .await;
    assert_eq!(after, "10.250.0.20");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_checkpoint_adopts_the_published_node_side() {
    let (server, admin) = cluster().await;
    create_block(&admin, BLOCK, "node-a", UID_A, false).await;
    // what the agent had published before its checkpoint was lost to corruption
    let since = "2026-11-24T10:00:00Z";
    let until = an_hour_from_now();
    let entry = |uid: &str, c: &str| {
        json!({"podUID": uid, "namespace": "default", "pod": format!("web-{c}"),
               "containerID": c, "ifname": "eth0", "since": since})
    };
    // c1's pool was chosen at its ADD; c2's entry predates pools per pod
    let mut chosen = entry(POD, "c1");
    chosen["pool"] = json!("default");
    let status = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": {"name": "node-a"},
        "status": {
            "used": {"10.250.0.18": chosen, "10.250.0.19": entry(POD2, "c2")},
            "cooldown": {"10.250.0.17": until},
        },
    });
    Api::<api::IPAMNode>::all(admin.clone())
        .patch_status(
            "node-a",
            &PatchParams::apply(tidepool_api::names::AGENT_MANAGER).force(),
            &Patch::Apply(status),
        )
        .await
        .expect("the published node side");
    let dir = tempfile::tempdir().expect("temp dir");
    let s = agent_settings(dir.path());
    std::fs::create_dir_all(&s.state_dir).expect("state dir");
    std::fs::write(
        s.state_dir.join("checkpoint.json"),
        b"{\"version\":2,\"alloc",
    )
    .expect("corrupt");

    let client = server.client(&agent_on("node-a")).await.expect("client");
    let agent = RunningAgent::start(client, &s).await;
    let set_aside = std::fs::read_dir(&s.state_dir)
        .expect("state dir")
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("checkpoint.corrupt.")
        });
    assert!(set_aside, "the corrupt checkpoint set aside");
    // the rebuild is durable before anything was published
    let saved: serde_json::Value = serde_json::from_slice(
        &std::fs::read(s.state_dir.join("checkpoint.json")).expect("checkpoint"),
    )
    .expect("json");
    let mut keys: Vec<(String, String)> = saved["allocations"]
        .as_array()
        .expect("allocations")
        .iter()
        .map(|a| {
            let c = a["containerID"].as_str().unwrap_or_default().to_owned();
            (c, a["addresses"][0].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            ("c1".to_owned(), "10.250.0.18".to_owned()),
            ("c2".to_owned(), "10.250.0.19".to_owned())
        ]
    );
    assert!(saved["cooldown"].get("10.250.0.17").is_some(), "{saved}");
    let c1 = saved["allocations"].as_array().expect("allocations").iter();
    let c1 = c1.clone().find(|a| a["containerID"] == "c1").expect("c1");
    assert_eq!(c1["pools"]["10.250.0.18"], "default", "{saved}");
    let (used, cooling) = node_a_status(&admin).await;
    assert_eq!(used, ["10.250.0.18", "10.250.0.19"], "published as adopted");
    assert_eq!(cooling, ["10.250.0.17"]);
    // published again with each entry's pool as it was (none where there was none)
    let node = Api::<api::IPAMNode>::all(admin.clone()).get("node-a").await;
    let used = node.expect("node-a").status.expect("status").used;
    let pool = |a: &str| used[a].pool.clone();
    assert_eq!(pool("10.250.0.18").as_deref(), Some("default"));
    assert_eq!(pool("10.250.0.19"), None);

    let config = config(&s);
    assert_eq!(add(&config, "c1", POD).await.addr(), "10.250.0.18");
    let mut given = Vec::new();
    for i in 0..20 {
        let r = add(&config, &format!("n{i}"), POD2).await;
        if r.code != 0 {
            assert_eq!(r.error_code(), 11, "{}", r.stdout);
            break;
        }
        given.push(r.addr());
    }
    assert_eq!(
        given.len(),
        13,
        "16 less two adopted, one cooling: {given:?}"
    );
    for taken in ["10.250.0.17", "10.250.0.18", "10.250.0.19"] {
        assert!(!given.contains(&taken.to_owned()), "{taken} in {given:?}");
    }
    agent.stop().await;
}

/// A cooldown end an hour from now, as the API writes times.
fn an_hour_from_now() -> String {
    let t = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    let time = tidepool_api::convert::from_system(t);
    serde_json::to_value(&time)
        .expect("time")
        .as_str()
        .expect("a string")
        .to_owned()
}
