//! The whole system, end to end (issue 16), kept short for CI: three nodes (network
//! namespaces on one L2 segment, an agent binary each, run inside its node's namespace),
//! two `tidepool-operator run` replicas (the leader killed midway), an agent killed and
//! restarted, pods created and deleted with kubectl whose sandboxes go through ptp →
//! tidepool-cni, pods crashed without a DEL, a pool CIDR added while a node waits for
//! addresses and the first one removed while pods use it, two pools (issue 29: `default`,
//! and `blue` serving namespace `blue`, created and labelled with kubectl, whose pods run
//! on every node), pods of both pools on different nodes pinging each other (through the
//! agents' `--node-routes`), Deployments created, scaled and deleted with kubectl (a
//! controller stand-in makes their pods) and churned for `TIDEPOOL_E2E_ROUNDS` rounds (1
//! by default), a node crashed at the end. Judged at the end by the simulator's invariants
//! ([`common::judge`]), every address in its pod's pool among them. Needs root: fails
//! (does not skip) without it.
//!
//! Run: `cargo build -p tidepool-operator --bin tidepool-operator && cargo test -p
//! tidepool-agent --test e2e -- --nocapture` (the figures and a summary are printed).
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use common::deployments::Deployments;
use common::e2e::{Cluster, Tuning, reconcile_report, until};
use common::figures::quantile;
use common::judge::{Crashes, Snapshot, Tombstones, violations};
use common::kubelet::{Backoff, Kubelet, Sandbox};
use ipnet::IpNet;
use kube::api::{Api, ListParams};
use serde_json::json;

/// The namespace pool [`BLUE`] selects (by its label `team: blue`), and that pool's name.
const BLUE: &str = "blue";
/// Pool [`BLUE`]'s CIDR, in the agents' `--pod-network` as every pool's.
const BLUE_CIDR: &str = "10.77.8.0/26";

/// `count` pods `e2e-{first}`… of namespace `default`, as a YAML stream of JSON documents.
fn pods(first: usize, count: usize) -> String {
    pods_of("default", "e2e", first, count)
}

/// `count` pods `{prefix}-{first}`… of `namespace`, as a YAML stream of JSON documents.
fn pods_of(namespace: &str, prefix: &str, first: usize, count: usize) -> String {
    let docs: Vec<String> = (first..first + count)
        .map(|i| {
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{prefix}-{i}"), "namespace": namespace,
                             "labels": {"app": prefix}},
                "spec": {"containers": [{"name": "c", "image": "pause"}]},
            })
            .to_string()
        })
        .collect();
    docs.join("\n---\n")
}

/// Deployment `name` with `replicas` pods of the pause image, labelled `app: name`.
fn deployment(name: &str, replicas: usize) -> String {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "pause"}]},
            },
        },
    })
    .to_string()
}

/// How many rounds of Deployment churn: `TIDEPOOL_E2E_ROUNDS` (1, the CI run, by default).
fn rounds() -> usize {
    std::env::var("TIDEPOOL_E2E_ROUNDS")
        .ok()
        .map(|r| r.parse().expect("TIDEPOOL_E2E_ROUNDS is a count"))
        .unwrap_or(1)
}

/// Crashes pod `name` (`uid`): its sandbox's namespace goes without a DEL, and kubectl
/// removes the object as a person would; recorded in `crashes`.
async fn crash_pod(
    cluster: &Cluster,
    k: &Kubelet,
    crashes: &mut Crashes,
    name: String,
    uid: String,
) {
    let addr = k.crash_pod(&uid);
    cluster
        .kubectl
        .ok(
            &["delete", "pod", &name, "--force", "--grace-period=0"],
            None,
        )
        .await;
    crashes.sandboxes.insert((addr, uid));
}

/// The running pods of namespace `default`: (name, UID).
fn running(k: &Kubelet) -> Vec<(String, String)> {
    running_on(k, None)
}

/// The running pods of namespace `default` on `node` (any node: `None`): (name, UID).
fn running_on(k: &Kubelet, node: Option<&str>) -> Vec<(String, String)> {
    k.record(|r| {
        r.sandboxes
            .iter()
            .filter(|(u, s)| {
                r.namespaces[*u] == "default"
                    && matches!(s, Sandbox::Running { node: n, .. } if node.is_none_or(|w| w == n))
            })
            .map(|(u, _)| (r.names[u].clone(), u.clone()))
            .collect()
    })
}

/// The running pods of Deployment `deploy` (named `<deploy>-<suffix>`): (name, UID).
fn running_of(k: &Kubelet, deploy: &str) -> Vec<(String, String)> {
    let prefix = format!("{deploy}-");
    running(k)
        .into_iter()
        .filter(|(n, _)| n.starts_with(&prefix))
        .collect()
}

/// Waits until each Deployment runs exactly its count of pods and the cluster settled:
/// every pod running, none terminating, every reclaim done.
async fn until_replicas(cluster: &Cluster, k: &Kubelet, want: &[(&str, usize)]) {
    until(
        cluster,
        &format!("replicas {want:?} and settled"),
        60,
        async || {
            want.iter().all(|(d, n)| running_of(k, d).len() == *n)
                && k.settled().await
                && Snapshot::take(&cluster.admin)
                    .await
                    .is_ok_and(|s| s.settled())
        },
    )
    .await;
}

