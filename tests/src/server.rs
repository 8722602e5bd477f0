//! The public handle: start the server on 127.0.0.1, hand out identities (bearer tokens,
//! kubeconfigs, kube clients), inject faults at runtime, read request counters.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::{Mutex, RwLock};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admission_policy::PoliciesCache;
use crate::error::{Error, Result};
use crate::identity::UserInfo;
use crate::rbac::PolicyCache;
use crate::store::Store;
use crate::tls::Tls;
use crate::watch_lag::{Hold, WatchLag};

/// Server configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Events retained per resource type for watch resumption; older resourceVersions get
    /// 410 Gone (the real server's watch cache window).
    pub watch_window: usize,
    /// Interval between watch bookmarks (for watches that allow them). The real server sends
    /// one about every minute.
    pub bookmark_interval: Duration,
    /// Watches without `timeoutSeconds` end after a random time in `[t, 2t)`, like the real
    /// server's `--min-request-timeout` (default 1800 s).
    pub min_request_timeout: Duration,
    /// How long a deleted namespace stays Terminating before its content and itself are
    /// removed (the namespace controller's delay).
    pub namespace_finalize_delay: Duration,
    /// Pods bound to a node are deleted gracefully (they stay with a deletionTimestamp); a
    /// simulated kubelet then deletes them with grace 0 after this delay. `None`: no kubelet,
    /// they stay terminating until someone deletes them with `gracePeriodSeconds=0`.
    pub kubelet_delay: Option<Duration>,
    /// A deleted CRD turns Terminating and its objects are deleted one by one, finalizers
    /// honoured; the CRD goes once none is left, as kube-apiserver's CRD finalizer controller
    /// does. This is how often that controller looks (the real one every 5 s). `None`: a
    /// CRD's objects go at once with it.
    pub crd_cleanup_interval: Option<Duration>,
    /// Authorize every request with RBAC (Role, ClusterRole, RoleBinding, ClusterRoleBinding
    /// objects; see `rbac.rs`). Off: every identity may do everything.
    pub rbac: bool,
    /// Serve HTTPS with a self-signed certificate that the kubeconfigs trust (see `tls.rs`;
    /// kubectl sends its token only over TLS).
    pub tls: bool,
    /// The `gitVersion` `/version` reports (major and minor follow it). Below `v1.31` the
    /// server is a 1.30 one with its default feature gates: CustomResourceFieldSelectors is
    /// off, so a CRD's `selectableFields` are dropped when it is written and a field selector
    /// on such a field is answered 400 `field label not supported: …`.
    pub git_version: String,
    /// Continue tokens older than this are expired (410 with a token that goes on from the
    /// latest state; see `paging.rs`), as after an etcd compaction: kube-apiserver
    /// compacts every 5 minutes by default (`--etcd-compaction-interval`). `None`: never.
    pub continue_max_age: Option<Duration>,
}

impl Config {
    /// Whether CRD `selectableFields` are served (Kubernetes ≥ 1.31, where
    /// CustomResourceFieldSelectors is on by default).
    pub fn crd_field_selectors(&self) -> bool {
        crate::discovery::major_minor(&self.git_version) >= (1, 31)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            watch_window: 1000,
            bookmark_interval: Duration::from_secs(60),
            min_request_timeout: Duration::from_secs(1800),
            namespace_finalize_delay: Duration::from_secs(1),
            kubelet_delay: Some(Duration::from_millis(100)),
            crd_cleanup_interval: Some(Duration::from_millis(200)),
            rbac: false,
            tls: false,
            git_version: "v1.33.0-tidepool".into(),
            continue_max_age: Some(Duration::from_secs(300)),
        }
    }
}

