//! An in-memory [`Fs`] for tests: it records every call, fails the call a test names, and
//! models what survives a power loss — a file's data only once it was fsynced, a name
//! (created, renamed, removed) only once its directory was fsynced. [`RecordingFs::crash`]
//! drops everything else, which a kill -9 of a real process never does.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::fs::{Fs, FsFile};

/// One call, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Create(PathBuf),
    Write(PathBuf),
    SyncFile(PathBuf),
    Rename(PathBuf, PathBuf),
    SyncDir(PathBuf),
    Read(PathBuf),
    Remove(PathBuf),
    List(PathBuf),
    /// Not a filesystem call: an event a test puts in the same log ([`RecordingFs::mark`]),
    /// such as the moment a reply reached the client, to check what came before it.
    Mark(String),
}

/// The kind of a call, to name the one that should fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    Create,
    Write,
    SyncFile,
    Rename,
    SyncDir,
    Read,
    Remove,
    List,
    Mark,
}

impl Op {
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Create(_) => OpKind::Create,
            Op::Write(_) => OpKind::Write,
            Op::SyncFile(_) => OpKind::SyncFile,
            Op::Rename(..) => OpKind::Rename,
            Op::SyncDir(_) => OpKind::SyncDir,
            Op::Read(_) => OpKind::Read,
            Op::Remove(_) => OpKind::Remove,
            Op::List(_) => OpKind::List,
            Op::Mark(_) => OpKind::Mark,
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Inode {
    /// What a reader sees (the page cache).
    data: Vec<u8>,
    /// What a power loss keeps.
    durable: Vec<u8>,
}

#[derive(Debug, Default)]
struct Inner {
    ops: Vec<Op>,
    fail: Vec<OpKind>,
    /// Names a reader sees.
    names: BTreeMap<PathBuf, u64>,
    /// Names a power loss keeps.
    durable_names: BTreeMap<PathBuf, u64>,
    inodes: HashMap<u64, Inode>,
    next_inode: u64,
}

impl Inner {
    /// Records `op`; fails it if a test asked for a failure of its kind.
    fn call(&mut self, op: Op) -> io::Result<()> {
        let kind = op.kind();
        self.ops.push(op);
        match self.fail.iter().position(|k| *k == kind) {
            Some(i) => {
                self.fail.remove(i);
                Err(io::Error::other(format!("injected failure of {kind:?}")))
            }
            None => Ok(()),
        }
    }

    fn inode(&mut self, path: &Path) -> io::Result<&mut Inode> {
        let ino = self.names.get(path).ok_or_else(|| not_found(path))?;
        self.inodes.get_mut(ino).ok_or_else(|| not_found(path))
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{}", path.display()))
}

/// See the module doc. Clones share one filesystem.
#[derive(Debug, Default, Clone)]
pub struct RecordingFs {
    inner: Arc<Mutex<Inner>>,
}

impl RecordingFs {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The calls so far.
    pub fn ops(&self) -> Vec<Op> {
        self.lock().ops.clone()
    }

    /// The calls so far, forgetting them.
    pub fn take_ops(&self) -> Vec<Op> {
        std::mem::take(&mut self.lock().ops)
    }

    /// Puts `event` in the log, in order with the calls (it never fails).
    pub fn mark(&self, event: impl Into<String>) {
        self.lock().ops.push(Op::Mark(event.into()));
    }

    /// The next call of `kind` fails (once; call again for more).
    pub fn fail_next(&self, kind: OpKind) {
        self.lock().fail.push(kind);
    }

    /// A file as if written and synced long ago (name and data durable), not recorded.
    pub fn put(&self, path: impl Into<PathBuf>, data: impl Into<Vec<u8>>) {
        let mut g = self.lock();
        let data = data.into();
        let ino = g.next_inode;
        g.next_inode += 1;
        g.inodes.insert(
            ino,
            Inode {
                durable: data.clone(),
                data,
            },
        );
        let path = path.into();
        g.names.insert(path.clone(), ino);
        g.durable_names.insert(path, ino);
    }

    /// A file's contents as a reader sees them, not recorded.
    pub fn get(&self, path: &Path) -> Option<Vec<u8>> {
        let g = self.lock();
        let ino = g.names.get(path)?;
        g.inodes.get(ino).map(|i| i.data.clone())
    }

    /// A file's contents as a power loss would leave them (its name and data fsynced), not
    /// recorded.
    pub fn durable(&self, path: &Path) -> Option<Vec<u8>> {
        let g = self.lock();
        let ino = g.durable_names.get(path)?;
        g.inodes.get(ino).map(|i| i.durable.clone())
    }

    /// The paths a reader sees, in order.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.lock().names.keys().cloned().collect()
    }

