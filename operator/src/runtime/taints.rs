//! `--taint-exhausted-nodes`: a Node whose IPAMNode is `Blocked` because it cannot get more
//! addresses (its pool exhausted, or at its cap) gets the taint
//! `ipam.tidepool.dev/exhausted:NoSchedule`, and loses it once the condition clears — the
//! scheduler knows nothing of IP capacity otherwise (Cilium #12557: pods waited 10+ min).
//!
//! The taint follows the condition as the IPAMNode watch shows it, so a restarted operator
//! (or a new leader) finds the state it must keep. Without the flag, taints left by an
//! earlier run are removed. A write is a merge patch of the whole taint list at the
//! resourceVersion it was read at: a concurrent change of the list (the node lifecycle
//! controller's own taints) is a conflict, retried a second later, never a loss.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tidepool_api::names::EXHAUSTED_TAINT;
use tidepool_ipam::{Background, ConditionReason, ConditionType, Gate, IpamNode, NodeStore};

use crate::index::NodeIndex;
use crate::leader::Fence;
use crate::store::KubeStore;

/// Whether the IPAMNode says its node cannot get the addresses its pods need: `Blocked`
/// for a reason that is [`tidepool_ipam::Blocked::out_of_addresses`].
pub(super) fn exhausted(node: &IpamNode) -> bool {
    node.operator.conditions.iter().any(|c| {
        c.type_ == ConditionType::Blocked
            && c.status
            && matches!(c.reason, ConditionReason::Blocked(b) if b.out_of_addresses())
    })
}

/// The Node's taints with ours added (`want`) or removed, every other taint kept in
/// order; `None` when nothing changes.
pub(super) fn taints_after(current: &[Taint], want: bool) -> Option<Vec<Taint>> {
    let ours = |t: &Taint| t.key == EXHAUSTED_TAINT;
    let has = current.iter().any(|t| ours(t) && t.effect == "NoSchedule");
    if want == has && current.iter().filter(|t| ours(t)).count() == usize::from(has) {
        return None;
    }
    let mut next: Vec<Taint> = current.iter().filter(|t| !ours(t)).cloned().collect();
    if want {
        next.push(Taint {
            key: EXHAUSTED_TAINT.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        });
    }
    Some(next)
}

/// Each second: every selected Node whose taint differs from what its IPAMNode's condition
/// asks for (`enabled`) gets it set or removed, each write admitted by `gate`.
pub(super) async fn keep(
    nodes: Api<Node>,
    store: KubeStore,
    index: NodeIndex,
    enabled: bool,
    mut gate: Background,
    fence: Fence,
) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (name, has) in index.exhausted_taints() {
            let want = enabled && store.cached(&name).is_some_and(|n| exhausted(&n));
            if want == has {
                continue;
            }
            if gate.request().await.is_err() {
                break; // the lead is gone: write nothing more this round
            }
            match fence.send(set(&nodes, &name, want)).await {
                Ok(Ok(true)) if want => tracing::info!(node = %name, "tainted: out of addresses"),
                Ok(Ok(true)) => tracing::info!(node = %name, "exhaustion taint removed"),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(node = %name, error = %e, "could not change the exhaustion taint")
                }
                Err(e) => tracing::warn!(node = %name, error = %e, "exhaustion taint not changed"),
            }
        }
    }
}

/// Sets or removes the taint on the Node as the server has it now. Returns whether it wrote.
async fn set(nodes: &Api<Node>, name: &str, want: bool) -> Result<bool, kube::Error> {
    let node = nodes.get(name).await?;
    let current = node.spec.and_then(|s| s.taints).unwrap_or_default();
    let Some(next) = taints_after(&current, want) else {
        return Ok(false);
    };
    let patch = json!({
        "metadata": { "resourceVersion": node.metadata.resource_version },
        "spec": { "taints": next },
    });
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use tidepool_ipam::{Blocked, Condition, NodeName, NodeUid};

    use super::*;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            ..Taint::default()
        }
    }

    #[test]
    fn ours_is_added_and_removed_and_the_others_kept() {
        let other = taint("node.kubernetes.io/not-ready", "NoExecute");
        let added = taints_after(std::slice::from_ref(&other), true).expect("a change");
        assert_eq!(
            added,
            vec![other.clone(), taint(EXHAUSTED_TAINT, "NoSchedule")]
        );
        assert_eq!(taints_after(&added, true), None, "already there");
        assert_eq!(taints_after(&added, false), Some(vec![other.clone()]));
        assert_eq!(taints_after(std::slice::from_ref(&other), false), None);
        // ours with another effect (someone edited it) is put right
        let edited = [taint(EXHAUSTED_TAINT, "NoExecute")];
        assert_eq!(
            taints_after(&edited, true),
            Some(vec![taint(EXHAUSTED_TAINT, "NoSchedule")])
        );
        assert_eq!(taints_after(&edited, false), Some(vec![]));
    }

    /// A node `Blocked` (status as given) for `reason`.
    fn blocked(status: bool, reason: ConditionReason) -> IpamNode {
        let mut n = IpamNode::new(NodeName::from("n"), NodeUid(1));
        n.operator.conditions.push(Condition {
            type_: ConditionType::Blocked,
            status,
            reason,
            message: String::new(),
            last_transition: UNIX_EPOCH,
        });
        n
    }

    #[test]
    fn only_a_node_that_cannot_get_addresses_is_exhausted() {
        use ConditionReason::Blocked as B;
        assert!(exhausted(&blocked(true, B(Blocked::Exhausted))));
        assert!(exhausted(&blocked(true, B(Blocked::AtCap))));
        assert!(!exhausted(&blocked(false, B(Blocked::Exhausted))));
        assert!(!exhausted(&blocked(true, B(Blocked::Cordoned))));
        assert!(!exhausted(&blocked(true, B(Blocked::InvalidSpec))));
        assert!(!exhausted(&blocked(true, ConditionReason::Unknown)));
        assert!(!exhausted(&IpamNode::new(NodeName::from("n"), NodeUid(1))));
    }

    /// Each `Blocked` reason as the engine writes it reaches the taint through the object
    /// the API server holds (the operator's status body, read back as the store reads it),
    /// so a renamed reason cannot silently stop tainting: the two that mean "out of
    /// addresses" taint, the others do not.
    #[test]
    fn a_blocked_reason_maps_to_its_taint_through_the_object() {
        use crate::convert::{Target, node_from_api, status_body};
        for b in Blocked::ALL {
            let written = blocked(true, ConditionReason::Blocked(b));
            let target = Target {
                name: "n",
                uid: None,
            };
            let none = crate::convert::Held::default();
            let mut obj = status_body(target, &written.operator.conditions, &none);
            obj["spec"] = serde_json::json!({ "nodeUID": "00000000-0000-0000-0000-000000000001" });
            let obj = serde_json::from_value(obj).expect("an IPAMNode");
            let (read, bad) = node_from_api(&obj);
            assert!(bad.is_empty(), "{bad:?}");
            let want = matches!(b, Blocked::Exhausted | Blocked::AtCap);
            assert_eq!(exhausted(&read.node), want, "{b:?}");
            assert_eq!(
                taints_after(&[], exhausted(&read.node)).is_some(),
                want,
                "{b:?}: the taint follows"
            );
        }
    }
}
