//! [`Fence`]: what every write the operator sends goes through. Under leader election it is
//! refused once this replica no longer leads, and it is given up at the instant
//! [`Leadership::permit`] names — the earlier of the step-down instant and now + the write
//! timeout (lease duration − renew deadline − a margin) — so a request sent while leading
//! cannot be in flight when another replica may take over (Cilium PR #42920: a leader that
//! went on writing past its deadline put one PodCIDR on two nodes).

use std::future::Future;

use super::{Leadership, count_refused_write};

/// Why a write was not sent or not waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// This replica does not lead (counted in `tidepool_leader_writes_refused_total`).
    NotLeading,
    /// No answer by the write's deadline: given up, its outcome unknown.
    TimedOut,
}

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fenced::NotLeading => "not sent: this replica does not lead",
            Fenced::TimedOut => "no answer before the leader's write deadline",
        })
    }
}

/// The leadership every write checks; without leader election (one replica) every write
/// goes. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Fence(Option<Leadership>);

impl Fence {
    /// Writes go while `leadership` leads, each bounded by its permit.
    pub fn of(leadership: Leadership) -> Self {
        Fence(Some(leadership))
    }

    /// Whether a write may be sent now.
    pub fn open(&self) -> bool {
        self.0.as_ref().is_none_or(Leadership::is_leading)
    }

    /// Sends the write `request` (a future that has not begun: kube's requests start when
    /// first polled) if this replica leads, and waits for its answer at most until its
    /// permit ends.
    pub async fn send<T>(&self, request: impl Future<Output = T>) -> Result<T, Fenced> {
        let Some(leadership) = &self.0 else {
            return Ok(request.await);
        };
        let Some(write) = leadership.start_write() else {
            count_refused_write();
            return Err(Fenced::NotLeading);
        };
        let answer = tokio::time::timeout_at(write.deadline(), request).await;
        if answer.is_ok() {
            write.answered();
        }
        answer.map_err(|_| Fenced::TimedOut)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::leader::LeaderConfig;

    fn leadership() -> Leadership {
        Leadership::new(&LeaderConfig {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            name: "l".into(),
            namespace: "ns".into(),
            identity: "a".into(),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn writes_go_only_while_leading_and_end_at_their_permit() {
        let l = leadership();
        let fence = Fence::of(l.clone());
        let sent = std::sync::atomic::AtomicBool::new(false);
        let r = fence
            .send(async { sent.store(true, std::sync::atomic::Ordering::SeqCst) })
            .await;
        assert_eq!(r, Err(Fenced::NotLeading));
        assert!(!sent.into_inner(), "a refused write is never polled");
        let start = Instant::now();
        l.renewed(start, Duration::from_secs(10));
        assert_eq!(fence.send(async { 7 }).await, Ok(7));
        // a write that hangs is given up at now + the write timeout (15 − 10 − 1 s)
        let r = fence.send(std::future::pending::<()>()).await;
        assert_eq!(r, Err(Fenced::TimedOut));
        assert_eq!(Instant::now(), start + Duration::from_secs(4));
        // close to the step-down instant, at that instant
        tokio::time::advance(Duration::from_secs(4)).await;
        let r = fence.send(std::future::pending::<()>()).await;
        assert_eq!(r, Err(Fenced::TimedOut));
        assert_eq!(Instant::now(), start + Duration::from_secs(10));
        assert!(!fence.open());
        assert!(Fence::default().open());
    }
}