/// Removes `removed`, the pool's first CIDR, with kubectl and waits until each of its
/// blocks is marked for release and its node's agent answered the mark: from then on no
/// ADD may get one of its addresses.
async fn remove_first_cidr(cluster: &Cluster, removed: &IpNet) {
    let patch = format!(
        r#"[{{"op":"test","path":"/spec/cidrs/0","value":"{removed}"}},
            {{"op":"remove","path":"/spec/cidrs/0"}}]"#
    );
    cluster
        .kubectl
        .ok(
            &["patch", "ippool", "default", "--type=json", "-p", &patch],
            None,
        )
        .await;
    until(
        cluster,
        "the removed CIDR's blocks marked and answered",
        30,
        async || {
            let blocks = blocks_in(&cluster.admin, removed).await;
            !blocks.is_empty()
                && blocks.iter().all(|b| {
                    b.spec.release.is_some()
                        && b.status.as_ref().is_some_and(|s| s.release_ack.is_some())
                })
        },
    )
    .await;
}

/// The pods that used `removed` when it went (`on_removed`) and kept their sandboxes kept
/// their addresses, in their nodes' `status.used` too (`keeper` among them); once kubectl
/// deleted them, its blocks go. Returns how many were deleted.
async fn drain_removed(
    cluster: &Cluster,
    kubelet: &Kubelet,
    removed: &IpNet,
    on_removed: &[(String, String, String, String)],
    keeper: &str,
) -> usize {
    let snap = Snapshot::take(&cluster.admin).await.expect("snapshot");
    let lost: BTreeSet<String> = kubelet.record(|r| r.lost.iter().map(|l| l.1.clone()).collect());
    let kept: Vec<&(String, String, String, String)> = on_removed
        .iter()
        .filter(|(_, uid, ..)| snap.pods.contains_key(uid) && !lost.contains(uid))
        .collect();
    assert!(kept.iter().any(|k| k.0 == keeper), "{keeper} is kept");
    for (name, uid, node, addr) in &kept {
        assert_eq!(
            snap.pods[uid].ips,
            vec![addr.clone()],
            "{name} kept its address"
        );
        assert_eq!(
            snap.used[node].get(addr),
            Some(uid),
            "{name}'s {addr} is still used on {node}"
        );
    }
    let mut args = vec!["delete", "pod", "--wait=false"];
    args.extend(kept.iter().map(|k| k.0.as_str()));
    cluster.kubectl.ok(&args, None).await;
    until(
        cluster,
        "the removed CIDR's blocks released",
        40,
        async || blocks_in(&cluster.admin, removed).await.is_empty(),
    )
    .await;
    kept.len()
}

/// Deployment `web` (3 replicas) created and `api` (2) applied with kubectl; waits until
/// their pods run.
async fn create_deployments(cluster: &Cluster, kubelet: &Kubelet) {
    // `kubectl create deployment` sends the object as protobuf (the server decodes Deployments)
    let out = cluster
        .kubectl
        .ok(
            &[
                "create",
                "deployment",
                "web",
                "--image=pause",
                "--replicas=3",
            ],
            None,
        )
        .await;
    assert!(out.contains("deployment.apps/web created"), "{out}");
    cluster.kubectl.apply(&deployment("api", 2)).await;
    until_replicas(cluster, kubelet, &[("web", 3), ("api", 2)]).await;
}

/// One round of churn: `web` scaled up to 6 with `kubectl scale` and `api` to 3 or 2 with
/// `kubectl apply`; a web pod crashes (no DEL; kubectl removes its object), an api pod's
/// sandbox is lost, a web pod is deleted with kubectl (DEL), the controller replaces them;
/// then web is scaled down to 2 (the surplus deleted gracefully: DEL).
async fn churn(cluster: &Cluster, k: &Kubelet, crashes: &mut Crashes, round: usize) {
    let api = 2 + (round + 1) % 2;
    cluster
        .kubectl
        .ok(&["scale", "deployment", "web", "--replicas=6"], None)
        .await;
    cluster.kubectl.apply(&deployment("api", api)).await;
    until_replicas(cluster, k, &[("web", 6), ("api", api)]).await;
    let (name, uid) = running_of(k, "web").swap_remove(round % 6);
    crash_pod(cluster, k, crashes, name, uid).await;
    let (_, uid) = running_of(k, "api").swap_remove(0);
    let addr = k.lose_sandbox(&uid);
    crashes.sandboxes.insert((addr, uid));
    let (name, _) = running_of(k, "web").swap_remove(0);
    cluster
        .kubectl
        .ok(&["delete", "pod", &name, "--wait=false"], None)
        .await;
    until_replicas(cluster, k, &[("web", 6), ("api", api)]).await;
    cluster
        .kubectl
        .ok(&["scale", "deployment", "web", "--replicas=2"], None)
        .await;
    until_replicas(cluster, k, &[("web", 2), ("api", api)]).await;
}

/// The running pods with an address in `net`: (name, UID, node, address).
fn running_in(k: &Kubelet, net: &IpNet) -> Vec<(String, String, String, String)> {
    k.record(|r| {
        r.sandboxes
            .iter()
            .filter_map(|(u, s)| match s {
                Sandbox::Running { node, addr, .. }
                    if addr.parse().is_ok_and(|a: IpAddr| net.contains(&a)) =>
                {
                    Some((r.names[u].clone(), u.clone(), node.clone(), addr.clone()))
                }
                _ => None,
            })
            .collect()
    })
}

