//! IPAMBlock objects (cluster-pool) in the in-memory store, behaving as the API server does:
//! a second create of a name is refused (AlreadyExists), every write bumps the one
//! resourceVersion, a delete can carry a resourceVersion precondition (409 when stale), and
//! every change reaches the subscribers and the hook.

use std::collections::BTreeMap;

use foldhash::HashMap;
use std::sync::Arc;

use super::MemoryNodeStore;
use crate::error::IpamError;
use crate::gate::Gate;
use crate::store::{BlockStore, ObjectKind, ReleaseMark, StoreEvent, Writer};
use crate::types::{IpamBlock, IpamNode, NodeName, NodeUid, ReleaseAck, ResourceVersion};

/// What a block write does.
enum Change {
    /// Nothing (a no-op apply does not bump the resourceVersion, as the API server).
    Keep,
    Put(IpamBlock),
    Delete,
}

#[derive(Default)]
pub(super) struct Blocks {
    by_name: BTreeMap<Arc<str>, Arc<IpamBlock>>,
    /// Each node's blocks by name (the objects themselves: `blocks_of` runs every pass).
    by_node: HashMap<NodeName, BTreeMap<Arc<str>, Arc<IpamBlock>>>,
    /// Per node, the store's write counter at the last write to one of its blocks.
    changes: HashMap<NodeName, u64>,
    /// The write counter at the last create, delete or spec change of any block.
    set_changes: u64,
}

impl MemoryNodeStore {
    /// Applies one block change under the lock: bumps the resourceVersion, indexes it,
    /// tells the hook and the subscribers. `f` gets the current object and says what to do;
    /// an `Err` leaves everything as it was. Returns the object as it is afterwards.
    fn write_block(
        &self,
        name: &str,
        writer: Writer,
        f: impl FnOnce(Option<&IpamBlock>) -> Result<Change, IpamError>,
    ) -> Result<Option<Arc<IpamBlock>>, IpamError> {
        let mut inner = self.inner.lock();
        if writer == Writer::Operator {
            inner.operator_writes += 1;
        }
        let old = inner.blocks.by_name.get(name).cloned();
        let new = match f(old.as_deref())? {
            Change::Keep => return Ok(old),
            Change::Put(b) => Some(b),
            Change::Delete if old.is_none() => return Ok(None),
            Change::Delete => None,
        };
        let rv = inner.next_version();
        let counter = inner.resource_version;
        let new = new.map(|mut b| {
            b.resource_version = Some(rv.clone());
            Arc::new(b)
        });
        let node = match (&new, &old) {
            (Some(b), _) | (None, Some(b)) => b.node.clone(),
            (None, None) => unreachable!("checked above"),
        };
        let blocks = &mut inner.blocks;
        blocks.changes.insert(node.clone(), counter);
        let same_spec = |a: &IpamBlock, b: &IpamBlock| {
            (&a.pool, a.cidr, &a.node, a.node_uid) == (&b.pool, b.cidr, &b.node, b.node_uid)
        };
        if !matches!((&old, &new), (Some(o), Some(n)) if same_spec(o, n)) {
            blocks.set_changes = counter;
        }
        match &new {
            Some(b) => {
                blocks.by_name.insert(b.name.clone(), b.clone());
                blocks
                    .by_node
                    .entry(b.node.clone())
                    .or_default()
                    .insert(b.name.clone(), b.clone());
            }
            None => {
                blocks.by_name.remove(name);
                if let Some(set) = blocks.by_node.get_mut(&node) {
                    set.remove(name);
                    if set.is_empty() {
                        blocks.by_node.remove(&node);
                    }
                }
            }
        }
        if let Some(h) = &self.hook {
            h.block_written(writer, old.as_deref(), new.as_deref());
        }
        let ev = StoreEvent {
            kind: ObjectKind::IpamBlock,
            name: node,
            resource_version: rv,
            writer,
            deleted: new.is_none(),
        };
        inner.subscribers.retain(|s| s.send(ev.clone()).is_ok());
        Ok(new)
    }

