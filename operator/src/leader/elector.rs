//! The elector's loop: every retry period, one bounded attempt to acquire or renew; a
//! follower also looks again when the holder's lease would expire. It ends with an error
//! when leadership is lost (the binary then exits non-zero and Kubernetes restarts it as a
//! follower) and with Ok after a shutdown, releasing the Lease if it held it.

use std::future::Future;

use k8s_openapi::jiff::Timestamp;
use tokio::time::{Instant, sleep_until, timeout};

use super::decide::{self, Decision, Observed, StepDown};
use super::lease::{LeaseApi, Written, lease_client};
use super::{LeaderConfig, Leadership};
use crate::Error;

/// Runs the election for `leadership` until `shutdown` resolves (Ok, after releasing a held
/// Lease) or leadership is lost (Err [`Error::LeadershipLost`]). The Lease is written
/// through its own client built from `kube_config` (see [`lease_client`]).
pub async fn run_elector(
    config: LeaderConfig,
    kube_config: kube::Config,
    leadership: Leadership,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    config.validate()?;
    let client = lease_client(kube_config, config.request_timeout())?;
    let lease = LeaseApi::new(client, &config);
    let mut elector = Elector {
        config,
        lease,
        leadership,
        seen: None,
    };
    elector.run(shutdown).await
}

struct Elector {
    config: LeaderConfig,
    lease: LeaseApi,
    leadership: Leadership,
    seen: Option<Observed>,
}

/// What the loop does next.
enum Step {
    /// Look again at this instant.
    Next(Instant),
    /// Leadership is over.
    Lost(StepDown),
    /// Asked to stop.
    Shutdown,
}

/// Steps down however the elector's future ends, aborted included: a dead elector cannot
/// renew, so nothing it guarded may go on writing.
struct StepDownOnDrop(Leadership);

impl Drop for StepDownOnDrop {
    fn drop(&mut self) {
        self.0.step_down();
    }
}

impl Elector {
    async fn run(&mut self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        let _guard = StepDownOnDrop(self.leadership.clone());
        let lead = self.leadership.clone();
        tokio::pin!(shutdown);
        loop {
            let step = tokio::select! {
                biased;
                () = &mut shutdown => Step::Shutdown,
                () = deadline_passed(&lead) => Step::Lost(StepDown::DeadlinePassed),
                step = self.attempt() => step,
            };
            let at = match step {
                Step::Next(at) => at,
                Step::Lost(why) => return Err(self.lost(&why)),
                Step::Shutdown => return self.shut_down().await,
            };
            let step = tokio::select! {
                biased;
                () = &mut shutdown => Step::Shutdown,
                () = deadline_passed(&lead) => Step::Lost(StepDown::DeadlinePassed),
                () = sleep_until(at) => Step::Next(at),
            };
            match step {
                Step::Next(_) => {}
                Step::Lost(why) => return Err(self.lost(&why)),
                Step::Shutdown => return self.shut_down().await,
            }
        }
    }

    /// One acquire-or-renew attempt, bounded by the request timeout; a failure is logged and
    /// retried a retry period after this attempt began.
    async fn attempt(&mut self) -> Step {
        let start = Instant::now();
        let retry = start + self.config.retry_period;
        let bound = self.config.request_timeout();
        match timeout(bound, self.try_acquire_or_renew(start)).await {
            Ok(Ok(Step::Next(at))) => Step::Next(at.min(retry)),
            Ok(Ok(step)) => step,
            Ok(Err(e)) => {
                tracing::warn!(error = %super::chain(&e), "leader election attempt failed");
                Step::Next(retry)
            }
            Err(_) => {
                let e = Error::LeaseTimeout { after: bound };
                tracing::warn!(error = %e, "leader election attempt failed");
                Step::Next(retry)
            }
        }
    }

