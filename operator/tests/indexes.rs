//! The watch-fed indexes, handed typed objects with no server.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{
    Node, NodeSpec, NodeStatus, Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::Event;
use parking_lot::Mutex;
use tidepool_ipam::{
    IpamError, NodeInfo, NodeName, NodeUid, PodCache, PodChanges, PodPhase, PodUid, PodView, Since,
};
use tidepool_operator::index::{LabelSelector, NodeChange, NodeIndex, PodGetter, PodIndex};
use tokio::time::Instant;

// ---- pods ----

fn uid_str(uid: u128) -> String {
    PodUid(uid).to_string()
}

/// A pod `p<uid>` in namespace `ns`, bound to `node` ("" = not bound).
fn pod(uid: u128, node: &str, phase: &str, ips: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("p{uid}")),
            namespace: Some("ns".into()),
            uid: Some(uid_str(uid)),
            labels: Some(BTreeMap::from([("app".into(), "web".into())])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: (!node.is_empty()).then(|| node.into()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some(phase.into()),
            pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect()),
            ..Default::default()
        }),
    }
}

/// The server side of `pod_live`: pods by (namespace, name), counting GETs.
#[derive(Clone, Default)]
struct FakeServer {
    pods: Arc<Mutex<HashMap<(String, String), Pod>>>,
    gets: Arc<AtomicUsize>,
    fail: Arc<Mutex<bool>>,
}

impl FakeServer {
    fn put(&self, p: Pod) {
        let key = (
            p.metadata.namespace.clone().unwrap(),
            p.metadata.name.clone().unwrap(),
        );
        self.pods.lock().insert(key, p);
    }
    fn gets(&self) -> usize {
        self.gets.load(Ordering::Relaxed)
    }
}

impl PodGetter for FakeServer {
    fn get(&self, ns: &str, name: &str) -> BoxFuture<'static, Result<Option<Pod>, kube::Error>> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        let out = if *self.fail.lock() {
            Err(kube::Error::LinesCodecMaxLineLengthExceeded)
        } else {
            Ok(self.pods.lock().get(&(ns.into(), name.into())).cloned())
        };
        Box::pin(async move { out })
    }
}

fn index() -> (PodIndex, FakeServer) {
    let server = FakeServer::default();
    (PodIndex::new(server.clone()), server)
}

fn names(v: &[&str]) -> Vec<NodeName> {
    v.iter().map(|n| NodeName::from(*n)).collect()
}

fn since(idx: &PodIndex, node: &str) -> Since {
    let seq = idx.pod_changes(node, None).expect("kept").seq;
    Since {
        seq,
        at: Instant::now(),
    }
}

#[test]
fn a_relist_is_buffered_then_replaces_the_set_and_drops_vanished_pods() {
    let (idx, _) = index();
    assert!(idx.apply(&Event::Init).is_empty());
    idx.apply(&Event::InitApply(pod(1, "n1", "Running", &["10.0.0.1"])));
    idx.apply(&Event::InitApply(pod(2, "n1", "Pending", &[])));
    idx.apply(&Event::InitApply(pod(3, "n2", "Pending", &[])));
    assert!(!idx.ready() && idx.pod(PodUid(1)).is_none(), "buffered");
    assert_eq!(idx.apply(&Event::InitDone), names(&["n1", "n2"]));
    assert!(idx.ready());
    assert_eq!((idx.bound_pods("n1"), idx.bound_pods("n2")), (2, 1));
    assert_eq!(idx.pending_pods("n1"), vec![PodUid(2)]);

    let before = since(&idx, "n1");
    idx.apply(&Event::Init);
    idx.apply(&Event::InitApply(pod(1, "n1", "Running", &["10.0.0.1"])));
    idx.apply(&Event::InitApply(pod(3, "n2", "Running", &["10.0.1.1"])));
    assert!(
        idx.pod(PodUid(2)).is_some(),
        "the old view answers until InitDone"
    );
    assert_eq!(idx.apply(&Event::InitDone), names(&["n1", "n2"]));
    assert!(idx.pod(PodUid(2)).is_none(), "not relisted: gone");
    assert_eq!(idx.bound_pods("n1"), 1);
    assert!(idx.pending_pods("n1").is_empty() && idx.pending_pods("n2").is_empty());
    let c = idx.pod_changes("n1", Some(before)).expect("kept");
    assert_eq!(
        c.changed,
        vec![PodUid(2)],
        "only the vanished pod changed on n1"
    );
    // an identical relist changes nothing
    idx.apply(&Event::Init);
    idx.apply(&Event::InitApply(pod(1, "n1", "Running", &["10.0.0.1"])));
    idx.apply(&Event::InitApply(pod(3, "n2", "Running", &["10.0.1.1"])));
    assert!(idx.apply(&Event::InitDone).is_empty());
}

