//! The `cluster-pool` IP source: blocks of the cluster's IPPools granted to nodes as IPAMBlock
//! objects (DESIGN.md "Resources", "IP sources").
//!
//! - **The claim is the create.** [`IpSource::allocate`] picks a free block in its index from a
//!   random start and creates the block's object; the store refuses a second create of a name,
//!   so two engines that both think they lead never grant one block twice. On AlreadyExists the
//!   block is read: adopted when its node and node UID are ours, else left taken in the index
//!   and another one is picked.
//! - **Handshakes live on the blocks.** [`IpSource::holdings`] shows the node's blocks in the
//!   address-level form the planner reads (marks and answers copied to each usable address);
//!   [`IpSource::set_marks`] marks or unmarks whole blocks; [`IpSource::release`] deletes each
//!   block with the resourceVersion this engine last saw it at (in `holdings` or `describe`),
//!   so a delete planned from an answer that another engine has since withdrawn fails with a
//!   conflict instead of taking back addresses the node uses again.
//! - **Whole blocks only.** [`IpSource::prepare_release`] offers only unmarked blocks all of
//!   whose usable addresses are free, never more addresses than asked.
//! - **Pool choice** per node and family: the pool set for the node ([`ClusterPoolSource::set_node_pool`],
//!   IPAMNode `spec.pools`) > the oldest valid pool whose node selector matches the node's labels
//!   > the pool named `default`.
//! - **Rebuild and repair** on every resync ([`IpSource::resync`]): the index is rebuilt from all
//!   blocks (skipped while neither the store's blocks, the pools nor the index changed since the
//!   last rebuild: it would give the same index), [`super::repair::check`] runs over blocks and IPAMNodes, findings are counted in
//!   `tidepool_ipam_repair_issues_total` and raised as events, and orphan blocks seen in three
//!   consecutive passes are deleted (with a resourceVersion precondition). Duplicates between
//!   live nodes are never fixed: each raises an `IPAddressDuplicate` warning event on both
//!   nodes when first found, and both are blocked ([`IpSource::node_blocked`]) until a pass
//!   no longer finds it. Leaked entries are counted, not fixed here (reclaim takes back
//!   entries whose pod is gone).
//! - **Drain**: blocks a pool no longer holds (CIDR removed or excluded, pool deleted) are
//!   marked, answered and deleted by the source itself on resync, regardless of excess.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod node_pools;

use super::choice::{Selector, Subject};
use super::forecast::Forecast;
use super::repair::{self, BlockClaim, LiveNodes, RepairFix, RepairReport, RepairTracker};
use super::{PoolError, PoolSet, PoolSpec, block_name, family_of};
use crate::addrs::{AddrSet, saturate, span};
use crate::budget::Api;
use crate::error::{ErrorClass, IpamError};
use crate::gate::{Gate, Ungated};
use crate::plan::NodePools;
use crate::source::{Holdings, IpSource, Quota};
use crate::store::{BlockStore, EventType, NodeStore, ReleaseMark};
use crate::types::WatermarkOverrides;
use crate::types::{
    Family, IpamBlock, NodeInfo, NodeName, NodeUid, PerFamily, PodUid, ReleaseAck, ReleaseState,
    ResourceVersion,
};
use crate::vocab::EventReason;

use tidepool_metrics::{BlockState, PoolState, record};

/// A pool and the labels a node must carry to get it (empty: no selector), with the
/// namespaces and pods it selects (DESIGN.md "Pools per namespace and per pod").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pub spec: PoolSpec,
    pub node_selector: BTreeMap<String, String>,
    pub namespace_selector: Selector,
    pub pod_selector: Selector,
    /// The pool's `spec.watermarks` (DESIGN.md "Pools per namespace and per pod").
    pub watermarks: WatermarkOverrides,
}

impl PoolConfig {
    pub fn new(spec: PoolSpec) -> Self {
        Self {
            spec,
            node_selector: BTreeMap::new(),
            namespace_selector: Selector::default(),
            pod_selector: Selector::default(),
            watermarks: WatermarkOverrides::default(),
        }
    }
}

/// A pool's selectors, in the pools' order (oldest first).
#[derive(Debug)]
struct Selectors {
    name: String,
    node: BTreeMap<String, String>,
    namespace: Selector,
    pod: Selector,
    watermarks: WatermarkOverrides,
}

impl Selectors {
    fn of(p: &PoolConfig) -> Self {
        Self {
            name: p.spec.name.clone(),
            node: p.node_selector.clone(),
            namespace: p.namespace_selector.clone(),
            pod: p.pod_selector.clone(),
            watermarks: p.watermarks,
        }
    }
}

/// The name of the pool nodes get when nothing else chooses one.
pub const DEFAULT_POOL: &str = "default";

#[derive(Debug, Default)]
struct NodeMeta {
    uid: NodeUid,
    labels: BTreeMap<String, String>,
    /// IPAMNode `spec.pools`.
    pools: PerFamily<Option<String>>,
    /// The engine manages the node (seen and not yet gone).
    managed: bool,
}

#[derive(Default)]
struct Seen {
    blocks: Vec<(Arc<str>, Option<ResourceVersion>)>,
    /// The store's version of the node's blocks when `blocks` was taken.
    at: u64,
    holdings: Option<Holdings>,
}

impl Seen {
    fn version(&self, block: &str) -> Option<ResourceVersion> {
        self.blocks
            .iter()
            .find(|(n, _)| &**n == block)
            .and_then(|(_, rv)| rv.clone())
    }
}

struct State {
    pools: PoolSet,
    selectors: Vec<Selectors>,
    /// Looked up per pass of each node (foldhash, as [`PoolSet`]'s names).
    nodes: HashMap<NodeName, NodeMeta, foldhash::fast::RandomState>,
    /// Per node: the blocks (name, resourceVersion) last shown to the engine, and the
    /// holdings built from them (reused while the blocks are unchanged).
    seen: HashMap<NodeName, Seen, foldhash::fast::RandomState>,
    rng: SmallRng,
    calls: u64,
    tracker: RepairTracker,
    last_repair: Option<RepairReport>,
    /// Nodes holding an address another live node holds too (the last repair's duplicates).
    duplicates: BTreeSet<NodeName>,
    /// Counts [`ClusterPoolSource::set_pools`] calls.
    pools_generation: u64,
    /// What the last rebuild indexed, while the index is still exactly its result.
    indexed: Option<Indexed>,
    /// Addresses in use by the cluster (see [`ClusterPoolSource::set_in_use`]).
    in_use: Option<InUse>,
    /// Per pool and family: what it could still grant, sampled at each repair.
    forecasts: BTreeMap<(String, Family), Forecast>,
}

/// Tells the source which addresses the cluster uses now (live pods' podIPs, IPAMNode
/// `status.used` entries): no block holding one is ever granted unless a block object
/// already covers it.
pub type InUse = Arc<dyn Fn() -> AddrSet + Send + Sync>;

/// A rebuild's inputs and its block claims: the rebuilt index depends on the pool set and on
/// the blocks' specs alone (a pool a rebuild found invalid stays so until the pools are
/// replaced), so while neither the store's block set, nor the pools, nor the index changed
/// since, rebuilding again would give the same index and the same claims.
struct Indexed {
    /// [`BlockStore::block_set_changes`] before the blocks were listed.
    blocks_at: u64,
    pools_generation: u64,
    /// [`PoolSet::changes`] right after the rebuild.
    pool_changes: u64,
    /// The addresses in use outside every block, whose blocks the rebuild took out.
    reserved: AddrSet,
    claims: Arc<[BlockClaim]>,
}

