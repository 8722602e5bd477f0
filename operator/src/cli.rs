//! Command-line flags (clap). Every flag also reads a `TIDEPOOL_*` environment variable;
//! durations are written like `30s` or `2m`; booleans accept `--flag` and `--flag=false`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use tidepool_api::flags::{MAX_DURATION, count_within, duration_within, listen_addr};

use tidepool_ipam::BackoffConfig;
use tidepool_ipam::EngineConfig;
use tidepool_ipam::ReclaimConfig;
use tidepool_ipam::ReleaseConfig;
use tidepool_ipam::ScarcityConfig;
use tidepool_ipam::SchedulingMode;
use tidepool_ipam::Watermarks;

// Every size and rate has an upper bound and every interval a floor (named in --help): an
// unbounded value aborted on a huge allocation, rounded event gaps to 0 ns or never ended.
// Durations and counts are bounded as the agent's are (`tidepool_api::flags`).

/// Calls per second a budget or the simulated cloud may allow.
const MIN_RATE: f64 = 0.001;
const MAX_RATE: f64 = 1_000_000.0;
/// Tokens a budget's bucket may hold.
const MAX_BURST: u32 = 1_000_000;

fn duration(s: &str) -> Result<Duration, String> {
    duration_within(s, Duration::ZERO, MAX_DURATION)
}

/// A duration of at least `floor` (a period the run repeats).
fn interval(s: &str, floor: Duration) -> Result<Duration, String> {
    duration_within(s, floor, MAX_DURATION)
}

/// As the agent's `--reuse-cooldown`, which must equal it.
fn reuse_cooldown(s: &str) -> Result<Duration, String> {
    duration_within(s, Duration::ZERO, tidepool_ipam::node::MAX_REUSE_COOLDOWN)
}

fn resync_interval(s: &str) -> Result<Duration, String> {
    interval(s, Duration::from_secs(1))
}

fn agent_ready_grace(s: &str) -> Result<Duration, String> {
    interval(s, Duration::from_secs(1))
}

fn backoff_min(s: &str) -> Result<Duration, String> {
    interval(s, Duration::from_millis(10))
}

/// A finite number within `lo..=hi`; the error repeats the input as written.
fn within(s: &str, lo: f64, hi: f64, what: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (lo..=hi).contains(&v) => Ok(v),
        Ok(_) => Err(format!("{what} must be between {lo} and {hi}")),
        Err(e) => Err(e.to_string()),
    }
}

fn positive_rate(s: &str) -> Result<f64, String> {
    within(s, MIN_RATE, MAX_RATE, "a rate (calls per second)")
}

/// A pool pressure threshold: a share of the pool's capacity.
fn pressure_share(s: &str) -> Result<f64, String> {
    within(s, 0.01, 1.0, "a share of the pool (0.01 to 1)")
}

/// Pod replacements per node per minute: at most one a second.
fn churn_rate(s: &str) -> Result<f64, String> {
    within(s, 0.0, 60.0, "pod churn (per node per minute)")
}

/// Node losses per hour: at most one a second.
fn node_churn_rate(s: &str) -> Result<f64, String> {
    within(s, 0.0, 3600.0, "node churn (per hour)")
}

fn burst(s: &str) -> Result<u32, String> {
    count_within(s, 1, MAX_BURST)
}

/// Seeds one `--seeds` may name.
const MAX_SEEDS: usize = 100_000;

/// A list of seeds (`--seeds`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seeds(pub Vec<u64>);

/// Seeds: `1..200` (inclusive: 200 seeds), `3,5,8`, or one number.
pub fn seeds(s: &str) -> Result<Seeds, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let num = |x: &str| {
            x.trim()
                .parse::<u64>()
                .map_err(|_| format!("{x:?} is not a seed (write 1..200, 3,5,8 or 7)"))
        };
        if let Some((a, b)) = part.split_once("..") {
            let (a, b) = (num(a)?, num(b.trim_start_matches('='))?);
            if a > b {
                return Err(format!("{part}: empty range"));
            }
            if b - a >= MAX_SEEDS as u64 {
                return Err(format!("{part}: at most {MAX_SEEDS} seeds"));
            }
            out.extend(a..=b);
        } else {
            out.push(num(part)?);
        }
        // the limit holds for the whole list, not per range
        if out.len() > MAX_SEEDS {
            return Err(format!("at most {MAX_SEEDS} seeds in all"));
        }
    }
    Ok(Seeds(out))
}

fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        Ok(v) => Err(format!("{v} is not within 0..=1")),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "tidepool-operator",
    version,
    about = "Keeps every node supplied with pod IP addresses"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log filter (tracing's EnvFilter syntax: `info`, `tidepool_ipam=debug,warn`, ...)
    /// [default: info; warn for simulate, whose output is its report].
    #[arg(long, global = true, env = "TIDEPOOL_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Log lines as text for people or JSON for a log pipeline.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "TIDEPOOL_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run against a cluster: replicas elect a leader through a Lease (or, with
    /// --leader-elect=false, one replica leads alone).
    Run(Box<RunCmd>),
    /// Run the real engine on a simulated cluster and report.
    Simulate(Box<SimulateFlags>),
    /// Read-only report of the cluster's IPAM state: reclaim candidates, leaked entries,
    /// duplicates, orphan blocks, out-of-range and unknown-pool blocks and addresses,
    /// malformed entries, and per-pool usage. Exit status 0 when nothing needs a person, 1
    /// when something does, 2 on errors.
    Check(CheckCmd),
    /// Print the CustomResourceDefinitions (IPPool, IPAMBlock, IPAMNode) as YAML, as
    /// `deploy/crds/` holds them.
    Crds,
}

