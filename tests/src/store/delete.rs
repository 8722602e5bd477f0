//! Deletion (k8s.io/apiserver pkg/registry/generic/registry/store.go `Delete`):
//! preconditions, graceful deletion of pods bound to a node, finalizers (the object stays,
//! terminating, until the last goes: see `update`), namespaces going Terminating and then
//! finalized, delete_collection.

use std::sync::Arc;

use serde_json::{Value, json};

use super::crd::CRD_GR;
use super::meta::{finalizers, meta, meta_mut, meta_str, now};
use super::objects::Stored;
use super::{DeleteOpts, Inner, Store, Written};
use crate::error::Error;
use crate::registry::ResType;
use crate::selector::Selector;

impl Store {
    pub(crate) fn delete(
        &self,
        rt: &ResType,
        ns: &str,
        name: &str,
        d: &DeleteOpts,
    ) -> Result<Written, Error> {
        let mut i = self.inner.lock();
        let old = Self::lookup(&i, rt, ns, name)?;
        self.delete_locked(&mut i, rt, &old, d)
    }

    pub(super) fn delete_locked(
        &self,
        i: &mut Inner,
        rt: &ResType,
        old: &Arc<Value>,
        d: &DeleteOpts,
    ) -> Result<Written, Error> {
        check_preconditions(rt, old, d)?;
        let mut warnings: Vec<String> = Vec::new();
        if let Some(a) = &d.admission {
            let (ns, name) = (meta_str(old, "namespace"), meta_str(old, "name"));
            warnings = a.check(
                "DELETE",
                rt,
                "",
                ns,
                name,
                None,
                Some(old),
                d.dry_run,
                &Stored(i),
            )?;
        }
        let answer = |obj, code| Written {
            obj: Self::present(rt, &obj),
            warnings: warnings.clone(),
            code,
        };
        if d.dry_run {
            return Ok(answer(old.clone(), 200));
        }
        let gr = rt.storage_gr();
        if rt.kind == "Pod" && rt.group.is_empty() && graceful(old, d).is_some() {
            return Ok(answer(self.mark_pod_terminating(i, &gr, old, d), 200));
        }
        match d.propagation.as_deref().unwrap_or("Background") {
            "Orphan" => self.orphan_dependents(i, meta_str(old, "uid")),
            "Foreground" => self.delete_dependents(i, meta_str(old, "uid")),
            _ => {}
        }
        if gr == CRD_GR && d.crd_finalizer {
            return Ok(self.mark_crd_deleting(i, rt, old, warnings.clone()));
        }
        if !finalizers(old).is_empty() {
            // 200 with the object: 202 only for `orphanDependents: false`
            // (kubernetes/apiserver pkg/endpoints/handlers/delete.go `DeleteResource`)
            let code = if d.orphan_dependents == Some(false) {
                202
            } else {
                200
            };
            return Ok(answer(self.mark_deleting(i, &gr, old), code));
        }
        if rt.kind == "Namespace" && rt.group.is_empty() {
            return Ok(answer(self.mark_namespace_terminating(i, old), 200));
        }
        if gr == CRD_GR {
            self.delete_crd_objects(i, old);
        }
        let gone = self.commit(i, &gr, "DELETED", (**old).clone(), Some(old.clone()));
        self.after_delete(i, &gone);
        Ok(answer(gone, 200))
    }

