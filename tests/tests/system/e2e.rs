//! The whole system on one machine (issue 16): the in-process API server (RBAC and the
//! agent's admission policy on, TLS for kubectl, its simulated kubelet off), the real
//! `tidepool-operator run` binaries (leader-elected replicas) and one `tidepool-agent`
//! binary per node, every object of the set-up applied with kubectl.
//!
//! A node is a network namespace on one L2 segment (a bridge in a namespace of its own)
//! with its InternalIP on `eth0`; its pods' sandboxes are namespaces too, wired by Debian's
//! `ptp` run inside the node's namespace and delegating IPAM to the built `tidepool-cni`
//! ([`super::kubelet`] does that). Each agent runs inside its node's namespace (`ip netns
//! exec`) with `--node-routes`, so the routes to the other nodes' blocks via their
//! InternalIPs land there and pods ping across nodes. It reaches the API server (on the
//! host's loopback) through a [`Forwarder`] listening on the node's own `lo`: nothing is
//! added to the host's namespace.
//!
//! Every process and namespace is removed on every exit path: the processes are
//! [`KillOnDrop`], the forwarders stop when dropped, the namespaces [`Namespaces`], and the
//! fields drop in that order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tidepool_tests::{ADMIN, ApiServer, Config};

use super::chain::{Namespaces, PLUGINS, output, run};
use super::forward::Forwarder;
use super::kubelet::{Backoff, Kubelet};
use super::{KillOnDrop, OPERATOR, agent_on, blocking};

pub const AGENT_BIN: &str = env!("CARGO_BIN_EXE_tidepool-agent");
pub const CNI_BIN: &str = env!("CARGO_BIN_EXE_tidepool-cni");
/// The pod network every pool's CIDRs lie in (the agents' `--pod-network`).
pub const POD_NETWORK: &str = "10.77.0.0/16";
/// The nodes' L2 segment: node i has 192.168.77.(10 + i).
pub const NODE_NET: &str = "192.168.77";
/// The CNI network's name (libcni's cache entries start with it).
pub const NETWORK: &str = "pods";
/// Where `ip netns` keeps namespaces: the agents' `--netns-dir`.
pub const NETNS_DIR: &str = "/var/run/netns";

/// The operator binary: built by `cargo build -p tidepool-operator` (a `cargo test
/// --workspace` builds it) next to this crate's binaries; `TIDEPOOL_OPERATOR_BIN` overrides.
/// Cargo gives a test only its own package's binaries (artifact dependencies are unstable).
pub fn operator_bin() -> PathBuf {
    let p = std::env::var_os("TIDEPOOL_OPERATOR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(AGENT_BIN)
                .parent()
                .expect("the binaries' directory")
                .join("tidepool-operator")
        });
    assert!(
        p.is_file(),
        "{} not found: build it first with `cargo build -p tidepool-operator --bin tidepool-operator` \
         (same CARGO_TARGET_DIR) or set TIDEPOOL_OPERATOR_BIN",
        p.display()
    );
    p
}

/// kubectl: `/usr/bin/kubectl` (the machine's dispatcher), else the first on PATH.
pub fn kubectl_bin() -> PathBuf {
    let candidates = [PathBuf::from("/usr/bin/kubectl")].into_iter().chain(
        std::env::var_os("PATH")
            .map(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("kubectl"))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default(),
    );
    candidates
        .into_iter()
        .find(|c| c.is_file())
        .expect("kubectl not found: the end-to-end test drives the cluster with it")
}

/// Fails loudly unless root with ptp, ip and ping there (the test creates namespaces).
pub fn require_root() {
    let root = output("id", &["-u"]).stdout == b"0\n";
    assert!(
        root && Path::new(PLUGINS).join("ptp").exists(),
        "the end-to-end test needs root and Debian's containernetworking-plugins (ptp); \
         scripts/test.sh installs them"
    );
}

/// kubectl against the cluster as `admin`, with its own cache and HOME.
pub struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
}

impl Kubectl {
    pub fn new(server: &ApiServer, dir: &Path) -> Kubectl {
        std::fs::create_dir_all(dir).expect("kubectl's dir");
        server
            .write_kubeconfig(ADMIN, &dir.join("kubeconfig"))
            .expect("kubeconfig");
        Kubectl {
            bin: kubectl_bin(),
            dir: dir.to_path_buf(),
        }
    }

