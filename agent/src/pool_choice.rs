//! The pod's pool per family at its ADD (DESIGN.md "Pools per namespace and per pod"), as the
//! operator resolves it for demand (`ipam`'s cluster-pool source, `node_pools`): `ipam`'s
//! [`choice::choose`] on the pod, its namespace, the IPPools and the node, with the node's
//! default pool from [`choice::default_pool`]. Pure; the kube layer feeds [`PoolChoice`].
//!
//! - A choice error for which the node's default pool is missing or Invalid takes the default
//!   pool (the node's problem, shown as before: the ADD finds no address of it and waits);
//!   any other error means no address.
//! - A pod that already holds an address of a family (a new sandbox of the same pod UID)
//!   takes that address's pool, never re-evaluated.
//! - The ADD takes addresses only from the node's blocks of the pod's pools: the others are
//!   excluded ([`PoolChoice::outside`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use tidepool_ipam::pool::choice::{self, ChoiceError, Labels, PoolTerms, Subject, Why};
use tidepool_ipam::{AddrSet, Family, PerFamily};

/// The pod's pool per family (`None`: a family the ADD does not take).
pub type PodPools = PerFamily<Option<Arc<str>>>;

/// What the choice reads of a pod or a namespace: its labels and its
/// [`choice::POOLS_ANNOTATION`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Terms {
    pub labels: Labels,
    pub pools: Option<String>,
}

impl Terms {
    /// `labels` and `annotations` of an object.
    pub fn of(
        labels: Option<&BTreeMap<String, String>>,
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Self {
        Terms {
            labels: labels.cloned().unwrap_or_default(),
            pools: annotations.and_then(|a| a.get(choice::POOLS_ANNOTATION).cloned()),
        }
    }
}

/// The choice's subject for a pod and its namespace (unseen: no labels, no annotation);
/// its node's part is [`PoolChoice`]'s.
pub fn subject(pod: Option<&Terms>, namespace: Option<&Terms>) -> Subject {
    let (pod, namespace) = (pod.cloned(), namespace.cloned());
    let (pod, namespace) = (pod.unwrap_or_default(), namespace.unwrap_or_default());
    Subject {
        pod_labels: pod.labels,
        pod_pools: pod.pools,
        namespace_labels: namespace.labels,
        namespace_pools: namespace.pools,
        ..Subject::default()
    }
}

/// What the choice reads of the IPPools and the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolChoice {
    /// The readable IPPools, oldest first (creationTimestamp, then name); an Invalid one
    /// serves no family.
    pub pools: Vec<PoolTerms>,
    /// The node's labels (its Node's).
    pub node_labels: Labels,
    /// The IPAMNode's `spec.pools`: the node's default pool per family, when set.
    pub named: PerFamily<Option<String>>,
    /// The addresses of the node's usable blocks, per (pool, family).
    pub addresses: BTreeMap<(Arc<str>, Family), AddrSet>,
}

impl PoolChoice {
    /// The node's default pool for `family`: `spec.pools`, else the oldest valid pool of
    /// the family whose node selector matches, else `default`.
    pub fn default_pool(&self, family: Family) -> String {
        let serving = self.pools.iter().filter(|p| serves(p, family));
        let candidates = serving.map(|p| (p.name.as_str(), &p.node_selector.match_labels));
        choice::default_pool(
            self.named.get(family).as_deref(),
            candidates,
            &self.node_labels,
        )
    }

    /// The pool for `family` of the pod `subject` describes (its node's part is this
    /// node's), or why it has none.
    pub fn choose(&self, family: Family, subject: &Subject) -> Result<String, ChoiceError> {
        let default = self.default_pool(family);
        let subject = Subject {
            node_labels: self.node_labels.clone(),
            node_pools: [&self.named.v4, &self.named.v6]
                .into_iter()
                .flatten()
                .cloned()
                .collect(),
            ..subject.clone()
        };
        match choice::choose(family, &self.pools, &subject, Some(&default)) {
            // the node's default pool is missing or invalid: the node's problem, as before
            Err(ChoiceError::NoEligiblePool {
                why: Why::Missing | Why::Invalid,
                ..
            }) => Ok(default),
            chosen => chosen,
        }
    }

    /// The pool whose block on this node holds `addr`.
    pub fn pool_of(&self, addr: &IpAddr) -> Option<&Arc<str>> {
        let mut held = self.addresses.iter().filter(|(_, a)| a.contains(addr));
        held.next().map(|((pool, _), _)| pool)
    }

    /// The pod's pool for each of `families`: the pool of the address of the family it
    /// holds already (`held`: a new sandbox of the same pod), else [`Self::choose`].
    pub fn pod_pools(
        &self,
        families: &[Family],
        subject: &Subject,
        held: impl Fn(Family) -> Option<Arc<str>>,
    ) -> Result<PodPools, ChoiceError> {
        let mut out = PodPools::default();
        for &f in families {
            let pool = match held(f) {
                Some(p) => p,
                None => self.choose(f, subject)?.into(),
            };
            *out.get_mut(f) = Some(pool);
        }
        Ok(out)
    }

    /// The addresses of `held` (the node's) an ADD for a pod of `pools` may not take: all
    /// but its pools' blocks' addresses of their families.
    pub fn outside(&self, held: &AddrSet, pools: &PodPools) -> AddrSet {
        let mut outside = held.clone();
        for f in Family::ALL {
            let Some(pool) = pools.get(f) else { continue };
            if let Some(mine) = self.addresses.get(&(pool.clone(), f)) {
                outside.subtract(mine);
            }
        }
        outside
    }
}

