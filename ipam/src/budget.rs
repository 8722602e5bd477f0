//! Per-API call budgets with priority admission (DESIGN.md, "Priority and budget").
//!
//! Every mutating call of the engine first takes one token from the [`Budget`] of its API:
//! [`Api::Source`] (an external IP source, `--api-qps`/`--api-burst`) or [`Api::Kube`] (API
//! server writes, `--kube-api-qps`/`--kube-api-burst`). A budget is a governor GCRA bucket
//! (`qps`, `burst`) that runs on tokio's clock ([`TokioInstant`]), so paused test time and the
//! simulator's virtual time drive it; governor's own timer (`until_ready`) is never used — the
//! wait is computed from governor's `NotUntil` answer and slept with
//! [`tokio::time::sleep_until`].
//!
//! # Admission
//!
//! A caller that finds an empty queue and a free token goes at once. Otherwise it joins the
//! queue. At each moment exactly one queued waiter is the *dispatcher*: the only one that
//! sleeps on the bucket's next token time. When that time comes it takes the token and hands it
//! to the waiter that ranks first *at that moment* (possibly itself), waking only that waiter.
//! If the dispatcher itself leaves (admitted or dropped) it appoints the oldest remaining waiter
//! (that someone awaits: see "Passes") and wakes only it. So each token costs at most two wake-ups, whatever the queue length.
//! The queue lives under one `parking_lot` mutex that is never held across an await.
//!
//! Ranking, [`SchedulingMode::Priority`]: priorities are read from each waiter's
//! [`PriorityCell`] at admission time (not at enqueue), so a node whose pods start waiting
//! while it is queued moves up at once. The waiter with the highest *effective score* wins:
//!
//! ```text
//! score = boost(priority now) + time waited so far
//! boost = (waiting_pods > 0 ? POD_CLASS_BOOST (30 s) : 0)
//!       + min(waiting_pods, 120) × PER_WAITING_POD (250 ms)
//!       + min(needed, 249)       × PER_NEEDED     (1 ms)
//! ```
//!
//! With equal waiting times this is lexicographic within the caps: any node with pods waiting
//! beats any node without, more waiting pods beat fewer (250 ms per pod > 249 × 1 ms of
//! `needed`), and then larger `needed` wins. Ties go to the earlier arrival (a sequence number),
//! so the order is deterministic. Time waited counts one for one against the boost: a waiter
//! outranks every waiter that arrived more than `boost(other) − boost(self)` ≤ [`MAX_BOOST`]
//! (60.249 s) after it. Hence no starvation: a waiter is admitted after at most (waiters queued
//! before it) + (arrivals within [`MAX_BOOST`] after it) tokens. Because both terms grow with
//! time at the same rate, the ranking key `boost − enqueue time` does not depend on "now".
//!
//! [`SchedulingMode::Fifo`] admits in arrival order and ignores priorities (Cilium's
//! behaviour: its API limiter is a FIFO bucket), kept for comparison.
//!
//! # Passes: one place for a run of calls
//!
//! A maintenance pass may make several calls on one budget (cluster-pool: block creates,
//! deletes and marks, then the IPAMNode apply, all API server writes). A [`Pass`] takes one
//! place in the queue for all of them: the place is ranked as above; once admitted, the
//! pass's first call uses the admission's token and each further call waits in the *pass
//! lane*, which the dispatcher serves before any caller still waiting for admission (in the
//! order the calls ask). So a pass never requeues behind others, holds no second place it
//! could wait behind, and still pays one token per call at the bucket's rate; passes are
//! admitted in the queue's order, each as a whole. A pass's wait for its place can be given
//! up and taken up again ([`Pass::admitted`] is cancel-safe): the place keeps its rank and
//! arrival time but is *parked* while nobody awaits it — never the dispatcher, so it stalls
//! nobody; a token it is handed meanwhile waits for its next await.
//!
//! Cost: priority waiters sit in an ordered index by rank key, so an admission is O(log n)
//! in either mode. A [`PriorityCell`] knows the priority-mode queues it waits in and tells them
//! of each change; the next admission re-ranks just those waiters. (Before, each admission
//! scanned the waiters, O(n): draining 10,000 waiters that queued at one instant took 161 ms
//! against FIFO's 10.3 ms, and simulate spent 70% of its time there at 80,000 nodes.)
//! Measured: `benches/budget.rs` (BENCHMARKS.md, "Budget admission").
//!
//! Cancel safety: dropping an `acquire` future removes it from the queue. A dropped (or
//! parked) dispatcher appoints a successor, the oldest waiter someone awaits; a waiter (or an
//! admitted [`Pass`]) dropped after it was handed a token passes that token on to the best
//! remaining waiter (if nobody is left waiting the token is simply not used).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::ops::Add;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use governor::clock::{Clock, Reference};
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use parking_lot::Mutex;
use tokio::time::{Instant, Sleep};

use crate::IpamError;

/// Boost of any node with at least one pod waiting for an address.
pub const POD_CLASS_BOOST: Duration = Duration::from_secs(30);
/// Boost per waiting pod, up to [`MAX_COUNTED_PODS`] pods.
pub const PER_WAITING_POD: Duration = Duration::from_millis(250);
/// Waiting pods beyond this count add no boost.
pub const MAX_COUNTED_PODS: u32 = 120;
/// Boost per needed address, up to [`MAX_COUNTED_NEEDED`] addresses.
pub const PER_NEEDED: Duration = Duration::from_millis(1);
/// Needed addresses beyond this count add no boost (249 × 1 ms < one waiting pod's 250 ms).
pub const MAX_COUNTED_NEEDED: u32 = 249;
/// The largest boost: a waiter that has waited this much longer than another always ranks first.
pub const MAX_BOOST: Duration = Duration::from_millis(
    POD_CLASS_BOOST.as_millis() as u64
        + MAX_COUNTED_PODS as u64 * PER_WAITING_POD.as_millis() as u64
        + MAX_COUNTED_NEEDED as u64 * PER_NEEDED.as_millis() as u64,
);

/// Smallest accepted qps (one call per 1000 s); below it governor's nanosecond arithmetic
/// could overflow with large bursts.
pub const MIN_QPS: f64 = 0.001;
/// Largest accepted burst.
pub const MAX_BURST: u32 = 1_000_000;

/// The API a budget guards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// Calls to an external IP source (a cloud API).
    Source,
    /// API server writes (including cluster-pool's block claims and releases).
    Kube,
}

impl Api {
    /// The `api` label value.
    pub fn as_str(self) -> &'static str {
        tidepool_metrics::Api::from(self).as_str()
    }

    fn qps_flag(self) -> &'static str {
        match self {
            Api::Source => "api-qps",
            Api::Kube => "kube-api-qps",
        }
    }

    fn burst_flag(self) -> &'static str {
        match self {
            Api::Source => "api-burst",
            Api::Kube => "kube-api-burst",
        }
    }
}

