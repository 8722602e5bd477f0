//! The agent run as on a node (`tidepool_agent::run::run`) in a temp dir, and what a test
//! does around it: pods on the node with their podIPs, the agent's socket read, polling.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tidepool_agent::reconcile;
use tidepool_agent::run::{Settings, run};

/// [`super::settings`] with a shorter wait on an empty pool and reconcile every 200 ms.
pub fn agent_settings(dir: &Path) -> Settings {
    let s = super::settings(dir);
    Settings {
        empty_pool_wait: Duration::from_millis(300),
        reconcile: reconcile::Config {
            interval: Duration::from_millis(200),
            max_frees: 16,
            ..s.reconcile.clone()
        },
        ..s
    }
}

/// An agent running on a task; aborted if the test ends without stopping it.
pub struct RunningAgent {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<tidepool_agent::error::Result<()>>>,
}

impl RunningAgent {
    /// Starts the agent as `client` with `s` and waits until it serves (the restore marked).
    pub async fn start(client: kube::Client, s: &Settings) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(client, s.clone(), async move {
            let _ = stopped.await;
        }));
        let mut agent = RunningAgent {
            stop: Some(stop),
            task: Some(task),
        };
        let marker = s.restored_marker.clone();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !marker.exists() {
            if agent.task.as_ref().is_some_and(|t| t.is_finished()) {
                let r = agent.task.take().expect("task").await.expect("join");
                panic!("the agent stopped before serving: {r:?}");
            }
            assert!(Instant::now() < deadline, "the agent did not start serving");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        agent
    }

    /// Stops the agent and checks it stopped cleanly.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let task = self.task.take().expect("task");
        task.await.expect("join").expect("the agent stops cleanly");
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// `GET path` on the agent's socket: the JSON body.
pub async fn agent_get(sock: &Path, path: &str) -> Value {
    let (sock, path) = (sock.to_owned(), path.to_owned());
    super::blocking(move || {
        let mut s = UnixStream::connect(&sock).expect("connect");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        let (head, body) = out.split_once("\r\n\r\n").expect("head");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        serde_json::from_str(body).expect("json")
    })
    .await
}

/// Creates pod `name` in `default` bound to `node`, with `phase` and `ips` as its
/// status (the kubelet's part); returns its UID.
pub async fn pod_on(
    admin: &kube::Client,
    name: &str,
    node: &str,
    phase: &str,
    ips: &[&str],
) -> String {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
    }))
    .expect("pod");
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
    set_pod_ips(admin, name, phase, ips).await;
    created.metadata.uid.expect("a uid")
}

/// Sets pod `name`'s phase and podIPs.
pub async fn set_pod_ips(admin: &kube::Client, name: &str, phase: &str, ips: &[&str]) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let listed: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    let mut status = json!({"phase": phase, "podIPs": listed});
    if let Some(first) = ips.first() {
        status["podIP"] = json!(first);
    }
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .expect("patch the pod's status");
}

/// node-a's IPAMNode status: (used addresses, cooling addresses).
pub async fn node_a_status(admin: &kube::Client) -> (Vec<String>, Vec<String>) {
    let nodes: Api<tidepool_api::IPAMNode> = Api::all(admin.clone());
    let n = nodes.get("node-a").await.expect("node-a");
    let st = n.status.unwrap_or_default();
    (
        st.used.keys().cloned().collect(),
        st.cooldown.keys().cloned().collect(),
    )
}
