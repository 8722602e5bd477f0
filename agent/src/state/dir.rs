//! The state directory (`--state-dir`): the lock, then the checkpoint.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::checkpoint::{self, Loaded};
use super::error::Result;
use super::fs::{Fs, StdFs};
use super::lock::DirLock;
use super::model::NodeState;

/// The locked state directory. Opening it takes the lock before anything else reads or
/// writes there; the lock lives as long as this value.
pub struct StateDir {
    dir: PathBuf,
    fs: Arc<dyn Fs>,
    lock: DirLock,
}

impl std::fmt::Debug for StateDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateDir")
            .field("dir", &self.dir)
            .field("lock", &self.lock)
            .finish_non_exhaustive()
    }
}

impl StateDir {
    /// Locks `dir` (created if missing) on the real filesystem. Fails at once with
    /// [`super::StateError::Locked`] if another agent holds it.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        Self::open_with(dir, Arc::new(StdFs))
    }

    /// Locks `dir` on the real filesystem, and reads and writes the checkpoint through
    /// `fs` (a test's [`super::RecordingFs`]).
    pub fn open_with(dir: impl Into<PathBuf>, fs: Arc<dyn Fs>) -> Result<Self> {
        let dir = dir.into();
        let lock = DirLock::acquire(&dir)?;
        Ok(StateDir { dir, fs, lock })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn fs(&self) -> &dyn Fs {
        &*self.fs
    }

    /// Loads the checkpoint for boot `boot_id` at `now` (see [`Loaded`]); allocations of
    /// another boot are freed into cooldown and saved before it returns.
    pub fn load(&self, boot_id: &str, now: SystemTime, reuse_cooldown: Duration) -> Result<Loaded> {
        checkpoint::load(&*self.fs, &self.dir, boot_id, now, reuse_cooldown)
    }

    /// Saves `state` durably, then marks it clean; reply or publish only after `Ok`.
    pub fn save(&self, state: &mut NodeState) -> Result<()> {
        state.save(&*self.fs, &self.dir)
    }

    /// Saves `snapshot` (a [`NodeState::snapshot`]) durably; reply or publish only after
    /// `Ok`.
    pub fn write(&self, snapshot: &NodeState) -> Result<()> {
        checkpoint::save(&*self.fs, &self.dir, snapshot)
    }
}
