//! The DEL spool: where a DEL waits, durably, while the agent is down.
//!
//! CNI requires DEL to succeed (a failing DEL leaves pods stuck Terminating: aws-vpc-cni#2487),
//! and a DEL that is lost leaks the address until reconcile finds positive evidence. So the
//! plugin records it on disk and the agent replays it (format: `proto.rs`, "The DEL spool").
//!
//! Durable means: on disk before the plugin reports success, and never half-written. The record
//! goes to a temp file that is fsynced, renamed over the final name (atomic), and then the
//! directory is fsynced so the rename itself survives a power cut.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// File names stay well under the 255-byte limit of common filesystems; longer keys are
/// shortened and made unique by a hash.
const MAX_NAME: usize = 200;

/// The spool file name for (containerID, ifname): both parts percent-encoded (only
/// `[A-Za-z0-9_.-]` stay as they are), joined by `@` (which the encoding never leaves in a part,
/// so distinct keys never share a name), with `.json` appended. The name never starts with `.`
/// (the container ID starts alphanumeric; temp files do start with `.`).
pub fn file_name(container_id: &str, ifname: &str) -> String {
    let name = format!("{}@{}.json", encode(container_id), encode(ifname));
    if name.len() <= MAX_NAME {
        return name;
    }
    let key_hash = fnv1a64(format!("{container_id}\0{ifname}").as_bytes());
    let mut prefix = encode(container_id);
    // `encode` leaves only ASCII, so any length is a char boundary.
    prefix.truncate(MAX_NAME - 30);
    format!("{prefix}~{key_hash:016x}.json")
}

/// Writes `contents` as the spool file for (container_id, ifname) in `dir`, durably, replacing
/// an earlier one. Creates `dir` (mode 0700) if needed. Returns the file's path.
pub fn write(dir: &Path, container_id: &str, ifname: &str, contents: &str) -> io::Result<PathBuf> {
    ensure_dir(dir)?;
    let name = file_name(container_id, ifname);
    let path = dir.join(&name);
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = write_synced(&tmp, contents.as_bytes()).and_then(|()| fs::rename(&tmp, &path));
    if let Err(e) = written {
        // Best effort: a leftover temp file is ignored by the agent and replaced by the next try.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir)?;
    Ok(path)
}

/// Creates the spool directory if it is missing; a new directory's entry in its parent is made
/// durable too, or the first spooled DEL could vanish with it.
fn ensure_dir(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => Ok(()),
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    // A temp file left by a killed plugin with the same pid would make create_new fail.
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// FNV-1a, 64 bits: stable across versions and platforms, which `DefaultHasher` is not.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn names_are_readable_and_never_collide() {
        assert_eq!(file_name("3f2a9c", "eth0"), "3f2a9c@eth0.json");
        assert_eq!(file_name("a_b", "c"), "a_b@c.json");
        assert_ne!(file_name("a@b", "c"), file_name("a", "b@c"));
        assert_eq!(file_name("a", "b@c"), "a@b%40c.json");
        assert_eq!(file_name("x", "é/"), "x@%C3%A9%2F.json");
        let long = "c".repeat(300);
        let name = file_name(&long, "eth0");
        assert!(name.len() <= MAX_NAME, "{name}");
        assert!(name.ends_with(".json") && name.contains('~'));
        assert_ne!(name, file_name(&long, "eth1"));
        assert_eq!(name, file_name(&long, "eth0"));
    }

    #[test]
    fn write_creates_the_dir_and_replaces_the_file_leaving_no_temp_files() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("var/spool");
        let path = write(&dir, "c1", "eth0", r#"{"n":1}"#).expect("first");
        assert_eq!(path, dir.join("c1@eth0.json"));
        assert_eq!(fs::read_to_string(&path).expect("read"), r#"{"n":1}"#);
        write(&dir, "c1", "eth0", r#"{"n":2}"#).expect("second");
        assert_eq!(fs::read_to_string(&path).expect("read"), r#"{"n":2}"#);
        let names: Vec<_> = fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        assert_eq!(names, ["c1@eth0.json"]);
        let mode = |p: &Path| fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir), 0o700);
    }

    #[test]
    fn a_stale_temp_file_of_the_same_pid_is_replaced() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let stale = tmp
            .path()
            .join(format!(".c1@eth0.json.{}.tmp", std::process::id()));
        fs::write(&stale, "half").expect("stale");
        write(tmp.path(), "c1", "eth0", "{}").expect("write");
        assert!(!stale.exists());
        assert_eq!(
            fs::read_to_string(tmp.path().join("c1@eth0.json")).expect("read"),
            "{}"
        );
    }

    #[test]
    fn an_unwritable_spool_is_an_error_not_a_silent_success() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("not-a-dir");
        fs::write(&file, "").expect("file");
        assert!(write(&file, "c1", "eth0", "{}").is_err());
    }
}
