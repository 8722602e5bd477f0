//! The agent's side of reconcile and of the live pods' exclusion, on a state in a temp dir
//! saved through a recording filesystem: frees go through DEL's path and are durable before
//! they are published; a live pod's address is never handed out.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tidepool_ipam::AddrSet;

use super::*;
use crate::pods::{LivePods, PodAddrs};
use crate::serve::{CniRequest, Config, MemoryNodeSource, MemoryPods, PodNetworks, Publish};
use crate::state::{NodeState, Op, OpKind, RecordingFs, StateDir, parse_pod_uid};

const POD: &str = "0badc0de-0000-4000-8000-000000000001";
const OTHER: &str = "0badc0de-0000-4000-8000-000000000002";

/// A publisher that records the filesystem calls made before each publish.
struct SeenAtPublish {
    fs: RecordingFs,
    seen: Mutex<Vec<Vec<Op>>>,
}

impl Publish for SeenAtPublish {
    fn publish(&self) {
        self.seen.lock().expect("lock").push(self.fs.ops());
    }
}

struct Fixture {
    agent: Agent,
    pods: Arc<MemoryPods>,
    published: Arc<SeenAtPublish>,
    fs: RecordingFs,
    tmp: tempfile::TempDir,
}

/// An agent on pool 10.1.0.0/28 (pod network 10.1.0.0/16: .0 and .1 reserved), the pods
/// listed (none live).
fn fixture() -> Fixture {
    let fs = RecordingFs::new();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = StateDir::open_with(tmp.path().join("state"), Arc::new(fs.clone())).expect("open");
    let source = MemoryNodeSource::new();
    source.set_pool("n", AddrSet::of_net(&"10.1.0.0/28".parse().expect("net")));
    let pods = Arc::new(MemoryPods::default());
    pods.set(Some(LivePods::default()));
    let published = Arc::new(SeenAtPublish {
        fs: fs.clone(),
        seen: Mutex::new(Vec::new()),
    });
    let config = Config {
        pod_networks: Some(std::sync::Arc::new(
            PodNetworks::new(["10.1.0.0/16".parse().expect("net")]).expect("nets"),
        )),
        empty_pool_wait: Duration::from_millis(10),
    };
    let state = NodeState::new("boot", Duration::from_secs(30));
    let agent = Agent::with_pods(
        crate::serve::SharedState::new(state),
        dir,
        Arc::new(source),
        pods.clone(),
        published.clone(),
        config,
    );
    Fixture {
        agent,
        pods,
        published,
        fs,
        tmp,
    }
}

fn add_req(c: &str, uid: &str) -> CniRequest {
    serde_json::from_value(json!({"containerID": c, "ifname": "eth0",
        "netns": "/var/run/netns/cni-of-c1",
        "podNamespace": "d", "podName": "p", "podUID": uid,
        "cniVersion": "1.0.0", "config": {}}))
    .expect("request")
}

fn live(list: &[(&str, &str)]) -> LivePods {
    let pods: Vec<PodAddrs> = list
        .iter()
        .map(|(uid, a)| PodAddrs {
            uid: Some(parse_pod_uid(uid).expect("uid")),
            terminal: false,
            addrs: vec![a.parse().expect("ip")],
        })
        .collect();
    LivePods::new(&pods)
}