/// The metrics' `api` label.
impl From<Api> for tidepool_metrics::Api {
    fn from(api: Api) -> Self {
        match api {
            Api::Source => tidepool_metrics::Api::Source,
            Api::Kube => tidepool_metrics::Api::Kube,
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How waiting callers are ordered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedulingMode {
    /// Highest effective score first (see the module docs for the aging rule).
    #[default]
    Priority,
    /// Arrival order; priorities ignored (Cilium's behaviour).
    Fifo,
}

/// A node's urgency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Priority {
    /// Pods scheduled to the node that still wait for an address.
    pub waiting_pods: u32,
    /// Addresses the node needs (the watermark deficit).
    pub needed: u32,
}

impl Priority {
    fn pack(self) -> u64 {
        (u64::from(self.waiting_pods) << 32) | u64::from(self.needed)
    }

    fn unpack(v: u64) -> Self {
        Priority {
            waiting_pods: (v >> 32) as u32,
            needed: v as u32,
        }
    }

    /// The head start this priority gives, in nanoseconds of waiting time (module docs).
    pub fn boost(self) -> Duration {
        Duration::from_nanos(self.boost_nanos())
    }

    fn boost_nanos(self) -> u64 {
        const CLASS: u64 = POD_CLASS_BOOST.as_nanos() as u64;
        const POD: u64 = PER_WAITING_POD.as_nanos() as u64;
        const NEED: u64 = PER_NEEDED.as_nanos() as u64;
        let pods = u64::from(self.waiting_pods.min(MAX_COUNTED_PODS));
        let needed = u64::from(self.needed.min(MAX_COUNTED_NEEDED));
        let class = if self.waiting_pods > 0 { CLASS } else { 0 };
        let boost = class + pods * POD + needed * NEED;
        // The starvation bound of the module docs rests on this cap.
        debug_assert!(boost <= MAX_BOOST.as_nanos() as u64);
        boost
    }
}

/// A node's live priority; the maintainer updates it, the budget reads it at each admission.
///
/// A priority-mode budget ranks its waiters in an ordered index, so it must hear of every
/// change while the cell waits in it: the cell keeps the budgets' re-rank lists it is queued
/// in and, on a change, appends its place to each.
#[derive(Clone, Default)]
pub struct PriorityCell(Arc<CellInner>);

#[derive(Default)]
struct CellInner {
    packed: AtomicU64,
    /// (re-rank list, place) of every priority-mode queue the cell waits in. Lock order:
    /// a budget's queue, then this, then a re-rank list.
    waiting_in: Mutex<Vec<(Rerank, u64)>>,
}

/// Places whose priority changed since the queue last ranked them.
type Rerank = Arc<Mutex<Vec<u64>>>;

impl PriorityCell {
    /// A cell holding `prio`.
    pub fn new(prio: Priority) -> Self {
        let cell = PriorityCell::default();
        cell.0.packed.store(prio.pack(), Ordering::Relaxed);
        cell
    }

    /// Publishes the node's current priority.
    pub fn set(&self, prio: Priority) {
        // Under the lock, so a queue that registers the cell reads either the old value and
        // is told of the change, or the new one.
        let waiting_in = self.0.waiting_in.lock();
        if self.0.packed.swap(prio.pack(), Ordering::Relaxed) != prio.pack() {
            for (rerank, seq) in waiting_in.iter() {
                rerank.lock().push(*seq);
            }
        }
    }

    /// The last published priority.
    pub fn get(&self) -> Priority {
        Priority::unpack(self.0.packed.load(Ordering::Relaxed))
    }

    /// Registers place `seq` of a queue; returns the priority to rank it by now.
    fn join(&self, rerank: &Rerank, seq: u64) -> Priority {
        let mut waiting_in = self.0.waiting_in.lock();
        waiting_in.push((rerank.clone(), seq));
        self.get()
    }

    fn leave(&self, rerank: &Rerank, seq: u64) {
        self.0
            .waiting_in
            .lock()
            .retain(|(r, s)| !(*s == seq && Arc::ptr_eq(r, rerank)));
    }
}

impl fmt::Debug for PriorityCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PriorityCell").field(&self.get()).finish()
    }
}

/// A `tokio::time::Instant` as a governor clock reading, so the bucket runs on virtual time
/// when tokio's clock is paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TokioInstant(pub Instant);

impl Add<Nanos> for TokioInstant {
    type Output = TokioInstant;

    fn add(self, other: Nanos) -> TokioInstant {
        TokioInstant(self.0 + Duration::from(other))
    }
}

impl Reference for TokioInstant {
    fn duration_since(&self, earlier: Self) -> Nanos {
        self.0.saturating_duration_since(earlier.0).into()
    }

    fn saturating_sub(&self, duration: Nanos) -> Self {
        TokioInstant(self.0.checked_sub(duration.into()).unwrap_or(self.0))
    }
}

/// governor clock reading [`tokio::time::Instant::now`].
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioGovernorClock;

impl Clock for TokioGovernorClock {
    type Instant = TokioInstant;

    fn now(&self) -> TokioInstant {
        TokioInstant(Instant::now())
    }
}

type Limiter =
    RateLimiter<NotKeyed, InMemoryState, TokioGovernorClock, NoOpMiddleware<TokioInstant>>;

/// A per-API call budget. Cheap to clone (an `Arc` inside); `Send + Sync`.
#[derive(Clone)]
pub struct Budget(Arc<Inner>);

struct Inner {
    api: Api,
    mode: SchedulingMode,
    /// `None`: unlimited.
    limiter: Option<Limiter>,
    /// Origin of the waiters' enqueue offsets.
    epoch: Instant,
    queue: Mutex<Queue>,
}

/// Where a queued caller waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    /// Callers waiting for admission ([`Budget::acquire`], a [`Pass`]'s place), ranked by the
    /// scheduling mode.
    Admission,
    /// Further calls of an admitted [`Pass`]: served before every caller still waiting for
    /// admission, in the order they ask.
    Pass,
}

struct Waiter {
    prio: PriorityCell,
    /// Nanoseconds from `Inner::epoch` to the arrival.
    enqueued: u64,
    /// `None` while the place is parked (kept, but nobody awaits it).
    waker: Option<Waker>,
    /// Priority mode, admission lane: the rank key the waiter is indexed under.
    key: i64,
    lane: Lane,
}

/// Rank key = boost − arrival (ns) = score − now; the largest wins, and it does not change
/// while the priority stays the same.
fn rank_key(prio: Priority, enqueued: u64) -> i64 {
    prio.boost_nanos() as i64 - enqueued as i64
}

struct Queue {
    mode: SchedulingMode,
    next_seq: u64,
    /// Waiters not yet admitted, by arrival sequence. Admission removes the entry.
    waiters: BTreeMap<u64, Waiter>,
    /// Priority mode: the admission lane's waiters best first, as (−key, seq): ties go to
    /// the earlier arrival.
    ranks: BTreeSet<(i64, u64)>,
    /// The pass lane's waiters, in arrival order: they go before every admission waiter.
    passes: BTreeSet<u64>,
    /// Waiters someone awaits (not parked): the dispatcher is the oldest of them.
    active: BTreeSet<u64>,
    /// Priority mode: places whose cells changed since they were ranked (see [`PriorityCell`]).
    rerank: Rerank,
    /// The waiter that sleeps on the next token; `Some` iff `active` is non-empty. A parked
    /// place is never the dispatcher: nobody polls it, so nobody would wake at the token.
    dispatcher: Option<u64>,
}

impl Queue {
    fn new(mode: SchedulingMode) -> Queue {
        Queue {
            mode,
            next_seq: 0,
            waiters: BTreeMap::new(),
            ranks: BTreeSet::new(),
            passes: BTreeSet::new(),
            active: BTreeSet::new(),
            rerank: Rerank::default(),
            dispatcher: None,
        }
    }

    /// Queues a new admission waiter and returns its place.
    #[cfg(test)]
    fn enqueue(&mut self, prio: &PriorityCell, enqueued: u64, waker: Waker) -> u64 {
        self.enqueue_in(Lane::Admission, prio, enqueued, waker)
    }