/// Faults to inject; change them at any time with [`ApiServer::set_faults`].
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Share (0.0–1.0) of resource requests answered with `error_code` instead of being served.
    pub error_rate: f64,
    /// 429 (TooManyRequests, with Retry-After), 503 (ServiceUnavailable), 504 (Timeout);
    /// anything else (including 0) means 500 (InternalError).
    pub error_code: u16,
    /// Retry-After seconds sent with 429s.
    pub retry_after_secs: u64,
    /// Only these verbs (`get`, `list`, `watch`, `create`, `update`, `patch`, `apply`,
    /// `delete`, `deletecollection`) get errors; empty means all.
    pub error_verbs: BTreeSet<String>,
    /// Latency added before every request is served.
    pub latency: Duration,
    /// Identities whose requests are refused: their connections are closed without an answer
    /// and their open watches end (a network partition of that client).
    pub refused: BTreeSet<String>,
    /// Watches are closed after this long (watches closed early).
    pub watch_max: Option<Duration>,
    /// Faults of one identity's requests on one resource (the first match applies).
    pub targeted: Vec<TargetedFault>,
    /// One identity's watches of one resource held back (the first match applies; see
    /// [`ApiServer::lag_watch`]).
    pub watch_lag: Vec<WatchLag>,
}

/// A fault of one identity's requests on one resource, applied after authentication and
/// authorization: how a slow or failing storage key, or API priority and fairness throttling
/// one flow (leader election has its own priority level), looks to that client. For
/// example only replica A's Lease updates fail while its other writes go through.
#[derive(Debug, Clone, Default)]
pub struct TargetedFault {
    /// The identity string (as given to [`ApiServer::token`]).
    pub identity: String,
    /// `plural[.group][/subresource]`, as [`ApiServer::requests`] names it.
    pub resource: String,
    /// Verbs hit (as [`Faults::error_verbs`]); empty means all.
    pub verbs: BTreeSet<String>,
    /// Added before the request is served or refused (with `verbs` `list`: before each
    /// page of a list, a slow LIST).
    pub latency: Duration,
    /// Answered instead of serving (as [`Faults::error_code`]: 429, 503, 504, else 500);
    /// None: served after the latency.
    pub error_code: Option<u16>,
    /// A hung response: the answer's headers and its first this many bytes of body are
    /// sent, then nothing more (the body never ends; the connection stays open). Not for
    /// watches.
    pub hang_after_bytes: Option<usize>,
}

/// A write the server accepted: stored, not a dry run (see [`ApiServer::accepted_writes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedWrite {
    /// When the write was stored.
    pub at: std::time::Instant,
    /// The identity string of the writer.
    pub identity: String,
    /// create, update, patch, apply or delete.
    pub verb: String,
    /// `plural[.group][/subresource]`.
    pub resource: String,
    pub namespace: Option<String>,
    pub name: String,
    /// The object's resourceVersion after the write.
    pub resource_version: String,
}

/// A LIST the server answered (see [`ApiServer::lists`]): what a client asked for and what
/// one response carried, as kube-apiserver's audit log and `apiserver_response_sizes` tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListRequest {
    /// The identity string of the requester.
    pub identity: String,
    /// `plural[.group]`.
    pub resource: String,
    /// The `limit` the client asked for (served whole when `resourceVersion=0`).
    pub limit: Option<u64>,
    /// The `resourceVersion` parameter as sent ("" when none).
    pub resource_version: String,
    /// Whether it continued an earlier page.
    pub continued: bool,
    /// Items in this response.
    pub items: usize,
    /// The response body's bytes.
    pub bytes: u64,
}

/// A resource request the server answered with an error `Status`, as the real server's
/// audit log records it (an event's `user`, `verb`, `objectRef` and `responseStatus`): to
/// check that a client was never refused (no 403 of RBAC, no admission denial) and, for a
/// request that was, in which words (see [`ApiServer::failed_requests`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRequest {
    /// The identity string of the requester.
    pub identity: String,
    /// As in [`ApiServer::requests`]: get, list, watch, create, update, patch, apply, …
    pub verb: String,
    /// `plural[.group][/subresource]`.
    pub resource: String,
    pub namespace: Option<String>,
    /// The object's name, when the request names one.
    pub name: Option<String>,
    /// The HTTP status code (403 for RBAC and admission refusals).
    pub code: u16,
    /// The Status `reason` (`Forbidden`, `NotFound`, `Conflict`, …).
    pub reason: String,
    /// The Status `message`: the server's words.
    pub message: String,
}

