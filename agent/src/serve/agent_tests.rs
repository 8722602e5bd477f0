use std::path::Path;
use std::sync::{Condvar, Mutex};

use serde_json::json;
use tidepool_ipam::AddrSet;

use super::*;
use crate::serve::source::MemoryNodeSource;
use crate::state::{CHECKPOINT_FILE, Fs, FsFile, Op, OpKind, RecordingFs};

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
    let (agent, published, _, tmp) = agent_on(fs, Arc::new(fs.clone()));
    (agent, published, tmp)
}

/// [`agent`] saving through `dir_fs` (which records into `fs`), and the state it shares
/// with the publisher.
fn agent_on(
    fs: &RecordingFs,
    dir_fs: Arc<dyn Fs>,
) -> (Agent, Arc<SeenAtPublish>, SharedState, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = StateDir::open_with(tmp.path().join("state"), dir_fs).expect("open");
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
    let shared = SharedState::new(state);
    let agent = Agent::shared(
        shared.clone(),
        dir,
        Arc::new(source),
        publish.clone(),
        config,
    );
    (agent, publish, shared, tmp)
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

/// A [`RecordingFs`] whose directory fsync takes `delay` and then, done, waits while the
/// gate is closed: the save is durable but has not returned.
struct SlowFs {
    fs: RecordingFs,
    delay: Duration,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl SlowFs {
    fn new(fs: &RecordingFs, delay: Duration, open: bool) -> Self {
        let gate = Arc::new((Mutex::new(open), Condvar::new()));
        SlowFs {
            fs: fs.clone(),
            delay,
            gate,
        }
    }

    fn open(gate: &(Mutex<bool>, Condvar)) {
        *gate.0.lock().expect("gate") = true;
        gate.1.notify_all();
    }
}

/// Opens the gate when dropped: a failing test does not leave a save blocked.
struct OpenOnDrop(Arc<(Mutex<bool>, Condvar)>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        SlowFs::open(&self.0);
    }
}

impl Fs for SlowFs {
    fn create(&self, path: &Path) -> std::io::Result<Box<dyn FsFile + '_>> {
        self.fs.create(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.fs.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        std::thread::sleep(self.delay);
        let synced = self.fs.sync_dir(dir);
        let (open, cv) = &*self.gate;
        let g = open.lock().expect("gate");
        drop(cv.wait_while(g, |open| !*open).expect("gate"));
        synced
    }
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        self.fs.read(path)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        self.fs.remove(path)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        self.fs.list(dir)
    }
}

fn saves(fs: &RecordingFs) -> usize {
    fs.ops()
        .iter()
        .filter(|o| o.kind() == OpKind::SyncDir)
        .count()
}

/// Waits (up to 5 s) until `done` holds of the live state.
async fn until_state(agent: &Agent, what: &str, done: impl Fn(&NodeState) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let state = tokio::time::timeout_at(deadline, agent.state().lock()).await;
        if done(&state.unwrap_or_else(|_| panic!("never: {what} (the state stays locked)"))) {
            return;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Group commit: ADDs arriving while a save runs share the next one, and each is answered
/// only once a save holding it is durable (its directory fsynced: a power loss keeps it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_adds_share_saves_and_each_answers_only_once_its_save_is_durable() {
    const N: usize = 8;
    let fs = RecordingFs::new();
    let slow = SlowFs::new(&fs, Duration::from_millis(30), true);
    let (agent, published, _, tmp) = agent_on(&fs, Arc::new(slow));
    let checkpoint = tmp.path().join("state").join(CHECKPOINT_FILE);
    let adds = (0..N).map(|k| {
        let (agent, fs, checkpoint) = (agent.clone(), fs.clone(), checkpoint.clone());
        tokio::spawn(async move {
            let c = format!("c{k}");
            let r = agent.add(add_req(&c)).await;
            assert_eq!(r.status, 200, "{}", r.body);
            let durable = fs.durable(&checkpoint).expect("a durable checkpoint");
            let needle = format!("\"containerID\":\"{c}\"");
            assert!(
                String::from_utf8_lossy(&durable).contains(&needle),
                "{c} answered before a durable save held it"
            );
        })
    });
    for add in futures::future::join_all(adds).await {
        add.expect("an ADD");
    }
    let saves = saves(&fs);
    assert!(saves < N, "{N} concurrent ADDs took {saves} saves");
    assert!(!published.seen.lock().expect("lock").is_empty());
}

/// A batch whose save fails fails every mutation in it (not answered as done, nothing
/// published); their changes stay to be saved, and a retry saves and answers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_batch_save_fails_every_mutation_in_it_and_publishes_none() {
    let fs = RecordingFs::new();
    let slow = SlowFs::new(&fs, Duration::ZERO, false);
    let gate = OpenOnDrop(slow.gate.clone());
    let (agent, published, shared, _tmp) = agent_on(&fs, Arc::new(slow));
    let held = |s: &NodeState| -> Vec<String> {
        s.allocations()
            .map(|(k, _)| k.container_id.clone())
            .collect()
    };
    let add = |c: &str| {
        let (agent, c) = (agent.clone(), c.to_owned());
        tokio::spawn(async move { agent.add(add_req(&c)).await })
    };
    let first = add("c1");
    let deadline = Instant::now() + Duration::from_secs(5);
    while saves(&fs) == 0 {
        assert!(Instant::now() < deadline, "c1's save never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // c1's save is durable but held: the next ADDs change the state meanwhile
    let batch: Vec<_> = ["c2", "c3", "c4"].into_iter().map(add).collect();
    until_state(&agent, "the ADDs made while a save runs", |s| {
        s.allocations().count() == 4
    })
    .await;
    assert!(
        held(&shared.durable()).is_empty(),
        "the publisher reads only what a save returned"
    );
    fs.fail_next(OpKind::SyncDir);
    SlowFs::open(&gate.0);
    assert_eq!(first.await.expect("c1").status, 200);
    for r in futures::future::join_all(batch).await {
        let r = r.expect("an ADD");
        assert_eq!((r.status, r.code()), (500, Some(5)), "{}", r.body);
    }
    assert_eq!(saves(&fs), 2, "one save for c1, one for the batch");
    assert_eq!(
        published.seen.lock().expect("lock").len(),
        1,
        "only c1 published"
    );
    assert_eq!(held(&shared.durable()), ["c1"], "what may be published");
    // the runtime retries one: saved now (the whole batch with it), answered, published
    let r = agent.add(add_req("c3")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(published.seen.lock().expect("lock").len(), 2);
    assert_eq!(held(&shared.durable()).len(), 4);
    assert!(!agent.state().lock().await.is_dirty());
}
