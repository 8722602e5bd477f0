//! Through the real CNI chain (issue 15): Debian's `ptp` and `bridge` plugins
//! (containernetworking-plugins) delegate IPAM to the built `tidepool-cni`, which reaches the
//! agent (`tidepool_agent::run::run`, as it runs on a node) against the in-process API server,
//! as the agent's service account bound to its node. Everything runs in network namespaces
//! this test creates — one standing in for the node, one per pod:
//! - pods get their addresses, `status.used` has them, two pods in different blocks ping each
//!   other through ptp's host routes, and two pods on one bridge ping each other;
//! - DEL frees into cooldown, and a stale DEL (another pod UID) frees nothing;
//! - 50 parallel ADDs get 50 distinct addresses;
//! - with the agent down an ADD fails with code 11 and a DEL is spooled, then replayed;
//! - a faked boot-ID change moves every allocation into cooldown;
//! - STATUS and GC work when the plugin is called directly.
//!
//! Needs root, iproute2, ping and /usr/lib/cni/{ptp,bridge} (the test command installs them);
//! every namespace is removed on every exit path, and no address is ever configured outside
//! them.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use kube::api::Api;
use tidepool_agent::run::Settings;
use tidepool_agent::serve::PodNetworks;
use tidepool_api as api;
use tidepool_tests::ApiServer;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const PLUGINS: &str = "/usr/lib/cni";

/// Network namespaces, deleted when dropped (also when the test fails).
#[derive(Default)]
struct Namespaces(Mutex<Vec<String>>);

