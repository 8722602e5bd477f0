//! The system harness: set-ups the agent's integration tests and benches share, included by
//! path (`#[path = "../../tests/tests/system/mod.rs"] mod common;`). It lives here, next to
//! the API server it starts, but only the agent package compiles it: it runs the
//! `tidepool-cni` and `tidepool-agent` binaries through `env!("CARGO_BIN_EXE_…")`, which
//! Cargo sets only for the tests and benches of the package that builds them.
//!
//! What it holds: an in-process API server with RBAC, the CRDs, both roles and the agent's
//! own-node policy; objects as the operator creates them; the plugin binary run as a runtime
//! runs it; the agent run in a temp dir, pods on its node and its socket read ([`running`]);
//! the agent binary ([`agent_process`]); a real Prometheus and promtool ([`prometheus`]), and
//! what every binary's /metrics says of its process ([`process_metrics`]); the
//! whole system with stand-ins for the scheduler, the kubelets and the Deployment controller,
//! and its judgement ([`e2e`], [`kubelet`], [`deployments`], [`judge`]); the deploy bundle's
//! rendered workloads ([`deployed`]).
#![allow(dead_code)]

pub mod agent_process;
pub mod chain;
pub mod deployed;
pub mod deployments;
pub mod e2e;
pub mod figures;
pub mod forward;
pub mod judge;
pub mod kubelet;
pub mod process_metrics;
pub mod prometheus;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tidepool_agent::run::Settings;
use tidepool_api as api;
use tidepool_tests::{ApiServer, Config};

pub mod running;
/// The operator tests' helpers (`tests/tests/common`): the server set-up both share.
#[path = "../common/mod.rs"]
pub mod server;
pub use server::{OPERATOR, create_object};

pub const BIN: &str = env!("CARGO_BIN_EXE_tidepool-cni");

pub const AGENT_RBAC: &str = include_str!("../../../deploy/agent/rbac.yaml");
pub const UID_A: &str = "0a0a0a0a-0000-4000-8000-00000000000a";
pub const UID_B: &str = "0b0b0b0b-0000-4000-8000-00000000000b";
pub const UID_OLD: &str = "0c0c0c0c-0000-4000-8000-00000000000c";

pub fn agent_on(node: &str) -> String {
    format!("system:serviceaccount:tidepool:tidepool-agent@{node}")
}

/// RBAC on, the CRDs established, the operator's and the agent's RBAC and the agent's
/// policy created, IPAMNodes node-a and node-b (created as the operator does).
pub async fn cluster() -> (ApiServer, kube::Client) {
    let (server, admin) = empty_cluster().await;
    let operator = server.client(OPERATOR).await.unwrap();
    let nodes: Api<api::IPAMNode> = Api::all(operator);
    for (name, uid) in [("node-a", UID_A), ("node-b", UID_B)] {
        let obj: api::IPAMNode = serde_json::from_value(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": { "name": name },
            "spec": { "nodeUID": uid },
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &obj).await.unwrap();
    }
    (server, admin)
}

/// RBAC on, the CRDs established, the operator's and the agent's RBAC and the agent's
/// policy created; no object of ours yet.
pub async fn empty_cluster() -> (ApiServer, kube::Client) {
    empty_cluster_with(Config::default()).await
}

/// [`empty_cluster`] on a server of `config` (RBAC and fast bookmarks set here).
pub async fn empty_cluster_with(config: Config) -> (ApiServer, kube::Client) {
    let (server, admin) = server::operator_cluster_with(Config {
        rbac: true,
        bookmark_interval: Duration::from_millis(200),
        ..config
    })
    .await;
    for doc in AGENT_RBAC.split("\n---\n") {
        create_object(&admin, serde_saphyr::from_str(doc).expect("yaml")).await;
    }
    (server, admin)
}

/// The CIDRs of IPPool `default` ([`create_block`]): every hand-made block of these tests
/// lies in one, in /28 and /124 blocks.
pub const TEST_POOL: [&str; 5] = [
    "10.0.0.0/16",
    "10.77.0.0/16",
    "10.250.0.0/16",
    "fd77:2::/64",
    "fd00:250::/64",
];

/// IPPool `default` over [`TEST_POOL`] in /28 and /124 blocks, unless it exists: the agent
/// allocates only from blocks their pools grant (DESIGN.md "Node agent").
pub async fn test_pool(client: &kube::Client) {
    test_pool_of(client, 28).await;
}

/// [`test_pool`] with IPv4 blocks of prefix `v4`.
pub async fn test_pool_of(client: &kube::Client, v4: u8) {
    let obj: api::IPPool = serde_json::from_value(json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
        "metadata": { "name": "default" },
        "spec": { "cidrs": TEST_POOL, "blockSize": { "ipv4": v4, "ipv6": 124 } },
    }))
    .unwrap();
    match Api::<api::IPPool>::all(client.clone())
        .create(&PostParams::default(), &obj)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create IPPool default: {e}"),
    }
}

/// IPPool `name` over IPv4 `cidrs` in /`v4` blocks, as a user creates it.
pub async fn create_ipv4_pool(client: &kube::Client, name: &str, cidrs: &[&str], v4: u8) {
    create_object(
        client,
        json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": name},
            "spec": {"cidrs": cidrs, "blockSize": {"ipv4": v4}},
        }),
    )
    .await;
}

