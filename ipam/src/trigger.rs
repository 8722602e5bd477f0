//! The debounced per-node trigger (DESIGN.md, "Trigger"; Cilium's `pkg/trigger`, research §3.1).
//!
//! A [`Trigger`] is a cheap cloneable handle; the one task that runs the work owns the
//! [`TriggerRx`] and loops `next()` → run → `finished()`. So runs are serialized by construction.
//! Semantics:
//!
//! - Any number of [`Trigger::trigger`] calls while a run is in progress, or while the receiver
//!   waits out `min_interval`, fold into exactly one next run; their reasons are kept (a bit set)
//!   and counted in [`Run::folds`]. The last trigger is never lost: a call that lands after
//!   `next()` took the pending state is pending again for the following run.
//! - `min_interval` is measured start to start; the first run has no delay.
//! - [`Trigger::trigger_at`] schedules a run at a deadline. Only the earliest pending deadline is
//!   kept (one slot, no heap per node); the reasons of a superseded deadline move to the kept
//!   one, so no reason is dropped, only advanced. The runner is expected to re-arm whatever it
//!   still needs after each run (a maintenance pass computes its next wake-up).
//! - A run caused by a plain trigger does **not** consume a deadline that lies in the future:
//!   the deadline still fires later (it was asked for a time, e.g. "the second reclaim
//!   observation `reclaim_grace` after the first", which an early pass does not satisfy). A
//!   deadline that has been reached by the time a run starts is folded into that run.
//! - No task or timer per trigger while idle: the receiver waits on a [`Notify`] and arms a timer
//!   only when it waits for `min_interval` or for a deadline. Deterministic: no randomness.
//! - [`TriggerRx::next`] returns `None` once every [`Trigger`] handle is dropped and nothing is
//!   pending; a pending trigger (or a deadline already reached) is still delivered first, a
//!   deadline still in the future is discarded (nobody is left to re-arm or cancel it).
//!
//! Reasons are informational (logs, metrics): the runner recomputes its state on every run and
//! must not infer timing from them.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use tidepool_metrics as m;
use tidepool_metrics::record;

/// Why a run was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Reason {
    /// The node (or its spec) was added or changed.
    Upsert,
    /// The periodic resync.
    Resync,
    /// A pod of the node changed (created, deleted, phase).
    PodEvent,
    /// A scheduled deadline (e.g. the second reclaim observation, a release delay).
    Deadline,
    /// A retry after backoff.
    Retry,
    /// This replica became the leader.
    Leadership,
    /// The pool freed addresses (wakes nodes parked on an exhausted source).
    PoolFreed,
    /// The node is being deleted.
    Delete,
    /// The families the source serves changed (a pool of a new family, or the last pool of
    /// one gone).
    FamiliesChanged,
    /// The node's pool became scarce, or its squeeze changed or ended.
    Scarcity,
}

impl Reason {
    /// Every reason, in bit order.
    pub const ALL: [Reason; 10] = [
        Reason::Upsert,
        Reason::Resync,
        Reason::PodEvent,
        Reason::Deadline,
        Reason::Retry,
        Reason::Leadership,
        Reason::PoolFreed,
        Reason::Delete,
        Reason::FamiliesChanged,
        Reason::Scarcity,
    ];

    /// A stable lower-case name, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Upsert => "upsert",
            Reason::Resync => "resync",
            Reason::PodEvent => "pod-event",
            Reason::Deadline => "deadline",
            Reason::Retry => "retry",
            Reason::Leadership => "leadership",
            Reason::PoolFreed => "pool-freed",
            Reason::Delete => "delete",
            Reason::FamiliesChanged => "families-changed",
            Reason::Scarcity => "scarcity",
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u8)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of [`Reason`]s.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reasons(u16);

impl Reasons {
    /// The empty set.
    pub const EMPTY: Reasons = Reasons(0);

    /// Whether `r` is in the set.
    pub fn contains(self, r: Reason) -> bool {
        self.0 & r.bit() != 0
    }

    /// Adds `r`.
    pub fn insert(&mut self, r: Reason) {
        self.0 |= r.bit();
    }

