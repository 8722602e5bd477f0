//! The HTTP/1.1 server behind `/metrics` and the probes, with limits so that idle or slow
//! clients cannot take the process's descriptors (issue 27, defect 5):
//! - a client has [`HEADER_READ_TIMEOUT`] to send a request's head, counted from its
//!   connection's first poll and again after each response (so it is also the keep-alive idle
//!   limit); then the connection is closed;
//! - at most [`MAX_CONNECTIONS`] connections are open. A connection accepted at the cap closes
//!   the oldest open connection that had nothing to read when last read, else the oldest not
//!   read yet, else the oldest: accept never waits, and a prober that sends its request at once
//!   is not shut out by connections that send nothing.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;

/// How long a client has to send a request's head, and to start the next one on a kept-alive
/// connection.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How many connections one server keeps open at most.
pub const MAX_CONNECTIONS: usize = 64;

/// The accept queue's length asked for (the kernel caps it at `net.core.somaxconn`, 4096 by
/// default since Linux 5.4; tokio's `TcpListener::bind` asks for 1,024): long enough that
/// connections waiting to be accepted in a flood do not fill it, which would make the kernel
/// drop a prober's SYN (retried only after 1 s).
const BACKLOG: u32 = 4096;

/// Binds `addr` for [`serve`], with a long accept queue ([`BACKLOG`]). Call it inside a Tokio
/// runtime.
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// A server's limits: [`HEADER_READ_TIMEOUT`] and [`MAX_CONNECTIONS`] (tests use smaller ones).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

impl Limits {
    pub const DEFAULT: Self = Self {
        header_read_timeout: HEADER_READ_TIMEOUT,
        max_connections: MAX_CONNECTIONS,
    };
}

pub(crate) type Answer = Response<Full<Bytes>>;

/// A response with `code` and the text `body`.
pub(crate) fn text(code: StatusCode, body: impl Into<Bytes>, content_type: &'static str) -> Answer {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

/// Serves `listener` for ever under `limits`, answering each request with `answer`.
pub(crate) async fn serve<F, Fut>(listener: TcpListener, limits: Limits, answer: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    let table = Arc::new(Mutex::new(Table::default()));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // out of descriptors and the like: back off instead of spinning
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let slot = Table::admit(&table, limits.max_connections);
        tokio::spawn(serve_connection(stream, slot, limits, answer.clone()));
        // let the new connection be read before the next accept can close it
        tokio::task::yield_now().await;
    }
}

async fn serve_connection<F, Fut>(stream: TcpStream, slot: Slot, limits: Limits, answer: F)
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    let Slot {
        guard,
        heard,
        mut closed,
    } = slot;
    let io = TokioIo::new(Heard {
        inner: stream,
        heard,
    });
    let svc = service_fn(move |req| {
        let fut = answer(req);
        async move { Ok::<_, Infallible>(fut.await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection(io, svc);
    tokio::select! {
        _ = conn => {}
        _ = &mut closed => {}
    }
    drop(guard);
}

/// What was seen of a connection's client, in the order the table closes them at the cap.
const SILENT: u8 = 0; // read, and nothing was there
const UNREAD: u8 = 1; // not read yet
const HEARD: u8 = 2; // sent something

/// One open connection as the table holds it.
struct Entry {
    /// [`SILENT`], [`UNREAD`] or [`HEARD`].
    heard: Arc<AtomicU8>,
    /// Dropping it closes the connection.
    _close: oneshot::Sender<()>,
}

/// The open connections of one server, oldest first (ids only grow).
#[derive(Default)]
struct Table {
    next: u64,
    open: BTreeMap<u64, Entry>,
}

/// What a connection's task holds: its place in the table (freed on drop), whether its client
/// has sent anything, and the signal that the table closed it.
struct Slot {
    guard: SlotGuard,
    heard: Arc<AtomicU8>,
    closed: oneshot::Receiver<()>,
}

struct SlotGuard {
    id: u64,
    table: Arc<Mutex<Table>>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table.open.remove(&self.id);
    }
}

impl Table {
    /// A slot for a new connection; at `cap`, first closes the oldest connection that was
    /// [`SILENT`], else the oldest [`UNREAD`], else the oldest.
    fn admit(this: &Arc<Mutex<Self>>, cap: usize) -> Slot {
        let mut table = this.lock().unwrap_or_else(PoisonError::into_inner);
        while table.open.len() >= cap.max(1) {
            let victim = table
                .open
                .iter()
                .min_by_key(|(_, e)| e.heard.load(Ordering::Relaxed))
                .map(|(id, _)| *id);
            let Some(victim) = victim else { break };
            table.open.remove(&victim);
        }
        let id = table.next;
        table.next += 1;
        let heard = Arc::new(AtomicU8::new(UNREAD));
        let (close, closed) = oneshot::channel();
        table.open.insert(
            id,
            Entry {
                heard: heard.clone(),
                _close: close,
            },
        );
        Slot {
            guard: SlotGuard {
                id,
                table: this.clone(),
            },
            heard,
            closed,
        }
    }
}

/// A stream that records whether anything was read from it ([`SILENT`], [`HEARD`]).
struct Heard {
    inner: TcpStream,
    heard: Arc<AtomicU8>,
}

impl AsyncRead for Heard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.heard.store(HEARD, Ordering::Relaxed);
        } else {
            let _ =
                self.heard
                    .compare_exchange(UNREAD, SILENT, Ordering::Relaxed, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Heard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