    /// The node side answers a block's release mark (its own field manager), or drops its
    /// answer (`None`). Nothing happens when the block is gone or the answer unchanged.
    pub fn ack_block(&self, name: &str, ack: Option<ReleaseAck>) -> Option<Arc<IpamBlock>> {
        self.write_block(name, Writer::NodeSide, |old| {
            Ok(match old {
                Some(b) if b.ack != ack => Change::Put(IpamBlock { ack, ..b.clone() }),
                _ => Change::Keep,
            })
        })
        .ok()
        .flatten()
    }

    /// The block of that name in the cache.
    pub fn cached_block(&self, name: &str) -> Option<Arc<IpamBlock>> {
        self.inner.lock().blocks.by_name.get(name).cloned()
    }
}

fn not_found(name: &str) -> IpamError {
    IpamError::NotFound {
        name: name.to_string(),
    }
}

impl BlockStore for MemoryNodeStore {
    fn blocks_of(&self, node: &str) -> Vec<Arc<IpamBlock>> {
        let inner = self.inner.lock();
        let b = &inner.blocks;
        b.by_node
            .get(node)
            .map_or_else(Vec::new, |blocks| blocks.values().cloned().collect())
    }

    fn node_blocks_changes(&self, node: &str) -> u64 {
        let inner = self.inner.lock();
        inner.blocks.changes.get(node).copied().unwrap_or(0)
    }

    fn block_set_changes(&self) -> u64 {
        self.inner.lock().blocks.set_changes
    }

    fn list_blocks(&self) -> Vec<Arc<IpamBlock>> {
        self.inner.lock().blocks.by_name.values().cloned().collect()
    }

    fn list_nodes(&self) -> Vec<Arc<IpamNode>> {
        self.list()
    }

    async fn create_block<G: Gate>(
        &self,
        block: IpamBlock,
        gate: &mut G,
    ) -> Result<Arc<IpamBlock>, IpamError> {
        gate.request().await?;
        let name = block.name.clone();
        let new = self.write_block(&name, Writer::Operator, |old| match old {
            Some(_) => Err(IpamError::AlreadyExists {
                name: name.to_string(),
            }),
            None => Ok(Change::Put(block)),
        })?;
        Ok(new.expect("a create writes"))
    }

    async fn get_block(&self, name: &str) -> Result<Option<Arc<IpamBlock>>, IpamError> {
        Ok(self.cached_block(name))
    }

    async fn mark_block<G: Gate>(
        &self,
        name: &str,
        mark: ReleaseMark,
        gate: &mut G,
    ) -> Result<Arc<IpamBlock>, IpamError> {
        gate.request().await?;
        let release = mark.marked();
        let new = self.write_block(name, Writer::Operator, |old| match old {
            None => Err(not_found(name)),
            Some(b) if b.release == release => Ok(Change::Keep),
            Some(b) => Ok(Change::Put(IpamBlock {
                release,
                ..b.clone()
            })),
        })?;
        Ok(new.expect("checked present"))
    }

    async fn adopt_block<G: Gate>(
        &self,
        name: &str,
        node_uid: NodeUid,
        gate: &mut G,
    ) -> Result<Arc<IpamBlock>, IpamError> {
        gate.request().await?;
        let new = self.write_block(name, Writer::Operator, |old| match old {
            None => Err(not_found(name)),
            Some(b) if b.node_uid == node_uid => Ok(Change::Keep),
            Some(b) => Ok(Change::Put(IpamBlock {
                node_uid,
                ..b.clone()
            })),
        })?;
        Ok(new.expect("checked present"))
    }

