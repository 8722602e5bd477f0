//! The `tidepool-operator` binary itself: started with `--kubeconfig` as the operator's
//! service account against the in-process API server (RBAC and TLS on, so kubectl sends its
//! credentials), with the CRDs, the operator's RBAC (`deploy/operator/rbac.yaml`), a pool
//! and two Nodes applied by kubectl. It gives the Nodes IPAMNodes and blocks, kubectl shows
//! them with their printer columns, the probes and `/metrics` answer (with its build info
//! and the standard process metrics), it holds the
//! leader-election Lease (`--leader-elect` is on by default), and SIGTERM stops it with exit
//! status 0, the Lease released. With `--per-node-metrics`, `/metrics` shows each node's
//! addresses and drops a deleted node's series; a pod bound without an address is counted
//! waiting, and the `used` entry written for it (kubectl standing in for the agent) ends its
//! wait in `tidepool_ipam_pod_ip_wait_seconds`; the pool's blocks are counted by fill.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tidepool_tests::{ADMIN, ApiServer, Config};

// Shared with the agent's observability test (the system harness); Cargo shares no test
// modules between crates, so it is included by path.
#[path = "../../tests/tests/system/process_metrics.rs"]
mod process_metrics;

const OPERATOR: &str = "system:serviceaccount:tidepool:tidepool-operator";

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
        .display()
        .to_string()
}

fn kubectl_binary() -> PathBuf {
    let candidates = std::env::var_os("TIDEPOOL_KUBECTL")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/usr/bin/kubectl")])
        .chain(std::env::var_os("PATH").into_iter().flat_map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("kubectl"))
                .collect::<Vec<_>>()
        }));
    for c in candidates {
        if c.is_file() {
            return c;
        }
    }
    panic!("kubectl not found (TIDEPOOL_KUBECTL, /usr/bin/kubectl, PATH): this test needs it");
}

