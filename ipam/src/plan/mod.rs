//! One node's maintenance pass as a pure function: from a snapshot (the node's resource,
//! its Node, watermarks, pods waiting, the pod view, time) to a plan. The runtime
//! ([`crate::maintainer`]) executes the plan's calls and writes its fields once.
//!
//! Order (DESIGN.md): reclaim; advance release handshakes; compute needed/excess; claim or
//! mark. The decisions the executor takes as it runs a plan (hold-back, what it writes,
//! the marks a source that keeps them gets, the tombstones of a confirmed reclaim, how an
//! answered tombstone is reported, the `Blocked` reason) are pure too: [`execution`].

mod execution;
mod lanes;

pub(crate) use execution::{Answered, WriteRule, marks_to_send, tombstone};
use lanes::{Lane, lanes};
pub use lanes::{NodePools, PoolLane, Unplaced};

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use tokio::time::Instant;

use crate::addrs::{AddrMap, AddrSet, Run, saturate};
use crate::handshake::{self, ReleaseConfig};
use crate::pods::PodCache;
use crate::reclaim::{ReclaimConfig, ReclaimStep, ReclaimTracker};
use crate::scarcity::Squeezes;
use crate::types::{
    Family, IpamNode, NodeInfo, OperatorFields, PerFamily, PodUid, ReclaimAck, ReleaseAck,
    ReleaseState, Tombstone,
};
use crate::vocab::Blocked;
use crate::watermarks::{self, FamilyCounts, Sizing, Watermarks};

/// Since when the excess of each of a node's other pools persists, by family and pool.
type PoolClocks = BTreeMap<(Family, Arc<str>), Instant>;

/// What the maintainer remembers of a node between passes.
#[derive(Debug, Default)]
pub struct NodeMemory {
    pub reclaim: ReclaimTracker,
    /// Since when each lane's excess persists: the default pools', the others'.
    excess_since: PerFamily<Option<Instant>>,
    /// (boxed: most nodes have no other pool, and every node has a memory)
    pool_excess_since: Option<Box<PoolClocks>>,
    /// The smallest groups of the address set last planned with (see [`smallest_group`]),
    /// kept while the set is the same (shared) one: a source's holdings change rarely.
    groups: Option<Groups>,
}

#[derive(Debug)]
struct Groups {
    of: Weak<AddrSet>,
    grant: PerFamily<u128>,
    smallest: PerFamily<u128>,
}

impl NodeMemory {
    /// A new lead starts every clock afresh.
    pub fn reset(&mut self) {
        self.reclaim.reset();
        self.excess_since = PerFamily::default();
        self.pool_excess_since = None;
    }

    /// Since when a lane's excess persists.
    fn excess_clock(&self, family: Family, pool: Option<&Arc<str>>) -> Option<Instant> {
        match pool {
            None => *self.excess_since.get(family),
            Some(p) => {
                (self.pool_excess_since.as_ref()).and_then(|m| m.get(&(family, p.clone())).copied())
            }
        }
    }

    fn set_excess_clock(&mut self, family: Family, pool: Option<&Arc<str>>, at: Option<Instant>) {
        match (pool, at) {
            (None, at) => *self.excess_since.get_mut(family) = at,
            (Some(p), Some(at)) => {
                let clocks = self.pool_excess_since.get_or_insert_default();
                clocks.insert((family, p.clone()), at);
            }
            (Some(p), None) => {
                if let Some(clocks) = &mut self.pool_excess_since {
                    clocks.remove(&(family, p.clone()));
                    if clocks.is_empty() {
                        self.pool_excess_since = None;
                    }
                }
            }
        }
    }

    /// [`smallest_groups`] of `addresses`, computed once per address set.
    fn smallest_groups(
        &mut self,
        addresses: &Arc<AddrSet>,
        grant: PerFamily<u128>,
    ) -> PerFamily<u128> {
        // the weak reference keeps the set's allocation: no other set can reuse its address
        match &self.groups {
            Some(g) if g.grant == grant && std::ptr::eq(g.of.as_ptr(), &**addresses) => g.smallest,
            _ => {
                let smallest = smallest_groups(addresses, grant);
                self.groups = Some(Groups {
                    of: Arc::downgrade(addresses),
                    grant,
                    smallest,
                });
                smallest
            }
        }
    }
}

/// Everything one pass looks at.
pub struct Snapshot<'a> {
    pub now: Instant,
    /// The wall clock at `now` (the node side's cooldowns end by it).
    pub utc: SystemTime,
    pub node: &'a IpamNode,
    /// The operator's fields to plan from: the node's, or with the addresses and marks of a
    /// source that keeps them ([`crate::source::IpSource::holdings`]).
    pub operator: &'a OperatorFields,
    /// The node side's answers to release marks (the node's `status.releaseAck`, or the
    /// source's).
    pub release_ack: &'a AddrMap<ReleaseAck>,
    pub info: &'a NodeInfo,
    /// Resolved watermarks (flags + the node's overrides), already validated.
    pub watermarks: Watermarks,
    pub families: &'a [Family],
    /// Addresses per grant unit, per family.
    pub grant_size: PerFamily<u128>,
    /// Pods bound to the node, not terminal, without pod IPs.
    pub pending: &'a [PodUid],
    /// The node's pools beyond its default ones (`watermarks` and the pods of `pending`
    /// that no other pool takes are the default pools').
    pub pools: &'a NodePools,
    pub release: ReleaseConfig,
    pub reclaim: ReclaimConfig,
    /// The scarce pools' squeezes (the manager's pool step).
    pub squeezes: &'a Squeezes,
}

