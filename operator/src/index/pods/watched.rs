//! The Pod as the operator's watch reads it: only the fields [`super::project`] reads.
//!
//! A relist from the watch cache (`resourceVersion=0`) is one response of every pod, and
//! kube holds the whole list while its items are handed on. As `k8s_openapi`'s `Pod` a
//! pod takes ~4 KB of memory (every field of `PodSpec` and `Container` is there, set or
//! not, and `managedFields` is kept whole); 150,000 of them were 1.3 GB at the relist's
//! peak, and the memory freed after it stayed with the process (the allocator's arenas,
//! fragmented by the index's own records made in between). Serde skips every field this
//! type does not name, so the relist holds a few hundred bytes per pod instead.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodIP, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::watcher::Event;
use serde::{Deserialize, Deserializer};

/// A Pod with the metadata, spec and status fields the pod index projects, read from the
/// same JSON as a Pod.
#[derive(Clone, Debug, Deserialize)]
pub struct WatchedPod {
    #[serde(deserialize_with = "metadata")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<Spec>,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    node_name: Option<String>,
    host_network: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Option<Vec<PodIP>>,
    conditions: Option<Vec<PodCondition>>,
}

/// `metadata` without what the index never reads (managedFields above all, often the
/// largest part of a pod).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

fn metadata<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = Meta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        deletion_timestamp: m.deletion_timestamp,
        labels: m.labels,
        annotations: m.annotations,
        ..ObjectMeta::default()
    })
}

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl From<&WatchedPod> for Pod {
    fn from(w: &WatchedPod) -> Pod {
        let spec = w.spec.clone().unwrap_or_default();
        Pod {
            metadata: w.metadata.clone(),
            spec: w.spec.is_some().then(|| PodSpec {
                node_name: spec.node_name,
                host_network: spec.host_network,
                ..PodSpec::default()
            }),
            status: w.status.clone().map(|s| PodStatus {
                phase: s.phase,
                pod_ip: s.pod_ip,
                pod_ips: s.pod_ips,
                conditions: s.conditions,
                ..PodStatus::default()
            }),
        }
    }
}

/// The event with its pod as a [`Pod`] (for [`super::PodIndex::apply`]); one pod at a time.
pub fn to_pod_event(ev: &Event<WatchedPod>) -> Event<Pod> {
    match ev {
        Event::Apply(p) => Event::Apply(p.into()),
        Event::Delete(p) => Event::Delete(p.into()),
        Event::Init => Event::Init,
        Event::InitApply(p) => Event::InitApply(p.into()),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::super::project::{pod_uid, project};
    use super::*;
    use tidepool_ipam::NodeName;

    /// A production-shaped pod (managedFields, owner, probes, volumes, conditions) in the
    /// given phase, with the given addresses, on `node-a`.
    fn pod_json(uid: &str, phase: &str, ips: &[&str], host: bool) -> String {
        let mut v: serde_json::Value = serde_json::from_str(
            &include_str!("../../../tests/pod_template.json")
                .replace("@NAME@", "checkout-api-7d9f8b6c5d-x2x7q")
                .replace("@UID@", uid),
        )
        .expect("the template");
        v["spec"]["nodeName"] = "node-a".into();
        v["spec"]["hostNetwork"] = host.into();
        v["status"]["phase"] = phase.into();
        v["status"]["podIPs"] = ips.iter().map(|ip| serde_json::json!({"ip": ip})).collect();
        v["status"]["podIP"] = ips.first().copied().into();
        v.to_string()
    }

    /// The index's record of a pod read whole and of the same pod read through the watched
    /// fields are equal, for each phase, address set and network mode, as an agent's pod
    /// (its labels match the selector: readiness read from the conditions) or not.
    #[test]
    fn a_pod_read_through_the_watched_fields_projects_as_the_whole_pod() {
        let cases = [
            ("Pending", &[][..], false),
            ("Running", &["10.0.0.7", "fd00::7"][..], false),
            ("Succeeded", &["10.0.0.8"][..], false),
            ("Running", &[][..], true),
        ];
        let agents: crate::index::LabelSelector = "app.kubernetes.io/name=checkout-api"
            .parse()
            .expect("a selector");
        let others: crate::index::LabelSelector = "app=none".parse().expect("a selector");
        for (i, (phase, ips, host)) in cases.into_iter().enumerate() {
            let json = pod_json(
                &format!("00000000-0000-4000-8000-00000000000{i}"),
                phase,
                ips,
                host,
            );
            let whole: Pod = serde_json::from_str(&json).expect("a Pod");
            let watched: WatchedPod = serde_json::from_str(&json).expect("a WatchedPod");
            assert!(
                whole.metadata.managed_fields.is_some(),
                "the template has them"
            );
            assert!(watched.metadata.managed_fields.is_none(), "not kept");
            let Event::Apply(cut) = to_pod_event(&Event::Apply(watched)) else {
                panic!("an Apply stays an Apply");
            };
            let uid = pod_uid(&whole).expect("a UID");
            assert_eq!(pod_uid(&cut), Some(uid));
            for selector in [&agents, &others] {
                let node = NodeName::from("node-a");
                let a = project(&whole, uid, node.clone(), Some(selector));
                let b = project(&cut, uid, node, Some(selector));
                assert_eq!(a, b, "{phase} {ips:?} host network {host}");
            }
            assert_eq!(
                cut.metadata.resource_version,
                whole.metadata.resource_version
            );
        }
    }
}
