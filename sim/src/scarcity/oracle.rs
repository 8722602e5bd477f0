//! The waiting-time oracle of one pool and family (issue 30): a lower bound on the
//! pod-waiting seconds any assignment could achieve, computed online from the world's pod
//! events (arrivals, starts, deletions), beside the actual waiting seconds counted the same
//! way. Pure: times are offsets from the run's start, nothing here reads the engine.
//!
//! At every instant it holds, per node, the pods present (`live`, served or not) and the
//! addresses still held after a served pod left (`holds`: a deleted pod's address cools for
//! `reuse_cooldown`; a crashed pod's is held until the reclaim could take it, `grace` after
//! the crash and no sooner than `min_age` after the pod started, then cools). A node's need
//! is `ceil(min(live + holds, cap) / unit)` units. A unit a node held and gave up reaches
//! another node only `move_cost` later (the scarcity release delay plus one round trip): a
//! node's usage is the larger of its need and the most units it held (for the pods the
//! world served, and the holds) within the last `move_cost`. The bound at an instant is the
//! fewest present pods that must wait so that every node stays within its cap and the
//! usages fit the pool's capacity (a greedy that is optimal for this shape: freeing a
//! node's first unit costs its remainder, every further one a whole unit); the oracle is its
//! integral over the measured period. Where a call claims a bounded number of units
//! (cluster-pool: one IPAMBlock create per block, under the kube budget; a cloud: one
//! interface's addresses at most, under the source budget), no more units are held than the
//! budget's calls could have claimed since the start ([`ClaimBudget`]): a bring-up waits for
//! its claims. The units given up are those the world's served pods
//! held (no assignment moves a unit faster), so the world's own state satisfies every
//! constraint but one and its waiting is rarely below the bound: the engine's release delay
//! runs from when a node's excess first appeared, not per unit, so a unit freed on a node
//! already in excess that long moves sooner than `move_cost` (docs/simulate.md). It is a
//! bound per instant, not an optimum over schedules.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use foldhash::HashMap;
use std::time::Duration;

use tidepool_ipam::NodeName;

/// The constraints of one pool and family.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OracleLimits {
    /// Addresses per unit (a block's; 1 for a per-address source).
    pub unit: u64,
    /// Units in the pool.
    pub capacity: u64,
    /// Addresses a node may hold (its allocatable pods).
    pub node_cap: u64,
    /// How long a unit takes to move between nodes.
    pub move_cost: Duration,
    /// A crashed pod's address is held `reclaim_grace` after the crash, and at least
    /// `reclaim_min_age` after the pod started; then it cools.
    pub reclaim_grace: Duration,
    pub reclaim_min_age: Duration,
    pub cooldown: Duration,
    /// The budget the units are claimed under (None: no bound on what a call claims, as
    /// the in-memory source's).
    pub claims: Option<ClaimBudget>,
}

/// A token bucket of claim calls from the run's start: `burst` at once, then `qps` a
/// second, each claiming at most `per_call` units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClaimBudget {
    pub burst: u64,
    pub qps: f64,
    pub per_call: u64,
}

impl ClaimBudget {
    /// The most units claimed by `at`.
    fn units_by(&self, at: Duration) -> u64 {
        // no overflow: `as` saturates, and a run is shorter than u64::MAX calls
        let calls = (self.burst).saturating_add((self.qps * at.as_secs_f64()).floor() as u64);
        calls.saturating_mul(self.per_call.max(1))
    }

    /// The first instant by which `units` can have been claimed (`units` > what the burst
    /// claims).
    fn reaches(&self, units: u64) -> Duration {
        let calls = units.div_ceil(self.per_call.max(1));
        let mut at = Duration::from_secs_f64((calls - self.burst) as f64 / self.qps);
        // the division may round below the instant the product reaches `units`
        while self.units_by(at) < units {
            at += Duration::from_nanos(1);
        }
        at
    }
}

#[derive(Debug, Default)]
struct NodeOcc {
    live: u64,
    /// Of the live pods, those the world served.
    served: u64,
    holds: u64,
    /// Needs dropped from, each with when it can serve elsewhere (oldest first).
    dropped: VecDeque<(Duration, u64)>,
    /// Its usage as last counted in the pool's sum.
    counted: u64,
    /// Its part in the greedy as last counted in the pool's.
    frees: Frees,
}

/// What a node can free for the bound's greedy: its first unit, when partly occupied, at
/// the cost of its pods in it; then whole units.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Frees {
    first: Option<u64>,
    units: u64,
}

/// Why a timer of the pool fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    HoldEnds,
    MoveDone,
    /// The claim budget allows one more unit (the timer's node is none).
    Claimable,
}