/// Engine flags shared by `run` and `simulate`.
#[derive(Args, Debug, Clone)]
pub struct RunFlags {
    /// Free addresses to keep per node and family (0 = none).
    #[arg(long, default_value_t = 8, env = "TIDEPOOL_PRE_ALLOCATE")]
    pub pre_allocate: u32,
    /// Minimum pool size per node and family (0 = none).
    #[arg(long, default_value_t = 0, env = "TIDEPOOL_MIN_ALLOCATE")]
    pub min_allocate: u32,
    /// Hard cap per node and family (0 = none).
    #[arg(long, default_value_t = 0, env = "TIDEPOOL_MAX_ALLOCATE")]
    pub max_allocate: u32,
    /// Extra addresses claimed on top of the need in one pass.
    #[arg(long, default_value_t = 0, env = "TIDEPOOL_MAX_ABOVE_WATERMARK")]
    pub max_above_watermark: u32,
    /// Give back excess addresses through the release handshake.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, env = "TIDEPOOL_RELEASE_EXCESS_IPS")]
    pub release_excess_ips: bool,
    /// How long excess must persist before it is marked for release.
    #[arg(long, default_value = "180s", value_parser = duration, env = "TIDEPOOL_EXCESS_IP_RELEASE_DELAY")]
    pub excess_ip_release_delay: Duration,
    /// Workers recalculating nodes during a resync (1 to 10000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000), env = "TIDEPOOL_PARALLEL_ALLOC_WORKERS")]
    pub parallel_alloc_workers: u32,
    /// Time between resyncs of every node (1s to 30 days).
    #[arg(long, default_value = "1m", value_parser = resync_interval, env = "TIDEPOOL_RESYNC_INTERVAL")]
    pub resync_interval: Duration,
    /// API server writes per second (0.001 to 1000000).
    #[arg(long, default_value_t = 50.0, value_parser = positive_rate, env = "TIDEPOOL_KUBE_API_QPS")]
    pub kube_api_qps: f64,
    /// API server write burst (1 to 1000000).
    #[arg(long, default_value_t = 100, value_parser = burst, env = "TIDEPOOL_KUBE_API_BURST")]
    pub kube_api_burst: u32,
    /// Admission order of waiting calls: priority (pods waiting, then need) or fifo.
    #[arg(
        long,
        value_enum,
        default_value = "priority",
        env = "TIDEPOOL_SCHEDULING"
    )]
    pub scheduling: Scheduling,
    /// First retry delay after a failure (10ms to 30 days).
    #[arg(long, default_value = "1s", value_parser = backoff_min, env = "TIDEPOOL_BACKOFF_MIN")]
    pub backoff_min: Duration,
    /// Longest retry delay after failures (each consecutive failure waits longer, up to this).
    #[arg(long, default_value = "5m", value_parser = duration, env = "TIDEPOOL_BACKOFF_MAX")]
    pub backoff_max: Duration,
    /// A failure more than this long after the node's previous one starts its retry delays
    /// over from --backoff-min.
    #[arg(long, default_value = "10m", value_parser = duration, env = "TIDEPOOL_BACKOFF_RESET_AFTER")]
    pub backoff_reset_after: Duration,
    /// Time between the two observations of a reclaim candidate.
    #[arg(long, default_value = "30s", value_parser = duration, env = "TIDEPOOL_RECLAIM_GRACE")]
    pub reclaim_grace: Duration,
    /// Minimum time since the operator first saw an entry before it may be reclaimed.
    #[arg(long, default_value = "2m", value_parser = duration, env = "TIDEPOOL_RECLAIM_MIN_AGE")]
    pub reclaim_min_age: Duration,
    /// How long a freed or reclaimed address cools down before reuse.
    #[arg(long, default_value = "30s", value_parser = reuse_cooldown, env = "TIDEPOOL_REUSE_COOLDOWN")]
    pub reuse_cooldown: Duration,
    /// Whole-node reclaim waits this long after the Node's deletion.
    #[arg(long, default_value = "5m", value_parser = duration, env = "TIDEPOOL_NODE_RECLAIM_GRACE")]
    pub node_reclaim_grace: Duration,
    /// Let warm pools give way when a pool runs short: on a scarce pool, pre-allocation
    /// shrinks with pressure, --min-allocate and --max-above-watermark are ignored, and
    /// excess is released after --scarcity-release-delay. false: the watermarks hold
    /// whatever the pressure (pressure and the Scarce condition are still shown).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, env = "TIDEPOOL_SCARCITY_HANDLING")]
    pub scarcity_handling: bool,
    /// A pool becomes scarce when (used + waiting + cooldown) / capacity reaches this
    /// (0.01 to 1).
    #[arg(long, default_value_t = 0.85, value_parser = pressure_share, env = "TIDEPOOL_SCARCITY_ENTER")]
    pub scarcity_enter: f64,
    /// A scarce pool stops being scarce below this pressure (0.01 to --scarcity-enter)...
    #[arg(long, default_value_t = 0.75, value_parser = pressure_share, env = "TIDEPOOL_SCARCITY_EXIT")]
    pub scarcity_exit: f64,
    /// ...and no sooner than this after it became scarce.
    #[arg(long, default_value = "5m", value_parser = duration, env = "TIDEPOOL_SCARCITY_MIN_DURATION")]
    pub scarcity_min_duration: Duration,
    /// How long excess must persist before it is marked for release on a scarce pool
    /// (instead of --excess-ip-release-delay, when shorter).
    #[arg(long, default_value = "10s", value_parser = duration, env = "TIDEPOOL_SCARCITY_RELEASE_DELAY")]
    pub scarcity_release_delay: Duration,
    /// Export tidepool_ipam_node_ips{node,family,state}: 12 series per node. A deleted
    /// node's series leave the export 3 resync intervals after it is gone.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, env = "TIDEPOOL_PER_NODE_METRICS")]
    pub per_node_metrics: bool,
}