/// A claim of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub family: Family,
    /// The pool to claim from (None: the node's default pool for the family).
    pub pool: Option<Arc<str>>,
    pub count: u64,
    /// Never go past this many addresses in total (a set max_allocate or the pods cap).
    pub limit: u64,
}

/// New marks to place in one family, chosen by the source from `free`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marks {
    pub family: Family,
    pub count: u64,
    /// The family's free addresses.
    pub free: AddrSet,
}

/// One lane's figures (a pool and family of a node), for the metrics' `pool` label; the
/// node's pods refused a pool count as waiting under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneSummary {
    /// The pool ("" for a source without pools).
    pub pool: Arc<str>,
    pub family: Family,
    pub counts: FamilyCounts,
    pub sizing: Sizing,
    /// Releasable units beyond the lane's own used and waiting, in addresses: its free
    /// addresses in whole free blocks for a source granting blocks, else its free addresses,
    /// either way less what its waiting pods take (DESIGN.md "The engine", Scarcity: the
    /// nodes holding the most give back first). Counted only while the lane's pool is
    /// squeezed (0 otherwise): the walk of the blocks would cost a never-scarce run half
    /// again its instructions.
    pub spare: u64,
}

/// One node's state summarized for stats, resync and the settled check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeSummary {
    pub counts: PerFamily<FamilyCounts>,
    pub sizing: PerFamily<Sizing>,
    pub blocked: Option<Blocked>,
    /// Excess that could really be released (free addresses beyond the target, marks in flight).
    pub releasable: u64,
    pub reclaim_candidates: u64,
    pub release_enabled: bool,
    /// Pods waiting for an address of each family the node serves (`counts` also counts
    /// them for a family the source does not serve, where every pod lacks an address; the
    /// metric `tidepool_ipam_pods_waiting` must not).
    pub pods_waiting: PerFamily<u64>,
}

impl NodeSummary {
    pub fn waiting(&self) -> u64 {
        self.counts.v4.waiting.max(self.counts.v6.waiting)
    }

    pub fn needed(&self) -> u64 {
        self.sizing.v4.needed + self.sizing.v6.needed
    }

    pub fn excess(&self) -> u64 {
        self.sizing.v4.excess + self.sizing.v6.excess
    }

    /// needed = 0, no pod waiting, and nothing of the excess is releasable (or release off).
    pub fn at_target(&self) -> bool {
        self.needed() == 0
            && self.waiting() == 0
            && (!self.release_enabled || self.excess() == 0 || self.releasable == 0)
    }

    /// At target, or blocked with a reason.
    pub fn settled(&self) -> bool {
        self.at_target() || self.blocked.is_some()
    }

    pub fn releasing(&self) -> bool {
        self.counts.v4.marked + self.counts.v6.marked > 0
    }
}

/// The plan of one pass. Its fields borrow the node's until a step changes them.
#[derive(Debug, Default)]
pub struct Plan<'a> {
    /// The operator's fields after the pure steps (acked tombstones dropped, answered marks
    /// settled, surplus marks withdrawn). The runtime adds tombstones, claims and marks.
    pub fields: Cow<'a, OperatorFields>,
    pub reclaim: ReclaimStep,
    /// Tombstones the node side answered (now dropped from `fields`).
    pub answered_tombstones: Vec<(IpAddr, ReclaimAck)>,
    /// Marked addresses answered ready-for-release: release them at the source.
    pub release_now: AddrSet,
    pub claims: Vec<Claim>,
    pub marks: Vec<Marks>,
    pub summary: NodeSummary,
    /// The node's figures per pool and family (the metrics' `pool` label).
    pub lanes: Vec<LaneSummary>,
    pub next_deadline: Option<Instant>,
    /// Why the node gets nothing new whatever it needs (`Plan::hold_back`).
    pub held_back: Option<Blocked>,
    /// Of `release_now`, the addresses of scarce pools, by pool and family (the metric
    /// of units given back because of scarcity).
    pub scarce_release: Vec<(Arc<str>, Family, u64)>,
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Counts one node's addresses per family, with `fields` as the operator's current fields.
/// `utc`: the wall clock now (a cooldown that ended counts for nothing).
pub fn count(
    node: &IpamNode,
    fields: &OperatorFields,
    pending: &[PodUid],
    utc: SystemTime,
) -> PerFamily<FamilyCounts> {
    count_of(node, fields, pending, false, utc)
}