/// One pool and family's oracle and actual waiting, integrated as events come.
#[derive(Debug)]
pub struct PoolOracle {
    limits: OracleLimits,
    nodes: HashMap<NodeName, NodeOcc>,
    timers: BinaryHeap<Reverse<(Duration, Timer, NodeName)>>,
    /// Σ (live + holds): the addresses the pool's pods and holds occupy.
    present: u64,
    /// The nodes' [`Frees`]: how many first units cost each remainder, and the whole
    /// units. Kept as the nodes change, so the bound costs no walk over the nodes.
    firsts: BTreeMap<u64, u64>,
    at_unit: u64,
    /// Σ usage, Σ pods forced to wait by their node's cap, and the bound, now.
    usage: u64,
    forced: u64,
    bound: u64,
    /// Pods waiting in the world now.
    waiting: u64,
    /// A [`Timer::Claimable`] is queued.
    claim_queued: bool,
    now: Duration,
    measure_from: Duration,
    oracle_seconds: f64,
    actual_seconds: f64,
}

impl PoolOracle {
    pub fn new(limits: OracleLimits, now: Duration) -> PoolOracle {
        PoolOracle {
            limits,
            nodes: HashMap::default(),
            timers: BinaryHeap::new(),
            present: 0,
            firsts: BTreeMap::new(),
            at_unit: 0,
            usage: 0,
            forced: 0,
            bound: 0,
            waiting: 0,
            claim_queued: false,
            now,
            measure_from: Duration::ZERO,
            oracle_seconds: 0.0,
            actual_seconds: 0.0,
        }
    }

    /// Integrates from `at` on only (the measured period's start).
    pub fn measure_from(&mut self, at: Duration) {
        self.measure_from = at;
        (self.oracle_seconds, self.actual_seconds) = (0.0, 0.0);
    }

    /// The pool's capacity changed (a cloud subnet's primaries).
    pub fn set_capacity(&mut self, at: Duration, units: u64) {
        self.advance(at);
        self.limits.capacity = units;
        self.update_bound();
    }

    /// A pod is scheduled to `node`: present, and waiting in the world.
    pub fn arrive(&mut self, at: Duration, node: &NodeName) {
        self.advance(at);
        self.waiting += 1;
        self.change(node, |n| n.live += 1);
    }

    /// A waiting pod of `node` got its address in the world.
    pub fn started(&mut self, at: Duration, node: &NodeName) {
        self.advance(at);
        self.waiting = self.waiting.saturating_sub(1);
        self.change(node, |n| n.served += 1);
    }

    /// A pod left `node` (deleted, or lost with its machine). One the world served (at
    /// `started`) holds its address on: `crashed`, until the reclaim could take it and then
    /// for the cooldown, else for the cooldown.
    pub fn depart(
        &mut self,
        at: Duration,
        node: &NodeName,
        started: Option<Duration>,
        crashed: bool,
    ) {
        self.advance(at);
        let served = started.is_some();
        if !served {
            self.waiting = self.waiting.saturating_sub(1);
        }
        let l = self.limits;
        let free_at = match started {
            Some(t) if crashed => (at + l.reclaim_grace).max(t + l.reclaim_min_age),
            _ => at,
        } + l.cooldown;
        let held = served && free_at > at;
        if held {
            (self.timers).push(Reverse((free_at, Timer::HoldEnds, node.clone())));
        }
        self.change(node, |n| {
            n.live = n.live.saturating_sub(1);
            n.served = n.served.saturating_sub(u64::from(served));
            n.holds += u64::from(held);
        });
    }

    /// The share of the pool its pods and holds occupy now (waiting pods included): the
    /// demand the scarcity pressure measures, but for leaked addresses held past the
    /// reclaim's earliest.
    pub fn occupied_share(&self) -> f64 {
        let l = &self.limits;
        self.present as f64 / (l.capacity as f64 * l.unit as f64).max(1.0)
    }

    /// Integrates up to `at` (the run's end) and returns (oracle, actual) waiting seconds.
    pub fn finish(&mut self, at: Duration) -> (f64, f64) {
        self.advance(at);
        (self.oracle_seconds, self.actual_seconds)
    }

    /// Fires the timers due by `at`, integrating the bound and the waiting between them.
    fn advance(&mut self, at: Duration) {
        while let Some(Reverse((t, _, _))) = self.timers.peek() {
            if *t > at {
                break;
            }
            let Reverse((t, timer, node)) = self.timers.pop().expect("peeked");
            self.integrate(t);
            match timer {
                Timer::HoldEnds => self.change(&node, |n| n.holds = n.holds.saturating_sub(1)),
                Timer::MoveDone => self.change(&node, |_| {}),
                Timer::Claimable => {
                    self.claim_queued = false;
                    self.update_bound();
                }
            }
        }
        self.integrate(at);
    }

    fn integrate(&mut self, to: Duration) {
        let from = self.now.max(self.measure_from);
        if to > from {
            let dt = (to - from).as_secs_f64();
            self.oracle_seconds += self.bound as f64 * dt;
            self.actual_seconds += self.waiting as f64 * dt;
        }
        self.now = self.now.max(to);
    }

