//! The handlers: each CNI verb against the shared node state, durable before it answers.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tidepool_api::convert::Allocations;
use tidepool_ipam::node::{BlockView, Refused};
use tidepool_ipam::{AddrSet, Family, IpamNode, PodUid};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::commit::{Commit, Persist, Saved, SharedState};
use super::request::{CniRequest, Reply, UidArg};
use super::shape::PodNetworks;
use super::source::{NoPods, NodeSource, PodSource, Publish};
use super::spool::{Replayed, replay_spool};
use crate::cni::proto::code;
use crate::error::{Error, Result};
use crate::observe::{self, CniOutcome};
use crate::pool_choice::PodPools;
use crate::reconcile::Tracker;
use crate::state::{
    AllocKey, Attachment, NodeState, PodRef, StateDir, StateError, pool_families, spooled,
};

/// How long an ADD waits for a free address (a block arriving) before code 11.
pub const DEFAULT_EMPTY_POOL_WAIT: Duration = Duration::from_secs(5);

/// The server's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// `--pod-network`: the result's prefix lengths and gateways, and the addresses reserved
    /// for them, instead of the IPPools' CIDRs ([`super::NodeSource::pod_networks`]).
    pub pod_networks: Option<Arc<PodNetworks>>,
    /// See [`DEFAULT_EMPTY_POOL_WAIT`]; keep it below the plugin's `requestTimeout` (10 s).
    pub empty_pool_wait: Duration,
}

/// The agent's node state shared by the handlers (and the kube layer, which publishes its
/// durable copy): one mutation at a time, each answered once a save holding it is durable
/// (group commit: [`super::commit`]).
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    state: SharedState,
    commit: Commit,
    pub(super) dir: Arc<StateDir>,
    source: Arc<dyn NodeSource>,
    pub(super) pods: Arc<dyn PodSource>,
    publish: Arc<dyn Publish>,
    config: Config,
    /// Reconcile's memory and report (one cycle at a time runs).
    pub(super) reconcile: std::sync::Mutex<Tracker>,
    /// The locked steps running on the blocking pool: a caller's abort does not stop one,
    /// and each holds the agent (its state directory's lock) until it ends.
    blocking: TaskTracker,
    /// The ADDs waiting for an address now.
    adds_waiting: observe::AddsWaiting,
}

impl Inner {
    /// The pod networks an ADD result is shaped by: `--pod-network` when given, else the
    /// IPPools' CIDRs as the source has them now (none: an empty set, and the ADD fails
    /// naming the address).
    fn pod_networks(&self) -> Arc<PodNetworks> {
        match &self.config.pod_networks {
            Some(n) => n.clone(),
            None => self.source.pod_networks().unwrap_or_default(),
        }
    }
}

/// An ADD attempt: answered, or the pool had nothing (why) and the ADD may wait.
enum Attempt {
    Done(Reply),
    Empty(String),
}

impl Agent {
    /// The agent over `state` (loaded from `dir`, whose lock it keeps).
    pub fn new(
        state: NodeState,
        dir: StateDir,
        source: Arc<dyn NodeSource>,
        publish: Arc<dyn Publish>,
        config: Config,
    ) -> Self {
        Self::shared(SharedState::new(state), dir, source, publish, config)
    }

    /// The agent over a state others share already (the publisher reads its durable copy),
    /// with no pod view (nothing excluded; reconcile frees nothing).
    pub fn shared(
        state: SharedState,
        dir: StateDir,
        source: Arc<dyn NodeSource>,
        publish: Arc<dyn Publish>,
        config: Config,
    ) -> Self {
        Self::with_pods(state, dir, source, Arc::new(NoPods), publish, config)
    }

