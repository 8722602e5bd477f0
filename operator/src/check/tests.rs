//! The check over hand-built objects, no server: a clean cluster reports nothing, and each
//! kind of finding is found.

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use tidepool_api as api;
use tidepool_ipam::pool::block_name;

use super::*;

fn uid(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012x}")
}

fn at(minutes: u32) -> String {
    format!("2026-01-01T{:02}:{:02}:00Z", minutes / 60, minutes % 60)
}

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

fn pool(name: &str, created: u32, cidrs: &[&str]) -> api::IPPool {
    from(json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name, "creationTimestamp": at(created)},
        "spec": {"cidrs": cidrs, "blockSize": {"ipv4": 28, "ipv6": 124}},
    }))
}

fn node(name: &str, uid: &str) -> Node {
    from(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": uid}}))
}

fn pod(name: &str, uid: &str, node: &str, phase: &str, ips: &[&str]) -> Pod {
    let ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    from(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
        "status": {"phase": phase, "podIPs": ips},
    }))
}

fn block_named(name: &str, cidr: &str, pool: &str, node: &str, node_uid: &str) -> api::IPAMBlock {
    from(json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
        "metadata": {"name": name},
        "spec": {"pool": pool, "cidr": cidr, "node": node, "nodeUID": node_uid},
    }))
}

fn block(cidr: &str, pool: &str, node: &str, node_uid: &str) -> api::IPAMBlock {
    let name = cidr
        .parse()
        .map(|c| block_name(&c))
        .unwrap_or_else(|_| "unreadable".into());
    block_named(&name, cidr, pool, node, node_uid)
}

/// One `status.used` entry: address, pod UID, pod name, container, minutes after T0.
type Use<'a> = (&'a str, &'a str, &'a str, &'a str, u32);

fn ipam_node(name: &str, node_uid: &str, used: &[Use<'_>]) -> api::IPAMNode {
    let used: serde_json::Map<String, Value> = used
        .iter()
        .map(|(a, uid, pod, container, since)| {
            let e = json!({"podUID": uid, "namespace": "default", "pod": pod,
                "containerID": container, "ifname": "eth0", "since": at(*since)});
            (a.to_string(), e)
        })
        .collect();
    from(json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": {"name": name},
        "spec": {"nodeUID": node_uid},
        "status": {"used": used},
    }))
}

#[derive(Clone)]
struct World {
    pools: Vec<api::IPPool>,
    blocks: Vec<api::IPAMBlock>,
    ipam_nodes: Vec<api::IPAMNode>,
    nodes: Vec<Node>,
    pods: Vec<Pod>,
}

impl World {
    /// Two live nodes, dual-stack, each address in its node's block and held by a Running
    /// pod listing it.
    fn clean() -> Self {
        let (n1, n2) = (uid(1), uid(2));
        let (a, b) = (uid(101), uid(102));
        Self {
            pools: vec![pool("default", 0, &["10.0.0.0/16", "fd00::/120"])],
            blocks: vec![
                block("10.0.0.16/28", "default", "n1", &n1),
                block("10.0.0.32/28", "default", "n2", &n2),
                block("fd00::/124", "default", "n1", &n1),
            ],
            ipam_nodes: vec![
                ipam_node(
                    "n1",
                    &n1,
                    &[
                        ("10.0.0.17", &a, "a", "ca", 0),
                        ("fd00::1", &a, "a", "ca", 0),
                    ],
                ),
                ipam_node("n2", &n2, &[("10.0.0.33", &b, "b", "cb", 0)]),
            ],
            nodes: vec![node("n1", &n1), node("n2", &n2)],
            pods: vec![
                pod("a", &a, "n1", "Running", &["10.0.0.17", "fd00::1"]),
                pod("b", &b, "n2", "Running", &["10.0.0.33"]),
            ],
        }
    }

    fn report(&self) -> Report {
        let w = self.clone();
        check(&Inputs::from_objects(
            w.pools,
            w.blocks,
            w.ipam_nodes,
            w.nodes,
            w.pods,
        ))
    }

    fn ipam_node_mut(&mut self, name: &str) -> &mut api::IPAMNode {
        self.ipam_nodes
            .iter_mut()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .expect("that IPAMNode")
    }

    /// Adds a `status.used` entry to an IPAMNode.
    fn use_addr(&mut self, node: &str, u: Use<'_>) {
        self.use_in_pool(node, u, None);
    }

