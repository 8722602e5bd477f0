//! The agent as it starts on a node (`tidepool_agent::run::run`), against the in-process API
//! server with RBAC and the own-node policy on, as the agent's service account bound to its
//! node, driven by the real `tidepool-cni` binary: it waits for its IPAMNode, serves ADD from
//! its node's block, publishes the allocation in `status.used`, and a DEL frees it into
//! cooldown; a DEL spooled while it was down is replayed at start before anything is
//! published, and one spooled while it serves is replayed while it runs.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use common::agent_process::start_agent;
use common::running::RunningAgent;
use common::*;
use kube::api::Api;
use std::time::Duration;

use tidepool_agent::run::{Settings, run};
use tidepool_api as api;
use tidepool_tests::{ApiServer, Config};

const POD: &str = "0badc0de-0000-4000-8000-000000000001";
const POD_2: &str = "0badc0de-0000-4000-8000-000000000002";

/// node-a's IPAMNode status: (used addresses, cooling addresses).
async fn status(nodes: &Api<api::IPAMNode>) -> (Vec<String>, Vec<String>) {
    let n = nodes.get("node-a").await.expect("node-a");
    let st = n.status.unwrap_or_default();
    (
        st.used.keys().cloned().collect(),
        st.cooldown.keys().cloned().collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_serves_its_node_pool_and_publishes_what_it_gave() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.250.0.16/28", "node-a", UID_A, false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = settings(dir.path());
    // a DEL the plugin spooled while no agent ran (of a pod that never got an address)
    let spooled = blocking({
        let c = config(&s);
        move || plugin("DEL", "c-gone", POD, &c)
    })
    .await;
    assert_eq!(spooled.code, 0, "{}", spooled.stdout);
    assert_eq!(std::fs::read_dir(&s.spool_dir).expect("spool").count(), 1);

    let client = server.client(&agent_on("node-a")).await.expect("client");
    let agent = RunningAgent::start(client, &s).await;
    assert_eq!(
        std::fs::read_dir(&s.spool_dir).expect("spool").count(),
        0,
        "the spooled DEL was replayed and its file removed"
    );

    let add = blocking({
        let c = config(&s);
        move || plugin("ADD", "c1", POD, &c)
    })
    .await;
    let addr = add.addr();
    let ip: std::net::IpAddr = addr.parse().expect("an address");
    let block: ipnet::IpNet = "10.250.0.16/28".parse().expect("net");
    assert!(block.contains(&ip), "{addr} from node-a's block");
    assert_eq!(
        add.json()["ips"][0]["address"],
        format!("{addr}/16"),
        "the pod network's prefix, as ptp needs"
    );

    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually("the allocation published in status.used", || async {
        (status(&nodes).await.0 == [addr.clone()]).then_some(())
    })
    .await;
    let del = blocking({
        let c = config(&s);
        move || plugin("DEL", "c1", POD, &c)
    })
    .await;
    assert_eq!(del.code, 0, "{}", del.stdout);
    eventually("freed into cooldown", || async {
        let (used, cooling) = status(&nodes).await;
        (used.is_empty() && cooling == [addr.clone()]).then_some(())
    })
    .await;
    agent.stop().await;
}

/// A DEL the plugin spooled while the agent served (it could not connect: a connect timeout
/// under load, or the window between the start-up replay and the socket serving) is applied
/// while the agent runs: the address goes into cooldown and the spool file is removed, with
/// no restart (issue 27, defect 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_spooled_while_the_agent_serves_is_applied_while_it_runs() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.250.0.16/28", "node-a", UID_A, false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = settings(dir.path());
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let agent = RunningAgent::start(client, &s).await;
    let add = blocking({
        let c = config(&s);
        move || plugin("ADD", "c1", POD, &c)
    })
    .await;
    let addr = add.addr();
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually("the allocation published in status.used", || async {
        (status(&nodes).await.0 == [addr.clone()]).then_some(())
    })
    .await;

    // the plugin cannot reach the agent (a socket path nothing answers on, the same spool)
    let unreachable = config(&s).replace(
        &s.socket.display().to_string(),
        &dir.path().join("run/nobody.sock").display().to_string(),
    );
    let del = blocking(move || plugin("DEL", "c1", POD, &unreachable)).await;
    assert_eq!(del.code, 0, "{}", del.stdout);
    eventually_within(
        Duration::from_secs(10),
        "the spooled DEL applied: the address in cooldown, the file removed",
        || async {
            let (used, cooling) = status(&nodes).await;
            let files = std::fs::read_dir(&s.spool_dir).map_or(0, Iterator::count);
            (used.is_empty() && cooling == [addr.clone()] && files == 0).then_some(())
        },
    )
    .await;
    agent.stop().await;
}

