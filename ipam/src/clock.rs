//! The one injected clock: a monotonic instant (tokio's, so paused test time and the
//! simulator's virtual time apply) and a UTC reading derived from it, so `since` fields,
//! events and conditions use the same virtual time as everything else.

use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// Time source for the engine and the simulated world.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic now (tokio's clock; virtual when time is paused).
    fn now(&self) -> Instant;
    /// Wall-clock now as UTC, consistent with [`Clock::now`].
    fn utc(&self) -> SystemTime;
}

/// A clock anchored at construction: `utc()` = anchor UTC + (now − anchor instant).
/// Under paused tokio time both readings advance virtually.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start: Instant,
    start_utc: SystemTime,
}

impl TokioClock {
    /// Anchors UTC at the real system time.
    pub fn new() -> Self {
        Self::anchored(SystemTime::now())
    }

    /// Anchors UTC at a fixed point, for deterministic simulations.
    pub fn anchored(start_utc: SystemTime) -> Self {
        Self {
            start: Instant::now(),
            start_utc,
        }
    }

    /// Time elapsed since the anchor.
    pub fn elapsed(&self) -> Duration {
        Instant::now().saturating_duration_since(self.start)
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn utc(&self) -> SystemTime {
        self.start_utc + self.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn utc_follows_virtual_time() {
        let clock = TokioClock::anchored(SystemTime::UNIX_EPOCH);
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(
            clock.utc(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(90)
        );
        assert_eq!(clock.elapsed(), Duration::from_secs(90));
    }
}
