//! The node side's answers to the operator (DESIGN.md "Release handshake" and reclaim), on
//! the durable state: tombstones answered by `ipam`'s rule on their exact allocation
//! (reclaimed: freed into cooldown; live: the pod runs on the node with it, nothing freed;
//! else stale), an answer dropped once its tombstone is gone; address release marks and
//! block marks answered by `ipam`'s [`tidepool_ipam::node::NodeSide`] — an address a live
//! pod on the node lists counts as busy there, held or not (no checkpoint, or a corrupt one, must not let a
//! running pod's block go); cooldowns forgotten when the address left the node's blocks
//! (one that ended with its time is over already, and goes with the next save). The
//! caller saves and then publishes.

use std::time::SystemTime;

use tidepool_api::convert::Allocations;
use tidepool_ipam::node::BlockView;
use tidepool_ipam::{AddrSet, IpamNode};

use crate::pods::LivePods;
use crate::state::NodeState;

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
        state.answer_tombstones(&node.operator.reclaim, keys, |uid| pods.has(uid), now);
    }
    // a live pod's address counts as busy, held or not
    let busy: AddrSet = pods
        .map(|p| p.addresses().iter().copied().collect())
        .unwrap_or_default();
    let unmarked = IpamNode {
        operator: tidepool_ipam::OperatorFields {
            release: address_marks(node, blocks),
            addresses: node.operator.addresses.clone(),
            ..Default::default()
        },
        ..node.clone()
    };
    state.answer_marks(&unmarked, &busy, now);
    state.answer_blocks(blocks, &busy, now);
    // a block left out of the pool is still the node's: its cooldowns stay
    let mut held = (*node.operator.addresses).clone();
    for b in blocks {
        held.union_with(&b.all);
    }
    state.forget_outside(&held);
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
    use crate::state::{AllocKey, PodRef};

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
        st.adopt_allocation(key.clone(), pod, &[ip], None, now)
            .expect("add");
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
            let names =
                tidepool_api::convert::AllocationNames::new(&k.container_id, k.ifname.as_str());
            keys.insert(k.id(), names);
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
        // the tombstones gone: their answers go with the next save, not one of their own
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
        assert_eq!(st.reclaim_acks().len(), 2);
        let saved = st.snapshot(now);
        assert!(saved.reclaim_acks().is_empty() && st.reclaim_acks().is_empty());
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
