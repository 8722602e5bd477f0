//! The agent's socket server driven by the real `tidepool-cni` binary, run the way a runtime
//! runs it (a clean `CNI_*` environment, the network config on stdin), against an in-memory
//! node source: what each CNI verb does to the node state, and that it is on disk before the
//! plugin returns.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use common::*;
use serde_json::Value;
use tidepool_agent::serve::{
    Agent, Config, CountingPublish, MemoryNodeSource, PodNetworks, Server,
};
use tidepool_agent::state::StateDir;
use tidepool_ipam::AddrSet;
use tokio_util::sync::CancellationToken;

const COOLDOWN: Duration = Duration::from_secs(60);

fn uid(n: u32) -> String {
    format!("0badc0de-0000-4000-8000-{n:012x}")
}

fn pool(nets: &[&str]) -> AddrSet {
    let mut s = AddrSet::new();
    for n in nets {
        s.union_with(&AddrSet::of_net(&n.parse().expect("net")));
    }
    s
}

/// A node: its temp dir, the agent and its server.
struct Node {
    dir: tempfile::TempDir,
    source: Arc<MemoryNodeSource>,
    publish: Arc<CountingPublish>,
    agent: Agent,
    server: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Node {
    /// An agent with pod network 10.250.0.0/16 (gateway 10.250.0.1) over a node whose pool
    /// is `blocks`, serving on its socket.
    fn start(blocks: &[&str], empty_pool_wait: Duration) -> Node {
        Node::start_from(blocks, empty_pool_wait, None)
    }

    /// [`Node::start`] over `checkpoint`, written into the state dir before the agent loads it.
    fn start_from(blocks: &[&str], empty_pool_wait: Duration, checkpoint: Option<&str>) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        if let Some(text) = checkpoint {
            std::fs::create_dir_all(dir.path().join("state")).expect("state dir");
            std::fs::write(dir.path().join("state/checkpoint.json"), text).expect("seed");
        }
        let source = Arc::new(MemoryNodeSource::new());
        if !blocks.is_empty() {
            source.set_pool("node-a", pool(blocks));
        }
        let publish = Arc::new(CountingPublish::default());
        let state_dir = StateDir::open(dir.path().join("state")).expect("lock the state dir");
        let loaded = state_dir
            .load("boot-1", SystemTime::now(), COOLDOWN)
            .expect("load");
        let config = Config {
            pod_networks: Some(std::sync::Arc::new(
                PodNetworks::new(["10.250.0.0/16".parse().expect("net")]).expect("networks"),
            )),
            empty_pool_wait,
        };
        let agent = Agent::new(
            loaded.state,
            state_dir,
            source.clone(),
            publish.clone(),
            config,
        );
        let mut node = Node {
            dir,
            source,
            publish,
            agent,
            server: None,
        };
        node.serve();
        node
    }

    fn serve(&mut self) {
        let server = Server::bind(&self.sock()).expect("bind");
        let stop = CancellationToken::new();
        self.server = Some((stop.clone(), server.spawn(self.agent.clone(), stop)));
    }

    async fn stop(&mut self) {
        if let Some((stop, server)) = self.server.take() {
            stop.cancel();
            server.await.expect("the server stops");
        }
    }

