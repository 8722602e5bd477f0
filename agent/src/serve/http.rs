//! The socket: HTTP/1.1 over a unix socket (hyper), routed to the [`Agent`]'s handlers; each
//! CNI request counted and timed from its receipt to its reply ([`crate::observe`]).

use std::convert::Infallible;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::agent::Agent;
use super::request::{CniRequest, Reply};
use crate::cni::proto::{Verb, code};
use crate::error::{Error, Result};
use crate::observe::{self, CniOutcome};

/// The largest request body read (the plugin caps the network config at 1 MiB).
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// The bound socket.
#[derive(Debug)]
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
}

impl Server {
    /// Binds `path` with mode 0600. A stale socket there is removed (the state-dir lock
    /// already proved no other agent runs); anything else there is an error. The socket is
    /// bound under a temporary name, given mode 0600 and renamed into place, so it is never
    /// reachable with wider permissions. The backlog is the kernel's maximum
    /// (`net.core.somaxconn`: tokio listens with -1), since the plugin has no connect
    /// timeout of its own besides its retry loop. Needs a tokio runtime.
    pub fn bind(path: &Path) -> Result<Server> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(Error::io("create", parent))?;
        }
        remove_stale(path)?;
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp_name);
        remove_stale(&tmp)?;
        let listener = UnixListener::bind(&tmp).map_err(Error::io("bind", &tmp))?;
        let perms = std::fs::Permissions::from_mode(0o600);
        std::fs::set_permissions(&tmp, perms).map_err(Error::io("chmod 0600", &tmp))?;
        std::fs::rename(&tmp, path).map_err(Error::io("rename the socket to", path))?;
        Ok(Server {
            listener,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves until `stop` is cancelled; each connection on its own task. Then it closes
    /// every open connection and returns once their tasks are gone, so nothing of the agent
    /// runs on (a connection held open by a hung plugin must not keep the agent, and with it
    /// its state directory's lock, alive).
    pub async fn serve(self, agent: Agent, stop: CancellationToken) {
        let mut connections = JoinSet::new();
        loop {
            let stream = tokio::select! {
                () = stop.cancelled() => break,
                Some(_) = connections.join_next() => continue,
                accepted = self.listener.accept() => match accepted {
                    Ok((s, _)) => s,
                    Err(e) => {
                        // out of descriptors and the like: back off a little, keep serving
                        tracing::warn!(error = %e, socket = %self.path.display(), "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
            };
            connections.spawn(connection(agent.clone(), stream));
        }
        connections.shutdown().await;
    }

    /// [`Server::serve`] on a task of its own.
    pub fn spawn(self, agent: Agent, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.serve(agent, stop))
    }
}

/// One plugin connection, served until the plugin closes it.
async fn connection(agent: Agent, stream: UnixStream) {
    let svc = service_fn(move |req| {
        let agent = agent.clone();
        async move { Ok::<_, Infallible>(route(&agent, req).await) }
    });
    if let Err(e) = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), svc)
        .await
    {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Removes `path` if it is a socket; nothing there is fine; anything else is refused.
fn remove_stale(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(Error::io("remove the stale socket", path))
        }
        Ok(_) => Err(Error::Config(format!(
            "{} exists and is not a socket: refusing to replace it",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("stat", path)(e)),
    }
}

async fn route(agent: &Agent, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let reply = match (method, path.as_str()) {
        (Method::GET, "/v1/allocations") => agent.allocations().await,
        (Method::GET, "/v1/reconcile") => agent.reconcile_report(),
        (Method::POST, p) if p.starts_with("/v1/cni/") => match Verb::from_path(p) {
            Some(verb) => observed(agent, verb, req).await,
            None => {
                let verb = &p["/v1/cni/".len()..];
                let mut r = Reply::error(code::GENERIC, "no such CNI verb", verb.to_owned());
                r.status = 404;
                r
            }
        },
        (_, "/v1/allocations" | "/v1/reconcile") => not_allowed("GET"),
        (_, p) if p.starts_with("/v1/cni/") => not_allowed("POST"),
        (_, p) => {
            let mut r = Reply::error(code::GENERIC, "no such endpoint", p.to_owned());
            r.status = 404;
            r
        }
    };
    respond(&reply)
}

/// A CNI request answered, counted by verb and outcome and timed from its receipt (the
/// request head read) to its reply.
async fn observed(agent: &Agent, verb: Verb, req: Request<Incoming>) -> Reply {
    let received = tokio::time::Instant::now();
    let (reply, outcome) = cni(agent, verb, req).await;
    observe::cni_request(verb, outcome, received.elapsed());
    reply
}

async fn cni(agent: &Agent, verb: Verb, req: Request<Incoming>) -> (Reply, CniOutcome) {
    let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let r = Reply::error(
                code::DECODING_FAILURE,
                "could not read the request body",
                e.to_string(),
            );
            return (r, CniOutcome::Error);
        }
    };
    let req = match CniRequest::parse(&body) {
        Ok(r) => r,
        Err(reply) => return (reply, CniOutcome::Error),
    };
    let reply = match verb {
        Verb::Del => return agent.del_observed(req).await,
        Verb::Add => agent.add(req).await,
        Verb::Check => agent.check(req).await,
        Verb::Gc => agent.gc(req).await,
        Verb::Status => agent.status(req).await,
    };
    let outcome = CniOutcome::of_reply(&reply);
    (reply, outcome)
}

fn not_allowed(allowed: &str) -> Reply {
    let mut r = Reply::error(
        code::GENERIC,
        "method not allowed",
        format!("use {allowed}"),
    );
    r.status = 405;
    r
}

fn respond(reply: &Reply) -> Response<Full<Bytes>> {
    let body = Bytes::from(reply.body.to_string());
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}
