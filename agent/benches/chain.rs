//! The CNI chain measured (issue 15; BENCHMARKS.md "Node agent"): per-operation latency of
//! the plugin alone (process start + socket + the agent's durable save), of `ptp` delegating
//! to it, and of `ptp` with the reference `host-local` (the anchor), so the main plugin's own
//! time shows separately; then pods per second through one agent at several concurrencies.
//! The agent is `run::run` against the in-process API server, as in the chain test. Root only
//! (network namespaces); every namespace is removed at the end.
//!
//! ```text
//! sudo cargo bench -p tidepool-agent --bench chain
//! # env: CHAIN_ROUNDS (200), CHAIN_PODS (200), CHAIN_STATE=disk|tmpfs (disk)
//! ```
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::time::{Duration, Instant};

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
    let (mut add, mut del) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let (c, conf) = (format!("alone{i}"), alone.clone());
        let a = blocking(move || plugin("ADD", &c, &pod_uid(i), &conf)).await;
        assert_eq!(a.code, 0, "{}", a.stdout);
        let (c, conf) = (format!("alone{i}"), alone.clone());
        let d = blocking(move || plugin("DEL", &c, &pod_uid(i), &conf)).await;
        assert_eq!(d.code, 0, "{}", d.stdout);
        add.push(a.took);
        del.push(d.took);
    }
    let (ipam_add, ipam_del) = row("tidepool-cni alone (start + socket + save)", add, del);

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

    println!(
        "\n| concurrency | {pods} pods ADD (ptp → tidepool-cni) | pods/s | DEL all | pods/s |\n|---|---|---|---|---|"
    );
    let netns: Vec<String> = (1..=pods).map(|i| node.pod(i)).collect();
    let node = std::sync::Arc::new(node);
    for (round, concurrency) in [1usize, 8, 32].into_iter().enumerate() {
        let mut wall = Vec::new();
        for cmd in ["ADD", "DEL"] {
            let t = Instant::now();
            let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
            let calls = netns.iter().enumerate().map(|(i, p)| {
                let (node, p, sem) = (node.clone(), p.clone(), sem.clone());
                let c = format!("t{round}-{i}");
                tokio::spawn(async move {
                    let _permit = sem.acquire().await.expect("semaphore");
                    node.cni("ptp", cmd, &p, &c, &pod_uid(20_000 + i)).await
                })
            });
            for out in futures::future::join_all(calls).await {
                let out = out.expect("join");
                assert!(out.status.success(), "{cmd}: {out:?}");
            }
            wall.push(t.elapsed());
        }
        let rate = |d: Duration| pods as f64 / d.as_secs_f64();
        println!(
            "| {concurrency} | {:.2} s | {:.0} | {:.2} s | {:.0} |",
            wall[0].as_secs_f64(),
            rate(wall[0]),
            wall[1].as_secs_f64(),
            rate(wall[1])
        );
    }
    let mut node = std::sync::Arc::into_inner(node).expect("the last handle");
    node.stop_agent().await;
}
