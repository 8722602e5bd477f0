//! The kube-backed [`NodeStore`] and [`BlockStore`]: reads from a watch-fed [`Cache`],
//! writes to the API server.
//!
//! - An IPAMNode is created only by POST (with the operator's finalizer); after that the
//!   operator's fields are one server-side apply of the spec and, when its conditions or
//!   count changed, one apply of `status` through its subresource, both under the field
//!   manager `tidepool-operator`: at most one write per object and subresource per pass.
//! - A block claim is a POST; a release is a DELETE with a resourceVersion precondition,
//!   after which the operator's finalizer comes off (the node side acked the block before
//!   the engine asked); a mark is an apply of the block's spec.
//! - Each written object is taken into the cache at once, so the next pass plans from it
//!   (a claim must not be made twice because its echo is still on its way).

pub mod cache;
mod errors;
mod events;
mod recorder;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use parking_lot::RwLock;
use serde_json::json;
use tidepool_api as api;
use tidepool_api::convert::HeldCount;
use tidepool_api::names::{FINALIZER, OPERATOR_MANAGER};
use tidepool_ipam::{
    BlockStore, EventReason, EventType, Family, Gate, IpamBlock, IpamError, IpamNode, NodeName,
    NodeStore, NodeUid, OperatorFields, ReleaseMark, ResourceVersion,
};

use crate::convert::{
    Held, NodeView, PoolTally, Target, block_for_create, block_from_api, block_mark_body,
    node_from_api, pool_usage, spec_body, status_body,
};
use crate::leader::{Fence, Fenced};
pub use cache::{Applied, Cache};
pub use errors::store_error;
pub use events::Events;
use tidepool_ipam::pool::used_in;

/// IPAMNodes and IPAMBlocks on an API server. Clones share one cache.
#[derive(Clone)]
pub struct KubeStore {
    nodes: Api<api::IPAMNode>,
    blocks: Api<api::IPAMBlock>,
    cache: Arc<RwLock<Cache>>,
    events: Events,
    /// One status writer per IPAMNode at a time (the engine's pass and the count refresh),
    /// so each writes the other's latest fields.
    status_locks: Arc<parking_lot::Mutex<HashMap<NodeName, Arc<tokio::sync::Mutex<()>>>>>,
    /// Live reads in flight at once: every node's first pass reads its IPAMNode, and a
    /// thousand at once would open a thousand connections (reads are not budgeted).
    reads: Arc<tokio::sync::Semaphore>,
    /// What every write passes through (leader election).
    fence: Fence,
}

/// When [`KubeStore::write_status`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusWrite {
    /// When the conditions, the count or the pools differ from the object's.
    IfChanged,
    /// Whatever the object holds (a create drops `status`).
    Always,
}

/// How many live reads (GETs) the store has in flight at most.
const MAX_READS_IN_FLIGHT: usize = 32;