/// A hand-made block of pool `default` (created first if need be, [`test_pool`]).
pub async fn create_block(client: &kube::Client, cidr: &str, node: &str, uid: &str, release: bool) {
    test_pool(client).await;
    let family = if cidr.contains(':') { 6 } else { 4 };
    let name = format!("v{family}-{}", cidr.replace(['.', '/', ':'], "-"));
    let mut spec = json!({ "pool": "default", "cidr": cidr, "node": node, "nodeUID": uid });
    if release {
        spec["release"] = json!("marked-for-release");
    }
    let obj: api::IPAMBlock = serde_json::from_value(json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
        "metadata": { "name": name }, "spec": spec,
    }))
    .unwrap();
    Api::<api::IPAMBlock>::all(client.clone())
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
}

pub struct Run {
    pub stdout: String,
    pub code: i32,
    pub took: Duration,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {:?}", self.stdout))
    }
    /// The address (no prefix) of an ADD result's first IP.
    pub fn addr(&self) -> String {
        assert_eq!(self.code, 0, "ADD failed: {}", self.stdout);
        let a = self.json()["ips"][0]["address"]
            .as_str()
            .expect("address")
            .to_owned();
        a.split('/').next().expect("addr").to_owned()
    }
    pub fn error_code(&self) -> u64 {
        assert_eq!(self.code, 1, "expected an error: {}", self.stdout);
        self.json()["code"].as_u64().expect("code")
    }
}

/// One CNI call for pod `web-{c}` (container `c`, interface eth0) with `config` on stdin.
pub fn plugin(cmd: &str, c: &str, pod_uid: &str, config: &str) -> Run {
    let args = cni_args(c, pod_uid);
    plugin_with(&cni_env(cmd, c, &args), config)
}

/// [`plugin`]'s call made in this process through the plugin's library entry
/// (`tidepool_agent::cni::run`): the same socket exchange with the agent, without the
/// process start a runtime pays for each call.
pub fn plugin_in_process(cmd: &str, c: &str, pod_uid: &str, config: &str) -> Run {
    let args = cni_args(c, pod_uid);
    let env = cni_env(cmd, c, &args);
    let getenv = |k: &str| {
        let v = env.iter().find(|(name, _)| *name == k);
        v.map(|(_, v)| std::ffi::OsString::from(*v))
    };
    let started = Instant::now();
    let out = tidepool_agent::cni::run(&getenv, &mut config.as_bytes());
    Run {
        stdout: out.stdout,
        code: out.exit_code,
        took: started.elapsed(),
    }
}

fn cni_args(c: &str, pod_uid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-{c};K8S_POD_UID={pod_uid}")
}

/// The environment a runtime gives the plugin for `cmd` on container `c`.
fn cni_env<'a>(cmd: &'a str, c: &'a str, args: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![("CNI_COMMAND", cmd), ("CNI_PATH", "/opt/cni/bin")];
    if matches!(cmd, "ADD" | "DEL" | "CHECK") {
        env.extend([
            ("CNI_CONTAINERID", c),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", args),
        ]);
    }
    if matches!(cmd, "ADD" | "CHECK") {
        env.push(("CNI_NETNS", "/var/run/netns/pod"));
    }
    env
}

/// The plugin run with exactly `env` and `stdin`, as a runtime runs it.
pub fn plugin_with(env: &[(&str, &str)], stdin: &str) -> Run {
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tidepool-cni");
    if let Some(mut input) = child.stdin.take() {
        // VERSION does not read stdin; a closed pipe is fine then.
        let _ = input.write_all(stdin.as_bytes());
    }
    let out = child.wait_with_output().expect("wait for tidepool-cni");
    Run {
        stdout: String::from_utf8(out.stdout).expect("utf-8"),
        code: out.status.code().expect("exit code"),
        took: started.elapsed(),
    }
}

/// Blocking work (the plugin) off the runtime's threads.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("join")
}

/// The agent's paths in a temp dir (node node-a; its pod networks the IPPools').
pub fn settings(dir: &Path) -> Settings {
    let boot = dir.join("boot_id");
    std::fs::write(&boot, "3f6c6a1e-0000-4000-8000-000000000000\n").expect("boot id");
    Settings {
        socket: dir.join("run/agent.sock"),
        state_dir: dir.join("state"),
        spool_dir: dir.join("spool"),
        restored_marker: dir.join("run/restored"),
        boot_id_file: boot,
        node_wait: Duration::from_secs(10),
        empty_pool_wait: Duration::from_millis(500),
        // the runtime's directories: none here (reconcile frees nothing)
        reconcile: tidepool_agent::reconcile::Config {
            netns_dir: dir.join("netns"),
            cni_cache_dir: dir.join("results"),
            ..Default::default()
        },
        // the pod networks: the IPPools' CIDRs ([`TEST_POOL`], or a test's own pool)
        ..Settings::new("node-a")
    }
}

/// The network config a runtime hands the plugin for the agent of `s`.
pub fn config(s: &Settings) -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","name":"pods","type":"ptp","ipam":{{"type":"tidepool-cni","socket":"{}","spoolDir":"{}","restoredMarker":"{}","connectTimeout":300}}}}"#,
        s.socket.display(),
        s.spool_dir.display(),
        s.restored_marker.display()
    )
}

/// Polls `f` until it gives `Some` (30 s at most).
pub async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    f: impl FnMut() -> F,
) -> T {
    eventually_within(Duration::from_secs(30), what, f).await
}

/// Polls `f` until it gives `Some` (`timeout` at most): `tests/tests/common`'s `eventually`.
pub use server::eventually as eventually_within;

/// Whether `path` exists (the restored marker), for [`eventually`].
pub fn marker(path: &Path) -> Option<()> {
    path.exists().then_some(())
}

/// A process the test started, killed if the test ends (or fails) while it runs.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