    /// A power loss: only what was fsynced stays.
    pub fn crash(&self) {
        let mut g = self.lock();
        g.names = g.durable_names.clone();
        let live: std::collections::HashSet<u64> = g.names.values().copied().collect();
        g.inodes.retain(|ino, _| live.contains(ino));
        for i in g.inodes.values_mut() {
            i.data = i.durable.clone();
        }
    }
}

struct MemFile {
    fs: RecordingFs,
    path: PathBuf,
}

impl FsFile for MemFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut g = self.fs.lock();
        let failed = g.call(Op::Write(self.path.clone()));
        // a failed write may have written part of the buffer (a torn write)
        let n = if failed.is_ok() {
            buf.len()
        } else {
            buf.len() / 2
        };
        g.inode(&self.path)?.data.extend_from_slice(&buf[..n]);
        failed
    }

    fn sync(&mut self) -> io::Result<()> {
        let mut g = self.fs.lock();
        g.call(Op::SyncFile(self.path.clone()))?;
        let i = g.inode(&self.path)?;
        i.durable = i.data.clone();
        Ok(())
    }
}

impl Fs for RecordingFs {
    fn create(&self, path: &Path) -> io::Result<Box<dyn FsFile + '_>> {
        let mut g = self.lock();
        g.call(Op::Create(path.to_owned()))?;
        if let Ok(i) = g.inode(path) {
            i.data.clear();
        } else {
            let ino = g.next_inode;
            g.next_inode += 1;
            g.inodes.insert(ino, Inode::default());
            g.names.insert(path.to_owned(), ino);
        }
        Ok(Box::new(MemFile {
            fs: self.clone(),
            path: path.to_owned(),
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut g = self.lock();
        g.call(Op::Rename(from.to_owned(), to.to_owned()))?;
        let ino = g.names.remove(from).ok_or_else(|| not_found(from))?;
        g.names.insert(to.to_owned(), ino);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut g = self.lock();
        g.call(Op::SyncDir(dir.to_owned()))?;
        let in_dir = |p: &Path| p.parent() == Some(dir);
        g.durable_names.retain(|p, _| !in_dir(p));
        let names: Vec<(PathBuf, u64)> = g
            .names
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        g.durable_names.extend(names);
        Ok(())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut g = self.lock();
        g.call(Op::Read(path.to_owned()))?;
        Ok(g.inode(path)?.data.clone())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut g = self.lock();
        g.call(Op::Remove(path.to_owned()))?;
        g.names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut g = self.lock();
        g.call(Op::List(dir.to_owned()))?;
        let entries: Vec<PathBuf> = g
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .cloned()
            .collect();
        if entries.is_empty() {
            // a directory exists here only while it holds a file
            return Err(not_found(dir));
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model is what makes the durability tests mean something: a rename whose
    /// directory was not fsynced, or a file not fsynced, is gone after a crash.
    #[test]
    fn a_crash_keeps_only_what_was_fsynced() {
        let fs = RecordingFs::new();
        let dir = Path::new("/d");
        fs.put("/d/old", "old");

        let mut f = fs.create(Path::new("/d/a")).expect("create");
        f.write_all(b"a").expect("write");
        drop(f);
        let mut f = fs.create(Path::new("/d/b")).expect("create");
        f.write_all(b"b").expect("write");
        f.sync().expect("sync");
        drop(f);
        fs.rename(Path::new("/d/b"), Path::new("/d/old"))
            .expect("rename");
        assert_eq!(fs.get(Path::new("/d/old")), Some(b"b".to_vec()));

        fs.crash();
        // neither the new file nor the rename reached the disk
        assert_eq!(fs.get(Path::new("/d/a")), None);
        assert_eq!(fs.get(Path::new("/d/old")), Some(b"old".to_vec()));

        let mut f = fs.create(Path::new("/d/c")).expect("create");
        f.write_all(b"c").expect("write");
        drop(f);
        fs.sync_dir(dir).expect("sync dir");
        fs.crash();
        // the name survived, its unsynced data did not
        assert_eq!(fs.get(Path::new("/d/c")), Some(Vec::new()));
    }

    #[test]
    fn an_injected_failure_fails_one_call_and_is_recorded() {
        let fs = RecordingFs::new();
        fs.put("/d/x", "x");
        fs.fail_next(OpKind::Read);
        assert!(fs.read(Path::new("/d/x")).is_err());
        assert_eq!(fs.read(Path::new("/d/x")).expect("read"), b"x");
        assert_eq!(
            fs.ops(),
            vec![Op::Read("/d/x".into()), Op::Read("/d/x".into())]
        );
    }
}
