//! [`Publisher`]: writes the node side's fields by server-side apply, batching. Callers only
//! say "publish now" ([`Publisher::publish`], never blocks); one task reads the latest state
//! from its [`NodeSideSource`] and writes it whole, at most once per
//! [`PublishConfig::interval`]: requests arriving during a write or the interval after it
//! collapse into one write.
//!
//! Applies are forced: these fields have one writer, the node side (DESIGN.md "Who writes
//! what"), so a conflict can only come from a hand edit, which must not stop the node from
//! recording its pods. The IPAMNode's status is written only when its body changed since the
//! last write that succeeded, or when the IPAMNode's UID changed (a re-created object gets
//! everything again, from the checkpoint); a block's answer only when it changed. Every
//! apply is counted by what the API server answered (`tidepool_agent_status_writes_total`).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::Value;
use tidepool_api as api;
use tidepool_api::names::AGENT_MANAGER;
use tidepool_ipam::{NodeUid, ReleaseAck};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::body::{AgentReady, NodeSide, block_status_body, node_status_body};
use super::{KubeError, NodeWatch};
use crate::failpoint::{Failpoint, reach_async};
use crate::observe;

/// Where the publisher reads the node side's state (the agent: its durable node state).
pub trait NodeSideSource: Send + Sync + 'static {
    /// The state to publish now; `None` while there is nothing to publish yet (before the
    /// first restore: a partial `used` map is never published).
    fn read(&self) -> impl Future<Output = Option<NodeSide>> + Send;
}

/// How the publisher paces its writes.
#[derive(Debug, Clone, Copy)]
pub struct PublishConfig {
    /// At most one round of writes per interval.
    pub interval: Duration,
    /// The wait after a failed write before the next try.
    pub retry: Duration,
}

impl Default for PublishConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            retry: Duration::from_secs(1),
        }
    }
}

struct Running {
    notify: Arc<Notify>,
    written: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The handle to the publishing task. Cheap to clone; the task stops with the last clone.
#[derive(Clone)]
pub struct Publisher {
    running: Arc<Running>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("rounds", &*self.running.written.borrow())
            .finish()
    }
}

impl Publisher {
    /// Starts the task publishing `source` for the node `watch` watches, through `client`.
    pub fn start<S: NodeSideSource>(
        client: kube::Client,
        watch: NodeWatch,
        source: S,
        config: PublishConfig,
    ) -> Self {
        let notify = Arc::new(Notify::new());
        let (written_tx, written) = watch::channel(0);
        let task = Task {
            nodes: Api::all(client.clone()),
            blocks: Api::all(client),
            watch,
            source,
            config,
            notify: notify.clone(),
            written: written_tx,
            last: Last::default(),
        };
        let task = tokio::spawn(task.run());
        Self {
            running: Arc::new(Running {
                notify,
                written,
                task,
            }),
        }
    }

    /// Asks for the current state to be published (soon; many asks, one write).
    pub fn publish(&self) {
        self.running.notify.notify_one();
    }

    /// Counts the rounds whose writes all succeeded (a round with nothing to change
    /// counts too): wait on it to know a state asked for is on the server.
    pub fn published(&self) -> watch::Receiver<u64> {
        self.running.written.clone()
    }
}

/// What the last successful writes sent.
#[derive(Default)]
struct Last {
    node_uid: Option<NodeUid>,
    body: Option<Value>,
    ready: Option<(AgentReady, SystemTime)>,
    blocks: BTreeMap<String, ReleaseAck>,
}

struct Task<S> {
    nodes: Api<api::IPAMNode>,
    blocks: Api<api::IPAMBlock>,
    watch: NodeWatch,
    source: S,
    config: PublishConfig,
    notify: Arc<Notify>,
    written: watch::Sender<u64>,
    last: Last,
}

