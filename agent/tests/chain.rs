//! Through the real CNI chain (issue 15): Debian's `ptp` plugin (containernetworking-plugins)
//! delegates IPAM to the built `tidepool-cni`, which reaches the agent's socket server, in
//! network namespaces this test creates — one standing in for the node, one per pod. Two
//! pods get addresses from different blocks of the node and ping each other through ptp's
//! host routes; DEL frees both; with the agent down an ADD fails with code 11 through ptp
//! and a DEL succeeds, spooled for the agent. Needs root, iproute2, ping and /usr/lib/cni/ptp (the test
//! command installs them); every namespace is removed on every exit path, and no address
//! is ever configured outside them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tidepool_agent::serve::{
    Agent, Config, CountingPublish, MemoryNodeSource, PodNetworks, Server,
};
use tidepool_agent::state::StateDir;
use tidepool_ipam::AddrSet;

const PTP: &str = "/usr/lib/cni/ptp";

/// Network namespaces, deleted when dropped (also when the test fails).
struct Namespaces(Vec<String>);

impl Namespaces {
    fn create(names: &[String]) -> Namespaces {
        let ns = Namespaces(Vec::new());
        let mut ns = ns;
        for n in names {
            run("ip", &["netns", "add", n]);
            ns.0.push(n.clone());
        }
        ns
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.0 {
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

/// One CNI call of ptp, run in the node's namespace as a runtime runs it.
fn ptp(node_ns: &str, cmd: &str, pod_ns: &str, container: &str, uid: &str, conf: &str) -> Output {
    let plugin_dir = Path::new(env!("CARGO_BIN_EXE_tidepool-cni"))
        .parent()
        .expect("the plugin's directory")
        .to_path_buf();
    let cni_path = format!("{}:/usr/lib/cni", plugin_dir.display());
    let args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={container};K8S_POD_UID={uid}"
    );
    let netns = format!("/var/run/netns/{pod_ns}");
    let mut child = Command::new("ip")
        .args(["netns", "exec", node_ns, "env", "-i"])
        .arg(format!("CNI_COMMAND={cmd}"))
        .arg(format!("CNI_CONTAINERID={container}"))
        .arg(format!("CNI_NETNS={netns}"))
        .arg("CNI_IFNAME=eth0")
        .arg(format!("CNI_PATH={cni_path}"))
        .arg(format!("CNI_ARGS={args}"))
        .arg(PTP)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ptp");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(conf.as_bytes())
        .expect("write the config");
    child.wait_with_output().expect("ptp")
}

fn pool(net: &str) -> AddrSet {
    AddrSet::of_net(&net.parse().expect("net"))
}

/// The first IPv4 address of the result's `ips`.
fn address(out: &Output) -> String {
    assert!(
        out.status.success(),
        "ptp ADD failed: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a CNI result");
    let a = v["ips"][0]["address"].as_str().expect("an address");
    a.split('/').next().expect("the address").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_in_different_blocks_ping_through_ptp() {
    let root = output("id", &["-u"]).stdout == b"0\n";
    assert!(
        root && Path::new(PTP).exists(),
        "this test needs root and Debian's containernetworking-plugins (ptp); \
         scripts/test.sh installs them"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let tag = std::process::id();
    let (node_ns, pod_a, pod_b) = (
        format!("tpn-node-{tag}"),
        format!("tpn-pa-{tag}"),
        format!("tpn-pb-{tag}"),
    );
    let _ns = Namespaces::create(&[node_ns.clone(), pod_a.clone(), pod_b.clone()]);
    run("ip", &["-n", &node_ns, "link", "set", "lo", "up"]);
    run(
        "ip",
        &[
            "netns",
            "exec",
            &node_ns,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ],
    );

    // the agent: pod network 10.250.0.0/16, the node's pool one /28 block at first
    let source = Arc::new(MemoryNodeSource::new());
    source.set_pool("node-a", pool("10.250.0.16/28"));
    let state_dir = StateDir::open(dir.path().join("state")).expect("lock");
    let loaded = state_dir
        .load("boot-1", SystemTime::now(), Duration::from_secs(30))
        .expect("load");
    let config = Config {
        pod_networks: PodNetworks::new(["10.250.0.0/16".parse().expect("net")]).expect("nets"),
        empty_pool_wait: Duration::from_secs(1),
    };
    let agent = Agent::new(
        loaded.state,
        state_dir,
        source.clone(),
        Arc::new(CountingPublish::default()),
        config,
    );
    let sock: PathBuf = dir.path().join("agent.sock");
    let server = Server::bind(&sock).expect("bind").spawn(agent);
    let conf_timeout = 300; // ms the plugin tries to connect when the agent is down
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"pods","type":"ptp","ipam":{{"type":"tidepool-cni","socket":"{}","spoolDir":"{}","restoredMarker":"{}","connectTimeout":{}}}}}"#,
        sock.display(),
        dir.path().join("spool").display(),
        dir.path().join("restored").display(),
        conf_timeout
    );

    let (uid_a, uid_b) = (
        "0badc0de-0000-4000-8000-00000000000a",
        "0badc0de-0000-4000-8000-00000000000b",
    );
    let a = tokio::task::spawn_blocking({
        let (n, p, c) = (node_ns.clone(), pod_a.clone(), conf.clone());
        move || ptp(&n, "ADD", &p, "ca", uid_a, &c)
    })
    .await
    .expect("join");
    let addr_a = address(&a);
    // the node's second block: the next pod's address comes from it
    source.set_pool("node-a", pool("10.250.0.32/28"));
    let b = tokio::task::spawn_blocking({
        let (n, p, c) = (node_ns.clone(), pod_b.clone(), conf.clone());
        move || ptp(&n, "ADD", &p, "cb", uid_b, &c)
    })
    .await
    .expect("join");
    let addr_b = address(&b);
    assert!(addr_a.starts_with("10.250.0.") && addr_a != addr_b);
    assert!(pool("10.250.0.16/28").contains(&addr_a.parse().expect("ip")));
    assert!(pool("10.250.0.32/28").contains(&addr_b.parse().expect("ip")));
    let shown = run("ip", &["-n", &pod_a, "-4", "addr", "show", "eth0"]);
    assert!(shown.contains(&format!("{addr_a}/16")), "{shown}");

    for (from, to) in [(&pod_a, &addr_b), (&pod_b, &addr_a)] {
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

    for (p, c, uid) in [(&pod_a, "ca", uid_a), (&pod_b, "cb", uid_b)] {
        let del = tokio::task::spawn_blocking({
            let (n, p, c, conf) = (node_ns.clone(), p.clone(), c.to_string(), conf.clone());
            move || ptp(&n, "DEL", &p, &c, uid, &conf)
        })
        .await
        .expect("join");
        assert!(
            del.status.success(),
            "DEL: {}",
            String::from_utf8_lossy(&del.stdout)
        );
    }
    let checkpoint =
        std::fs::read_to_string(dir.path().join("state/checkpoint.json")).expect("the checkpoint");
    let v: serde_json::Value = serde_json::from_str(&checkpoint).expect("json");
    assert_eq!(v["allocations"], serde_json::json!([]), "both freed");

    // the agent down: ADD fails with code 11 through ptp, DEL succeeds and is spooled
    server.abort();
    let _ = server.await;
    let add = tokio::task::spawn_blocking({
        let (n, p, c) = (node_ns.clone(), pod_a.clone(), conf.clone());
        move || ptp(&n, "ADD", &p, "cc", uid_a, &c)
    })
    .await
    .expect("join");
    assert!(!add.status.success(), "an ADD with the agent down fails");
    let err: serde_json::Value = serde_json::from_slice(&add.stdout).expect("CNI error JSON");
    assert_eq!(err["code"], 11, "{err}");
    let del = tokio::task::spawn_blocking({
        let (n, p, c) = (node_ns.clone(), pod_a.clone(), conf.clone());
        move || ptp(&n, "DEL", &p, "cc", uid_a, &c)
    })
    .await
    .expect("join");
    assert!(del.status.success(), "a DEL with the agent down succeeds");
    let spooled = std::fs::read_dir(dir.path().join("spool"))
        .expect("the spool")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .count();
    assert_eq!(spooled, 1, "the DEL spooled for the agent");
}
