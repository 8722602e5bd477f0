//! The CNI chain measured (issue 15; BENCHMARKS.md "Node agent"): per-operation latency of
//! the plugin alone (process start + socket + the agent's durable save), of the same call
//! made in the bench's own process (no process start), of `ptp` delegating to it, and of
//! `ptp` with the reference `host-local` (the anchor), so the main plugin's own time shows
//! separately; the disk's own save (write → fsync → rename → fsync(dir), the checkpoint's
//! size, next to the state dir) in the same run; then pods per second through one agent and
//! through the anchor at several concurrencies, with the agent's durable saves per mutation
//! (its group commit; counted as the checkpoint's renames, by inotify); then the
//! checkpoint's size and save cost at 250 pods. The agent is `run::run` against the
//! in-process API server, as in the chain test. Root only (network namespaces); every
//! namespace is removed at the end.
//!
//! ```text
//! sudo cargo bench -p tidepool-agent --bench chain
//! # env: CHAIN_ROUNDS (200), CHAIN_PODS (200), CHAIN_STATE=disk|tmpfs (disk)
//! ```
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tidepool_agent::state::{CHECKPOINT_FILE, StateDir, read_boot_id};

use common::chain::*;
use common::figures::{env_or, p50_p99_ms};
use common::*;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

fn row(what: &str, add: Vec<Duration>, del: Vec<Duration>) -> (f64, f64) {
    let (a50, a99) = p50_p99_ms(add);
    let (d50, d99) = p50_p99_ms(del);
    println!("| {what} | {a50:.2} / {a99:.2} ms | {d50:.2} / {d99:.2} ms |");
    (a50, d50)
}

async fn bench() {
    let rounds: usize = env_or("CHAIN_ROUNDS", 200);
    let pods: usize = env_or("CHAIN_PODS", 200);
    let tmpfs = std::env::var("CHAIN_STATE").as_deref() == Ok("tmpfs");
    let mut node = Node::new("bench", &["10.250.16.0/20"]).await;
    let shm = tempfile::tempdir_in("/dev/shm").expect("a tmpfs dir");
    if tmpfs {
        node.settings.state_dir = shm.path().join("state");
    }
    node.start_agent().await;
    println!(
        "{rounds} rounds each, state dir on {}\n",
        if tmpfs { "tmpfs" } else { "disk" }
    );
    println!("| chain | ADD p50 / p99 | DEL p50 / p99 |\n|---|---|---|");

    let alone = node.conf("ptp");
    let (add, del) = add_del_rounds(rounds, "alone", &alone, plugin).await;
    let (ipam_add, ipam_del) = row("tidepool-cni alone (start + socket + save)", add, del);
    let (add, del) = add_del_rounds(rounds, "inproc", &alone, plugin_in_process).await;
    let label = "tidepool-cni in this process (socket + save, no process start)";
    row(label, add, del);
    let checkpoint = node.settings.state_dir.join(CHECKPOINT_FILE);
    let bytes = std::fs::metadata(&checkpoint).map_or(0, |m| m.len());
    let probe = node.dir.path().join("disk-probe");
    let disk = disk_saves(&probe, usize::try_from(bytes).expect("size"), rounds);
    let (s50, s99) = p50_p99_ms(disk);
    println!(
        "| the disk's own save ({bytes} B: write → fsync → rename → fsync(dir)) | {s50:.2} / {s99:.2} ms | — |"
    );

    let pod = node.pod(0);
    let mut main_own = Vec::new();
    for main in ["ptp", "ptp+host-local"] {
        let (mut add, mut del) = (Vec::new(), Vec::new());
        for i in 0..rounds {
            let c = format!("{}-{i}", main.replace('+', "-"));
            let t = Instant::now();
            let a = node.cni(main, "ADD", &pod, &c, &pod_uid(10_000 + i)).await;
            add.push(t.elapsed());
            address(&a);
            let t = Instant::now();
            let d = node.cni(main, "DEL", &pod, &c, &pod_uid(10_000 + i)).await;
            del.push(t.elapsed());
            assert!(d.status.success(), "{d:?}");
        }
        let label = if main == "ptp" {
            "ptp → tidepool-cni"
        } else {
            "ptp → host-local (anchor)"
        };
        let (a50, d50) = row(label, add, del);
        if main == "ptp" {
            main_own.push((a50 - ipam_add, d50 - ipam_del));
        }
    }
    if let Some((a, d)) = main_own.first() {
        println!("\nptp's own part (p50 difference): ADD {a:.2} ms, DEL {d:.2} ms");
    }

    let saves = count_saves(&node.settings.state_dir);
    println!(
        "\n| concurrency | chain | {pods} pods ADD | pods/s | saves per ADD | DEL all | pods/s | saves per DEL |\n|---|---|---|---|---|---|---|---|"
    );
    let netns: Vec<String> = (1..=pods).map(|i| node.pod(i)).collect();
    let node = Arc::new(node);
    for (round, concurrency) in [1usize, 8, 32].into_iter().enumerate() {
        for main in ["ptp", "ptp+host-local"] {
            let mut cells = Vec::new();
            for cmd in ["ADD", "DEL"] {
                let before = saves.load(Ordering::SeqCst);
                let t = Instant::now();
                let sem = Arc::new(tokio::sync::Semaphore::new(concurrency));
                let calls = netns.iter().enumerate().map(|(i, p)| {
                    let (node, p, sem) = (node.clone(), p.clone(), sem.clone());
                    let c = format!("t{round}-{}-{i}", main.replace('+', "-"));
                    tokio::spawn(async move {
                        let _permit = sem.acquire().await.expect("semaphore");
                        node.cni(main, cmd, &p, &c, &pod_uid(20_000 + i)).await
                    })
                });
                for out in futures::future::join_all(calls).await {
                    let out = out.expect("join");
                    assert!(out.status.success(), "{main} {cmd}: {out:?}");
                }
                let wall = t.elapsed();
                // the last save's rename may still be on its way to the counter
                tokio::time::sleep(Duration::from_millis(50)).await;
                let saved = saves.load(Ordering::SeqCst) - before;
                let per = if main == "ptp" {
                    format!("{:.3}", saved as f64 / pods as f64)
                } else {
                    "—".into()
                };
                cells.push(format!(
                    "{:.2} s | {:.0} | {per}",
                    wall.as_secs_f64(),
                    pods as f64 / wall.as_secs_f64()
                ));
            }
            let label = if main == "ptp" {
                "ptp → tidepool-cni"
            } else {
                "ptp → host-local"
            };
            println!("| {concurrency} | {label} | {} | {} |", cells[0], cells[1]);
        }
    }
    at_250_pods(&node, &alone, &saves).await;
    let mut node = std::sync::Arc::into_inner(node).expect("the last handle");
    node.stop_agent().await;
}