#[test]
fn delete_removes_and_a_pod_being_deleted_stays_until_then() {
    let (idx, _) = index();
    idx.apply(&Event::Apply(pod(1, "n1", "Running", &["10.0.0.1"])));
    let mut deleting = pod(1, "n1", "Running", &["10.0.0.1"]);
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    assert!(
        idx.apply(&Event::Apply(deleting.clone())).is_empty(),
        "same projection"
    );
    assert_eq!(idx.bound_pods("n1"), 1);
    assert!(idx.pod(PodUid(1)).is_some());
    assert_eq!(idx.apply(&Event::Delete(deleting.clone())), names(&["n1"]));
    assert!(idx.pod(PodUid(1)).is_none());
    assert_eq!(idx.bound_pods("n1"), 0);
    assert!(
        idx.apply(&Event::Delete(deleting)).is_empty(),
        "already gone"
    );
}

#[test]
fn pod_ip_assignment_moves_a_pod_out_of_pending_and_a_terminal_pod_is_not_bound() {
    let (idx, _) = index();
    assert!(
        idx.apply(&Event::Apply(pod(1, "", "Pending", &[])))
            .is_empty()
    );
    assert!(idx.pod(PodUid(1)).is_none(), "not bound: not kept");
    assert_eq!(
        idx.apply(&Event::Apply(pod(1, "n1", "Pending", &[]))),
        names(&["n1"])
    );
    assert_eq!(idx.pending_pods("n1"), vec![PodUid(1)]);
    idx.apply(&Event::Apply(pod(
        1,
        "n1",
        "Running",
        &["10.0.0.7", "fd00::7"],
    )));
    assert!(idx.pending_pods("n1").is_empty());
    assert_eq!(idx.bound_pods("n1"), 1);
    let ips: Vec<String> = idx
        .pod(PodUid(1))
        .unwrap()
        .ips
        .iter()
        .map(|a| a.to_string())
        .collect();
    assert_eq!(ips, ["10.0.0.7", "fd00::7"]);
    idx.apply(&Event::Apply(pod(2, "n1", "Pending", &[])));
    idx.apply(&Event::Apply(pod(2, "n1", "Failed", &[])));
    assert!(idx.pending_pods("n1").is_empty(), "terminal: not waiting");
    assert_eq!(idx.bound_pods("n1"), 1, "terminal: not bound");
    assert_eq!(
        idx.pod(PodUid(2)).unwrap().phase,
        PodPhase::Failed,
        "still visible"
    );
    let (mut seen, mut found) = (Vec::new(), 0);
    idx.with_pods(
        [1u128, 2, 3],
        |u| PodUid(*u),
        |u, p| {
            seen.push(u);
            found += usize::from(p.is_some());
        },
    );
    assert_eq!((seen, found), (vec![1, 2, 3], 2));
}

/// Issue 27, "What counts as waiting": a hostNetwork pod (the agent's own, kube-proxy, a
/// node exporter) gets no address from tidepool, so before it runs it is never counted as
/// waiting (demand, the pods-waiting figure, `AgentNotReady`); it is still bound.
#[test]
fn a_host_network_pod_never_waits_for_an_address() {
    let (idx, _) = index();
    let mut host = pod(1, "n1", "Pending", &[]);
    host.spec.as_mut().expect("spec").host_network = Some(true);
    idx.apply(&Event::Apply(host));
    idx.apply(&Event::Apply(pod(2, "n1", "Pending", &[])));
    assert_eq!(
        idx.pending_pods("n1"),
        vec![PodUid(2)],
        "only the pod network's"
    );
    assert_eq!(idx.bound_pods("n1"), 2, "both bound");
}