impl<S: NodeSideSource> Task<S> {
    async fn run(mut self) {
        let mut changes = self.watch.changes();
        loop {
            tokio::select! {
                () = self.notify.notified() => {}
                r = changes.changed() => {
                    if r.is_err() {
                        return;
                    }
                    // a re-created IPAMNode (another UID) gets everything again
                    if self.watch.node_uid() == self.last.node_uid {
                        continue;
                    }
                }
            }
            let started = tokio::time::Instant::now();
            match self.round().await {
                Ok(()) => {
                    self.written.send_modify(|n| *n += 1);
                    tokio::time::sleep_until(started + self.config.interval).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "publishing the node side's fields failed; retrying");
                    tokio::time::sleep(self.config.retry).await;
                    self.notify.notify_one();
                }
            }
        }
    }

    /// One round: the node's status, then the blocks' answers that changed.
    async fn round(&mut self) -> Result<(), KubeError> {
        let Some(side) = self.source.read().await else {
            return Ok(());
        };
        let Some(node) = self.watch.current() else {
            // nothing to write to before the IPAMNode exists
            return Ok(());
        };
        let name = node.name.to_string();
        let uid = Some(node.node_uid);
        let since = self.since(side.ready.as_ref());
        let body = node_status_body(
            &name,
            &side.fields,
            &side.allocations,
            &side.pools,
            side.ready.as_ref(),
            since,
        );
        if self.last.node_uid != uid || self.last.body.as_ref() != Some(&body) {
            self.apply_node(&name, &body).await?;
            self.last.node_uid = uid;
            self.last.body = Some(body);
            self.last.ready = side.ready.clone().map(|r| (r, since));
        }
        self.apply_blocks(&side.block_acks).await
    }

    /// When the `AgentReady` condition last changed status (now, if it does now).
    fn since(&self, ready: Option<&AgentReady>) -> SystemTime {
        match (&self.last.ready, ready) {
            (Some((old, at)), Some(new)) if old.ready == new.ready => *at,
            _ => SystemTime::now(),
        }
    }

    async fn apply_node(&self, name: &str, body: &Value) -> Result<(), KubeError> {
        reach_async(Failpoint::BeforePublish).await;
        let pp = PatchParams::apply(AGENT_MANAGER).force();
        let written = self
            .nodes
            .patch_status(name, &pp, &Patch::Apply(body))
            .await;
        observe::status_write(&written);
        written.map(drop).map_err(|source| KubeError::Apply {
            object: format!("ipamnode/{name}"),
            source,
        })
    }

    /// Writes each block answer that changed; withdraws those no longer given. A block
    /// gone from the server (404) or refused for good (another 4xx) is not retried.
    async fn apply_blocks(&mut self, acks: &BTreeMap<String, ReleaseAck>) -> Result<(), KubeError> {
        let mut todo: Vec<(String, Option<ReleaseAck>)> = acks
            .iter()
            .filter(|(b, a)| self.last.blocks.get(*b) != Some(a))
            .map(|(b, a)| (b.clone(), Some(*a)))
            .collect();
        todo.extend(
            self.last
                .blocks
                .keys()
                .filter(|b| !acks.contains_key(*b))
                .map(|b| (b.clone(), None)),
        );
        let pp = PatchParams::apply(AGENT_MANAGER).force();
        for (name, ack) in todo {
            let body = block_status_body(&name, ack);
            reach_async(Failpoint::BeforePublish).await;
            let written = self
                .blocks
                .patch_status(&name, &pp, &Patch::Apply(&body))
                .await;
            observe::status_write(&written);
            match written {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                // Refused for good, e.g. the block moved to another node and the own-node
                // policy says no (422): the same body would be refused again, and retrying it
                // would stall every later write. Throttling (429) is retried.
                Err(kube::Error::Api(s)) if (400..500).contains(&s.code) && s.code != 429 => {
                    tracing::warn!(block = %name, code = s.code, message = %s.message, "a block answer was refused; dropping it");
                }
                Err(source) => {
                    return Err(KubeError::Apply {
                        object: format!("ipamblock/{name}"),
                        source,
                    });
                }
            }
            match ack {
                Some(a) => self.last.blocks.insert(name, a),
                None => self.last.blocks.remove(&name),
            };
        }
        Ok(())
    }
}
