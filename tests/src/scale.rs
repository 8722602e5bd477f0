//! The `scale` subresource of Deployments (`deployments/scale`, an `autoscaling/v1` Scale),
//! as the real server's `ScaleREST` serves it: GET shows the Deployment's replicas and
//! selector; PUT and PATCH change `spec.replicas` of the Deployment alone, with the Scale's
//! resourceVersion (if any) as the precondition. `kubectl scale` PATCHes it with a merge
//! patch (a PUT when given `--current-replicas` or `--resource-version`).
//!
//! Not served: server-side apply to the subresource (the real server takes it; 415 here), and
//! admission policies see the Deployment, not the Scale.

use serde_json::{Value, json};

use crate::error::Error;
use crate::registry::ResType;
use crate::store::{Store, WriteOpts, Written};

/// How often a PATCH without a resourceVersion is retried when the Deployment changed
/// between its read and its write (the real patcher retries on conflict too).
const PATCH_RETRIES: usize = 5;

/// Whether `rt` has a `scale` subresource here (the real server also has it on
/// ReplicaSets, StatefulSets and ReplicationControllers, which are not served).
pub(crate) fn has_scale(rt: &ResType) -> bool {
    rt.group == "apps" && rt.kind == "Deployment"
}

/// The discovery entry of `rt`'s scale subresource.
pub(crate) fn discovery(rt: &ResType) -> Value {
    json!({
        "name": format!("{}/scale", rt.plural), "singularName": "", "namespaced": rt.namespaced,
        "group": "autoscaling", "version": "v1", "kind": "Scale",
        "verbs": ["get", "patch", "update"],
    })
}

/// The Scale of Deployment `d` (`scaleFromDeployment`).
pub(crate) fn of(d: &Value) -> Value {
    let md = |k: &str| d.pointer(&format!("/metadata/{k}")).cloned();
    let mut meta = serde_json::Map::new();
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = md(k) {
            meta.insert(k.into(), v);
        }
    }
    let mut status = json!({
        "replicas": d.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
    });
    let selector = selector_string(d.pointer("/spec/selector").unwrap_or(&Value::Null));
    if !selector.is_empty() {
        status["selector"] = json!(selector);
    }
    let mut spec = json!({});
    if let Some(r) = d
        .pointer("/spec/replicas")
        .filter(|r| r.as_i64() != Some(0))
    {
        spec["replicas"] = r.clone();
    }
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": meta, "spec": spec, "status": status,
    })
}

/// A label selector as `LabelSelectorAsSelector(...).String()` writes it: requirements
/// sorted by key, joined by commas.
fn selector_string(sel: &Value) -> String {
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            reqs.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))));
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or("");
        let mut values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        values.sort_unstable();
        let r = match e.get("operator").and_then(Value::as_str).unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            _ => format!("!{key}"),
        };
        reqs.push((key.to_string(), r));
    }
    reqs.sort();
    reqs.into_iter()
        .map(|(_, r)| r)
        .collect::<Vec<_>>()
        .join(",")
}

/// GET of the scale of `rt` `ns/name`.
pub(crate) fn get(store: &Store, rt: &ResType, ns: &str, name: &str) -> Result<Value, Error> {
    let d = store.get(rt, ns, name)?;
    Ok(of(&d))
}

/// PUT of a Scale: the Deployment's `spec.replicas` set from it.
pub(crate) fn update(
    store: &Store,
    rt: &ResType,
    ns: &str,
    name: &str,
    scale: &Value,
    o: &WriteOpts,
) -> Result<Written, Error> {
    let body_name = scale
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !body_name.is_empty() && body_name != name {
        return Err(Error::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    write(store, rt, ns, name, scale, o)
}

/// PATCH of the Scale (merge, JSON or strategic: a Scale has no lists, so strategic is a
/// merge); retried on a conflict unless the patch carries its own resourceVersion.
pub(crate) fn patch(
    store: &Store,
    rt: &ResType,
    ns: &str,
    name: &str,
    ptype: &str,
    body: &Value,
    o: &WriteOpts,
) -> Result<Written, Error> {
    if ptype == "apply" {
        return Err(Error::unsupported_media_type(&[
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ]));
    }
    let pinned = body.pointer("/metadata/resourceVersion").is_some();
    let mut tries = 0;
    loop {
        let mut scale = get(store, rt, ns, name)?;
        match ptype {
            "json" => crate::patch::json_patch(&mut scale, body)?,
            _ => crate::patch::merge_patch(&mut scale, body),
        }
        match write(store, rt, ns, name, &scale, o) {
            Err(e) if e.code() == 409 && !pinned && tries < PATCH_RETRIES => tries += 1,
            r => return r,
        }
    }
}

/// The write both take (`scaleUpdatedObjectInfo`): the Scale validated, then the
/// Deployment updated with its replicas, at the Scale's resourceVersion when it has one.
/// The answer is the Scale of the Deployment written.
fn write(
    store: &Store,
    rt: &ResType,
    ns: &str,
    name: &str,
    scale: &Value,
    o: &WriteOpts,
) -> Result<Written, Error> {
    let replicas = match scale.pointer("/spec/replicas") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_i64()
            .filter(|r| i32::try_from(*r).is_ok())
            .ok_or_else(|| {
                Error::bad_request(format!("spec.replicas: expected an int32, got {v}"))
            })?,
    };
    if replicas < 0 {
        return Err(Error::invalid(
            "autoscaling",
            "Scale",
            name,
            vec![(
                "spec.replicas".into(),
                format!("Invalid value: {replicas}: must be greater than or equal to 0"),
            )],
        ));
    }
    let mut d = (*store.get(rt, ns, name)?).clone();
    if let Some(rv) = scale
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|rv| !rv.is_empty())
    {
        d["metadata"]["resourceVersion"] = json!(rv);
    }
    d["spec"]["replicas"] = json!(replicas);
    let w = store.update(rt, ns, name, d, o)?;
    Ok(Written {
        obj: std::sync::Arc::new(of(&w.obj)),
        ..w
    })
}
