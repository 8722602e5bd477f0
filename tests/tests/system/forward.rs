//! A TCP forwarder from a node's network namespace to the host's loopback (issue 16): an
//! agent runs inside its node's namespace (so `--node-routes` acts there), while the
//! in-process API server listens on the host's 127.0.0.1 only. Nothing is added to the
//! host's namespace: the listener is bound on the node's own `lo`.
//!
//! A socket keeps the network namespace it was created in, so only the listener is made on
//! a short-lived thread that entered the node's namespace (`setns` changes the calling
//! thread's namespace only, and threads it spawns inherit it); accepting, connecting to
//! the server and copying run on threads of the test's (host) namespace.
//! Hand-rolled: a few lines of std, where a proxy crate would bring its own runtime.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The open connections' streams (clones), by connection number.
type Open = Mutex<BTreeMap<u64, Vec<TcpStream>>>;

/// How often the accept loop looks at its stop flag.
const POLL: Duration = Duration::from_millis(20);

/// Forwards `127.0.0.1:<port>` in a node's namespace to `target` in the host's; dropping it
/// stops accepting, cuts every open connection and joins its threads.
pub struct Forwarder {
    /// The listener's port (in the node's namespace).
    pub port: u16,
    stop: Arc<AtomicBool>,
    /// Both ends of every open connection (by a number), to cut them when dropped.
    open: Arc<Open>,
    accept: Option<JoinHandle<()>>,
}

impl Forwarder {
    /// Listens on 127.0.0.1 (an ephemeral port) in the namespace at `netns` (e.g.
    /// `/var/run/netns/<name>`, its `lo` up) and forwards every connection to `target`.
    pub fn start(netns: &Path, target: SocketAddr) -> Forwarder {
        let listener = listen_in(netns);
        let port = listener
            .local_addr()
            .expect("the forwarder's address")
            .port();
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Open::default());
        let accept = {
            let (stop, open) = (stop.clone(), open.clone());
            std::thread::Builder::new()
                .name(format!("forward-{port}"))
                .spawn(move || accept_loop(listener, target, &stop, &open))
                .expect("the forwarder's thread")
        };
        Forwarder {
            port,
            stop,
            open,
            accept: Some(accept),
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for s in std::mem::take(&mut *self.open.lock().expect("lock"))
            .into_values()
            .flatten()
        {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// The listener, made on a thread that entered `netns` (the caller's stays where it is).
fn listen_in(netns: &Path) -> TcpListener {
    let ns = File::open(netns).unwrap_or_else(|e| panic!("open {}: {e}", netns.display()));
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        TcpListener::bind("127.0.0.1:0").expect("bind in the node's namespace")
    })
    .join()
    .expect("the listener's thread")
}

/// Accepts until `stop`; each connection is served on threads of its own (of this
/// thread's namespace: the host's, where `target` is reached).
fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    stop: &Arc<AtomicBool>,
    open: &Arc<Open>,
) {
    let mut pipes = Vec::new();
    let mut next = 0u64;
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                let (stop, open) = (stop.clone(), open.clone());
                next += 1;
                let id = next;
                pipes.push(std::thread::spawn(move || {
                    pipe(client, target, &stop, &open, id)
                }));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("the forwarder's accept: {e}"),
        }
        pipes.retain(|p: &JoinHandle<()>| !p.is_finished());
    }
    drop(listener);
    for p in pipes {
        let _ = p.join();
    }
}

/// Connects to `target` and copies both ways until either side closes or `stop`. The
/// streams are registered in `open` under its lock and `stop` is read after: either the
/// drop's drain (which follows the flag) cuts them, or this sees the flag and cuts them.
fn pipe(client: TcpStream, target: SocketAddr, stop: &AtomicBool, open: &Open, id: u64) {
    let _ = client.set_nonblocking(false);
    let Ok(server) = TcpStream::connect(target) else {
        // the server is gone (the test is ending): the client sees its connection closed
        return;
    };
    let clones = (client.try_clone(), server.try_clone());
    let (Ok(client_back), Ok(server_back)) = clones else {
        return;
    };
    let ends = [&client, &server]
        .into_iter()
        .filter_map(|s| s.try_clone().ok())
        .collect();
    open.lock().expect("lock").insert(id, ends);
    if stop.load(Ordering::SeqCst) {
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
    }
    let up = std::thread::spawn(move || copy(client, server));
    copy(server_back, client_back);
    let _ = up.join();
    open.lock().expect("lock").remove(&id);
}

/// Copies `from` to `to`, then closes `to`'s writing half (the other side sees EOF).
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}