    /// Runs kubectl with `args` (and `stdin`), off the runtime's threads; fails the test
    /// when kubectl fails. Returns stdout.
    pub async fn ok(&self, args: &[&str], stdin: Option<String>) -> String {
        let mut cmd = Command::new(&self.bin);
        // The cache flag goes first: after `args`, it would land behind a `--` (a command).
        cmd.arg("--cache-dir")
            .arg(self.dir.join("cache"))
            .args(args)
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("HOME", &self.dir)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let what = format!("kubectl {args:?}");
        let out = blocking(move || {
            use std::io::Write as _;
            let mut child = cmd.spawn().expect("start kubectl");
            let mut input = child.stdin.take().expect("stdin");
            if let Some(s) = stdin {
                input.write_all(s.as_bytes()).expect("kubectl's stdin");
            }
            drop(input);
            child.wait_with_output().expect("kubectl")
        })
        .await;
        assert!(
            out.status.success(),
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `docs` (JSON or YAML documents).
    pub async fn apply(&self, docs: &str) -> String {
        self.ok(&["apply", "-f", "-"], Some(docs.to_string())).await
    }
}

/// A process the cluster started, its output in a log file (read on failure).
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Option<KillOnDrop>,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Proc {
        let file = std::fs::File::create(&log).expect("log file");
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
        Proc {
            name: name.to_string(),
            log,
            child: Some(KillOnDrop(child)),
        }
    }

    /// SIGKILL (a crash: no clean-up of its own); waits until it is gone.
    pub fn kill(&mut self) {
        drop(self.child.take());
    }

    pub fn running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => c.0.try_wait().expect("wait").is_none(),
            None => false,
        }
    }

    /// The log's last `lines` lines.
    pub fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// What a node's kubelet needs to run the CNI chain there (cheap to clone into tasks).
#[derive(Debug, Clone)]
pub struct NodeRuntime {
    pub name: String,
    /// The node's network namespace.
    pub netns: String,
    pub ip: String,
    pub dir: PathBuf,
}

impl NodeRuntime {
    pub fn socket(&self) -> PathBuf {
        self.dir.join("run/agent.sock")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn spool_dir(&self) -> PathBuf {
        self.state_dir().join("spool")
    }
    pub fn restored_marker(&self) -> PathBuf {
        self.dir.join("run/restored")
    }
    /// libcni's result cache as this node's runtime keeps it (`<cacheDir>/results`).
    pub fn cni_cache(&self) -> PathBuf {
        self.dir.join("cni/results")
    }

    /// The network config the runtime hands ptp: IPAM delegated to tidepool-cni.
    pub fn conf(&self) -> String {
        json!({
            "cniVersion": "1.0.0", "name": NETWORK, "type": "ptp",
            "ipam": {
                "type": "tidepool-cni",
                "socket": self.socket(),
                "spoolDir": self.spool_dir(),
                "restoredMarker": self.restored_marker(),
                "requestTimeout": 8000,
            },
        })
        .to_string()
    }
}

/// One node: its runtime, its agent process and the agent's way to the API server (the
/// agent is killed before the forwarder stops: fields drop in order).
pub struct NodeHost {
    pub rt: NodeRuntime,
    pub agent: Option<Proc>,
    pub forward: Forwarder,
}

/// How the cluster's processes are tuned for a short run.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// The agents' and the operator's `--reuse-cooldown`.
    pub reuse_cooldown: &'static str,
    /// The operator's `--reclaim-grace` and `--reclaim-min-age`.
    pub reclaim_grace: &'static str,
    /// The agents' `--reconcile-interval`.
    pub reconcile_interval: &'static str,
    /// The operator's `--agent-ready-grace` (its `AgentNotReady` event on a node whose
    /// agent never starts).
    pub agent_ready_grace: &'static str,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            reuse_cooldown: "2s",
            reclaim_grace: "1s",
            reconcile_interval: "1s",
            agent_ready_grace: "2s",
        }
    }
}

