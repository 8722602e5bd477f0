//! Helpers shared by the integration tests (included with `mod common;`).
#![allow(dead_code)]

use std::future::Future;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use tidepool_tests::{ADMIN, ApiServer, Config};

pub const CRD_YAML: &str = include_str!("../fixtures/crd-ipamnodes.yaml");

/// Polls `f` until it returns `Some` or `timeout` passes (then panics with `what`).
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until a GET of `name` answers 404 or `timeout` passes (then panics naming it).
pub async fn gone<K>(api: &Api<K>, name: &str, timeout: Duration)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let what = format!("{name} gone");
    eventually(timeout, &what, || async move {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// Sends the tracing log of the code under test (the operator's runtime run in-process) to
/// the test's captured output, which libtest prints when the test fails: a timed-out wait
/// then shows what the operator did meanwhile. `RUST_LOG` overrides the level (info).
pub fn log_to_test_output() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube_client=warn"));
    // a second call (the next test in this binary) finds one installed: that is fine
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

pub fn fast_config() -> Config {
    Config {
        watch_window: 50,
        bookmark_interval: Duration::from_millis(200),
        min_request_timeout: Duration::from_secs(30),
        namespace_finalize_delay: Duration::from_millis(100),
        kubelet_delay: Some(Duration::from_millis(100)),
        ..Config::default()
    }
}

pub async fn start() -> (ApiServer, kube::Client) {
    let server = ApiServer::start_with(fast_config())
        .await
        .expect("start server");
    let client = server.client("tester").await.expect("client");
    (server, client)
}

/// HTTP status code of a kube error (0 for non-API errors).
pub fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        _ => 0,
    }
}

pub fn status(e: &kube::Error) -> &kube::core::Status {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

pub fn ipamnode_resource() -> ApiResource {
    ApiResource {
        group: "ipam.tidepool.dev".into(),
        version: "v1alpha1".into(),
        api_version: "ipam.tidepool.dev/v1alpha1".into(),
        kind: "IPAMNode".into(),
        plural: "ipamnodes".into(),
    }
}

/// Creates the IPAMNode CRD, waits for Established, returns the CR api.
pub async fn install_crd(client: &kube::Client) -> Api<DynamicObject> {
    let crd: CustomResourceDefinition = serde_saphyr::from_str(CRD_YAML).expect("crd yaml");
    create_established(client, &crd).await;
    Api::all_with(client.clone(), &ipamnode_resource())
}

/// Creates `crd` and waits until it is Established.
pub async fn create_established(client: &kube::Client, crd: &CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), crd)
        .await
        .expect("create crd");
    let name = crd.metadata.name.as_deref().expect("a CRD name");
    tokio::time::timeout(
        Duration::from_secs(10),
        await_condition(crds, name, conditions::is_crd_established()),
    )
    .await
    .expect("crd established in time")
    .expect("await condition");
}

pub fn dynamic(v: serde_json::Value) -> DynamicObject {
    serde_json::from_value(v).expect("dynamic object")
}

/// A raw HTTP/1.1 request (Connection: close); returns status, headers (lowercased names) and body.
pub async fn raw(
    server: &ApiServer,
    method: &str,
    path: &str,
    token: Option<String>,
    body: Option<&str>,
) -> (u16, Vec<(String, String)>, String) {
    raw_typed(server, method, path, token, body, "application/json").await
}

/// [`raw`] with the body sent as `content_type`.
pub async fn raw_typed(
    server: &ApiServer,
    method: &str,
    path: &str,
    token: Option<String>,
    body: Option<&str>,
    content_type: &str,
) -> (u16, Vec<(String, String)>, String) {
    let addr = server.addr();
    let method = method.to_string();
    let path = path.to_string();
    let body = body.map(String::from);
    let content_type = content_type.to_string();
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        if let Some(t) = token {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if let Some(b) = &body {
            req.push_str(&format!(
                "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
                b.len()
            ));
        }
        req.push_str("\r\n");
        if let Some(b) = &body {
            req.push_str(b);
        }
        s.write_all(req.as_bytes()).expect("write");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        let mut lines = head.lines();
        let code = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_string()))
            .collect();
        (code, headers, body.to_string())
    })
    .await
    .expect("raw request")
}

/// The operator's service-account identity (`deploy/operator/rbac.yaml` binds its role).
pub const OPERATOR: &str = "system:serviceaccount:tidepool:tidepool-operator";
const OPERATOR_RBAC: &str = include_str!("../../../deploy/operator/rbac.yaml");