    /// Adds a `status.used` entry naming `pool` (none: an entry written before pools).
    fn use_in_pool(&mut self, node: &str, u: Use<'_>, pool: Option<&str>) {
        let (a, uid, pod, container, since) = u;
        let n = self.ipam_node_mut(node);
        let entry: api::UsedEntry = from(json!({"podUID": uid, "namespace": "default",
            "pod": pod, "containerID": container, "ifname": "eth0", "since": at(since),
            "pool": pool}));
        n.status
            .get_or_insert_with(Default::default)
            .used
            .insert(a.to_string(), entry);
    }
}

fn kinds(r: &Report) -> Vec<&'static str> {
    r.problems.iter().map(|p| p.kind.as_str()).collect()
}

#[test]
fn a_clean_cluster_reports_nothing() {
    let r = World::clean().report();
    assert!(r.problems.is_empty(), "{:#?}", r.problems);
    assert!(r.reclaim_candidates.is_empty());
    assert!(!r.needs_attention());
    assert_eq!(r.exit_code(), 0);
    let s = &r.summary;
    assert_eq!(
        (s.ippools, s.ipamblocks, s.ipamnodes, s.nodes, s.pods),
        (1, 3, 2, 2, 2)
    );
    assert_eq!(s.addresses_in_use, 3);
    assert!(s.problems.values().all(|n| *n == 0) && s.problems.len() == ProblemKind::ALL.len());
    // usage per family: the /16 has 4096 /28s, its first and last address are not usable
    let v4 = &r.pools[0];
    assert_eq!((v4.pool.as_str(), v4.family), ("default", "ipv4"));
    assert_eq!(v4.state, PoolState::Valid);
    assert_eq!(v4.addresses, Some(Counts::new(65534, 32, 65502)));
    assert_eq!(v4.blocks, Some(Counts::new(4096, 2, 4094)));
    assert_eq!(v4.in_use, 2);
    let v6 = &r.pools[1];
    assert_eq!(v6.family, "ipv6");
    assert_eq!(v6.addresses, Some(Counts::new(256, 16, 240)));
    assert_eq!(v6.blocks, Some(Counts::new(16, 1, 15)));
    assert_eq!(v6.in_use, 1);
    let text = table(&r);
    assert!(
        text.ends_with("Check complete; found 0 problems.\n"),
        "{text}"
    );
    assert!(
        text.contains("Found 0 reclaim candidates (informational"),
        "{text}"
    );
}