    /// The union of two sets.
    pub fn union(self, other: Reasons) -> Reasons {
        Reasons(self.0 | other.0)
    }

    #[cfg(test)]
    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    #[cfg(test)]
    /// Number of reasons in the set.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The reasons, in [`Reason::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Reason> {
        Reason::ALL.into_iter().filter(move |r| self.contains(*r))
    }
}

impl From<Reason> for Reasons {
    fn from(r: Reason) -> Self {
        Reasons(r.bit())
    }
}

impl FromIterator<Reason> for Reasons {
    fn from_iter<I: IntoIterator<Item = Reason>>(iter: I) -> Self {
        let mut s = Reasons::EMPTY;
        for r in iter {
            s.insert(r);
        }
        s
    }
}

impl fmt::Debug for Reasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(Reason::as_str))
            .finish()
    }
}

impl fmt::Display for Reasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(r.as_str())?;
        }
        Ok(())
    }
}

/// State shared by the handles and the receiver.
struct Shared {
    name: m::Trigger,
    state: Mutex<State>,
    notify: Notify,
    /// Live [`Trigger`] handles.
    handles: AtomicUsize,
}

#[derive(Default)]
struct State {
    /// A plain trigger is pending.
    pending: bool,
    /// Reasons of the pending plain triggers.
    reasons: Reasons,
    /// Trigger calls since the last run started.
    folds: u32,
    /// When the first pending plain trigger was queued.
    first_queued: Option<Instant>,
    /// The earliest pending deadline and its reasons.
    deadline: Option<Instant>,
    deadline_reasons: Reasons,
}

/// A cheap handle that asks for a run; `Clone`, `Send`, `Sync`.
pub struct Trigger {
    shared: Arc<Shared>,
}

/// The receiving side, owned by the one task that runs the work.
pub struct TriggerRx {
    shared: Arc<Shared>,
    min_interval: Duration,
    /// Start of the previous run.
    last_start: Option<Instant>,
    /// Loop iterations in `next()`, to show that an idle receiver does not wake.
    #[cfg(test)]
    wakeups: u64,
}

/// One run handed out by [`TriggerRx::next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Reasons of every trigger folded into this run.
    pub reasons: Reasons,
    /// Trigger calls (and reached deadlines) folded into this run; at least 1.
    pub folds: u32,
    /// From the first queued trigger (or the deadline) to the run's start.
    pub latency: Duration,
    /// When the run started.
    pub started: Instant,
}

/// A trigger named `name` (the metrics label `trigger`, e.g.
/// [`tidepool_metrics::Trigger::PoolMaintainer`]; one name per kind, not per node) whose runs
/// start at least `min_interval` apart.
pub fn trigger(name: m::Trigger, min_interval: Duration) -> (Trigger, TriggerRx) {
    let shared = Arc::new(Shared {
        name,
        state: Mutex::new(State::default()),
        notify: Notify::new(),
        handles: AtomicUsize::new(1),
    });
    (
        Trigger {
            shared: shared.clone(),
        },
        TriggerRx {
            shared,
            min_interval,
            last_start: None,
            #[cfg(test)]
            wakeups: 0,
        },
    )
}

impl Shared {
    fn trigger(&self, r: Reason) {
        let was_idle = {
            let mut st = self.state.lock();
            st.reasons.insert(r);
            st.folds = st.folds.saturating_add(1);
            st.first_queued.get_or_insert_with(Instant::now);
            !std::mem::replace(&mut st.pending, true)
        };
        record::trigger_queued(self.name);
        if was_idle {
            // A stored permit if the receiver is not waiting yet: no wake-up is lost.
            self.notify.notify_one();
        }
    }

    fn trigger_at(&self, deadline: Instant, r: Reason) {
        let wake = {
            let mut st = self.state.lock();
            st.deadline_reasons.insert(r);
            match st.deadline {
                Some(d) if d <= deadline => false,
                _ => {
                    st.deadline = Some(deadline);
                    // While a plain trigger is pending the receiver already has a wake-up.
                    !st.pending
                }
            }
        };
        if wake {
            self.notify.notify_one();
        }
    }
}

impl Trigger {
    /// Asks for a run as soon as `min_interval` allows.
    pub fn trigger(&self, r: Reason) {
        self.shared.trigger(r);
    }

