//! Group commit: the mutations made while a save runs share the next save.
//!
//! A locked step changes the live state and joins a batch: the next save's when the state
//! changed since the last snapshot (or the last save failed), else the last snapshot's (what
//! the step read may be in it, not yet durable). One saver at a time, on the blocking pool,
//! takes the next batch: it snapshots the live state under its lock (marking it clean), writes
//! the snapshot without the lock (temp file, fsync, rename, fsync of the directory), makes it
//! the durable state, and only then resolves the batch: every step in it answers (and
//! publishes) after that, and a failed save fails every step in it. A failed save leaves its
//! changes to be saved: the live state keeps them and the next step joins the next save,
//! which holds them too (a snapshot is the whole state). The publisher reads the durable
//! state, never the live one, so nothing not yet durable is published.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use tokio::sync::watch;

use crate::failpoint::{self, Failpoint};
use crate::state::{NodeState, StateDir, StateError};

/// How a batch's save ended.
pub(super) type Saved = Result<(), Arc<StateError>>;

/// The node state the handlers change (the live one, under its lock) and what the publisher
/// reads (the durable one: the last state saved). Cheap to clone (shared).
#[derive(Clone)]
pub struct SharedState {
    live: Arc<tokio::sync::Mutex<NodeState>>,
    durable: Arc<Mutex<Arc<NodeState>>>,
}

impl SharedState {
    /// Shares `state`, durable as it is (just loaded or saved).
    pub fn new(state: NodeState) -> Self {
        SharedState {
            durable: Arc::new(Mutex::new(Arc::new(state.clone()))),
            live: Arc::new(tokio::sync::Mutex::new(state)),
        }
    }

    /// The live state: every change so far, durable or not (lock it briefly).
    pub fn live(&self) -> &Arc<tokio::sync::Mutex<NodeState>> {
        &self.live
    }

    /// The state as last saved: what may be published.
    pub fn durable(&self) -> Arc<NodeState> {
        self.durable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_durable(&self, state: Arc<NodeState>) {
        *self.durable.lock().unwrap_or_else(PoisonError::into_inner) = state;
    }
}

/// The failpoints around one kind of save (see [`crate::failpoint`]): a batch's save passes
/// those of every kind of change in it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Persist {
    before: Failpoint,
    after: Failpoint,
}

impl Persist {
    pub(super) const ADD: Persist = Persist {
        before: Failpoint::AddBeforePersist,
        after: Failpoint::AddAfterPersist,
    };
    pub(super) const DEL: Persist = Persist {
        before: Failpoint::DelBeforePersist,
        after: Failpoint::DelAfterPersist,
    };
    pub(super) const ACK: Persist = Persist {
        before: Failpoint::AckBeforePersist,
        after: Failpoint::AckAfterPersist,
    };
}

/// The steps waiting for one save; resolved once, when it ended.
#[derive(Clone)]
pub(super) struct Batch(Arc<watch::Sender<Option<Saved>>>);

impl Batch {
    fn new() -> Self {
        Batch(Arc::new(watch::channel(None).0))
    }

    fn resolve(&self, saved: Saved) {
        self.0.send_replace(Some(saved));
    }

    /// How its save ended (waits for it).
    pub(super) async fn saved(&self) -> Saved {
        let mut rx = self.0.subscribe();
        let ended = rx.wait_for(Option::is_some).await;
        let ended = ended.expect("the batch holds its sender");
        ended.clone().expect("resolved")
    }
}

/// A step's place in the group commit.
pub(super) struct Joined {
    pub(super) batch: Batch,
    /// It joined the next save (the state changed, or is still to be saved).
    pub(super) next: bool,
    /// No saver runs: the step starts one.
    pub(super) start_saver: bool,
}

/// The batches: see the module doc.
pub(super) struct Commit {
    pending: Mutex<Pending>,
}

struct Pending {
    /// The batch of the next save.
    next: Batch,
    /// The batch of the last snapshot (being saved, or saved).
    last: Batch,
    /// The failpoints the next save passes.
    points: Vec<Persist>,
    /// A step joined `next`.
    joined: bool,
    /// The last save failed: the live state holds changes not durable.
    failed: bool,
    /// A saver runs.
    saving: bool,
}

impl Default for Commit {
    fn default() -> Self {
        let last = Batch::new();
        last.resolve(Ok(()));
        Commit {
            pending: Mutex::new(Pending {
                next: Batch::new(),
                last,
                points: Vec::new(),
                joined: false,
                failed: false,
                saving: false,
            }),
        }
    }
}

impl Commit {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins a step that just ran on `live` (still locked) to its batch; `points` are the
    /// failpoints of its kind of change.
    pub(super) fn join(&self, live: &NodeState, points: Option<Persist>) -> Joined {
        let mut p = self.lock();
        if !(live.is_dirty() || p.failed) {
            return Joined {
                batch: p.last.clone(),
                next: false,
                start_saver: false,
            };
        }
        if let Some(pt) = points.filter(|pt| !p.points.contains(pt)) {
            p.points.push(pt);
        }
        p.joined = true;
        let start_saver = !p.saving;
        p.saving = true;
        Joined {
            batch: p.next.clone(),
            next: true,
            start_saver,
        }
    }

    /// The saver: saves batches while steps join them. Blocking (fsync).
    pub(super) fn save_batches(&self, state: &SharedState, dir: &StateDir) {
        while let Some((snapshot, batch, points)) = self.take(state) {
            for pt in &points {
                failpoint::reach(pt.before);
            }
            let saved = dir.write(&snapshot).map_err(Arc::new);
            match &saved {
                Ok(()) => {
                    for pt in &points {
                        failpoint::reach(pt.after);
                    }
                    state.set_durable(snapshot);
                }
                Err(_) => self.lock().failed = true,
            }
            batch.resolve(saved);
        }
    }

    /// The next batch and the snapshot it saves, or `None` (the saver stops) when no step
    /// joined it.
    fn take(&self, state: &SharedState) -> Option<(Arc<NodeState>, Batch, Vec<Persist>)> {
        let mut live = state.live.blocking_lock();
        let mut p = self.lock();
        if !p.joined {
            p.saving = false;
            return None;
        }
        p.joined = false;
        p.failed = false;
        let batch = std::mem::replace(&mut p.next, Batch::new());
        p.last = batch.clone();
        let points = std::mem::take(&mut p.points);
        Some((Arc::new(live.snapshot(SystemTime::now())), batch, points))
    }
}
