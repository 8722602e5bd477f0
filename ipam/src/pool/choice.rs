//! A pod's pool per family (DESIGN.md "Pools per namespace and per pod"): one pure function,
//! [`choose`], for both the operator (demand, until the pod's first ADD) and the agent (at
//! ADD).
//!
//! A pool is *eligible* for a pod and a family when it is valid, serves the family, its
//! `nodeSelector` matches the pod's node (or the node's IPAMNode `spec.pools` names it), its
//! `namespaceSelector` matches the pod's namespace — **the access control** — and its
//! `podSelector` matches the pod (a convenience only: the pod's creator sets its labels). The
//! choice, in order:
//! 1. the pool of the family named by the pod's annotation [`POOLS_ANNOTATION`];
//! 2. else the one named by the namespace's annotation;
//! 3. else the first eligible pool whose `namespaceSelector` or `podSelector` is not empty
//!    (pools come oldest first: creationTimestamp, then name);
//! 4. else the node's default pool for the family (IPAMNode `spec.pools`, node selectors,
//!    then `default`: [`super::ClusterPoolSource::pool_of`]), if it is eligible.
//!
//! An annotation that names a pool that is not eligible is an error: it never falls through
//! to the next rule. The annotation's value is a comma-separated list of pool names (at most
//! one per family); a family none of them serves falls through.

use std::collections::BTreeMap;

use crate::types::Family;

/// The pod and namespace annotation that names a pod's pools.
pub const POOLS_ANNOTATION: &str = "ipam.tidepool.dev/pools";

/// Labels, as on an object.
pub type Labels = BTreeMap<String, String>;

/// A `matchExpressions` operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operator {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

/// A Kubernetes label selector: every `matchLabels` pair and every expression must hold.
/// Empty: it selects everything (a pool without the selector).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub match_labels: Labels,
    pub match_expressions: Vec<(String, Operator)>,
}

impl Selector {
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Whether `labels` satisfy every requirement (apimachinery's `LabelSelectorAsSelector`:
    /// `NotIn` and `DoesNotExist` hold for a missing key).
    pub fn matches(&self, labels: &Labels) -> bool {
        let pairs = (self.match_labels.iter()).all(|(k, v)| labels.get(k) == Some(v));
        pairs
            && self.match_expressions.iter().all(|(k, op)| {
                let v = labels.get(k);
                match op {
                    Operator::In(vs) => v.is_some_and(|v| vs.contains(v)),
                    Operator::NotIn(vs) => v.is_none_or(|v| !vs.contains(v)),
                    Operator::Exists => v.is_some(),
                    Operator::DoesNotExist => v.is_none(),
                }
            })
    }
}

/// What the choice needs of one pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolTerms {
    pub name: String,
    /// Valid (its `Valid` condition True).
    pub valid: bool,
    /// The families it has CIDRs of.
    pub v4: bool,
    pub v6: bool,
    pub node_selector: Selector,
    pub namespace_selector: Selector,
    pub pod_selector: Selector,
}

impl PoolTerms {
    fn serves(&self, family: Family) -> bool {
        match family {
            Family::V4 => self.v4,
            Family::V6 => self.v6,
        }
    }
}

/// The pod, its namespace and its node, as the choice sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subject {
    pub pod_labels: Labels,
    /// The pod's [`POOLS_ANNOTATION`].
    pub pod_pools: Option<String>,
    pub namespace_labels: Labels,
    /// The namespace's [`POOLS_ANNOTATION`].
    pub namespace_pools: Option<String>,
    pub node_labels: Labels,
    /// The pools the node's IPAMNode `spec.pools` names (either family).
    pub node_pools: Vec<String>,
}

/// Why a pod has no pool for a family.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChoiceError {
    #[error("the {by} annotation {POOLS_ANNOTATION} names {name:?}, which is no pool")]
    NoSuchPool { by: By, name: String },
    #[error(
        "the {by} annotation {POOLS_ANNOTATION} names pool {name:?}, which the pod may not use: {why}"
    )]
    NotEligible { by: By, name: String, why: Why },
    #[error("the {by} annotation {POOLS_ANNOTATION} names two pools of {}: {first:?} and {second:?}", family.as_str())]
    TwoForFamily {
        by: By,
        family: Family,
        first: String,
        second: String,
    },
    #[error("no pool of {} the pod may use (the node's default {default:?} {why})", family.as_str())]
    NoEligiblePool {
        family: Family,
        default: Option<String>,
        why: Why,
    },
}

impl ChoiceError {
    /// The pool the pod is refused: the one its annotation names, or the node's default it
    /// may not use (None: the annotation names two, or there is no default).
    pub fn pool(&self) -> Option<&str> {
        match self {
            ChoiceError::NoSuchPool { name, .. } | ChoiceError::NotEligible { name, .. } => {
                Some(name)
            }
            ChoiceError::TwoForFamily { .. } => None,
            ChoiceError::NoEligiblePool { default, .. } => default.as_deref(),
        }
    }
}