/// [`count`]; `restricted`: `fields` hold one pool's addresses of a node that holds others
/// too, so only the `used` entries among them count.
fn count_of(
    node: &IpamNode,
    fields: &OperatorFields,
    pending: &[PodUid],
    restricted: bool,
    utc: SystemTime,
) -> PerFamily<FamilyCounts> {
    let mut c: PerFamily<FamilyCounts> = PerFamily::default();
    let used = match restricted {
        false => per_family(node.node.used.keys()),
        true => per_family(
            (node.node.used.keys())
                .filter(|a| fields.addresses.contains(a))
                .collect::<Vec<_>>()
                .into_iter(),
        ),
    };
    (c.v4.used, c.v6.used) = (used.v4, used.v6);
    let mut with_ip: PerFamily<BTreeSet<PodUid>> = PerFamily::default();
    if !pending.is_empty() {
        for (a, e) in &node.node.used {
            with_ip.get_mut(Family::of(&a)).insert(e.pod_uid);
        }
    }
    for a in node.node.cooling(utc) {
        if fields.addresses.contains(a) {
            c.get_mut(Family::of(a)).cooldown += 1;
        }
    }
    for f in Family::ALL {
        let fc = c.get_mut(f);
        fc.allocated = fields.addresses.count(f);
        fc.marked = fields
            .release
            .count_where(f, |s| *s == ReleaseState::MarkedForRelease);
    }
    for f in Family::ALL {
        c.get_mut(f).waiting = pending
            .iter()
            .filter(|u| !with_ip.get(f).contains(u))
            .count() as u64;
    }
    c
}

/// How many of the ascending addresses (`used` keys) are IPv4 and how many IPv6. IPv4 sorts first, so
/// when the first and the last are of one family, all are: no walk (the common
/// single-stack node); otherwise one walk.
fn per_family(
    mut addrs: impl DoubleEndedIterator<Item = IpAddr> + ExactSizeIterator,
) -> PerFamily<u64> {
    let n = addrs.len() as u64;
    let mut counts = PerFamily::default();
    let (Some(first), last) = (addrs.next(), addrs.next_back()) else {
        return counts;
    };
    let last = last.unwrap_or(first);
    if Family::of(&first) == Family::of(&last) {
        *counts.get_mut(Family::of(&first)) = n;
        return counts;
    }
    counts.v4 = 1 + addrs.filter(|a| a.is_ipv4()).count() as u64;
    counts.v6 = n - counts.v4;
    counts
}

/// The node's addresses of a family that are not free: used, cooling down at `utc`,
/// marked or released, or tombstoned.
fn taken(node: &IpamNode, fields: &OperatorFields, family: Family, utc: SystemTime) -> AddrSet {
    let mut taken = fields.release.keys().of_family(family);
    let singles = node.node.used.keys();
    let singles = singles.chain(node.node.cooling(utc).copied());
    taken.extend(
        singles
            .chain(fields.reclaim.keys().copied())
            .filter(|a| Family::of(a) == family),
    );
    taken.intersection(&fields.addresses)
}

/// Free addresses of a family (not used, not cooling down at `utc`, not marked, not
/// tombstoned).
fn free_addresses(
    node: &IpamNode,
    fields: &OperatorFields,
    family: Family,
    utc: SystemTime,
) -> AddrSet {
    let mut free = fields.addresses.of_family(family);
    free.subtract(&taken(node, fields, family, utc));
    free
}

/// Consecutive aligned groups of `grant` addresses (first..=last, by group number) of which
/// the node holds `held` addresses each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    first: u128,
    last: u128,
    held: u128,
}

/// The groups the runs touch, as segments in order: a run's edge groups alone (two runs
/// may share one), the whole groups between them as one segment — so a /64 granted in /124
/// groups is three segments, not 2^60.
fn segments<'a>(runs: impl Iterator<Item = &'a Run>, grant: u128) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    let edge = |out: &mut Vec<Segment>, g: u128, held: u128| match out.last_mut() {
        Some(l) if l.first == g && l.last == g => l.held += held,
        _ => out.push(Segment {
            first: g,
            last: g,
            held,
        }),
    };
    for r in runs {
        let (s, e) = (*r.start(), *r.end());
        let (g0, g1) = (s / grant, e / grant);
        if g0 == g1 {
            edge(&mut out, g0, e - s + 1);
            continue;
        }
        edge(&mut out, g0, grant - s % grant);
        if g1 > g0 + 1 {
            out.push(Segment {
                first: g0 + 1,
                last: g1 - 1,
                held: grant,
            });
        }
        edge(&mut out, g1, e % grant + 1);
    }
    out
}

/// Per family, the fewest addresses the node holds of one group (aligned `grant`
/// addresses of its family; `u128::MAX` when it holds none, or when grants are single
/// addresses, which form no groups).
fn smallest_groups(addresses: &AddrSet, grant: PerFamily<u128>) -> PerFamily<u128> {
    let smallest = |f: Family| {
        let size = *grant.get(f);
        if size <= 1 {
            return u128::MAX;
        }
        segments(addresses.runs_of(f), size)
            .iter()
            .map(|s| s.held)
            .min()
            .unwrap_or(u128::MAX)
    };
    PerFamily {
        v4: smallest(Family::V4),
        v6: smallest(Family::V6),
    }
}

