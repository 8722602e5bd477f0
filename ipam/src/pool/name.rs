//! Canonical IPAMBlock names, derived from the block's CIDR alone (pools never overlap, so a
//! CIDR names at most one block cluster-wide). Creating the object of that name *is* the claim:
//! the API server refuses a second create of the same name, so the mapping must be a bijection
//! between canonical CIDRs and names. The exact rule:
//!
//! - IPv4 `a.b.c.d/p` → `v4-a-b-c-d-p`: the four octets and the prefix length in decimal, no
//!   leading zeros (`10.0.1.16/28` → `v4-10-0-1-16-28`).
//! - IPv6 → `v6-` + the eight 16-bit groups, each as exactly four lowercase hex digits (fully
//!   expanded, no `::` compression), then the prefix length in decimal
//!   (`fd00::10/124` → `v6-fd00-0000-0000-0000-0000-0000-0000-0010-124`).
//! - Host bits are dropped when naming (`10.0.1.17/28` is named as `10.0.1.16/28`).
//!
//! Both forms are valid DNS-1123 labels (lowercase alphanumerics and `-`, start with a letter,
//! at most 46 characters). [`parse_block_name`] accepts exactly the names [`block_name`]
//! produces and nothing else (no uppercase, no leading zeros, no host bits), so
//! `parse_block_name(&block_name(&n)) == Ok(n.trunc())` and
//! `block_name(&parse_block_name(s)?) == s`.

use std::fmt::Write as _;

use ipnet::IpNet;

use super::{make_net, span};
use crate::types::Family;

/// A string that is not a canonical block name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid block name {name:?}: {reason}")]
pub struct BlockNameError {
    pub name: String,
    pub reason: &'static str,
}

/// The canonical object name of the block `net` (host bits dropped).
pub fn block_name(net: &IpNet) -> String {
    let net = net.trunc();
    let mut s = String::with_capacity(48);
    match net {
        IpNet::V4(n) => {
            let [a, b, c, d] = n.addr().octets();
            let _ = write!(s, "v4-{a}-{b}-{c}-{d}-{}", n.prefix_len());
        }
        IpNet::V6(n) => {
            s.push_str("v6");
            for g in n.addr().segments() {
                let _ = write!(s, "-{g:04x}");
            }
            let _ = write!(s, "-{}", n.prefix_len());
        }
    }
    s
}

fn decimal(part: &str, max: u32) -> Option<u32> {
    if part.is_empty()
        || part.len() > 3
        || !part.bytes().all(|b| b.is_ascii_digit())
        || (part.len() > 1 && part.starts_with('0'))
    {
        return None;
    }
    let v: u32 = part.parse().ok()?;
    (v <= max).then_some(v)
}

fn group(part: &str) -> Option<u16> {
    if part.len() != 4
        || !part
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u16::from_str_radix(part, 16).ok()
}