    /// Asks for a run at `deadline` (at once if it has passed). Only the earliest pending
    /// deadline is kept; a plain trigger before it does not consume it.
    pub fn trigger_at(&self, deadline: Instant, r: Reason) {
        self.shared.trigger_at(deadline, r);
    }
}

impl Clone for Trigger {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        Trigger {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Trigger {
    fn drop(&mut self) {
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.notify.notify_one();
        }
    }
}

impl fmt::Debug for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trigger")
            .field("name", &self.shared.name.as_str())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for TriggerRx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TriggerRx")
            .field("name", &self.shared.name.as_str())
            .field("min_interval", &self.min_interval)
            .field("last_start", &self.last_start)
            .finish_non_exhaustive()
    }
}

impl TriggerRx {
    /// Waits until a run is due: a trigger is pending (or a deadline reached) and
    /// `min_interval` has passed since the last run's start. Returns `None` when every
    /// [`Trigger`] handle is dropped and nothing is pending. No timer is armed while idle
    /// without deadlines.
    pub async fn next(&mut self) -> Option<Run> {
        loop {
            #[cfg(test)]
            {
                self.wakeups += 1;
            }
            let now = Instant::now();
            let not_before = self.last_start.map(|s| s + self.min_interval);
            let wake_at = {
                let mut st = self.shared.state.lock();
                let deadline_due = st.deadline.is_some_and(|d| d <= now);
                if st.pending || deadline_due {
                    match not_before {
                        Some(t) if t > now => Some(t),
                        _ => {
                            let run = take_run(self.shared.name, &mut st, now);
                            self.last_start = Some(now);
                            return Some(run);
                        }
                    }
                } else if self.shared.handles.load(Ordering::Acquire) == 0 {
                    return None;
                } else {
                    st.deadline
                }
            };
            let notified = self.shared.notify.notified();
            match wake_at {
                None => notified.await,
                Some(t) => {
                    tokio::select! {
                        biased;
                        () = notified => {}
                        () = tokio::time::sleep_until(t) => {}
                    }
                }
            }
        }
    }

    /// Records duration, folds and latency metrics for a finished run.
    pub fn finished(&mut self, run: &Run) {
        let name = self.shared.name;
        let duration = Instant::now().saturating_duration_since(run.started);
        record::trigger_duration(name, duration);
        record::trigger_folds(name, run.folds);
        record::trigger_latency(name, run.latency);
    }

    #[cfg(test)]
    /// Schedules a run at `deadline` from the runner itself (e.g. a retry after backoff)
    /// without holding a [`Trigger`], which would keep `next()` from ever returning `None`.
    pub fn trigger_at(&self, deadline: Instant, r: Reason) {
        self.shared.trigger_at(deadline, r);
    }

    #[cfg(test)]
    /// The earliest pending deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.shared.state.lock().deadline
    }
}

