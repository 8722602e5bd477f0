//! A CRD's lifecycle: its kinds registered and the CRD Established on a write; on delete,
//! Terminating with the cleanup finalizer while the CRD finalizer controller deletes its
//! objects, then gone with its kinds.

use std::sync::Arc;

use serde_json::{Value, json};

use super::meta::{finalizers, meta, meta_mut, now, set_condition};
use super::{DeleteOpts, Inner, Store, Written};
use crate::error::Error;
use crate::registry::{ResType, from_crd};

pub(super) const CRD_GR: &str = "customresourcedefinitions.apiextensions.k8s.io";

/// The finalizer the real server puts on a CRD being deleted (kubernetes/apiextensions-apiserver
/// `pkg/apis/apiextensions/v1/types.go`, `CustomResourceCleanupFinalizer`).
const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// A CRD's `selectableFields` (top level and per version) are dropped unless the stored CRD
/// uses them, as a server with CustomResourceFieldSelectors off does (kubernetes/
/// apiextensions-apiserver `pkg/registry/customresourcedefinition/strategy.go`
/// `dropDisabledFields`, 1.30).
pub(super) fn drop_selectable_fields(crd: &mut Value, old: Option<&Value>) {
    let uses = |c: &Value| {
        c.pointer("/spec/selectableFields").is_some()
            || c.pointer("/spec/versions")
                .and_then(Value::as_array)
                .is_some_and(|vs| vs.iter().any(|v| v.get("selectableFields").is_some()))
    };
    if old.is_some_and(uses) {
        return;
    }
    if let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("selectableFields");
    }
    let versions = crd
        .pointer_mut("/spec/versions")
        .and_then(Value::as_array_mut);
    for v in versions.into_iter().flatten() {
        if let Some(v) = v.as_object_mut() {
            v.remove("selectableFields");
        }
    }
}

/// `plural.group` of a CRD's objects.
fn crd_resource(crd: &Value) -> String {
    let s = |p: &str| crd.pointer(p).and_then(Value::as_str).unwrap_or("");
    format!("{}.{}", s("/spec/names/plural"), s("/spec/group"))
}

/// The status the real server's controllers give a new CRD: names accepted, Established,
/// its storage version stored.
fn established_status(crd: &Value) -> Value {
    let t = now();
    let storage: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v["storage"] == json!(true))
                .map(|v| v["name"].clone())
                .collect()
        })
        .unwrap_or_default();
    let mut accepted = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    if accepted.get("listKind").is_none() {
        accepted["listKind"] = json!(format!("{}List", accepted["kind"].as_str().unwrap_or("")));
    }
    if accepted.get("singular").is_none() {
        accepted["singular"] = json!(accepted["kind"].as_str().unwrap_or("").to_lowercase());
    }
    json!({
        "acceptedNames": accepted,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": t},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": t},
        ],
        "storedVersions": storage,
    })
}

