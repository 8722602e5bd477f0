//! The names of pods that left the index, kept for a while for their reclaim events.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tidepool_ipam::PodUid;
use tokio::time::Instant;

/// How long a departed pod's name is kept: longer than any reclaim waits (grace, minimum
/// age and the node grace are minutes by default) before it reports on the pod.
const RETENTION: Duration = Duration::from_secs(15 * 60);

/// `namespace/name` of pods deleted or not relisted, by UID: the reclaim's event on the
/// pod comes after the pod left the cache, and an event needs the name.
#[derive(Default)]
pub(super) struct Departed {
    by_uid: HashMap<PodUid, (Instant, Box<str>)>,
    order: VecDeque<(Instant, PodUid)>,
}

impl Departed {
    pub fn note(&mut self, now: Instant, uid: PodUid, key: Box<str>) {
        self.by_uid.insert(uid, (now, key));
        self.order.push_back((now, uid));
    }

    /// Forgets names kept longer than [`RETENTION`].
    pub fn prune(&mut self, now: Instant) {
        while let Some(&(at, uid)) = self.order.front() {
            if now.saturating_duration_since(at) < RETENTION {
                break;
            }
            self.order.pop_front();
            // a later note of the same pod keeps its own time
            if self.by_uid.get(&uid).is_some_and(|(t, _)| *t == at) {
                self.by_uid.remove(&uid);
            }
        }
    }

    pub fn get(&self, uid: PodUid) -> Option<&str> {
        self.by_uid.get(&uid).map(|(_, key)| &**key)
    }
}
