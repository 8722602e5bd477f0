//! `/healthz` (the process serves) and `/readyz` (the binary says it is ready) on
//! `--health-addr`: what Kubernetes' liveness and readiness probes ask, for both binaries
//! (feature `probes`). What "ready" means is the binary's: the operator's watches have synced
//! and its engine runs; the agent has restored its state and serves its socket.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::http_server::{self, Limits};
use hyper::StatusCode;

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
/// long as the runtime runs, under the limits of [`http_server`](crate::http_server) (a
/// header-read and keep-alive idle timeout, a connection cap); returns the bound address
/// (`addr` with port 0: the port taken).
pub async fn serve(addr: SocketAddr, ready: Readiness) -> std::io::Result<SocketAddr> {
    let listener = http_server::bind(addr)?;
    let local = listener.local_addr()?;
    tokio::spawn(http_server::serve(listener, Limits::DEFAULT, move |req| {
        let (code, body) = answer(req.uri().path(), ready.get());
        async move { http_server::text(code, body, "text/plain; charset=utf-8") }
    }));
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
