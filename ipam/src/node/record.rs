//! [`NodeSide`] as plain data, for the agent's checkpoint (which keeps its own versioned
//! format, converted from this): [`NodeSide::record`] and [`NodeSide::from_record`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use super::side::{Key, Network, NodeSide, Owner, ReclaimAnswer, Refused};
use crate::addrs::AddrMap;
use crate::types::{FewByAddr, PodUid, ReleaseAck};

/// One allocation of a [`Record`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedAllocation<K> {
    pub key: K,
    pub pod_uid: PodUid,
    /// In address order.
    pub addrs: Vec<IpAddr>,
    pub since: SystemTime,
    pub network: Network,
}

/// Everything a [`NodeSide`] holds, as plain data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<K> {
    pub allocations: Vec<RecordedAllocation<K>>,
    pub cooldown: FewByAddr<SystemTime>,
    pub release_ack: AddrMap<ReleaseAck>,
    pub reclaim_ack: BTreeMap<IpAddr, ReclaimAnswer<K>>,
    pub block_ack: BTreeMap<String, ReleaseAck>,
}

impl<K: Key> NodeSide<K> {
    /// Everything it holds, by key.
    pub fn record(&self) -> Record<K> {
        let allocations = self
            .allocations()
            .map(|(h, addrs)| RecordedAllocation {
                key: h.key.clone(),
                pod_uid: h.pod_uid,
                addrs,
                since: h.since.into(),
                network: h.network.clone(),
            })
            .collect();
        Record {
            allocations,
            cooldown: self.cooldown.clone(),
            release_ack: self.release_ack.clone(),
            reclaim_ack: self.reclaim_ack.clone(),
            block_ack: self.block_ack.clone(),
        }
    }

    /// The node side `record` describes, clean; refused (with the first refusal) when it
    /// cannot be trusted: an allocation recorded twice, without addresses or with one
    /// twice, an address held twice.
    pub fn from_record(record: Record<K>, reuse_cooldown: Duration) -> Result<Self, Refused<K>> {
        let mut side = NodeSide::new(reuse_cooldown);
        for a in record.allocations {
            let owner = Owner {
                pod: a.pod_uid,
                network: a.network,
            };
            if side.adopt(a.key, owner, &a.addrs, a.since)?.repeated {
                return Err(Refused::KeyRecordedTwice);
            }
        }
        side.cooldown = record.cooldown;
        side.release_ack = record.release_ack;
        side.reclaim_ack = record.reclaim_ack;
        side.block_ack = record.block_ack;
        side.dirty = false;
        Ok(side)
    }

    /// Takes over a cooldown the node side had published (a rebuild after its record was
    /// lost): unless it is over at `now` or the address is held; the longer one wins.
    /// Returns whether it was taken.
    pub fn adopt_cooldown(&mut self, addr: IpAddr, until: SystemTime, now: SystemTime) -> bool {
        if until <= now || self.used.contains_key(&addr) {
            return false;
        }
        let e = self.cooldown.entry(addr).or_insert(until);
        *e = (*e).max(until);
        self.dirty = true;
        true
    }
}
