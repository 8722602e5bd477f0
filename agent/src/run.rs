//! The agent's start-up order and lifetime (DESIGN.md "Node agent"): take the lock on the
//! state directory, load the checkpoint, wait for the node's IPAMNode (the operator creates
//! it), read it and its blocks, list the node's pods, rebuild from the published node side
//! if the checkpoint was corrupt, reconcile, replay the DEL spool, publish the node side's
//! fields in one write (`AgentReady=False`, `Starting`), serve ADD, and only then mark the
//! restore done (the plugin's STATUS reads the marker) and publish `AgentReady=True`. A partial `used` map is never published (Cilium #9888): nothing is published
//! before the checkpoint is loaded (or rebuilt) and the spool replayed. No ADD is served
//! before the pods are listed: a live pod's address is never handed out, checkpoint or not.
//!
//! Then, for as long as it runs, it answers the operator's tombstones and release marks
//! whenever the node's objects change and each second (cooldowns end with time),
//! reconciles against the runtime every [`reconcile::Config::interval`], and replays the DEL
//! spool whenever it holds a DEL (a check at once, then each second: the plugin spools a DEL
//! whenever it cannot reach the agent, the start-up window included). With
//! [`Settings::node_routes`] it also keeps a route to every other node's blocks
//! ([`crate::routes`]), started once it serves, stopped (its routes left) when it stops.
//!
//! [`Settings::ready`] turns ready once it serves (restored and the socket bound: what
//! `/readyz` reports) and not ready when it stops; so does `AgentReady`, which a clean stop
//! leaves False (`Stopped`) and an error after the first publish False (`Failed`, the
//! error). A crashed agent writes nothing: the operator takes its liveness from the agent
//! pod's Ready condition (the kubelet probes `/readyz`). Its metrics are recorded where things
//! happen ([`crate::observe`]); the binary installs the exporter.
//!
//! For tests only: `TIDEPOOL_FAILPOINTS` (read by the binary) stops the agent at named
//! points of this lifetime — before and after each save of an ADD, a DEL or an answer to
//! the operator, before each publish — so the crash tests can kill it there
//! ([`crate::failpoint`], agent/tests/crash.rs).
//!

use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tidepool_metrics::probes::Readiness;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::kube::{
    AgentReady, NodeSide, NodeSideSource, NodeWatch, PodWatch, PublishConfig, Publisher, read_node,
};
use crate::masq::{self, Masquerade};
use crate::reconcile;
use crate::routes::{self, NodeRoutes};
use crate::serve::{Agent, Config, PodNetworks, Replayed, Server, SharedState};
use crate::state::{BOOT_ID_PATH, NodeState, StateDir, read_boot_id};

/// What `run` needs besides a client.
#[derive(Debug, Clone)]
pub struct Settings {
    pub node_name: String,
    /// Where the plugin reaches the agent.
    pub socket: PathBuf,
    /// The checkpoint's directory (locked: one agent per node).
    pub state_dir: PathBuf,
    /// Where the plugin spools DELs while the agent is down.
    pub spool_dir: PathBuf,
    /// Written once the first restore since boot is done (on tmpfs: a reboot removes it).
    pub restored_marker: PathBuf,
    /// How often the marker's modification time is refreshed while the agent serves: the
    /// plugin's STATUS fails once it is older than its `unreachableGrace` (10 min).
    pub marker_refresh: Duration,
    /// The boot ID's file (the kernel's; a test fakes it).
    pub boot_id_file: PathBuf,
    /// `--pod-network`: these instead of the IPPools' CIDRs (`None`: the IPPools').
    pub pod_networks: Option<PodNetworks>,
    /// How long an address stays out of use after it is freed.
    pub reuse_cooldown: Duration,
    /// How long to wait for the node's IPAMNode at start before failing.
    pub node_wait: Duration,
    /// How long an ADD waits for an address when the pool is empty.
    pub empty_pool_wait: Duration,
    /// Set once the agent serves, cleared when it stops (`/readyz`).
    pub ready: Readiness,
    /// Reconcile against the runtime: its directories, interval and cap.
    pub reconcile: reconcile::Config,
    /// `--node-routes`: routes to the other nodes' blocks via their InternalIPs (`None`:
    /// off, the network routes the blocks).
    pub node_routes: Option<routes::Config>,
    /// `--masquerade`: pods' traffic to outside the pod networks and the non-masquerade
    /// CIDRs leaves with the node's address (`None`: off).
    pub masquerade: Option<masq::Config>,
}

