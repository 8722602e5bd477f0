//! The handle every write path consults: one step-down instant, checked against the
//! monotonic clock at each call, so leadership ends at that instant even if the elector's
//! task is late to wake.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use super::LeaderConfig;
use crate::Error;

/// Whether this replica leads, and until when. Cheap to clone; all clones share one state,
/// which only the elector changes.
#[derive(Debug, Clone)]
pub struct Leadership {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    /// Woken whenever a write ends (answered, timed out or dropped).
    write_ended: tokio::sync::Notify,
    /// Flips to true on acquisition and to false on step-down; for wake-ups. The truth is
    /// [`Leadership::is_leading`], which does not wait for anyone to send.
    tx: watch::Sender<bool>,
    write_timeout: Duration,
}

#[derive(Debug, Default)]
struct State {
    /// While leading: last successful renewal's start + renew deadline.
    step_down_at: Option<Instant>,
    /// Writes under way: their ids and the instants they must land by.
    in_flight: std::collections::HashMap<u64, Instant>,
    next_write: u64,
    /// The latest deadline of a write given up without an answer (dropped, or past its
    /// deadline): the server may still hold it until then. The Lease is not released before
    /// it (client-go's ReleaseOnCancel presumes guarded work has stopped).
    abandoned_until: Option<Instant>,
}

/// One write under way (see [`Leadership::start_write`]); [`WriteGuard::answered`] when
/// its answer came, else dropping it counts the write as possibly still held by the server
/// until its deadline.
#[derive(Debug)]
pub struct WriteGuard {
    leadership: Leadership,
    id: u64,
    by: Instant,
    answered: bool,
}

impl WriteGuard {
    /// The instant the write must have landed by.
    pub fn deadline(&self) -> Instant {
        self.by
    }

    /// The answer came: the server holds nothing of this write any more.
    pub fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        let mut st = self.leadership.inner.state.lock();
        st.in_flight.remove(&self.id);
        if !self.answered && Instant::now() < self.by {
            st.abandoned_until = st.abandoned_until.max(Some(self.by));
        }
        drop(st);
        self.leadership.inner.write_ended.notify_waiters();
    }
}

impl Leadership {
    /// A handle that does not lead until an elector running with it acquires the Lease.
    pub fn new(config: &LeaderConfig) -> Self {
        Leadership {
            inner: Arc::new(Inner {
                state: Mutex::default(),
                write_ended: tokio::sync::Notify::new(),
                tx: watch::channel(false).0,
                write_timeout: config.write_timeout(),
            }),
        }
    }

    /// True until the step-down instant, judged by the monotonic clock now.
    pub fn is_leading(&self) -> bool {
        self.step_down_instant().is_some_and(|d| Instant::now() < d)
    }

    /// The step-down instant while this replica leads or last led without stepping down.
    pub fn step_down_instant(&self) -> Option<Instant> {
        self.inner.state.lock().step_down_at
    }

