use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tidepool_ipam::PodUid;

use super::*;
use crate::state::test_dir::TestDir;
use crate::state::{DelOutcome, NodeState, PodRef, RecordingFs, StdFs, parse_pod_uid};

const SPOOL: &str = "/var/lib/tidepool/spool";
const UID1: &str = "00000000-0000-0000-0000-000000000001";

fn entry(cid: &str, uid: Option<&str>, at_ms: u64) -> String {
    let uid = uid.map_or("null".to_owned(), |u| format!("\"{u}\""));
    format!(
        r#"{{"spoolVersion":1,"spooledAtMs":{at_ms},"del":{{"containerID":"{cid}","ifname":"eth0",
        "netns":null,"podNamespace":"default","podName":"web","podUID":{uid},
        "cniVersion":"1.1.0","config":{{"type":"tidepool-cni"}}}}}}"#
    )
}

fn path(name: &str) -> PathBuf {
    Path::new(SPOOL).join(name)
}

#[test]
fn spooled_dels_are_read_oldest_first_and_temp_files_skipped() {
    let fs = RecordingFs::new();
    fs.put(path("c3@eth0.json"), entry("c3", Some(UID1), 3_000));
    fs.put(path("c1@eth0.json"), entry("c1", None, 1_000));
    fs.put(path("c2@eth0.json"), entry("c2", Some(UID1), 2_000));
    fs.put(path("b@eth0.json"), entry("b", None, 2_000));
    // the plugin's write in progress, and a stranger
    fs.put(path(".c4@eth0.json.tmp"), "{\"spoolV");
    fs.put(path("README"), "not a DEL");

    let mut listed = spooled(&fs, Path::new(SPOOL)).expect("list");
    listed.sort();
    let names = [
        "b@eth0.json",
        "c1@eth0.json",
        "c2@eth0.json",
        "c3@eth0.json",
    ];
    assert_eq!(listed, names.map(path), "the entries, nothing else");
    let d = drain_spool(&fs, Path::new(SPOOL)).expect("drain");
    let order: Vec<&str> = d.dels.iter().map(|e| e.key.container_id.as_str()).collect();
    assert_eq!(order, vec!["c1", "b", "c2", "c3"]);
    assert!(d.unreadable.is_empty());
    let c2 = &d.dels[2];
    assert_eq!(
        (c2.key.ifname.as_str(), c2.pod_uid.as_deref()),
        ("eth0", Some(UID1))
    );
    assert_eq!(c2.spooled_at, UNIX_EPOCH + Duration::from_secs(2));
    assert_eq!(c2.path, path("c2@eth0.json"));
    assert_eq!(c2.request["podName"], "web");
    assert_eq!(d.dels[0].pod_uid, None);
}

#[test]
fn a_missing_spool_dir_is_empty_and_bad_files_are_reported() {
    let fs = RecordingFs::new();
    assert_eq!(
        drain_spool(&fs, Path::new(SPOOL)).expect("none"),
        Drained::default()
    );
    assert!(spooled(&fs, Path::new(SPOOL)).expect("none").is_empty());

    fs.put(path("a@eth0.json"), "{not json");
    fs.put(
        path("b@eth0.json"),
        r#"{"spoolVersion":2,"spooledAtMs":1,"del":{}}"#,
    );
    fs.put(
        path("c@eth0.json"),
        r#"{"spoolVersion":1,"spooledAtMs":1,"del":{"ifname":"x"}}"#,
    );
    fs.put(path("d@eth0.json"), entry("", None, 1));
    fs.put(path("e@eth0.json"), entry("e", None, 1));
    let d = drain_spool(&fs, Path::new(SPOOL)).expect("drain");
    assert_eq!(d.dels.len(), 1);
    let why: Vec<&str> = d.unreadable.iter().map(|u| u.error.as_str()).collect();
    assert_eq!(why.len(), 4, "{why:?}");
    assert!(why[0].contains("key must be a string"), "{why:?}");
    assert!(why[1].contains("spool format 2"), "{why:?}");
    assert!(why[2].contains("containerID"), "{why:?}");
    assert!(why[3].contains("empty containerID"), "{why:?}");
}

/// The replay protocol: apply the DEL, save, then remove the file. A crash before the
/// removal replays the DEL again, which frees nothing more (DEL is idempotent); a spooled
/// DEL naming another pod frees nothing (stale-safe, as a live one).
#[test]
fn a_replayed_del_is_removed_only_after_the_save_and_replays_safely() {
    let fs = RecordingFs::new();
    let dir = Path::new("/var/lib/tidepool");
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut s = NodeState::new("boot-1", Duration::from_secs(30));
    let pod = |n: u128| PodRef {
        uid: PodUid(n),
        namespace: "default".into(),
        name: "web".into(),
    };
    for (c, n, a) in [("c1", 1, "10.0.0.1"), ("c2", 1, "10.0.0.2")] {
        let addr = a.parse().expect("ip");
        s.adopt_allocation(AllocKey::new(c, "eth0"), pod(n), &[addr], None, t)
            .expect("add");
    }
    s.save(&fs, dir).expect("save");
    fs.put(path("c1@eth0.json"), entry("c1", Some(UID1), 1));
    let other = "00000000-0000-0000-0000-000000000009";
    fs.put(path("c2@eth0.json"), entry("c2", Some(other), 2));

    let replay = |s: &mut NodeState| -> Vec<DelOutcome> {
        let d = drain_spool(&fs, Path::new(SPOOL)).expect("drain");
        d.dels
            .iter()
            .map(|e| {
                let uid = e.pod_uid.as_deref().map(parse_pod_uid).transpose();
                s.del(&e.key, uid.expect("a UUID"), t)
            })
            .collect()
    };
    let first = replay(&mut s);
    assert_eq!(first[0].freed().len(), 1);
    assert_eq!(first[1], DelOutcome::Stale { owner: PodUid(1) });
    s.save(&fs, dir).expect("save");
    // a crash here, before the removal: the DELs come back and change nothing
    fs.crash();
    let loaded = crate::state::checkpoint::load(&fs, dir, "boot-1", t, Duration::from_secs(30));
    let mut s = loaded.expect("load").state;
    assert!(
        s.get(&AllocKey::new("c1", "eth0")).is_none(),
        "the first replay was saved"
    );
    let again = replay(&mut s);
    assert_eq!(again[0], DelOutcome::Unknown);
    assert_eq!(again[1], DelOutcome::Stale { owner: PodUid(1) });

    for e in drain_spool(&fs, Path::new(SPOOL)).expect("drain").dels {
        e.remove(&fs).expect("remove");
        e.remove(&fs).expect("a second removal is fine");
    }
    assert_eq!(
        drain_spool(&fs, Path::new(SPOOL)).expect("drain"),
        Drained::default()
    );
}

#[test]
fn the_spool_is_read_from_disk() {
    let d = TestDir::new("spool");
    std::fs::write(d.path().join("c1@eth0.json"), entry("c1", None, 5)).expect("write");
    let drained = drain_spool(&StdFs, d.path()).expect("drain");
    assert_eq!(drained.dels.len(), 1);
    drained.dels[0].remove(&StdFs).expect("remove");
    assert!(
        drain_spool(&StdFs, d.path())
            .expect("drain")
            .dels
            .is_empty()
    );
}
