//! IPAMNode: the object as the engine reads it (the operator's store and the agent's watch
//! read it alike).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use crate as api;
use crate::names::{FINALIZER, condition};
use tidepool_ipam::{
    AddrMap, AddrSet, AllocationId, BlockedPool, Condition, ConditionReason, ConditionType, Family,
    FewByAddr, IpamNode, NodeName, NodeSideFields, NodeUid, OperatorFields, PodName, PodUid,
    ReclaimAck, ReclaimOutcome, ReclaimReason, ReleaseAck, ReleaseState, ResourceVersion,
    Tombstone, UsedEntry, WatermarkOverrides,
};

use super::names::{AllocationNames, Strings};
use super::time::to_system;
use super::uid::{parse_uid, spec_node_uid};
use super::{Malformed, Report};

/// The (containerID, ifname) behind each allocation ID the object names: the engine keeps
/// only the IDs, a tombstone written back needs the strings.
pub type Allocations = BTreeMap<AllocationId, AllocationNames>;

/// What reading one object collects beside the engine's fields: its allocations' strings,
/// and one copy of each string its entries repeat.
#[derive(Default)]
struct Collected {
    allocations: Allocations,
    strings: Strings,
}

/// An IPAMNode as the store keeps it: the engine's copy and the strings of its allocations.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub node: Arc<IpamNode>,
    /// `metadata.uid`: every apply to the object carries it, so that an apply after the
    /// object was deleted, or replaced by another of that name, is refused (never creates).
    pub uid: Option<String>,
    pub allocations: Allocations,
    /// `status.used[addr].pool` of the entries `node` holds that name one: the pool the
    /// entry's pod resolved to at its ADD (an entry without one belongs to the pool whose
    /// block holds its address).
    pub used_pools: BTreeMap<IpAddr, Arc<str>>,
    /// The object is being deleted (`deletionTimestamp` set).
    pub terminating: bool,
    /// The operator's count as last written (None: not all of its fields are there, or
    /// they disagree).
    pub allocated: Option<HeldCount>,
    /// `status.pools` as last written: the pools the operator found the node's blocks in.
    pub held_pools: Vec<String>,
    /// `status.poolUsage` as last written.
    pub pool_usage: Vec<api::NodePoolUsage>,
    /// `spec.pools`: the pool per family a user set for the node (None: by selector, or
    /// `default`).
    pub pools: tidepool_ipam::PerFamily<Option<String>>,
    /// The node side's `AgentReady` condition (None: its agent never wrote one). The
    /// operator only reads it, to tell why a node's pods wait.
    pub agent_ready: Option<AgentReady>,
}

/// Addresses a node holds (its blocks' and `spec.addresses`), per family, exact. The
/// operator writes it as `status.ipv4.allocated` and `status.ipv6.allocated` (decimal
/// strings) and as the int64 `status.allocated`, their sum clamped ([`Self::clamped`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldCount {
    pub v4: u128,
    pub v6: u128,
}

impl HeldCount {
    /// Adds the addresses of `set`, saturating.
    pub fn add(&mut self, set: &AddrSet) {
        self.v4 = self.v4.saturating_add(set.len(tidepool_ipam::Family::V4));
        self.v6 = self.v6.saturating_add(set.len(tidepool_ipam::Family::V6));
    }

    /// `status.allocated`: the sum, clamped to the int64 maximum.
    pub fn clamped(self) -> i64 {
        i64::try_from(self.v4.saturating_add(self.v6)).unwrap_or(i64::MAX)
    }

    /// The count as `status` records it: all three fields there and agreeing, else None
    /// (so an object an older operator wrote, with `status.allocated` only, is rewritten).
    fn recorded(status: &api::IPAMNodeStatus) -> Option<Self> {
        let family = |u: Option<&api::NodeUsage>| u?.allocated.as_deref()?.parse::<u128>().ok();
        let held = Self {
            v4: family(status.ipv4.as_ref())?,
            v6: family(status.ipv6.as_ref())?,
        };
        (status.allocated == Some(held.clamped())).then_some(held)
    }
}