/// `run`'s own flags besides the engine's.
#[derive(Args, Debug)]
pub struct RunCmd {
    #[command(flatten)]
    pub engine: RunFlags,
    /// A kubeconfig to use; without it the in-cluster config, then $KUBECONFIG.
    #[arg(long, env = "TIDEPOOL_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Where Prometheus metrics are served (/metrics).
    #[arg(long, default_value = "0.0.0.0:9690", value_parser = listen_addr, env = "TIDEPOOL_METRICS_ADDR")]
    pub metrics_addr: SocketAddr,
    /// Where /healthz and /readyz are served.
    #[arg(long, default_value = "0.0.0.0:9691", value_parser = listen_addr, env = "TIDEPOOL_HEALTH_ADDR")]
    pub health_addr: SocketAddr,
    /// Elect a leader among replicas through a Lease (the --leader-elect-* flags); false:
    /// run exactly one replica, which always leads.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, env = "TIDEPOOL_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Only Nodes matching this label selector get pools (`k=v`, `k!=v`, `k`, `!k`,
    /// comma-separated; empty: every Node).
    #[arg(long, default_value = "", value_parser = label_selector, env = "TIDEPOOL_NODE_SELECTOR")]
    pub node_selector: tidepool_operator::index::LabelSelector,
    /// How long the API server may take to answer at start, and each watch's first list
    /// may go without progress (no page and no event) before start-up fails naming what did
    /// not sync (1s to 30 days). A list that keeps advancing may take longer in all.
    #[arg(long, default_value = "60s", value_parser = sync_timeout, env = "TIDEPOOL_SYNC_TIMEOUT")]
    pub sync_timeout: Duration,
    /// Taint a Node `ipam.tidepool.dev/exhausted:NoSchedule` while it cannot get more
    /// addresses (its pool exhausted or at its cap) and pods wait; removed when it can grow
    /// again. Without it, such taints left by an earlier run are removed.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, env = "TIDEPOOL_TAINT_EXHAUSTED_NODES")]
    pub taint_exhausted_nodes: bool,
    /// How long pods on a node may wait for an address while its agent is not ready (no
    /// `AgentReady=True` condition on its IPAMNode — the tidepool-agent pod never started,
    /// or is not ready — or its agent pod is not Ready) before a Warning event `AgentNotReady` on the IPAMNode says so,
    /// naming the pods' count, since when and what to check (1s to 30 days).
    #[arg(long, default_value = "1m", value_parser = agent_ready_grace, env = "TIDEPOOL_AGENT_READY_GRACE")]
    pub agent_ready_grace: Duration,
    /// The label selector of the tidepool-agent pods (`k=v`, `k!=v`, `k`, `!k`,
    /// comma-separated; empty: none). A node whose agent pod is not Ready counts as not
    /// ready for `AgentNotReady` (a crashed agent cannot withdraw its `AgentReady=True`).
    #[arg(long, default_value = tidepool_operator::runtime::DEFAULT_AGENT_POD_SELECTOR, value_parser = label_selector, env = "TIDEPOOL_AGENT_POD_SELECTOR")]
    pub agent_pod_selector: tidepool_operator::index::LabelSelector,
    #[command(flatten)]
    pub leader: LeaderFlags,
}

/// Leader election (Kubernetes' component-base names, client-go's semantics; see
/// [`tidepool_operator::leader`]).
#[derive(Args, Debug, Clone)]
pub struct LeaderFlags {
    /// How long followers wait after they last saw the Lease change before taking it over
    /// (1s to 30 days; more than --leader-elect-renew-deadline).
    #[arg(long = "leader-elect-lease-duration", default_value = "15s", value_parser = lease_duration, env = "TIDEPOOL_LEADER_ELECT_LEASE_DURATION")]
    pub lease_duration: Duration,
    /// How long the leader goes on leading without a successful renewal; at that instant
    /// it stops writing and exits (10ms to 30 days; more than 1.2 × the retry period).
    #[arg(long = "leader-elect-renew-deadline", default_value = "10s", value_parser = election_interval, env = "TIDEPOOL_LEADER_ELECT_RENEW_DEADLINE")]
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew the Lease (10ms to 30 days).
    #[arg(long = "leader-elect-retry-period", default_value = "2s", value_parser = election_interval, env = "TIDEPOOL_LEADER_ELECT_RETRY_PERIOD")]
    pub retry_period: Duration,
    /// The Lease's name.
    #[arg(long = "leader-elect-resource-name", default_value = tidepool_operator::leader::DEFAULT_LEASE_NAME, env = "TIDEPOOL_LEADER_ELECT_RESOURCE_NAME")]
    pub resource_name: String,
    /// The Lease's namespace [default: the pod's, from $POD_NAMESPACE (downward API)].
    #[arg(
        long = "leader-elect-resource-namespace",
        env = "TIDEPOOL_LEADER_ELECT_RESOURCE_NAMESPACE"
    )]
    pub resource_namespace: Option<String>,
}

impl LeaderFlags {
    /// The elector's settings, checked: lease duration > renew deadline > 1.2 × retry period,
    /// and a namespace (the flag, else `env("POD_NAMESPACE")`). The identity is
    /// `$POD_NAME` (else the host name) with a random suffix.
    pub fn config(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<tidepool_operator::leader::LeaderConfig, tidepool_operator::Error> {
        let namespace = self
            .resource_namespace
            .clone()
            .or_else(|| env("POD_NAMESPACE"))
            .unwrap_or_default();
        let config = tidepool_operator::leader::LeaderConfig {
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            name: self.resource_name.clone(),
            namespace,
            identity: tidepool_operator::leader::default_identity(),
        };
        config.validate()?;
        Ok(config)
    }
}

/// A Lease's duration is written in whole seconds: at least one.
fn lease_duration(s: &str) -> Result<Duration, String> {
    interval(s, Duration::from_secs(1))
}

fn election_interval(s: &str) -> Result<Duration, String> {
    interval(s, Duration::from_millis(10))
}

/// `check`'s flags.
#[derive(Args, Debug)]
pub struct CheckCmd {
    /// A kubeconfig to use; without it the in-cluster config, then $KUBECONFIG.
    #[arg(long, env = "TIDEPOOL_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Report format: a table for people, or JSON.
    #[arg(
        long,
        short = 'o',
        value_enum,
        default_value = "table",
        env = "TIDEPOOL_CHECK_OUTPUT"
    )]
    pub output: CheckOutput,
    /// How long the API server may take to answer at start, and may then go silent in the
    /// middle of an answer (1s to 30 days).
    #[arg(long, default_value = "30s", value_parser = sync_timeout, env = "TIDEPOOL_CHECK_TIMEOUT")]
    pub timeout: Duration,
}

/// `check --output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CheckOutput {
    Table,
    Json,
}

fn label_selector(s: &str) -> Result<tidepool_operator::index::LabelSelector, String> {
    s.parse()
        .map_err(|e: tidepool_operator::Error| e.to_string())
}