    /// A pod bound to a node and not terminal stays, terminating for its grace period, until
    /// its kubelet deletes it with grace 0 (`kubelet_delete`). Returns the pod as it is.
    fn mark_pod_terminating(
        &self,
        i: &mut Inner,
        gr: &str,
        old: &Arc<Value>,
        d: &DeleteOpts,
    ) -> Arc<Value> {
        if meta(old, "deletionTimestamp").is_some() {
            return old.clone();
        }
        let grace = graceful(old, d).unwrap_or(0);
        let at = jiff::Timestamp::now()
            .checked_add(jiff::SignedDuration::from_secs(grace))
            .unwrap_or_else(|_| jiff::Timestamp::now());
        let mut next = (**old).clone();
        let m = meta_mut(&mut next);
        m.insert(
            "deletionTimestamp".into(),
            json!(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
        );
        m.insert("deletionGracePeriodSeconds".into(), json!(grace));
        self.commit(i, gr, "MODIFIED", next, Some(old.clone()))
    }

    /// An object with finalizers is marked deleting (once) and stays.
    fn mark_deleting(&self, i: &mut Inner, gr: &str, old: &Arc<Value>) -> Arc<Value> {
        if meta(old, "deletionTimestamp").is_some() {
            return old.clone();
        }
        self.commit(i, gr, "MODIFIED", marked_deleting(old), Some(old.clone()))
    }

    /// Like the real namespace lifecycle: Terminating now, content removed later by
    /// `finalize_namespace` (the namespace controller's job).
    fn mark_namespace_terminating(&self, i: &mut Inner, old: &Arc<Value>) -> Arc<Value> {
        if meta(old, "deletionTimestamp").is_some() {
            return old.clone();
        }
        let mut next = (**old).clone();
        meta_mut(&mut next).insert("deletionTimestamp".into(), json!(now()));
        next["status"] = json!({"phase": "Terminating"});
        self.commit(i, "namespaces", "MODIFIED", next, Some(old.clone()))
    }

    /// What a kubelet does once a pod it runs is terminating: delete it with grace 0.
    pub(crate) fn kubelet_delete(&self, rt: &ResType, ns: &str, name: &str, uid: &str) {
        let mut i = self.inner.lock();
        if let Ok(cur) = Self::lookup(&i, rt, ns, name)
            && meta_str(&cur, "uid") == uid
            && meta(&cur, "deletionTimestamp").is_some()
        {
            let d = DeleteOpts {
                admission: None,
                uid: Some(uid.to_string()),
                grace: Some(0),
                ..DeleteOpts::default()
            };
            let _ = self.delete_locked(&mut i, rt, &cur, &d);
        }
    }

    /// Removes everything in a terminating namespace, then the namespace.
    pub(crate) fn finalize_namespace(&self, ns: &str) {
        let mut i = self.inner.lock();
        let victims: Vec<(String, Arc<Value>)> = i
            .objects
            .iter()
            .flat_map(|(g, m)| {
                m.iter()
                    .filter(|((n, _), _)| n == ns)
                    .map(move |(_, o)| (g.clone(), o.clone()))
            })
            .collect();
        for (g, o) in victims {
            let gone = self.commit(&mut i, &g, "DELETED", (*o).clone(), Some(o.clone()));
            self.after_delete(&mut i, &gone);
        }
        let key = (String::new(), ns.to_string());
        if let Some(n) = i
            .objects
            .get("namespaces")
            .and_then(|m| m.get(&key))
            .cloned()
        {
            let gone = self.commit(
                &mut i,
                "namespaces",
                "DELETED",
                (*n).clone(),
                Some(n.clone()),
            );
            self.after_delete(&mut i, &gone);
        }
    }

    pub(crate) fn delete_collection(
        &self,
        rt: &ResType,
        ns: Option<&str>,
        sel: &Selector,
        d: &DeleteOpts,
    ) -> Result<u64, Error> {
        let mut i = self.inner.lock();
        let victims: Vec<Arc<Value>> = i
            .objects
            .get(&rt.storage_gr())
            .map(|m| {
                m.iter()
                    .filter(|((n, _), o)| ns.is_none_or(|x| x == n) && sel.matches(o))
                    .map(|(_, o)| o.clone())
                    .collect()
            })
            .unwrap_or_default();
        for o in victims {
            self.delete_locked(&mut i, rt, &o, d)?;
        }
        Ok(i.rv)
    }
}

/// The uid and resourceVersion preconditions of a delete: 409 when either differs.
fn check_preconditions(rt: &ResType, old: &Value, d: &DeleteOpts) -> Result<(), Error> {
    let name = meta_str(old, "name");
    if let Some(uid) = d.uid.as_deref()
        && uid != meta_str(old, "uid")
    {
        return Err(Error::conflict(
            &rt.group,
            &rt.plural,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta_str(old, "uid")
            ),
        ));
    }
    if let Some(rv) = d.rv.as_deref()
        && rv != meta_str(old, "resourceVersion")
    {
        return Err(Error::conflict(
            &rt.group,
            &rt.plural,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta_str(old, "resourceVersion")
            ),
        ));
    }
    Ok(())
}

