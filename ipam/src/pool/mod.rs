//! The pure part of the `cluster-pool` IP source: pool specs and their validation, canonical
//! block names, and the free-block index per pool and family. No I/O here; the source that
//! creates and deletes IPAMBlock objects through the node store is built on top.
//!
//! - [`name`]: `v4-10-0-1-16-28` ⇄ `10.0.1.16/28` (the IPAMBlock object name; creating it is
//!   the claim, so the mapping is a bijection on canonical CIDRs).
//! - [`spec`]: [`PoolSpec`] (IPPool `spec`), its validation, and [`check_pools`] — the later of
//!   two pools whose CIDRs overlap is `Invalid`, the others keep working.
//! - [`index`]: [`FamilyIndex`] / [`PoolIndex`] — claim from a caller-given start (callers
//!   randomize it), claim a specific block (adoption, rebuild), release, counts. A dense two-level
//!   bitmap for CIDRs of at most 2^24 blocks (any IPv4 pool in /28 blocks), a sparse two-level
//!   bitmap otherwise (an IPv6 /64 in /124 blocks: memory proportional to what is granted).
//! - [`choice`]: a pod's pool per family ([`choice::choose`]): eligibility by node, namespace
//!   and pod selectors, then the pod's and the namespace's annotation, selectors, the node's
//!   default; an annotation naming a pool the pod may not use is an error.
//! - [`set`]: [`PoolSet`] — every pool in creation order with its validity, and
//!   [`PoolSet::rebuild`] from typed block records with a typed [`RebuildReport`].
//!
//! Rules decided here (DESIGN.md is silent on them):
//! - **IPv4 network and broadcast addresses.** For each IPv4 CIDR of prefix ≤ 30, its first and
//!   last address are never handed out. A block containing one of them is still granted (a
//!   /28 at the start of a CIDR gives its node 15 usable addresses, not 16 — wasting a whole
//!   block per CIDR end would cost 14 addresses), and [`FamilyIndex::usable_addresses`] leaves
//!   them out. A block with *no* usable address (only a /32 block on either address) is treated
//!   as excluded: never granted, not counted in capacity. /31 and /32 CIDRs are point-to-point
//!   (RFC 3021): all their addresses are usable. IPv6 reserves nothing.
//! - **Exclusions** are block-granular: a block that overlaps an exclusion at all is never
//!   granted and is not part of the capacity. An exclusion must lie inside one of the pool's
//!   CIDRs of its family.
//! - **Counts**: capacity = blocks that can ever be granted; allocated = blocks taken;
//!   free = capacity − allocated, all in blocks (`u128`). [`FamilyIndex::addresses`] gives the
//!   same in usable addresses (saturating).
//! - **CIDRs** must be canonical (no host bits: `10.0.0.1/24` is refused, it is almost always a
//!   typo), may not overlap each other inside a pool, and hold at most 2^64 blocks each.

pub mod bitmap;
pub mod choice;
pub mod fill;
pub mod forecast;
pub mod index;
pub mod name;
pub mod repair;
pub mod runs;
pub mod set;
pub mod source;
pub mod sparse;
pub mod spec;

#[cfg(test)]
mod tests;

use ipnet::IpNet;

use crate::error::ErrorClass;
use crate::types::{Family, PerFamily};

pub use fill::{BlockFill, block_fill, used_in};
pub use index::{AddressCounts, FamilyIndex, Layout, PoolIndex};
pub use name::{BlockNameError, block_name, parse_block_name};
pub use set::{BlockRecord, Finding, FindingKind, PoolSet, RebuildReport};
pub use source::{ClusterPoolSource, DEFAULT_POOL, InUse, PoolConfig, PoolUsage};
pub use spec::{PoolSpec, check_pools};

/// Default block sizes (prefix lengths): /28 for IPv4 and /124 for IPv6, 16 addresses each.
pub const DEFAULT_BLOCK_SIZE: PerFamily<u8> = PerFamily { v4: 28, v6: 124 };

