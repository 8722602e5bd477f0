//! A node's pools, each sized on its own (DESIGN.md "Pools per namespace and per pod"):
//! planning is per (node, pool, family). A node whose pods all take its default pools has
//! one lane per family, which sees the node's fields as they are; a node that also holds or
//! needs another pool of a family gets a lane per pool, each seeing only its pool's
//! addresses, and its default lane what the others do not hold.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::addrs::AddrSet;
use crate::scarcity::Squeeze;
use crate::types::{Family, OperatorFields, PerFamily, PodUid, WatermarkOverrides};
use crate::watermarks::Watermarks;

/// One of the node's pools for one family other than its default pool: what it holds on the
/// node and who waits for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLane {
    pub family: Family,
    pub pool: Arc<str>,
    /// The node's addresses of the pool (its blocks of it).
    pub addresses: AddrSet,
    pub watermarks: Watermarks,
    /// Pods waiting whose pool for `family` is this one.
    pub pending: Vec<PodUid>,
}

/// The node's pools beyond its default ones. Empty on a node whose pods all take the
/// default pools.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePools {
    pub lanes: Vec<PoolLane>,
    /// Pods waiting with no pool for a family (an annotation names a pool they may not
    /// use): demand for no lane of it.
    pub unplaced: PerFamily<Vec<Unplaced>>,
    /// The node's default pool of each family, when the source has pools (for
    /// `status.poolUsage`).
    pub defaults: PerFamily<Option<Arc<str>>>,
    /// The default pools' `spec.watermarks`, per family: over the flags, under the
    /// IPAMNode's `spec.watermarks`.
    pub default_overrides: PerFamily<WatermarkOverrides>,
}

impl NodePools {
    pub const EMPTY: NodePools = NodePools {
        lanes: Vec::new(),
        unplaced: PerFamily {
            v4: Vec::new(),
            v6: Vec::new(),
        },
        defaults: PerFamily { v4: None, v6: None },
        default_overrides: PerFamily {
            v4: WatermarkOverrides::NONE,
            v6: WatermarkOverrides::NONE,
        },
    };
}

/// A pending pod with no pool for a family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unplaced {
    pub pod: PodUid,
    /// The pool it is refused (see [`crate::pool::choice::ChoiceError::pool`]), shown
    /// blocked on the node.
    pub pool: Option<Arc<str>>,
    /// Why, for the pod's event.
    pub why: String,
}

/// A lane as a pass sizes it.
#[derive(Debug)]
pub(super) struct Lane<'s> {
    pub family: Family,
    /// None: the node's default pool for the family (the source chooses it).
    pub pool: Option<&'s Arc<str>>,
    /// The operator's fields as the lane sees them: its pool's addresses and marks only,
    /// when `restricted`.
    pub fields: Cow<'s, OperatorFields>,
    pub restricted: bool,
    pub watermarks: Watermarks,
    pub pending: Cow<'s, [PodUid]>,
    /// Its pool's scarcity squeeze, already applied to `watermarks` (None: not scarce).
    pub squeeze: Option<Squeeze>,
}

/// The lanes of `families`: the default pool's of each (with `watermarks`, the flags under
/// the node's `overrides`, and the default pool's own between them; and the pods no other
/// lane takes), then the others' in `pools` order.
pub(super) fn lanes<'s>(
    families: &[Family],
    fields: &'s OperatorFields,
    pending: &'s [PodUid],
    (watermarks, overrides): (Watermarks, &WatermarkOverrides),
    pools: &'s NodePools,
) -> Vec<Lane<'s>> {
    let mut out = Vec::with_capacity(families.len());
    for &family in families {
        let pool = pools.default_overrides.get(family).under(overrides);
        let default_watermarks = watermarks.with_overrides(&pool).unwrap_or(watermarks);
        let others: Vec<&PoolLane> = pools.lanes.iter().filter(|l| l.family == family).collect();
        let unplaced = pools.unplaced.get(family);
        if others.is_empty() && unplaced.is_empty() {
            out.push(Lane {
                family,
                pool: None,
                fields: Cow::Borrowed(fields),
                restricted: false,
                watermarks: default_watermarks,
                pending: Cow::Borrowed(pending),
                squeeze: None,
            });
            continue;
        }
        let mut mine = fields.addresses.of_family(family);
        let mut elsewhere: BTreeSet<PodUid> = unplaced.iter().map(|u| u.pod).collect();
        for o in &others {
            mine.subtract(&o.addresses);
            elsewhere.extend(o.pending.iter().copied());
        }
        out.push(Lane {
            family,
            pool: None,
            fields: Cow::Owned(restrict(fields, mine)),
            restricted: true,
            watermarks: default_watermarks,
            pending: pending
                .iter()
                .filter(|u| !elsewhere.contains(u))
                .copied()
                .collect(),
            squeeze: None,
        });
        out.extend(others.into_iter().map(|o| Lane {
            family,
            pool: Some(&o.pool),
            fields: Cow::Owned(restrict(
                fields,
                o.addresses.intersection(&fields.addresses),
            )),
            restricted: true,
            watermarks: o.watermarks,
            pending: Cow::Borrowed(&o.pending),
            squeeze: None,
        }));
    }
    out
}

