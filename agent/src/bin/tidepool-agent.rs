//! `tidepool-agent`: the node agent (one per node, a DaemonSet). Flags to settings, the
//! client, logging, metrics, probes and signals; the agent itself is `tidepool_agent::run`.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{ArgAction, Parser, ValueEnum};
use ipnet::IpNet;
use tidepool_agent::run::{Settings, run};
use tidepool_agent::serve::PodNetworks;
use tidepool_agent::{masq, reconcile, routes};
use tidepool_api::flags::{count_within, duration_within, listen_addr};
use tidepool_api::preflight::{self, Unmet};
use tidepool_metrics::probes::{self, Readiness};

/// The tidepool node agent: hands this node's pods their addresses from its pool.
#[derive(Parser, Debug)]
#[command(name = "tidepool-agent", version)]
struct Flags {
    /// This node's name (the downward API's spec.nodeName).
    #[arg(long, env = "TIDEPOOL_NODE_NAME")]
    node_name: String,
    /// A kubeconfig to use; without it the in-cluster config, then $KUBECONFIG.
    #[arg(long, env = "TIDEPOOL_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Override: the pod networks, comma-separated or repeated, instead of the valid
    /// IPPools' CIDRs (the default, followed at runtime). Each pod gets its network's prefix
    /// length and first host address as gateway (the ptp result shape).
    #[arg(
        long = "pod-network",
        value_delimiter = ',',
        env = "TIDEPOOL_POD_NETWORK"
    )]
    pod_networks: Vec<IpNet>,
    /// The unix socket the CNI plugin reaches the agent on.
    #[arg(
        long,
        default_value = "/run/tidepool/agent.sock",
        env = "TIDEPOOL_SOCKET"
    )]
    socket: PathBuf,
    /// The checkpoint's directory (locked: one agent per node).
    #[arg(long, default_value = "/var/lib/tidepool", env = "TIDEPOOL_STATE_DIR")]
    state_dir: PathBuf,
    /// Where the plugin spools DELs while the agent is down [default: <state-dir>/spool].
    #[arg(long, env = "TIDEPOOL_SPOOL_DIR")]
    spool_dir: Option<PathBuf>,
    /// The marker of this boot's first restore, on tmpfs (the plugin's STATUS reads it).
    #[arg(
        long,
        default_value = "/run/tidepool/restored",
        env = "TIDEPOOL_RESTORED_MARKER"
    )]
    restored_marker: PathBuf,
    /// How long a freed address stays out of use (0s to 1h; equal to the operator's).
    #[arg(long, default_value = "30s", value_parser = reuse_cooldown, env = "TIDEPOOL_REUSE_COOLDOWN")]
    reuse_cooldown: Duration,
    /// How long to wait at start for this node's IPAMNode (the operator creates it; 1s to
    /// 1h).
    #[arg(long, default_value = "5m", value_parser = period, env = "TIDEPOOL_NODE_WAIT")]
    node_wait: Duration,
    /// Where Prometheus metrics are served (/metrics). Loopback by default: the DaemonSet
    /// runs on the host network, so a wildcard address would expose it on the node's
    /// addresses.
    #[arg(long, default_value = "127.0.0.1:9692", value_parser = listen_addr, env = "TIDEPOOL_METRICS_ADDR")]
    metrics_addr: SocketAddr,
    /// Where /healthz (the process serves) and /readyz (restored and serving the socket) are
    /// served [default: not served].
    #[arg(long, value_parser = listen_addr, env = "TIDEPOOL_HEALTH_ADDR")]
    health_addr: Option<SocketAddr>,
    /// The runtime's network namespace directory as the agent sees it (reconcile's
    /// evidence: missing or empty, reconcile frees nothing).
    #[arg(long, default_value = reconcile::DEFAULT_NETNS_DIR, env = "TIDEPOOL_NETNS_DIR")]
    netns_dir: PathBuf,
    /// libcni's result cache directory as the agent sees it (reconcile's evidence).
    #[arg(long, default_value = reconcile::DEFAULT_CNI_CACHE_DIR, env = "TIDEPOOL_CNI_CACHE_DIR")]
    cni_cache_dir: PathBuf,
    /// How often reconcile runs (an allocation is freed at its second cycle as a candidate;
    /// 1s to 1h).
    #[arg(long, default_value = "30s", value_parser = period, env = "TIDEPOOL_RECONCILE_INTERVAL")]
    reconcile_interval: Duration,
    /// The most allocations one reconcile cycle frees (1 to 10000).
    #[arg(long, default_value_t = reconcile::DEFAULT_MAX_FREES, value_parser = max_frees, env = "TIDEPOOL_RECONCILE_MAX_FREES")]
    reconcile_max_frees: usize,
    /// Install a route to every other node's IPAMBlocks via that node's InternalIP (host-gw
    /// style, for nodes on one L2 segment; marked `proto 0x7d`, only those touched). Off
    /// when the network already routes the blocks. Needs the host network and CAP_NET_ADMIN.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, env = "TIDEPOOL_NODE_ROUTES")]
    node_routes: bool,
    /// How often --node-routes checks its routes without a change (repairs removed ones; 1s
    /// to 1h).
    #[arg(long, default_value = "30s", value_parser = period, env = "TIDEPOOL_NODE_ROUTES_INTERVAL")]
    node_routes_interval: Duration,
    /// Masquerade pods' traffic to destinations outside every pool CIDR and outside
    /// --non-masquerade-cidrs (ip-masq-agent's rule: chain TIDEPOOL-MASQ in the nat table,
    /// rewritten with iptables-restore). Pod-to-pod traffic keeps its source. Needs the host
    /// network, CAP_NET_ADMIN and iptables (components/cni-install).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, env = "TIDEPOOL_MASQUERADE")]
    masquerade: bool,
    /// Destinations --masquerade leaves alone, comma-separated: the node subnet and the
    /// service CIDR (the pool CIDRs always are).
    #[arg(long, value_delimiter = ',', env = "TIDEPOOL_NON_MASQUERADE_CIDRS")]
    non_masquerade_cidrs: Vec<IpNet>,
    /// Log filter (tracing's EnvFilter syntax).
    #[arg(long, default_value = "info", env = "TIDEPOOL_LOG_LEVEL")]
    log_level: String,
    /// Log format: text (for people) or json (one object per line, for log pipelines).
    #[arg(long, value_enum, default_value = "text", env = "TIDEPOOL_LOG_FORMAT")]
    log_format: LogFormat,
}

