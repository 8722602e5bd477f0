//! tidepool's in-process Kubernetes API server for tests.
//!
//! [`ApiServer`] serves the Kubernetes REST API on 127.0.0.1 with the semantics our clients
//! depend on (resourceVersion, conflicts, Status bodies, watches with bookmarks and 410 Gone,
//! status and (Deployments') scale subresources, CRDs with schema validation, server-side apply with field ownership,
//! finalizers and garbage collection, discovery and OpenAPI v3), plus runtime fault injection
//! and per-verb request counters. See `tests/README.md` for what it does not emulate.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod access_review;
mod admission;
mod admission_params;
mod admission_policy;
mod cel_expr;
mod cel_net;
mod crd_rules;
mod crd_validation;
mod discovery;
mod error;
mod events;
mod fieldset;
mod http;
mod identity;
mod kinds;
mod media;
mod names;
mod paging;
mod params;
mod patch;
mod protobuf;
mod rbac;
mod registry;
mod scale;
mod schema;
mod selector;
mod server;
mod store;
mod tls;
mod typed;
mod typemeta;
mod watch_lag;

pub use error::{Error, Result};
pub use identity::{ADMIN, NODE_NAME_EXTRA, NODE_UID_EXTRA, UserInfo};
pub use server::{
    AcceptedWrite, ApiServer, Config, FailedRequest, Faults, ListRequest, TargetedFault,
};
pub use watch_lag::{Hold, WatchLag};
