//! Each `status.used` entry against its pool (DESIGN.md "Pools per namespace and per pod"):
//! an entry names the pool its pod resolved to at its ADD (`status.used[addr].pool`); one
//! that names none belongs to the pool of its node's block holding its address, as the
//! operator and the agent derive it.
//!
//! - `outside-pool`: the entry names pool X, but its node's block holding the address is of
//!   pool Y (valid, invalid or missing);
//! - `no-pool`: the entry's pool (named or derived) is the block's, and that pool does not
//!   exist or is invalid.
//!
//! An address outside every valid pool (repair's `out-of-range`) or outside its node's
//! blocks (`leaked`, or a `duplicate` in another node's block) is repair's and not judged
//! again here.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use tidepool_ipam::pool::PoolSet;
use tidepool_ipam::pool::repair::BlockClaim;
use tidepool_ipam::{IpamNode, NodeUid, UsedEntry};

use super::findings::{block_object, node_object, pod_desc};
use super::report::{Problem, ProblemKind};

/// An IPAMNode with the pools its `status.used` entries name.
pub(super) type NamedPools<'a> = (&'a IpamNode, &'a BTreeMap<IpAddr, Arc<str>>);

/// The problems of every entry of `nodes` whose address lies in its node's block (of
/// `claims`) and in a valid pool of `set`.
pub(super) fn check(
    set: &PoolSet,
    claims: &[BlockClaim],
    nodes: &[NamedPools<'_>],
    out: &mut Vec<Problem>,
) {
    let mut by_holder: HashMap<(&str, NodeUid), Vec<&BlockClaim>> = HashMap::new();
    for c in claims {
        by_holder.entry((&c.node, c.node_uid)).or_default().push(c);
    }
    for (node, named) in nodes {
        let Some(blocks) = by_holder.get(&(&*node.name, node.node_uid)) else {
            continue;
        };
        for (address, e) in &node.node.used {
            if set.locate(address).is_none() {
                continue;
            }
            let holding = blocks.iter().filter(|b| b.cidr.contains(&address)).min();
            let Some(block) = holding else { continue };
            let entry = Entry {
                node,
                address,
                used: e,
                block,
            };
            out.extend(entry.problem(set, named.get(&address)));
        }
    }
}

/// One entry in its node's block.
struct Entry<'a> {
    node: &'a IpamNode,
    address: IpAddr,
    used: &'a UsedEntry,
    block: &'a BlockClaim,
}

impl Entry<'_> {
    /// `outside-pool` when the entry names another pool than its block's, else `no-pool`
    /// when the block's pool is missing or invalid.
    fn problem(&self, set: &PoolSet, named: Option<&Arc<str>>) -> Option<Problem> {
        let (b, y) = (self.block, &*self.block.pool);
        let other = named.filter(|x| ***x != *y);
        let missing = match set.get(y) {
            Ok(_) if other.is_none() => return None,
            Ok(_) => String::new(),
            Err(_) if set.holds(y) => ", which is invalid".to_string(),
            Err(_) => ", which does not exist".to_string(),
        };
        let head = format!(
            "status.used[{}] ({})",
            self.address,
            pod_desc(self.used, self.used.pod_uid)
        );
        let in_block = format!("block {} of pool {y}{missing}", b.cidr);
        let (kind, pool, detail) = match other {
            Some(x) => (
                ProblemKind::OutsidePool,
                x.to_string(),
                format!("{head} names pool {x}, but lies in {in_block}"),
            ),
            None => (
                ProblemKind::NoPool,
                y.to_string(),
                format!("{head} lies in {in_block}: the address is in no pool"),
            ),
        };
        Some(Problem {
            kind,
            objects: vec![node_object(&self.node.name), block_object(&b.name)],
            address: Some(self.address),
            cidr: Some(b.cidr),
            pool: Some(pool),
            detail,
        })
    }
}