/// The node side's `AgentReady` condition as last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentReady {
    pub ready: bool,
    pub reason: String,
    pub message: String,
}

/// `status.conditions[type=AgentReady]`, if the agent wrote it.
fn agent_ready(obj: &api::IPAMNode) -> Option<AgentReady> {
    let c = obj
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == condition::AGENT_READY)?;
    Some(AgentReady {
        ready: c.status == "True",
        reason: c.reason.clone(),
        message: c.message.clone(),
    })
}

/// The engine's view of an IPAMNode, with what could not be read.
pub fn node_from_api(obj: &api::IPAMNode) -> (NodeView, Vec<Malformed>) {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let object = format!("ipamnode/{name}");
    let mut r = Report::new(&object);
    let mut c = Collected::default();
    let node_uid = spec_node_uid(&mut r, &obj.spec.node_uid);
    let node = IpamNode {
        name: NodeName::from(name.as_str()),
        node_uid: node_uid.unwrap_or(NodeUid::UNKNOWN),
        resource_version: obj
            .metadata
            .resource_version
            .as_deref()
            .map(ResourceVersion::server),
        watermarks: watermarks(obj.spec.watermarks.as_ref(), &mut r),
        operator: operator_fields(obj, &mut r, &mut c),
        node: node_side(obj, &mut r, &mut c),
        finalizer: obj
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER)),
        deleting: obj.metadata.deletion_timestamp.is_some(),
    };
    let view = NodeView {
        used_pools: used_pools(obj, &node.node, &mut c.strings),
        node: Arc::new(node),
        uid: obj.metadata.uid.clone(),
        allocations: c.allocations,
        terminating: obj.metadata.deletion_timestamp.is_some(),
        allocated: obj.status.as_ref().and_then(HeldCount::recorded),
        held_pools: obj
            .status
            .as_ref()
            .map(|s| s.pools.clone())
            .unwrap_or_default(),
        pool_usage: (obj.status.as_ref())
            .map(|s| s.pool_usage.clone())
            .unwrap_or_default(),
        pools: tidepool_ipam::PerFamily {
            v4: obj.spec.pools.as_ref().and_then(|p| p.ipv4.clone()),
            v6: obj.spec.pools.as_ref().and_then(|p| p.ipv6.clone()),
        },
        agent_ready: agent_ready(obj),
    };
    (view, r.finish())
}

/// The pools `status.used` names, of the entries `side` took.
fn used_pools(
    obj: &api::IPAMNode,
    side: &NodeSideFields,
    strings: &mut Strings,
) -> BTreeMap<IpAddr, Arc<str>> {
    let used = obj.status.iter().flat_map(|s| &s.used);
    let named = used.filter_map(|(k, e)| Some((k.parse().ok()?, e.pool.as_deref()?)));
    named
        .filter(|(a, _)| side.used.contains_key(a))
        .map(|(a, p)| (a, strings.get(p)))
        .collect()
}

fn addr(r: &mut Report<'_>, field: &str, key: &str) -> Option<IpAddr> {
    key.parse()
        .ok()
        .or_else(|| r.bad(format!("{field}[{key:?}]"), "not an IP address"))
}

fn pod_uid(r: &mut Report<'_>, field: &str, key: &str, uid: &str) -> Option<PodUid> {
    parse_uid(uid).map(PodUid).or_else(|| {
        r.bad(
            format!("{field}[{key:?}].podUID"),
            format!("{uid:?} is not a UID"),
        )
    })
}

/// The allocation ID of (containerID, ifname), remembering the strings.
fn allocation(c: &mut Collected, container_id: &str, ifname: &str) -> AllocationId {
    let id = AllocationId::new(container_id, ifname);
    if !c.allocations.contains_key(&id) {
        let names = AllocationNames::new(container_id, c.strings.get(ifname));
        c.allocations.insert(id, names);
    }
    id
}

