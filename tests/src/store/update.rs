//! Update (PUT) and the merge, JSON and strategic patches (k8s.io/apiserver
//! pkg/registry/generic/registry/store.go `Update`): preconditions, the status subresource,
//! the server's metadata kept, generation, no-op writes, and the delete that removing the
//! last finalizer of a terminating object is.

use std::sync::Arc;

use serde_json::{Value, json};

use super::crd::CRD_GR;
use super::meta::{finalizers, meta, meta_mut, meta_str, now, spec_part, without_managed};
use super::objects::Stored;
use super::{Inner, Owners, Store, WriteOpts, Written, writer};
use crate::error::Error;
use crate::registry::ResType;

impl Store {
    pub(crate) fn update(
        &self,
        rt: &ResType,
        ns: &str,
        name: &str,
        body: Value,
        o: &WriteOpts,
    ) -> Result<Written, Error> {
        let mut i = self.inner.lock();
        let old = Self::lookup(&i, rt, ns, name)?;
        if !body.is_object() {
            return Err(Error::bad_request(
                "the body of the request was in an unknown format",
            ));
        }
        let body_rv = meta_str(&body, "resourceVersion").to_string();
        if body_rv.is_empty() && rt.crd {
            return Err(Error::invalid(
                &rt.group,
                &rt.kind,
                name,
                vec![(
                    "metadata.resourceVersion".into(),
                    "Invalid value: 0x0: must be specified for an update".into(),
                )],
            ));
        }
        // A PUT's body uid is a precondition (kubernetes/apiserver pkg/registry/rest/update.go,
        // `defaultUpdatedObjectInfo.Preconditions`): a 409 before anything else.
        let body_uid = meta_str(&body, "uid");
        if !body_uid.is_empty() && body_uid != meta_str(&old, "uid") {
            return Err(Error::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {body_uid}, UID in object meta: {}",
                    meta_str(&old, "uid")
                ),
            ));
        }
        self.update_locked(&mut i, rt, &old, body, &body_rv, o, Owners::Record)
    }

    /// PATCH with a merge, JSON or strategic patch, or a server-side apply.
    pub(crate) fn patch(
        &self,
        rt: &ResType,
        ns: &str,
        name: &str,
        ptype: &str,
        body: &Value,
        o: &WriteOpts,
    ) -> Result<Written, Error> {
        let mut i = self.inner.lock();
        if ptype == "apply" {
            return self.apply_locked(&mut i, rt, ns, name, body, o);
        }
        let old = Self::lookup(&i, rt, ns, name)?;
        let mut new = (*Self::present(rt, &old)).clone();
        match ptype {
            "merge" => crate::patch::merge_patch(&mut new, body),
            "json" => crate::patch::json_patch(&mut new, body)?,
            _ => {
                if rt.crd {
                    return Err(Error::unsupported_media_type(&crate::media::CR_PATCH_TYPES));
                }
                crate::patch::strategic_merge(&mut new, body)
            }
        }
        let rv = meta_str(&new, "resourceVersion").to_string();
        self.update_locked(&mut i, rt, &old, new, &rv, o, Owners::Record)
    }

    /// A patch or an apply naming another uid than the object's changes an immutable field:
    /// 422 (kubernetes/apiserver pkg/registry/rest/update.go `BeforeUpdate`, which validates
    /// the object meta update: `ValidateImmutableField` of `metadata.uid`).
    pub(super) fn uid_unchanged(rt: &ResType, old: &Value, uid: &str) -> Result<(), Error> {
        if uid.is_empty() || uid == meta_str(old, "uid") {
            return Ok(());
        }
        Err(Error::invalid(
            &rt.group,
            &rt.kind,
            meta_str(old, "name"),
            vec![(
                "metadata.uid".into(),
                format!("Invalid value: \"{uid}\": field is immutable"),
            )],
        ))
    }

    /// Writes `new` over `stored_old` (the stored object) unless `expect_rv` is stale.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn update_locked(
        &self,
        i: &mut Inner,
        rt: &ResType,
        stored_old: &Arc<Value>,
        mut new: Value,
        expect_rv: &str,
        o: &WriteOpts,
        owners: Owners,
    ) -> Result<Written, Error> {
        let old = &Self::present(rt, stored_old);
        let name = meta_str(old, "name").to_string();
        Self::check_type_meta_in(i, rt, &new)?;
        check_target(rt, old, &new, expect_rv)?;
        new["apiVersion"] = old["apiVersion"].clone();
        new["kind"] = json!(rt.kind);
        carry_status(rt, old, &mut new, &o.subresource, owners);
        carry_metadata(old, &mut new, owners);
        let terminating = meta(old, "deletionTimestamp").is_some();
        if terminating {
            no_new_finalizers(rt, old, &new)?;
        }
        if !rt.crd {
            let mut causes = Vec::new();
            crate::kinds::validate_update(&rt.group, &rt.kind, old, &new, &mut causes);
            if !causes.is_empty() {
                return Err(Error::invalid(&rt.group, &rt.kind, &name, causes));
            }
        }
        let mut warnings = Vec::new();
        self.admit(rt, &mut new, Some(old.as_ref()), o.strict, &mut warnings)?;
        if let Some(a) = &o.admission {
            let ns = meta_str(old, "namespace");
            let (sub, dry) = (o.subresource.as_str(), o.dry_run);
            warnings.extend(a.check(
                "UPDATE",
                rt,
                sub,
                ns,
                &name,
                Some(&new),
                Some(old),
                dry,
                &Stored(i),
            )?);
        }
        if owners == Owners::Record {
            let (t, av) = (now(), rt.api_version());
            writer(rt, o, &o.subresource, &av, &t).record_update(Some(old), &mut new);
        }
        if rt.has_generation() && spec_part(old, rt.status) != spec_part(&new, rt.status) {
            let g = meta(old, "generation").and_then(Value::as_i64).unwrap_or(0) + 1;
            meta_mut(&mut new).insert("generation".into(), json!(g));
        }
        let obj = if without_managed(&new) == without_managed(old) {
            Self::present(rt, old)
        } else if o.dry_run {
            Arc::new(new)
        } else if terminating && finalizers(&new).is_empty() {
            self.delete_finalized(i, rt, stored_old, new)
        } else {
            let stored = self.commit(
                i,
                &rt.storage_gr(),
                "MODIFIED",
                Self::to_storage(rt, new),
                Some(stored_old.clone()),
            );
            if rt.storage_gr() == CRD_GR {
                self.crd_changed(i, &stored)?;
            }
            Self::present(rt, &stored)
        };
        Ok(Written {
            obj,
            warnings,
            code: 200,
        })
    }

    /// `deleteWithoutFinalizers` (kubernetes/apiserver
    /// pkg/registry/generic/registry/store.go): the stored object is deleted, so the
    /// DELETED event carries its last stored state (finalizers still listed); the
    /// answer is the request's object at the version it was read at.
    fn delete_finalized(
        &self,
        i: &mut Inner,
        rt: &ResType,
        stored_old: &Arc<Value>,
        mut new: Value,
    ) -> Arc<Value> {
        let gr = rt.storage_gr();
        let gone = self.commit(
            i,
            &gr,
            "DELETED",
            (**stored_old).clone(),
            Some(stored_old.clone()),
        );
        if gr == CRD_GR {
            Self::crd_gone(i, &gone);
        }
        self.after_delete(i, &gone);
        let rv = meta_str(stored_old, "resourceVersion").to_string();
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv));
        Self::present(rt, &Arc::new(new))
    }
}

