//! The operator's events.k8s.io/v1 Events, with a repeat folded into a series as
//! kube-runtime 5.0.0's `Recorder` folds it (`src/events.rs`): the same type, reason, action,
//! object and reporter within 6 minutes of the last sighting patches the first event's
//! `series` (count, last observed time) instead of creating another.
//!
//! Written here, not through that `Recorder`, for its memory: it keeps every event it sent,
//! whole, for 6 minutes, in a map that never shrinks. At the operator's event rate limit
//! (10 a second) that is ~3,700 events, ~12 MB held and reached only after 6 minutes of
//! churn (a heap profile at 150,000 pods, BENCHMARKS.md). [`SeriesCache`] keeps what a
//! series needs (the event's name and count, under a fingerprint of its key) for at most
//! [`CACHE_ENTRIES`] keys, client-go's bound (`maxLruCacheEntries` in
//! k8s.io/client-go/tools/record/events_cache.go), and no longer than a repeat could use it.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use parking_lot::Mutex;
use tokio::time::Instant;

/// How long after its last sighting a repeat still folds into an event (kube-runtime's
/// `CACHE_TTL`).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// The most keys remembered; the oldest goes first.
pub const CACHE_ENTRIES: usize = 4096;

/// What folds repeats together: type, reason, action, the object and the reporter (the
/// fields kube-runtime's `get_event_key` uses), as a 64-bit fingerprint. Two keys share
/// one with a chance of about 2^-64 each; then a repeat of one would count in the other's
/// series, and nothing else.
pub fn series_key(event: &Event) -> u64 {
    let r = event.regarding.as_ref();
    let mut h = std::hash::DefaultHasher::new();
    (
        &event.type_,
        &event.reason,
        &event.action,
        r.map(|r| (&r.kind, &r.namespace, &r.name, &r.uid)),
        &event.reporting_controller,
        &event.reporting_instance,
    )
        .hash(&mut h);
    h.finish()
}

#[derive(Debug)]
struct Seen {
    name: Box<str>,
    count: i32,
    last: Instant,
    /// Which place in `order` is the key's (its last sighting's).
    serial: u64,
}

/// The events sent lately, by [`series_key`]: pure, bounded to a number of keys, each
/// kept until [`SERIES_TTL`] after its last sighting.
#[derive(Debug)]
pub struct SeriesCache {
    seen: HashMap<u64, Seen>,
    /// (serial, key) by last sighting, oldest first; a key seen again leaves a stale place.
    order: VecDeque<(u64, u64)>,
    serial: u64,
    capacity: usize,
}

impl SeriesCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            seen: HashMap::new(),
            order: VecDeque::new(),
            serial: 0,
            capacity: capacity.max(1),
        }
    }

    /// The event a sighting of `key` at `now` folds into, with the series' count then; None:
    /// a new event (never seen, or last seen [`SERIES_TTL`] ago or more).
    pub fn repeat_of(&self, key: u64, now: Instant) -> Option<(String, i32)> {
        let s = self.seen.get(&key)?;
        (now < s.last + SERIES_TTL).then(|| (s.name.to_string(), s.count + 1))
    }

    /// `key`'s event `name` reached the API with `count` sightings at `now`.
    pub fn record(&mut self, key: u64, name: String, count: i32, now: Instant) {
        self.serial += 1;
        self.order.push_back((self.serial, key));
        match self.seen.get_mut(&key).filter(|s| *s.name == *name) {
            Some(s) => (s.count, s.last, s.serial) = (s.count.max(count), now, self.serial),
            None => {
                let seen = Seen {
                    name: name.into(),
                    count,
                    last: now,
                    serial: self.serial,
                };
                self.seen.insert(key, seen);
            }
        }
        self.expire(now);
    }

    /// Drops the keys past [`SERIES_TTL`] and, beyond the capacity, the oldest; keeps the
    /// stale places in `order` bounded too.
    fn expire(&mut self, now: Instant) {
        while let Some(&(serial, key)) = self.order.front() {
            let current = self.seen.get(&key).filter(|s| s.serial == serial);
            let over = self.seen.len() > self.capacity || self.order.len() > 2 * self.capacity;
            match current {
                Some(s) if !over && now < s.last + SERIES_TTL => break,
                Some(_) => {
                    self.seen.remove(&key);
                }
                None => {}
            }
            self.order.pop_front();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seen.len()
    }
}

/// An event to send: what the caller chooses.
#[derive(Debug, Clone)]
pub struct Draft {
    pub type_: &'static str,
    pub reason: &'static str,
    pub action: String,
    pub note: String,
    pub regarding: ObjectReference,
}

/// Sends events to the API server, folding repeats.
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    cache: Mutex<SeriesCache>,
}

impl Recorder {
    pub fn new(client: Client, controller: String, instance: Option<String>) -> Self {
        Self {
            client,
            instance: instance.unwrap_or_else(|| controller.clone()),
            controller,
            cache: Mutex::new(SeriesCache::new(CACHE_ENTRIES)),
        }
    }