// Every duration and count has a floor and a ceiling, bounded as the operator's are: `1ns`
// pinned a core, and a cooldown of `300000000000y` overflowed the clock at the first DEL.

/// A period the agent repeats or waits for: 1s to 1h.
fn period(s: &str) -> Result<Duration, String> {
    duration_within(s, Duration::from_secs(1), Duration::from_secs(3600))
}

fn reuse_cooldown(s: &str) -> Result<Duration, String> {
    duration_within(s, Duration::ZERO, tidepool_ipam::node::MAX_REUSE_COOLDOWN)
}

fn max_frees(s: &str) -> Result<usize, String> {
    count_within(s, 1, 10_000)
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> anyhow::Result<()> {
    let f = Flags::parse();
    init_logging(&f)?;
    // tests only: where the crash tests stop the agent (tidepool_agent::failpoint)
    tidepool_agent::failpoint::init_from_env().context(tidepool_agent::failpoint::ENV)?;
    let nets = match f.pod_networks.as_slice() {
        [] => None,
        given => Some(PodNetworks::new(given.to_vec()).context("--pod-network")?),
    };
    let settings = Settings {
        socket: f.socket.clone(),
        spool_dir: f
            .spool_dir
            .clone()
            .unwrap_or_else(|| f.state_dir.join("spool")),
        state_dir: f.state_dir.clone(),
        restored_marker: f.restored_marker.clone(),
        reuse_cooldown: f.reuse_cooldown,
        node_wait: f.node_wait,
        reconcile: reconcile::Config {
            netns_dir: f.netns_dir.clone(),
            cni_cache_dir: f.cni_cache_dir.clone(),
            interval: f.reconcile_interval,
            max_frees: f.reconcile_max_frees,
        },
        node_routes: f.node_routes.then_some(routes::Config {
            netns: None,
            interval: f.node_routes_interval,
        }),
        masquerade: f
            .masquerade
            .then(|| masq::Config::new(f.non_masquerade_cidrs.clone())),
        pod_networks: nets,
        ..Settings::new(&f.node_name)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async {
        // up before the wait for the IPAMNode: the liveness probe must answer meanwhile
        serve_observability(&f, &settings.ready).await?;
        let client = client(f.kubeconfig.as_deref()).await?;
        preflight(&client, &f).await?;
        run(client, settings, shutdown_signal()).await?;
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}

fn init_logging(f: &Flags) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&f.log_level)
        .with_context(|| format!("--log-level {}", f.log_level))?;
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match f.log_format {
        LogFormat::Text => fmt.init(),
        LogFormat::Json => fmt.json().init(),
    }
    Ok(())
}

/// Serves /metrics (the agent's series registered at zero) and, with --health-addr, the
/// probes; a bad or busy address fails start-up naming the flag.
async fn serve_observability(f: &Flags, ready: &Readiness) -> anyhow::Result<()> {
    let build = tidepool_metrics::build_info!();
    tidepool_metrics::install_exporter(f.metrics_addr, tidepool_metrics::Binary::Agent, build)
        .with_context(|| format!("serving metrics on --metrics-addr {}", f.metrics_addr))?;
    tracing::info!(addr = %f.metrics_addr, "serving /metrics");
    if let Some(addr) = f.health_addr {
        let at = probes::serve(addr, ready.clone())
            .await
            .with_context(|| format!("serving probes on --health-addr {addr}"))?;
        tracing::info!(%at, "serving /healthz and /readyz");
    }
    Ok(())
}

/// The client from --kubeconfig, else in-cluster, else $KUBECONFIG; its requests, watches
/// aside, fail after [`READ_TIMEOUT`](tidepool_api::client::READ_TIMEOUT) of silence.
async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no --kubeconfig, not in a cluster, and no usable $KUBECONFIG")?,
    };
    tidepool_api::client::client(config, tidepool_api::client::READ_TIMEOUT)
        .context("building the API client")
}

