//! [`NodeNames`]: node names by number, so a record that names its node (a pod, an
//! address's holder) takes 4 bytes, not a string's 16: at 10,000 nodes there are a
//! million such records.

use std::mem::size_of;

use foldhash::HashMap;
use tidepool_ipam::NodeName;

/// Node names numbered in the order first seen; a name keeps its number for the run
/// (a node deleted and created again under its name is the same name).
#[derive(Default)]
pub(crate) struct NodeNames {
    by_id: Vec<NodeName>,
    /// A hash map: asked on every pod event, iterated never.
    ids: HashMap<NodeName, u32>,
}

impl NodeNames {
    /// The name's number, given on first sight.
    pub(crate) fn id(&mut self, name: &NodeName) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = u32::try_from(self.by_id.len()).expect("fewer than 2^32 node names");
        self.by_id.push(name.clone());
        self.ids.insert(name.clone(), id);
        id
    }

    /// The name's number, if it has one.
    pub(crate) fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// The name of a number [`NodeNames::id`] gave.
    pub(crate) fn name(&self, id: u32) -> &NodeName {
        &self.by_id[id as usize]
    }

    /// Estimated heap bytes (see `World::world_heap_estimate`).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.by_id.capacity() * size_of::<NodeName>()
            + tidepool_ipam::uid_table::hash_slots(self.ids.capacity())
                * (size_of::<(NodeName, u32)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_keeps_its_number() {
        let mut names = NodeNames::default();
        let (a, b) = (NodeName::from("a"), NodeName::from("b"));
        assert_eq!((names.id(&a), names.id(&b), names.id(&a)), (0, 1, 0));
        assert_eq!((names.get("b"), names.get("c")), (Some(1), None));
        assert_eq!(&**names.name(1), "b");
    }
}
