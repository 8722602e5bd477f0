use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use tidepool_api::convert::Allocations;
use tidepool_ipam::node::BlockView;
use tidepool_ipam::{
    AddrSet, IpamNode, PodUid, ReclaimReason, ReleaseAck, ReleaseState, Tombstone,
};

use super::*;
use crate::state::format::{self, readable};
use crate::state::test_dir::TestDir;
use crate::state::{AllocKey, Op, OpKind, PodRef, RecordingFs, StateDir, read_boot_id};

const CD: Duration = Duration::from_secs(30);
const DIR: &str = "/var/lib/tidepool";

fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

fn dir() -> &'static Path {
    Path::new(DIR)
}

fn ckpt() -> PathBuf {
    dir().join(CHECKPOINT_FILE)
}

fn pod(n: u128) -> PodRef {
    PodRef {
        uid: PodUid(n),
        namespace: "default".into(),
        name: format!("web-{n}"),
    }
}

fn add(s: &mut NodeState, c: &str, p: u128, a: &str) {
    s.adopt_allocation(
        AllocKey::new(c, "eth0"),
        pod(p),
        &[ip(a)],
        Some(format!("/var/run/netns/{c}")),
        t0(),
    )
    .expect("add");
}

/// Answers a tombstone on `addr` for allocation (`c`, eth0) of pod `p` (its pod gone).
fn reclaim(s: &mut NodeState, addr: &str, p: u128, c: &str) {
    let key = AllocKey::new(c, "eth0");
    let t = Tombstone {
        pod_uid: PodUid(p),
        allocation: key.id(),
        reason: ReclaimReason::PodDeleted,
    };
    let mut names = Allocations::new();
    names.insert(
        key.id(),
        tidepool_api::convert::AllocationNames::new(c, "eth0"),
    );
    s.answer_tombstones(&BTreeMap::from([(ip(addr), t)]), &names, |_| false, t0());
}

/// Answers marks on `ready` (free) and `busy` (a live pod's) addresses.
fn mark(s: &mut NodeState, ready: &[&str], busy: &[&str]) {
    let mut node = IpamNode::new(Arc::from("n"), tidepool_ipam::NodeUid(1));
    for a in ready.iter().chain(busy) {
        node.operator
            .release
            .insert(ip(a), ReleaseState::MarkedForRelease);
    }
    let busy: AddrSet = busy.iter().map(|a| ip(a)).collect();
    s.answer_marks(&node, &busy, t0());
}

/// Answers a mark on block `name` (holding 10.0.2.1), busy or not.
fn mark_block(s: &mut NodeState, name: &str, busy: bool) {
    let addrs: AddrSet = [ip("10.0.2.1")].into_iter().collect();
    let block = BlockView {
        name: Arc::from(name),
        addrs: addrs.clone(),
        all: addrs.clone(),
        release: true,
        ack: None,
    };
    let busy = if busy { addrs } else { AddrSet::new() };
    s.answer_blocks(&[block], &busy, t0());
}

fn keys(s: &NodeState) -> Vec<String> {
    s.allocations()
        .map(|(k, _)| k.container_id.clone())
        .collect()
}

fn load_at(fs: &RecordingFs, boot: &str, now: SystemTime) -> Loaded {
    load(fs, dir(), boot, now, CD).expect("load")
}

/// Every field the checkpoint holds, set.
fn full_state() -> NodeState {
    let mut s = NodeState::new("boot-1", CD);
    add(&mut s, "c1", 1, "10.0.0.1");
    s.adopt_allocation(
        AllocKey::new("c2", "net1"),
        pod(2),
        &[ip("10.0.0.2"), ip("fd00::2")],
        None,
        t0(),
    )
    .expect("add");
    add(&mut s, "c3", 3, "10.0.0.3");
    s.del(&AllocKey::new("c3", "eth0"), Some(PodUid(3)), t0());
    reclaim(&mut s, "10.0.0.7", 7, "c7");
    mark(&mut s, &["10.0.1.0", "10.0.1.1", "10.0.1.2"], &["10.0.1.9"]);
    mark_block(&mut s, "node-a-10-0-2-0-28", true);
    assert_eq!(
        s.block_release_acks().get("node-a-10-0-2-0-28"),
        Some(&ReleaseAck::DoNotRelease)
    );
    s
}