    async fn delete_block<G: Gate>(
        &self,
        name: &str,
        expected: &ResourceVersion,
        gate: &mut G,
    ) -> Result<(), IpamError> {
        gate.request().await?;
        self.write_block(name, Writer::Operator, |old| match old {
            None => Err(not_found(name)),
            Some(b) if b.resource_version.as_ref() != Some(expected) => Err(IpamError::Conflict {
                name: name.to_string(),
                expected: expected.clone(),
            }),
            Some(_) => Ok(Change::Delete),
        })?;
        // the API server's second request: the operator's finalizer comes off (the object
        // is gone here already; the request is counted and budgeted as `run` makes it)
        gate.request().await?;
        self.inner.lock().operator_writes += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::Ungated;
    use crate::types::NodeUid;

    fn block(cidr: &str, node: &str) -> IpamBlock {
        let cidr: ipnet::IpNet = cidr.parse().unwrap();
        IpamBlock {
            name: crate::pool::block_name(&cidr).into(),
            cidr,
            pool: "default".into(),
            node: node.into(),
            node_uid: NodeUid(7),
            release: false,
            ack: None,
            resource_version: None,
            deleting: false,
        }
    }

    #[tokio::test]
    async fn blocks_behave_like_api_server_objects() {
        let s = MemoryNodeStore::new();
        let mut rx = s.subscribe();
        let a = s
            .create_block(block("10.0.0.16/28", "n1"), &mut Ungated)
            .await
            .unwrap();
        assert_eq!(a.resource_version, Some(ResourceVersion::counter(1)));
        // a second create of the name is refused, whoever asks
        assert!(matches!(
            s.create_block(block("10.0.0.16/28", "n2"), &mut Ungated)
                .await,
            Err(IpamError::AlreadyExists { .. })
        ));
        assert_eq!(s.blocks_of("n1").len(), 1);
        assert!(s.blocks_of("n2").is_empty());
        // each node's blocks have a version: the last write to one of them
        assert_eq!(
            (s.node_blocks_changes("n1"), s.node_blocks_changes("n2")),
            (1, 0)
        );
        assert_eq!(s.block_set_changes(), 1, "a create changes the set");
        // marking bumps the resourceVersion; re-marking does not
        let m = s
            .mark_block(&a.name, ReleaseMark::Set, &mut Ungated)
            .await
            .unwrap();
        assert_eq!(m.resource_version, Some(ResourceVersion::counter(2)));
        assert_eq!(
            s.mark_block(&a.name, ReleaseMark::Set, &mut Ungated)
                .await
                .unwrap()
                .resource_version,
            Some(ResourceVersion::counter(2))
        );
        assert_eq!(s.node_blocks_changes("n1"), 2);
        let acked = s
            .ack_block(&a.name, Some(ReleaseAck::ReadyForRelease))
            .unwrap();
        assert_eq!(acked.resource_version, Some(ResourceVersion::counter(3)));
        assert_eq!(
            s.node_blocks_changes("n1"),
            3,
            "the node side's answers count too"
        );
        assert_eq!(s.block_set_changes(), 1, "marks and answers leave the set");
        // a delete with a stale precondition fails and changes nothing
        assert!(matches!(
            s.delete_block(&a.name, &ResourceVersion::counter(2), &mut Ungated).await,
            Err(IpamError::Conflict { expected, .. }) if expected == ResourceVersion::counter(2)
        ));
        assert!(s.cached_block(&a.name).is_some());
        s.delete_block(&a.name, &ResourceVersion::counter(3), &mut Ungated)
            .await
            .unwrap();
        assert!(s.blocks_of("n1").is_empty());
        assert_eq!(s.node_blocks_changes("n1"), 4, "and deletes");
        assert_eq!(s.block_set_changes(), 4, "a delete changes the set");
        assert!(matches!(
            s.delete_block(&a.name, &ResourceVersion::counter(3), &mut Ungated)
                .await,
            Err(IpamError::NotFound { .. })
        ));
        assert!(matches!(
            s.mark_block(&a.name, ReleaseMark::Withdraw, &mut Ungated)
                .await,
            Err(IpamError::NotFound { .. })
        ));
        let ev: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(ev.len(), 4, "create, mark, ack, delete: {ev:?}");
        assert!(
            ev.iter()
                .all(|e| e.kind == ObjectKind::IpamBlock && &*e.name == "n1")
        );
        assert_eq!(ev[2].writer, Writer::NodeSide);
        assert!(ev[3].deleted);
        // the successful delete is two requests (the finalizer's removal follows it)
        assert_eq!(
            s.operator_writes(),
            9,
            "node-side acks are not operator writes"
        );
    }
}
