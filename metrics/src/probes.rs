//! `/healthz` (the process serves) and `/readyz` (the binary says it is ready) on
//! `--health-addr`: what Kubernetes' liveness and readiness probes ask, for both binaries
//! (feature `probes`). What "ready" means is the binary's: the operator's watches have synced
//! and its engine runs; the agent has restored its state and serves its socket.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Whether the binary is ready (initially not); shared with the health server.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

fn answer(path: &str, ready: bool) -> (StatusCode, &'static str) {
    match path {
        "/healthz" | "/livez" => (StatusCode::OK, "ok\n"),
        "/readyz" if ready => (StatusCode::OK, "ok\n"),
        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        _ => (StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// Binds `addr` (so a port in use fails at start), then serves on a task of its own for as
/// long as the runtime runs; returns the bound address (`addr` with port 0: the port taken).
pub async fn serve(addr: SocketAddr, ready: Readiness) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // out of descriptors and the like: back off instead of spinning
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            };
            let ready = ready.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (code, body) = answer(req.uri().path(), ready.get());
                    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                    *resp.status_mut() = code;
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readyz_follows_readiness_healthz_does_not() {
        assert_eq!(answer("/healthz", false).0, StatusCode::OK);
        assert_eq!(answer("/readyz", false).0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer("/readyz", true).0, StatusCode::OK);
        assert_eq!(answer("/metrics", true).0, StatusCode::NOT_FOUND);
    }
}