impl Store {
    /// Registers the kinds of a CRD and marks it Established (a separate write, as the real
    /// server's controllers do).
    pub(super) fn crd_changed(&self, i: &mut Inner, crd: &Arc<Value>) -> Result<(), Error> {
        let types = from_crd(crd)?;
        let s = |p: &str| crd.pointer(p).and_then(Value::as_str).unwrap_or("");
        let (group, plural) = (s("/spec/group"), s("/spec/names/plural"));
        i.types.retain(|(g, _, p), _| !(g == group && p == plural));
        for t in types {
            i.types.insert(
                (t.group.clone(), t.version.clone(), t.plural.clone()),
                Arc::new(t),
            );
        }
        i.discovery_gen += 1;
        let established = crd
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
            });
        if !established {
            let mut next = (**crd).clone();
            next["status"] = established_status(crd);
            self.commit(i, CRD_GR, "MODIFIED", next, Some(crd.clone()));
        }
        Ok(())
    }

    /// The first delete of a CRD: Terminating, with the cleanup finalizer, until its objects
    /// are gone (kubernetes/apiextensions-apiserver pkg/registry/customresourcedefinition/etcd.go
    /// `REST.Delete`). A later delete answers the object as it is.
    pub(super) fn mark_crd_deleting(
        &self,
        i: &mut Inner,
        rt: &ResType,
        old: &Arc<Value>,
        warnings: Vec<String>,
    ) -> Written {
        if meta(old, "deletionTimestamp").is_some() {
            return Written {
                obj: Self::present(rt, old),
                warnings,
                code: 200,
            };
        }
        let mut next = (**old).clone();
        let m = meta_mut(&mut next);
        m.insert("deletionTimestamp".into(), json!(now()));
        let list = m.entry("finalizers").or_insert_with(|| json!([]));
        if let Some(list) = list.as_array_mut()
            && !list.iter().any(|f| f == CRD_CLEANUP_FINALIZER)
        {
            list.push(json!(CRD_CLEANUP_FINALIZER));
        }
        set_condition(
            &mut next,
            "Terminating",
            "True",
            "InstanceDeletionPending",
            "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
        );
        let stored = self.commit(i, CRD_GR, "MODIFIED", next, Some(old.clone()));
        Written {
            obj: Self::present(rt, &stored),
            warnings,
            code: 200,
        }
    }

    /// A CRD deleted at once (no cleanup finalizer): its objects go with it, and its kinds.
    pub(super) fn delete_crd_objects(&self, i: &mut Inner, crd: &Value) {
        let cr_gr = crd_resource(crd);
        for o in Self::all_of(i, &cr_gr) {
            self.commit(i, &cr_gr, "DELETED", (*o).clone(), Some(o.clone()));
        }
        Self::crd_gone(i, crd);
    }

    fn all_of(i: &Inner, gr: &str) -> Vec<Arc<Value>> {
        i.objects
            .get(gr)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The kinds of a CRD that is gone leave discovery.
    pub(super) fn crd_gone(i: &mut Inner, crd: &Value) {
        let gr = crd_resource(crd);
        i.types.retain(|_, t| t.gr() != gr);
        i.discovery_gen += 1;
    }

    /// The CRD of a custom resource type is being deleted: its `Terminating` condition is
    /// True (kubernetes/apiextensions-apiserver pkg/apiserver/customresource_handler.go
    /// `ServeHTTP`).
    pub(super) fn crd_terminating(i: &Inner, rt: &ResType) -> bool {
        i.objects
            .get(CRD_GR)
            .and_then(|m| m.get(&(String::new(), rt.gr())))
            .and_then(|c| c.pointer("/status/conditions"))
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Terminating" && c["status"] == "True")
            })
    }

    /// One round of the CRD finalizer controller for a CRD being deleted
    /// (kubernetes/apiextensions-apiserver pkg/controller/finalizer/crd_finalizer.go `sync`):
    /// every object of the CRD is deleted (its finalizers honoured); once none is left the
    /// cleanup finalizer comes off and the CRD goes. Returns whether the CRD is done (gone, or
    /// no longer being deleted).
    pub(crate) fn crd_cleanup_step(&self, name: &str) -> bool {
        let mut i = self.inner.lock();
        let Some(crd) = i
            .objects
            .get(CRD_GR)
            .and_then(|m| m.get(&(String::new(), name.to_string())))
            .cloned()
        else {
            return true;
        };
        let cleaning = finalizers(&crd).iter().any(|f| f == CRD_CLEANUP_FINALIZER);
        if meta(&crd, "deletionTimestamp").is_none() || !cleaning {
            return true;
        }
        let cr_gr = crd_resource(&crd);
        let left = Self::all_of(&i, &cr_gr);
        if let Some(crt) = Self::type_for_gr(&i, &cr_gr).filter(|_| !left.is_empty()) {
            let mut next = (*crd).clone();
            let (reason, message) = (
                "InstanceDeletionInProgress",
                "CustomResource deletion is in progress",
            );
            set_condition(&mut next, "Terminating", "True", reason, message);
            if next != *crd {
                self.commit(&mut i, CRD_GR, "MODIFIED", next, Some(crd.clone()));
            }
            for obj in left {
                let _ = self.delete_locked(&mut i, &crt, &obj, &DeleteOpts::default());
            }
            return false;
        }
        self.crd_cleaned(&mut i, &crd);
        true
    }

    /// The CRD's objects are gone: the cleanup finalizer comes off, and the CRD goes unless
    /// other finalizers hold it.
    fn crd_cleaned(&self, i: &mut Inner, crd: &Arc<Value>) {
        let mut next = (**crd).clone();
        let (reason, message) = ("InstanceDeletionCompleted", "removed all instances");
        set_condition(&mut next, "Terminating", "False", reason, message);
        if let Some(list) = meta_mut(&mut next)
            .get_mut("finalizers")
            .and_then(Value::as_array_mut)
        {
            list.retain(|f| f != CRD_CLEANUP_FINALIZER);
        }
        if !finalizers(&next).is_empty() {
            self.commit(i, CRD_GR, "MODIFIED", next, Some(crd.clone()));
            return;
        }
        let gone = self.commit(i, CRD_GR, "DELETED", (**crd).clone(), Some(crd.clone()));
        Self::crd_gone(i, &gone);
        self.after_delete(i, &gone);
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{
        crd_type, deletes, install_widgets, store, widget, widget_crd, writes,
    };
    use super::super::{DeleteOpts, Store};
    use super::CRD_CLEANUP_FINALIZER;
    use serde_json::{Value, json};

    fn condition(obj: &Value, type_: &str) -> Value {
        obj["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
            .unwrap_or(Value::Null)
    }

    #[test]
    fn a_created_crd_registers_its_kind_and_becomes_established() {
        let store = store();
        let before = store.types().1;
        let w = store
            .create(&crd_type(&store), "", widget_crd(), &writes())
            .unwrap();
        assert_eq!(condition(&w.obj, "Established")["status"], "True");
        assert_eq!(condition(&w.obj, "NamesAccepted")["reason"], "NoConflicts");
        assert_eq!(w.obj["status"]["storedVersions"], json!(["v1"]));
        assert!(store.types().1 > before, "discovery changed");
        let widgets = store
            .resolve("example.com", "v1", "widgets")
            .expect("registered");
        assert_eq!(
            (widgets.kind.as_str(), widgets.namespaced),
            ("Widget", true)
        );
    }

    #[test]
    fn a_deleted_crd_terminates_deletes_its_objects_then_goes() {
        // apiextensions-apiserver: `REST.Delete` adds the cleanup finalizer and the
        // Terminating condition; creates are 405 meanwhile; the finalizer controller deletes
        // the objects, honouring their finalizers, then removes its finalizer.
        let store = store();
        let widgets = install_widgets(&store);
        store
            .create(&widgets, "default", widget("a"), &writes())
            .unwrap();
        let mut held = widget("b");
        held["metadata"]["finalizers"] = json!(["example.com/hold"]);
        store.create(&widgets, "default", held, &writes()).unwrap();
        let crds = crd_type(&store);
        let d = DeleteOpts {
            crd_finalizer: true,
            ..deletes()
        };
        let w = store.delete(&crds, "", "widgets.example.com", &d).unwrap();
        assert_eq!(
            w.obj["metadata"]["finalizers"],
            json!([CRD_CLEANUP_FINALIZER])
        );
        assert_eq!(
            condition(&w.obj, "Terminating")["reason"],
            "InstanceDeletionPending"
        );
        let err = store
            .create(&widgets, "default", widget("c"), &writes())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "405 MethodNotAllowed: create not allowed while custom resource definition is terminating"
        );
        assert!(!store.crd_cleanup_step("widgets.example.com"));
        assert_eq!(store.get(&widgets, "default", "a").unwrap_err().code(), 404);
        let b = store.get(&widgets, "default", "b").unwrap();
        assert!(
            b["metadata"]["deletionTimestamp"].is_string(),
            "b waits for its finalizer"
        );
        let crd = store.get(&crds, "", "widgets.example.com").unwrap();
        assert_eq!(
            condition(&crd, "Terminating")["reason"],
            "InstanceDeletionInProgress"
        );
        assert!(!store.crd_cleanup_step("widgets.example.com"));
        let off = json!({"metadata": {"finalizers": null}});
        store
            .patch(&widgets, "default", "b", "merge", &off, &writes())
            .unwrap();
        assert!(store.crd_cleanup_step("widgets.example.com"));
        assert_eq!(
            store
                .get(&crds, "", "widgets.example.com")
                .unwrap_err()
                .code(),
            404
        );
        assert!(store.resolve("example.com", "v1", "widgets").is_none());
        assert!(
            store.crd_cleanup_step("widgets.example.com"),
            "nothing left to do"
        );
    }

    #[test]
    fn without_the_finalizer_a_crds_objects_go_at_once() {
        let store = store();
        let widgets = install_widgets(&store);
        store
            .create(&widgets, "default", widget("a"), &writes())
            .unwrap();
        store
            .delete(&crd_type(&store), "", "widgets.example.com", &deletes())
            .unwrap();
        assert!(store.objects_of("widgets.example.com").is_empty());
        assert!(store.resolve("example.com", "v1", "widgets").is_none());
    }

    #[test]
    fn selectable_fields_are_dropped_by_a_1_30_server_unless_already_used() {
        let store = Store::new(100, false);
        let mut crd = widget_crd();
        crd["spec"]["versions"][0]["selectableFields"] = json!([{"jsonPath": ".spec.replicas"}]);
        let w = store
            .create(&crd_type(&store), "", crd.clone(), &writes())
            .unwrap();
        assert_eq!(w.obj["spec"]["versions"][0].get("selectableFields"), None);
        let mut kept = crd.clone();
        super::drop_selectable_fields(&mut kept, Some(&crd));
        assert_eq!(kept, crd, "a CRD that uses them keeps them");
    }
}