/// One pool's usage and validity ([`ClusterPoolSource::usage`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolUsage {
    pub name: String,
    /// Capacity, allocated and free usable addresses per family (None: not served).
    pub addresses: PerFamily<Option<super::AddressCounts>>,
    pub valid: Result<(), PoolError>,
    /// Seconds until the pool runs out at its pace of the last 6 hours, per family (None:
    /// not shrinking; [`super::forecast`]).
    pub runway: PerFamily<Option<f64>>,
}

/// The cluster-pool source over a block store. Cheap to clone.
#[derive(Clone)]
pub struct ClusterPoolSource<B> {
    store: B,
    latency: Duration,
    state: Arc<Mutex<State>>,
}

/// Whether a pool's refusal of a block makes it stray (see [`State::kept`]).
fn is_stray(e: &PoolError) -> bool {
    matches!(
        e,
        PoolError::WrongBlockSize { .. } | PoolError::Misaligned { .. }
    )
}

/// Sets each valid pool's `tidepool_ipam_pool_ips` (capacity, allocated, free): at each
/// repair, and after each claim or release, so the free count follows them. Its `idle`
/// count needs the nodes' `used` and `cooldown` entries: each repair sets it with the
/// blocks' fill.
fn record_pool_ips(pools: &PoolSet) {
    for p in pools.valid() {
        for f in Family::ALL {
            if let Some(fi) = p.family(f) {
                let c = fi.addresses();
                for (state, v) in [
                    (PoolState::Capacity, c.capacity),
                    (PoolState::Allocated, c.allocated),
                    (PoolState::Free, c.free),
                ] {
                    record::pool_ips(p.name(), f.into(), state, v as f64);
                }
            }
        }
    }
}

/// Whether any of `addrs` lies in the block.
fn touches(addrs: &AddrSet, b: &IpamBlock) -> bool {
    let (f, run) = span(&b.cidr);
    addrs.overlaps(f, &run)
}

fn source_error(op: &'static str, node: &str, class: ErrorClass, message: String) -> IpamError {
    IpamError::Source {
        op,
        node: node.to_string(),
        class,
        message,
    }
}

impl State {
    /// Samples what the pool could still grant (its free addresses plus `idle` ones, in
    /// whole free blocks) and sets `tidepool_ipam_pool_exhaustion_seconds`.
    fn forecast(&mut self, pool: String, f: Family, idle: u128) {
        let Some(counts) = (self.pools.get(&pool).ok())
            .and_then(|p| p.family(f))
            .map(|fi| fi.addresses())
        else {
            return;
        };
        let forecast = self.forecasts.entry((pool.clone(), f)).or_default();
        forecast.sample(Instant::now(), counts.free.saturating_add(idle) as f64);
        let seconds = forecast.seconds_to_empty().unwrap_or(f64::INFINITY);
        record::pool_exhaustion(&pool, f.into(), seconds);
    }

    /// The usable addresses of a block: as its pool says, or all of them when the pool no
    /// longer holds it.
    fn usable(&self, b: &IpamBlock) -> AddrSet {
        let f = family_of(&b.cidr);
        self.pools
            .get(&b.pool)
            .ok()
            .and_then(|p| p.family(f))
            .and_then(|fi| fi.usable_addresses(&b.cidr).ok())
            .unwrap_or_else(|| AddrSet::of_net(&b.cidr))
    }

    /// Whether a block is to be drained: someone deleted it (its finalizer holds it), or
    /// its pool no longer holds it as a grantable block (its CIDR was removed or excluded,
    /// or the pool is gone) and it is neither [`Self::stray`] nor [`Self::of_invalid_pool`].
    fn drained(&self, b: &IpamBlock) -> bool {
        b.deleting
            || !self.of_invalid_pool(b)
                && self
                    .pools
                    .get(&b.pool)
                    .ok()
                    .and_then(|p| p.family(family_of(&b.cidr)))
                    .is_none_or(|fi| fi.usable_count(&b.cidr).is_err_and(|e| !is_stray(&e)))
    }

    /// Whether a block's pool exists but is Invalid: the block is left out as a stray one
    /// is (no grants, no allocations, never drained) while the pool stays Invalid; once the
    /// pool is valid again it serves, once it is deleted the block drains.
    fn of_invalid_pool(&self, b: &IpamBlock) -> bool {
        self.pools.holds(&b.pool) && self.pools.get(&b.pool).is_err()
    }

    /// Whether a block counts in its node's holdings: neither drained (the source's own
    /// handshake), nor stray (its valid pool cannot use it as one of its blocks — another
    /// prefix length than the pool's block size, or host bits — so nobody granted it: it
    /// was made by hand; reported and left out, DESIGN.md "one bad object": never marked
    /// nor deleted by the source, its range taken in the index until a person deletes it,
    /// an allocation in it stays), nor of an Invalid pool. That is: not being deleted, its pool
    /// valid and serving its family, and its CIDR one of the pool's blocks — in one lookup
    /// of its pool (a call per block of every node at every pass).
    fn kept(&self, b: &IpamBlock) -> bool {
        let pool = (self.pools.lookup(&b.pool)).and_then(Result::ok);
        let family = pool.and_then(|p| p.family(family_of(&b.cidr)));
        !b.deleting && family.is_some_and(|fi| fi.usable_count(&b.cidr).is_ok())
    }

    /// The node's pool for a family (see the module documentation for the precedence).
    fn pool_for(&self, node: &str, family: Family) -> Option<String> {
        let meta = self.nodes.get(node);
        let serves = |name: &str| {
            self.pools
                .get(name)
                .is_ok_and(|p| p.family(family).is_some())
        };
        let candidates = (self.selectors.iter())
            .filter(|p| serves(&p.name))
            .map(|p| (p.name.as_str(), &p.node));
        let named = meta.and_then(|m| m.pools.get(family).as_deref());
        let none = BTreeMap::new();
        let labels = meta.map_or(&none, |m| &m.labels);
        Some(super::choice::default_pool(named, candidates, labels))
    }

    /// Records the blocks shown to the engine (the store's `at` version of them); the
    /// cached holdings stay only if they are the same blocks at the same versions.
    fn remember(&mut self, node: &NodeName, blocks: &[Arc<IpamBlock>], at: u64) -> &mut Seen {
        let seen = self.seen.entry(node.clone()).or_default();
        seen.at = at;
        let same = seen.blocks.len() == blocks.len()
            && seen
                .blocks
                .iter()
                .zip(blocks)
                .all(|((n, rv), b)| *n == b.name && *rv == b.resource_version);
        if !same {
            seen.blocks = blocks
                .iter()
                .map(|b| (b.name.clone(), b.resource_version.clone()))
                .collect();
            seen.holdings = None;
        }
        seen
    }
}

impl<B: BlockStore + NodeStore + Clone> ClusterPoolSource<B> {
    /// The usable addresses of a block.
    pub fn block_addresses(&self, b: &IpamBlock) -> AddrSet {
        self.state.lock().usable(b)
    }

    /// The pool of `family` a pod with `subject` takes on `node` (DESIGN.md "Pools per
    /// namespace and per pod"): what the node side allocates from at ADD, and what the
    /// engine counts the pod's demand for until then.
    pub fn choose(
        &self,
        node: &str,
        family: Family,
        subject: &Subject,
    ) -> Result<String, super::choice::ChoiceError> {
        self.state.lock().choose(node, family, subject)
    }

    /// The node's block that holds `addr`.
    pub fn block_holding(
        &self,
        node: &NodeName,
        addr: &std::net::IpAddr,
    ) -> Option<Arc<IpamBlock>> {
        (self.store.blocks_of(node).iter())
            .find(|b| b.cidr.contains(addr))
            .cloned()
    }

    /// The usable addresses of the node's blocks of `pool` and `family`.
    pub fn pool_addresses(&self, node: &NodeName, pool: &str, family: Family) -> AddrSet {
        let blocks = self.store.blocks_of(node);
        let s = self.state.lock();
        let mut out = AddrSet::new();
        let mine = |b: &&Arc<IpamBlock>| &*b.pool == pool && family_of(&b.cidr) == family;
        for b in blocks.iter().filter(mine) {
            out.union_with(&s.usable(b));
        }
        out
    }

