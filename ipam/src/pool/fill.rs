//! How full the claimed blocks of each pool are: the measure behind
//! `tidepool_ipam_pool_blocks{pool, family, state = full | partial | empty}`.
//!
//! A pool's free-address count (`tidepool_ipam_pool_ips`) says how much is left to grant;
//! it does not say how much of what was granted sits unused on nodes. Counting the claimed
//! blocks by how many of their usable addresses have a `used` entry of the node holding them
//! does: many partial blocks spread over nodes, or empty ones, are addresses stranded by
//! fragmentation (each node holds at least one partly used block per family), and a
//! smaller block size or lower watermarks give them back.
//!
//! The addresses of the *idle* blocks (`tidepool_ipam_pool_ips{state="idle"}`) are what a
//! release can give back at once: empty blocks whose holder has no address of them cooling
//! down either. With the pool's free addresses they are what the pool could still grant,
//! which the exhaustion forecast alert follows.

use std::collections::BTreeMap;

use foldhash::HashMap;
use std::time::SystemTime;

use ipnet::IpNet;

use super::PoolSet;
use super::repair::BlockClaim;
use crate::types::{Family, FewByAddr, IpamNode, UsedMap};

/// Claimed blocks of one pool and family by fill.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockFill {
    /// Every usable address has a `used` entry.
    pub full: u64,
    /// Some usable addresses have one, some not.
    pub partial: u64,
    /// No address has one.
    pub empty: u64,
    /// The usable addresses of the empty blocks of which no address cools down either (a
    /// `cooldown` entry of the node holding it, as the node side last published it, not
    /// ended): whole free blocks.
    pub idle_addresses: u128,
}

impl BlockFill {
    fn add(&mut self, used: u128, cooling: bool, usable: u128) {
        match used {
            0 => {
                self.empty += 1;
                if !cooling {
                    self.idle_addresses += usable;
                }
            }
            u if u >= usable => self.full += 1,
            _ => self.partial += 1,
        }
    }
}

/// The fill of every valid pool and family it serves (zeros included, so a pool whose
/// blocks all went back shows 0, not its last count). Blocks of pools that are gone or
/// invalid, and blocks their pool no longer grants (a CIDR removed or excluded: being
/// drained), are not counted. A block's used and cooling addresses are the `used` and
/// `cooldown` entries of the IPAMNode it names that lie in its CIDR; a cooldown ended at
/// `utc` counts for nothing.
pub fn block_fill<N: std::borrow::Borrow<IpamNode>>(
    pools: &PoolSet,
    blocks: &[BlockClaim],
    ipam_nodes: &[N],
    utc: SystemTime,
) -> BTreeMap<(String, Family), BlockFill> {
    let mut out = BTreeMap::new();
    for p in pools.valid() {
        for f in Family::ALL {
            if p.family(f).is_some() {
                out.insert((p.name().to_string(), f), BlockFill::default());
            }
        }
    }
    let by_name: HashMap<&str, &IpamNode> = ipam_nodes
        .iter()
        .map(|n| {
            let n = n.borrow();
            (&*n.name, n)
        })
        .collect();
    for b in blocks {
        let f = Family::of(&b.cidr.network());
        let Some(fill) = out.get_mut(&(b.pool.to_string(), f)) else {
            continue;
        };
        let usable = pools
            .get(&b.pool)
            .ok()
            .and_then(|p| p.family(f))
            .and_then(|fi| fi.usable_count(&b.cidr).ok());
        let Some(usable) = usable else {
            continue;
        };
        let holder = by_name.get(&*b.node);
        let used = holder.map_or(0, |n| used_in(&n.node.used, &b.cidr));
        let cooling = holder.is_some_and(|n| cools_in(&n.node.cooldown, &b.cidr, utc));
        fill.add(used, cooling, usable);
    }
    out
}

/// How many of the ascending addresses lie in `net` (two binary searches).
pub fn used_in<E>(used: &UsedMap<E>, net: &IpNet) -> u128 {
    let start = used.rank(&net.network(), false);
    let end = used.rank(&net.broadcast(), true);
    (end - start) as u128
}