/// How many groups of the segment hold an address of `taken`.
fn touched_groups(taken: &AddrSet, family: Family, seg: &Segment, grant: u128) -> u128 {
    let span = seg.first * grant..=(seg.last * grant).saturating_add(grant - 1);
    let mut count = 0;
    let mut last: Option<u128> = None;
    for r in taken.runs_within(family, &span) {
        let (mut g0, g1) = (r.start() / grant, r.end() / grant);
        if last == Some(g0) {
            g0 += 1;
        }
        if g0 <= g1 {
            count += g1 - g0 + 1;
        }
        last = Some(g1);
    }
    count
}

/// How many free addresses could go back as whole blocks (aligned groups of `grant`
/// addresses of which every address the node holds is free), at most `max`, largest first.
/// `smallest`: the smallest group's size ([`smallest_groups`]); `utc`: the wall clock now.
fn whole_free_blocks(
    node: &IpamNode,
    utc: SystemTime,
    fields: &OperatorFields,
    family: Family,
    grant: u128,
    max: u64,
    smallest: u128,
) -> u64 {
    // A group larger than `max` never counts: when every group is, nothing needs a look
    // (the usual case, a node holding a little more than its target).
    let max = u128::from(max);
    if smallest > max {
        return 0;
    }
    let taken = taken(node, fields, family, utc);
    // group size → how many such groups are wholly free
    let mut sizes: BTreeMap<u128, u128> = BTreeMap::new();
    for seg in segments(fields.addresses.runs_of(family), grant) {
        let free = (seg.last - seg.first + 1) - touched_groups(&taken, family, &seg, grant);
        if free > 0 && seg.held <= max {
            *sizes.entry(seg.held).or_default() += free;
        }
    }
    // largest first, each while it fits (groups of one size fit until the first does not)
    let mut total = 0u128;
    for (n, k) in sizes.into_iter().rev() {
        total += n * k.min((max - total) / n);
    }
    saturate(total)
}

/// Plans one pass; `pods` answers pod lookups from the cache.
pub fn plan<'a>(mem: &mut NodeMemory, s: &Snapshot<'a>, pods: &impl PodCache) -> Plan<'a> {
    let node = s.node;
    let mut p = Plan {
        fields: Cow::Borrowed(s.operator),
        ..Plan::default()
    };

    // 1. Reclaim: drop answered tombstones, then observe candidates.
    let acks = &node.node.reclaim_ack;
    let answered = |addr: &IpAddr, t: &Tombstone| acks.get(addr).filter(|a| a.answers(t));
    if s.operator
        .reclaim
        .iter()
        .any(|(a, t)| answered(a, t).is_some())
    {
        p.fields
            .to_mut()
            .reclaim
            .retain(|addr, t| match answered(addr, t) {
                Some(ack) => {
                    p.answered_tombstones.push((*addr, *ack));
                    false
                }
                None => true,
            });
    }
    p.reclaim = mem
        .reclaim
        .observe(s.now, &s.reclaim, node, &p.fields.reclaim, pods);
    p.next_deadline = p.reclaim.next_deadline;
    // a cooldown's end may change the plan (an address usable again, a block free), and
    // the node side writes nothing for it alone: look again then
    if let Some(end) = node.node.next_cooldown_end(s.utc) {
        let at = s.now + end.duration_since(s.utc).unwrap_or_default();
        p.next_deadline = earliest(p.next_deadline, Some(at));
    }

    // 2. Release handshakes: settle answers.
    let mut ready = AddrSet::new();
    if !p.fields.release.is_empty() {
        let fields = p.fields.to_mut();
        ready = handshake::settle(fields, s.release_ack);
        if !s.release.enabled {
            for f in Family::ALL {
                handshake::withdraw_surplus(fields, s.release_ack, f, 0);
            }
        }
    }

    // 3. Needed and excess per lane; withdraw marks that are no longer justified.
    if !p.fields.release.is_empty() {
        withdraw_unjustified(s, p.fields.to_mut());
    }
    // 4. Claim or mark.
    let smallest = mem.smallest_groups(&p.fields.addresses, s.grant_size);
    let sized = sized_lanes(s, &p.fields);
    p.summary = summary_of(s, &sized, p.reclaim.candidates as u64, smallest);
    p.lanes = lane_summaries(s, &sized, smallest);
    for (lane, c, sizing) in &sized.lanes {
        let f = lane.family;
        if sizing.claim > 0 && !s.info.cordoned && !s.info.terminating {
            p.claims.push(Claim {
                family: f,
                pool: lane.pool.cloned(),
                count: sizing.claim,
                limit: lane_cap(s, lane, c, &sized.counts)
                    .map_or(u64::MAX, |cap| cap.saturating_sub(c.allocated)),
            });
        }
        if !(s.release.enabled && sizing.needed == 0) {
            mem.set_excess_clock(f, lane.pool, None);
            continue;
        }
        let mark = sizing.mark.min(c.free());
        let mut since = mem.excess_clock(f, lane.pool);
        let delay = (lane.squeeze).map_or(s.release.delay, |q| q.release_delay(s.release.delay));
        let persisted = handshake::excess_persisted(&mut since, mark, s.now, delay);
        mem.set_excess_clock(f, lane.pool, since);
        match persisted {
            // a source granting blocks takes back whole free blocks only: when none
            // fits, there is nothing to offer it
            Ok(()) => {
                let grant = *s.grant_size.get(f);
                let smallest = lane_smallest(lane, &smallest, s.grant_size);
                if grant <= 1
                    || whole_free_blocks(node, s.utc, &lane.fields, f, grant, mark, smallest) > 0
                {
                    p.marks.push(Marks {
                        family: f,
                        count: mark,
                        free: free_addresses(node, &lane.fields, f, s.utc),
                    });
                }
            }
            Err(at) => p.next_deadline = earliest(p.next_deadline, at),
        }
    }
    // the marked addresses answered ready that survived the withdrawals
    p.release_now = ready.intersection(
        &p.fields
            .release
            .keys_where(|s| *s == ReleaseState::MarkedForRelease),
    );
    p.scarce_release = scarce_release(s, &sized, &p.release_now);
    p
}