/// Parses a canonical block name back into its CIDR. Only exact canonical names are accepted.
pub fn parse_block_name(name: &str) -> Result<IpNet, BlockNameError> {
    let err = |reason| BlockNameError {
        name: name.to_string(),
        reason,
    };
    let (family, rest) = if let Some(r) = name.strip_prefix("v4-") {
        (Family::V4, r)
    } else if let Some(r) = name.strip_prefix("v6-") {
        (Family::V6, r)
    } else {
        return Err(err("must start with v4- or v6-"));
    };
    let parts: Vec<&str> = rest.split('-').collect();
    let (addr, prefix) = match family {
        Family::V4 => {
            if parts.len() != 5 {
                return Err(err(
                    "an IPv4 block name has four octets and a prefix length",
                ));
            }
            let mut addr = 0u128;
            for p in &parts[..4] {
                let o = decimal(p, 255)
                    .ok_or_else(|| err("octets are decimal 0-255 without leading zeros"))?;
                addr = (addr << 8) | o as u128;
            }
            let prefix = decimal(parts[4], 32)
                .ok_or_else(|| err("the prefix length is decimal 0-32 without leading zeros"))?;
            (addr, prefix as u8)
        }
        Family::V6 => {
            if parts.len() != 9 {
                return Err(err(
                    "an IPv6 block name has eight groups and a prefix length",
                ));
            }
            let mut addr = 0u128;
            for p in &parts[..8] {
                let g =
                    group(p).ok_or_else(|| err("groups are exactly four lowercase hex digits"))?;
                addr = (addr << 16) | g as u128;
            }
            let prefix = decimal(parts[8], 128)
                .ok_or_else(|| err("the prefix length is decimal 0-128 without leading zeros"))?;
            (addr, prefix as u8)
        }
    };
    let net = make_net(family, addr, prefix);
    if span(&net).0 != addr {
        return Err(err("host bits are set"));
    }
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_of_the_design_examples() {
        let v4: IpNet = "10.0.1.16/28".parse().unwrap();
        assert_eq!(block_name(&v4), "v4-10-0-1-16-28");
        let v6: IpNet = "fd00::10/124".parse().unwrap();
        assert_eq!(
            block_name(&v6),
            "v6-fd00-0000-0000-0000-0000-0000-0000-0010-124"
        );
        assert_eq!(parse_block_name("v4-10-0-1-16-28"), Ok(v4));
        assert_eq!(
            parse_block_name("v6-fd00-0000-0000-0000-0000-0000-0000-0010-124"),
            Ok(v6)
        );
        // host bits are dropped when naming
        let odd: IpNet = "10.0.1.17/28".parse().unwrap();
        assert_eq!(block_name(&odd), "v4-10-0-1-16-28");
    }

    #[test]
    fn rejects_non_canonical_names() {
        for bad in [
            "",
            "v4",
            "v4-",
            "v5-10-0-0-0-28",
            "V4-10-0-1-16-28",
            "v4-10-0-1-16",
            "v4-10-0-1-16-28-1",
            "v4-010-0-1-16-28",
            "v4-10-0-1-256-28",
            "v4-10-0-1-16-33",
            "v4-10-0-1-16-028",
            "v4-10-0-1-17-28",
            "v4-+1-0-1-16-28",
            "v4-10-0-1-16-",
            "v6-fd00-0000-0000-0000-0000-0000-0000-0010-129",
            "v6-FD00-0000-0000-0000-0000-0000-0000-0010-124",
            "v6-fd00-0-0-0-0-0-0-10-124",
            "v6-fd00-0000-0000-0000-0000-0000-0000-0011-124",
            "v6-fd00-0000-0000-0000-0000-0000-0010-124",
            "v6-fd00--0000-0000-0000-0000-0000-0000-0010-124",
        ] {
            assert!(parse_block_name(bad).is_err(), "{bad:?} accepted");
        }
        let e = parse_block_name("v4-10-0-1-17-28").unwrap_err();
        assert_eq!(e.name, "v4-10-0-1-17-28");
        assert_eq!(e.reason, "host bits are set");
    }

    proptest! {
        #[test]
        fn v4_names_round_trip(addr in any::<u32>(), prefix in 0u8..=32) {
            let net = make_net(Family::V4, addr as u128, prefix).trunc();
            let name = block_name(&net);
            prop_assert!(name.len() <= 46);
            prop_assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
            prop_assert_eq!(parse_block_name(&name), Ok(net));
        }

        #[test]
        fn v6_names_round_trip(addr in any::<u128>(), prefix in 0u8..=128) {
            let net = make_net(Family::V6, addr, prefix).trunc();
            let name = block_name(&net);
            prop_assert_eq!(name.len(), 3 + 8 * 5 + prefix.to_string().len());
            prop_assert_eq!(parse_block_name(&name), Ok(net));
        }

        /// Arbitrary strings never panic; whatever parses is canonical.
        #[test]
        fn arbitrary_names_never_panic(s in "\\PC{0,60}") {
            if let Ok(net) = parse_block_name(&s) {
                prop_assert_eq!(block_name(&net), s);
            }
        }

        #[test]
        fn name_shaped_strings_never_panic(s in "v[46](-[0-9a-fA-F+]{0,5}){0,10}") {
            if let Ok(net) = parse_block_name(&s) {
                prop_assert_eq!(block_name(&net), s);
            }
        }
    }
}
