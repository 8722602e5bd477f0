//! Kubernetes events through kube's `Recorder` (which folds repeats into a series), under a
//! rate limit of ours: a storm of findings (a repair of thousands of leaked entries) must
//! not become a storm of API writes. Events over the limit are dropped and logged.

use std::num::NonZeroU32;
use std::sync::Arc;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType as KubeEventType, Recorder, Reporter};
use tidepool_api::names::{GROUP, VERSION};
use tidepool_ipam::EventType;

use crate::leader::Fence;

/// Publishes events on tidepool objects (cluster-scoped: the events land in `default`).
#[derive(Clone)]
pub struct Events {
    recorder: Option<Recorder>,
    limiter: Arc<DefaultDirectRateLimiter>,
    /// An event is a write too: only the leader sends it.
    fence: Fence,
}

impl Events {
    /// `per_second` events on average, `burst` at once.
    pub fn new(client: kube::Client, per_second: NonZeroU32, burst: NonZeroU32) -> Self {
        let reporter = Reporter {
            controller: tidepool_api::names::OPERATOR_MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Some(Recorder::new(client, reporter)),
            limiter: Arc::new(RateLimiter::direct(
                Quota::per_second(per_second).allow_burst(burst),
            )),
            fence: Fence::default(),
        }
    }

    /// Every event through `fence` (leader election).
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// Events that go nowhere (`check`, which writes nothing).
    pub fn none() -> Self {
        Self {
            recorder: None,
            limiter: Arc::new(RateLimiter::direct(Quota::per_second(NonZeroU32::MIN))),
            fence: Fence::default(),
        }
    }

    /// Sends one event on the tidepool object `kind/name` in the background (never blocks
    /// the caller).
    pub fn emit(&self, kind: &str, name: &str, type_: EventType, reason: &str, message: String) {
        let reference = ObjectReference {
            api_version: Some(format!("{GROUP}/{VERSION}")),
            kind: Some(kind.into()),
            name: Some(name.into()),
            ..Default::default()
        };
        self.publish(reference, type_, reason, message);
    }

    /// Sends one event on the pod `namespace/name` (its UID given: the event names that
    /// very pod, also once it is gone), in its namespace.
    pub fn emit_on_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        type_: EventType,
        reason: &str,
        message: String,
    ) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..Default::default()
        };
        self.publish(reference, type_, reason, message);
    }

    fn publish(&self, reference: ObjectReference, type_: EventType, reason: &str, message: String) {
        let Some(recorder) = self.recorder.clone() else {
            return;
        };
        if !self.fence.open() {
            return;
        }
        if self.limiter.check().is_err() {
            let (kind, name) = (&reference.kind, &reference.name);
            tracing::warn!(?kind, ?name, %reason, %message, "event dropped: over the event rate limit");
            return;
        }
        let event = Event {
            type_: match type_ {
                EventType::Normal => KubeEventType::Normal,
                EventType::Warning => KubeEventType::Warning,
            },
            reason: reason.into(),
            note: Some(message),
            action: reason.into(),
            secondary: None,
        };
        let fence = self.fence.clone();
        tokio::spawn(async move {
            match fence.send(recorder.publish(&event, &reference)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "could not publish an event"),
                Err(e) => tracing::debug!(error = %e, "event not published"),
            }
        });
    }
}