/// The order that makes a save durable, for every kind of change: write → fsync(file) →
/// rename → fsync(dir), and nothing else.
#[test]
fn every_save_is_write_fsync_rename_fsync_dir() {
    let fs = RecordingFs::new();
    let tmp = dir().join(TEMP_FILE);
    let expected = vec![
        Op::Create(tmp.clone()),
        Op::Write(tmp.clone()),
        Op::SyncFile(tmp.clone()),
        Op::Rename(tmp.clone(), ckpt()),
        Op::SyncDir(dir().to_owned()),
    ];
    let mut s = NodeState::new("boot-1", CD);
    let k = AllocKey::new("c1", "eth0");
    type Change = Box<dyn Fn(&mut NodeState)>;
    let changes: Vec<Change> = vec![
        Box::new(|s| add(s, "c1", 1, "10.0.0.1")),
        Box::new(|s| add(s, "c2", 2, "10.0.0.2")),
        Box::new(move |s| {
            s.del(&k, Some(PodUid(1)), t0());
        }),
        Box::new(|s| reclaim(s, "10.0.0.2", 2, "c2")),
        Box::new(|s| mark(s, &["10.0.0.9"], &[])),
        Box::new(|s| mark_block(s, "b1", false)),
        Box::new(|s| {
            s.forget_outside(&AddrSet::new());
        }),
    ];
    for (i, change) in changes.iter().enumerate() {
        change(&mut s);
        assert!(s.is_dirty(), "change {i}");
        s.save(&fs, dir()).expect("save");
        assert_eq!(fs.take_ops(), expected, "save {i}");
    }
}

/// A failure at any step of a save leaves a complete checkpoint: the previous one, both as
/// a reader sees it now and after a power loss (a failed directory fsync: the new one is
/// visible, the old one is what a power loss keeps).
#[test]
fn a_failure_at_any_step_leaves_the_previous_checkpoint() {
    for kind in [
        OpKind::Create,
        OpKind::Write,
        OpKind::SyncFile,
        OpKind::Rename,
        OpKind::SyncDir,
    ] {
        let fs = RecordingFs::new();
        let mut s = NodeState::new("boot-1", CD);
        add(&mut s, "c1", 1, "10.0.0.1");
        s.save(&fs, dir()).expect("first save");
        add(&mut s, "c2", 2, "10.0.0.2");
        fs.fail_next(kind);
        let err = s.save(&fs, dir()).expect_err("injected failure");
        assert!(matches!(err, StateError::Io { .. }), "{kind:?}: {err}");
        assert!(s.is_dirty(), "{kind:?}");

        let now = load_at(&fs, "boot-1", t0());
        assert_eq!(now.origin, Origin::Restored { version: 2 }, "{kind:?}");
        let visible = if kind == OpKind::SyncDir {
            vec!["c1", "c2"]
        } else {
            vec!["c1"]
        };
        assert_eq!(keys(&now.state), visible, "{kind:?}");
        if kind != OpKind::SyncDir {
            assert!(
                !fs.paths().contains(&dir().join(TEMP_FILE)),
                "{kind:?}: temp left"
            );
        }

        fs.crash();
        let after = load_at(&fs, "boot-1", t0());
        assert_eq!(after.origin, Origin::Restored { version: 2 }, "{kind:?}");
        assert_eq!(keys(&after.state), vec!["c1"], "{kind:?} after a crash");
    }
}

/// Once a save returned, a power loss keeps all of it: every field comes back.
#[test]
fn a_saved_checkpoint_survives_a_crash_whole() {
    let fs = RecordingFs::new();
    let mut s = full_state();
    s.save(&fs, dir()).expect("save");
    fs.crash();
    let loaded = load_at(&fs, "boot-1", t0());
    assert_eq!(loaded.origin, Origin::Restored { version: 2 });
    assert!(loaded.expired_by_reboot.is_empty());
    assert_eq!(loaded.state, s);
    assert_eq!(loaded.state.release_acks().run_count(), 2);
}

