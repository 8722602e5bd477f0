//! Lease I/O with the Lease's own client: get, create, and replace under a resourceVersion
//! precondition, so of two candidates writing from the same observation one wins and the
//! other gets a 409.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::{Client, Config};

use super::LeaderConfig;
use super::decide::LeaseRecord;
use crate::Error;

/// A client for the Lease alone, built from the operator's kube configuration with no
/// automatic retries (kube's default stack retries 429/503/504 with backoff; a renewal
/// retried past its deadline is worse than one that failed) and with connect, read and write
/// timeouts of `timeout` (the renew deadline / 2). The read timeout counts from each request
/// sent, not from when its pooled connection went idle (else a request on a connection idle
/// longer than the timeout would fail at once).
pub fn lease_client(mut config: Config, timeout: Duration) -> Result<Client, Error> {
    config.default_retry = false;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    config.reset_reader_on_write = true;
    Client::try_from(config).map_err(Error::LeaseClient)
}

/// The outcome of a write that was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// The record as stored, with its new resourceVersion.
    Stored(LeaseRecord),
    /// 409: someone else wrote first (or created it first).
    Conflict,
}

/// The one Lease the elector uses.
#[derive(Clone)]
pub struct LeaseApi {
    api: Api<Lease>,
    name: String,
    namespace: String,
}

impl LeaseApi {
    /// The Lease `config` names, through `client` (see [`lease_client`]).
    pub fn new(client: Client, config: &LeaderConfig) -> Self {
        LeaseApi {
            api: Api::namespaced(client, &config.namespace),
            name: config.name.clone(),
            namespace: config.namespace.clone(),
        }
    }

    /// The record, or None when the Lease does not exist.
    pub async fn get(&self) -> Result<Option<LeaseRecord>, Error> {
        match self.api.get_opt(&self.name).await {
            Ok(lease) => Ok(lease.as_ref().map(record)),
            Err(e) => Err(self.error("get", e)),
        }
    }

    /// Creates the Lease holding `rec`.
    pub async fn create(&self, rec: &LeaseRecord) -> Result<Written, Error> {
        let lease = self.lease(rec);
        self.written("create", self.api.create(&params(), &lease).await)
    }

    /// Replaces the Lease with `rec` if its resourceVersion is still `rec.resource_version`.
    pub async fn replace(&self, rec: &LeaseRecord) -> Result<Written, Error> {
        let lease = self.lease(rec);
        let r = self.api.replace(&self.name, &params(), &lease).await;
        self.written("update", r)
    }

    fn written(&self, op: &'static str, r: kube::Result<Lease>) -> Result<Written, Error> {
        match r {
            Ok(lease) => Ok(Written::Stored(record(&lease))),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Written::Conflict),
            Err(e) => Err(self.error(op, e)),
        }
    }

    fn error(&self, op: &'static str, source: kube::Error) -> Error {
        Error::Lease {
            op,
            lease: format!("{}/{}", self.namespace, self.name),
            source: Box::new(source),
        }
    }

    fn lease(&self, rec: &LeaseRecord) -> Lease {
        to_lease(&self.name, &self.namespace, rec)
    }
}

/// The Lease object holding `rec`; an empty resourceVersion (a create) is left out.
fn to_lease(name: &str, namespace: &str, rec: &LeaseRecord) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            resource_version: Some(rec.resource_version.clone()).filter(|v| !v.is_empty()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(rec.holder.clone()),
            lease_duration_seconds: Some(rec.lease_duration_seconds),
            acquire_time: rec.acquire_time.map(MicroTime),
            renew_time: rec.renew_time.map(MicroTime),
            lease_transitions: Some(rec.transitions),
            ..LeaseSpec::default()
        }),
    }
}

/// Writes under the operator's field manager.
fn params() -> PostParams {
    PostParams {
        field_manager: Some(tidepool_api::names::OPERATOR_MANAGER.to_string()),
        ..PostParams::default()
    }
}

/// A Lease as the election reads it; absent fields read as client-go reads them (no holder,
/// no duration, no transitions).
pub fn record(lease: &Lease) -> LeaseRecord {
    let spec = lease.spec.clone().unwrap_or_default();
    LeaseRecord {
        holder: spec.holder_identity.unwrap_or_default(),
        lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
        acquire_time: spec.acquire_time.map(|t| t.0),
        renew_time: spec.renew_time.map(|t| t.0),
        transitions: spec.lease_transitions.unwrap_or(0),
        resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_without_spec_reads_as_released() {
        let r = record(&Lease::default());
        assert_eq!(r, LeaseRecord::default());
        assert!(!r.is_held());
    }

    #[test]
    fn records_round_trip_through_leases() {
        let t = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap();
        let rec = LeaseRecord {
            holder: "a".into(),
            lease_duration_seconds: 15,
            acquire_time: Some(t),
            renew_time: Some(t),
            transitions: 2,
            resource_version: "41".into(),
        };
        let lease = to_lease("l", "ns", &rec);
        assert_eq!(lease.metadata.resource_version.as_deref(), Some("41"));
        assert_eq!(record(&lease), rec);
        // a create carries no resourceVersion
        let fresh = LeaseRecord {
            resource_version: String::new(),
            ..rec
        };
        assert_eq!(to_lease("l", "ns", &fresh).metadata.resource_version, None);
    }
}