#[test]
fn reclaim_candidates_follow_the_engines_rule_and_are_informational() {
    let mut w = World::clean();
    // a's pod is gone, b's has succeeded
    w.pods.retain(|p| p.metadata.name.as_deref() != Some("a"));
    w.pods[0] = pod("b", &uid(102), "n2", "Succeeded", &["10.0.0.33"]);
    // c's first sandbox was replaced by a later one, which the Running pod lists
    let c = uid(103);
    w.use_addr("n1", ("10.0.0.18", &c, "c", "c-old", 1));
    w.use_addr("n1", ("10.0.0.19", &c, "c", "c-new", 2));
    w.pods.push(pod("c", &c, "n1", "Running", &["10.0.0.19"]));
    // d lists another address but no later entry of its own: not the engine's candidate
    let d = uid(104);
    w.use_addr("n1", ("10.0.0.20", &d, "d", "cd", 1));
    w.pods.push(pod("d", &d, "n1", "Running", &["10.0.0.21"]));
    // e is Pending
    let e = uid(105);
    w.use_addr("n1", ("10.0.0.22", &e, "e", "ce", 1));
    w.pods.push(pod("e", &e, "n1", "Pending", &[]));
    // the operator has tombstoned b's entry already
    w.ipam_node_mut("n2").spec.reclaim.insert(
        "10.0.0.33".into(),
        from(json!({"podUID": uid(102), "containerID": "cb", "ifname": "eth0", "reason": "pod-terminal"})),
    );

    let r = w.report();
    assert!(r.problems.is_empty(), "{:#?}", r.problems);
    assert_eq!(r.exit_code(), 0, "reclaim candidates alone need no one");
    let got: Vec<(&str, String, &str, &str, bool)> = r
        .reclaim_candidates
        .iter()
        .map(|c| {
            (
                c.node.as_str(),
                c.address.to_string(),
                c.pod.as_str(),
                c.reason,
                c.tombstoned,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("n1", "10.0.0.17".into(), "a", "pod-deleted", false),
            ("n1", "10.0.0.18".into(), "c", "sandbox-replaced", false),
            ("n1", "fd00::1".into(), "a", "pod-deleted", false),
            ("n2", "10.0.0.33".into(), "b", "pod-terminal", true),
        ]
    );
    assert_eq!(r.reclaim_candidates[0].pod_uid, uid(101));
    assert_eq!(r.summary.reclaim_candidates, 4);
    let text = table(&r);
    assert!(
        text.contains(
            "Found 4 reclaim candidates (informational: the operator reclaims these itself"
        ),
        "{text}"
    );
    assert!(text.contains("tombstone written"), "{text}");
}

#[test]
fn the_same_address_on_two_live_nodes_is_a_duplicate() {
    let mut w = World::clean();
    let x = uid(201);
    w.use_addr("n2", ("10.0.0.17", &x, "x", "cx", 3));
    w.pods.push(pod("x", &x, "n2", "Running", &["10.0.0.17"]));
    let r = w.report();
    assert!(!r.problems.is_empty());
    assert!(
        kinds(&r).iter().all(|k| *k == "duplicate"),
        "{:#?}",
        r.problems
    );
    let same = r
        .problems
        .iter()
        .find(|p| p.objects == ["ipamnode/n1", "ipamnode/n2"])
        .expect("the same address in two IPAMNodes");
    assert_eq!(same.address, Some("10.0.0.17".parse().unwrap()));
    assert!(
        same.detail.contains("default/a") && same.detail.contains("default/x"),
        "{}",
        same.detail
    );
    // n2 also uses an address of n1's block
    assert!(
        r.problems
            .iter()
            .any(|p| p.objects == ["ipamnode/n2", "ipamblock/v4-10-0-0-16-28"]),
        "{:#?}",
        r.problems
    );
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn overlapping_blocks_are_duplicates() {
    // of two nodes (the second under a name that is not its CIDR's)
    let mut w = World::clean();
    w.blocks.push(block_named(
        "extra",
        "10.0.0.32/28",
        "default",
        "n1",
        &uid(1),
    ));
    let r = w.report();
    assert_eq!(
        kinds(&r),
        vec!["duplicate", "malformed"],
        "{:#?}",
        r.problems
    );
    assert_eq!(
        r.problems[0].objects,
        vec!["ipamblock/extra", "ipamblock/v4-10-0-0-32-28"]
    );
    assert!(
        r.problems[1].detail.contains("v4-10-0-0-32-28"),
        "{}",
        r.problems[1].detail
    );
    // of one node
    let mut w = World::clean();
    w.blocks.push(block_named(
        "extra",
        "10.0.0.16/28",
        "default",
        "n1",
        &uid(1),
    ));
    let r = w.report();
    assert_eq!(
        kinds(&r),
        vec!["duplicate", "malformed"],
        "{:#?}",
        r.problems
    );
    assert!(
        r.problems[0].detail.contains("of node n1 overlap"),
        "{}",
        r.problems[0].detail
    );
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn an_address_outside_the_nodes_blocks_is_leaked() {
    let mut w = World::clean();
    w.use_addr("n1", ("10.0.9.9", &uid(101), "a", "ca2", 1));
    // a gone node's entry outside any block
    w.ipam_nodes.push(ipam_node(
        "n3",
        &uid(3),
        &[("10.0.7.7", &uid(301), "z", "cz", 0)],
    ));
    let r = w.report();
    assert_eq!(kinds(&r), vec!["leaked", "leaked"], "{:#?}", r.problems);
    assert_eq!(r.problems[0].objects, vec!["ipamnode/n1"]);
    assert!(
        r.problems[0].detail.contains("status.used[10.0.9.9]")
            && r.problems[0].detail.contains("default/a"),
        "{}",
        r.problems[0].detail
    );
    assert!(
        r.problems[1].detail.contains("no longer exists"),
        "{}",
        r.problems[1].detail
    );
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn spec_addresses_are_the_nodes_own() {
    let mut w = World::clean();
    w.ipam_node_mut("n2").spec.addresses = vec!["10.6.0.1".into()];
    w.use_addr("n2", ("10.6.0.1", &uid(102), "b", "cb2", 1));
    let r = w.report();
    assert!(r.problems.is_empty(), "{:#?}", r.problems);
}

#[test]
fn out_of_range_and_unknown_pool() {
    let mut w = World::clean();
    w.blocks
        .push(block("10.99.0.0/28", "default", "n1", &uid(1)));
    w.blocks.push(block("10.1.0.0/28", "nope", "n2", &uid(2)));
    w.use_addr("n1", ("192.168.1.1", &uid(101), "a", "ca3", 1));
    let r = w.report();
    assert_eq!(
        kinds(&r),
        vec!["leaked", "out-of-range", "out-of-range", "unknown-pool"],
        "{:#?}",
        r.problems
    );
    let block = r
        .of_kind(ProblemKind::OutOfRange)
        .find(|p| p.cidr.is_some());
    assert!(
        block
            .unwrap()
            .detail
            .contains("outside pool default's CIDRs"),
        "{:#?}",
        r.problems
    );
    let addr = r
        .of_kind(ProblemKind::OutOfRange)
        .find(|p| p.address.is_some());
    assert!(addr.unwrap().detail.contains("outside every valid pool"));
    let unknown = r.of_kind(ProblemKind::UnknownPool).next().unwrap();
    assert!(
        unknown
            .detail
            .contains("names pool nope, which does not exist")
    );
    assert_eq!(r.exit_code(), 1);
}

/// An entry names the pool its pod resolved to at its ADD; one without a name belongs to the
/// pool of the node's block holding its address. An address in a block of no (valid) pool,
/// and an address outside the pool its entry names, are each found once, naming the pod.
#[test]
fn an_entry_in_no_pool_or_outside_its_pool_is_reported() {
    let mut w = World::clean();
    w.pools.push(pool("blue", 10, &["10.1.0.0/16"]));
    w.blocks.push(block("10.1.0.16/28", "blue", "n1", &uid(1)));
    // a block naming a pool that does not exist, inside pool default's CIDRs
    w.blocks.push(block("10.0.0.48/28", "gone", "n2", &uid(2)));
    let (c, d) = (uid(103), uid(104));
    // in their pools: named, or not named
    w.use_in_pool("n1", ("10.1.0.17", &c, "c", "c1", 1), Some("blue"));
    w.use_in_pool("n1", ("10.0.0.18", &c, "c", "c2", 1), Some("default"));
    w.use_in_pool("n1", ("10.1.0.18", &c, "c", "c3", 1), None);
    // outside the pool they name
    w.use_in_pool("n1", ("10.1.0.19", &d, "d", "d1", 1), Some("default"));
    w.use_in_pool("n1", ("10.0.0.19", &d, "d", "d2", 1), Some("blue"));
    w.use_in_pool("n2", ("10.0.0.50", &d, "d", "d3", 1), Some("default"));
    // in no pool: the block's pool does not exist
    w.use_in_pool("n2", ("10.0.0.49", &d, "d", "d4", 1), None);
    w.use_in_pool("n2", ("10.0.0.51", &d, "d", "d5", 1), Some("gone"));
    // outside every pool and its node's blocks: leaked and out of range only
    w.use_in_pool("n1", ("192.168.1.1", &d, "d", "d6", 1), Some("default"));
    let r = w.report();
    assert_eq!(
        kinds(&r),
        vec![
            "leaked",
            "out-of-range",
            "unknown-pool",
            "no-pool",
            "no-pool",
            "outside-pool",
            "outside-pool",
            "outside-pool"
        ],
        "{:#?}",
        r.problems
    );
    let at = |kind: ProblemKind| -> Vec<(String, String)> {
        (r.of_kind(kind))
            .map(|p| (p.objects.join(","), p.address.unwrap().to_string()))
            .collect()
    };
    let at_n2 = |a: &str| {
        (
            "ipamnode/n2,ipamblock/v4-10-0-0-48-28".to_string(),
            a.to_string(),
        )
    };
    assert_eq!(
        at(ProblemKind::NoPool),
        vec![at_n2("10.0.0.49"), at_n2("10.0.0.51")]
    );
    let no_pool = r.of_kind(ProblemKind::NoPool).next().unwrap();
    assert_eq!(no_pool.pool.as_deref(), Some("gone"));
    assert!(
        no_pool
            .detail
            .contains("status.used[10.0.0.49] (pod default/d (UID")
            && no_pool.detail.contains("pool gone, which does not exist"),
        "{}",
        no_pool.detail
    );
    assert_eq!(
        at(ProblemKind::OutsidePool),
        vec![
            (
                "ipamnode/n1,ipamblock/v4-10-0-0-16-28".to_string(),
                "10.0.0.19".to_string()
            ),
            (
                "ipamnode/n1,ipamblock/v4-10-1-0-16-28".to_string(),
                "10.1.0.19".to_string()
            ),
            at_n2("10.0.0.50"),
        ]
    );
    let outside: Vec<&Problem> = r.of_kind(ProblemKind::OutsidePool).collect();
    assert_eq!(outside[0].pool.as_deref(), Some("blue"), "the entry's pool");
    assert!(
        outside[0].detail.contains("names pool blue")
            && outside[0]
                .detail
                .contains("block 10.0.0.16/28 of pool default"),
        "{}",
        outside[0].detail
    );
    assert!(
        outside[2]
            .detail
            .contains("pool gone, which does not exist"),
        "{}",
        outside[2].detail
    );
    assert_eq!(r.summary.problems["no-pool"], 2);
    assert_eq!(r.summary.problems["outside-pool"], 3);
    let text = table(&r);
    assert!(
        text.contains("Found 2 addresses in no pool")
            && text.contains("Found 3 addresses outside their pod's pool"),
        "{text}"
    );
    assert_eq!(r.exit_code(), 1);
}

/// Someone set an IPAMNode's `spec.nodeUID` to another UID than its Node's (the old
/// overrides example did, with its placeholder): reported.
#[test]
fn an_ipamnode_whose_node_uid_is_not_its_nodes_is_reported() {
    let mut w = World::clean();
    w.ipam_node_mut("n2").spec.node_uid = uid(7);
    let r = w.report();
    let p = r
        .problems
        .iter()
        .find(|p| p.kind == ProblemKind::NodeUid)
        .unwrap_or_else(|| panic!("{:#?}", r.problems));
    assert_eq!(p.objects, vec!["ipamnode/n2", "node/n2"]);
    assert!(
        p.detail.contains(&uid(7)) && p.detail.contains(&uid(2)),
        "{}",
        p.detail
    );
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.summary.problems["node-uid"], 1);
}

#[test]
fn blocks_of_gone_or_recreated_nodes_are_orphans() {
    let mut w = World::clean();
    w.blocks
        .push(block("10.0.0.48/28", "default", "n3", &uid(3)));
    w.blocks
        .push(block("10.0.0.64/28", "default", "n2", &uid(99)));
    let r = w.report();
    assert_eq!(
        kinds(&r),
        vec!["orphan-block", "orphan-block"],
        "{:#?}",
        r.problems
    );
    assert!(r.problems[0].detail.contains("no Node n3 exists"));
    assert!(
        r.problems[1]
            .detail
            .contains(&format!("Node n2 now has UID {}", uid(2))),
        "{}",
        r.problems[1].detail
    );
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn an_overlapping_pool_is_invalid() {
    let mut w = World::clean();
    w.pools.push(pool("later", 60, &["10.0.0.0/24"]));
    let r = w.report();
    assert_eq!(kinds(&r), vec!["invalid-pool"], "{:#?}", r.problems);
    assert_eq!(r.problems[0].objects, vec!["ippool/later"]);
    let row = r.pools.iter().find(|p| p.pool == "later").unwrap();
    assert_eq!(row.state, PoolState::Invalid);
    assert!(row.reason.as_deref().unwrap().contains("overlaps"));
    assert_eq!(row.addresses, None);
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn malformed_entries_are_reported_and_skipped() {
    let mut w = World::clean();
    w.use_addr("n1", ("10.0.0.999", &uid(101), "a", "ca4", 1));
    w.blocks
        .push(block_named("bad", "nonsense", "default", "n1", &uid(1)));
    w.nodes.push(node("n4", "not-a-uid"));
    w.pools.push(pool("broken", 30, &["10.2.0/16"]));
    // host bits are read as written: an invalid pool, with why (not malformed)
    w.pools.push(pool("host-bits", 31, &["10.3.0.1/16"]));
    // an IPAMNode whose node UID cannot be read: reported, its entries not called leaked
    w.ipam_nodes.push(ipam_node(
        "n5",
        "garbage",
        &[("10.0.5.5", &uid(501), "q", "cq", 0)],
    ));
    w.pods
        .push(pod("q", &uid(501), "n5", "Running", &["10.0.5.5"]));
    let r = w.report();
    let (invalid, malformed): (Vec<&Problem>, Vec<&Problem>) =
        (r.problems.iter()).partition(|p| p.kind == ProblemKind::InvalidPool);
    assert_eq!(invalid.len(), 1, "{:#?}", r.problems);
    assert_eq!(invalid[0].objects, vec!["ippool/host-bits".to_string()]);
    assert!(invalid[0].detail.contains("host bits set"), "{invalid:?}");
    assert!(malformed.iter().all(|p| p.kind == ProblemKind::Malformed));
    let objects: Vec<&str> = malformed.iter().map(|p| p.objects[0].as_str()).collect();
    assert_eq!(
        objects,
        vec![
            "ipamblock/bad",
            "ipamnode/n1",
            "ipamnode/n5",
            "ippool/broken",
            "node/n4"
        ]
    );
    assert!(malformed[1].detail.contains("status.used[\"10.0.0.999\"]"));
    assert_eq!(r.exit_code(), 1);
}

/// The same objects in another order give the same report.
#[test]
fn the_report_does_not_depend_on_the_order_of_the_objects() {
    let mut w = World::clean();
    w.blocks
        .push(block("10.0.0.48/28", "default", "n3", &uid(3)));
    w.use_addr("n2", ("10.0.0.17", &uid(201), "x", "cx", 3));
    w.use_addr("n1", ("10.0.9.9", &uid(101), "a", "ca2", 1));
    w.pools.push(pool("later", 60, &["10.0.0.0/24"]));
    w.pods.remove(0);
    let r = w.report();
    let mut v = w.clone();
    v.pools.reverse();
    v.blocks.reverse();
    v.ipam_nodes.reverse();
    v.nodes.reverse();
    v.pods.reverse();
    assert_eq!(v.report(), r);
}

#[test]
fn the_table_and_the_json_say_the_same() {
    let mut w = World::clean();
    w.blocks
        .push(block("10.0.0.48/28", "default", "n3", &uid(3)));
    w.pods.remove(0);
    let r = w.report();
    let text = table(&r);
    assert!(
        text.starts_with("Checking IPAM for inconsistencies...\n"),
        "{text}"
    );
    assert!(text.contains("Found 1 orphan block (its Node is gone or has another UID)."));
    assert!(text.contains("Found 2 reclaim candidates"), "{text}");
    assert!(
        text.ends_with("Check complete; found 1 problem that needs a person.\n"),
        "{text}"
    );
    // the pool table's columns line up
    let header = text.lines().find(|l| l.starts_with("POOL")).unwrap();
    let row = text.lines().find(|l| l.starts_with("default")).unwrap();
    let col = header.find("CAPACITY").unwrap();
    assert_eq!(&row[col..col + 5], "65534", "{text}");

    let v: Value = serde_json::from_str(&r.to_json()).expect("JSON");
    assert_eq!(v["summary"]["needs_attention"], true);
    assert_eq!(v["summary"]["problems"]["orphan-block"], 1);
    assert_eq!(v["problems"][0]["kind"], "orphan-block");
    assert_eq!(v["problems"][0]["cidr"], "10.0.0.48/28");
    assert_eq!(v["reclaim_candidates"][0]["reason"], "pod-deleted");
    assert_eq!(v["pools"][0]["addresses"]["capacity"], "65534");
}

/// A pool's runway is what the operator wrote in its status: shown in the table (as a
/// duration) and the JSON; absent (`-`, no field) while the pool is not shrinking.
#[test]
fn the_runway_is_the_one_the_operator_wrote() {
    let mut w = World::clean();
    let quiet = w.report();
    let row = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("default"))
            .unwrap()
            .to_string()
    };
    let text = table(&quiet);
    let header = text.lines().find(|l| l.starts_with("POOL")).unwrap();
    let col = header.find("RUNWAY").expect("a RUNWAY column");
    assert_eq!(&row(&text)[col..col + 1], "-", "{text}");
    let v: Value = serde_json::from_str(&quiet.to_json()).expect("JSON");
    assert!(v["pools"][0].get("runway_seconds").is_none(), "{v}");

    w.pools[0].status = Some(from(
        json!({"ipv4": {"capacity": "65534", "allocated": "48",
        "free": "65486", "runwaySeconds": 9000}}),
    ));
    let r = w.report();
    let text = table(&r);
    assert!(row(&text)[col..].starts_with("2h 30m"), "{text}");
    let v: Value = serde_json::from_str(&r.to_json()).expect("JSON");
    assert_eq!(v["pools"][0]["runway_seconds"], 9000);
}