const V1_FILE: &str = r#"{"version":1,"minReaderVersion":1,
 "allocations":[{"containerID":"c1","ifname":"eth0",
   "podUID":"00000000-0000-0000-0000-000000000001","namespace":"default","pod":"web-1",
   "addresses":["10.0.0.1","fd00::1"],"since":1700000000000,"bootID":"boot-1"}],
 "cooldown":{"10.0.0.4":1700000030000},
 "releaseAck":[{"first":"10.0.1.0","last":"10.0.1.15","ack":"ready-for-release"}],
 "blockReleaseAck":{"b1":"do-not-release"},
 "reclaimAck":{"10.0.0.7":{"podUID":"00000000-0000-0000-0000-000000000007",
   "containerID":"c7","ifname":"eth0","outcome":"stale"}}}"#;

/// Format N reads format N−1.
#[test]
fn the_current_reader_reads_a_v1_file() {
    let fs = RecordingFs::new();
    fs.put(ckpt(), V1_FILE);
    let loaded = load_at(&fs, "boot-1", t0());
    assert_eq!(loaded.origin, Origin::Restored { version: 1 });
    let s = &loaded.state;
    let a = s.get(&AllocKey::new("c1", "eth0")).expect("c1");
    assert_eq!(a.pod, pod(1));
    assert_eq!(a.addrs, vec![ip("10.0.0.1"), ip("fd00::1")]);
    assert_eq!(
        (a.since, a.boot_id.as_str(), &a.netns),
        (t0(), "boot-1", &None)
    );
    assert_eq!(s.cooldowns().get(&ip("10.0.0.4")), Some(&(t0() + CD)));
    assert_eq!(
        s.release_acks().get(&ip("10.0.1.15")),
        Some(&ReleaseAck::ReadyForRelease)
    );
    assert_eq!(
        s.block_release_acks().get("b1"),
        Some(&ReleaseAck::DoNotRelease)
    );
    assert_eq!(
        s.reclaim_acks()[&ip("10.0.0.7")].key,
        AllocKey::new("c7", "eth0")
    );
    assert!(
        !s.is_dirty(),
        "reading an older format saves nothing by itself"
    );
}

/// What an agent of format 1 knew: its fields, nothing of format 2's, unknown fields
/// ignored (serde's default).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct V1File {
    allocations: Vec<V1Allocation>,
    cooldown: BTreeMap<IpAddr, u64>,
    release_ack: Vec<serde_json::Value>,
    block_release_ack: BTreeMap<String, String>,
    reclaim_ack: BTreeMap<IpAddr, serde_json::Value>,
}

#[derive(Deserialize, Debug, PartialEq)]
struct V1Allocation {
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
    #[serde(rename = "podUID")]
    pod_uid: String,
    namespace: String,
    pod: String,
    addresses: Vec<IpAddr>,
    since: u64,
    #[serde(rename = "bootID")]
    boot_id: String,
}

/// Format N−1 reads format N (a rollback keeps the node's state): by its version rule,
/// then by its fields.
#[test]
fn a_v1_reader_reads_a_v2_file() {
    let fs = RecordingFs::new();
    let mut s = full_state();
    s.save(&fs, dir()).expect("save");
    let bytes = fs.get(&ckpt()).expect("saved");
    let header: format::Header = serde_json::from_slice(&bytes).expect("header");
    assert_eq!(header.version, 2);
    let min_reader = header.min_reader_version.expect("written");
    assert!(readable(header.version, min_reader, 1));

    let v1: V1File = serde_json::from_slice(&bytes).expect("a v1 reader parses v2");
    assert!(String::from_utf8_lossy(&bytes).contains("\"netns\":\"/var/run/netns/c1\""));
    assert_eq!(
        v1.allocations[0],
        V1Allocation {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            pod_uid: PodUid(1).to_string(),
            namespace: "default".into(),
            pod: "web-1".into(),
            addresses: vec![ip("10.0.0.1")],
            since: 1_700_000_000_000,
            boot_id: "boot-1".into(),
        }
    );
    assert_eq!(v1.allocations.len(), 2);
    assert_eq!(v1.cooldown.len(), 1);
    assert_eq!(v1.release_ack.len(), 2);
    assert_eq!(v1.block_release_ack.len(), 1);
    assert_eq!(v1.reclaim_ack.len(), 1);
}