    /// [`Agent::shared`] with the node's live pods: their addresses are never handed out
    /// (nor answered `ready-for-release`), and reconcile reads them.
    pub fn with_pods(
        state: SharedState,
        dir: StateDir,
        source: Arc<dyn NodeSource>,
        pods: Arc<dyn PodSource>,
        publish: Arc<dyn Publish>,
        config: Config,
    ) -> Self {
        Agent {
            inner: Arc::new(Inner {
                state,
                commit: Commit::default(),
                dir: Arc::new(dir),
                source,
                pods,
                publish,
                config,
                reconcile: std::sync::Mutex::new(Tracker::default()),
                blocking: TaskTracker::new(),
                adds_waiting: observe::AddsWaiting::default(),
            }),
        }
    }

    pub(super) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// How many ADDs wait for an address now (`tidepool_agent_adds_waiting`).
    pub fn adds_waiting(&self) -> usize {
        self.inner.adds_waiting.now()
    }

    /// The live state: every change so far, durable or not (lock it briefly).
    pub fn state(&self) -> &Arc<Mutex<NodeState>> {
        self.inner.state.live()
    }

    /// Waits until the locked steps on the blocking pool have ended: a step whose task was
    /// aborted runs on there, holding the agent. Call it once every caller has stopped;
    /// after it, the agent's handles are its only holders.
    pub async fn close(&self) {
        self.inner.blocking.close();
        self.inner.blocking.wait().await;
    }

    /// Runs `f` on the locked live state on the blocking pool, sets the address gauges
    /// from what it left and joins the step to its batch ([`super::commit`]), starting the
    /// saver if none runs; then waits for that batch's save. Publishes once it is durable if
    /// the step joined the next save (the state changed). `points`: the step's kind of save,
    /// for the failpoints.
    pub(super) async fn locked<T, F>(&self, points: Option<Persist>, f: F) -> Result<(T, Saved)>
    where
        T: Send + 'static,
        F: FnOnce(&mut NodeState, &Inner) -> T + Send + 'static,
    {
        let mut guard = self.inner.state.live().clone().lock_owned().await;
        let inner = self.inner.clone();
        let ran = self.inner.blocking.spawn_blocking(move || {
            let out = f(&mut guard, &inner);
            observe::ips(&guard, inner.source.node().as_deref());
            let joined = inner.commit.join(&guard, points);
            drop(guard);
            if joined.start_saver {
                let saver = inner.clone();
                (inner.blocking).spawn_blocking(move || {
                    saver.commit.save_batches(&saver.state, &saver.dir);
                });
            }
            (out, joined)
        });
        let (out, joined) = ran.await.map_err(|e| Error::Task(e.to_string()))?;
        let saved = joined.batch.saved().await;
        if saved.is_ok() && joined.next {
            self.inner.publish.publish();
        }
        Ok((out, saved))
    }

    /// CNI ADD: the key's addresses (the same ones on a repeated ADD), one per family the
    /// node's pool has, all or none; waits up to `empty_pool_wait` for a free address,
    /// counted among the ADDs waiting meanwhile.
    pub async fn add(&self, req: CniRequest) -> Reply {
        let key = match req.key() {
            Ok(k) => k,
            Err(r) => return r,
        };
        let uid = match req.required_uid() {
            Ok(u) => u,
            Err(r) => return r,
        };
        let req = Arc::new(req);
        let deadline = Instant::now() + self.inner.config.empty_pool_wait;
        let mut changes = self.inner.source.changes();
        let mut waiting = None;
        loop {
            changes.borrow_and_update();
            let (key, req) = (key.clone(), req.clone());
            let attempt = self.locked(Some(Persist::ADD), move |s, i| {
                try_add(s, i, key, uid, &req)
            });
            let why = match attempt.await {
                Ok((_, Err(e))) => return not_durable(&e),
                Ok((Attempt::Done(reply), Ok(()))) => return reply,
                Ok((Attempt::Empty(why), Ok(()))) => why,
                Err(e) => return failed(&e),
            };
            waiting.get_or_insert_with(|| self.inner.adds_waiting.hold());
            let woke = tokio::time::timeout_at(deadline, changes.changed()).await;
            if !matches!(woke, Ok(Ok(()))) {
                return Reply::error(
                    code::TRY_AGAIN_LATER,
                    "the node's address pool is empty",
                    why,
                );
            }
        }
    }

