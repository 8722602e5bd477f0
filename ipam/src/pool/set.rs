//! Every pool of the cluster, in creation order, with its validity ([`PoolSet`]), and the
//! rebuild of all indices from the existing IPAMBlock objects ([`PoolSet::rebuild`]).
//!
//! Rebuild rules, per record, in input order (callers pass records sorted by object name so two
//! runs decide alike):
//! - a record whose `cidr` has host bits set is reported `Misaligned`;
//! - a record whose `name` is not the canonical name of its `cidr` is reported `NameMismatch`
//!   (and otherwise indexed as usual: the object exists and its addresses may be in use);
//! - a record naming no valid pool is reported `UnknownPool`; one whose pool does not serve its
//!   family, or whose block lies outside the pool's CIDRs, `OutOfRange`; one overlapping an
//!   exclusion, `Excluded`; one whose prefix length is not the pool's block size,
//!   `WrongBlockSize` (a stray block, made by hand: it never makes its pool Invalid, DESIGN.md
//!   "one bad object"; like every record that is not a clean claim, it occupies its range);
//! - a record of the right pool and size claims its block; if the block is taken already,
//!   `Overlap` names the record that holds it;
//! - every record that is not a clean claim still makes every grantable block it overlaps, in
//!   any valid pool, count as taken (DESIGN.md: "any existing block overlapping a candidate
//!   counts as taken"), and reports `Overlap` (without the other's key) if one was taken.
//!
//! Nothing panics on any input; every odd record is a [`Finding`].

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::index::{Layout, PoolIndex};
use super::name::block_name;
use super::spec::{PoolSpec, check_pools};
use super::{PoolError, family_of, span};
use crate::types::Family;

/// One IPAMBlock object, typed. `key` is the caller's handle for it (its name, an index, a
/// reference), returned in findings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRecord<'a, K> {
    pub key: K,
    /// The object's name.
    pub name: &'a str,
    /// `spec.pool`.
    pub pool: &'a str,
    /// `spec.cidr`.
    pub cidr: IpNet,
}

/// What is odd about a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FindingKind<K> {
    /// The object's name is not the canonical name of its CIDR.
    NameMismatch { expected: String },
    /// The CIDR has host bits set.
    Misaligned,
    /// The named pool does not exist or is not valid.
    UnknownPool,
    /// Not inside the named pool's CIDRs (or the pool serves no CIDR of that family).
    OutOfRange,
    /// Overlaps one of the pool's exclusions.
    Excluded,
    /// The prefix length is not the pool's block size.
    WrongBlockSize { expected: u8 },
    /// Overlaps a block already indexed; `other` is that record's key when known.
    Overlap { other: Option<K> },
}

impl<K> FindingKind<K> {
    /// A short label (logs, metrics).
    pub fn as_str(&self) -> &'static str {
        match self {
            FindingKind::NameMismatch { .. } => "name-mismatch",
            FindingKind::Misaligned => "misaligned",
            FindingKind::UnknownPool => "unknown-pool",
            FindingKind::OutOfRange => "out-of-range",
            FindingKind::Excluded => "excluded",
            FindingKind::WrongBlockSize { .. } => "wrong-block-size",
            FindingKind::Overlap { .. } => "duplicate",
        }
    }
}

/// One odd record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding<K> {
    pub key: K,
    /// The pool the record names.
    pub pool: String,
    pub cidr: IpNet,
    pub kind: FindingKind<K>,
}

/// What [`PoolSet::rebuild`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildReport<K> {
    /// Records that claimed their block cleanly.
    pub indexed: usize,
    /// Odd records, in input order (one record may give several findings).
    pub findings: Vec<Finding<K>>,
}

impl<K> Default for RebuildReport<K> {
    fn default() -> Self {
        Self {
            indexed: 0,
            findings: Vec::new(),
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    spec: PoolSpec,
    state: Result<PoolIndex, PoolError>,
}

/// Every pool in creation order; the valid ones with their index.
#[derive(Debug, Clone)]
pub struct PoolSet {
    entries: Vec<Entry>,
    /// Name → entry of the first pool of that name (looked up per block at every pass:
    /// foldhash, several times cheaper than SipHash on short names).
    by_name: HashMap<String, usize, foldhash::fast::RandomState>,
    /// Calls that may have changed an index ([`Self::get_mut`], [`Self::rebuild`]).
    changes: u64,
}

impl PoolSet {
    /// Checks the pools ([`check_pools`]) and builds an empty index for each valid one.
    pub fn new(specs: Vec<PoolSpec>) -> Self {
        Self::with_layout(specs, Layout::Auto)
    }

    pub fn with_layout(specs: Vec<PoolSpec>, layout: Layout) -> Self {
        let validity = check_pools(&specs);
        let mut by_name = HashMap::default();
        let entries = specs
            .into_iter()
            .zip(validity)
            .enumerate()
            .map(|(i, (spec, ok))| {
                by_name.entry(spec.name.clone()).or_insert(i);
                let state = ok.and_then(|()| PoolIndex::with_layout(&spec, layout));
                Entry { spec, state }
            })
            .collect();
        Self {
            entries,
            by_name,
            changes: 0,
        }
    }

    /// Each pool's name and validity, in creation order.
    pub fn validity(&self) -> impl Iterator<Item = (&str, Result<(), &PoolError>)> + '_ {
        self.entries
            .iter()
            .map(|e| (e.spec.name.as_str(), e.state.as_ref().map(|_| ())))
    }

    /// Whether a pool of this name exists (valid or not).
    pub fn holds(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The index of a valid pool; the pool's own error if it is Invalid.
    pub fn get(&self, name: &str) -> Result<&PoolIndex, PoolError> {
        match self.lookup(name) {
            None => Err(PoolError::UnknownPool {
                pool: name.to_string(),
            }),
            Some(state) => state.map_err(Clone::clone),
        }
    }

    /// The index of the pool of that name, or its error if it is Invalid; None for no such
    /// pool. [`Self::get`] without making an error (a lookup per block on hot paths).
    pub fn lookup(&self, name: &str) -> Option<Result<&PoolIndex, &PoolError>> {
        let &i = self.by_name.get(name)?;
        Some(self.entries[i].state.as_ref())
    }

    pub fn get_mut(&mut self, name: &str) -> Result<&mut PoolIndex, PoolError> {
        self.changes += 1;
        match self.by_name.get(name) {
            None => Err(PoolError::UnknownPool {
                pool: name.to_string(),
            }),
            Some(&i) => self.entries[i].state.as_mut().map_err(|e| e.clone()),
        }
    }

    /// Counts the calls that may have changed an index (mutable access, rebuilds): while it
    /// is the same, nothing changed.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// The families some pool has a CIDR of, valid or not (the nodes of an Invalid pool
    /// still claim, and are told why nothing comes).
    pub fn families(&self) -> &'static [Family] {
        Family::subset(|f| self.entries.iter().any(|e| e.spec.serves(f)))
    }

    /// Valid pools, in creation order.
    pub fn valid(&self) -> impl Iterator<Item = &PoolIndex> + '_ {
        self.entries.iter().filter_map(|e| e.state.as_ref().ok())
    }

