use std::sync::Mutex;

use serde_json::json;
use tidepool_ipam::AddrSet;

use super::*;
use crate::serve::source::MemoryNodeSource;
use crate::state::{Op, OpKind, RecordingFs};

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

fn agent(fs: &RecordingFs) -> (Agent, Arc<SeenAtPublish>, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = StateDir::open_with(tmp.path().join("state"), Arc::new(fs.clone())).expect("open");
    let source = MemoryNodeSource::new();
    source.set_pool("n", AddrSet::of_net(&"10.1.0.0/28".parse().expect("net")));
    let publish = Arc::new(SeenAtPublish {
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
    let agent = Agent::new(state, dir, Arc::new(source), publish.clone(), config);
    (agent, publish, tmp)
}

fn add_req(c: &str) -> CniRequest {
    serde_json::from_value(json!({"containerID": c, "ifname": "eth0", "netns": "/n",
        "podNamespace": "d", "podName": "p", "podUID": "0badc0de-0000-4000-8000-000000000001",
        "cniVersion": "1.0.0", "config": {}}))
    .expect("request")
}

fn kinds(ops: &[Op]) -> Vec<OpKind> {
    ops.iter().map(Op::kind).collect()
}

#[tokio::test]
async fn add_publishes_only_after_the_directory_fsync() {
    let fs = RecordingFs::new();
    let (agent, published, _tmp) = agent(&fs);
    let r = agent.add(add_req("c1")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["cniVersion"], "1.0.0");
    assert_eq!(r.body["ips"][0]["address"], "10.1.0.2/16");
    let seen = published.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        kinds(&seen[0]),
        [
            OpKind::Create,
            OpKind::Write,
            OpKind::SyncFile,
            OpKind::Rename,
            OpKind::SyncDir
        ]
    );
}

#[tokio::test]
async fn an_add_that_could_not_be_saved_is_not_answered_as_done_and_its_retry_saves_it() {
    let fs = RecordingFs::new();
    let (agent, published, _tmp) = agent(&fs);
    fs.fail_next(OpKind::SyncDir);
    let r = agent.add(add_req("c1")).await;
    assert_eq!((r.status, r.code()), (500, Some(5)), "{}", r.body);
    assert!(
        published.seen.lock().expect("lock").is_empty(),
        "nothing published"
    );
    // the runtime retries: the same address, saved now, then published
    let r = agent.add(add_req("c1")).await;
    assert_eq!(r.body["ips"][0]["address"], "10.1.0.2/16");
    assert_eq!(published.seen.lock().expect("lock").len(), 1);
    assert!(!agent.state().lock().await.is_dirty());
}

#[tokio::test]
async fn a_repeated_add_by_another_pod_is_refused() {
    let fs = RecordingFs::new();
    let (agent, _, _tmp) = agent(&fs);
    assert_eq!(agent.add(add_req("c1")).await.status, 200);
    let mut other = add_req("c1");
    other.pod_uid = Some("0badc0de-0000-4000-8000-000000000002".into());
    let r = agent.add(other).await;
    assert_eq!(r.code(), Some(code::GENERIC), "{}", r.body);
    assert_eq!(agent.state().lock().await.allocations().count(), 1);
}

fn del_req(c: &str, uid: &str) -> CniRequest {
    let mut r = add_req(c);
    r.pod_uid = Some(uid.into());
    r
}

/// What a DEL did, for the metrics: the state's answer (freed, stale, unknown), or error
/// when it could not be saved.
#[tokio::test]
async fn a_del_tells_freed_stale_unknown_and_error_apart() {
    let fs = RecordingFs::new();
    let (agent, _, _tmp) = agent(&fs);
    assert_eq!(agent.add(add_req("c1")).await.status, 200);
    assert_eq!(agent.add(add_req("c2")).await.status, 200);
    let owner = "0badc0de-0000-4000-8000-000000000001";
    let other = "0badc0de-0000-4000-8000-000000000002";
    let del = |c: &str, uid: &str| agent.del_observed(del_req(c, uid));
    let outcome = |(r, o): (Reply, CniOutcome)| {
        assert_eq!(r.status, if o == CniOutcome::Error { 500 } else { 200 });
        o
    };
    assert_eq!(outcome(del("c1", other).await), CniOutcome::Stale);
    // a UID that is no UUID matches no owner: stale on a held key, unknown otherwise
    assert_eq!(outcome(del("c1", "uid-1").await), CniOutcome::Stale);
    assert_eq!(outcome(del("c9", "uid-1").await), CniOutcome::Unknown);
    assert_eq!(outcome(del("c1", owner).await), CniOutcome::Ok);
    assert_eq!(outcome(del("c1", owner).await), CniOutcome::Unknown);
    // freed but not durable: an error, whatever the state did
    fs.fail_next(OpKind::SyncDir);
    assert_eq!(outcome(del("c2", owner).await), CniOutcome::Error);
    let (r, o) = agent.del_observed(del_req("c2", owner)).await;
    assert_eq!(
        (r.status, o),
        (200, CniOutcome::Unknown),
        "freed before: saved now"
    );
    assert!(!agent.state().lock().await.is_dirty());
}