fn serves(p: &PoolTerms, f: Family) -> bool {
    match f {
        Family::V4 => p.v4,
        Family::V6 => p.v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidepool_ipam::pool::choice::{By, Selector};

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    fn pool(name: &str, namespaces: &[(&str, &str)]) -> PoolTerms {
        PoolTerms {
            name: name.into(),
            valid: true,
            v4: true,
            namespace_selector: Selector {
                match_labels: labels(namespaces),
                ..Selector::default()
            },
            ..PoolTerms::default()
        }
    }

    fn ns(pairs: &[(&str, &str)], pools: Option<&str>) -> Subject {
        Subject {
            namespace_labels: labels(pairs),
            namespace_pools: pools.map(String::from),
            ..Subject::default()
        }
    }

    fn set(net: &str) -> AddrSet {
        AddrSet::of_net(&net.parse().unwrap())
    }

    /// default 10.0.0.0/28 and blue 10.1.0.0/28 on the node; blue for team=blue only.
    fn two_pools() -> PoolChoice {
        let mut addresses = BTreeMap::new();
        addresses.insert((Arc::from("default"), Family::V4), set("10.0.0.0/28"));
        addresses.insert((Arc::from("blue"), Family::V4), set("10.1.0.0/28"));
        PoolChoice {
            pools: vec![pool("default", &[]), pool("blue", &[("team", "blue")])],
            addresses,
            ..PoolChoice::default()
        }
    }

    #[test]
    fn a_namespace_its_pool_selects_takes_it_and_another_the_default() {
        let c = two_pools();
        let blue = ns(&[("team", "blue")], None);
        assert_eq!(c.choose(Family::V4, &blue).as_deref(), Ok("blue"));
        assert_eq!(
            c.choose(Family::V4, &ns(&[], None)).as_deref(),
            Ok("default")
        );
        let got = c.pod_pools(&[Family::V4], &blue, |_| None).unwrap();
        assert_eq!(got.v4.as_deref(), Some("blue"));
        assert_eq!(got.v6, None);
    }

    #[test]
    fn an_annotation_naming_a_forbidden_pool_is_an_error_naming_it() {
        let c = two_pools();
        let red = ns(&[("team", "red")], Some("blue"));
        let e = c.choose(Family::V4, &red).unwrap_err();
        assert!(
            matches!(&e, ChoiceError::NotEligible { by: By::Namespace, name, why: Why::Namespace } if name == "blue"),
            "{e:?}"
        );
        assert!(e.to_string().contains("\"blue\""), "{e}");
        assert!(c.pod_pools(&[Family::V4], &red, |_| None).is_err());
    }

    /// As the operator: a default pool that is missing or Invalid takes the default all the
    /// same (the ADD then finds no address of it and waits).
    #[test]
    fn a_missing_or_invalid_default_pool_is_taken_as_the_default() {
        let mut c = two_pools();
        c.pools.retain(|p| p.name != "default");
        assert_eq!(
            c.choose(Family::V4, &ns(&[], None)).as_deref(),
            Ok("default")
        );
        c.pools.insert(
            0,
            PoolTerms {
                valid: false,
                ..pool("default", &[])
            },
        );
        assert_eq!(
            c.choose(Family::V4, &ns(&[], None)).as_deref(),
            Ok("default")
        );
    }

    /// The node's part: `spec.pools` names its default, and node selectors pick one.
    #[test]
    fn the_default_pool_follows_spec_pools_then_node_selectors() {
        let mut c = two_pools();
        let mut rack = pool("rack", &[]);
        rack.node_selector.match_labels = labels(&[("rack", "r1")]);
        c.pools.push(rack);
        assert_eq!(c.default_pool(Family::V4), "default");
        c.node_labels = labels(&[("rack", "r1")]);
        assert_eq!(c.default_pool(Family::V4), "rack");
        assert_eq!(c.choose(Family::V4, &ns(&[], None)).as_deref(), Ok("rack"));
        c.named.v4 = Some("default".into());
        assert_eq!(
            c.choose(Family::V4, &ns(&[], None)).as_deref(),
            Ok("default")
        );
    }

    /// A new sandbox of a pod takes the pool its earlier address came from, even where the
    /// choice now says otherwise.
    #[test]
    fn a_pod_holding_an_address_keeps_its_pool() {
        let c = two_pools();
        let held = c.pool_of(&"10.1.0.5".parse().unwrap()).cloned();
        assert_eq!(held.as_deref(), Some("blue"));
        let got = (c.pod_pools(&[Family::V4], &ns(&[], None), |_| held.clone())).unwrap();
        assert_eq!(got.v4.as_deref(), Some("blue"));
        assert_eq!(c.pool_of(&"10.9.0.1".parse().unwrap()), None);
    }

    #[test]
    fn outside_leaves_only_the_pods_pools_addresses() {
        let c = two_pools();
        let mut held = set("10.0.0.0/28");
        held.union_with(&set("10.1.0.0/28"));
        let blue = PodPools {
            v4: Some("blue".into()),
            v6: None,
        };
        assert_eq!(c.outside(&held, &blue), set("10.0.0.0/28"));
        let none_yet = PodPools {
            v4: Some("green".into()),
            v6: None,
        };
        assert_eq!(
            c.outside(&held, &none_yet),
            held,
            "no block of it: nothing to take"
        );
    }
}
