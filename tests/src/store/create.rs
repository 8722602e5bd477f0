//! Create (k8s.io/apiserver pkg/registry/generic/registry/store.go `Create`): the server's
//! metadata, a generated name, the initial status, then admission and the first
//! `managedFields` entry.

use std::sync::Arc;

use serde_json::{Value, json};

use super::crd::CRD_GR;
use super::meta::{meta_mut, meta_str, now};
use super::objects::Stored;
use super::{Inner, Owners, Store, WriteOpts, Written, writer};
use crate::error::Error;
use crate::names;
use crate::registry::ResType;

impl Store {
    pub(crate) fn create(
        &self,
        rt: &ResType,
        ns: &str,
        obj: Value,
        o: &WriteOpts,
    ) -> Result<Written, Error> {
        let mut i = self.inner.lock();
        if rt.crd && Self::crd_terminating(&i, rt) {
            // kubernetes/apiextensions-apiserver pkg/apiserver/customresource_handler.go
            // `serveResource` (v0.31–v0.33; from v0.34 a 403 that an apply that creates gets too)
            return Err(Error::Api {
                code: 405,
                reason: "MethodNotAllowed",
                message: "create not allowed while custom resource definition is terminating"
                    .into(),
                details: Some(json!({"group": rt.group, "kind": rt.plural})),
            });
        }
        self.create_locked(&mut i, rt, ns, obj, o, Owners::Record)
    }

    pub(super) fn create_locked(
        &self,
        i: &mut Inner,
        rt: &ResType,
        ns: &str,
        mut obj: Value,
        o: &WriteOpts,
        owners: Owners,
    ) -> Result<Written, Error> {
        if !obj.is_object() {
            return Err(Error::bad_request(
                "the body of the request was in an unknown format",
            ));
        }
        Self::check_type_meta_in(i, rt, &obj)?;
        obj["apiVersion"] = json!(if rt.group.is_empty() {
            rt.storage_version.clone()
        } else {
            format!("{}/{}", rt.group, rt.storage_version)
        });
        obj["kind"] = json!(rt.kind);
        let body_ns = meta_str(&obj, "namespace").to_string();
        if rt.namespaced && !body_ns.is_empty() && body_ns != ns {
            return Err(Error::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let name = meta_str(&obj, "name").to_string();
        Self::check_namespace(i, rt, ns, &name)?;
        let name = self.generated_name(name, &obj);
        self.stamp_new(rt, ns, &name, &mut obj, owners);
        check_new_name(rt, &name)?;
        let gr = rt.storage_gr();
        let key = (
            if rt.namespaced { ns } else { "" }.to_string(),
            name.clone(),
        );
        if i.objects.get(&gr).is_some_and(|m| m.contains_key(&key)) {
            return Err(Error::already_exists(&rt.group, &rt.plural, &name));
        }
        initial_status(rt, &mut obj);
        let mut warnings = Vec::new();
        self.admit(rt, &mut obj, None, o.strict, &mut warnings)?;
        if let Some(a) = &o.admission {
            let name = meta_str(&obj, "name").to_string();
            warnings.extend(a.check(
                "CREATE",
                rt,
                "",
                ns,
                &name,
                Some(&obj),
                None,
                o.dry_run,
                &Stored(i),
            )?);
        }
        if owners == Owners::Record {
            let (t, av) = (now(), rt.api_version());
            writer(rt, o, "", &av, &t).record_update(None, &mut obj);
        }
        let obj = if o.dry_run {
            Arc::new(obj)
        } else {
            Self::present(rt, &self.store_created(i, rt, obj, &name)?)
        };
        Ok(Written {
            obj,
            warnings,
            code: 201,
        })
    }

    /// `metadata.name`, or `generateName` and five random characters (k8s.io/apiserver
    /// pkg/storage/names/generate.go `SimpleNameGenerator`).
    fn generated_name(&self, name: String, obj: &Value) -> String {
        let generate = meta_str(obj, "generateName");
        if !name.is_empty() || generate.is_empty() {
            return name;
        }
        const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let suffix: String = (0..5)
            .map(|_| ALPHA[(self.random() % ALPHA.len() as u64) as usize] as char)
            .collect();
        format!("{generate}{suffix}")
    }

    /// The metadata the server sets on a new object: name, namespace, a new uid, the creation
    /// time, generation 1; what the body said of the server's fields is dropped.
    fn stamp_new(&self, rt: &ResType, ns: &str, name: &str, obj: &mut Value, owners: Owners) {
        let uid = self.uid();
        let m = meta_mut(obj);
        for k in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "selfLink",
        ] {
            m.remove(k);
        }
        if owners == Owners::Record {
            m.remove("managedFields");
        }
        m.insert("name".into(), json!(name));
        if rt.namespaced {
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(now()));
        if rt.has_generation() {
            m.insert("generation".into(), json!(1));
        }
    }

    /// Commits a new object; a CRD registers its kinds (and turns Established by a second
    /// write, whose object is answered).
    fn store_created(
        &self,
        i: &mut Inner,
        rt: &ResType,
        obj: Value,
        name: &str,
    ) -> Result<Arc<Value>, Error> {
        let gr = rt.storage_gr();
        let stored = self.commit(i, &gr, "ADDED", Self::to_storage(rt, obj), None);
        if gr == CRD_GR {
            self.crd_changed(i, &stored)?;
        }
        let key = (meta_str(&stored, "namespace").to_string(), name.to_string());
        Ok(i.objects
            .get(&gr)
            .and_then(|m| m.get(&key))
            .cloned()
            .unwrap_or(stored))
    }
}

/// A name is required and must be valid for its kind (422 in apimachinery's words).
fn check_new_name(rt: &ResType, name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::invalid(
            &rt.group,
            &rt.kind,
            "",
            vec![(
                "metadata.name".into(),
                "Required value: name or generateName is required".into(),
            )],
        ));
    }
    let name_errors = names::object_name(&rt.kind, name);
    if name_errors.is_empty() {
        return Ok(());
    }
    Err(Error::invalid(
        &rt.group,
        &rt.kind,
        name,
        name_errors
            .into_iter()
            .map(|m| {
                (
                    "metadata.name".into(),
                    format!("Invalid value: \"{name}\": {m}"),
                )
            })
            .collect(),
    ))
}

