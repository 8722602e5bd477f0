//! The agent's server-side apply bodies (field manager `tidepool-agent`): the node side's
//! fields on the IPAMNode's status subresource, and a block's answer on the IPAMBlock's.
//! Pure functions. Each body carries every entry the agent owns: under server-side apply an
//! entry the manager stops sending is removed (unless another manager owns it too).

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::Value;
use tidepool_api as api;
use tidepool_api::convert::{AllocationNames, Allocations, apply_envelope, condition, from_system};
use tidepool_api::names::condition::AGENT_READY;
use tidepool_ipam::{NodeSideFields, ReleaseAck};

use crate::state::AddrPools;

/// The agent's `AgentReady` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentReady {
    pub ready: bool,
    /// CamelCase, as a condition's reason must be.
    pub reason: String,
    pub message: String,
}

impl AgentReady {
    /// Restoring its node's state; not serving yet.
    pub fn starting() -> Self {
        Self::not_ready("Starting", "the agent restores its node's state")
    }

    /// Serving its node: its socket takes the plugin's requests.
    pub fn serving() -> Self {
        Self {
            ready: true,
            reason: "Serving".into(),
            message: String::new(),
        }
    }

    /// Stopped cleanly (a rollout, a drain): the next agent takes over.
    pub fn stopped() -> Self {
        Self::not_ready("Stopped", "the agent stopped")
    }

    /// Stopped by an error (`why`): a socket it cannot bind, routes it cannot keep.
    pub fn failed(why: &str) -> Self {
        Self::not_ready("Failed", why)
    }

    fn not_ready(reason: &str, message: &str) -> Self {
        Self {
            ready: false,
            reason: reason.into(),
            message: message.into(),
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
    /// The pool of each address that has one recorded (`status.used[addr].pool`).
    pub pools: AddrPools,
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
            let names = AllocationNames::new(&k.container_id, k.ifname.as_str());
            allocations.insert(k.id(), names);
        }
        Self {
            fields: state.node_side(),
            allocations,
            pools: state.pools(),
            ready,
            block_acks: state.block_release_acks().clone(),
        }
    }
}

/// The apply of the IPAMNode `name`'s status: `used`, `cooldown`, `releaseAck`,
/// `reclaimAck`, `inUse`, `ipv4.used` and `ipv6.used` (both always; the operator owns their
/// `allocated`) and the `AgentReady` condition (last changed at `since`). Entries
/// whose allocation strings are unknown cannot be written (containerID and ifname are
/// required) and are left out; the caller's [`Allocations`] should always hold them. An
/// entry's `pool` is its address's in `pools` (none: the pool whose block holds it).
pub fn node_status_body(
    name: &str,
    fields: &NodeSideFields,
    all: &Allocations,
    pools: &AddrPools,
    ready: Option<&AgentReady>,
    since: SystemTime,
) -> Value {
    let used: BTreeMap<String, api::UsedEntry> = fields
        .used
        .iter()
        .filter_map(|(a, e)| {
            let names = all.get(&e.allocation)?;
            let v = api::UsedEntry {
                pod_uid: e.pod_uid.to_string(),
                namespace: e.pod.namespace().to_string(),
                pod: e.pod.name().to_string(),
                container_id: names.container_id(),
                ifname: names.ifname().to_string(),
                since: from_system(e.since.into()),
                pool: pools.get(&a).map(|p| p.to_string()),
            };
            Some((a.to_string(), v))
        })
        .collect();
    let reclaim_ack = fields
        .reclaim_ack
        .iter()
        .filter_map(|(a, r)| {
            let names = all.get(&r.allocation)?;
            let v = api::ReclaimAnswer {
                pod_uid: r.pod_uid.to_string(),
                container_id: names.container_id(),
                ifname: names.ifname().to_string(),
                outcome: r.outcome.into(),
            };
            Some((a.to_string(), v))
        })
        .collect();
    let v4 = (used.keys())
        .filter(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
        .count();
    let usage = |n: usize| {
        Some(api::NodeUsage {
            allocated: None,
            used: Some(n.to_string()),
        })
    };
    let status = api::IPAMNodeStatus {
        in_use: Some(i64::try_from(used.len()).unwrap_or(i64::MAX)),
        ipv4: usage(v4),
        ipv6: usage(used.len() - v4),
        used,
        cooldown: (fields.cooldown.iter())
            .map(|(a, until)| (a.to_string(), from_system(*until)))
            .collect(),
        release_ack: (fields.release_ack.iter())
            .map(|(a, v)| (a.to_string(), (*v).into()))
            .collect(),
        reclaim_ack,
        allocated: None,
        pools: Vec::new(),
        pool_usage: Vec::new(),
        conditions: ready
            .map(|r| condition(AGENT_READY, r.ready, &r.reason, &r.message, since))
            .into_iter()
            .collect(),
    };
    let mut body = apply_envelope("IPAMNode", name, None);
    body["status"] = serde_json::to_value(status).expect("a status serializes");
    // Every map the agent owns is sent, an empty one too: under server-side apply the empty
    // map keeps the agent the owner of the field and clears the entries it owned.
    for owned in ["used", "cooldown", "releaseAck", "reclaimAck"] {
        body["status"]
            .as_object_mut()
            .expect("a status is an object")
            .entry(owned)
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
    }
    body
}

/// The apply of a block's answer (`status.releaseAck`, the node side's); `None` withdraws
/// it (the field is left out, so the agent's ownership and the value go).
pub fn block_status_body(name: &str, ack: Option<ReleaseAck>) -> Value {
    let status = api::IPAMBlockStatus {
        release_ack: ack.map(Into::into),
    };
    let mut body = apply_envelope("IPAMBlock", name, None);
    body["status"] = serde_json::to_value(status).expect("a status serializes");
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::net::IpAddr;
    use std::time::Duration;
    use tidepool_api::convert::node_from_api;
    use tidepool_ipam::{AllocationId, PodUid, ReclaimAck, ReclaimOutcome, UsedEntry};

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
        all.insert(id, AllocationNames::new("containerd://abc", "eth0"));
        let old = AllocationId::new("containerd://old", "eth0");
        all.insert(old, AllocationNames::new("containerd://old", "eth0"));
        let uid = PodUid(0x11111111_2222_4333_8444_555555555555);
        let entry = UsedEntry {
            pod_uid: uid,
            pod: tidepool_ipam::PodName::new("ns", "p"),
            allocation: id,
            since: at(1).into(),
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
        let mut body =
            node_status_body("n1", &fields, &all, &AddrPools::new(), Some(&ready), at(5));
        assert!(body.get("spec").is_none());
        assert_eq!(body["status"]["inUse"], json!(2));
        assert_eq!(body["status"]["ipv4"], json!({ "used": "1" }));
        assert_eq!(body["status"]["ipv6"], json!({ "used": "1" }));
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
            &AddrPools::new(),
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
        let body = node_status_body("n1", &fields, &all, &AddrPools::new(), None, at(0));
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
        let body = node_status_body(
            "n1",
            &side.fields,
            &side.allocations,
            &side.pools,
            None,
            at(2),
        );
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
