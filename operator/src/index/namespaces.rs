//! [`NamespaceIndex`]: what the pool choice reads of each Namespace (DESIGN.md "Pools per
//! namespace and per pod": its labels, for the pools' `namespaceSelector`, the access
//! control; its `ipam.tidepool.dev/pools` annotation), fed by a Namespace watch with the
//! reflector's relist semantics ([`crate::index`]).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::watcher::Event;
use parking_lot::RwLock;
use tidepool_ipam::pool::choice::{Labels, POOLS_ANNOTATION};

/// One Namespace as the choice reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceTerms {
    pub labels: Labels,
    /// Its [`POOLS_ANNOTATION`].
    pub pools: Option<String>,
}

#[derive(Default)]
struct State {
    namespaces: HashMap<String, Arc<NamespaceTerms>>,
    relist: Option<HashMap<String, Arc<NamespaceTerms>>>,
    ready: bool,
}

/// Namespaces by name. Clones share one index.
#[derive(Clone, Default)]
pub struct NamespaceIndex {
    state: Arc<RwLock<State>>,
}

fn terms(ns: &Namespace) -> (String, Arc<NamespaceTerms>) {
    let meta = &ns.metadata;
    let pools = (meta.annotations.as_ref()).and_then(|a| a.get(POOLS_ANNOTATION).cloned());
    let t = NamespaceTerms {
        labels: meta.labels.clone().unwrap_or_default(),
        pools,
    };
    (meta.name.clone().unwrap_or_default(), Arc::new(t))
}

impl NamespaceIndex {
    /// Applies one watch event; returns the namespaces whose terms changed (appeared,
    /// changed or went), sorted.
    pub fn apply(&self, event: &Event<Namespace>) -> Vec<String> {
        let mut st = self.state.write();
        let mut changed = Vec::new();
        match event {
            Event::Apply(ns) => {
                let (name, t) = terms(ns);
                if st.namespaces.get(&name) != Some(&t) {
                    st.namespaces.insert(name.clone(), t);
                    changed.push(name);
                }
            }
            Event::Delete(ns) => {
                let (name, _) = terms(ns);
                if st.namespaces.remove(&name).is_some() {
                    changed.push(name);
                }
            }
            Event::Init => st.relist = Some(HashMap::new()),
            Event::InitApply(ns) => {
                let (name, t) = terms(ns);
                st.relist.get_or_insert_default().insert(name, t);
            }
            Event::InitDone => {
                st.ready = true;
                if let Some(new) = st.relist.take() {
                    let old = std::mem::replace(&mut st.namespaces, new);
                    let st = &*st;
                    changed.extend(
                        old.keys()
                            .filter(|n| !st.namespaces.contains_key(*n))
                            .cloned(),
                    );
                    changed.extend(
                        (st.namespaces.iter())
                            .filter(|(n, t)| old.get(*n) != Some(t))
                            .map(|(n, _)| n.clone()),
                    );
                }
            }
        }
        changed.sort_unstable();
        changed
    }

    /// The namespace's terms; `None` while the watch has not shown it.
    pub fn get(&self, name: &str) -> Option<Arc<NamespaceTerms>> {
        self.state.read().namespaces.get(name).cloned()
    }

    /// True once the first relist is complete.
    pub fn ready(&self) -> bool {
        self.state.read().ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ns(name: &str, labels: serde_json::Value, pools: Option<&str>) -> Namespace {
        let annotations = pools.map(|p| json!({ POOLS_ANNOTATION: p }));
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
        }))
        .unwrap()
    }

    #[test]
    fn namespaces_are_kept_as_the_choice_reads_them_and_changes_are_told() {
        let idx = NamespaceIndex::default();
        assert!(!idx.ready());
        idx.apply(&Event::Init);
        idx.apply(&Event::InitApply(ns("a", json!({"team": "a"}), None)));
        idx.apply(&Event::InitApply(ns("b", json!({}), Some("blue"))));
        assert!(idx.get("a").is_none(), "a relist answers once it is done");
        assert_eq!(idx.apply(&Event::InitDone), vec!["a", "b"]);
        assert!(idx.ready());
        assert_eq!(idx.get("b").unwrap().pools.as_deref(), Some("blue"));
        let a = ns("a", json!({"team": "a"}), None);
        assert!(
            idx.apply(&Event::Apply(a)).is_empty(),
            "no change, nothing told"
        );
        let a = ns("a", json!({"team": "blue"}), None);
        assert_eq!(idx.apply(&Event::Apply(a)), vec!["a"]);
        assert_eq!(idx.get("a").unwrap().labels["team"], "blue");
        // a relist that misses b and changes nothing of a tells b only
        idx.apply(&Event::Init);
        idx.apply(&Event::InitApply(ns("a", json!({"team": "blue"}), None)));
        assert_eq!(idx.apply(&Event::InitDone), vec!["b"]);
        assert!(idx.get("b").is_none());
        assert_eq!(
            idx.apply(&Event::Delete(ns("a", json!({}), None))),
            vec!["a"]
        );
    }
}
