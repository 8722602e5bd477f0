//! The deletes of a resource request: their options (body and query), their answer, and
//! what the server's controllers do afterwards to an object left terminating.

use std::collections::HashMap;
use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};

use super::verbs::Call;
use super::{Body, json_response, record_write, success_status};
use crate::admission_policy::Admission;
use crate::error::Error;
use crate::media;
use crate::registry::ResType;
use crate::server::State;
use crate::store::DeleteOpts;

/// `delete` and `deletecollection`.
pub(super) fn serve(
    c: &Call<'_>,
    admission: Option<Admission>,
    ns: String,
    name: &str,
) -> Result<Response<Body>, Error> {
    let (st, rt) = (c.st, &c.t.rt);
    let b = media::parse_body(c.body, c.ctype)?;
    let d = options(st, c.q, &b, admission);
    if c.verb == "deletecollection" {
        st.store
            .delete_collection(rt, c.t.ns.as_deref(), &c.selector()?, &d)?;
        return Ok(json_response(200, &success_status(), &[]));
    }
    let w = st.store.delete(rt, &ns, name, &d)?;
    record_write(st, c.t, c.verb, c.who, &w.obj, d.dry_run);
    if !d.dry_run && w.obj.pointer("/metadata/deletionTimestamp").is_some() {
        finish_later(st, rt, ns, name, &w.obj);
    }
    if rt.crd
        && w.obj
            .pointer("/metadata/finalizers")
            .is_none_or(is_empty_list)
    {
        return Ok(json_response(w.code, &deleted_status(rt, &w.obj), &[]));
    }
    Ok(json_response(w.code, &w.obj, &[]))
}

/// The DeleteOptions of the body, else of the query.
fn options(
    st: &State,
    q: &HashMap<String, String>,
    b: &Value,
    admission: Option<Admission>,
) -> DeleteOpts {
    let dry = q.get("dryRun").is_some_and(|d| d == "All")
        || b.get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "All"));
    let text = |p: &str| b.pointer(p).and_then(Value::as_str).map(String::from);
    DeleteOpts {
        admission,
        uid: text("/preconditions/uid"),
        rv: text("/preconditions/resourceVersion"),
        propagation: text("/propagationPolicy").or_else(|| q.get("propagationPolicy").cloned()),
        dry_run: dry,
        grace: b
            .get("gracePeriodSeconds")
            .and_then(Value::as_i64)
            .or_else(|| q.get("gracePeriodSeconds").and_then(|g| g.parse().ok())),
        orphan_dependents: b
            .get("orphanDependents")
            .and_then(Value::as_bool)
            .or_else(|| q.get("orphanDependents").map(|o| o == "true")),
        crd_finalizer: st.config.crd_cleanup_interval.is_some(),
    }
}

/// What finishes a delete that left `obj` terminating, later, as the real cluster's
/// controllers do: the CRD finalizer removes a CRD's objects, the namespace controller
/// finalizes a namespace, the kubelet removes a pod once its grace period is over.
fn finish_later(st: &Arc<State>, rt: &Arc<ResType>, ns: String, name: &str, obj: &Value) {
    let (st, name) = (st.clone(), name.to_string());
    let core = rt.group.is_empty();
    match rt.kind.as_str() {
        "CustomResourceDefinition" => {
            if let Some(every) = st.config.crd_cleanup_interval {
                tokio::spawn(async move {
                    while !st.store.crd_cleanup_step(&name) {
                        tokio::time::sleep(every).await;
                    }
                });
            }
        }
        "Namespace" if core => {
            tokio::spawn(async move {
                tokio::time::sleep(st.config.namespace_finalize_delay).await;
                st.store.finalize_namespace(&name);
            });
        }
        "Pod" if core => {
            let grace = obj
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if let Some(delay) = st.config.kubelet_delay
                && grace > 0
            {
                let rt = rt.clone();
                let uid = obj
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    st.store.kubelet_delete(&rt, &ns, &name, &uid);
                });
            }
        }
        _ => {}
    }
}

/// What a delete that removed a custom resource answers: the custom-resource store has no
/// `ReturnDeletedObject`, so `finalizeDelete` answers a `Status` naming it
/// (kubernetes/apiserver pkg/registry/generic/registry/store.go; kubernetes/apiextensions-apiserver
/// pkg/registry/customresource/etcd.go).
fn deleted_status(rt: &ResType, obj: &Value) -> Value {
    let md = |k: &str| obj.pointer(&format!("/metadata/{k}")).cloned();
    let mut s = success_status();
    s["details"] =
        json!({"name": md("name"), "group": rt.group, "kind": rt.plural, "uid": md("uid")});
    s
}

fn is_empty_list(v: &Value) -> bool {
    v.as_array().is_some_and(Vec::is_empty)
}
