//! One agent per node: an exclusive, non-blocking lock on a file in `--state-dir`.
//!
//! A DaemonSet surge (a new agent pod starting while the old one still runs) or an old
//! agent stuck terminating must not give two agents one checkpoint: each would hand out
//! addresses the other does not know about. `flock(2)` (std's `File::try_lock`) is released
//! by the kernel when the holder dies, even by kill -9, so a crashed agent never blocks its
//! successor; and it is per open file, so two opens in one process conflict too (the tests
//! rely on that).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::error::{Result, StateError};

/// The lock file's name in the state directory.
pub const LOCK_FILE: &str = "agent.lock";

/// The held lock; dropping it releases it.
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
    _file: File,
}

impl DirLock {
    /// Takes the lock on `dir`'s lock file, creating both if missing, without waiting: a
    /// second agent must fail at once with a message that says why, not hang in a
    /// CrashLoop nobody understands.
    pub fn acquire(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(StateError::io("create the state directory", dir))?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(StateError::io("open the lock file", &path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = holder(&mut file);
                return Err(StateError::Locked { path, holder });
            }
            Err(TryLockError::Error(source)) => return Err(StateError::Lock { path, source }),
        }
        // who holds it, for the next agent's error message (best effort: the lock is what
        // counts, not this text)
        let _ = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()));
        Ok(DirLock { path, _file: file })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// " (pid N)" as the holder wrote it, or nothing.
fn holder(file: &mut File) -> String {
    let mut s = String::new();
    match file.read_to_string(&mut s) {
        Ok(_) => match s.trim().parse::<u32>() {
            Ok(pid) => format!(" (pid {pid})"),
            Err(_) => String::new(),
        },
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::test_dir::TestDir;

    #[test]
    fn a_second_lock_on_the_same_dir_fails_and_names_the_path() {
        let d = TestDir::new("lock");
        let first = DirLock::acquire(d.path()).expect("first lock");
        let err = DirLock::acquire(d.path()).expect_err("second lock");
        let msg = err.to_string();
        assert!(matches!(err, StateError::Locked { .. }), "{err:?}");
        assert!(
            msg.contains(&d.path().join(LOCK_FILE).display().to_string()),
            "{msg}"
        );
        assert!(
            msg.contains("another tidepool-agent holds the lock"),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        // the lock lives as long as its value
        drop(first);
        DirLock::acquire(d.path()).expect("lock after release");
    }

    #[test]
    fn a_missing_state_dir_is_created() {
        let d = TestDir::new("lock-mkdir");
        let sub = d.path().join("a/b");
        let l = DirLock::acquire(&sub).expect("lock");
        assert!(l.path().exists());
    }
}