async fn addr(agent: &Agent, c: &str, uid: &str) -> String {
    let r = agent.add(add_req(c, uid)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["ips"][0]["address"]
        .as_str()
        .expect("address")
        .to_owned()
}

/// The runtime's directories: a netns of another sandbox, a cache entry of another
/// attachment (it confirms libcni's layout).
fn runtime_dirs(root: &Path) -> reconcile::Config {
    let netns = root.join("netns");
    let cache = root.join("results");
    std::fs::create_dir_all(&netns).expect("mkdir");
    std::fs::create_dir_all(&cache).expect("mkdir");
    std::fs::write(netns.join("cni-other"), "").expect("netns");
    let entry = json!({"kind": "cniCacheV1", "containerId": "cother", "ifName": "eth0",
        "networkName": "pods", "result": {}});
    std::fs::write(cache.join("pods-cother-eth0"), entry.to_string()).expect("entry");
    reconcile::Config {
        netns_dir: netns,
        cni_cache_dir: cache,
        interval: Duration::from_secs(1),
        max_frees: 16,
    }
}

#[tokio::test]
async fn a_live_pods_address_is_never_handed_out_until_the_pod_is_gone() {
    let f = fixture();
    // 10.1.0.2 is the lowest free address; a live pod lists it though the state does not
    f.pods.set(Some(live(&[(OTHER, "10.1.0.2")])));
    assert_eq!(addr(&f.agent, "c1", POD).await, "10.1.0.3/16");
    // the pod is gone: its address is free again
    f.pods.set(Some(LivePods::default()));
    assert_eq!(
        addr(&f.agent, "c2", POD).await,
        "10.1.0.2/16",
        "the pod went"
    );
}

#[tokio::test]
async fn a_candidate_seen_twice_is_freed_durably_before_it_is_published() {
    let f = fixture();
    let cfg = runtime_dirs(f.tmp.path());
    let gone = addr(&f.agent, "c1", POD).await;
    let kept = addr(&f.agent, "c2", OTHER).await;
    let kept_ip = kept.split('/').next().expect("ip").to_owned();
    // c2's pod lives and lists its address
    f.pods.set(Some(live(&[(OTHER, &kept_ip)])));
    let publishes = f.published.seen.lock().expect("lock").len();

    let first = f.agent.reconcile(&cfg).await.expect("cycle 1");
    assert_eq!((first.candidates, first.free.len()), (1, 0));
    assert_eq!(f.published.seen.lock().expect("lock").len(), publishes);
    f.fs.take_ops();

    let second = f.agent.reconcile(&cfg).await.expect("cycle 2");
    assert_eq!(second.free.len(), 1);
    assert_eq!(second.free[0].key.container_id, "c1");
    let seen = f.published.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), publishes + 1, "published once");
    let kinds: Vec<OpKind> = seen[publishes].iter().map(Op::kind).collect();
    assert_eq!(
        kinds.last(),
        Some(&OpKind::SyncDir),
        "saved before it was published: {kinds:?}"
    );
    let st = f.agent.state().lock().await;
    assert!(st.get(&crate::state::AllocKey::new("c1", "eth0")).is_none());
    let gone_ip: std::net::IpAddr = gone.split('/').next().expect("ip").parse().expect("ip");
    assert!(st.cooldowns().contains_key(&gone_ip), "into cooldown");
    assert!(st.get(&crate::state::AllocKey::new("c2", "eth0")).is_some());
    assert!(!st.is_dirty());
    drop(st);
    let report = f.agent.reconcile_report().body;
    assert_eq!(report["cycles"], 2);
    assert_eq!(report["recentFrees"][0]["containerID"], "c1");
    assert_eq!(report["recentFrees"][0]["firstSeenCycle"], 1);
    assert_eq!(report["recentFrees"][0]["podUID"], POD);
}

#[tokio::test]
async fn without_a_populated_netns_dir_nothing_is_freed() {
    let f = fixture();
    let mut cfg = runtime_dirs(f.tmp.path());
    addr(&f.agent, "c1", POD).await;
    std::fs::remove_file(cfg.netns_dir.join("cni-other")).expect("rm");
    for _ in 0..4 {
        let d = f.agent.reconcile(&cfg).await.expect("cycle");
        assert_eq!(d.blocked, Some(reconcile::Blocked::NetnsEmpty));
    }
    cfg.netns_dir = f.tmp.path().join("not-mounted");
    let d = f.agent.reconcile(&cfg).await.expect("cycle");
    assert!(matches!(
        d.blocked,
        Some(reconcile::Blocked::NetnsInvisible(_))
    ));
    assert_eq!(f.agent.state().lock().await.allocations().count(), 1);
    let report = f.agent.reconcile_report().body;
    assert!(
        report["last"]["blocked"]
            .as_str()
            .is_some_and(|b| b.contains("netns")),
        "{report}"
    );
}