/// Which spec field a bad CIDR came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    Cidrs,
    Exclude,
}

impl Field {
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Cidrs => "spec.cidrs",
            Field::Exclude => "spec.exclude",
        }
    }
}

/// Everything that can be wrong with a pool or a block operation on it. Every variant names the
/// pool and the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// Not a CIDR, or a CIDR with host bits set.
    #[error("pool {pool}: {}: invalid CIDR {value:?}: {reason}", .field.as_str())]
    InvalidCidr {
        pool: String,
        field: Field,
        value: String,
        reason: String,
    },
    /// A block prefix length beyond /32 (IPv4) or /128 (IPv6).
    #[error("pool {pool}: block size /{prefix} is not a valid {} prefix length", .family.as_str())]
    InvalidBlockSize {
        pool: String,
        family: Family,
        prefix: u8,
    },
    /// The block prefix is shorter than the CIDR's, or carves it into more than 2^64 blocks.
    #[error("pool {pool}: block size /{prefix} does not fit CIDR {cidr}: {reason}")]
    BlockSizeDoesNotFit {
        pool: String,
        cidr: IpNet,
        prefix: u8,
        reason: &'static str,
    },
    /// An exclusion not inside any of the pool's CIDRs.
    #[error("pool {pool}: exclusion {exclusion} is outside the pool's CIDRs")]
    ExclusionOutsidePool { pool: String, exclusion: IpNet },
    /// No CIDRs, or every block excluded.
    #[error("pool {pool}: empty pool: {reason}")]
    EmptyPool { pool: String, reason: &'static str },
    /// Two CIDRs of one pool overlap (or are equal).
    #[error("pool {pool}: CIDRs {first} and {second} overlap")]
    OverlappingCidrs {
        pool: String,
        first: IpNet,
        second: IpNet,
    },
    /// A CIDR overlaps one of an older, valid pool: this (later) pool is Invalid.
    #[error("pool {pool}: CIDR {cidr} overlaps {other_cidr} of older pool {other_pool}")]
    OverlapsPool {
        pool: String,
        cidr: IpNet,
        other_pool: String,
        other_cidr: IpNet,
    },
    /// A second pool with the same name (the later one is Invalid).
    #[error("pool {pool}: duplicate pool name")]
    DuplicateName { pool: String },
    /// The pool has no CIDR of this family.
    #[error("pool {pool}: serves no {} CIDR", .family.as_str())]
    FamilyNotServed { pool: String, family: Family },
    /// Every block of the family is taken (a normal state, not a fault).
    #[error("pool {pool}: no free {} block", .family.as_str())]
    Exhausted { pool: String, family: Family },
    /// No pool of that name, or the pool is not valid.
    #[error("pool {pool}: unknown or invalid pool")]
    UnknownPool { pool: String },
    /// A block not inside any of the pool's CIDRs.
    #[error("pool {pool}: block {block} is outside the pool's CIDRs")]
    BlockOutsidePool { pool: String, block: IpNet },
    /// A block of another prefix length than the pool's block size.
    #[error("pool {pool}: block {block} does not match block size /{expected}")]
    WrongBlockSize {
        pool: String,
        block: IpNet,
        expected: u8,
    },
    /// A block with host bits set.
    #[error("pool {pool}: block {block} has host bits set")]
    Misaligned { pool: String, block: IpNet },
    /// A block overlapping an exclusion (or with no usable address).
    #[error("pool {pool}: block {block} is excluded")]
    BlockExcluded { pool: String, block: IpNet },
    /// The block is already taken.
    #[error("pool {pool}: block {block} is already taken")]
    BlockTaken { pool: String, block: IpNet },
}