/// The cluster and the agent's token offer what the agent needs (`tidepool_api::preflight`:
/// Kubernetes 1.31 or later, the `spec.node` field selector on ipamblocks, a token bound to
/// this node), or start-up fails naming what is missing and how to fix it. A request that
/// fails is tried again, every second, until --node-wait has passed.
async fn preflight(client: &kube::Client, f: &Flags) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + f.node_wait;
    loop {
        let checked = async {
            let version = preflight::check_cluster(client).await?;
            preflight::check_agent_token(client, &f.node_name).await?;
            Ok(version)
        };
        match checked.await {
            Ok(version) => {
                tracing::info!(%version, "API server version");
                return Ok(());
            }
            Err(e @ Unmet::Unanswered { .. }) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "preflight check unanswered: trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// SIGTERM (Kubernetes stopping the pod) or Ctrl-C.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        () = term => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: stopping"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_flag_has_help_text() {
        let cmd = Flags::command();
        let bare: Vec<&str> = cmd
            .get_arguments()
            .filter(|a| a.get_help().is_none() && !a.is_hide_set())
            .map(|a| a.get_id().as_str())
            .collect();
        assert_eq!(bare, Vec::<&str>::new());
    }

    /// Each flag's environment variable is its name: `--pod-network` ↔
    /// `TIDEPOOL_POD_NETWORK`.
    #[test]
    fn every_env_name_is_its_flag_name() {
        let cmd = Flags::command();
        let odd: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| Some((a.get_long()?, a.get_env()?.to_str()?)))
            .filter(|(long, env)| {
                *env != format!("TIDEPOOL_{}", long.to_uppercase().replace('-', "_"))
            })
            .map(|(long, env)| format!("--{long} {env}"))
            .collect();
        assert_eq!(odd, Vec::<String>::new());
    }
}
