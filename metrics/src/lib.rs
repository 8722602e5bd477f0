//! Every tidepool metric in one place: name, type, unit, help text, label keys and their
//! enumerated values, and the histogram buckets (DESIGN.md, "Metrics").
//!
//! The engine and the node agent record through [`record`], one function per metric, which
//! takes the labels' values typed and sets them under the keys defined here (no caller
//! spells a label); each binary installs a recorder. The table is split by the
//! binary that exports a metric ([`Binary`]: [`OPERATOR`], [`AGENT`]): each binary describes
//! and registers only its own series, so neither exports the other's at zero. With feature
//! `exporter`, [`install_exporter`] builds the Prometheus recorder with every histogram's
//! buckets (so histograms export as histograms, not summaries), serves `/metrics`, describes
//! the binary's metrics and registers their enumerated series at zero so dashboards and alerts
//! see them before the first event. With feature `probes`, [`probes`] serves `/healthz` and
//! `/readyz` (both binaries' Kubernetes probes).
//!
//! Label values live in one module per label (`family::IPV4`, `family::ALL`, `family::KEY`),
//! and as an enum per label ([`Family`]) that [`record`]'s functions take. Labels whose values
//! are not enumerable (`pool`, `node`) have only a `KEY`; their series are not registered at
//! zero.
#![cfg_attr(test, allow(clippy::too_many_lines))]
#![forbid(unsafe_code)]

#[cfg(feature = "exporter")]
mod exporter;
#[cfg(feature = "exporter")]
pub use exporter::{
    install_exporter, install_exporter_with, prometheus_builder, prometheus_builder_with,
};
#[cfg(feature = "exporter")]
pub use metrics_exporter_prometheus::PrometheusHandle;
#[cfg(feature = "http-server")]
pub mod http_server;
#[cfg(feature = "probes")]
pub mod probes;

mod buckets;
mod build;
mod labels;
mod names;
pub mod record;
mod register;
mod table;

pub use buckets::buckets;
pub use build::BuildInfo;
pub use labels::*;
pub use names::*;
pub use register::{describe_all, register_zero};
pub use table::{AGENT, Binary, Def, EVERY_BINARY, Kind, OPERATOR, Values, all, def};

/// The error of setting up metrics export.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// The Prometheus exporter could not be built (bad buckets, address in use, ...).
    #[cfg(feature = "exporter")]
    /// (The cause is the error's source, not repeated in its text: `{:#}` prints the chain.)
    #[error("building the Prometheus exporter failed")]
    Build(#[from] metrics_exporter_prometheus::BuildError),
    /// A global metrics recorder was installed before.
    #[error("a global metrics recorder is already installed")]
    AlreadyInstalled,
    /// The metrics address could not be bound (in use, not local, ...).
    #[cfg(feature = "exporter")]
    #[error("binding the metrics address failed")]
    Bind(#[source] std::io::Error),
    /// The exporter's own runtime (used when called outside a Tokio runtime) failed to start.
    #[error("starting the metrics exporter's runtime failed")]
    Runtime(#[source] std::io::Error),
}

#[cfg(test)]
mod tests;
