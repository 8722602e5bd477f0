//! The store's local copy of IPAMNodes and IPAMBlocks, fed by watch events with relist
//! semantics (kube's reflector: a relist's objects replace the old set at `InitDone`).
//! Pure: each apply says which [`StoreEvent`]s the engine must hear and which entries
//! could not be read.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use kube::runtime::watcher::Event;
use tidepool_api as api;
use tidepool_ipam::{IpamBlock, NodeName, ObjectKind, ResourceVersion, StoreEvent, Writer};

use crate::convert::{Malformed, NodeView, block_from_api, node_from_api};

/// How many of our own writes' resourceVersions are remembered to tell their echoes apart.
const OWN_WRITES: usize = 4096;

/// A block with its `metadata.uid`, when the server told it.
type UidBlock = (Arc<IpamBlock>, Option<Arc<str>>);

/// What one apply changed.
#[derive(Debug, Default, PartialEq)]
pub struct Applied {
    pub events: Vec<StoreEvent>,
    pub malformed: Vec<Malformed>,
}

#[derive(Default)]
pub struct Cache {
    nodes: HashMap<NodeName, NodeView>,
    blocks: BTreeMap<Arc<str>, Arc<IpamBlock>>,
    /// Each block's `metadata.uid` (what its applies carry).
    block_uids: HashMap<Arc<str>, Arc<str>>,
    blocks_by_node: HashMap<NodeName, BTreeSet<Arc<str>>>,
    /// Per node, a counter bumped whenever one of its blocks changes.
    node_block_changes: HashMap<NodeName, u64>,
    block_set_changes: u64,
    changes: u64,
    node_relist: Option<Vec<NodeView>>,
    block_relist: Option<Vec<UidBlock>>,
    pub nodes_ready: bool,
    pub blocks_ready: bool,
    /// Lists (watch relists) of IPAMNodes and of IPAMBlocks completed so far.
    pub lists: (u64, u64),
    own: OwnWrites,
    /// Objects we wrote through (took in at once): their watch events older than our
    /// write's echo are skipped, so the copy never goes back in time.
    pending: HashMap<(ObjectKind, Arc<str>), Expect>,
}

/// The echo a written-through object waits for.
struct Expect {
    /// The resourceVersion our write returned; None: our delete.
    version: Option<u64>,
    /// Someone else wrote in between (their event was skipped): the echo is news.
    foreign: bool,
}

/// What to do with a watch event for an object we wrote through.
enum Echo {
    /// Not written through: apply as usual.
    Apply,
    /// Older than our write: skip.
    Skip,
    /// The echo itself: apply; `true` when a skipped event was someone else's.
    Arrived(bool),
}

/// The resourceVersions our own writes returned, oldest first.
#[derive(Default)]
struct OwnWrites {
    order: VecDeque<ResourceVersion>,
    set: BTreeSet<u64>,
}

impl OwnWrites {
    fn note(&mut self, rv: &ResourceVersion) {
        if self.order.len() == OWN_WRITES
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old.fingerprint());
        }
        self.set.insert(rv.fingerprint());
        self.order.push_back(rv.clone());
    }

    fn writer(&self, rv: Option<&ResourceVersion>) -> Writer {
        match rv {
            Some(rv) if self.set.contains(&rv.fingerprint()) => Writer::Operator,
            _ => Writer::User,
        }
    }
}

impl Cache {
    pub fn node(&self, name: &str) -> Option<&NodeView> {
        self.nodes.get(name)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &NodeView> {
        self.nodes.values()
    }

    pub fn block(&self, name: &str) -> Option<&Arc<IpamBlock>> {
        self.blocks.get(name)
    }

    /// The block's `metadata.uid`, when the server told it.
    pub fn block_uid(&self, name: &str) -> Option<Arc<str>> {
        self.block_uids.get(name).cloned()
    }

    pub fn blocks(&self) -> impl Iterator<Item = &Arc<IpamBlock>> {
        self.blocks.values()
    }

    pub fn blocks_of(&self, node: &str) -> Vec<Arc<IpamBlock>> {
        self.blocks_by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|n| self.blocks.get(n).cloned())
            .collect()
    }

    pub fn node_blocks_changes(&self, node: &str) -> u64 {
        self.node_block_changes.get(node).copied().unwrap_or(0)
    }

    pub fn block_set_changes(&self) -> u64 {
        self.block_set_changes
    }

