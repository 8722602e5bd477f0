//! The ADD result's shape, and the addresses it reserves (see the module doc of
//! [`super`], "Gateway").
//!
//! Each pod network (a valid IPPool's CIDR, or `--pod-network`, which overrides them all)
//! gives the result's prefix length and its
//! gateway: the network's first host address, the same on every node. The network's own
//! address, its gateway and (IPv4) its broadcast address are never handed to a pod.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Value, json};
use tidepool_ipam::AddrSet;

use crate::error::{Error, Result};

/// The pod networks: what the result says about each address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodNetworks {
    nets: Vec<IpNet>,
    reserved: AddrSet,
}

impl PodNetworks {
    /// Checks each network has room for a gateway and a pod (IPv4 /30 or wider, IPv6 /126 or
    /// wider) and that none overlaps another.
    pub fn new(nets: impl IntoIterator<Item = IpNet>) -> Result<Self> {
        let nets: Vec<IpNet> = nets.into_iter().map(|n| n.trunc()).collect();
        let mut reserved = AddrSet::new();
        for (i, n) in nets.iter().enumerate() {
            if n.prefix_len() + 2 > n.max_prefix_len() {
                return Err(Error::Config(format!(
                    "pod network {n} is too small for a gateway and a pod"
                )));
            }
            if let Some(o) = nets[..i].iter().find(|o| o.contains(n) || n.contains(*o)) {
                return Err(Error::Config(format!("pod networks {o} and {n} overlap")));
            }
            reserved.insert(n.network());
            reserved.insert(gateway(n));
            if let IpNet::V4(v4) = n {
                reserved.insert(IpAddr::V4(v4.broadcast()));
            }
        }
        Ok(PodNetworks { nets, reserved })
    }

    /// The pod networks the IPPools make: each CIDR of a valid pool (their CIDRs never
    /// overlap), leaving out, with a warning, one too small for a gateway and a pod.
    pub fn from_pools(cidrs: impl IntoIterator<Item = IpNet>) -> Self {
        let fit: Vec<IpNet> = cidrs
            .into_iter()
            .filter(|n| {
                let ok = n.prefix_len() + 2 <= n.max_prefix_len();
                if !ok {
                    tracing::warn!(cidr = %n, "pool CIDR too small to be a pod network (a gateway and a pod)");
                }
                ok
            })
            .collect();
        // valid pools never overlap (`check_pools`), so this cannot fail but on a bug
        Self::new(fit).unwrap_or_else(|e| {
            tracing::error!(error = %e, "pool CIDRs as pod networks");
            Self::default()
        })
    }

    /// The networks.
    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    /// The addresses never handed to a pod: each network's own, its gateway, its broadcast.
    pub fn reserved(&self) -> &AddrSet {
        &self.reserved
    }

    /// The network `addr` is in.
    pub fn network_of(&self, addr: IpAddr) -> Option<&IpNet> {
        self.nets.iter().find(|n| n.contains(&addr))
    }

    /// The CNI result for `addrs` (each in a pod network, or an error naming it).
    pub fn result(&self, cni_version: &str, addrs: &[IpAddr]) -> Result<Value> {
        let mut ips = Vec::with_capacity(addrs.len());
        let mut routes = Vec::with_capacity(addrs.len());
        for a in addrs {
            let net = self.network_of(*a).ok_or_else(|| {
                Error::Config(format!(
                    "address {a} of the node's pool is in no pod network (no valid IPPool holds it, \
                     and no --pod-network)"
                ))
            })?;
            ips.push(json!({
                "address": format!("{a}/{}", net.prefix_len()),
                "gateway": gateway(net).to_string(),
            }));
            routes.push(json!({"dst": if a.is_ipv4() { "0.0.0.0/0" } else { "::/0" }}));
        }
        Ok(json!({"cniVersion": cni_version, "ips": ips, "routes": routes}))
    }
}

/// A network's gateway: its first host address.
pub fn gateway(net: &IpNet) -> IpAddr {
    match net {
        IpNet::V4(n) => IpAddr::V4((u32::from(n.network()).wrapping_add(1)).into()),
        IpNet::V6(n) => IpAddr::V6((u128::from(n.network()).wrapping_add(1)).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn result_has_the_pool_prefix_a_gateway_and_a_default_route() {
        let p = PodNetworks::new([net("10.250.0.0/16"), net("fd00:250::/64")]).expect("nets");
        let r = p
            .result("1.1.0", &[ip("10.250.1.5"), ip("fd00:250::5")])
            .expect("result");
        assert_eq!(
            r.to_string(),
            r#"{"cniVersion":"1.1.0","ips":[{"address":"10.250.1.5/16","gateway":"10.250.0.1"},{"address":"fd00:250::5/64","gateway":"fd00:250::1"}],"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]}"#
        );
    }

    #[test]
    fn network_gateway_and_broadcast_are_reserved() {
        let p = PodNetworks::new([net("10.250.0.0/16"), net("fd00::/64")]).expect("nets");
        for a in [
            "10.250.0.0",
            "10.250.0.1",
            "10.250.255.255",
            "fd00::",
            "fd00::1",
        ] {
            assert!(p.reserved().contains(&ip(a)), "{a}");
        }
        assert!(!p.reserved().contains(&ip("10.250.0.2")));
        assert!(!p.reserved().contains(&ip("fd00::ffff:ffff:ffff:ffff")));
    }

    #[test]
    fn an_address_outside_every_network_is_an_error() {
        let p = PodNetworks::new([net("10.250.0.0/16")]).expect("nets");
        let e = p.result("1.1.0", &[ip("10.9.0.5")]).expect_err("outside");
        assert!(e.to_string().contains("10.9.0.5"), "{e}");
    }

    #[test]
    fn tiny_or_overlapping_networks_are_refused() {
        assert!(PodNetworks::new([net("10.0.0.0/31")]).is_err());
        assert!(PodNetworks::new([net("10.0.0.0/30")]).is_ok());
        assert!(PodNetworks::new([net("10.0.0.0/16"), net("10.0.1.0/24")]).is_err());
    }
}
