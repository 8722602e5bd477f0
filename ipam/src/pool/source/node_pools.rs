//! A node's pools beyond its default ones ([`IpSource::node_pools`](crate::IpSource)): what
//! it holds of each (its kept blocks, by pool) and the pending pods whose choice
//! ([`choice::choose`]) is each (DESIGN.md "Pools per namespace and per pod").

use std::collections::BTreeMap;
use std::sync::Arc;

use super::State;
use crate::addrs::AddrSet;
use crate::plan::{NodePools, PoolLane, Unplaced};
use crate::pool::choice::{self, ChoiceError, PoolTerms, Selector, Subject, Why};
use crate::pool::family_of;
use crate::types::{Family, IpamBlock, PerFamily, PodUid};
use crate::watermarks::Watermarks;

/// Watermarks of a pool other than the node's default: no pre-allocation, so that nodes ×
/// pools × 8 idle addresses are not the price of pools.
const OTHER_POOL: Watermarks = Watermarks {
    pre_allocate: 0,
    min_allocate: 0,
    max_allocate: 0,
    max_above_watermark: 0,
};

/// The lanes found so far, by family and pool.
type Lanes = BTreeMap<(Family, Arc<str>), PoolLane>;

impl State {
    /// See [`IpSource::node_pools`](crate::IpSource); `blocks`: the node's.
    pub(super) fn node_pools(
        &self,
        blocks: &[Arc<IpamBlock>],
        node: &str,
        pending: &[(PodUid, Option<Subject>)],
    ) -> NodePools {
        let defaults = PerFamily {
            v4: self.pool_for(node, Family::V4),
            v6: self.pool_for(node, Family::V6),
        };
        let is_default = |f: Family, pool: &str| defaults.get(f).as_deref() == Some(pool);
        let mut lanes = Lanes::new();
        // the name first: a default pool's blocks (most of them) skip the pool lookups
        for b in blocks {
            let f = family_of(&b.cidr);
            if !is_default(f, &b.pool) && self.kept(b) {
                let lane = self.lane(&mut lanes, f, b.pool.clone());
                lane.addresses.union_with(&self.usable(b));
            }
        }
        let mut unplaced: PerFamily<Vec<Unplaced>> = PerFamily::default();
        let choosing = pending.iter().filter_map(|(u, s)| Some((*u, s.as_ref()?)));
        if self.selects_pods()
            || pending
                .iter()
                .any(|(_, s)| s.as_ref().is_some_and(annotated))
        {
            let terms = self.terms();
            for (uid, subject) in choosing {
                let subject = self.with_node(node, subject);
                for &f in self.pools.families() {
                    match choice::choose(f, &terms, &subject, defaults.get(f).as_deref()) {
                        Ok(p) if is_default(f, &p) => {}
                        Ok(p) => self.lane(&mut lanes, f, p.into()).pending.push(uid),
                        // the node's default pool is missing or invalid: the node's problem,
                        // shown as today (its claims find nothing)
                        Err(ChoiceError::NoEligiblePool {
                            why: Why::Missing | Why::Invalid,
                            ..
                        }) => {}
                        Err(e) => unplaced.get_mut(f).push(Unplaced {
                            pod: uid,
                            pool: e.pool().map(Arc::from),
                            why: e.to_string(),
                        }),
                    }
                }
            }
        }
        let overrides = |f: Family| {
            let of = |name: &String| self.selectors.iter().find(|p| &p.name == name);
            (defaults.get(f).as_ref())
                .and_then(of)
                .map(|p| p.watermarks)
                .unwrap_or_default()
        };
        NodePools {
            lanes: lanes.into_values().collect(),
            unplaced,
            defaults: PerFamily {
                v4: defaults.v4.as_deref().map(Arc::from),
                v6: defaults.v6.as_deref().map(Arc::from),
            },
            default_overrides: PerFamily {
                v4: overrides(Family::V4),
                v6: overrides(Family::V6),
            },
        }
    }

    /// The lane of `pool` and `family`, new ones with the pool's watermarks on a node
    /// whose default pool it is not: its `spec.watermarks` over no pre-allocation (invalid
    /// ones: none).
    fn lane<'l>(&self, lanes: &'l mut Lanes, family: Family, pool: Arc<str>) -> &'l mut PoolLane {
        lanes.entry((family, pool.clone())).or_insert_with(|| {
            let set = self.selectors.iter().find(|p| *p.name == *pool);
            let watermarks = (set.and_then(|p| OTHER_POOL.with_overrides(&p.watermarks).ok()))
                .unwrap_or(OTHER_POOL);
            PoolLane {
                family,
                pool,
                addresses: AddrSet::new(),
                watermarks,
                pending: Vec::new(),
            }
        })
    }

    /// The pod's pool for `family` on `node` ([`choice::choose`] with the node's part).
    pub(super) fn choose(
        &self,
        node: &str,
        family: Family,
        subject: &Subject,
    ) -> Result<String, ChoiceError> {
        let default = self.pool_for(node, family);
        choice::choose(
            family,
            &self.terms(),
            &self.with_node(node, subject),
            default.as_deref(),
        )
    }

    /// Whether a pool selects namespaces or pods.
    fn selects_pods(&self) -> bool {
        (self.selectors.iter()).any(|p| !(p.namespace.is_empty() && p.pod.is_empty()))
    }

    /// The pools as the choice reads them, oldest first.
    fn terms(&self) -> Vec<PoolTerms> {
        let serves =
            |name: &str, f: Family| self.pools.get(name).is_ok_and(|p| p.family(f).is_some());
        (self.selectors.iter())
            .map(|p| PoolTerms {
                name: p.name.clone(),
                valid: self.pools.get(&p.name).is_ok(),
                v4: serves(&p.name, Family::V4),
                v6: serves(&p.name, Family::V6),
                node_selector: Selector {
                    match_labels: p.node.clone(),
                    match_expressions: Vec::new(),
                },
                namespace_selector: p.namespace.clone(),
                pod_selector: p.pod.clone(),
            })
            .collect()
    }

    /// `subject` with the node's labels and `spec.pools`.
    fn with_node(&self, node: &str, subject: &Subject) -> Subject {
        let meta = self.nodes.get(node);
        Subject {
            node_labels: meta.map(|m| m.labels.clone()).unwrap_or_default(),
            node_pools: meta
                .map(|m| {
                    [&m.pools.v4, &m.pools.v6]
                        .into_iter()
                        .flatten()
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
            ..subject.clone()
        }
    }
}

/// Whether the pod or its namespace names pools.
fn annotated(s: &Subject) -> bool {
    s.pod_pools.is_some() || s.namespace_pools.is_some()
}