    /// A write of ours returned this resourceVersion: its echo is the operator's.
    pub fn own_write(&mut self, rv: &ResourceVersion) {
        self.own.note(rv);
    }

    /// Takes an object we wrote (or read) in at once; its watch events up to the echo are
    /// skipped. A copy the watch already brought newer stays ([`holds_newer`]).
    pub fn put_node(&mut self, view: NodeView) {
        let name: Arc<str> = view.node.name.clone();
        let seen = self.nodes.get(&*name).map(|v| &v.node.resource_version);
        if holds_newer(seen, view.node.resource_version.as_ref()) {
            return;
        }
        // a write that changed nothing returns the version already held: no echo comes
        if seen != Some(&view.node.resource_version) {
            let rv = view.node.resource_version.clone();
            self.expect(ObjectKind::IpamNode, name, rv.as_ref());
        }
        self.nodes.insert(view.node.name.clone(), view);
    }

    pub fn put_block(&mut self, b: Arc<IpamBlock>, uid: Option<Arc<str>>) {
        let seen = self.blocks.get(&b.name).map(|o| &o.resource_version);
        if holds_newer(seen, b.resource_version.as_ref()) {
            return;
        }
        if seen != Some(&b.resource_version) {
            let rv = b.resource_version.clone();
            self.expect(ObjectKind::IpamBlock, b.name.clone(), rv.as_ref());
        }
        self.upsert_block(b, uid);
    }

    /// Our delete of a block went through (its finalizer off), or the server said the
    /// block we hold is gone: gone at once, its late events skipped until its deletion's.
    pub fn drop_block(&mut self, name: &str) {
        self.expect(ObjectKind::IpamBlock, name.into(), None);
        self.remove_block(name);
    }

    /// The server said the IPAMNode we hold is gone: gone at once, its late events skipped
    /// until its deletion's (the engine re-reads it and creates it anew by POST).
    pub fn drop_node(&mut self, name: &str) {
        self.expect(ObjectKind::IpamNode, name.into(), None);
        self.nodes.remove(name);
    }

    /// A deletion event of `uid` is for the object held under its name: not for an older
    /// object of that name, which a newer one replaced.
    fn deletes_held(held: Option<&str>, uid: Option<&str>) -> bool {
        match (held, uid) {
            (Some(h), Some(u)) => h == u,
            _ => true,
        }
    }

    fn expect(&mut self, kind: ObjectKind, name: Arc<str>, rv: Option<&ResourceVersion>) {
        if let Some(rv) = rv {
            self.own.note(rv);
        }
        let version = rv.map(ResourceVersion::fingerprint);
        let e = self.pending.entry((kind, name)).or_insert(Expect {
            version,
            foreign: false,
        });
        e.version = version;
    }

    /// Sorts a watch event of `name` (None `rv`: a delete) against a write-through.
    fn echo(&mut self, kind: ObjectKind, name: &str, rv: Option<&ResourceVersion>) -> Echo {
        let key = (kind, Arc::<str>::from(name));
        let Some(e) = self.pending.get_mut(&key) else {
            return Echo::Apply;
        };
        let fp = rv.map(ResourceVersion::fingerprint);
        if fp == e.version {
            let foreign = e.foreign;
            self.pending.remove(&key);
            return Echo::Arrived(foreign);
        }
        if self.own.writer(rv) != Writer::Operator {
            e.foreign = true;
        }
        Echo::Skip
    }

    pub fn apply_node_event(&mut self, ev: &Event<api::IPAMNode>) -> Applied {
        let mut out = Applied::default();
        match ev {
            Event::Apply(o) => {
                let (v, bad) = node_from_api(o);
                out.malformed = bad;
                let rv = v.node.resource_version.clone();
                match self.echo(ObjectKind::IpamNode, &v.node.name, rv.as_ref()) {
                    Echo::Apply => self.node_changed(v, &mut out),
                    Echo::Skip => {}
                    Echo::Arrived(foreign) => {
                        if foreign {
                            out.events
                                .push(news(ObjectKind::IpamNode, &v.node.name, rv));
                        }
                        self.nodes.insert(v.node.name.clone(), v);
                    }
                }
            }
            Event::Delete(o) => {
                let name = o.metadata.name.as_deref().unwrap_or_default();
                let held = self.nodes.get(name).and_then(|v| v.uid.as_deref());
                if Self::deletes_held(held, o.metadata.uid.as_deref()) {
                    self.pending
                        .remove(&(ObjectKind::IpamNode, Arc::from(name)));
                    self.node_gone(name, &mut out);
                }
            }
            Event::Init => self.node_relist = Some(Vec::new()),
            Event::InitApply(o) => {
                let (v, bad) = node_from_api(o);
                out.malformed = bad;
                self.node_relist.get_or_insert_with(Vec::new).push(v);
            }
            Event::InitDone => {
                self.nodes_ready = true;
                self.lists.0 += 1;
                // the relist is the truth: no write-through waits any longer
                self.pending.retain(|(k, _), _| *k != ObjectKind::IpamNode);
                if let Some(list) = self.node_relist.take() {
                    let keep: BTreeSet<NodeName> =
                        list.iter().map(|v| v.node.name.clone()).collect();
                    let gone: Vec<NodeName> = self
                        .nodes
                        .keys()
                        .filter(|n| !keep.contains(*n))
                        .cloned()
                        .collect();
                    for n in gone {
                        self.node_gone(&n, &mut out);
                    }
                    for v in list {
                        self.node_changed(v, &mut out);
                    }
                }
            }
        }
        out
    }

