//! The node's pools that give its waiting pods nothing (DESIGN.md "Pools per namespace and
//! per pod"): which are blocked (`status.poolUsage[].blocked`, named by the `Blocked`
//! condition), and the pods told why (a `PoolUnavailable` event, once per pod, family and
//! reason).

use std::collections::HashMap;

use crate::plan::NodePools;
use crate::pods::PodView;
use crate::shared::Shared;
use crate::source::IpSource;
use crate::store::{EventType, NodeStore};
use crate::types::{BlockedPool, Family, PodUid};
use crate::vocab::EventReason;

/// What a pod was last told, by (pod, family).
pub(super) type Told = HashMap<(PodUid, Family), String>;

/// The blocked pools, sorted, each once: the pools other than the default whose claims got
/// nothing (`exhausted`), the default pool of `default_exhausted` (its claim got nothing),
/// and the pools pods are refused.
pub(super) fn blocked_pools(
    pools: &NodePools,
    default_exhausted: Option<Family>,
    exhausted: &[BlockedPool],
) -> Vec<BlockedPool> {
    let mut out = exhausted.to_vec();
    if let Some(f) = default_exhausted
        && let Some(pool) = pools.defaults.get(f)
    {
        out.push(BlockedPool {
            pool: pool.clone(),
            family: f,
        });
    }
    for family in Family::ALL {
        let refused = pools.unplaced.get(family).iter();
        out.extend(refused.filter_map(|u| {
            let pool = u.pool.clone()?;
            Some(BlockedPool { pool, family })
        }));
    }
    out.sort();
    out.dedup();
    out
}

/// Why each waiting pod of a pool gets no address: a pod refused its pool, and the pods of
/// a pool other than the default that has none left for `node`.
pub(super) fn pod_notes(node: &str, pools: &NodePools, exhausted: &[BlockedPool]) -> Told {
    let mut notes = Told::new();
    for family in Family::ALL {
        for u in pools.unplaced.get(family) {
            notes.insert((u.pod, family), u.why.clone());
        }
    }
    for lane in &pools.lanes {
        let key = BlockedPool {
            pool: lane.pool.clone(),
            family: lane.family,
        };
        if !exhausted.contains(&key) {
            continue;
        }
        let why = format!(
            "pool {:?} has no {} address left for node {node}",
            lane.pool,
            lane.family.as_str()
        );
        for pod in &lane.pending {
            notes.insert((*pod, lane.family), why.clone());
        }
    }
    notes
}

/// Tells each pod of `notes` its note, unless `told` it that already; `told` becomes
/// `notes` (a pod no longer waiting, or placed, is forgotten).
pub(super) fn tell_pods<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    told: &mut Told,
    notes: Told,
) {
    for ((pod, family), why) in &notes {
        if told.get(&(*pod, *family)) != Some(why) {
            let (warning, reason) = (EventType::Warning, EventReason::PoolUnavailable);
            shared.pods.event(*pod, None, warning, reason, why.clone());
        }
    }
    *told = notes;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::addrs::AddrSet;
    use crate::plan::{PoolLane, Unplaced};
    use crate::types::PerFamily;
    use crate::watermarks::Watermarks;

    fn blocked(pool: &str, family: Family) -> BlockedPool {
        BlockedPool {
            pool: pool.into(),
            family,
        }
    }

    fn pools() -> NodePools {
        let unplaced = |pod, pool: Option<&str>| Unplaced {
            pod: PodUid(pod),
            pool: pool.map(Arc::from),
            why: format!("pod {pod} refused"),
        };
        NodePools {
            lanes: vec![PoolLane {
                family: Family::V4,
                pool: "blue".into(),
                addresses: AddrSet::new(),
                watermarks: Watermarks::default(),
                pending: vec![PodUid(1), PodUid(2)],
            }],
            unplaced: PerFamily {
                v4: vec![unplaced(3, Some("red")), unplaced(4, None)],
                v6: vec![unplaced(3, Some("red"))],
            },
            defaults: PerFamily {
                v4: Some("default".into()),
                v6: None,
            },
            ..NodePools::default()
        }
    }

    #[test]
    fn the_blocked_pools_are_the_exhausted_ones_and_those_refused() {
        let p = pools();
        assert_eq!(
            blocked_pools(&p, None, &[]),
            [blocked("red", Family::V4), blocked("red", Family::V6)],
            "a refusal without a pool names none"
        );
        let exhausted = [blocked("blue", Family::V4)];
        assert_eq!(
            blocked_pools(&p, Some(Family::V4), &exhausted),
            [
                blocked("blue", Family::V4),
                blocked("default", Family::V4),
                blocked("red", Family::V4),
                blocked("red", Family::V6),
            ]
        );
        assert_eq!(
            blocked_pools(&p, Some(Family::V6), &[]).len(),
            2,
            "no default pool of IPv6 known: none named"
        );
        assert!(blocked_pools(&NodePools::EMPTY, None, &[]).is_empty());
    }

    #[test]
    fn refused_pods_and_the_pods_of_an_exhausted_pool_have_notes() {
        let p = pools();
        let notes = pod_notes("n1", &p, &[]);
        let keys: std::collections::BTreeSet<_> = notes.keys().copied().collect();
        assert_eq!(
            keys.into_iter().collect::<Vec<_>>(),
            [
                (PodUid(3), Family::V4),
                (PodUid(3), Family::V6),
                (PodUid(4), Family::V4)
            ],
            "blue is not exhausted: its pods just wait"
        );
        let notes = pod_notes("n1", &p, &[blocked("blue", Family::V4)]);
        assert_eq!(notes.len(), 5);
        assert_eq!(
            notes[&(PodUid(1), Family::V4)],
            "pool \"blue\" has no ipv4 address left for node n1"
        );
        assert_eq!(notes[&(PodUid(3), Family::V6)], "pod 3 refused");
    }
}
