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
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use common::chain::*;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_in_two_blocks_ping_through_ptp_and_are_published() {
    // each /31 block holds two addresses; the third pod's comes from the second block
    let mut node = Node::new("ping", &["10.250.0.16/31"]).await;
    node.start_agent().await;
    let (pa, pc, pb) = (node.pod(0), node.pod(2), node.pod(1));
    let a = address(&node.cni("ptp", "ADD", &pa, "ca", &pod_uid(0)).await);
    let c = address(&node.cni("ptp", "ADD", &pc, "cc", &pod_uid(2)).await);
    create_block(&node.admin, "10.250.0.32/31", "node-a", UID_A, false).await;
    let b = address(&node.cni("ptp", "ADD", &pb, "cb", &pod_uid(1)).await);
    assert!(in_net("10.250.0.16/31", &a) && in_net("10.250.0.16/31", &c));
    assert!(in_net("10.250.0.32/31", &b), "{b} from the second block");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_pods_get_one_address_per_family_and_ping_over_ipv6() {
    let mut node = Node::new("dual", &["10.250.0.16/28"]).await;
    run(
        "ip",
        &[
            "netns",
            "exec",
            &node.name,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.forwarding=1",
        ],
    );
    create_block(&node.admin, "fd00:250::10/124", "node-a", UID_A, false).await;
    // the pod networks: the test pool's 10.250.0.0/16 and fd00:250::/64 (its IPPool)
    node.start_agent().await;
    let (pa, pb) = (node.pod(0), node.pod(1));
    let mut v6 = Vec::new();
    for (p, c, u) in [(&pa, "ca", 0), (&pb, "cb", 1)] {
        let out = node.cni("ptp", "ADD", p, c, &pod_uid(u)).await;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a CNI result");
        let ips: Vec<&str> = v["ips"]
            .as_array()
            .expect("ips")
            .iter()
            .map(|i| i["address"].as_str().expect("address"))
            .collect();
        assert_eq!(ips.len(), 2, "one per family: {v}");
        assert!(
            ips[0].ends_with("/16") && ips[1].ends_with("/64"),
            "{ips:?}"
        );
        let a6 = ips[1].split('/').next().expect("addr").to_string();
        assert!(in_net("fd00:250::10/124", &a6), "{a6}");
        v6.push(a6);
    }
    node.until_status("both families of both pods published", |used, _| {
        used.len() == 4 && v6.iter().all(|a| used.contains_key(a))
    })
    .await;
    let ping6 = |from: &str, to: &str| {
        output(
            "ip",
            &[
                "netns", "exec", from, "ping", "-6", "-c", "1", "-W", "2", to,
            ],
        )
    };
    // a fresh IPv6 address may still be in duplicate address detection: allow a few tries
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let out = ping6(&pa, &v6[1]);
        if out.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{pa} → {}: {}",
            v6[1],
            String::from_utf8_lossy(&out.stdout)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    node.stop_agent().await;
}

/// Reconcile needs positive evidence: with the runtime's netns directory not mounted, a pod
/// whose namespace vanished without a DEL (a crashed sandbox) keeps its address cycle after
/// cycle; with the real, populated directory, no libcni cache entry and no live pod, it is
/// freed into cooldown, and the pod whose cache entry exists keeps its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_frees_nothing_without_the_netns_mount() {
    let mut node = Node::new("recon", &["10.250.0.16/28"]).await;
    let cache = node.dir.path().join("results");
    node.settings.reconcile = tidepool_agent::reconcile::Config {
        netns_dir: node.dir.path().join("netns-not-mounted"),
        cni_cache_dir: cache.clone(),
        interval: std::time::Duration::from_millis(200),
        max_frees: 16,
    };
    node.start_agent().await;
    let (pa, pb) = (node.pod(0), node.pod(1));
    let a = address(&node.cni("ptp", "ADD", &pa, "ca", &pod_uid(0)).await);
    let b = address(&node.cni("ptp", "ADD", &pb, "cb", &pod_uid(1)).await);
    // the runtime's cache as libcni writes it: b's entry (a's sandbox never made it there)
    std::fs::create_dir_all(&cache).expect("cache dir");
    let entry = serde_json::json!({
        "kind": "cniCacheV1", "containerId": "cb", "ifName": "eth0", "networkName": "pods",
        "config": "", "result": {"cniVersion": "1.0.0", "ips": [{"address": format!("{b}/16")}]},
    });
    std::fs::write(cache.join("pods-cb-eth0"), entry.to_string()).expect("cache entry");
    run("ip", &["netns", "del", &pa]); // a's sandbox is gone, and no DEL came

    let sock = node.settings.socket.clone();
    let seen = eventually("five reconcile cycles", || {
        let sock = sock.clone();
        async move {
            let r = common::running::agent_get(&sock, "/v1/reconcile").await;
            (r["cycles"].as_u64().unwrap_or(0) >= 5).then_some(r)
        }
    })
    .await;
    let (used, cooling) = node.status().await;
    assert!(
        used.contains_key(&a) && used.contains_key(&b) && cooling.is_empty(),
        "nothing freed without the mount: {used:?} {cooling:?}; {seen}"
    );

    node.stop_agent().await;
    node.settings.reconcile.netns_dir = "/var/run/netns".into();
    node.start_agent().await;
    node.until_status("a freed by reconcile, b kept", |used, cooling| {
        used.keys().eq([&b]) && cooling == [a.clone()]
    })
    .await;
    node.stop_agent().await;
}

