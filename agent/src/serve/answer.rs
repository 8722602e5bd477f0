//! The node side's answers to the operator (DESIGN.md "Release handshake" and reclaim), on
//! the durable state: tombstones answered by `ipam`'s rule on their exact allocation
//! (reclaimed: freed into cooldown; live: the pod runs on the node with it, nothing freed;
//! else stale), an answer dropped once its tombstone is gone; address release marks and
//! block marks answered by `ipam`'s node rules — an address a live pod on the node lists
//! counts as busy there, held or not (no checkpoint, or a corrupt one, must not let a
//! running pod's block go); cooldowns ended with their time or when the address left the
//! pool. The caller saves and then publishes.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use tidepool_api::convert::Allocations;
use tidepool_ipam::node::{Answers, BlockView, answer_blocks, reconcile};
use tidepool_ipam::{IpamNode, NodeSideFields};

use crate::pods::LivePods;
use crate::state::{AllocKey, NodeState};

/// Answers everything the operator asks of `node` (projected, with `blocks`); `keys` names
/// the tombstones' allocations; `pods` are the live pods on the node (`None`: not listed
/// yet, and tombstones wait: whether their pods run cannot be told). A change leaves the
/// state dirty (to be saved).
pub fn answer(
    state: &mut NodeState,
    node: &IpamNode,
    blocks: &[BlockView],
    keys: &Allocations,
    pods: Option<&LivePods>,
    now: SystemTime,
) {
    if let Some(pods) = pods {
        answer_tombstones(state, node, keys, pods, now);
    }
    let busy = pods.map(|p| p.addresses().clone()).unwrap_or_default();
    answer_marks(state, node, blocks, &busy, now);
    state.expire_cooldowns(now);
    state.forget_cooldowns_outside(&node.operator.addresses);
}

fn answer_tombstones(
    state: &mut NodeState,
    node: &IpamNode,
    keys: &Allocations,
    pods: &LivePods,
    now: SystemTime,
) {
    for (addr, t) in &node.operator.reclaim {
        // a tombstone whose allocation the IPAMNode does not name cannot be matched to a
        // key: answered at the next change (the operator writes both together)
        let Some((container_id, ifname)) = keys.get(&t.allocation) else {
            continue;
        };
        let key = AllocKey {
            container_id: container_id.to_string(),
            ifname: ifname.to_string(),
        };
        state.ack_reclaim(*addr, t.pod_uid, &key, |uid| pods.has(uid), now);
    }
    let gone: Vec<_> = state
        .reclaim_acks()
        .keys()
        .filter(|a| !node.operator.reclaim.contains_key(a))
        .copied()
        .collect();
    for a in gone {
        state.forget_reclaim_ack(&a);
    }
}

/// Address marks (`spec.release`) by `ipam::node::reconcile` over the node side as the
/// state has it (its tombstone and cooldown parts are done above, on the full keys), and
/// block marks by `answer_blocks`.
fn answer_marks(
    state: &mut NodeState,
    node: &IpamNode,
    blocks: &[BlockView],
    live: &BTreeSet<IpAddr>,
    now: SystemTime,
) {
    let mut side = busy_side(state, live, now);
    let unmarked = IpamNode {
        operator: tidepool_ipam::OperatorFields {
            release: address_marks(node, blocks),
            addresses: node.operator.addresses.clone(),
            ..Default::default()
        },
        ..node.clone()
    };
    reconcile(&unmarked, &mut side, now, Duration::ZERO, &|_| false);
    state.ack_release(side.release_ack);
    let mut out = Answers::default();
    for (name, ack) in answer_blocks(&busy_side(state, live, now), blocks, now, &mut out) {
        state.ack_block(&name, ack);
    }
    // a block that went (released and deleted) takes its answer with it
    let gone: Vec<String> = state
        .block_release_acks()
        .keys()
        .filter(|b| !blocks.iter().any(|v| &*v.name == b.as_str()))
        .cloned()
        .collect();
    for b in gone {
        state.ack_block(&b, None);
    }
}

/// The node side as the release answers read it: live pods' addresses the state does not
/// hold count as cooling down for as long as anyone can see.
fn busy_side(state: &NodeState, live: &BTreeSet<IpAddr>, now: SystemTime) -> NodeSideFields {
    let mut side = state.node_side();
    let never = now + Duration::from_secs(100 * 365 * 24 * 3600);
    for a in live {
        if !side.used.contains_key(a) {
            side.cooldown.entry(*a).or_insert(never);
        }
    }
    side
}

