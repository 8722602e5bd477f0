//! The harness's stand-in for the Deployment and ReplicaSet controllers (issue 16): the
//! in-process server stores apps/v1 Deployments but runs no controllers. One loop over the
//! Deployments of namespace `default`, ReplicaSet-like with the ReplicaSet layer left out
//! (pods are owned by the Deployment itself):
//! - fewer live pods (owned, not terminating) than `spec.replicas`: pods from the template,
//!   named `<deployment>-<suffix>` (`generateName`, as a ReplicaSet names its pods), owned
//!   by the Deployment (a controller `ownerReference`); the scheduler stand-in binds them;
//! - more: the surplus deleted gracefully — not yet running first, then the newest, as the
//!   ReplicaSet controller ranks them — so the kubelet stand-in runs their DEL;
//! - the Deployment's `status` written when its counts changed (`kubectl get deploy`).
//!
//! A deleted Deployment's pods are not this loop's: the in-process server collects garbage
//! itself (a dependent goes, gracefully for a bound pod, once all its owners are gone), as
//! Kubernetes' garbage collector deletes a Deployment's ReplicaSet and then its pods.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;

/// What the controller did, for the report.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Pods created, per Deployment.
    pub created: BTreeMap<String, usize>,
    /// Surplus pods deleted, per Deployment.
    pub scaled_down: BTreeMap<String, usize>,
    /// Errors of its own steps (not the system's): fail the run.
    pub errors: Vec<String>,
}

/// The controller's loop, stopped when dropped.
pub struct Deployments {
    tally: Arc<Mutex<Tally>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Deployments {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Deployments {
    pub fn start(admin: kube::Client) -> Deployments {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let t = tally.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = step(&admin, &t).await {
                    t.lock().expect("lock").errors.push(e);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Deployments { tally, task }
    }

    pub fn tally(&self) -> Tally {
        self.tally.lock().expect("lock").clone()
    }
}

/// One pass over the Deployments.
async fn step(admin: &kube::Client, tally: &Mutex<Tally>) -> Result<(), String> {
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let all = deployments
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list deployments: {e}"))?;
    let list = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list pods: {e}"))?;
    for d in all
        .items
        .iter()
        .filter(|d| d.metadata.deletion_timestamp.is_none())
    {
        let uid = d.metadata.uid.clone().unwrap_or_default();
        let name = d.metadata.name.clone().unwrap_or_default();
        let owned: Vec<&Pod> = list.items.iter().filter(|p| owned_by(p, &uid)).collect();
        let mut live: Vec<&Pod> = owned
            .iter()
            .copied()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0) as usize;
        for _ in live.len()..want {
            pods.create(&PostParams::default(), &pod_for(d)?)
                .await
                .map_err(|e| format!("create a pod of {name}: {e}"))?;
            *tally
                .lock()
                .expect("lock")
                .created
                .entry(name.clone())
                .or_default() += 1;
        }
        if live.len() > want {
            // not running first, then the newest (ReplicaSet's ActivePodsWithRanks)
            live.sort_by_key(|p| {
                (
                    running(p),
                    Reverse(p.metadata.creation_timestamp.clone()),
                    p.metadata.name.clone(),
                )
            });
            for p in &live[..live.len() - want] {
                delete(&pods, p).await?;
                *tally
                    .lock()
                    .expect("lock")
                    .scaled_down
                    .entry(name.clone())
                    .or_default() += 1;
            }
        }
        write_status(&deployments, d, &owned).await?;
    }
    Ok(())
}

fn owned_by(p: &Pod, uid: &str) -> bool {
    p.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == uid && r.controller == Some(true))
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// A pod of Deployment `d`'s template, owned by it.
fn pod_for(d: &Deployment) -> Result<Pod, String> {
    let name = d.metadata.name.clone().unwrap_or_default();
    let template = d
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .ok_or_else(|| format!("deployment {name} has no spec"))?;
    let labels = template.metadata.and_then(|m| m.labels).unwrap_or_default();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": format!("{name}-"),
            "namespace": "default",
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                "uid": d.metadata.uid, "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": template.spec,
    }))
    .map_err(|e| format!("a pod of {name}: {e}"))
}

/// A graceful delete (the pod's grace period), on the pod's UID.
async fn delete(pods: &Api<Pod>, p: &Pod) -> Result<(), String> {
    let name = p.metadata.name.clone().unwrap_or_default();
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: p.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pods.delete(&name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(format!("delete pod {name}: {e}")),
    }
}

/// The Deployment's status from its pods, written when it changed.
async fn write_status(
    deployments: &Api<Deployment>,
    d: &Deployment,
    owned: &[&Pod],
) -> Result<(), String> {
    let ready = owned
        .iter()
        .filter(|p| running(p) && p.metadata.deletion_timestamp.is_none())
        .count() as i32;
    let status = json!({
        "observedGeneration": d.metadata.generation,
        "replicas": owned.len() as i32,
        "updatedReplicas": owned.len() as i32,
        "readyReplicas": ready,
        "availableReplicas": ready,
    });
    let current = serde_json::to_value(&d.status).unwrap_or_default();
    let same = ["observedGeneration", "replicas", "readyReplicas"]
        .iter()
        .all(|k| current.get(k).unwrap_or(&json!(0)) == &status[k]);
    if same {
        return Ok(());
    }
    let name = d.metadata.name.clone().unwrap_or_default();
    match deployments
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(format!("deployment {name}'s status: {e}")),
    }
}
