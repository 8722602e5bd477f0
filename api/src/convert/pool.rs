//! IPPool: its spec as the engine's [`PoolSpec`], read as written (not validated: a pool the
//! API server accepted but the engine cannot use still names its pool, and is held Invalid
//! with [`PoolSpec::validate`]'s reason).

use tidepool_ipam::PerFamily;
use tidepool_ipam::pool::PoolSpec;

use crate as api;
use crate::IPPoolSpec;

/// Pool `name`'s spec; an error (naming the pool and the value) only for a string that is
/// no CIDR at all.
pub fn pool_spec(name: &str, spec: &IPPoolSpec) -> Result<PoolSpec, String> {
    let cidrs: Vec<&str> = spec.cidrs.iter().map(|c| c.0.as_str()).collect();
    let exclude: Vec<&str> = spec.exclude.iter().map(|c| c.0.as_str()).collect();
    let block_size = PerFamily {
        v4: spec.block_size.ipv4,
        v6: spec.block_size.ipv6,
    };
    PoolSpec::read(name, &cidrs, block_size, &exclude).map_err(|e| e.to_string())
}

/// An address count for people (`kubectl get`): exact below a million, `2^k` for a power
/// of two, else three significant digits rounded down (`1.84e19`: free space is never
/// overstated).
pub fn readable_count(n: u128) -> String {
    if n < 1_000_000 {
        return n.to_string();
    }
    if n.is_power_of_two() {
        return format!("2^{}", n.trailing_zeros());
    }
    let exp = n.ilog10();
    let digits = n / 10u128.pow(exp - 2);
    format!("{}.{:02}e{exp}", digits / 100, digits % 100)
}

/// The readable counts of one family's usage.
pub fn readable_usage(capacity: u128, allocated: u128, free: u128) -> api::UsageReadable {
    api::UsageReadable {
        capacity: readable_count(capacity),
        allocated: readable_count(allocated),
        free: readable_count(free),
    }
}

#[cfg(test)]
mod readable_tests {
    use super::readable_count;

    #[test]
    fn counts_read_as_people_read_them() {
        assert_eq!(readable_count(0), "0");
        assert_eq!(readable_count(999_999), "999999");
        assert_eq!(readable_count(1 << 24), "2^24");
        assert_eq!(readable_count(1 << 64), "2^64");
        assert_eq!(readable_count(u128::MAX), "3.40e38");
        assert_eq!(readable_count((1 << 64) - 16), "1.84e19");
        assert_eq!(readable_count(16_777_200), "1.67e7");
        assert_eq!(readable_count(1_000_001), "1.00e6");
    }
}