/// The body's resourceVersion (409 when stale), name (400 when another) and uid (422 when
/// another).
fn check_target(rt: &ResType, old: &Value, new: &Value, expect_rv: &str) -> Result<(), Error> {
    let name = meta_str(old, "name");
    if !expect_rv.is_empty() && expect_rv != meta_str(old, "resourceVersion") {
        return Err(Error::stale(&rt.group, &rt.plural, name));
    }
    let body_name = meta_str(new, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(Error::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    Store::uid_unchanged(rt, old, meta_str(new, "uid"))
}

/// A `/status` write changes only the status (and, precomputed by an apply, managedFields);
/// a main-resource write of a kind with a status subresource keeps the stored status.
fn carry_status(rt: &ResType, old: &Value, new: &mut Value, subresource: &str, owners: Owners) {
    if subresource == "status" {
        let status = new.get("status").cloned();
        let managed = meta(new, "managedFields").cloned();
        *new = old.clone();
        match status {
            Some(s) => new["status"] = s,
            None => {
                new.as_object_mut().expect("object").remove("status");
            }
        }
        if owners == Owners::Precomputed {
            match managed {
                Some(m) => {
                    meta_mut(new).insert("managedFields".into(), m);
                }
                None => {
                    meta_mut(new).remove("managedFields");
                }
            }
        }
    } else if rt.status {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                new.as_object_mut().expect("object").remove("status");
            }
        }
    }
}

/// The metadata only the server writes is kept from the stored object (managedFields too,
/// unless precomputed by an apply).
fn carry_metadata(old: &Value, new: &mut Value, owners: Owners) {
    let om = old["metadata"].as_object().cloned().unwrap_or_default();
    let m = meta_mut(new);
    for k in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
    ] {
        match om.get(k) {
            Some(v) => m.insert(k.into(), v.clone()),
            None => m.remove(k),
        };
    }
    if owners == Owners::Record {
        match om.get("managedFields") {
            Some(v) => m.insert("managedFields".into(), v.clone()),
            None => m.remove("managedFields"),
        };
    }
}