/// The count of pending pods over every node (what the engine's scarcity step reads to
/// know whether pods not yet counted could make a pool scarcer) is the sum of each node's
/// `pending_pods`, through relists, address assignment, terminal phases, host-network pods,
/// a move to another node and deletion.
#[test]
fn pending_total_is_the_sum_of_every_nodes_pending_pods() {
    let (idx, _) = index();
    let sum = |idx: &PodIndex| {
        let each: usize = ["n1", "n2"].iter().map(|n| idx.pending_pods(n).len()).sum();
        (idx.pending_total(), each)
    };
    idx.apply(&Event::Init);
    idx.apply(&Event::InitApply(pod(1, "n1", "Pending", &[])));
    idx.apply(&Event::InitApply(pod(2, "n2", "Pending", &[])));
    assert_eq!(idx.pending_total(), 0, "a relist is buffered");
    idx.apply(&Event::InitDone);
    assert_eq!(sum(&idx), (2, 2));
    let mut host = pod(3, "n1", "Pending", &[]);
    host.spec.as_mut().expect("spec").host_network = Some(true);
    idx.apply(&Event::Apply(host));
    idx.apply(&Event::Apply(pod(4, "n1", "Pending", &[])));
    idx.apply(&Event::Apply(pod(4, "n1", "Pending", &[])));
    assert_eq!(sum(&idx), (3, 3), "host network never waits");
    idx.apply(&Event::Apply(pod(1, "n1", "Running", &["10.0.0.1"])));
    idx.apply(&Event::Apply(pod(2, "n2", "Failed", &[])));
    assert_eq!(sum(&idx), (1, 1));
    idx.apply(&Event::Apply(pod(4, "n2", "Pending", &[])));
    assert_eq!(sum(&idx), (1, 1), "moved, still pending");
    idx.apply(&Event::Delete(pod(4, "n2", "Pending", &[])));
    idx.apply(&Event::Init);
    idx.apply(&Event::InitApply(pod(5, "n2", "Pending", &[])));
    idx.apply(&Event::InitDone);
    assert_eq!(sum(&idx), (1, 1), "a relist replaces the set");
}

/// A pod labelled as `--agent-pod-selector` says is its node's agent: the index keeps
/// whether it is Ready (the kubelet's probe of `/readyz`), through events and relists; a
/// node with no agent pod (or only a terminal one) has no answer; with two (a rollout),
/// one Ready is enough.
#[test]
fn an_agent_pods_ready_condition_is_kept_per_node() {
    let server = FakeServer::default();
    let selector: LabelSelector = "app.kubernetes.io/name=tidepool-agent".parse().unwrap();
    let idx = PodIndex::new(server).with_agent_pods(selector);
    let agent = |uid: u128, node: &str, phase: &str, ready: &str| {
        let mut p = pod(uid, node, phase, &["192.168.0.1"]);
        p.metadata.labels = Some(BTreeMap::from([(
            "app.kubernetes.io/name".into(),
            "tidepool-agent".into(),
        )]));
        p.spec.as_mut().unwrap().host_network = Some(true);
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "Ready".into(),
            status: ready.into(),
            ..Default::default()
        }]);
        p
    };
    idx.apply(&Event::Apply(pod(9, "n1", "Running", &["10.0.0.9"])));
    assert_eq!(idx.agent_pod_ready("n1"), None, "a pod of another app");
    idx.apply(&Event::Apply(agent(1, "n1", "Running", "False")));
    assert_eq!(idx.agent_pod_ready("n1"), Some(false));
    assert_eq!(idx.agent_pod_ready("n2"), None);
    idx.apply(&Event::Apply(agent(2, "n1", "Running", "True")));
    assert_eq!(idx.agent_pod_ready("n1"), Some(true), "one of two Ready");
    idx.apply(&Event::Delete(agent(2, "n1", "Running", "True")));
    assert_eq!(idx.agent_pod_ready("n1"), Some(false));
    idx.apply(&Event::Init);
    idx.apply(&Event::InitApply(agent(1, "n1", "Running", "True")));
    idx.apply(&Event::InitDone);
    assert_eq!(idx.agent_pod_ready("n1"), Some(true), "relisted");
    idx.apply(&Event::Apply(agent(1, "n1", "Failed", "False")));
    assert_eq!(idx.agent_pod_ready("n1"), None, "terminal: gone as agent");
    // without a selector (or with the empty one) no pod is an agent's
    let none = PodIndex::new(FakeServer::default()).with_agent_pods(LabelSelector::default());
    none.apply(&Event::Apply(agent(1, "n1", "Running", "False")));
    assert_eq!(none.agent_pod_ready("n1"), None);
}

