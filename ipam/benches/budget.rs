//! Admission cost of a budget with many waiting nodes.
//!
//! Queues `n` waiters (each its own task and `PriorityCell`, priorities spread so the ranking has
//! real work), then times draining the whole queue under paused tokio time: qps 1000, burst 1,
//! so every admission is one dispatcher wake-up, one admission decision and one targeted wake.
//! Reported time is per drained queue; divide by `n` for the cost per admission at an average
//! queue length of `n / 2`. FIFO (first arrival) against Priority (rank index) isolates the
//! cost of ranking.
//!
//! Run: `cargo bench -p tidepool-ipam --bench budget`.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tidepool_ipam::{Api, Budget, Priority, PriorityCell, SchedulingMode};

fn drain(n: usize, mode: SchedulingMode) -> Duration {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let budget = Budget::new(Api::Source, 1000.0, 1, mode).unwrap();
        budget.acquire(&PriorityCell::default()).await;
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let budget = budget.clone();
                let cell = PriorityCell::new(Priority {
                    waiting_pods: (i % 7) as u32,
                    needed: (i * 31 % 257) as u32,
                });
                tokio::spawn(async move { budget.acquire(&cell).await })
            })
            .collect();
        while budget.waiting() < n {
            tokio::task::yield_now().await;
        }
        let start = Instant::now();
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    })
}

fn admission(c: &mut Criterion) {
    let mut g = c.benchmark_group("budget_drain");
    g.sample_size(10);
    for n in [1_000usize, 10_000] {
        for (name, mode) in [
            ("priority", SchedulingMode::Priority),
            ("fifo", SchedulingMode::Fifo),
        ] {
            g.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                b.iter_custom(|iters| (0..iters).map(|_| drain(n, mode)).sum())
            });
        }
    }
    g.finish();
}

criterion_group!(benches, admission);
criterion_main!(benches);
