//! IPAMNode: the operator's two apply bodies (spec, and `status` through its subresource:
//! one write each per pass). Reading the object is [`tidepool_api::convert`]'s.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use tidepool_api as api;
use tidepool_api::convert::{Allocations, HeldCount, NodeView, apply_envelope, condition};
use tidepool_api::names::FINALIZER;

use tidepool_ipam::{Condition, Family, NodeUid, OperatorFields};

/// Which IPAMNode a body is for: its name and its `metadata.uid` (None: the body creates it).
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub name: &'a str,
    pub uid: Option<&'a str>,
}

/// The operator's server-side apply of an IPAMNode's spec (and its finalizer): every field
/// the operator owns, so a field it stops applying goes. It is forced, so it holds only
/// those (`nodeUID`, `addresses`, `release`, `reclaim`), never `pools` or `watermarks`,
/// which are the users'. Tombstones whose allocation strings are unknown (the entry they
/// name is gone from the object) are left out: the node side has nothing of them to take
/// back.
pub fn spec_body(
    to: Target<'_>,
    node_uid: NodeUid,
    fields: &OperatorFields,
    all: &Allocations,
) -> Value {
    let reclaim = (fields.reclaim.iter())
        .filter_map(|(a, t)| {
            let names = all.get(&t.allocation)?;
            let v = api::TombstoneSpec {
                pod_uid: t.pod_uid.to_string(),
                container_id: names.container_id(),
                ifname: names.ifname().to_string(),
                reason: t.reason.into(),
            };
            Some((a.to_string(), v))
        })
        .collect();
    let spec = api::IPAMNodeSpec {
        node_uid: node_uid.to_string(),
        pools: None,
        watermarks: None,
        addresses: fields.addresses.iter().map(|a| a.to_string()).collect(),
        release: (fields.release.iter())
            .map(|(a, s)| (a.to_string(), (*s).into()))
            .collect(),
        reclaim,
    };
    let mut body = apply_envelope("IPAMNode", to.name, to.uid);
    body["metadata"]["finalizers"] = json!([FINALIZER]);
    body["spec"] = serde_json::to_value(spec).expect("a spec serializes");
    body
}

/// What the operator records of the addresses a node holds: their count, the pools they
/// come from (its blocks' `spec.pool`, sorted, each once), and per pool and family what it
/// holds and uses and whether it is blocked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    pub count: HeldCount,
    pub pools: Vec<String>,
    /// `status.poolUsage`, sorted by pool and family.
    pub usage: Vec<api::NodePoolUsage>,
}

impl Held {
    /// The object records exactly this (`status.allocated`, `ipv4`/`ipv6`, `pools`,
    /// `poolUsage`).
    pub fn recorded_in(&self, view: &NodeView) -> bool {
        view.allocated == Some(self.count)
            && view.held_pools == self.pools
            && view.pool_usage == self.usage
    }
}

/// Per pool and family: addresses held and used, and whether blocked.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolTally {
    pub allocated: u128,
    pub used: u64,
    pub blocked: bool,
}

/// `status.poolUsage` of `tally`, in its (pool, family) order.
pub fn pool_usage(tally: &BTreeMap<(String, Family), PoolTally>) -> Vec<api::NodePoolUsage> {
    (tally.iter())
        .map(|((name, family), t)| api::NodePoolUsage {
            name: name.clone(),
            family: family.as_str().to_string(),
            allocated: t.allocated.to_string(),
            used: t.used.to_string(),
            blocked: t.blocked,
        })
        .collect()
}