#[test]
fn change_counters_advance_per_node() {
    let (idx, _) = index();
    assert_eq!(idx.pod_changes("n1", None), Some(PodChanges::default()));
    idx.apply(&Event::Apply(pod(1, "n1", "Pending", &[])));
    let s1 = since(&idx, "n1");
    assert!(s1.seq > 0);
    assert!(idx.pod_changes("n1", Some(s1)).unwrap().changed.is_empty());
    idx.apply(&Event::Apply(pod(2, "n2", "Pending", &[])));
    assert!(
        idx.pod_changes("n1", Some(s1)).unwrap().changed.is_empty(),
        "n2's pod"
    );
    // a waiting pod's labels choose its pool (DESIGN.md "Pools per namespace and per pod"):
    // a change of them is one
    let mut relabelled = pod(1, "n1", "Pending", &[]);
    relabelled.metadata.labels = None;
    assert_eq!(
        idx.apply(&Event::Apply(relabelled)),
        vec![NodeName::from("n1")]
    );
    assert_eq!(
        idx.pod_changes("n1", Some(s1)).unwrap().changed,
        vec![PodUid(1)]
    );
    let s1 = since(&idx, "n1");
    idx.apply(&Event::Apply(pod(1, "n1", "Running", &["10.0.0.1"])));
    let c = idx.pod_changes("n1", Some(s1)).unwrap();
    assert_eq!(c.changed, vec![PodUid(1)]);
    assert!(c.seq > s1.seq);
    // a change the engine does not see (a label of a pod that has its addresses) is not one
    let seen = since(&idx, "n1");
    let mut relabelled = pod(1, "n1", "Running", &["10.0.0.1"]);
    relabelled.metadata.labels = None;
    assert!(idx.apply(&Event::Apply(relabelled)).is_empty());
    assert_eq!(since(&idx, "n1").seq, seen.seq);
    // more changes than are kept: it can no longer tell which
    for u in 10..26 {
        idx.apply(&Event::Apply(pod(u, "n1", "Pending", &[])));
    }
    assert_eq!(idx.pod_changes("n1", Some(s1)), None);
    assert_eq!(
        idx.pod_changes("n1", Some(since(&idx, "n1")))
            .unwrap()
            .changed,
        vec![]
    );
    // a node whose pods are all gone: a caller who saw them cannot be told which changed
    let s2 = since(&idx, "n2");
    idx.apply(&Event::Delete(pod(2, "n2", "Pending", &[])));
    assert_eq!(idx.pod_changes("n2", Some(s2)), None);
    assert_eq!(idx.pod_changes("n2", None), Some(PodChanges::default()));
}

/// The live lookup is a GET by the namespace and name the caller has (a `used` entry's),
/// whatever the index holds: a UID the index never saw (its pod watch lags, issue 25) is
/// asked for too, not answered "gone".
#[tokio::test(start_paused = true)]
async fn pod_live_gets_the_pod_by_name_and_checks_its_uid() {
    let (idx, server) = index();
    idx.apply(&Event::Apply(pod(1, "n1", "Pending", &[])));
    server.put(pod(1, "n1", "Running", &["10.0.0.1"]));
    let live = idx
        .pod_live(PodUid(1), "ns", "p1")
        .await
        .unwrap()
        .expect("on the server");
    assert_eq!(
        (live.phase, server.gets()),
        (PodPhase::Running, 1),
        "the server's view"
    );
    // recreated under the same name: another pod
    server.put(pod(1, "n1", "Running", &["10.0.0.1"]).tap_uid(9));
    assert_eq!(idx.pod_live(PodUid(1), "ns", "p1").await.unwrap(), None);
    // gone from the index: still asked
    server.put(pod(1, "n1", "Running", &["10.0.0.1"]));
    idx.apply(&Event::Delete(pod(1, "n1", "Running", &[])));
    assert!(idx.pod_live(PodUid(1), "ns", "p1").await.unwrap().is_some());
    assert_eq!(server.gets(), 3);
    // never seen by the index (its watch lags): asked, and found running
    server.put(pod(77, "n1", "Running", &["10.0.0.7"]));
    let late = idx.pod_live(PodUid(77), "ns", "p77").await.unwrap();
    assert_eq!(late.map(|p| p.phase), Some(PodPhase::Running));
    assert_eq!(server.gets(), 4);
    // no such pod on the server: gone
    assert_eq!(idx.pod_live(PodUid(78), "ns", "p78").await.unwrap(), None);
    assert_eq!(server.gets(), 5);
    // a failed GET is an error naming the pod
    *server.fail.lock() = true;
    let err = idx.pod_live(PodUid(1), "ns", "p1").await.unwrap_err();
    assert!(
        matches!(&err, IpamError::PodView(m) if m.contains("ns/p1")),
        "{err}"
    );
}

trait TapUid {
    fn tap_uid(self, uid: u128) -> Self;
}

