//! The engine's values as the objects spell them, for the writers' apply bodies (the
//! operator's and the agent's build their bodies from these and the typed objects, so no
//! writer spells a mark, an answer or a reason by hand), and the envelope every apply body
//! shares.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Value, json};
use tidepool_ipam::{ReclaimOutcome, ReclaimReason, ReleaseAck, ReleaseState};

use super::time::from_system;
use crate as api;
use crate::names::{GROUP, VERSION};

impl From<ReleaseState> for api::AddressRelease {
    fn from(s: ReleaseState) -> Self {
        match s {
            ReleaseState::MarkedForRelease => Self::MarkedForRelease,
            ReleaseState::Released => Self::Released,
        }
    }
}

impl From<ReleaseAck> for api::ReleaseAnswer {
    fn from(a: ReleaseAck) -> Self {
        match a {
            ReleaseAck::ReadyForRelease => Self::ReadyForRelease,
            ReleaseAck::DoNotRelease => Self::DoNotRelease,
        }
    }
}

impl From<ReleaseAck> for api::BlockAck {
    fn from(a: ReleaseAck) -> Self {
        match a {
            ReleaseAck::ReadyForRelease => Self::ReadyForRelease,
            ReleaseAck::DoNotRelease => Self::DoNotRelease,
        }
    }
}

impl From<ReclaimReason> for api::ReclaimReason {
    fn from(r: ReclaimReason) -> Self {
        match r {
            ReclaimReason::PodDeleted => Self::PodDeleted,
            ReclaimReason::PodTerminal => Self::PodTerminal,
            ReclaimReason::SandboxReplaced => Self::SandboxReplaced,
            ReclaimReason::NodeDeleted => Self::NodeDeleted,
        }
    }
}

impl From<ReclaimOutcome> for api::ReclaimOutcome {
    fn from(o: ReclaimOutcome) -> Self {
        match o {
            ReclaimOutcome::Reclaimed => Self::Reclaimed,
            ReclaimOutcome::Stale => Self::Stale,
            ReclaimOutcome::Live => Self::Live,
        }
    }
}

/// A condition as the objects carry it (`status` "True" or "False", the transition time
/// in whole seconds).
pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    since: SystemTime,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: from_system(since),
        observed_generation: None,
    }
}

/// The part every apply body starts with: the object's kind and name, and its `metadata.uid`
/// when the apply is for that very object (the server then refuses the apply when the
/// object is gone or replaced, instead of creating one).
pub fn apply_envelope(kind: &str, name: &str, uid: Option<&str>) -> Value {
    let mut v = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": kind,
        "metadata": { "name": name },
    });
    if let Some(uid) = uid {
        v["metadata"]["uid"] = json!(uid);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::node::{reclaim_outcome, reclaim_reason, release_ack, release_state};

    /// Every value a writer sends reads back as itself (the reading side is
    /// `convert::node`'s and `convert::block`'s), through the JSON the server stores.
    #[test]
    fn what_is_written_reads_back_as_itself() {
        for s in [ReleaseState::MarkedForRelease, ReleaseState::Released] {
            let v = serde_json::to_value(api::AddressRelease::from(s)).expect("json");
            let back: api::AddressRelease = serde_json::from_value(v).expect("read");
            assert_eq!(release_state(back), Some(s));
        }
        for a in [ReleaseAck::ReadyForRelease, ReleaseAck::DoNotRelease] {
            let v = serde_json::to_value(api::ReleaseAnswer::from(a)).expect("json");
            let back: api::ReleaseAnswer = serde_json::from_value(v.clone()).expect("read");
            assert_eq!(release_ack(back), Some(a));
            let block: api::BlockAck = serde_json::from_value(v).expect("a block answer");
            assert_eq!(block, api::BlockAck::from(a));
        }
        for r in [
            ReclaimReason::PodDeleted,
            ReclaimReason::PodTerminal,
            ReclaimReason::SandboxReplaced,
            ReclaimReason::NodeDeleted,
        ] {
            let v = serde_json::to_value(api::ReclaimReason::from(r)).expect("json");
            assert_eq!(
                v,
                json!(r.as_str()),
                "the reason's string is the metric label's"
            );
            let back: api::ReclaimReason = serde_json::from_value(v).expect("read");
            assert_eq!(reclaim_reason(back), Some(r));
        }
        for o in [
            ReclaimOutcome::Reclaimed,
            ReclaimOutcome::Stale,
            ReclaimOutcome::Live,
        ] {
            let v = serde_json::to_value(api::ReclaimOutcome::from(o)).expect("json");
            let back: api::ReclaimOutcome = serde_json::from_value(v).expect("read");
            assert_eq!(reclaim_outcome(back), Some(o));
        }
    }

    #[test]
    fn a_condition_is_spelled_as_kubernetes_spells_it() {
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_400);
        let c = serde_json::to_value(condition("Ready", false, "Why", "what", at)).expect("json");
        assert_eq!(
            c,
            json!({"type": "Ready", "status": "False", "reason": "Why", "message": "what",
                   "lastTransitionTime": "2023-11-14T22:13:20Z"})
        );
    }

    #[test]
    fn the_envelope_names_the_object_and_its_uid_when_given() {
        let v = apply_envelope("IPAMBlock", "b", Some("u"));
        assert_eq!(v["apiVersion"], json!(format!("{GROUP}/{VERSION}")));
        assert_eq!(v["kind"], json!("IPAMBlock"));
        assert_eq!(v["metadata"], json!({"name": "b", "uid": "u"}));
        assert_eq!(
            apply_envelope("IPAMNode", "n", None)["metadata"],
            json!({"name": "n"})
        );
    }
}