/// Of `release_now`, the addresses of each squeezed lane.
fn scarce_release(
    s: &Snapshot<'_>,
    sized: &SizedLanes<'_>,
    release_now: &AddrSet,
) -> Vec<(Arc<str>, Family, u64)> {
    if release_now.is_empty() {
        return Vec::new();
    }
    (sized.lanes.iter())
        .filter(|(lane, ..)| lane.squeeze.is_some())
        .map(|(lane, ..)| {
            let f = lane.family;
            let n = release_now.intersection(&lane.fields.addresses).count(f);
            (pool_name(s, f, lane.pool), f, n)
        })
        .filter(|(.., n)| *n > 0)
        .collect()
}

/// A lane's pool by name: its own, or the node's default pool of the family when the
/// source names it, else "".
fn pool_name(s: &Snapshot<'_>, family: Family, pool: Option<&Arc<str>>) -> Arc<str> {
    (pool.or(s.pools.defaults.get(family).as_ref()))
        .cloned()
        .unwrap_or_else(|| Arc::from(""))
}

/// Puts the lane's pool's scarcity squeeze, if it is scarce, on its watermarks.
fn squeeze_lane(s: &Snapshot<'_>, lane: &mut Lane<'_>) {
    if s.squeezes.is_empty() {
        return;
    }
    let key = (pool_name(s, lane.family, lane.pool), lane.family);
    if let Some(q) = s.squeezes.get(&key) {
        lane.watermarks = q.apply(&lane.watermarks);
        lane.squeeze = Some(*q);
    }
}

/// Withdraws, lane by lane, the marks its sizing no longer justifies (all of them while it
/// needs addresses).
fn withdraw_unjustified(s: &Snapshot<'_>, fields: &mut OperatorFields) {
    let mut gone = AddrSet::new();
    for (mut lane, c, sizing) in sized_lanes(s, fields).lanes {
        let keep = if sizing.needed > 0 { 0 } else { sizing.excess };
        if c.marked <= keep {
            continue;
        }
        let before = lane.fields.release.keys();
        handshake::withdraw_surplus(lane.fields.to_mut(), s.release_ack, lane.family, keep);
        let mut withdrawn = before;
        withdrawn.subtract(&lane.fields.release.keys());
        gone.union_with(&withdrawn);
    }
    fields.release.remove_set(&gone);
}

/// A lane's counts and sizing; `counts`: the node's, for a lane that sees all of them.
fn size_lane(
    s: &Snapshot<'_>,
    lane: &Lane<'_>,
    counts: &PerFamily<FamilyCounts>,
) -> (FamilyCounts, Sizing) {
    let f = lane.family;
    let c = match lane.restricted {
        false => *counts.get(f),
        true => *count_of(s.node, &lane.fields, &lane.pending, true, s.utc).get(f),
    };
    let cap = lane_cap(s, lane, &c, counts);
    (c, watermarks::size(&lane.watermarks, &c, cap))
}