    fn sock(&self) -> PathBuf {
        self.dir.path().join("run/agent.sock")
    }
    fn spool(&self) -> PathBuf {
        self.dir.path().join("spool")
    }
    fn config(&self, extra: &str) -> String {
        self.config_of("pods", extra)
    }
    /// The network config of CNI network `network` (its `name`).
    fn config_of(&self, network: &str, extra: &str) -> String {
        format!(
            r#"{{"cniVersion":"1.1.0","name":"{network}","type":"ptp","ipam":{{"type":"tidepool-cni","socket":"{}","spoolDir":"{}","restoredMarker":"{}","connectTimeout":300}}{extra}}}"#,
            self.sock().display(),
            self.spool().display(),
            self.dir.path().join("restored").display()
        )
    }
    fn checkpoint(&self) -> Value {
        let text = std::fs::read_to_string(self.dir.path().join("state/checkpoint.json"))
            .expect("read the checkpoint");
        serde_json::from_str(&text).expect("checkpoint json")
    }
    /// (containerID, addresses) of every allocation in the checkpoint on disk.
    fn on_disk(&self) -> Vec<(String, Vec<String>)> {
        let cp = self.checkpoint();
        cp["allocations"]
            .as_array()
            .expect("allocations")
            .iter()
            .map(|a| {
                let addrs = a["addresses"].as_array().expect("addresses");
                let addrs = addrs.iter().map(|x| x.as_str().expect("addr").to_owned());
                (
                    a["containerID"].as_str().expect("id").to_owned(),
                    addrs.collect(),
                )
            })
            .collect()
    }
    fn cooling_on_disk(&self) -> Vec<String> {
        let cp = self.checkpoint();
        let m = cp["cooldown"].as_object().expect("cooldown");
        m.keys().cloned().collect()
    }

    /// Runs the plugin for `cmd` on container `c` of pod `uid`.
    fn cni(&self, cmd: &str, c: &str, pod_uid: &str) -> Run {
        self.cni_with(cmd, c, pod_uid, "")
    }
    fn cni_with(&self, cmd: &str, c: &str, pod_uid: &str, extra: &str) -> Run {
        plugin(cmd, c, pod_uid, &self.config(extra))
    }
    /// Runs the plugin for `cmd` on container `c` of pod `uid`, attached to `network`.
    fn cni_on(&self, network: &str, cmd: &str, c: &str, pod_uid: &str, extra: &str) -> Run {
        plugin(cmd, c, pod_uid, &self.config_of(network, extra))
    }
}

