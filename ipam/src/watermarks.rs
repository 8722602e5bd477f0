//! Watermarks and the pool-size formulas (DESIGN.md "The engine"; Cilium's
//! calculateNeededIPs / calculateExcessIPs, research §1.3/§1.4), per node and family.

use crate::error::IpamError;
use crate::types::WatermarkOverrides;

/// Pool-size targets of one node and family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    /// Free addresses to keep on hand (0 = none; Cilium cannot express 0, we can).
    pub pre_allocate: u32,
    /// Never hold fewer addresses than this (0 = no floor).
    pub min_allocate: u32,
    /// Hard cap on the pool (0 = none).
    pub max_allocate: u32,
    /// Extra addresses claimed on top of `needed` in one pass.
    pub max_above_watermark: u32,
}

impl Default for Watermarks {
    fn default() -> Self {
        Self {
            pre_allocate: 8,
            min_allocate: 0,
            max_allocate: 0,
            max_above_watermark: 0,
        }
    }
}

impl Watermarks {
    /// Rejects combinations that cannot be satisfied, naming the field.
    pub fn validate(&self) -> Result<(), IpamError> {
        if self.max_allocate > 0 && self.min_allocate > self.max_allocate {
            return Err(IpamError::InvalidWatermarks {
                field: "min_allocate",
                value: self.min_allocate.to_string(),
                reason: format!("above max_allocate {}", self.max_allocate),
            });
        }
        Ok(())
    }

    /// These watermarks with a node's `spec.watermarks` overrides applied, validated.
    pub fn with_overrides(&self, o: &WatermarkOverrides) -> Result<Watermarks, IpamError> {
        let w = Watermarks {
            pre_allocate: o.pre_allocate.unwrap_or(self.pre_allocate),
            min_allocate: o.min_allocate.unwrap_or(self.min_allocate),
            max_allocate: o.max_allocate.unwrap_or(self.max_allocate),
            max_above_watermark: o.max_above_watermark.unwrap_or(self.max_above_watermark),
        };
        w.validate()?;
        Ok(w)
    }
}

/// Cilium's calculateNeededIPs on (available, used), literally.
pub fn cilium_needed(w: &Watermarks, available: u64, used: u64) -> u64 {
    let (avail, used) = (available as i128, used as i128);
    let mut needed = w.pre_allocate as i128 - (avail - used);
    if w.min_allocate > 0 {
        needed = needed.max(w.min_allocate as i128 - avail);
    }
    if w.max_allocate > 0 && avail + needed > w.max_allocate as i128 {
        needed = w.max_allocate as i128 - avail;
    }
    needed.max(0) as u64
}

/// Cilium's current calculateExcessIPs on (available, used), literally.
pub fn cilium_excess(w: &Watermarks, available: u64, used: u64) -> u64 {
    let upper = w.min_allocate as u64 + w.max_above_watermark as u64;
    if used <= upper {
        if available <= upper {
            return 0;
        }
        if used + w.pre_allocate as u64 <= upper {
            return available - upper;
        }
    }
    available.saturating_sub(used + w.pre_allocate as u64 + w.max_above_watermark as u64)
}

/// What one node holds and needs in one family at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FamilyCounts {
    /// Addresses in the node's pool.
    pub allocated: u64,
    /// Addresses with a `used` entry.
    pub used: u64,
    /// Pods on the node with no `used` entry of this family yet.
    pub waiting: u64,
    /// Addresses in reuse cooldown (not usable yet).
    pub cooldown: u64,
    /// Addresses marked for release (not usable).
    pub marked: u64,
}

impl FamilyCounts {
    pub fn demand(&self) -> u64 {
        self.used + self.waiting
    }

    /// Free, usable addresses.
    pub fn free(&self) -> u64 {
        self.allocated
            .saturating_sub(self.used + self.cooldown + self.marked)
    }
}

/// The pool-size decision for one node and family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizing {
    pub needed: u64,
    pub excess: u64,
    /// Addresses to claim this pass, before the source rounds up to whole blocks.
    pub claim: u64,
    /// How many more addresses may be marked for release this pass.
    pub mark: u64,
    /// Demand the pool cannot meet — `needed > 0`, or pods waiting beyond the free
    /// addresses (Cilium's formula clamps `needed` to 0 at a set `max_allocate`) — and the
    /// cap leaves no room.
    pub at_cap: bool,
}