    /// CNI DEL: frees the key's addresses into cooldown if they are this pod's; an unknown
    /// key or a stale DEL (another pod UID) frees nothing and succeeds.
    pub async fn del(&self, req: CniRequest) -> Reply {
        self.del_observed(req).await.0
    }

    /// [`Agent::del`], and how it ended for the metrics: freed (ok), stale, unknown, error.
    pub(crate) async fn del_observed(&self, req: CniRequest) -> (Reply, CniOutcome) {
        let key = match req.key() {
            Ok(k) => k,
            Err(r) => return (r, CniOutcome::Error),
        };
        let uid = req.uid();
        let run = self.locked(Some(Persist::DEL), move |s, _| {
            let now = SystemTime::now();
            match uid {
                // matches no owner: frees nothing (a pending save still happens)
                UidArg::Invalid if s.get(&key).is_some() => CniOutcome::Stale,
                UidArg::Invalid => CniOutcome::Unknown,
                UidArg::Absent => CniOutcome::of_del(&s.del(&key, None, now)),
                UidArg::Valid(u) => CniOutcome::of_del(&s.del(&key, Some(u), now)),
            }
        });
        match run.await {
            Ok((outcome, Ok(()))) => (Reply::empty(), outcome),
            Ok((_, Err(e))) => (not_durable(&e), CniOutcome::Error),
            Err(e) => (failed(&e), CniOutcome::Error),
        }
    }

    /// CNI CHECK: success if the key is held (by this pod, when it names one) with the
    /// addresses of `prevResult` (when given).
    pub async fn check(&self, req: CniRequest) -> Reply {
        let key = match req.key() {
            Ok(k) => k,
            Err(r) => return r,
        };
        let state = self.state().lock().await;
        let Some(a) = state.get(&key) else {
            return Reply::error(
                code::GENERIC,
                "no allocation for this attachment",
                format!("({}, {})", key.container_id, key.ifname),
            );
        };
        let other_pod = match req.uid() {
            UidArg::Valid(u) => u != a.pod.uid,
            UidArg::Invalid => true,
            UidArg::Absent => false,
        };
        if other_pod {
            return Reply::error(
                code::GENERIC,
                "the attachment's allocation belongs to another pod",
                format!("owner {}", a.pod.uid),
            );
        }
        if let Some(prev) = req.prev_result_addresses() {
            let held: Vec<String> = a.addrs.iter().map(IpAddr::to_string).collect();
            let same = held.len() == prev.len() && held.iter().all(|h| prev.contains(h));
            if !same {
                return Reply::error(
                    code::GENERIC,
                    "prevResult's addresses differ from the allocation's",
                    format!("held {held:?}, prevResult {prev:?}"),
                );
            }
        }
        Reply::empty()
    }

    /// CNI GC: frees every allocation of the config's network (its `name`) missing from
    /// `cni.dev/valid-attachments` — never one of another network or of an unknown one
    /// (nothing when the config has no such list or no name). Implemented; nothing depends
    /// on it (DESIGN.md).
    pub async fn gc(&self, req: CniRequest) -> Reply {
        let (Some(valid), Some(network)) = (req.valid_attachments(), req.network()) else {
            return Reply::empty();
        };
        let network = network.to_owned();
        let run = self.locked(None, move |s, _| {
            s.gc(&network, &valid, SystemTime::now());
        });
        match run.await {
            Ok(((), Ok(()))) => Reply::empty(),
            Ok(((), Err(e))) => not_durable(&e),
            Err(e) => failed(&e),
        }
    }

    /// CNI STATUS: the agent answers, so the plugin is ready (it handles the agent-down
    /// case itself; an empty pool is never a STATUS failure).
    pub async fn status(&self, _req: CniRequest) -> Reply {
        Reply::empty()
    }