    /// Queues a new waiter in `lane` and returns its place.
    fn enqueue_in(&mut self, lane: Lane, prio: &PriorityCell, enqueued: u64, waker: Waker) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut key = 0;
        match lane {
            Lane::Admission if self.mode == SchedulingMode::Priority => {
                key = rank_key(prio.join(&self.rerank, seq), enqueued);
                self.ranks.insert((-key, seq));
            }
            Lane::Admission => {}
            Lane::Pass => {
                self.passes.insert(seq);
            }
        }
        let waiter = Waiter {
            prio: prio.clone(),
            enqueued,
            waker: Some(waker),
            key,
            lane,
        };
        self.waiters.insert(seq, waiter);
        self.active.insert(seq);
        self.dispatcher.get_or_insert(seq);
        seq
    }

    /// Takes `seq` out of the queue (not the dispatcher role: see [`Queue::after_removal`]).
    fn remove(&mut self, seq: u64) -> Option<Waiter> {
        let w = self.waiters.remove(&seq)?;
        self.active.remove(&seq);
        match w.lane {
            Lane::Admission if self.mode == SchedulingMode::Priority => {
                self.ranks.remove(&(-w.key, seq));
                w.prio.leave(&self.rerank, seq);
            }
            Lane::Admission => {}
            Lane::Pass => {
                self.passes.remove(&seq);
            }
        }
        Some(w)
    }

    /// The waiter to admit now: O(log n) plus the priority changes since the last pick.
    fn best(&mut self) -> Option<u64> {
        if let Some(&seq) = self.passes.first() {
            return Some(seq);
        }
        match self.mode {
            // no pass-lane waiter: the first waiter is the earliest admission waiter
            SchedulingMode::Fifo => self.waiters.keys().next().copied(),
            SchedulingMode::Priority => {
                self.apply_reranks();
                self.ranks.first().map(|&(_, seq)| seq)
            }
        }
    }

    fn apply_reranks(&mut self) {
        let changed = std::mem::take(&mut *self.rerank.lock());
        for seq in changed {
            // A place admitted or dropped since its change is gone.
            let Some(w) = self.waiters.get_mut(&seq) else {
                continue;
            };
            let key = rank_key(w.prio.get(), w.enqueued);
            if key != w.key {
                self.ranks.remove(&(-w.key, seq));
                self.ranks.insert((-key, seq));
                w.key = key;
            }
        }
    }

    /// Admits `seq` (removes it from the queue) and pushes the wakers to call once the lock is
    /// released: the admitted waiter's (unless it is parked: its owner finds the token when it
    /// awaits the place again) and, if it was the dispatcher, its successor's.
    fn admit(&mut self, seq: u64, wake: &mut Vec<Waker>) {
        if let Some(w) = self.remove(seq)
            && let Some(waker) = w.waker
        {
            wake.push(waker);
        }
        self.after_removal(seq, wake);
    }

    /// Keeps the dispatcher invariant after `seq` left the queue or was parked.
    fn after_removal(&mut self, seq: u64, wake: &mut Vec<Waker>) {
        if self.dispatcher == Some(seq) {
            self.dispatcher = self.active.first().copied();
            if let Some(next) = self.dispatcher
                && let Some(waker) = &self.waiters[&next].waker
            {
                wake.push(waker.clone());
            }
        }
    }

    /// A token handed to a waiter that will not use it goes to the best waiter left (if
    /// nobody is left waiting the token is simply not used).
    fn hand_on(&mut self, wake: &mut Vec<Waker>) {
        if let Some(next) = self.best() {
            self.admit(next, wake);
        }
    }

    /// Nobody awaits `seq` for now: it keeps its place and rank, and may be admitted
    /// meanwhile, but gives up the dispatcher role.
    fn park(&mut self, seq: u64, wake: &mut Vec<Waker>) {
        let Some(w) = self.waiters.get_mut(&seq) else {
            return;
        };
        w.waker = None;
        self.active.remove(&seq);
        self.after_removal(seq, wake);
    }

    /// `seq` is awaited (again) with `waker`. False when it is no longer queued: it was
    /// admitted.
    fn awaited(&mut self, seq: u64, waker: &Waker) -> bool {
        let Some(w) = self.waiters.get_mut(&seq) else {
            return false;
        };
        match &mut w.waker {
            Some(old) => old.clone_from(waker),
            None => {
                w.waker = Some(waker.clone());
                self.active.insert(seq);
                self.dispatcher.get_or_insert(seq);
            }
        }
        true
    }
}

impl Budget {
    /// A budget of `qps` calls per second with bursts of up to `burst` calls.
    ///
    /// Rejects (naming the flag: `api-qps`/`kube-api-qps`, `api-burst`/`kube-api-burst`) a qps
    /// that is not finite or below [`MIN_QPS`], and a burst of 0 or above [`MAX_BURST`].
    pub fn new(api: Api, qps: f64, burst: u32, mode: SchedulingMode) -> Result<Budget, IpamError> {
        if !qps.is_finite() || qps < MIN_QPS {
            return Err(IpamError::InvalidSetting {
                name: api.qps_flag(),
                value: qps.to_string(),
                reason: format!("must be a finite number of calls per second, at least {MIN_QPS}"),
            });
        }
        let burst = match std::num::NonZeroU32::new(burst) {
            Some(b) if b.get() <= MAX_BURST => b,
            _ => {
                return Err(IpamError::InvalidSetting {
                    name: api.burst_flag(),
                    value: burst.to_string(),
                    reason: format!("must be between 1 and {MAX_BURST}"),
                });
            }
        };
        // qps ≥ MIN_QPS keeps the period ≤ 1000 s; governor clamps a sub-nanosecond period.
        let period = Duration::from_secs_f64(1.0 / qps).max(Duration::from_nanos(1));
        let quota = Quota::with_period(period)
            .expect("period is at least 1 ns")
            .allow_burst(burst);
        Ok(Budget::build(
            api,
            mode,
            Some(RateLimiter::direct_with_clock(quota, TokioGovernorClock)),
        ))
    }

    /// A budget that admits every call at once (still records the wait histogram).
    pub fn unlimited(api: Api) -> Budget {
        Budget::build(api, SchedulingMode::Fifo, None)
    }

    fn build(api: Api, mode: SchedulingMode, limiter: Option<Limiter>) -> Budget {
        Budget(Arc::new(Inner {
            api,
            mode,
            limiter,
            epoch: Instant::now(),
            queue: Mutex::new(Queue::new(mode)),
        }))
    }

    /// Takes a token only if one is free now and nobody is waiting (it never queues).
    pub fn try_acquire(&self) -> bool {
        let ok = match &self.0.limiter {
            None => true,
            Some(limiter) => {
                let q = self.0.queue.lock();
                q.waiters.is_empty() && limiter.check().is_ok()
            }
        };
        if ok {
            self.record(Duration::ZERO);
        }
        ok
    }

