//! Aggregate statistics over all nodes, kept incrementally: each pass replaces its node's
//! contribution, so reading them never walks the nodes.

use crate::plan::NodeSummary;
use crate::types::{Family, PerFamily};
use crate::vocab::Blocked;

/// Totals over one family. A node's counts reach u64::MAX (a /64 block), so the sums over
/// many nodes are kept in i128.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FamilyTotals {
    pub allocated: i128,
    pub used: i128,
    pub free: i128,
    pub cooldown: i128,
    pub needed: i128,
    pub excess: i128,
}

/// Totals over all nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub ips: PerFamily<FamilyTotals>,
    pub nodes: i64,
    pub in_deficit: i64,
    pub at_capacity: i64,
    pub releasing: i64,
    pub blocked: i64,
    pub reclaim_candidates: i64,
    /// Pods waiting for an address, per family (over the families each node serves).
    pub pods_waiting: PerFamily<i128>,
    /// Nodes neither at target nor blocked with a reason ([`NodeSummary::settled`]).
    pub unsettled: i64,
}

impl Stats {
    fn add(&mut self, s: &NodeSummary, sign: i64) {
        for f in Family::ALL {
            let c = s.counts.get(f);
            let z = s.sizing.get(f);
            let t = self.ips.get_mut(f);
            let sign = i128::from(sign);
            t.allocated += sign * i128::from(c.allocated);
            t.used += sign * i128::from(c.used);
            t.free += sign * i128::from(c.free());
            t.cooldown += sign * i128::from(c.cooldown);
            t.needed += sign * i128::from(z.needed);
            t.excess += sign * i128::from(z.excess);
            *self.pods_waiting.get_mut(f) += sign * i128::from(*s.pods_waiting.get(f));
        }
        self.nodes += sign;
        self.in_deficit += sign * i64::from(s.needed() > 0 || s.waiting() > 0);
        self.at_capacity += sign * i64::from(s.blocked.is_some_and(Blocked::out_of_addresses));
        self.releasing += sign * i64::from(s.releasing());
        self.blocked += sign * i64::from(s.blocked.is_some());
        self.reclaim_candidates += sign * s.reclaim_candidates as i64;
        self.unsettled += sign * i64::from(!s.settled());
    }

    /// Replaces one node's contribution (`old` = None for a new node, `new` = None for a
    /// removed one).
    pub fn replace(&mut self, old: Option<&NodeSummary>, new: Option<&NodeSummary>) {
        if let Some(o) = old {
            self.add(o, -1);
        }
        if let Some(n) = new {
            self.add(n, 1);
        }
    }

    /// Sets the aggregate gauges.
    pub fn publish(&self) {
        use tidepool_metrics::{IpsState as St, NodeCategory as Cat, record};
        for f in Family::ALL {
            let t = self.ips.get(f);
            for (state, v) in [
                (St::Allocated, t.allocated),
                (St::Used, t.used),
                (St::Free, t.free),
                (St::Cooldown, t.cooldown),
                (St::Needed, t.needed),
                (St::Excess, t.excess),
            ] {
                record::ips(f.into(), state, v as f64);
            }
        }
        for (category, v) in [
            (Cat::Total, self.nodes),
            (Cat::InDeficit, self.in_deficit),
            (Cat::AtCapacity, self.at_capacity),
            (Cat::Releasing, self.releasing),
            (Cat::Blocked, self.blocked),
        ] {
            record::nodes(category, v as f64);
        }
        record::reclaim_candidates(self.reclaim_candidates as f64);
        for f in Family::ALL {
            record::pods_waiting(f.into(), *self.pods_waiting.get(f) as f64);
        }
    }
}

/// Sets one node's `tidepool_ipam_node_ips` gauges (`--per-node-metrics`), both families,
/// the same states as the cluster-wide `tidepool_ipam_ips`.
pub(crate) fn publish_node(name: &str, s: &NodeSummary) {
    use tidepool_metrics::{IpsState as St, record};
    for f in Family::ALL {
        let c = s.counts.get(f);
        let z = s.sizing.get(f);
        for (state, v) in [
            (St::Allocated, c.allocated),
            (St::Used, c.used),
            (St::Free, c.free()),
            (St::Cooldown, c.cooldown),
            (St::Needed, z.needed),
            (St::Excess, z.excess),
        ] {
            record::node_ips(name, f.into(), state, v as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watermarks::FamilyCounts;

    #[test]
    fn replace_is_incremental() {
        let mut st = Stats::default();
        let mut a = NodeSummary::default();
        a.counts.v4 = FamilyCounts {
            allocated: 10,
            used: 4,
            ..Default::default()
        };
        a.sizing.v4.needed = 2;
        a.pods_waiting.v4 = 3;
        st.replace(None, Some(&a));
        assert_eq!(st.unsettled, 1, "needs addresses: not settled");
        assert_eq!(st.pods_waiting, PerFamily { v4: 3, v6: 0 });
        let mut b = a;
        b.counts.v4.allocated = 12;
        b.sizing.v4.needed = 0;
        b.pods_waiting.v4 = 0;
        st.replace(Some(&a), Some(&b));
        assert_eq!(st.pods_waiting, PerFamily::default());
        assert_eq!(st.ips.v4.allocated, 12);
        assert_eq!(st.ips.v4.free, 8);
        assert_eq!((st.nodes, st.in_deficit, st.unsettled), (1, 0, 0));
        st.replace(Some(&b), None);
        assert_eq!(st, Stats::default());
    }

    /// Nodes holding a /64 each (counts saturated at u64::MAX) add up without wrapping.
    #[test]
    fn nodes_of_a_64_each_add_up() {
        let mut st = Stats::default();
        let mut a = NodeSummary::default();
        a.counts.v6 = FamilyCounts {
            allocated: u64::MAX,
            used: 110,
            ..Default::default()
        };
        a.sizing.v6.excess = u64::MAX - 118;
        for _ in 0..3 {
            st.replace(None, Some(&a));
        }
        assert_eq!(st.ips.v6.allocated, 3 * i128::from(u64::MAX));
        assert_eq!(st.ips.v6.free, 3 * i128::from(u64::MAX - 110));
        assert!(st.ips.v6.excess > 0);
        for _ in 0..3 {
            st.replace(Some(&a), None);
        }
        assert_eq!(st, Stats::default());
    }
}
