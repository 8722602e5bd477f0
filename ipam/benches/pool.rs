//! cluster-pool free-block index: claim+release throughput, rebuild time, memory.
//!
//! 1. `claim_release/*`: one claim (random start, as callers randomize it) plus one release of
//!    a uniformly chosen held block, on a pool kept 50% full. Throughput is in pairs.
//! 2. `rebuild/100k_blocks_10k_nodes`: a fresh `PoolSet` plus `rebuild` from 100,000 typed
//!    block records (10,000 nodes × 5 IPv4 /28 + 5 IPv6 /124 blocks, sorted by name as a list
//!    from the API server comes) in a dual-stack pool 10.0.0.0/10 + fd00::/64.
//! 3. Memory, printed before the criterion runs, measured with a counting allocator (live heap
//!    bytes after building minus before).
//!
//! Run: `cargo bench -p tidepool-ipam --bench pool` (needs the `[[bench]] name = "pool"
//! harness = false` entry in ipam/Cargo.toml).
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use ipnet::IpNet;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tidepool_ipam::pool::{BlockRecord, Layout, PoolIndex, PoolSet, PoolSpec, block_name};
use tidepool_ipam::{Family, NodeName};

/// Counts live heap bytes.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: AllocLayout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: AllocLayout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: AllocLayout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn spec(cidrs: &[&str]) -> PoolSpec {
    PoolSpec::new(
        "bench",
        cidrs.iter().map(|c| c.parse::<IpNet>().unwrap()).collect(),
    )
}

/// A pool of one family with `held` blocks claimed at random starts.
struct Half {
    pool: PoolIndex,
    family: Family,
    held: Vec<IpNet>,
    rng: SmallRng,
    range: u128,
}

impl Half {
    fn new(cidr: &str, layout: Layout, held: usize) -> Self {
        let family = if cidr.contains(':') {
            Family::V6
        } else {
            Family::V4
        };
        let mut pool = PoolIndex::with_layout(&spec(&[cidr]), layout).unwrap();
        let range = pool.family(family).unwrap().total_blocks();
        let mut rng = SmallRng::seed_from_u64(7);
        let held = (0..held)
            .map(|_| pool.claim(family, rng.random_range(0..range)).unwrap())
            .collect();
        Self {
            pool,
            family,
            held,
            rng,
            range,
        }
    }

    /// One claim at a random start and one release of a random held block.
    #[inline]
    fn pair(&mut self) {
        let start = self.rng.random_range(0..self.range);
        let b = self.pool.claim(self.family, start).unwrap();
        let k = self.rng.random_range(0..self.held.len());
        let old = std::mem::replace(&mut self.held[k], b);
        black_box(self.pool.release(&old).unwrap());
    }

    fn run(&mut self, pairs: u64) -> Duration {
        let t = Instant::now();
        for _ in 0..pairs {
            self.pair();
        }
        t.elapsed()
    }
}

fn cases() -> Vec<(&'static str, &'static str, Layout, usize)> {
    vec![
        // IPv4 /12 in /28: 65,536 blocks, 32,768 held
        ("v4_12_half_dense", "10.0.0.0/12", Layout::Auto, 32_768),
        ("v4_12_half_sparse", "10.0.0.0/12", Layout::Sparse, 32_768),
        ("v4_12_half_runs", "10.0.0.0/12", Layout::Runs, 32_768),
        // IPv6 /64 in /124: 2^60 blocks, 100,000 held
        ("v6_64_100k_sparse", "fd00::/64", Layout::Auto, 100_000),
        ("v6_64_100k_runs", "fd00::/64", Layout::Runs, 100_000),
    ]
}

fn report_pairs() {
    println!("== claim+release pairs, one core (10 M pairs after warm-up)");
    for (name, cidr, layout, held) in cases() {
        let mut h = Half::new(cidr, layout, held);
        h.run(1_000_000);
        let n = 10_000_000;
        let d = h.run(n);
        println!(
            "{name:<20} {:>7.1} ns/pair  {:>6.2} M pairs/s",
            d.as_nanos() as f64 / n as f64,
            n as f64 / d.as_secs_f64() / 1e6
        );
    }
}

