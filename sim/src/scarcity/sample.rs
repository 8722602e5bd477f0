//! The world's pools as the promise's counter reads them ([`PoolSample`]), from the store
//! (the nodes' used and cooling addresses, their blocks) and the kubelets' queues: the
//! truth, not the engine's view.

use std::collections::BTreeMap;
use std::sync::Arc;

use tidepool_ipam::{AddrSet, BlockStore, Family, IpamNode, NodeName};

use super::PoolKey;
use super::promise::PoolSample;
use crate::world::{SimSource, World};

/// One node's holdings in one pool: free addresses in blocks that hold a used or cooling
/// one, and idle units (whole blocks with neither; free addresses of a per-address source).
#[derive(Debug, Default, Clone, Copy)]
struct Holding {
    free_in_use: u128,
    idle: u64,
    waiting: u128,
}

/// `key`'s sample in `out`, made with the pool's capacity and unit on first use.
fn entry<'a, S: SimSource>(
    out: &'a mut BTreeMap<PoolKey, (PoolSample, u64)>,
    world: &World<S>,
    key: &PoolKey,
) -> &'a mut (PoolSample, u64) {
    out.entry(key.clone()).or_insert_with(|| {
        let (capacity, unit) = world.pool_size(key);
        let sample = PoolSample {
            capacity,
            ..PoolSample::default()
        };
        (sample, unit)
    })
}

/// Every pool's sample now, with the capacity (usable addresses, addresses per unit) the
/// source gives it.
pub(crate) fn sample<S: SimSource>(world: &World<S>) -> BTreeMap<PoolKey, (PoolSample, u64)> {
    let mut out = BTreeMap::<PoolKey, (PoolSample, u64)>::new();
    let mut holdings = BTreeMap::<(PoolKey, NodeName), Holding>::new();
    let utc = tidepool_ipam::Clock::utc(&*world.clock);
    for n in world.store.list() {
        for (key, addrs, block) in pieces(world, &n) {
            let used = count_in(n.node.used.keys(), &addrs, key.family);
            let cooling = count_in(n.node.cooling(utc).copied(), &addrs, key.family);
            let fam = addrs.len(key.family);
            let s = entry(&mut out, world, &key);
            (s.0.used, s.0.cooldown) = (s.0.used + used, s.0.cooldown + cooling);
            let h = holdings.entry((key, n.name.clone())).or_default();
            let free = fam.saturating_sub(used + cooling);
            match block {
                true if used + cooling == 0 => h.idle += 1,
                true => h.free_in_use += free,
                false => h.idle += u64::try_from(free).unwrap_or(u64::MAX),
            }
        }
    }
    for (node, uid, since, keys) in world.waiting_pods() {
        for key in keys {
            let s = entry(&mut out, world, &key);
            s.0.waiting.push((node.clone(), uid, since));
            holdings.entry((key, node.clone())).or_default().waiting += 1;
        }
    }
    for ((key, node), h) in holdings {
        let Some((s, unit)) = out.get_mut(&key) else {
            continue;
        };
        let spare = beyond_need(h, *unit, world.source.grants_blocks());
        if spare > 0 {
            s.holders.push((node, spare));
        }
    }
    out
}

/// The idle units a node holds beyond its own waiting pods' need.
fn beyond_need(h: Holding, unit: u64, blocks: bool) -> u64 {
    if !blocks {
        return h
            .idle
            .saturating_sub(u64::try_from(h.waiting).unwrap_or(u64::MAX));
    }
    let short = h.waiting.saturating_sub(h.free_in_use);
    let needed = short.div_ceil(u128::from(unit.max(1)));
    h.idle
        .saturating_sub(u64::try_from(needed).unwrap_or(u64::MAX))
}

/// The node's holdings cut by pool: each block of a block source (true), else its
/// addresses of each family in the node's pool (false).
fn pieces<S: SimSource>(world: &World<S>, n: &IpamNode) -> Vec<(PoolKey, Arc<AddrSet>, bool)> {
    if world.source.grants_blocks() {
        return (world.store.blocks_of(&n.name).iter())
            .map(|b| {
                let family = Family::of(&b.cidr.network());
                let key = PoolKey {
                    pool: Arc::from(&*b.pool),
                    family,
                };
                (key, Arc::new(world.source.block_addresses(b)), true)
            })
            .collect();
    }
    (world.cfg.families.iter())
        .map(|&family| {
            let key = world.pool_key(&n.name, family, None);
            (key, n.operator.addresses.clone(), false)
        })
        .collect()
}

/// How many of `addrs` of `family` lie in `set`.
fn count_in(addrs: impl Iterator<Item = std::net::IpAddr>, set: &AddrSet, family: Family) -> u128 {
    addrs
        .filter(|a| Family::of(a) == family && set.contains(a))
        .count() as u128
}