/// The agent allocates only from the blocks their pools grant (issue 27, "one bad object"):
/// with a block of its pool and one naming a pool that does not exist, every ADD is served
/// from the first until it runs out, then answered "try again later" (code 11), never from
/// the other; once that pool is created, the next ADD is served from its block, with no
/// restart, its prefix length and gateway those of the pool's CIDR (the agent's pod networks
/// are the IPPools' CIDRs, issue 28).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_allocates_only_from_blocks_their_pools_grant() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.250.0.16/28", "node-a", UID_A, false).await;
    create_object(
        &admin,
        serde_json::json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
            "metadata": { "name": "v4-10-251-0-0-28" },
            "spec": { "pool": "other", "cidr": "10.251.0.0/28", "node": "node-a", "nodeUID": UID_A },
        }),
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = settings(dir.path());
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let agent = RunningAgent::start(client, &s).await;
    let add = |c: String| {
        let config = config(&s);
        blocking(move || plugin("ADD", &c, POD, &config))
    };
    let own: ipnet::IpNet = "10.250.0.16/28".parse().expect("net");
    for i in 0..16 {
        let ip: std::net::IpAddr = add(format!("c{i}"))
            .await
            .addr()
            .parse()
            .expect("an address");
        assert!(
            own.contains(&ip),
            "{ip}: only from the block of a known pool"
        );
    }
    assert_eq!(
        add("c16".into()).await.error_code(),
        11,
        "the other block left out"
    );
    // pool `other` selects every namespace (a non-empty selector), so it is the pod's pool
    // from now on (issue 29: the agent allocates only from the pod's pool's blocks)
    create_object(
        &admin,
        serde_json::json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
            "metadata": { "name": "other" },
            "spec": { "cidrs": ["10.251.0.0/24"], "blockSize": { "ipv4": 28 },
                      "namespaceSelector": { "matchExpressions": [
                          { "key": "tidepool.dev/none", "operator": "DoesNotExist" }] } },
        }),
    )
    .await;
    let other: ipnet::IpNet = "10.251.0.0/28".parse().expect("net");
    let served = eventually("an ADD served from the block of the new pool", || async {
        // another pod: POD keeps the pool of the addresses it holds
        let config = config(&s);
        let run = blocking(move || plugin("ADD", "c17", POD_2, &config)).await;
        (run.code == 0).then(|| run.json()["ips"][0].clone())
    })
    .await;
    let addr = served["address"].as_str().expect("an address");
    let (ip, prefix) = addr.split_once('/').expect("address/prefix");
    assert!(
        other.contains(&ip.parse::<std::net::IpAddr>().expect("an IP")),
        "{addr}"
    );
    // the pod network is the new pool's CIDR, taken from the IPPool at runtime (no flag)
    assert_eq!(prefix, "24", "{served}");
    assert_eq!(served["gateway"], "10.251.0.1", "{served}");
    agent.stop().await;
}

/// An agent whose role may not read IPPools (a bundle from before it had to) never serves
/// an ADD, and says why when it gives up waiting: not "the IPAMNode is missing".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_may_not_read_ippools_says_so() {
    let (server, admin) = cluster().await;
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    let mut role = roles.get("tidepool-agent").await.expect("the agent's role");
    for rule in role.rules.iter_mut().flatten() {
        if let Some(r) = rule.resources.as_mut() {
            r.retain(|r| r != "ippools");
        }
    }
    roles
        .replace("tidepool-agent", &Default::default(), &role)
        .await
        .expect("the role without ippools");
    let dir = tempfile::tempdir().expect("temp dir");
    let s = Settings {
        node_wait: Duration::from_secs(2),
        ..settings(dir.path())
    };
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let err = run(client, s.clone(), std::future::pending())
        .await
        .expect_err("no start without the IPPools");
    let text = err.to_string();
    assert!(
        text.contains("IPPools were not listed") && text.contains("ippools"),
        "{text}"
    );
    assert!(!s.restored_marker.exists(), "never served");
}