fn watermarks(w: Option<&api::Watermarks>, r: &mut Report<'_>) -> WatermarkOverrides {
    let Some(w) = w else {
        return WatermarkOverrides::default();
    };
    let mut one = |field: &str, v: Option<i64>| {
        v.and_then(|v| {
            u32::try_from(v).ok().or_else(|| {
                r.bad(
                    format!("spec.watermarks.{field}"),
                    format!("{v} is out of range"),
                )
            })
        })
    };
    WatermarkOverrides {
        pre_allocate: one("preAllocate", w.pre_allocate),
        min_allocate: one("minAllocate", w.min_allocate),
        max_allocate: one("maxAllocate", w.max_allocate),
        max_above_watermark: one("maxAboveWatermark", w.max_above_watermark),
    }
}

fn operator_fields(obj: &api::IPAMNode, r: &mut Report<'_>, c: &mut Collected) -> OperatorFields {
    let spec = &obj.spec;
    let addresses: AddrSet = spec
        .addresses
        .iter()
        .filter_map(|a| addr(r, "spec.addresses", a))
        .collect();
    let mut release = AddrMap::new();
    for (k, v) in &spec.release {
        if let (Some(a), Some(v)) = (addr(r, "spec.release", k), release_state(*v)) {
            release.insert(a, v);
        }
    }
    let mut reclaim = BTreeMap::new();
    for (k, t) in &spec.reclaim {
        let (Some(a), Some(uid), Some(reason)) = (
            addr(r, "spec.reclaim", k),
            pod_uid(r, "spec.reclaim", k, &t.pod_uid),
            reclaim_reason(t.reason),
        ) else {
            continue;
        };
        let tomb = Tombstone {
            pod_uid: uid,
            allocation: allocation(c, &t.container_id, &t.ifname),
            reason,
        };
        reclaim.insert(a, tomb);
    }
    let conditions = obj
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .filter_map(operator_condition)
        .collect();
    OperatorFields {
        addresses: Arc::new(addresses),
        release,
        reclaim,
        conditions,
        blocked_pools: blocked_pools(obj),
    }
}