    /// [`Budget::acquire`] as a future that owns what it needs, so a caller can keep its
    /// place in the queue across awaits of its own (dropping it leaves the queue).
    pub fn acquire_owned(&self, prio: PriorityCell) -> impl Future<Output = ()> + Send + 'static {
        let budget = self.clone();
        async move { budget.acquire(&prio).await }
    }

    /// Waits for one call's token. `prio` is read at each admission decision while waiting.
    ///
    /// Cancel-safe: a dropped future leaves the queue without losing a token for others.
    pub async fn acquire(&self, prio: &PriorityCell) {
        self.acquire_in(Lane::Admission, prio).await;
    }

    async fn acquire_in(&self, lane: Lane, prio: &PriorityCell) {
        let start = Instant::now();
        if self.0.limiter.is_some() {
            let mut wait = Wait {
                inner: &self.0,
                prio,
                lane,
                at: Place::default(),
            };
            std::future::poll_fn(|cx| wait.poll(cx)).await;
        }
        self.record(Instant::now().saturating_duration_since(start));
    }

    /// A [`Pass`] on this budget for a caller of priority `prio`: one place in the queue for
    /// a run of calls. It joins the queue when first awaited.
    pub fn pass(&self, prio: PriorityCell) -> Pass {
        Pass {
            budget: self.clone(),
            prio,
            state: PassState::Queued(Place::default()),
            asked: None,
        }
    }

    /// Records one admitted [`Budget::acquire`]'s wait.
    fn record(&self, wait: Duration) {
        tidepool_metrics::record::api_wait(self.0.api.into(), wait);
    }

    /// How many callers are queued and not yet admitted (parked places included).
    pub fn waiting(&self) -> usize {
        self.0.queue.lock().waiters.len()
    }

    /// The API this budget guards.
    pub fn api(&self) -> Api {
        self.0.api
    }

    /// The scheduling mode.
    pub fn mode(&self) -> SchedulingMode {
        self.0.mode
    }
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("api", &self.0.api)
            .field("mode", &self.0.mode)
            .field("limited", &self.0.limiter.is_some())
            .field("waiting", &self.waiting())
            .finish()
    }
}

/// A caller's place in a queue between polls.
#[derive(Default)]
struct Place {
    /// Queue position, while queued (`None` before the first poll and once admitted).
    seq: Option<u64>,
    /// The dispatcher's timer (kept across polls).
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Inner {
    /// Polls `at`'s admission (joining the queue on the first poll). Ready once admitted,
    /// with `at.seq` cleared.
    fn poll_place(
        &self,
        at: &mut Place,
        lane: Lane,
        prio: &PriorityCell,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let Some(limiter) = self.limiter.as_ref() else {
            return Poll::Ready(());
        };
        loop {
            let mut wake = Vec::new();
            let deadline = {
                let mut q = self.queue.lock();
                let seq = match at.seq {
                    None => {
                        // a free token goes at once to a caller nobody ranks before
                        let ahead = match lane {
                            Lane::Admission => !q.waiters.is_empty(),
                            Lane::Pass => !q.passes.is_empty(),
                        };
                        if !ahead && limiter.check().is_ok() {
                            return Poll::Ready(());
                        }
                        // Read under the lock, so arrival times never decrease with `seq`.
                        let enqueued = Instant::now()
                            .saturating_duration_since(self.epoch)
                            .as_nanos() as u64;
                        let seq = q.enqueue_in(lane, prio, enqueued, cx.waker().clone());
                        at.seq = Some(seq);
                        seq
                    }
                    Some(seq) => {
                        if !q.awaited(seq, cx.waker()) {
                            // Gone from the queue: we were admitted.
                            at.seq = None;
                            return Poll::Ready(());
                        }
                        seq
                    }
                };
                if q.dispatcher != Some(seq) {
                    return Poll::Pending;
                }
                // We are the dispatcher: hand out every token available now.
                loop {
                    match limiter.check() {
                        Ok(()) => {
                            let best = q.best().expect("dispatcher is queued");
                            if best == seq {
                                // Admit ourselves: no wake-up for us, one for our successor.
                                q.remove(seq);
                                q.after_removal(seq, &mut wake);
                                at.seq = None;
                                drop(q);
                                wake.into_iter().for_each(Waker::wake);
                                return Poll::Ready(());
                            }
                            q.admit(best, &mut wake);
                        }
                        Err(not_until) => break not_until.earliest_possible().0,
                    }
                }
            };
            wake.into_iter().for_each(Waker::wake);
            let sleep = at
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if sleep.deadline() != deadline || sleep.is_elapsed() {
                sleep.as_mut().reset(deadline);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }

    /// Gives `at` up: it leaves the queue, passing the dispatcher role on if it held it; a
    /// token it was handed but never used goes to the best waiter left.
    fn leave(&self, at: &mut Place) {
        let Some(seq) = at.seq.take() else { return };
        let mut wake = Vec::new();
        {
            let mut q = self.queue.lock();
            if q.remove(seq).is_some() {
                q.after_removal(seq, &mut wake);
            } else {
                q.hand_on(&mut wake);
            }
        }
        wake.into_iter().for_each(Waker::wake);
    }

    /// Nobody awaits `at` for now (see [`Queue::park`]).
    fn park(&self, at: &Place) {
        let Some(seq) = at.seq else { return };
        let mut wake = Vec::new();
        self.queue.lock().park(seq, &mut wake);
        wake.into_iter().for_each(Waker::wake);
    }

    /// An admitted caller did not use its token: it goes to the best waiter.
    fn hand_on(&self) {
        if self.limiter.is_none() {
            return;
        }
        let mut wake = Vec::new();
        self.queue.lock().hand_on(&mut wake);
        wake.into_iter().for_each(Waker::wake);
    }
}

/// State of one `acquire` call; its `Drop` keeps the queue consistent on cancellation.
struct Wait<'a> {
    inner: &'a Inner,
    prio: &'a PriorityCell,
    lane: Lane,
    at: Place,
}

impl Wait<'_> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.inner
            .poll_place(&mut self.at, self.lane, self.prio, cx)
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        self.inner.leave(&mut self.at);
    }
}

/// One place in a budget's queue for a run of calls (a maintenance pass's writes), from
/// [`Budget::pass`].
///
/// The place is ranked like any [`Budget::acquire`] (priority read at each admission, with
/// aging; or arrival order in FIFO mode). When it comes up, the pass is *admitted* with one
/// token, which its first [`Pass::call`] uses; each further call takes a token of its own in
/// the *pass lane*, served before every caller still waiting for admission, so an admitted
/// pass never queues behind others again, and never behind itself: it holds no other place.
/// N calls cost N tokens, at the bucket's rate, and the queue's order is the order in which
/// passes are admitted.
///
/// Waiting for the place can be given up and taken up again: dropping the
/// [`Pass::admitted`] future keeps the place (its rank and arrival time) but *parks* it —
/// while nobody awaits it, it is never the dispatcher, so it stalls nobody; if it ranks
/// first meanwhile it is handed the token, which the next await finds. Dropping the `Pass`
/// leaves the queue; a token it was handed and did not use goes to the best waiter left.
pub struct Pass {
    budget: Budget,
    prio: PriorityCell,
    state: PassState,
    /// When the place was first awaited (the wait histogram's start).
    asked: Option<Instant>,
}

enum PassState {
    /// Not admitted yet (queued once first awaited, possibly parked).
    Queued(Place),
    /// Admitted; the admission's token is not used yet.
    Admitted,
    /// Admitted and the admission's token used: further calls take the pass lane.
    Open,
}

impl Pass {
    /// Whether the place came up.
    pub fn is_admitted(&self) -> bool {
        !matches!(self.state, PassState::Queued(_))
    }

