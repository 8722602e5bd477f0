//! IPPool `spec` and its validation (DESIGN.md, "Resources").
//!
//! A pool is valid when: its block sizes are prefix lengths of their family; it has at least
//! one CIDR; every CIDR is canonical (no host bits), fits the block size of its family (block
//! prefix ≥ CIDR prefix, at most 2^64 blocks), and overlaps no other CIDR of the pool; every
//! exclusion is canonical and inside one of the pool's CIDRs of its family; and at least one
//! block is left after exclusions (and after IPv4 /32 blocks on a network or broadcast address,
//! see [`super`]). Errors are checked in that order and the first one is returned.
//!
//! Across pools ([`check_pools`]), given in creation order: a pool whose name repeats an older
//! pool's, or one of whose CIDRs overlaps a CIDR of an older *valid* pool, is Invalid; the older
//! one keeps working. A pool that is itself invalid holds no address space, so it never makes a
//! later pool invalid.

use ipnet::IpNet;

use super::{DEFAULT_BLOCK_SIZE, Field, PoolError, family_of, max_prefix, shr, span};
use crate::types::{Family, PerFamily};

/// IPPool `spec` (the parts the index needs; `nodeSelector` is the operator's business).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub name: String,
    /// IPv4 and/or IPv6 CIDRs, in the order claims walk them.
    pub cidrs: Vec<IpNet>,
    /// Prefix length of the unit granted to a node, per family (default /28 and /124).
    pub block_size: PerFamily<u8>,
    pub exclude: Vec<IpNet>,
}

/// Parses one CIDR of a pool's spec. Refuses anything `ipnet` refuses and CIDRs with host bits
/// set (`10.0.0.1/24`).
pub fn parse_cidr(pool: &str, field: Field, value: &str) -> Result<IpNet, PoolError> {
    let net = read_cidr(pool, field, value)?;
    canonical(pool, field, &net).map_err(|_| PoolError::InvalidCidr {
        pool: pool.to_string(),
        field,
        value: value.to_string(),
        reason: format!("host bits set; did you mean {}?", net.trunc()),
    })?;
    Ok(net)
}

/// Reads one CIDR of a pool's spec as written, host bits and all; refuses only what `ipnet`
/// cannot read.
fn read_cidr(pool: &str, field: Field, value: &str) -> Result<IpNet, PoolError> {
    value.trim().parse().map_err(|e| PoolError::InvalidCidr {
        pool: pool.to_string(),
        field,
        value: value.to_string(),
        reason: format!("{e}"),
    })
}

fn canonical(pool: &str, field: Field, net: &IpNet) -> Result<(), PoolError> {
    if net.trunc() != *net {
        return Err(PoolError::InvalidCidr {
            pool: pool.to_string(),
            field,
            value: net.to_string(),
            reason: format!("host bits set; did you mean {}?", net.trunc()),
        });
    }
    Ok(())
}

impl PoolSpec {
    /// A pool with the default block sizes and no exclusions.
    pub fn new(name: impl Into<String>, cidrs: Vec<IpNet>) -> Self {
        Self {
            name: name.into(),
            cidrs,
            block_size: DEFAULT_BLOCK_SIZE,
            exclude: Vec::new(),
        }
    }

    pub fn with_block_size(mut self, block_size: PerFamily<u8>) -> Self {
        self.block_size = block_size;
        self
    }

    pub fn with_exclude(mut self, exclude: Vec<IpNet>) -> Self {
        self.exclude = exclude;
        self
    }