/// A temporary directory with one kubeconfig per identity; removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(server: &ApiServer) -> Self {
        let d = std::env::temp_dir().join(format!("tidepool-operator-bin-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        server.write_kubeconfig(ADMIN, &d.join("admin")).unwrap();
        server
            .write_kubeconfig(OPERATOR, &d.join("operator"))
            .unwrap();
        Dir(d)
    }

    fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(kubectl_binary())
            .args(args)
            .arg("--kubeconfig")
            .arg(self.0.join("admin"))
            .arg("--cache-dir")
            .arg(self.0.join("cache"))
            .env_remove("KUBECONFIG")
            .env("HOME", &self.0)
            .output()
            .expect("run kubectl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, text) = self.kubectl(args);
        assert!(ok, "kubectl {args:?} failed:\n{text}");
        text
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The operator process; killed on drop if still running.
struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// One plain HTTP GET: the status code and the body.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Some((code, body))
}

/// The value of the series `series` (name and labels as rendered) on /metrics.
fn metric(addr: SocketAddr, series: &str) -> Option<f64> {
    let (code, body) = get(addr, "/metrics")?;
    if code != 200 {
        return None;
    }
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn node_ips(node: &str, state: &str) -> String {
    format!("tidepool_ipam_node_ips{{node=\"{node}\",family=\"ipv4\",state=\"{state}\"}}")
}

fn blocks(state: &str) -> String {
    format!("tidepool_ipam_pool_blocks{{pool=\"default\",family=\"ipv4\",state=\"{state}\"}}")
}

/// `--per-node-metrics`, pods waiting, pod bound → address and block fill, on the running
/// operator's /metrics.
fn per_node_and_waiting_metrics(dir: &Dir, metrics: SocketAddr) {
    // each node's pool as its IPAMNode's ALLOCATED column shows it; no pod: all free
    for n in ["node-a", "node-b"] {
        let allocated: f64 = dir
            .ok(&["get", "ipamnode", n, "-o", "jsonpath={.status.allocated}"])
            .parse()
            .unwrap();
        assert!(allocated >= 8.0, "{n}: pre-allocate 8: {allocated}");
        eventually(&format!("{n}'s per-node series"), || {
            (metric(metrics, &node_ips(n, "allocated"))? == allocated
                && metric(metrics, &node_ips(n, "free"))? == allocated
                && metric(metrics, &node_ips(n, "used"))? == 0.0)
                .then_some(())
        });
    }
    // one block each, nothing used in it
    eventually("two empty blocks", || {
        (metric(metrics, &blocks("empty"))? == 2.0
            && metric(metrics, &blocks("partial"))? == 0.0
            && metric(metrics, &blocks("full"))? == 0.0)
            .then_some(())
    });
    assert_eq!(
        metric(
            metrics,
            "tidepool_ipam_pods_waiting{family=\"ipv4\",pool=\"default\"}"
        ),
        Some(0.0)
    );

    // a pod bound to node-a that no agent serves: it waits
    dir.ok(&[
        "apply",
        "-f",
        &repo("operator/tests/fixtures/waiting-pod.yaml"),
    ]);
    eventually("1 pod waiting for an IPv4 address", || {
        (metric(
            metrics,
            "tidepool_ipam_pods_waiting{family=\"ipv4\",pool=\"default\"}",
        )? == 1.0)
            .then_some(())
    });
    let (_, body) = get(metrics, "/metrics").expect("/metrics");
    assert!(
        !body.contains("tidepool_ipam_pods_waiting{family=\"ipv6\""),
        "an IPv4-only pool: no series of pods waiting for IPv6"
    );
    assert_eq!(
        metric(metrics, "tidepool_ipam_pod_ip_wait_seconds_count"),
        Some(0.0)
    );
    // kubectl stands in for node-a's agent: a used entry of the pod's UID in node-a's block
    let uid = dir.ok(&[
        "get",
        "pod",
        "-n",
        "apps",
        "waiter",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let cidr = dir.ok(&[
        "get",
        "ipamblocks",
        "-o",
        "jsonpath={.items[?(@.spec.node==\"node-a\")].spec.cidr}",
    ]);
    let net: std::net::Ipv4Addr = cidr.split('/').next().unwrap().parse().unwrap();
    let addr = std::net::Ipv4Addr::from(u32::from(net) + 1);
    let patch = format!(
        r#"{{"status":{{"used":{{"{addr}":{{"podUID":"{uid}","namespace":"apps","pod":"waiter","containerID":"c0ffee","ifname":"eth0","since":"2026-11-25T00:00:00Z"}}}}}}}}"#
    );
    dir.ok(&[
        "patch",
        "ipamnode",
        "node-a",
        "--subresource=status",
        "--type=merge",
        "-p",
        &patch,
    ]);
    eventually("the wait observed, nothing waiting", || {
        (metric(metrics, "tidepool_ipam_pod_ip_wait_seconds_count")? == 1.0
            && metric(
                metrics,
                "tidepool_ipam_pods_waiting{family=\"ipv4\",pool=\"default\"}",
            )? == 0.0)
            .then_some(())
    });
    let waited = metric(metrics, "tidepool_ipam_pod_ip_wait_seconds_sum").unwrap();
    assert!(waited > 0.0 && waited < 60.0, "waited {waited} s");
    eventually("node-a uses 1, its block partial", || {
        (metric(metrics, &node_ips("node-a", "used"))? == 1.0
            && metric(metrics, &blocks("partial"))? == 1.0
            && metric(metrics, &blocks("empty"))? == 1.0)
            .then_some(())
    });

    // node-b goes: its addresses are reclaimed, then its series leave /metrics; node-a's stay
    dir.ok(&["delete", "node", "node-b", "--wait=false"]);
    eventually("node-b's series gone", || {
        let (_, body) = get(metrics, "/metrics")?;
        (!body.contains("node=\"node-b\"")).then_some(())
    });
    assert!(metric(metrics, &node_ips("node-a", "allocated")).is_some());
    eventually("node-b's block released", || {
        (metric(metrics, &blocks("empty"))? == 0.0).then_some(())
    });
}

fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_a_cluster_driven_by_kubectl() {
    let server = ApiServer::start_with(Config {
        rbac: true,
        tls: true,
        ..Config::default()
    })
    .await
    .expect("start the API server");
    let dir = Dir::new(&server);
    tokio::task::spawn_blocking(move || scenario(&dir))
        .await
        .expect("the scenario");
}

fn scenario(dir: &Dir) {
    dir.ok(&["apply", "-f", &repo("deploy/crds")]);
    dir.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/ippools.ipam.tidepool.dev",
        "crd/ipamblocks.ipam.tidepool.dev",
        "crd/ipamnodes.ipam.tidepool.dev",
    ]);
    dir.ok(&["apply", "-f", &repo("deploy/operator/rbac.yaml")]);
    dir.ok(&["apply", "-f", &repo("operator/tests/fixtures/cluster.yaml")]);

    let (metrics, health) = (free_port(), free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_tidepool-operator"))
        .args(["run", "--kubeconfig"])
        .arg(dir.0.join("operator"))
        .args(["--leader-elect-resource-namespace", "tidepool"])
        .args(["--leader-elect-lease-duration", "2s"])
        .args(["--leader-elect-renew-deadline", "1s"])
        .args(["--leader-elect-retry-period", "250ms"])
        .env("POD_NAME", "operator-0")
        .args(["--metrics-addr", &metrics.to_string()])
        .args(["--health-addr", &health.to_string()])
        .args(["--sync-timeout", "20s", "--resync-interval", "2s"])
        .args(["--per-node-metrics", "--node-reclaim-grace", "1s"])
        .env_remove("TIDEPOOL_LOG_LEVEL")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tidepool-operator");
    let mut op = Operator(child);
    // read the log as it comes (a full pipe would stall the operator)
    let mut stderr = op.0.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    eventually("/readyz ready", || {
        get(health, "/readyz").filter(|(c, _)| *c == 200)
    });
    assert_eq!(get(health, "/healthz").map(|(c, _)| c), Some(200));

    // IPAMNodes with the Allocated column filled, and a block each
    let table = eventually("two IPAMNodes with addresses", || {
        let t = dir.ok(&["get", "ipamnodes"]);
        let rows: Vec<&str> = t.lines().filter(|l| l.starts_with("node-")).collect();
        let filled = rows
            .iter()
            .filter(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|c| c.parse::<u64>().is_ok())
            })
            .count();
        (filled == 2).then_some(t)
    });
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    // a CRD with printer columns shows NAME and its columns (AGE because it names one)
    assert_eq!(
        header,
        [
            "NAME",
            "V4-ALLOCATED",
            "V4-USED",
            "V6-ALLOCATED",
            "V6-USED",
            "AGENT",
            "BLOCKED",
            "POOL",
            "AGE"
        ],
        "{table}"
    );
    // the POOL column names the pool the node's blocks come from (`status.pools`, a list
    // printed as JSON, as kube-apiserver's table convertor prints a list value); a cell
    // is read at its header's offset (kubectl aligns columns left, blank cells are blank)
    let pool = table.lines().next().unwrap().find("POOL").unwrap();
    for row in table.lines().filter(|l| l.starts_with("node-")) {
        assert_eq!(
            row.get(pool..).and_then(|c| c.split_whitespace().next()),
            Some(r#"["default"]"#),
            "{table}"
        );
    }
    let blocks = dir.ok(&["get", "ipamblocks"]);
    let header: Vec<&str> = blocks.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "NODE", "CIDR", "POOL", "RELEASE", "ANSWER", "AGE"],
        "{blocks}"
    );
    for n in ["node-a", "node-b"] {
        assert!(
            blocks
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(n)),
            "{n} has a block:\n{blocks}"
        );
    }
    let pools = dir.ok(&["get", "ippools"]);
    assert!(pools.starts_with("NAME"), "{pools}");
    assert!(pools.contains("default"), "{pools}");

    // /metrics: the engine's node gauge (published on each resync), from a real exporter
    eventually(
        "tidepool_ipam_nodes{category=\"total\"} 2 on /metrics",
        || {
            let (code, body) = get(metrics, "/metrics")?;
            let total = "tidepool_ipam_nodes{category=\"total\"} 2";
            // and the leader gauge and transitions of this replica, which leads
            let want = [
                total,
                "tidepool_leader 1",
                "tidepool_leader_transitions_total 1",
            ];
            (code == 200 && want.iter().all(|w| body.lines().any(|l| l == *w))).then_some(())
        },
    );

    // the process itself: build info and the standard process_* families
    let (_, body) = get(metrics, "/metrics").expect("/metrics");
    process_metrics::assert_process_series(&body, env!("CARGO_PKG_VERSION"));

    per_node_and_waiting_metrics(dir, metrics);

    // it leads: the Lease names it
    let holder = || {
        dir.ok(&[
            "get",
            "lease",
            "-n",
            "tidepool",
            "tidepool-operator",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
    };
    assert!(holder().starts_with("operator-0_"), "{}", holder());

    // SIGTERM: stops, exit status 0, the Lease released
    let pid = op.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = op.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "still running 15 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = log.join().unwrap();
    assert!(status.success(), "exit {status:?}:\n{log}");
    assert!(log.contains("SIGTERM"), "{log}");
    // the default level is info (the leader's lines), and a pipe gets no colour codes
    assert!(log.contains(" INFO ") && log.contains("leading"), "{log}");
    assert!(
        !log.contains('\x1b'),
        "ANSI escapes in a piped log:\n{log:?}"
    );
    assert_eq!(holder(), "", "the Lease is released:\n{log}");
}

/// `run` against `server` as the operator (leader election on, as deployed), until it exits
/// (at most 60 s): its exit code and stderr.
fn run_until_exit(server: &ApiServer) -> (Option<i32>, String) {
    // not Dir's: the other test of this binary uses that one meanwhile
    let kubeconfig = std::env::temp_dir().join(format!(
        "tidepool-operator-preflight-{}-{}",
        std::process::id(),
        server.addr().port()
    ));
    server.write_kubeconfig(OPERATOR, &kubeconfig).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_tidepool-operator"))
        .args(["run", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--leader-elect-resource-namespace", "tidepool"])
        .env("POD_NAME", "operator-0")
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
        ])
        .args(["--sync-timeout", "20s"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tidepool-operator");
    let mut op = Operator(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = op.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the operator did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    op.0.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let _ = std::fs::remove_file(&kubeconfig);
    (status.code(), stderr)
}

/// Preflight (docs/operations.md "Preflight"): below Kubernetes 1.31 by `gitVersion` (a 1.30 server
/// also drops the CRDs' selectableFields), and on a 1.31 server whose ipamblocks CRD has no
/// field selector (CustomResourceFieldSelectors off), `run` exits with status 2 at once,
/// naming the cause and the fix, instead of failing later with a misleading message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_a_cluster_it_cannot_work_in_naming_the_cause() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, PostParams};
    for (git_version, selectable, says) in [
        (
            "v1.30.4",
            true,
            "error: the API server is Kubernetes 1.30.4: tidepool needs 1.31 or later",
        ),
        (
            "v1.31.4-eks-1234567",
            false,
            "error: the API server refuses the field selector spec.node= on ipamblocks (400: \
             field label not supported: spec.node): CRD field selectors are off",
        ),
    ] {
        let server = ApiServer::start_with(Config {
            git_version: git_version.into(),
            ..Config::default()
        })
        .await
        .expect("start the API server");
        let crds: Api<CustomResourceDefinition> =
            Api::all(server.client(ADMIN).await.expect("client"));
        for mut crd in tidepool_api::crds() {
            if !selectable {
                for v in &mut crd.spec.versions {
                    v.selectable_fields = None;
                }
            }
            crds.create(&PostParams::default(), &crd)
                .await
                .expect("a CRD");
        }
        let (code, stderr) = tokio::task::spawn_blocking(move || run_until_exit(&server))
            .await
            .expect("the operator");
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains(says), "{git_version}: {stderr}");
    }
}