/// The address-level marks alone: the projection also marks a marked block's addresses,
/// but those are answered per block.
fn address_marks(
    node: &IpamNode,
    blocks: &[BlockView],
) -> tidepool_ipam::AddrMap<tidepool_ipam::ReleaseState> {
    let mut marks = node.operator.release.clone();
    for b in blocks.iter().filter(|b| b.release || b.ack.is_some()) {
        marks.remove_set(&b.addrs);
    }
    marks
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    use tidepool_ipam::{
        AddrSet, NodeName, NodeUid, PodUid, ReclaimOutcome, ReclaimReason, ReleaseAck, Tombstone,
    };

    use super::*;
    use crate::state::PodRef;

    fn block(name: &str, cidr: &str, release: bool) -> BlockView {
        let all = AddrSet::of_net(&cidr.parse().expect("net"));
        BlockView {
            name: Arc::from(name),
            addrs: all.clone(),
            all,
            release,
            ack: None,
        }
    }

    /// One pod on block a (marked), block b marked and free; a tombstone for the pod's
    /// exact allocation and one for an allocation the node never made.
    #[test]
    fn tombstones_and_block_marks_are_answered_on_the_state() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut st = NodeState::new("boot", Duration::from_secs(30));
        let key = AllocKey::new("c1", "eth0");
        let pod = PodRef {
            uid: PodUid(7),
            namespace: "default".into(),
            name: "p".into(),
        };
        let ip: std::net::IpAddr = "10.0.0.2".parse().expect("ip");
        st.add(key.clone(), pod, &[ip], None, now).expect("add");
        let blocks = [
            block("a", "10.0.0.0/28", true),
            block("b", "10.0.0.16/28", true),
        ];
        let mut node = IpamNode::new(NodeName::from("n"), NodeUid(1));
        node.operator.reclaim.insert(
            ip,
            Tombstone {
                pod_uid: PodUid(7),
                allocation: key.id(),
                reason: ReclaimReason::PodDeleted,
            },
        );
        let stranger: std::net::IpAddr = "10.0.0.3".parse().expect("ip");
        let other = AllocKey::new("c9", "eth0");
        node.operator.reclaim.insert(
            stranger,
            Tombstone {
                pod_uid: PodUid(9),
                allocation: other.id(),
                reason: ReclaimReason::PodDeleted,
            },
        );
        let node = tidepool_ipam::node::project(&node, &blocks);
        let mut keys = Allocations::new();
        for k in [&key, &other] {
            keys.insert(
                k.id(),
                (k.container_id.as_str().into(), k.ifname.as_str().into()),
            );
        }
        answer(
            &mut st,
            &node,
            &blocks,
            &keys,
            Some(&LivePods::default()),
            now,
        );
        let acks = st.reclaim_acks();
        assert_eq!(acks[&ip].outcome, ReclaimOutcome::Reclaimed);
        assert_eq!(acks[&stranger].outcome, ReclaimOutcome::Stale);
        assert!(st.get(&key).is_none(), "freed");
        assert!(st.cooldowns().contains_key(&ip), "into cooldown");
        // block a holds a cooling address: do-not-release; b is free: ready-for-release
        let blocks_acks = st.block_release_acks();
        assert_eq!(blocks_acks.get("a"), Some(&ReleaseAck::DoNotRelease));
        assert_eq!(blocks_acks.get("b"), Some(&ReleaseAck::ReadyForRelease));
        assert!(st.is_dirty());
        // the tombstones gone: their answers go
        let bare =
            tidepool_ipam::node::project(&IpamNode::new(NodeName::from("n"), NodeUid(1)), &blocks);
        answer(
            &mut st,
            &bare,
            &blocks,
            &keys,
            Some(&LivePods::default()),
            now,
        );
        assert!(st.reclaim_acks().is_empty());
        // block b released and deleted: its answer goes with it
        let left = [blocks[0].clone()];
        let bare =
            tidepool_ipam::node::project(&IpamNode::new(NodeName::from("n"), NodeUid(1)), &left);
        answer(
            &mut st,
            &bare,
            &left,
            &keys,
            Some(&LivePods::default()),
            now,
        );
        assert_eq!(
            st.block_release_acks().keys().collect::<Vec<_>>(),
            vec!["a"]
        );
    }

    /// A live pod's address the state does not hold (no checkpoint) keeps its block and
    /// its address mark from being answered ready-for-release.
    #[test]
    fn a_live_pods_address_is_busy_for_release_marks() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let blocks = [block("a", "10.0.0.0/28", true)];
        let ip: std::net::IpAddr = "10.0.0.5".parse().expect("ip");
        // an address mark as a cloud source's node carries it (not projected from blocks)
        let mut node = IpamNode::new(NodeName::from("n"), NodeUid(1));
        let mark: std::net::IpAddr = "10.0.0.40".parse().expect("ip");
        let mut pool = AddrSet::of_net(&"10.0.0.0/28".parse().expect("net"));
        pool.union_with(&AddrSet::of_net(&"10.0.0.32/28".parse().expect("net")));
        node.operator.addresses = Arc::new(pool);
        node.operator
            .release
            .insert(mark, tidepool_ipam::ReleaseState::MarkedForRelease);
        let answered = |live: &[std::net::IpAddr]| {
            let mut st = NodeState::new("boot", Duration::from_secs(30));
            let pod = crate::pods::PodAddrs {
                uid: None,
                terminal: false,
                addrs: live.to_vec(),
            };
            let live = LivePods::new([&pod]);
            answer(
                &mut st,
                &node,
                &blocks,
                &Allocations::new(),
                Some(&live),
                now,
            );
            (
                st.block_release_acks().get("a").copied(),
                st.release_acks().get(&mark).copied(),
            )
        };
        assert_eq!(
            answered(&[ip, mark]),
            (
                Some(ReleaseAck::DoNotRelease),
                Some(ReleaseAck::DoNotRelease)
            )
        );
        assert_eq!(
            answered(&[]),
            (
                Some(ReleaseAck::ReadyForRelease),
                Some(ReleaseAck::ReadyForRelease)
            )
        );
    }
}
