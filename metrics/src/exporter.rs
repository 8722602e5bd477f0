//! The Prometheus exporter (feature `exporter`).

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

use crate::{Binary, MetricsError, buckets, describe_all, register_zero};

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
///
/// Inside a Tokio runtime the HTTP listener and the recorder's upkeep run as tasks of that
/// runtime; outside one, on a dedicated thread with its own current-thread runtime (as
/// `PrometheusBuilder::install` does). The listening socket is bound before this returns, so a
/// bad or busy address is an error here.
pub fn install_exporter(
    addr: SocketAddr,
    binary: Binary,
) -> Result<PrometheusHandle, MetricsError> {
    install_exporter_with(addr, binary, None)
}

/// [`install_exporter`] with the gauges' idle timeout of [`prometheus_builder_with`].
pub fn install_exporter_with(
    addr: SocketAddr,
    binary: Binary,
    gauge_idle_timeout: Option<Duration>,
) -> Result<PrometheusHandle, MetricsError> {
    let builder = prometheus_builder_with(gauge_idle_timeout)?.with_http_listener(addr);
    let recorder = if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let (recorder, exporter) = {
            let _guard = rt.enter();
            builder.build()?
        };
        rt.spawn(exporter);
        recorder
    } else {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(MetricsError::Runtime)?;
        let (recorder, exporter) = {
            let _guard = rt.enter();
            builder.build()?
        };
        std::thread::Builder::new()
            .name("tidepool-metrics-exporter".into())
            .spawn(move || rt.block_on(exporter))
            .map_err(MetricsError::Runtime)?;
        recorder
    };
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|_| MetricsError::AlreadyInstalled)?;
    describe_all(binary);
    register_zero(binary);
    Ok(handle)
}