/// The pools `status.poolUsage` says are blocked, sorted (an item of a family this build
/// does not know is left out).
fn blocked_pools(obj: &api::IPAMNode) -> Vec<BlockedPool> {
    let usage = obj.status.iter().flat_map(|s| &s.pool_usage);
    let mut out: Vec<BlockedPool> = (usage.filter(|u| u.blocked))
        .filter_map(|u| {
            let family = Family::ALL.into_iter().find(|f| f.as_str() == u.family)?;
            let pool = u.name.as_str().into();
            Some(BlockedPool { pool, family })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn node_side(obj: &api::IPAMNode, r: &mut Report<'_>, c: &mut Collected) -> NodeSideFields {
    let mut side = NodeSideFields::default();
    let Some(st) = &obj.status else {
        return side;
    };
    for (k, e) in &st.used {
        let (Some(a), Some(uid)) = (
            addr(r, "status.used", k),
            pod_uid(r, "status.used", k, &e.pod_uid),
        ) else {
            continue;
        };
        let entry = UsedEntry {
            pod_uid: uid,
            pod: PodName::new(&e.namespace, &e.pod),
            allocation: allocation(c, &e.container_id, &e.ifname),
            since: to_system(&e.since).into(),
        };
        side.used.insert(a, entry);
    }
    // each map in one allocation of its size (`reserve` would round up to 4 entries): a
    // cache holds these for every node
    side.cooldown = FewByAddr::with_capacity(st.cooldown.len());
    side.reclaim_ack = FewByAddr::with_capacity(st.reclaim_ack.len());
    for (k, t) in &st.cooldown {
        if let Some(a) = addr(r, "status.cooldown", k) {
            side.cooldown.insert(a, to_system(t));
        }
    }
    for (k, v) in &st.release_ack {
        if let (Some(a), Some(v)) = (addr(r, "status.releaseAck", k), release_ack(*v)) {
            side.release_ack.insert(a, v);
        }
    }
    for (k, v) in &st.reclaim_ack {
        let (Some(a), Some(uid), Some(outcome)) = (
            addr(r, "status.reclaimAck", k),
            pod_uid(r, "status.reclaimAck", k, &v.pod_uid),
            reclaim_outcome(v.outcome),
        ) else {
            continue;
        };
        let ack = ReclaimAck {
            pod_uid: uid,
            allocation: allocation(c, &v.container_id, &v.ifname),
            outcome,
        };
        side.reclaim_ack.insert(a, ack);
    }
    side
}

// A value a later release writes (`Unknown`) is read as no mark, no answer, no tombstone:
// the entry is left out, as if not written yet.

pub(super) fn release_state(v: api::AddressRelease) -> Option<ReleaseState> {
    match v {
        api::AddressRelease::MarkedForRelease => Some(ReleaseState::MarkedForRelease),
        api::AddressRelease::Released => Some(ReleaseState::Released),
        api::AddressRelease::Unknown => None,
    }
}

pub(super) fn release_ack(v: api::ReleaseAnswer) -> Option<ReleaseAck> {
    match v {
        api::ReleaseAnswer::ReadyForRelease => Some(ReleaseAck::ReadyForRelease),
        api::ReleaseAnswer::DoNotRelease => Some(ReleaseAck::DoNotRelease),
        api::ReleaseAnswer::Unknown => None,
    }
}

pub(super) fn reclaim_reason(v: api::ReclaimReason) -> Option<ReclaimReason> {
    match v {
        api::ReclaimReason::PodDeleted => Some(ReclaimReason::PodDeleted),
        api::ReclaimReason::PodTerminal => Some(ReclaimReason::PodTerminal),
        api::ReclaimReason::SandboxReplaced => Some(ReclaimReason::SandboxReplaced),
        api::ReclaimReason::NodeDeleted => Some(ReclaimReason::NodeDeleted),
        api::ReclaimReason::Unknown => None,
    }
}

pub(super) fn reclaim_outcome(v: api::ReclaimOutcome) -> Option<ReclaimOutcome> {
    match v {
        api::ReclaimOutcome::Reclaimed => Some(ReclaimOutcome::Reclaimed),
        api::ReclaimOutcome::Stale => Some(ReclaimOutcome::Stale),
        api::ReclaimOutcome::Live => Some(ReclaimOutcome::Live),
        api::ReclaimOutcome::Unknown => None,
    }
}

/// A condition of a type the operator writes, with its reason as the engine types it (an
/// unknown one, written by an older operator, reads as `Unknown` and the next write
/// replaces it); other conditions (the agent's) are not the operator's.
fn operator_condition(
    c: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
) -> Option<Condition> {
    let type_ = ConditionType::OPERATOR
        .into_iter()
        .find(|t| t.as_str() == c.type_)?;
    Some(Condition {
        type_,
        status: c.status == "True",
        reason: ConditionReason::parse(&c.reason),
        message: c.message.clone(),
        last_transition: to_system(&c.last_transition_time),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn node(v: Value) -> api::IPAMNode {
        serde_json::from_value(v).expect("an IPAMNode")
    }

    const UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
    const POD: &str = "11111111-2222-4333-8444-555555555555";

    /// Version skew: values a later release writes decode (`Unknown`) and are read as
    /// not written yet; `live` is read.
    #[test]
    fn values_of_a_later_release_are_read_as_no_answer_yet() {
        let later = "from-a-later-release";
        let entry =
            |k: &str, v: &str| json!({"podUID": POD, "containerID": "c", "ifname": "eth0", k: v});
        let obj = node(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": {"name": "n1"},
            "spec": {"nodeUID": UID, "release": {"10.0.0.1": later},
                "reclaim": {"10.0.0.1": entry("reason", later)}},
            "status": {"releaseAck": {"10.0.0.1": later},
                "reclaimAck": {"10.0.0.1": entry("outcome", later), "10.0.0.2": entry("outcome", "live")}},
        }));
        assert_eq!(obj.spec.release["10.0.0.1"], api::AddressRelease::Unknown);
        assert_eq!(
            obj.spec.reclaim["10.0.0.1"].reason,
            api::ReclaimReason::Unknown
        );
        let (view, bad) = node_from_api(&obj);
        assert!(bad.is_empty(), "{bad:?}");
        assert!(view.node.operator.release.is_empty());
        assert!(view.node.operator.reclaim.is_empty());
        assert!(view.node.node.release_ack.is_empty());
        let acks: Vec<_> = view
            .node
            .node
            .reclaim_ack
            .values()
            .map(|a| a.outcome)
            .collect();
        assert_eq!(acks, vec![ReclaimOutcome::Live]);
    }

    /// The cache holds an IPAMNode's cooldowns and answers for every node: each map in one
    /// allocation of its size, not the 4 entries a `Vec` first reserves (issue 31).
    #[test]
    fn cooldowns_and_answers_are_read_into_maps_of_their_size() {
        let ack = json!({"podUID": POD, "containerID": "c", "ifname": "eth0", "outcome": "live"});
        let obj = node(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": {"name": "n1"},
            "spec": {"nodeUID": UID},
            "status": {"cooldown": {"10.0.0.9": "2026-11-24T10:00:00Z", "10.0.0.10": "2026-11-24T10:00:01Z"},
                "reclaimAck": {"10.0.0.2": ack}},
        }));
        let (view, bad) = node_from_api(&obj);
        assert!(bad.is_empty(), "{bad:?}");
        let mut node = std::sync::Arc::try_unwrap(view.node).expect("the view's own");
        let side = &mut node.node;
        let cooldown = std::mem::take(&mut side.cooldown).into_tuple_vec();
        let answers = std::mem::take(&mut side.reclaim_ack).into_tuple_vec();
        // in address order, whatever the JSON's order of strings
        let ips: Vec<String> = cooldown.iter().map(|(a, _)| a.to_string()).collect();
        assert_eq!(ips, ["10.0.0.9", "10.0.0.10"]);
        assert_eq!((cooldown.len(), cooldown.capacity()), (2, 2));
        assert_eq!((answers.len(), answers.capacity()), (1, 1));
    }

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
    fn an_ipamnode_reads_as_the_engine_sees_it_and_bad_entries_are_reported() {
        let (v, bad) = node_from_api(&busy_node());
        let n = &v.node;
        assert_eq!(n.node_uid.to_string(), UID);
        assert_eq!(n.resource_version, Some(ResourceVersion::server("42")));
        assert!(n.finalizer);
        assert_eq!(n.operator.addresses.total(), 2);
        let a1: IpAddr = "10.0.0.1".parse().unwrap();
        let a2: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(
            n.operator.release.get(&a2),
            Some(&ReleaseState::MarkedForRelease)
        );
        let t = n.operator.reclaim[&a1];
        assert_eq!(t.allocation, AllocationId::new("c1", "eth0"));
        assert_eq!(n.node.used.get(&a1).unwrap().allocation, t.allocation);
        assert_eq!(
            n.node.release_ack.get(&a2),
            Some(&ReleaseAck::ReadyForRelease)
        );
        // only the operator's condition types
        assert_eq!(n.operator.conditions.len(), 1);
        assert_eq!(
            n.operator.conditions[0].reason,
            ConditionReason::Blocked(tidepool_ipam::Blocked::Exhausted)
        );
        // the agent's, kept apart for the operator to read
        let ready = v.agent_ready.as_ref().expect("AgentReady read");
        assert!(ready.ready);
        assert_eq!(ready.reason, "Serving");
        // the address that is none and the used entry with a bad UID: reported, skipped
        let fields: Vec<&str> = bad.iter().map(|m| m.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "spec.addresses[\"not-an-ip\"]",
                "status.used[\"10.0.0.9\"].podUID"
            ]
        );
        assert_eq!(n.node.used.len(), 1);
        let names = &v.allocations[&t.allocation];
        assert_eq!(
            (names.container_id(), names.ifname()),
            ("c1".into(), "eth0")
        );
    }

    /// A node's entries repeat their ifname and pool: the view keeps one copy of each
    /// (issue 31: the store holds an entry per pod of the cluster). The namespace is part
    /// of the entry's one `namespace/name` string.
    #[test]
    fn the_strings_entries_repeat_are_kept_once() {
        let cid = |i: u8| format!("{i:064x}");
        let entry = |i: u8, ns: &str| {
            json!({"podUID": POD, "namespace": ns, "pod": format!("p{i}"), "containerID": cid(i),
                "ifname": "eth0", "since": "2026-11-24T10:00:00Z", "pool": "default"})
        };
        let obj = node(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": {"name": "n1"},
            "spec": {"nodeUID": UID},
            "status": {"used": {"10.0.0.1": entry(1, "a"), "10.0.0.2": entry(2, "a"),
                "10.0.0.3": entry(3, "b")}},
        }));
        let (v, bad) = node_from_api(&obj);
        assert!(bad.is_empty(), "{bad:?}");
        let used: Vec<&UsedEntry> = v.node.node.used.values().collect();
        let pods: Vec<(&str, &str)> = (used.iter())
            .map(|e| (e.pod.namespace(), e.pod.name()))
            .collect();
        assert_eq!(pods, [("a", "p1"), ("a", "p2"), ("b", "p3")]);
        let names: Vec<_> = used.iter().map(|e| &v.allocations[&e.allocation]).collect();
        assert_eq!(names[2].container_id(), cid(3));
        assert!(names.iter().all(|n| n.ifname() == "eth0"));
        let pools: Vec<&Arc<str>> = v.used_pools.values().collect();
        assert_eq!(pools.len(), 3);
        assert!(
            pools
                .iter()
                .all(|p| Arc::ptr_eq(p, pools[0]) && &***p == "default")
        );
    }

    /// A `spec.nodeUID` that is not a UID: reported, and the IPAMNode read with an unknown
    /// UID, which no Node has (the operator's next write adopts it).
    #[test]
    fn an_unreadable_node_uid_reads_as_unknown() {
        let mut obj = busy_node();
        obj.spec.node_uid = "n1".into();
        let (v, bad) = node_from_api(&obj);
        assert_eq!(v.node.node_uid, NodeUid::UNKNOWN);
        assert_eq!(bad[0].field, "spec.nodeUID");
        assert_eq!(bad[0].reason, "\"n1\" is not a UID");
    }

    #[test]
    fn agent_ready_is_none_until_the_agent_writes_it_and_false_keeps_its_reason() {
        let mut obj = busy_node();
        let conditions = &mut obj.status.as_mut().expect("a status").conditions;
        conditions.retain(|c| c.type_ != condition::AGENT_READY);
        let mut c = conditions[0].clone();
        assert_eq!(node_from_api(&obj).0.agent_ready, None);
        c.type_ = condition::AGENT_READY.into();
        c.status = "False".into();
        c.reason = "NodeWait".into();
        c.message = "waiting".into();
        obj.status.as_mut().expect("a status").conditions.push(c);
        let want = AgentReady {
            ready: false,
            reason: "NodeWait".into(),
            message: "waiting".into(),
        };
        assert_eq!(node_from_api(&obj).0.agent_ready, Some(want));
    }
}
