//! Issue 27, defect 5: under the 1,024-descriptor limit container runtimes give, 2,000
//! connections that send nothing, re-opened as fast as the server closes them, must not stop
//! `/healthz` from answering: it answers within 1 s in 99 of 100 probes.
//!
//! One binary (no libtest harness) plays three roles, chosen by `TIDEPOOL_FLOOD_ROLE`:
//! - unset: the test. It starts the two others as child processes, waits until the flood is
//!   on, then probes `/healthz` 100 times;
//! - `server`: `probes::serve` on a loopback port, started under `ulimit -n 1024` (checked in
//!   /proc/self/limits), until its stdin closes;
//! - `flood`: 2,000 connections to the server that send nothing, each re-opened as soon as the
//!   server closes it, under `ulimit -n 4096` (the test's own limit may be lower), until its
//!   stdin closes.
#![cfg(feature = "probes")]
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use tidepool_metrics::probes::{Readiness, serve};

const ROLE: &str = "TIDEPOOL_FLOOD_ROLE";
const SERVER_FD_LIMIT: u32 = 1024;
const FLOOD_CONNECTIONS: usize = 2000;
const PROBES: usize = 100;
const PROBE_DEADLINE: Duration = Duration::from_secs(1);

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("server") => run_server(),
        Ok("flood") => run_flood(
            std::env::args()
                .nth(1)
                .expect("flood: the server's address"),
        ),
        _ => {
            // libtest-style arguments (a filter, --list, ...) are accepted and ignored.
            print!("test healthz_answers_under_an_idle_connection_flood ... ");
            healthz_answers_under_an_idle_connection_flood();
            println!("ok");
        }
    }
}

/// The soft "Max open files" limit of this process, from /proc/self/limits.
fn open_files_limit() -> u32 {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// Blocks until stdin closes (the test ended, or died).
fn wait_for_stdin_eof() {
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

fn run_server() {
    let limit = open_files_limit();
    assert_eq!(
        limit, SERVER_FD_LIMIT,
        "the server must run under the lowered limit"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr = rt
        .block_on(serve("127.0.0.1:0".parse().unwrap(), Readiness::default()))
        .expect("bind");
    println!("listening {addr} limit {limit}");
    std::io::stdout().flush().unwrap();
    wait_for_stdin_eof();
}

fn run_flood(addr: String) {
    let addr: SocketAddr = addr.parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let (opened_tx, mut opened_rx) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..FLOOD_CONNECTIONS {
            let opened_tx = opened_tx.clone();
            tokio::spawn(idle_connection_forever(addr, opened_tx));
        }
        // "flooding" once every connection has been opened (or refused) at least once
        for _ in 0..FLOOD_CONNECTIONS {
            opened_rx.recv().await;
        }
        println!("flooding");
        std::io::stdout().flush().unwrap();
        tokio::task::spawn_blocking(wait_for_stdin_eof)
            .await
            .unwrap();
    });
    rt.shutdown_background();
}

/// Connects, sends nothing, waits for the server to close, and connects again, for ever.
async fn idle_connection_forever(addr: SocketAddr, opened: tokio::sync::mpsc::UnboundedSender<()>) {
    use tokio::io::AsyncReadExt;
    let mut first = true;
    loop {
        let stream =
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
                .await;
        if std::mem::take(&mut first) {
            let _ = opened.send(());
        }
        match stream {
            Ok(Ok(mut s)) => {
                let mut buf = [0u8; 64];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            }
            // refused, reset, timed out: again, without spinning
            _ => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
}

/// Starts this binary in `role` under `ulimit -n limit`, stdin and stdout piped.
fn spawn_role(role: &str, limit: u32, args: &[String]) -> Child {
    let exe = std::env::current_exe().unwrap();
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
        .arg(exe)
        .args(args)
        .env(ROLE, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting the {role}: {e}"))
}

/// The next line the child prints, or a panic naming `what` when it printed none.
fn line_of(out: &mut BufReader<ChildStdout>, what: &str) -> String {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(!line.is_empty(), "the {what} exited before it was up");
    line
}

/// One `GET /healthz`: whether it got a 200 within [`PROBE_DEADLINE`], and how long it took.
fn probe(addr: SocketAddr) -> (bool, Duration) {
    let start = Instant::now();
    let ok = (|| -> std::io::Result<bool> {
        let mut s = std::net::TcpStream::connect_timeout(&addr, PROBE_DEADLINE)?;
        let left = PROBE_DEADLINE.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Ok(false);
        }
        s.set_read_timeout(Some(left))?;
        s.set_write_timeout(Some(left))?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head)?;
        Ok(&head == b"HTTP/1.1 200")
    })()
    .unwrap_or(false);
    let took = start.elapsed();
    (ok && took <= PROBE_DEADLINE, took)
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn healthz_answers_under_an_idle_connection_flood() {
    let mut server = Kill(spawn_role("server", SERVER_FD_LIMIT, &[]));
    let mut out = BufReader::new(server.0.stdout.take().unwrap());
    let up = line_of(&mut out, "server");
    let addr: SocketAddr = up.split_whitespace().nth(1).unwrap().parse().unwrap();

    let mut flood = Kill(spawn_role("flood", 4096, &[addr.to_string()]));
    let mut flood_out = BufReader::new(flood.0.stdout.take().unwrap());
    assert_eq!(line_of(&mut flood_out, "flood").trim(), "flooding");
    // let the flood reach its steady state: every descriptor the server can get is taken
    std::thread::sleep(Duration::from_secs(2));

    let mut times = Vec::with_capacity(PROBES);
    let mut answered = 0;
    for _ in 0..PROBES {
        let (ok, took) = probe(addr);
        answered += usize::from(ok);
        times.push(took);
        std::thread::sleep(Duration::from_millis(20));
    }
    times.sort();
    let flood_alive = flood.0.try_wait().unwrap().is_none();
    let server_alive = server.0.try_wait().unwrap().is_none();
    println!(
        "\n  {up}  /healthz under {FLOOD_CONNECTIONS} idle connections: {answered}/{PROBES} \
         answered within {PROBE_DEADLINE:?}; median {:?}, p99 {:?}, max {:?}",
        times[PROBES / 2],
        times[PROBES * 99 / 100 - 1],
        times[PROBES - 1]
    );
    assert!(flood_alive, "the flood stopped before the probes ended");
    assert!(server_alive, "the server died under the flood");
    assert!(
        answered >= 99,
        "/healthz answered within {PROBE_DEADLINE:?} in only {answered} of {PROBES} probes"
    );
}