/// The IPAMBlocks that lie in `net`.
async fn blocks_in(admin: &kube::Client, net: &IpNet) -> Vec<tidepool_api::IPAMBlock> {
    let blocks: Api<tidepool_api::IPAMBlock> = Api::all(admin.clone());
    let list = blocks
        .list(&ListParams::default())
        .await
        .expect("list blocks");
    list.items
        .into_iter()
        .filter(|b| {
            b.spec
                .cidr
                .0
                .parse::<IpNet>()
                .is_ok_and(|c| net.contains(&c))
        })
        .collect()
}

/// One running sandbox per (node, pod namespace): (netns, address).
fn one_per_node_and_namespace(k: &Kubelet) -> BTreeMap<(String, String), (String, String)> {
    k.record(|r| {
        let mut one = BTreeMap::new();
        for (uid, s) in &r.sandboxes {
            if let Sandbox::Running {
                node, netns, addr, ..
            } = s
            {
                let key = (node.clone(), r.namespaces[uid].clone());
                one.entry(key).or_insert((netns.clone(), addr.clone()));
            }
        }
        one
    })
}

/// One pod of each namespace (so of each pool: `default` and [`BLUE`]) on each node pings
/// one pod of each namespace on every other node: through the routes the agents
/// (`--node-routes`, inside their nodes' namespaces) keep to the other nodes' blocks of
/// every pool. Returns how many pairs were pinged.
fn ping_across_nodes(k: &Kubelet) -> usize {
    let one = one_per_node_and_namespace(k);
    let mut pairs = 0;
    for ((from, _), (netns, _)) in &one {
        for ((to, _), (_, addr)) in &one {
            if from != to {
                common::chain::ping(netns, addr);
                pairs += 1;
            }
        }
    }
    pairs
}

/// Namespace [`BLUE`] created and labelled with kubectl, and pool [`BLUE`] that selects it
/// applied (/28 blocks, no pre-allocation: a node claims one for its first blue pod).
async fn blue_pool(cluster: &Cluster) {
    cluster
        .kubectl
        .ok(&["create", "namespace", BLUE], None)
        .await;
    cluster
        .kubectl
        .ok(&["label", "namespace", BLUE, "team=blue"], None)
        .await;
    let pool = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": BLUE},
        "spec": {"cidrs": [BLUE_CIDR], "blockSize": {"ipv4": 28},
                 "namespaceSelector": {"matchLabels": {"team": "blue"}}},
    });
    cluster.kubectl.apply(&pool.to_string()).await;
}

/// Three pods of namespace [`BLUE`] created with kubectl; waits until one runs on each
/// node, with an address of pool [`BLUE`].
async fn blue_pods(cluster: &Cluster, k: &Kubelet) {
    cluster.kubectl.apply(&pods_of(BLUE, "blue", 0, 3)).await;
    let blue: IpNet = BLUE_CIDR.parse().expect("a CIDR");
    until(cluster, "a blue pod running on each node", 30, async || {
        let one = one_per_node_and_namespace(k);
        let on: Vec<&String> = one
            .iter()
            .filter(|((_, ns), (_, addr))| {
                ns == BLUE && addr.parse().is_ok_and(|a: IpAddr| blue.contains(&a))
            })
            .map(|((node, _), _)| node)
            .collect();
        on.len() == 3
    })
    .await;
}

