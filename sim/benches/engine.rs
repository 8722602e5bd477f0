//! Engine benchmarks (BENCHMARKS.md has the figures and how to reproduce them):
//! - `resync/10k_nodes`: one full resync of 10,000 nodes with 110 used addresses each and
//!   10% in deficit;
//! - `plan/one_node`: planning one node's pass (256 addresses, 110 used, 3 candidates).
//!
//! Trigger latency during resyncs: `benches/trigger_latency.rs`; memory per node and
//! address: `benches/memory.rs`.
//!
//! `cargo bench -p tidepool-sim --bench engine`
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};

mod common;

use tidepool_ipam::NodeUid;
use tidepool_ipam::ReclaimConfig;
use tidepool_ipam::ReleaseConfig;
use tidepool_ipam::Squeezes;
use tidepool_ipam::Watermarks;
use tidepool_ipam::plan::{self, NodeMemory, Snapshot};
use tidepool_ipam::{Family, IpamNode, NodeInfo, PerFamily, PodUid, UsedEntry};
use tidepool_ipam::{PodInfo, PodIps, PodPhase};
use tidepool_sim::World;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// 10,000 nodes with 110 running pods each, settled; then 10% get 10 more pods while the
/// engine does not lead, so they stay in deficit for every resync measured.
fn resync(c: &mut Criterion) {
    let rt = rt();
    // built on first use, so a filtered-out run skips the setup
    let world = std::cell::OnceCell::new();
    let setup = || rt.block_on(common::ten_thousand_nodes(Duration::from_secs(1)));
    c.bench_function("resync/10k_nodes", |b| {
        let w: &World = world.get_or_init(setup);
        b.iter(|| rt.block_on(w.manager.resync()));
    });
    if let Some(w) = world.get() {
        w.shutdown();
    }
}

/// The pod cache is an ordered map, as the engine's in-memory pod view is.
fn node_for_plan() -> (IpamNode, NodeInfo, Vec<PodUid>, BTreeMap<PodUid, PodInfo>) {
    let mut node = IpamNode::new("n".into(), NodeUid(1));
    let since = SystemTime::UNIX_EPOCH;
    let mut pods = BTreeMap::new();
    for i in 0..256u32 {
        let a = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
        std::sync::Arc::make_mut(&mut node.operator.addresses).insert(a);
        if i < 110 {
            let uid = PodUid(i as u128);
            node.node.used.insert(
                a,
                UsedEntry {
                    pod_uid: uid,
                    pod: tidepool_ipam::PodName::new("default", "p"),
                    allocation: tidepool_ipam::AllocationId(1),
                    since: since.into(),
                },
            );
            // pods 0..3 are gone: three reclaim candidates
            if i >= 3 {
                pods.insert(
                    uid,
                    PodInfo {
                        uid,
                        node: "n".into(),
                        phase: PodPhase::Running,
                        ips: PodIps::new([a]),
                    },
                );
            }
        }
    }
    let info = NodeInfo {
        name: "n".into(),
        uid: NodeUid(1),
        allocatable_pods: 250,
        cordoned: false,
        terminating: false,
    };
    (node, info, Vec::new(), pods)
}

fn plan_one(c: &mut Criterion) {
    let rt = rt();
    let _guard = rt.enter();
    let (node, info, pending, pods) = node_for_plan();
    let mut mem = NodeMemory::default();
    let snap = Snapshot {
        now: tokio::time::Instant::now(),
        utc: std::time::SystemTime::UNIX_EPOCH,
        node: &node,
        operator: &node.operator,
        release_ack: &node.node.release_ack,
        info: &info,
        watermarks: Watermarks::default(),
        families: &[Family::V4],
        grant_size: PerFamily { v4: 1, v6: 1 },
        pending: &pending,
        pools: &plan::NodePools::EMPTY,
        release: ReleaseConfig::default(),
        reclaim: ReclaimConfig::default(),
        squeezes: &Squeezes::new(),
    };
    c.bench_function("plan/one_node", |b| {
        b.iter(|| black_box(plan::plan(&mut mem, black_box(&snap), &pods)));
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(5));
    targets = plan_one, resync
}
criterion_main!(benches);
