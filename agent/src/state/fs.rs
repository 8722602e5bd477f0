//! The few filesystem operations the state needs, behind a trait.
//!
//! Why a trait: a kill -9 never loses the page cache, so crash tests alone cannot show that
//! a checkpoint is durable. Every save goes through [`Fs`], and [`super::RecordingFs`]
//! records the calls and models what a power loss keeps, so the tests check the order
//! write → fsync(file) → rename → fsync(dir) and inject a failure at each step.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A file being written.
pub trait FsFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// fsync: the file's data is on disk when this returns (its name is not, see
    /// [`Fs::sync_dir`]).
    fn sync(&mut self) -> io::Result<()>;
}

/// The filesystem as the node state uses it.
pub trait Fs: Send + Sync {
    /// Creates `path` (or truncates it), for writing; mode 0600: the checkpoint names the
    /// node's pods.
    fn create(&self, path: &Path) -> io::Result<Box<dyn FsFile + '_>>;
    /// Atomically replaces `to` with `from` (rename(2)).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// fsync of a directory: the names created, renamed or removed in it are on disk.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// A whole file; `ErrorKind::NotFound` when it does not exist.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// The paths of a directory's entries, in no order; `ErrorKind::NotFound` when it does
    /// not exist.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
}

/// The real filesystem (std).
#[derive(Debug, Default, Clone, Copy)]
pub struct StdFs;

struct StdFile(File);

impl FsFile for StdFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.0.sync_all()
    }
}

impl Fs for StdFs {
    fn create(&self, path: &Path) -> io::Result<Box<dyn FsFile + '_>> {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        Ok(Box::new(StdFile(f)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        // Linux fsyncs a directory opened read-only
        File::open(dir)?.sync_all()
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.path()))
            .collect()
    }
}