/// `rounds` ADDs each followed by its DEL, each call made by `call` (the plugin as a process,
/// or in this one) on containers `{prefix}{i}`: their times.
async fn add_del_rounds(
    rounds: usize,
    prefix: &str,
    conf: &str,
    call: fn(&str, &str, &str, &str) -> Run,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut add, mut del) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        for (cmd, took) in [("ADD", &mut add), ("DEL", &mut del)] {
            let (c, conf) = (format!("{prefix}{i}"), conf.to_owned());
            let r = blocking(move || call(cmd, &c, &pod_uid(i), &conf)).await;
            assert_eq!(r.code, 0, "{cmd}: {}", r.stdout);
            took.push(r.took);
        }
    }
    (add, del)
}

/// `rounds` saves of `bytes` bytes as the agent saves its checkpoint, in `dir` (made here):
/// write a temp file, fsync it, rename it over the target, fsync the directory. Each one's
/// time.
fn disk_saves(dir: &Path, bytes: usize, rounds: usize) -> Vec<Duration> {
    use std::io::Write;
    std::fs::create_dir_all(dir).expect("probe dir");
    let (tmp, target) = (dir.join("probe.tmp"), dir.join("probe"));
    let data = vec![b'x'; bytes];
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            let mut f = std::fs::File::create(&tmp).expect("create");
            f.write_all(&data).expect("write");
            f.sync_all().expect("fsync");
            std::fs::rename(&tmp, &target).expect("rename");
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .expect("fsync dir");
            t.elapsed()
        })
        .collect()
}

/// Counts the agent's durable saves from now on: each one renames a new checkpoint into
/// `state_dir`.
fn count_saves(state_dir: &Path) -> Arc<AtomicUsize> {
    let n = Arc::new(AtomicUsize::new(0));
    let inotify = Inotify::init(InitFlags::empty()).expect("inotify");
    inotify
        .add_watch(state_dir, AddWatchFlags::IN_MOVED_TO)
        .expect("watch the state dir");
    let counter = n.clone();
    std::thread::spawn(move || {
        while let Ok(events) = inotify.read_events() {
            let renamed = events
                .iter()
                .filter(|e| e.name.as_deref() == Some(CHECKPOINT_FILE.as_ref()));
            counter.fetch_add(renamed.count(), Ordering::SeqCst);
        }
    });
    n
}

