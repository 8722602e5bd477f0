//! Saving and loading the checkpoint.
//!
//! A save is temp file → write → fsync(file) → rename over the checkpoint → fsync(dir):
//! until the rename the old checkpoint is untouched, the rename swaps whole files, and only
//! the directory fsync makes the swap survive a power loss — so a crash or a failure at any
//! step leaves one complete checkpoint, the old or the new. The agent replies only after
//! a save returned `Ok`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::error::{Result, StateError};
use super::format::{self, CheckpointFile, FORMAT_VERSION, Header, readable};
use super::fs::Fs;
use super::model::{AllocKey, Allocation, NodeState};

/// The checkpoint's name in the state directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";
/// Where a save writes before the rename (one writer: the lock).
pub const TEMP_FILE: &str = "checkpoint.json.tmp";
/// A corrupt checkpoint is renamed to this prefix and the Unix time in milliseconds.
pub const CORRUPT_PREFIX: &str = "checkpoint.corrupt.";

/// Writes `state` durably; see the module doc. On an error before the rename the temp
/// file is removed (best effort) and the old checkpoint is what a reader sees; on an error
/// of the directory fsync the new one is, but it may not survive a power loss — either way
/// the caller must not reply.
pub(crate) fn save(fs: &dyn Fs, dir: &Path, state: &NodeState) -> Result<()> {
    let bytes = serde_json::to_vec(&format::encode(state)).map_err(StateError::Encode)?;
    let tmp = dir.join(TEMP_FILE);
    let path = dir.join(CHECKPOINT_FILE);
    let swapped = write_synced(fs, &tmp, &bytes).and_then(|()| {
        fs.rename(&tmp, &path)
            .map_err(StateError::io("rename the new checkpoint over", &path))
    });
    if let Err(e) = swapped {
        let _ = fs.remove(&tmp);
        return Err(e);
    }
    fs.sync_dir(dir)
        .map_err(StateError::io("fsync the state directory", dir))
}

fn write_synced(fs: &dyn Fs, path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = fs.create(path).map_err(StateError::io("create", path))?;
    f.write_all(bytes).map_err(StateError::io("write", path))?;
    f.sync().map_err(StateError::io("fsync", path))
}

/// Where the state came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// No checkpoint: the first start on this node, or its state was lost. The agent must
    /// never hand out the podIPs of live pods on the node (aws-vpc-cni#711).
    Fresh,
    /// Read from a checkpoint of this format.
    Restored { version: u32 },
    /// The checkpoint could not be parsed or trusted: it was renamed to `set_aside` and
    /// the state starts empty. The agent rebuilds it from the server's `status.used` and
    /// live pods' podIPs; nothing is freed because of it.
    Corrupt { set_aside: PathBuf, error: String },
}

/// What [`super::StateDir::load`] found.
#[derive(Debug)]
pub struct Loaded {
    pub state: NodeState,
    pub origin: Origin,
    /// Allocations of an earlier boot, freed into cooldown (and saved) by the load.
    pub expired_by_reboot: Vec<(AllocKey, Allocation)>,
}

impl Loaded {
    /// No checkpoint existed: exclude live pods' podIPs.
    pub fn fresh(&self) -> bool {
        self.origin == Origin::Fresh
    }

    /// The checkpoint was corrupt: rebuild from the server and live pods before serving.
    pub fn rebuild_needed(&self) -> bool {
        matches!(self.origin, Origin::Corrupt { .. })
    }
}

/// Reads the checkpoint in `dir` for boot `boot_id` at `now`. A file of a format this agent
/// does not read is an error (misreading it could give a held address away); a corrupt
/// one is set aside. Allocations of another boot are freed into cooldown and the result
/// saved before this returns, so nothing published later can show them as used.
pub(crate) fn load(
    fs: &dyn Fs,
    dir: &Path,
    boot_id: &str,
    now: SystemTime,
    reuse_cooldown: Duration,
) -> Result<Loaded> {
    let path = dir.join(CHECKPOINT_FILE);
    let bytes = match fs.read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Loaded {
                state: NodeState::new(boot_id, reuse_cooldown),
                origin: Origin::Fresh,
                expired_by_reboot: Vec::new(),
            });
        }
        Err(e) => return Err(StateError::io("read", &path)(e)),
    };
    let parsed = parse(&bytes, &path)?.and_then(|file| {
        let version = file.version;
        format::decode(file, boot_id, reuse_cooldown).map(|s| (s, version))
    });
    let (mut state, version) = match parsed {
        Ok(v) => v,
        Err(error) => {
            let set_aside = dir.join(format!("{CORRUPT_PREFIX}{}", format::to_ms(now)));
            fs.rename(&path, &set_aside)
                .map_err(StateError::io("set aside the corrupt checkpoint", &path))?;
            fs.sync_dir(dir)
                .map_err(StateError::io("fsync the state directory", dir))?;
            return Ok(Loaded {
                state: NodeState::new(boot_id, reuse_cooldown),
                origin: Origin::Corrupt { set_aside, error },
                expired_by_reboot: Vec::new(),
            });
        }
    };
    let expired_by_reboot = state.expire_boot(now);
    if state.is_dirty() {
        state.save(fs, dir)?;
    }
    Ok(Loaded {
        state,
        origin: Origin::Restored { version },
        expired_by_reboot,
    })
}

/// The file, `Ok(Err(why))` if it is corrupt, `Err` if its format is not one this agent
/// reads.
fn parse(bytes: &[u8], path: &Path) -> Result<Result<CheckpointFile, String>> {
    let header: Header = match serde_json::from_slice(bytes) {
        Ok(h) => h,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let min_reader = header.min_reader_version.unwrap_or(header.version);
    if !readable(header.version, min_reader, FORMAT_VERSION) {
        return Err(StateError::UnsupportedVersion {
            path: path.to_owned(),
            version: header.version,
            min_reader,
            oldest: FORMAT_VERSION - 1,
            current: FORMAT_VERSION,
        });
    }
    Ok(serde_json::from_slice(bytes).map_err(|e| e.to_string()))
}

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod tests;
