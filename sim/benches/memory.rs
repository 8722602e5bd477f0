//! Heap bytes per idle node (engine task and state, store object, source bookkeeping; no
//! pods) and per address, measured with a counting allocator.
//!
//! `cargo bench -p tidepool-sim --bench memory`
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use tidepool_ipam::EngineConfig;
use tidepool_sim::alloc::CountingAllocator;
use tidepool_sim::{World, WorldConfig};

mod common;
use tidepool_ipam::IpamNode;
use tidepool_ipam::NodeUid;
use tidepool_ipam::Watermarks;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

fn main() {
    ALLOCATOR.start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let nodes: u32 = 2_000;
    let measure = |addresses: u32| -> f64 {
        rt.block_on(async {
            let cfg = WorldConfig {
                engine: EngineConfig {
                    watermarks: Watermarks {
                        pre_allocate: addresses,
                        ..Watermarks::default()
                    },
                    ..Default::default()
                },
                ..common::unlimited()
            };
            let w = World::start(cfg).expect("world");
            tokio::time::sleep(Duration::from_secs(1)).await;
            let before = ALLOCATOR.live_bytes();
            for i in 0..nodes {
                w.add_node(&format!("n{i:05}"));
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            assert!(w.all_settled(), "nodes must reach their pools");
            let per = (ALLOCATOR.live_bytes() - before) as f64 / nodes as f64;
            w.shutdown();
            per
        })
    };
    let idle = measure(0);
    let with64 = measure(64);
    // The engine's own per-address state is the IPAMNode's address set (the informer
    // copy); the rest of the world's figure is the simulated source's and observer's books.
    let object = |addresses: u32| -> f64 {
        let before = ALLOCATOR.live_bytes();
        let objs: Vec<IpamNode> = (0..nodes)
            .map(|i| {
                let mut n = IpamNode::new(format!("n{i:05}").into(), NodeUid(i as u128));
                n.operator.addresses = std::sync::Arc::new(
                    (0..addresses)
                        .map(|a| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i * 256 + a)))
                        .collect(),
                );
                n
            })
            .collect();
        let per = (ALLOCATOR.live_bytes() - before) as f64 / nodes as f64;
        drop(objs);
        per
    };
    let engine_per_address = (object(64) - object(0)) / 64.0;
    println!("memory/idle_node: {idle:.0} B per node with no address (engine + store + source)");
    println!(
        "memory/per_address: {:.1} B per address in the whole simulated world (64-address pools), \
         of which {engine_per_address:.1} B is the engine's (the IPAMNode address set)",
        (with64 - idle) / 64.0
    );
}