/// Whether any address of `net` cools down at `utc`.
fn cools_in(cooldown: &FewByAddr<SystemTime>, net: &IpNet, utc: SystemTime) -> bool {
    let entries = cooldown.as_slice();
    let start = entries.partition_point(|(a, _)| *a < net.network());
    (entries[start..].iter())
        .take_while(|(a, _)| *a <= net.broadcast())
        .any(|(_, until)| *until > utc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{BlockRecord, PoolSpec};
    use crate::types::{AllocationId, NodeUid, PodName, PodUid, UsedEntry};
    use std::sync::Arc;

    fn entry(i: u128) -> UsedEntry {
        UsedEntry {
            pod_uid: PodUid(i),
            pod: PodName::new("ns", "p"),
            allocation: AllocationId(1),
            since: SystemTime::UNIX_EPOCH.into(),
        }
    }

    fn claim(pool: &str, cidr: &str, node: &str) -> BlockClaim {
        BlockClaim {
            name: Arc::from(cidr),
            pool: Arc::from(pool),
            cidr: cidr.parse().unwrap(),
            node: node.into(),
            node_uid: NodeUid(1),
        }
    }

    fn node(name: &str, addrs: &[&str]) -> IpamNode {
        let mut n = IpamNode::new(name.into(), NodeUid(1));
        for (i, a) in addrs.iter().enumerate() {
            n.node.used.insert(a.parse().unwrap(), entry(i as u128));
        }
        n
    }

    /// The pool "default" (10.0.0.0/24 and fd00::/120 in /29 and /125 blocks) holding
    /// `blocks`.
    fn pools_holding(blocks: &[BlockClaim]) -> PoolSet {
        let spec = PoolSpec::new(
            "default",
            vec![
                "10.0.0.0/24".parse().unwrap(),
                "fd00::/120".parse().unwrap(),
            ],
        )
        .with_block_size(crate::types::PerFamily { v4: 29, v6: 125 });
        let mut pools = PoolSet::new(vec![spec]);
        let names: Vec<String> = blocks.iter().map(|b| b.name.to_string()).collect();
        pools.rebuild(blocks.iter().zip(&names).map(|(b, n)| BlockRecord {
            key: (),
            name: n,
            pool: &b.pool,
            cidr: b.cidr,
        }));
        pools
    }

    /// A /24 pool in /29 blocks (8 addresses; the first block loses the network address,
    /// the last the broadcast address): full, partial and empty blocks are told apart by
    /// the holding node's `used` entries in each block's CIDR, another node's entries do
    /// not count, and a served family with no block shows zeros.
    #[test]
    fn blocks_are_counted_by_the_holding_nodes_used_entries() {
        let blocks = vec![
            // the first block: 7 usable (10.0.0.0 is the network address), all used
            claim("default", "10.0.0.0/29", "a"),
            // 8 usable, 3 used
            claim("default", "10.0.0.8/29", "a"),
            // 8 usable, none used by its holder b (a's stray entry in it does not count)
            claim("default", "10.0.0.16/29", "b"),
            // the last block: 7 usable (10.0.0.255 is the broadcast address), all used
            claim("default", "10.0.0.248/29", "b"),
            // a pool that does not exist: not counted
            claim("gone", "10.9.0.0/29", "a"),
        ];
        let pools = pools_holding(&blocks);
        let mut a_used: Vec<String> = (1..8).map(|i| format!("10.0.0.{i}")).collect();
        a_used.extend(["10.0.0.9", "10.0.0.10", "10.0.0.15", "10.0.0.17"].map(String::from));
        let b_used: Vec<String> = (248..255).map(|i| format!("10.0.0.{i}")).collect();
        let a = node("a", &a_used.iter().map(String::as_str).collect::<Vec<_>>());
        let b = node("b", &b_used.iter().map(String::as_str).collect::<Vec<_>>());
        let fill = block_fill(&pools, &blocks, &[a, b], SystemTime::UNIX_EPOCH);
        assert_eq!(
            fill[&("default".to_string(), Family::V4)],
            BlockFill {
                full: 2,
                partial: 1,
                empty: 1,
                idle_addresses: 8,
            }
        );
        assert_eq!(
            fill[&("default".to_string(), Family::V6)],
            BlockFill::default()
        );
        assert_eq!(
            fill.len(),
            2,
            "only the valid pool's served families: {fill:?}"
        );
    }

    /// Idle addresses are those of the empty blocks none of whose addresses cools down on
    /// the node holding it: a cooling address makes an empty block count as empty but not
    /// idle; another node's cooldown in a block, or the holder's outside it, does not; a
    /// used block stays out whatever cools in it.
    #[test]
    fn idle_addresses_are_those_of_empty_blocks_with_nothing_cooling() {
        let blocks = vec![
            // empty, one address cooling: not idle
            claim("default", "10.0.0.8/29", "a"),
            // empty, nothing of it cooling on a (10.0.0.40 is outside it): 8 idle
            claim("default", "10.0.0.16/29", "a"),
            // empty; a's cooldown in it is not its holder's: 8 idle
            claim("default", "10.0.0.24/29", "b"),
            // one used, one cooling: partial
            claim("default", "10.0.0.32/29", "a"),
            // IPv6: empty, one address cooling: not idle
            claim("default", "fd00::8/125", "b"),
        ];
        let pools = pools_holding(&blocks);
        let mut a = node("a", &["10.0.0.33"]);
        let mut b = node("b", &[]);
        for addr in ["10.0.0.12", "10.0.0.25", "10.0.0.34", "10.0.0.40"] {
            let until = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(30);
            a.node.cooldown.insert(addr.parse().unwrap(), until);
        }
        let until = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1);
        b.node.cooldown.insert("fd00::f".parse().unwrap(), until);
        let fill = block_fill(
            &pools,
            &blocks,
            &[a.clone(), b.clone()],
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(
            fill[&("default".to_string(), Family::V4)],
            BlockFill {
                full: 0,
                partial: 1,
                empty: 3,
                idle_addresses: 16,
            }
        );
        assert_eq!(
            fill[&("default".to_string(), Family::V6)],
            BlockFill {
                full: 0,
                partial: 0,
                empty: 1,
                idle_addresses: 0,
            }
        );
        // once the cooldowns ended, listed or not, the empty blocks are idle
        let later = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(30);
        let fill = block_fill(&pools, &blocks, &[a, b], later);
        assert_eq!(
            fill[&("default".to_string(), Family::V4)].idle_addresses,
            24
        );
        assert_eq!(fill[&("default".to_string(), Family::V6)].idle_addresses, 8);
    }

    #[test]
    fn used_in_counts_the_addresses_inside_the_cidr() {
        let sorted: UsedMap<()> = ["10.0.0.7", "10.0.0.8", "10.0.0.15", "10.0.0.16", "fd00::1"]
            .iter()
            .map(|a| (a.parse().unwrap(), ()))
            .collect();
        assert_eq!(used_in(&sorted, &"10.0.0.8/29".parse().unwrap()), 2);
        assert_eq!(used_in(&sorted, &"10.0.0.0/24".parse().unwrap()), 4);
        assert_eq!(used_in(&sorted, &"fd00::/120".parse().unwrap()), 1);
        assert_eq!(used_in(&sorted, &"10.1.0.0/16".parse().unwrap()), 0);
    }
}