/// node-a's `AgentReady` condition: (status, reason, message), `None` while there is none.
fn agent_ready(n: &api::IPAMNode) -> Option<(String, String, String)> {
    let conditions = &n.status.as_ref()?.conditions;
    let c = conditions.iter().find(|c| c.type_ == "AgentReady")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The `AgentReady` (status, reason) pairs seen in order, and at the first `True` whether
/// the socket took a connection and the restore marker was there.
type History = (Vec<(String, String)>, Option<(bool, bool)>);

/// Every `AgentReady` node-a's IPAMNode goes through, in order, as a watch sees them (see
/// [`History`]).
fn watch_agent_ready(admin: &kube::Client, s: &Settings) -> tokio::task::JoinHandle<History> {
    use futures::StreamExt;
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let config = kube::runtime::watcher::Config::default().fields("metadata.name=node-a");
    let (socket, marker) = (s.socket.clone(), s.restored_marker.clone());
    tokio::spawn(async move {
        let mut seen: Vec<(String, String)> = Vec::new();
        let mut at_true = None;
        let mut events = kube::runtime::watcher(nodes, config).boxed();
        while let Some(Ok(e)) = events.next().await {
            let kube::runtime::watcher::Event::Apply(n) = e else {
                continue;
            };
            let Some((status, reason, _)) = agent_ready(&n) else {
                continue;
            };
            if seen.last() != Some(&(status.clone(), reason.clone())) {
                if status == "True" && at_true.is_none() {
                    let serves = std::os::unix::net::UnixStream::connect(&socket).is_ok();
                    at_true = Some((serves, marker.exists()));
                }
                seen.push((status, reason));
                if seen.len() == 3 {
                    break;
                }
            }
        }
        (seen, at_true)
    })
}

/// Issue 27, defect 7: `AgentReady` turns True only once the agent's socket serves (and
/// its restore marker is written only then), is False while it restores, and turns False
/// with a reason on a clean stop — a stopped agent does not leave `True` behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_ready_is_true_only_while_the_socket_serves() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.250.0.16/28", "node-a", UID_A, false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = settings(dir.path());
    let history = watch_agent_ready(&admin, &s);
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let agent = RunningAgent::start(client, &s).await;
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually("AgentReady=True", || async {
        let n = nodes.get("node-a").await.ok()?;
        (agent_ready(&n)?.0 == "True").then_some(())
    })
    .await;
    agent.stop().await;
    let n = nodes.get("node-a").await.expect("node-a");
    let (status, reason, message) = agent_ready(&n).expect("AgentReady");
    assert_eq!(
        (status.as_str(), reason.as_str(), message.as_str()),
        ("False", "Stopped", "the agent stopped"),
        "written before a clean stop returns"
    );
    let (seen, at_true) = tokio::time::timeout(Duration::from_secs(10), history)
        .await
        .expect("three conditions seen")
        .expect("join");
    let pair = |s: &str, r: &str| (s.to_owned(), r.to_owned());
    assert_eq!(
        seen,
        [
            pair("False", "Starting"),
            pair("True", "Serving"),
            pair("False", "Stopped")
        ]
    );
    assert_eq!(
        at_true,
        Some((true, true)),
        "at True: the socket served, the restore marker written"
    );
}

