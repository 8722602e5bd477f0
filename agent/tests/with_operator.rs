//! The node side and the operator together, against the in-process API server with RBAC and
//! the agent's policy on: the operator's runtime gives node-a its IPAMNode and a block, the
//! agent (`tidepool_agent::run`) serves the real plugin from it and publishes the pod's
//! entry, and once the pod is deleted the operator's tombstone is answered by the agent:
//! the entry goes, the address cools down, and the operator's tombstone goes after it.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::time::Duration;

use common::running::RunningAgent;
use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;
use tidepool_agent::run::Settings;
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
    default_pool(&admin).await;
    node_a(&admin).await;
    let pod_uid = bound_pod(&admin, "p1").await;
    let op = Operator::start(&server).await;

    let dir = tempfile::tempdir().expect("temp dir");
    let (agent, s) = start_agent(&server, dir.path()).await;

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

    agent.stop().await;
    op.stop().await;
}

/// A running operator (`runtime::run` on its own client), stopped by [`Operator::stop`].
struct Operator {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tidepool_operator::Error>>,
}

impl Operator {
    async fn start(server: &tidepool_tests::ApiServer) -> Self {
        let client = server.client(OPERATOR).await.expect("operator client");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(runtime::run(client, operator_settings(), async move {
            let _ = stopped.await;
        }));
        Operator { stop, task }
    }

    async fn stop(self) {
        self.stop.send(()).expect("the operator runs");
        self.task
            .await
            .expect("join")
            .expect("the operator stops cleanly");
    }
}

/// The agent of node-a in `dir` (`run` on its own client), serving once started.
async fn start_agent(
    server: &tidepool_tests::ApiServer,
    dir: &std::path::Path,
) -> (RunningAgent, Settings) {
    let s = Settings {
        reuse_cooldown: Duration::from_secs(60),
        node_wait: Duration::from_secs(20),
        empty_pool_wait: Duration::from_secs(5),
        ..settings(dir)
    };
    let client = server
        .client(&agent_on("node-a"))
        .await
        .expect("agent client");
    (RunningAgent::start(client, &s).await, s)
}

/// IPPool `default`: 10.250.0.0/16 in /28 blocks.
async fn default_pool(admin: &kube::Client) {
    create_ipv4_pool(admin, "default", &["10.250.0.0/16"], 28).await;
}

/// Pod `name` bound to node-a; its UID.
async fn bound_pod(admin: &kube::Client, name: &str) -> String {
    let pod = create_object(
        admin,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "pause"}]},
        }),
    )
    .await;
    pod.metadata.uid.expect("a uid")
}

/// Node node-a created; its UID.
async fn node_a(admin: &kube::Client) -> String {
    let node = create_object(
        admin,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
    )
    .await;
    node.metadata.uid.expect("a uid")
}

/// The pod's ADD, retried as the kubelet retries a failed sandbox, until it is served.
async fn add_until_served(config: &str, container: &str, pod_uid: &str) -> String {
    let mut last = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let run = blocking({
            let (c, id, uid) = (
                config.to_string(),
                container.to_string(),
                pod_uid.to_string(),
            );
            move || plugin("ADD", &id, &uid, &c)
        })
        .await;
        if run.code == 0 {
            return run.addr();
        }
        last = Some(run.stdout);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{container}'s ADD was never served; the last answer: {last:?}");
}

/// A Node deleted and created again under its name (a `kubectl delete node` and a kubelet
/// restart) while its pods keep running and stay bound, with the operator running through
/// it or not (`operator_through`): the operator adopts the IPAMNode and the blocks under the
/// new UID (DESIGN.md "Reclaim"), so the running pod keeps its address, which is never
/// tombstoned, a new pod's ADD is served from the node's blocks, and the entry of a pod
/// deleted while the Node was away is reclaimed as any other.
async fn a_node_re_registered_with_pods_bound(operator_through: bool) {
    let (server, admin) = empty_cluster().await;
    default_pool(&admin).await;
    let old_uid = node_a(&admin).await;
    let p0 = bound_pod(&admin, "p0").await;
    let p1 = bound_pod(&admin, "p1").await;
    let operator = Operator::start(&server).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (agent, s) = start_agent(&server, dir.path()).await;
    let config = config(&s);
    let addr1 = add_until_served(&config, "c1", &p1).await;
    let ipamnodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let published = |addr: String, uid: String| {
        let ipamnodes = ipamnodes.clone();
        move || {
            let (ipamnodes, addr, uid) = (ipamnodes.clone(), addr.clone(), uid.clone());
            async move {
                let st = ipamnodes.get("node-a").await.ok()?.status?;
                (st.used.get(&addr)?.pod_uid == uid).then_some(())
            }
        }
    };
    eventually("p1's entry published", published(addr1.clone(), p1.clone())).await;
    let addr0 = add_until_served(&config, "c0", &p0).await;
    eventually("p0's entry published", published(addr0.clone(), p0.clone())).await;

    // the Node goes and comes back under its name; p1 stays bound to it all along
    let operator = if operator_through {
        Some(operator)
    } else {
        operator.stop().await;
        None
    };
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .expect("delete the Node");
    // p0 goes while the Node is away: its entry is the old incarnation's to reclaim
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    pods.delete("p0", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete p0");
    let new_uid = node_a(&admin).await;
    assert_ne!(old_uid, new_uid);
    let operator = match operator {
        Some(o) => o,
        None => Operator::start(&server).await,
    };

    // a new pod on the re-registered node is served
    let p2 = bound_pod(&admin, "p2").await;
    let addr2 = add_until_served(&config, "c2", &p2).await;
    assert_ne!(addr1, addr2);
    eventually("p2's entry published", published(addr2, p2)).await;
    // the IPAMNode and every block of the node carry the new UID
    let obj = ipamnodes.get("node-a").await.expect("the IPAMNode");
    assert_eq!(obj.spec.node_uid, new_uid);
    let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
    let held: Vec<_> = blocks
        .list(&ListParams::default())
        .await
        .expect("list blocks")
        .items
        .into_iter()
        .filter(|b| b.spec.node == "node-a")
        .collect();
    assert!(!held.is_empty());
    for b in &held {
        assert_eq!(b.spec.node_uid, new_uid, "{:?}", b.metadata.name);
    }
    // p1 lives on: over several resyncs (2 s each) its entry stays and is never tombstoned
    // the gone pod's entry is reclaimed pod by pod, through the agent
    eventually("p0's entry reclaimed", || {
        let (ipamnodes, addr0) = (ipamnodes.clone(), addr0.clone());
        async move {
            let st = ipamnodes.get("node-a").await.ok()?.status?;
            (!st.used.contains_key(&addr0)).then_some(())
        }
    })
    .await;
    assert!(pods.get_opt("p1").await.expect("get p1").is_some());
    for _ in 0..40 {
        let n = ipamnodes.get("node-a").await.expect("the IPAMNode");
        assert!(
            !n.spec.reclaim.contains_key(&addr1),
            "p1's address tombstoned: {:?}",
            n.spec
        );
        let st = n.status.expect("a status");
        assert_eq!(
            st.used.get(&addr1).map(|u| u.pod_uid.as_str()),
            Some(p1.as_str())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    agent.stop().await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_re_registered_under_a_running_operator_keeps_its_pods_and_serves_new_ones() {
    a_node_re_registered_with_pods_bound(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_re_registered_while_no_operator_ran_keeps_its_pods_and_serves_new_ones() {
    a_node_re_registered_with_pods_bound(false).await;
}
