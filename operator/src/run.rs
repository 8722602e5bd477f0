//! `tidepool-operator run`: flags to settings, the client, metrics, signals.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tidepool_api::preflight;

use crate::cli::RunCmd;
use tidepool_api::client::READ_TIMEOUT;
use tidepool_operator::leader::LeaderConfig;
use tidepool_operator::runtime::{self, Election, Settings};

pub fn run(f: &RunCmd) -> anyhow::Result<bool> {
    // bad leader-election flags fail first, naming them
    let leader = f
        .leader_elect
        .then(|| f.leader.config(|k| std::env::var(k).ok()))
        .transpose()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(run_async(f, leader))?;
    Ok(true)
}

async fn run_async(f: &RunCmd, leader: Option<LeaderConfig>) -> anyhow::Result<()> {
    let config = config(f.kubeconfig.as_deref()).await?;
    let client = client_of(config.clone(), f.sync_timeout, READ_TIMEOUT).await?;
    // Kubernetes >= 1.31 and the spec.node field selector the agents' block watches use
    let version = preflight::check_cluster(&client).await?;
    tracing::info!(%version, "API server version");
    if let Some(l) = &leader {
        tracing::info!(identity = %l.identity, lease = %format!("{}/{}", l.namespace, l.name), "leader election on");
    }
    // describes and registers the operator's series (not the agent's) at zero
    tidepool_metrics::install_exporter_with(
        f.metrics_addr,
        tidepool_metrics::Binary::Operator,
        tidepool_metrics::build_info!(),
        f.engine.gauge_idle_timeout(),
    )
    .with_context(|| format!("serving metrics on --metrics-addr {}", f.metrics_addr))?;
    let settings = Settings {
        engine: f.engine.engine(),
        scheduling: f.engine.scheduling(),
        kube_api_qps: f.engine.kube_api_qps,
        kube_api_burst: f.engine.kube_api_burst,
        node_selector: f.node_selector.clone(),
        sync_timeout: f.sync_timeout,
        health_addr: Some(f.health_addr),
        seed: rand_seed(),
        taint_exhausted_nodes: f.taint_exhausted_nodes,
        agent_ready_grace: f.agent_ready_grace,
        agent_pods: f.agent_pod_selector.clone(),
        election: leader.map(|leader| Election {
            config: leader,
            kube_config: config,
        }),
    };
    runtime::run(client, settings, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// `check`'s client, from --kubeconfig, else in-cluster, else $KUBECONFIG: the API server
/// must answer within `timeout` (--timeout), and then never go silent for as long.
pub(crate) async fn client(kubeconfig: Option<&Path>, timeout: Duration) -> anyhow::Result<Client> {
    client_of(config(kubeconfig).await?, timeout, timeout).await
}

/// The client configuration from --kubeconfig, else in-cluster, else $KUBECONFIG.
async fn config(kubeconfig: Option<&Path>) -> anyhow::Result<Config> {
    Ok(match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None => Config::infer()
            .await
            .context("no --kubeconfig, not in a cluster, and no usable $KUBECONFIG")?,
    })
}

/// A client of `config` whose requests, watches aside, fail after `read_timeout` of silence
/// ([`tidepool_api::client`]), once the API server answers (at most `timeout`).
async fn client_of(
    config: Config,
    timeout: Duration,
    read_timeout: Duration,
) -> anyhow::Result<Client> {
    let url = config.cluster_url.clone();
    let client =
        tidepool_api::client::client(config, read_timeout).context("building the API client")?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match client.apiserver_version().await {
            Ok(_) => return Ok(client),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                bail!("the API server at {url} did not answer within {timeout:?}: {e}")
            }
            Err(e) => {
                tracing::warn!(%url, error = %e, "API server not reachable yet");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
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
        _ = term => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: stopping"),
    }
}

/// The block search's random start differs per start (replicas must not collide).
fn rand_seed() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    (t as u64) ^ u64::from(std::process::id()).rotate_left(32)
}