impl TapUid for Pod {
    fn tap_uid(mut self, uid: u128) -> Self {
        self.metadata.uid = Some(uid_str(uid));
        self
    }
}

// ---- nodes ----

fn node(name: &str, uid: u128, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(uid_str(uid)),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some(BTreeMap::from([("pods".into(), Quantity("58".into()))])),
            ..Default::default()
        }),
    }
}

fn info(name: &str, uid: u128) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        uid: NodeUid(uid),
        allocatable_pods: 58,
        cordoned: false,
        terminating: false,
    }
}

fn nodes(selector: &str) -> NodeIndex {
    NodeIndex::new(selector.parse().expect("a valid selector"))
}

#[test]
fn the_node_selector_filters_and_relabelling_moves_nodes_in_and_out() {
    let idx = nodes("pool=a, !gpu");
    let added = idx.apply(&Event::Apply(node("n1", 1, &[("pool", "a")])));
    assert_eq!(added, vec![NodeChange::Added(info("n1", 1))]);
    assert!(
        idx.apply(&Event::Apply(node("n2", 2, &[("pool", "b")])))
            .is_empty()
    );
    let gpu = node("n3", 3, &[("pool", "a"), ("gpu", "yes")]);
    assert!(idx.apply(&Event::Apply(gpu)).is_empty());
    assert!(idx.get("n2").is_none() && idx.get("n3").is_none());
    let n2 = idx.apply(&Event::Apply(node("n2", 2, &[("pool", "a")])));
    assert_eq!(n2, vec![NodeChange::Added(info("n2", 2))]);
    let out = idx.apply(&Event::Apply(node("n1", 1, &[("pool", "b")])));
    assert_eq!(out, vec![NodeChange::Removed(info("n1", 1))]);
    assert!(idx.get("n1").is_none());
    // a label change inside the selection is a change (pools select by labels)
    let out = idx.apply(&Event::Apply(node(
        "n2",
        2,
        &[("pool", "a"), ("zone", "z1")],
    )));
    assert_eq!(out, vec![NodeChange::Changed(info("n2", 2))]);
    assert_eq!(
        idx.labels("n2").unwrap().get("zone").map(String::as_str),
        Some("z1")
    );
}

#[test]
fn a_node_re_registered_under_its_name_is_removed_then_added() {
    let idx = nodes("");
    idx.apply(&Event::Apply(node("n1", 1, &[])));
    let out = idx.apply(&Event::Apply(node("n1", 2, &[])));
    assert_eq!(
        out,
        vec![
            NodeChange::Removed(info("n1", 1)),
            NodeChange::Added(info("n1", 2))
        ]
    );
    assert!(
        idx.apply(&Event::Delete(node("n1", 1, &[]))).is_empty(),
        "the old one's"
    );
    assert_eq!(idx.get("n1").map(|i| i.uid), Some(NodeUid(2)));
    let out = idx.apply(&Event::Delete(node("n1", 2, &[])));
    assert_eq!(out, vec![NodeChange::Removed(info("n1", 2))]);
}

#[test]
fn node_projection_and_changes() {
    let idx = nodes("");
    let mut n = node("n1", 1, &[]);
    idx.apply(&Event::Apply(n.clone()));
    assert!(
        idx.apply(&Event::Apply(n.clone())).is_empty(),
        "nothing changed"
    );
    n.spec.as_mut().unwrap().unschedulable = Some(true);
    n.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    let want = NodeInfo {
        cordoned: true,
        terminating: true,
        ..info("n1", 1)
    };
    assert_eq!(
        idx.apply(&Event::Apply(n.clone())),
        vec![NodeChange::Changed(want)]
    );
    for (pods, want) in [(Some("1k"), 110), (None, 110), (Some("250"), 250)] {
        let status = n.status.as_mut().unwrap();
        status.allocatable = pods.map(|p| BTreeMap::from([("pods".into(), Quantity(p.into()))]));
        idx.apply(&Event::Apply(n.clone()));
        assert_eq!(idx.get("n1").unwrap().allocatable_pods, want, "{pods:?}");
    }
    let mut bad = node("n9", 9, &[]);
    bad.metadata.uid = Some("not-a-uuid".into());
    assert!(idx.apply(&Event::Apply(bad)).is_empty() && idx.get("n9").is_none());
}

