//! The kube budget on the cluster pool, where every mutating call of a pass is an API server
//! write (block creates, deletes and marks, then the IPAMNode apply): a pass takes one place
//! in the kube budget's queue for all of its writes, and a node waiting for that place still
//! sees new work (issue 13).
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use common::*;
use tidepool_ipam::{NodeName, ObjectKind, PodUid, Writer};
use tidepool_sim::{SimSource, World, WorldConfig};

/// A cluster-pool world (/28 blocks of 10.0.0.0/24) whose kube budget allows `qps` writes
/// a second in bursts of `burst`; release off, so no marks are written.
fn world(qps: f64, burst: u32, pre: u32) -> World<Pool> {
    let mut cfg = WorldConfig {
        kube_qps: qps,
        kube_burst: burst,
        ..config(wm(pre, 0, 0, 0))
    };
    cfg.engine.release.enabled = false;
    pool_world(cfg, &["10.0.0.0/24"], Duration::ZERO)
}

/// The operator's writes as the store reports them: (time since the start, node, kind).
type Writes = Arc<Mutex<Vec<(Duration, NodeName, ObjectKind)>>>;

fn record_writes(w: &World<Pool>) -> Writes {
    let log: Writes = Arc::default();
    let mut events = w.store.subscribe();
    let start = Instant::now();
    let out = log.clone();
    tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            if ev.writer == Writer::Operator {
                out.lock()
                    .unwrap()
                    .push((start.elapsed(), ev.name.clone(), ev.kind));
            }
        }
    });
    log
}

/// One write per second (burst 1), pre-allocate 20: every node claims two /28 blocks. n1
/// is admitted first (the free token) and creates its first block; n2 and n3, with ten
/// pods waiting each, queue before n1 asks for its second block and its IPAMNode write.
/// Those need no second place: they take the next tokens, ahead of the higher-priority
/// passes queued meanwhile, and each later pass writes its two blocks and its IPAMNode back
/// to back, one token per API request: the IPAMNode's create is two (the POST, then its
/// status), so it lands with the second. (Before, the claim of two blocks took one token,
/// and the IPAMNode write queued again, behind n2 and n3.)
#[tokio::test(start_paused = true)]
async fn a_pass_writes_on_one_place_in_the_kube_queue() {
    let w = world(1.0, 1, 20);
    let writes = record_writes(&w);
    let n1 = w.add_node("n1");
    schedule_on(&w, &n1, 1);
    advance(millis(100)).await;
    for name in ["n2", "n3"] {
        let n = w.add_node(name);
        schedule_on(&w, &n, 10);
    }
    settle_pool(&w, secs(60)).await;
    let got: Vec<(u64, String, ObjectKind)> = writes
        .lock()
        .unwrap()
        .iter()
        .map(|(t, n, k)| (t.as_millis() as u64, n.to_string(), *k))
        .collect();
    let mut want = Vec::new();
    for (i, n) in ["n1", "n2", "n3"].into_iter().enumerate() {
        let t = 4000 * i as u64;
        want.push((t, n.to_string(), ObjectKind::IpamBlock));
        want.push((t + 1000, n.to_string(), ObjectKind::IpamBlock));
        want.push((t + 3000, n.to_string(), ObjectKind::IpamNode));
    }
    assert_eq!(got, want);
    assert_eq!(w.waiting(), 0);
    assert_finish_clean_pool(&w);
}

/// A very slow kube budget (one write per 100 s, burst 3). n1 waits for its place to write
/// the tombstone of a crashed pod when a second pod crashes. Its wait ends on the pod
/// event, so the second crash is observed at once; when its grace has ended the next pass
/// plans that tombstone too, and both go out in the one IPAMNode write the place comes up
/// for (400 s). (Before, the waiting pass saw nothing until its write was done at 400 s;
/// the second crash was observed then, and its tombstone waited for the token at 500 s.)
#[tokio::test(start_paused = true)]
async fn a_node_waiting_for_the_kube_budget_still_sees_new_work() {
    let w = world(0.01, 3, 8);
    let writes = record_writes(&w);
    let start = Instant::now();
    // n1's block and its IPAMNode (a POST and a status apply) take the three tokens
    let n1 = w.add_node("n1");
    let pods = schedule_on(&w, &n1, 3);
    advance(secs(250)).await;
    assert_eq!(used(&w, "n1"), 3);
    // n2 takes the two tokens the bucket holds again and the third at 300 s: the next one
    // is due at 400 s
    let n2 = w.add_node("n2");
    schedule_on(&w, &n2, 3);
    advance(secs(51)).await;
    assert_eq!(used(&w, "n2"), 3);
    // the first crash: observed at once, its tombstone planned 30 s later (the entries are
    // older than the 2 min minimum age), then n1 waits for its place
    w.delete_pod(pods[0], true);
    advance(secs(39)).await;
    assert!(w.node("n1").unwrap().operator.reclaim.is_empty());
    // the second crash, while n1 waits
    assert_eq!(start.elapsed(), secs(340));
    w.delete_pod(pods[1], true);
    wait_until("n1's tombstones", secs(300), secs(1), || {
        w.node("n1").is_some_and(|n| n.operator.reclaim.len() == 2)
    })
    .await;
    assert!(start.elapsed() <= secs(401), "{:?}", start.elapsed());
    let n1_writes: Vec<(u64, ObjectKind)> = writes
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, n, _)| &**n == "n1")
        .map(|(t, _, k)| (t.as_millis() as u64, *k))
        .collect();
    // the block and the IPAMNode at the start, then the one write with both tombstones
    assert_eq!(
        n1_writes,
        vec![
            (0, ObjectKind::IpamBlock),
            (0, ObjectKind::IpamNode),
            (400_000, ObjectKind::IpamNode),
        ]
    );
    settle_pool(&w, secs(900)).await;
    assert_eq!(w.observer.reclaimed(), 2);
    assert_eq!(used(&w, "n1"), 1);
    assert_finish_clean_pool(&w);
}

fn assert_finish_clean_pool(w: &World<Pool>) {
    assert!(
        w.observer.invariants().ok(),
        "{:?}",
        w.observer.violations()
    );
    let inv = w.observer.finish(&w.source.grants(), &w.store.list());
    assert!(inv.ok(), "{inv:?}: {:?}", w.observer.violations());
}

fn schedule_on(w: &World<Pool>, node: &NodeName, n: usize) -> Vec<PodUid> {
    (0..n).map(|_| w.schedule_pod(node)).collect()
}

async fn settle_pool(w: &World<Pool>, limit: Duration) {
    assert!(
        w.settle(limit).await,
        "not settled: {:?}",
        w.manager.summaries()
    );
}

/// `used` entries of the node (0 if its IPAMNode does not exist).
fn used(w: &World<Pool>, name: &str) -> usize {
    w.node(name).map_or(0, |n| n.node.used.len())
}
