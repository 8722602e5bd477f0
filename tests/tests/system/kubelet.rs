//! The harness's stand-ins for the scheduler and for each node's kubelet (issue 16), one
//! loop over the pods of every namespace:
//! - the scheduler binds a pod without `spec.nodeName` to the live node with the fewest
//!   pods (a Binding, as kube-scheduler writes it);
//! - the kubelet of a pod's node creates its sandbox — a network namespace, the CNI ADD
//!   through ptp in the node's namespace, libcni's cache entry — and writes phase Running
//!   and podIPs through the status subresource; a failed ADD is torn down (DEL, as
//!   containerd does after a failed RunPodSandbox) and retried after [`Backoff`];
//! - a terminating pod gets its DEL, its cache entry and namespace removed, then is
//!   deleted with grace 0 (the server's own simulated kubelet is off);
//! - a pod bound to a node that is gone is deleted with grace 0 (the pod GC's part).
//!
//! [`Kubelet::crash_pod`] removes a sandbox's namespace and sends no DEL.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::chain::{CniCall, Namespaces, exec_plugin};
use super::e2e::{CNI_BIN, NETNS_DIR, NETWORK, NodeRuntime};

/// When a failed sandbox is tried again: `first`, doubling, at most `cap`. The kubelet's
/// pod worker re-queues a pod whose sync failed after `backOffPeriod` (10 s, jitter 0.5);
/// a short run scales that down.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub first: Duration,
    pub cap: Duration,
}

impl Backoff {
    pub fn after(&self, failures: u32) -> Duration {
        let d = self.first.saturating_mul(1 << failures.min(16));
        d.min(self.cap)
    }
}

/// A pod's sandbox as its kubelet knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sandbox {
    /// ADD running or waiting to be retried.
    Starting,
    Running {
        node: String,
        netns: String,
        container: String,
        addr: String,
    },
    /// DEL and removal under way.
    Stopping,
    /// Its namespace removed without a DEL ([`Kubelet::crash_pod`]).
    Crashed { node: String, addr: String },
    /// Lost by the runtime, namespace and cache entry both ([`Kubelet::lose_sandbox`]):
    /// the kubelet starts a new sandbox for the pod.
    Lost,
}

/// What the run saw, for the judge and the report.
#[derive(Debug, Default)]
pub struct Record {
    /// Pod UID → its sandbox.
    pub sandboxes: BTreeMap<String, Sandbox>,
    /// Pod UID → name.
    pub names: BTreeMap<String, String>,
    /// Pod UID → its namespace.
    pub namespaces: BTreeMap<String, String>,
    /// Bound (seen bound by its kubelet) → Running with an address, per started pod.
    pub ready_latency: Vec<Duration>,
    /// Every sandbox started: (pod UID, address, when its ADD returned).
    pub started: Vec<(String, String, Instant)>,
    /// ADDs that failed (and were retried).
    pub failed_adds: usize,
    /// Pods bound by the scheduler stand-in, per node.
    pub bound: BTreeMap<String, usize>,
    /// Pods that went through DEL and were removed: UID → (node, when the DEL returned).
    pub deleted: BTreeMap<String, (String, Instant)>,
    /// Sandboxes lost by the runtime: (address, pod UID).
    pub lost: Vec<(String, String)>,
    /// Errors of the kubelet's own steps (not the system's): fail the run.
    pub errors: Vec<String>,
}

/// A pod as its sandbox's CNI calls name it (`CNI_ARGS`).
#[derive(Debug, Clone)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

struct Inner {
    admin: kube::Client,
    nodes: Mutex<BTreeMap<String, NodeRuntime>>,
    ns: Arc<Namespaces>,
    tag: String,
    backoff: Backoff,
    record: Mutex<Record>,
    seq: Mutex<usize>,
}

