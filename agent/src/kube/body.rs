//! The agent's server-side apply bodies (field manager `tidepool-agent`): the node side's
//! fields on the IPAMNode's status subresource, and a block's answer on the IPAMBlock's.
//! Pure functions. Each body carries every entry the agent owns: under server-side apply an
//! entry the manager stops sending is removed (unless another manager owns it too).

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::{Map, Value, json};
use tidepool_api::convert::{Allocations, from_system};
use tidepool_api::names::{GROUP, VERSION, condition};
use tidepool_ipam::{NodeSideFields, ReclaimOutcome, ReleaseAck};

/// The agent's `AgentReady` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentReady {
    pub ready: bool,
    /// CamelCase, as a condition's reason must be.
    pub reason: String,
    pub message: String,
}

impl AgentReady {
    /// Serving its node.
    pub fn serving() -> Self {
        Self {
            ready: true,
            reason: "Serving".into(),
            message: String::new(),
        }
    }
}

/// Everything the agent publishes: the node side's fields with the strings of their
/// allocations (the engine keeps only their hashes), its condition, and its answers on the
/// node's blocks (by block name).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeSide {
    pub fields: NodeSideFields,
    pub allocations: Allocations,
    pub ready: Option<AgentReady>,
    pub block_acks: BTreeMap<String, ReleaseAck>,
}

impl NodeSide {
    /// What the agent's durable node state says now, with `ready` as its condition.
    pub fn from_state(state: &crate::state::NodeState, ready: Option<AgentReady>) -> Self {
        let mut allocations = Allocations::new();
        let keys = state
            .allocations()
            .map(|(k, _)| k)
            .chain(state.reclaim_acks().values().map(|r| &r.key));
        for k in keys {
            let strings = (k.container_id.as_str().into(), k.ifname.as_str().into());
            allocations.insert(k.id(), strings);
        }
        Self {
            fields: state.node_side(),
            allocations,
            ready,
            block_acks: state.block_release_acks().clone(),
        }
    }
}

fn type_meta(kind: &str, name: &str) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": kind,
        "metadata": { "name": name },
    })
}

fn release_ack(a: ReleaseAck) -> &'static str {
    match a {
        ReleaseAck::ReadyForRelease => "ready-for-release",
        ReleaseAck::DoNotRelease => "do-not-release",
    }
}

/// The apply of the IPAMNode `name`'s status: `used`, `cooldown`, `releaseAck`,
/// `reclaimAck`, `inUse` and the `AgentReady` condition (last changed at `since`). Entries
/// whose allocation strings are unknown cannot be written (containerID and ifname are
/// required) and are left out; the caller's [`Allocations`] should always hold them.
pub fn node_status_body(
    name: &str,
    fields: &NodeSideFields,
    all: &Allocations,
    ready: Option<&AgentReady>,
    since: SystemTime,
) -> Value {
    let used: Map<String, Value> = fields
        .used
        .iter()
        .filter_map(|(a, e)| {
            let (cid, ifname) = all.get(&e.allocation)?;
            let v = json!({
                "podUID": e.pod_uid.to_string(),
                "namespace": &*e.namespace,
                "pod": &*e.pod,
                "containerID": &**cid,
                "ifname": &**ifname,
                "since": from_system(e.since),
            });
            Some((a.to_string(), v))
        })
        .collect();
    let cooldown: Map<String, Value> = fields
        .cooldown
        .iter()
        .map(|(a, until)| (a.to_string(), json!(from_system(*until))))
        .collect();
    let release: Map<String, Value> = fields
        .release_ack
        .iter()
        .map(|(a, v)| (a.to_string(), json!(release_ack(*v))))
        .collect();
    let reclaim: Map<String, Value> = fields
        .reclaim_ack
        .iter()
        .filter_map(|(a, r)| {
            let (cid, ifname) = all.get(&r.allocation)?;
            let outcome = match r.outcome {
                ReclaimOutcome::Reclaimed => "reclaimed",
                ReclaimOutcome::Stale => "stale",
                ReclaimOutcome::Live => "live",
            };
            let v = json!({
                "podUID": r.pod_uid.to_string(),
                "containerID": &**cid,
                "ifname": &**ifname,
                "outcome": outcome,
            });
            Some((a.to_string(), v))
        })
        .collect();
    let in_use = i64::try_from(used.len()).unwrap_or(i64::MAX);
    let mut status = json!({
        "used": used,
        "cooldown": cooldown,
        "releaseAck": release,
        "reclaimAck": reclaim,
        "inUse": in_use,
    });
    if let Some(r) = ready {
        status["conditions"] = json!([{
            "type": condition::AGENT_READY,
            "status": if r.ready { "True" } else { "False" },
            "reason": r.reason,
            "message": r.message,
            "lastTransitionTime": from_system(since),
        }]);
    }
    let mut body = type_meta("IPAMNode", name);
    body["status"] = status;
    body
}