fn sync_timeout(s: &str) -> Result<Duration, String> {
    interval(s, Duration::from_secs(1))
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Scheduling {
    Priority,
    Fifo,
}

impl RunFlags {
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            watermarks: Watermarks {
                pre_allocate: self.pre_allocate,
                min_allocate: self.min_allocate,
                max_allocate: self.max_allocate,
                max_above_watermark: self.max_above_watermark,
            },
            release: ReleaseConfig {
                enabled: self.release_excess_ips,
                delay: self.excess_ip_release_delay,
            },
            reclaim: ReclaimConfig {
                grace: self.reclaim_grace,
                min_age: self.reclaim_min_age,
            },
            node_reclaim_grace: self.node_reclaim_grace,
            backoff: BackoffConfig {
                min: self.backoff_min,
                max: self.backoff_max,
                reset_after: self.backoff_reset_after,
                ..BackoffConfig::default()
            },
            resync_interval: self.resync_interval,
            parallel_workers: self.parallel_alloc_workers as usize,
            per_node_metrics: self.per_node_metrics,
            scarcity: ScarcityConfig {
                enabled: self.scarcity_handling,
                enter: self.scarcity_enter,
                exit: self.scarcity_exit,
                min_duration: self.scarcity_min_duration,
                release_delay: self.scarcity_release_delay,
            },
            ..EngineConfig::default()
        }
    }

    /// The exporter's idle timeout for gauges: with --per-node-metrics, 3 resync intervals
    /// (every live series is set again at each resync, so only a deleted node's expire);
    /// without, none.
    pub fn gauge_idle_timeout(&self) -> Option<Duration> {
        self.per_node_metrics.then(|| 3 * self.resync_interval)
    }

    pub fn scheduling(&self) -> SchedulingMode {
        match self.scheduling {
            Scheduling::Priority => SchedulingMode::Priority,
            Scheduling::Fifo => SchedulingMode::Fifo,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum WarmUpArg {
    None,
    Steady,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum SourceArg {
    Memory,
    SimCloud,
    ClusterPool,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ReportFormat {
    Text,
    Json,
}

/// Defaults of the flags a scenario's `start` and `duration` may also set (a flag given
/// explicitly wins over the scenario, which wins over these).
pub const DEFAULT_NODES: u32 = 200;
pub const DEFAULT_PODS_PER_NODE: u32 = 30;
pub const DEFAULT_CHURN: f64 = 2.0;
pub const DEFAULT_CRASH_RATE: f64 = 0.05;
pub const DEFAULT_NODE_CHURN: f64 = 1.0;
pub const DEFAULT_DURATION: Duration = Duration::from_secs(600);
/// Seeds `--compare-scheduling` runs without `--seeds`.
pub const DEFAULT_COMPARE_SEEDS: u64 = 20;

#[derive(Args, Debug, Clone)]
pub struct SimulateFlags {
    /// IP source calls per second (0.001 to 1000000): the simulated cloud's or the
    /// in-memory source's budget (`run` serves cluster-pool, whose calls are API server
    /// writes under --kube-api-qps).
    #[arg(long, default_value_t = 4.0, value_parser = positive_rate, env = "TIDEPOOL_SIM_API_QPS")]
    pub api_qps: f64,
    /// IP source burst (1 to 1000000).
    #[arg(long, default_value_t = 20, value_parser = burst, env = "TIDEPOOL_SIM_API_BURST")]
    pub api_burst: u32,
    /// Nodes at the start [default: 200, or the scenario's start.nodes].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), env = "TIDEPOOL_SIM_NODES")]
    pub nodes: Option<u32>,
    /// Pods scheduled to each node at the start [default: 30, or the scenario's].
    #[arg(long, env = "TIDEPOOL_SIM_PODS_PER_NODE")]
    pub pods_per_node: Option<u32>,
    /// Pod replacements per node per minute, 0 to 60 [default: 2, or the scenario's].
    #[arg(long, value_parser = churn_rate, env = "TIDEPOOL_SIM_CHURN")]
    pub churn: Option<f64>,
    /// Share of pod deletions that never release their address [default: 0.05, or the
    /// scenario's].
    #[arg(long, value_parser = share, env = "TIDEPOOL_SIM_CRASH_RATE")]
    pub crash_rate: Option<f64>,
    /// Node losses per hour, 0 to 3600 [default: 1, or the scenario's].
    #[arg(long, value_parser = node_churn_rate, env = "TIDEPOOL_SIM_NODE_CHURN")]
    pub node_churn: Option<f64>,
    /// The active period, a drain tail follows [default: 10m, or the scenario's].
    #[arg(long, value_parser = duration, env = "TIDEPOOL_SIM_DURATION")]
    pub duration: Option<Duration>,
    /// `steady`: run the workload for one drain tail first and measure from there (pods
    /// still waiting then are counted, not measured); `none`: measure from the start.
    #[arg(long, value_enum, default_value = "none", env = "TIDEPOOL_SIM_WARM_UP")]
    pub warm_up: WarmUpArg,
    /// How long the run may go on past the drain tail while work is still queued (a slow
    /// budget, a retry, a lost node inside its grace); what is still missing then counts as
    /// lost.
    #[arg(long, default_value = "1h", value_parser = duration, env = "TIDEPOOL_SIM_DRAIN_LIMIT")]
    pub drain_limit: Duration,
    /// The seed of every random choice: the same seed gives the same run.
    #[arg(
        long,
        default_value_t = 1,
        conflicts_with = "seeds",
        env = "TIDEPOOL_SIM_SEED"
    )]
    pub seed: u64,
    /// Timed phases that change the workload, faults or watermarks during the run (YAML;
    /// see docs/simulate.md and scenarios/).
    #[arg(long, env = "TIDEPOOL_SIM_SCENARIO")]
    pub scenario: Option<PathBuf>,
    /// Run once per seed and summarize: `1..200` (inclusive), `3,5,8` or one number.
    #[arg(long, value_parser = seeds, env = "TIDEPOOL_SIM_SEEDS")]
    pub seeds: Option<Seeds>,
    /// Run the workload under priority and under FIFO admission for each seed (--seeds,
    /// default 1..20) and compare pod waits.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, env = "TIDEPOOL_SIM_COMPARE_SCHEDULING")]
    pub compare_scheduling: bool,
    /// Runs at once with --seeds or --compare-scheduling, 1 to 256 [default: the CPU count].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256), env = "TIDEPOOL_SIM_JOBS")]
    pub jobs: Option<u32>,
    /// The report for people (`text`) or for programs (`json`).
    #[arg(long, value_enum, default_value = "text", env = "TIDEPOOL_SIM_REPORT")]
    pub report: ReportFormat,
    /// Add per-node details to the report.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, env = "TIDEPOOL_SIM_REPORT_NODES")]
    pub report_nodes: bool,
    /// Exit 1 when pods never got an address (the report's `pods.never_served` above 0;
    /// with --seeds, in any run).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, conflicts_with = "compare_scheduling", env = "TIDEPOOL_SIM_FAIL_ON_UNSERVED")]
    pub fail_on_unserved: bool,
    /// Run at wall-clock speed (and serve /metrics on --metrics-addr).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, env = "TIDEPOOL_SIM_REALTIME")]
    pub realtime: bool,
    /// Where --realtime serves /metrics.
    #[arg(long, default_value = "0.0.0.0:9690", value_parser = listen_addr, env = "TIDEPOOL_METRICS_ADDR")]
    pub metrics_addr: SocketAddr,
    /// Allocatable pods of each simulated node.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..), env = "TIDEPOOL_SIM_MAX_PODS")]
    pub max_pods: u32,
    /// Give every pod an IPv4 and an IPv6 address.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, env = "TIDEPOOL_SIM_DUAL_STACK")]
    pub dual_stack: bool,
    /// Addresses per family in the in-memory source.
    #[arg(long, default_value_t = 1 << 24, value_parser = clap::value_parser!(u64).range(1..), env = "TIDEPOOL_SIM_SOURCE_CAPACITY")]
    pub source_capacity: u64,
    /// Where addresses come from: the in-memory per-address source, the ENI-like cloud, or
    /// the cluster pool (blocks of --pool-cidr claimed as IPAMBlock objects).
    #[arg(
        long,
        value_enum,
        default_value = "memory",
        env = "TIDEPOOL_SIM_SOURCE"
    )]
    pub source: SourceArg,
    /// sim-cloud: the nodes' instance type (m5.large, m5.4xlarge, m4.xlarge, t2.xlarge,
    /// c3.xlarge, m4.large).
    #[arg(long, default_value = "m5.4xlarge", env = "TIDEPOOL_SIM_INSTANCE_TYPE")]
    pub instance_type: String,
    /// sim-cloud: prefix length of each subnet (one subnet per 1,000 nodes).
    #[arg(long, default_value_t = 16, env = "TIDEPOOL_SIM_SUBNET_SIZE")]
    pub subnet_size: u8,
    /// cluster-pool: a CIDR of the pool (repeatable; IPv4 and/or IPv6).
    #[arg(
        long = "pool-cidr",
        env = "TIDEPOOL_SIM_POOL_CIDR",
        value_delimiter = ','
    )]
    pub pool_cidrs: Vec<String>,
    /// cluster-pool: prefix length of each IPv4 block granted to a node (/32: per address).
    #[arg(long, default_value_t = 28, env = "TIDEPOOL_SIM_BLOCK_SIZE")]
    pub block_size: u8,
    /// cluster-pool: prefix length of each IPv6 block granted to a node (/128: per address).
    #[arg(long, default_value_t = 124, env = "TIDEPOOL_SIM_BLOCK_SIZE_V6")]
    pub block_size_v6: u8,
    /// Latency of each mutating source call (cluster-pool: of each block write).
    #[arg(long, default_value = "0s", value_parser = duration, env = "TIDEPOOL_SIM_CLOUD_LATENCY")]
    pub cloud_latency: Duration,
    /// sim-cloud: the cloud's own rate limit (calls per second, 0.001 to 1000000); unlimited
    /// if not given.
    #[arg(long, value_parser = positive_rate, env = "TIDEPOOL_SIM_CLOUD_QPS")]
    pub cloud_qps: Option<f64>,
    /// sim-cloud: the cloud's burst, 1 to 1000000 (defaults to --cloud-qps).
    #[arg(long, value_parser = burst, env = "TIDEPOOL_SIM_CLOUD_BURST")]
    pub cloud_burst: Option<u32>,
    /// Share of source calls that fail (transient).
    #[arg(long, default_value_t = 0.0, value_parser = share, env = "TIDEPOOL_SIM_FAULT_RATE")]
    pub fault_rate: f64,
    #[command(flatten)]
    pub run: RunFlags,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The flags of `c` and of its subcommands that `--help` shows without a word.
    fn without_help(c: &clap::Command) -> Vec<String> {
        let own = c
            .get_arguments()
            .filter(|a| a.get_help().is_none() && !a.is_hide_set());
        let mut out: Vec<String> = own
            .map(|a| format!("{} --{}", c.get_name(), a.get_id()))
            .collect();
        for sub in c.get_subcommands() {
            out.extend(without_help(sub));
        }
        out
    }

    /// The flags of `c` and of its subcommands whose environment variable is not their
    /// name: `TIDEPOOL_<FLAG>`, or for a subcommand's own `TIDEPOOL_SIM_<FLAG>` (simulate)
    /// and `TIDEPOOL_CHECK_<FLAG>` (check).
    fn env_not_named_as_flag(c: &clap::Command) -> Vec<String> {
        let own = c
            .get_arguments()
            .filter_map(|a| Some((a.get_long()?, a.get_env()?.to_str()?)));
        let mut out: Vec<String> = own
            .filter(|(long, env)| {
                let flag = long.to_uppercase().replace('-', "_");
                let sub = match c.get_name() {
                    "simulate" => "SIM_",
                    "check" => "CHECK_",
                    _ => "",
                };
                *env != format!("TIDEPOOL_{flag}") && *env != format!("TIDEPOOL_{sub}{flag}")
            })
            .map(|(long, env)| format!("{} --{long} {env}", c.get_name()))
            .collect();
        for sub in c.get_subcommands() {
            out.extend(env_not_named_as_flag(sub));
        }
        out
    }

    #[test]
    fn every_env_name_is_its_flag_name() {
        assert_eq!(env_not_named_as_flag(&Cli::command()), Vec::<String>::new());
    }

    /// A listen address may be Go's `:PORT` (every interface), on `run` and `simulate`.
    #[test]
    fn listen_addresses_take_a_port_alone() {
        let c = Cli::try_parse_from([
            "t",
            "run",
            "--metrics-addr",
            ":19690",
            "--health-addr=:19691",
        ])
        .unwrap();
        let Command::Run(r) = c.command else {
            panic!("run expected")
        };
        assert_eq!(r.metrics_addr, "0.0.0.0:19690".parse().unwrap());
        assert_eq!(r.health_addr, "0.0.0.0:19691".parse().unwrap());
        let e = Cli::try_parse_from(["t", "simulate", "--metrics-addr", "9690"]).unwrap_err();
        assert!(e.to_string().contains(":PORT"), "{e}");
    }

    /// `run` offers no flag it cannot use: the IP source's budget is simulate's (the
    /// cluster pool's calls are API server writes, under --kube-api-qps).
    #[test]
    fn run_offers_no_source_budget() {
        for flag in ["--api-qps", "--api-burst"] {
            let e = Cli::try_parse_from(["t", "run", flag, "4"]).unwrap_err();
            assert!(e.to_string().contains(flag), "{e}");
            assert!(Cli::try_parse_from(["t", "simulate", flag, "4"]).is_ok());
        }
    }

    #[test]
    fn every_flag_has_help_text() {
        assert_eq!(without_help(&Cli::command()), Vec::<String>::new());
    }

    #[test]
    fn booleans_accept_both_forms() {
        let c = Cli::try_parse_from([
            "t",
            "simulate",
            "--release-excess-ips=false",
            "--report-nodes",
        ])
        .unwrap();
        let Command::Simulate(s) = c.command else {
            panic!("simulate expected")
        };
        assert!(!s.run.release_excess_ips);
        assert!(s.report_nodes);
        let c = Cli::try_parse_from(["t", "simulate", "--release-excess-ips"]).unwrap();
        let Command::Simulate(s) = c.command else {
            panic!("simulate expected")
        };
        assert!(s.run.release_excess_ips);
    }

    /// --per-node-metrics (default off) reaches the engine and gives the exporter's gauges
    /// an idle timeout of 3 resync intervals, on `run` and on `simulate`.
    #[test]
    fn per_node_metrics_is_off_by_default_and_sets_the_gauge_idle_timeout() {
        let c = Cli::try_parse_from(["t", "simulate"]).unwrap();
        let Command::Simulate(s) = c.command else {
            panic!("simulate expected")
        };
        assert!(!s.run.engine().per_node_metrics);
        assert_eq!(s.run.gauge_idle_timeout(), None);
        let c = Cli::try_parse_from([
            "t",
            "simulate",
            "--per-node-metrics",
            "--resync-interval=20s",
        ])
        .unwrap();
        let Command::Simulate(s) = c.command else {
            panic!("simulate expected")
        };
        assert!(s.run.engine().per_node_metrics);
        assert_eq!(s.run.gauge_idle_timeout(), Some(Duration::from_secs(60)));
        let c = Cli::try_parse_from(["t", "run", "--per-node-metrics=true"]).unwrap();
        let Command::Run(r) = c.command else {
            panic!("run expected")
        };
        assert!(r.engine.engine().per_node_metrics);
        assert_eq!(
            r.engine.gauge_idle_timeout(),
            Some(Duration::from_secs(180))
        );
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (flag, value) in [
            ("--api-qps", "0"),
            ("--kube-api-qps", "-1"),
            ("--crash-rate", "1.5"),
            ("--duration", "ten"),
            ("--nodes", "0"),
            ("--churn", "NaN"),
        ] {
            let arg = format!("{flag}={value}");
            let err = Cli::try_parse_from(["t", "simulate", arg.as_str()])
                .unwrap_err()
                .to_string();
            assert!(err.contains(flag), "{flag}: {err}");
        }
    }

    /// Parses `simulate` with `args` and builds its configuration: the error, if any.
    fn simulate_config(args: &[&str]) -> Result<(), String> {
        let mut all = vec!["t", "simulate"];
        all.extend_from_slice(args);
        let Command::Simulate(s) = Cli::try_parse_from(all).unwrap().command else {
            panic!("simulate expected")
        };
        crate::simulate::config(&s)
            .map(|_| ())
            .map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn sim_cloud_flags_are_checked_before_anything_runs() {
        let parse = |args: &[&str]| {
            let mut all = vec!["--source", "sim-cloud"];
            all.extend_from_slice(args);
            simulate_config(&all)
        };
        assert!(parse(&[]).is_ok());
        let e = parse(&["--instance-type", "x9.huge"]).unwrap_err();
        assert!(
            e.contains("--instance-type x9.huge") && e.contains("m5.large"),
            "{e}"
        );
        let e = parse(&["--instance-type", "m5.large"]).unwrap_err();
        assert!(e.contains("pods-per-node"), "{e}");
        let e = parse(&["--cloud-burst", "5"]).unwrap_err();
        assert!(e.contains("--cloud-qps"), "{e}");
        let e = parse(&["--subnet-size", "4"]).unwrap_err();
        assert!(e.contains("subnet"), "{e}");
        let e = parse(&["--dual-stack"]).unwrap_err();
        assert!(e.contains("IPv4 only"), "{e}");
    }

    #[test]
    fn cluster_pool_flags_are_checked_before_anything_runs() {
        let parse = simulate_config;
        let cp = |args: &[&str]| {
            let mut all = vec!["--source", "cluster-pool"];
            all.extend_from_slice(args);
            parse(&all)
        };
        assert!(cp(&["--pool-cidr", "10.0.0.0/16"]).is_ok());
        assert!(cp(&["--pool-cidr", "10.0.0.0/16,fd00::/64", "--dual-stack"]).is_ok());
        assert!(cp(&["--pool-cidr", "10.0.0.0/16", "--pool-cidr", "10.1.0.0/16"]).is_ok());
        let e = cp(&[]).unwrap_err();
        assert!(e.contains("--pool-cidr"), "{e}");
        let e = cp(&["--pool-cidr", "10.0.0.300/16"]).unwrap_err();
        assert!(
            e.contains("pool-cidr") && e.contains("10.0.0.300/16"),
            "{e}"
        );
        let e = cp(&["--pool-cidr", "10.0.0.1/16"]).unwrap_err();
        assert!(e.contains("host bits") && e.contains("10.0.0.0/16"), "{e}");
        let e = cp(&["--pool-cidr", "10.0.0.0/16", "--block-size", "12"]).unwrap_err();
        assert!(e.contains("block-size") && e.contains("/12"), "{e}");
        let e = cp(&["--pool-cidr", "10.0.0.0/16", "--block-size", "33"]).unwrap_err();
        assert!(e.contains("block-size") && e.contains("/33"), "{e}");
        let e = cp(&[
            "--pool-cidr",
            "10.0.0.0/16,fd00::/64",
            "--dual-stack",
            "--block-size-v6",
            "60",
        ])
        .unwrap_err();
        assert!(e.contains("block-size-v6"), "{e}");
        let e = cp(&["--pool-cidr", "10.0.0.0/16", "--dual-stack"]).unwrap_err();
        assert!(e.contains("pool-cidr") && e.contains("ipv6"), "{e}");
        let e = cp(&["--pool-cidr", "10.0.0.0/16,10.0.128.0/17"]).unwrap_err();
        assert!(e.contains("overlap"), "{e}");
        let e = parse(&["--pool-cidr", "10.0.0.0/16"]).unwrap_err();
        assert!(e.contains("--pool-cidr needs --source cluster-pool"), "{e}");
        let e = parse(&["--nodes", "200000"]).unwrap_err();
        assert!(e.contains("nodes") && e.contains("supports up to"), "{e}");
    }

    #[test]
    fn defaults_match_the_design() {
        let c = Cli::try_parse_from(["t", "simulate"]).unwrap();
        let Command::Simulate(s) = c.command else {
            panic!("simulate expected")
        };
        let e = s.run.engine();
        assert_eq!(e.watermarks.pre_allocate, 8);
        assert_eq!(e.release.delay, Duration::from_secs(180));
        assert_eq!(e.reclaim.grace, Duration::from_secs(30));
        assert_eq!(e.reclaim.min_age, Duration::from_secs(120));
        assert_eq!(e.node_reclaim_grace, Duration::from_secs(300));
        assert_eq!((s.api_qps, s.api_burst), (4.0, 20));
        assert_eq!((s.run.kube_api_qps, s.run.kube_api_burst), (50.0, 100));
        let cfg = crate::simulate::config(&s).unwrap();
        assert_eq!((cfg.nodes, cfg.pods_per_node, s.seed), (200, 30, 1));
        assert_eq!(cfg.duration, Duration::from_secs(600));
        assert_eq!(
            (cfg.churn, cfg.crash_rate, cfg.node_churn),
            (2.0, 0.05, 1.0)
        );
    }

    fn leader_flags(args: &[&str]) -> Result<LeaderFlags, String> {
        let mut all = vec!["t", "run"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).map_err(|e| e.to_string())?.command {
            Command::Run(r) => Ok(r.leader),
            _ => panic!("run expected"),
        }
    }

    /// The settings `args` give, with `POD_NAMESPACE` as `pod_ns`.
    fn leader_config(
        args: &[&str],
        pod_ns: Option<&str>,
    ) -> Result<tidepool_operator::leader::LeaderConfig, String> {
        let env = |k: &str| {
            (k == "POD_NAMESPACE")
                .then(|| pod_ns.map(String::from))
                .flatten()
        };
        leader_flags(args)?.config(env).map_err(|e| e.to_string())
    }

    #[test]
    fn leader_election_defaults_are_client_gos() {
        let c = leader_config(&[], Some("tidepool")).unwrap();
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        assert_eq!(
            (c.name.as_str(), c.namespace.as_str()),
            ("tidepool-operator", "tidepool")
        );
        assert!(!c.identity.is_empty());
        let c = leader_config(
            &[
                "--leader-elect-resource-namespace",
                "ops",
                "--leader-elect-resource-name",
                "x",
            ],
            Some("tidepool"),
        )
        .unwrap();
        assert_eq!(
            (c.name.as_str(), c.namespace.as_str()),
            ("x", "ops"),
            "the flag wins"
        );
    }

    /// Each rule of lease duration > renew deadline > 1.2 × retry period fails at start,
    /// naming the flags; so does a missing namespace.
    #[test]
    fn leader_election_flags_that_do_not_fit_are_refused_naming_them() {
        let refused = |args: &[&str], pod_ns: Option<&str>, says: &[&str]| {
            let e = leader_config(args, pod_ns).unwrap_err();
            for s in says {
                assert!(e.contains(s), "{args:?}: {e}");
            }
        };
        let ns = Some("tidepool");
        refused(
            &["--leader-elect-lease-duration", "10s"],
            ns,
            &[
                "--leader-elect-lease-duration (10s)",
                "--leader-elect-renew-deadline (10s)",
            ],
        );
        refused(
            &["--leader-elect-renew-deadline", "2400ms"],
            ns,
            &[
                "--leader-elect-renew-deadline (2s 400ms)",
                "1.2 × --leader-elect-retry-period (2s)",
            ],
        );
        refused(
            &[],
            None,
            &["--leader-elect-resource-namespace", "POD_NAMESPACE"],
        );
        refused(
            &["--leader-elect-renew-deadline", "14500ms"],
            ns,
            &["--leader-elect-lease-duration (15s)", "by more than 1s"],
        );
        refused(
            &["--leader-elect-lease-duration", "500ms"],
            ns,
            &["--leader-elect-lease-duration", "at least 1s"],
        );
        refused(
            &["--leader-elect-retry-period", "1ms"],
            ns,
            &["--leader-elect-retry-period", "at least 10ms"],
        );
        // the short durations the tests use are fine
        let short = [
            "--leader-elect-lease-duration",
            "2s",
            "--leader-elect-renew-deadline",
            "1s",
            "--leader-elect-retry-period",
            "250ms",
        ];
        assert!(leader_config(&short, ns).is_ok());
    }

    fn simulate_flags(args: &[&str]) -> Result<SimulateFlags, String> {
        let mut all = vec!["t", "simulate"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).map_err(|e| e.to_string())?.command {
            Command::Simulate(s) => Ok(*s),
            _ => panic!("simulate expected"),
        }
    }

    fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("tidepool-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn seeds_lists_and_ranges() {
        assert_eq!(seeds("1..200").unwrap().0.len(), 200);
        assert_eq!(seeds("1..=3").unwrap().0, vec![1, 2, 3]);
        assert_eq!(seeds("3,5, 8").unwrap().0, vec![3, 5, 8]);
        assert_eq!(seeds("7").unwrap().0, vec![7]);
        for bad in ["", "5..1", "a..b", "1..x", "-1"] {
            assert!(seeds(bad).is_err(), "{bad}");
        }
        let e = simulate_flags(&["--seeds", "1..3", "--seed", "4"]).unwrap_err();
        assert!(e.contains("--seed"), "{e}");
        let e = simulate_flags(&["--seeds", "x"]).unwrap_err();
        assert!(e.contains("--seeds"), "{e}");
    }

    /// Any block size the pool allows is accepted — a /64 per node, Kubernetes' usual IPv6
    /// mask, panicked and hung before (issue 11) — and a block larger than its pool is
    /// refused naming the flag.
    #[test]
    fn every_block_size_the_pool_allows_is_accepted() {
        let cfg = |v6: &str, v4: &str| {
            let f = simulate_flags(&[
                "--source",
                "cluster-pool",
                "--pool-cidr",
                "10.0.0.0/8,fd00::/64",
                "--dual-stack",
                "--block-size-v6",
                v6,
                "--block-size",
                v4,
            ])
            .unwrap();
            crate::simulate::config(&f)
                .map(|_| ())
                .map_err(|e| format!("{e:#}"))
        };
        for v6 in ["64", "96", "111", "128"] {
            assert!(cfg(v6, "28").is_ok(), "{v6}: {:?}", cfg(v6, "28"));
        }
        assert!(cfg("124", "8").is_ok());
        let e = cfg("63", "28").unwrap_err();
        assert!(e.contains("63"), "{e}");
        let e = cfg("124", "7").unwrap_err();
        assert!(e.contains("7"), "{e}");
    }

    /// The cluster pool's families are the pods' families: IPv6-only, IPv4-only and
    /// dual-stack pools; --dual-stack insists on both.
    #[test]
    fn cluster_pool_families_come_from_the_pool() {
        use tidepool_ipam::Family::{V4, V6};
        let families = |args: &[&str]| {
            let mut a = vec!["--source", "cluster-pool"];
            a.extend_from_slice(args);
            crate::simulate::config(&simulate_flags(&a).unwrap()).map(|c| c.world.families)
        };
        assert_eq!(families(&["--pool-cidr", "fd00:10::/64"]).unwrap(), [V6]);
        assert_eq!(families(&["--pool-cidr", "10.0.0.0/16"]).unwrap(), [V4]);
        let both = ["--pool-cidr", "10.0.0.0/16,fd00::/64"];
        assert_eq!(families(&both).unwrap(), [V4, V6]);
        let mut dual = both.to_vec();
        dual.push("--dual-stack");
        assert_eq!(families(&dual).unwrap(), [V4, V6]);
        let e = families(&["--pool-cidr", "fd00:10::/64", "--dual-stack"]).unwrap_err();
        assert!(format!("{e:#}").contains("no ipv4 CIDR"), "{e:#}");
        // the memory source stays IPv4 unless --dual-stack
        let cfg = crate::simulate::config(&simulate_flags(&[]).unwrap()).unwrap();
        assert_eq!(cfg.world.families, [V4]);
    }

    /// Sizes and rates have an upper bound, intervals a floor; each refusal names the flag
    /// and the bound, and repeats the value as written (issue 11).
    #[test]
    fn sizes_rates_and_intervals_are_bounded() {
        let refused = |args: &[&str], says: &str| {
            let e = simulate_flags(args).unwrap_err();
            assert!(e.contains(args[0]) && e.contains(says), "{args:?}: {e}");
        };
        refused(&["--parallel-alloc-workers", "4294967295"], "10000");
        refused(&["--churn", "1e12"], "between 0 and 60");
        refused(&["--node-churn", "3601"], "between 0 and 3600");
        refused(&["--resync-interval", "1ns"], "at least 1s");
        refused(&["--backoff-min", "1ms"], "at least 10ms");
        refused(&["--duration", "277778h"], "at most 30days");
        refused(&["--api-burst", "1000001"], "1000000");
        refused(&["--jobs", "257"], "256");
        let e = simulate_flags(&["--api-qps", "1e-300"]).unwrap_err();
        assert!(
            e.contains("'1e-300'") && e.contains("between 0.001 and 1000000"),
            "{e}"
        );
        assert!(!e.contains("0.0000000000"), "no 300-digit echo: {e}");
        // the limits hold
        assert!(simulate_flags(&["--churn", "60", "--resync-interval", "1s"]).is_ok());
    }

    /// The seed limit counts the whole list, not each range.
    #[test]
    fn the_seed_limit_holds_for_the_whole_list() {
        assert_eq!(seeds("1..100000").unwrap().0.len(), 100_000);
        let twice = "0..99999,".repeat(2) + "1";
        assert!(
            seeds(&twice)
                .unwrap_err()
                .contains("at most 100000 seeds in all")
        );
    }

    #[test]
    fn flags_given_win_over_the_scenario_which_wins_over_defaults() {
        let path = temp_file(
            "precedence.yaml",
            "duration: 5m\nstart: {nodes: 7, pods_per_node: 3, churn: 0}\nphases:\n- kind: churn\n  at: 1m\n  churn: 1\n",
        );
        let p = path.to_str().unwrap();
        let cfg = crate::simulate::config(&simulate_flags(&["--scenario", p]).unwrap()).unwrap();
        assert_eq!((cfg.nodes, cfg.pods_per_node, cfg.churn), (7, 3, 0.0));
        assert_eq!(cfg.duration, Duration::from_secs(300));
        assert_eq!(cfg.crash_rate, 0.05);
        let cfg = crate::simulate::config(
            &simulate_flags(&["--scenario", p, "--nodes", "9", "--duration", "6m"]).unwrap(),
        )
        .unwrap();
        assert_eq!((cfg.nodes, cfg.pods_per_node), (9, 3));
        assert_eq!(cfg.duration, Duration::from_secs(360));
        // a run too short for the phases is refused, naming the phase
        let e = crate::simulate::config(
            &simulate_flags(&["--scenario", p, "--duration", "1m"]).unwrap(),
        )
        .map(|_| ())
        .unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains(p) && e.contains("phase #1 (churn)"), "{e}");
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn bad_scenarios_fail_before_anything_runs() {
        let cases = [
            (
                "unknown.yaml",
                "phases:\n- kind: meteor\n  at: 1m\n",
                "phase #1 (meteor)",
            ),
            (
                "field.yaml",
                "phases:\n- kind: node-loss\n  at: 1m\n  nodes: 1\n  podz: 3\n",
                "podz",
            ),
            (
                "dur.yaml",
                "phases:\n- kind: node-loss\n  at: soon\n  nodes: 1\n",
                "bad duration",
            ),
            ("yaml.yaml", "phases: [ {kind: churn\n", "yaml.yaml"),
            (
                "many.yaml",
                "phases:\n- kind: node-loss\n  at: 1m\n  nodes: 500\n",
                "lost 500 nodes of the cluster, which has 200 by then",
            ),
        ];
        for (name, text, want) in cases {
            let path = temp_file(name, text);
            let f = simulate_flags(&["--scenario", path.to_str().unwrap()]).unwrap();
            let e = format!("{:#}", crate::simulate::config(&f).map(|_| ()).unwrap_err());
            assert!(e.contains(want) && e.contains(name), "{name}: {e}");
            let _ = std::fs::remove_file(path);
        }
        let f = simulate_flags(&["--scenario", "/nonexistent/x.yaml"]).unwrap();
        let e = format!("{:#}", crate::simulate::config(&f).map(|_| ()).unwrap_err());
        assert!(
            e.contains("/nonexistent/x.yaml") && e.contains("cannot read"),
            "{e}"
        );
    }

    #[test]
    fn impossible_run_combinations_are_refused() {
        let f = simulate_flags(&["--realtime", "--seeds", "1..2"]).unwrap();
        let e = crate::simulate::run(&f).unwrap_err().to_string();
        assert!(e.contains("--realtime"), "{e}");
        let f = simulate_flags(&["--realtime", "--compare-scheduling"]).unwrap();
        let e = crate::simulate::run(&f).unwrap_err().to_string();
        assert!(e.contains("--compare-scheduling"), "{e}");
        let f = simulate_flags(&["--jobs", "2"]).unwrap();
        let e = crate::simulate::run(&f).unwrap_err().to_string();
        assert!(e.contains("--jobs"), "{e}");
    }
}