/// Whose annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    Pod,
    Namespace,
}

impl std::fmt::Display for By {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            By::Pod => "pod's",
            By::Namespace => "namespace's",
        })
    }
}

/// Why a pool is not eligible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    Invalid,
    OtherFamily,
    Node,
    Namespace,
    Pod,
    Missing,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Why::Invalid => "it is not valid",
            Why::OtherFamily => "it serves no address of the family",
            Why::Node => "its nodeSelector does not select the pod's node",
            Why::Namespace => "its namespaceSelector does not select the pod's namespace",
            Why::Pod => "its podSelector does not select the pod",
            Why::Missing => "is no pool",
        })
    }
}

/// The node's default pool for a family (rule 4; DESIGN.md "Resources", IPAMNode
/// `spec.pools`): the pool `spec.pools` names for it, else the first of `candidates` (the
/// valid pools serving the family, oldest first, with their `nodeSelector` labels) whose
/// non-empty node selector the node's `labels` match, else [`super::DEFAULT_POOL`]. The
/// operator's source and the agent both call it.
pub fn default_pool<'a>(
    named: Option<&str>,
    candidates: impl IntoIterator<Item = (&'a str, &'a Labels)>,
    labels: &Labels,
) -> String {
    if let Some(p) = named {
        return p.to_string();
    }
    let selects = |sel: &Labels| (sel.iter()).all(|(k, v)| labels.get(k) == Some(v));
    let by_selector = (candidates.into_iter()).find(|(_, sel)| !sel.is_empty() && selects(sel));
    by_selector.map_or_else(
        || super::DEFAULT_POOL.to_string(),
        |(name, _)| name.to_string(),
    )
}

/// Whether `pool` may serve `subject` in `family`, or why not.
pub fn eligible(pool: &PoolTerms, family: Family, subject: &Subject) -> Result<(), Why> {
    let node_ok =
        pool.node_selector.matches(&subject.node_labels) || subject.node_pools.contains(&pool.name);
    let checks = [
        (pool.valid, Why::Invalid),
        (pool.serves(family), Why::OtherFamily),
        (node_ok, Why::Node),
        (
            pool.namespace_selector.matches(&subject.namespace_labels),
            Why::Namespace,
        ),
        (pool.pod_selector.matches(&subject.pod_labels), Why::Pod),
    ];
    checks
        .into_iter()
        .find(|(ok, _)| !ok)
        .map_or(Ok(()), |(_, why)| Err(why))
}

/// The pod's pool for `family`: `pools` oldest first, `default` the node's default pool for
/// the family (rule 4).
pub fn choose(
    family: Family,
    pools: &[PoolTerms],
    subject: &Subject,
    default: Option<&str>,
) -> Result<String, ChoiceError> {
    let annotations = [
        (By::Pod, subject.pod_pools.as_deref()),
        (By::Namespace, subject.namespace_pools.as_deref()),
    ];
    for (by, value) in annotations {
        if let Some(name) = named(by, value, family, pools, subject)? {
            return Ok(name);
        }
    }
    let selected = pools.iter().find(|p| {
        !(p.namespace_selector.is_empty() && p.pod_selector.is_empty())
            && eligible(p, family, subject).is_ok()
    });
    if let Some(p) = selected {
        return Ok(p.name.clone());
    }
    let why = match default.and_then(|d| pools.iter().find(|p| p.name == d)) {
        Some(p) => match eligible(p, family, subject) {
            Ok(()) => return Ok(p.name.clone()),
            Err(why) => why,
        },
        None => Why::Missing,
    };
    Err(ChoiceError::NoEligiblePool {
        family,
        default: default.map(String::from),
        why,
    })
}

/// The pool of `family` an annotation's `value` names (None: it names none of the family),
/// or why the annotation is wrong. Every name must be a pool; a pool of the family must be
/// eligible.
fn named(
    by: By,
    value: Option<&str>,
    family: Family,
    pools: &[PoolTerms],
    subject: &Subject,
) -> Result<Option<String>, ChoiceError> {
    let names = value.into_iter().flat_map(|v| v.split(',')).map(str::trim);
    let mut chosen: Option<&PoolTerms> = None;
    for name in names.filter(|n| !n.is_empty()) {
        let Some(pool) = pools.iter().find(|p| p.name == name) else {
            return Err(ChoiceError::NoSuchPool {
                by,
                name: name.into(),
            });
        };
        if !pool.serves(family) {
            continue;
        }
        if let Some(first) = chosen {
            return Err(ChoiceError::TwoForFamily {
                by,
                family,
                first: first.name.clone(),
                second: name.into(),
            });
        }
        eligible(pool, family, subject).map_err(|why| ChoiceError::NotEligible {
            by,
            name: name.into(),
            why,
        })?;
        chosen = Some(pool);
    }
    Ok(chosen.map(|p| p.name.clone()))
}

#[cfg(test)]
#[path = "choice_tests.rs"]
mod tests;
