//! The CNI chain's set-up (the chain test and the chain bench share it): a network
//! namespace standing in for the node and one per pod (deleted on every exit path), the
//! in-process API server with node-a's IPAMNode and blocks, the agent (`run::run`) started
//! and stopped at will, and the main plugins (`ptp`, `bridge`, and `ptp` with `host-local`
//! for the anchor) run in the node's namespace as a runtime runs them. Needs root.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::Api;
use tidepool_agent::run::Settings;
use tidepool_api as api;
use tidepool_tests::ApiServer;

use super::running::RunningAgent;
use super::{UID_A, agent_on, blocking, cluster, create_block, settings, test_pool_of};

pub const PLUGINS: &str = "/usr/lib/cni";

/// Network namespaces, deleted when dropped (also when the test fails).
#[derive(Default)]
pub struct Namespaces(Mutex<Vec<String>>);

impl Namespaces {
    pub fn add(&self, name: &str) {
        run("ip", &["netns", "add", name]);
        self.0.lock().expect("lock").push(name.to_string());
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in self.0.lock().expect("lock").iter() {
            // a test may have removed one already (a crashed sandbox)
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stderr(Stdio::null())
                .status();
        }
    }
}

pub fn output(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"))
}

pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = output(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first address (no prefix) of a main plugin's ADD result.
pub fn address(out: &Output) -> String {
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
pub fn error_code(out: &Output) -> u64 {
    assert!(!out.status.success(), "expected a failure");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("CNI error JSON");
    v["code"].as_u64().expect("a code")
}

pub fn ping(from: &str, to: &str) {
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

pub fn pod_uid(i: usize) -> String {
    format!("0badc0de-0000-4000-8000-{i:012}")
}

/// One node: its namespace, the API server with node-a's IPAMNode, the agent's paths, and
/// the agent while it runs.
pub struct Node {
    pub ns: Namespaces,
    pub name: String,
    pub tag: String,
    pub dir: tempfile::TempDir,
    pub server: ApiServer,
    pub admin: kube::Client,
    pub settings: Settings,
    agent: Option<RunningAgent>,
}

impl Node {
    /// `test` names the namespaces; `blocks` are node-a's blocks at the start.
    pub async fn new(test: &str, blocks: &[&str]) -> Node {
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
        // the pool's IPv4 block size is the test's (a /31 holds two addresses)
        let v4 = blocks
            .iter()
            .filter_map(|b| b.parse::<ipnet::Ipv4Net>().ok())
            .map(|b| b.prefix_len())
            .next()
            .unwrap_or(28);
        test_pool_of(&admin, v4).await;
        for b in blocks {
            create_block(&admin, b, "node-a", UID_A, false).await;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let settings = Settings {
            // the two-block test's ADD waits for the second block to arrive
            empty_pool_wait: Duration::from_secs(2),
            ..settings(dir.path())
        };
        Node {
            ns,
            name,
            tag,
            dir,
            server,
            admin,
            settings,
            agent: None,
        }
    }

    /// Starts the agent and waits until it serves (its restore marker written anew).
    pub async fn start_agent(&mut self) {
        let _ = std::fs::remove_file(&self.settings.restored_marker);
        let client = self
            .server
            .client(&agent_on("node-a"))
            .await
            .expect("client");
        self.agent = Some(RunningAgent::start(client, &self.settings).await);
    }

    pub async fn stop_agent(&mut self) {
        self.agent.take().expect("the agent runs").stop().await;
    }

    /// A new pod namespace.
    pub fn pod(&self, i: usize) -> String {
        let name = format!("tpp-{}-{i}", self.tag);
        self.ns.add(&name);
        name
    }

    /// The main plugin's network config (`ptp` or `bridge`), its IPAM delegated to
    /// tidepool-cni; `ptp+host-local` is ptp with the reference IPAM plugin (the anchor).
    pub fn conf(&self, main: &str) -> String {
        let s = &self.settings;
        let (main, ipam) = match main {
            "bridge" => (
                r#""type":"bridge","bridge":"tpbr0","isGateway":true"#,
                String::new(),
            ),
            "ptp+host-local" => (
                r#""type":"ptp""#,
                format!(
                    r#"{{"type":"host-local","ranges":[[{{"subnet":"10.251.0.0/16"}}]],"dataDir":"{}"}}"#,
                    self.dir.path().join("host-local").display()
                ),
            ),
            _ => (r#""type":"ptp""#, String::new()),
        };
        let ipam = if ipam.is_empty() {
            format!(
                r#"{{"type":"tidepool-cni","socket":"{}","spoolDir":"{}","restoredMarker":"{}","connectTimeout":300}}"#,
                s.socket.display(),
                s.spool_dir.display(),
                s.restored_marker.display()
            )
        } else {
            ipam
        };
        format!(r#"{{"cniVersion":"1.0.0","name":"pods",{main},"ipam":{ipam}}}"#)
    }

    /// One CNI call of the `main` plugin, run in the node's namespace as a runtime runs it
    /// (off the runtime's threads).
    pub async fn cni(
        &self,
        main: &str,
        cmd: &str,
        pod_ns: &str,
        container: &str,
        uid: &str,
    ) -> Output {
        let netns = format!("/var/run/netns/{pod_ns}");
        let call = CniCall::new(cmd, &netns, container, uid);
        let plugin = main.split('+').next().unwrap_or(main);
        exec_plugin(&self.name, plugin, &call, plugin_dir(), self.conf(main)).await
    }

    /// node-a's `status.used` (address → pod UID) and `status.cooldown` addresses.
    pub async fn status(&self) -> (BTreeMap<String, String>, Vec<String>) {
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
    pub async fn until_status(
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

    /// `conflist` run as libcni runs a network config list (`cmd` ADD or DEL): each
    /// plugin in order for ADD, in reverse for DEL, each given the list's `cniVersion` and
    /// `name`, `runtime_config` (the capabilities the runtime passes), and the previous
    /// result (`prev_result` for the first DEL'd plugin: the ADD's cached result). Its
    /// IPAM section is pointed at this node's agent. The last plugin's output, or the first
    /// that failed.
    pub async fn cni_list(
        &self,
        conflist: &serde_json::Value,
        call: (&str, &str, &str, &str),
        runtime_config: &serde_json::Value,
        prev_result: Option<serde_json::Value>,
    ) -> Output {
        let (cmd, pod_ns, container, uid) = call;
        let netns = format!("/var/run/netns/{pod_ns}");
        let mut plugins = conflist["plugins"].as_array().expect("plugins").clone();
        if cmd == "DEL" {
            plugins.reverse();
        }
        let (mut prev, mut last) = (prev_result, None);
        for mut p in plugins {
            p["cniVersion"] = conflist["cniVersion"].clone();
            p["name"] = conflist["name"].clone();
            p["runtimeConfig"] = runtime_config.clone();
            if let Some(ipam) = p.get_mut("ipam") {
                let s = &self.settings;
                ipam["socket"] = s.socket.display().to_string().into();
                ipam["spoolDir"] = s.spool_dir.display().to_string().into();
                ipam["restoredMarker"] = s.restored_marker.display().to_string().into();
            }
            if let Some(r) = &prev {
                p["prevResult"] = r.clone();
            }
            let call = CniCall::new(cmd, &netns, container, uid);
            let plugin = p["type"].as_str().expect("a type").to_string();
            let out = exec_plugin(&self.name, &plugin, &call, plugin_dir(), p.to_string()).await;
            if !out.status.success() {
                return out;
            }
            if cmd == "ADD" {
                prev = Some(serde_json::from_slice(&out.stdout).expect("a CNI result"));
            }
            last = Some(out);
        }
        last.expect("a plugin in the list")
    }

    pub fn spooled(&self) -> usize {
        std::fs::read_dir(&self.settings.spool_dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                    .count()
            })
            .unwrap_or(0)
    }
}

pub fn in_net(net: &str, addr: &str) -> bool {
    let net: ipnet::IpNet = net.parse().expect("net");
    net.contains(&addr.parse::<std::net::IpAddr>().expect("ip"))
}

/// What a runtime tells a CNI plugin in its environment.
pub struct CniCall<'a> {
    pub cmd: &'a str,
    /// The pod's network namespace (a path).
    pub netns: &'a str,
    pub container: &'a str,
    /// The pod's namespace, name and UID, in `CNI_ARGS` as the kubelet passes them.
    pub namespace: &'a str,
    pub pod: &'a str,
    pub uid: &'a str,
}

impl<'a> CniCall<'a> {
    /// `cmd` for the pod named as its container (default namespace) with UID `uid`.
    pub fn new(cmd: &'a str, netns: &'a str, container: &'a str, uid: &'a str) -> Self {
        CniCall {
            cmd,
            netns,
            container,
            namespace: "default",
            pod: container,
            uid,
        }
    }
}

/// The directory of the built `tidepool-cni` (delegated plugins are found there first).
fn plugin_dir() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidepool-cni"))
        .parent()
        .expect("the plugin's directory")
}

/// Runs Debian's `plugin` inside network namespace `node_ns` with a clean `call`
/// environment and `conf` on stdin, as a runtime runs it (off the runtime's threads);
/// delegated plugins are found in `plugin_dir` (tidepool-cni), then in [`PLUGINS`].
pub async fn exec_plugin(
    node_ns: &str,
    plugin: &str,
    call: &CniCall<'_>,
    plugin_dir: &Path,
    conf: String,
) -> Output {
    let CniCall {
        cmd,
        netns,
        container,
        namespace,
        pod,
        uid,
    } = call;
    let args = vec![
        "netns".to_string(),
        "exec".into(),
        node_ns.to_string(),
        "env".into(),
        "-i".into(),
        // libcni passes the runtime's own environment too (its PATH: portmap runs iptables)
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        format!("CNI_COMMAND={cmd}"),
        format!("CNI_CONTAINERID={container}"),
        format!("CNI_NETNS={netns}"),
        "CNI_IFNAME=eth0".into(),
        format!("CNI_PATH={}:{PLUGINS}", plugin_dir.display()),
        format!(
            "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};K8S_POD_UID={uid}"
        ),
        format!("{PLUGINS}/{plugin}"),
    ];
    blocking(move || {
        let mut child = Command::new("ip")
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the plugin");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(conf.as_bytes())
            .expect("write the config");
        child.wait_with_output().expect("the plugin")
    })
    .await
}