impl FailedRequest {
    /// Whether authorization or an admission policy refused it (rather than, say, a
    /// conflict or a missing object): a 403, or a ValidatingAdmissionPolicy's denial with
    /// a reason of its own.
    pub fn is_refusal(&self) -> bool {
        self.code == 403 || self.message.contains("denied request")
    }
}

pub(crate) struct State {
    pub store: Store,
    pub config: Config,
    pub faults: RwLock<Faults>,
    /// Bumped on every fault change or forced watch close; watches re-check on change.
    pub changes: watch::Sender<u64>,
    pub close_epoch: Mutex<u64>,
    pub paused: watch::Sender<bool>,
    /// Bearer token → (identity string, the user it authenticates as).
    pub tokens: RwLock<HashMap<String, (String, Arc<UserInfo>)>>,
    pub counters: Mutex<BTreeMap<(String, String), u64>>,
    /// Request body bytes by `(verb, resource)` (kube-apiserver's
    /// `apiserver_request_body_size_bytes`, "broken out by resource and verb").
    pub request_bytes: Mutex<BTreeMap<(String, String), u64>>,
    /// Watch event bytes sent, by resource and watcher (`apiserver_watch_events_sizes`,
    /// here also per identity: what one client was delivered).
    pub watch_bytes: Mutex<BTreeMap<(String, String), u64>>,
    pub writes: Mutex<Vec<AcceptedWrite>>,
    pub failed: Mutex<Vec<FailedRequest>>,
    pub lists: Mutex<Vec<ListRequest>>,
    pub addr: SocketAddr,
    pub tls: Option<Tls>,
    pub policy: PolicyCache,
    pub admission_policies: PoliciesCache,
}

impl State {
    pub(crate) fn count(&self, verb: &str, resource: &str) {
        *self
            .counters
            .lock()
            .entry((verb.to_string(), resource.to_string()))
            .or_default() += 1;
    }

    pub(crate) fn count_body(&self, verb: &str, resource: &str, bytes: u64) {
        *self
            .request_bytes
            .lock()
            .entry((verb.to_string(), resource.to_string()))
            .or_default() += bytes;
    }

    pub(crate) fn count_watch_event(&self, resource: &str, identity: &str, bytes: u64) {
        *self
            .watch_bytes
            .lock()
            .entry((resource.to_string(), identity.to_string()))
            .or_default() += bytes;
    }
}

/// A running in-process Kubernetes API server on 127.0.0.1.
pub struct ApiServer {
    state: Arc<State>,
    shutdown: watch::Sender<bool>,
}

impl ApiServer {
    /// Starts a server with the default configuration on an ephemeral port.
    pub async fn start() -> Result<Self> {
        Self::start_with(Config::default()).await
    }

    /// Starts a server on an ephemeral port of 127.0.0.1.
    pub async fn start_with(config: Config) -> Result<Self> {
        Self::bind(config, "127.0.0.1:0".parse().expect("addr")).await
    }

