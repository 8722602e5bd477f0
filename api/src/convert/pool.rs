//! IPPool: its spec as the engine's [`PoolSpec`], read as written (not validated: a pool the
//! API server accepted but the engine cannot use still names its pool, and is held Invalid
//! with [`PoolSpec::validate`]'s reason).

use tidepool_ipam::PerFamily;
use tidepool_ipam::pool::PoolSpec;

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
