//! The stores the engine writes through: [`NodeStore`] (IPAMNode) and [`BlockStore`]
//! (IPAMBlock, cluster-pool), their change events and write hook; and an in-memory store
//! with resourceVersions, change notifications and a write hook ([`MemoryNodeStore`],
//! its blocks in `blocks`).
//!
//! Every write takes a [`Gate`] that admits each API request it makes; a caller that
//! budgets the write as a whole, or a test, passes [`crate::gate::Ungated`].

mod memory;

pub use memory::MemoryNodeStore;

use std::future::Future;
use std::sync::Arc;

use crate::error::IpamError;
use crate::gate::Gate;
use crate::types::{IpamBlock, IpamNode, NodeName, NodeUid, OperatorFields, ResourceVersion};
use crate::vocab::EventReason;

/// Who wrote a change (the field manager).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    Operator,
    NodeSide,
    User,
}

/// Which kind of object a change is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    IpamNode,
    /// An IPAMBlock; the event's `name` is then the block's node.
    IpamBlock,
}

/// A change notification (the informer's event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreEvent {
    pub kind: ObjectKind,
    /// The IPAMNode's name, or the node of an IPAMBlock.
    pub name: NodeName,
    pub resource_version: ResourceVersion,
    pub writer: Writer,
    pub deleted: bool,
}

/// What [`BlockStore::mark_block`] does to a block's release mark (`spec.release`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseMark {
    /// Marks the block for release.
    Set,
    /// Takes the mark back.
    Withdraw,
}

impl ReleaseMark {
    /// The block's `spec.release` once the mark is applied.
    pub fn marked(self) -> bool {
        self == Self::Set
    }
}

/// Kubernetes event severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// The engine's view of the IPAMNode resources.
pub trait NodeStore: Send + Sync + 'static {
    /// The latest copy known locally (the informer cache).
    fn cached(&self, name: &str) -> Option<Arc<IpamNode>>;
    /// A live read from the server (GET, not the cache).
    fn get(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Arc<IpamNode>>, IpamError>> + Send;
    /// The operator's fields written; creates the object if missing. Each API request (a
    /// create, a spec apply, a status apply: one per object and subresource that changes)
    /// is admitted by `gate` first.
    fn apply_operator<G: Gate>(
        &self,
        name: &NodeName,
        node_uid: NodeUid,
        fields: OperatorFields,
        gate: &mut G,
    ) -> impl Future<Output = Result<Arc<IpamNode>, IpamError>> + Send;
    /// Deletes the object and removes the operator's finalizer, letting it go; each API
    /// request admitted by `gate` first.
    fn remove<G: Gate>(
        &self,
        name: &str,
        gate: &mut G,
    ) -> impl Future<Output = Result<(), IpamError>> + Send;
    /// Records a Kubernetes event on the named object.
    fn event(&self, object: &str, type_: EventType, reason: EventReason, message: String);
    /// IPAMNodes whose recorded count of held addresses no longer matches what they hold
    /// (a block came or went since it was written). A store that records no count: none.
    fn stale_counts(&self) -> Vec<NodeName> {
        Vec::new()
    }
    /// Rewrites the IPAMNode's recorded count when it is stale, its request admitted by
    /// `gate`; whether it wrote.
    fn refresh_count<G: Gate>(
        &self,
        _name: &str,
        _gate: &mut G,
    ) -> impl Future<Output = Result<bool, IpamError>> + Send {
        async { Ok(false) }
    }
}

/// Sees every write, with the object before and after, in order (the node side's IPAMNode
/// writes only if [`StoreHook::wants_node_side_writes`]).
pub trait StoreHook: Send + Sync + 'static {
    fn written(&self, writer: Writer, old: Option<&IpamNode>, new: Option<&IpamNode>);
    /// An IPAMBlock was created (`old` None), changed, or deleted (`new` None).
    fn block_written(&self, _writer: Writer, _old: Option<&IpamBlock>, _new: Option<&IpamBlock>) {}
    /// Whether [`StoreHook::written`] wants the node side's IPAMNode writes. A hook that
    /// ignores them says false, and the store then skips copying the object before such a
    /// write ([`MemoryNodeStore::update_node`] can change it in place).
    fn wants_node_side_writes(&self) -> bool {
        true
    }
}

/// The IPAMBlock half of the store, as the cluster-pool source uses it.
pub trait BlockStore: Send + Sync + 'static {
    /// The node's blocks as the local cache knows them, in name order.
    fn blocks_of(&self, node: &str) -> Vec<Arc<IpamBlock>>;
    /// A local change counter, not a resourceVersion: it changes whenever one of the
    /// node's blocks is created, changed or deleted (0 if none ever was), so what a caller
    /// made of `blocks_of` stays right while it is the same.
    fn node_blocks_changes(&self, node: &str) -> u64;
    /// A local change counter, not a resourceVersion: it changes whenever a block is
    /// created or deleted, or its spec (pool, CIDR, node, node UID) changes; not with
    /// release marks and answers. What a caller made of the specs `list_blocks` gave stays
    /// right while it is the same.
    fn block_set_changes(&self) -> u64;
    /// Every block in the local cache, in name order.
    fn list_blocks(&self) -> Vec<Arc<IpamBlock>>;
    /// Every IPAMNode in the local cache (repair checks `status.used` against the blocks).
    fn list_nodes(&self) -> Vec<Arc<IpamNode>>;
    /// Creates the block: the claim, its request admitted by `gate` first. `AlreadyExists`
    /// when the name is taken.
    fn create_block<G: Gate>(
        &self,
        block: IpamBlock,
        gate: &mut G,
    ) -> impl Future<Output = Result<Arc<IpamBlock>, IpamError>> + Send;
    /// A live read (GET).
    fn get_block(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Arc<IpamBlock>>, IpamError>> + Send;
    /// Sets or withdraws the release mark (the operator's apply), its request admitted by
    /// `gate` first. `NotFound` when gone.
    fn mark_block<G: Gate>(
        &self,
        name: &str,
        mark: ReleaseMark,
        gate: &mut G,
    ) -> impl Future<Output = Result<Arc<IpamBlock>, IpamError>> + Send;
    /// Writes `node_uid` into the block's `spec.nodeUID` (the operator's apply): the block of
    /// a Node re-created under its name is adopted by the new incarnation. The request is
    /// admitted by `gate` first. `NotFound` when gone.
    fn adopt_block<G: Gate>(
        &self,
        name: &str,
        node_uid: NodeUid,
        gate: &mut G,
    ) -> impl Future<Output = Result<Arc<IpamBlock>, IpamError>> + Send;
    /// Deletes the block if its resourceVersion is still `expected` (else `Conflict`) and
    /// removes the operator's finalizer: the release. Each request (the delete, the
    /// finalizer's removal) is admitted by `gate` first. `NotFound` when gone.
    fn delete_block<G: Gate>(
        &self,
        name: &str,
        expected: &ResourceVersion,
        gate: &mut G,
    ) -> impl Future<Output = Result<(), IpamError>> + Send;
}
