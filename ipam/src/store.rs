//! The per-node resource store (IPAMNode): the trait the engine writes through, and an
//! in-memory implementation with resourceVersions, change notifications and a write hook.
//! The same in-memory store keeps the IPAMBlock objects of cluster-pool ([`blocks`]).

mod blocks;

pub use blocks::BlockStore;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::error::{ErrorClass, IpamError};
use crate::types::{
    IpamBlock, IpamNode, NodeName, NodeSideFields, OperatorFields, WatermarkOverrides,
};

/// Who wrote a change (the field manager).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    Operator,
    NodeSide,
    User,
}

/// Which kind of object a change is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    pub resource_version: u64,
    pub writer: Writer,
    pub deleted: bool,
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
    /// One server-side apply of the operator's fields; creates the object if missing.
    fn apply_operator(
        &self,
        name: &NodeName,
        node_uid: u128,
        fields: OperatorFields,
    ) -> impl Future<Output = Result<Arc<IpamNode>, IpamError>> + Send;
    /// Removes the operator's finalizer, letting the object go.
    fn remove(&self, name: &str) -> impl Future<Output = Result<(), IpamError>> + Send;
    /// Records a Kubernetes event on the named object.
    fn event(&self, object: &str, type_: EventType, reason: &'static str, message: String);
}

/// Sees every write, with the object before and after, in order.
pub trait StoreHook: Send + Sync + 'static {
    fn written(&self, writer: Writer, old: Option<&IpamNode>, new: Option<&IpamNode>);
    /// An IPAMBlock was created (`old` None), changed, or deleted (`new` None).
    fn block_written(&self, _writer: Writer, _old: Option<&IpamBlock>, _new: Option<&IpamBlock>) {}
}

#[derive(Default)]
struct Inner {
    objects: BTreeMap<NodeName, Arc<IpamNode>>,
    blocks: blocks::Blocks,
    resource_version: u64,
    subscribers: Vec<mpsc::UnboundedSender<StoreEvent>>,
    events: BTreeMap<&'static str, u64>,
    /// Operator writes to fail (transient) before taking effect, for tests.
    fail_operator_writes: u32,
    operator_writes: u64,
}

/// An in-memory IPAMNode store: one monotonically increasing resourceVersion, change
/// notifications to subscribers, and event counts per reason.
#[derive(Clone, Default)]
pub struct MemoryNodeStore {
    inner: Arc<Mutex<Inner>>,
    hook: Option<Arc<dyn StoreHook>>,
}

impl MemoryNodeStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_hook(mut self, hook: Arc<dyn StoreHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// A stream of every change from now on.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<StoreEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.inner.lock().subscribers.push(tx);
        rx
    }

    /// How many events of `reason` were recorded.
    pub fn event_count(&self, reason: &str) -> u64 {
        self.inner.lock().events.get(reason).copied().unwrap_or(0)
    }

    /// Operator write requests received (applies and deletes).
    pub fn operator_writes(&self) -> u64 {
        self.inner.lock().operator_writes
    }

    /// Makes the next `n` operator writes fail with a transient error.
    pub fn fail_next_operator_writes(&self, n: u32) {
        self.inner.lock().fail_operator_writes = n;
    }

    /// Every object, in name order.
    pub fn list(&self) -> Vec<Arc<IpamNode>> {
        self.inner.lock().objects.values().cloned().collect()
    }

    fn write(
        &self,
        name: &NodeName,
        writer: Writer,
        f: impl FnOnce(Option<&IpamNode>) -> Option<IpamNode>,
    ) -> Option<Arc<IpamNode>> {
        let mut inner = self.inner.lock();
        let old = inner.objects.get(name).cloned();
        let mut new = f(old.as_deref())?;
        if old.as_deref().is_some_and(|o| {
            o.node_uid == new.node_uid
                && o.watermarks == new.watermarks
                && o.operator == new.operator
                && o.node == new.node
                && o.finalizer == new.finalizer
        }) {
            // A no-op apply does not bump the resourceVersion (as the API server).
            return old;
        }
        inner.resource_version += 1;
        new.resource_version = inner.resource_version;
        let new = Arc::new(new);
        inner.objects.insert(name.clone(), new.clone());
        if let Some(h) = &self.hook {
            h.written(writer, old.as_deref(), Some(&new));
        }
        let ev = StoreEvent {
            kind: ObjectKind::IpamNode,
            name: name.clone(),
            resource_version: new.resource_version,
            writer,
            deleted: false,
        };
        inner.subscribers.retain(|s| s.send(ev.clone()).is_ok());
        Some(new)
    }

    /// Creates the object (the operator does this when a Node appears).
    pub fn create(&self, node: IpamNode) -> Arc<IpamNode> {
        let name = node.name.clone();
        self.write(&name, Writer::Operator, |_| Some(node))
            .expect("create always writes")
    }

    /// A user edits `spec.watermarks`.
    pub fn set_watermarks(&self, name: &NodeName, w: WatermarkOverrides) -> Option<Arc<IpamNode>> {
        self.write(name, Writer::User, |old| {
            let mut n = old?.clone();
            n.watermarks = w;
            Some(n)
        })
    }

    /// The node side applies its fields (its own field manager: never conflicts with the operator).
    pub fn apply_node(
        &self,
        name: &NodeName,
        f: impl FnOnce(&mut NodeSideFields),
    ) -> Option<Arc<IpamNode>> {
        self.write(name, Writer::NodeSide, |old| {
            let mut n = old?.clone();
            f(&mut n.node);
            Some(n)
        })
    }
}

