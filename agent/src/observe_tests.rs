use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tidepool_ipam::{AddrSet, NodeName, NodeUid, PodUid};

use super::*;
use crate::state::{AllocKey, PodRef};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn pod(n: u128) -> PodRef {
    PodRef {
        uid: PodUid(n),
        namespace: "default".into(),
        name: format!("p{n}"),
    }
}

fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// Dual-stack: two pods (one with both families), one freed IPv4 address cooling; a /28 and
/// a /124 in the pool, four IPv4 addresses of it marked for release.
fn dual_stack() -> (NodeState, IpamNode) {
    let mut s = NodeState::new("boot", Duration::from_secs(30));
    let now = t0();
    s.adopt_allocation(
        AllocKey::new("c1", "eth0"),
        pod(1),
        &[ip("10.0.0.2"), ip("fd00::2")],
        None,
        now,
    )
    .expect("add c1");
    s.adopt_allocation(
        AllocKey::new("c2", "eth0"),
        pod(2),
        &[ip("10.0.0.3")],
        None,
        now,
    )
    .expect("add c2");
    s.adopt_allocation(
        AllocKey::new("c3", "eth0"),
        pod(3),
        &[ip("10.0.0.4")],
        None,
        now,
    )
    .expect("add c3");
    s.del(&AllocKey::new("c3", "eth0"), Some(PodUid(3)), now);
    let mut node = IpamNode::new(NodeName::from("n"), NodeUid(1));
    let mut pool = AddrSet::of_net(&"10.0.0.0/28".parse().expect("net"));
    pool.union_with(&AddrSet::of_net(&"fd00::/124".parse().expect("net")));
    node.operator.addresses = Arc::new(pool);
    let marked = AddrSet::of_net(&"10.0.0.12/30".parse().expect("net"));
    node.operator
        .release
        .insert_set(&marked, ReleaseState::MarkedForRelease);
    node.operator
        .release
        .insert(ip("10.0.0.11"), ReleaseState::Released);
    (s, node)
}

#[test]
fn ip_counts_come_from_the_state_and_the_node_per_family() {
    use m::AgentIpsState::{Cooldown, Marked, Pool, Used};
    let (s, node) = dual_stack();
    assert_eq!(
        ip_counts(&s, Some(&node), Family::V4, t0()),
        [(Pool, 16), (Used, 2), (Cooldown, 1), (Marked, 4)]
    );
    assert_eq!(
        ip_counts(&s, Some(&node), Family::V6, t0()),
        [(Pool, 16), (Used, 1), (Cooldown, 0), (Marked, 0)]
    );
    // before the IPAMNode is read: no pool, nothing marked; the state still counts
    assert_eq!(
        ip_counts(&s, None, Family::V4, t0()),
        [(Pool, 0), (Used, 2), (Cooldown, 1), (Marked, 0)]
    );
    // the cooldown's end: over, whether or not the state dropped it yet
    let end = t0() + Duration::from_secs(30);
    assert_eq!(s.cooldowns().len(), 1);
    assert_eq!(
        ip_counts(&s, Some(&node), Family::V4, end),
        [(Pool, 16), (Used, 2), (Cooldown, 0), (Marked, 4)]
    );
}

#[test]
fn a_del_counts_as_what_the_state_did() {
    assert_eq!(
        CniOutcome::of_del(&DelOutcome::Freed(vec![ip("10.0.0.2")])),
        CniOutcome::Ok
    );
    assert_eq!(
        CniOutcome::of_del(&DelOutcome::Stale { owner: PodUid(1) }),
        CniOutcome::Stale
    );
    assert_eq!(
        CniOutcome::of_del(&DelOutcome::Unknown),
        CniOutcome::Unknown
    );
    assert_eq!(
        CniOutcome::of_reply(&Reply::empty()),
        CniOutcome::Ok,
        "a 200"
    );
    assert_eq!(
        CniOutcome::of_reply(&Reply::error(11, "empty", "")),
        CniOutcome::Error
    );
}

#[test]
fn status_writes_are_told_apart_by_the_api_servers_answer() {
    let api = |code: u16| -> Result<(), kube::Error> {
        Err(kube::Error::Api(
            kube::core::Status::failure("x", "y")
                .with_code(code)
                .boxed(),
        ))
    };
    assert_eq!(write_outcome(&Ok::<_, kube::Error>(())).as_str(), "ok");
    assert_eq!(write_outcome(&api(409)).as_str(), "conflict");
    assert_eq!(write_outcome(&api(404)).as_str(), "gone");
    assert_eq!(write_outcome(&api(500)).as_str(), "error");
    assert_eq!(write_outcome(&api(429)).as_str(), "error");
    let other: Result<(), kube::Error> = Err(kube::Error::LinesCodecMaxLineLengthExceeded);
    assert_eq!(write_outcome(&other).as_str(), "error");
}

/// Name, labels (sorted), value of one recorded series.
type Recorded = (String, Vec<(String, String)>, DebugValue);

/// Every series `f` records.
fn recorded(f: impl FnOnce()) -> Vec<Recorded> {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    metrics::with_local_recorder(&rec, f);
    let mut out: Vec<_> = snap
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(ck, _, _, v)| {
            let (_, key) = ck.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            (key.name().to_owned(), labels, v)
        })
        .collect();
    out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    out
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    v.sort();
    v
}

#[test]
fn a_cni_request_is_counted_and_timed_under_its_verb() {
    let got = recorded(|| {
        cni_request(Verb::Del, CniOutcome::Stale, Duration::from_millis(3));
        cni_request(Verb::Del, CniOutcome::Stale, Duration::from_millis(5));
        cni_request(Verb::Add, CniOutcome::Error, Duration::from_millis(7));
    });
    let find = |name: &str, l: &[(&str, &str)]| {
        got.iter()
            .find(|(n, ls, _)| n == name && *ls == labels(l))
            .map(|(.., v)| v)
            .unwrap_or_else(|| panic!("{name} {l:?} not recorded: {got:?}"))
    };
    assert_eq!(
        find(
            m::AGENT_CNI_REQUESTS_TOTAL,
            &[("verb", "del"), ("outcome", "stale")]
        ),
        &DebugValue::Counter(2)
    );
    assert_eq!(
        find(
            m::AGENT_CNI_REQUESTS_TOTAL,
            &[("verb", "add"), ("outcome", "error")]
        ),
        &DebugValue::Counter(1)
    );
    assert_eq!(
        find(m::AGENT_CNI_DURATION_SECONDS, &[("verb", "del")]),
        &DebugValue::Histogram(vec![0.003.into(), 0.005.into()])
    );
    assert_eq!(got.len(), 4, "{got:?}");
}

#[test]
fn the_ips_gauges_are_set_for_both_families_and_every_state() {
    let (s, node) = dual_stack();
    let got = recorded(|| ips(&s, Some(&node)));
    assert_eq!(got.len(), 8, "{got:?}");
    let gauge = |family: &str, state: &str| {
        got.iter()
            .find(|(_, l, _)| *l == labels(&[("family", family), ("state", state)]))
            .map(|(.., v)| v)
    };
    assert_eq!(gauge("ipv4", "used"), Some(&DebugValue::Gauge(2.0.into())));
    assert_eq!(
        gauge("ipv4", "marked"),
        Some(&DebugValue::Gauge(4.0.into()))
    );
    assert_eq!(gauge("ipv6", "pool"), Some(&DebugValue::Gauge(16.0.into())));
    assert!(got.iter().all(|(n, ..)| n == m::AGENT_IPS));
}