    fn node_changed(&mut self, v: NodeView, out: &mut Applied) {
        if self.nodes.get(&v.node.name) == Some(&v) {
            return;
        }
        let rv = v.node.resource_version.clone();
        out.events.push(StoreEvent {
            kind: ObjectKind::IpamNode,
            name: v.node.name.clone(),
            writer: self.own.writer(rv.as_ref()),
            resource_version: rv.unwrap_or_else(|| ResourceVersion::counter(0)),
            deleted: false,
        });
        self.nodes.insert(v.node.name.clone(), v);
    }

    fn node_gone(&mut self, name: &str, out: &mut Applied) {
        if let Some(v) = self.nodes.remove(name) {
            out.events.push(StoreEvent {
                kind: ObjectKind::IpamNode,
                name: v.node.name.clone(),
                resource_version: v
                    .node
                    .resource_version
                    .clone()
                    .unwrap_or_else(|| ResourceVersion::counter(0)),
                writer: Writer::User,
                deleted: true,
            });
        }
    }

    pub fn apply_block_event(&mut self, ev: &Event<api::IPAMBlock>) -> Applied {
        let mut out = Applied::default();
        let read = |o: &api::IPAMBlock, out: &mut Applied| match block_from_api(o) {
            Ok(b) => Some((Arc::new(b), o.metadata.uid.as_deref().map(Arc::from))),
            Err(bad) => {
                out.malformed.extend(bad);
                None
            }
        };
        match ev {
            Event::Apply(o) => {
                if let Some((b, uid)) = read(o, &mut out) {
                    let rv = b.resource_version.clone();
                    match self.echo(ObjectKind::IpamBlock, &b.name, rv.as_ref()) {
                        Echo::Apply => self.block_changed(b, uid, &mut out),
                        Echo::Skip => {}
                        Echo::Arrived(foreign) => {
                            if foreign {
                                out.events.push(news(ObjectKind::IpamBlock, &b.node, rv));
                            }
                            self.upsert_block(b, uid);
                        }
                    }
                }
            }
            Event::Delete(o) => {
                let name = o.metadata.name.as_deref().unwrap_or_default();
                let held = self.block_uids.get(name).map(|u| &**u);
                if !Self::deletes_held(held, o.metadata.uid.as_deref()) {
                    return out;
                }
                let ours = self
                    .pending
                    .remove(&(ObjectKind::IpamBlock, Arc::from(name)));
                // the echo of our own delete changes nothing; any other delete is news
                if ours.is_none_or(|e| e.version.is_some()) {
                    self.block_gone(name, &mut out);
                }
            }
            Event::Init => self.block_relist = Some(Vec::new()),
            Event::InitApply(o) => {
                if let Some(b) = read(o, &mut out) {
                    self.block_relist.get_or_insert_with(Vec::new).push(b);
                }
            }
            Event::InitDone => {
                self.blocks_ready = true;
                self.lists.1 += 1;
                self.pending.retain(|(k, _), _| *k != ObjectKind::IpamBlock);
                if let Some(list) = self.block_relist.take() {
                    let keep: BTreeSet<Arc<str>> =
                        list.iter().map(|(b, _)| b.name.clone()).collect();
                    let gone: Vec<Arc<str>> = self
                        .blocks
                        .keys()
                        .filter(|n| !keep.contains(*n))
                        .cloned()
                        .collect();
                    for n in gone {
                        self.block_gone(&n, &mut out);
                    }
                    for (b, uid) in list {
                        self.block_changed(b, uid, &mut out);
                    }
                }
            }
        }
        out
    }

