//! Kubernetes events through our [`Recorder`] (which folds repeats into a series as
//! kube-runtime's does, in bounded memory), under a rate limit of ours: a storm of findings
//! (a repair of thousands of leaked entries) must not become a storm of API writes. Events
//! over the limit are dropped and logged.
//!
//! Two things the series leave to the caller:
//! - **The note's length.** The API server refuses a note over 1024 bytes with 422
//!   (`NoteLengthLimit`, kubernetes/kubernetes pkg/apis/core/validation/events.go,
//!   `legacyValidateEvent`), and `AgentNotReady` quotes the agent's own message: notes are
//!   cut to fit ([`fit_note`]).
//! - **A changed note.** A series is keyed as kube-runtime 5.0.0 `src/events.rs` keys it
//!   (`get_event_key`): on type, action, reason, reporter and regarding, not on the note. A
//!   repeat of a cached key only patches `series` onto the first event, so a new note with
//!   the same reason would never reach the API. The action is ours to choose, so it carries
//!   a digest of the note ([`action`]): a changed note is a new key and a new event, while
//!   the same note repeated still folds into one series.

use std::num::NonZeroU32;
use std::sync::Arc;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::ObjectReference;
use tidepool_api::names::{GROUP, VERSION};
use tidepool_ipam::{EventReason, EventType};

use super::recorder::{Draft, Recorder};
use crate::leader::Fence;

/// The longest note the API server stores, in bytes (`NoteLengthLimit`; Go's `len`).
pub const NOTE_LIMIT: usize = 1024;

/// What ends a note that was cut.
const CUT: &str = "…";

/// `note` if it fits in [`NOTE_LIMIT`] bytes; else its longest prefix that ends on a
/// character boundary and leaves room for "…", then "…".
pub fn fit_note(mut note: String) -> String {
    if note.len() > NOTE_LIMIT {
        note.truncate(note.floor_char_boundary(NOTE_LIMIT - CUT.len()));
        note.push_str(CUT);
    }
    note
}

/// The event's action: its reason and a digest of its note (FNV-1a, 64 bits), so that
/// a changed note is a series of its own (see the module's documentation). At most
/// 128 bytes (`ActionLengthLimit`) for the reasons tidepool uses.
fn action(reason: &str, note: &str) -> String {
    let digest = note.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{reason}-{digest:016x}")
}

/// Publishes events on tidepool objects (cluster-scoped: the events land in `default`).
#[derive(Clone)]
pub struct Events {
    recorder: Option<Arc<Recorder>>,
    limiter: Arc<DefaultDirectRateLimiter>,
    /// An event is a write too: only the leader sends it.
    fence: Fence,
}

impl Events {
    /// `per_second` events on average, `burst` at once.
    pub fn new(client: kube::Client, per_second: NonZeroU32, burst: NonZeroU32) -> Self {
        let recorder = Recorder::new(
            client,
            tidepool_api::names::OPERATOR_MANAGER.into(),
            std::env::var("POD_NAME").ok(),
        );
        Self {
            recorder: Some(Arc::new(recorder)),
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
    pub fn emit(
        &self,
        kind: &str,
        name: &str,
        type_: EventType,
        reason: EventReason,
        message: String,
    ) {
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
        reason: EventReason,
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

    fn publish(
        &self,
        reference: ObjectReference,
        type_: EventType,
        reason: EventReason,
        message: String,
    ) {
        let Some(recorder) = self.recorder.clone() else {
            return;
        };
        if !self.fence.open() {
            return;
        }
        if self.limiter.check().is_err() {
            let kind = reference.kind.as_deref().unwrap_or("");
            let name = reference.name.as_deref().unwrap_or("");
            tracing::warn!(kind, name, %reason, %message, "event dropped: over the event rate limit");
            return;
        }
        let note = fit_note(message);
        let type_ = match type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let draft = Draft {
            type_,
            reason: reason.as_str(),
            action: action(reason.as_str(), &note),
            note,
            regarding: reference,
        };
        let fence = self.fence.clone();
        tokio::spawn(async move {
            match fence.send(recorder.publish(draft)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "could not publish an event"),
                Err(e) => tracing::debug!(error = %e, "event not published"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_note_is_cut_on_a_character_boundary() {
        assert_eq!(fit_note("short".into()), "short");
        let exact = "x".repeat(NOTE_LIMIT);
        assert_eq!(fit_note(exact.clone()), exact);
        // "é" is two bytes: a cut at an odd byte would split one
        let long = format!("x{}", "é".repeat(NOTE_LIMIT));
        let cut = fit_note(long.clone());
        assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
        assert!(cut.len() > NOTE_LIMIT - 2 * CUT.len());
        assert!(cut.ends_with(CUT));
        assert!(long.starts_with(cut.strip_suffix(CUT).unwrap()));
    }

    #[test]
    fn the_action_tells_notes_apart_and_fits() {
        let a = action("AgentNotReady", "one");
        assert_eq!(a, action("AgentNotReady", "one"));
        assert_ne!(a, action("AgentNotReady", "two"));
        assert!(a.starts_with("AgentNotReady-") && a.len() <= 128, "{a}");
    }
}