/// The hard cap on a node's pool: `max_allocate` if set, and the node's allocatable pods
/// rounded up to a whole block (`block` addresses), whichever is smaller. `None` = no cap.
pub fn pool_cap(w: &Watermarks, allocatable_pods: Option<u32>, block: u128) -> Option<u64> {
    let block = block.max(1);
    let pods_cap = allocatable_pods
        .map(|p| crate::addrs::saturate(u128::from(p).div_ceil(block).saturating_mul(block)));
    match (w.max_allocate, pods_cap) {
        (0, c) => c,
        (m, None) => Some(m as u64),
        (m, Some(c)) => Some(c.min(m as u64)),
    }
}

/// DESIGN.md's per-family sizing: `needed` on (allocated − cooldown − marked, demand),
/// `excess` on (allocated − cooldown, demand), a claim of
/// min(needed + max_above_watermark, cap − allocated), and the number of new marks.
pub fn size(w: &Watermarks, c: &FamilyCounts, cap: Option<u64>) -> Sizing {
    let demand = c.demand();
    let usable = c.allocated.saturating_sub(c.cooldown + c.marked);
    // pre-allocate counts usable free addresses; min-allocate counts what the node holds
    // (cooling addresses come back, marked ones leave)
    let mut needed = cilium_needed(
        &Watermarks {
            min_allocate: 0,
            ..*w
        },
        usable,
        demand,
    );
    if w.min_allocate > 0 {
        let held = c.allocated.saturating_sub(c.marked);
        needed = needed.max((w.min_allocate as u64).saturating_sub(held));
    }
    let excess = cilium_excess(w, c.allocated.saturating_sub(c.cooldown), demand);
    let room = cap.map_or(u64::MAX, |cap| cap.saturating_sub(c.allocated));
    // Never claim into what the excess formula would call excess right after (Cilium's
    // middle branch: used + pre ≤ min + above releases everything above min + above).
    let upper = w.min_allocate as u64 + w.max_above_watermark as u64;
    let no_excess_up_to = if demand <= upper && demand + w.pre_allocate as u64 <= upper {
        upper
    } else {
        demand + w.pre_allocate as u64 + w.max_above_watermark as u64
    };
    let base = c.allocated.saturating_sub(c.cooldown);
    let claim = if needed == 0 {
        0
    } else {
        (needed + w.max_above_watermark as u64)
            .min(needed.max(no_excess_up_to.saturating_sub(base)))
            .min(room)
    };
    Sizing {
        needed,
        excess,
        claim,
        mark: if needed > 0 {
            0
        } else {
            excess.saturating_sub(c.marked)
        },
        at_cap: room == 0 && (needed > 0 || c.waiting > c.free()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wm(pre: u32, min: u32, max: u32, above: u32) -> Watermarks {
        Watermarks {
            pre_allocate: pre,
            min_allocate: min,
            max_allocate: max,
            max_above_watermark: above,
        }
    }

    /// Cilium's neededDef table (NT-main): (available, used, pre, min, max) -> needed.
    #[test]
    fn cilium_needed_table() {
        let rows: [(u64, u64, u32, u32, u32, u64); 10] = [
            (0, 0, 0, 16, 0, 16),
            (0, 0, 8, 16, 0, 16),
            (0, 0, 16, 8, 0, 16),
            (0, 0, 16, 0, 0, 16),
            (8, 0, 0, 16, 0, 8),
            (8, 4, 8, 0, 0, 4),
            (8, 4, 8, 8, 0, 4),
            (8, 4, 8, 8, 6, 0),
            (8, 4, 8, 0, 8, 0),
            (4, 4, 8, 0, 8, 4),
        ];
        for (avail, used, pre, min, max, want) in rows {
            assert_eq!(
                cilium_needed(&wm(pre, min, max, 0), avail, used),
                want,
                "needed({avail},{used},pre {pre},min {min},max {max})"
            );
        }
    }

    /// Cilium's excessDef table (NT-main): (available, used, pre, min, maxAbove) -> excess.
    #[test]
    fn cilium_excess_table() {
        let rows: [(u64, u64, u32, u32, u32, u64); 10] = [
            (0, 0, 0, 16, 0, 0),
            (15, 0, 8, 16, 8, 0),
            (17, 0, 8, 16, 0, 1),
            (20, 0, 8, 16, 4, 0),
            (21, 0, 8, 0, 4, 9),
            (20, 0, 8, 20, 8, 0),
            (16, 1, 8, 16, 8, 0),
            (20, 4, 8, 17, 8, 0),
            (20, 4, 8, 0, 0, 8),
            (20, 4, 8, 0, 8, 0),
        ];
        for (avail, used, pre, min, above, want) in rows {
            assert_eq!(
                cilium_excess(&wm(pre, min, 0, above), avail, used),
                want,
                "excess({avail},{used},pre {pre},min {min},above {above})"
            );
        }
    }

    fn counts(allocated: u64, used: u64, waiting: u64, cooldown: u64, marked: u64) -> FamilyCounts {
        FamilyCounts {
            allocated,
            used,
            waiting,
            cooldown,
            marked,
        }
    }

    #[test]
    fn waiting_pods_count_as_demand() {
        // A fresh node with 30 pods waiting and pre-allocate 8 claims 38 at once.
        let s = size(&wm(8, 0, 0, 0), &counts(0, 0, 30, 0, 0), None);
        assert_eq!((s.needed, s.claim), (38, 38));
    }

    #[test]
    fn pre_allocate_zero_still_serves_waiting_pods() {
        let s = size(&wm(0, 0, 0, 0), &counts(0, 0, 5, 0, 0), None);
        assert_eq!((s.needed, s.claim), (5, 5));
        // and holds nothing spare once they run
        let s = size(&wm(0, 0, 0, 0), &counts(5, 5, 0, 0, 0), None);
        assert_eq!((s.needed, s.claim, s.excess), (0, 0, 0));
    }

    #[test]
    fn max_allocate_is_a_hard_cap() {
        let w = wm(8, 0, 20, 4);
        let s = size(&w, &counts(16, 16, 0, 0, 0), pool_cap(&w, None, 1));
        assert_eq!(s.needed, 4); // capped by max 20
        assert_eq!(s.claim, 4); // max_above_watermark does not pass the cap
        // at the cap with pods waiting: nothing to claim, and blocked at the cap (DESIGN:
        // settled = at target or blocked with a reason)
        let s = size(&w, &counts(20, 20, 3, 0, 0), pool_cap(&w, None, 1));
        assert_eq!((s.needed, s.claim, s.at_cap), (0, 0, true));
        // at the cap with free addresses for every waiting pod: not blocked
        let s = size(&w, &counts(20, 16, 3, 0, 0), pool_cap(&w, None, 1));
        assert!(!s.at_cap);
    }

    #[test]
    fn allocatable_pods_cap_rounds_up_to_a_block() {
        let w = wm(8, 0, 0, 0);
        assert_eq!(pool_cap(&w, Some(30), 16), Some(32));
        assert_eq!(pool_cap(&w, Some(32), 16), Some(32));
        assert_eq!(pool_cap(&wm(8, 0, 20, 0), Some(30), 16), Some(20));
        assert_eq!(pool_cap(&w, None, 16), None);
        let s = size(&w, &counts(32, 30, 0, 0, 0), pool_cap(&w, Some(30), 16));
        assert_eq!((s.needed, s.claim, s.at_cap), (6, 0, true));
    }

    #[test]
    fn cooldown_is_not_usable_but_not_excess() {
        // 10 allocated, 2 used, 4 in cooldown: only 4 usable free, pre 8 → need 4 more.
        let s = size(&wm(8, 0, 0, 0), &counts(10, 2, 0, 4, 0), None);
        assert_eq!(s.needed, 4);
        // excess counts allocated − cooldown = 6 against used 2 + pre 8: none.
        assert_eq!(s.excess, 0);
    }

    #[test]
    fn marked_addresses_keep_the_handshake_justified() {
        // 20 allocated, 4 used, pre 8: excess 8. With 5 already marked, 3 more may be marked.
        let s = size(&wm(8, 0, 0, 0), &counts(20, 4, 0, 0, 5), None);
        assert_eq!(s.excess, 8);
        assert_eq!(s.mark, 3);
        // marked addresses are not usable: 20 − 5 = 15 usable, 4 used → 11 free ≥ 8
        assert_eq!(s.needed, 0);
        // all 8 marked: nothing more to mark, and still no need
        let s = size(&wm(8, 0, 0, 0), &counts(20, 4, 0, 0, 8), None);
        assert_eq!((s.needed, s.mark, s.excess), (0, 0, 8));
    }

    #[test]
    fn invalid_combinations_name_the_field() {
        let err = wm(8, 30, 20, 0).validate().unwrap_err();
        assert!(matches!(
            err,
            IpamError::InvalidWatermarks {
                field: "min_allocate",
                ..
            }
        ));
        assert!(err.to_string().contains("min_allocate"));
        // pre-allocate above the cap is allowed (Cilium's table has pre 8, max 6): the cap wins.
        assert!(wm(30, 0, 20, 0).validate().is_ok());
        assert!(wm(8, 20, 0, 0).validate().is_ok());
        let o = WatermarkOverrides {
            min_allocate: Some(10),
            max_allocate: Some(4),
            ..Default::default()
        };
        assert!(Watermarks::default().with_overrides(&o).is_err());
    }
}
