//! Per-node change logs behind `PodCache::pod_changes`.

use std::collections::VecDeque;

use tidepool_ipam::{PodChanges, PodUid, Since};

/// Changes of one node's pods kept for `pod_changes` (as many as the in-memory view keeps).
const CHANGES_KEPT: usize = 16;

/// The recent changes of one node's pods. The index shows a change the moment it applies
/// it, so a change's sequence number alone says whether a caller has seen it (`Since::at`
/// is not needed).
#[derive(Debug)]
pub(super) struct ChangeLog {
    /// (sequence number, pod), oldest first, at most [`CHANGES_KEPT`].
    recent: VecDeque<(u64, PodUid)>,
    /// The largest sequence number no longer kept (at creation: the index's counter then,
    /// since whatever the node's pods did before is not in this log).
    dropped: u64,
}

impl ChangeLog {
    pub fn new(seq_now: u64) -> Self {
        Self {
            recent: VecDeque::new(),
            dropped: seq_now,
        }
    }

    pub fn push(&mut self, seq: u64, uid: PodUid) {
        if self.recent.len() == CHANGES_KEPT
            && let Some((old, _)) = self.recent.pop_front()
        {
            self.dropped = old;
        }
        self.recent.push_back((seq, uid));
    }

    /// The answer for a node that has this log.
    pub fn changes(&self, since: Option<Since>) -> Option<PodChanges> {
        let seq = self.recent.back().map_or(self.dropped, |c| c.0);
        let Some(since) = since else {
            return Some(PodChanges {
                seq,
                changed: Vec::new(),
            });
        };
        if self.dropped > since.seq {
            return None;
        }
        let changed = self.recent.iter().filter(|(s, _)| *s > since.seq);
        Some(PodChanges {
            seq,
            changed: changed.map(|(_, uid)| *uid).collect(),
        })
    }
}

/// The answer for a node with no log: it has no pod now. A caller who saw it that way
/// (sequence 0) has seen everything; one who saw its pods (a log since dropped) cannot
/// be told which changed.
pub(super) fn changes_without_log(since: Option<Since>) -> Option<PodChanges> {
    match since {
        Some(s) if s.seq > 0 => None,
        _ => Some(PodChanges::default()),
    }
}