/// Takes the pending state for a run starting `now`.
fn take_run(name: m::Trigger, st: &mut State, now: Instant) -> Run {
    let mut reasons = std::mem::take(&mut st.reasons);
    let mut folds = std::mem::take(&mut st.folds);
    let mut first = st.first_queued.take();
    st.pending = false;
    if let Some(d) = st.deadline.filter(|d| *d <= now) {
        st.deadline = None;
        reasons = reasons.union(std::mem::take(&mut st.deadline_reasons));
        folds = folds.saturating_add(1);
        first = Some(first.map_or(d, |f| f.min(d)));
        record::trigger_queued(name);
    }
    Run {
        reasons,
        folds,
        latency: first.map_or(Duration::ZERO, |f| now.saturating_duration_since(f)),
        started: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tokio::time::{sleep, timeout};

    const NAME: m::Trigger = m::Trigger::PoolMaintainer;
    const MS: Duration = Duration::from_millis(1);

    /// No run within an hour of virtual time.
    async fn assert_idle(rx: &mut TriggerRx) {
        let r = timeout(Duration::from_secs(3600), rx.next()).await;
        assert!(r.is_err(), "unexpected run: {r:?}");
    }

    async fn next(rx: &mut TriggerRx) -> Run {
        rx.next().await.expect("a run")
    }

    #[test]
    fn reasons_bit_set() {
        let mut s = Reasons::EMPTY;
        assert!(s.is_empty());
        s.insert(Reason::Delete);
        s.insert(Reason::Upsert);
        s.insert(Reason::Upsert);
        assert!(s.contains(Reason::Upsert) && s.contains(Reason::Delete));
        assert!(!s.contains(Reason::Retry));
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            [Reason::Upsert, Reason::Delete]
        );
        assert_eq!(s.to_string(), "upsert,delete");
        assert_eq!(format!("{s:?}"), r#"{"upsert", "delete"}"#);
        let all: Reasons = Reason::ALL.into_iter().collect();
        assert_eq!(all.len(), 10);
        let names: std::collections::BTreeSet<_> = all.iter().map(Reason::as_str).collect();
        assert_eq!(names.len(), 10, "names must be distinct");
        assert_eq!(Reason::PoolFreed.as_str(), "pool-freed");
        assert_eq!(
            Reasons::from(Reason::Retry)
                .union(Reason::Leadership.into())
                .len(),
            2
        );
    }

    #[test]
    fn handles_are_small_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Trigger>();
        send_sync::<TriggerRx>();
        assert_eq!(size_of::<Trigger>(), size_of::<usize>());
        // One Arc allocation per trigger: the shared state plus Arc's two counters.
        let heap = size_of::<Shared>() + 2 * size_of::<usize>();
        assert!(heap <= 160, "shared state grew to {heap} bytes");
        assert!(size_of::<TriggerRx>() <= 64, "{}", size_of::<TriggerRx>());
        eprintln!(
            "size_of Trigger {} TriggerRx {} Shared {} (heap per trigger {heap})",
            size_of::<Trigger>(),
            size_of::<TriggerRx>(),
            size_of::<Shared>()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn first_trigger_runs_at_once() {
        let (t, mut rx) = trigger(NAME, Duration::from_secs(1));
        let t0 = Instant::now();
        t.trigger(Reason::Upsert);
        let run = next(&mut rx).await;
        assert_eq!(run.started, t0);
        assert_eq!(run.reasons, Reason::Upsert.into());
        assert_eq!(run.folds, 1);
        assert_eq!(run.latency, Duration::ZERO);
        rx.finished(&run);
        assert_idle(&mut rx).await;
    }

    #[tokio::test(start_paused = true)]
    async fn triggers_before_a_run_fold_into_one() {
        let (t, mut rx) = trigger(NAME, 10 * MS);
        let t0 = Instant::now();
        t.trigger(Reason::Upsert);
        sleep(3 * MS).await;
        t.trigger(Reason::PodEvent);
        t.clone().trigger(Reason::PodEvent);
        let run = next(&mut rx).await;
        assert_eq!(run.folds, 3);
        assert_eq!(
            run.reasons,
            [Reason::Upsert, Reason::PodEvent].into_iter().collect()
        );
        assert_eq!(run.latency, 3 * MS, "latency counts from the first trigger");
        assert_eq!(run.started, t0 + 3 * MS);
        rx.finished(&run);
        assert_idle(&mut rx).await;
    }

    #[tokio::test(start_paused = true)]
    async fn triggers_during_a_run_yield_exactly_one_more_run() {
        let (t, mut rx) = trigger(NAME, 10 * MS);
        t.trigger(Reason::Upsert);
        let first = next(&mut rx).await;
        // The run takes 50 ms; five triggers arrive during it.
        for i in 0..5 {
            sleep(10 * MS).await;
            t.trigger(if i == 4 {
                Reason::Delete
            } else {
                Reason::PodEvent
            });
        }
        rx.finished(&first);
        let second = next(&mut rx).await;
        assert_eq!(
            second.started,
            first.started + 50 * MS,
            "runs at once: min_interval passed"
        );
        assert_eq!(second.folds, 5);
        assert!(
            second.reasons.contains(Reason::Delete),
            "the last trigger is kept"
        );
        assert!(
            !second.reasons.contains(Reason::Upsert),
            "reasons do not carry over"
        );
        assert_eq!(second.latency, 40 * MS);
        rx.finished(&second);
        assert_idle(&mut rx).await;
    }

    #[tokio::test(start_paused = true)]
    async fn min_interval_spaces_starts() {
        let (t, mut rx) = trigger(NAME, 100 * MS);
        t.trigger(Reason::Upsert);
        let r1 = next(&mut rx).await;
        sleep(30 * MS).await; // the run
        rx.finished(&r1);
        sleep(10 * MS).await;
        t.trigger(Reason::PodEvent); // at +40ms
        sleep(20 * MS).await;
        t.trigger(Reason::PodEvent); // at +60ms, folds
        let r2 = next(&mut rx).await;
        assert_eq!(r2.started, r1.started + 100 * MS, "start to start");
        assert_eq!(r2.folds, 2);
        assert_eq!(r2.latency, 60 * MS);
        rx.finished(&r2);
        // A run longer than min_interval: the next run starts right after it.
        t.trigger(Reason::Retry);
        sleep(150 * MS).await;
        let r3 = next(&mut rx).await;
        assert_eq!(r3.started, r2.started + 150 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_fires_at_the_deadline() {
        let (t, mut rx) = trigger(NAME, 10 * MS);
        let t0 = Instant::now();
        t.trigger_at(t0 + Duration::from_secs(5), Reason::Deadline);
        assert_eq!(rx.deadline(), Some(t0 + Duration::from_secs(5)));
        let run = next(&mut rx).await;
        assert_eq!(run.started, t0 + Duration::from_secs(5));
        assert_eq!(run.reasons, Reason::Deadline.into());
        assert_eq!(run.folds, 1);
        assert_eq!(run.latency, Duration::ZERO);
        assert_eq!(rx.deadline(), None, "consumed");
        rx.finished(&run);
        assert_idle(&mut rx).await;
    }

    #[tokio::test(start_paused = true)]
    async fn earliest_deadline_wins_and_keeps_all_reasons() {
        let (t, mut rx) = trigger(NAME, 10 * MS);
        let t0 = Instant::now();
        t.trigger_at(t0 + Duration::from_secs(10), Reason::Retry);
        t.trigger_at(t0 + Duration::from_secs(3), Reason::Deadline);
        t.trigger_at(t0 + Duration::from_secs(7), Reason::Deadline);
        let run = next(&mut rx).await;
        assert_eq!(run.started, t0 + Duration::from_secs(3));
        assert_eq!(
            run.reasons,
            [Reason::Deadline, Reason::Retry].into_iter().collect()
        );
        assert_eq!(run.folds, 1, "one deadline slot, one fold");
        rx.finished(&run);
        // Later deadlines were not kept: the runner re-arms what it still needs.
        assert_idle(&mut rx).await;
    }

    #[tokio::test(start_paused = true)]
    async fn trigger_before_a_deadline_runs_now_and_the_deadline_still_fires() {
        let (t, mut rx) = trigger(NAME, 10 * MS);
        let t0 = Instant::now();
        t.trigger_at(t0 + Duration::from_secs(10), Reason::Deadline);
        sleep(Duration::from_secs(1)).await;
        t.trigger(Reason::PodEvent);
        let r1 = next(&mut rx).await;
        assert_eq!(r1.started, t0 + Duration::from_secs(1));
        assert_eq!(r1.reasons, Reason::PodEvent.into());
        rx.finished(&r1);
        let r2 = next(&mut rx).await;
        assert_eq!(r2.started, t0 + Duration::from_secs(10));
        assert_eq!(r2.reasons, Reason::Deadline.into());
        rx.finished(&r2);
        assert_idle(&mut rx).await;
    }

    #[tokio::test(start_paused = true)]
    async fn reached_deadline_folds_into_a_run_delayed_by_min_interval() {
        let (t, mut rx) = trigger(NAME, Duration::from_secs(2));
        let t0 = Instant::now();
        t.trigger(Reason::Upsert);
        let r1 = next(&mut rx).await;
        rx.finished(&r1);
        t.trigger_at(t0 + Duration::from_secs(1), Reason::Deadline);
        let r2 = next(&mut rx).await;
        assert_eq!(
            r2.started,
            t0 + Duration::from_secs(2),
            "min_interval still holds"
        );
        assert_eq!(r2.reasons, Reason::Deadline.into());
        assert_eq!(
            r2.latency,
            Duration::from_secs(1),
            "counted from the deadline"
        );
        // A deadline in the past is due at once (after min_interval).
        rx.finished(&r2);
        sleep(Duration::from_secs(5)).await;
        rx.trigger_at(t0, Reason::Retry);
        let r3 = next(&mut rx).await;
        assert_eq!(r3.started, t0 + Duration::from_secs(7));
        assert_eq!(r3.reasons, Reason::Retry.into());
    }

    #[tokio::test(start_paused = true)]
    async fn trigger_and_reached_deadline_fold_together() {
        let (t, mut rx) = trigger(NAME, Duration::from_secs(2));
        let t0 = Instant::now();
        t.trigger(Reason::Upsert);
        let r1 = next(&mut rx).await;
        rx.finished(&r1);
        sleep(Duration::from_millis(500)).await;
        t.trigger(Reason::PodEvent); // at 0.5 s
        t.trigger_at(t0 + Duration::from_secs(1), Reason::Deadline);
        t.trigger_at(t0 + Duration::from_secs(60), Reason::Retry); // later: dropped slot
        let r2 = next(&mut rx).await;
        assert_eq!(r2.started, t0 + Duration::from_secs(2));
        assert_eq!(r2.folds, 2);
        assert_eq!(
            r2.reasons,
            [Reason::PodEvent, Reason::Deadline, Reason::Retry]
                .into_iter()
                .collect()
        );
        assert_eq!(r2.latency, Duration::from_millis(1500));
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_receiver_rearms_for_an_earlier_deadline() {
        let (t, mut rx) = trigger(NAME, 10 * MS);
        let t0 = Instant::now();
        let task = tokio::spawn(async move {
            let run = rx.next().await;
            (run, Instant::now())
        });
        sleep(Duration::from_secs(1)).await; // the receiver waits with no timer
        t.trigger_at(t0 + Duration::from_secs(5), Reason::Retry);
        sleep(Duration::from_secs(1)).await; // now it sleeps until 5 s
        t.trigger_at(t0 + Duration::from_secs(3), Reason::Deadline);
        let (run, at) = timeout(Duration::from_secs(3600), task)
            .await
            .expect("the receiver never woke")
            .unwrap();
        assert_eq!(at, t0 + Duration::from_secs(3));
        assert_eq!(
            run.unwrap().reasons,
            [Reason::Deadline, Reason::Retry].into_iter().collect()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn none_when_every_handle_is_dropped() {
        let (t, mut rx) = trigger(NAME, 10 * MS);
        let t2 = t.clone();
        drop(t);
        t2.trigger(Reason::Delete);
        drop(t2);
        // The pending trigger is still delivered, then None.
        let run = next(&mut rx).await;
        assert_eq!(run.reasons, Reason::Delete.into());
        rx.finished(&run);
        let t0 = Instant::now();
        assert!(rx.next().await.is_none());
        assert!(rx.next().await.is_none());
        assert_eq!(Instant::now(), t0, "nothing pending: no wait");
    }

    #[tokio::test(start_paused = true)]
    async fn future_deadline_is_discarded_when_handles_drop() {
        let (t, mut rx) = trigger(NAME, 10 * MS);
        let t0 = Instant::now();
        t.trigger_at(t0 + Duration::from_secs(30), Reason::Deadline);
        drop(t);
        assert!(rx.next().await.is_none());
        assert_eq!(Instant::now(), t0, "did not wait for the deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_receiver_wakes_with_none_on_last_drop() {
        let (t, mut rx) = trigger(NAME, 10 * MS);
        let task = tokio::spawn(async move { rx.next().await });
        sleep(Duration::from_secs(1)).await;
        assert!(!task.is_finished());
        drop(t);
        assert_eq!(task.await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_receiver_does_not_wake() {
        let (t, mut rx) = trigger(NAME, 10 * MS);
        let task = tokio::spawn(async move {
            let run = rx.next().await;
            (run, rx)
        });
        // A day of idle virtual time: a polling receiver would loop here.
        sleep(Duration::from_secs(86_400)).await;
        t.trigger(Reason::Upsert);
        let (run, rx) = task.await.unwrap();
        assert!(run.is_some());
        assert!(
            rx.wakeups <= 2,
            "receiver woke {} times while idle",
            rx.wakeups
        );
    }

    /// Runs never overlap, starts are min_interval apart, every trigger is followed by a run
    /// that starts at or after it, and folds add up to the trigger calls.
    #[tokio::test(start_paused = true)]
    async fn serialized_spaced_and_nothing_lost_under_load() {
        let min = 20 * MS;
        let (t, mut rx) = trigger(NAME, min);
        let runner = tokio::spawn(async move {
            let mut runs = Vec::new();
            let mut seed = 7u64;
            while let Some(run) = rx.next().await {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                sleep(Duration::from_millis(seed >> 59)).await; // 0..31 ms
                rx.finished(&run);
                runs.push((run, Instant::now()));
            }
            runs
        });
        let mut calls = Vec::new();
        let mut seed = 1u64;
        for _ in 0..500 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            sleep(Duration::from_millis(seed >> 60)).await; // 0..15 ms
            t.trigger(Reason::PodEvent);
            calls.push(Instant::now());
        }
        drop(t);
        let runs = runner.await.unwrap();
        let folds: u32 = runs.iter().map(|(r, _)| r.folds).sum();
        assert_eq!(folds as usize, calls.len());
        for w in runs.windows(2) {
            let ((a, a_end), (b, _)) = (w[0], w[1]);
            assert!(b.started >= a_end, "runs overlap");
            assert!(
                b.started >= a.started + min,
                "starts closer than min_interval"
            );
        }
        let last_call = *calls.last().unwrap();
        assert!(
            runs.last().unwrap().0.started >= last_call,
            "last trigger lost"
        );
        assert!(runs.len() < calls.len(), "nothing folded");
    }

    type Snap = Vec<(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )>;

    /// The value of `name{trigger=NAME}` in a snapshot (taking one drains histograms).
    fn value<'a>(snap: &'a Snap, name: &str) -> Option<&'a DebugValue> {
        snap.iter().find_map(|(ck, _, _, v)| {
            let key = ck.key();
            let ok = key.name() == name
                && key
                    .labels()
                    .any(|l| l.key() == m::trigger::KEY && l.value() == NAME.as_str());
            ok.then_some(v)
        })
    }

    fn histogram(snap: &Snap, name: &str) -> Vec<f64> {
        match value(snap, name) {
            Some(DebugValue::Histogram(v)) => v.iter().map(|x| x.into_inner()).collect(),
            other => panic!("{name}: {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_are_recorded() {
        let rec = DebuggingRecorder::new();
        let snap = rec.snapshotter();
        let _guard = metrics::set_default_local_recorder(&rec);
        let (t, mut rx) = trigger(NAME, 100 * MS);
        t.trigger(Reason::Upsert);
        let r1 = next(&mut rx).await;
        sleep(50 * MS).await;
        rx.finished(&r1);
        sleep(10 * MS).await;
        t.trigger(Reason::PodEvent);
        t.trigger(Reason::PodEvent);
        let r2 = next(&mut rx).await;
        rx.finished(&r2);
        t.trigger_at(Instant::now() + Duration::from_secs(1), Reason::Deadline);
        let r3 = next(&mut rx).await;
        sleep(MS).await;
        rx.finished(&r3);
        let snap: Snap = snap.snapshot().into_vec();
        assert_eq!(
            value(&snap, m::TRIGGER_QUEUED_TOTAL),
            Some(&DebugValue::Counter(4)),
            "3 calls + 1 reached deadline"
        );
        assert_eq!(histogram(&snap, m::TRIGGER_FOLDS), [1.0, 2.0, 1.0]);
        assert_eq!(
            histogram(&snap, m::TRIGGER_DURATION_SECONDS),
            [0.05, 0.0, 0.001]
        );
        assert_eq!(
            histogram(&snap, m::TRIGGER_LATENCY_SECONDS),
            [0.0, 0.04, 0.0]
        );
    }
}