impl NodeStore for MemoryNodeStore {
    fn cached(&self, name: &str) -> Option<Arc<IpamNode>> {
        self.inner.lock().objects.get(name).cloned()
    }

    async fn get(&self, name: &str) -> Result<Option<Arc<IpamNode>>, IpamError> {
        Ok(self.cached(name))
    }

    async fn apply_operator(
        &self,
        name: &NodeName,
        node_uid: u128,
        fields: OperatorFields,
    ) -> Result<Arc<IpamNode>, IpamError> {
        {
            let mut inner = self.inner.lock();
            inner.operator_writes += 1;
            if inner.fail_operator_writes > 0 {
                inner.fail_operator_writes -= 1;
                return Err(IpamError::Store {
                    op: "apply",
                    name: name.to_string(),
                    class: ErrorClass::Transient,
                    message: "injected write failure".into(),
                });
            }
        }
        Ok(self
            .write(name, Writer::Operator, |old| {
                let mut n = old
                    .cloned()
                    .unwrap_or_else(|| IpamNode::new(name.clone(), node_uid));
                n.node_uid = node_uid;
                n.operator = fields;
                Some(n)
            })
            .expect("apply always writes"))
    }

    async fn remove(&self, name: &str) -> Result<(), IpamError> {
        let mut inner = self.inner.lock();
        inner.operator_writes += 1;
        if let Some(old) = inner.objects.remove(name) {
            inner.resource_version += 1;
            if let Some(h) = &self.hook {
                h.written(Writer::Operator, Some(&old), None);
            }
            let ev = StoreEvent {
                kind: ObjectKind::IpamNode,
                name: old.name.clone(),
                resource_version: inner.resource_version,
                writer: Writer::Operator,
                deleted: true,
            };
            inner.subscribers.retain(|s| s.send(ev.clone()).is_ok());
        }
        Ok(())
    }

    fn event(&self, _object: &str, _type: EventType, reason: &'static str, _message: String) {
        *self.inner.lock().events.entry(reason).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_bump_one_resource_version_and_notify() {
        let s = MemoryNodeStore::new();
        let mut rx = s.subscribe();
        let name: NodeName = "n1".into();
        let a = s.create(IpamNode::new(name.clone(), 7));
        assert_eq!(a.resource_version, 1);
        let b = s.apply_node(&name, |f| {
            f.cooldown
                .insert("10.0.0.1".parse().unwrap(), std::time::UNIX_EPOCH);
        });
        assert_eq!(b.unwrap().resource_version, 2);
        // the operator's apply keeps the node side's fields
        let c = s
            .apply_operator(&name, 7, OperatorFields::default())
            .await
            .unwrap();
        assert_eq!(c.resource_version, 2, "no-op apply must not bump");
        assert_eq!(c.node.cooldown.len(), 1);
        let ev: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[1].writer, Writer::NodeSide);
        s.fail_next_operator_writes(1);
        assert!(
            s.apply_operator(&name, 7, OperatorFields::default())
                .await
                .is_err()
        );
        s.remove("n1").await.unwrap();
        assert!(s.cached("n1").is_none());
        assert!(rx.try_recv().unwrap().deleted);
    }
}