    /// `GET /v1/allocations`: every allocation, for people.
    pub async fn allocations(&self) -> Reply {
        let state = self.state().lock().await;
        let list: Vec<Value> = state
            .allocations()
            .map(|(k, a)| {
                let since = a
                    .since
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                json!({
                    "containerID": k.container_id, "ifname": k.ifname,
                    "podUID": a.pod.uid.to_string(), "namespace": a.pod.namespace,
                    "pod": a.pod.name,
                    "addresses": a.addrs.iter().map(IpAddr::to_string).collect::<Vec<_>>(),
                    "since": since, "netns": a.netns, "network": a.network.as_deref(),
                })
            })
            .collect();
        Reply::ok(Value::Array(list))
    }

    /// Answers what the operator asks of the node as `source` shows it now (tombstones,
    /// release marks, block marks; cooldowns of addresses gone): saved, then published. `keys` names the
    /// tombstones' allocations; live pods' addresses count as busy for release marks, and a
    /// live pod's newest allocation is answered `live` (tombstones wait for the pods' list).
    /// Nothing happens before the IPAMNode is read.
    pub async fn answer_operator(
        &self,
        blocks: Arc<[BlockView]>,
        keys: Arc<Allocations>,
    ) -> Result<()> {
        let Some(node) = self.inner.source.node() else {
            return Ok(());
        };
        let live = self.inner.pods.live_pods();
        let ((), saved) = self
            .locked(Some(Persist::ACK), move |s, _| {
                let now = SystemTime::now();
                super::answer::answer(s, &node, &blocks, &keys, live.as_deref(), now);
            })
            .await?;
        Ok(saved?)
    }

    /// The spool files in `spool_dir` now (see [`spooled`]): one listing, no lock taken,
    /// nothing read.
    pub fn spooled(&self, spool_dir: &Path) -> Result<Vec<PathBuf>> {
        Ok(spooled(self.inner.dir.fs(), spool_dir)?)
    }

    /// Replays the DEL spool in `spool_dir` (see [`replay_spool`]), publishes if it freed
    /// anything, and removes the replayed files once that is durable.
    pub async fn replay_spool(&self, spool_dir: &Path) -> Result<Replayed> {
        let spool_dir = spool_dir.to_owned();
        let (replayed, saved) = self
            .locked(None, move |s, i| replay_spool(s, i.dir.fs(), &spool_dir))
            .await?;
        let (mut out, dels) = replayed?;
        saved?;
        for d in &dels {
            d.remove(self.inner.dir.fs())?;
            out.applied += 1;
        }
        Ok(out)
    }
}

fn try_add(s: &mut NodeState, i: &Inner, key: AllocKey, uid: PodUid, req: &CniRequest) -> Attempt {
    let now = SystemTime::now();
    let networks = &i.pod_networks();
    if let Some(a) = s.get(&key) {
        if a.pod.uid != uid {
            let why = format!(
                "({}, {}) is held by pod {}",
                key.container_id, key.ifname, a.pod.uid
            );
            let reply = Reply::error(code::GENERIC, "the attachment belongs to another pod", why);
            return Attempt::Done(reply);
        }
        // a runtime retrying after a lost reply: the same addresses (answered once durable)
        return Attempt::Done(result_reply(networks, &req.cni_version, &a.addrs));
    }
    let Some(node) = i.source.node() else {
        return Attempt::Empty("the node's IPAMNode has not been read yet".into());
    };
    // the reserved addresses (gateways) are never handed out, and neither are live pods'
    // addresses the state does not hold (no checkpoint, or a corrupt one: a running pod's
    // address is never given to another; aws-vpc-cni#711)
    let mut exclude = networks.reserved().clone();
    if let Some(live) = i.pods.live_pods() {
        exclude.union_with(&live.addresses().iter().copied().collect());
    }
    if pool_families(&node).is_empty() {
        return Attempt::Empty("the node has no block yet".into());
    }
    let pod = PodRef {
        uid,
        namespace: req.pod_namespace.clone().unwrap_or_default(),
        name: req.pod_name.clone().unwrap_or_default(),
    };
    let pools = match pod_pools(s, i, &node, &pod) {
        Ok(Some((pools, outside))) => {
            exclude.union_with(&outside);
            pools
        }
        Ok(None) => PodPools::default(),
        Err(reply) => return Attempt::Done(reply),
    };
    let at = Attachment {
        netns: req.netns.clone(),
        network: req.network().map(Arc::from),
        pools,
    };
    let pools = at.pools.clone();
    let addrs = match s.add(&node, &exclude, key.clone(), pod, at, now) {
        Ok(added) => added.addrs,
        Err(Refused::NoFreeAddress { family }) => {
            let of_pool =
                (pools.get(family).as_deref()).map_or(String::new(), |p| format!(" of pool {p}"));
            let why = format!(
                "no free {} address in the node's blocks{of_pool}",
                family.as_str()
            );
            return Attempt::Empty(why);
        }
        Err(e) => return Attempt::Done(refused(&e.into())),
    };
    let result = match networks.result(&req.cni_version, &addrs) {
        Ok(r) => r,
        Err(e) => {
            // an address in no pod network: given back (it cools down), the ADD fails
            s.del(&key, Some(uid), now);
            let reply = Reply::error(
                code::INVALID_CONFIG,
                "no result shape for the address",
                e.to_string(),
            );
            return Attempt::Done(reply);
        }
    };
    Attempt::Done(Reply::ok(result))
}

