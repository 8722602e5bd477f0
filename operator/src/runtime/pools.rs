//! IPPools as the cluster-pool source's [`PoolConfig`]s, fed by an IPPool watch with relist
//! semantics. Pools are taken in creation order (the oldest valid pool wins, DESIGN.md). A
//! spec the engine cannot use (host bits, a block size that does not fit) is read as it is
//! and the source holds the pool as Invalid with the reason (its `Valid=False` condition and
//! `InvalidPool` event); only a string that is no CIDR at all (the API server's `cidr` format
//! refuses those) leaves the pool out, reported with the reason.

use std::collections::BTreeMap;

use kube::runtime::watcher::Event;
use tidepool_api as api;
use tidepool_ipam::pool::PoolConfig;

/// The IPPools seen, by name.
#[derive(Default)]
pub struct Pools {
    pools: BTreeMap<String, api::IPPool>,
    relist: Option<BTreeMap<String, api::IPPool>>,
    pub ready: bool,
    /// How many events changed the pools.
    changes: u64,
}

impl Pools {
    /// Applies one watch event; true when the set of pools or a spec changed.
    pub fn apply(&mut self, ev: &Event<api::IPPool>) -> bool {
        let changed = self.apply_event(ev);
        self.changes += u64::from(changed);
        changed
    }

    /// How many events changed the pools so far: while it is the same, nothing changed.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    fn apply_event(&mut self, ev: &Event<api::IPPool>) -> bool {
        let name = |p: &api::IPPool| p.metadata.name.clone().unwrap_or_default();
        match ev {
            Event::Apply(p) => self.put(name(p), p.clone()),
            Event::Delete(p) => self.pools.remove(&name(p)).is_some(),
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            Event::InitApply(p) => {
                let relist = self.relist.get_or_insert_with(BTreeMap::new);
                relist.insert(name(p), p.clone());
                false
            }
            Event::InitDone => {
                self.ready = true;
                let Some(list) = self.relist.take() else {
                    return false;
                };
                let changed = specs(&list) != specs(&self.pools);
                self.pools = list;
                changed
            }
        }
    }

    fn put(&mut self, name: String, p: api::IPPool) -> bool {
        let changed = self.pools.get(&name).is_none_or(|old| old.spec != p.spec);
        self.pools.insert(name, p);
        changed
    }

    /// The pools as the source takes them, oldest first, and the ones that could not be
    /// read with why.
    pub fn configs(&self) -> (Vec<PoolConfig>, Vec<(String, String)>) {
        let mut ordered: Vec<&api::IPPool> = self.pools.values().collect();
        ordered.sort_by_key(|p| {
            let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            (created, p.metadata.name.clone())
        });
        let mut ok = Vec::new();
        let mut bad = Vec::new();
        for p in ordered {
            let name = p.metadata.name.clone().unwrap_or_default();
            match tidepool_api::convert::pool_config(&name, &p.spec) {
                Ok(c) => ok.push(c),
                Err(e) => bad.push((name, e)),
            }
        }
        (ok, bad)
    }
}

fn specs(m: &BTreeMap<String, api::IPPool>) -> Vec<(&String, &api::IPPoolSpec)> {
    m.iter().map(|(n, p)| (n, &p.spec)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool(name: &str, created: &str, cidrs: &[&str]) -> api::IPPool {
        serde_json::from_value(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
            "metadata": { "name": name, "creationTimestamp": created },
            "spec": { "cidrs": cidrs },
        }))
        .unwrap()
    }

    #[test]
    fn pools_come_oldest_first_and_unreadable_ones_are_reported() {
        let mut p = Pools::default();
        p.apply(&Event::Init);
        p.apply(&Event::InitApply(pool(
            "b",
            "2026-01-01T00:00:00Z",
            &["10.1.0.0/16"],
        )));
        p.apply(&Event::InitApply(pool(
            "a",
            "2026-02-01T00:00:00Z",
            &["fd00::/64"],
        )));
        p.apply(&Event::InitApply(pool(
            "c",
            "2026-03-01T00:00:00Z",
            &["10.2.0.1/16"],
        )));
        p.apply(&Event::InitApply(pool(
            "d",
            "2026-04-01T00:00:00Z",
            &["10.2.0/16"],
        )));
        assert!(p.apply(&Event::InitDone));
        assert!(p.ready);
        let (ok, bad) = p.configs();
        let names: Vec<&str> = ok.iter().map(|c| c.spec.name.as_str()).collect();
        assert_eq!(names, vec!["b", "a", "c"], "creation order, not name order");
        // host bits are read as written: the source holds the pool as Invalid, with why
        let set = tidepool_ipam::pool::PoolSet::new(ok.iter().map(|c| c.spec.clone()).collect());
        let c = set.validity().find(|(n, _)| *n == "c").unwrap().1;
        assert!(
            c.unwrap_err().to_string().contains("host bits set"),
            "{c:?}"
        );
        // only what is no CIDR at all is left out
        assert_eq!(bad.len(), 1);
        assert!(bad[0].0 == "d" && bad[0].1.contains("10.2.0/16"), "{bad:?}");
        // the same spec again changes nothing; a new CIDR does
        assert!(!p.apply(&Event::Apply(pool(
            "b",
            "2026-01-01T00:00:00Z",
            &["10.1.0.0/16"]
        ))));
        assert!(p.apply(&Event::Apply(pool(
            "b",
            "2026-01-01T00:00:00Z",
            &["10.1.0.0/16", "10.3.0.0/16"]
        ))));
        assert!(p.apply(&Event::Delete(pool("a", "2026-02-01T00:00:00Z", &[]))));
        assert_eq!(p.configs().0.len(), 2);
    }
}