/// The operator's apply of an IPAMNode's status (through `/status`): its conditions, the
/// count of addresses the node holds: exact per family (`ipv4.allocated`, `ipv6.allocated`,
/// both always) and clamped in the int64 `allocated` (a printer column), the pools they
/// come from (`pools`, a printer column; left out when none, so the field goes), and per
/// pool and family (`poolUsage`).
pub fn status_body(to: Target<'_>, conditions: &[Condition], held: &Held) -> Value {
    let count = held.count;
    let usage = |n: u128| {
        Some(api::NodeUsage {
            allocated: Some(n.to_string()),
            used: None,
        })
    };
    let status = api::IPAMNodeStatus {
        allocated: Some(count.clamped()),
        ipv4: usage(count.v4),
        ipv6: usage(count.v6),
        pools: held.pools.clone(),
        pool_usage: held.usage.clone(),
        // none: no `conditions` key (left out when empty), which on a real server owns
        // nothing either (an empty associative list records no ownership), and never claims
        // the list the agent's `AgentReady` item is in
        conditions: (conditions.iter())
            .map(|c| {
                let (type_, reason) = (c.type_.as_str(), c.reason.as_str());
                condition(type_, c.status, reason, &c.message, c.last_transition)
            })
            .collect(),
        ..api::IPAMNodeStatus::default()
    };
    let mut body = apply_envelope("IPAMNode", to.name, to.uid);
    body["status"] = serde_json::to_value(status).expect("a status serializes");
    body
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use tidepool_api as api;
    use tidepool_api::convert::node_from_api;
    use tidepool_ipam::{AllocationId, PodUid, ReclaimReason, Tombstone};

    fn node(v: Value) -> api::IPAMNode {
        serde_json::from_value(v).expect("an IPAMNode")
    }

    const UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
    const POD: &str = "11111111-2222-4333-8444-555555555555";

    fn busy_node() -> api::IPAMNode {
        node(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": { "name": "n1", "resourceVersion": "42", "finalizers": [FINALIZER] },
            "spec": {
                "nodeUID": UID,
                "addresses": ["10.0.0.1", "10.0.0.2", "not-an-ip"],
                "release": { "10.0.0.2": "marked-for-release" },
                "reclaim": { "10.0.0.1": { "podUID": POD, "containerID": "c1", "ifname": "eth0", "reason": "pod-deleted" } },
            },
            "status": {
                "used": {
                    "10.0.0.1": { "podUID": POD, "namespace": "ns", "pod": "p", "containerID": "c1", "ifname": "eth0", "since": "2026-11-24T10:00:00Z" },
                    "10.0.0.9": { "podUID": "nope", "namespace": "ns", "pod": "q", "containerID": "c2", "ifname": "eth0", "since": "2026-11-24T10:00:00Z" },
                },
                "releaseAck": { "10.0.0.2": "ready-for-release" },
                "conditions": [
                    { "type": "Blocked", "status": "True", "reason": "Exhausted", "message": "m", "lastTransitionTime": "2026-11-24T10:00:00Z" },
                    { "type": "AgentReady", "status": "True", "reason": "Serving", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z" },
                ],
            },
        }))
    }

    #[test]
    fn the_spec_body_carries_the_operators_fields_and_round_trips() {
        let (v, _) = node_from_api(&busy_node());
        let to = Target {
            name: "n1",
            uid: Some(UID),
        };
        let body = spec_body(to, v.node.node_uid, &v.node.operator, &v.allocations);
        assert_eq!(body["metadata"]["finalizers"], json!([FINALIZER]));
        assert_eq!(body["metadata"]["uid"], json!(UID));
        let spec: Vec<&String> = body["spec"].as_object().unwrap().keys().collect();
        assert_eq!(
            spec,
            ["addresses", "nodeUID", "reclaim", "release"],
            "never pools or watermarks"
        );
        assert_eq!(body["spec"]["nodeUID"], json!(UID));
        assert_eq!(
            body["spec"]["release"]["10.0.0.2"],
            json!("marked-for-release")
        );
        assert_eq!(
            body["spec"]["reclaim"]["10.0.0.1"]["containerID"],
            json!("c1")
        );
        let back: api::IPAMNode = serde_json::from_value(body).unwrap();
        let (again, bad) = node_from_api(&back);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(again.node.operator.addresses, v.node.operator.addresses);
        assert_eq!(again.node.operator.reclaim, v.node.operator.reclaim);
        assert_eq!(again.node.operator.release, v.node.operator.release);
    }

    #[test]
    fn a_tombstone_whose_allocation_is_unknown_is_left_out() {
        let (v, _) = node_from_api(&busy_node());
        let mut fields = v.node.operator.clone();
        let a: IpAddr = "10.0.0.7".parse().unwrap();
        fields.reclaim.insert(
            a,
            Tombstone {
                pod_uid: PodUid(1),
                allocation: AllocationId(99),
                reason: ReclaimReason::PodDeleted,
            },
        );
        let to = Target {
            name: "n1",
            uid: None,
        };
        let body = spec_body(to, NodeUid(1), &fields, &v.allocations);
        assert!(body["metadata"].get("uid").is_none());
        assert!(body["spec"]["reclaim"].get("10.0.0.7").is_none());
        assert!(body["spec"]["reclaim"].get("10.0.0.1").is_some());
    }

    #[test]
    fn the_status_body_holds_conditions_and_the_count() {
        let (v, _) = node_from_api(&busy_node());
        let to = Target {
            name: "n1",
            uid: Some(UID),
        };
        let held = Held {
            count: HeldCount {
                v4: 16,
                v6: 1 << 64,
            },
            pools: vec!["default".into(), "v6".into()],
            usage: pool_usage(&BTreeMap::from([
                (
                    ("blue".to_string(), Family::V4),
                    PoolTally {
                        allocated: 0,
                        used: 0,
                        blocked: true,
                    },
                ),
                (
                    ("v6".to_string(), Family::V6),
                    PoolTally {
                        allocated: 1 << 64,
                        used: 2,
                        blocked: false,
                    },
                ),
            ])),
        };
        let body = status_body(to, &v.node.operator.conditions, &held);
        assert_eq!(
            body["status"]["poolUsage"],
            json!([
                { "name": "blue", "family": "ipv4", "allocated": "0", "used": "0", "blocked": true },
                { "name": "v6", "family": "ipv6", "allocated": "18446744073709551616", "used": "2",
                  "blocked": false },
            ])
        );
        assert_eq!(body["metadata"]["uid"], json!(UID));
        assert_eq!(body["status"]["allocated"], json!(i64::MAX));
        assert_eq!(body["status"]["ipv4"], json!({ "allocated": "16" }));
        assert_eq!(
            body["status"]["ipv6"],
            json!({ "allocated": "18446744073709551616" })
        );
        // read back, the count is what was written: nothing looks stale
        let mut obj = busy_node();
        obj.status = serde_json::from_value(body["status"].clone()).unwrap();
        assert_eq!(body["status"]["pools"], json!(["default", "v6"]));
        assert!(held.recorded_in(&node_from_api(&obj).0));
        let other = Held {
            pools: vec!["default".into()],
            ..held.clone()
        };
        assert!(
            !other.recorded_in(&node_from_api(&obj).0),
            "a pool less is a change"
        );
        let (read, _) = node_from_api(&obj);
        assert_eq!(
            read.node.operator.blocked_pools,
            [tidepool_ipam::BlockedPool {
                pool: "blue".into(),
                family: Family::V4
            }],
            "the blocked pools read back as written"
        );
        let mut unblocked = held.clone();
        unblocked.usage[0].blocked = false;
        assert!(
            !unblocked.recorded_in(&read),
            "a pool unblocked is a change"
        );
        assert_eq!(body["status"]["conditions"][0]["type"], json!("Blocked"));
        assert_eq!(
            body["status"]["conditions"][0]["lastTransitionTime"],
            json!("2026-11-24T10:00:00Z")
        );
        assert!(body.get("spec").is_none());
        let count = HeldCount { v4: 3, v6: 0 };
        let pools = Vec::new();
        let usage = Vec::new();
        let none = status_body(
            to,
            &[],
            &Held {
                count,
                pools,
                usage,
            },
        );
        assert!(none["status"].get("conditions").is_none(), "{none}");
        assert!(none["status"].get("pools").is_none(), "{none}");
        assert!(none["status"].get("poolUsage").is_none(), "{none}");
    }
}
