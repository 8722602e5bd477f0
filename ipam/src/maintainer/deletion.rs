//! The `Deleting` condition: what an IPAMNode on its way out waits for (DESIGN.md
//! "Reclaim", whole-node reclaim), so `kubectl describe` says why it has not gone.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use super::conditions::{drop_condition, replace_condition};
use crate::types::{Condition, OperatorFields};
use crate::vocab::{ConditionReason, ConditionType, DeletionWait};

const DELETING: ConditionType = ConditionType::Deleting;

/// Where a node stands on its way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Leaving {
    /// Its Node exists; `deleting`: someone deleted the IPAMNode.
    NodeLive { deleting: bool },
    /// Its Node is gone: whole-node reclaim waits while `bound_pods` (not terminal) are
    /// bound to the node name, and for `grace_left` of `node_reclaim_grace` (zero: passed,
    /// or the source says the machine is gone).
    NodeGone {
        bound_pods: usize,
        grace_left: Duration,
    },
}

/// What the IPAMNode of `node` waits for, with the condition's message; None when it is
/// not on its way out, or nothing holds it any more (its reclaim runs now).
pub(super) fn deletion_wait(
    node: &str,
    grace: Duration,
    leaving: Leaving,
) -> Option<(DeletionWait, String)> {
    match leaving {
        Leaving::NodeLive { deleting: false } => None,
        Leaving::NodeLive { deleting: true } => Some((
            DeletionWait::NodeExists,
            format!(
                "the IPAMNode is deleted but its Node {node} exists: it goes once the Node \
                 is deleted and its addresses are reclaimed"
            ),
        )),
        Leaving::NodeGone { bound_pods, .. } if bound_pods > 0 => {
            let pods = match bound_pods {
                1 => "1 pod that is".to_string(),
                n => format!("{n} pods that are"),
            };
            Some((
                DeletionWait::PodsStillBound,
                format!(
                    "Node {node} is gone but {pods} not terminal still bound to it: its \
                     addresses are reclaimed once no pod is and node_reclaim_grace \
                     ({grace:?}) has passed since the Node's deletion"
                ),
            ))
        }
        Leaving::NodeGone { grace_left, .. } if !grace_left.is_zero() => Some((
            DeletionWait::ReclaimGrace,
            format!(
                "Node {node} is gone: its addresses are reclaimed once node_reclaim_grace \
                 ({grace:?}) has passed since its deletion, or the source says the machine \
                 is gone"
            ),
        )),
        Leaving::NodeGone { .. } => None,
    }
}

/// Sets `Deleting` (status True) to `wait`, or drops it (None). Its transition time stays
/// while it stays True (only the reason or the message changes).
pub(super) fn set_deleting_condition(
    fields: &mut Cow<'_, OperatorFields>,
    wait: Option<(DeletionWait, String)>,
    now: SystemTime,
) {
    let current = fields.conditions.iter().find(|c| c.type_ == DELETING);
    let Some((w, message)) = wait else {
        if current.is_some() {
            drop_condition(fields.to_mut(), DELETING);
        }
        return;
    };
    let reason = ConditionReason::Deleting(w);
    if current.is_some_and(|c| c.status && c.reason == reason && c.message == message) {
        return;
    }
    let last_transition = current
        .filter(|c| c.status)
        .map_or(now, |c| c.last_transition);
    let condition = Condition {
        type_: DELETING,
        status: true,
        reason,
        message,
        last_transition,
    };
    replace_condition(fields.to_mut(), condition);
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(300);

    fn wait(leaving: Leaving) -> Option<DeletionWait> {
        deletion_wait("n1", GRACE, leaving).map(|(w, _)| w)
    }

    fn gone(bound_pods: usize, grace_left: u64) -> Leaving {
        Leaving::NodeGone {
            bound_pods,
            grace_left: Duration::from_secs(grace_left),
        }
    }

    #[test]
    fn a_live_node_waits_only_when_its_ipamnode_is_deleted() {
        assert_eq!(wait(Leaving::NodeLive { deleting: false }), None);
        let (w, m) = deletion_wait("n1", GRACE, Leaving::NodeLive { deleting: true }).unwrap();
        assert_eq!(w, DeletionWait::NodeExists);
        assert!(m.contains("Node n1 exists"), "{m}");
    }

    #[test]
    fn a_gone_node_waits_for_its_pods_then_the_grace() {
        let (w, m) = deletion_wait("n1", GRACE, gone(2, 10)).unwrap();
        assert_eq!(w, DeletionWait::PodsStillBound);
        assert!(m.contains("2 pods that are not terminal"), "{m}");
        assert!(m.contains("300s"), "{m}");
        let (_, m) = deletion_wait("n1", GRACE, gone(1, 0)).unwrap();
        assert!(m.contains("1 pod that is not terminal"), "{m}");
        assert_eq!(
            wait(gone(1, 0)),
            Some(DeletionWait::PodsStillBound),
            "pods hold it after the grace too"
        );
        assert_eq!(wait(gone(0, 10)), Some(DeletionWait::ReclaimGrace));
        assert_eq!(wait(gone(0, 0)), None, "nothing holds it: the reclaim runs");
    }

    #[test]
    fn the_condition_is_set_changed_and_dropped() {
        let t0 = SystemTime::UNIX_EPOCH;
        let t1 = t0 + Duration::from_secs(5);
        let empty = OperatorFields::default();
        let mut fields = Cow::Borrowed(&empty);
        set_deleting_condition(&mut fields, None, t0);
        assert!(
            matches!(fields, Cow::Borrowed(_)),
            "nothing to drop: no write"
        );
        let bound = deletion_wait("n1", GRACE, gone(1, 10));
        set_deleting_condition(&mut fields, bound.clone(), t0);
        let set = fields.clone().into_owned();
        assert_eq!(set.conditions.len(), 1);
        let c = &set.conditions[0];
        assert_eq!((c.type_, c.status), (DELETING, true));
        assert_eq!(c.reason.as_str(), "PodsStillBound");
        // the same again: no change, so no write
        let mut same = Cow::Borrowed(&set);
        set_deleting_condition(&mut same, bound, t1);
        assert!(matches!(same, Cow::Borrowed(_)));
        // another reason: changed, its transition time kept (it stays True)
        let mut next = Cow::Borrowed(&set);
        set_deleting_condition(&mut next, deletion_wait("n1", GRACE, gone(0, 10)), t1);
        let c = &next.conditions[0];
        assert_eq!(c.reason.as_str(), "WaitingForReclaimGrace");
        assert_eq!(c.last_transition, t0);
        assert_eq!(next.conditions.len(), 1);
        // nothing holds it: dropped
        let mut cleared = Cow::Borrowed(&*next);
        set_deleting_condition(&mut cleared, None, t1);
        assert!(cleared.conditions.is_empty());
    }
}