/// Issue 27, defect 7: an agent that cannot bind its socket stops with an error and leaves
/// `AgentReady=False` with the reason, not the `True` of the agent before it (which crashed
/// and wrote nothing); its restore marker is not written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_bind_its_socket_leaves_agent_ready_false() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.250.0.16/28", "node-a", UID_A, false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = settings(dir.path());
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let crashed = RunningAgent::start(client.clone(), &s).await;
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    eventually("AgentReady=True", || async {
        let n = nodes.get("node-a").await.ok()?;
        (agent_ready(&n)?.0 == "True").then_some(())
    })
    .await;
    drop(crashed); // aborted: it writes nothing more

    // the next agent: its own state dir and marker, its socket path a regular file
    let next = tempfile::tempdir().expect("temp dir");
    let mut s = settings(next.path());
    std::fs::create_dir_all(s.socket.parent().expect("parent")).expect("run dir");
    std::fs::write(&s.socket, "not a socket").expect("a file in the way");
    s.restored_marker = next.path().join("run/restored");
    let e = run(client, s.clone(), std::future::pending())
        .await
        .expect_err("the socket cannot be bound");
    let n = nodes.get("node-a").await.expect("node-a");
    let (status, reason, message) = agent_ready(&n).expect("AgentReady");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Failed"));
    assert_eq!(message, e.to_string());
    assert!(
        message.contains(&s.socket.display().to_string()),
        "{message}"
    );
    assert!(
        !s.restored_marker.exists(),
        "no restore marker: it never served"
    );
}

/// STATUS through the plugin: ok while the agent serves; ok while it is down but its restore
/// marker was refreshed within `unreachableGrace` (a restart); code 50 once the marker has
/// gone unrefreshed for longer. The serving agent keeps the marker fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_fails_only_after_the_agent_is_gone_longer_than_the_grace() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.250.0.16/28", "node-a", UID_A, false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = Settings {
        marker_refresh: Duration::from_millis(100),
        ..settings(dir.path())
    };
    let conf = config(&s).replace(r#""connectTimeout":300"#, r#""unreachableGrace":5000"#);
    let status = move || {
        let c = conf.clone();
        blocking(move || plugin("STATUS", "-", POD, &c))
    };
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let agent = RunningAgent::start(client, &s).await;
    assert_eq!(status().await.code, 0, "serving");

    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    let set_age = |t| {
        std::fs::File::options()
            .write(true)
            .open(&s.restored_marker)
            .and_then(|f| f.set_modified(t))
            .expect("set the marker's mtime")
    };
    set_age(an_hour_ago);
    eventually("the serving agent refreshes its marker", || async {
        let m = std::fs::metadata(&s.restored_marker).and_then(|m| m.modified());
        (m.expect("marker") > an_hour_ago + Duration::from_secs(3000)).then_some(())
    })
    .await;

    agent.stop().await;
    assert_eq!(
        status().await.code,
        0,
        "down, refreshed within the grace: a restart"
    );
    set_age(std::time::SystemTime::now() - Duration::from_secs(6));
    let late = status().await;
    assert_eq!(late.error_code(), 50, "{}", late.stdout);
    assert!(late.stdout.contains("grace 5 s"), "{}", late.stdout);
}

/// One agent per node: a second agent on the same state directory refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_on_the_same_state_dir_refuses_to_start() {
    let (server, _admin) = cluster().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = settings(dir.path());
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let first = tokio::spawn(run(client.clone(), s.clone(), async move {
        let _ = stopped.await;
    }));
    eventually("the first agent serving", || async {
        marker(&s.restored_marker)
    })
    .await;
    let second = run(client, s.clone(), std::future::ready(())).await;
    let e = second.expect_err("a second agent must not start");
    assert!(e.to_string().contains("state"), "{e}");

    // the binary, as a DaemonSet surge would start it: refused, naming the directory
    let kubeconfig = dir.path().join("kubeconfig");
    server
        .write_kubeconfig(&agent_on("node-a"), &kubeconfig)
        .expect("kubeconfig");
    let (state_dir, sock) = (s.state_dir.clone(), dir.path().join("second.sock"));
    let out = blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tidepool-agent"))
            .env_clear()
            .args(["--node-name", "node-a", "--pod-network", "10.250.0.0/16"])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--socket")
            .arg(sock)
            .arg("--state-dir")
            .arg(state_dir)
            .output()
            .expect("run tidepool-agent")
    })
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a second agent must not start: {stderr}"
    );
    assert!(
        stderr.contains(&s.state_dir.display().to_string()) && stderr.contains("lock"),
        "{stderr}"
    );
    first.abort();
}