/// 250 pods on the node (ADDs of the plugin alone, 32 at once): the checkpoint's size, and
/// what saving it costs (a copy of it loaded and saved, next to the state dir); then the
/// pods deleted.
async fn at_250_pods(node: &Node, conf: &str, saves: &AtomicUsize) {
    const PODS: usize = 250;
    let call = |cmd: &'static str, pods: std::ops::Range<usize>| {
        let sem = Arc::new(tokio::sync::Semaphore::new(32));
        let calls = pods.map(move |i| {
            let (conf, sem) = (conf.to_owned(), sem.clone());
            async move {
                let _permit = sem.acquire().await.expect("semaphore");
                let c = format!("big{i}");
                blocking(move || plugin(cmd, &c, &pod_uid(40_000 + i), &conf)).await
            }
        });
        futures::future::join_all(calls)
    };
    // the operator's watch of every IPAMNode, drained as the operator's informer does
    let watching = tokio::spawn(operator_watch(node.admin.clone()));
    let before = saves.load(Ordering::SeqCst);
    let start = ApiLoad::now(node, 0).await;
    println!(
        "\n| API server load, pods on the node | IPAMNode (managedFields included) | status writes per pod start | bytes written per pod start | watch bytes per pod start to the operator |\n|---|---|---|---|---|"
    );
    let add = |range: std::ops::Range<usize>| async move {
        for r in call("ADD", range).await {
            assert_eq!(r.code, 0, "{}", r.stdout);
        }
    };
    add(0..110).await;
    let at_110 = start.report(node, 110).await;
    add(110..PODS).await;
    at_110.report(node, PODS).await;
    watching.abort();
    let added = saves.load(Ordering::SeqCst) - before;
    let checkpoint = node.settings.state_dir.join(CHECKPOINT_FILE);
    let bytes = std::fs::read(&checkpoint).expect("the checkpoint");
    let copy = node.dir.path().join("copy-250");
    std::fs::create_dir_all(&copy).expect("copy dir");
    std::fs::write(copy.join(CHECKPOINT_FILE), &bytes).expect("copy");
    let dir = StateDir::open(&copy).expect("open the copy");
    let boot = read_boot_id(dir.fs(), &node.settings.boot_id_file).expect("the boot ID");
    let mut state = dir
        .load(&boot, SystemTime::now(), Duration::from_secs(30))
        .expect("load")
        .state;
    let held = state.allocations().count();
    let took: Vec<Duration> = (0..100)
        .map(|_| {
            let t = Instant::now();
            dir.save(&mut state).expect("save");
            t.elapsed()
        })
        .collect();
    let (s50, s99) = p50_p99_ms(took);
    println!(
        "\nAt {PODS} pods ({held} allocations): the checkpoint is {} B; saving it costs {s50:.2} / {s99:.2} ms p50 / p99 (100 saves); the {PODS} ADDs, 32 at once, took {added} saves",
        bytes.len()
    );
    for r in call("DEL", 0..PODS).await {
        assert_eq!(r.code, 0, "{}", r.stdout);
    }
}

/// The IPAMNode watch an operator keeps: every event read and dropped.
async fn operator_watch(admin: kube::Client) {
    use futures::StreamExt;
    let api: kube::Api<tidepool_api::IPAMNode> = kube::Api::all(admin);
    let stream = kube::runtime::watcher(api, kube::runtime::watcher::Config::default());
    stream.for_each(|_| async {}).await;
}

/// The API server's counters for the node's IPAMNode at some number of pods: the agent's
/// status writes and their request bytes, and what the operator's watch was delivered.
struct ApiLoad {
    pods: usize,
    writes: u64,
    bytes: u64,
    watched: u64,
}

impl ApiLoad {
    /// The counters now, once the IPAMNode's `status.used` holds `pods` entries (the
    /// agent publishes after its saves).
    async fn now(node: &Node, pods: usize) -> ApiLoad {
        let api: kube::Api<tidepool_api::IPAMNode> = kube::Api::all(node.admin.clone());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let o = api.get("node-a").await.expect("node-a's IPAMNode");
            let used = o.status.as_ref().map_or(0, |s| s.used.len());
            if used == pods {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{used} entries published, not {pods}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ipamnodes = |r: &str| r.starts_with("ipamnodes.");
        let writes = ["apply", "patch", "update"];
        let is_write = |(v, r): &(String, String)| writes.contains(&v.as_str()) && ipamnodes(r);
        let requests = node.server.requests();
        ApiLoad {
            pods,
            writes: (requests.iter())
                .filter(|(k, _)| is_write(k))
                .map(|(_, n)| n)
                .sum(),
            bytes: (node.server.request_bytes().iter())
                .filter(|(k, _)| is_write(k))
                .map(|(_, n)| n)
                .sum(),
            watched: node
                .server
                .watch_bytes("ipamnodes.ipam.tidepool.dev", tidepool_tests::ADMIN),
        }
    }

    /// Prints the row for `pods` against `self` (the counters at fewer pods); the new
    /// counters.
    async fn report(self, node: &Node, pods: usize) -> ApiLoad {
        let next = ApiLoad::now(node, pods).await;
        let api: kube::Api<tidepool_api::IPAMNode> = kube::Api::all(node.admin.clone());
        let o = api.get("node-a").await.expect("node-a's IPAMNode");
        let size = serde_json::to_vec(&o).expect("serializes").len();
        let started = (pods - self.pods) as f64;
        println!(
            "| {pods} | {size} B | {:.2} | {:.0} B | {:.0} B |",
            (next.writes - self.writes) as f64 / started,
            (next.bytes - self.bytes) as f64 / started,
            (next.watched - self.watched) as f64 / started,
        );
        next
    }
}
