//! [`NodeTable`]: the maintainers by node name, in name order and by hash.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::types::NodeName;

/// Values by node name, kept twice: in name order (resyncs, sums and listings walk them
/// in that order, which keeps runs deterministic) and by hash (every pod and store event
/// looks one up: a B-tree of 1,000 names took ~900 instructions a lookup, string
/// comparisons mostly, 1.7 % of a simulated run; a hash lookup takes one comparison).
pub(crate) struct NodeTable<V> {
    ordered: BTreeMap<NodeName, Arc<V>>,
    index: foldhash::HashMap<NodeName, Arc<V>>,
}

impl<V> Default for NodeTable<V> {
    fn default() -> Self {
        Self {
            ordered: BTreeMap::new(),
            index: foldhash::HashMap::default(),
        }
    }
}

impl<V> NodeTable<V> {
    pub fn get(&self, name: &str) -> Option<&Arc<V>> {
        self.index.get(name)
    }

    pub fn insert(&mut self, name: NodeName, value: Arc<V>) {
        self.index.insert(name.clone(), value.clone());
        self.ordered.insert(name, value);
    }

    pub fn remove(&mut self, name: &str) -> Option<Arc<V>> {
        self.index.remove(name);
        self.ordered.remove(name)
    }

    pub fn len(&self) -> usize {
        self.ordered.len()
    }

    /// In name order.
    pub fn values(&self) -> impl Iterator<Item = &Arc<V>> {
        self.ordered.values()
    }

    /// In name order.
    pub fn keys(&self) -> impl Iterator<Item = &NodeName> {
        self.ordered.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_views_hold_the_same_values() {
        let mut t = NodeTable::default();
        for (n, v) in [("b", 2), ("a", 1), ("c", 3)] {
            t.insert(NodeName::from(n), Arc::new(v));
        }
        t.insert(NodeName::from("a"), Arc::new(10));
        assert_eq!(t.remove("c").as_deref(), Some(&3));
        assert_eq!(t.remove("c"), None);
        let keys: Vec<&str> = t.keys().map(|k| &**k).collect();
        assert_eq!(keys, ["a", "b"], "name order");
        let values: Vec<i32> = t.values().map(|v| **v).collect();
        assert_eq!(values, [10, 2]);
        assert_eq!(
            (t.get("a").map(|v| **v), t.get("c"), t.len()),
            (Some(10), None, 2)
        );
    }
}