/// A format this agent does not read stops the load with an error that says so; the file
/// stays where it is (it is not corrupt, only newer — or too old).
#[test]
fn a_file_of_an_unknown_future_version_is_refused() {
    for (text, version) in [
        (
            r#"{"version":4,"minReaderVersion":3,"allocations":"a new shape"}"#,
            4,
        ),
        (r#"{"version":3}"#, 3),
        (r#"{"version":0}"#, 0),
    ] {
        let fs = RecordingFs::new();
        fs.put(ckpt(), text);
        let err = load(&fs, dir(), "boot-1", t0(), CD).expect_err("refused");
        let msg = err.to_string();
        assert!(
            matches!(err, StateError::UnsupportedVersion { version: v, .. } if v == version),
            "{msg}"
        );
        assert!(msg.contains(&ckpt().display().to_string()), "{msg}");
        assert!(
            msg.contains("refusing to start rather than misread it"),
            "{msg}"
        );
        assert_eq!(fs.get(&ckpt()).as_deref(), Some(text.as_bytes()));
    }
    // a newer format that lets this one read it is read (the rule's other half)
    let fs = RecordingFs::new();
    fs.put(
        ckpt(),
        r#"{"version":3,"minReaderVersion":2,"somethingNew":{}}"#,
    );
    assert_eq!(
        load_at(&fs, "boot-1", t0()).origin,
        Origin::Restored { version: 3 }
    );
}

/// A corrupt checkpoint is set aside and reported; the state starts empty, asks for a
/// rebuild, and nothing is saved or freed until the agent has rebuilt it.
#[test]
fn a_corrupt_checkpoint_is_set_aside_and_reported() {
    let held_twice = r#"{"version":2,"minReaderVersion":1,"allocations":[
        {"containerID":"a","ifname":"eth0","podUID":"00000000-0000-0000-0000-000000000001",
         "namespace":"n","pod":"p","addresses":["10.0.0.1"],"since":0,"bootID":"boot-1"},
        {"containerID":"b","ifname":"eth0","podUID":"00000000-0000-0000-0000-000000000002",
         "namespace":"n","pod":"q","addresses":["10.0.0.1"],"since":0,"bootID":"boot-1"}]}"#;
    let cases = [
        ("{\"version\":2,\"allocations\":[{\"contai", "EOF"),
        ("", "EOF"),
        (held_twice, "held by both"),
        (
            r#"{"version":2,"minReaderVersion":1,"cooldown":{"not an ip":1}}"#,
            "invalid IP",
        ),
    ];
    for (text, why) in cases {
        let fs = RecordingFs::new();
        fs.put(ckpt(), text);
        let loaded = load_at(&fs, "boot-1", t0());
        let Origin::Corrupt { set_aside, error } = &loaded.origin else {
            panic!("{text}: {:?}", loaded.origin);
        };
        assert!(error.contains(why), "{text}: {error}");
        assert_eq!(set_aside, &dir().join("checkpoint.corrupt.1700000000000"));
        assert!(loaded.rebuild_needed() && !loaded.fresh());
        assert_eq!(fs.get(set_aside).as_deref(), Some(text.as_bytes()));
        assert_eq!(fs.get(&ckpt()), None);
        assert_eq!(loaded.state.allocations().count(), 0);
        assert!(!loaded.state.is_dirty() && loaded.state.cooldowns().is_empty());
        // the set-aside survives a power loss, so the next start does not find it again
        fs.crash();
        assert_eq!(fs.paths(), vec![set_aside.clone()]);
    }
}

/// No checkpoint at all: `fresh`, so the agent excludes live pods' podIPs; nothing written.
#[test]
fn no_checkpoint_is_fresh() {
    let fs = RecordingFs::new();
    let loaded = load_at(&fs, "boot-1", t0());
    assert!(loaded.fresh() && !loaded.rebuild_needed());
    assert_eq!(loaded.state, NodeState::new("boot-1", CD));
    assert!(fs.paths().is_empty());
}