/// `fields` with only `addresses` and their marks.
fn restrict(fields: &OperatorFields, addresses: AddrSet) -> OperatorFields {
    let mut release = fields.release.clone();
    let mut outside = release.keys();
    outside.subtract(&addresses);
    release.remove_set(&outside);
    OperatorFields {
        addresses: Arc::new(addresses),
        release,
        reclaim: fields.reclaim.clone(),
        conditions: Vec::new(),
        blocked_pools: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ReleaseState;
    use std::net::IpAddr;

    fn set(addrs: &[&str]) -> AddrSet {
        let mut s = AddrSet::new();
        for a in addrs {
            s.insert(a.parse::<IpAddr>().unwrap());
        }
        s
    }

    fn fields(addrs: &[&str], marked: &[&str]) -> OperatorFields {
        let mut f = OperatorFields {
            addresses: Arc::new(set(addrs)),
            ..OperatorFields::default()
        };
        for a in marked {
            f.release
                .insert(a.parse().unwrap(), ReleaseState::MarkedForRelease);
        }
        f
    }

    #[test]
    fn a_node_of_default_pools_has_one_lane_per_family_seeing_all() {
        let f = fields(&["10.0.0.1", "fd00::1"], &[]);
        let pending = [PodUid(1)];
        let pools = NodePools::default();
        let l = lanes(
            &Family::ALL,
            &f,
            &pending,
            (Watermarks::default(), &WatermarkOverrides::NONE),
            &pools,
        );
        assert_eq!(l.len(), 2);
        for lane in &l {
            assert!(lane.pool.is_none() && !lane.restricted);
            assert!(matches!(lane.fields, Cow::Borrowed(_)));
            assert_eq!(&*lane.pending, &pending);
        }
    }

    #[test]
    fn another_pool_takes_its_addresses_marks_and_pods_from_the_default_lane() {
        let f = fields(&["10.0.0.1", "10.0.1.1", "10.0.1.2"], &["10.0.1.2"]);
        let pending = [PodUid(1), PodUid(2), PodUid(3)];
        let zero = Watermarks {
            pre_allocate: 0,
            ..Watermarks::default()
        };
        let pools = NodePools {
            lanes: vec![PoolLane {
                family: Family::V4,
                pool: "blue".into(),
                addresses: set(&["10.0.1.1", "10.0.1.2", "10.0.9.9"]),
                watermarks: zero,
                pending: vec![PodUid(2)],
            }],
            unplaced: PerFamily {
                v4: vec![Unplaced {
                    pod: PodUid(3),
                    pool: Some("red".into()),
                    why: "may not".into(),
                }],
                v6: vec![],
            },
            ..NodePools::default()
        };
        let no = &WatermarkOverrides::NONE;
        let l = lanes(
            &[Family::V4],
            &f,
            &pending,
            (Watermarks::default(), no),
            &pools,
        );
        assert_eq!(l.len(), 2);
        let (default, blue) = (&l[0], &l[1]);
        assert_eq!(*default.fields.addresses, set(&["10.0.0.1"]));
        assert!(default.fields.release.is_empty());
        assert_eq!(
            &*default.pending,
            &[PodUid(1)],
            "pod 3 has no pool: no demand"
        );
        assert_eq!(default.watermarks, Watermarks::default());
        assert_eq!(blue.pool.map(|p| &**p), Some("blue"));
        assert_eq!(
            *blue.fields.addresses,
            set(&["10.0.1.1", "10.0.1.2"]),
            "only what the node holds"
        );
        assert_eq!(blue.fields.release.keys(), set(&["10.0.1.2"]));
        assert_eq!((&*blue.pending, blue.watermarks), (&[PodUid(2)][..], zero));
    }
}