/// The conflist components/cni-install installs (its install-cni.sh run against temporary
/// CNI directories holding the reference plugins), run as libcni runs a list: ptp with
/// tidepool-cni as its IPAM, then portmap. The pod gets its address and its hostPort is
/// DNATed in the node's nat table; DEL, in reverse, removes both. The one rewrite: the IPAM
/// section is pointed at this test's agent (its socket, spool and marker paths).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installed_conflist_serves_a_pod_and_its_host_port() {
    let mut node = Node::new("conflist", &["10.250.0.16/28"]).await;
    node.start_agent().await;
    let conflist = installed_conflist(node.dir.path());
    let ports = serde_json::json!({"portMappings": [
        {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}
    ]});
    let pa = node.pod(0);
    let add = node
        .cni_list(&conflist, ("ADD", &pa, "ca", &pod_uid(0)), &ports, None)
        .await;
    let a = address(&add);
    assert!(in_net("10.250.0.16/28", &a), "{a}");
    let nat = || {
        run(
            "ip",
            &["netns", "exec", &node.name, "iptables", "-t", "nat", "-S"],
        )
    };
    let rules = nat();
    assert!(
        rules.contains("--dport 18080") && rules.contains(&format!("{a}:80")),
        "the hostPort is DNATed to the pod: {rules}"
    );
    node.until_status("a published", |used, _| used.contains_key(&a))
        .await;
    let result: serde_json::Value = serde_json::from_slice(&add.stdout).expect("a result");
    let del = node
        .cni_list(
            &conflist,
            ("DEL", &pa, "ca", &pod_uid(0)),
            &ports,
            Some(result),
        )
        .await;
    assert!(del.status.success(), "{del:?}");
    assert!(!nat().contains("--dport 18080"), "{}", nat());
    node.until_status("a freed", |used, cooling| {
        used.is_empty() && cooling == [a.clone()]
    })
    .await;
    node.stop_agent().await;
}

/// install-cni.sh run with the reference plugins (symlinked) in a temporary bin directory:
/// the conflist it wrote.
fn installed_conflist(dir: &std::path::Path) -> serde_json::Value {
    let (bin, conf) = (dir.join("cni-bin"), dir.join("net.d"));
    for d in [&bin, &conf] {
        std::fs::create_dir_all(d).expect("a CNI directory");
    }
    for p in ["ptp", "portmap"] {
        std::os::unix::fs::symlink(std::path::Path::new(PLUGINS).join(p), bin.join(p))
            .expect("symlink a plugin");
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/components/cni-install/install-cni.sh");
    let out = std::process::Command::new("sh")
        .arg(script)
        .env("CNI_BIN_DIR", &bin)
        .env("CNI_CONF_DIR", &conf)
        .env("PLUGIN_SRC", env!("CARGO_BIN_EXE_tidepool-cni"))
        .output()
        .expect("run install-cni.sh");
    assert!(out.status.success(), "install-cni.sh: {out:?}");
    let text = std::fs::read(conf.join("10-tidepool.conflist")).expect("the conflist");
    serde_json::from_slice(&text).expect("a conflist")
}
