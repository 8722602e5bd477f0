//! The deploy bundle applied and run (issue 17), against the in-process API server with
//! RBAC, the agent's ValidatingAdmissionPolicy and TLS on:
//! 1. `kubectl apply -k deploy/crds`, then `kubectl apply -k deploy/`, as the admin;
//! 2. the operator's replicas and one agent per node start with the rendered Deployment's
//!    and DaemonSet's command, args, env and service-account identities (read from
//!    `kubectl kustomize deploy/`; the few changes outside a cluster are listed in
//!    `common::deployed::overrides`);
//! 3. a short scenario (nodes, pods bound and given addresses, pods deleted and their
//!    addresses freed) in which the server refuses those identities nothing: its record of
//!    failed requests holds no 403 and no admission denial, their logs name none;
//! 4. then, as the same identities, what each binary does not need is refused, in the
//!    server's words: a verb, a subresource, another namespace, another node's objects.
//!
//! The in-process server rather than the standalone `tidepool-apiserver` binary: the
//! whole-system harness (`common::e2e`: the scheduler and kubelet stand-ins, each node's
//! forwarder) is built on its handle, the refusals are read from its record in the same
//! process, and its node-bound tokens are minted once the Node exists (so they carry the
//! Node's UID, as a projected token does), where the binary mints every token at start,
//! before any Node; the binary also cannot switch its simulated kubelet off, which would
//! delete pods behind the CNI DEL's back.
//!
//! Needs root (network namespaces) and Debian's containernetworking-plugins (ptp); skips
//! with a printed reason otherwise. Run: `cargo build -p tidepool-operator --bin
//! tidepool-operator && cargo test -p tidepool-agent --test deploy_live -- --nocapture`.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::chain::{PLUGINS, output};
use common::deployed::{self, Role, Workload};
use common::e2e::{Cluster, Tuning, until};
use common::judge::Snapshot;
use common::kubelet::{Backoff, Kubelet, Sandbox};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tidepool_api as api;

const NODES: [&str; 2] = ["node-a", "node-b"];
const PODS: usize = 6;

/// Why the test cannot run here, if it cannot.
fn cannot_run() -> Option<String> {
    if output("id", &["-u"]).stdout != b"0\n" {
        return Some("not root: the nodes are network namespaces".into());
    }
    if !Path::new(PLUGINS).join("ptp").exists() {
        return Some(format!("no ptp in {PLUGINS} (containernetworking-plugins)"));
    }
    None
}

/// A rendered flag's value (`--flag=value`).
fn flag<'a>(w: &'a Workload, name: &str) -> &'a str {
    let eq = format!("{name}=");
    w.args
        .iter()
        .find_map(|a| a.strip_prefix(&eq))
        .unwrap_or_else(|| panic!("{} sets {name}", w.kind))
}

/// `count` pods `live-{first}`…, as a YAML stream of JSON documents.
fn pods(first: usize, count: usize) -> String {
    let docs: Vec<String> = (first..first + count)
        .map(|i| {
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("live-{i}"), "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "pause"}]},
            })
            .to_string()
        })
        .collect();
    docs.join("\n---\n")
}

/// The running pods: (name, UID, address).
fn running(k: &Kubelet) -> Vec<(String, String, String)> {
    k.record(|r| {
        r.sandboxes
            .iter()
            .filter_map(|(u, s)| match s {
                Sandbox::Running { addr, .. } => {
                    Some((r.names[u].clone(), u.clone(), addr.clone()))
                }
                _ => None,
            })
            .collect()
    })
}

/// The refusal's Status (code and message), failing the test if `r` was not refused.
fn refused<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.message.clone()),
        other => panic!("should be refused: {other:?}"),
    }
}