    /// The valid pool whose CIDRs hold `addr`, with the block holding it.
    pub fn locate(&self, addr: IpAddr) -> Option<(&str, IpNet)> {
        let f = Family::of(&addr);
        self.valid().find_map(|p| {
            p.family(f)
                .and_then(|i| i.block_of(addr))
                .map(|b| (p.name(), b))
        })
    }

    /// Marks an unclaimed record's range occupied in every valid pool serving its family, so
    /// that nothing is granted over it; true when it overlapped a pool's range.
    fn occupy(&mut self, cidr: &IpNet) -> bool {
        let (lo, hi) = span(cidr);
        let mut overlapped = false;
        for e in &mut self.entries {
            if let Ok(p) = &mut e.state
                && let Some(idx) = p.family_mut(family_of(cidr))
            {
                overlapped |= idx.occupy(lo, hi).1 > 0;
            }
        }
        overlapped
    }

    /// Frees every block of every valid pool, then indexes `records` (see the module
    /// documentation for the rules): the index is then the records' alone, whatever was
    /// claimed before.
    pub fn rebuild<'a, K: Clone>(
        &mut self,
        records: impl IntoIterator<Item = BlockRecord<'a, K>>,
    ) -> RebuildReport<K> {
        self.changes += 1;
        for e in &mut self.entries {
            if let Ok(p) = &mut e.state {
                p.clear();
            }
        }
        let mut report = RebuildReport::default();
        // who holds each cleanly claimed block: (entry, block address) → key
        let mut owners: HashMap<(usize, u128), K> = HashMap::new();
        for r in records {
            let family = family_of(&r.cidr);
            let finding = |kind| Finding {
                key: r.key.clone(),
                pool: r.pool.to_string(),
                cidr: r.cidr,
                kind,
            };
            let aligned = r.cidr.trunc() == r.cidr;
            if !aligned {
                report.findings.push(finding(FindingKind::Misaligned));
            }
            let expected = block_name(&r.cidr);
            if r.name != expected {
                report
                    .findings
                    .push(finding(FindingKind::NameMismatch { expected }));
            }
            let entries = &mut self.entries;
            let entry = self
                .by_name
                .get(r.pool)
                .and_then(|&i| entries[i].state.as_mut().ok().map(|p| (i, p)));
            let mut claimed = false;
            match entry {
                None => report.findings.push(finding(FindingKind::UnknownPool)),
                Some((i, pool)) => {
                    let (lo, hi) = span(&r.cidr);
                    match pool.family_mut(family) {
                        None => report.findings.push(finding(FindingKind::OutOfRange)),
                        Some(idx) if r.cidr.prefix_len() != idx.block_prefix() => {
                            let expected = idx.block_prefix();
                            if !idx.overlaps_range(lo, hi) {
                                report.findings.push(finding(FindingKind::OutOfRange));
                            }
                            report
                                .findings
                                .push(finding(FindingKind::WrongBlockSize { expected }));
                        }
                        Some(_) if !aligned => {}
                        Some(idx) => match idx.claim_block(&r.cidr) {
                            Ok(()) => {
                                claimed = true;
                                report.indexed += 1;
                                owners.insert((i, lo), r.key.clone());
                            }
                            Err(PoolError::BlockTaken { .. }) => {
                                claimed = true;
                                let other = owners.get(&(i, lo)).cloned();
                                report
                                    .findings
                                    .push(finding(FindingKind::Overlap { other }));
                            }
                            Err(PoolError::BlockExcluded { .. }) => {
                                report.findings.push(finding(FindingKind::Excluded))
                            }
                            Err(_) => report.findings.push(finding(FindingKind::OutOfRange)),
                        },
                    }
                }
            }
            if !claimed && self.occupy(&r.cidr) {
                report
                    .findings
                    .push(finding(FindingKind::Overlap { other: None }));
            }
        }
        report
    }
}
