//! The engine's rebuild and repair findings as [`Problem`]s, in words a person can act on.

use std::collections::HashMap;
use std::net::IpAddr;

use tidepool_ipam::IpamNode;
use tidepool_ipam::pool::repair::{
    BlockClaim, BlockRef, Conflict, LiveNodes, RangeIssue, RangeSubject, RepairFinding,
    RepairReport, UsedRef,
};
use tidepool_ipam::pool::{FindingKind, RebuildReport};
use tidepool_ipam::{NodeUid, PodUid, UsedEntry};

use super::report::{Problem, ProblemKind};

/// IPAMNodes by holder (name, node UID).
pub(super) type Holders<'a> = HashMap<(&'a str, NodeUid), &'a IpamNode>;

pub(super) fn block_object(name: &str) -> String {
    format!("ipamblock/{name}")
}

pub(super) fn node_object(name: &str) -> String {
    format!("ipamnode/{name}")
}

/// `namespace/pod (UID …)` of the entry, as its IPAMNode records it.
fn pod_of(holders: &Holders<'_>, used: &UsedRef, address: IpAddr) -> String {
    let entry = holders
        .get(&(&*used.node, used.node_uid))
        .and_then(|n| n.node.used.get(&address))
        .filter(|e| e.pod_uid == used.pod_uid);
    match entry {
        Some(e) => pod_desc(e, used.pod_uid),
        None => format!("pod UID {}", used.pod_uid),
    }
}

/// `pod namespace/name (UID …)` of an entry.
pub(super) fn pod_desc(e: &UsedEntry, uid: PodUid) -> String {
    format!("pod {} (UID {uid})", e.pod)
}

/// Whether the address is one of the node's `spec.addresses` (a cloud source's grant).
fn node_addresses_hold(holders: &Holders<'_>, used: &UsedRef, address: IpAddr) -> bool {
    holders
        .get(&(&*used.node, used.node_uid))
        .is_some_and(|n| n.operator.addresses.contains(&address))
}

fn block_desc(b: &BlockRef) -> String {
    format!("block {} (pool {}) of node {}", b.cidr, b.pool, b.node)
}

/// Rebuild's findings that repair does not cover: overlapping blocks of one node, and a
/// name that is not the CIDR's canonical one.
pub(super) fn from_rebuild(
    report: &RebuildReport<&str>,
    claims: &[BlockClaim],
    out: &mut Vec<Problem>,
) {
    let by_name: HashMap<&str, &BlockClaim> = claims.iter().map(|c| (&*c.name, c)).collect();
    for f in &report.findings {
        match &f.kind {
            FindingKind::NameMismatch { expected } => out.push(Problem {
                kind: ProblemKind::Malformed,
                objects: vec![block_object(f.key)],
                address: None,
                cidr: Some(f.cidr),
                pool: Some(f.pool.clone()),
                detail: format!(
                    "metadata.name: not the canonical name {expected} of its CIDR {}: the name is what makes a second claim of the block fail",
                    f.cidr
                ),
            }),
            FindingKind::Overlap { other: Some(other) } => {
                let (Some(a), Some(b)) = (by_name.get(f.key), by_name.get(other)) else {
                    continue;
                };
                // blocks of two nodes: repair's (a duplicate, or an orphan's)
                if (&a.node, a.node_uid) != (&b.node, b.node_uid) {
                    continue;
                }
                let (a, b) = if a.name <= b.name { (a, b) } else { (b, a) };
                out.push(Problem {
                    kind: ProblemKind::Duplicate,
                    objects: vec![block_object(&a.name), block_object(&b.name)],
                    address: None,
                    cidr: Some(a.cidr),
                    pool: Some(a.pool.to_string()),
                    detail: format!(
                        "blocks {} and {} of node {} overlap",
                        a.cidr, b.cidr, a.node
                    ),
                });
            }
            // the others are repair's out-of-range and unknown-pool findings
            _ => {}
        }
    }
}

/// Repair's findings. A `spec.addresses` address of the node that uses it is not leaked nor
/// out of range for that node.
/// IPAMNodes whose `spec.nodeUID` is not the UID of the Node of their name (a Node that
/// is gone is whole-node reclaim's, not this).
pub(super) fn node_uids(ipam_nodes: &[&IpamNode], nodes: &LiveNodes, out: &mut Vec<Problem>) {
    for n in ipam_nodes {
        let Some(uid) = nodes.uid(&n.name).filter(|u| *u != n.node_uid) else {
            continue;
        };
        out.push(Problem {
            kind: ProblemKind::NodeUid,
            objects: vec![node_object(&n.name), format!("node/{}", n.name)],
            address: None,
            cidr: None,
            pool: None,
            detail: format!(
                "spec.nodeUID is {}, but Node {} has UID {}: only the operator may set it \
                 (the node side drops every block of another nodeUID)",
                n.node_uid, n.name, uid
            ),
        });
    }
}