impl Settings {
    /// The defaults for `node_name`: DESIGN.md's paths, the pod networks from the IPPools.
    pub fn new(node_name: &str) -> Self {
        Settings {
            node_name: node_name.into(),
            socket: "/run/tidepool/agent.sock".into(),
            state_dir: "/var/lib/tidepool".into(),
            spool_dir: "/var/lib/tidepool/spool".into(),
            restored_marker: "/run/tidepool/restored".into(),
            marker_refresh: Duration::from_secs(10),
            boot_id_file: BOOT_ID_PATH.into(),
            pod_networks: None,
            reuse_cooldown: Duration::from_secs(30),
            node_wait: Duration::from_secs(300),
            empty_pool_wait: crate::serve::DEFAULT_EMPTY_POOL_WAIT,
            ready: Readiness::default(),
            reconcile: reconcile::Config::default(),
            node_routes: None,
            masquerade: None,
        }
    }
}

/// The durable state as the publisher reads it (never a change not yet saved), with the
/// agent's `AgentReady` condition as [`run`] sets it. Cheap to clone (shared).
#[derive(Clone)]
pub struct Published {
    state: SharedState,
    ready: Arc<std::sync::Mutex<AgentReady>>,
}

impl Published {
    /// `state`, published with `ready` as the condition until [`Published::set`].
    pub fn new(state: SharedState, ready: AgentReady) -> Self {
        Published {
            state,
            ready: Arc::new(std::sync::Mutex::new(ready)),
        }
    }

    /// The condition the next publish carries.
    pub fn set(&self, ready: AgentReady) {
        *self
            .ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = ready;
    }

