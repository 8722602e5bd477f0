//! [`MemoryNodeStore`]: IPAMNodes (and, in `blocks`, IPAMBlocks) in memory, behaving as the
//! API server does: one monotonically increasing resourceVersion, no-op writes keep it,
//! change notifications to subscribers, a write hook, and event counts per reason.

mod blocks;

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::{EventType, NodeStore, ObjectKind, StoreEvent, StoreHook, Writer};
use crate::error::{ErrorClass, IpamError};
use crate::gate::Gate;
use crate::types::{
    IpamNode, NodeName, NodeSideFields, NodeUid, OperatorFields, ResourceVersion,
    WatermarkOverrides,
};
use crate::vocab::EventReason;

#[derive(Default)]
struct Inner {
    objects: BTreeMap<NodeName, Arc<IpamNode>>,
    blocks: blocks::Blocks,
    resource_version: u64,
    subscribers: Vec<mpsc::UnboundedSender<StoreEvent>>,
    events: BTreeMap<EventReason, u64>,
    /// The object and message of the last event of each reason.
    last_events: BTreeMap<EventReason, (String, String)>,
    /// Operator writes to fail (transient) before taking effect, for tests.
    fail_operator_writes: u32,
    operator_writes: u64,
}

impl Inner {
    /// The next resourceVersion: the store's write counter, one for IPAMNodes and blocks.
    fn next_version(&mut self) -> ResourceVersion {
        self.resource_version += 1;
        ResourceVersion::counter(self.resource_version)
    }
}

