//! The masquerade rules as `iptables-restore` input, per family (pure).

use ipnet::IpNet;

use super::CHAIN;

/// An address family's tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// Its `iptables` binary.
    pub fn iptables(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }

    /// Its `iptables-restore` binary.
    pub fn restore(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }

    /// Whether `net` is of this family.
    pub fn holds(self, net: &IpNet) -> bool {
        matches!(
            (self, net),
            (Family::V4, IpNet::V4(_)) | (Family::V6, IpNet::V6(_))
        )
    }
}

/// The `iptables-restore --noflush` input that makes [`CHAIN`] exactly: return for a
/// destination in a pool CIDR or in `keep`, then masquerade a source in a pool CIDR. Only
/// `family`'s CIDRs are used; with no pool CIDR the chain is empty.
pub fn restore_input(family: Family, pools: &[IpNet], keep: &[IpNet]) -> String {
    let pools: Vec<&IpNet> = pools.iter().filter(|n| family.holds(n)).collect();
    let keep = keep.iter().filter(|n| family.holds(n));
    let mut out = format!("*nat\n:{CHAIN} - [0:0]\n");
    if !pools.is_empty() {
        for (d, why) in pools
            .iter()
            .map(|n| (*n, "a pool"))
            .chain(keep.map(|n| (n, "non-masquerade")))
        {
            out +=
                &format!("-A {CHAIN} -d {d} -m comment --comment \"tidepool: {why}\" -j RETURN\n");
        }
        for s in &pools {
            out += &format!(
                "-A {CHAIN} -s {s} -m comment --comment \"tidepool: pod to outside\" -j MASQUERADE\n"
            );
        }
    }
    out + "COMMIT\n"
}

/// The `POSTROUTING` rule that jumps to [`CHAIN`] (for `iptables -t nat -C|-A`): traffic
/// to a non-local destination, as ip-masq-agent's.
pub fn jump() -> Vec<String> {
    [
        "POSTROUTING",
        "-m",
        "comment",
        "--comment",
        "tidepool: masquerade pods' traffic leaving the pod networks",
        "-m",
        "addrtype",
        "!",
        "--dst-type",
        "LOCAL",
        "-j",
        CHAIN,
    ]
    .map(String::from)
    .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|n| n.parse().expect("a CIDR")).collect()
    }

    #[test]
    fn returns_for_pools_and_kept_cidrs_then_masquerades_the_pools() {
        let pools = nets(&["10.77.0.0/16", "fd00:10:64::/64"]);
        let keep = nets(&["192.168.77.0/24", "10.96.0.0/12", "fd00:96::/108"]);
        let v4 = restore_input(Family::V4, &pools, &keep);
        assert_eq!(
            v4,
            "*nat\n:TIDEPOOL-MASQ - [0:0]\n\
             -A TIDEPOOL-MASQ -d 10.77.0.0/16 -m comment --comment \"tidepool: a pool\" -j RETURN\n\
             -A TIDEPOOL-MASQ -d 192.168.77.0/24 -m comment --comment \"tidepool: non-masquerade\" -j RETURN\n\
             -A TIDEPOOL-MASQ -d 10.96.0.0/12 -m comment --comment \"tidepool: non-masquerade\" -j RETURN\n\
             -A TIDEPOOL-MASQ -s 10.77.0.0/16 -m comment --comment \"tidepool: pod to outside\" -j MASQUERADE\n\
             COMMIT\n"
        );
        let v6 = restore_input(Family::V6, &pools, &keep);
        assert!(v6.contains("-d fd00:10:64::/64 "), "{v6}");
        assert!(v6.contains("-d fd00:96::/108 "), "{v6}");
        assert!(v6.contains("-s fd00:10:64::/64 "), "{v6}");
        assert!(!v6.contains("10.77."), "{v6}");
    }

    #[test]
    fn no_pool_of_the_family_empties_the_chain() {
        let input = restore_input(Family::V6, &nets(&["10.77.0.0/16"]), &nets(&["fd00::/8"]));
        assert_eq!(input, "*nat\n:TIDEPOOL-MASQ - [0:0]\nCOMMIT\n");
    }
}
