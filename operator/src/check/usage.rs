//! Per-pool usage: capacity, allocated and free per pool and family, from the index
//! [`PoolSet::rebuild`] made of every block, and the `status.used` entries each pool holds.

use std::collections::HashMap;

use tidepool_api as api;
use tidepool_ipam::pool::{PoolConfig, PoolSet};
use tidepool_ipam::{Family, IpamNode};

use super::report::{Counts, PoolState, PoolUsage};

/// One row per pool (in creation order) and family it serves; `written`: the IPPools as
/// read, for the runway their status shows.
pub(super) fn usage(
    configs: &[PoolConfig],
    set: &PoolSet,
    nodes: &[&IpamNode],
    written: &[api::IPPool],
) -> Vec<PoolUsage> {
    let mut in_use: HashMap<(&str, Family), u64> = HashMap::new();
    for n in nodes {
        for address in n.node.used.keys() {
            if let Some((pool, _)) = set.locate(address) {
                *in_use.entry((pool, Family::of(&address))).or_default() += 1;
            }
        }
    }
    let mut out = Vec::new();
    // `set` holds the configs' pools in the same order
    for (config, (name, validity)) in configs.iter().zip(set.validity()) {
        let spec = &config.spec;
        for f in Family::ALL.into_iter().filter(|f| spec.serves(*f)) {
            let index = validity
                .is_ok()
                .then(|| set.get(name).ok())
                .flatten()
                .and_then(|p| p.family(f));
            let (addresses, blocks) = match index {
                Some(i) => {
                    let a = i.addresses();
                    (
                        Some(Counts::new(a.capacity, a.allocated, a.free)),
                        Some(Counts::new(i.capacity(), i.allocated(), i.free())),
                    )
                }
                None => (None, None),
            };
            out.push(PoolUsage {
                pool: name.to_string(),
                family: f.as_str(),
                cidrs: spec.cidrs_of(f).copied().collect(),
                block_size: *spec.block_size.get(f),
                state: if validity.is_ok() {
                    PoolState::Valid
                } else {
                    PoolState::Invalid
                },
                reason: validity.err().map(|e| e.to_string()),
                addresses,
                blocks,
                in_use: in_use.get(&(name, f)).copied().unwrap_or(0),
                runway_seconds: runway(written, name, f),
            });
        }
    }
    out
}

/// The runway the operator wrote in the status of the IPPool named `name`, for `family`.
fn runway(written: &[api::IPPool], name: &str, family: Family) -> Option<u64> {
    let pool = written
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))?;
    let status = pool.status.as_ref()?;
    let usage = match family {
        Family::V4 => status.ipv4.as_ref(),
        Family::V6 => status.ipv6.as_ref(),
    };
    usage?.runway_seconds
}