fn report_memory() {
    println!("== index memory (live heap bytes, counting allocator)");
    let before = live();
    let mut p = PoolIndex::new(&spec(&["10.0.0.0/12"])).unwrap();
    while p.claim(Family::V4, 0).is_ok() {}
    let i = p.family(Family::V4).unwrap();
    println!(
        "v4 /12 in /28, fully claimed ({} blocks): {} bytes (stored entries {}, heap_bytes() {})",
        i.allocated(),
        live() - before,
        i.stored_entries(),
        i.heap_bytes()
    );
    drop(p);

    for layout in [Layout::Sparse, Layout::Runs] {
        let before = live();
        let mut p = PoolIndex::with_layout(&spec(&["10.0.0.0/12"]), layout).unwrap();
        let mut rng = SmallRng::seed_from_u64(3);
        for _ in 0..32_768 {
            p.claim(Family::V4, rng.random_range(0..65_536)).unwrap();
        }
        let i = p.family(Family::V4).unwrap();
        println!(
            "v4 /12 in /28, {layout:?} layout, half claimed at random starts: {} bytes ({} entries)",
            live() - before,
            i.stored_entries()
        );
    }

    for (layout, what, random) in [
        (Layout::Auto, "random starts", true),
        (Layout::Auto, "sequential", false),
        (Layout::Runs, "random starts", true),
        (Layout::Runs, "sequential", false),
    ] {
        let before = live();
        let mut p = PoolIndex::with_layout(&spec(&["fd00::/64"]), layout).unwrap();
        let mut rng = SmallRng::seed_from_u64(5);
        for _ in 0..100_000 {
            let start = if random {
                rng.random::<u64>() as u128
            } else {
                0
            };
            p.claim(Family::V6, start).unwrap();
        }
        let bytes = live() - before;
        let i = p.family(Family::V6).unwrap();
        println!(
            "v6 /64 in /124, {layout:?} layout, 100,000 blocks claimed ({what}): {bytes} bytes = {:.1} B/block ({} entries, heap_bytes() estimate {})",
            bytes as f64 / 100_000.0,
            i.stored_entries(),
            i.heap_bytes()
        );
    }
}

struct BlockObject {
    name: String,
    pool: String,
    cidr: IpNet,
    #[allow(dead_code)]
    node: NodeName,
}

fn block_objects() -> Vec<BlockObject> {
    let mut p = PoolIndex::new(&spec(&["10.0.0.0/10", "fd00::/64"])).unwrap();
    let mut rng = SmallRng::seed_from_u64(11);
    let mut out = Vec::with_capacity(100_000);
    for n in 0..10_000 {
        let node: NodeName = format!("node-{n:05}").into();
        for f in [Family::V4, Family::V6] {
            for _ in 0..5 {
                let cidr = p.claim(f, rng.random::<u64>() as u128).unwrap();
                out.push(BlockObject {
                    name: block_name(&cidr),
                    pool: "bench".into(),
                    cidr,
                    node: node.clone(),
                });
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn rebuild_once(objects: &[BlockObject]) -> Duration {
    let t = Instant::now();
    let mut set = PoolSet::new(vec![spec(&["10.0.0.0/10", "fd00::/64"])]);
    let report = set.rebuild(objects.iter().map(|o| BlockRecord {
        key: o,
        name: &o.name,
        pool: &o.pool,
        cidr: o.cidr,
    }));
    let d = t.elapsed();
    assert_eq!(report.indexed, 100_000);
    assert!(report.findings.is_empty());
    black_box(set);
    d
}

fn main() {
    report_memory();
    report_pairs();
    let objects = block_objects();
    let runs: Vec<Duration> = (0..5).map(|_| rebuild_once(&objects)).collect();
    println!(
        "== rebuild, 100,000 records, 10,000 nodes: {:?} (min of 5; all {:?})",
        runs.iter().min().unwrap(),
        runs
    );

    let mut c = Criterion::default().configure_from_args();
    {
        let mut g = c.benchmark_group("claim_release");
        g.throughput(Throughput::Elements(1));
        for (name, cidr, layout, held) in cases() {
            let mut h = Half::new(cidr, layout, held);
            g.bench_function(name, |b| b.iter_custom(|iters| h.run(iters)));
        }
        g.finish();
    }
    {
        let mut g = c.benchmark_group("rebuild");
        g.sample_size(20);
        g.bench_function("100k_blocks_10k_nodes", |b| {
            b.iter_custom(|iters| (0..iters).map(|_| rebuild_once(&objects)).sum())
        });
        g.finish();
    }
    c.final_summary();
}