/// RBAC's words for a request it refuses.
fn rbac_denial(
    what: &str,
    user: &str,
    verb: &str,
    resource: &str,
    group: &str,
    scope: &str,
) -> String {
    format!(
        "{what} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in API group \
         \"{group}\" {scope}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rendered_bundle_installs_runs_and_enforces_least_privilege() {
    if let Some(why) = cannot_run() {
        println!("SKIPPED deploy_live: {why}");
        return;
    }
    let mut cluster = Cluster::bare("dl", Tuning::default()).await;

    // 1. the bundle, as an admin installs it
    let repo = deployed::repo();
    let crds = repo.join("deploy/crds").display().to_string();
    let applied = cluster.kubectl.ok(&["apply", "-k", &crds], None).await;
    assert_eq!(applied.matches(" created").count(), 3, "{applied}");
    cluster.until_crds_established().await;
    let bundle = repo.join("deploy").display().to_string();
    let applied = cluster.kubectl.ok(&["apply", "-k", &bundle], None).await;
    let docs = deployed::render(&cluster).await;
    assert_eq!(
        applied.matches(" created").count(),
        docs.len(),
        "every rendered object created:\n{applied}"
    );
    let operator = Workload::find(&docs, "Deployment", "tidepool-operator");
    let agent = Workload::find(&docs, "DaemonSet", "tidepool-agent");
    for (w, role) in [(&operator, Role::Operator), (&agent, Role::Agent)] {
        println!("{} {} as {}:", w.kind, w.command, w.identity(None));
        for o in deployed::overrides(role, Path::new("DIR"), Path::new("KUBECONFIG")) {
            println!("  override {}={} ({})", o.flag, o.value, o.why);
        }
    }

    // 2. the binaries as the bundle runs them: the agents take their pod networks from
    // the IPPools (the bundle names none), here the example default pool's IPv4 CIDR
    let v4 = "10.64.0.0/14";
    cluster.apply_pool(&[v4], 28).await;
    let replicas = operator.replicas.expect("the Deployment's replicas") as usize;
    for i in 0..replicas {
        deployed::spawn_operator(&mut cluster, &operator, i);
    }
    let lease_name = flag(&operator, "--leader-elect-resource-name").to_string();
    let leases: Api<Lease> = Api::namespaced(cluster.admin.clone(), &operator.namespace);
    until(&cluster, "a replica leads", 60, async || {
        leases
            .get_opt(&lease_name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .is_some_and(|h| h.starts_with("tidepool-operator-"))
    })
    .await;
    for n in NODES {
        cluster
            .add_node_with(n, |c, rt, port| deployed::spawn_agent(&agent, c, rt, port))
            .await;
    }

    // 3. the scenario: pods bound, given addresses, some deleted and their addresses freed
    let kubelet = cluster.start_kubelet(Backoff {
        first: Duration::from_millis(500),
        cap: Duration::from_secs(4),
    });
    cluster.kubectl.apply(&pods(0, PODS)).await;
    until(&cluster, "every pod running", 90, async || {
        running(&kubelet).len() == PODS
    })
    .await;
    let pool: ipnet::IpNet = v4.parse().expect("a CIDR");
    let addrs: BTreeSet<String> = running(&kubelet).into_iter().map(|(_, _, a)| a).collect();
    assert_eq!(addrs.len(), PODS, "one address per pod: {addrs:?}");
    for a in &addrs {
        assert!(
            pool.contains(&a.parse::<std::net::IpAddr>().unwrap()),
            "{a} in {pool}"
        );
    }
    let used_nodes: BTreeSet<String> = kubelet.record(|r| r.bound.keys().cloned().collect());
    let deleted: Vec<(String, String, String)> =
        running(&kubelet).into_iter().take(PODS / 2).collect();
    let mut args = vec!["delete", "pod", "--wait=false"];
    args.extend(deleted.iter().map(|(n, _, _)| n.as_str()));
    cluster.kubectl.ok(&args, None).await;
    let mut snap = Snapshot::default();
    until(
        &cluster,
        "the deleted pods' addresses freed",
        60,
        async || {
            snap = Snapshot::take(&cluster.admin).await.expect("snapshot");
            kubelet.settled().await && snap.settled() && snap.pods.len() == PODS - PODS / 2
        },
    )
    .await;
    let still_used: BTreeSet<&String> = snap.used.values().flat_map(|u| u.keys()).collect();
    for (name, uid, addr) in &deleted {
        assert!(!still_used.contains(addr), "{name}'s {addr} still used");
        assert!(
            kubelet.record(|r| r.deleted.contains_key(uid)),
            "{name} went through DEL"
        );
    }
    let errors = kubelet.record(|r| r.errors.clone());
    assert!(
        errors.is_empty(),
        "the harness's own steps failed: {errors:?}"
    );
    for p in cluster.operators.iter_mut() {
        assert!(p.running(), "{} stopped:\n{}", p.name, p.tail(20));
    }

    // nothing refused: not in the server's record, not in the binaries' logs
    let identities: BTreeSet<String> = NODES
        .iter()
        .map(|n| agent.identity(Some(n)))
        .chain([operator.identity(None)])
        .collect();
    let refusals = |server: &tidepool_tests::ApiServer| -> Vec<tidepool_tests::FailedRequest> {
        server
            .failed_requests()
            .into_iter()
            .filter(|f| f.is_refusal() && identities.contains(&f.identity))
            .collect()
    };
    let during = refusals(&cluster.server);
    assert!(during.is_empty(), "refused during the run: {during:#?}");
    let words = ["forbidden", "Forbidden", "denied request"].map(String::from);
    let named = cluster.logs_matching(&words);
    assert!(
        named.is_empty(),
        "the binaries' logs name a refusal:\n{named}"
    );
    println!(
        "deploy_live: {} objects applied, {replicas} operator replicas, {} agents, {PODS} pods \
         on {used_nodes:?}, {} deleted and freed, 0 refusals",
        docs.len(),
        NODES.len(),
        deleted.len()
    );

    // 4. what each binary does not need, refused in the server's words
    let op_user = operator.identity(None);
    let op = cluster.server.client(&op_user).await.expect("client");
    let (ag_node, other_node) = (NODES[0], NODES[1]);
    let ag_id = agent.identity(Some(ag_node));
    let ag_user = agent.identity(None);
    let ag = cluster.server.client(&ag_id).await.expect("client");
    let live = &snap.pods.values().next().expect("a live pod").name;
    let pp = PatchParams::default();
    let mut expected = Vec::new();
    let mut check = |(code, message): (u16, String), want: String| {
        assert_eq!(message, want);
        expected.push((code, message));
    };
    // the operator: a verb (it reads pods, never deletes them)
    check(
        refused(
            Api::<Pod>::namespaced(op.clone(), "default")
                .delete(live, &DeleteParams::default())
                .await,
        ),
        rbac_denial(
            &format!("pods \"{live}\""),
            &op_user,
            "delete",
            "pods",
            "",
            "in the namespace \"default\"",
        ),
    );
    // a subresource (it patches Nodes for the taint, never their status)
    check(
        refused(
            Api::<Node>::all(op.clone())
                .patch_status(ag_node, &pp, &Patch::Merge(json!({"status": {}})))
                .await,
        ),
        rbac_denial(
            &format!("nodes \"{ag_node}\""),
            &op_user,
            "patch",
            "nodes/status",
            "",
            "at the cluster scope",
        ),
    );
    // another namespace (its Lease lives in its own)
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": lease_name}})).unwrap();
    check(
        refused(
            Api::<Lease>::namespaced(op.clone(), "kube-system")
                .create(&PostParams::default(), &lease)
                .await,
        ),
        rbac_denial(
            "leases.coordination.k8s.io",
            &op_user,
            "create",
            "leases",
            "coordination.k8s.io",
            "in the namespace \"kube-system\"",
        ),
    );
    // the agent: a verb (it patches its IPAMNode's status, never deletes the IPAMNode)
    check(
        refused(
            Api::<api::IPAMNode>::all(ag.clone())
                .delete(ag_node, &DeleteParams::default())
                .await,
        ),
        rbac_denial(
            &format!("ipamnodes.ipam.tidepool.dev \"{ag_node}\""),
            &ag_user,
            "delete",
            "ipamnodes",
            "ipam.tidepool.dev",
            "at the cluster scope",
        ),
    );
    // a subresource (it reads pods, never writes their status)
    check(
        refused(
            Api::<Pod>::namespaced(ag.clone(), "default")
                .patch_status(live, &pp, &Patch::Merge(json!({"status": {}})))
                .await,
        ),
        rbac_denial(
            &format!("pods \"{live}\""),
            &ag_user,
            "patch",
            "pods/status",
            "",
            "in the namespace \"default\"",
        ),
    );
    // another namespace (the operator's Lease)
    check(
        refused(
            Api::<Lease>::namespaced(ag.clone(), &operator.namespace)
                .get(&lease_name)
                .await,
        ),
        rbac_denial(
            &format!("leases.coordination.k8s.io \"{lease_name}\""),
            &ag_user,
            "get",
            "leases",
            "coordination.k8s.io",
            &format!("in the namespace \"{}\"", operator.namespace),
        ),
    );
    // another node's objects: RBAC lets it patch IPAMNode status, the policy refuses
    let policy = "tidepool-agent-own-node";
    check(
        refused(
            Api::<api::IPAMNode>::all(ag.clone())
                .patch_status(
                    other_node,
                    &pp,
                    &Patch::Merge(json!({"status": {"used": {}}})),
                )
                .await,
        ),
        format!(
            "ipamnodes.ipam.tidepool.dev \"{other_node}\" is forbidden: ValidatingAdmissionPolicy \
             '{policy}' with binding '{policy}' denied request: agent on node {ag_node} may not \
             write ipamnodes {other_node}"
        ),
    );
    // the server's record holds exactly these refusals, in order
    let recorded: Vec<(u16, String)> = refusals(&cluster.server)
        .into_iter()
        .map(|f| (f.code, f.message))
        .collect();
    assert_eq!(recorded, expected);
}

/// The rendering helpers themselves (no root needed): overrides replace a flag in either
/// form or append it, everything else stays as rendered; env is the downward API's.
#[test]
fn overrides_replace_only_their_flags_and_env_comes_from_the_downward_api() {
    let docs: Vec<serde_json::Value> = vec![json!({
        "kind": "DaemonSet", "metadata": {"name": "a", "namespace": "ns"},
        "spec": {"template": {"spec": {"serviceAccountName": "sa", "containers": [{
            "name": "c", "command": ["/usr/local/bin/tidepool-agent"],
            "args": ["--socket=/run/x.sock", "--state-dir", "/var/lib/x", "--keep=1"],
            "env": [{"name": "TIDEPOOL_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "PLAIN", "value": "v"}],
        }]}}},
    })];
    let w = Workload::find(&docs, "DaemonSet", "a");
    assert_eq!(w.replicas, None);
    assert_eq!(w.identity(Some("n1")), "system:serviceaccount:ns:sa@n1");
    let o = deployed::overrides(
        deployed::Role::Agent,
        Path::new("/tmp/d"),
        Path::new("/tmp/kc"),
    );
    assert_eq!(
        w.args_with(&o),
        [
            "--socket=/tmp/d/run/agent.sock",
            "--state-dir",
            "/tmp/d/state",
            "--keep=1",
            "--kubeconfig=/tmp/kc",
            "--restored-marker=/tmp/d/run/restored",
            "--cni-cache-dir=/tmp/d/cni/results",
        ]
    );
    let pod = deployed::PodFacts {
        name: "p".into(),
        namespace: "ns".into(),
        node: "n1".into(),
    };
    assert_eq!(
        w.env(&pod),
        [
            ("TIDEPOOL_NODE_NAME".to_string(), "n1".to_string()),
            ("PLAIN".to_string(), "v".to_string())
        ]
    );
}