pub(super) fn from_repair(report: &RepairReport, holders: &Holders<'_>, out: &mut Vec<Problem>) {
    for f in &report.findings {
        let p = match f {
            RepairFinding::OrphanBlock { block, current_uid } => Problem {
                kind: ProblemKind::OrphanBlock,
                objects: vec![block_object(&block.name)],
                address: None,
                cidr: Some(block.cidr),
                pool: Some(block.pool.clone()),
                detail: format!(
                    "block {} (pool {}) is held by node {} with UID {}, {}",
                    block.cidr,
                    block.pool,
                    block.node,
                    block.node_uid,
                    match current_uid {
                        None => format!("and no Node {} exists", block.node),
                        Some(now) => format!("but Node {} now has UID {}", block.node, now),
                    }
                ),
            },
            RepairFinding::Leaked {
                address,
                used,
                node_live,
            } => {
                if *node_live && node_addresses_hold(holders, used, *address) {
                    continue;
                }
                let gone = if *node_live {
                    String::new()
                } else {
                    format!("; its Node (UID {}) no longer exists", used.node_uid)
                };
                Problem {
                    kind: ProblemKind::Leaked,
                    objects: vec![node_object(&used.node)],
                    address: Some(*address),
                    cidr: None,
                    pool: None,
                    detail: format!(
                        "status.used[{address}] ({}) lies in none of node {}'s blocks{gone}",
                        pod_of(holders, used, *address),
                        used.node
                    ),
                }
            }
            RepairFinding::Duplicate(c) => duplicate(c, holders),
            RepairFinding::OutOfRange { subject, issue } => match subject {
                RangeSubject::Block(b) => Problem {
                    kind: ProblemKind::OutOfRange,
                    objects: vec![block_object(&b.name)],
                    address: None,
                    cidr: Some(b.cidr),
                    pool: Some(b.pool.clone()),
                    detail: format!("{} {}", block_desc(b), range_issue(*issue, &b.pool)),
                },
                RangeSubject::Address { address, used } => {
                    if node_addresses_hold(holders, used, *address) {
                        continue;
                    }
                    Problem {
                        kind: ProblemKind::OutOfRange,
                        objects: vec![node_object(&used.node)],
                        address: Some(*address),
                        cidr: None,
                        pool: None,
                        detail: format!(
                            "status.used[{address}] ({}) lies outside every valid pool",
                            pod_of(holders, used, *address)
                        ),
                    }
                }
            },
            RepairFinding::UnknownPool { block, invalid } => Problem {
                kind: ProblemKind::UnknownPool,
                objects: vec![block_object(&block.name)],
                address: None,
                cidr: Some(block.cidr),
                pool: Some(block.pool.clone()),
                detail: format!(
                    "{} names pool {}, which {}",
                    block_desc(block),
                    block.pool,
                    if *invalid {
                        "is invalid"
                    } else {
                        "does not exist"
                    }
                ),
            },
        };
        out.push(p);
    }
}

fn duplicate(c: &Conflict, holders: &Holders<'_>) -> Problem {
    match c {
        Conflict::SameAddress {
            address,
            first,
            second,
        } => Problem {
            kind: ProblemKind::Duplicate,
            objects: vec![node_object(&first.node), node_object(&second.node)],
            address: Some(*address),
            cidr: None,
            pool: None,
            detail: format!(
                "{address} is in status.used of two live nodes: {} ({}) and {} ({})",
                first.node,
                pod_of(holders, first, *address),
                second.node,
                pod_of(holders, second, *address)
            ),
        },
        Conflict::ForeignAddress {
            address,
            user,
            owner,
        } => Problem {
            kind: ProblemKind::Duplicate,
            objects: vec![node_object(&user.node), block_object(&owner.name)],
            address: Some(*address),
            cidr: Some(owner.cidr),
            pool: Some(owner.pool.clone()),
            detail: format!(
                "node {} uses {address} ({}), which lies in {}",
                user.node,
                pod_of(holders, user, *address),
                block_desc(owner)
            ),
        },
        Conflict::OverlappingBlocks { first, second } => Problem {
            kind: ProblemKind::Duplicate,
            objects: vec![block_object(&first.name), block_object(&second.name)],
            address: None,
            cidr: Some(first.cidr),
            pool: Some(first.pool.clone()),
            detail: format!("{} overlaps {}", block_desc(first), block_desc(second)),
        },
    }
}

fn range_issue(issue: RangeIssue, pool: &str) -> String {
    match issue {
        RangeIssue::FamilyNotServed => format!("is of a family pool {pool} does not serve"),
        RangeIssue::OutsidePool => format!("lies outside pool {pool}'s CIDRs"),
        RangeIssue::Excluded => format!("overlaps an exclusion of pool {pool}"),
        RangeIssue::WrongBlockSize { expected } => {
            format!("does not match pool {pool}'s block size /{expected}")
        }
        RangeIssue::Misaligned => "has host bits set".to_string(),
        RangeIssue::OutsideEveryPool => "lies outside every valid pool".to_string(),
    }
}