    fn block_changed(&mut self, b: Arc<IpamBlock>, uid: Option<Arc<str>>, out: &mut Applied) {
        if self.blocks.get(&b.name) == Some(&b) && self.block_uids.get(&b.name) == uid.as_ref() {
            return;
        }
        let rv = b.resource_version.clone();
        out.events.push(StoreEvent {
            kind: ObjectKind::IpamBlock,
            name: b.node.clone(),
            writer: self.own.writer(rv.as_ref()),
            resource_version: rv.unwrap_or_else(|| ResourceVersion::counter(0)),
            deleted: false,
        });
        self.upsert_block(b, uid);
    }

    fn block_gone(&mut self, name: &str, out: &mut Applied) {
        if let Some(b) = self.remove_block(name) {
            out.events.push(StoreEvent {
                kind: ObjectKind::IpamBlock,
                name: b.node.clone(),
                resource_version: b
                    .resource_version
                    .clone()
                    .unwrap_or_else(|| ResourceVersion::counter(0)),
                writer: Writer::User,
                deleted: true,
            });
        }
    }

    fn upsert_block(&mut self, b: Arc<IpamBlock>, uid: Option<Arc<str>>) {
        match uid {
            Some(u) => self.block_uids.insert(b.name.clone(), u),
            None => self.block_uids.remove(&b.name),
        };
        if self.blocks.get(&b.name) == Some(&b) {
            return;
        }
        let old = self.blocks.insert(b.name.clone(), b.clone());
        if let Some(o) = &old
            && o.node != b.node
        {
            self.unlink(&o.node, &o.name);
        }
        let spec_changed = old.as_ref().is_none_or(|o| {
            (&o.pool, &o.cidr, &o.node, o.node_uid) != (&b.pool, &b.cidr, &b.node, b.node_uid)
        });
        if spec_changed {
            self.block_set_changes += 1;
        }
        self.blocks_by_node
            .entry(b.node.clone())
            .or_default()
            .insert(b.name.clone());
        self.bump(&b.node);
    }

    fn remove_block(&mut self, name: &str) -> Option<Arc<IpamBlock>> {
        let b = self.blocks.remove(name)?;
        self.block_uids.remove(name);
        self.unlink(&b.node, &b.name);
        self.block_set_changes += 1;
        Some(b)
    }

    fn unlink(&mut self, node: &NodeName, name: &str) {
        if let Some(set) = self.blocks_by_node.get_mut(node) {
            set.remove(name);
            if set.is_empty() {
                self.blocks_by_node.remove(node);
            }
        }
        self.bump(node);
    }

    fn bump(&mut self, node: &NodeName) {
        self.changes += 1;
        self.node_block_changes.insert(node.clone(), self.changes);
    }
}

/// Whether the copy held (`seen`) is newer than one our write or read returned (`got`):
/// the watch delivered the write's echo, and a later change, before the answer was taken
/// in. Taking it would put the copy back in time and wait for an echo that has gone by.
/// Only where the versions compare (Kubernetes 1.35, [`ResourceVersion::compare`]);
/// elsewhere the echo is waited for.
fn holds_newer(seen: Option<&Option<ResourceVersion>>, got: Option<&ResourceVersion>) -> bool {
    matches!((seen, got), (Some(Some(held)), Some(got))
        if held.compare(got) == Some(std::cmp::Ordering::Greater))
}