    /// A source over `store` serving `pools` (in creation order; invalid ones are kept,
    /// reported by [`Self::validity`], and never granted from). It serves the families its
    /// pools have CIDRs of, as they are now ([`Self::set_pools`]). The index is rebuilt from
    /// the blocks in the store before anything is granted.
    pub fn new(store: B, pools: Vec<PoolConfig>, seed: u64) -> Self {
        let selectors = pools.iter().map(Selectors::of).collect();
        let set = PoolSet::new(pools.into_iter().map(|p| p.spec).collect());
        let source = Self {
            store,
            latency: Duration::ZERO,
            state: Arc::new(Mutex::new(State {
                pools: set,
                selectors,
                nodes: HashMap::default(),
                seen: HashMap::default(),
                rng: SmallRng::seed_from_u64(seed),
                calls: 0,
                tracker: RepairTracker::new(),
                last_repair: None,
                duplicates: BTreeSet::new(),
                pools_generation: 0,
                indexed: None,
                in_use: None,
                forecasts: BTreeMap::new(),
            })),
        };
        source.rebuild();
        source
    }

    /// Each store write waits this long first (the API server's round trip).
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Each store write's latency.
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// Every pool with its validity, in creation order.
    pub fn validity(&self) -> Vec<(String, Result<(), PoolError>)> {
        self.state
            .lock()
            .pools
            .validity()
            .map(|(n, r)| (n.to_string(), r.map_err(Clone::clone)))
            .collect()
    }

    /// Each pool's usable addresses per family with its validity: what IPPool status shows.
    pub fn usage(&self) -> Vec<PoolUsage> {
        let s = self.state.lock();
        s.pools
            .validity()
            .map(|(name, valid)| {
                let index = s.pools.get(name).ok();
                let counts = |f| index.and_then(|p| p.family(f)).map(|fi| fi.addresses());
                let runway = |f| {
                    let forecast = s.forecasts.get(&(name.to_string(), f));
                    forecast.and_then(Forecast::seconds_to_empty)
                };
                PoolUsage {
                    name: name.to_string(),
                    addresses: PerFamily {
                        v4: counts(Family::V4),
                        v6: counts(Family::V6),
                    },
                    valid: valid.map_err(Clone::clone),
                    runway: PerFamily {
                        v4: runway(Family::V4),
                        v6: runway(Family::V6),
                    },
                }
            })
            .collect()
    }

    /// IPAMNode `spec.pools` of one node and family (None: chosen by selector or default).
    pub fn set_node_pool(&self, node: &NodeName, family: Family, pool: Option<String>) {
        let mut s = self.state.lock();
        *s.nodes
            .entry(node.clone())
            .or_default()
            .pools
            .get_mut(family) = pool;
    }

    /// The node's labels (from its Node object).
    pub fn set_node_labels(&self, node: &NodeName, labels: BTreeMap<String, String>) {
        self.state
            .lock()
            .nodes
            .entry(node.clone())
            .or_default()
            .labels = labels;
    }

    /// The pool a node gets addresses of `family` from now.
    pub fn pool_of(&self, node: &str, family: Family) -> Option<String> {
        self.state.lock().pool_for(node, family)
    }

    /// Replaces the pools (an IPPool added, edited or deleted). Blocks of CIDRs no longer in
    /// a valid pool stay with their nodes and are never granted again. The families served
    /// follow: a family no pool has a CIDR of any more is no longer claimed.
    pub fn set_pools(&self, pools: Vec<PoolConfig>) {
        {
            let mut s = self.state.lock();
            s.selectors = pools.iter().map(Selectors::of).collect();
            s.pools = PoolSet::new(pools.into_iter().map(|p| p.spec).collect());
            s.pools_generation += 1;
            // what is drained and what is usable may have changed
            for seen in s.seen.values_mut() {
                seen.holdings = None;
            }
        }
        self.rebuild();
    }

    /// Rebuilds the index from every block in the store, unless it is still the last
    /// rebuild's result ([`Indexed`]). Returns the blocks' claims.
    fn rebuild(&self) -> Arc<[BlockClaim]> {
        // read before listing: a block created in between makes the next call rebuild again
        let at = self.store.block_set_changes();
        let in_use = self.state.lock().in_use.clone();
        let listed = in_use.as_ref().map(|_| self.store.list_blocks());
        let reserved = match (&in_use, &listed) {
            (Some(f), Some(blocks)) => Self::reserved(f, blocks),
            _ => AddrSet::new(),
        };
        {
            let s = self.state.lock();
            if let Some(i) = s.indexed.as_ref().filter(|i| {
                (i.blocks_at, i.pools_generation, i.pool_changes)
                    == (at, s.pools_generation, s.pools.changes())
                    && i.reserved == reserved
            }) {
                return i.claims.clone();
            }
        }
        let blocks = listed.unwrap_or_else(|| self.store.list_blocks());
        let claims: Arc<[BlockClaim]> = blocks
            .iter()
            .map(|b| BlockClaim {
                name: b.name.clone(),
                pool: b.pool.clone(),
                cidr: b.cidr,
                node: b.node.clone(),
                node_uid: b.node_uid,
            })
            .collect();
        let mut s = self.state.lock();
        // the blocks holding an address in use outside every block count as taken, as
        // blocks of nobody (a cluster adopted with addresses, block objects lost)
        // (one address per pod or `used` entry: as many as those, never a block's worth)
        let taken: BTreeSet<(String, ipnet::IpNet)> = reserved
            .iter()
            .filter_map(|a| s.pools.locate(a).map(|(p, b)| (p.to_string(), b)))
            .collect();
        let names: Vec<String> = taken.iter().map(|(_, b)| super::block_name(b)).collect();
        let records = blocks
            .iter()
            .map(|b| super::BlockRecord {
                key: (),
                name: &b.name,
                pool: &b.pool,
                cidr: b.cidr,
            })
            .chain(
                taken
                    .iter()
                    .zip(&names)
                    .map(|((pool, cidr), name)| super::BlockRecord {
                        key: (),
                        name,
                        pool,
                        cidr: *cidr,
                    }),
            );
        s.pools.rebuild(records);
        s.indexed = Some(Indexed {
            blocks_at: at,
            pools_generation: s.pools_generation,
            pool_changes: s.pools.changes(),
            reserved,
            claims: claims.clone(),
        });
        claims
    }

    /// Says which addresses the cluster uses (see [`InUse`]): asked now, and again at each
    /// rebuild of the index (every resync).
    pub fn set_in_use(&self, f: InUse) {
        self.state.lock().in_use = Some(f);
        self.rebuild();
    }

    /// The addresses in use that no block object covers.
    fn reserved(in_use: &InUse, blocks: &[Arc<IpamBlock>]) -> AddrSet {
        let mut out = in_use();
        for b in blocks {
            if out.is_empty() {
                break;
            }
            let (fam, run) = span(&b.cidr);
            out.remove_run(fam, run);
        }
        out
    }

    /// How many times the pools were replaced ([`Self::set_pools`]): a block's usable
    /// addresses can change only with its object or with this.
    pub fn pools_generation(&self) -> u64 {
        self.state.lock().pools_generation
    }

    /// Mutating calls made (block creates, marks, deletes).
    pub fn calls(&self) -> u64 {
        self.state.lock().calls
    }

    /// The last repair pass's report.
    pub fn last_repair(&self) -> Option<RepairReport> {
        self.state.lock().last_repair.clone()
    }

    /// Blocks granted per node (for the simulator's oracle).
    pub fn blocks_held(&self, node: &str) -> u64 {
        self.store.blocks_of(node).len() as u64
    }

