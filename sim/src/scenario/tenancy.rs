//! A scenario's pools per namespace and per pod (DESIGN.md "Pools per namespace and per
//! pod"): the cluster pools beyond the flags' `default`, and the namespaces (tenants) new
//! pods are created in, each with its share of them.
//!
//! ```yaml
//! pools:                          # cluster-pool only (--source cluster-pool)
//!   - name: blue
//!     cidrs: [10.64.0.0/16]
//!     namespace_selector: {team: blue}   # matchLabels; absent: every namespace
//!     pod_selector: {app: web}           # matchLabels; absent: every pod
//! tenants:                        # the rest of the pods: no namespace labels, no annotation
//!   - labels: {team: blue}        # the namespace's labels
//!     pools: blue                 # the namespace's ipam.tidepool.dev/pools (optional)
//!     pod_labels: {app: web}      # the pods' labels (optional)
//!     share: 0.3                  # of the new pods
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use tidepool_ipam::pool::choice::{Selector, Subject};

/// A pool of the scenario's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioPool {
    pub name: String,
    pub cidrs: Vec<String>,
    pub namespace_selector: Selector,
    pub pod_selector: Selector,
}

/// A namespace new pods are created in, and its share of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// The namespace's and the pods' labels and annotations, as the pool choice reads them.
    pub subject: Subject,
    pub share: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    name: String,
    cidrs: Vec<String>,
    #[serde(default)]
    namespace_selector: BTreeMap<String, String>,
    #[serde(default)]
    pod_selector: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenant {
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    pools: Option<String>,
    #[serde(default)]
    pod_labels: BTreeMap<String, String>,
    share: f64,
}

fn matching(labels: BTreeMap<String, String>) -> Selector {
    Selector {
        match_labels: labels,
        ..Selector::default()
    }
}

/// The pools, checked: names unique, none named `default` (the flags' pool), each with a
/// CIDR (the pool's own checks follow when the run builds it).
pub(super) fn check_pools(raw: Vec<RawPool>) -> Result<Vec<ScenarioPool>, String> {
    let mut names = BTreeSet::new();
    raw.into_iter()
        .enumerate()
        .map(|(i, p)| {
            let at = format!("pools[{i}] ({})", p.name);
            if p.name.is_empty() || p.name == tidepool_ipam::pool::DEFAULT_POOL {
                return Err(format!("{at}: name it (not `default`: the flags' pool)"));
            }
            if !names.insert(p.name.clone()) {
                return Err(format!("{at}: a second pool of that name"));
            }
            if p.cidrs.is_empty() {
                return Err(format!("{at}: no cidrs"));
            }
            Ok(ScenarioPool {
                name: p.name,
                cidrs: p.cidrs,
                namespace_selector: matching(p.namespace_selector),
                pod_selector: matching(p.pod_selector),
            })
        })
        .collect()
}

/// The tenants, checked: each share in (0, 1], together at most 1.
pub(super) fn check_tenants(raw: Vec<RawTenant>) -> Result<Vec<Tenant>, String> {
    let mut total = 0.0;
    let mut out = Vec::with_capacity(raw.len());
    for (i, t) in raw.into_iter().enumerate() {
        if !(t.share > 0.0 && t.share <= 1.0) {
            return Err(format!(
                "tenants[{i}]: share = {}: must be in (0, 1]",
                t.share
            ));
        }
        total += t.share;
        let subject = Subject {
            namespace_labels: t.labels,
            namespace_pools: t.pools,
            pod_labels: t.pod_labels,
            ..Subject::default()
        };
        out.push(Tenant {
            subject,
            share: t.share,
        });
    }
    if total > 1.0 + 1e-9 {
        return Err(format!("tenants: shares add up to {total}, more than 1"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pools(yaml: &str) -> Result<Vec<ScenarioPool>, String> {
        check_pools(serde_saphyr::from_str(yaml).unwrap())
    }

    fn tenants(yaml: &str) -> Result<Vec<Tenant>, String> {
        check_tenants(serde_saphyr::from_str(yaml).unwrap())
    }

    #[test]
    fn pools_and_tenants_are_read_and_checked_naming_the_entry() {
        let p = pools("- {name: blue, cidrs: [10.64.0.0/16], namespace_selector: {team: blue}}")
            .unwrap();
        assert_eq!(p[0].namespace_selector.match_labels["team"], "blue");
        assert!(p[0].pod_selector.is_empty());
        let e = pools("- {name: default, cidrs: [10.0.0.0/8]}").unwrap_err();
        assert!(e.starts_with("pools[0] (default)"), "{e}");
        let e = pools("- {name: a, cidrs: [10.0.0.0/8]}\n- {name: a, cidrs: [10.1.0.0/16]}")
            .unwrap_err();
        assert!(e.contains("a second pool"), "{e}");
        let t = tenants("- {labels: {team: blue}, pools: blue, share: 0.5}").unwrap();
        assert_eq!(t[0].subject.namespace_pools.as_deref(), Some("blue"));
        let e = tenants("- {share: 0.7}\n- {share: 0.6}").unwrap_err();
        assert!(e.contains("more than 1"), "{e}");
        let e = tenants("- {share: 0}").unwrap_err();
        assert!(e.starts_with("tenants[0]: share = 0"), "{e}");
    }
}