#[test]
fn a_node_relist_reports_what_vanished_changed_and_appeared() {
    let idx = nodes("role!=edge");
    idx.apply(&Event::Init);
    idx.apply(&Event::InitApply(node("n1", 1, &[])));
    idx.apply(&Event::InitApply(node("n2", 2, &[("role", "worker")])));
    idx.apply(&Event::InitApply(node("n4", 4, &[("role", "edge")])));
    assert!(!idx.ready() && idx.get("n1").is_none());
    let out = idx.apply(&Event::InitDone);
    assert_eq!(
        out,
        vec![
            NodeChange::Added(info("n1", 1)),
            NodeChange::Added(info("n2", 2))
        ]
    );
    assert!(idx.ready());
    idx.apply(&Event::Init);
    idx.apply(&Event::InitApply(node("n3", 3, &[])));
    idx.apply(&Event::InitApply(node("n2", 2, &[("role", "db")])));
    idx.apply(&Event::InitApply(node("n1", 5, &[])));
    assert!(
        idx.get("n1").is_some(),
        "the old view answers until InitDone"
    );
    let out = idx.apply(&Event::InitDone);
    assert_eq!(
        out,
        vec![
            NodeChange::Removed(info("n1", 1)),
            NodeChange::Added(info("n1", 5)),
            NodeChange::Changed(info("n2", 2)),
            NodeChange::Added(info("n3", 3)),
        ]
    );
}

#[test]
fn node_selectors_parse_equality_and_existence_and_refuse_the_rest() {
    let s: LabelSelector = "a=b, c==d,e!=f,g,!h,example.com/role=worker"
        .parse()
        .unwrap();
    let labels = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let base = [
        ("a", "b"),
        ("c", "d"),
        ("g", ""),
        ("example.com/role", "worker"),
    ];
    assert!(s.matches(&labels(&base)), "e absent satisfies e!=f");
    assert!(s.matches(&labels(&[base.as_slice(), &[("e", "x")]].concat())));
    assert!(!s.matches(&labels(&[base.as_slice(), &[("e", "f")]].concat())));
    assert!(!s.matches(&labels(&[base.as_slice(), &[("h", "1")]].concat())));
    assert!(!s.matches(&labels(&base[1..])), "a missing");
    assert_eq!(s.to_string(), "a=b,c=d,e!=f,g,!h,example.com/role=worker");
    assert!(
        "".parse::<LabelSelector>()
            .unwrap()
            .matches(&BTreeMap::new())
    );
    let long = format!("a={}", "v".repeat(64));
    for bad in [
        "a in (b,c)",
        "a notin (b)",
        "a in b",
        "=b",
        "a,",
        "!",
        "a=b=c",
        "a>1",
        long.as_str(),
        "Bad_Prefix/x=y",
        "a=-b",
    ] {
        let err = bad.parse::<LabelSelector>().expect_err(bad).to_string();
        assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
    }
}

/// What the pool choice reads of a waiting pod: its labels and pools annotation and its
/// namespace's, once the namespace watch has shown it; nothing for a pod that has its
/// addresses (its pool is fixed), and nothing before its namespace is known (not in the
/// cache is not "no labels").
#[test]
fn a_waiting_pods_pool_subject_joins_its_namespaces_terms() {
    use k8s_openapi::api::core::v1::Namespace;
    use tidepool_operator::index::NamespaceIndex;
    let namespaces = NamespaceIndex::default();
    let idx = PodIndex::new(FakeServer::default()).with_namespaces(namespaces.clone());
    let mut waiting = pod(1, "n1", "Pending", &[]);
    let pools = BTreeMap::from([("ipam.tidepool.dev/pools".to_string(), "blue".to_string())]);
    waiting.metadata.annotations = Some(pools);
    idx.apply(&Event::Apply(waiting));
    idx.apply(&Event::Apply(pod(2, "n2", "Running", &["10.0.0.2"])));
    assert_eq!(
        idx.pool_subject(PodUid(1)),
        None,
        "its namespace is not known yet"
    );
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ns", "labels": {"team": "blue"}},
    }))
    .unwrap();
    assert_eq!(namespaces.apply(&Event::Apply(ns)), vec!["ns".to_string()]);
    let s = idx.pool_subject(PodUid(1)).expect("a subject");
    assert_eq!(s.pod_pools.as_deref(), Some("blue"));
    assert_eq!(s.pod_labels["app"], "web");
    assert_eq!(s.namespace_labels["team"], "blue");
    assert_eq!(
        idx.pool_subject(PodUid(2)),
        None,
        "a pod with its addresses"
    );
    assert_eq!(idx.waiting_in("ns"), names(&["n1"]));
    assert!(idx.waiting_in("other").is_empty());
}
