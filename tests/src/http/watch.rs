//! The watch stream of a resource request: the events from a version on (or the current
//! objects first), as the watch's selector sees them, through the watch's lag, with bookmarks.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::{Body, Target};
use crate::discovery;
use crate::error::Error;
use crate::registry::ResType;
use crate::selector::Selector;
use crate::server::State;
use crate::store::{Store, WatchEvent, event_line};
use crate::watch_lag::Outbox;

/// Serves a watch: a chunked answer whose lines a task writes until the client goes, the
/// watch times out, the server closes its watches or refuses the identity.
pub(super) fn watch(
    st: &Arc<State>,
    t: &Target,
    q: &HashMap<String, String>,
    sel: Selector,
    who: &str,
    as_table: bool,
) -> Result<Response<Body>, Error> {
    let rt = t.rt.clone();
    let include = q.get("includeObject").cloned().unwrap_or_default();
    let gr = rt.storage_gr();
    let params = Params::parse(st, q)?;
    let (tx, out_rx) = mpsc::channel::<Bytes>(256);
    let started = st.store.watch(&rt, t.ns.as_deref(), params.from);
    let feed = Feed {
        // every line goes through the watch's lag (held back for one identity, if asked)
        out: Outbox::new(st.clone(), who, &gr),
        st: st.clone(),
        render: Render {
            rt: rt.clone(),
            as_table,
            include,
            headers_sent: false,
        },
        rt,
        ns: t.ns.clone(),
        gr,
        who: who.to_string(),
        sel,
        params,
        tx,
        last_rv: 0,
    };
    tokio::spawn(async move {
        match started {
            Ok((first, rx, start_rv)) => feed.run(first, rx, start_rv).await,
            Err(e) => {
                let _ = feed.tx.send(event_line("ERROR", &e.status())).await;
            }
        }
    });
    Ok(stream_response(out_rx))
}

/// A chunked JSON answer of the lines `rx` receives.
fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::TRANSFER_ENCODING, "chunked")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("response")
}

/// A watch's query parameters.
struct Params {
    /// The version to start after (`None`: the current objects first, as ADDED events).
    from: Option<u64>,
    timeout: Duration,
    initial_events: bool,
    bookmarks: bool,
}

impl Params {
    /// `sendInitialEvents`, `allowWatchBookmarks`, `resourceVersion` and `timeoutSeconds`
    /// (else the server's minimum request timeout plus a random part of it), capped by the
    /// injected `watch_max`.
    fn parse(st: &State, q: &HashMap<String, String>) -> Result<Self, Error> {
        let initial_events = q.get("sendInitialEvents").is_some_and(|v| v == "true");
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        let from = match q.get("resourceVersion").map(String::as_str) {
            _ if initial_events => None,
            None | Some("") => None,
            Some(v) => Some(
                v.parse::<u64>()
                    .map_err(|_| Error::bad_request(format!("invalid resource version {v:?}")))?,
            ),
        };
        let timeout = match q.get("timeoutSeconds").and_then(|s| s.parse::<u64>().ok()) {
            Some(s) => Duration::from_secs(s),
            None => {
                let base = st.config.min_request_timeout;
                base + Duration::from_millis(st.store.random() % (base.as_millis() as u64).max(1))
            }
        };
        let timeout = match st.faults.read().watch_max {
            Some(m) => timeout.min(m),
            None => timeout,
        };
        Ok(Params {
            from,
            timeout,
            initial_events,
            bookmarks,
        })
    }
}

/// How a watch writes an event: the object, or with `as=Table` (kubectl get -w) a one-row
/// Table; only the first Table has column definitions, as the real server sends them.
struct Render {
    rt: Arc<ResType>,
    as_table: bool,
    /// `includeObject` of a Table.
    include: String,
    headers_sent: bool,
}

impl Render {
    fn line(&mut self, ev: &WatchEvent, et: &'static str) -> Bytes {
        if !self.as_table {
            return plain_line(ev, et, &self.rt);
        }
        let obj = Store::present(&self.rt, &ev.obj);
        let mut tbl = discovery::table(&self.rt, &[obj], ev.rv, &self.include);
        if self.headers_sent {
            tbl["columnDefinitions"] = json!([]);
        }
        self.headers_sent = true;
        event_line(et, &tbl)
    }
}

/// Whether a change passes a watch's selector; the event type seen by that watch.
fn filtered(ev: &WatchEvent, sel: &Selector) -> Option<&'static str> {
    if sel.is_empty() {
        return Some(ev.etype);
    }
    let now = sel.matches(&ev.obj);
    let before = ev.prev.as_ref().is_some_and(|p| sel.matches(p));
    match ev.etype {
        "ADDED" => now.then_some("ADDED"),
        "DELETED" => (now || before).then_some("DELETED"),
        _ => match (before, now) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        },
    }
}

fn plain_line(ev: &WatchEvent, etype: &'static str, rt: &ResType) -> Bytes {
    let av = rt.api_version();
    if etype == ev.etype && ev.obj.get("apiVersion").and_then(Value::as_str) == Some(av.as_str()) {
        return ev.line.clone();
    }
    event_line(etype, &Store::present(rt, &ev.obj))
}