    /// Builds and validates a spec from strings (the CRD's or the CLI's form).
    pub fn parse<S: AsRef<str>>(
        name: &str,
        cidrs: &[S],
        block_size: PerFamily<u8>,
        exclude: &[S],
    ) -> Result<Self, PoolError> {
        let spec = Self::from_strings(name, cidrs, block_size, exclude, parse_cidr)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Reads a spec from strings (the CRD's form) without validating it, so that a spec the
    /// API server accepted but the engine cannot use still names its pool: a
    /// [`super::PoolSet`] holds it as Invalid with [`Self::validate`]'s reason. Fails only on
    /// a string that is no CIDR at all.
    pub fn read<S: AsRef<str>>(
        name: &str,
        cidrs: &[S],
        block_size: PerFamily<u8>,
        exclude: &[S],
    ) -> Result<Self, PoolError> {
        Self::from_strings(name, cidrs, block_size, exclude, read_cidr)
    }

    fn from_strings<S: AsRef<str>>(
        name: &str,
        cidrs: &[S],
        block_size: PerFamily<u8>,
        exclude: &[S],
        cidr: fn(&str, Field, &str) -> Result<IpNet, PoolError>,
    ) -> Result<Self, PoolError> {
        let list = |field, l: &[S]| -> Result<Vec<IpNet>, PoolError> {
            l.iter().map(|c| cidr(name, field, c.as_ref())).collect()
        };
        Ok(Self {
            name: name.to_string(),
            cidrs: list(Field::Cidrs, cidrs)?,
            block_size,
            exclude: list(Field::Exclude, exclude)?,
        })
    }

    /// The pool's CIDRs of one family, in spec order.
    pub fn cidrs_of(&self, family: Family) -> impl Iterator<Item = &IpNet> {
        self.cidrs.iter().filter(move |c| family_of(c) == family)
    }

    /// Whether the pool has a CIDR of this family.
    pub fn serves(&self, family: Family) -> bool {
        self.cidrs_of(family).next().is_some()
    }

    /// Checks the spec on its own (see the module documentation for the rules and their order).
    pub fn validate(&self) -> Result<(), PoolError> {
        let pool = || self.name.clone();
        for f in Family::ALL {
            let prefix = *self.block_size.get(f);
            if prefix > max_prefix(f) {
                return Err(PoolError::InvalidBlockSize {
                    pool: pool(),
                    family: f,
                    prefix,
                });
            }
        }
        if self.cidrs.is_empty() {
            return Err(PoolError::EmptyPool {
                pool: pool(),
                reason: "no CIDRs",
            });
        }
        for c in &self.cidrs {
            canonical(&self.name, Field::Cidrs, c)?;
            let prefix = *self.block_size.get(family_of(c));
            if prefix < c.prefix_len() {
                return Err(PoolError::BlockSizeDoesNotFit {
                    pool: pool(),
                    cidr: *c,
                    prefix,
                    reason: "the block prefix is shorter than the CIDR's",
                });
            }
            if prefix - c.prefix_len() > 64 {
                return Err(PoolError::BlockSizeDoesNotFit {
                    pool: pool(),
                    cidr: *c,
                    prefix,
                    reason: "more than 2^64 blocks in one CIDR",
                });
            }
        }
        for (i, a) in self.cidrs.iter().enumerate() {
            for b in &self.cidrs[i + 1..] {
                if overlaps(a, b) {
                    return Err(PoolError::OverlappingCidrs {
                        pool: pool(),
                        first: *a,
                        second: *b,
                    });
                }
            }
        }
        for e in &self.exclude {
            canonical(&self.name, Field::Exclude, e)?;
            if !self.cidrs.iter().any(|c| c.contains(e)) {
                return Err(PoolError::ExclusionOutsidePool {
                    pool: pool(),
                    exclusion: *e,
                });
            }
        }
        let mut capacity = 0u128;
        for c in &self.cidrs {
            let prefix = *self.block_size.get(family_of(c));
            let count = 1u128 << (prefix - c.prefix_len());
            let excluded: u128 = excluded_ranges(c, prefix, &self.exclude)
                .iter()
                .map(|&(lo, hi)| (hi - lo) as u128 + 1)
                .sum();
            capacity += count - excluded;
        }
        if capacity == 0 {
            return Err(PoolError::EmptyPool {
                pool: pool(),
                reason: "every block is excluded",
            });
        }
        Ok(())
    }
}

/// Whether two networks share an address (different families never do).
pub fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    if family_of(a) != family_of(b) {
        return false;
    }
    let (a0, a1) = span(a);
    let (b0, b1) = span(b);
    a0 <= b1 && b0 <= a1
}

/// Validity of each pool, given in creation order: each pool's own validation, then duplicate
/// names and overlap with older valid pools (the later pool is Invalid, the older keeps
/// working). The result has one entry per pool, in the same order.
pub fn check_pools(pools: &[PoolSpec]) -> Vec<Result<(), PoolError>> {
    let mut out: Vec<Result<(), PoolError>> = Vec::with_capacity(pools.len());
    for (i, p) in pools.iter().enumerate() {
        let r = p.validate().and_then(|()| {
            if pools[..i].iter().any(|q| q.name == p.name) {
                return Err(PoolError::DuplicateName {
                    pool: p.name.clone(),
                });
            }
            for (q, ok) in pools[..i].iter().zip(&out) {
                if ok.is_err() {
                    continue;
                }
                for c in &p.cidrs {
                    if let Some(o) = q.cidrs.iter().find(|o| overlaps(c, o)) {
                        return Err(PoolError::OverlapsPool {
                            pool: p.name.clone(),
                            cidr: *c,
                            other_pool: q.name.clone(),
                            other_cidr: *o,
                        });
                    }
                }
            }
            Ok(())
        });
        out.push(r);
    }
    out
}

/// Excluded block ranges (inclusive, sorted, merged) of `cidr` carved in `/block_prefix`
/// blocks: every block overlapping an exclusion, plus, for an IPv4 CIDR of prefix ≤ 30 in /32
/// blocks, the blocks of its network and broadcast address (they have no usable address).
pub(crate) fn excluded_ranges(
    cidr: &IpNet,
    block_prefix: u8,
    exclude: &[IpNet],
) -> Vec<(u64, u64)> {
    let family = family_of(cidr);
    let shift = (max_prefix(family) - block_prefix) as u32;
    let (c0, c1) = span(cidr);
    let count = 1u128 << (block_prefix - cidr.prefix_len());
    let mut out: Vec<(u64, u64)> = exclude
        .iter()
        .filter(|e| family_of(e) == family)
        .filter_map(|e| {
            let (e0, e1) = span(e);
            if e1 < c0 || e0 > c1 {
                return None;
            }
            let lo = shr(e0.max(c0) - c0, shift);
            let hi = shr(e1.min(c1) - c0, shift);
            Some((lo as u64, hi as u64))
        })
        .collect();
    if family == Family::V4 && cidr.prefix_len() <= 30 && block_prefix == 32 {
        out.push((0, 0));
        out.push(((count - 1) as u64, (count - 1) as u64));
    }
    out.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(out.len());
    for (lo, hi) in out {
        match merged.last_mut() {
            Some((_, last)) if (*last as u128) + 1 >= lo as u128 => *last = (*last).max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}