/// A reboot (a new boot ID, faked here) moves every earlier allocation into cooldown at
/// load, and that is saved before the load returns.
#[test]
fn a_boot_id_change_moves_everything_into_cooldown() {
    let fs = RecordingFs::new();
    let boot_id = Path::new("/proc/sys/kernel/random/boot_id");
    fs.put(boot_id, "boot-1\n");
    let mut s = NodeState::new(read_boot_id(&fs, boot_id).expect("boot id"), CD);
    add(&mut s, "c1", 1, "10.0.0.1");
    add(&mut s, "c2", 2, "10.0.0.2");
    s.save(&fs, dir()).expect("save");

    // the same boot: an agent restart keeps everything
    let same = load_at(&fs, "boot-1", t0());
    assert!(same.expired_by_reboot.is_empty());
    assert_eq!(same.state.allocations().count(), 2);

    fs.crash();
    fs.put(boot_id, "boot-2\n");
    let now = t0() + Duration::from_secs(600);
    fs.take_ops();
    let booted = load_at(&fs, &read_boot_id(&fs, boot_id).expect("boot id"), now);
    let dead: Vec<&str> = booted
        .expired_by_reboot
        .iter()
        .map(|(k, _)| k.container_id.as_str())
        .collect();
    assert_eq!(dead, vec!["c1", "c2"]);
    assert_eq!(booted.state.allocations().count(), 0);
    for a in ["10.0.0.1", "10.0.0.2"] {
        assert_eq!(
            booted.state.cooldowns().get(&ip(a)),
            Some(&(now + CD)),
            "{a}"
        );
    }
    assert!(
        fs.take_ops().contains(&Op::SyncDir(dir().to_owned())),
        "saved by the load"
    );

    fs.crash();
    let again = load_at(&fs, "boot-2", now);
    assert!(again.expired_by_reboot.is_empty());
    assert_eq!(again.state, booted.state);
}

/// The real filesystem: the lock first, a round trip, the checkpoint only root reads.
#[test]
fn a_state_dir_on_disk_locks_saves_and_loads() {
    let d = TestDir::new("state-dir");
    let sd = StateDir::open(d.path()).expect("open");
    let err = StateDir::open(d.path()).expect_err("second agent");
    assert!(matches!(err, StateError::Locked { .. }), "{err}");

    let loaded = sd.load("boot-1", t0(), CD).expect("load");
    assert!(loaded.fresh());
    let mut s = full_state();
    sd.save(&mut s).expect("save");
    let path = d.path().join(CHECKPOINT_FILE);
    let mode = std::fs::metadata(&path)
        .expect("checkpoint")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(!d.path().join(TEMP_FILE).exists());
    drop(sd);

    let sd = StateDir::open_with(d.path(), Arc::new(crate::state::StdFs)).expect("reopen");
    let loaded = sd.load("boot-1", t0(), CD).expect("load");
    assert_eq!(loaded.origin, Origin::Restored { version: 2 });
    assert_eq!(loaded.state, s);
}

