use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn block(cidr: &str, node: &str, uid: u128) -> BlockOwner {
    BlockOwner {
        cidr: net(cidr),
        node: node.into(),
        node_uid: NodeUid(uid),
    }
}

fn node(name: &str, uid: u128, internal: &[&str]) -> NodeAddrs {
    NodeAddrs {
        name: name.into(),
        uid: Some(NodeUid(uid)),
        internal: internal.iter().map(|a| ip(a)).collect(),
    }
}

#[test]
fn other_nodes_blocks_are_routed_via_their_internal_ip_of_the_family() {
    let blocks = [
        block("10.0.0.0/26", "a", 1),
        block("10.0.0.64/26", "b", 2),
        block("fd00::/120", "b", 2),
        block("10.0.0.128/26", "c", 3),
        block("fd00::100/120", "c", 3),
    ];
    let nodes = [
        node("a", 1, &["192.168.77.1"]),
        node("b", 2, &["fd77::2", "192.168.77.2"]),
        node("c", 3, &["192.168.77.3"]),
    ];
    let (routes, skipped) = desired(&blocks, &nodes, "a");
    let want: BTreeMap<IpNet, IpAddr> = [
        (net("10.0.0.64/26"), ip("192.168.77.2")),
        (net("fd00::/120"), ip("fd77::2")),
        (net("10.0.0.128/26"), ip("192.168.77.3")),
    ]
    .into();
    assert_eq!(routes, want);
    // c has no IPv6 InternalIP; a's own blocks are not even considered
    assert_eq!(
        skipped,
        vec![Skipped::NoAddress {
            block: net("fd00::100/120"),
            node: "c".into()
        }]
    );
}

#[test]
fn a_stale_block_or_one_of_an_unknown_node_is_not_routed() {
    let blocks = [
        block("10.0.0.0/26", "b", 9), // an earlier Node b's
        block("10.0.0.64/26", "gone", 4),
        block("10.0.0.128/26", "b", 2),
    ];
    let nodes = [node("b", 2, &["192.168.77.2"])];
    let (routes, skipped) = desired(&blocks, &nodes, "a");
    assert_eq!(routes, [(net("10.0.0.128/26"), ip("192.168.77.2"))].into());
    assert!(skipped.contains(&Skipped::Stale {
        block: net("10.0.0.0/26"),
        node: "b".into()
    }));
    assert!(skipped.contains(&Skipped::NoNode {
        block: net("10.0.0.64/26"),
        node: "gone".into()
    }));
    // a Node whose UID is not a UUID routes nothing
    let odd = NodeAddrs {
        uid: None,
        ..node("b", 2, &["192.168.77.2"])
    };
    assert!(desired(&blocks, &[odd], "a").0.is_empty());
}

#[test]
fn one_cidr_claimed_twice_goes_to_the_first_node_by_name() {
    let blocks = [block("10.0.0.0/26", "c", 3), block("10.0.0.0/26", "b", 2)];
    let nodes = [
        node("b", 2, &["192.168.77.2"]),
        node("c", 3, &["192.168.77.3"]),
    ];
    let (routes, skipped) = desired(&blocks, &nodes, "a");
    assert_eq!(routes, [(net("10.0.0.0/26"), ip("192.168.77.2"))].into());
    assert_eq!(skipped.len(), 1);
}

#[test]
fn a_changed_gateway_is_deleted_then_added() {
    let desired: BTreeMap<IpNet, IpAddr> = [
        (net("10.0.0.0/26"), ip("192.168.77.9")),
        (net("10.0.0.64/26"), ip("192.168.77.2")),
    ]
    .into();
    let old = Route {
        dst: net("10.0.0.0/26"),
        via: ip("192.168.77.1"),
    };
    let kept = Route {
        dst: net("10.0.0.64/26"),
        via: ip("192.168.77.2"),
    };
    let gone = Route {
        dst: net("10.0.1.0/26"),
        via: ip("192.168.77.3"),
    };
    let d = diff(&desired, &[old, kept, gone, kept]);
    // the duplicate of `kept` goes too
    assert_eq!(d.delete, vec![old, gone, kept]);
    assert_eq!(
        d.add,
        vec![Route {
            dst: net("10.0.0.0/26"),
            via: ip("192.168.77.9")
        }]
    );
    assert!(diff(&desired, &[kept, d.add[0]]).is_empty());
}

fn arb_route() -> impl Strategy<Value = Route> {
    (0u8..8, 0u8..4).prop_map(|(b, g)| Route {
        dst: IpNet::new(IpAddr::from([10, 0, b, 0]), 24).unwrap(),
        via: IpAddr::from([192, 168, 77, g]),
    })
}

/// The kernel's table as the diff sees it: owned routes, and others the agent must not touch.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    route: Route,
    owned: bool,
}

proptest! {
    /// Applying the diff to the owned routes present gives exactly the desired ones, and
    /// routes that are not owned (never listed to the diff) stay as they were.
    #[test]
    fn applying_the_diff_yields_the_desired_routes(
        want in prop::collection::vec(arb_route(), 0..10),
        owned in prop::collection::vec(arb_route(), 0..10),
        foreign in prop::collection::vec(arb_route(), 0..5),
    ) {
        let desired: BTreeMap<IpNet, IpAddr> = want.iter().map(|r| (r.dst, r.via)).collect();
        let mut table: Vec<Entry> = owned.iter().map(|&route| Entry { route, owned: true })
            .chain(foreign.iter().map(|&route| Entry { route, owned: false }))
            .collect();
        let present: Vec<Route> = table.iter().filter(|e| e.owned).map(|e| e.route).collect();
        let d = diff(&desired, &present);
        for r in &d.delete {
            // a delete names an owned route present (the kernel deletes one match)
            let i = table.iter().position(|e| e.owned && e.route == *r);
            prop_assert!(i.is_some(), "deleting {r} which is not owned and present");
            table.remove(i.unwrap());
        }
        for r in &d.add {
            table.push(Entry { route: *r, owned: true });
        }
        let now: Vec<Route> = table.iter().filter(|e| e.owned).map(|e| e.route).collect();
        let as_set: BTreeSet<Route> = now.iter().copied().collect();
        prop_assert_eq!(as_set.len(), now.len(), "an owned route twice");
        let want_set: BTreeSet<Route> = desired.iter().map(|(&dst, &via)| Route { dst, via }).collect();
        prop_assert_eq!(as_set, want_set);
        let mut before: Vec<Route> = foreign.clone();
        let mut after: Vec<Route> = table.iter().filter(|e| !e.owned).map(|e| e.route).collect();
        before.sort();
        after.sort();
        prop_assert_eq!(before, after);
        // and a second pass has nothing to do
        prop_assert!(diff(&desired, &now).is_empty());
    }
}
