//! The kube client both binaries use: kube's default stack with a read timeout on every
//! request but watches.
//!
//! kube's `Config::read_timeout` is a timeout on the connection's socket reads: it would
//! apply to the watches sharing the client too, and a watch of a quiet resource (no event
//! and no bookmark for the timeout) would be cut and restarted over and over. kube leaves it
//! `None` and guards watches with the watcher's own idle timeout (the watch's
//! `timeoutSeconds`, 290 s, plus 5 s). So this client keeps the socket without one and adds a
//! tower layer that times each request that is not a watch (no `watch=true` in its query):
//! its answer's headers must come within the timeout, and then each piece of its body
//! within the timeout of the one before. An idle timeout rather than a total one: a large
//! list (every pod of a cluster in one `resourceVersion=0` answer) may take longer than the
//! timeout to arrive as a whole, but a server that sends nothing for that long is hung. A
//! hung LIST then fails, and kube's watcher relists after its backoff.
//!
//! The same layer bounds the requests in flight, watches aside, to
//! [`MAX_REQUESTS_IN_FLIGHT`]: kube's HTTP/1.1 client opens one connection per concurrent
//! request and keeps them, so a burst of writes (the kube budget's burst, 100 by default)
//! opened as many connections to the API server (115 at 5,000 nodes). A request holds its
//! place until its answer's body is read or dropped; a watch gives it back with its
//! headers. A client then holds about that many connections plus one per open watch, and
//! a few more: a connection goes back to hyper's pool a moment after its body ends, and a
//! request that starts in that moment opens another (measured: 48 places gave 69
//! connections with six watches; `tests/benches/scale.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use kube::client::ClientBuilder;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::PollSemaphore;
use tower::{Layer, Service};

/// The default read timeout of both binaries' API requests (watches aside).
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests a client has in flight at once, watches aside: with the operator's six watches,
/// its lease client and the pool's slack, under 64 connections to the API server.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 32;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The crate's errors: those of the client's read timeout.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer, or no more of its body, within the read timeout.
    #[error("the API server sent nothing for {0:?} (read timeout)")]
    ReadTimedOut(Duration),
}

/// A client of `config` whose requests, watches aside, time out after `read_timeout` of
/// silence (see the module documentation).
pub fn client(config: kube::Config, read_timeout: Duration) -> Result<kube::Client, kube::Error> {
    let layer = ReadTimeoutLayer::new(read_timeout, MAX_REQUESTS_IN_FLIGHT);
    Ok(ClientBuilder::try_from(config)?.with_layer(&layer).build())
}

/// Whether a request is a watch (`watch=true` or `watch=1`).
fn is_watch(uri: &Uri) -> bool {
    uri.query()
        .unwrap_or("")
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
}

/// The layer of [`ReadTimeout`]; its services share one bound on the requests in flight.
#[derive(Debug, Clone)]
pub struct ReadTimeoutLayer {
    timeout: Duration,
    in_flight: Arc<Semaphore>,
}

impl ReadTimeoutLayer {
    /// Requests time out after `timeout` of silence; at most `in_flight` at once, watches
    /// aside.
    pub fn new(timeout: Duration, in_flight: usize) -> Self {
        ReadTimeoutLayer {
            timeout,
            in_flight: Arc::new(Semaphore::new(in_flight)),
        }
    }
}

impl<S> Layer<S> for ReadTimeoutLayer {
    type Service = ReadTimeout<S>;

    fn layer(&self, inner: S) -> ReadTimeout<S> {
        ReadTimeout {
            inner,
            timeout: self.timeout,
            in_flight: PollSemaphore::new(self.in_flight.clone()),
            place: None,
        }
    }
}

/// Times each request that is not a watch: its headers, then each piece of its body; and
/// is ready only with a place among the requests in flight, which a request keeps until its
/// body is done with (a watch gives it back at once).
#[derive(Debug)]
pub struct ReadTimeout<S> {
    inner: S,
    timeout: Duration,
    in_flight: PollSemaphore,
    /// The place `poll_ready` took for the next `call`.
    place: Option<OwnedSemaphorePermit>,
}

