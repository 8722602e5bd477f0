//! The report as text (`--output table`), worded after `calicoctl ipam check`: what was
//! loaded, what each scan found, one table per section, and a closing verdict.

use std::fmt::Write;
use std::time::Duration;

use super::report::{PoolState, PoolUsage, ProblemKind, Report};

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Columns padded to their widest cell, two spaces apart; the last one unpadded.
fn grid(out: &mut String, headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, c) in cells.enumerate() {
            if i + 1 == widths.len() {
                s.push_str(c);
            } else {
                let pad = widths[i] - c.chars().count();
                s.push_str(c);
                s.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(out, &mut headers.iter().copied());
    for r in rows {
        line(out, &mut r.iter().map(String::as_str));
    }
}

/// The report as text.
pub fn table(r: &Report) -> String {
    let mut out = String::new();
    out.push_str("Checking IPAM for inconsistencies...\n\n");
    pools_section(&mut out, r);
    counts_section(&mut out, r);
    candidates_section(&mut out, r);
    problems_section(&mut out, r);
    let n = r.problems.len();
    if n == 0 {
        out.push_str("Check complete; found 0 problems.\n");
    } else {
        let _ = writeln!(
            out,
            "Check complete; found {} that {} a person.",
            plural(n, "problem", "problems"),
            if n == 1 { "needs" } else { "need" }
        );
    }
    out
}

/// The IP pools: how many are valid, and a row per pool and family.
fn pools_section(out: &mut String, r: &Report) {
    out.push_str("Loading all IP pools...\n");
    let valid = {
        let mut names: Vec<&str> = r
            .pools
            .iter()
            .filter(|p| p.state == PoolState::Valid)
            .map(|p| p.pool.as_str())
            .collect();
        names.dedup();
        names.len()
    };
    let _ = writeln!(
        out,
        "Found {} ({valid} valid).",
        plural(r.summary.ippools, "IP pool", "IP pools")
    );
    if !r.pools.is_empty() {
        let rows: Vec<Vec<String>> = r.pools.iter().map(pool_row).collect();
        grid(
            out,
            &[
                "POOL",
                "FAMILY",
                "CIDRS",
                "BLOCK",
                "CAPACITY",
                "ALLOCATED",
                "FREE",
                "BLOCKS",
                "IN USE",
                "RUNWAY",
                "STATE",
            ],
            &rows,
        );
    }
    out.push('\n');
}

fn pool_row(p: &PoolUsage) -> Vec<String> {
    let na = || "-".to_string();
    let (cap, alloc, free) = match &p.addresses {
        Some(c) => (c.capacity.clone(), c.allocated.clone(), c.free.clone()),
        None => (na(), na(), na()),
    };
    let blocks = match &p.blocks {
        Some(b) => format!("{}/{}", b.allocated, b.capacity),
        None => na(),
    };
    let cidrs: Vec<String> = p.cidrs.iter().map(ToString::to_string).collect();
    let state = match (&p.state, &p.reason) {
        (PoolState::Valid, _) => "valid".to_string(),
        (PoolState::Invalid, Some(why)) => format!("invalid: {why}"),
        (PoolState::Invalid, None) => "invalid".to_string(),
    };
    vec![
        p.pool.clone(),
        p.family.to_string(),
        cidrs.join(","),
        format!("/{}", p.block_size),
        cap,
        alloc,
        free,
        blocks,
        p.in_use.to_string(),
        p.runway_seconds.map_or_else(
            || "-".to_string(),
            |s| humantime::format_duration(Duration::from_secs(s)).to_string(),
        ),
        state,
    ]
}

/// How many blocks, IPAM nodes, addresses in use, Nodes and Pods were read.
fn counts_section(out: &mut String, r: &Report) {
    let s = &r.summary;
    out.push_str("Loading all IPAM blocks, IPAM nodes, Nodes and Pods...\n");
    let _ = writeln!(
        out,
        "Found {}, {} recording {} in use, {} and {}.",
        plural(s.ipamblocks, "IPAM block", "IPAM blocks"),
        plural(s.ipamnodes, "IPAM node", "IPAM nodes"),
        plural(s.addresses_in_use, "address", "addresses"),
        plural(s.nodes, "Node", "Nodes"),
        plural(s.pods, "Pod", "Pods"),
    );
    out.push('\n');
}

/// The reclaim candidates (informational), a row each.
fn candidates_section(out: &mut String, r: &Report) {
    out.push_str("Scanning for addresses in use whose pod is gone, terminal or replaced...\n");
    let _ = writeln!(
        out,
        "Found {} (informational: the operator reclaims these itself once they stay candidates for its reclaim grace; they are not problems).",
        plural(
            r.summary.reclaim_candidates,
            "reclaim candidate",
            "reclaim candidates"
        )
    );
    if !r.reclaim_candidates.is_empty() {
        let rows: Vec<Vec<String>> = r
            .reclaim_candidates
            .iter()
            .map(|c| {
                vec![
                    c.node.clone(),
                    c.address.to_string(),
                    format!("{}/{}", c.namespace, c.pod),
                    c.pod_uid.clone(),
                    c.reason.to_string(),
                    if c.tombstoned {
                        "tombstone written"
                    } else {
                        ""
                    }
                    .to_string(),
                ]
            })
            .collect();
        grid(
            out,
            &["NODE", "ADDRESS", "POD", "POD UID", "REASON", "STATE"],
            &rows,
        );
    }
    out.push('\n');
}

/// The problems: a count per kind, then a row each.
fn problems_section(out: &mut String, r: &Report) {
    out.push_str(
        "Scanning for duplicates, leaks, orphan blocks, out-of-range and unknown-pool blocks and addresses, addresses in no pool or outside their pod's pool, invalid pools and malformed entries...\n",
    );
    for k in ProblemKind::ALL {
        let _ = writeln!(out, "Found {}.", k.describe(r.of_kind(k).count()));
    }
    if !r.problems.is_empty() {
        let rows: Vec<Vec<String>> = r
            .problems
            .iter()
            .map(|p| {
                let at = match (p.address, p.cidr) {
                    (Some(a), _) => a.to_string(),
                    (None, Some(c)) => c.to_string(),
                    (None, None) => "-".to_string(),
                };
                vec![
                    p.kind.as_str().to_string(),
                    p.objects.join(", "),
                    at,
                    p.detail.clone(),
                ]
            })
            .collect();
        grid(
            out,
            &["PROBLEM", "OBJECTS", "ADDRESS/CIDR", "DETAIL"],
            &rows,
        );
    }
    out.push('\n');
}