/// The grace period of a pod's delete when it is graceful: the pod is bound to a node, not
/// terminal, and the period (the request's, else the pod's, else 30 s) is positive.
fn graceful(pod: &Value, d: &DeleteOpts) -> Option<i64> {
    let bound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let terminal = matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    let grace = d.grace.unwrap_or_else(|| {
        pod.pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30)
    });
    (bound && !terminal && grace > 0).then_some(grace)
}

/// The object with `deletionTimestamp` set, as `markAsDeleting` does
/// (kubernetes/apiserver pkg/registry/generic/registry/store.go): the generation is
/// bumped when the timestamp is first set.
fn marked_deleting(old: &Value) -> Value {
    let mut next = old.clone();
    let generation = meta(old, "generation").and_then(Value::as_i64).unwrap_or(0);
    let m = meta_mut(&mut next);
    if generation > 0 && !m.contains_key("deletionTimestamp") {
        m.insert("generation".into(), json!(generation + 1));
    }
    m.entry("deletionTimestamp").or_insert_with(|| json!(now()));
    m.insert("deletionGracePeriodSeconds".into(), json!(0));
    next
}

#[cfg(test)]
mod tests {
    use super::super::DeleteOpts;
    use super::super::fixtures::{
        configmap, deletes, install_widgets, rv_of, store, type_of, widget, writes,
    };
    use crate::selector::Selector;
    use serde_json::json;

    #[test]
    fn a_finalizer_holds_the_object_until_it_is_removed() {
        // k8s.io/apiserver store.go `Delete` → `updateForGracefulDeletionAndFinalizers`:
        // deletionTimestamp set, generation bumped once, 200 with the object; the update that
        // removes the last finalizer deletes it (`deleteWithoutFinalizers`).
        let store = store();
        let widgets = install_widgets(&store);
        let mut body = widget("w");
        body["metadata"]["finalizers"] = json!(["example.com/hold"]);
        store.create(&widgets, "default", body, &writes()).unwrap();
        let (_, mut rx, _) = store.watch(&widgets, None, None).unwrap();
        let d = store.delete(&widgets, "default", "w", &deletes()).unwrap();
        assert_eq!(d.code, 200);
        assert!(d.obj["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(d.obj["metadata"]["generation"], 2);
        let again = store.delete(&widgets, "default", "w", &deletes()).unwrap();
        assert_eq!(
            rv_of(&again.obj),
            rv_of(&d.obj),
            "a second delete changes nothing"
        );
        assert_eq!(again.obj["metadata"]["generation"], 2);
        let more = json!({"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}});
        let err = store
            .patch(&widgets, "default", "w", "merge", &more, &writes())
            .unwrap_err();
        assert_eq!(err.code(), 422);
        let off = json!({"metadata": {"finalizers": null}});
        let w = store
            .patch(&widgets, "default", "w", "merge", &off, &writes())
            .unwrap();
        assert_eq!(
            rv_of(&w.obj),
            rv_of(&d.obj),
            "answered at the version it read"
        );
        assert_eq!(store.get(&widgets, "default", "w").unwrap_err().code(), 404);
        let modified = rx.try_recv().unwrap();
        assert_eq!(modified.etype, "MODIFIED");
        let deleted = rx.try_recv().unwrap();
        assert_eq!(deleted.etype, "DELETED");
        assert_eq!(
            deleted.obj["metadata"]["finalizers"],
            json!(["example.com/hold"])
        );
    }

    #[test]
    fn orphan_dependents_false_answers_202_while_a_finalizer_waits() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        let mut body = configmap("a");
        body["metadata"]["finalizers"] = json!(["x/y"]);
        store.create(&cms, "default", body, &writes()).unwrap();
        let d = DeleteOpts {
            orphan_dependents: Some(false),
            ..deletes()
        };
        assert_eq!(store.delete(&cms, "default", "a", &d).unwrap().code, 202);
    }

    #[test]
    fn delete_preconditions_are_conflicts() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        let a = store
            .create(&cms, "default", configmap("a"), &writes())
            .unwrap();
        let d = DeleteOpts {
            uid: Some("other".into()),
            ..deletes()
        };
        let err = store.delete(&cms, "default", "a", &d).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "409 Conflict: Operation cannot be fulfilled on configmaps \"a\": Precondition failed: UID in precondition: other, UID in object meta: {}",
                a.obj["metadata"]["uid"].as_str().unwrap()
            )
        );
        let d = DeleteOpts {
            rv: Some("1".into()),
            ..deletes()
        };
        assert_eq!(
            store.delete(&cms, "default", "a", &d).unwrap_err().code(),
            409
        );
        let gone = store.delete(&cms, "default", "a", &deletes()).unwrap();
        assert_eq!(rv_of(&gone.obj), rv_of(&a.obj) + 1);
        assert_eq!(store.get(&cms, "default", "a").unwrap_err().code(), 404);
    }