/// A bench's setting: `flag`'s value on the command line, else `$env`, else `default`.
pub fn setting(flag: &str, env: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var(env).ok())
        .unwrap_or_else(|| default.to_string())
}

/// The operator's identity as one replica on node `node` (a bound service-account token).
pub fn operator_on(node: &str) -> String {
    format!("{OPERATOR}@{node}")
}

/// The operator runtime's settings for tests: resync every 2 s, passes 50 ms apart, a
/// generous kube budget, one replica without leader election.
pub fn operator_settings() -> tidepool_operator::runtime::Settings {
    tidepool_operator::runtime::Settings {
        engine: tidepool_ipam::EngineConfig {
            resync_interval: Duration::from_secs(2),
            min_pass_interval: Duration::from_millis(50),
            ..tidepool_ipam::EngineConfig::default()
        },
        scheduling: tidepool_ipam::SchedulingMode::Priority,
        kube_api_qps: 200.0,
        kube_api_burst: 100,
        node_selector: Default::default(),
        sync_timeout: Duration::from_secs(20),
        health_addr: None,
        seed: 7,
        taint_exhausted_nodes: false,
        agent_ready_grace: tidepool_operator::runtime::DEFAULT_AGENT_READY_GRACE,
        agent_pods: tidepool_operator::runtime::default_agent_pods(),
        election: None,
    }
}

/// Creates any object, built-in or custom, finding its resource by discovery.
pub async fn create_object(client: &kube::Client, v: serde_json::Value) -> DynamicObject {
    let obj = dynamic(v);
    let gvk = kube::api::GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
    let (ar, caps) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    let api: Api<DynamicObject> = match (caps.scope, obj.metadata.namespace.clone()) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => {
            Api::namespaced_with(client.clone(), &ns, &ar)
        }
        _ => Api::all_with(client.clone(), &ar),
    };
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {:?}: {e}", obj.metadata.name))
}

/// Grants the operator what `deploy/components/taint-exhausted-nodes` adds to its role
/// (`--taint-exhausted-nodes` needs it): the rule that component's JSON patch appends to
/// the ClusterRole (`op: add`, `path: /rules/-`).
pub async fn grant_taint_exhausted_nodes(admin: &kube::Client) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
    const COMPONENT: &str =
        include_str!("../../../deploy/components/taint-exhausted-nodes/kustomization.yaml");
    let k: serde_json::Value = serde_saphyr::from_str(COMPONENT).expect("component yaml");
    let patch = k["patches"]
        .as_array()
        .expect("patches")
        .iter()
        .find(|p| p["target"]["kind"] == "ClusterRole")
        .expect("the ClusterRole's patch");
    let ops: serde_json::Value =
        serde_saphyr::from_str(patch["patch"].as_str().unwrap()).expect("a JSON patch");
    assert_eq!(ops[0]["op"], "add");
    assert_eq!(ops[0]["path"], "/rules/-");
    let rule: PolicyRule = serde_json::from_value(ops[0]["value"].clone()).expect("a rule");
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let name = patch["target"]["name"].as_str().unwrap();
    let mut role = roles.get(name).await.expect("the operator's role");
    role.rules.get_or_insert_default().push(rule);
    roles
        .replace(name, &PostParams::default(), &role)
        .await
        .expect("the component's grant");
}

/// A server with RBAC on, tidepool's three CRDs established and the operator's role
/// granted; the admin's client.
pub async fn operator_cluster() -> (ApiServer, kube::Client) {
    operator_cluster_with(Config {
        rbac: true,
        ..fast_config()
    })
    .await
}

/// [`operator_cluster`] on a server started with `config`.
pub async fn operator_cluster_with(config: Config) -> (ApiServer, kube::Client) {
    let server = ApiServer::start_with(config).await.expect("start server");
    let admin = server.client(ADMIN).await.expect("admin client");
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in tidepool_api::crds() {
        let name = crd.metadata.name.clone().unwrap();
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("crd");
        let established = await_condition(crds.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(Duration::from_secs(10), established)
            .await
            .expect("crd established in time")
            .expect("await condition");
    }
    for doc in OPERATOR_RBAC.split("\n---\n") {
        let v: serde_json::Value = serde_saphyr::from_str(doc).expect("rbac yaml");
        create_object(&admin, v).await;
    }
    (server, admin)
}