impl KubeStore {
    pub fn new(client: Client, events: Events) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            blocks: Api::all(client),
            cache: Arc::default(),
            events,
            status_locks: Arc::default(),
            reads: Arc::new(tokio::sync::Semaphore::new(MAX_READS_IN_FLIGHT)),
            fence: Fence::default(),
        }
    }

    /// Every write through `fence` (leader election; without it, every write goes).
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    fn status_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.status_locks.lock();
        locks.entry(NodeName::from(name)).or_default().clone()
    }

    /// The operator's status apply (its conditions, the count and the pools), as `when`
    /// says; one status writer per IPAMNode at a time, each with the latest count. Returns the
    /// written object, None when nothing was due.
    async fn write_status<G: Gate>(
        &self,
        name: &str,
        fields: &OperatorFields,
        when: StatusWrite,
        gate: &mut G,
    ) -> Result<Option<Arc<IpamNode>>, IpamError> {
        let lock = self.status_lock(name);
        let _held = lock.lock().await;
        let (view, held) = {
            let c = self.cache.read();
            let Some(v) = c.node(name).filter(|v| v.node.resource_version.is_some()) else {
                return Ok(None);
            };
            (v.clone(), held_of(&c, &v.node, fields))
        };
        let conditions = &fields.conditions;
        let same = view.node.operator.conditions == *conditions && held.recorded_in(&view);
        if same && when == StatusWrite::IfChanged {
            return Ok(None);
        }
        let to = Target {
            name,
            uid: view.uid.as_deref(),
        };
        let body = status_body(to, conditions, &held);
        let rv = view.node.resource_version.as_ref();
        let pp = Self::apply_params();
        let patch = Patch::Apply(&body);
        let request = self.nodes.patch_status(name, &pp, &patch);
        let sent = self.send(gate, "apply-status", name, rv, request).await;
        let obj = self.checked_node(name, sent).await?;
        Ok(Some(self.take_node(&obj)))
    }

    /// An apply's answer for the IPAMNode `name`. A refused uid (the object we hold was
    /// deleted, or replaced by another of that name) re-reads it from the server into the
    /// cache, so the retry plans from what is there (a gone IPAMNode is created again by
    /// POST); a field-manager conflict (someone else owns a field we force) is reported.
    async fn checked_node(
        &self,
        name: &str,
        sent: Result<api::IPAMNode, IpamError>,
    ) -> Result<api::IPAMNode, IpamError> {
        match &sent {
            Err(IpamError::Conflict { .. }) => match self.nodes.get_opt(name).await {
                Ok(Some(obj)) => {
                    self.take_node(&obj);
                }
                Ok(None) => self.cache.write().drop_node(name),
                Err(e) => tracing::debug!(%name, error = %e, "re-read after a refused uid"),
            },
            Err(e) if errors::is_manager_conflict(e) => {
                self.event(
                    name,
                    EventType::Warning,
                    EventReason::ApplyConflict,
                    e.to_string(),
                );
            }
            _ => {}
        }
        sent
    }

    /// As [`Self::checked_node`], for the IPAMBlock `name`.
    async fn checked_block(
        &self,
        name: &str,
        sent: Result<api::IPAMBlock, IpamError>,
    ) -> Result<api::IPAMBlock, IpamError> {
        match &sent {
            Err(IpamError::Conflict { .. }) => match self.blocks.get_opt(name).await {
                Ok(Some(obj)) => {
                    let _ = self.take_block(&obj, name);
                }
                Ok(None) => self.cache.write().drop_block(name),
                Err(e) => tracing::debug!(%name, error = %e, "re-read after a refused uid"),
            },
            Err(e) if errors::is_manager_conflict(e) => {
                let message = e.to_string();
                let reason = EventReason::ApplyConflict;
                self.events
                    .emit("IPAMBlock", name, EventType::Warning, reason, message);
            }
            _ => {}
        }
        sent
    }

    /// One write request: admitted by `gate`, sent through the fence (refused once this
    /// replica no longer leads, given up at its permit's end), its error named.
    async fn send<T, G: Gate>(
        &self,
        gate: &mut G,
        op: &'static str,
        name: &str,
        rv: Option<&ResourceVersion>,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, IpamError> {
        gate.request().await?;
        match self.fence.send(request).await {
            Ok(answer) => answer.map_err(|e| store_error(op, name, rv, e)),
            Err(Fenced::NotLeading) => Err(IpamError::NotLeader),
            Err(timed_out @ Fenced::TimedOut) => Err(IpamError::Store {
                op,
                name: name.into(),
                class: tidepool_ipam::ErrorClass::Transient,
                message: timed_out.to_string(),
            }),
        }
    }

    fn post_params() -> PostParams {
        PostParams {
            field_manager: Some(OPERATOR_MANAGER.into()),
            ..PostParams::default()
        }
    }

    /// Feeds an IPAMNode watch event; returns what the engine must hear.
    pub fn apply_node_event(&self, ev: &kube::runtime::watcher::Event<api::IPAMNode>) -> Applied {
        self.cache.write().apply_node_event(ev)
    }

    /// Feeds an IPAMBlock watch event.
    pub fn apply_block_event(&self, ev: &kube::runtime::watcher::Event<api::IPAMBlock>) -> Applied {
        self.cache.write().apply_block_event(ev)
    }

    /// The pools a user set for the node in its IPAMNode (`spec.pools`).
    pub fn node_pools(&self, name: &str) -> Option<tidepool_ipam::PerFamily<Option<String>>> {
        self.cache.read().node(name).map(|v| v.pools.clone())
    }

    /// Every IPAMNode that is not being deleted, with its agent's `AgentReady` condition as
    /// the watch last showed it (read to tell why a node's pods wait).
    pub fn agent_readiness(&self) -> Vec<(NodeName, Option<api::convert::AgentReady>)> {
        let c = self.cache.read();
        c.nodes()
            .filter(|v| !v.terminating)
            .map(|v| (v.node.name.clone(), v.agent_ready.clone()))
            .collect()
    }

    /// Both watches have completed their first list.
    pub fn ready(&self) -> (bool, bool) {
        let c = self.cache.read();
        (c.nodes_ready, c.blocks_ready)
    }

    /// Lists of IPAMNodes and of IPAMBlocks the cache has taken in so far (each watch's
    /// first list and every relist).
    pub fn lists(&self) -> (u64, u64) {
        self.cache.read().lists
    }

    /// The operator's applies are forced: it takes back the fields it owns from anyone who
    /// wrote them (as the server-side apply documentation recommends for controllers), and
    /// its bodies hold only those.
    fn apply_params() -> PatchParams {
        PatchParams::apply(OPERATOR_MANAGER).force()
    }

    fn take_node(&self, obj: &api::IPAMNode) -> Arc<IpamNode> {
        let (view, bad) = node_from_api(obj);
        for m in bad {
            tracing::warn!(%m, "malformed entry skipped");
        }
        let node = view.node.clone();
        self.cache.write().put_node(view);
        node
    }

    fn take_block(&self, obj: &api::IPAMBlock, name: &str) -> Result<Arc<IpamBlock>, IpamError> {
        let b = Arc::new(block_from_api(obj).map_err(|bad| {
            IpamError::Store {
                op: "read",
                name: name.into(),
                class: tidepool_ipam::ErrorClass::Permanent,
                message: bad
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            }
        })?);
        let uid = obj.metadata.uid.as_deref().map(Arc::from);
        self.cache.write().put_block(b.clone(), uid);
        Ok(b)
    }

    async fn create_node<G: Gate>(
        &self,
        name: &NodeName,
        node_uid: NodeUid,
        fields: &OperatorFields,
        gate: &mut G,
    ) -> Result<Arc<IpamNode>, IpamError> {
        let to = Target { name, uid: None };
        let body = spec_body(to, node_uid, fields, &Default::default());
        let obj: api::IPAMNode = serde_json::from_value(body).map_err(|e| IpamError::Store {
            op: "create",
            name: name.to_string(),
            class: tidepool_ipam::ErrorClass::Permanent,
            message: e.to_string(),
        })?;
        let pp = Self::post_params();
        let request = self.nodes.create(&pp, &obj);
        let created = self.send(gate, "create", name, None, request).await?;
        let node = self.take_node(&created);
        // a create drops `status`: the conditions and the count follow through /status
        let written = self
            .write_status(name, fields, StatusWrite::Always, gate)
            .await?;
        Ok(written.unwrap_or(node))
    }

    /// Removes our finalizer from an object being deleted: a merge patch of the remaining
    /// finalizers with the resourceVersion they were read at, so a concurrent change of the
    /// list is a conflict (retried by the engine), never a loss.
    async fn drop_finalizer<K, G: Gate>(
        &self,
        api: &Api<K>,
        name: &str,
        meta: &ObjectMeta,
        gate: &mut G,
    ) -> Result<(), IpamError>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let finalizers = meta.finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let rest: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
        let rv = meta.resource_version.clone();
        let patch = json!({ "metadata": { "finalizers": rest, "resourceVersion": rv } });
        let expected = rv.as_deref().map(ResourceVersion::server);
        let pp = PatchParams::default();
        let patch = Patch::Merge(&patch);
        let request = api.patch(name, &pp, &patch);
        match self
            .send(gate, "finalize", name, expected.as_ref(), request)
            .await
        {
            Ok(_) | Err(IpamError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Addresses the node holds, per family: its spec addresses (cloud sources) and the
/// addresses of its blocks (cluster-pool); the pools of its blocks; and per pool and
/// family, its blocks' addresses, those of them in `used`, and whether `fields` say it is
/// blocked.
fn held_of(c: &Cache, node: &IpamNode, fields: &OperatorFields) -> Held {
    let mut count = HeldCount::default();
    let mut tally: BTreeMap<(String, Family), PoolTally> = BTreeMap::new();
    for b in c.blocks_of(&node.name) {
        let addrs = tidepool_ipam::AddrSet::of_net(&b.cidr);
        count.add(&addrs);
        let family = Family::of(&b.cidr.addr());
        let t = tally.entry((b.pool.to_string(), family)).or_default();
        t.allocated = t.allocated.saturating_add(addrs.len(family));
        let used = used_in(&node.node.used, &b.cidr);
        t.used += u64::try_from(used).unwrap_or(u64::MAX);
    }
    count.add(&fields.addresses);
    let pools = tally
        .keys()
        .map(|(p, _)| p.clone())
        .collect::<BTreeSet<_>>();
    for p in &fields.blocked_pools {
        tally
            .entry((p.pool.to_string(), p.family))
            .or_default()
            .blocked = true;
    }
    Held {
        count,
        pools: pools.into_iter().collect(),
        usage: pool_usage(&tally),
    }
}

impl NodeStore for KubeStore {
    /// IPAMNodes whose recorded count (`status.allocated`, `status.ipv4/ipv6.allocated`) or
    /// pools (`status.pools`) no longer match their blocks and addresses.
    fn stale_counts(&self) -> Vec<NodeName> {
        let c = self.cache.read();
        c.nodes()
            .filter(|v| v.node.resource_version.is_some())
            .filter(|v| !held_of(&c, &v.node, &v.node.operator).recorded_in(v))
            .map(|v| v.node.name.clone())
            .collect()
    }

    /// Writes an IPAMNode's count and pools when they are stale (a block was claimed or
    /// released since), keeping the operator's conditions as they are, its request admitted
    /// by `gate`. Returns whether it wrote.
    async fn refresh_count<G: Gate>(&self, name: &str, gate: &mut G) -> Result<bool, IpamError> {
        let Some(node) = self.cached(name) else {
            return Ok(false);
        };
        Ok(self
            .write_status(name, &node.operator, StatusWrite::IfChanged, gate)
            .await?
            .is_some())
    }

    fn cached(&self, name: &str) -> Option<Arc<IpamNode>> {
        self.cache.read().node(name).map(|v| v.node.clone())
    }

    async fn get(&self, name: &str) -> Result<Option<Arc<IpamNode>>, IpamError> {
        let _slot = self.reads.acquire().await;
        let obj = self
            .nodes
            .get_opt(name)
            .await
            .map_err(|e| store_error("get", name, None, e))?;
        Ok(obj.map(|o| node_from_api(&o).0.node))
    }

    async fn apply_operator<G: Gate>(
        &self,
        name: &NodeName,
        node_uid: NodeUid,
        fields: OperatorFields,
        gate: &mut G,
    ) -> Result<Arc<IpamNode>, IpamError> {
        let cached: Option<NodeView> = self.cache.read().node(name).cloned();
        let Some(view) = cached.filter(|v| v.node.resource_version.is_some()) else {
            return self.create_node(name, node_uid, &fields, gate).await;
        };
        let mut node = view.node.clone();
        let spec_changed = node.node_uid != node_uid
            || !node.finalizer
            || fields.spec_differs(&view.node.operator);
        if spec_changed {
            let to = Target {
                name,
                uid: view.uid.as_deref(),
            };
            let body = spec_body(to, node_uid, &fields, &view.allocations);
            let pp = Self::apply_params();
            let patch = Patch::Apply(&body);
            let request = self.nodes.patch(name, &pp, &patch);
            let sent = self.send(gate, "apply", name, None, request).await;
            let obj = self.checked_node(name, sent).await?;
            node = self.take_node(&obj);
        }
        if let Some(written) = self
            .write_status(name, &fields, StatusWrite::IfChanged, gate)
            .await?
        {
            node = written;
        }
        Ok(node)
    }

    async fn remove<G: Gate>(&self, name: &str, gate: &mut G) -> Result<(), IpamError> {
        let dp = DeleteParams::default();
        let request = self.nodes.delete(name, &dp);
        let obj = match self.send(gate, "delete", name, None, request).await {
            Ok(either) => either.left(),
            Err(IpamError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        match obj {
            Some(o) => {
                self.drop_finalizer(&self.nodes, name, &o.metadata, gate)
                    .await
            }
            None => Ok(()),
        }
    }

    fn event(&self, object: &str, type_: EventType, reason: EventReason, message: String) {
        self.events.emit("IPAMNode", object, type_, reason, message);
    }
}

impl KubeStore {
    fn cached_block(&self, name: &str) -> Result<Arc<IpamBlock>, IpamError> {
        let cached = self.cache.read().block(name).cloned();
        cached.ok_or_else(|| IpamError::NotFound { name: name.into() })
    }

    /// The operator's apply of block `b`'s spec with `mark`, to the object of the cached
    /// `metadata.uid` (a block deleted or replaced meanwhile refuses it).
    async fn apply_block<G: Gate>(
        &self,
        b: &IpamBlock,
        mark: ReleaseMark,
        op: &'static str,
        gate: &mut G,
    ) -> Result<Arc<IpamBlock>, IpamError> {
        let uid = self.cache.read().block_uid(&b.name);
        let body = block_mark_body(b, uid.as_deref(), mark);
        let pp = Self::apply_params();
        let patch = Patch::Apply(&body);
        let request = self.blocks.patch(&b.name, &pp, &patch);
        let sent = self.send(gate, op, &b.name, None, request).await;
        let obj = self.checked_block(&b.name, sent).await?;
        self.take_block(&obj, &b.name)
    }
}

impl BlockStore for KubeStore {
    fn blocks_of(&self, node: &str) -> Vec<Arc<IpamBlock>> {
        self.cache.read().blocks_of(node)
    }

    fn node_blocks_changes(&self, node: &str) -> u64 {
        self.cache.read().node_blocks_changes(node)
    }

    fn block_set_changes(&self) -> u64 {
        self.cache.read().block_set_changes()
    }

    fn list_blocks(&self) -> Vec<Arc<IpamBlock>> {
        self.cache.read().blocks().cloned().collect()
    }

    fn list_nodes(&self) -> Vec<Arc<IpamNode>> {
        self.cache.read().nodes().map(|v| v.node.clone()).collect()
    }

    async fn create_block<G: Gate>(
        &self,
        block: IpamBlock,
        gate: &mut G,
    ) -> Result<Arc<IpamBlock>, IpamError> {
        let obj = block_for_create(&block);
        let pp = Self::post_params();
        let request = self.blocks.create(&pp, &obj);
        let created = self
            .send(gate, "create", &block.name, None, request)
            .await?;
        self.take_block(&created, &block.name)
    }

    async fn get_block(&self, name: &str) -> Result<Option<Arc<IpamBlock>>, IpamError> {
        let _slot = self.reads.acquire().await;
        let obj = self
            .blocks
            .get_opt(name)
            .await
            .map_err(|e| store_error("get", name, None, e))?;
        match obj {
            Some(o) => Ok(block_from_api(&o).ok().map(Arc::new)),
            None => Ok(None),
        }
    }

    async fn mark_block<G: Gate>(
        &self,
        name: &str,
        mark: ReleaseMark,
        gate: &mut G,
    ) -> Result<Arc<IpamBlock>, IpamError> {
        let b = self.cached_block(name)?;
        self.apply_block(&b, mark, "mark", gate).await
    }

    async fn adopt_block<G: Gate>(
        &self,
        name: &str,
        node_uid: NodeUid,
        gate: &mut G,
    ) -> Result<Arc<IpamBlock>, IpamError> {
        let b = self.cached_block(name)?;
        let mark = if b.release {
            ReleaseMark::Set
        } else {
            ReleaseMark::Withdraw
        };
        let adopted = IpamBlock {
            node_uid,
            ..(*b).clone()
        };
        self.apply_block(&adopted, mark, "adopt", gate).await
    }

    async fn delete_block<G: Gate>(
        &self,
        name: &str,
        expected: &ResourceVersion,
        gate: &mut G,
    ) -> Result<(), IpamError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(expected.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        let request = self.blocks.delete(name, &params);
        let deleted = self
            .send(gate, "delete", name, Some(expected), request)
            .await?;
        if let Some(obj) = deleted.left() {
            self.drop_finalizer(&self.blocks, name, &obj.metadata, gate)
                .await?;
        }
        self.cache.write().drop_block(name);
        Ok(())
    }
}
