//! Reads (get, list with continue tokens) and `commit`, the one place a change is stored:
//! it takes the next resourceVersion, keeps the uid and owner indexes right and logs the
//! event for watches.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::meta::{meta_mut, meta_str};
use super::{Inner, Listed, Store, WatchEvent, event_line};
use crate::error::Error;
use crate::paging::{Token, key_of, start_after};
use crate::registry::ResType;
use crate::selector::Selector;

/// The stored objects as admission policies read them (params, the request's namespace),
/// under the lock a write holds.
pub(super) struct Stored<'a>(pub(super) &'a Inner);

impl crate::admission_params::Objects for Stored<'_> {
    fn of_kind(&self, api_version: &str, kind: &str) -> Option<(bool, Vec<Arc<Value>>)> {
        let rt =
            (self.0.types.values()).find(|t| t.api_version() == api_version && t.kind == kind)?;
        let objects = (self.0.objects.get(&rt.storage_gr()).into_iter())
            .flat_map(|m| m.values().map(|o| Store::present(rt, o)))
            .collect();
        Some((rt.namespaced, objects))
    }

    fn namespace(&self, name: &str) -> Option<Arc<Value>> {
        let key = (String::new(), name.to_string());
        self.0.objects.get("namespaces")?.get(&key).cloned()
    }
}