    /// Applies `f` to `node` and updates the sums and the bound.
    fn change(&mut self, node: &NodeName, f: impl FnOnce(&mut NodeOcc)) {
        let (l, now) = (self.limits, self.now);
        let n = self.nodes.entry(node.clone()).or_default();
        let (usage0, forced0) = (n.counted, forced(n, &l));
        let (held0, present0) = (held(n, &l), n.live + n.holds);
        f(n);
        self.present = self.present + (n.live + n.holds) - present0;
        if held(n, &l) < held0 && !l.move_cost.is_zero() {
            n.dropped.push_back((now + l.move_cost, held0));
            (self.timers).push(Reverse((now + l.move_cost, Timer::MoveDone, node.clone())));
        }
        while n.dropped.front().is_some_and(|(until, _)| *until <= now) {
            n.dropped.pop_front();
        }
        let (usage1, forced1) = (usage(n, &l, now), forced(n, &l));
        n.counted = usage1;
        let frees1 = frees(n, &l, now);
        let frees0 = std::mem::replace(&mut n.frees, frees1);
        if n.live == 0 && n.holds == 0 && n.dropped.is_empty() {
            self.nodes.remove(node);
        }
        self.count_frees(frees0, false);
        self.count_frees(frees1, true);
        self.usage = self.usage + usage1 - usage0;
        self.forced = self.forced + forced1 - forced0;
        self.update_bound();
    }

    /// Recomputes the bound; while the claim budget holds the nodes below their need, the
    /// bound falls as it allows one more unit, so a timer is queued for that instant.
    fn update_bound(&mut self) {
        self.bound = self.bound_now();
        let Some(b) = self.limits.claims else {
            return;
        };
        let claimable = b.units_by(self.now);
        if self.claim_queued || claimable >= self.limits.capacity || self.usage <= claimable {
            return;
        }
        let at = b.reaches(claimable + 1);
        (self.timers).push(Reverse((at, Timer::Claimable, NodeName::from(""))));
        self.claim_queued = true;
    }

    /// The units the nodes may hold now: the pool's, or fewer while the claim budget has
    /// not let that many be claimed yet.
    fn available(&self) -> u64 {
        let l = &self.limits;
        match l.claims {
            Some(b) => b.units_by(self.now).min(l.capacity),
            None => l.capacity,
        }
    }

    /// Adds a node's [`Frees`] to the pool's, or takes them out.
    fn count_frees(&mut self, f: Frees, add: bool) {
        if let Some(rem) = f.first {
            let c = self.firsts.entry(rem).or_default();
            *c = if add { *c + 1 } else { *c - 1 };
            if *c == 0 {
                self.firsts.remove(&rem);
            }
        }
        self.at_unit = if add {
            self.at_unit + f.units
        } else {
            self.at_unit - f.units
        };
    }

    /// The fewest pods that must wait now (see the module's doc): the units short freed
    /// cheapest first, each node's first unit at its remainder, then whole units.
    fn bound_now(&self) -> u64 {
        let (l, available) = (&self.limits, self.available());
        if self.usage <= available {
            return self.forced;
        }
        let (mut short, mut cost) = (self.usage - available, 0);
        for (rem, count) in &self.firsts {
            let k = (*count).min(short);
            (cost, short) = (cost + k * rem, short - k);
            if short == 0 {
                break;
            }
        }
        self.forced + cost + short.min(self.at_unit) * l.unit
    }
}

/// What `n` can free at `now` (see [`Frees`]): nothing beyond the units it gave up that
/// have not reached another node yet, nor a unit holding more pods than may wait.
fn frees(n: &NodeOcc, l: &OracleLimits, now: Duration) -> Frees {
    let (occ, floor) = (occupied(n, l), dropped_max(n, now));
    let need = occ.div_ceil(l.unit);
    let removable = n.live - forced(n, l);
    if need <= floor {
        return Frees::default();
    }
    let rem = occ - (need - 1) * l.unit;
    if removable < rem {
        return Frees::default();
    }
    let further = (need - floor - 1).min((removable - rem) / l.unit);
    match rem < l.unit {
        true => Frees {
            first: Some(rem),
            units: further,
        },
        false => Frees {
            first: None,
            units: further + 1,
        },
    }
}

/// Addresses a node occupies, within its cap.
fn occupied(n: &NodeOcc, l: &OracleLimits) -> u64 {
    (n.live + n.holds).min(l.node_cap)
}

fn need(n: &NodeOcc, l: &OracleLimits) -> u64 {
    occupied(n, l).div_ceil(l.unit)
}

/// Units the node holds in the world at least: for its served pods and its holds.
fn held(n: &NodeOcc, l: &OracleLimits) -> u64 {
    (n.served + n.holds).min(l.node_cap).div_ceil(l.unit)
}

/// Pods of the node beyond its cap: they wait whatever the pool holds.
fn forced(n: &NodeOcc, l: &OracleLimits) -> u64 {
    (n.live + n.holds).saturating_sub(l.node_cap).min(n.live)
}

/// The most units the node gave up that cannot serve elsewhere yet at `now`.
fn dropped_max(n: &NodeOcc, now: Duration) -> u64 {
    (n.dropped.iter())
        .filter(|(until, _)| *until > now)
        .map(|(_, need)| *need)
        .max()
        .unwrap_or(0)
}

fn usage(n: &NodeOcc, l: &OracleLimits, now: Duration) -> u64 {
    need(n, l).max(dropped_max(n, now))
}