/// A raw HTTP/1.1 request on the socket: (status, body).
fn http(sock: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = UnixStream::connect(sock).expect("connect");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let (head, body) = out.split_once("\r\n\r\n").expect("head");
    let status = head.split_whitespace().nth(1).expect("status");
    (status.parse().expect("status"), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_gives_a_block_address_never_the_gateway_durable_before_the_reply() {
    let node = Arc::new(Node::start(&["10.250.0.0/28"], Duration::from_secs(1)));
    let n = node.clone();
    let (first, again, check, check_other) = blocking(move || {
        let first = n.cni("ADD", "c1", &uid(1));
        // the checkpoint on disk has it the moment the plugin returned
        assert_eq!(n.on_disk(), vec![("c1".to_owned(), vec![first.addr()])]);
        let again = n.cni("ADD", "c1", &uid(1));
        let check = n.cni("CHECK", "c1", &uid(1));
        let check_other = n.cni("CHECK", "c9", &uid(9));
        (first, again, check, check_other)
    })
    .await;
    assert_eq!(
        first.json(),
        serde_json::json!({"cniVersion":"1.1.0",
            "ips":[{"address":"10.250.0.2/16","gateway":"10.250.0.1"}],
            "routes":[{"dst":"0.0.0.0/0"}]}),
        "the ptp shape: pool prefix, gateway .1 (reserved), default route; .0 and .1 skipped"
    );
    assert_eq!(again.addr(), first.addr(), "repeated ADD: same address");
    assert_eq!(check.code, 0, "{}", check.stdout);
    assert_ne!(check_other.code, 0, "CHECK of an unknown attachment fails");
    assert!(node.publish.count() >= 1, "published after the ADD");

    let (status, body) = http(&node.sock(), "GET", "/v1/allocations", "");
    assert_eq!(status, 200);
    let list: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(list[0]["containerID"], "c1");
    assert_eq!(list[0]["podUID"], uid(1));
    assert_eq!(list[0]["addresses"], serde_json::json!(["10.250.0.2"]));

    let mode = std::fs::metadata(node.sock())
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "only root reaches the socket");
    refused_to_nobody(&node);
}

/// Run as root (the test command is): the plugin run as `nobody`, with every directory on
/// the way open to it, is refused by the socket's mode alone.
fn refused_to_nobody(node: &Node) {
    if !Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n")
    {
        println!("not root: skipping the non-root connect check");
        return;
    }
    let run_dir = node.sock().parent().expect("run dir").to_path_buf();
    for d in [node.dir.path(), run_dir.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-x;K8S_POD_UID=";
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
        .env_clear()
        .envs([
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "cx"),
            ("CNI_NETNS", "/var/run/netns/pod"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
            ("CNI_ARGS", &format!("{args}{}", uid(99))),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(node.config("").as_bytes())
        .expect("config");
    let out = child.wait_with_output().expect("the plugin as nobody");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "nobody got an answer: {stdout}");
    assert!(stdout.contains("Permission denied"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_parallel_adds_get_fifty_distinct_addresses() {
    let node = Arc::new(Node::start(
        &["10.250.0.0/28", "10.250.3.0/26"],
        Duration::from_secs(1),
    ));
    let n = node.clone();
    let addrs = blocking(move || {
        let threads: Vec<_> = (0..50)
            .map(|i| {
                let n = n.clone();
                std::thread::spawn(move || n.cni("ADD", &format!("c{i}"), &uid(i)).addr())
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect::<Vec<_>>()
    })
    .await;
    let distinct: BTreeSet<&String> = addrs.iter().collect();
    assert_eq!(distinct.len(), 50, "{addrs:?}");
    for reserved in ["10.250.0.0", "10.250.0.1"] {
        assert!(
            !distinct.contains(&reserved.to_owned()),
            "{reserved} handed out"
        );
    }
    let on_disk: BTreeSet<String> = node.on_disk().into_iter().flat_map(|(_, a)| a).collect();
    assert_eq!(on_disk.len(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_frees_into_cooldown_and_a_stale_del_frees_nothing() {
    let node = Arc::new(Node::start(&["10.250.0.0/28"], Duration::from_secs(1)));
    let n = node.clone();
    blocking(move || {
        let a = n.cni("ADD", "c1", &uid(1)).addr();
        // a stale DEL: same key, another pod's UID (and one that is not a UUID)
        assert_eq!(n.cni("DEL", "c1", &uid(2)).code, 0);
        assert_eq!(n.cni("DEL", "c1", "not-a-uuid").code, 0);
        assert_eq!(n.on_disk(), vec![("c1".to_owned(), vec![a.clone()])]);
        // the pod's own DEL frees it, into cooldown, on disk before the plugin returns
        assert_eq!(n.cni("DEL", "c1", &uid(1)).code, 0);
        assert!(n.on_disk().is_empty());
        assert_eq!(n.cooling_on_disk(), vec![a.clone()]);
        // idempotent; unknown keys succeed
        assert_eq!(n.cni("DEL", "c1", &uid(1)).code, 0);
        assert_eq!(n.cni("DEL", "never", &uid(7)).code, 0);
        // the cooling address is not handed out again at once
        let b = n.cni("ADD", "c2", &uid(3)).addr();
        assert_ne!(a, b);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pool_waits_then_answers_11_and_a_block_serves_a_waiting_add() {
    let node = Arc::new(Node::start(&[], Duration::from_millis(700)));
    let n = node.clone();
    let empty = blocking(move || n.cni("ADD", "c1", &uid(1))).await;
    assert_eq!(empty.error_code(), 11, "{}", empty.stdout);
    assert!(empty.took >= Duration::from_millis(700), "{:?}", empty.took);

    let n = node.clone();
    let waiting = tokio::task::spawn_blocking(move || n.cni("ADD", "c2", &uid(2)));
    tokio::time::sleep(Duration::from_millis(250)).await;
    node.source.set_pool("node-a", pool(&["10.250.7.0/28"]));
    let served = waiting.await.expect("join");
    assert_eq!(
        served.addr(),
        "10.250.7.0",
        "a block's first address (not a gateway)"
    );
    assert!(
        served.took < Duration::from_millis(700),
        "{:?}",
        served.took
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_body_is_code_6_and_changes_nothing() {
    let node = Node::start(&["10.250.0.0/28"], Duration::from_secs(1));
    let sock = node.sock();
    let (status, body) = blocking(move || http(&sock, "POST", "/v1/cni/add", "{not json")).await;
    assert_eq!(status, 400);
    let e: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(e["code"], 6);
    assert!(e["details"].as_str().is_some_and(|d| !d.is_empty()), "{e}");
    let sock = node.sock();
    let (_, list) = blocking(move || http(&sock, "GET", "/v1/allocations", "")).await;
    assert_eq!(list, "[]");
    assert!(!node.dir.path().join("state/checkpoint.json").exists());
    assert_eq!(node.publish.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_spooled_while_the_agent_is_down_is_replayed_and_its_file_removed() {
    let mut node = Node::start(&["10.250.0.0/28"], Duration::from_secs(1));
    let n = Arc::new(node.config(""));
    let cfg = n.clone();
    let added = blocking(move || plugin("ADD", "c1", &uid(1), &cfg)).await;
    let a = added.addr();
    node.stop().await;
    let cfg = n.clone();
    let del = blocking(move || plugin("DEL", "c1", &uid(1), &cfg)).await;
    assert_eq!(del.code, 0, "{}", del.stdout);
    let files = std::fs::read_dir(node.spool()).expect("spool").count();
    assert_eq!(files, 1, "the DEL is spooled");
    assert_eq!(node.on_disk().len(), 1, "not applied yet");

    let replayed = node
        .agent
        .replay_spool(&node.spool())
        .await
        .expect("replay");
    assert_eq!((replayed.applied, replayed.freed), (1, 1));
    assert!(node.on_disk().is_empty());
    assert_eq!(node.cooling_on_disk(), vec![a]);
    assert_eq!(std::fs::read_dir(node.spool()).expect("spool").count(), 0);
    // the server comes back on the same path (the stale socket replaced)
    node.serve();
    let cfg = n.clone();
    assert_eq!(
        blocking(move || plugin("STATUS", "", "", &cfg)).await.code,
        0
    );
}

/// A spooled DEL leaves an allocation that a later ADD re-created under its key alone: that
/// one is the new ADD's (issue 27, defect 6: the agent now replays while it serves).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spooled_del_leaves_the_allocation_a_later_add_re_created() {
    let mut node = Node::start(&["10.250.0.0/28"], Duration::from_secs(1));
    let n = Arc::new(node.config(""));
    let cfg = n.clone();
    blocking(move || plugin("ADD", "c1", &uid(1), &cfg))
        .await
        .addr();
    node.stop().await;
    let cfg = n.clone();
    let spooled = blocking(move || plugin("DEL", "c1", &uid(1), &cfg)).await;
    assert_eq!(spooled.code, 0, "{}", spooled.stdout);
    assert_eq!(std::fs::read_dir(node.spool()).expect("spool").count(), 1);
    node.serve();
    // the runtime's next DEL reaches the agent; then an ADD re-creates the attachment
    let cfg = n.clone();
    let del = blocking(move || plugin("DEL", "c1", &uid(1), &cfg)).await;
    assert_eq!(del.code, 0, "{}", del.stdout);
    let cfg = n.clone();
    let again = blocking(move || plugin("ADD", "c1", &uid(1), &cfg))
        .await
        .addr();

    let replayed = node
        .agent
        .replay_spool(&node.spool())
        .await
        .expect("replay");
    assert_eq!(
        (replayed.applied, replayed.freed, replayed.superseded),
        (1, 0, 1)
    );
    assert_eq!(node.on_disk(), [("c1".to_owned(), vec![again])]);
    assert_eq!(std::fs::read_dir(node.spool()).expect("spool").count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_frees_what_is_not_a_valid_attachment_and_status_answers() {
    let node = Arc::new(Node::start(&["10.250.0.0/28"], Duration::from_secs(1)));
    let n = node.clone();
    blocking(move || {
        n.cni("ADD", "c1", &uid(1)).addr();
        n.cni("ADD", "c2", &uid(2)).addr();
        let valid = r#","cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]"#;
        let gc = n.cni_with("GC", "", "", valid);
        assert_eq!(gc.code, 0, "{}", gc.stdout);
        let ids: Vec<String> = n.on_disk().into_iter().map(|(c, _)| c).collect();
        assert_eq!(ids, ["c1"]);
        assert_eq!(n.cni("STATUS", "", "").code, 0);
    })
    .await;
}

/// Issue 27, defect 8: a GC names one network's valid attachments, so it frees only that
/// network's allocations: another network's and those whose network is unknown (migrated
/// from format 2, which kept none) stay; DEL still frees an unknown one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_of_one_network_leaves_other_networks_and_unknown_ones_alone() {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    let format2 = format!(
        r#"{{"version":2,"minReaderVersion":1,"allocations":[{{"containerID":"old","ifname":"eth0","podUID":"{}","namespace":"d","pod":"old","addresses":["10.250.0.9"],"since":{since},"bootID":"boot-1"}}]}}"#,
        uid(9)
    );
    let node = Arc::new(Node::start_from(
        &["10.250.0.0/28"],
        Duration::from_secs(1),
        Some(&format2),
    ));
    let n = node.clone();
    blocking(move || {
        n.cni_on("a", "ADD", "a1", &uid(1), "").addr();
        n.cni_on("a", "ADD", "a2", &uid(2), "").addr();
        n.cni_on("b", "ADD", "b1", &uid(3), "").addr();
        let ids = |n: &Node| -> Vec<String> { n.on_disk().into_iter().map(|(c, _)| c).collect() };
        assert_eq!(ids(&n), ["a1", "a2", "b1", "old"]);
        let valid_a1 = r#","cni.dev/valid-attachments":[{"containerID":"a1","ifname":"eth0"}]"#;
        let gc = n.cni_on("a", "GC", "", "", valid_a1);
        assert_eq!(gc.code, 0, "{}", gc.stdout);
        assert_eq!(ids(&n), ["a1", "b1", "old"], "GC of a frees a2 only");
        let networks: Vec<Value> = n.checkpoint()["allocations"]
            .as_array()
            .expect("allocations")
            .iter()
            .map(|a| a["network"].clone())
            .collect();
        assert_eq!(networks, [Value::from("a"), Value::from("b"), Value::Null]);
        let gc = n.cni_on("b", "GC", "", "", r#","cni.dev/valid-attachments":[]"#);
        assert_eq!(gc.code, 0, "{}", gc.stdout);
        assert_eq!(
            ids(&n),
            ["a1", "old"],
            "GC of b frees b1; the unknown one stays"
        );
        assert_eq!(n.cni_on("a", "DEL", "old", &uid(9), "").code, 0);
        assert_eq!(
            ids(&n),
            ["a1"],
            "DEL frees an allocation of unknown network"
        );
    })
    .await;
}

/// Issue 27, "What counts as waiting": the agent counts the ADDs it holds for lack of an
/// address (`tidepool_agent_adds_waiting`): one while an ADD waits on an empty pool, none
/// once a block arrives and it is answered, and none after one that gave up (code 11).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_held_for_lack_of_an_address_are_counted_while_they_wait() {
    let node = Arc::new(Node::start(&[], Duration::from_secs(20)));
    assert_eq!(node.agent.adds_waiting(), 0);
    let n = node.clone();
    let add = tokio::task::spawn_blocking(move || n.cni("ADD", "c1", &uid(1)));
    eventually("the ADD held", || async {
        (node.agent.adds_waiting() == 1).then_some(())
    })
    .await;
    node.source.set_pool("node-a", pool(&["10.250.0.0/28"]));
    let add = add.await.expect("join");
    assert_eq!(add.code, 0, "{}", add.stdout);
    assert_eq!(node.agent.adds_waiting(), 0, "answered: no longer waiting");

    let short = Node::start(&[], Duration::from_millis(200));
    let gave_up = blocking({
        let cfg = short.config("");
        move || plugin("ADD", "c2", &uid(2), &cfg)
    })
    .await;
    assert_eq!(gave_up.json()["code"], 11, "{}", gave_up.stdout);
    assert_eq!(short.agent.adds_waiting(), 0, "gave up: no longer waiting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_replaces_a_stale_socket_but_not_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("a/b/agent.sock");
    let first = Server::bind(&sock).expect("bind");
    drop(first);
    let second = Server::bind(&sock).expect("a stale socket is replaced");
    assert_eq!(second.path(), sock);
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "x").expect("write");
    assert!(Server::bind(&file).is_err());
    assert_eq!(std::fs::read(&file).expect("still there"), b"x");
}

/// ADD+DEL through the plugin binary against the server, 200 rounds (issue 15: the IPAM
/// part's p99 ≤ 5 ms). `cargo test -p tidepool-agent --test serve -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn latency_add_del_through_the_plugin() {
    let node = Arc::new(Node::start(&["10.250.0.0/20"], Duration::from_secs(1)));
    let n = node.clone();
    let (mut adds, mut dels, mut both, mut start, mut direct) = blocking(move || {
        let (mut adds, mut dels, mut both) = (Vec::new(), Vec::new(), Vec::new());
        // the parts: process start alone (VERSION asks no agent), and ADD+DEL over the
        // socket without the plugin process (socket, handler, fsync'd save)
        let (mut start, mut direct) = (Vec::new(), Vec::new());
        for i in 0..200 {
            start.push(plugin("VERSION", "", "", "").took);
            let body = |c: &str| {
                format!(
                    r#"{{"containerID":"{c}","ifname":"eth0","netns":"/n","podNamespace":"d","podName":"p","podUID":"{}","cniVersion":"1.1.0","config":{{}}}}"#,
                    uid(10_000 + i)
                )
            };
            let c = format!("direct{i}");
            let t = Instant::now();
            assert_eq!(http(&n.sock(), "POST", "/v1/cni/add", &body(&c)).0, 200);
            assert_eq!(http(&n.sock(), "POST", "/v1/cni/del", &body(&c)).0, 200);
            direct.push(t.elapsed());
        }
        for i in 0..200 {
            let c = format!("lat{i}");
            let a = n.cni("ADD", &c, &uid(i));
            assert_eq!(a.code, 0, "{}", a.stdout);
            let d = n.cni("DEL", &c, &uid(i));
            assert_eq!(d.code, 0, "{}", d.stdout);
            adds.push(a.took);
            dels.push(d.took);
            both.push(a.took + d.took);
        }
        (adds, dels, both, start, direct)
    })
    .await;
    let rows = [
        ("ADD", &mut adds),
        ("DEL", &mut dels),
        ("ADD+DEL", &mut both),
        ("start", &mut start),
        ("direct", &mut direct),
    ];
    for (name, v) in rows {
        v.sort();
        let p = |q: f64| common::figures::quantile(v, q).expect("samples");
        println!(
            "{name:8} p50 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms",
            p(0.50).as_secs_f64() * 1e3,
            p(0.99).as_secs_f64() * 1e3,
            v[v.len() - 1].as_secs_f64() * 1e3
        );
    }
}