impl Store {
    /// Every stored object of a resource (`plural.group`), in all namespaces.
    pub(crate) fn objects_of(&self, gr: &str) -> Vec<Arc<Value>> {
        let i = self.inner.lock();
        i.objects
            .get(gr)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn get(&self, rt: &ResType, ns: &str, name: &str) -> Result<Arc<Value>, Error> {
        let i = self.inner.lock();
        Self::lookup(&i, rt, ns, name).map(|o| Self::present(rt, &o))
    }

    /// The stored object (in its storage version), or 404.
    pub(super) fn lookup(
        i: &Inner,
        rt: &ResType,
        ns: &str,
        name: &str,
    ) -> Result<Arc<Value>, Error> {
        i.objects
            .get(&rt.storage_gr())
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
            .ok_or_else(|| Error::not_found(&rt.group, &rt.plural, name))
    }

    /// One page of a list: from the current state, or from the snapshot a continue token
    /// names (see [`crate::paging`]; a snapshot older than `max_age` is expired).
    pub(crate) fn list(
        &self,
        rt: &ResType,
        ns: Option<&str>,
        sel: &Selector,
        limit: Option<usize>,
        cont: Option<&str>,
        max_age: Option<Duration>,
    ) -> Result<Listed, Error> {
        let mut i = self.inner.lock();
        let token = match cont {
            Some(c) => Some(Token::parse(c).ok_or_else(|| {
                Error::bad_request("invalid continue token: continue key is not valid")
            })?),
            None => None,
        };
        let (rv, all, id) = match &token {
            Some(Token::Snapshot { id, after }) => match i.snapshots.get(id) {
                Some(s) if !s.expired(max_age) => (s.rv, s.items.clone(), Some(*id)),
                _ => {
                    i.snapshots.remove(id);
                    let after = after.clone();
                    return Err(Error::ContinueExpired(Token::Latest { after }.encode()));
                }
            },
            Some(Token::Latest { .. }) | None => {
                (i.rv, Arc::new(Self::matching(&i, rt, ns, sel)), None)
            }
        };
        let offset = start_after(&all, token.as_ref().map(Token::after));
        let limit = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let end = offset.saturating_add(limit).min(all.len());
        let items = all[offset.min(end)..end].to_vec();
        let mut next = None;
        if end < all.len() {
            let id = id.unwrap_or_else(|| i.keep_snapshot(rv, all.clone()));
            let after = key_of(&items[items.len() - 1]);
            next = Some(Token::Snapshot { id, after }.encode());
        } else if let Some(id) = id {
            i.snapshots.remove(&id);
        }
        Ok(Listed {
            items,
            rv,
            remaining: next.as_ref().map(|_| all.len() - end),
            cont: next,
        })
    }

    /// The objects of `rt` in `ns` (all namespaces: `None`) that `sel` selects, in key order.
    fn matching(i: &Inner, rt: &ResType, ns: Option<&str>, sel: &Selector) -> Vec<Arc<Value>> {
        i.objects
            .get(&rt.storage_gr())
            .map(|m| {
                m.iter()
                    .filter(|((ons, _), o)| ns.is_none_or(|n| n == ons) && sel.matches(o))
                    .map(|(_, o)| Self::present(rt, o))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Stores a change (`ADDED`, `MODIFIED` or `DELETED`) at the next resourceVersion.
    pub(super) fn commit(
        &self,
        i: &mut Inner,
        gr: &str,
        etype: &'static str,
        mut obj: Value,
        prev: Option<Arc<Value>>,
    ) -> Arc<Value> {
        i.rv += 1;
        let rv = i.rv;
        let ns = meta_str(&obj, "namespace").to_string();
        let name = meta_str(&obj, "name").to_string();
        let uid = meta_str(&obj, "uid").to_string();
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let obj = Arc::new(obj);
        let key = (ns.clone(), name);
        let map = i.objects.entry(gr.to_string()).or_default();
        let stored = if etype == "DELETED" {
            i.uids.remove(&uid);
            map.remove(&key)
        } else {
            i.uids.insert(uid, (gr.to_string(), key.clone()));
            map.insert(key.clone(), obj.clone())
        };
        let now = (etype != "DELETED").then_some(&obj);
        Self::index_owners(i, gr, &key, stored.as_deref(), now.map(|o| &**o));
        let ev = Arc::new(WatchEvent {
            rv,
            gr: gr.to_string(),
            ns,
            etype,
            line: event_line(etype, &obj),
            obj: obj.clone(),
            prev,
        });
        self.log_event(i, ev);
        obj
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{configmap, rv_of, store, type_of, writes};
    use crate::selector::Selector;
    use serde_json::json;

    fn everything() -> Selector {
        Selector::default()
    }

    #[test]
    fn each_create_takes_the_next_resource_version_and_get_reads_it_back() {
        // One global, monotonically increasing resourceVersion (etcd's revision).
        let store = store();
        let cms = type_of(&store, "configmaps");
        let before = store.current_rv();
        let a = store
            .create(&cms, "default", configmap("a"), &writes())
            .unwrap();
        let b = store
            .create(&cms, "kube-system", configmap("b"), &writes())
            .unwrap();
        assert_eq!((rv_of(&a.obj), rv_of(&b.obj)), (before + 1, before + 2));
        assert_eq!(store.current_rv(), before + 2);
        assert_eq!(a.code, 201);
        let got = store.get(&cms, "default", "a").unwrap();
        assert_eq!(got, a.obj);
        assert_eq!(got["data"], json!({"k": "v"}));
        let missing = store.get(&cms, "kube-system", "a").unwrap_err();
        assert_eq!(missing.code(), 404);
        assert_eq!(
            missing.to_string(),
            "404 NotFound: configmaps \"a\" not found"
        );
    }

    #[test]
    fn a_list_answers_the_current_version_and_the_namespace_asked_for() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        for (ns, n) in [("default", "b"), ("default", "a"), ("kube-system", "c")] {
            store.create(&cms, ns, configmap(n), &writes()).unwrap();
        }
        let all = store
            .list(&cms, None, &everything(), None, None, None)
            .unwrap();
        assert_eq!(all.rv, store.current_rv());
        let names: Vec<_> = all
            .items
            .iter()
            .map(|o| o["metadata"]["name"].clone())
            .collect();
        assert_eq!(names, [json!("a"), json!("b"), json!("c")]);
        assert_eq!((all.cont, all.remaining), (None, None));
        let def = store
            .list(&cms, Some("default"), &everything(), None, None, None)
            .unwrap();
        assert_eq!(def.items.len(), 2);
        assert_eq!(store.objects_of("configmaps").len(), 3);
    }

    #[test]
    fn a_paged_list_continues_from_its_snapshot() {
        // A continue token serves the list at the version of its first page
        // (k8s.io/apiserver pkg/storage/etcd3/store.go `GetList`).
        let store = store();
        let cms = type_of(&store, "configmaps");
        for n in ["a", "b", "c"] {
            store
                .create(&cms, "default", configmap(n), &writes())
                .unwrap();
        }
        let first = store
            .list(&cms, None, &everything(), Some(2), None, None)
            .unwrap();
        assert_eq!(first.items.len(), 2);
        assert_eq!(first.remaining, Some(1));
        let token = first.cont.clone().expect("a continue token");
        store
            .create(&cms, "default", configmap("d"), &writes())
            .unwrap();
        let rest = store
            .list(&cms, None, &everything(), Some(2), Some(&token), None)
            .unwrap();
        let names: Vec<_> = rest
            .items
            .iter()
            .map(|o| o["metadata"]["name"].clone())
            .collect();
        assert_eq!(names, [json!("c")], "d came after the snapshot");
        assert_eq!(rest.rv, first.rv);
        assert_eq!(rest.cont, None);
        let bad = store
            .list(&cms, None, &everything(), None, Some("junk"), None)
            .unwrap_err();
        assert_eq!(bad.code(), 400);
    }
}