/// An in-memory IPAMNode store: one monotonically increasing resourceVersion, change
/// notifications to subscribers, and event counts per reason (and each reason's last event).
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
    pub fn event_count(&self, reason: EventReason) -> u64 {
        self.inner.lock().events.get(&reason).copied().unwrap_or(0)
    }

    /// The object and the message of the last event of `reason`, if any.
    pub fn last_event(&self, reason: EventReason) -> Option<(String, String)> {
        self.inner.lock().last_events.get(&reason).cloned()
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
        let rv = inner.next_version();
        new.resource_version = Some(rv.clone());
        let new = Arc::new(new);
        inner.objects.insert(name.clone(), new.clone());
        if let Some(h) = &self.hook
            && (writer != Writer::NodeSide || h.wants_node_side_writes())
        {
            h.written(writer, old.as_deref(), Some(&new));
        }
        let ev = StoreEvent {
            kind: ObjectKind::IpamNode,
            name: name.clone(),
            resource_version: rv,
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

    /// The node side changes its fields in place (its own field manager, as
    /// [`Self::apply_node`]) without the copy and comparison `apply_node` makes: `f` gets
    /// the object and its node-side fields and returns whether it changed them. The object
    /// it is shown has its node-side fields moved out into the second argument for the
    /// call, so it must read only the other fields. A change bumps the resourceVersion,
    /// reaches the hook and the subscribers; no change (`f` returns false, and then it must
    /// not have changed anything) leaves the object as it was and tells no one, as a no-op
    /// apply on the API server. The object is copied only when someone else holds the
    /// previous version (a reader's `Arc`) or the hook wants node-side writes (it gets the
    /// old and the new version). Returns the object as it is afterwards.
    pub fn update_node(
        &self,
        name: &NodeName,
        f: impl FnOnce(&IpamNode, &mut NodeSideFields) -> bool,
    ) -> Option<Arc<IpamNode>> {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let hook = self.hook.as_ref().filter(|h| h.wants_node_side_writes());
        let slot = inner.objects.get_mut(name)?;
        // The version before the write, when the write copies the object anyway (a reader
        // holds it) or the hook is to be shown it: a no-op then puts it back.
        let old = (hook.is_some() || Arc::strong_count(slot) > 1).then(|| slot.clone());
        let n = Arc::make_mut(slot);
        let mut side = std::mem::take(&mut n.node);
        let changed = f(n, &mut side);
        n.node = side;
        if !changed {
            // nothing changed: no new resourceVersion, no notification (as the API server);
            // a copy made goes, the object stays the one readers share
            if let Some(old) = old {
                *slot = old.clone();
                return Some(old);
            }
            return Some(slot.clone());
        }
        inner.resource_version += 1;
        let rv = ResourceVersion::counter(inner.resource_version);
        n.resource_version = Some(rv.clone());
        let new = slot.clone();
        if let Some(h) = hook {
            h.written(Writer::NodeSide, old.as_deref(), Some(&new));
        }
        drop(old);
        let ev = StoreEvent {
            kind: ObjectKind::IpamNode,
            name: name.clone(),
            resource_version: rv,
            writer: Writer::NodeSide,
            deleted: false,
        };
        inner.subscribers.retain(|s| s.send(ev.clone()).is_ok());
        Some(new)
    }
}

impl MemoryNodeStore {
    /// The API server requests an apply of `fields` takes (as the kube-backed store makes
    /// them, so the budget and `operator_writes` count what `run` would): a create is a
    /// POST and a status apply; otherwise one apply per part that changes, spec and status.
    fn apply_requests(&self, name: &str, node_uid: NodeUid, fields: &OperatorFields) -> u64 {
        match self.inner.lock().objects.get(name) {
            None => 2,
            Some(old) => {
                let spec = old.node_uid != node_uid || fields.spec_differs(&old.operator);
                let status = fields.conditions != old.operator.conditions;
                u64::from(spec) + u64::from(status)
            }
        }
    }
}

impl NodeStore for MemoryNodeStore {
    fn cached(&self, name: &str) -> Option<Arc<IpamNode>> {
        self.inner.lock().objects.get(name).cloned()
    }

    async fn get(&self, name: &str) -> Result<Option<Arc<IpamNode>>, IpamError> {
        Ok(self.cached(name))
    }

    async fn apply_operator<G: Gate>(
        &self,
        name: &NodeName,
        node_uid: NodeUid,
        fields: OperatorFields,
        gate: &mut G,
    ) -> Result<Arc<IpamNode>, IpamError> {
        let requests = self.apply_requests(name, node_uid, &fields);
        for _ in 0..requests {
            gate.request().await?;
        }
        {
            let mut inner = self.inner.lock();
            inner.operator_writes += requests;
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

    async fn remove<G: Gate>(&self, name: &str, gate: &mut G) -> Result<(), IpamError> {
        // the API server's two: the delete, then the finalizer's removal
        for _ in 0..2 {
            gate.request().await?;
        }
        let mut inner = self.inner.lock();
        inner.operator_writes += 2;
        if let Some(old) = inner.objects.remove(name) {
            let rv = inner.next_version();
            if let Some(h) = &self.hook {
                h.written(Writer::Operator, Some(&old), None);
            }
            let ev = StoreEvent {
                kind: ObjectKind::IpamNode,
                name: old.name.clone(),
                resource_version: rv,
                writer: Writer::Operator,
                deleted: true,
            };
            inner.subscribers.retain(|s| s.send(ev.clone()).is_ok());
        }
        Ok(())
    }

    fn event(&self, object: &str, _type: EventType, reason: EventReason, message: String) {
        let mut inner = self.inner.lock();
        *inner.events.entry(reason).or_default() += 1;
        inner
            .last_events
            .insert(reason, (object.to_string(), message));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::Ungated;
    use std::net::IpAddr;

    #[tokio::test]
    async fn writes_bump_one_resource_version_and_notify() {
        let s = MemoryNodeStore::new();
        let mut rx = s.subscribe();
        let name: NodeName = "n1".into();
        let a = s.create(IpamNode::new(name.clone(), NodeUid(7)));
        assert_eq!(a.resource_version, Some(ResourceVersion::counter(1)));
        let b = s.apply_node(&name, |f| {
            f.cooldown
                .insert("10.0.0.1".parse().unwrap(), std::time::UNIX_EPOCH);
        });
        assert_eq!(
            b.unwrap().resource_version,
            Some(ResourceVersion::counter(2))
        );
        // the operator's apply keeps the node side's fields
        let c = s
            .apply_operator(&name, NodeUid(7), OperatorFields::default(), &mut Ungated)
            .await
            .unwrap();
        assert_eq!(
            c.resource_version,
            Some(ResourceVersion::counter(2)),
            "no-op apply must not bump"
        );
        assert_eq!(c.node.cooldown.len(), 1);
        let ev: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[1].writer, Writer::NodeSide);
        s.fail_next_operator_writes(1);
        assert!(
            s.apply_operator(&name, NodeUid(7), OperatorFields::default(), &mut Ungated)
                .await
                .is_err()
        );
        s.remove("n1", &mut Ungated).await.unwrap();
        assert!(s.cached("n1").is_none());
        assert!(rx.try_recv().unwrap().deleted);
    }

    #[test]
    fn update_node_writes_in_place_and_skips_no_ops() {
        let s = MemoryNodeStore::new();
        let mut rx = s.subscribe();
        let name: NodeName = "n1".into();
        s.create(IpamNode::new(name.clone(), NodeUid(7)));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let held = s.cached("n1").unwrap();
        // a change: a new resourceVersion, a notification, and the reader's copy unchanged
        let b = s
            .update_node(&name, |n, side| {
                assert_eq!(n.node_uid, NodeUid(7));
                side.cooldown.insert(a, std::time::UNIX_EPOCH);
                true
            })
            .unwrap();
        assert_eq!(b.resource_version, Some(ResourceVersion::counter(2)));
        assert_eq!(b.node.cooldown.len(), 1);
        assert!(
            held.node.cooldown.is_empty(),
            "a reader's version never changes"
        );
        // no change: same version, nobody told, the object readers share stays
        let c = s
            .update_node(&name, |_, side| side.used.contains_key(&a))
            .unwrap();
        assert!(Arc::ptr_eq(&b, &c));
        assert_eq!(c.resource_version, Some(ResourceVersion::counter(2)));
        assert!(s.update_node(&"gone".into(), |_, _| true).is_none());
        let ev: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(ev.len(), 2);
        assert_eq!(
            (ev[1].writer, ev[1].resource_version.clone()),
            (Writer::NodeSide, ResourceVersion::counter(2))
        );
        // nobody else holds it: changed in place
        drop((b, c, held));
        let before = Arc::as_ptr(&s.cached("n1").unwrap());
        let d = s
            .update_node(&name, |_, side| side.cooldown.remove(&a).is_some())
            .unwrap();
        assert_eq!(Arc::as_ptr(&d), before);
        assert_eq!(d.resource_version, Some(ResourceVersion::counter(3)));
    }

    /// A hook that wants node-side writes sees the object before and after each one.
    #[test]
    fn update_node_shows_the_hook_old_and_new() {
        type Rv = Option<ResourceVersion>;
        #[derive(Default)]
        struct Seen(Mutex<Vec<(Writer, Rv, Rv)>>);
        impl StoreHook for Seen {
            fn written(&self, writer: Writer, old: Option<&IpamNode>, new: Option<&IpamNode>) {
                let rv = |n: Option<&IpamNode>| n.and_then(|n| n.resource_version.clone());
                self.0.lock().push((writer, rv(old), rv(new)));
            }
        }
        let seen = Arc::new(Seen::default());
        let s = MemoryNodeStore::new().with_hook(seen.clone());
        let name: NodeName = "n1".into();
        s.create(IpamNode::new(name.clone(), NodeUid(7)));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        s.update_node(&name, |_, side| {
            side.cooldown.insert(a, std::time::UNIX_EPOCH);
            true
        });
        s.update_node(&name, |_, _| false);
        assert_eq!(
            *seen.0.lock(),
            vec![
                (Writer::Operator, None, Some(ResourceVersion::counter(1))),
                (
                    Writer::NodeSide,
                    Some(ResourceVersion::counter(1)),
                    Some(ResourceVersion::counter(2))
                )
            ]
        );
    }

    /// Counts the requests it admits.
    #[derive(Default)]
    struct Counting(u32);

    impl Gate for Counting {
        async fn request(&mut self) -> Result<(), IpamError> {
            self.0 += 1;
            Ok(())
        }
    }

    /// The budget sees the requests `run` makes: a create is a POST and a status apply;
    /// then one apply per part (spec, status) that changes, none when nothing does; a
    /// removal is a delete and the finalizer's removal.
    #[tokio::test]
    async fn writes_are_charged_per_api_request() {
        let s = MemoryNodeStore::new();
        let name: NodeName = "n1".into();
        let charged = |fields: OperatorFields| {
            let (s, name) = (&s, &name);
            async move {
                let mut gate = Counting::default();
                s.apply_operator(name, NodeUid(7), fields, &mut gate)
                    .await
                    .unwrap();
                gate.0
            }
        };
        let mut f = OperatorFields::default();
        assert_eq!(charged(f.clone()).await, 2, "create");
        assert_eq!(charged(f.clone()).await, 0, "no change");
        f.reclaim.insert(
            "10.0.0.1".parse().unwrap(),
            crate::types::Tombstone {
                pod_uid: crate::types::PodUid(1),
                allocation: crate::types::AllocationId(1),
                reason: crate::types::ReclaimReason::PodDeleted,
            },
        );
        assert_eq!(charged(f.clone()).await, 1, "spec only");
        f.conditions.push(crate::types::Condition {
            type_: crate::vocab::ConditionType::Blocked,
            status: true,
            reason: crate::vocab::ConditionReason::Blocked(crate::vocab::Blocked::Exhausted),
            message: String::new(),
            last_transition: std::time::UNIX_EPOCH,
        });
        assert_eq!(charged(f.clone()).await, 1, "status only");
        f.reclaim.clear();
        f.conditions.clear();
        assert_eq!(charged(f).await, 2, "both");
        let mut gate = Counting::default();
        s.remove("n1", &mut gate).await.unwrap();
        assert_eq!(gate.0, 2, "remove");
        assert_eq!(s.operator_writes(), 2 + 1 + 1 + 2 + 2);
    }
}