/// Every allocation the agents' reconcile freed, as (node, address, pod UID).
async fn reconcile_frees(cluster: &Cluster) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rt in cluster.runtimes() {
        let report = reconcile_report(&rt)
            .await
            .unwrap_or_else(|| panic!("{}'s agent answers GET /v1/reconcile", rt.name));
        for f in report["recentFrees"].as_array().expect("recentFrees") {
            for a in f["addresses"].as_array().expect("addresses") {
                let uid = f["podUID"].as_str().expect("podUID").to_string();
                out.insert((rt.name.clone(), a.as_str().expect("an address").into(), uid));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_two_operators_pods_crashes_and_a_new_cidr() {
    let started = Instant::now();
    let mut cluster = Cluster::start("e2e", Tuning::default()).await;
    let tombstones = Tombstones::watch(cluster.admin.clone());
    // a /27: two /28 blocks for three nodes, so one node waits until the CIDR is added
    cluster.apply_pool(&["10.77.0.0/27"], 28).await;
    blue_pool(&cluster).await;
    cluster.start_operator();
    cluster.start_operator();
    for n in ["node-a", "node-b", "node-c"] {
        cluster.add_node(n).await;
    }
    let kubelet = cluster.start_kubelet(Backoff {
        first: Duration::from_millis(500),
        cap: Duration::from_secs(4),
    });

    // nine pods: two nodes' blocks hold theirs, the third node's wait for addresses
    cluster.kubectl.apply(&pods(0, 9)).await;
    until(&cluster, "six pods running", 30, async || {
        running(&kubelet).len() >= 6
    })
    .await;
    let before_cidr = running(&kubelet).len();
    cluster
        .kubectl
        .ok(
            &[
                "patch",
                "ippool",
                "default",
                "--type=json",
                "-p",
                r#"[{"op":"add","path":"/spec/cidrs/-","value":"10.77.1.0/26"}]"#,
            ],
            None,
        )
        .await;
    until(&cluster, "all nine pods running", 30, async || {
        running(&kubelet).len() == 9
    })
    .await;
    // three pods of namespace blue, one per node: pool blue's first on each
    blue_pods(&cluster, &kubelet).await;

    // the first CIDR removed while pods use it: it drains (DESIGN.md "Release handshake")
    let removed: IpNet = "10.77.0.0/27".parse().expect("a CIDR");
    let on_removed = running_in(&kubelet, &removed);
    assert!(!on_removed.is_empty(), "pods use the CIDR about to go");
    remove_first_cidr(&cluster, &removed).await;
    let removed_at = Instant::now();

    // two pods crash (no DEL); kubectl removes their objects as a person would
    let mut crashes = Crashes::default();
    for (name, uid) in running(&kubelet).into_iter().take(2) {
        crash_pod(&cluster, &kubelet, &mut crashes, name, uid).await;
    }
    // the leader dies; the other replica takes over
    let leader = cluster.leader().await;
    cluster.operators[leader].kill();
    // the agent of the node with the most pods crashes; three of its pods are deleted
    // the ordinary way (their DELs are spooled), six more created (those bound there fail
    // their ADD until it is back, and are retried)
    let down_node = ["node-a", "node-b", "node-c"]
        .into_iter()
        .max_by_key(|n| running_on(&kubelet, Some(n)).len())
        .expect("a node");
    // one pod on the removed CIDR is kept through the churn: it must keep its address
    let (keeper, keeper_uid, ..) = running_in(&kubelet, &removed)
        .into_iter()
        .find(|(_, _, node, _)| node != down_node)
        .expect("a pod on the removed CIDR off the node going down");
    cluster.kill_agent(down_node);
    let down = Instant::now();
    let deleting: Vec<String> = running_on(&kubelet, Some(down_node))
        .into_iter()
        .take(3)
        .map(|(n, _)| n)
        .collect();
    let mut args = vec!["delete", "pod", "--wait=false"];
    args.extend(deleting.iter().map(String::as_str));
    cluster.kubectl.ok(&args, None).await;
    cluster.kubectl.apply(&pods(9, 6)).await;
    // longer than the plugin's connectTimeout (2 s): ADDs fail with code 11
    tokio::time::sleep(Duration::from_secs(3)).await;
    let failed_while_down = kubelet.record(|r| r.failed_adds);
    cluster.restart_agent(down_node).await;
    let up = Instant::now();
    until(&cluster, "the other replica leading", 20, async || {
        cluster.leader().await != leader
    })
    .await;
    let new_leader = cluster.leader().await;
    // one more crash, reclaimed by the new leader; two sandboxes lost by the runtime
    // (their pods get new ones): the agents' reconcile or a SandboxReplaced tombstone
    until(&cluster, "ten pods running", 30, async || {
        kubelet.settled().await && running(&kubelet).len() == 10
    })
    .await;
    let mut victims = running(&kubelet)
        .into_iter()
        .filter(|(_, u)| *u != keeper_uid);
    let (name, uid) = victims.next().expect("a pod");
    crash_pod(&cluster, &kubelet, &mut crashes, name, uid).await;
    for (_, uid) in victims.take(2) {
        let addr = kubelet.lose_sandbox(&uid);
        crashes.sandboxes.insert((addr, uid));
    }

    // lost sandboxes and ADDs retried after the agent's restart come back on the kubelet's
    // backoff: wait until every node runs a sandbox of each namespace again (CI once pinged
    // while one did not)
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let on = one_per_node_and_namespace(&kubelet);
        if on.len() == 6 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a sandbox of each namespace on every node in time: only {:?}",
            on.keys()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pinged = ping_across_nodes(&kubelet);
    assert_eq!(
        pinged, 24,
        "a pod of each pool on each of the three nodes pinged one of each pool on the other two"
    );

    // once those are reclaimed, a node crashes: its agent, its namespaces and then its
    // Node object go
    until(&cluster, "the crashes reclaimed", 30, async || {
        let snap = Snapshot::take(&cluster.admin).await.expect("snapshot");
        kubelet.settled().await && snap.settled()
    })
    .await;
    let drained = drain_removed(&cluster, &kubelet, &removed, &on_removed, &keeper).await;
    let mut freed = reconcile_frees(&cluster).await;

    // Deployments, which the controller stand-in turns into pods: one created, one applied
    // with kubectl, then churned for `rounds()` rounds
    let deployments = Deployments::start(cluster.admin.clone());
    create_deployments(&cluster, &kubelet).await;
    let rounds = rounds();
    for round in 0..rounds {
        churn(&cluster, &kubelet, &mut crashes, round).await;
        // each agent reports its last 32 frees only
        freed.extend(reconcile_frees(&cluster).await);
    }
    // kubectl deletes a Deployment: the server's garbage collector deletes its pods
    // gracefully, so each goes through DEL
    let api_pods = running_of(&kubelet, "api").len();
    cluster
        .kubectl
        .ok(&["delete", "deployment", "api"], None)
        .await;
    until_replicas(&cluster, &kubelet, &[("web", 2), ("api", 0)]).await;

    // the agent of the node about to crash cannot be asked afterwards
    freed.extend(reconcile_frees(&cluster).await);
    let lost_node = ["node-a", "node-b", "node-c"]
        .into_iter()
        .min_by_key(|n| running_on(&kubelet, Some(n)).len())
        .expect("a node");
    let on_lost = kubelet.crash_node(lost_node);
    cluster.crash_node(lost_node).await;
    let (lost_pods, lost_blue) = kubelet.record(|r| {
        let count = |f: &dyn Fn(&str) -> bool| on_lost.iter().filter(|(_, u)| f(u)).count();
        (
            count(&|u| r.names[u].starts_with("e2e-")),
            count(&|u| r.namespaces[u] == BLUE),
        )
    });
    crashes.nodes.insert(lost_node.to_string(), on_lost);
    crashes.deleted_before.extend(kubelet.deleted_on(lost_node));

    // settle (the crashed node's web pods replaced), then judge
    let mut snap = Snapshot::default();
    until(&cluster, "the cluster settled", 40, async || {
        snap = Snapshot::take(&cluster.admin).await.expect("snapshot");
        kubelet.settled().await
            && snap.settled()
            && !snap.used.contains_key(lost_node)
            && running_of(&kubelet, "web").len() == 2
    })
    .await;
    let seen = tombstones.seen();
    freed.extend(reconcile_frees(&cluster).await);
    crashes.spooled = kubelet.record(|r| {
        r.deleted
            .iter()
            .filter(|(_, (node, at))| node == down_node && (down..up).contains(at))
            .map(|(uid, _)| uid.clone())
            .collect()
    });
    crashes.removed_cidrs.push(removed);
    let bad = violations(&snap, &crashes, &seen, &freed);
    let mut errors = kubelet.record(|r| r.errors.clone());
    let tally = deployments.tally();
    errors.extend(tally.errors.iter().cloned());
    assert!(
        errors.is_empty(),
        "the harness's own steps failed: {errors:?}"
    );
    // the addresses (quoted, as the logs print them) and pod UIDs the broken invariants name
    let named: Vec<String> = bad
        .iter()
        .flat_map(|b| b.split_whitespace())
        .filter_map(|w| {
            let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric());
            if w.parse::<std::net::IpAddr>().is_ok() {
                Some(format!("{w}\""))
            } else {
                (w.len() == 36 && w.matches('-').count() == 4).then(|| w.to_string())
            }
        })
        .collect();
    assert!(
        bad.is_empty(),
        "invariants broken:\n{}\n{}\nthe logs naming them:\n{}\nlost sandboxes: {:?}",
        bad.join("\n"),
        cluster.logs(),
        cluster.logs_matching(&named),
        kubelet.record(|r| r.lost.clone()),
    );
    let named = |prefix: &str| {
        snap.pods
            .values()
            .filter(|p| p.name.starts_with(prefix))
            .count()
    };
    assert_eq!(
        named("e2e-"),
        9 - drained - lost_pods,
        "9 + 6 created, 3 crashed, 3 + {drained} deleted, {lost_pods} on the crashed {lost_node}"
    );
    assert_eq!(
        (named("web-"), named("api-"), named("blue-")),
        (2, 0, 3 - lost_blue),
        "web's two replicas, no pod of the deleted api, the blue pods off the crashed node"
    );
    assert_eq!(snap.pods.len(), 14 - drained - lost_pods - lost_blue);
    // no sandbox started after the removal took effect got one of its addresses
    let late = kubelet.record(|r| {
        r.started
            .iter()
            .filter(|(_, addr, at)| {
                *at > removed_at && addr.parse().is_ok_and(|a: IpAddr| removed.contains(&a))
            })
            .cloned()
            .collect::<Vec<_>>()
    });
    assert!(
        late.is_empty(),
        "granted from the removed {removed}: {late:?}"
    );
    let (lat, failed, bound, deleted) = kubelet.record(|r| {
        let mut l = r.ready_latency.clone();
        l.sort();
        (l, r.failed_adds, r.bound.clone(), r.deleted.len())
    });
    let scaled_down: usize = tally.scaled_down.values().sum();
    assert_eq!(
        deleted,
        3 + drained + rounds + scaled_down + api_pods,
        "every pod deleted (by kubectl, scaled down, collected with its Deployment) went \
         through DEL"
    );
    assert_eq!(
        crashes.spooled.len(),
        3,
        "their DELs ran while {down_node}'s agent was down"
    );
    println!(
        "e2e: {:.1} s; leader operator-{leader} killed, operator-{new_leader} took over; \
         {before_cidr} of 9 pods ran before the CIDR was added; {drained} pods kept their \
         addresses on the removed CIDR until deleted, then its blocks went; {failed} ADDs failed and \
         were retried ({failed_while_down} while {down_node}'s agent was down, {} pods deleted \
         then, their DELs spooled); bound {bound:?}; {} tombstones and {} reconcile frees for {} crashed sandboxes; \
         {lost_node} crashed with {lost_pods} + {lost_blue} blue pods and was reclaimed whole; \
         {pinged} pairs of nodes' pods (both pools) pinged each other; {rounds} rounds of Deployment churn: pods created \
         {:?}, scaled down {:?}; bound → Running: min {:?}, median {:?}, max {:?}",
        started.elapsed().as_secs_f64(),
        crashes.spooled.len(),
        seen.len(),
        freed.len(),
        crashes.sandboxes.len(),
        tally.created,
        tally.scaled_down,
        lat.first(),
        lat.get(lat.len() / 2),
        lat.last(),
    );
    summary(
        rounds,
        started.elapsed(),
        &kubelet,
        &crashes,
        &seen,
        &freed,
        &lat,
    );
}

/// The summary line of a run (BENCHMARKS.md): pods started, each crashed or lost sandbox
/// by the paths that reclaimed it, pod-ready latency over the sorted `lat`, duration.
fn summary(
    rounds: usize,
    elapsed: Duration,
    kubelet: &Kubelet,
    crashes: &Crashes,
    tombstones: &BTreeSet<(String, String, String)>,
    freed: &BTreeSet<(String, String, String)>,
    lat: &[Duration],
) {
    let pairs = |set: &BTreeSet<(String, String, String)>| -> BTreeSet<(String, String)> {
        set.iter().map(|(_, a, u)| (a.clone(), u.clone())).collect()
    };
    let (tombed, reconciled) = (pairs(tombstones), pairs(freed));
    let per_path = |t: bool, r: bool| {
        crashes
            .sandboxes
            .iter()
            .filter(|c| tombed.contains(*c) == t && reconciled.contains(*c) == r)
            .count()
    };
    println!(
        "e2e summary: rounds {rounds}, {:.1} s; pods started {} ({} sandbox starts); \
         {} sandboxes crashed or lost, reclaimed by the operator's tombstone only {}, by the \
         agent's reconcile only {}, by both {}; a crashed node's {} pods reclaimed whole; \
         {} tombstones in all; pod-ready p50 {:?}, p99 {:?}, max {:?}",
        elapsed.as_secs_f64(),
        kubelet.record(|r| r.names.len()),
        lat.len(),
        crashes.sandboxes.len(),
        per_path(true, false),
        per_path(false, true),
        per_path(true, true),
        crashes.nodes.values().map(BTreeSet::len).sum::<usize>(),
        tombstones.len(),
        quantile(lat, 0.5),
        quantile(lat, 0.99),
        lat.last(),
    );
}

/// The judge itself (no root needed): a sound end passes; each broken invariant is named.
mod judge_can_fail {
    use std::collections::{BTreeMap, BTreeSet};

    use super::common::judge::{Crashes, LivePod, Seen, Snapshot, violations};

    const A: &str = "0a000000-0000-4000-8000-000000000001";
    const B: &str = "0b000000-0000-4000-8000-000000000002";
    const GONE: &str = "0c000000-0000-4000-8000-000000000003";

    /// Pods a (10.77.0.2) and b (10.77.0.3) of namespace `default` on node-a, block
    /// 10.77.0.0/28 of pool `default` (/27), their `status.used` entries naming it.
    fn sound() -> Snapshot {
        let pod = |n: &str, ip: &str| LivePod {
            name: n.to_string(),
            namespace: "default".to_string(),
            node: "node-a".to_string(),
            ips: vec![ip.to_string()],
        };
        let entry = |ip: &str| {
            (
                ("node-a".to_string(), ip.to_string()),
                "default".to_string(),
            )
        };
        Snapshot {
            pods: BTreeMap::from([
                (A.to_string(), pod("a", "10.77.0.2")),
                (B.to_string(), pod("b", "10.77.0.3")),
            ]),
            used: BTreeMap::from([(
                "node-a".to_string(),
                BTreeMap::from([
                    ("10.77.0.2".to_string(), A.to_string()),
                    ("10.77.0.3".to_string(), B.to_string()),
                ]),
            )]),
            used_pools: BTreeMap::from([entry("10.77.0.2"), entry("10.77.0.3")]),
            blocks: BTreeMap::from([(
                "node-a".to_string(),
                vec!["10.77.0.0/28".parse().expect("net")],
            )]),
            block_pools: BTreeMap::from([(
                "10.77.0.0/28".parse().expect("net"),
                "default".to_string(),
            )]),
            pool: vec!["10.77.0.0/27".parse().expect("net")],
            namespace_labels: BTreeMap::from([("default".to_string(), BTreeMap::new())]),
            ..Snapshot::default()
        }
    }

    fn tomb(uid: &str) -> BTreeSet<(String, String, String)> {
        BTreeSet::from([("node-a".into(), "10.77.0.9".into(), uid.into())])
    }

    fn none() -> BTreeSet<(String, String, String)> {
        BTreeSet::new()
    }

    #[test]
    fn a_sound_end_passes_and_every_broken_invariant_is_named() {
        let crashed = Crashes {
            sandboxes: BTreeSet::from([("10.77.0.9".to_string(), GONE.to_string())]),
            ..Crashes::default()
        };
        assert_eq!(
            violations(&sound(), &crashed, &none(), &tomb(GONE)),
            Vec::<String>::new()
        );
        assert_eq!(
            violations(&sound(), &crashed, &tomb(GONE), &none()),
            Vec::<String>::new()
        );

        let mut dup = sound();
        dup.pods.get_mut(B).expect("b").ips = vec!["10.77.0.2".into()];
        dup.used
            .get_mut("node-a")
            .expect("used")
            .remove("10.77.0.3");
        let v = violations(&dup, &crashed, &tomb(GONE), &none());
        assert!(v.iter().any(|m| m.contains("on two live pods")), "{v:?}");

        let mut leaked = sound();
        leaked
            .used
            .get_mut("node-a")
            .expect("used")
            .insert("10.77.0.9".into(), GONE.into());
        let v = violations(&leaked, &crashed, &tomb(GONE), &none());
        assert!(v.iter().any(|m| m.contains("status.used")), "{v:?}");

        let live = BTreeSet::from([("node-a".into(), "10.77.0.2".into(), A.into())]);
        let v = violations(&sound(), &crashed, &none(), &live);
        assert!(v.iter().any(|m| m.contains("of live pod")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("but never crashed")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("never reclaimed")), "{v:?}");

        let v = violations(&sound(), &crashed, &none(), &none());
        assert!(v.iter().any(|m| m.contains("never reclaimed")), "{v:?}");

        // a pod deleted while its agent was down may be tombstoned (not freed by reconcile)
        const SPOOLED: &str = "0d000000-0000-4000-8000-000000000004";
        let both = BTreeSet::from([
            ("node-a".into(), "10.77.0.9".into(), GONE.into()),
            ("node-a".into(), "10.77.0.5".into(), SPOOLED.into()),
        ]);
        let v = violations(&sound(), &crashed, &both, &none());
        assert!(v.iter().any(|m| m.contains("but never crashed")), "{v:?}");
        let excused = Crashes {
            spooled: BTreeSet::from([SPOOLED.to_string()]),
            ..crashed.clone()
        };
        assert!(violations(&sound(), &excused, &both, &none()).is_empty());
        // so may a pod deleted on a crashed node before it went (its free unpublished)
        let deleted_before = Crashes {
            deleted_before: BTreeSet::from([("10.77.0.5".to_string(), SPOOLED.to_string())]),
            ..crashed.clone()
        };
        assert!(violations(&sound(), &deleted_before, &both, &none()).is_empty());
        let freed = BTreeSet::from([("node-a".into(), "10.77.0.5".into(), SPOOLED.into())]);
        let v = violations(&sound(), &excused, &tomb(GONE), &freed);
        assert!(
            v.iter().any(|m| m.contains("freed by reconcile but never")),
            "{v:?}"
        );

        // a crashed node's IPAMNode must go
        let mut with_node = crashed.clone();
        with_node.nodes.insert("node-a".into(), BTreeSet::new());
        let v = violations(&sound(), &with_node, &tomb(GONE), &none());
        assert!(v.iter().any(|m| m.contains("were not reclaimed")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("still bound")), "{v:?}");

        let mut outside = sound();
        outside.blocks.get_mut("node-a").expect("blocks")[0] = "10.78.0.0/28".parse().expect("net");
        let v = violations(&outside, &crashed, &tomb(GONE), &none());
        assert!(v.iter().any(|m| m.contains("in no block")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("outside the pool")), "{v:?}");

        // the pool's CIDR removed: its block may stay only while it drains with users
        let mut removed = sound();
        removed.pool = vec!["10.77.1.0/26".parse().expect("net")];
        let drain = Crashes {
            removed_cidrs: vec!["10.77.0.0/27".parse().expect("net")],
            ..crashed.clone()
        };
        let v = violations(&removed, &crashed, &tomb(GONE), &none());
        assert!(v.iter().any(|m| m.contains("outside the pool")), "{v:?}");
        let v = violations(&removed, &drain, &tomb(GONE), &none());
        assert!(
            v.iter().any(|m| m.contains("not marked for release")),
            "{v:?}"
        );
        removed
            .draining
            .insert("10.77.0.0/28".parse().expect("net"));
        assert!(violations(&removed, &drain, &tomb(GONE), &none()).is_empty());
        assert!(removed.settled(), "a draining block with users is settled");
        let mut unused = removed;
        unused.pods.clear();
        unused.used.clear();
        let v = violations(&unused, &drain, &tomb(GONE), &none());
        assert!(v.iter().any(|m| m.contains("no user left")), "{v:?}");
        assert!(
            !unused.settled(),
            "a drained block without users is not settled"
        );
    }

    /// [`sound`] with pool `blue` (10.77.8.0/26) selecting namespace `blue` (team=blue);
    /// `default` is labelled team=red, which no pool selects.
    fn with_blue() -> Snapshot {
        let team = |t: &str| BTreeMap::from([("team".to_string(), t.to_string())]);
        let mut s = sound();
        s.pool.push("10.77.8.0/26".parse().expect("net"));
        s.namespace_selectors.insert("blue".into(), team("blue"));
        s.namespace_labels.insert("blue".into(), team("blue"));
        s.namespace_labels.insert("default".into(), team("red"));
        s
    }

    /// [`with_blue`] with pod b in namespace `blue` at `ip`, its entry naming `entry_pool`,
    /// and node-a holding block 10.77.8.0/28 of pool `blue`.
    fn b_in_blue(ip: &str, entry_pool: Option<&str>) -> Snapshot {
        let mut s = with_blue();
        let b = s.pods.get_mut(B).expect("b");
        b.namespace = "blue".into();
        b.ips = vec![ip.into()];
        let used = s.used.get_mut("node-a").expect("used");
        used.remove("10.77.0.3");
        used.insert(ip.into(), B.into());
        s.used_pools.remove(&("node-a".into(), "10.77.0.3".into()));
        if let Some(p) = entry_pool {
            s.used_pools.insert(("node-a".into(), ip.into()), p.into());
        }
        let block: ipnet::IpNet = "10.77.8.0/28".parse().expect("net");
        s.blocks.get_mut("node-a").expect("blocks").push(block);
        s.block_pools.insert(block, "blue".into());
        s
    }

    /// Issue 29: each live pod's address lies in a block of the pool its namespace
    /// resolves to (`blue` for namespace `blue`, `default` otherwise), and its
    /// `status.used` entry names that pool.
    #[test]
    fn an_address_outside_its_pods_pool_is_named() {
        let judge = |s: &Snapshot| violations(s, &Crashes::default(), &none(), &none());
        assert_eq!(judge(&with_blue()), Vec::<String>::new());
        assert_eq!(
            judge(&b_in_blue("10.77.8.2", Some("blue"))),
            Vec::<String>::new()
        );

        // b in namespace blue with its address of the default pool
        let v = judge(&b_in_blue("10.77.0.3", Some("default")));
        assert!(
            v.iter().any(|m| m.contains(
                "10.77.0.3 is in block 10.77.0.0/28 of pool default, not of its pool blue"
            )),
            "{v:?}"
        );
        assert!(
            v.iter().any(|m| m.contains(
                "10.77.0.3: status.used on node-a names pool Some(\"default\"), not its pool blue"
            )),
            "{v:?}"
        );
        // the right block, but the entry names another pool, or none
        for entry in [Some("default"), None] {
            let v = judge(&b_in_blue("10.77.8.2", entry));
            assert_eq!(v.len(), 1, "{v:?}");
            assert!(v[0].contains("status.used on node-a names pool"), "{v:?}");
        }
        // a pod of default in a blue block
        let mut a_in_blue = b_in_blue("10.77.8.2", Some("blue"));
        a_in_blue.pods.get_mut(A).expect("a").ips = vec!["10.77.8.3".into()];
        let used = a_in_blue.used.get_mut("node-a").expect("used");
        used.remove("10.77.0.2");
        used.insert("10.77.8.3".into(), A.into());
        a_in_blue
            .used_pools
            .insert(("node-a".into(), "10.77.8.3".into()), "blue".into());
        let v = judge(&a_in_blue);
        assert!(
            v.iter().any(|m| m.contains(
                "a's 10.77.8.3 is in block 10.77.8.0/28 of pool blue, not of its pool default"
            )),
            "{v:?}"
        );
    }

    /// A tombstone only ever answered `stale` freed nothing, so the judge leaves it out;
    /// one answered `reclaimed` (or not yet answered) it judges.
    #[test]
    fn a_tombstone_answered_stale_is_not_a_reclaim() {
        let node = |answers: &[(&str, &str)]| -> tidepool_api::IPAMNode {
            let tomb = |a: &str| {
                let t = serde_json::json!({"podUID": GONE, "containerID": "c1", "ifname": "eth0", "reason": "pod-deleted"});
                (a.to_string(), t)
            };
            let reclaim: serde_json::Map<_, _> = ["10.77.0.4", "10.77.0.5", "10.77.0.6"]
                .map(tomb)
                .into_iter()
                .collect();
            let acks: serde_json::Map<_, _> = answers
                .iter()
                .map(|(a, outcome)| {
                    let ack = serde_json::json!({"podUID": GONE, "containerID": "c1", "ifname": "eth0", "outcome": outcome});
                    (a.to_string(), ack)
                })
                .collect();
            serde_json::from_value(serde_json::json!({
                "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
                "metadata": {"name": "node-a"},
                "spec": {"nodeUID": "u-a", "reclaim": reclaim},
                "status": {"reclaimAck": acks},
            }))
            .expect("an IPAMNode")
        };
        let mut seen = Seen::default();
        seen.record(&node(&[]));
        seen.record(&node(&[("10.77.0.4", "stale"), ("10.77.0.5", "reclaimed")]));
        let judged: Vec<String> = seen.judged().into_iter().map(|(_, a, _)| a).collect();
        assert_eq!(judged, ["10.77.0.5", "10.77.0.6"]);
        // answered stale, then reclaimed (the same allocation tombstoned again): judged
        seen.record(&node(&[("10.77.0.4", "reclaimed")]));
        assert_eq!(seen.judged().len(), 3);
    }
}

/// The figures' quantiles are nearest-rank (no root needed).
#[test]
fn quantiles_are_nearest_rank() {
    use common::figures::p50_p99_ms;
    let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
    assert_eq!(quantile(&d, 0.5), Some(Duration::from_millis(50)));
    assert_eq!(quantile(&d, 0.99), Some(Duration::from_millis(99)));
    assert_eq!(quantile(&d, 1.0), Some(Duration::from_millis(100)));
    assert_eq!(quantile(&d[..1], 0.99), Some(Duration::from_millis(1)));
    assert_eq!(quantile(&[], 0.5), None);
    assert_eq!(p50_p99_ms(d.into_iter().rev().collect()), (50.0, 99.0));
}