    #[test]
    fn a_bound_pod_terminates_until_its_kubelet_deletes_it() {
        let store = store();
        let pods = type_of(&store, "pods");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 5,
                     "containers": [{"name": "c", "image": "i"}]}});
        let p = store.create(&pods, "default", pod, &writes()).unwrap();
        let d = store.delete(&pods, "default", "p", &deletes()).unwrap();
        assert_eq!(d.obj["metadata"]["deletionGracePeriodSeconds"], 5);
        assert!(store.get(&pods, "default", "p").is_ok());
        let uid = p.obj["metadata"]["uid"].as_str().unwrap();
        store.kubelet_delete(&pods, "default", "p", uid);
        assert_eq!(store.get(&pods, "default", "p").unwrap_err().code(), 404);
    }

    #[test]
    fn a_namespace_terminates_then_is_finalized_with_its_content() {
        // The namespace lifecycle: Terminating at once, its content removed by the namespace
        // controller, then the namespace itself (pkg/controller/namespace).
        let store = store();
        let (nss, cms) = (type_of(&store, "namespaces"), type_of(&store, "configmaps"));
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}});
        store.create(&nss, "", ns, &writes()).unwrap();
        store
            .create(&cms, "team", configmap("a"), &writes())
            .unwrap();
        store
            .create(&cms, "default", configmap("a"), &writes())
            .unwrap();
        let d = store.delete(&nss, "", "team", &deletes()).unwrap();
        assert_eq!(d.obj["status"]["phase"], "Terminating");
        assert!(d.obj["metadata"]["deletionTimestamp"].is_string());
        assert!(
            store.get(&cms, "team", "a").is_ok(),
            "content stays until finalized"
        );
        store.finalize_namespace("team");
        assert_eq!(store.get(&cms, "team", "a").unwrap_err().code(), 404);
        assert_eq!(store.get(&nss, "", "team").unwrap_err().code(), 404);
        assert!(store.get(&cms, "default", "a").is_ok());
    }

    #[test]
    fn delete_collection_deletes_what_the_selector_picks() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        for (n, app) in [("a", "x"), ("b", "x"), ("c", "y")] {
            let mut body = configmap(n);
            body["metadata"]["labels"] = json!({"app": app});
            store.create(&cms, "default", body, &writes()).unwrap();
        }
        let sel = Selector::parse(Some("app=x"), None).unwrap();
        let rv = store
            .delete_collection(&cms, Some("default"), &sel, &deletes())
            .unwrap();
        assert_eq!(rv, store.current_rv());
        let left: Vec<_> = store
            .objects_of("configmaps")
            .iter()
            .map(|o| o["metadata"]["name"].clone())
            .collect();
        assert_eq!(left, [json!("c")]);
    }
}
