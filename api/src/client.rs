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

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use kube::client::ClientBuilder;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// The default read timeout of both binaries' API requests (watches aside).
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

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
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&ReadTimeoutLayer(read_timeout))
        .build())
}

/// Whether a request is a watch (`watch=true` or `watch=1`).
fn is_watch(uri: &Uri) -> bool {
    uri.query()
        .unwrap_or("")
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
}

/// The layer of [`ReadTimeout`].
#[derive(Debug, Clone, Copy)]
pub struct ReadTimeoutLayer(pub Duration);

impl<S> Layer<S> for ReadTimeoutLayer {
    type Service = ReadTimeout<S>;

    fn layer(&self, inner: S) -> ReadTimeout<S> {
        ReadTimeout {
            inner,
            timeout: self.0,
        }
    }
}

/// Times each request that is not a watch: its headers, then each piece of its body.
#[derive(Debug, Clone)]
pub struct ReadTimeout<S> {
    inner: S,
    timeout: Duration,
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
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let timeout = (!is_watch(req.uri())).then_some(self.timeout);
        let answer = self.inner.call(req);
        Box::pin(async move {
            let resp = match timeout {
                None => answer.await.map_err(Into::into)?,
                Some(t) => tokio::time::timeout(t, answer)
                    .await
                    .map_err(|_| ClientError::ReadTimedOut(t))?
                    .map_err(Into::into)?,
            };
            Ok(resp.map(|body| IdleTimeout::new(body, timeout)))
        })
    }
}

/// A body whose every frame must come within `timeout` of the one before (or of the
/// headers); `None`: no timeout.
pub struct IdleTimeout<B> {
    inner: B,
    timeout: Option<(Duration, Pin<Box<Sleep>>)>,
}

impl<B> IdleTimeout<B> {
    fn new(inner: B, timeout: Option<Duration>) -> Self {
        let timeout = timeout.map(|t| (t, Box::pin(tokio::time::sleep(t))));
        IdleTimeout { inner, timeout }
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