/// The previous release (format 2, before the node side moved into `ipam`) reads what this
/// build writes, and this build reads what the previous release wrote: nothing is lost
/// either way.
#[test]
fn the_previous_release_reads_this_checkpoint_and_the_other_way_round() {
    use crate::state::format_prev as prev;
    let fs = RecordingFs::new();
    let mut state = full_state();
    state.save(&fs, dir()).expect("save");
    let bytes = fs.get(&ckpt()).expect("written");
    let read = prev::read(&bytes).expect("the previous release reads it");
    let allocs: Vec<_> = read
        .allocations
        .iter()
        .map(|a| {
            (
                a.container_id.as_str(),
                a.ifname.as_str(),
                a.addresses.clone(),
            )
        })
        .collect();
    assert_eq!(
        allocs,
        vec![
            ("c1", "eth0", vec![ip("10.0.0.1")]),
            ("c2", "net1", vec![ip("10.0.0.2"), ip("fd00::2")]),
        ]
    );
    let c1 = &read.allocations[0];
    assert_eq!(
        (c1.pod_uid.as_str(), c1.namespace.as_str(), c1.pod.as_str()),
        ("00000000-0000-0000-0000-000000000001", "default", "web-1")
    );
    assert_eq!(
        (c1.boot_id.as_str(), c1.netns.as_deref()),
        ("boot-1", Some("/var/run/netns/c1"))
    );
    assert_eq!(c1.since, format::to_ms(t0()));
    assert_eq!(
        read.cooldown.keys().collect::<Vec<_>>(),
        vec![&ip("10.0.0.3")]
    );
    assert_eq!(read.release_ack.len(), 2, "a run of three and one");
    assert_eq!(
        read.block_release_ack.get("node-a-10-0-2-0-28"),
        Some(&prev::Answer::DoNotRelease)
    );
    let r = &read.reclaim_ack[&ip("10.0.0.7")];
    assert_eq!(
        (r.container_id.as_str(), r.outcome),
        ("c7", prev::Outcome::Stale)
    );

    // the previous release writes what it read; this build reads the same state back
    let written = serde_json::to_vec(&read).expect("encode");
    assert_eq!(
        (read.version, read.min_reader_version),
        (prev::FORMAT_VERSION, prev::MIN_READER_VERSION)
    );
    let fs = RecordingFs::new();
    fs.put(ckpt(), written);
    let loaded = load_at(&fs, "boot-1", t0());
    assert_eq!(loaded.origin, Origin::Restored { version: 2 });
    assert_eq!(loaded.state, state, "nothing lost");
}

/// An allocation's network (issue 27, defect 8) is kept across a save and a load; a file
/// without it (the previous release's, or one it wrote back after a rollback) reads as an
/// unknown network, which no GC frees; and the previous release reads a file that has it.
#[test]
fn the_network_is_kept_and_a_file_without_it_reads_as_unknown() {
    use crate::state::format_prev as prev;
    const FILE: &str = r#"{"version":2,"minReaderVersion":1,"allocations":[
      {"containerID":"c1","ifname":"eth0","podUID":"00000000-0000-0000-0000-000000000001",
       "namespace":"default","pod":"web-1","addresses":["10.0.0.1"],"since":1700000000000,
       "bootID":"boot-1","network":"pods"},
      {"containerID":"c2","ifname":"eth0","podUID":"00000000-0000-0000-0000-000000000002",
       "namespace":"default","pod":"web-2","addresses":["10.0.0.2"],"since":1700000000000,
       "bootID":"boot-1"}]}"#;
    let network = |s: &NodeState, c: &str| s.get(&AllocKey::new(c, "eth0")).expect(c).network;
    let loaded = || {
        let fs = RecordingFs::new();
        fs.put(ckpt(), FILE);
        load_at(&fs, "boot-1", t0()).state
    };
    let mut state = loaded();
    assert_eq!(network(&state, "c1").as_deref(), Some("pods"));
    assert_eq!(
        network(&state, "c2"),
        None,
        "no network in the file: unknown"
    );
    assert!(state.gc("pods", &[], t0()));
    assert_eq!(
        keys(&state),
        ["c2"],
        "a GC of pods frees c1, not the unknown c2"
    );

    let mut state = loaded();
    let fs = RecordingFs::new();
    state.save(&fs, dir()).expect("save");
    let bytes = fs.get(&ckpt()).expect("saved");
    assert_eq!(
        load_at(&fs, "boot-1", t0()).state,
        state,
        "kept across save and load"
    );

    let read = prev::read(&bytes).expect("the previous release reads it");
    assert_eq!(read.allocations.len(), 2);
    let fs = RecordingFs::new();
    fs.put(
        ckpt(),
        serde_json::to_vec(&read).expect("the previous release writes it"),
    );
    let back = load_at(&fs, "boot-1", t0()).state;
    assert_eq!(
        network(&back, "c1"),
        None,
        "lost by the previous release: unknown"
    );
    assert_eq!(keys(&back), keys(&state));
}
