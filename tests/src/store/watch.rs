//! Watch windows: every resource keeps its last `window` events; a watch resumes from a
//! resourceVersion inside the window, or is 410 Gone below it.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use super::{Inner, Store};
use crate::error::Error;
use crate::registry::ResType;

/// One change, as retained for watches.
#[derive(Debug)]
pub(crate) struct WatchEvent {
    pub rv: u64,
    pub gr: String,
    pub ns: String,
    pub etype: &'static str,
    pub obj: Arc<Value>,
    pub prev: Option<Arc<Value>>,
    /// `{"type":...,"object":...}\n` in the storage version.
    pub line: Bytes,
}

pub(crate) fn event_line(etype: &str, obj: &Value) -> Bytes {
    let mut v = Vec::with_capacity(512);
    v.extend_from_slice(b"{\"type\":\"");
    v.extend_from_slice(etype.as_bytes());
    v.extend_from_slice(b"\",\"object\":");
    serde_json::to_writer(&mut v, obj).expect("serialise");
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

/// One resource's window of events; `compacted` is the version of the last event dropped.
#[derive(Default)]
pub(super) struct Log {
    events: VecDeque<Arc<WatchEvent>>,
    compacted: u64,
}

/// What a new watch starts with: events to send first, the live feed, the current version.
pub(crate) type WatchStart = (
    Vec<Arc<WatchEvent>>,
    broadcast::Receiver<Arc<WatchEvent>>,
    u64,
);

impl Store {
    /// Starts a watch: returns the events to send first and the live receiver.
    /// `from == None` means "current state first" (synthetic ADDED events).
    pub(crate) fn watch(
        &self,
        rt: &ResType,
        ns: Option<&str>,
        from: Option<u64>,
    ) -> Result<WatchStart, Error> {
        let i = self.inner.lock();
        let gr = rt.storage_gr();
        let rx = self.tx.subscribe();
        let first = match from {
            None | Some(0) => Self::current_as_added(&i, &gr, ns),
            Some(rv) => Self::events_since(&i, &gr, ns, rv)?,
        };
        Ok((first, rx, i.rv))
    }

    /// Every object of a resource as an ADDED event (at version 0).
    fn current_as_added(i: &Inner, gr: &str, ns: Option<&str>) -> Vec<Arc<WatchEvent>> {
        let Some(objects) = i.objects.get(gr) else {
            return Vec::new();
        };
        objects
            .iter()
            .filter(|((ons, _), _)| ns.is_none_or(|n| n == ons))
            .map(|((ons, _), o)| {
                Arc::new(WatchEvent {
                    rv: 0,
                    gr: gr.to_string(),
                    ns: ons.clone(),
                    etype: "ADDED",
                    obj: o.clone(),
                    prev: None,
                    line: event_line("ADDED", o),
                })
            })
            .collect()
    }

    /// The window's events after `rv`; 410 when events after `rv` have left the window
    /// (k8s.io/apiserver pkg/storage/cacher/watch_cache.go `getAllEventsSinceLocked`).
    fn events_since(
        i: &Inner,
        gr: &str,
        ns: Option<&str>,
        rv: u64,
    ) -> Result<Vec<Arc<WatchEvent>>, Error> {
        let log = i.logs.get(gr);
        let compacted = log.map(|l| l.compacted).unwrap_or(0);
        if rv < compacted {
            return Err(Error::gone(format!(
                "too old resource version: {rv} ({compacted})"
            )));
        }
        Ok(log
            .map(|l| {
                l.events
                    .iter()
                    .filter(|e| e.rv > rv && ns.is_none_or(|n| n == e.ns))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The resourceVersion of the last write to a resource (`plural.group`), 0 before any.
    pub(crate) fn last_write(&self, gr: &str) -> u64 {
        let i = self.inner.lock();
        i.logs
            .get(gr)
            .map(|l| l.events.back().map_or(l.compacted, |e| e.rv))
            .unwrap_or(0)
    }

    /// Keeps an event in its resource's window (dropping the oldest beyond `window`) and
    /// sends it to the live watches.
    pub(super) fn log_event(&self, i: &mut Inner, ev: Arc<WatchEvent>) {
        let log = i.logs.entry(ev.gr.clone()).or_default();
        log.events.push_back(ev.clone());
        while log.events.len() > self.window {
            if let Some(old) = log.events.pop_front() {
                log.compacted = old.rv;
            }
        }
        let _ = self.tx.send(ev);
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{configmap, rv_of, store_with_window, type_of, writes};
    use serde_json::json;

    #[test]
    fn a_watch_resumes_after_the_version_it_names() {
        let store = store_with_window(10);
        let cms = type_of(&store, "configmaps");
        let a = store
            .create(&cms, "default", configmap("a"), &writes())
            .unwrap();
        let from = rv_of(&a.obj);
        store
            .create(&cms, "default", configmap("b"), &writes())
            .unwrap();
        store
            .create(&cms, "kube-system", configmap("c"), &writes())
            .unwrap();
        let (first, _rx, rv) = store.watch(&cms, Some("default"), Some(from)).unwrap();
        let seen: Vec<_> = first
            .iter()
            .map(|e| (e.etype, e.obj["metadata"]["name"].clone()))
            .collect();
        assert_eq!(seen, [("ADDED", json!("b"))]);
        assert_eq!(first[0].rv, from + 1);
        assert_eq!(rv, store.current_rv());
        assert_eq!(store.last_write("configmaps"), from + 2);
        let (all, _, _) = store.watch(&cms, None, Some(from)).unwrap();
        assert_eq!(all.len(), 2);
    }

    #[test]
    fn a_watch_without_a_version_starts_with_the_current_objects() {
        let store = store_with_window(10);
        let cms = type_of(&store, "configmaps");
        store
            .create(&cms, "default", configmap("a"), &writes())
            .unwrap();
        let (first, _, _) = store.watch(&cms, None, None).unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].rv, first[0].etype), (0, "ADDED"));
        let line = String::from_utf8(first[0].line.to_vec()).unwrap();
        assert!(
            line.starts_with("{\"type\":\"ADDED\",\"object\":{"),
            "{line}"
        );
        assert!(line.ends_with("}\n"), "{line}");
    }

    #[test]
    fn a_watch_below_the_window_is_gone() {
        // kube-apiserver answers a watch from a resourceVersion its watch cache no longer
        // holds with 410 `too old resource version` (watch_cache.go).
        let store = store_with_window(2);
        let cms = type_of(&store, "configmaps");
        let mut rvs = Vec::new();
        for n in ["a", "b", "c", "d"] {
            let w = store
                .create(&cms, "default", configmap(n), &writes())
                .unwrap();
            rvs.push(rv_of(&w.obj));
        }
        // The window holds c and d; b's version was compacted away.
        let err = store.watch(&cms, None, Some(rvs[0])).unwrap_err();
        assert_eq!(err.code(), 410);
        assert_eq!(
            err.to_string(),
            format!(
                "410 Expired: too old resource version: {} ({})",
                rvs[0], rvs[1]
            )
        );
        let (first, _, _) = store.watch(&cms, None, Some(rvs[1])).unwrap();
        let names: Vec<_> = first
            .iter()
            .map(|e| e.obj["metadata"]["name"].clone())
            .collect();
        assert_eq!(names, [json!("c"), json!("d")]);
        assert_eq!(store.last_write("configmaps"), rvs[3]);
        assert_eq!(store.last_write("secrets"), 0);
    }
}