/// The scheduler's and the kubelets' loop, stopped when dropped.
pub struct Kubelet {
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Kubelet {
    pub fn start(
        admin: kube::Client,
        nodes: Vec<NodeRuntime>,
        ns: Arc<Namespaces>,
        tag: &str,
        backoff: Backoff,
    ) -> Kubelet {
        let inner = Arc::new(Inner {
            admin,
            nodes: Mutex::new(nodes.into_iter().map(|n| (n.name.clone(), n)).collect()),
            ns,
            tag: tag.to_string(),
            backoff,
            record: Mutex::new(Record::default()),
            seq: Mutex::new(0),
        });
        let task = tokio::spawn(run(inner.clone()));
        Kubelet { inner, task }
    }

    /// Reads the record.
    pub fn record<T>(&self, f: impl FnOnce(&Record) -> T) -> T {
        f(&self.inner.record.lock().expect("lock"))
    }

    /// Adds a node the scheduler may bind to.
    pub fn add_node(&self, rt: NodeRuntime) {
        self.inner
            .nodes
            .lock()
            .expect("lock")
            .insert(rt.name.clone(), rt);
    }

    /// (address, pod UID) of the pods deleted on node `name` (through DEL).
    pub fn deleted_on(&self, name: &str) -> BTreeSet<(String, String)> {
        self.record(|r| {
            r.started
                .iter()
                .filter(|(uid, ..)| r.deleted.get(uid).is_some_and(|(n, _)| n == name))
                .map(|(uid, addr, _)| (addr.clone(), uid.clone()))
                .collect()
        })
    }

    /// Node `name` is gone (crashed): it is forgotten, so its pods are deleted with grace
    /// 0 from then on (the pod GC), and its running sandboxes' namespaces go without a DEL.
    /// Returns their (address, pod UID).
    pub fn crash_node(&self, name: &str) -> BTreeSet<(String, String)> {
        self.inner.nodes.lock().expect("lock").remove(name);
        let mut rec = self.inner.record.lock().expect("lock");
        let mut gone = BTreeSet::new();
        for (uid, sb) in rec.sandboxes.iter_mut() {
            if let Sandbox::Running {
                node, netns, addr, ..
            } = sb.clone()
                && node == name
            {
                del_netns(&netns);
                gone.insert((addr.clone(), uid.clone()));
                *sb = Sandbox::Crashed { node, addr };
            }
        }
        gone
    }

    /// Crashes the running pod with UID `uid`: its namespace removed, no DEL (libcni's
    /// cache entry stays, as after a runtime that lost the sandbox). Returns its address.
    pub fn crash_pod(&self, uid: &str) -> String {
        let mut rec = self.inner.record.lock().expect("lock");
        let sb = rec.sandboxes.get_mut(uid).expect("a known pod");
        let Sandbox::Running {
            node, netns, addr, ..
        } = sb.clone()
        else {
            panic!("pod {uid} is not running: {sb:?}");
        };
        del_netns(&netns);
        *sb = Sandbox::Crashed {
            node,
            addr: addr.clone(),
        };
        addr
    }

    /// The runtime loses the running pod `uid`'s sandbox: its namespace and libcni's cache
    /// entry gone, no DEL (containerd#5768). The kubelet then starts a new sandbox with a
    /// new address; the old allocation is the agent's reconcile's (or the operator's
    /// `SandboxReplaced` tombstone's) to free. Returns the lost address.
    pub fn lose_sandbox(&self, uid: &str) -> String {
        let mut rec = self.inner.record.lock().expect("lock");
        let sb = rec.sandboxes.get_mut(uid).expect("a known pod");
        let Sandbox::Running {
            node,
            netns,
            container,
            addr,
        } = sb.clone()
        else {
            panic!("pod {uid} is not running: {sb:?}");
        };
        del_netns(&netns);
        let rt = self.inner.nodes.lock().expect("lock")[&node].clone();
        remove_cache(&rt, &container);
        *sb = Sandbox::Lost;
        rec.lost.push((addr.clone(), uid.to_string()));
        addr
    }

    /// The running sandboxes: (node, pod namespace, address).
    pub fn sandboxes(&self) -> Vec<(String, String, String)> {
        self.record(|r| {
            r.sandboxes
                .values()
                .filter_map(|s| match s {
                    Sandbox::Running {
                        node, netns, addr, ..
                    } => Some((node.clone(), netns.clone(), addr.clone())),
                    _ => None,
                })
                .collect()
        })
    }

    /// Whether every pod that exists runs and none is terminating.
    pub async fn settled(&self) -> bool {
        let pods: Api<Pod> = Api::all(self.inner.admin.clone());
        let Ok(list) = pods.list(&ListParams::default()).await else {
            return false;
        };
        list.items.iter().all(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
    }
}

async fn run(inner: Arc<Inner>) {
    loop {
        if let Err(e) = step(&inner).await {
            // the API server answers the admin always; a failure here is the harness's
            inner.record.lock().expect("lock").errors.push(e);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One pass over the pods.
async fn step(inner: &Arc<Inner>) -> Result<(), String> {
    let list = Api::<Pod>::all(inner.admin.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list pods: {e}"))?;
    let mut load: BTreeMap<String, usize> = inner
        .nodes
        .lock()
        .expect("lock")
        .keys()
        .map(|n| (n.clone(), 0))
        .collect();
    for p in &list.items {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.as_ref()) {
            load.entry(n.clone()).and_modify(|c| *c += 1);
        }
    }
    for p in list.items {
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let name = p.metadata.name.clone().unwrap_or_default();
        let namespace = p.metadata.namespace.clone().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(inner.admin.clone(), &namespace);
        let pod = PodRef {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: uid.clone(),
        };
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let terminating = p.metadata.deletion_timestamp.is_some();
        let known = inner
            .record
            .lock()
            .expect("lock")
            .sandboxes
            .get(&uid)
            .cloned();
        let rt = node
            .as_ref()
            .and_then(|n| inner.nodes.lock().expect("lock").get(n).cloned());
        match (node, rt, known, terminating) {
            (None, _, _, false) => {
                let Some(target) = least_loaded(&load) else {
                    continue;
                };
                *load.get_mut(&target).expect("a node") += 1;
                bind(&pods, &name, &target).await?;
                *inner
                    .record
                    .lock()
                    .expect("lock")
                    .bound
                    .entry(target)
                    .or_default() += 1;
            }
            // bound to a node that is gone: the pod GC's force delete
            (Some(_), None, _, _) => force_delete(&pods, &name, &uid).await?,
            (Some(_), Some(rt), None | Some(Sandbox::Lost), false) => {
                let mut rec = inner.record.lock().expect("lock");
                rec.sandboxes.insert(uid.clone(), Sandbox::Starting);
                rec.names.insert(uid.clone(), name.clone());
                rec.namespaces.insert(uid.clone(), namespace);
                drop(rec);
                tokio::spawn(start(inner.clone(), rt, pod));
            }
            (Some(_), Some(rt), Some(Sandbox::Running { .. }), true) => {
                let sb = std::mem::replace(
                    inner
                        .record
                        .lock()
                        .expect("lock")
                        .sandboxes
                        .get_mut(&uid)
                        .expect("known"),
                    Sandbox::Stopping,
                );
                tokio::spawn(stop(inner.clone(), rt, pod, sb));
            }
            (Some(_), Some(_), None | Some(Sandbox::Lost), true) => {
                force_delete(&pods, &name, &uid).await?
            }
            // Starting: its start task sees the deletion; Stopping, Crashed: nothing to do
            _ => {}
        }
    }
    Ok(())
}

fn least_loaded(load: &BTreeMap<String, usize>) -> Option<String> {
    load.iter().min_by_key(|(_, c)| **c).map(|(n, _)| n.clone())
}

/// The scheduler's write: a Binding through `pods/NAME/binding`.
async fn bind(pods: &Api<Pod>, name: &str, node: &str) -> Result<(), String> {
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    pods.create_subresource::<_, serde_json::Value>(
        "binding",
        name,
        &PostParams::default(),
        &binding,
    )
    .await
    .map(|_| ())
    .or_else(|e| gone_is_fine(e, name))
}

async fn force_delete(pods: &Api<Pod>, name: &str, uid: &str) -> Result<(), String> {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    pods.delete(name, &dp)
        .await
        .map(|_| ())
        .or_else(|e| gone_is_fine(e, name))
}

/// A pod deleted meanwhile (404) or replaced (409 on the UID precondition) is no error.
fn gone_is_fine(e: kube::Error, name: &str) -> Result<(), String> {
    match &e {
        kube::Error::Api(s) if s.code == 404 || s.code == 409 => Ok(()),
        _ => Err(format!("pod {name}: {e}")),
    }
}

/// The sandbox's start: ADD until it succeeds (or the pod is deleted), then the status.
async fn start(inner: Arc<Inner>, rt: NodeRuntime, pod: PodRef) {
    let began = Instant::now();
    let pods: Api<Pod> = Api::namespaced(inner.admin.clone(), &pod.namespace);
    let (name, uid) = (pod.name.clone(), pod.uid.clone());
    let seq = {
        let mut s = inner.seq.lock().expect("lock");
        *s += 1;
        *s
    };
    let netns = format!("tpe-{}-p{seq}", inner.tag);
    inner.ns.add(&netns);
    let mut failures = 0u32;
    loop {
        let container = format!("c{seq:05}a{failures}{}", uid.replace('-', ""));
        let out = cni(&rt, "ADD", &netns, &container, &pod).await;
        if out.status.success() {
            let added = Instant::now();
            let addr = super::chain::address(&out);
            write_cache(&rt, &container, &out.stdout);
            if let Err(e) = set_running(&pods, &name, &addr).await {
                // deleted meanwhile: the loop sees it gone; tear down now
                let _ = cni(&rt, "DEL", &netns, &container, &pod).await;
                remove_cache(&rt, &container);
                del_netns(&netns);
                let mut rec = inner.record.lock().expect("lock");
                rec.sandboxes.insert(uid.clone(), Sandbox::Stopping);
                if !e.is_empty() {
                    rec.errors.push(e);
                }
                return;
            }
            let mut rec = inner.record.lock().expect("lock");
            rec.ready_latency.push(began.elapsed());
            rec.started.push((uid.clone(), addr.clone(), added));
            rec.sandboxes.insert(
                uid.clone(),
                Sandbox::Running {
                    node: rt.name.clone(),
                    netns,
                    container,
                    addr,
                },
            );
            return;
        }
        // containerd tears a failed sandbox down with DEL before it reports the failure
        let _ = cni(&rt, "DEL", &netns, &container, &pod).await;
        inner.record.lock().expect("lock").failed_adds += 1;
        tokio::time::sleep(inner.backoff.after(failures)).await;
        failures += 1;
        let gone = match pods.get_opt(&name).await {
            Ok(p) => p.is_none_or(|p| {
                p.metadata.deletion_timestamp.is_some()
                    || p.metadata.uid.as_deref() != Some(uid.as_str())
            }),
            Err(_) => false,
        };
        if gone {
            del_netns(&netns);
            inner
                .record
                .lock()
                .expect("lock")
                .sandboxes
                .insert(uid.clone(), Sandbox::Stopping);
            let _ = force_delete(&pods, &name, &uid).await;
            return;
        }
    }
}

/// The status a kubelet writes once the sandbox runs; `Err("")` when the pod is gone.
async fn set_running(pods: &Api<Pod>, name: &str, addr: &str) -> Result<(), String> {
    let status = json!({"status": {
        "phase": "Running",
        "podIP": addr,
        "podIPs": [{"ip": addr}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }});
    match pods
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(String::new()),
        Err(e) => Err(format!("pod {name}'s status: {e}")),
    }
}

/// A terminating pod: DEL, the cache entry and namespace removed, then grace 0.
async fn stop(inner: Arc<Inner>, rt: NodeRuntime, pod: PodRef, sb: Sandbox) {
    let Sandbox::Running {
        netns, container, ..
    } = sb
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(inner.admin.clone(), &pod.namespace);
    let (name, uid) = (pod.name.clone(), pod.uid.clone());
    let out = cni(&rt, "DEL", &netns, &container, &pod).await;
    let done = Instant::now();
    let mut errors = Vec::new();
    if !out.status.success() {
        errors.push(format!(
            "DEL of {name} failed: {}",
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    remove_cache(&rt, &container);
    del_netns(&netns);
    if let Err(e) = force_delete(&pods, &name, &uid).await {
        errors.push(e);
    }
    let mut rec = inner.record.lock().expect("lock");
    rec.deleted.insert(uid, (rt.name.clone(), done));
    rec.errors.extend(errors);
}

fn del_netns(name: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stderr(Stdio::null())
        .status();
}

/// libcni's cache entry of an ADD that succeeded (what the agent's reconcile reads).
fn write_cache(rt: &NodeRuntime, container: &str, result: &[u8]) {
    let result: serde_json::Value = serde_json::from_slice(result).expect("a CNI result");
    let entry = json!({
        "kind": "cniCacheV1", "containerId": container, "ifName": "eth0",
        "networkName": NETWORK, "config": rt.conf(), "result": result,
    });
    std::fs::write(cache_path(rt, container), entry.to_string()).expect("the cache entry");
}

fn remove_cache(rt: &NodeRuntime, container: &str) {
    let _ = std::fs::remove_file(cache_path(rt, container));
}

fn cache_path(rt: &NodeRuntime, container: &str) -> std::path::PathBuf {
    rt.cni_cache().join(format!("{NETWORK}-{container}-eth0"))
}

/// One CNI call of ptp in node `rt`'s namespace, as its runtime runs it.
pub async fn cni(
    rt: &NodeRuntime,
    cmd: &str,
    pod_ns: &str,
    container: &str,
    pod: &PodRef,
) -> Output {
    let plugin_dir = Path::new(CNI_BIN).parent().expect("the plugin's directory");
    let call = CniCall {
        cmd,
        netns: &format!("{NETNS_DIR}/{pod_ns}"),
        container,
        namespace: &pod.namespace,
        pod: &pod.name,
        uid: &pod.uid,
    };
    exec_plugin(&rt.netns, "ptp", &call, plugin_dir, rt.conf()).await
}
