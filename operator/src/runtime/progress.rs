//! When each watch last made progress (a page listed or an event), so that start-up waits
//! for a large list as long as it advances and fails on one that stalls: a total deadline
//! would fail a cluster whose list takes longer than it however healthy the server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// The last progress of each watch, by resource name.
#[derive(Clone, Default)]
pub(super) struct Progress(Arc<Mutex<HashMap<&'static str, Instant>>>);

/// One watch's handle on [`Progress`].
pub(super) struct Of {
    all: Progress,
    what: &'static str,
}

impl Of {
    /// Notes progress now.
    pub(super) fn made(&self) {
        self.all.0.lock().insert(self.what, Instant::now());
    }
}

impl Progress {
    /// The handle of the watch of `what`.
    pub(super) fn of(&self, what: &'static str) -> Of {
        Of {
            all: self.clone(),
            what,
        }
    }

    /// Those of `waiting` without progress for `timeout`, counting from `start` at the
    /// earliest.
    pub(super) fn stalled(
        &self,
        waiting: &[&'static str],
        start: Instant,
        timeout: Duration,
    ) -> Vec<&'static str> {
        let last = self.0.lock();
        waiting
            .iter()
            .filter(|w| {
                let since = last.get(*w).map_or(start, |t| (*t).max(start));
                since.elapsed() >= timeout
            })
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_watch_stalls_only_after_the_timeout_without_progress() {
        let p = Progress::default();
        let start = Instant::now();
        let pods = p.of("pods");
        let t = Duration::from_secs(10);
        tokio::time::advance(Duration::from_secs(9)).await;
        pods.made();
        assert!(p.stalled(&["pods", "nodes"], start, t).is_empty());
        tokio::time::advance(Duration::from_secs(2)).await;
        // nodes made no progress since the start; pods did 2 s ago
        assert_eq!(p.stalled(&["pods", "nodes"], start, t), ["nodes"]);
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(p.stalled(&["pods", "nodes"], start, t), ["pods", "nodes"]);
        // a later wait counts from its own start
        assert!(p.stalled(&["pods"], Instant::now(), t).is_empty());
    }
}