/// The cluster; dropping it stops every process, then removes every namespace.
pub struct Cluster {
    pub operators: Vec<Proc>,
    pub nodes: BTreeMap<String, NodeHost>,
    pub ns: Arc<Namespaces>,
    pub kubectl: Kubectl,
    pub admin: kube::Client,
    pub server: ApiServer,
    pub tag: String,
    pub tuning: Tuning,
    /// The L2 segment's namespace (the bridge the nodes' `eth0`s hang on).
    pub lan: String,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// The API server, the CRDs, both RBAC files and the agent's policy applied with
    /// kubectl, the L2 segment; no node and no operator yet.
    pub async fn start(test: &str, tuning: Tuning) -> Cluster {
        let cluster = Cluster::bare(test, tuning).await;
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let crds = repo.join("deploy/crds").display().to_string();
        cluster.kubectl.ok(&["apply", "-f", &crds], None).await;
        cluster.until_crds_established().await;
        for f in ["deploy/operator/rbac.yaml", "deploy/agent/rbac.yaml"] {
            let f = repo.join(f).display().to_string();
            cluster.kubectl.ok(&["apply", "-f", &f], None).await;
        }
        cluster
    }

    /// The API server (RBAC, TLS, no simulated kubelet) and the L2 segment, nothing
    /// applied: for a test that installs the objects itself (the deploy bundle).
    pub async fn bare(test: &str, tuning: Tuning) -> Cluster {
        require_root();
        let server = ApiServer::start_with(Config {
            rbac: true,
            tls: true,
            // the harness is the kubelet: nothing may delete pods behind DEL's back
            kubelet_delay: None,
            bookmark_interval: Duration::from_millis(500),
            ..Config::default()
        })
        .await
        .expect("start the API server");
        let admin = server.client(ADMIN).await.expect("admin client");
        let dir = tempfile::tempdir().expect("temp dir");
        let kubectl = Kubectl::new(&server, &dir.path().join("kubectl"));
        let tag = format!("{test}{}", std::process::id() % 100_000);
        let lan = format!("tpe-{tag}-lan");
        let ns = Arc::new(Namespaces::default());
        ns.add(&lan);
        run("ip", &["-n", &lan, "link", "add", "br0", "type", "bridge"]);
        run("ip", &["-n", &lan, "link", "set", "br0", "up"]);
        Cluster {
            operators: Vec::new(),
            nodes: BTreeMap::new(),
            ns,
            kubectl,
            admin,
            server,
            tag,
            tuning,
            lan,
            dir,
        }
    }

    /// Waits until tidepool's three CRDs are Established.
    pub async fn until_crds_established(&self) {
        self.kubectl
            .ok(
                &[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=30s",
                    "crd/ippools.ipam.tidepool.dev",
                    "crd/ipamblocks.ipam.tidepool.dev",
                    "crd/ipamnodes.ipam.tidepool.dev",
                ],
                None,
            )
            .await;
    }

    /// Starts operator replica `operator-{i}` (leader election on, short timings).
    pub fn start_operator(&mut self) {
        let i = self.operators.len();
        let name = format!("operator-{i}");
        let kubeconfig = self.dir.path().join(format!("{name}.kubeconfig"));
        self.server
            .write_kubeconfig(OPERATOR, &kubeconfig)
            .expect("kubeconfig");
        let cmd = operator_command(&name, &kubeconfig, &self.tuning, "127.0.0.1:0");
        let log = self.dir.path().join(format!("{name}.log"));
        self.operators.push(Proc::spawn(&name, cmd, log));
    }