/// An object being deleted takes no new finalizers (k8s.io/apimachinery
/// pkg/api/validation/objectmeta.go `ValidateObjectMetaUpdate`).
fn no_new_finalizers(rt: &ResType, old: &Value, new: &Value) -> Result<(), Error> {
    let oldf = finalizers(old);
    let Some(f) = finalizers(new).into_iter().find(|f| !oldf.contains(f)) else {
        return Ok(());
    };
    Err(Error::invalid(
        &rt.group,
        &rt.kind,
        meta_str(old, "name"),
        vec![(
            "metadata.finalizers".into(),
            format!(
                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{\"{f}\"}}"
            ),
        )],
    ))
}

#[cfg(test)]
mod tests {
    use super::super::WriteOpts;
    use super::super::fixtures::{
        configmap, install_widgets, rv_of, store, type_of, widget, writes,
    };
    use serde_json::json;

    #[test]
    fn a_stale_resource_version_is_a_conflict_and_a_no_op_keeps_the_version() {
        // etcd3 store `GuaranteedUpdate`: a precondition on the read resourceVersion; an
        // update that changes nothing writes nothing (k8s.io/apiserver store.go `Update`).
        let store = store();
        let cms = type_of(&store, "configmaps");
        let a = store
            .create(&cms, "default", configmap("a"), &writes())
            .unwrap();
        let mut body = (*a.obj).clone();
        body["data"]["k"] = json!("w");
        let b = store
            .update(&cms, "default", "a", body.clone(), &writes())
            .unwrap();
        assert_eq!(rv_of(&b.obj), rv_of(&a.obj) + 1);
        assert_eq!(b.obj["data"]["k"], "w");
        let err = store
            .update(&cms, "default", "a", body, &writes())
            .unwrap_err();
        assert_eq!(err.code(), 409);
        assert_eq!(
            err.to_string(),
            "409 Conflict: Operation cannot be fulfilled on configmaps \"a\": the object has been modified; please apply your changes to the latest version and try again"
        );
        let same = store
            .update(&cms, "default", "a", (*b.obj).clone(), &writes())
            .unwrap();
        assert_eq!(rv_of(&same.obj), rv_of(&b.obj));
        assert_eq!(store.current_rv(), rv_of(&b.obj));
    }

    #[test]
    fn the_generation_follows_the_spec_and_status_writes_change_only_status() {
        let store = store();
        let widgets = install_widgets(&store);
        let w = store
            .create(&widgets, "default", widget("w"), &writes())
            .unwrap();
        assert_eq!(w.obj["metadata"]["generation"], 1);
        let label = json!({"metadata": {"labels": {"a": "b"}}});
        let l = store
            .patch(&widgets, "default", "w", "merge", &label, &writes())
            .unwrap();
        assert_eq!(l.obj["metadata"]["generation"], 1, "metadata is not spec");
        let spec = json!({"spec": {"replicas": 3}});
        let s = store
            .patch(&widgets, "default", "w", "merge", &spec, &writes())
            .unwrap();
        assert_eq!(s.obj["metadata"]["generation"], 2);
        assert_eq!(s.obj["spec"]["replicas"], 3);
    }

    #[test]
    fn a_status_write_changes_nothing_else() {
        let store = store();
        let pods = type_of(&store, "pods");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        store.create(&pods, "default", pod, &writes()).unwrap();
        let status = WriteOpts {
            subresource: "status".into(),
            ..writes()
        };
        let body = json!({"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Running"}});
        let w = store
            .patch(&pods, "default", "p", "merge", &body, &status)
            .unwrap();
        assert_eq!(w.obj["status"]["phase"], "Running");
        assert_eq!(w.obj["metadata"].get("labels"), None);
        let back = json!({"status": {"phase": "Failed"}});
        let m = store
            .patch(&pods, "default", "p", "merge", &back, &writes())
            .unwrap();
        assert_eq!(
            m.obj["status"]["phase"], "Running",
            "the main resource keeps the status"
        );
    }

    #[test]
    fn a_patch_cannot_change_the_uid_or_name() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        store
            .create(&cms, "default", configmap("a"), &writes())
            .unwrap();
        let uid = json!({"metadata": {"uid": "other"}});
        let err = store
            .patch(&cms, "default", "a", "merge", &uid, &writes())
            .unwrap_err();
        assert_eq!(err.code(), 422);
        assert_eq!(
            err.status()["details"]["causes"][0]["message"],
            "Invalid value: \"other\": field is immutable"
        );
        let name = json!({"metadata": {"name": "b"}});
        let err = store
            .patch(&cms, "default", "a", "merge", &name, &writes())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "400 BadRequest: the name of the object (b) does not match the name on the URL (a)"
        );
    }
}