impl PoolError {
    /// The pool the error is about.
    pub fn pool(&self) -> &str {
        match self {
            PoolError::InvalidCidr { pool, .. }
            | PoolError::InvalidBlockSize { pool, .. }
            | PoolError::BlockSizeDoesNotFit { pool, .. }
            | PoolError::ExclusionOutsidePool { pool, .. }
            | PoolError::EmptyPool { pool, .. }
            | PoolError::OverlappingCidrs { pool, .. }
            | PoolError::OverlapsPool { pool, .. }
            | PoolError::DuplicateName { pool }
            | PoolError::FamilyNotServed { pool, .. }
            | PoolError::Exhausted { pool, .. }
            | PoolError::UnknownPool { pool }
            | PoolError::BlockOutsidePool { pool, .. }
            | PoolError::WrongBlockSize { pool, .. }
            | PoolError::Misaligned { pool, .. }
            | PoolError::BlockExcluded { pool, .. }
            | PoolError::BlockTaken { pool, .. } => pool,
        }
    }

    /// How the runtime should react: a bad spec is permanent (no retry until the spec or the
    /// pool changes), exhaustion parks the node until a block frees, a taken block means
    /// "pick another" (transient).
    pub fn class(&self) -> ErrorClass {
        match self {
            PoolError::Exhausted { .. } => ErrorClass::Exhausted,
            PoolError::BlockTaken { .. } => ErrorClass::Transient,
            _ => ErrorClass::Permanent,
        }
    }
}

/// The family of a network.
pub(crate) fn family_of(net: &IpNet) -> Family {
    match net {
        IpNet::V4(_) => Family::V4,
        IpNet::V6(_) => Family::V6,
    }
}

/// Address bits of a family.
pub(crate) fn max_prefix(f: Family) -> u8 {
    match f {
        Family::V4 => 32,
        Family::V6 => 128,
    }
}

/// The network address as a number (IPv4 in the low 32 bits).
pub(crate) fn addr_bits(net: &IpNet) -> u128 {
    match net {
        IpNet::V4(n) => u32::from(n.addr()) as u128,
        IpNet::V6(n) => u128::from(n.addr()),
    }
}

/// Inclusive first and last address of a network, as numbers (host bits ignored).
pub(crate) fn span(net: &IpNet) -> (u128, u128) {
    let host = max_prefix(family_of(net)) - net.prefix_len();
    let first = addr_bits(net) & !low_mask(host);
    (first, first | low_mask(host))
}

/// The low `bits` bits set (bits ≤ 128).
pub(crate) fn low_mask(bits: u8) -> u128 {
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

/// Builds a network of `family` from a numeric address.
pub(crate) fn make_net(family: Family, addr: u128, prefix: u8) -> IpNet {
    match family {
        Family::V4 => IpNet::V4(ipnet::Ipv4Net::new_assert(
            std::net::Ipv4Addr::from(addr as u32),
            prefix,
        )),
        Family::V6 => IpNet::V6(ipnet::Ipv6Net::new_assert(
            std::net::Ipv6Addr::from(addr),
            prefix,
        )),
    }
}

/// Every address of a network, in order.
pub fn addresses_of(net: &IpNet) -> impl Iterator<Item = std::net::IpAddr> + use<> {
    let f = family_of(net);
    let (lo, hi) = span(net);
    (lo..=hi).map(move |a| make_addr(f, a))
}

/// Builds an address of `family` from a number.
pub(crate) fn make_addr(family: Family, addr: u128) -> std::net::IpAddr {
    match family {
        Family::V4 => std::net::IpAddr::V4(std::net::Ipv4Addr::from(addr as u32)),
        Family::V6 => std::net::IpAddr::V6(std::net::Ipv6Addr::from(addr)),
    }
}

#[inline]
pub(crate) fn shr(x: u128, s: u32) -> u128 {
    x.checked_shr(s).unwrap_or(0)
}

#[inline]
pub(crate) fn shl(x: u128, s: u32) -> u128 {
    x.checked_shl(s).unwrap_or(0)
}
