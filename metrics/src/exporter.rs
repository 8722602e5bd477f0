//! The Prometheus exporter (feature `exporter`).

use std::net::SocketAddr;
use std::time::Duration;

use hyper::StatusCode;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use tokio::net::TcpListener;

use crate::http_server::{self, Limits};
use crate::{Binary, BuildInfo, MetricsError, buckets, describe_all, record, register_zero};

/// A Prometheus builder with every histogram's explicit buckets set (so histograms export as
/// histograms, not summaries) and no exporter configured: add a listener, or call
/// `build_recorder()` to render without a socket (tests, `simulate --report`).
pub fn prometheus_builder() -> Result<PrometheusBuilder, MetricsError> {
    prometheus_builder_with(None)
}

/// [`prometheus_builder`], and with `gauge_idle_timeout` every gauge series not set within
/// that time is dropped from the export (counters and histograms never are).
///
/// Why: metrics-exporter-prometheus 0.18 has no call that removes one series; its idle
/// timeout (per metric kind) is the only way a series leaves the registry. The operator
/// uses it for `--per-node-metrics`, so a deleted node's `tidepool_ipam_node_ips` series go
/// away; every operator gauge is then set again at each resync (see the engine's
/// `NodeManager::resync`), so only the series nobody sets any more expire.
pub fn prometheus_builder_with(
    gauge_idle_timeout: Option<Duration>,
) -> Result<PrometheusBuilder, MetricsError> {
    let mut builder = PrometheusBuilder::new();
    if let Some(t) = gauge_idle_timeout {
        builder = builder.idle_timeout(MetricKindMask::GAUGE, Some(t));
    }
    for (name, b) in buckets() {
        builder = builder.set_buckets_for_metric(Matcher::Full((*name).to_string()), b)?;
    }
    Ok(builder)
}

/// Builds the Prometheus recorder with every histogram's buckets, installs it as the global
/// recorder, serves `/metrics` on `addr`, then describes `binary`'s metrics and registers their
/// enumerated series at zero (only its own: the other binary's series are not exported).
/// Each scrape first sets the series of the process itself: `tidepool_build_info` (from
/// `build`) and the standard `process_*` (metrics-process: CPU, memory, start time, file
/// descriptors, threads, read from /proc at that moment).
///
/// `/metrics` is served by the same limited server as the probes (`http_server`: header-read
/// and keep-alive idle timeout, connection cap), not by metrics-exporter-prometheus' own
/// listener, which has no such limits; other paths answer 404. Inside a Tokio runtime the
/// server and the recorder's upkeep run as tasks of that runtime; outside one, on a dedicated
/// thread with its own current-thread runtime (as `PrometheusBuilder::install` does). The
/// listening socket is bound before this returns, so a bad or busy address is an error here.
pub fn install_exporter(
    addr: SocketAddr,
    binary: Binary,
    build: BuildInfo,
) -> Result<PrometheusHandle, MetricsError> {
    install_exporter_with(addr, binary, build, None)
}

/// [`install_exporter`] with the gauges' idle timeout of [`prometheus_builder_with`].
pub fn install_exporter_with(
    addr: SocketAddr,
    binary: Binary,
    build: BuildInfo,
    gauge_idle_timeout: Option<Duration>,
) -> Result<PrometheusHandle, MetricsError> {
    let builder = prometheus_builder_with(gauge_idle_timeout)?;
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    let process = Process {
        collector: metrics_process::Collector::default(),
        build,
    };
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let listener = http_server::bind(addr).map_err(MetricsError::Bind)?;
        rt.spawn(export(listener, handle.clone(), process.clone()));
    } else {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(MetricsError::Runtime)?;
        let listener = {
            let _guard = rt.enter();
            http_server::bind(addr).map_err(MetricsError::Bind)?
        };
        let exported = handle.clone();
        let process = process.clone();
        std::thread::Builder::new()
            .name("tidepool-metrics-exporter".into())
            .spawn(move || rt.block_on(export(listener, exported, process)))
            .map_err(MetricsError::Runtime)?;
    }
    metrics::set_global_recorder(recorder).map_err(|_| MetricsError::AlreadyInstalled)?;
    describe_all(binary);
    process.collector.describe();
    register_zero(binary);
    process.refresh();
    Ok(handle)
}

/// The series of the process itself, set again before each render: they change without an
/// event (CPU, memory), and a gauge not set within `--per-node-metrics`' idle timeout would
/// leave the export.
#[derive(Clone)]
struct Process {
    collector: metrics_process::Collector,
    build: BuildInfo,
}

impl Process {
    /// Sets `process_*` and `tidepool_build_info` through the global recorder.
    fn refresh(&self) {
        self.collector.collect();
        record::build_info(self.build);
    }
}

/// How often the recorder's upkeep runs (drains histograms, expires idle series): the
/// interval `PrometheusBuilder::build` uses.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Serves `/metrics` on `listener` (`process` refreshed before each render) and runs the
/// recorder's upkeep, for ever.
async fn export(listener: TcpListener, handle: PrometheusHandle, process: Process) {
    let upkeep = {
        let handle = handle.clone();
        async move {
            loop {
                tokio::time::sleep(UPKEEP_INTERVAL).await;
                handle.run_upkeep();
            }
        }
    };
    let serve = http_server::serve(listener, Limits::DEFAULT, move |req| {
        let (handle, process) = (handle.clone(), process.clone());
        async move {
            if req.uri().path() != "/metrics" {
                return http_server::text(StatusCode::NOT_FOUND, "not found\n", TEXT);
            }
            // reading /proc and rendering many series take a while: off the runtime's workers
            let render = move || {
                process.refresh();
                handle.render()
            };
            match tokio::task::spawn_blocking(render).await {
                Ok(body) => http_server::text(StatusCode::OK, body, EXPOSITION),
                Err(_) => {
                    http_server::text(StatusCode::INTERNAL_SERVER_ERROR, "render failed\n", TEXT)
                }
            }
        }
    });
    tokio::join!(upkeep, serve);
}

/// The Prometheus text exposition format's content type.
const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";