/// A status subresource's status is not written on create (Nodes and Namespaces keep theirs);
/// pods start `Pending`, namespaces `Active`.
fn initial_status(rt: &ResType, obj: &mut Value) {
    if rt.status
        && rt.kind != "Node"
        && rt.kind != "Namespace"
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("status");
    }
    if rt.kind == "Pod" {
        obj["status"] = json!({"phase": "Pending"});
    }
    if rt.kind == "Namespace" && obj.get("status").is_none() {
        obj["status"] = json!({"phase": "Active"});
    }
}

#[cfg(test)]
mod tests {
    use super::super::WriteOpts;
    use super::super::fixtures::{configmap, store, type_of, writes};
    use serde_json::json;

    #[test]
    fn a_create_sets_the_servers_metadata_and_a_managed_fields_entry() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        let mut body = configmap("a");
        body["metadata"]["uid"] = json!("mine");
        body["metadata"]["resourceVersion"] = json!("999");
        let w = store.create(&cms, "default", body, &writes()).unwrap();
        let m = &w.obj["metadata"];
        assert_eq!(m["namespace"], "default");
        assert_ne!(m["uid"], "mine");
        assert_eq!(m["uid"].as_str().map(str::len), Some(36));
        assert_eq!(m["resourceVersion"], store.current_rv().to_string());
        assert!(
            m["creationTimestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z'))
        );
        assert_eq!(m["managedFields"][0]["manager"], "test");
        assert_eq!(m["managedFields"][0]["operation"], "Update");
        assert_eq!(m.get("generation"), None, "ConfigMaps have no generation");
        let err = store
            .create(&cms, "default", configmap("a"), &writes())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "409 AlreadyExists: configmaps \"a\" already exists"
        );
    }

    #[test]
    fn generate_name_adds_five_characters_and_a_name_is_required() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        let body =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "cm-"}});
        let w = store.create(&cms, "default", body, &writes()).unwrap();
        let name = w.obj["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("cm-") && name.len() == 8, "{name}");
        let nameless = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}});
        let err = store
            .create(&cms, "default", nameless, &writes())
            .unwrap_err();
        assert_eq!(err.code(), 422);
        assert_eq!(
            err.status()["details"]["causes"][0]["message"],
            "Required value: name or generateName is required"
        );
    }

    #[test]
    fn pods_start_pending_without_the_status_they_were_sent_with() {
        let store = store();
        let pods = type_of(&store, "pods");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Running"}});
        let w = store.create(&pods, "default", pod, &writes()).unwrap();
        assert_eq!(w.obj["status"], json!({"phase": "Pending"}));
    }

    #[test]
    fn a_dry_run_create_stores_nothing() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        let before = store.current_rv();
        let dry = WriteOpts {
            dry_run: true,
            ..writes()
        };
        let w = store.create(&cms, "default", configmap("a"), &dry).unwrap();
        assert_eq!(
            (w.code, w.obj["metadata"]["name"].clone()),
            (201, json!("a"))
        );
        assert_eq!(store.current_rv(), before);
        assert_eq!(store.get(&cms, "default", "a").unwrap_err().code(), 404);
    }
}