/// An event saying someone else changed the object while our write waited for its echo.
fn news(kind: ObjectKind, name: &NodeName, rv: Option<ResourceVersion>) -> StoreEvent {
    StoreEvent {
        kind,
        name: name.clone(),
        resource_version: rv.unwrap_or_else(|| ResourceVersion::counter(0)),
        writer: Writer::User,
        deleted: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::block_for_create;
    use tidepool_api::names::FINALIZER;
    use tidepool_ipam::NodeUid;

    const UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";

    fn ipamnode(name: &str, rv: &str) -> api::IPAMNode {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": { "name": name, "resourceVersion": rv, "finalizers": [FINALIZER] },
            "spec": { "nodeUID": UID },
        }))
        .unwrap()
    }

    fn ipamblock(cidr: &str, node: &str, rv: &str) -> api::IPAMBlock {
        let net: ipnet::IpNet = cidr.parse().unwrap();
        let b = IpamBlock {
            name: tidepool_ipam::pool::block_name(&net).into(),
            cidr: net,
            pool: "default".into(),
            node: node.into(),
            node_uid: NodeUid(crate::index::parse_uid(UID).unwrap()),
            release: false,
            ack: None,
            resource_version: None,
            deleting: false,
        };
        let mut o = block_for_create(&b);
        o.metadata.resource_version = Some(rv.into());
        o
    }

    #[test]
    fn a_relist_replaces_the_nodes_and_reports_what_changed() {
        let mut c = Cache::default();
        c.apply_node_event(&Event::Init);
        c.apply_node_event(&Event::InitApply(ipamnode("a", "1")));
        c.apply_node_event(&Event::InitApply(ipamnode("b", "2")));
        assert!(
            !c.nodes_ready && c.node("a").is_none(),
            "buffered until InitDone"
        );
        let out = c.apply_node_event(&Event::InitDone);
        assert!(c.nodes_ready);
        assert_eq!(out.events.len(), 2);
        // a relist without b and with a changed: b deleted, a changed, nothing else
        c.apply_node_event(&Event::Init);
        c.apply_node_event(&Event::InitApply(ipamnode("a", "3")));
        let out = c.apply_node_event(&Event::InitDone);
        let seen: Vec<(&str, bool)> = out.events.iter().map(|e| (&*e.name, e.deleted)).collect();
        assert_eq!(seen, vec![("b", true), ("a", false)]);
        assert!(c.node("b").is_none());
        // the same object again: no event
        assert!(
            c.apply_node_event(&Event::Apply(ipamnode("a", "3")))
                .events
                .is_empty()
        );
    }

    #[test]
    fn echoes_of_our_own_writes_are_the_operators() {
        let mut c = Cache::default();
        c.own_write(&ResourceVersion::server("7"));
        let out = c.apply_node_event(&Event::Apply(ipamnode("a", "7")));
        assert_eq!(out.events[0].writer, Writer::Operator);
        let out = c.apply_node_event(&Event::Apply(ipamnode("a", "8")));
        assert_eq!(out.events[0].writer, Writer::User);
    }

    #[test]
    fn blocks_are_indexed_by_node_with_change_counters() {
        let mut c = Cache::default();
        let out = c.apply_block_event(&Event::Apply(ipamblock("10.0.0.0/28", "a", "1")));
        assert_eq!(out.events[0].kind, ObjectKind::IpamBlock);
        assert_eq!(&*out.events[0].name, "a", "a block's event names its node");
        c.apply_block_event(&Event::Apply(ipamblock("10.0.0.16/28", "a", "2")));
        assert_eq!(c.blocks_of("a").len(), 2);
        let (na, set) = (c.node_blocks_changes("a"), c.block_set_changes());
        // a mark changes the node's counter, not the block set's
        let mut marked = ipamblock("10.0.0.16/28", "a", "3");
        marked.spec.release = Some(api::BlockRelease::MarkedForRelease);
        c.apply_block_event(&Event::Apply(marked.clone()));
        assert!(c.node_blocks_changes("a") > na);
        assert_eq!(c.block_set_changes(), set);
        assert!(c.blocks_of("a")[1].release);
        c.apply_block_event(&Event::Delete(marked));
        assert_eq!(c.blocks_of("a").len(), 1);
        assert!(c.block_set_changes() > set);
        assert_eq!(c.node_blocks_changes("b"), 0);
    }

    /// A written-through object never goes back in time: watch events older than our
    /// write's echo are skipped, and the echo says whether someone else wrote meanwhile.
    #[test]
    fn a_write_through_waits_for_its_echo() {
        let mut c = Cache::default();
        c.apply_block_event(&Event::Apply(ipamblock("10.0.0.0/28", "a", "1")));
        let mut marked = ipamblock("10.0.0.0/28", "a", "3");
        marked.spec.release = Some(api::BlockRelease::MarkedForRelease);
        c.put_block(Arc::new(block_from_api(&marked).unwrap()), None);
        assert!(c.blocks_of("a")[0].release);
        // the node side's answer at 2, written before our mark: skipped, remembered
        let mut acked = ipamblock("10.0.0.0/28", "a", "2");
        acked.status = Some(api::IPAMBlockStatus {
            release_ack: Some(api::BlockAck::DoNotRelease),
        });
        assert!(c.apply_block_event(&Event::Apply(acked)).events.is_empty());
        assert!(c.blocks_of("a")[0].release, "not back in time");
        let out = c.apply_block_event(&Event::Apply(marked.clone()));
        assert_eq!(out.events.len(), 1, "someone wrote meanwhile: news");
        assert_eq!(out.events[0].writer, Writer::User);
        // a later echo-free event applies as usual
        let later = ipamblock("10.0.0.0/28", "a", "4");
        assert_eq!(c.apply_block_event(&Event::Apply(later)).events.len(), 1);
        assert!(!c.blocks_of("a")[0].release);
        // our delete: gone at once, a late Apply of it skipped until the Delete comes
        c.drop_block(&marked.metadata.name.clone().unwrap());
        assert!(c.blocks_of("a").is_empty());
        c.apply_block_event(&Event::Apply(ipamblock("10.0.0.0/28", "a", "5")));
        assert!(c.blocks_of("a").is_empty());
        c.apply_block_event(&Event::Delete(ipamblock("10.0.0.0/28", "a", "5")));
        c.apply_block_event(&Event::Apply(ipamblock("10.0.0.0/28", "b", "6")));
        assert_eq!(
            c.blocks_of("b").len(),
            1,
            "a new block of that name applies again"
        );
    }

    /// A write that changes nothing returns the version the cache holds; no echo of it
    /// will come, so it must not hold back the events after it.
    #[test]
    fn a_no_op_write_waits_for_no_echo() {
        let mut c = Cache::default();
        c.apply_node_event(&Event::Apply(ipamnode("a", "5")));
        let (same, _) = crate::convert::node_from_api(&ipamnode("a", "5"));
        c.put_node(same);
        let out = c.apply_node_event(&Event::Apply(ipamnode("a", "6")));
        assert_eq!(out.events.len(), 1, "the next change is not skipped");
        assert_eq!(
            c.node("a").unwrap().node.resource_version,
            Some(ResourceVersion::server("6"))
        );
    }

    /// Our write's answer can come after the watch has already delivered its echo and a
    /// later change by someone else (the watch task ran first): taking the answer in then
    /// would put the copy back in time and skip every later event while it waits for an
    /// echo that has gone by. Since Kubernetes 1.35 versions of one resource compare as
    /// integers (KEP-5504, `k8s.io/apimachinery/pkg/util/resourceversion.
    /// CompareResourceVersion`): the newer copy stays, and nothing waits.
    #[test]
    fn a_write_answered_after_a_newer_event_does_not_go_back_in_time() {
        let mut c = Cache::default();
        c.apply_node_event(&Event::Apply(ipamnode("a", "5")));
        c.own_write(&ResourceVersion::server("6"));
        c.apply_node_event(&Event::Apply(ipamnode("a", "6")));
        assert_eq!(
            c.apply_node_event(&Event::Apply(ipamnode("a", "7")))
                .events
                .len(),
            1
        );
        let (ours, _) = crate::convert::node_from_api(&ipamnode("a", "6"));
        c.put_node(ours);
        let held = |c: &Cache| c.node("a").unwrap().node.resource_version.clone();
        assert_eq!(
            held(&c),
            Some(ResourceVersion::server("7")),
            "not back in time"
        );
        let out = c.apply_node_event(&Event::Apply(ipamnode("a", "8")));
        assert_eq!(out.events.len(), 1, "the next change is not skipped");
        assert_eq!(held(&c), Some(ResourceVersion::server("8")));
        // the same for a block
        c.apply_block_event(&Event::Apply(ipamblock("10.0.0.0/28", "a", "10")));
        c.apply_block_event(&Event::Apply(ipamblock("10.0.0.0/28", "a", "11")));
        let ours = block_from_api(&ipamblock("10.0.0.0/28", "a", "10")).unwrap();
        c.put_block(Arc::new(ours), None);
        let b = &c.blocks_of("a")[0];
        assert_eq!(b.resource_version, Some(ResourceVersion::server("11")));
        let out = c.apply_block_event(&Event::Apply(ipamblock("10.0.0.0/28", "a", "12")));
        assert_eq!(
            out.events.len(),
            1,
            "the next change of the block is not skipped"
        );
    }

    #[test]
    fn an_unreadable_block_is_reported_and_left_out() {
        let mut c = Cache::default();
        let mut bad = ipamblock("10.0.0.0/28", "a", "1");
        bad.spec.cidr = api::Cidr("10.0.0.0/99".into());
        let out = c.apply_block_event(&Event::Apply(bad));
        assert_eq!(out.malformed.len(), 1);
        assert!(out.events.is_empty());
        assert!(c.blocks_of("a").is_empty());
    }
}