impl<S: Clone> Clone for ReadTimeout<S> {
    fn clone(&self) -> Self {
        ReadTimeout {
            inner: self.inner.clone(),
            timeout: self.timeout,
            in_flight: self.in_flight.clone(),
            place: None,
        }
    }
}

impl<S, ReqBody, B> Service<Request<ReqBody>> for ReadTimeout<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<IdleTimeout<B>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.place.is_none() {
            // the semaphore is never closed
            self.place = std::task::ready!(self.in_flight.poll_acquire(cx));
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let watch = is_watch(req.uri());
        let timeout = (!watch).then_some(self.timeout);
        let place = self.place.take().filter(|_| !watch);
        let answer = self.inner.call(req);
        Box::pin(async move {
            let resp = match timeout {
                None => answer.await.map_err(Into::into)?,
                Some(t) => tokio::time::timeout(t, answer)
                    .await
                    .map_err(|_| ClientError::ReadTimedOut(t))?
                    .map_err(Into::into)?,
            };
            Ok(resp.map(|body| IdleTimeout::new(body, timeout, place)))
        })
    }
}

/// A body whose every frame must come within `timeout` of the one before (or of the
/// headers); `None`: no timeout. It holds its request's place in flight until it ends or
/// is dropped.
pub struct IdleTimeout<B> {
    inner: B,
    timeout: Option<(Duration, Pin<Box<Sleep>>)>,
    place: Option<OwnedSemaphorePermit>,
}

impl<B> IdleTimeout<B> {
    fn new(inner: B, timeout: Option<Duration>, place: Option<OwnedSemaphorePermit>) -> Self {
        let timeout = timeout.map(|t| (t, Box::pin(tokio::time::sleep(t))));
        IdleTimeout {
            inner,
            timeout,
            place,
        }
    }
}

impl<B> Body for IdleTimeout<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let Some((t, sleep)) = &mut this.timeout {
                sleep.as_mut().reset(Instant::now() + *t);
            }
            if frame.is_none() {
                this.place = None;
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let Some((t, sleep)) = &mut this.timeout else {
            return Poll::Pending;
        };
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(ClientError::ReadTimedOut(*t).into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    /// Two places: two answers whose bodies are held fill them (a watch between them takes
    /// none), a third request waits; a body dropped or read to its end frees its place.
    #[tokio::test(start_paused = true)]
    async fn requests_in_flight_are_bounded_until_their_bodies_end() {
        let inner = tower::service_fn(|_: Request<()>| async {
            Ok::<_, BoxError>(Response::new(String::from("an answer")))
        });
        let mut svc = ReadTimeoutLayer::new(Duration::from_secs(30), 2).layer(inner);
        let req = |q: &str| Request::get(format!("/api/v1/pods?{q}")).body(()).unwrap();
        let send = async |svc: &mut ReadTimeout<_>, q: &str| {
            svc.ready().await.unwrap().call(req(q)).await.unwrap()
        };
        let a = send(&mut svc, "limit=1").await;
        let watch = send(&mut svc, "watch=true").await;
        let mut b = send(&mut svc, "limit=2").await;
        let third = tokio::time::timeout(Duration::from_secs(1), svc.ready()).await;
        assert!(third.is_err(), "a third request waits for a place");
        drop(a);
        let c = send(&mut svc, "limit=3").await;
        let third = tokio::time::timeout(Duration::from_secs(1), svc.ready()).await;
        assert!(third.is_err(), "b and c hold both places");
        let body = b.body_mut();
        while futures::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx))
            .await
            .is_some()
        {}
        let d = send(&mut svc, "limit=4").await;
        drop((watch, b, c, d));
    }

    #[test]
    fn watches_are_told_apart() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert!(is_watch(&uri("/api/v1/pods?watch=true&resourceVersion=5")));
        assert!(is_watch(&uri("/api/v1/pods?resourceVersion=5&watch=1")));
        assert!(!is_watch(&uri("/api/v1/pods?limit=100")));
        assert!(!is_watch(&uri("/api/v1/namespaces/a/pods/watch")));
        assert!(!is_watch(&uri("/api/v1/pods?watch=false")));
    }
}
