//! Decoding of built-in kinds through their typed (k8s-openapi) form, as the real server decodes
//! into Go structs: wrong JSON types are refused (400) and, with `fieldValidation=Strict`,
//! unknown fields too; otherwise unknown fields are dropped with a warning.

use k8s_openapi::api::{
    admissionregistration, apps, coordination, core, events, flowcontrol, networking, policy, rbac,
    scheduling,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn roundtrip<T: DeserializeOwned + Serialize>(v: &Value) -> Result<Value, serde_json::Error> {
    let t: T = serde_json::from_value(v.clone())?;
    serde_json::to_value(&t)
}

/// The object as the typed form keeps it, or the decoding error; `None` for unknown kinds.
pub(crate) fn decode(
    group: &str,
    kind: &str,
    v: &Value,
) -> Option<Result<Value, serde_json::Error>> {
    Some(match (group, kind) {
        ("", "Namespace") => roundtrip::<core::v1::Namespace>(v),
        ("", "Node") => roundtrip::<core::v1::Node>(v),
        ("", "Pod") => roundtrip::<core::v1::Pod>(v),
        ("", "Event") => roundtrip::<core::v1::Event>(v),
        ("", "ServiceAccount") => roundtrip::<core::v1::ServiceAccount>(v),
        ("", "Service") => roundtrip::<core::v1::Service>(v),
        ("", "ConfigMap") => roundtrip::<core::v1::ConfigMap>(v),
        ("", "Secret") => roundtrip::<core::v1::Secret>(v),
        ("", "ResourceQuota") => roundtrip::<core::v1::ResourceQuota>(v),
        ("flowcontrol.apiserver.k8s.io", "FlowSchema") => {
            roundtrip::<flowcontrol::v1::FlowSchema>(v)
        }
        ("events.k8s.io", "Event") => roundtrip::<events::v1::Event>(v),
        ("coordination.k8s.io", "Lease") => roundtrip::<coordination::v1::Lease>(v),
        ("apps", "Deployment") => roundtrip::<apps::v1::Deployment>(v),
        ("apps", "DaemonSet") => roundtrip::<apps::v1::DaemonSet>(v),
        ("networking.k8s.io", "NetworkPolicy") => roundtrip::<networking::v1::NetworkPolicy>(v),
        ("scheduling.k8s.io", "PriorityClass") => roundtrip::<scheduling::v1::PriorityClass>(v),
        ("rbac.authorization.k8s.io", "Role") => roundtrip::<rbac::v1::Role>(v),
        ("rbac.authorization.k8s.io", "RoleBinding") => roundtrip::<rbac::v1::RoleBinding>(v),
        ("rbac.authorization.k8s.io", "ClusterRole") => roundtrip::<rbac::v1::ClusterRole>(v),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            roundtrip::<rbac::v1::ClusterRoleBinding>(v)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => {
            roundtrip::<admissionregistration::v1::ValidatingAdmissionPolicy>(v)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => {
            roundtrip::<admissionregistration::v1::ValidatingAdmissionPolicyBinding>(v)
        }
        ("policy", "PodDisruptionBudget") => roundtrip::<policy::v1::PodDisruptionBudget>(v),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            roundtrip::<CustomResourceDefinition>(v)
        }
        _ => return None,
    })
}

/// Paths of fields present (non-null) in `input` but not kept by the typed form.
pub(crate) fn unknown_fields(input: &Value, kept: &Value, path: &str, out: &mut Vec<String>) {
    match (input, kept) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                if v.is_null() {
                    continue;
                }
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match b.get(k) {
                    None => out.push(p),
                    Some(kv) => unknown_fields(v, kv, &p, out),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                unknown_fields(x, y, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

enum Seg {
    Key(String),
    Index(usize),
}

fn segments(p: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    for part in p.split('.') {
        let mut it = part.split('[');
        if let Some(k) = it.next() {
            out.push(Seg::Key(k.to_string()));
        }
        for i in it {
            out.push(Seg::Index(
                i.trim_end_matches(']').parse().unwrap_or(usize::MAX),
            ));
        }
    }
    out
}

fn remove_at(v: &mut Value, segs: &[Seg]) {
    match segs {
        [] => {}
        [Seg::Key(k)] => {
            if let Some(m) = v.as_object_mut() {
                m.remove(k);
            }
        }
        [Seg::Key(k), rest @ ..] => {
            if let Some(next) = v.get_mut(k.as_str()) {
                remove_at(next, rest);
            }
        }
        [Seg::Index(i), rest @ ..] => {
            if let Some(next) = v.get_mut(*i) {
                remove_at(next, rest);
            }
        }
    }
}

/// Removes the fields at `paths` (as produced by [`unknown_fields`]).
pub(crate) fn remove_fields(v: &mut Value, paths: &[String]) {
    for p in paths {
        remove_at(v, &segments(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_and_removes_unknown_fields() {
        let input = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"replicas": 1, "bogus": 2, "selector": {}, "template": {"spec": {"containers": [{"name": "c", "imagex": "i"}]}}}});
        let kept = decode("apps", "Deployment", &input).unwrap().unwrap();
        let mut out = Vec::new();
        unknown_fields(&input, &kept, "", &mut out);
        assert_eq!(
            out,
            vec!["spec.bogus", "spec.template.spec.containers[0].imagex"]
        );
        let mut v = input.clone();
        remove_fields(&mut v, &out);
        assert!(v["spec"].get("bogus").is_none());
        assert!(
            v["spec"]["template"]["spec"]["containers"][0]
                .get("imagex")
                .is_none()
        );
        assert!(
            decode(
                "apps",
                "Deployment",
                &json!({"spec": {"replicas": "two", "selector": {}, "template": {}}})
            )
            .unwrap()
            .is_err()
        );
    }
}