/// The hard cap on a lane: the node's allocatable pods less the pods its other pools of
/// the family hold or wait for, rounded up to whole blocks (one pool's rounding takes no
/// room from another's), and `max_allocate` (the node's, and a pool's own for another pool).
fn lane_cap(
    s: &Snapshot<'_>,
    lane: &Lane<'_>,
    c: &FamilyCounts,
    counts: &PerFamily<FamilyCounts>,
) -> Option<u64> {
    let f = lane.family;
    let others = counts.get(f).demand().saturating_sub(c.demand());
    let others = u32::try_from(others).unwrap_or(u32::MAX);
    let pods = s.info.allocatable_pods.saturating_sub(others);
    let grant = *s.grant_size.get(f);
    let node = watermarks::pool_cap(&s.watermarks, Some(pods), grant);
    if lane.pool.is_none() {
        return node;
    }
    match (node, watermarks::pool_cap(&lane.watermarks, None, grant)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The smallest group of the lane's addresses: the node's, for a lane that sees all.
fn lane_smallest(lane: &Lane<'_>, node: &PerFamily<u128>, grant: PerFamily<u128>) -> u128 {
    let f = lane.family;
    match lane.restricted {
        false => *node.get(f),
        true => *smallest_groups(&lane.fields.addresses, grant).get(f),
    }
}

/// Summarizes the node as it would be with `fields` as the operator's fields.
pub fn summarize(
    mem: &mut NodeMemory,
    s: &Snapshot<'_>,
    fields: &OperatorFields,
    reclaim_candidates: u64,
) -> (NodeSummary, Vec<LaneSummary>) {
    let smallest = mem.smallest_groups(&fields.addresses, s.grant_size);
    let sized = sized_lanes(s, fields);
    let summary = summary_of(s, &sized, reclaim_candidates, smallest);
    (summary, lane_summaries(s, &sized, smallest))
}

/// Each lane's figures, under its pool's name (the node's default pool's, when the source
/// names it), and the pods refused a pool, waiting under it.
fn lane_summaries(
    s: &Snapshot<'_>,
    sized: &SizedLanes<'_>,
    smallest: PerFamily<u128>,
) -> Vec<LaneSummary> {
    let mut out: Vec<LaneSummary> = (sized.lanes.iter())
        .map(|(lane, c, sizing)| LaneSummary {
            pool: pool_name(s, lane.family, lane.pool),
            family: lane.family,
            counts: *c,
            sizing: *sizing,
            spare: spare(s, lane, c, smallest),
        })
        .collect();
    for &family in s.families {
        for u in s.pools.unplaced.get(family) {
            let pool = pool_name(s, family, u.pool.as_ref());
            match out
                .iter_mut()
                .find(|l| l.family == family && l.pool == pool)
            {
                Some(l) => l.counts.waiting += 1,
                None => out.push(LaneSummary {
                    pool,
                    family,
                    counts: FamilyCounts {
                        waiting: 1,
                        ..FamilyCounts::default()
                    },
                    sizing: Sizing::default(),
                    spare: 0,
                }),
            }
        }
    }
    out
}

/// The lane's releasable units beyond its own used and waiting, in addresses, while its
/// pool is squeezed.
fn spare(s: &Snapshot<'_>, lane: &Lane<'_>, c: &FamilyCounts, smallest: PerFamily<u128>) -> u64 {
    if lane.squeeze.is_none() {
        return 0;
    }
    let room = c.free().saturating_sub(c.waiting);
    let f = lane.family;
    let grant = *s.grant_size.get(f);
    if grant <= 1 || room == 0 {
        return room;
    }
    let smallest = lane_smallest(lane, &smallest, s.grant_size);
    whole_free_blocks(s.node, s.utc, &lane.fields, f, grant, room, smallest)
}

/// The node's counts, and its lanes with theirs and their sizing.
struct SizedLanes<'s> {
    counts: PerFamily<FamilyCounts>,
    lanes: Vec<(Lane<'s>, FamilyCounts, Sizing)>,
}

/// Counts and sizes the node's lanes as they are with `fields` as the operator's fields.
fn sized_lanes<'s>(s: &'s Snapshot<'_>, fields: &'s OperatorFields) -> SizedLanes<'s> {
    let counts = count(s.node, fields, s.pending, s.utc);
    let lanes = lanes(
        s.families,
        fields,
        s.pending,
        (s.watermarks, &s.node.watermarks),
        s.pools,
    );
    let lanes = (lanes.into_iter())
        .map(|mut lane| {
            squeeze_lane(s, &mut lane);
            let (c, sizing) = size_lane(s, &lane, &counts);
            (lane, c, sizing)
        })
        .collect();
    SizedLanes { counts, lanes }
}

/// The node's summary from its sized lanes: each family's sizing is the sum of its lanes'.
fn summary_of(
    s: &Snapshot<'_>,
    sized: &SizedLanes<'_>,
    reclaim_candidates: u64,
    smallest: PerFamily<u128>,
) -> NodeSummary {
    let counts = sized.counts;
    let mut summary = NodeSummary {
        counts,
        release_enabled: s.release.enabled,
        reclaim_candidates,
        ..NodeSummary::default()
    };
    for &f in s.families {
        *summary.pods_waiting.get_mut(f) = counts.get(f).waiting;
    }
    for (lane, c, sizing) in &sized.lanes {
        let f = lane.family;
        if sizing.claim > 0 {
            if s.info.terminating {
                summary.blocked = summary.blocked.or(Some(Blocked::Terminating));
            } else if s.info.cordoned {
                summary.blocked = summary.blocked.or(Some(Blocked::Cordoned));
            }
        } else if sizing.at_cap {
            summary.blocked = summary.blocked.or(Some(Blocked::AtCap));
        }
        // marks sit on free addresses and tombstones on used ones, so the counts suffice
        // for per-address grants; a source granting blocks can give back whole free blocks only
        let room = c.free().min(sizing.excess.saturating_sub(c.marked));
        let grant = *s.grant_size.get(f);
        let releasable = if grant > 1 && room > 0 {
            let smallest = lane_smallest(lane, &smallest, s.grant_size);
            whole_free_blocks(s.node, s.utc, &lane.fields, f, grant, room, smallest)
        } else {
            room
        };
        summary.releasable += releasable + c.marked;
        add_sizing(summary.sizing.get_mut(f), sizing);
    }
    summary
}