/// A bookmark at `rv`; `end` marks the end of the initial events.
fn bookmark(rt: &ResType, rv: u64, end: bool) -> Bytes {
    let mut md = json!({"resourceVersion": rv.to_string()});
    if end {
        md["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line(
        "BOOKMARK",
        &json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": md}),
    )
}

/// One watch's task: what it watches, for whom, and what it has sent. Its steps answer
/// false when the watch ends (the client is gone, or the feed broke).
struct Feed {
    st: Arc<State>,
    rt: Arc<ResType>,
    ns: Option<String>,
    /// The store key of the watched resource.
    gr: String,
    who: String,
    sel: Selector,
    params: Params,
    render: Render,
    out: Outbox,
    tx: mpsc::Sender<Bytes>,
    /// The newest version sent or passed over.
    last_rv: u64,
}

impl Feed {
    async fn run(
        mut self,
        first: Vec<Arc<WatchEvent>>,
        mut rx: broadcast::Receiver<Arc<WatchEvent>>,
        start_rv: u64,
    ) {
        let deadline = Instant::now() + self.params.timeout;
        let mut changes = self.st.changes.subscribe();
        let mut paused = self.st.paused.subscribe();
        let close_epoch = *self.st.close_epoch.lock();
        if !self.initial(&first, start_rv).await {
            return;
        }
        let every = self.st.config.bookmark_interval;
        let mut tick = tokio::time::interval_at(Instant::now() + every, every);
        loop {
            let is_paused = *paused.borrow();
            let due = self.out.next_due();
            let go_on = tokio::select! {
                biased;
                _ = self.tx.closed() => false,
                _ = tokio::time::sleep_until(deadline) => false,
                // the lag may have changed
                _ = changes.changed() => self.wanted(close_epoch) && self.out.flush(&self.tx).await,
                _ = paused.changed() => true,
                _ = tokio::time::sleep_until(due.unwrap_or(deadline)), if due.is_some() => {
                    self.out.flush(&self.tx).await
                }
                _ = tick.tick(), if self.params.bookmarks && !is_paused => {
                    self.bookmark_tick(&mut rx).await
                }
                ev = rx.recv(), if !is_paused => match ev {
                    Ok(ev) => self.live(&ev).await,
                    Err(_) => false,
                },
            };
            if !go_on {
                return;
            }
        }
    }

    /// The events the watch starts with, then (when asked for both) the bookmark that ends
    /// the initial events.
    async fn initial(&mut self, first: &[Arc<WatchEvent>], start_rv: u64) -> bool {
        self.last_rv = start_rv;
        for ev in first {
            if let Some(et) = filtered(ev, &self.sel)
                && !self.send(ev, et).await
            {
                return false;
            }
            self.last_rv = self.last_rv.max(ev.rv);
        }
        if self.params.initial_events && self.params.bookmarks {
            let line = bookmark(&self.rt, start_rv, true);
            return self.out.send(&self.tx, line).await;
        }
        true
    }

    /// Whether the server still serves this watch: its watches were not closed and its
    /// identity is not refused since it started.
    fn wanted(&self, close_epoch: u64) -> bool {
        *self.st.close_epoch.lock() == close_epoch
            && !self.st.faults.read().refused.contains(&self.who)
    }

    fn relevant(&self, ev: &WatchEvent) -> bool {
        ev.gr == self.gr && self.ns.as_deref().is_none_or(|n| n == ev.ns)
    }

    async fn send(&mut self, ev: &WatchEvent, et: &'static str) -> bool {
        let line = self.render.line(ev, et);
        (self.st).count_watch_event(&self.gr, &self.who, line.len() as u64);
        self.out.send(&self.tx, line).await
    }

    /// A change from the live feed: sent when it is new, of this watch and seen by its
    /// selector.
    async fn live(&mut self, ev: &WatchEvent) -> bool {
        if ev.rv > self.last_rv
            && self.relevant(ev)
            && let Some(et) = filtered(ev, &self.sel)
        {
            if !self.send(ev, et).await {
                return false;
            }
            self.last_rv = ev.rv;
        }
        true
    }

    /// A bookmark tick: the changes already received go first, then a bookmark at the
    /// store's version, unless lines are held (a bookmark never overtakes a held event).
    async fn bookmark_tick(&mut self, rx: &mut broadcast::Receiver<Arc<WatchEvent>>) -> bool {
        let now_rv = self.st.store.current_rv();
        loop {
            match rx.try_recv() {
                Ok(ev) => {
                    if ev.rv > self.last_rv
                        && self.relevant(&ev)
                        && let Some(et) = filtered(&ev, &self.sel)
                        && !self.send(&ev, et).await
                    {
                        return false;
                    }
                    self.last_rv = self.last_rv.max(ev.rv);
                }
                Err(broadcast::error::TryRecvError::Empty) => break,
                Err(_) => return false,
            }
        }
        if !self.out.holding() {
            self.last_rv = self.last_rv.max(now_rv);
            let line = bookmark(&self.rt, self.last_rv, false);
            if self.tx.send(line).await.is_err() {
                return false;
            }
        }
        true
    }
}
