//! The node side and the operator together, against the in-process API server with RBAC and
//! the agent's policy on: the operator's runtime gives node-a its IPAMNode and a block, the
//! agent (`tidepool_agent::run`) serves the real plugin from it and publishes the pod's
//! entry, and once the pod is deleted the operator's tombstone is answered by the agent:
//! the entry goes, the address cools down, and the operator's tombstone goes after it.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::time::Duration;

use common::*;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use tidepool_agent::run::{Settings, run};
use tidepool_api as api;
use tidepool_operator::runtime::{self, Settings as OperatorSettings};

fn operator_settings() -> OperatorSettings {
    OperatorSettings {
        engine: tidepool_ipam::EngineConfig {
            resync_interval: Duration::from_secs(2),
            min_pass_interval: Duration::from_millis(50),
            reclaim: tidepool_ipam::ReclaimConfig {
                grace: Duration::from_millis(500),
                min_age: Duration::from_millis(500),
            },
            ..tidepool_ipam::EngineConfig::default()
        },
        scheduling: tidepool_ipam::SchedulingMode::Priority,
        kube_api_qps: 200.0,
        kube_api_burst: 100,
        node_selector: Default::default(),
        sync_timeout: Duration::from_secs(20),
        health_addr: None,
        seed: 7,
        taint_exhausted_nodes: false,
        agent_ready_grace: tidepool_operator::runtime::DEFAULT_AGENT_READY_GRACE,
        agent_pods: tidepool_operator::runtime::default_agent_pods(),
        election: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pods_address_is_reclaimed_through_the_agent() {
    let (server, admin) = empty_cluster().await;
    create_object(
        &admin,
        json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": "default"},
            "spec": {"cidrs": ["10.250.0.0/16"], "blockSize": {"ipv4": 28}},
        }),
    )
    .await;
    create_object(
        &admin,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
    )
    .await;
    let pod = create_object(
        &admin,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p1", "namespace": "default"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "pause"}]},
        }),
    )
    .await;
    let pod_uid = pod.metadata.uid.expect("a uid");
    let operator = server.client(OPERATOR).await.expect("operator client");
    let (stop_op, op_stopped) = tokio::sync::oneshot::channel::<()>();
    let op = tokio::spawn(runtime::run(operator, operator_settings(), async move {
        let _ = op_stopped.await;
    }));

    let dir = tempfile::tempdir().expect("temp dir");
    let s = Settings {
        reuse_cooldown: Duration::from_secs(60),
        node_wait: Duration::from_secs(20),
        empty_pool_wait: Duration::from_secs(5),
        ..settings(dir.path())
    };
    let agent_client = server
        .client(&agent_on("node-a"))
        .await
        .expect("agent client");
    let (stop_agent, agent_stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(run(agent_client, s.clone(), async move {
        let _ = agent_stopped.await;
    }));
    eventually("the agent serving", || async {
        s.restored_marker.exists().then_some(())
    })
    .await;

    let config = format!(
        r#"{{"cniVersion":"1.1.0","name":"pods","type":"ptp","ipam":{{"type":"tidepool-cni","socket":"{}","spoolDir":"{}","restoredMarker":"{}","connectTimeout":300,"requestTimeout":8000}}}}"#,
        s.socket.display(),
        s.spool_dir.display(),
        s.restored_marker.display()
    );
    let add = blocking({
        let (c, uid) = (config.clone(), pod_uid.clone());
        move || plugin("ADD", "c1", &uid, &c)
    })
    .await;
    let addr = add.addr();
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let used = |want: bool| {
        let (nodes, addr) = (nodes.clone(), addr.clone());
        move || {
            let (nodes, addr) = (nodes.clone(), addr.clone());
            async move {
                let st = nodes.get("node-a").await.ok()?.status?;
                (st.used.contains_key(&addr) == want).then_some(st)
            }
        }
    };
    let st = eventually("the pod's entry published", used(true)).await;
    assert_eq!(st.used[&addr].pod_uid, pod_uid);

    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), "default");
    pods.delete("p1", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the pod");
    let st = eventually("the entry reclaimed by the agent", used(false)).await;
    assert!(st.cooldown.contains_key(&addr), "cooling down: {st:?}");
    // the operator saw the agent's answer `reclaimed`: its event on the pod says so
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(admin.clone(), "default");
    eventually("IPAddressGarbageCollected on the pod", || {
        let (events, uid) = (events.clone(), pod_uid.clone());
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("IPAddressGarbageCollected")
                        && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(&uid)
                })
                .then_some(())
        }
    })
    .await;
    eventually("the operator's tombstone gone after the answer", || {
        let nodes = nodes.clone();
        async move {
            let n = nodes.get("node-a").await.ok()?;
            n.spec.reclaim.is_empty().then_some(())
        }
    })
    .await;

    stop_agent.send(()).expect("the agent runs");
    agent.await.expect("join").expect("the agent stops cleanly");
    stop_op.send(()).expect("the operator runs");
    op.await.expect("join").expect("the operator stops cleanly");
}
