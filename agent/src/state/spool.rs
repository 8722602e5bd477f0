//! The DEL spool, the agent's side: DELs the plugin recorded while the agent was down
//! (aws#2487: a DEL that fails while the agent is down leaves pods stuck Terminating, so the
//! plugin spools it and succeeds).
//!
//! The plugin's format (`cni::proto`, "The DEL spool"): one file per (containerID, ifname),
//! `<containerID>@<ifname>.json` percent-encoded, written durably through a temp file whose
//! name starts with `.` and ends with `.tmp` (skipped here), holding
//! `{"spoolVersion":1,"spooledAtMs":…,"del":{…the del request body…}}`.
//!
//! The agent replays each DEL (keyed and stale-safe, as a live one; an allocation made after
//! the DEL was spooled is not its own and stays), at start and whenever the spool holds a
//! file while it serves ([`spooled`] lists them), saves its checkpoint,
//! and only then calls [`SpooledDel::remove`]: a crash in between replays the DEL again, which is
//! harmless because DEL is idempotent.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Deserialize;
use serde_json::Value;

use super::error::{Result, StateError};
use super::format::from_ms;
use super::fs::Fs;
use super::model::AllocKey;

/// The spool format this agent reads.
pub const SPOOL_VERSION: u64 = 1;

/// One spooled DEL.
#[derive(Debug, Clone, PartialEq)]
pub struct SpooledDel {
    /// Its file (for [`SpooledDel::remove`]).
    pub path: PathBuf,
    pub key: AllocKey,
    /// `podUID` as the runtime gave it, if it did (the agent parses it as it would a live
    /// DEL's: one that is not a UUID matches no owner and frees nothing).
    pub pod_uid: Option<String>,
    pub spooled_at: SystemTime,
    /// The del request body as the plugin would have sent it.
    pub request: Value,
}

/// A spool file that cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    pub path: PathBuf,
    pub error: String,
}

/// What [`drain_spool`] found.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Drained {
    /// In the order they were spooled (then by file name).
    pub dels: Vec<SpooledDel>,
    /// Files to report: leaving them costs a read at each start; removing one loses its DEL
    /// (reconcile finds the leak later).
    pub unreadable: Vec<Unreadable>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpoolFile {
    spool_version: u64,
    spooled_at_ms: u64,
    del: Value,
}

#[derive(Deserialize)]
struct DelBody {
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
    #[serde(rename = "podUID", default)]
    pod_uid: Option<String>,
}

/// The spool files in `dir` (none if it does not exist): one listing, nothing read. The
/// plugin's temp files, and anything else not named as a spool entry, are left out.
pub fn spooled(fs: &dyn Fs, dir: &Path) -> Result<Vec<PathBuf>> {
    let paths = match fs.list(dir) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StateError::io("list the DEL spool", dir)(e)),
    };
    let is_entry = |p: &PathBuf| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| !n.starts_with('.') && n.ends_with(".json"))
    };
    Ok(paths.into_iter().filter(is_entry).collect())
}

/// Reads every spooled DEL in `dir` (none if it does not exist), oldest first. Reads only;
/// see the module doc for when to [`SpooledDel::remove`].
pub fn drain_spool(fs: &dyn Fs, dir: &Path) -> Result<Drained> {
    let mut out = Drained::default();
    for path in spooled(fs, dir)? {
        let bytes = match fs.read(&path) {
            Ok(b) => b,
            // removed since the listing: nothing to replay
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(StateError::io("read", &path)(e)),
        };
        match parse(&bytes, path.clone()) {
            Ok(d) => out.dels.push(d),
            Err(error) => out.unreadable.push(Unreadable { path, error }),
        }
    }
    out.dels
        .sort_by(|a, b| (a.spooled_at, &a.path).cmp(&(b.spooled_at, &b.path)));
    Ok(out)
}

fn parse(bytes: &[u8], path: PathBuf) -> Result<SpooledDel, String> {
    let file: SpoolFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if file.spool_version != SPOOL_VERSION {
        return Err(format!(
            "spool format {} (this agent reads {SPOOL_VERSION})",
            file.spool_version
        ));
    }
    let body = DelBody::deserialize(&file.del).map_err(|e| format!("del: {e}"))?;
    if body.container_id.is_empty() || body.ifname.is_empty() {
        return Err("del: empty containerID or ifname".to_owned());
    }
    Ok(SpooledDel {
        path,
        key: AllocKey::new(body.container_id, body.ifname),
        pod_uid: body.pod_uid,
        spooled_at: from_ms(file.spooled_at_ms),
        request: file.del,
    })
}

impl SpooledDel {
    /// Removes this DEL's file — after its result was saved. A file already gone is fine;
    /// a removal lost to a crash only replays an idempotent DEL, so it is not fsynced.
    pub fn remove(&self, fs: &dyn Fs) -> Result<()> {
        match fs.remove(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StateError::io("remove the spooled DEL", &self.path)(e))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
#[path = "spool_tests.rs"]
mod tests;