    async fn try_acquire_or_renew(&mut self, start: Instant) -> Result<Step, Error> {
        let decision = self.observe().await?;
        let me = self.config.identity.as_str();
        let secs = self.config.lease_duration_seconds();
        let seen = self.seen.as_ref();
        let Some(claim) = decide::claim(me, &decision, seen, Timestamp::now(), secs) else {
            return Ok(match decision {
                Decision::Wait { until } => Step::Next(until),
                Decision::StepDown(why) => Step::Lost(why),
                _ => Step::Next(start + self.config.retry_period),
            });
        };
        let written = match decision {
            Decision::Create => self.lease.create(&claim).await?,
            _ => self.lease.replace(&claim).await?,
        };
        let Written::Stored(rec) = written else {
            tracing::debug!(?decision, "another replica wrote the Lease first");
            return Ok(Step::Next(start + self.config.retry_period));
        };
        self.seen = Some(Observed::update(self.seen.take(), rec, Instant::now()));
        Ok(self.won(start, &decision))
    }

    /// Reads the Lease, notes whether it changed (on the monotonic clock, when the answer
    /// came) and decides.
    async fn observe(&mut self) -> Result<Decision, Error> {
        let current = self.lease.get().await?;
        let now = Instant::now();
        self.seen = current.map(|r| Observed::update(self.seen.take(), r, now));
        Ok(decide::decide(
            &self.config.identity,
            self.leadership.step_down_instant(),
            self.seen.as_ref(),
            now,
            self.config.lease_duration,
        ))
    }

    /// A successful write of the Lease: leadership runs until `start` + renew deadline.
    fn won(&self, start: Instant, decision: &Decision) -> Step {
        let was_leading = self.leadership.is_leading();
        if !self.leadership.renewed(start, self.config.renew_deadline) {
            return Step::Lost(StepDown::DeadlinePassed);
        }
        if !was_leading {
            tidepool_metrics::record::leader_transitions();
            tracing::info!(identity = %self.config.identity, ?decision, lease = %self.config.name, "leading");
        }
        Step::Next(start + self.config.retry_period)
    }

    fn lost(&self, why: &StepDown) -> Error {
        self.leadership.step_down();
        tracing::warn!(identity = %self.config.identity, reason = %why, "leader election lost");
        Error::LeadershipLost {
            reason: why.to_string(),
        }
    }

    /// Stops leading at once; if this replica led, waits until every permitted write has
    /// landed or timed out, then clears the holder so a follower takes over at its next look
    /// (client-go's ReleaseOnCancel) rather than a lease duration later.
    async fn shut_down(&mut self) -> Result<(), Error> {
        let was_leading = self.leadership.is_leading();
        self.leadership.step_down();
        if !was_leading {
            return Ok(());
        }
        self.leadership.settled().await;
        match timeout(self.config.request_timeout(), self.release()).await {
            Ok(Ok(Some(Written::Stored(_)))) => tracing::info!("released the Lease"),
            Ok(Ok(Some(Written::Conflict))) => tracing::info!("the Lease changed; not released"),
            Ok(Ok(None)) => tracing::info!("the Lease is another's; nothing to release"),
            Ok(Err(e)) => tracing::warn!(error = %super::chain(&e), "releasing the Lease"),
            Err(_) => tracing::warn!("releasing the Lease timed out"),
        }
        Ok(())
    }

    /// Reads the Lease, then gives it up if this replica still holds it. The read comes
    /// first because what this replica last saw may be stale: a renewal the stop cancelled
    /// after the server stored it changed the resourceVersion, and a release from the older
    /// one would be refused (409) and leave the Lease held for a lease duration.
    async fn release(&mut self) -> Result<Option<Written>, Error> {
        let current = self.lease.get().await?;
        let now = Instant::now();
        self.seen = current.map(|r| Observed::update(self.seen.take(), r, now));
        let me = self.config.identity.as_str();
        let Some(rec) = (self.seen.as_ref()).and_then(|s| decide::release(me, s, Timestamp::now()))
        else {
            return Ok(None);
        };
        self.lease.replace(&rec).await.map(Some)
    }
}

/// Resolves at the step-down instant while leading; never while following.
async fn deadline_passed(leadership: &Leadership) {
    match leadership.step_down_instant() {
        Some(d) => sleep_until(d).await,
        None => std::future::pending().await,
    }
}
