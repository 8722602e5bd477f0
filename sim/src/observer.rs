//! The independent observer: it builds its own log of who holds which address from the
//! source's grants and releases, the node side's answers, the kubelets' pod starts and
//! stops and the operator's tombstones, and judges DESIGN.md's three invariants from it.
//! It trusts no engine counter.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::addr_bits::AddrBits;
use crate::names::NodeNames;
use tidepool_ipam::addrs::{Run, show_run, span};
use tidepool_ipam::uid_table::{Keyed, UidTable};
use tidepool_ipam::{AddrMap, AddrSet, SourceHook};
use tidepool_ipam::{Family, IpamBlock, IpamNode, NodeName, PodIps, PodUid};
use tidepool_ipam::{StoreHook, Writer};

/// A run of addresses a source has granted to a node (the truth the end of a run is
/// checked against): a block, or a node's consecutive addresses. Runs, not address sets:
/// a set of one run takes a whole B-tree leaf (~550 bytes), and the cluster pool's 80,000
/// blocks at 10,000 nodes made the end-of-run check the run's peak of memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub node: NodeName,
    pub family: Family,
    pub run: Run,
}

impl Grant {
    /// Every address of `net`.
    pub fn of_net(net: &IpNet, node: NodeName) -> Grant {
        let (family, run) = span(net);
        Grant { node, family, run }
    }

    /// Per-address grants as runs, each node's consecutive addresses in one.
    pub fn of_addresses(granted: Vec<(IpAddr, NodeName)>) -> Vec<Grant> {
        let mut per: BTreeMap<NodeName, AddrSet> = BTreeMap::new();
        for (a, n) in granted {
            per.entry(n).or_default().insert(a);
        }
        let mut out = Vec::new();
        for (node, set) in per {
            for (family, run) in set.runs() {
                let (node, run) = (node.clone(), run.clone());
                out.push(Grant { node, family, run });
            }
        }
        out
    }
}

/// Counts of invariant violations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Invariants {
    pub double_allocations: u64,
    pub live_ip_reclaimed: u64,
    pub lost_allocations: u64,
    /// A pod's address lies outside the pool it resolved to at its ADD (DESIGN.md "Pools
    /// per namespace and per pod").
    pub outside_pod_pool: u64,
}

