//! One identity's watches of one resource held back ([`WatchLag`]): the events are
//! delivered later, in order — a lagging watch, not a lost one.
//!
//! Why a real server shows this: every watch is its own HTTP stream (kube-client enables
//! HTTP/1 only), served by the watch cache of its own resource — kubernetes/apiserver
//! `pkg/storage/cacher/cacher.go`: one `Cacher` per resource, fed by its own reflector over
//! an etcd watch, each client watch a `cacheWatcher` with its own buffer
//! (`pkg/storage/cacher/cache_watcher.go`). Behind a load balancer a client's pods watch
//! and its IPAMNode watch may reach different apiservers; a relist after 410, a LIST
//! throttled by API Priority and Fairness or a slow page holds one resource's view back
//! for minutes while the others flow (docs: fidelity-review.md B1).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::server::State;

/// Holds back the watch events of one resource for one identity (see
/// [`crate::Faults::watch_lag`]). Events already sent are not taken back; events held are
/// sent, in order, when their hold ends. Bookmarks wait behind held events. A watch that
/// ends (its timeout) with events held drops them unsent: the client's next watch, from
/// its last resourceVersion, replays them (held again while the lag lasts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchLag {
    /// The identity string (as given to [`crate::ApiServer::token`]).
    pub identity: String,
    /// `plural[.group]`, as [`crate::ApiServer::requests`] names it (`pods`,
    /// `ipamnodes.ipam.tidepool.dev`).
    pub resource: String,
    pub hold: Hold,
}

/// How a [`WatchLag`] holds events back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Nothing is sent until the lag is removed (resumed).
    Paused,
    /// Each event is sent this long after the watch received it.
    Delay(Duration),
}

/// One watch's outgoing lines, through its lag.
pub(crate) struct Outbox {
    st: Arc<State>,
    who: String,
    resource: String,
    held: VecDeque<(Instant, Bytes)>,
}

impl Outbox {
    pub fn new(st: Arc<State>, who: &str, resource: &str) -> Self {
        Outbox {
            st,
            who: who.to_owned(),
            resource: resource.to_owned(),
            held: VecDeque::new(),
        }
    }

    /// The lag in force for this watch now.
    fn hold(&self) -> Option<Hold> {
        let f = self.st.faults.read();
        let lag = f.watch_lag.iter();
        lag.filter(|l| l.identity == self.who && l.resource == self.resource)
            .map(|l| l.hold)
            .next()
    }

    /// Queues `line` behind what is held and sends what may go; false when the client
    /// is gone.
    pub async fn send(&mut self, tx: &mpsc::Sender<Bytes>, line: Bytes) -> bool {
        self.held.push_back((Instant::now(), line));
        self.flush(tx).await
    }

    /// Sends, in order, the held lines whose hold has ended; false when the client is gone.
    pub async fn flush(&mut self, tx: &mpsc::Sender<Bytes>) -> bool {
        let hold = self.hold();
        let now = Instant::now();
        while let Some((at, _)) = self.held.front() {
            let due = match hold {
                None => true,
                Some(Hold::Paused) => false,
                Some(Hold::Delay(d)) => *at + d <= now,
            };
            if !due {
                break;
            }
            let Some((_, line)) = self.held.pop_front() else {
                break;
            };
            if tx.send(line).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Whether lines are held (a bookmark must not overtake them).
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// When the first held line falls due (`None`: none held, or paused until resumed; a
    /// fault change wakes the watch too).
    pub fn next_due(&self) -> Option<Instant> {
        let (at, _) = self.held.front()?;
        match self.hold() {
            None => Some(*at),
            Some(Hold::Paused) => None,
            Some(Hold::Delay(d)) => Some(*at + d),
        }
    }
}
