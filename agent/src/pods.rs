//! The live pods on this node as the agent reads them (pure; [`crate::kube::PodWatch`]
//! feeds it): per pod UID, the addresses its `status.podIPs` lists.
//!
//! Two rules read it (DESIGN.md "Node agent"):
//! - an address a live pod on this node lists is never handed to another allocation — so
//!   with no checkpoint (or a corrupt one) the agent cannot give a running pod's address
//!   away (aws-vpc-cni#711). The rule always holds, not only after such a start: an address
//!   the state does not hold but a live pod lists is busy whatever the checkpoint says;
//! - reconcile frees nothing a live pod with the allocation's UID lists.
//!
//! A pod is live until it is gone or terminal (`Succeeded`, `Failed`): a terminal pod's
//! sandbox is torn down, and the operator reclaims its address as well.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use tidepool_ipam::PodUid;

/// One pod bound to this node, cut down to what the rules read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAddrs {
    /// `None` when the object's UID is not a UUID (its addresses still count as busy).
    pub uid: Option<PodUid>,
    /// `Succeeded` or `Failed`.
    pub terminal: bool,
    /// `status.podIPs` (or the older `status.podIP`).
    pub addrs: Vec<IpAddr>,
}

/// The live pods on the node: what each lists, and every listed address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LivePods {
    by_uid: BTreeMap<PodUid, Vec<IpAddr>>,
    listed: BTreeSet<IpAddr>,
    pods: usize,
}

impl LivePods {
    /// The live ones among `pods` (terminal pods are left out).
    pub fn new<'a>(pods: impl IntoIterator<Item = &'a PodAddrs>) -> Self {
        let mut live = LivePods::default();
        for p in pods.into_iter().filter(|p| !p.terminal) {
            live.pods += 1;
            live.listed.extend(p.addrs.iter().copied());
            if let Some(uid) = p.uid {
                live.by_uid
                    .entry(uid)
                    .or_default()
                    .extend(p.addrs.iter().copied());
            }
        }
        live
    }

    /// Whether the live pod with UID `uid` lists `addr`.
    pub fn lists(&self, uid: PodUid, addr: &IpAddr) -> bool {
        self.by_uid.get(&uid).is_some_and(|a| a.contains(addr))
    }

    /// Whether a live pod has UID `uid`.
    pub fn has(&self, uid: PodUid) -> bool {
        self.by_uid.contains_key(&uid)
    }

    /// Every address a live pod lists: never handed to another allocation.
    pub fn addresses(&self) -> &BTreeSet<IpAddr> {
        &self.listed
    }

    /// How many live pods.
    pub fn len(&self) -> usize {
        self.pods
    }

    pub fn is_empty(&self) -> bool {
        self.pods == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn pod(uid: Option<u128>, terminal: bool, addrs: &[&str]) -> PodAddrs {
        PodAddrs {
            uid: uid.map(PodUid),
            terminal,
            addrs: addrs.iter().map(|a| ip(a)).collect(),
        }
    }

    #[test]
    fn terminal_pods_are_not_live_and_every_live_address_counts() {
        let pods = [
            pod(Some(1), false, &["10.0.0.1", "fd00::1"]),
            pod(Some(2), true, &["10.0.0.2"]),
            pod(None, false, &["10.0.0.3"]),
            pod(Some(4), false, &[]),
        ];
        let live = LivePods::new(&pods);
        assert_eq!(live.len(), 3);
        assert!(live.lists(PodUid(1), &ip("fd00::1")));
        assert!(!live.lists(PodUid(1), &ip("10.0.0.3")), "another pod's");
        assert!(!live.lists(PodUid(2), &ip("10.0.0.2")), "terminal");
        assert!(!live.has(PodUid(2)));
        assert!(live.has(PodUid(4)));
        let all: Vec<IpAddr> = live.addresses().iter().copied().collect();
        assert_eq!(all, vec![ip("10.0.0.1"), ip("10.0.0.3"), ip("fd00::1")]);
    }
}