    /// Applies the IPPool `default` (IPv4 `cidrs` in /`block` blocks) with kubectl.
    pub async fn apply_pool(&self, cidrs: &[&str], block: u8) {
        let pool = json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": "default"},
            "spec": {"cidrs": cidrs, "blockSize": {"ipv4": block}},
        });
        self.kubectl.apply(&pool.to_string()).await;
    }

    /// The kubelet stand-in for the nodes added so far (more join with its `add_node`).
    pub fn start_kubelet(&self, backoff: Backoff) -> Kubelet {
        Kubelet::start(
            self.admin.clone(),
            self.runtimes(),
            self.ns.clone(),
            &self.tag,
            backoff,
        )
    }

    /// The replica holding the Lease (its index), once one does.
    pub async fn leader(&self) -> usize {
        let leases: Api<Lease> = Api::namespaced(self.admin.clone(), "tidepool");
        super::eventually("an operator leads", || {
            let leases = leases.clone();
            async move {
                let l = leases.get_opt("tidepool-operator").await.ok()??;
                let holder = l.spec?.holder_identity?;
                let i = holder.strip_prefix("operator-")?.split('_').next()?;
                i.parse().ok()
            }
        })
        .await
    }

    /// Adds node `name`: its namespace on the segment with InternalIP 192.168.77.(10 + i),
    /// the Node object (kubectl; its addresses through the status subresource), and its
    /// agent; returns once the agent serves.
    pub async fn add_node(&mut self, name: &str) {
        self.add_node_with(name, Self::spawn_agent).await
    }

    /// [`Cluster::add_node`] with the agent started by `spawn` (given the node and the port
    /// of its forwarder to the API server), for agents run with other flags.
    pub async fn add_node_with(
        &mut self,
        name: &str,
        spawn: impl FnOnce(&Self, &NodeRuntime, u16) -> Proc,
    ) {
        self.add_node_without_agent(name).await;
        self.start_agent_with(name, spawn);
        self.until_serving(name).await;
    }

    /// [`Cluster::add_node`] without starting the agent (a node whose agent DaemonSet pod
    /// never started, or has not yet): [`Cluster::start_agent`] starts it.
    pub async fn add_node_without_agent(&mut self, name: &str) {
        self.wire_node_host(name);
        self.register_node(name).await;
    }

    /// Node `name`'s namespace on the segment (InternalIP 192.168.77.(10 + i)) and its way
    /// to the API server, with neither Node object nor agent yet ([`Cluster::register_node`],
    /// [`Cluster::start_agent`]): a kubelet stand-in may take its runtime at once.
    pub fn wire_node_host(&mut self, name: &str) -> NodeRuntime {
        let i = self.nodes.len();
        let rt = NodeRuntime {
            name: name.to_string(),
            netns: format!("tpe-{}-{name}", self.tag),
            ip: format!("{NODE_NET}.{}", 10 + i),
            dir: self.dir.path().join(name),
        };
        self.wire_node(&rt, i);
        let forward = Forwarder::start(&Path::new(NETNS_DIR).join(&rt.netns), self.server.addr());
        self.nodes.insert(
            name.to_string(),
            NodeHost {
                rt: rt.clone(),
                agent: None,
                forward,
            },
        );
        rt
    }

    /// Creates wired node `name`'s Node object (kubectl; its addresses and `Ready` through
    /// the status subresource).
    pub async fn register_node(&self, name: &str) {
        let ip = self.nodes[name].rt.ip.clone();
        self.kubectl
            .apply(
                &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
                    .to_string(),
            )
            .await;
        let nodes: Api<Node> = Api::all(self.admin.clone());
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "addresses": [{"type": "InternalIP", "address": ip}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                }})),
            )
            .await
            .expect("the Node's addresses");
    }

    /// Starts node `name`'s agent (added without one); returns at once, see
    /// [`Cluster::until_serving`].
    pub fn start_agent(&mut self, name: &str) {
        self.start_agent_with(name, Self::spawn_agent)
    }

    /// [`Cluster::start_agent`] through `spawn`.
    fn start_agent_with(
        &mut self,
        name: &str,
        spawn: impl FnOnce(&Self, &NodeRuntime, u16) -> Proc,
    ) {
        let host = &self.nodes[name];
        assert!(host.agent.is_none(), "{name}'s agent runs already");
        let agent = spawn(self, &host.rt, host.forward.port);
        self.nodes.get_mut(name).expect("a node").agent = Some(agent);
    }

    /// The node's namespace, `lo` up, forwarding on, `eth0` on the segment.
    fn wire_node(&self, rt: &NodeRuntime, i: usize) {
        let n = &rt.netns;
        self.ns.add(n);
        run("ip", &["-n", n, "link", "set", "lo", "up"]);
        run(
            "ip",
            &["netns", "exec", n, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
        );
        let port = format!("n{i}");
        run(
            "ip",
            &[
                "-n", &self.lan, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", n,
            ],
        );
        run(
            "ip",
            &["-n", &self.lan, "link", "set", &port, "master", "br0"],
        );
        run("ip", &["-n", &self.lan, "link", "set", &port, "up"]);
        let cidr = format!("{}/24", rt.ip);
        run("ip", &["-n", n, "addr", "add", &cidr, "dev", "eth0"]);
        run("ip", &["-n", n, "link", "set", "eth0", "up"]);
        std::fs::create_dir_all(rt.cni_cache()).expect("the node's CNI cache");
    }

    /// Node `rt`'s agent inside its namespace, `--node-routes` on, reaching the API server
    /// through the node's forwarder on `port` (the server's certificate names 127.0.0.1).
    fn spawn_agent(&self, rt: &NodeRuntime, port: u16) -> Proc {
        let cmd = self.agent_command(rt, port);
        Self::spawn_agent_as(rt, cmd)
    }

    /// Node `rt`'s agent started as `cmd` (from [`Cluster::agent_command`], more flags
    /// added), its log in the node's directory.
    pub fn spawn_agent_as(rt: &NodeRuntime, cmd: Command) -> Proc {
        let log = rt.dir.join("agent.log");
        Proc::spawn(&format!("agent on {}", rt.name), cmd, log)
    }

    /// The command [`Cluster::add_node`] starts node `rt`'s agent with.
    pub fn agent_command(&self, rt: &NodeRuntime, port: u16) -> Command {
        let kubeconfig = rt.dir.join("agent.kubeconfig");
        // after the Node exists: a node-bound identity carries the Node's UID
        let mut config: serde_json::Value =
            serde_json::from_str(&self.server.kubeconfig(&agent_on(&rt.name)))
                .expect("a kubeconfig");
        config["clusters"][0]["cluster"]["server"] = format!("https://127.0.0.1:{port}").into();
        std::fs::write(&kubeconfig, config.to_string()).expect("kubeconfig");
        let t = &self.tuning;
        let mut cmd = Command::new("ip");
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .args(["netns", "exec", &rt.netns, AGENT_BIN])
            .args(["--node-name", &rt.name, "--pod-network", POD_NETWORK])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--socket")
            .arg(rt.socket())
            .arg("--state-dir")
            .arg(rt.state_dir())
            .arg("--restored-marker")
            .arg(rt.restored_marker())
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(["--netns-dir", NETNS_DIR])
            .arg("--cni-cache-dir")
            .arg(rt.cni_cache())
            .args(["--reconcile-interval", t.reconcile_interval])
            .args(["--reuse-cooldown", t.reuse_cooldown])
            .args(["--node-wait", "60s"])
            .args(["--node-routes", "--node-routes-interval", "1s"]);
        cmd
    }

    /// Waits until node `name`'s agent has restored and serves (or fails with its log).
    pub async fn until_serving(&mut self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let host = self.nodes.get_mut(name).expect("a node");
        let agent = host.agent.as_mut().expect("its agent");
        while !host.rt.restored_marker().exists() {
            assert!(
                agent.running(),
                "{} stopped before serving:\n{}",
                agent.name,
                agent.tail(40)
            );
            assert!(
                Instant::now() < deadline,
                "{} did not start serving:\n{}",
                agent.name,
                agent.tail(40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILLs node `name`'s agent (its state dir and spool stay, as on a real node).
    pub fn kill_agent(&mut self, name: &str) {
        let host = self.nodes.get_mut(name).expect("a node");
        host.agent.as_mut().expect("its agent").kill();
    }

    /// Starts node `name`'s agent again on the same state and waits until its socket
    /// answers (the restore marker of this boot stays from the first start).
    pub async fn restart_agent(&mut self, name: &str) {
        let rt = self.nodes[name].rt.clone();
        let agent = self.spawn_agent(&rt, self.nodes[name].forward.port);
        self.nodes.get_mut(name).expect("a node").agent = Some(agent);
        let deadline = Instant::now() + Duration::from_secs(30);
        while reconcile_report(&rt).await.is_none() {
            let host = self.nodes.get_mut(name).expect("a node");
            let agent = host.agent.as_mut().expect("its agent");
            assert!(
                agent.running() && Instant::now() < deadline,
                "{} did not serve again:\n{}",
                agent.name,
                agent.tail(40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Crashes node `name`: its agent killed, its namespace removed (its pods' are the
    /// kubelet's: [`super::kubelet::Kubelet::crash_node`]), then its Node object deleted.
    pub async fn crash_node(&mut self, name: &str) {
        let NodeHost { rt, agent, forward } = self.nodes.remove(name).expect("a node");
        // the agent first, then its forwarder (whose listener holds the namespace)
        drop(agent);
        drop(forward);
        let _ = Command::new("ip")
            .args(["netns", "del", &rt.netns])
            .status();
        self.kubectl
            .ok(&["delete", "node", name, "--wait=false"], None)
            .await;
    }

    /// The live nodes' runtimes.
    pub fn runtimes(&self) -> Vec<NodeRuntime> {
        self.nodes.values().map(|n| n.rt.clone()).collect()
    }

    /// Every log line (of every process, the crashed ones' too) naming one of `words`.
    pub fn logs_matching(&self, words: &[String]) -> String {
        let mut out = String::new();
        let mut files: Vec<PathBuf> = self.operators.iter().map(|p| p.log.clone()).collect();
        for e in std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            files.push(e.path().join("agent.log"));
        }
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            for l in text
                .lines()
                .filter(|l| words.iter().any(|w| l.contains(w.as_str())))
            {
                out += &format!("{}: {l}\n", f.display());
            }
        }
        out
    }

    /// Every process's log tail, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for p in self
            .operators
            .iter()
            .chain(self.nodes.values().filter_map(|n| n.agent.as_ref()))
        {
            out += &format!("--- {} ---\n{}\n", p.name, p.tail(15));
        }
        out
    }
}

/// `tidepool-operator run` as replica `name` (its `POD_NAME`) with `kubeconfig`: leader
/// election on with short timings, `t`'s reclaim and cooldown times, resyncs every second,
/// metrics on `metrics` and probes on a free loopback port.
pub fn operator_command(name: &str, kubeconfig: &Path, t: &Tuning, metrics: &str) -> Command {
    let mut cmd = Command::new(operator_bin());
    cmd.args(["run", "--kubeconfig"])
        .arg(kubeconfig)
        .args(["--leader-elect-resource-namespace", "tidepool"])
        .args(["--leader-elect-lease-duration", "2s"])
        .args(["--leader-elect-renew-deadline", "1s"])
        .args(["--leader-elect-retry-period", "250ms"])
        .args(["--metrics-addr", metrics, "--health-addr", "127.0.0.1:0"])
        .args(["--sync-timeout", "20s", "--resync-interval", "1s"])
        .args(["--reclaim-grace", t.reclaim_grace])
        .args(["--reclaim-min-age", t.reclaim_grace])
        .args(["--reuse-cooldown", t.reuse_cooldown])
        .args(["--node-reclaim-grace", "2s"])
        .args(["--agent-ready-grace", t.agent_ready_grace])
        .args(["--kube-api-qps", "200", "--kube-api-burst", "200"])
        .env_clear()
        .env("POD_NAME", name)
        // TIDEPOOL_E2E_OPERATOR_LOG (e.g. `info,tidepool_ipam=debug`) when a run is debugged
        .env("TIDEPOOL_LOG_LEVEL", operator_log_level());
    cmd
}

/// The operators' log filter: `TIDEPOOL_E2E_OPERATOR_LOG`, else `info`.
fn operator_log_level() -> String {
    std::env::var("TIDEPOOL_E2E_OPERATOR_LOG").unwrap_or_else(|_| "info".into())
}

/// Waits (`secs` at most) until `f` holds, else fails with the cluster's logs.
pub async fn until(cluster: &Cluster, what: &str, secs: u64, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The agent's reconcile report on node `rt` (`GET /v1/reconcile`), if it answers.
pub async fn reconcile_report(rt: &NodeRuntime) -> Option<serde_json::Value> {
    let sock = rt.socket();
    blocking(move || {
        use std::io::{Read as _, Write as _};
        let mut s = std::os::unix::net::UnixStream::connect(&sock).ok()?;
        write!(
            s,
            "GET /v1/reconcile HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (_, body) = out.split_once("\r\n\r\n")?;
        serde_json::from_str(body).ok()
    })
    .await
}