    /// Creates the event, or patches the series of the one it repeats; a series whose
    /// event is gone from the server (events expire there) starts a new event.
    pub async fn publish(&self, draft: Draft) -> Result<(), kube::Error> {
        let namespace = (draft.regarding.namespace.clone()).unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let (wall, now) = (Timestamp::now(), Instant::now());
        let event = self.event(draft, namespace, wall);
        let key = series_key(&event);
        let repeat = self.cache.lock().repeat_of(key, now);
        if let Some((name, count)) = repeat {
            let series = EventSeries {
                count,
                last_observed_time: MicroTime(wall),
            };
            let patch = serde_json::json!({ "series": series });
            let patched = (api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))).await;
            match patched {
                Ok(_) => {
                    self.cache.lock().record(key, name, count, now);
                    return Ok(());
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let created = api.create(&PostParams::default(), &event).await?;
        let name = created.metadata.name.unwrap_or_default();
        self.cache.lock().record(key, name, 1, now);
        Ok(())
    }

    /// The event as created: named after its object and the time, as kube-runtime names it.
    fn event(&self, d: Draft, namespace: String, now: Timestamp) -> Event {
        let name = format!(
            "{}.{:x}",
            d.regarding.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        Event {
            action: Some(d.action),
            reason: Some(d.reason.into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(d.regarding),
            note: Some(d.note),
            metadata: ObjectMeta {
                namespace: Some(namespace),
                name: Some(name),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(d.type_.into()),
            ..Event::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_repeat_folds_into_the_first_event_until_six_minutes_after_the_last() {
        let t0 = Instant::now();
        let mut c = SeriesCache::new(8);
        assert_eq!(c.repeat_of(1, t0), None, "never seen");
        c.record(1, "ev-1".into(), 1, t0);
        assert_eq!(c.repeat_of(1, t0), Some(("ev-1".into(), 2)));
        // seen again 5 minutes on: the 6 minutes count from then
        let t5 = t0 + Duration::from_secs(300);
        c.record(1, "ev-1".into(), 2, t5);
        let later = t5 + SERIES_TTL - Duration::from_millis(1);
        assert_eq!(c.repeat_of(1, later), Some(("ev-1".into(), 3)));
        assert_eq!(c.repeat_of(1, t5 + SERIES_TTL), None, "expired");
        // a new event for the key replaces the old one
        c.record(1, "ev-2".into(), 1, t5 + SERIES_TTL);
        assert_eq!(c.repeat_of(1, t5 + SERIES_TTL), Some(("ev-2".into(), 2)));
        assert_eq!(c.len(), 1);
    }

    /// A key is forgotten once a repeat could no longer use it, at the next event sent:
    /// at a steady rate the cache holds [`SERIES_TTL`]'s worth of keys, not its capacity.
    #[tokio::test(start_paused = true)]
    async fn keys_past_the_window_are_dropped() {
        let t0 = Instant::now();
        let mut c = SeriesCache::new(100);
        c.record(1, "ev-1".into(), 1, t0);
        let t4 = t0 + Duration::from_secs(240);
        c.record(2, "ev-2".into(), 1, t4);
        // key 1 seen again at minute 4: its window now ends at minute 10
        c.record(1, "ev-1".into(), 2, t4);
        c.record(
            3,
            "ev-3".into(),
            1,
            t0 + SERIES_TTL + Duration::from_secs(1),
        );
        assert_eq!(c.len(), 3, "nothing past its window yet");
        let t10 = t4 + SERIES_TTL;
        c.record(4, "ev-4".into(), 1, t10);
        assert_eq!(c.len(), 2, "keys 1 and 2 last seen at minute 4 went");
        assert_eq!(c.repeat_of(3, t10), Some(("ev-3".into(), 2)));
        assert!(c.order.len() <= 3);
    }

    /// However many events are sent, the cache holds at most its capacity, the keys seen
    /// longest ago going first; a key given a new event leaves its old place in line, which
    /// then evicts nothing.
    #[tokio::test(start_paused = true)]
    async fn the_cache_is_bounded_and_drops_the_oldest() {
        let t0 = Instant::now();
        let mut c = SeriesCache::new(4);
        for n in 0..1000 {
            c.record(n, format!("ev-{n}"), 1, t0);
            assert!(c.len() <= 4);
            assert!(c.order.len() <= 8);
        }
        assert_eq!(c.repeat_of(995, t0), None, "evicted");
        for n in 996..1000 {
            assert_eq!(c.repeat_of(n, t0), Some((format!("ev-{n}"), 2)));
        }
        // replaced keys: the stale place in line evicts nothing
        c.record(996, "ev-new".into(), 1, t0);
        c.record(2000, "ev-2000".into(), 1, t0);
        assert_eq!(c.repeat_of(996, t0), Some(("ev-new".into(), 2)));
        assert_eq!(c.repeat_of(997, t0), None, "the oldest went");
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn the_key_tells_objects_reasons_and_actions_apart() {
        let ev = |reason: &str, action: &str, name: &str| Event {
            reason: Some(reason.into()),
            action: Some(action.into()),
            regarding: Some(ObjectReference {
                kind: Some("IPAMNode".into()),
                name: Some(name.into()),
                ..ObjectReference::default()
            }),
            note: Some("a note the key ignores".into()),
            ..Event::default()
        };
        let a = series_key(&ev("R", "A", "n1"));
        let mut same = ev("R", "A", "n1");
        same.note = Some("another note".into());
        assert_eq!(a, series_key(&same));
        assert_ne!(a, series_key(&ev("R", "B", "n1")));
        assert_ne!(a, series_key(&ev("S", "A", "n1")));
        assert_ne!(a, series_key(&ev("R", "A", "n2")));
        // fields run together differently are different keys
        assert_ne!(
            series_key(&ev("RA", "", "n1")),
            series_key(&ev("R", "A", "n1"))
        );
    }
}