/// Adds a lane's sizing to its family's.
fn add_sizing(total: &mut Sizing, lane: &Sizing) {
    total.needed += lane.needed;
    total.excess += lane.excess;
    total.claim += lane.claim;
    total.mark += lane.mark;
    total.at_cap |= lane.at_cap;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addrs::span;
    use crate::types::{NodeUid, PodName, PodUid, ReclaimReason, UsedEntry};
    use proptest::prelude::*;
    use std::time::{Duration, SystemTime};

    /// The wall clock of the plans under test.
    const NOW: SystemTime = SystemTime::UNIX_EPOCH;

    fn addr(v6: bool, n: u8) -> IpAddr {
        if v6 {
            IpAddr::V6(std::net::Ipv6Addr::new(
                0xfd00,
                0,
                0,
                0,
                0,
                0,
                0,
                u16::from(n),
            ))
        } else {
            IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, n))
        }
    }

    /// The `used` entry of pod `i`.
    fn used_by(i: usize) -> UsedEntry {
        UsedEntry {
            pod_uid: PodUid(i as u128),
            pod: PodName::new("ns", "p"),
            allocation: crate::types::AllocationId(1),
            since: SystemTime::UNIX_EPOCH.into(),
        }
    }

    proptest! {
        /// Per-family counts agree with counting each address.
        #[test]
        fn per_family_counts_each_address(v4 in 0u8..40, v6 in 0u8..40) {
            let set: BTreeSet<IpAddr> = (0..v4)
                .map(|n| addr(false, n))
                .chain((0..v6).map(|n| addr(true, n)))
                .collect();
            let c = per_family(set.iter().copied());
            prop_assert_eq!((c.v4, c.v6), (u64::from(v4), u64::from(v6)));
        }

        /// Whole free blocks as counted group by group with lookups, for every `max`.
        #[test]
        fn whole_free_blocks_matches_a_count_by_group(
            // per IPv4 address 0..64: held, used
            flags in proptest::collection::vec(any::<[bool; 2]>(), 64),
            grant in prop_oneof![Just(4u128), Just(8), Just(16)],
            max in 0u64..40,
        ) {
            let mut node = IpamNode::new("n".into(), NodeUid(1));
            let mut fields = OperatorFields::default();
            for (i, f) in flags.iter().enumerate() {
                let a = addr(false, i as u8);
                if f[0] { Arc::make_mut(&mut fields.addresses).insert(a); }
                if f[1] { node.node.used.insert(a, used_by(i)); }
            }
            let mut groups: BTreeMap<u128, (u64, bool)> = BTreeMap::new();
            for (i, f) in flags.iter().enumerate() {
                if f[0] {
                    let g = groups.entry(i as u128 / grant).or_insert((0, true));
                    g.0 += 1;
                    g.1 &= !f[1];
                }
            }
            let mut sizes: Vec<u64> =
                groups.values().filter(|(_, free)| *free).map(|(n, _)| *n).collect();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            let mut want = 0;
            for n in sizes {
                if want + n <= max {
                    want += n;
                }
            }
            let smallest = smallest_groups(&fields.addresses, PerFamily { v4: grant, v6: 1 });
            let held_min = groups.values().map(|(n, _)| u128::from(*n)).min();
            prop_assert_eq!(smallest.v4, held_min.unwrap_or(u128::MAX));
            prop_assert_eq!(
                whole_free_blocks(&node, NOW, &fields, Family::V4, grant, max, smallest.v4),
                want
            );
        }

        /// The free set is what a lookup per address finds.
        #[test]
        fn free_addresses_match_lookups(
            // per address (both families, 0..64): held, used, cooling down (or ended), marked, tombstoned
            flags in proptest::collection::vec(any::<[bool; 5]>(), 128),
        ) {
            let mut node = IpamNode::new("n".into(), NodeUid(1));
            let mut fields = OperatorFields::default();
            for (i, f) in flags.iter().enumerate() {
                let a = addr(i >= 64, (i % 64) as u8);
                if f[0] { Arc::make_mut(&mut fields.addresses).insert(a); }
                if f[1] { node.node.used.insert(a, used_by(i)); }
                if f[2] {
                    // every other cooldown ended at NOW: over, though still listed
                    let until = if i % 2 == 0 { NOW + Duration::from_secs(30) } else { NOW };
                    node.node.cooldown.insert(a, until);
                }
                if f[3] { fields.release.insert(a, ReleaseState::MarkedForRelease); }
                if f[4] {
                    fields.reclaim.insert(a, Tombstone { pod_uid: PodUid(1), allocation: crate::types::AllocationId(1), reason: ReclaimReason::PodDeleted });
                }
            }
            for family in Family::ALL {
                let looked_up: Vec<IpAddr> = fields
                    .addresses
                    .iter()
                    .filter(|a| {
                        Family::of(a) == family
                            && !node.node.used.contains_key(a)
                            && node.node.cooldown.get(a).is_none_or(|u| *u <= NOW)
                            && !fields.release.contains_key(a)
                            && !fields.reclaim.contains_key(a)
                    })
                    .collect();
                let free: Vec<IpAddr> = free_addresses(&node, &fields, family, NOW).iter().collect();
                prop_assert_eq!(free, looked_up);
            }
        }
    }

    /// A node holding one /64 granted in /64 blocks: its counts saturate, its free set is a
    /// handful of runs, the group walk sees one group, and nothing of it is releasable
    /// while a pod uses it — with memory for the runs only.
    #[test]
    fn a_64_block_is_planned_from_its_runs() {
        let net: ipnet::IpNet = "fd00:0:0:7::/64".parse().unwrap();
        let mut node = IpamNode::new("n".into(), NodeUid(1));
        let mut fields = OperatorFields {
            addresses: Arc::new(AddrSet::of_net(&net)),
            ..Default::default()
        };
        let used: IpAddr = "fd00:0:0:7::2".parse().unwrap();
        node.node.used.insert(used, used_by(1));
        let c = count(&node, &fields, &[], NOW);
        assert_eq!((c.v6.allocated, c.v6.used), (u64::MAX, 1));
        let free = free_addresses(&node, &fields, Family::V6, NOW);
        assert_eq!(free.run_count(), 2);
        assert!(!free.contains(&used));
        let grant = PerFamily {
            v4: 1,
            v6: 1u128 << 64,
        };
        let smallest = smallest_groups(&fields.addresses, grant);
        assert_eq!(smallest.v6, 1u128 << 64);
        assert_eq!(
            whole_free_blocks(
                &node,
                NOW,
                &fields,
                Family::V6,
                1 << 64,
                u64::MAX,
                smallest.v6
            ),
            0
        );
        // in /124 groups: 2^60 groups, all whole and free but the used one's
        let grant = 16u128;
        let smallest = smallest_groups(&fields.addresses, PerFamily { v4: 1, v6: grant });
        assert_eq!(smallest.v6, 16);
        assert_eq!(
            whole_free_blocks(&node, NOW, &fields, Family::V6, grant, 64, smallest.v6),
            64
        );
        assert_eq!(
            whole_free_blocks(
                &node,
                NOW,
                &fields,
                Family::V6,
                grant,
                u64::MAX,
                smallest.v6
            ),
            u64::MAX - 15,
            "(2^60 - 1) groups of 16, saturated"
        );
        // a mark on part of it is a run too
        fields
            .release
            .insert_run(Family::V6, span(&net).1, ReleaseState::MarkedForRelease);
        assert_eq!(count(&node, &fields, &[], NOW).v6.marked, u64::MAX);
        assert!(free_addresses(&node, &fields, Family::V6, NOW).is_empty());
    }

    /// A lane's spare units, for the order a scarce pool's nodes give back in: the free
    /// addresses in whole free blocks for a block grant, each free address for a grant of
    /// one; either way less what the pods waiting take; none counted while the pool is not
    /// squeezed.
    #[test]
    fn spare_counts_whole_free_blocks_beyond_the_pods_waiting() {
        let mut node = IpamNode::new("n".into(), NodeUid(1));
        let mut fields = OperatorFields::default();
        for i in 0..64u8 {
            Arc::make_mut(&mut fields.addresses).insert(addr(false, i));
        }
        // in blocks of 16: block 0 has 10 used, block 1 one, blocks 2 and 3 none (53 free)
        for i in (0..10).chain([16]) {
            node.node
                .used
                .insert(addr(false, i), used_by(usize::from(i)));
        }
        let info = NodeInfo {
            name: "n".into(),
            uid: NodeUid(1),
            allocatable_pods: 110,
            cordoned: false,
            terminating: false,
        };
        let squeeze = crate::scarcity::Squeeze {
            keep_per_mille: 500,
            release_delay: std::time::Duration::from_secs(10),
        };
        let scarce: Squeezes = [(("".into(), Family::V4), squeeze)].into();
        let spare = |grant: u128, waiting: u128, squeezes: &Squeezes| {
            let pending: Vec<PodUid> = (1000..1000 + waiting).map(PodUid).collect();
            let s = Snapshot {
                now: Instant::now(),
                utc: NOW,
                node: &node,
                operator: &fields,
                release_ack: &AddrMap::new(),
                info: &info,
                watermarks: Watermarks::default(),
                families: &[Family::V4],
                grant_size: PerFamily { v4: grant, v6: 1 },
                pending: &pending,
                pools: &NodePools::EMPTY,
                release: ReleaseConfig::default(),
                reclaim: ReclaimConfig::default(),
                squeezes,
            };
            let (_, lanes) = summarize(&mut NodeMemory::default(), &s, &fields, 0);
            assert_eq!(lanes.len(), 1);
            lanes[0].spare
        };
        assert_eq!(spare(16, 0, &scarce), 32, "blocks 2 and 3");
        assert_eq!(
            spare(16, 30, &scarce),
            16,
            "23 beyond the waiting: one block"
        );
        assert_eq!(spare(16, 40, &scarce), 0, "13 beyond the waiting: no block");
        assert_eq!(spare(1, 0, &scarce), 53);
        assert_eq!(spare(1, 30, &scarce), 23);
        assert_eq!(spare(1, 60, &scarce), 0);
        assert_eq!(
            spare(16, 0, &Squeezes::new()),
            0,
            "not counted unless scarce"
        );
    }
}
