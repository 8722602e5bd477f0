//! The strings an IPAMNode's entries repeat, kept small: at 150,000 pods the operator's
//! store holds one set per `status.used` entry, and issue 31's heap profile found them a
//! fifth of its memory.
//!
//! - [`Strings`]: one copy per object of each namespace, ifname and pool name its entries
//!   repeat (a node's 30 to 250 entries name a few namespaces, one ifname, one pool).
//! - [`AllocationNames`]: an allocation's (containerID, ifname), what a tombstone written
//!   back names; a containerID of 64 lowercase hex digits (containerd's, CRI-O's) inline as
//!   its 32 bytes, which saves its own allocation of ~96 B.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

/// One shared copy of each string read from one object.
#[derive(Debug, Default)]
pub(super) struct Strings(HashSet<Arc<str>>);

impl Strings {
    /// The object's copy of `s` (made at its first use).
    pub(super) fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.0.get(s) {
            return a.clone();
        }
        let a: Arc<str> = s.into();
        self.0.insert(a.clone());
        a
    }
}

/// The (containerID, ifname) behind an allocation ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocationNames {
    container_id: ContainerId,
    ifname: Arc<str>,
}

impl AllocationNames {
    pub fn new(container_id: &str, ifname: impl Into<Arc<str>>) -> Self {
        AllocationNames {
            container_id: ContainerId::new(container_id),
            ifname: ifname.into(),
        }
    }

    /// The containerID exactly as the object had it.
    pub fn container_id(&self) -> String {
        self.container_id.to_string()
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }
}

/// A containerID: a SHA-256 in lowercase hex as its bytes, any other as written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ContainerId {
    Sha256([u8; 32]),
    Other(Arc<str>),
}

impl ContainerId {
    fn new(s: &str) -> Self {
        let mut bytes = [0u8; 32];
        let lower = !s.bytes().any(|b| b.is_ascii_uppercase());
        match lower && hex::decode_to_slice(s, &mut bytes).is_ok() {
            true => ContainerId::Sha256(bytes),
            false => ContainerId::Other(s.into()),
        }
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContainerId::Sha256(b) => f.write_str(&hex::encode(b)),
            ContainerId::Other(s) => f.write_str(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "4f2b1c0e9d8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c";

    #[test]
    fn a_lowercase_sha256_is_kept_as_bytes_and_read_back_as_written() {
        let n = AllocationNames::new(SHA, "eth0");
        assert!(matches!(n.container_id, ContainerId::Sha256(_)));
        assert_eq!(n.container_id(), SHA);
        assert_eq!(n.ifname(), "eth0");
    }

    #[test]
    fn any_other_container_id_is_kept_as_written() {
        let upper = SHA.to_uppercase();
        let cases = [&upper[..], &SHA[1..], "c1", "", "zz", &SHA[..62]];
        for id in cases {
            let n = AllocationNames::new(id, "eth0");
            assert!(matches!(n.container_id, ContainerId::Other(_)), "{id:?}");
            assert_eq!(n.container_id(), id);
        }
    }

    #[test]
    fn a_name_read_twice_is_one_copy() {
        let mut s = Strings::default();
        let (a, b, c) = (s.get("ns-a"), s.get("ns-a"), s.get("ns-b"));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!((&*a, &*c), ("ns-a", "ns-b"));
    }
}