    /// Blocks free in the valid pools, per family.
    pub fn free_blocks(&self) -> PerFamily<u64> {
        let s = self.state.lock();
        let mut out = PerFamily::<u64>::default();
        for p in s.pools.valid() {
            for f in Family::ALL {
                if let Some(fi) = p.family(f) {
                    let free = fi.free().min(u128::from(u64::MAX)) as u64;
                    *out.get_mut(f) = out.get(f).saturating_add(free);
                }
            }
        }
        out
    }

    /// Blocks `node` holds, per family.
    pub fn blocks_held_by_family(&self, node: &str) -> PerFamily<u64> {
        let mut out = PerFamily::default();
        for b in self.store.blocks_of(node) {
            *out.get_mut(family_of(&b.cidr)) += 1;
        }
        out
    }

    /// Addresses per block of the pool serving `family` first.
    fn block_size(&self, family: Family) -> u128 {
        let s = self.state.lock();
        s.pools
            .valid()
            .find_map(|p| p.family(family))
            .map_or(16, |fi| fi.block_addresses())
    }

    async fn call(&self) {
        self.state.lock().calls += 1;
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }

    /// Every block's CIDR with its node (the simulator's truth at the end of a run).
    pub fn granted(&self) -> Vec<(ipnet::IpNet, NodeName)> {
        (self.store.list_blocks().iter())
            .map(|b| (b.cidr, b.node.clone()))
            .collect()
    }

    /// Drains blocks their pool no longer holds (a CIDR removed from an IPPool, an exclusion
    /// added, the pool deleted), regardless of excess: each is marked for release; once the
    /// node side answers ready-for-release (when none of its addresses is used or cooling
    /// down) it is deleted with the resourceVersion it was answered at. Its addresses are
    /// never granted again: the index holds only the pools' current blocks.
    async fn drain<G: Gate>(&self, gate: &mut G) {
        let blocks = self.store.list_blocks();
        let drained: Vec<Arc<IpamBlock>> = {
            let s = self.state.lock();
            blocks.into_iter().filter(|b| s.drained(b)).collect()
        };
        for b in drained {
            let r = if !b.release {
                self.call().await;
                self.store
                    .mark_block(&b.name, ReleaseMark::Set, gate)
                    .await
                    .map(|_| ())
            } else if b.ack == Some(ReleaseAck::ReadyForRelease) {
                self.call().await;
                match b.stored_version() {
                    Ok(rv) => self.store.delete_block(&b.name, rv, gate).await,
                    Err(e) => Err(e),
                }
            } else {
                Ok(()) // the node side answers when the block is free
            };
            match r {
                Err(IpamError::NotLeader) => return,
                Err(e) => tracing::debug!(block = %b.name, error = %e, "draining a block failed"),
                Ok(()) => {}
            }
        }
    }

    /// The events of a repair pass's findings that the last pass did not have: a duplicate
    /// between live nodes is never fixed, and the nodes it is blamed on hear of it once (the
    /// block's holder is the authority: a foreign entry blames its user); a stray block's
    /// node hears that it is left out.
    fn announce(&self, last: Option<&RepairReport>, report: &RepairReport) {
        use repair::{RangeIssue, RangeSubject, RepairFinding};
        let new = report
            .findings
            .iter()
            .filter(|f| !last.is_some_and(|l| l.findings.contains(f)));
        for f in new {
            match f {
                RepairFinding::Duplicate(c) => {
                    for node in report.blamed(c) {
                        let (w, r) = (EventType::Warning, EventReason::Duplicate);
                        self.store.event(node, w, r, c.to_string());
                    }
                }
                RepairFinding::OutOfRange {
                    subject: RangeSubject::Block(b),
                    issue: issue @ (RangeIssue::WrongBlockSize { .. } | RangeIssue::Misaligned),
                } => {
                    let why = match issue {
                        RangeIssue::WrongBlockSize { expected } => {
                            format!("its pool's block size is /{expected}")
                        }
                        _ => "its CIDR has host bits set".to_string(),
                    };
                    let message = format!(
                        "{b} is left out ({why}): no address of it is granted or allocated, \
                         its range stays taken until the IPAMBlock {} is deleted",
                        b.name
                    );
                    let (w, r) = (EventType::Warning, EventReason::StrayBlock);
                    self.store.event(&b.node, w, r, message);
                }
                _ => {}
            }
        }
    }

    /// One repair pass: rebuild, check, count (a cooldown ended at `utc` counts for
    /// nothing), and the fixes that are due (each release admitted by `gate`).
    async fn repair<G: Gate>(&self, gate: &mut G, utc: SystemTime) {
        let claims = self.rebuild();
        let nodes = self.store.list_nodes();
        let fixes = {
            let mut s = self.state.lock();
            let mut live = LiveNodes::new();
            for (name, meta) in &s.nodes {
                if meta.managed {
                    live.insert(name.clone(), meta.uid);
                }
            }
            let report = repair::check(&s.pools, &claims, &nodes, &live);
            for (kind, n) in report.counts() {
                record::repair_issues(kind, n as u64);
            }
            record_pool_ips(&s.pools);
            for ((pool, f), fill) in super::fill::block_fill(&s.pools, &claims, &nodes, utc) {
                for (state, v) in [
                    (BlockState::Full, fill.full),
                    (BlockState::Partial, fill.partial),
                    (BlockState::Empty, fill.empty),
                ] {
                    record::pool_blocks(&pool, f.into(), state, v as f64);
                }
                record::pool_ips(&pool, f.into(), PoolState::Idle, fill.idle_addresses as f64);
                s.forecast(pool, f, fill.idle_addresses);
            }
            self.announce(s.last_repair.as_ref(), &report);
            s.duplicates = report.nodes_to_block();
            s.tracker.observe(&report);
            let fixes = s.tracker.fixes();
            s.last_repair = Some(report);
            fixes
        };
        for fix in fixes {
            if let RepairFix::ReleaseBlock(b) = fix {
                // only the very object the finding named, unchanged since
                let Ok(Some(cur)) = self.store.get_block(&b.name).await else {
                    continue;
                };
                if cur.node != b.node || cur.node_uid != b.node_uid {
                    continue;
                }
                self.call().await;
                let Ok(rv) = cur.stored_version() else {
                    continue;
                };
                if self.store.delete_block(&b.name, rv, gate).await.is_ok() {
                    tracing::info!(block = %b.name, node = %b.node, "released orphan block");
                    let mut s = self.state.lock();
                    if let Ok(p) = s.pools.get_mut(&b.pool) {
                        let _ = p.release(&b.cidr);
                    }
                }
            }
        }
    }
}

impl<B: BlockStore + NodeStore + Clone> ClusterPoolSource<B> {
    /// [`IpSource::prepare_allocation`] from `pool`, or the node's default pool.
    fn prepare_in(
        &self,
        node: &NodeName,
        family: Family,
        pool: Option<&str>,
        want: u64,
        limit: u64,
    ) -> u64 {
        let s = self.state.lock();
        let Some(fi) = (pool.map(String::from))
            .or_else(|| s.pool_for(node, family))
            .and_then(|p| s.pools.get(&p).ok())
            .and_then(|p| p.family(family))
        else {
            return 0;
        };
        // a block of 2^64 or more addresses counts as u64::MAX of them
        let bs = saturate(fi.block_addresses());
        let free = saturate(fi.free());
        let blocks = want.div_ceil(bs).min(limit / bs).min(free);
        blocks.saturating_mul(bs)
    }

