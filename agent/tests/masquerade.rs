//! `--masquerade` in network namespaces (components/cni-install's agent, DESIGN.md
//! "Datapath"): two nodes on one L2 segment, their agents run with `--masquerade` and the
//! node subnet and a service CIDR as `--non-masquerade-cidrs`, an outside host on the same
//! segment but off the node subnet (198.51.100.1, routed on-link). A pod's datagram to a pod
//! of the other node arrives from the pod's address (the Kubernetes network model); one to
//! the outside host arrives from its node's address (ip-masq-agent's rule). Needs root:
//! fails (does not skip) without it.

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::Duration;

use common::chain::run;
use common::e2e::{Cluster, NODE_NET, POD_NETWORK, Tuning, until};
use common::kubelet::Backoff;
use serde_json::json;

const OUTSIDE: &str = "198.51.100.1";
const SERVICES: &str = "10.96.0.0/12";

/// A UDP socket bound to `addr` in network namespace `netns` (made on a thread that
/// entered it: the socket stays there, the caller's thread does not move).
fn udp_in(netns: &str, addr: &str) -> UdpSocket {
    let ns = File::open(Path::new("/run/netns").join(netns)).expect("the namespace");
    let addr: SocketAddr = addr.parse().expect("a socket address");
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let s = UdpSocket::bind(addr).expect("bind");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        s
    })
    .join()
    .expect("the socket's thread")
}

/// The source address a datagram from `from` (a pod's namespace) to `to` arrives with.
fn source_seen(from: &str, to_netns: &str, to: &str) -> String {
    let rx = udp_in(to_netns, &format!("{to}:0"));
    let port = rx.local_addr().expect("its port").port();
    let tx = udp_in(from, "0.0.0.0:0");
    let mut buf = [0u8; 16];
    for _ in 0..5 {
        tx.send_to(b"tidepool", (to, port)).expect("send");
        if let Ok((_, src)) = rx.recv_from(&mut buf) {
            return src.ip().to_string();
        }
    }
    panic!("no datagram from {from} reached {to}");
}

/// `iptables -t nat -S [chain]` in network namespace `netns`.
fn nat_rules(netns: &str, chain: &[&str]) -> String {
    let args = [
        &["netns", "exec", netns, "iptables", "-t", "nat", "-S"][..],
        chain,
    ]
    .concat();
    run("ip", &args)
}

/// The outside host: its namespace on the segment, 198.51.100.1/24, the node subnet on-link.
fn wire_outside(cluster: &Cluster) -> String {
    let ns = format!("tpe-{}-out", cluster.tag);
    cluster.ns.add(&ns);
    let lan = cluster.lan.as_str();
    run(
        "ip",
        &[
            "-n", lan, "link", "add", "out", "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ],
    );
    run("ip", &["-n", lan, "link", "set", "out", "master", "br0"]);
    run("ip", &["-n", lan, "link", "set", "out", "up"]);
    run("ip", &["-n", &ns, "link", "set", "lo", "up"]);
    run(
        "ip",
        &[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{OUTSIDE}/24"),
            "dev",
            "eth0",
        ],
    );
    run("ip", &["-n", &ns, "link", "set", "eth0", "up"]);
    let nodes = format!("{NODE_NET}.0/24");
    run("ip", &["-n", &ns, "route", "add", &nodes, "dev", "eth0"]);
    for rt in cluster.runtimes() {
        run(
            "ip",
            &[
                "-n",
                &rt.netns,
                "route",
                "add",
                "198.51.100.0/24",
                "dev",
                "eth0",
            ],
        );
    }
    ns
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_keep_their_source_between_nodes_and_hide_it_from_outside() {
    let mut cluster = Cluster::start("masq", Tuning::default()).await;
    cluster.apply_pool(&["10.77.0.0/24"], 28).await;
    cluster.start_operator();
    let keep = format!("{NODE_NET}.0/24,{SERVICES}");
    for n in ["node-a", "node-b"] {
        cluster
            .add_node_with(n, |c, rt, port| {
                let mut cmd = c.agent_command(rt, port);
                cmd.args(["--masquerade", "--non-masquerade-cidrs", &keep]);
                Cluster::spawn_agent_as(rt, cmd)
            })
            .await;
    }
    let outside = wire_outside(&cluster);
    let kubelet = cluster.start_kubelet(Backoff {
        first: Duration::from_millis(500),
        cap: Duration::from_secs(4),
    });
    let pods: Vec<String> = (0..4)
        .map(|i| {
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("masq-{i}"), "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "pause"}]},
            })
            .to_string()
        })
        .collect();
    cluster.kubectl.apply(&pods.join("\n---\n")).await;
    // one running pod per node: (netns, address)
    let mut per_node = BTreeMap::new();
    until(&cluster, "a pod running on each node", 30, async || {
        per_node = kubelet
            .sandboxes()
            .into_iter()
            .map(|(node, netns, addr)| (node, (netns, addr)))
            .collect();
        per_node.len() == 2
    })
    .await;
    let rts = cluster.runtimes();
    let node_a = rts.iter().find(|r| r.name == "node-a").expect("node-a");
    until(&cluster, "node-a's masquerade rule", 20, async || {
        let rules = nat_rules(&node_a.netns, &[]);
        rules.contains("-j TIDEPOOL-MASQ") && rules.contains("-j MASQUERADE")
    })
    .await;
    let (a_ns, a_addr) = &per_node["node-a"];
    let (b_ns, b_addr) = &per_node["node-b"];

    assert_eq!(
        source_seen(a_ns, b_ns, b_addr),
        *a_addr,
        "pod to pod across nodes keeps the pod's source address"
    );
    assert_eq!(
        source_seen(a_ns, &outside, OUTSIDE),
        node_a.ip,
        "pod to outside leaves with node-a's address"
    );
    let rules = nat_rules(&node_a.netns, &["TIDEPOOL-MASQ"]);
    // the harness gives its agents --pod-network (the networks in effect)
    for cidr in [POD_NETWORK, "192.168.77.0/24", SERVICES] {
        assert!(
            rules.contains(&format!("-d {cidr} ")),
            "{cidr} returns:\n{rules}"
        );
    }
}