    /// A receiver of leadership changes (true: acquired). Use it to wake up; ask
    /// [`is_leading`](Self::is_leading) or [`permit`](Self::permit) before acting.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.inner.tx.subscribe()
    }

    /// The timeout every write must carry: lease duration − renew deadline − margin
    /// ([`LeaderConfig::write_timeout`]).
    pub fn write_timeout(&self) -> Duration {
        self.inner.write_timeout
    }

    /// May a write be sent now? Some(instant by which it must have landed): the earlier
    /// of the step-down instant and now + [`write_timeout`](Self::write_timeout). The write
    /// path must give up at that instant and should send the remaining time as the
    /// request's server-side `timeout`, since dropping a future does not retract a request
    /// the server already holds. None: not leading; count it with
    /// [`count_refused_write`] (or use [`require_permit`](Self::require_permit)).
    pub fn permit(&self) -> Option<Instant> {
        let now = Instant::now();
        let st = self.inner.state.lock();
        let d = st.step_down_at.filter(|d| now < *d)?;
        Some(d.min(now + self.inner.write_timeout))
    }

    /// A write about to be sent under [`permit`](Self::permit): None when not leading;
    /// else its guard, which the Lease's release on shutdown waits for (see
    /// [`settled`](Self::settled)).
    pub fn start_write(&self) -> Option<WriteGuard> {
        let by = self.permit()?;
        let mut st = self.inner.state.lock();
        let id = st.next_write;
        st.next_write += 1;
        st.in_flight.insert(id, by);
        Some(WriteGuard {
            leadership: self.clone(),
            id,
            by,
            answered: false,
        })
    }

    /// Resolves once no write sent while leading can still land: every one under way has
    /// been answered or reached its deadline, and the deadlines of those given up have
    /// passed.
    pub async fn settled(&self) {
        loop {
            let ended = self.inner.write_ended.notified();
            let last = {
                let st = self.inner.state.lock();
                st.in_flight
                    .values()
                    .copied()
                    .chain(st.abandoned_until)
                    .max()
                    .filter(|t| Instant::now() < *t)
            };
            let Some(last) = last else {
                return;
            };
            tokio::select! {
                () = ended => {}
                () = tokio::time::sleep_until(last) => {}
            }
        }
    }

    /// [`permit`](Self::permit), counting a refusal in `tidepool_leader_writes_refused_total`
    /// and returning it as [`Error::NotLeading`].
    pub fn require_permit(&self) -> Result<Instant, Error> {
        self.permit().ok_or_else(|| {
            count_refused_write();
            Error::NotLeading
        })
    }

    /// Resolves once this replica leads.
    pub async fn leading(&self) {
        let mut rx = self.subscribe();
        while !self.is_leading() {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Resolves once this replica does not lead: at once if it does not, else at the
    /// step-down instant (on this task's own timer) or when the elector steps down, whichever
    /// comes first. Race a write against it to cancel the write at that instant.
    pub async fn lost(&self) {
        let mut rx = self.subscribe();
        loop {
            let Some(d) = self.step_down_instant().filter(|_| self.is_leading()) else {
                return;
            };
            tokio::select! {
                () = tokio::time::sleep_until(d) => {}
                r = rx.changed() => if r.is_err() { return },
            }
        }
    }

    /// Starts or extends leadership after a successful write of the Lease that began at
    /// `start`: the step-down instant becomes `start + renew_deadline`. Refused (false) if a
    /// step-down instant has already passed: a renewal that lands late does not revive a
    /// leadership that writers were told had ended.
    pub(crate) fn renewed(&self, start: Instant, renew_deadline: Duration) -> bool {
        let now = Instant::now();
        let mut st = self.inner.state.lock();
        if st.step_down_at.is_some_and(|d| now >= d) {
            return false;
        }
        st.step_down_at = Some(start + renew_deadline);
        drop(st);
        self.inner
            .tx
            .send_if_modified(|v| !std::mem::replace(v, true));
        true
    }

    /// Ends leadership now (writes under way may still end: see [`settled`](Self::settled)).
    pub(crate) fn step_down(&self) {
        self.inner.state.lock().step_down_at = None;
        self.inner
            .tx
            .send_if_modified(|v| std::mem::replace(v, false));
    }
}

/// Counts one write a write path did not send because this replica does not lead.
pub fn count_refused_write() {
    tidepool_metrics::record::leader_writes_refused();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LeaderConfig {
        LeaderConfig {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            name: "l".into(),
            namespace: "ns".into(),
            identity: "a".into(),
        }
    }

    const RENEW: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn leadership_ends_at_the_deadline_without_anyone_waking() {
        let l = Leadership::new(&config());
        let rx = l.subscribe();
        assert!(!l.is_leading() && l.permit().is_none());
        let start = Instant::now();
        assert!(l.renewed(start, RENEW));
        assert!(l.is_leading() && *rx.borrow());
        tokio::time::advance(RENEW - Duration::from_millis(1)).await;
        assert!(l.is_leading());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!l.is_leading(), "over at start + renew deadline");
        assert!(l.permit().is_none());
        assert!(
            *rx.borrow(),
            "the watch is only a wake-up; the clock decides"
        );
        // a renewal that comes back late does not revive it
        assert!(!l.renewed(start + RENEW, RENEW));
        assert!(!l.is_leading());
    }

    #[tokio::test(start_paused = true)]
    async fn permits_end_at_the_earlier_of_deadline_and_write_timeout() {
        let l = Leadership::new(&config());
        assert_eq!(l.write_timeout(), Duration::from_secs(4));
        let start = Instant::now();
        l.renewed(start, RENEW);
        assert_eq!(l.permit(), Some(start + Duration::from_secs(4)));
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(
            l.permit(),
            Some(start + RENEW),
            "capped by the step-down instant"
        );
        // a renewal moves the deadline
        let again = Instant::now();
        assert!(l.renewed(again, RENEW));
        assert_eq!(l.step_down_instant(), Some(again + RENEW));
    }

    #[tokio::test(start_paused = true)]
    async fn writes_settle_when_answered_or_past_their_deadline() {
        let l = Leadership::new(&config());
        let start = Instant::now();
        l.renewed(start, RENEW);
        let answered = l.start_write().unwrap();
        let dropped = l.start_write().unwrap();
        let pending = l.start_write().unwrap();
        assert_eq!(pending.deadline(), start + Duration::from_secs(4));
        tokio::time::advance(Duration::from_secs(1)).await;
        l.step_down();
        assert!(!l.is_leading() && !*l.subscribe().borrow());
        assert!(l.require_permit().is_err() && l.start_write().is_none());
        answered.answered();
        let settled = tokio::spawn({
            let l = l.clone();
            async move {
                l.settled().await;
                Instant::now()
            }
        });
        tokio::time::advance(Duration::from_secs(1)).await;
        pending.answered();
        // the dropped write may still be held by the server until its deadline
        drop(dropped);
        assert_eq!(settled.await.unwrap(), start + Duration::from_secs(4));
        // answered writes leave nothing to wait for
        let l = Leadership::new(&config());
        l.renewed(Instant::now(), RENEW);
        l.start_write().unwrap().answered();
        l.step_down();
        let before = Instant::now();
        l.settled().await;
        assert_eq!(Instant::now(), before);
    }

    #[tokio::test(start_paused = true)]
    async fn lost_resolves_at_the_deadline_on_its_own_timer() {
        let l = Leadership::new(&config());
        l.lost().await; // not leading: at once
        let start = Instant::now();
        l.renewed(start, RENEW);
        let waiter = tokio::spawn({
            let l = l.clone();
            async move {
                l.lost().await;
                Instant::now()
            }
        });
        // extended halfway: the waiter follows the new instant
        tokio::time::advance(Duration::from_secs(5)).await;
        let renewed_at = Instant::now();
        l.renewed(renewed_at, RENEW);
        let ended = waiter.await.unwrap();
        assert_eq!(ended, renewed_at + RENEW);
    }

    #[tokio::test(start_paused = true)]
    async fn lost_and_leading_follow_the_elector() {
        let l = Leadership::new(&config());
        let leading = tokio::spawn({
            let l = l.clone();
            async move { l.leading().await }
        });
        tokio::task::yield_now().await;
        assert!(!leading.is_finished());
        l.renewed(Instant::now(), RENEW);
        leading.await.unwrap();
        let lost = tokio::spawn({
            let l = l.clone();
            async move {
                l.lost().await;
                Instant::now()
            }
        });
        tokio::task::yield_now().await;
        let at = Instant::now();
        l.step_down();
        assert_eq!(
            lost.await.unwrap(),
            at,
            "a step-down ends it before the deadline"
        );
    }

    #[test]
    fn refusals_are_counted() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let rec = DebuggingRecorder::new();
        let snap = rec.snapshotter();
        let l = Leadership::new(&config());
        metrics::with_local_recorder(&rec, || {
            assert!(matches!(l.require_permit(), Err(Error::NotLeading)));
            assert!(l.require_permit().is_err());
        });
        let v = snap
            .snapshot()
            .into_vec()
            .into_iter()
            .find(|(k, ..)| k.key().name() == tidepool_metrics::LEADER_WRITES_REFUSED_TOTAL)
            .map(|(.., v)| v);
        assert_eq!(v, Some(DebugValue::Counter(2)));
    }
}
