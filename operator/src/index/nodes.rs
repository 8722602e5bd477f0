//! [`NodeIndex`]: the Nodes `--node-selector` selects, fed by a Node watch, reporting
//! what the engine must hear of (`NodeManager::upsert_node` / `delete_node`).

mod project;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::Event;
use parking_lot::Mutex;
use tidepool_ipam::{NodeInfo, NodeName};

use super::LabelSelector;
use project::{NodeRecord, project};

/// A change of the selected Nodes, as one apply reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeChange {
    /// A Node now selected: new, relabelled into the selection, or re-registered (a new
    /// UID under a name known before, reported after the old one's `Removed`).
    Added(NodeInfo),
    /// A selected Node whose projection or labels changed (same UID).
    Changed(NodeInfo),
    /// A Node no longer selected: deleted, relabelled out, not relisted, or replaced by a
    /// new UID under its name. Carries what the index last held (the old UID).
    Removed(NodeInfo),
}

#[derive(Default)]
struct State {
    nodes: HashMap<NodeName, NodeRecord>,
    relist: Option<HashMap<NodeName, NodeRecord>>,
    ready: bool,
}

/// The selected Nodes as [`NodeInfo`] with their labels, by name. Clones share one index.
#[derive(Clone)]
pub struct NodeIndex {
    selector: Arc<LabelSelector>,
    state: Arc<Mutex<State>>,
}

impl NodeIndex {
    pub fn new(selector: LabelSelector) -> Self {
        Self {
            selector: Arc::new(selector),
            state: Arc::default(),
        }
    }

    /// Applies one watch event (relist semantics: see [`crate::index`]). Returns the
    /// changes in the order the engine must hear them (a relist: the Nodes gone first,
    /// then the others by name; a re-registered Node's removal just before its addition).
    pub fn apply(&self, event: &Event<Node>) -> Vec<NodeChange> {
        let mut st = self.state.lock();
        let mut out = Vec::new();
        match event {
            Event::Apply(node) => {
                if let Some(rec) = project(node) {
                    let selected = self.selector.matches(&rec.labels);
                    st.put(rec, selected, &mut out);
                }
            }
            Event::Delete(node) => {
                if let Some(rec) = project(node) {
                    st.delete(&rec.info, &mut out);
                }
            }
            Event::Init => st.relist = Some(HashMap::new()),
            Event::InitApply(node) => {
                let rec = project(node).filter(|r| self.selector.matches(&r.labels));
                let relist = st.relist.get_or_insert_with(HashMap::new);
                relist.extend(rec.map(|r| (r.info.name.clone(), r)));
            }
            Event::InitDone => st.finish_relist(&mut out),
        }
        out
    }

    /// True once the first relist is complete.
    pub fn ready(&self) -> bool {
        self.state.lock().ready
    }

    /// The selected Node of that name.
    pub fn get(&self, name: &str) -> Option<NodeInfo> {
        self.state.lock().nodes.get(name).map(|r| r.info.clone())
    }

    /// Each selected Node's name and whether it carries the exhaustion taint.
    pub fn exhausted_taints(&self) -> Vec<(NodeName, bool)> {
        let st = self.state.lock();
        st.nodes
            .iter()
            .map(|(n, r)| (n.clone(), r.exhausted_taint))
            .collect()
    }

    /// The labels of the selected Node of that name (for IPPool node selectors).
    pub fn labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.state.lock().nodes.get(name).map(|r| r.labels.clone())
    }
}

impl State {
    /// The Node as it is now; `selected`: whether the selector takes it.
    fn put(&mut self, rec: NodeRecord, selected: bool, out: &mut Vec<NodeChange>) {
        let name = rec.info.name.clone();
        let old = self.nodes.get(&name);
        match old {
            Some(o) if selected && o.info.uid == rec.info.uid => {
                // the taint is the operator's own doing: nothing the engine must hear
                if (&o.info, &o.labels) != (&rec.info, &rec.labels) {
                    out.push(NodeChange::Changed(rec.info.clone()));
                }
                self.nodes.insert(name, rec);
                return;
            }
            Some(_) => {
                let o = self.nodes.remove(&name).expect("just seen");
                out.push(NodeChange::Removed(o.info));
            }
            None => {}
        }
        if selected {
            out.push(NodeChange::Added(rec.info.clone()));
            self.nodes.insert(name, rec);
        }
    }

    /// `Delete`: gone, if it is the Node the index holds (not an older one of its name).
    fn delete(&mut self, gone: &NodeInfo, out: &mut Vec<NodeChange>) {
        if self
            .nodes
            .get(&gone.name)
            .is_some_and(|o| o.info.uid == gone.uid)
            && let Some(o) = self.nodes.remove(&gone.name)
        {
            out.push(NodeChange::Removed(o.info));
        }
    }

    /// `InitDone`: the relisted Nodes replace the current ones.
    fn finish_relist(&mut self, out: &mut Vec<NodeChange>) {
        self.ready = true;
        // an InitDone with no Init before it (kube sends none) changes nothing
        let Some(mut relist) = self.relist.take() else {
            return;
        };
        let mut gone: Vec<NodeName> = (self.nodes.keys())
            .filter(|n| !relist.contains_key(*n))
            .cloned()
            .collect();
        gone.sort_unstable();
        for name in gone {
            let o = self.nodes.remove(&name).expect("listed");
            out.push(NodeChange::Removed(o.info));
        }
        let mut listed: Vec<NodeName> = relist.keys().cloned().collect();
        listed.sort_unstable();
        for name in listed {
            let rec = relist.remove(&name).expect("listed");
            self.put(rec, true, out);
        }
    }
}