    /// Starts a server on the given address.
    pub async fn bind(config: Config, addr: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let tls = if config.tls {
            Some(Tls::self_signed()?)
        } else {
            None
        };
        let state = Arc::new(State {
            store: Store::new(config.watch_window, config.crd_field_selectors()),
            config,
            faults: RwLock::new(Faults::default()),
            changes: watch::channel(0).0,
            close_epoch: Mutex::new(0),
            paused: watch::channel(false).0,
            tokens: RwLock::new(HashMap::new()),
            counters: Mutex::new(BTreeMap::new()),
            request_bytes: Mutex::new(BTreeMap::new()),
            watch_bytes: Mutex::new(BTreeMap::new()),
            writes: Mutex::new(Vec::new()),
            failed: Mutex::new(Vec::new()),
            lists: Mutex::new(Vec::new()),
            addr,
            tls,
            policy: PolicyCache::default(),
            admission_policies: PoliciesCache::default(),
        });
        tracing::info!(%addr, "in-process Kubernetes API server listening");
        let (shutdown, mut stop) = watch::channel(false);
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let conn = tokio::select! {
                    c = listener.accept() => c,
                    _ = stop.changed() => break,
                };
                let Ok((stream, _)) = conn else { continue };
                let _ = stream.set_nodelay(true);
                let st = st.clone();
                let mut stop = stop.clone();
                tokio::spawn(async move {
                    let acceptor = st.tls.as_ref().map(|t| t.acceptor.clone());
                    let svc = service_fn(move |req| crate::http::handle(st.clone(), req));
                    let http = http1::Builder::new();
                    let served = async {
                        match acceptor {
                            None => {
                                let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                            }
                            Some(acceptor) => {
                                if let Ok(tls) = acceptor.accept(stream).await {
                                    let _ = http.serve_connection(TokioIo::new(tls), svc).await;
                                }
                            }
                        }
                    };
                    tokio::select! {
                        _ = served => {}
                        _ = stop.changed() => {}
                    }
                });
            }
        });
        Ok(ApiServer { state, shutdown })
    }

    /// `http://127.0.0.1:PORT`, or `https://` with [`Config::tls`].
    pub fn url(&self) -> String {
        let scheme = if self.state.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.state.addr)
    }

    /// The socket address served.
    pub fn addr(&self) -> SocketAddr {
        self.state.addr
    }

    /// The bearer token of an identity (created on first use; see [`UserInfo`] for what an
    /// identity string names: `admin`, `system:serviceaccount:NS:NAME`, a suffix `@NODE`).
    pub fn token(&self, identity: &str) -> String {
        let mut t = self.state.tokens.write();
        if let Some((tok, _)) = t.iter().find(|(_, (id, _))| id == identity) {
            return tok.clone();
        }
        let user = UserInfo::from_identity(identity, |node| self.node_uid(node));
        let tok = format!("{identity}-{:016x}", self.state.store.random());
        t.insert(tok.clone(), (identity.to_string(), Arc::new(user)));
        tok
    }

    /// The user an identity authenticates as.
    pub fn user(&self, identity: &str) -> UserInfo {
        let tok = self.token(identity);
        (*self.state.tokens.read()[&tok].1).clone()
    }

    fn node_uid(&self, node: &str) -> Option<String> {
        let nodes = self.state.store.resolve("", "v1", "nodes")?;
        let obj = self.state.store.get(&nodes, "", node).ok()?;
        obj["metadata"]["uid"].as_str().map(String::from)
    }

    /// A kubeconfig (JSON, which is also YAML) for `identity`, default namespace `default`.
    pub fn kubeconfig(&self, identity: &str) -> String {
        let v = serde_json::json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "tidepool",
            "clusters": [{"name": "tidepool", "cluster": self.cluster()}],
            "users": [{"name": identity, "user": {"token": self.token(identity)}}],
            "contexts": [{"name": "tidepool", "context": {"cluster": "tidepool", "user": identity, "namespace": "default"}}],
        });
        serde_json::to_string_pretty(&v).expect("serialise")
    }

    /// A kubeconfig's cluster entry: the URL and, with TLS, the certificate as its CA.
    fn cluster(&self) -> serde_json::Value {
        use base64::Engine as _;
        let mut c = serde_json::json!({"server": self.url()});
        if let Some(tls) = &self.state.tls {
            c["certificate-authority-data"] = base64::engine::general_purpose::STANDARD
                .encode(&tls.cert_pem)
                .into();
        }
        c
    }

    /// Writes [`kubeconfig`](Self::kubeconfig) to `path`.
    pub fn write_kubeconfig(&self, identity: &str, path: &Path) -> Result<()> {
        std::fs::write(path, self.kubeconfig(identity))?;
        Ok(())
    }

    /// A kube client configuration for `identity`.
    pub async fn kube_config(&self, identity: &str) -> Result<kube::Config> {
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig(identity))
            .map_err(|e| Error::KubeConfig(e.to_string()))?;
        kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| Error::KubeConfig(e.to_string()))
    }

    /// A kube client for `identity`.
    pub async fn client(&self, identity: &str) -> Result<kube::Client> {
        let cfg = self.kube_config(identity).await?;
        kube::Client::try_from(cfg).map_err(|e| Error::KubeConfig(e.to_string()))
    }

    /// Replaces the injected faults.
    pub fn set_faults(&self, faults: Faults) {
        *self.state.faults.write() = faults;
        self.state.changes.send_modify(|g| *g += 1);
    }

    /// Changes the injected faults in place.
    pub fn update_faults(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.state.faults.write());
        self.state.changes.send_modify(|g| *g += 1);
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        self.state.faults.read().clone()
    }

    /// Pauses (or resumes) the fan-out of events to every watch; events queue meanwhile.
    pub fn pause_watches(&self, paused: bool) {
        self.state.paused.send_replace(paused);
    }

    /// Holds back `identity`'s watch events of `resource` (`plural[.group]`) from now on:
    /// [`Hold::Paused`] until [`ApiServer::resume_watch`], or each by a fixed delay. They
    /// are delivered later, in order (a lagging watch, not a lost one); other identities'
    /// watches, and this identity's other resources, flow as before.
    pub fn lag_watch(&self, identity: &str, resource: &str, hold: Hold) {
        self.update_faults(|f| {
            f.watch_lag
                .retain(|l| l.identity != identity || l.resource != resource);
            f.watch_lag.push(WatchLag {
                identity: identity.to_owned(),
                resource: resource.to_owned(),
                hold,
            });
        });
    }

    /// Ends [`ApiServer::lag_watch`]'s hold: what was held is delivered now, in order.
    pub fn resume_watch(&self, identity: &str, resource: &str) {
        self.update_faults(|f| {
            f.watch_lag
                .retain(|l| l.identity != identity || l.resource != resource)
        });
    }

    /// Ends every open watch now (clients then resume from their last resourceVersion).
    pub fn close_watches(&self) {
        *self.state.close_epoch.lock() += 1;
        self.state.changes.send_modify(|g| *g += 1);
    }

    /// Requests served so far, by `(verb, resource)`; resource is `plural[.group][/subresource]`
    /// and verb one of get, list, watch, create, update, patch, apply, delete,
    /// deletecollection. Non-resource requests count as `("get", path)`.
    pub fn requests(&self) -> BTreeMap<(String, String), u64> {
        self.state.counters.lock().clone()
    }

    /// Requests of one verb on one resource.
    pub fn request_count(&self, verb: &str, resource: &str) -> u64 {
        self.state
            .counters
            .lock()
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Request body bytes received so far by `(verb, resource)`, as
    /// [`ApiServer::requests`] names them (kube-apiserver's
    /// `apiserver_request_body_size_bytes`: the body's length as sent).
    pub fn request_bytes(&self) -> BTreeMap<(String, String), u64> {
        self.state.request_bytes.lock().clone()
    }

    /// Watch event bytes delivered so far to `identity`'s watches of `resource`
    /// (`plural[.group]`; each event's JSON line: `apiserver_watch_events_sizes`).
    pub fn watch_bytes(&self, resource: &str, identity: &str) -> u64 {
        let key = (resource.to_string(), identity.to_string());
        self.state
            .watch_bytes
            .lock()
            .get(&key)
            .copied()
            .unwrap_or(0)
    }

    /// Every write accepted so far, in the order stored, with its time and writer: to check
    /// who wrote what when (for example that a deposed leader wrote nothing after its
    /// successor's first write).
    pub fn accepted_writes(&self) -> Vec<AcceptedWrite> {
        self.state.writes.lock().clone()
    }

    /// Every resource request answered with an error Status so far, in order, with its
    /// requester and the server's words: the audit log's failed events. Refusals (RBAC,
    /// admission) are those with [`FailedRequest::is_refusal`]; requests dropped for an
    /// injected identity refusal ([`Faults::refused`]) get no answer and are not in it.
    pub fn failed_requests(&self) -> Vec<FailedRequest> {
        self.state.failed.lock().clone()
    }

    /// Every LIST answered so far, in order: its requester, its `limit` and
    /// `resourceVersion`, and the items and bytes of the response.
    pub fn lists(&self) -> Vec<ListRequest> {
        self.state.lists.lock().clone()
    }

    /// Resets the request counters (not the logs of writes, failures and lists).
    pub fn reset_counters(&self) {
        self.state.counters.lock().clear();
        self.state.request_bytes.lock().clear();
        self.state.watch_bytes.lock().clear();
    }

    /// The latest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.state.store.current_rv()
    }

    /// Stops accepting connections and closes open ones.
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