    /// [`IpSource::allocate`] from `pool`, or the node's default pool: one block create per
    /// block (an AlreadyExists answer included), each admitted by `gate`.
    async fn allocate_in<G: Gate>(
        &self,
        node: &NodeName,
        family: Family,
        pool: Option<&str>,
        count: u64,
        gate: &mut G,
    ) -> Result<AddrSet, IpamError> {
        let (pool, uid, bs) = {
            let s = self.state.lock();
            let pool = (pool.map(String::from))
                .or_else(|| s.pool_for(node, family))
                .unwrap_or_default();
            let bs = match s.pools.get(&pool) {
                Ok(p) => match p.family(family) {
                    Some(fi) => saturate(fi.block_addresses()),
                    None => {
                        let e = PoolError::FamilyNotServed { pool, family };
                        return Err(source_error("allocate", node, e.class(), e.to_string()));
                    }
                },
                Err(e) => return Err(source_error("allocate", node, e.class(), e.to_string())),
            };
            let uid = s.nodes.get(node).map_or(NodeUid::UNKNOWN, |m| m.uid);
            (pool, uid, bs)
        };
        let pool_name: Arc<str> = pool.as_str().into();
        let want = count.div_ceil(bs);
        let mut out = AddrSet::new();
        let mut got = 0;
        let mut refused = 0;
        while got < want {
            // the request's token first, so no block is held in the index while it waits
            if let Err(e) = gate.request().await {
                if got == 0 {
                    return Err(e);
                }
                break;
            }
            let claimed = {
                let mut s = self.state.lock();
                let start: u128 = s.rng.random();
                s.pools.get_mut(&pool).and_then(|p| p.claim(family, start))
            };
            let cidr = match claimed {
                Ok(c) => c,
                Err(e) if got == 0 => {
                    return Err(source_error("allocate", node, e.class(), e.to_string()));
                }
                Err(_) => break,
            };
            let block = IpamBlock {
                name: block_name(&cidr).into(),
                cidr,
                pool: pool_name.clone(),
                node: node.clone(),
                node_uid: uid,
                release: false,
                ack: None,
                resource_version: None,
                deleting: false,
            };
            let name = block.name.clone();
            self.call().await;
            // (its one request admitted above)
            let created = match self.store.create_block(block, &mut Ungated).await {
                Ok(b) => Some(b),
                // someone created it first: ours (a reply we lost), or taken
                Err(IpamError::AlreadyExists { .. }) => match self.store.get_block(&name).await {
                    Ok(Some(b)) if &b.node == node && b.node_uid == uid => Some(b),
                    _ => None,
                },
                Err(e) => {
                    if let Ok(p) = self.state.lock().pools.get_mut(&pool) {
                        let _ = p.release(&cidr);
                    }
                    if got == 0 {
                        return Err(e);
                    }
                    break;
                }
            };
            match created {
                Some(b) => {
                    out.union_with(&self.state.lock().usable(&b));
                    got += 1;
                }
                None => {
                    // stays taken in our index; pick another
                    refused += 1;
                    if refused > 16 {
                        if got == 0 {
                            return Err(source_error(
                                "allocate",
                                node,
                                ErrorClass::Transient,
                                format!("{refused} blocks of pool {pool} were taken by others"),
                            ));
                        }
                        break;
                    }
                }
            }
        }
        record_pool_ips(&self.state.lock().pools);
        Ok(out)
    }
}

impl<B: BlockStore + NodeStore + Clone> IpSource for ClusterPoolSource<B> {
    fn name(&self) -> tidepool_metrics::Source {
        tidepool_metrics::Source::ClusterPool
    }

    fn families(&self) -> &[Family] {
        self.state.lock().pools.families()
    }

    fn grant_size(&self, family: Family) -> u128 {
        self.block_size(family)
    }

    fn prepare_allocation(&self, node: &NodeName, family: Family, want: u64, limit: u64) -> u64 {
        self.prepare_in(node, family, None, want, limit)
    }

    fn prepare_pool_allocation(
        &self,
        node: &NodeName,
        family: Family,
        pool: &str,
        want: u64,
        limit: u64,
    ) -> u64 {
        self.prepare_in(node, family, Some(pool), want, limit)
    }

    async fn allocate<G: Gate>(
        &self,
        node: &NodeName,
        family: Family,
        count: u64,
        gate: &mut G,
    ) -> Result<AddrSet, IpamError> {
        self.allocate_in(node, family, None, count, gate).await
    }

    async fn allocate_from_pool<G: Gate>(
        &self,
        node: &NodeName,
        family: Family,
        pool: &str,
        count: u64,
        gate: &mut G,
    ) -> Result<AddrSet, IpamError> {
        self.allocate_in(node, family, Some(pool), count, gate)
            .await
    }

    fn node_pools(&self, node: &NodeName, pending: &[(PodUid, Option<Subject>)]) -> NodePools {
        self.state
            .lock()
            .node_pools(&self.store.blocks_of(node), node, pending)
    }

    fn prepare_release(&self, node: &NodeName, free: &AddrSet, max: u64) -> AddrSet {
        let blocks = self.store.blocks_of(node);
        let s = self.state.lock();
        let mut out = AddrSet::new();
        let mut taken = 0u128;
        for b in blocks.iter().rev().filter(|b| !b.release) {
            let addrs = s.usable(b);
            let n = addrs.len(family_of(&b.cidr));
            let all_free = addrs.runs().all(|(f, r)| free.covers(f, r));
            if all_free && taken.saturating_add(n) <= u128::from(max) {
                taken += n;
                out.union_with(&addrs);
            }
        }
        out
    }