/// When `run` returns, the agent has let go of its node: nothing of it runs on, so its
/// state directory's lock is free and the next agent (a restart in the same process, or the
/// next process) starts at once. A plugin connection still open at the stop (a plugin hung
/// mid-request) is closed with it, not left holding the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_agent_lets_go_of_its_state_dir_at_once() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.250.0.16/28", "node-a", UID_A, false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = settings(dir.path());
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let agent = RunningAgent::start(client.clone(), &s).await;
    let mut open = tokio::net::UnixStream::connect(&s.socket)
        .await
        .expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut open, b"POST /v1/cni/ADD HTTP/1.1\r\n")
        .await
        .expect("half a request");
    agent.stop().await;
    let again = run(client.clone(), s.clone(), std::future::ready(())).await;
    assert!(again.is_ok(), "the next agent could not start: {again:?}");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut open, &mut rest),
    )
    .await;
    assert!(
        read.is_ok(),
        "the open connection was closed with the agent"
    );
}

/// The `tidepool-agent` binary itself, started with `--kubeconfig` as the agent's service
/// account: it serves the plugin from its node's block and stops with exit status 0 on
/// SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_the_plugin_and_stops_on_sigterm() {
    let (server, admin) = cluster().await;
    create_block(&admin, "10.250.0.32/28", "node-a", UID_A, false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = settings(dir.path());
    let kubeconfig = dir.path().join("kubeconfig");
    server
        .write_kubeconfig(&agent_on("node-a"), &kubeconfig)
        .expect("kubeconfig");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_tidepool-agent"))
        .env_clear()
        .args(["--node-name", "node-a", "--pod-network", "10.250.0.0/16"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--socket")
        .arg(&s.socket)
        .arg("--state-dir")
        .arg(&s.state_dir)
        .arg("--restored-marker")
        .arg(&s.restored_marker)
        // any free port: the default (127.0.0.1:9692) may be taken by another test's agent
        .args(["--metrics-addr", "127.0.0.1:0"])
        .arg("--netns-dir")
        .arg(&s.reconcile.netns_dir)
        .arg("--cni-cache-dir")
        .arg(&s.reconcile.cni_cache_dir)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start tidepool-agent");
    let mut child = KillOnDrop(child);
    eventually("the restore marked", || async {
        marker(&s.restored_marker)
    })
    .await;
    let add = blocking({
        let c = config(&s);
        move || plugin("ADD", "c1", POD, &c)
    })
    .await;
    let ip: std::net::IpAddr = add.addr().parse().expect("an address");
    assert!(
        "10.250.0.32/28"
            .parse::<ipnet::IpNet>()
            .expect("net")
            .contains(&ip)
    );
    let pid = child.0.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = eventually("the agent exited", || {
        let r = child.0.try_wait().expect("wait");
        async move { r }
    })
    .await;
    assert!(status.success(), "exit {status:?}");
}

/// The binary as `identity` against `server`, until it exits: its exit status and stderr.
async fn agent_exit(server: &ApiServer, identity: &str) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    server
        .write_kubeconfig(identity, &kubeconfig)
        .expect("kubeconfig");
    let loopback = || std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    start_agent(dir.path(), &kubeconfig, loopback(), loopback())
        .exited()
        .await
}

/// Preflight (docs/operations.md "Preflight"): a token without the node-name extra (not a pod's
/// projected token, or minted with ServiceAccountTokenPodNodeInfo off) stops the agent at
/// start, naming the extra and the fix, before any write is denied; so does a server older
/// than 1.31, whose CRDs have no field selectors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_refuses_to_start_without_what_it_needs() {
    let (server, _admin) = cluster().await;
    let (status, stderr) =
        agent_exit(&server, "system:serviceaccount:tidepool:tidepool-agent").await;
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("carry no authentication.kubernetes.io/node-name extra")
            && stderr.contains("ServiceAccountTokenPodNodeInfo")
            && stderr.contains("projected token"),
        "{stderr}"
    );
    let (status, stderr) = agent_exit(&server, &agent_on("node-b")).await;
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("bound to node node-b, not to --node-name node-a"),
        "{stderr}"
    );

    let (old, _admin) = empty_cluster_with(Config {
        git_version: "v1.30.4".into(),
        ..Config::default()
    })
    .await;
    let (status, stderr) = agent_exit(&old, &agent_on("node-a")).await;
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("the API server is Kubernetes 1.30.4: tidepool needs 1.31 or later"),
        "{stderr}"
    );
}