impl Invariants {
    pub fn ok(&self) -> bool {
        *self == Invariants::default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Hold {
    /// The holding node's id ([`State::names`]).
    node: u32,
    /// False once the node side answered ready-for-release (it promised not to use it).
    active: bool,
}

/// A live pod's addresses: its IPv4 one inline, its IPv6 one (if any) in [`V6Slots`] by
/// number, so a record is 32 bytes where an inline [`PodIps`] made it 40 (a million live
/// pods at 10,000 nodes, most with no IPv6 address).
struct LivePod {
    uid: PodUid,
    /// Its IPv6 address's slot in [`State::v6`].
    v6: Option<V6Slot>,
    v4: Option<Ipv4Addr>,
}

// a pod table's record, with room for none (the options' spare values)
const _: () = assert!(size_of::<Option<LivePod>>() == 32);

impl LivePod {
    fn new(uid: PodUid, ips: PodIps, slots: &mut V6Slots) -> Self {
        let (mut v4, mut v6) = (None, None);
        for a in ips.iter() {
            match a {
                IpAddr::V4(a) => v4 = Some(a),
                IpAddr::V6(a) => v6 = Some(slots.put(a)),
            }
        }
        LivePod { uid, v6, v4 }
    }

    fn ips(&self, slots: &V6Slots) -> PodIps {
        let v4 = self.v4.map(IpAddr::V4);
        let v6 = self.v6.map(|s| IpAddr::V6(slots.get(s)));
        PodIps::new(v4.into_iter().chain(v6))
    }
}

/// A slot of [`V6Slots`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct V6Slot(std::num::NonZeroU32);

/// The live pods' IPv6 addresses, by slot; a freed slot is reused.
#[derive(Default)]
struct V6Slots {
    addrs: Vec<Ipv6Addr>,
    free: Vec<V6Slot>,
}

impl V6Slots {
    fn put(&mut self, a: Ipv6Addr) -> V6Slot {
        if let Some(s) = self.free.pop() {
            self.addrs[s.0.get() as usize - 1] = a;
            return s;
        }
        self.addrs.push(a);
        let n = u32::try_from(self.addrs.len()).expect("fewer than 2^32 live pods");
        V6Slot(n.try_into().expect("counted from 1"))
    }

    fn get(&self, s: V6Slot) -> Ipv6Addr {
        self.addrs[s.0.get() as usize - 1]
    }

    fn release(&mut self, s: Option<V6Slot>) {
        self.free.extend(s);
    }

    fn heap_bytes(&self) -> usize {
        self.addrs.capacity() * size_of::<Ipv6Addr>() + self.free.capacity() * size_of::<V6Slot>()
    }
}

impl Keyed for LivePod {
    fn uid(&self) -> PodUid {
        self.uid
    }
}

#[derive(Default)]
struct State {
    /// Who holds which address, as runs (a /64 block is one entry).
    holds: AddrMap<Hold>,
    /// A hold names its node by number.
    names: NodeNames,
    /// The addresses live pods use, as bitmaps (a node's pods' addresses sit in a few
    /// blocks: a few words a node, where a map of address to pod took ~47 bytes an
    /// address). Which pod uses one is in `live`.
    in_use: AddrBits,
    /// The live pods with their addresses (a compact table: a million pods at 10,000
    /// nodes, where a B-tree of boxed address lists took twice the bytes).
    live: UidTable<LivePod>,
    /// Their IPv6 addresses.
    v6: V6Slots,
    /// Pods deleted while their address stayed recorded: deletion time (for reclaim latency).
    deleted_at: BTreeMap<PodUid, Instant>,
    vanished: BTreeSet<NodeName>,
    /// Holds of machines that vanished, while the source still grants them to the name:
    /// a new machine joining under that name (or the same kubelet re-registering) holds
    /// them again.
    dormant: AddrMap<NodeName>,
    reclaim_latency: Vec<f64>,
    reclaimed: u64,
    inv: Invariants,
    violations: Vec<String>,
}

impl State {
    /// Whether `a` is held by `node`, and actively (not promised away) if `active`.
    fn held_by(&self, a: &IpAddr, node: &str, active: bool) -> bool {
        let id = self.names.get(node);
        self.holds
            .get(a)
            .is_some_and(|h| (h.active || !active) && Some(h.node) == id)
    }

    /// Marks `node`'s holds within `run` active or not (the node side's promise).
    fn set_active(&mut self, f: Family, run: &Run, node: u32, active: bool) {
        let mine: Vec<Run> = self
            .holds
            .within(f, run)
            .filter(|(_, h)| h.node == node)
            .map(|(r, _)| r)
            .collect();
        for r in mine {
            self.holds.insert_run(f, r, Hold { node, active });
        }
    }

    fn violate(&mut self, kind: fn(&mut Invariants) -> &mut u64, msg: String) {
        *kind(&mut self.inv) += 1;
        if self.violations.len() < 50 {
            self.violations.push(msg);
        }
    }

    /// Lost addresses: granted by the source but not held by their node, or recorded in
    /// `used` for a pod that is gone. With `all` every one is described; otherwise the
    /// walk stops at the first (a check, not a report).
    fn lost(
        &self,
        granted: impl IntoIterator<Item = Grant>,
        nodes: &[std::sync::Arc<IpamNode>],
        all: bool,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for Grant { node, family, run } in granted {
            let id = self.names.get(&node);
            for (piece, hold) in self.holds.pieces(family, &run) {
                if hold.is_some_and(|h| h.active && Some(h.node) == id) {
                    continue;
                }
                out.push(format!(
                    "{} granted to {node} by the source but not held by it",
                    show_run(family, &piece)
                ));
                if !all {
                    return out;
                }
            }
        }
        for n in nodes {
            for (a, e) in &n.node.used {
                if self.live.get(&e.pod_uid).is_none() {
                    out.push(format!(
                        "{a} on {} still recorded for gone pod {}",
                        n.name, e.pod_uid
                    ));
                    if !all {
                        return out;
                    }
                }
            }
        }
        out
    }
}

/// The observer. Register it as the source's and the store's hook, and tell it what the
/// kubelets and the node side do.
#[derive(Default)]
pub struct Observer {
    s: Mutex<State>,
}

impl Observer {
    pub fn new() -> Self {
        Self::default()
    }

    /// The observer's heap as a deterministic size estimate (see
    /// [`crate::World::world_heap_estimate`]).
    pub fn heap_estimate(&self) -> usize {
        use crate::heap::btree_bytes;
        use std::mem::size_of;
        let s = self.s.lock();
        let run = size_of::<Run>();
        btree_bytes(s.holds.run_count(), run + size_of::<Hold>())
            + btree_bytes(s.in_use.word_count(), 16 + 8)
            + s.live.heap_bytes()
            + s.v6.heap_bytes()
            + s.names.heap_bytes()
            + btree_bytes(
                s.deleted_at.len(),
                size_of::<PodUid>() + size_of::<Instant>(),
            )
            + btree_bytes(s.vanished.len(), size_of::<NodeName>())
            + btree_bytes(s.dormant.run_count(), run + size_of::<NodeName>())
            + s.reclaim_latency.capacity() * 8
    }

    /// A pod started with these addresses on `node`.
    pub fn pod_started(&self, node: &NodeName, uid: PodUid, addrs: &[IpAddr]) {
        let mut s = self.s.lock();
        let ips = PodIps::new(addrs.iter().copied());
        // what the pod had, if it started before (its own addresses are no double use)
        let before = s.live.get(&uid).map(|p| p.ips(&s.v6));
        if ips.iter().count() < addrs.len() {
            s.violate(
                |i| &mut i.double_allocations,
                format!("pod {uid} on {node} got two addresses of one family: {addrs:?}"),
            );
        }
        for a in addrs {
            if !s.held_by(a, node, true) {
                s.violate(
                    |i| &mut i.double_allocations,
                    format!("pod {uid} on {node} uses {a}, which {node} does not hold"),
                );
            }
            let again = before.is_some_and(|b| b.contains(a));
            if s.in_use.contains(a) && !again {
                let other = (s.live.values())
                    .find(|p| p.ips(&s.v6).contains(a))
                    .map_or_else(|| "another".to_string(), |p| p.uid.to_string());
                s.violate(
                    |i| &mut i.double_allocations,
                    format!("{a} used by live pods {other} and {uid} at once"),
                );
            }
            s.in_use.insert(a);
        }
        let s = &mut *s;
        if let Some(old) = s.live.get(&uid) {
            s.v6.release(old.v6);
        }
        s.live.insert(LivePod::new(uid, ips, &mut s.v6));
    }

    /// A pod started with `addr`, which lies outside the pool it resolved to (`why`).
    pub fn outside_pod_pool(&self, node: &NodeName, uid: PodUid, addr: IpAddr, why: &str) {
        let msg = format!("pod {uid} on {node} got {addr}, outside its pool: {why}");
        self.s.lock().violate(|i| &mut i.outside_pod_pool, msg);
    }

    /// A pod's containers stopped (DEL, crash or machine loss). `timed` says whether the
    /// time from now to its tombstone counts as a reclaim latency (its addresses stay
    /// recorded, and it was older than the minimum age).
    pub fn pod_stopped(&self, uid: PodUid, timed: bool) {
        let mut s = self.s.lock();
        if let Some(pod) = s.live.remove(&uid) {
            let ips = pod.ips(&s.v6);
            s.v6.release(pod.v6);
            for a in ips.iter() {
                s.in_use.remove(&a);
            }
            if timed {
                s.deleted_at.insert(uid, Instant::now());
            }
        }
    }

    /// The node side answered: addresses it will no longer use, and withdrawn ones it may.
    pub fn node_answers(
        &self,
        node: &NodeName,
        ready: &AddrSet,
        resumed: &AddrSet,
        reclaimed: usize,
    ) {
        let mut guard = self.s.lock();
        let s = &mut *guard;
        s.reclaimed += reclaimed as u64;
        let Some(id) = s.names.get(node) else {
            // a node never granted anything holds nothing to resume
            for (f, run) in resumed.runs() {
                s.violate(
                    |i| &mut i.double_allocations,
                    format!(
                        "{} resumed by {node}, which was never granted it",
                        show_run(f, run)
                    ),
                );
            }
            return;
        };
        for (f, run) in ready.runs() {
            s.set_active(f, run, id, false);
        }
        for (f, run) in resumed.runs() {
            let mut bad = Vec::new();
            for (piece, hold) in s.holds.pieces(f, run) {
                bad.push(match hold {
                    Some(h) if h.node == id => continue,
                    Some(h) if h.active => format!(
                        "{} resumed by {node} while {} holds it",
                        show_run(f, &piece),
                        s.names.name(h.node)
                    ),
                    _ => format!(
                        "{} resumed by {node} after the source took it back",
                        show_run(f, &piece)
                    ),
                });
            }
            for msg in bad {
                s.violate(|i| &mut i.double_allocations, msg);
            }
            s.set_active(f, run, id, true);
        }
    }

    /// A machine joins under `node` — possibly a name whose earlier machine vanished: the
    /// new machine holds what it is granted from now on.
    pub fn machine_joined(&self, node: &NodeName) {
        let mut s = self.s.lock();
        s.vanished.remove(node);
        let back = s.dormant.keys_where(|n| n == node);
        let id = s.names.id(node);
        s.dormant.remove_set(&back);
        s.holds.insert_set(
            &back,
            Hold {
                node: id,
                active: true,
            },
        );
    }

    /// A machine vanished with its pods: its holds end.
    pub fn machine_vanished(&self, node: &NodeName) {
        let mut s = self.s.lock();
        if let Some(id) = s.names.get(node) {
            let active = s.holds.keys_where(|h| h.node == id && h.active);
            let all = s.holds.keys_where(|h| h.node == id);
            s.holds.remove_set(&all);
            s.dormant.insert_set(&active, node.clone());
        }
        s.vanished.insert(node.clone());
    }

    /// End-of-run check for lost addresses: every address the source still grants must
    /// be held by that node, and every `used` entry must belong to a live pod.
    pub fn finish(&self, granted: &[Grant], nodes: &[std::sync::Arc<IpamNode>]) -> Invariants {
        self.finish_with(granted.iter().cloned(), nodes)
    }

    /// [`Observer::finish`] over the granted addresses as an iterator (a large source need
    /// not list them all at once).
    pub fn finish_with(
        &self,
        granted: impl IntoIterator<Item = Grant>,
        nodes: &[std::sync::Arc<IpamNode>],
    ) -> Invariants {
        let mut s = self.s.lock();
        for lost in State::lost(&s, granted, nodes, true) {
            s.violate(|i| &mut i.lost_allocations, lost);
        }
        s.inv
    }

    /// Whether [`Observer::finish_with`] would count an address as lost now, recording
    /// nothing: work still queued at the end of the drain tail (a slow budget, a retry
    /// after a failure, a lost node inside its grace) shows here until it is done.
    pub fn any_lost(
        &self,
        granted: impl IntoIterator<Item = Grant>,
        nodes: &[std::sync::Arc<IpamNode>],
    ) -> bool {
        let s = self.s.lock();
        !State::lost(&s, granted, nodes, false).is_empty()
    }

    pub fn invariants(&self) -> Invariants {
        self.s.lock().inv
    }

    /// The first violations, for diagnosis.
    pub fn violations(&self) -> Vec<String> {
        self.s.lock().violations.clone()
    }

    /// Starts a measured period: reclaim counts and latencies start from zero (the
    /// invariants keep counting).
    pub fn start_measuring(&self) {
        let mut s = self.s.lock();
        s.reclaimed = 0;
        s.reclaim_latency.clear();
    }

    /// Pod deletion → tombstone latencies, in seconds.
    pub fn reclaim_latencies(&self) -> Vec<f64> {
        self.s.lock().reclaim_latency.clone()
    }

    /// Entries the node side removed on a tombstone.
    pub fn reclaimed(&self) -> u64 {
        self.s.lock().reclaimed
    }
}

impl SourceHook for Observer {
    fn granted(&self, node: &NodeName, addrs: &AddrSet) {
        let mut s = self.s.lock();
        if s.vanished.contains(node) {
            return; // a machine that is gone holds nothing
        }
        let id = s.names.id(node);
        s.dormant.remove_set(addrs);
        let mut bad = Vec::new();
        for (f, run) in addrs.runs() {
            for (piece, hold) in s.holds.pieces(f, run) {
                if let Some(h) = hold
                    && h.active
                    && h.node != id
                {
                    bad.push(format!(
                        "{} granted to {node} while {} holds it",
                        show_run(f, &piece),
                        s.names.name(h.node)
                    ));
                }
            }
        }
        for msg in bad {
            s.violate(|i| &mut i.double_allocations, msg);
        }
        s.holds.insert_set(
            addrs,
            Hold {
                node: id,
                active: true,
            },
        );
    }

    fn released(&self, node: &NodeName, addrs: &AddrSet) {
        let mut s = self.s.lock();
        let dormant_here = s.dormant.keys_where(|n| n == node).intersection(addrs);
        s.dormant.remove_set(&dormant_here);
        // An active hold stays: granting the address elsewhere would then be a double grant.
        if let Some(id) = s.names.get(node) {
            let promised = s
                .holds
                .keys_where(|h| h.node == id && !h.active)
                .intersection(addrs);
            s.holds.remove_set(&promised);
        }
    }
}

impl StoreHook for Observer {
    /// cluster-pool: creating a block grants every address of it, deleting it takes them back.
    fn block_written(&self, _writer: Writer, old: Option<&IpamBlock>, new: Option<&IpamBlock>) {
        match (old, new) {
            (None, Some(b)) => self.granted(&b.node, &AddrSet::of_net(&b.cidr)),
            (Some(b), None) => self.released(&b.node, &AddrSet::of_net(&b.cidr)),
            _ => {}
        }
    }

    /// Only the operator's tombstones matter here.
    fn wants_node_side_writes(&self) -> bool {
        false
    }

    fn written(&self, writer: Writer, old: Option<&IpamNode>, new: Option<&IpamNode>) {
        if writer != Writer::Operator {
            return;
        }
        let Some(new) = new else {
            return;
        };
        let before = old.map(|o| &o.operator.reclaim);
        let mut s = self.s.lock();
        let now = Instant::now();
        let mut seen = BTreeSet::new();
        for (a, t) in &new.operator.reclaim {
            if before.is_some_and(|b| b.get(a) == Some(t)) {
                continue;
            }
            // Live reclaim: the address is in use by that very pod, which still runs. (A
            // replaced sandbox's old address names a live pod too, but the pod no longer
            // uses it: that tombstone is the point of the sandbox-replaced rule.)
            if s.live
                .get(&t.pod_uid)
                .is_some_and(|p| p.ips(&s.v6).contains(a))
            {
                s.violate(
                    |i| &mut i.live_ip_reclaimed,
                    format!(
                        "tombstone for {a} of live pod {} on {}",
                        t.pod_uid, new.name
                    ),
                );
            }
            if seen.insert(t.pod_uid)
                && let Some(at) = s.deleted_at.remove(&t.pod_uid)
            {
                s.reclaim_latency.push(now.duration_since(at).as_secs_f64());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// An observer with `nets` granted to node n1.
    fn granted(nets: &[&str]) -> (Observer, NodeName) {
        let (o, n) = (Observer::new(), NodeName::from("n1"));
        let mut set = AddrSet::new();
        for net in nets {
            set.insert_net(&net.parse().unwrap());
        }
        o.granted(&n, &set);
        (o, n)
    }

    #[test]
    fn a_pod_with_two_addresses_of_one_family_is_a_double_allocation() {
        let (o, n) = granted(&["10.0.0.0/29"]);
        o.pod_started(&n, PodUid(1), &[ip("10.0.0.1")]);
        assert!(o.invariants().ok(), "{:?}", o.violations());
        o.pod_started(&n, PodUid(2), &[ip("10.0.0.2"), ip("10.0.0.3")]);
        assert_eq!(o.invariants().double_allocations, 1);
        assert!(o.violations()[0].contains("two addresses of one family"));
    }

    #[test]
    fn a_stopped_pod_frees_each_of_its_addresses() {
        let (o, n) = granted(&["10.0.0.0/30", "fd00::/126"]);
        let both = [ip("10.0.0.1"), ip("fd00::1")];
        o.pod_started(&n, PodUid(1), &both);
        o.pod_started(&n, PodUid(2), &both[1..]);
        assert_eq!(o.invariants().double_allocations, 1, "fd00::1 used twice");
        o.pod_stopped(PodUid(1), false);
        o.pod_stopped(PodUid(2), false);
        o.pod_started(&n, PodUid(3), &both);
        assert_eq!(o.invariants().double_allocations, 1, "both free again");
    }

    #[test]
    fn a_tombstone_for_a_live_pods_address_is_a_live_reclaim() {
        use tidepool_ipam::{AllocationId, ReclaimReason, Tombstone};
        let (o, n) = granted(&["10.0.0.0/30"]);
        let tombstone = |uid: u128, a: &str| {
            let mut node = IpamNode::new(n.clone(), tidepool_ipam::NodeUid(1));
            let t = Tombstone {
                pod_uid: PodUid(uid),
                allocation: AllocationId(uid as u64),
                reason: ReclaimReason::PodDeleted,
            };
            node.operator.reclaim.insert(ip(a), t);
            o.written(Writer::Operator, None, Some(&node));
        };
        o.pod_started(&n, PodUid(1), &[ip("10.0.0.1")]);
        tombstone(2, "10.0.0.1");
        assert!(
            o.invariants().ok(),
            "another pod's tombstone: {:?}",
            o.violations()
        );
        tombstone(1, "10.0.0.1");
        assert_eq!(o.invariants().live_ip_reclaimed, 1);
        o.pod_stopped(PodUid(1), false);
        tombstone(1, "10.0.0.1");
        assert_eq!(o.invariants().live_ip_reclaimed, 1, "stopped: reclaimable");
    }
}