    /// One delete per block touched, each admitted by `gate`.
    async fn release<G: Gate>(
        &self,
        node: &NodeName,
        addrs: &AddrSet,
        gate: &mut G,
    ) -> Result<(), IpamError> {
        let blocks = self.store.blocks_of(node);
        let seen: Vec<Option<ResourceVersion>> = {
            let s = self.state.lock();
            let seen = s.seen.get(node);
            blocks
                .iter()
                .map(|b| seen.and_then(|x| x.version(&b.name)))
                .collect()
        };
        let mut first_err = None;
        for (b, seen) in blocks.iter().zip(seen) {
            if !touches(addrs, b) {
                continue;
            }
            let expected = match seen {
                Some(rv) => rv,
                None => match b.stored_version() {
                    Ok(rv) => rv.clone(),
                    Err(e) => {
                        first_err.get_or_insert(e);
                        continue;
                    }
                },
            };
            self.call().await;
            match self.store.delete_block(&b.name, &expected, gate).await {
                Err(e @ IpamError::NotLeader) => {
                    first_err.get_or_insert(e);
                    break;
                }
                Ok(()) | Err(IpamError::NotFound { .. }) => {
                    if let Ok(p) = self.state.lock().pools.get_mut(&b.pool) {
                        let _ = p.release(&b.cidr);
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        record_pool_ips(&self.state.lock().pools);
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn describe(&self, node: &NodeName) -> Result<AddrSet, IpamError> {
        let at = self.store.node_blocks_changes(node);
        let blocks = self.store.blocks_of(node);
        let mut s = self.state.lock();
        s.remember(node, &blocks, at);
        let mut out = AddrSet::new();
        for b in &blocks {
            out.union_with(&s.usable(b));
        }
        Ok(out)
    }

    fn quota(&self) -> PerFamily<Quota> {
        let s = self.state.lock();
        let mut q: PerFamily<Quota> = PerFamily::default();
        for p in s.pools.valid() {
            for &f in s.pools.families() {
                if let Some(fi) = p.family(f) {
                    let c = fi.addresses();
                    let e = q.get_mut(f);
                    e.capacity = e
                        .capacity
                        .saturating_add(c.capacity.min(u128::from(u64::MAX)) as u64);
                    e.free = e
                        .free
                        .saturating_add(c.free.min(u128::from(u64::MAX)) as u64);
                }
            }
        }
        q
    }

    fn pool_capacity(&self, pool: &str, family: Family) -> Option<u128> {
        let s = self.state.lock();
        let index = s.pools.get(pool).ok()?;
        Some(index.family(family)?.addresses().capacity)
    }

    fn api(&self) -> Api {
        Api::Kube
    }

    fn node_seen(&self, info: &NodeInfo) {
        let mut s = self.state.lock();
        let meta = s.nodes.entry(info.name.clone()).or_default();
        meta.uid = info.uid;
        meta.managed = true;
    }

    fn node_blocked(&self, node: &NodeName) -> bool {
        self.state.lock().duplicates.contains(node)
    }

    fn pool_invalid(&self, node: &NodeName, family: Family) -> bool {
        let s = self.state.lock();
        s.pool_for(node, family)
            .is_some_and(|p| s.pools.get(&p).is_err_and(|e| s.pools.holds(e.pool())))
    }

    fn node_gone(&self, node: &NodeName) {
        let mut s = self.state.lock();
        if let Some(meta) = s.nodes.get_mut(node) {
            meta.managed = false;
        }
        s.seen.remove(node);
    }

    fn holdings(&self, node: &NodeName) -> Option<Holdings> {
        // the blocks as last shown, unchanged since (the version read first: a write after
        // it makes the next call look again)
        let at = self.store.node_blocks_changes(node);
        {
            let s = self.state.lock();
            if let Some(seen) = s.seen.get(node)
                && seen.at == at
                && at != 0
                && let Some(h) = &seen.holdings
            {
                return Some(h.clone());
            }
        }
        let blocks = self.store.blocks_of(node);
        let mut s = self.state.lock();
        if let Some(h) = &s.remember(node, &blocks, at).holdings {
            return Some(h.clone());
        }
        let mut h = Holdings::default();
        let mut addresses = AddrSet::new();
        // drained blocks are the source's own handshakes (see `drain`): the engine neither
        // counts them nor marks them, and tops the node up from the pools that remain; stray
        // blocks and those of an Invalid pool are left out alike, and never drained
        for b in blocks.iter().filter(|b| s.kept(b)) {
            let addrs = s.usable(b);
            if b.release {
                h.release.insert_set(&addrs, ReleaseState::MarkedForRelease);
            }
            if let Some(ack) = b.ack {
                h.acks.insert_set(&addrs, ack);
            }
            addresses.union_with(&addrs);
        }
        h.addresses = Arc::new(addresses);
        if let Some(seen) = s.seen.get_mut(node) {
            seen.holdings = Some(h.clone());
        }
        Some(h)
    }

    /// One mark write per block whose mark changes, each admitted by `gate`.
    async fn set_marks<G: Gate>(
        &self,
        node: &NodeName,
        mark: &AddrSet,
        withdraw: &AddrSet,
        gate: &mut G,
    ) -> Result<(), IpamError> {
        let blocks = self.store.blocks_of(node);
        for b in &blocks {
            // a block is withdrawn as soon as any of its addresses is
            let want = if touches(withdraw, b) {
                ReleaseMark::Withdraw
            } else if touches(mark, b) {
                ReleaseMark::Set
            } else {
                continue;
            };
            if b.release != want.marked() {
                self.call().await;
                self.store.mark_block(&b.name, want, gate).await?;
            }
        }
        Ok(())
    }

    /// One apply per block of the node that names another UID.
    async fn adopt<G: Gate>(
        &self,
        node: &NodeName,
        uid: NodeUid,
        gate: &mut G,
    ) -> Result<(), IpamError> {
        for b in self.store.blocks_of(node) {
            if b.node_uid != uid {
                self.call().await;
                self.store.adopt_block(&b.name, uid, gate).await?;
                tracing::info!(block = %b.name, %node, old = %b.node_uid, new = %uid, "a block adopted by the Node re-created under its name");
            }
        }
        Ok(())
    }

    async fn resync<G: Gate>(&self, gate: &mut G, utc: SystemTime) {
        self.repair(gate, utc).await;
        self.drain(gate).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryNodeStore;

    fn pool(name: &str, cidr: &str, selector: &[(&str, &str)]) -> PoolConfig {
        let spec = PoolSpec::parse(
            name,
            &[cidr],
            super::super::DEFAULT_BLOCK_SIZE,
            &[] as &[&str],
        )
        .unwrap();
        PoolConfig {
            node_selector: selector
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..PoolConfig::new(spec)
        }
    }

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn pool_choice_follows_the_precedence() {
        let src = ClusterPoolSource::new(
            MemoryNodeStore::new(),
            vec![
                pool("default", "10.0.0.0/24", &[]),
                pool("gpu", "10.1.0.0/24", &[("pool", "gpu")]),
                pool("gpu-new", "10.2.0.0/24", &[("pool", "gpu")]),
                // overlaps "default": Invalid, the others keep working
                pool("bad", "10.0.0.0/25", &[("pool", "bad")]),
            ],
            1,
        );
        let v = src.validity();
        assert!(v[..3].iter().all(|(_, r)| r.is_ok()));
        assert!(matches!(v[3].1, Err(PoolError::OverlapsPool { .. })));
        let n: NodeName = "n".into();
        assert_eq!(src.pool_of("n", Family::V4).as_deref(), Some("default"));
        src.set_node_labels(&n, labels(&[("pool", "gpu"), ("zone", "a")]));
        assert_eq!(
            src.pool_of("n", Family::V4).as_deref(),
            Some("gpu"),
            "the oldest matching pool"
        );
        src.set_node_labels(&n, labels(&[("pool", "bad")]));
        assert_eq!(
            src.pool_of("n", Family::V4).as_deref(),
            Some("default"),
            "an Invalid pool is never chosen"
        );
        src.set_node_pool(&n, Family::V4, Some("gpu-new".into()));
        assert_eq!(
            src.pool_of("n", Family::V4).as_deref(),
            Some("gpu-new"),
            "spec.pools wins"
        );
    }

    /// The families served are the pools' own, as they are now: none before the first
    /// pool, a family of a pool created or edited later, and none again once its last pool
    /// goes.
    #[test]
    fn the_families_follow_the_pools() {
        let src = ClusterPoolSource::new(MemoryNodeStore::new(), vec![], 1);
        assert!(src.families().is_empty(), "{:?}", src.families());
        src.set_pools(vec![pool("default", "10.0.0.0/24", &[])]);
        assert_eq!(src.families(), [Family::V4]);
        let v6 = pool("v6", "fd00::/64", &[("pool", "v6")]);
        src.set_pools(vec![pool("default", "10.0.0.0/24", &[]), v6.clone()]);
        assert_eq!(src.families(), [Family::V4, Family::V6]);
        assert!(src.quota().v6.capacity > 0, "the new family's quota counts");
        src.set_pools(vec![v6]);
        assert_eq!(src.families(), [Family::V6], "IPv4's last pool is gone");
        assert_eq!(src.quota().v4.capacity, 0);
        src.set_pools(vec![]);
        assert!(src.families().is_empty());
    }

    /// `kept` in one lookup says what its definition says: not drained, not stray (a
    /// valid pool's block it cannot use: refused as stray), not of an Invalid pool; over
    /// every kind of block.
    #[test]
    fn a_block_is_kept_unless_drained_stray_or_of_an_invalid_pool() {
        let src = ClusterPoolSource::new(
            MemoryNodeStore::new(),
            vec![
                pool("default", "10.0.0.0/24", &[]),
                pool("bad", "10.0.0.0/25", &[("pool", "bad")]),
            ],
            1,
        );
        let block = |cidr: &str, pool: &str, deleting: bool| {
            let net: ipnet::IpNet = cidr.parse().unwrap();
            IpamBlock {
                name: block_name(&net).into(),
                cidr: net,
                pool: pool.into(),
                node: "n".into(),
                node_uid: NodeUid(1),
                release: false,
                ack: None,
                resource_version: None,
                deleting,
            }
        };
        let s = src.state.lock();
        let stray = |b: &IpamBlock| {
            let fi = (s.pools.get(&b.pool).ok()).and_then(|p| p.family(family_of(&b.cidr)));
            fi.is_some_and(|fi| fi.usable_count(&b.cidr).is_err_and(|e| is_stray(&e)))
        };
        let cases = [
            (block("10.0.0.16/28", "default", false), true),
            (block("10.0.0.16/28", "default", true), false),
            (block("10.0.0.64/26", "default", false), false), // stray: not a /28
            (block("10.0.1.0/28", "default", false), false),  // outside: drained
            (block("fd00::/124", "default", false), false),   // a family it does not serve
            (block("10.0.0.16/28", "gone", false), false),
            (block("10.0.0.16/28", "bad", false), false), // an Invalid pool
        ];
        for (b, want) in cases {
            let by_definition = !s.drained(&b) && !stray(&b) && !s.of_invalid_pool(&b);
            assert_eq!((s.kept(&b), by_definition), (want, want), "{b:?}");
        }
    }

    /// A source over a new store with one IPv4 pool, 10.0.0.0/24 in /28 blocks.
    fn source_on_a_24() -> (MemoryNodeStore, ClusterPoolSource<MemoryNodeStore>) {
        let store = MemoryNodeStore::new();
        let src =
            ClusterPoolSource::new(store.clone(), vec![pool("default", "10.0.0.0/24", &[])], 1);
        (store, src)
    }

    /// Addresses the cluster uses outside every block (a pod's podIP after the block
    /// objects were lost, a cluster adopted with addresses): their blocks are never granted,
    /// from the next rebuild on; one a block object covers takes nothing more.
    #[tokio::test(start_paused = true)]
    async fn blocks_holding_addresses_in_use_are_never_granted() {
        let (_store, src) = source_on_a_24();
        let n: NodeName = "n".into();
        let own = src
            .allocate(&n, Family::V4, 16, &mut Ungated)
            .await
            .unwrap();
        let inside = own.first(Family::V4).unwrap();
        let outside: std::net::IpAddr = if own.contains(&"10.0.0.200".parse().unwrap()) {
            "10.0.0.5".parse().unwrap()
        } else {
            "10.0.0.200".parse().unwrap()
        };
        let free_before = src.quota().v4.free;
        src.set_in_use(Arc::new(move || AddrSet::from_iter([inside, outside])));
        assert_eq!(src.quota().v4.free, free_before - 16, "one block taken out");
        let mut granted = AddrSet::new();
        while let Ok(got) = src.allocate(&n, Family::V4, 16, &mut Ungated).await {
            granted.union_with(&got);
        }
        assert!(!granted.is_empty());
        assert!(!granted.contains(&outside), "{outside} granted over");
        assert_eq!(src.quota().v4.free, 0);
    }

    /// A Node re-created under its name: its blocks are adopted (one write each, under
    /// the new UID), its addresses stay its own, and repair never releases them, though
    /// until then they are orphan blocks of the old UID; adopted, nothing more is written.
    #[tokio::test(start_paused = true)]
    async fn a_re_created_nodes_blocks_are_adopted_and_never_released() {
        let (store, src) = source_on_a_24();
        let n: NodeName = "n".into();
        let old = NodeInfo {
            name: n.clone(),
            uid: NodeUid(1),
            allocatable_pods: 110,
            cordoned: false,
            terminating: false,
        };
        src.node_seen(&old);
        let held = src
            .allocate(&n, Family::V4, 32, &mut Ungated)
            .await
            .unwrap();
        src.node_seen(&NodeInfo {
            uid: NodeUid(2),
            ..old
        });
        for _ in 0..4 {
            src.resync(&mut Ungated, SystemTime::UNIX_EPOCH).await; // past the three passes a release waits for
        }
        let blocks = store.blocks_of(&n);
        assert_eq!(blocks.len(), 2, "no orphan block released");
        assert!(blocks.iter().all(|b| b.node_uid == NodeUid(1)));
        let mut gate = Counting {
            asked: 0,
            allow: u32::MAX,
        };
        src.adopt(&n, NodeUid(2), &mut gate).await.unwrap();
        assert_eq!(gate.asked, 2, "one write per block");
        assert!(store.blocks_of(&n).iter().all(|b| b.node_uid == NodeUid(2)));
        assert_eq!(src.describe(&n).await.unwrap(), held);
        src.adopt(&n, NodeUid(2), &mut gate).await.unwrap();
        assert_eq!(gate.asked, 2, "nothing more to write");
    }

    /// A hand-made block of the wrong size inside a pool (issue 27, "one bad object"): it is
    /// reported (a repair finding, a `StrayBlock` event on its node) and left out — not in
    /// its node's holdings, never marked nor deleted, its range never granted — and the
    /// pool goes on serving every other node.
    #[tokio::test(start_paused = true)]
    async fn a_stray_block_is_reported_and_left_out_and_the_pool_goes_on() {
        let (store, src) = source_on_a_24();
        for (name, uid) in [("x", 1), ("n", 2)] {
            src.node_seen(&NodeInfo {
                name: name.into(),
                uid: NodeUid(uid),
                allocatable_pods: 250,
                cordoned: false,
                terminating: false,
            });
        }
        let stray: ipnet::IpNet = "10.0.0.64/26".parse().unwrap();
        let block = IpamBlock {
            name: block_name(&stray).into(),
            cidr: stray,
            pool: "default".into(),
            node: "x".into(),
            node_uid: NodeUid(1),
            release: false,
            ack: None,
            resource_version: None,
            deleting: false,
        };
        store.create_block(block, &mut Ungated).await.unwrap();
        for _ in 0..4 {
            src.resync(&mut Ungated, SystemTime::UNIX_EPOCH).await;
        }
        assert!(src.validity()[0].1.is_ok(), "the pool goes on");
        let report = src.last_repair().unwrap();
        assert_eq!(
            report.counts()[&tidepool_metrics::RepairKind::OutOfRange],
            1,
            "{report:?}"
        );
        assert_eq!(store.event_count(EventReason::StrayBlock), 1, "once");
        let (node, message) = store.last_event(EventReason::StrayBlock).unwrap();
        assert_eq!(node, "x");
        assert!(
            message.contains("10.0.0.64/26") && message.contains("/28"),
            "{message}"
        );
        let kept = store
            .cached_block(&block_name(&stray))
            .expect("never deleted");
        assert!(!kept.release, "never marked");
        let x_holds = src.holdings(&"x".into()).unwrap();
        assert!(
            x_holds.addresses.is_empty(),
            "left out of its node's holdings"
        );
        // the other node gets the pool's other 12 blocks, none in the stray's range
        let n: NodeName = "n".into();
        let mut granted = AddrSet::new();
        while let Ok(got) = src.allocate(&n, Family::V4, 16, &mut Ungated).await {
            granted.union_with(&got);
        }
        assert_eq!(store.blocks_of("n").len(), 12);
        let (f, run) = span(&stray);
        assert!(!granted.overlaps(f, &run), "the stray's range stays taken");
    }

    /// A block whose pool turns Invalid (an older pool's CIDR now overlaps it) is left out,
    /// not drained: never marked, not in its node's holdings, nothing more granted for the
    /// node from the pool; once the pool is deleted, the block drains like a removed CIDR.
    #[tokio::test(start_paused = true)]
    async fn a_block_of_an_invalid_pool_is_left_out_and_drains_once_its_pool_goes() {
        let (store, src) = source_on_a_24();
        let n: NodeName = "n".into();
        src.node_seen(&NodeInfo {
            name: n.clone(),
            uid: NodeUid(1),
            allocatable_pods: 110,
            cordoned: false,
            terminating: false,
        });
        src.allocate(&n, Family::V4, 16, &mut Ungated)
            .await
            .unwrap();
        let older = PoolConfig::new(PoolSpec::new("older", vec!["10.0.0.0/16".parse().unwrap()]));
        let default = pool("default", "10.0.0.0/24", &[]);
        src.set_pools(vec![older.clone(), default]);
        assert!(
            src.validity()[1].1.is_err(),
            "`default` overlaps an older pool"
        );
        for _ in 0..4 {
            src.resync(&mut Ungated, SystemTime::UNIX_EPOCH).await;
        }
        let blocks = store.blocks_of(&n);
        assert_eq!(blocks.len(), 1, "kept");
        assert!(!blocks[0].release, "never marked for release");
        assert!(src.holdings(&n).unwrap().addresses.is_empty(), "left out");
        assert_eq!(src.prepare_allocation(&n, Family::V4, 16, u64::MAX), 0);
        src.set_pools(vec![older]);
        src.resync(&mut Ungated, SystemTime::UNIX_EPOCH).await;
        assert!(
            store.blocks_of(&n)[0].release,
            "its pool deleted: it drains"
        );
    }

    /// Counts requests; refuses every one after the first `allow`.
    struct Counting {
        asked: u32,
        allow: u32,
    }

    impl Gate for Counting {
        async fn request(&mut self) -> Result<(), IpamError> {
            self.asked += 1;
            if self.asked > self.allow {
                return Err(IpamError::NotLeader);
            }
            Ok(())
        }
    }

    /// Every block create and mark is one request admitted by the gate first, a delete two; a
    /// refused request ends the call, keeping what was done.
    #[tokio::test(start_paused = true)]
    async fn each_block_write_is_one_gated_request() {
        let (store, src) = source_on_a_24();
        let n: NodeName = "n".into();
        src.node_seen(&NodeInfo {
            name: n.clone(),
            uid: NodeUid(7),
            allocatable_pods: 250,
            cordoned: false,
            terminating: false,
        });
        let open = |allow| Counting { asked: 0, allow };
        let mut gate = open(u32::MAX);
        let got = src.allocate(&n, Family::V4, 40, &mut gate).await.unwrap();
        assert_eq!((store.blocks_of("n").len(), gate.asked), (3, 3));
        assert_eq!(src.calls(), 3);
        // refused after one block: the call keeps that block
        let mut gate = open(1);
        src.allocate(&n, Family::V4, 40, &mut gate).await.unwrap();
        assert_eq!((store.blocks_of("n").len(), gate.asked), (4, 2));
        // refused at once: nothing claimed, nothing held in the index
        let free = src.quota().v4.free;
        let mut gate = open(0);
        let e = src.allocate(&n, Family::V4, 40, &mut gate).await;
        assert!(matches!(e, Err(IpamError::NotLeader)));
        assert_eq!((store.blocks_of("n").len(), src.quota().v4.free), (4, free));
        // marks: one request per block whose mark changes
        let mut gate = open(u32::MAX);
        src.set_marks(&n, &got, &AddrSet::new(), &mut gate)
            .await
            .unwrap();
        assert_eq!(gate.asked, 3);
        // deletes: two requests per block, the delete and the finalizer's removal
        src.describe(&n).await.unwrap();
        let mut gate = open(u32::MAX);
        src.release(&n, &got, &mut gate).await.unwrap();
        assert_eq!((store.blocks_of("n").len(), gate.asked), (1, 6));
        assert_eq!(src.calls(), 3 + 1 + 3 + 3);
    }

    #[tokio::test(start_paused = true)]
    async fn release_offers_whole_free_blocks_only() {
        let (store, src) = source_on_a_24();
        let n: NodeName = "n".into();
        let got = src
            .allocate(&n, Family::V4, 20, &mut Ungated)
            .await
            .unwrap();
        assert_eq!(store.blocks_of("n").len(), 2);
        let n_got = got.len(Family::V4);
        assert!((31..=32).contains(&n_got), "two /28s: {n_got}");
        // one address used: its block is not offered
        let mut free = got.clone();
        let used = got.first(Family::V4).unwrap();
        free.remove(&used);
        let offered = src.prepare_release(&n, &free, u64::MAX);
        assert!(!offered.is_empty());
        let used_block = store
            .blocks_of("n")
            .into_iter()
            .find(|b| b.cidr.contains(&used))
            .unwrap();
        assert!(!touches(&offered, &used_block));
        // never more than asked: less than a block asked, nothing offered
        assert!(src.prepare_release(&n, &free, 10).is_empty());
        assert_eq!(src.prepare_allocation(&n, Family::V4, 1, u64::MAX), 16);
        assert_eq!(
            src.prepare_allocation(&n, Family::V4, 40, 20),
            16,
            "capped by the limit"
        );
    }

    /// A repair rebuilds the index only when its result could differ: after a block was
    /// created or deleted behind the source's back (another engine), after the source's
    /// own claims, not after release marks and answers.
    #[tokio::test(start_paused = true)]
    async fn repair_rebuilds_when_the_blocks_or_the_index_changed() {
        let (store, src) = source_on_a_24();
        let n: NodeName = "n".into();
        src.node_seen(&NodeInfo {
            name: n.clone(),
            uid: NodeUid(7),
            allocatable_pods: 250,
            cordoned: false,
            terminating: false,
        });
        let changes = |src: &ClusterPoolSource<MemoryNodeStore>| src.state.lock().pools.changes();
        src.allocate(&n, Family::V4, 1, &mut Ungated).await.unwrap();
        let after_claim = changes(&src);
        src.repair(&mut Ungated, SystemTime::UNIX_EPOCH).await;
        let rebuilt = changes(&src);
        assert!(rebuilt > after_claim, "the source's claim: rebuilt");
        src.repair(&mut Ungated, SystemTime::UNIX_EPOCH).await;
        assert_eq!(changes(&src), rebuilt, "nothing changed: not rebuilt");
        let b = store.blocks_of("n")[0].clone();
        store
            .mark_block(&b.name, ReleaseMark::Set, &mut Ungated)
            .await
            .unwrap();
        store.ack_block(&b.name, Some(ReleaseAck::ReadyForRelease));
        src.repair(&mut Ungated, SystemTime::UNIX_EPOCH).await;
        assert_eq!(changes(&src), rebuilt, "marks and answers: not rebuilt");
        let free = src.quota().v4.free;
        // a claim in the index alone (a create that never happened): the repair's rebuild
        // from the store frees it again
        let stray = src
            .state
            .lock()
            .pools
            .get_mut("default")
            .unwrap()
            .claim(Family::V4, 0)
            .unwrap();
        assert!(src.quota().v4.free < free, "{stray} claimed");
        src.repair(&mut Ungated, SystemTime::UNIX_EPOCH).await;
        assert_eq!(src.quota().v4.free, free, "{stray} free again");

        // another engine deletes the block, then creates one for another node
        store
            .delete_block(
                &b.name,
                store
                    .cached_block(&b.name)
                    .unwrap()
                    .stored_version()
                    .unwrap(),
                &mut Ungated,
            )
            .await
            .unwrap();
        src.repair(&mut Ungated, SystemTime::UNIX_EPOCH).await;
        assert_eq!(
            src.quota().v4.free,
            free + src.block_addresses(&b).count(Family::V4),
            "the deleted block is free again"
        );
        let theirs: ipnet::IpNet = "10.0.0.64/28".parse().unwrap();
        store
            .create_block(
                IpamBlock {
                    name: block_name(&theirs).into(),
                    cidr: theirs,
                    pool: "default".into(),
                    node: "other".into(),
                    node_uid: NodeUid(9),
                    release: false,
                    ack: None,
                    resource_version: None,
                    deleting: false,
                },
                &mut Ungated,
            )
            .await
            .unwrap();
        src.repair(&mut Ungated, SystemTime::UNIX_EPOCH).await;
        assert_eq!(
            src.quota().v4.free,
            free + src.block_addresses(&b).count(Family::V4) - 16,
            "the created one is taken"
        );
    }
}