    fn ready(&self) -> AgentReady {
        (self.ready.lock())
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl NodeSideSource for Published {
    async fn read(&self) -> Option<NodeSide> {
        let ready = self.ready();
        Some(NodeSide::from_state(&self.state.durable(), Some(ready)))
    }
}

/// How long a stopping agent waits for its last `AgentReady` (False) to be written.
const LAST_WORD: Duration = Duration::from_secs(5);

/// Runs the agent until `shutdown` completes. `AgentReady` is False (`Starting`) from its
/// first publish, True (`Serving`) once its socket serves, and False again when it stops:
/// `Stopped` on a clean stop, `Failed` with the error once it published and then failed.
pub async fn run(
    client: kube::Client,
    s: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    if s.reconcile.interval.is_zero() {
        return Err(Error::Config(
            "the reconcile interval must be positive".into(),
        ));
    }
    let restored = restore(&client, &s).await?;
    let (publisher, published) = (restored.publisher.clone(), restored.published.clone());
    let served = serve(client, &s, restored, shutdown).await;
    if let Err(e) = &served {
        published.set(AgentReady::failed(&e.to_string()));
        publish_within(&publisher, LAST_WORD).await;
    }
    served
}

/// The agent restored and published (`AgentReady=False`, `Starting`), not serving yet.
struct Restored {
    agent: Agent,
    watch: NodeWatch,
    publisher: Publisher,
    published: Published,
}

/// Takes the lock, loads the checkpoint, waits for the node's IPAMNode and pods, rebuilds
/// if the checkpoint was corrupt, answers the operator, reconciles, replays the DEL spool
/// and publishes the node side in one write.
async fn restore(client: &kube::Client, s: &Settings) -> Result<Restored> {
    let dir = StateDir::open(&s.state_dir)?;
    let boot_id = read_boot_id(dir.fs(), &s.boot_id_file)?;
    let loaded = dir.load(&boot_id, SystemTime::now(), s.reuse_cooldown)?;
    tracing::info!(origin = ?loaded.origin, expired_by_reboot = loaded.expired_by_reboot.len(), "checkpoint loaded");
    let watch = NodeWatch::start(client.clone(), &s.node_name);
    watch.wait_for_node(s.node_wait).await?;
    watch.ready().await;
    let pods = PodWatch::start(client.clone(), &s.node_name);
    let live = pods.synced(s.node_wait).await?;
    tracing::info!(live_pods = live.len(), "the node's pods listed");
    let rebuild = loaded.rebuild_needed();
    let mut state = loaded.state;
    if rebuild {
        adopt_published(client, &watch, &dir, &mut state).await?;
    }
    let state = SharedState::new(state);
    let published = Published::new(state.clone(), AgentReady::starting());
    let publisher = Publisher::start(
        client.clone(),
        watch.clone(),
        published.clone(),
        PublishConfig::default(),
    );
    let config = Config {
        pod_networks: s.pod_networks.clone().map(Arc::new),
        empty_pool_wait: s.empty_pool_wait,
    };
    let agent = Agent::with_pods(
        state,
        dir,
        Arc::new(watch.clone()),
        Arc::new(pods),
        Arc::new(publisher.clone()),
        config,
    );
    agent
        .answer_operator(watch.blocks(), watch.allocations())
        .await?;
    agent.reconcile(&s.reconcile).await?;
    let replayed = agent.replay_spool(&s.spool_dir).await?;
    tracing::info!(?replayed, "DEL spool replayed");
    publish_once(&publisher).await;
    Ok(Restored {
        agent,
        watch,
        publisher,
        published,
    })
}

/// Binds the socket and serves until `shutdown`; only then is the restore marked and
/// `AgentReady` True. On `shutdown`: not ready, `AgentReady` False (`Stopped`, written
/// within [`LAST_WORD`]) while the socket still serves, then every task stopped.
async fn serve(
    client: kube::Client,
    s: &Settings,
    r: Restored,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let server = Server::bind(&s.socket)?;
    tracing::info!(socket = %s.socket.display(), node = %s.node_name, "serving");
    let masquerade = start_masquerade(&r.watch, s);
    let serving = Serving::start(r.agent, r.watch, server, s);
    let started = match mark_restored(&s.restored_marker) {
        Ok(()) => start_node_routes(client, s).await,
        Err(e) => Err(e),
    };
    let node_routes = match started {
        Ok(routes) => routes,
        Err(e) => {
            serving.stop().await;
            return Err(e);
        }
    };
    r.published.set(AgentReady::serving());
    r.publisher.publish();
    s.ready.set(true);
    shutdown.await;
    s.ready.set(false);
    r.published.set(AgentReady::stopped());
    publish_within(&r.publisher, LAST_WORD).await;
    serving.stop().await;
    // stops the route and masquerade managers; their rules stay (pods keep reaching the
    // other nodes and the outside)
    drop(node_routes);
    drop(masquerade);
    Ok(())
}

/// The agent's tasks once it serves: the socket server and the loops beside it.
struct Serving {
    agent: Agent,
    stop: CancellationToken,
    server: JoinHandle<()>,
    loops: [JoinHandle<()>; 4],
}

impl Serving {
    fn start(agent: Agent, watch: NodeWatch, server: Server, s: &Settings) -> Self {
        let stop = CancellationToken::new();
        let loops = [
            tokio::spawn(answer_loop(agent.clone(), watch)),
            tokio::spawn(refresh_marker(s.restored_marker.clone(), s.marker_refresh)),
            tokio::spawn(agent.clone().reconcile_every(s.reconcile.clone())),
            tokio::spawn(replay_spool_loop(agent.clone(), s.spool_dir.clone())),
        ];
        let server = server.spawn(agent.clone(), stop.clone());
        Serving {
            agent,
            stop,
            server,
            loops,
        }
    }

    /// Stops every task and waits until each is gone, and the work they left on the
    /// blocking pool with them: then no clone of the agent is left, and its state
    /// directory's lock is free when `run` returns.
    async fn stop(self) {
        self.stop.cancel();
        self.loops.iter().for_each(JoinHandle::abort);
        let _ = self.server.await;
        for t in self.loops {
            let _ = t.await;
        }
        self.agent.close().await;
    }
}

/// With `--node-routes`: the routes to the other nodes' blocks, kept from now on.
async fn start_node_routes(client: kube::Client, s: &Settings) -> Result<Option<NodeRoutes>> {
    let Some(config) = &s.node_routes else {
        return Ok(None);
    };
    let routes = NodeRoutes::start(client, &s.node_name, config.clone()).await?;
    tracing::info!(node = %s.node_name, "keeping the routes to the other nodes' blocks");
    Ok(Some(routes))
}

/// With `--masquerade`: the masquerade rules for the pod networks in effect (the
/// `--pod-network` override, else the valid IPPools' as the watch has them), kept from now on.
fn start_masquerade(watch: &NodeWatch, s: &Settings) -> Option<Masquerade> {
    let config = s.masquerade.clone()?;
    let fixed = s.pod_networks.as_ref().map(|n| n.nets().to_vec());
    let w = watch.clone();
    let networks = move || {
        fixed
            .clone()
            .unwrap_or_else(|| w.pod_networks().nets().to_vec())
    };
    tracing::info!(node = %s.node_name, "keeping the masquerade rules");
    Some(Masquerade::start(networks, watch.changes(), config))
}

/// Answers the operator (tombstones, release marks, block marks) whenever the node's
/// objects change, and each second (cooldowns end with time).
async fn answer_loop(agent: Agent, watch: NodeWatch) {
    let mut changes = watch.changes();
    loop {
        let answered = agent
            .answer_operator(watch.blocks(), watch.allocations())
            .await;
        if let Err(e) = answered {
            tracing::warn!(error = %e, "answering the operator failed; retrying");
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// How often the serving agent looks into the DEL spool ([`replay_spool_loop`]).
const SPOOL_CHECK: Duration = Duration::from_secs(1);

/// Every this many spool checks, files that were no DEL are read (and reported) again: a
/// plugin may have replaced one with a DEL since.
const UNREADABLE_RECHECK: u32 = 60;

/// Replays the DEL spool while the agent serves, whenever it holds a DEL: the plugin spools
/// one whenever it cannot reach the agent (between the start-up replay and the socket
/// serving, or a connect timeout under load) and reports success, so a DEL left there would
/// leak its address for as long as the agent runs. The first check runs at once, then one
/// every [`SPOOL_CHECK`]: a periodic check, not a watch of the directory (inotify needs a
/// new dependency or a blocking reader, and the directory may not exist yet). An empty
/// spool costs one directory listing, no lock. A replay takes the state lock, as a live DEL
/// does, so the two never interleave; it matches entries as the start-up replay does.
async fn replay_spool_loop(agent: Agent, spool_dir: PathBuf) {
    // files that are no DEL, left in place: replayed (and reported) again only now and then
    let mut unreadable = BTreeSet::new();
    let mut checks = tokio::time::interval(SPOOL_CHECK);
    checks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    for n in (0..UNREADABLE_RECHECK).cycle() {
        checks.tick().await;
        if n == 0 {
            unreadable.clear();
        }
        match agent.spooled(&spool_dir) {
            Ok(files) if files.iter().all(|f| unreadable.contains(f)) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "reading the DEL spool failed; retrying");
                continue;
            }
        }
        match agent.replay_spool(&spool_dir).await {
            Ok(r) => unreadable = report_replayed(r, &unreadable),
            Err(e) => tracing::warn!(error = %e, "replaying the DEL spool failed; retrying"),
        }
    }
}

/// Logs what a replay while serving did (each unreadable file once, not at each check);
/// returns the unreadable files.
fn report_replayed(r: Replayed, reported: &BTreeSet<PathBuf>) -> BTreeSet<PathBuf> {
    if r.applied > 0 {
        tracing::info!(
            applied = r.applied,
            freed = r.freed,
            "spooled DELs replayed"
        );
    }
    let mut unreadable = BTreeSet::new();
    for u in r.unreadable {
        if !reported.contains(&u.path) {
            tracing::warn!(file = %u.path.display(), error = %u.error, "a spool file is no DEL this agent reads; left in place");
        }
        unreadable.insert(u.path);
    }
    unreadable
}

/// After a corrupt checkpoint: adopts the node side the agent had published (read from the
/// server, only if the IPAMNode is still the watched one, same nodeUID) and saves it before
/// anything is published, so the rebuild survives a restart.
async fn adopt_published(
    client: &kube::Client,
    watch: &NodeWatch,
    dir: &StateDir,
    state: &mut NodeState,
) -> Result<()> {
    let view = read_node(client, &watch.node_name()).await?;
    if Some(view.node.node_uid) != watch.node_uid() {
        tracing::warn!("the IPAMNode changed UID since it was watched: nothing adopted");
        return Ok(());
    }
    let adopted = state.adopt(
        &view.node.node,
        &view.allocations,
        &view.used_pools,
        SystemTime::now(),
    );
    for why in &adopted.skipped {
        tracing::warn!(%why, "a published entry could not be adopted");
    }
    tracing::info!(
        allocations = adopted.allocations,
        cooldowns = adopted.cooldowns,
        "corrupt checkpoint: the published node side adopted"
    );
    dir.save(state)?;
    Ok(())
}

/// [`publish_once`], waiting at most `wait` (a stopping agent does not hang on a server it
/// cannot reach).
async fn publish_within(publisher: &Publisher, wait: Duration) {
    if tokio::time::timeout(wait, publish_once(publisher))
        .await
        .is_err()
    {
        tracing::warn!("the last AgentReady could not be written in time");
    }
}

/// Publishes the restored state and waits until it is written (retried by the publisher).
async fn publish_once(publisher: &Publisher) {
    let mut written = publisher.published();
    let before = *written.borrow_and_update();
    publisher.publish();
    while *written.borrow_and_update() == before {
        if written.changed().await.is_err() {
            return;
        }
    }
}

/// Refreshes the restore marker's modification time every `every` (a heartbeat the plugin
/// reads when it cannot reach the agent).
async fn refresh_marker(path: PathBuf, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let touched = std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(SystemTime::now()));
        if let Err(e) = touched {
            tracing::warn!(marker = %path.display(), error = %e, "refreshing the restore marker failed");
        }
    }
}

/// Writes the marker that tells the plugin's STATUS this boot's first restore is done.
fn mark_restored(path: &Path) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(Error::io("create", parent))?;
    }
    std::fs::write(path, b"").map_err(Error::io("write", path))
}