/// The apply of a block's answer (`status.releaseAck`, the node side's); `None` withdraws
/// it (the field is left out, so the agent's ownership and the value go).
pub fn block_status_body(name: &str, ack: Option<ReleaseAck>) -> Value {
    let mut body = type_meta("IPAMBlock", name);
    body["status"] = match ack {
        Some(a) => json!({ "releaseAck": release_ack(a) }),
        None => json!({}),
    };
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use std::sync::Arc;
    use std::time::Duration;
    use tidepool_api as api;
    use tidepool_api::convert::node_from_api;
    use tidepool_ipam::{AllocationId, PodUid, ReclaimAck, UsedEntry};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Whole seconds: the API keeps `metav1.Time` at that precision.
    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn side() -> (NodeSideFields, Allocations) {
        let mut all = Allocations::new();
        let mut f = NodeSideFields::default();
        let id = AllocationId::new("containerd://abc", "eth0");
        all.insert(id, ("containerd://abc".into(), "eth0".into()));
        let old = AllocationId::new("containerd://old", "eth0");
        all.insert(old, ("containerd://old".into(), "eth0".into()));
        let uid = PodUid(0x11111111_2222_4333_8444_555555555555);
        let entry = UsedEntry {
            pod_uid: uid,
            namespace: Arc::from("ns"),
            pod: Arc::from("p"),
            allocation: id,
            since: at(1),
        };
        f.used.insert(ip("10.0.0.2"), entry.clone());
        f.used.insert(ip("fd00::2"), entry);
        f.cooldown.insert(ip("10.0.0.3"), at(60));
        f.release_ack
            .insert(ip("10.0.0.4"), ReleaseAck::ReadyForRelease);
        f.release_ack
            .insert(ip("10.0.0.5"), ReleaseAck::DoNotRelease);
        f.reclaim_ack.insert(
            ip("10.0.0.6"),
            ReclaimAck {
                pod_uid: uid,
                allocation: old,
                outcome: ReclaimOutcome::Stale,
            },
        );
        (f, all)
    }

    #[test]
    fn the_node_status_body_round_trips_through_the_operators_reading() {
        let (fields, all) = side();
        let ready = AgentReady::serving();
        let mut body = node_status_body("n1", &fields, &all, Some(&ready), at(5));
        assert!(body.get("spec").is_none());
        assert_eq!(body["status"]["inUse"], json!(2));
        let c = &body["status"]["conditions"][0];
        assert_eq!(c["type"], json!("AgentReady"));
        assert_eq!(c["status"], json!("True"));
        // the IPAMNode type needs its spec; the status apply does not send one
        body["spec"] = json!({ "nodeUID": "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b" });
        let obj: api::IPAMNode = serde_json::from_value(body).unwrap();
        let (view, bad) = node_from_api(&obj);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(view.node.node, fields);
        // the operator's reading keeps the strings behind every allocation it saw
        for id in view.allocations.keys() {
            assert_eq!(view.allocations.get(id), all.get(id));
        }
    }

    #[test]
    fn an_empty_side_still_sends_every_map_so_old_entries_go() {
        let body = node_status_body(
            "n1",
            &NodeSideFields::default(),
            &Allocations::new(),
            None,
            at(0),
        );
        for f in ["used", "cooldown", "releaseAck", "reclaimAck"] {
            assert_eq!(body["status"][f], json!({}), "{f}");
        }
        assert!(body["status"].get("conditions").is_none());
    }

    #[test]
    fn an_entry_without_its_strings_is_left_out() {
        let (fields, mut all) = side();
        all.clear();
        let body = node_status_body("n1", &fields, &all, None, at(0));
        assert_eq!(body["status"]["used"], json!({}));
        assert_eq!(body["status"]["reclaimAck"], json!({}));
        assert_eq!(
            body["status"]["cooldown"]["10.0.0.3"],
            json!("2027-01-15T08:01:00Z")
        );
    }

    #[test]
    fn the_durable_state_publishes_with_its_strings() {
        use crate::state::{AllocKey, NodeState, PodRef};
        let mut st = NodeState::new("boot-1", Duration::from_secs(30));
        let pod = PodRef {
            uid: PodUid(7),
            namespace: "ns".into(),
            name: "p".into(),
        };
        let key = AllocKey::new("containerd://abc", "eth0");
        st.adopt_allocation(key.clone(), pod, &[ip("10.0.0.2")], None, at(1))
            .unwrap();
        let side = NodeSide::from_state(&st, Some(AgentReady::serving()));
        assert_eq!(side.fields, st.node_side());
        let body = node_status_body("n1", &side.fields, &side.allocations, None, at(2));
        let e = &body["status"]["used"]["10.0.0.2"];
        assert_eq!(e["containerID"], json!("containerd://abc"));
        assert_eq!(e["ifname"], json!("eth0"));
        assert_eq!(e["pod"], json!("p"));
    }

    #[test]
    fn a_block_answer_is_set_and_withdrawn() {
        let b = block_status_body("v4-10-0-0-0-28", Some(ReleaseAck::DoNotRelease));
        assert_eq!(b["kind"], json!("IPAMBlock"));
        assert_eq!(b["status"]["releaseAck"], json!("do-not-release"));
        let obj: api::IPAMBlockStatus = serde_json::from_value(b["status"].clone()).unwrap();
        assert_eq!(obj.release_ack, Some(api::BlockAck::DoNotRelease));
        let none = block_status_body("v4-10-0-0-0-28", None);
        assert_eq!(none["status"], json!({}));
    }
}