/// The pod's pool per family the node serves, and the node's addresses outside them
/// ([`crate::pool_choice`]): `None` when the source knows no pools; a reply (code 11, naming
/// the pool and why) when the pod may use none.
fn pod_pools(
    s: &NodeState,
    i: &Inner,
    node: &IpamNode,
    pod: &PodRef,
) -> Result<Option<(PodPools, AddrSet)>, Reply> {
    let Some(choice) = i.source.pool_choice() else {
        return Ok(None);
    };
    let subject = i.pods.subject(pod.uid, &pod.namespace);
    // a new sandbox of the same pod: the pool of the address it holds of the family
    let held = |f: Family| {
        let mine = s.allocations().filter(|(_, a)| a.pod.uid == pod.uid);
        let addrs = mine.flat_map(|(_, a)| {
            let pools = a.pools;
            a.addrs
                .into_iter()
                .map(move |x| (x, pools.get(&x).cloned()))
        });
        let mut of_family = addrs.filter(|(x, _)| Family::of(x) == f);
        of_family.find_map(|(x, p)| p.or_else(|| choice.pool_of(&x).cloned()))
    };
    match choice.pod_pools(&pool_families(node), &subject, held) {
        Ok(pools) => {
            let outside = choice.outside(&node.operator.addresses, &pools);
            Ok(Some((pools, outside)))
        }
        Err(e) => Err(Reply::error(
            code::TRY_AGAIN_LATER,
            "the pod has no pool it may use",
            e.to_string(),
        )),
    }
}

fn result_reply(networks: &PodNetworks, version: &str, addrs: &[IpAddr]) -> Reply {
    networks.result(version, addrs).map_or_else(
        |e| {
            Reply::error(
                code::INVALID_CONFIG,
                "no result shape for the address",
                e.to_string(),
            )
        },
        Reply::ok,
    )
}

/// The agent itself failed (a blocking task died): not the request's fault.
fn failed(e: &Error) -> Reply {
    Reply::error(code::GENERIC, "tidepool agent failed", e.to_string())
}

fn refused(e: &StateError) -> Reply {
    Reply::error(
        code::GENERIC,
        "the node state refused the allocation",
        e.to_string(),
    )
}

/// A change that could not be made durable is not answered as done (it stays to be saved:
/// the next request's save holds it).
fn not_durable(e: &StateError) -> Reply {
    Reply::error(
        code::IO_FAILURE,
        "the tidepool agent could not save its state",
        e.to_string(),
    )
}

#[cfg(test)]
#[path = "agent_tests.rs"]
mod tests;
