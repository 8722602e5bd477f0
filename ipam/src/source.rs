//! Where addresses come from (Cilium's AllocationImplementation): the [`IpSource`] trait,
//! and an in-memory per-address source with a fixed capacity per family ([`memory`]).

mod memory;

pub use memory::{Faults, MemorySource};

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use crate::addrs::{AddrMap, AddrSet};
use crate::budget::Api;
use crate::error::{ErrorClass, IpamError};
use crate::gate::Gate;
use crate::plan::NodePools;
use crate::pool::choice::Subject;
use crate::types::{
    Family, NodeInfo, NodeName, NodeUid, PerFamily, PodUid, ReleaseAck, ReleaseState,
};

/// Capacity and free addresses of a source, per family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    pub capacity: u64,
    pub free: u64,
}

/// An IP source. Mutating calls (`allocate`, `release`, `set_marks`) admit each API request
/// they make through the caller's [`Gate`] (a caller that budgets the call as a whole passes
/// [`crate::gate::Ungated`]); `prepare_*`, `describe` and `quota` are reads.
pub trait IpSource: Send + Sync + 'static {
    /// The `source` metric label.
    fn name(&self) -> tidepool_metrics::Source;
    /// Families this source serves.
    fn families(&self) -> &[Family];
    /// Addresses per grant unit (1 for per-address sources, 16 for a /28 block, 2^64 for
    /// a /64).
    fn grant_size(&self, family: Family) -> u128;
    /// How many addresses a claim of `want` would really give now: rounded up to whole
    /// grant units, limited by what is free, never above `limit` (a set max_allocate
    /// headroom). 0 means the source is exhausted for this node.
    fn prepare_allocation(&self, node: &NodeName, family: Family, want: u64, limit: u64) -> u64;
    /// Grants `count` addresses of `family` to `node`, each API request it makes admitted
    /// by `gate` first (a per-address source's call is one request).
    fn allocate<G: Gate>(
        &self,
        node: &NodeName,
        family: Family,
        count: u64,
        gate: &mut G,
    ) -> impl Future<Output = Result<AddrSet, IpamError>> + Send;
    /// [`IpSource::prepare_allocation`] from `pool`, one of the node's pools other than its
    /// default one ([`IpSource::node_pools`]). Sources without pools have none: 0.
    fn prepare_pool_allocation(
        &self,
        _node: &NodeName,
        _family: Family,
        _pool: &str,
        _want: u64,
        _limit: u64,
    ) -> u64 {
        0
    }
    /// [`IpSource::allocate`] from `pool` (see [`IpSource::prepare_pool_allocation`]).
    fn allocate_from_pool<G: Gate>(
        &self,
        node: &NodeName,
        family: Family,
        pool: &str,
        _count: u64,
        _gate: &mut G,
    ) -> impl Future<Output = Result<AddrSet, IpamError>> + Send {
        let e = IpamError::Source {
            op: "allocate",
            node: node.to_string(),
            class: ErrorClass::Permanent,
            message: format!(
                "no pool {pool:?} of {}: this source has no pools",
                family.as_str()
            ),
        };
        async move { Err(e) }
    }
    /// The node's pools beyond its default ones: what it holds of each, and which of
    /// `pending` (with what the pool choice reads of each: [`crate::PodView::pool_subject`])
    /// wait for each. Sources without pools: none.
    fn node_pools(&self, _node: &NodeName, _pending: &[(PodUid, Option<Subject>)]) -> NodePools {
        NodePools::default()
    }
    /// Which of `free` (the node's unused addresses of one family) can really be given
    /// back, at most `max`; the highest addresses are preferred.
    fn prepare_release(&self, node: &NodeName, free: &AddrSet, max: u64) -> AddrSet;
    /// Takes the addresses back from the node, each API request admitted by `gate` first
    /// (a per-address source's call is one request).
    fn release<G: Gate>(
        &self,
        node: &NodeName,
        addrs: &AddrSet,
        gate: &mut G,
    ) -> impl Future<Output = Result<(), IpamError>> + Send;
    /// What the source believes the node holds: the truth used to repair after a call
    /// that failed after taking effect.
    fn describe(&self, node: &NodeName) -> impl Future<Output = Result<AddrSet, IpamError>> + Send;
    /// Capacity and free addresses per family.
    fn quota(&self) -> PerFamily<Quota>;
    /// The capacity of one pool of `family` (scarcity's pressure is measured against it):
    /// the pool "" of a source without pools is the whole source. None: no such pool.
    fn pool_capacity(&self, pool: &str, family: Family) -> Option<u128> {
        pool.is_empty()
            .then(|| u128::from(self.quota().get(family).capacity))
    }
    /// Whether the source knows the node's machine is gone (a cloud: no such instance).
    /// Whole-node reclaim then need not wait for the node grace. Sources that cannot tell
    /// say false.
    fn machine_gone(&self, _node: &NodeName) -> bool {
        false
    }
    /// Which budget the mutating calls draw on: an external API's (`source`), or the API
    /// server's (`kube`: cluster-pool's block claims and releases are API server writes).
    fn api(&self) -> Api {
        Api::Source
    }
    /// A Node was added or changed (the source may need its UID or labels).
    fn node_seen(&self, _info: &NodeInfo) {}
    /// Whether the source found one of the node's addresses held by another live node too
    /// (cluster-pool repair): the node then gets no new addresses and no marks until that
    /// is resolved; reclaim and running handshakes go on.
    fn node_blocked(&self, _node: &NodeName) -> bool {
        false
    }
    /// Whether the pool the node would get `family` from is Invalid (a claim then finds
    /// nothing, as on an exhausted pool, but the node is blocked for its pool, not for a
    /// lack of addresses). Sources without pools say false.
    fn pool_invalid(&self, _node: &NodeName, _family: Family) -> bool {
        false
    }
    /// The engine is done with a node (its addresses were reclaimed and its IPAMNode let go).
    fn node_gone(&self, _node: &NodeName) {}
    /// For sources that keep a node's addresses and release handshakes themselves
    /// (cluster-pool: on the node's IPAMBlocks), what they show now; the engine then plans
    /// from it and writes neither addresses nor marks into IPAMNode spec. Sources whose
    /// handshakes live in IPAMNode spec (cloud sources) return None.
    fn holdings(&self, _node: &NodeName) -> Option<Holdings> {
        None
    }
    /// Places release marks on `mark` and withdraws them from `withdraw` (sources with
    /// [`IpSource::holdings`] only), each API request (cluster-pool: each block's mark or
    /// withdrawal) admitted by `gate` first. A mutating call.
    fn set_marks<G: Gate>(
        &self,
        _node: &NodeName,
        _mark: &AddrSet,
        _withdraw: &AddrSet,
        _gate: &mut G,
    ) -> impl Future<Output = Result<(), IpamError>> + Send {
        async { Ok(()) }
    }
    /// The node's Node now has `uid` (DESIGN.md "Reclaim": a Node re-created under its name
    /// is adopted): a source that records the Node's UID on what it grants (cluster-pool:
    /// each IPAMBlock's `spec.nodeUID`) rewrites it, each API request admitted by `gate`
    /// first. A mutating call.
    fn adopt<G: Gate>(
        &self,
        _node: &NodeName,
        _uid: NodeUid,
        _gate: &mut G,
    ) -> impl Future<Output = Result<(), IpamError>> + Send {
        async { Ok(()) }
    }
    /// Called at the start of every resync while leading, before nodes are recalculated: a
    /// source with an index of its own rebuilds and repairs it here, each API request it
    /// makes (a repair's release, a drained block's mark or delete) admitted by `gate`;
    /// `utc`: the engine's wall clock now (a node's cooldowns end by it).
    fn resync<G: Gate>(&self, _gate: &mut G, _utc: SystemTime) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// A node's addresses and release handshakes as a source that keeps them shows them
/// ([`IpSource::holdings`]), in the address-level form the planner reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holdings {
    pub addresses: Arc<AddrSet>,
    /// Marked addresses (`MarkedForRelease` only).
    pub release: AddrMap<ReleaseState>,
    /// The node side's answers, per address.
    pub acks: AddrMap<ReleaseAck>,
}

/// Observes every change the source makes, in order (the simulator's observer).
pub trait SourceHook: Send + Sync + 'static {
    fn granted(&self, node: &NodeName, addrs: &AddrSet);
    fn released(&self, node: &NodeName, addrs: &AddrSet);
}