    /// Waits until the place comes up. Cancel-safe: dropping the future keeps the place,
    /// parked (see [`Pass`]).
    pub fn admitted(&mut self) -> Admitted<'_> {
        Admitted { pass: self }
    }

    /// One call's token: the admission's for the first call (waiting for the place first if
    /// need be, without interruption), a pass-lane token for each further one.
    pub async fn call(&mut self) {
        self.admitted().await;
        match self.state {
            PassState::Admitted => self.state = PassState::Open,
            PassState::Open => self.budget.acquire_in(Lane::Pass, &self.prio).await,
            PassState::Queued(_) => unreachable!("admitted above"),
        }
    }
}

impl fmt::Debug for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            PassState::Queued(_) => "queued",
            PassState::Admitted => "admitted",
            PassState::Open => "open",
        };
        f.debug_struct("Pass")
            .field("api", &self.budget.api())
            .field("state", &state)
            .finish()
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        match &mut self.state {
            PassState::Queued(at) => self.budget.0.leave(at),
            PassState::Admitted => self.budget.0.hand_on(),
            PassState::Open => {}
        }
    }
}

/// The future of [`Pass::admitted`]; dropping it before the place comes up parks the place.
pub struct Admitted<'a> {
    pass: &'a mut Pass,
}

impl Future for Admitted<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let pass = &mut *self.get_mut().pass;
        let Pass {
            budget,
            prio,
            state,
            asked,
        } = pass;
        let PassState::Queued(at) = state else {
            return Poll::Ready(());
        };
        let asked = *asked.get_or_insert_with(Instant::now);
        if budget
            .0
            .poll_place(at, Lane::Admission, prio, cx)
            .is_pending()
        {
            return Poll::Pending;
        }
        *state = PassState::Admitted;
        budget.record(Instant::now().saturating_duration_since(asked));
        Poll::Ready(())
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let PassState::Queued(at) = &self.pass.state {
            self.pass.budget.0.park(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    fn prio(waiting_pods: u32, needed: u32) -> PriorityCell {
        PriorityCell::new(Priority {
            waiting_pods,
            needed,
        })
    }

    /// Spawns `acquire` for `cell` and records `(id, admission time since t0)` into `log`.
    fn spawn_acquire(
        budget: &Budget,
        cell: PriorityCell,
        id: usize,
        t0: Instant,
        log: &Rc<RefCell<Vec<(usize, Duration)>>>,
    ) -> tokio::task::JoinHandle<()> {
        let budget = budget.clone();
        let log = log.clone();
        tokio::task::spawn_local(async move {
            budget.acquire(&cell).await;
            log.borrow_mut().push((id, t0.elapsed()));
        })
    }

    /// Lets spawned tasks run (and enqueue) without advancing virtual time.
    async fn settle() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    fn ids(log: &Rc<RefCell<Vec<(usize, Duration)>>>) -> Vec<usize> {
        log.borrow().iter().map(|(id, _)| *id).collect()
    }

    async fn local<F: Future>(f: F) -> F::Output {
        tokio::task::LocalSet::new().run_until(f).await
    }

    #[tokio::test(start_paused = true)]
    async fn rate_respected_burst_then_qps_spacing() {
        local(async {
            let budget = Budget::new(Api::Source, 2.0, 3, SchedulingMode::Priority).unwrap();
            let t0 = Instant::now();
            let log = Rc::default();
            let tasks: Vec<_> = (0..9)
                .map(|i| spawn_acquire(&budget, PriorityCell::default(), i, t0, &log))
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            let times: Vec<Duration> = log.borrow().iter().map(|(_, t)| *t).collect();
            let ms = |m| Duration::from_millis(m);
            // Burst of 3 at once, then one every 500 ms.
            assert_eq!(
                times,
                vec![
                    ms(0),
                    ms(0),
                    ms(0),
                    ms(500),
                    ms(1000),
                    ms(1500),
                    ms(2000),
                    ms(2500),
                    ms(3000)
                ]
            );
            // With equal priorities the order is arrival order.
            assert_eq!(ids(&log), (0..9).collect::<Vec<_>>());
            assert_eq!(budget.waiting(), 0);

            // After an idle period the bucket refills only up to the burst.
            tokio::time::sleep(Duration::from_secs(60)).await;
            let t1 = Instant::now();
            for _ in 0..5 {
                budget.acquire(&PriorityCell::default()).await;
            }
            assert_eq!(t1.elapsed(), ms(1000));
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn pods_waiting_admitted_before_earlier_idle_node() {
        local(async {
            let budget = Budget::new(Api::Kube, 1.0, 1, SchedulingMode::Priority).unwrap();
            budget.acquire(&PriorityCell::default()).await; // empty the bucket
            let t0 = Instant::now();
            let log = Rc::default();
            let idle = spawn_acquire(&budget, prio(0, 50), 0, t0, &log);
            settle().await;
            let busy = spawn_acquire(&budget, prio(5, 1), 1, t0, &log);
            settle().await;
            assert_eq!(budget.waiting(), 2);
            idle.await.unwrap();
            busy.await.unwrap();
            assert_eq!(
                *log.borrow(),
                vec![(1, Duration::from_secs(1)), (0, Duration::from_secs(2))]
            );
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn fifo_mode_admits_in_arrival_order() {
        local(async {
            let budget = Budget::new(Api::Source, 1.0, 1, SchedulingMode::Fifo).unwrap();
            budget.acquire(&PriorityCell::default()).await;
            let t0 = Instant::now();
            let log = Rc::default();
            // Later arrivals are ever more urgent; FIFO must ignore that.
            let cells = [prio(0, 0), prio(0, 50), prio(3, 10), prio(100, 200)];
            let mut tasks = Vec::new();
            for (i, c) in cells.into_iter().enumerate() {
                tasks.push(spawn_acquire(&budget, c, i, t0, &log));
                settle().await;
            }
            for t in tasks {
                t.await.unwrap();
            }
            assert_eq!(ids(&log), vec![0, 1, 2, 3]);
            assert_eq!(log.borrow()[3].1, Duration::from_secs(4));
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn priority_mode_orders_pods_then_needed_then_arrival() {
        local(async {
            let budget = Budget::new(Api::Source, 1.0, 1, SchedulingMode::Priority).unwrap();
            budget.acquire(&PriorityCell::default()).await;
            let t0 = Instant::now();
            let log = Rc::default();
            // All enqueue at the same virtual instant, in this order.
            let cells = [
                prio(0, 0),
                prio(0, 7),
                prio(2, 1),
                prio(2, 9),
                prio(0, 7),
                prio(9, 0),
            ];
            let mut tasks = Vec::new();
            for (i, c) in cells.into_iter().enumerate() {
                tasks.push(spawn_acquire(&budget, c, i, t0, &log));
            }
            settle().await;
            assert_eq!(budget.waiting(), 6);
            for t in tasks {
                t.await.unwrap();
            }
            assert_eq!(ids(&log), vec![5, 3, 2, 1, 4, 0]);
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn small_deficit_not_starved_by_stream_of_large_deficits() {
        local(async {
            let budget = Budget::new(Api::Source, 1.0, 1, SchedulingMode::Priority).unwrap();
            budget.acquire(&PriorityCell::default()).await;
            let t0 = Instant::now();
            let log = Rc::default();
            let small = spawn_acquire(&budget, prio(0, 1), 0, t0, &log);
            settle().await;
            // Large deficits arrive twice as fast as the budget admits, for 300 s.
            let feeder = {
                let budget = budget.clone();
                let log = log.clone();
                tokio::task::spawn_local(async move {
                    let mut big = Vec::new();
                    for i in 1..=600 {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        big.push(spawn_acquire(&budget, prio(10, 100), i, t0, &log));
                    }
                    big
                })
            };
            small.await.unwrap();
            let waited = log.borrow().iter().find(|(id, _)| *id == 0).unwrap().1;
            // The small node outranks every large node that arrived more than
            // boost(large) − boost(small) = 32.599 s after it, so exactly the 65 large nodes
            // that arrived at 0.5 s, 1 s, ..., 32.5 s go first (one per token), then it: at 66 s.
            // Without aging it would wait for all 600; without priority for none.
            let window = prio(10, 100).get().boost() - prio(0, 1).get().boost();
            assert_eq!(window, Duration::from_millis(32_599));
            let before = log.borrow().iter().filter(|(id, _)| *id != 0).count();
            assert_eq!(before, 65, "large deficits admitted before the small one");
            assert_eq!(waited, Duration::from_secs(66));
            for t in feeder.await.unwrap() {
                t.abort();
            }
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn priority_changed_while_waiting_is_honoured() {
        local(async {
            let budget = Budget::new(Api::Kube, 1.0, 1, SchedulingMode::Priority).unwrap();
            budget.acquire(&PriorityCell::default()).await;
            let t0 = Instant::now();
            let log = Rc::default();
            let a = prio(0, 1);
            let b = prio(4, 20);
            // b arrives first and ranks first at enqueue; before the next token the picture
            // flips, so a must go first (FIFO or a rank taken at enqueue would pick b).
            let tb = spawn_acquire(&budget, b.clone(), 1, t0, &log);
            settle().await;
            let ta = spawn_acquire(&budget, a.clone(), 0, t0, &log);
            settle().await;
            a.set(Priority {
                waiting_pods: 6,
                needed: 6,
            });
            b.set(Priority {
                waiting_pods: 0,
                needed: 0,
            });
            ta.await.unwrap();
            tb.await.unwrap();
            assert_eq!(ids(&log), vec![0, 1]);
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_dispatcher_does_not_stall_others() {
        local(async {
            let budget = Budget::new(Api::Source, 1.0, 1, SchedulingMode::Priority).unwrap();
            budget.acquire(&PriorityCell::default()).await;
            let t0 = Instant::now();
            let log = Rc::default();
            // The first waiter becomes the dispatcher; cancel it by timeout.
            let b1 = budget.clone();
            let first = tokio::task::spawn_local(async move {
                tokio::time::timeout(Duration::from_millis(300), b1.acquire(&prio(9, 9))).await
            });
            settle().await;
            let second = spawn_acquire(&budget, prio(0, 1), 1, t0, &log);
            settle().await;
            assert_eq!(budget.waiting(), 2);
            assert!(first.await.unwrap().is_err(), "first must time out");
            assert_eq!(budget.waiting(), 1);
            tokio::time::timeout(Duration::from_secs(10), second)
                .await
                .expect("second stalled")
                .unwrap();
            assert_eq!(*log.borrow(), vec![(1, Duration::from_secs(1))]);
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn admitted_but_dropped_waiter_passes_its_token_on() {
        let budget = Budget::new(Api::Source, 1.0, 1, SchedulingMode::Priority).unwrap();
        budget.acquire(&PriorityCell::default()).await;
        let t0 = Instant::now();
        let (low, high) = (prio(0, 1), prio(5, 5));
        let mut dispatcher = Box::pin(budget.acquire(&low));
        let mut urgent = Box::pin(budget.acquire(&high));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(dispatcher.as_mut().poll(&mut cx).is_pending());
        assert!(urgent.as_mut().poll(&mut cx).is_pending());
        tokio::time::advance(Duration::from_secs(1)).await;
        // The dispatcher takes the token and hands it to the urgent waiter...
        assert!(dispatcher.as_mut().poll(&mut cx).is_pending());
        assert_eq!(budget.waiting(), 1);
        // ...which is dropped before it runs: the token must go to the dispatcher now.
        drop(urgent);
        assert_eq!(budget.waiting(), 0);
        assert!(dispatcher.as_mut().poll(&mut cx).is_ready());
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
        // And the bucket still spaces the next call by the period.
        budget.acquire(&low).await;
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
    }

    #[derive(Default)]
    struct CountingWaker(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_admitted_waiter_is_woken() {
        let budget = Budget::new(Api::Kube, 1.0, 1, SchedulingMode::Priority).unwrap();
        budget.acquire(&PriorityCell::default()).await;
        let cells: Vec<_> = (0..50).map(|i| prio(0, i)).collect();
        let counts: Vec<Arc<CountingWaker>> = (0..50).map(|_| Arc::default()).collect();
        let mut futs: Vec<_> = cells.iter().map(|c| Box::pin(budget.acquire(c))).collect();
        fn poll_with<F: Future>(f: &mut Pin<Box<F>>, w: &Arc<CountingWaker>) -> Poll<F::Output> {
            f.as_mut()
                .poll(&mut Context::from_waker(&Waker::from(w.clone())))
        }
        let poll = |f: &mut Pin<Box<_>>, i: usize| poll_with(f, &counts[i]);
        for (i, f) in futs.iter_mut().enumerate() {
            assert!(poll(f, i).is_pending());
        }
        // Waiter 0 is the dispatcher; waiter 49 (largest needed) must get the token, and
        // nobody else may be woken.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(poll(&mut futs[0], 0).is_pending());
        let woken: Vec<usize> = (1..50)
            .filter(|&i| counts[i].0.load(Ordering::SeqCst) > 0)
            .collect();
        assert_eq!(woken, vec![49]);
        assert!(poll(&mut futs[49], 49).is_ready());
        assert_eq!(budget.waiting(), 49);
    }

    #[tokio::test(start_paused = true)]
    async fn many_dropped_waiters_leave_a_consistent_queue() {
        local(async {
            let budget = Budget::new(Api::Kube, 10.0, 1, SchedulingMode::Priority).unwrap();
            let t0 = Instant::now();
            let log = Rc::default();
            let mut tasks = Vec::new();
            for i in 0..40 {
                tasks.push(spawn_acquire(
                    &budget,
                    prio(i as u32 % 3, i as u32),
                    i,
                    t0,
                    &log,
                ));
            }
            settle().await;
            // Task 0 took the free token; task 1 is the dispatcher. Cancel every odd task.
            assert_eq!(budget.waiting(), 39);
            for t in tasks.iter().skip(1).step_by(2) {
                t.abort();
            }
            settle().await;
            assert_eq!(budget.waiting(), 19);
            let survivors: Vec<_> = tasks.into_iter().step_by(2).collect();
            for t in survivors {
                tokio::time::timeout(Duration::from_secs(60), t)
                    .await
                    .expect("survivor stalled")
                    .unwrap();
            }
            assert_eq!(budget.waiting(), 0);
            // No token lost to the cancelled: one survivor per 100 ms.
            let mut times: Vec<_> = log.borrow().iter().map(|(_, t)| *t).collect();
            times.sort();
            let expected: Vec<_> = (0..20).map(|i| Duration::from_millis(100 * i)).collect();
            assert_eq!(times, expected);
        })
        .await;
    }

    #[test]
    fn bad_settings_are_rejected_naming_the_flag() {
        let name = |r: Result<Budget, IpamError>| match r.unwrap_err() {
            IpamError::InvalidSetting { name, .. } => name,
            e => panic!("unexpected {e:?}"),
        };
        let mode = SchedulingMode::Priority;
        for qps in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e-9] {
            assert_eq!(name(Budget::new(Api::Source, qps, 5, mode)), "api-qps");
            assert_eq!(name(Budget::new(Api::Kube, qps, 5, mode)), "kube-api-qps");
        }
        for burst in [0, MAX_BURST + 1] {
            assert_eq!(
                name(Budget::new(Api::Source, 5.0, burst, mode)),
                "api-burst"
            );
            assert_eq!(
                name(Budget::new(Api::Kube, 5.0, burst, mode)),
                "kube-api-burst"
            );
        }
        assert!(Budget::new(Api::Kube, 1e12, MAX_BURST, mode).is_ok());
        assert!(Budget::new(Api::Kube, MIN_QPS, 1, SchedulingMode::Fifo).is_ok());
        assert_eq!(Api::Source.as_str(), "source");
        assert_eq!(Api::Kube.as_str(), "kube");
    }

    #[tokio::test(start_paused = true)]
    async fn unlimited_never_waits_and_wait_is_recorded() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _guard = metrics::set_default_local_recorder(&recorder);

        let unlimited = Budget::unlimited(Api::Kube);
        let t0 = Instant::now();
        for _ in 0..1000 {
            unlimited.acquire(&PriorityCell::default()).await;
        }
        assert_eq!(t0.elapsed(), Duration::ZERO);
        assert_eq!(unlimited.api(), Api::Kube);

        let limited = Budget::new(Api::Source, 4.0, 1, SchedulingMode::Fifo).unwrap();
        limited.acquire(&PriorityCell::default()).await;
        limited.acquire(&PriorityCell::default()).await;

        let mut seen = std::collections::HashMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            assert_eq!(key.key().name(), tidepool_metrics::API_WAIT_SECONDS);
            let api = key.key().labels().next().unwrap().value().to_owned();
            let DebugValue::Histogram(v) = value else {
                panic!("not a histogram")
            };
            seen.insert(
                api,
                v.into_iter().map(|x| x.into_inner()).collect::<Vec<_>>(),
            );
        }
        assert_eq!(seen["kube"].len(), 1000);
        assert!(seen["kube"].iter().all(|&s| s == 0.0));
        assert_eq!(seen["source"], vec![0.0, 0.25]);
    }

    #[tokio::test(start_paused = true)]
    async fn same_inputs_same_admission_order() {
        async fn run() -> Vec<usize> {
            local(async {
                let budget = Budget::new(Api::Source, 5.0, 2, SchedulingMode::Priority).unwrap();
                let t0 = Instant::now();
                let log = Rc::default();
                let mut tasks = Vec::new();
                for i in 0..50usize {
                    let cell = prio((i * 7 % 5) as u32, (i * 13 % 11) as u32);
                    tasks.push(spawn_acquire(&budget, cell, i, t0, &log));
                    if i % 4 == 0 {
                        tokio::time::sleep(Duration::from_millis(130)).await;
                    }
                }
                for t in tasks {
                    t.await.unwrap();
                }
                ids(&log)
            })
            .await
        }
        let first = run().await;
        assert_eq!(first.len(), 50);
        assert_eq!(first, run().await);
    }

    #[test]
    fn boost_is_lexicographic_within_caps() {
        let b = |p, n| {
            Priority {
                waiting_pods: p,
                needed: n,
            }
            .boost()
        };
        assert!(b(1, 0) > b(0, u32::MAX));
        assert!(b(2, 0) > b(1, u32::MAX));
        assert!(b(1, 2) > b(1, 1));
        assert_eq!(b(u32::MAX, u32::MAX), MAX_BOOST);
        assert_eq!(MAX_BOOST, Duration::from_millis(60_249));
        let cell = PriorityCell::default();
        let p = Priority {
            waiting_pods: u32::MAX,
            needed: 7,
        };
        cell.set(p);
        assert_eq!(cell.get(), p);
    }

    /// The rank index picks what a full scan of the live priorities picks, while waiters
    /// arrive over several aging windows, change priority while queued (some to the same
    /// value), share cells, and are admitted or dropped.
    #[test]
    fn best_matches_exhaustive_reference() {
        use rand::{Rng, SeedableRng};
        fn random_prio(rng: &mut rand::rngs::SmallRng) -> Priority {
            Priority {
                waiting_pods: if rng.random_bool(0.3) {
                    rng.random_range(1..200)
                } else {
                    0
                },
                needed: rng.random_range(0..400),
            }
        }
        fn reference(q: &Queue) -> Option<u64> {
            q.waiters
                .iter()
                .map(|(&seq, w)| {
                    let score = i128::from(w.prio.get().boost_nanos()) - i128::from(w.enqueued);
                    (score, std::cmp::Reverse(seq))
                })
                .max()
                .map(|(_, std::cmp::Reverse(seq))| seq)
        }
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut picks = 0;
        for _ in 0..300 {
            let mut q = Queue::new(SchedulingMode::Priority);
            let mut cells: Vec<PriorityCell> = Vec::new();
            let mut t = 0u64;
            for _ in 0..rng.random_range(1..400) {
                match rng.random_range(0..10) {
                    0..4 => {
                        t += rng.random_range(0..5_000_000_000u64);
                        let cell = if !cells.is_empty() && rng.random_bool(0.1) {
                            cells[rng.random_range(0..cells.len())].clone()
                        } else {
                            PriorityCell::new(random_prio(&mut rng))
                        };
                        q.enqueue(&cell, t, Waker::noop().clone());
                        cells.push(cell);
                    }
                    4..7 if !cells.is_empty() => {
                        let cell = &cells[rng.random_range(0..cells.len())];
                        let p = if rng.random_bool(0.2) {
                            cell.get()
                        } else {
                            random_prio(&mut rng)
                        };
                        cell.set(p);
                    }
                    7 if !q.waiters.is_empty() => {
                        let seq = *q
                            .waiters
                            .keys()
                            .nth(rng.random_range(0..q.waiters.len()))
                            .unwrap();
                        q.remove(seq);
                    }
                    _ => {
                        let expected = reference(&q);
                        assert_eq!(q.best(), expected);
                        if let Some(seq) = expected {
                            q.admit(seq, &mut Vec::new());
                            picks += 1;
                        }
                    }
                }
            }
            while let Some(seq) = reference(&q) {
                assert_eq!(q.best(), Some(seq));
                q.admit(seq, &mut Vec::new());
            }
            assert_eq!(q.best(), None);
            assert!(q.ranks.is_empty());
            assert!(cells.iter().all(|c| c.0.waiting_in.lock().is_empty()));
        }
        assert!(picks > 1000, "only {picks} picks compared");
    }

    #[test]
    fn fifo_picks_the_earliest_arrival_whatever_the_priorities() {
        let mut q = Queue::new(SchedulingMode::Fifo);
        let low = prio(0, 0);
        let high = prio(100, 100);
        q.enqueue(&low, 5, Waker::noop().clone());
        q.enqueue(&high, 6, Waker::noop().clone());
        high.set(Priority {
            waiting_pods: 120,
            needed: 249,
        });
        assert_eq!(q.best(), Some(0));
        assert!(high.0.waiting_in.lock().is_empty(), "FIFO ranks nothing");
    }

    fn assert_send_sync<T: Send + Sync>(_: &T) {}

    #[test]
    fn budget_and_acquire_are_send() {
        let b = Budget::unlimited(Api::Source);
        assert_send_sync(&b);
        let cell = PriorityCell::default();
        let fut = b.acquire(&cell);
        fn is_send<T: Send>(_: &T) {}
        is_send(&fut);
        let mut pass = b.pass(PriorityCell::default());
        is_send(&pass.call());
        is_send(&pass);
    }

    /// Runs `calls` calls of one pass, logging `(id, admission time since t0)` for each.
    fn spawn_pass(
        budget: &Budget,
        cell: PriorityCell,
        id: usize,
        calls: usize,
        t0: Instant,
        log: &Rc<RefCell<Vec<(usize, Duration)>>>,
    ) -> tokio::task::JoinHandle<()> {
        let mut pass = budget.pass(cell);
        let log = log.clone();
        tokio::task::spawn_local(async move {
            for _ in 0..calls {
                pass.call().await;
                log.borrow_mut().push((id, t0.elapsed()));
            }
        })
    }

    /// A pass admitted first makes all of its calls before the passes queued behind it,
    /// even those that outrank it, one token each at the bucket's rate; the passes behind
    /// go in priority order (or arrival order in FIFO mode), each as a whole.
    #[tokio::test(start_paused = true)]
    async fn a_pass_takes_one_place_for_all_its_calls() {
        for (mode, behind) in [
            (SchedulingMode::Priority, [2, 2, 2, 1, 1]),
            (SchedulingMode::Fifo, [1, 1, 2, 2, 2]),
        ] {
            local(async {
                let budget = Budget::new(Api::Kube, 1.0, 1, mode).unwrap();
                let t0 = Instant::now();
                let log = Rc::default();
                // the low-priority pass gets the free token, then asks for two more calls
                // while an urgent pass (3 calls) and a quieter one (2 calls) queue
                let first = spawn_pass(&budget, prio(0, 1), 0, 3, t0, &log);
                settle().await;
                let quiet = spawn_pass(&budget, prio(0, 5), 1, 2, t0, &log);
                settle().await;
                let urgent = spawn_pass(&budget, prio(9, 9), 2, 3, t0, &log);
                for t in [first, quiet, urgent] {
                    tokio::time::timeout(Duration::from_secs(60), t)
                        .await
                        .expect("a pass stalled")
                        .unwrap();
                }
                let mut want = vec![(0, Duration::ZERO)];
                want.extend(
                    [0, 0]
                        .into_iter()
                        .chain(behind)
                        .enumerate()
                        .map(|(i, id)| (id, Duration::from_secs(i as u64 + 1))),
                );
                assert_eq!(*log.borrow(), want, "{mode:?}");
                assert_eq!(budget.waiting(), 0);
            })
            .await;
        }
    }

    /// A place whose wait was given up (its `admitted` future dropped) keeps its rank but is
    /// not the dispatcher: the waiter behind it is served on time, the parked place is
    /// handed the token it ranks first for, and finds it when it awaits again. (A kept
    /// `acquire` future that nobody polls stalls the queue instead: it stays the dispatcher.)
    #[tokio::test(start_paused = true)]
    async fn a_parked_place_stalls_nobody_and_keeps_its_rank() {
        local(async {
            let budget = Budget::new(Api::Kube, 1.0, 1, SchedulingMode::Priority).unwrap();
            budget.acquire(&PriorityCell::default()).await;
            let t0 = Instant::now();
            let log = Rc::default();
            let mut parked = budget.pass(prio(5, 5));
            // waits 100 ms (the oldest waiter: the dispatcher), then stops waiting
            let r = tokio::time::timeout(Duration::from_millis(100), parked.admitted()).await;
            assert!(r.is_err() && !parked.is_admitted());
            assert_eq!(budget.waiting(), 1);
            let behind = spawn_acquire(&budget, prio(0, 1), 1, t0, &log);
            let after = spawn_acquire(&budget, prio(0, 0), 2, t0, &log);
            settle().await;
            // the token at 1 s is the parked place's (it ranks first), the next two the
            // others', on time though nobody polls the parked place
            tokio::time::sleep(Duration::from_millis(3500)).await;
            assert_eq!(
                *log.borrow(),
                vec![(1, Duration::from_secs(2)), (2, Duration::from_secs(3))]
            );
            behind.await.unwrap();
            after.await.unwrap();
            // admitted while parked: no wait now, and the pass's calls go on at the rate
            let t = Instant::now();
            parked.call().await;
            assert_eq!(t.elapsed(), Duration::ZERO);
            parked.call().await;
            assert_eq!(t0.elapsed(), Duration::from_secs(4));
        })
        .await;
    }

    /// A place kept across waits that a pass then uses for several calls never waits
    /// behind itself, whichever it was (dispatcher, parked, admitted while parked), and
    /// callers queued behind it are served after its calls.
    #[tokio::test(start_paused = true)]
    async fn a_kept_place_never_waits_behind_itself() {
        local(async {
            let budget = Budget::new(Api::Kube, 10.0, 1, SchedulingMode::Priority).unwrap();
            budget.acquire(&PriorityCell::default()).await;
            let t0 = Instant::now();
            let log = Rc::default();
            let mut pass = budget.pass(prio(0, 3));
            // interrupted twice before its place comes up; others queue meanwhile
            for _ in 0..2 {
                let r = tokio::time::timeout(Duration::from_millis(30), pass.admitted()).await;
                assert!(r.is_err());
            }
            let others: Vec<_> = (0..4)
                .map(|i| spawn_acquire(&budget, prio(0, 1), i + 1, t0, &log))
                .collect();
            settle().await;
            for _ in 0..3 {
                tokio::time::timeout(Duration::from_secs(5), pass.call())
                    .await
                    .expect("the pass waited behind its own place");
                log.borrow_mut().push((0, t0.elapsed()));
            }
            for t in others {
                t.await.unwrap();
            }
            let ms = |m| Duration::from_millis(m);
            assert_eq!(
                *log.borrow(),
                vec![
                    (0, ms(100)),
                    (0, ms(200)),
                    (0, ms(300)),
                    (1, ms(400)),
                    (2, ms(500)),
                    (3, ms(600)),
                    (4, ms(700)),
                ]
            );
        })
        .await;
    }

    /// An admitted pass that makes no call hands its token to the best waiter at once;
    /// dropping a queued pass leaves the queue.
    #[tokio::test(start_paused = true)]
    async fn an_unused_admission_goes_to_the_next_waiter() {
        local(async {
            let budget = Budget::new(Api::Kube, 1.0, 1, SchedulingMode::Priority).unwrap();
            budget.acquire(&PriorityCell::default()).await;
            let t0 = Instant::now();
            let log = Rc::default();
            let mut pass = budget.pass(prio(5, 5));
            let mut gone = budget.pass(prio(9, 9));
            let _ = tokio::time::timeout(Duration::from_millis(10), gone.admitted()).await;
            let waiter = spawn_acquire(&budget, prio(0, 1), 1, t0, &log);
            settle().await;
            assert_eq!(budget.waiting(), 2);
            drop(gone);
            assert_eq!(budget.waiting(), 1);
            pass.admitted().await;
            assert_eq!(t0.elapsed(), Duration::from_secs(1));
            tokio::time::sleep(Duration::from_millis(500)).await;
            drop(pass);
            waiter.await.unwrap();
            assert_eq!(*log.borrow(), vec![(1, Duration::from_millis(1500))]);
            // the token it used was the 1 s one: the next is due at 2 s
            budget.acquire(&PriorityCell::default()).await;
            assert_eq!(t0.elapsed(), Duration::from_secs(2));
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_unlimited_pass_never_waits() {
        let budget = Budget::unlimited(Api::Kube);
        let mut pass = budget.pass(PriorityCell::default());
        let t0 = Instant::now();
        for _ in 0..5 {
            pass.call().await;
        }
        assert!(pass.is_admitted());
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }
}
