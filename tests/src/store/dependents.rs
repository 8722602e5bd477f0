//! Owner references: the index from an owner's uid to its dependents, and garbage
//! collection (dependents whose owners are all gone are deleted; Orphan and Foreground
//! propagation). The real collector (pkg/controller/garbagecollector) is asynchronous; here
//! it runs within the delete.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;

use super::meta::{meta, meta_mut, meta_str};
use super::{DeleteOpts, Inner, Key, Store};

impl Store {
    /// Keeps [`Inner::owned`] right across one object's change from `before` to `after`.
    pub(super) fn index_owners(
        i: &mut Inner,
        gr: &str,
        key: &Key,
        before: Option<&Value>,
        after: Option<&Value>,
    ) {
        let owners = |o: Option<&Value>| -> BTreeSet<String> {
            o.and_then(|o| meta(o, "ownerReferences"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_string))
                .collect()
        };
        let (was, is) = (owners(before), owners(after));
        let entry = (gr.to_string(), key.clone());
        for u in was.difference(&is) {
            if let Some(set) = i.owned.get_mut(u) {
                set.remove(&entry);
                if set.is_empty() {
                    i.owned.remove(u);
                }
            }
        }
        for u in is.difference(&was) {
            i.owned.entry(u.clone()).or_default().insert(entry.clone());
        }
    }

    /// The objects whose `ownerReferences` name `uid`, in (group/resource, key) order.
    fn dependents(i: &Inner, uid: &str) -> Vec<(String, Arc<Value>)> {
        let Some(set) = i.owned.get(uid) else {
            return Vec::new();
        };
        set.iter()
            .filter_map(|(g, k)| {
                let o = i.objects.get(g)?.get(k)?;
                Some((g.clone(), o.clone()))
            })
            .collect()
    }

    /// Orphan propagation: the dependents lose their reference to the owner.
    pub(super) fn orphan_dependents(&self, i: &mut Inner, uid: &str) {
        for (g, o) in Self::dependents(i, uid) {
            let mut next = (*o).clone();
            if let Some(refs) = meta_mut(&mut next)
                .get_mut("ownerReferences")
                .and_then(Value::as_array_mut)
            {
                refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
            }
            self.commit(i, &g, "MODIFIED", next, Some(o));
        }
    }

    /// Foreground propagation: the dependents are deleted first.
    pub(super) fn delete_dependents(&self, i: &mut Inner, uid: &str) {
        for (g, o) in Self::dependents(i, uid) {
            if let Some(rt) = Self::type_for_gr(i, &g) {
                let _ = self.delete_locked(i, &rt, &o, &DeleteOpts::default());
            }
        }
    }

    /// Garbage collection: dependents all of whose owners are gone are deleted (background).
    pub(super) fn after_delete(&self, i: &mut Inner, gone: &Value) {
        let uid = meta_str(gone, "uid").to_string();
        for (g, o) in Self::dependents(i, &uid) {
            let owners_left = meta(&o, "ownerReferences")
                .and_then(Value::as_array)
                .map(|refs| {
                    refs.iter().any(|r| {
                        r.get("uid")
                            .and_then(Value::as_str)
                            .is_some_and(|u| i.uids.contains_key(u))
                    })
                })
                .unwrap_or(false);
            if owners_left {
                continue;
            }
            if let Some(rt) = Self::type_for_gr(i, &g)
                && let Some(cur) = i
                    .objects
                    .get(&g)
                    .and_then(|m| {
                        m.get(&(
                            meta_str(&o, "namespace").to_string(),
                            meta_str(&o, "name").to_string(),
                        ))
                    })
                    .cloned()
            {
                let _ = self.delete_locked(i, &rt, &cur, &DeleteOpts::default());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{configmap, deletes, store, type_of, writes};
    use super::super::{DeleteOpts, Store};
    use serde_json::{Value, json};

    /// Creates `name`, owned by the ConfigMaps `owners` (uids), and returns it.
    fn owned(store: &Store, name: &str, owners: &[&Value]) -> Value {
        let cms = type_of(store, "configmaps");
        let mut body = configmap(name);
        body["metadata"]["ownerReferences"] = owners
            .iter()
            .map(|o| {
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                "name": o["metadata"]["name"], "uid": o["metadata"]["uid"]})
            })
            .collect();
        (*store.create(&cms, "default", body, &writes()).unwrap().obj).clone()
    }

    #[test]
    fn a_dependent_goes_with_its_last_owner() {
        // pkg/controller/garbagecollector: a dependent is deleted once none of its owners
        // exists.
        let store = store();
        let cms = type_of(&store, "configmaps");
        let a = store
            .create(&cms, "default", configmap("a"), &writes())
            .unwrap()
            .obj;
        let b = store
            .create(&cms, "default", configmap("b"), &writes())
            .unwrap()
            .obj;
        owned(&store, "child", &[&a, &b]);
        store.delete(&cms, "default", "a", &deletes()).unwrap();
        assert!(
            store.get(&cms, "default", "child").is_ok(),
            "b still owns it"
        );
        store.delete(&cms, "default", "b", &deletes()).unwrap();
        assert_eq!(store.get(&cms, "default", "child").unwrap_err().code(), 404);
    }

    #[test]
    fn orphan_propagation_drops_the_reference_and_keeps_the_dependent() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        let a = store
            .create(&cms, "default", configmap("a"), &writes())
            .unwrap()
            .obj;
        owned(&store, "child", &[&a]);
        let d = DeleteOpts {
            propagation: Some("Orphan".into()),
            ..deletes()
        };
        store.delete(&cms, "default", "a", &d).unwrap();
        let child = store.get(&cms, "default", "child").unwrap();
        assert_eq!(child["metadata"]["ownerReferences"], json!([]));
    }

    #[test]
    fn foreground_propagation_deletes_the_dependents_first() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        let a = store
            .create(&cms, "default", configmap("a"), &writes())
            .unwrap()
            .obj;
        owned(&store, "child", &[&a]);
        let (_, mut rx, _) = store.watch(&cms, None, None).unwrap();
        let d = DeleteOpts {
            propagation: Some("Foreground".into()),
            ..deletes()
        };
        store.delete(&cms, "default", "a", &d).unwrap();
        let order: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| (e.etype, e.obj["metadata"]["name"].clone()))
            .collect();
        assert_eq!(
            order,
            [("DELETED", json!("child")), ("DELETED", json!("a"))]
        );
    }
}