impl Namespaces {
    fn add(&self, name: &str) {
        run("ip", &["netns", "add", name]);
        self.0.lock().expect("lock").push(name.to_string());
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in self.0.lock().expect("lock").iter() {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn output(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"))
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = output(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first address (no prefix) of a main plugin's ADD result.
fn address(out: &Output) -> String {
    assert!(
        out.status.success(),
        "ADD failed: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a CNI result");
    let a = v["ips"][0]["address"].as_str().expect("an address");
    a.split('/').next().expect("the address").to_string()
}

/// The CNI error code a failed call printed.
fn error_code(out: &Output) -> u64 {
    assert!(!out.status.success(), "expected a failure");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("CNI error JSON");
    v["code"].as_u64().expect("a code")
}

fn ping(from: &str, to: &str) {
    let ping = output(
        "ip",
        &["netns", "exec", from, "ping", "-c", "1", "-W", "2", to],
    );
    assert!(
        ping.status.success(),
        "{from} → {to}: {}",
        String::from_utf8_lossy(&ping.stdout)
    );
}

fn pod_uid(i: usize) -> String {
    format!("0badc0de-0000-4000-8000-{i:012}")
}

/// One node: its namespace, the API server with node-a's IPAMNode, the agent's paths, and
/// the agent while it runs.
struct Node {
    ns: Namespaces,
    name: String,
    tag: String,
    _dir: tempfile::TempDir,
    server: ApiServer,
    admin: kube::Client,
    settings: Settings,
    agent: Option<(
        oneshot::Sender<()>,
        JoinHandle<tidepool_agent::error::Result<()>>,
    )>,
}

impl Node {
    /// `test` names the namespaces; `blocks` are node-a's blocks at the start.
    async fn new(test: &str, blocks: &[&str]) -> Node {
        let root = output("id", &["-u"]).stdout == b"0\n";
        assert!(
            root && Path::new(PLUGINS).join("ptp").exists(),
            "this test needs root and Debian's containernetworking-plugins (ptp, bridge); \
             scripts/test.sh installs them"
        );
        let tag = format!("{test}-{}", std::process::id() % 100_000);
        let name = format!("tpn-{tag}");
        let ns = Namespaces::default();
        ns.add(&name);
        run("ip", &["-n", &name, "link", "set", "lo", "up"]);
        run(
            "ip",
            &[
                "netns",
                "exec",
                &name,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ],
        );
        let (server, admin) = cluster().await;
        for b in blocks {
            create_block(&admin, b, "node-a", UID_A, false).await;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let settings = settings(dir.path());
        Node {
            ns,
            name,
            tag,
            _dir: dir,
            server,
            admin,
            settings,
            agent: None,
        }
    }

    /// Starts the agent and waits until it serves (its restore marker written anew).
    async fn start_agent(&mut self) {
        let _ = std::fs::remove_file(&self.settings.restored_marker);
        let client = self
            .server
            .client(&agent_on("node-a"))
            .await
            .expect("client");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tidepool_agent::run::run(
            client,
            self.settings.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        self.agent = Some((stop, task));
        let marker = self.settings.restored_marker.clone();
        eventually("the agent serving", || {
            let m = marker.exists().then_some(());
            async move { m }
        })
        .await;
    }

    async fn stop_agent(&mut self) {
        let (stop, task) = self.agent.take().expect("the agent runs");
        stop.send(()).expect("the agent runs");
        task.await.expect("join").expect("the agent stops cleanly");
    }

    /// A new pod namespace.
    fn pod(&self, i: usize) -> String {
        let name = format!("tpp-{}-{i}", self.tag);
        self.ns.add(&name);
        name
    }

    /// The main plugin's network config, its IPAM delegated to tidepool-cni.
    fn conf(&self, main: &str) -> String {
        let main = match main {
            "bridge" => r#""type":"bridge","bridge":"tpbr0","isGateway":true"#,
            _ => r#""type":"ptp""#,
        };
        let s = &self.settings;
        format!(
            r#"{{"cniVersion":"1.0.0","name":"pods",{main},"ipam":{{"type":"tidepool-cni","socket":"{}","spoolDir":"{}","restoredMarker":"{}","connectTimeout":300}}}}"#,
            s.socket.display(),
            s.spool_dir.display(),
            s.restored_marker.display()
        )
    }

    /// One CNI call of the `main` plugin, run in the node's namespace as a runtime runs it
    /// (off the runtime's threads).
    async fn cni(&self, main: &str, cmd: &str, pod_ns: &str, container: &str, uid: &str) -> Output {
        let plugin_dir = Path::new(env!("CARGO_BIN_EXE_tidepool-cni"))
            .parent()
            .expect("the plugin's directory")
            .to_path_buf();
        let args = vec![
            "netns".to_string(),
            "exec".into(),
            self.name.clone(),
            "env".into(),
            "-i".into(),
            format!("CNI_COMMAND={cmd}"),
            format!("CNI_CONTAINERID={container}"),
            format!("CNI_NETNS=/var/run/netns/{pod_ns}"),
            "CNI_IFNAME=eth0".into(),
            format!("CNI_PATH={}:{PLUGINS}", plugin_dir.display()),
            format!(
                "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={container};K8S_POD_UID={uid}"
            ),
            format!("{PLUGINS}/{main}"),
        ];
        let conf = self.conf(main);
        blocking(move || {
            let mut child = Command::new("ip")
                .args(&args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start the main plugin");
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(conf.as_bytes())
                .expect("write the config");
            child.wait_with_output().expect("the main plugin")
        })
        .await
    }

    /// node-a's `status.used` (address → pod UID) and `status.cooldown` addresses.
    async fn status(&self) -> (BTreeMap<String, String>, Vec<String>) {
        let nodes: Api<api::IPAMNode> = Api::all(self.admin.clone());
        let st = nodes
            .get("node-a")
            .await
            .expect("node-a")
            .status
            .unwrap_or_default();
        let used = st
            .used
            .iter()
            .map(|(a, e)| (a.clone(), e.pod_uid.clone()))
            .collect();
        (used, st.cooldown.keys().cloned().collect())
    }

    /// Waits until node-a's status satisfies `f`.
    async fn until_status(
        &self,
        what: &str,
        f: impl Fn(&BTreeMap<String, String>, &[String]) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (used, cooling) = self.status().await;
            if f(&used, &cooling) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: used {used:?}, cooldown {cooling:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn spooled(&self) -> usize {
        std::fs::read_dir(&self.settings.spool_dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                    .count()
            })
            .unwrap_or(0)
    }
}

/// The agent's paths in `dir`; pod network 10.250.0.0/16 (ptp's result shape: /16, gateway
/// 10.250.0.1).
fn settings(dir: &Path) -> Settings {
    let boot = dir.join("boot_id");
    std::fs::write(&boot, "3f6c6a1e-0000-4000-8000-000000000000\n").expect("boot id");
    let nets = PodNetworks::new(["10.250.0.0/16".parse().expect("net")]).expect("networks");
    Settings {
        socket: dir.join("run/agent.sock"),
        state_dir: dir.join("state"),
        spool_dir: dir.join("spool"),
        restored_marker: dir.join("run/restored"),
        boot_id_file: boot,
        node_wait: Duration::from_secs(10),
        empty_pool_wait: Duration::from_secs(2),
        ..Settings::new("node-a", nets)
    }
}

/// Polls `f` until it gives `Some` (10 s at most).
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn in_net(net: &str, addr: &str) -> bool {
    let net: ipnet::IpNet = net.parse().expect("net");
    net.contains(&addr.parse::<std::net::IpAddr>().expect("ip"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_in_two_blocks_ping_through_ptp_and_are_published() {
    // the first block holds two addresses; the third pod's comes from the second block
    let mut node = Node::new("ping", &["10.250.0.16/31"]).await;
    node.start_agent().await;
    let (pa, pc, pb) = (node.pod(0), node.pod(2), node.pod(1));
    let a = address(&node.cni("ptp", "ADD", &pa, "ca", &pod_uid(0)).await);
    let c = address(&node.cni("ptp", "ADD", &pc, "cc", &pod_uid(2)).await);
    create_block(&node.admin, "10.250.0.32/28", "node-a", UID_A, false).await;
    let b = address(&node.cni("ptp", "ADD", &pb, "cb", &pod_uid(1)).await);
    assert!(in_net("10.250.0.16/31", &a) && in_net("10.250.0.16/31", &c));
    assert!(in_net("10.250.0.32/28", &b), "{b} from the second block");
    let shown = run("ip", &["-n", &pa, "-4", "addr", "show", "eth0"]);
    assert!(shown.contains(&format!("{a}/16")), "{shown}");
    node.until_status("all three in status.used", |used, _| {
        used.len() == 3
            && used.get(&a) == Some(&pod_uid(0))
            && used.get(&b) == Some(&pod_uid(1))
            && used.get(&c) == Some(&pod_uid(2))
    })
    .await;
    ping(&pa, &b);
    ping(&pb, &a);
    node.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_on_one_bridge_ping_each_other() {
    let mut node = Node::new("bridge", &["10.250.0.16/28"]).await;
    node.start_agent().await;
    let (pa, pb) = (node.pod(0), node.pod(1));
    let a = address(&node.cni("bridge", "ADD", &pa, "ca", &pod_uid(0)).await);
    let b = address(&node.cni("bridge", "ADD", &pb, "cb", &pod_uid(1)).await);
    assert!(a != b && in_net("10.250.0.16/28", &a) && in_net("10.250.0.16/28", &b));
    let gw = run("ip", &["-n", &node.name, "-4", "addr", "show", "tpbr0"]);
    assert!(
        gw.contains("10.250.0.1/16"),
        "the bridge is the gateway: {gw}"
    );
    ping(&pa, &b);
    ping(&pb, &a);
    for (p, c, u) in [(&pa, "ca", 0), (&pb, "cb", 1)] {
        let del = node.cni("bridge", "DEL", p, c, &pod_uid(u)).await;
        assert!(del.status.success(), "{del:?}");
    }
    node.until_status("both freed", |used, cooling| {
        used.is_empty() && cooling.len() == 2
    })
    .await;
    node.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_frees_into_cooldown_and_a_stale_del_frees_nothing() {
    let mut node = Node::new("del", &["10.250.0.16/30"]).await;
    node.start_agent().await;
    let pa = node.pod(0);
    let a = address(&node.cni("ptp", "ADD", &pa, "ca", &pod_uid(0)).await);
    node.until_status("a published", |used, _| used.contains_key(&a))
        .await;
    // a DEL of the same attachment from another pod (a stale kubelet retry) frees nothing
    let stale = node.cni("ptp", "DEL", &pa, "ca", &pod_uid(9)).await;
    assert!(stale.status.success(), "a stale DEL succeeds: {stale:?}");
    let held = run("ip", &["-n", &pa, "-4", "addr", "show"]);
    assert!(!held.contains(&a), "ptp's own DEL tore the interface down");
    let (used, cooling) = node.status().await;
    assert_eq!(used.get(&a), Some(&pod_uid(0)), "still the pod's");
    assert!(cooling.is_empty(), "{cooling:?}");
    // the pod's own DEL frees it into cooldown; a new pod gets another address
    let del = node.cni("ptp", "DEL", &pa, "ca", &pod_uid(0)).await;
    assert!(del.status.success(), "{del:?}");
    node.until_status("a in cooldown", |used, cooling| {
        used.is_empty() && cooling == [a.clone()]
    })
    .await;
    let pb = node.pod(1);
    let b = address(&node.cni("ptp", "ADD", &pb, "cb", &pod_uid(1)).await);
    assert_ne!(a, b, "a cooling address is not handed out");
    node.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_parallel_adds_get_fifty_distinct_addresses() {
    let mut node = Node::new("fifty", &["10.250.1.0/26"]).await;
    node.start_agent().await;
    let pods: Vec<String> = (0..50).map(|i| node.pod(i)).collect();
    let node = std::sync::Arc::new(node);
    let adds = pods.iter().enumerate().map(|(i, p)| {
        let (node, p) = (node.clone(), p.clone());
        tokio::spawn(async move {
            node.cni("ptp", "ADD", &p, &format!("c{i}"), &pod_uid(i))
                .await
        })
    });
    let mut got = Vec::new();
    for a in futures::future::join_all(adds).await {
        got.push(address(&a.expect("join")));
    }
    let distinct: std::collections::BTreeSet<&String> = got.iter().collect();
    assert_eq!(distinct.len(), 50, "{got:?}");
    assert!(got.iter().all(|a| in_net("10.250.1.0/26", a)), "{got:?}");
    node.until_status("all 50 published", |used, _| {
        used.len() == 50 && got.iter().all(|a| used.contains_key(a))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_agent_down_add_is_code_11_and_del_is_spooled_then_replayed() {
    let mut node = Node::new("down", &["10.250.0.16/28"]).await;
    node.start_agent().await;
    let (pa, pb) = (node.pod(0), node.pod(1));
    let a = address(&node.cni("ptp", "ADD", &pa, "ca", &pod_uid(0)).await);
    node.until_status("a published", |used, _| used.contains_key(&a))
        .await;
    node.stop_agent().await;

    let add = node.cni("ptp", "ADD", &pb, "cb", &pod_uid(1)).await;
    assert_eq!(error_code(&add), 11, "{add:?}");
    let del = node.cni("ptp", "DEL", &pa, "ca", &pod_uid(0)).await;
    assert!(
        del.status.success(),
        "a DEL with the agent down succeeds: {del:?}"
    );
    assert_eq!(node.spooled(), 1, "the DEL spooled for the agent");
    let (used, _) = node.status().await;
    assert!(
        used.contains_key(&a),
        "nothing published while the agent is down"
    );

    node.start_agent().await;
    assert_eq!(node.spooled(), 0, "replayed and removed");
    node.until_status("the spooled DEL freed a", |used, cooling| {
        used.is_empty() && cooling == [a.clone()]
    })
    .await;
    node.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_boot_id_moves_every_allocation_into_cooldown() {
    let mut node = Node::new("boot", &["10.250.0.16/28"]).await;
    node.start_agent().await;
    let (pa, pb) = (node.pod(0), node.pod(1));
    let a = address(&node.cni("ptp", "ADD", &pa, "ca", &pod_uid(0)).await);
    let b = address(&node.cni("ptp", "ADD", &pb, "cb", &pod_uid(1)).await);
    node.until_status("both published", |used, _| used.len() == 2)
        .await;
    node.stop_agent().await;
    std::fs::write(
        &node.settings.boot_id_file,
        "9e9e9e9e-0000-4000-8000-000000000000\n",
    )
    .expect("a new boot id");
    node.start_agent().await;
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    node.until_status("both in cooldown after the reboot", |used, cooling| {
        used.is_empty() && cooling == both.as_slice()
    })
    .await;
    let pc = node.pod(2);
    let c = address(&node.cni("ptp", "ADD", &pc, "cc", &pod_uid(2)).await);
    assert!(c != a && c != b, "a cooling address is not handed out");
    node.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_gc_work_when_called_directly() {
    let mut node = Node::new("gc", &["10.250.0.16/28"]).await;
    node.start_agent().await;
    let (pa, pb) = (node.pod(0), node.pod(1));
    let a = address(&node.cni("ptp", "ADD", &pa, "ca", &pod_uid(0)).await);
    let b = address(&node.cni("ptp", "ADD", &pb, "cb", &pod_uid(1)).await);
    let s = &node.settings;
    let ipam = format!(
        r#""ipam":{{"type":"tidepool-cni","socket":"{}","spoolDir":"{}","restoredMarker":"{}"}}"#,
        s.socket.display(),
        s.spool_dir.display(),
        s.restored_marker.display()
    );
    let status = plugin_with(
        &[("CNI_COMMAND", "STATUS"), ("CNI_PATH", PLUGINS)],
        &format!(r#"{{"cniVersion":"1.1.0","name":"pods","type":"ptp",{ipam}}}"#),
    );
    assert_eq!((status.code, status.stdout.as_str()), (0, ""), "STATUS");
    // GC keeps only the attachments the runtime lists: b's goes
    let gc = plugin_with(
        &[("CNI_COMMAND", "GC"), ("CNI_PATH", PLUGINS)],
        &format!(
            r#"{{"cniVersion":"1.1.0","name":"pods","type":"ptp","cni.dev/valid-attachments":[{{"containerID":"ca","ifname":"eth0"}}],{ipam}}}"#
        ),
    );
    assert_eq!((gc.code, gc.stdout.as_str()), (0, ""), "GC");
    node.until_status("b freed by GC", |used, cooling| {
        used.keys().eq([&a]) && cooling == [b.clone()]
    })
    .await;
    node.stop_agent().await;
}
