//! The call oracle (`api.source_calls_minimum`) per family, with each family's grant size
//! (issue 11: dual-stack runs made more calls than their "minimum", or fewer). Property: in
//! a pure scale-up (no churn, crashes or node losses) that converges, the engine's calls
//! equal the minimum; the minimum is never above them.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::time::Duration;

use proptest::prelude::*;
use tidepool_ipam::{Family, PerFamily};
use tidepool_sim::cloud::InstanceType;
use tidepool_sim::run::simulate_paused;
use tidepool_sim::{CloudChoice, PoolChoice, SimConfig, SourceChoice, WorldConfig};

#[derive(Debug, Clone)]
enum Src {
    Memory { dual: bool },
    Pool { v4: Option<u8>, v6: Option<u8> },
    Cloud(usize),
}

fn src() -> impl Strategy<Value = Src> {
    prop_oneof![
        any::<bool>().prop_map(|dual| Src::Memory { dual }),
        (prop::option::of(26u8..=32), prop::option::of(120u8..=128))
            .prop_filter("a pool serves a family", |(a, b)| a.is_some()
                || b.is_some())
            .prop_map(|(v4, v6)| Src::Pool { v4, v6 }),
        (0..InstanceType::ALL.len()).prop_map(Src::Cloud),
    ]
}

fn config(src: &Src, nodes: u32, pods: u32, pre: u32) -> SimConfig {
    let mut world = WorldConfig::default();
    world.engine.watermarks.pre_allocate = pre;
    let source = match *src {
        Src::Memory { dual } => {
            if dual {
                world.families = vec![Family::V4, Family::V6];
            }
            SourceChoice::Memory
        }
        Src::Pool { v4, v6 } => {
            world.families = Family::ALL
                .into_iter()
                .filter(|f| match f {
                    Family::V4 => v4.is_some(),
                    Family::V6 => v6.is_some(),
                })
                .collect();
            let cidrs = [v4.map(|_| "10.0.0.0/16"), v6.map(|_| "fd00::/64")];
            SourceChoice::ClusterPool(PoolChoice {
                cidrs: cidrs.into_iter().flatten().map(String::from).collect(),
                block_size: PerFamily {
                    v4: v4.unwrap_or(28),
                    v6: v6.unwrap_or(124),
                },
            })
        }
        Src::Cloud(i) => {
            let t = InstanceType::ALL[i];
            world.max_pods = t.max_pod_addresses().min(250) as u32;
            SourceChoice::SimCloud(CloudChoice {
                instance_type: t,
                subnet_size: 16,
                rate_limit: None,
            })
        }
    };
    let pods = pods.min(world.max_pods);
    SimConfig {
        world,
        source,
        nodes,
        pods_per_node: pods,
        churn: 0.0,
        crash_rate: 0.0,
        node_churn: 0.0,
        duration: Duration::from_secs(120),
        ..SimConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    #[test]
    fn a_converged_scale_up_makes_exactly_the_minimum_calls(
        src in src(),
        nodes in 1u32..4,
        pods in 0u32..40,
        pre in 0u32..12,
    ) {
        let r = simulate_paused(config(&src, nodes, pods, pre)).unwrap();
        prop_assert!(r.invariants.ok(), "{:?}", r.violations);
        let minimum = r.api.source_calls_minimum.expect("a scale-up has an oracle");
        prop_assert!(minimum <= r.api.source_calls, "{:?}", r.api);
        if r.converged {
            prop_assert_eq!(minimum, r.api.source_calls, "{:?}", r.api);
        }
    }
}

/// The three dual-stack cases of the issue, by hand: cluster-pool /28 + /112 and /28 + /128,
/// and the memory source.
#[test]
fn dual_stack_minimums_count_both_families() {
    for (src, calls) in [
        (
            Src::Pool {
                v4: Some(28),
                v6: Some(112),
            },
            5 * (3 + 1),
        ),
        (
            Src::Pool {
                v4: Some(28),
                v6: Some(128),
            },
            5 * (3 + 38),
        ),
        (Src::Memory { dual: true }, 5 * 2),
    ] {
        let r = simulate_paused(config(&src, 5, 30, 8)).unwrap();
        assert!(r.converged, "{src:?}");
        assert_eq!(
            (r.api.source_calls, r.api.source_calls_minimum),
            (calls, Some(calls)),
            "{src:?}"
        );
    }
}

/// An exhausted pool (issue 11): the minimum counts only the blocks the pool had. A /24 of
/// /28 blocks holds 16; eight nodes wanting three each get 16 in 16 calls.
#[test]
fn an_exhausted_pool_counts_only_what_it_could_give() {
    let mut cfg = config(
        &Src::Pool {
            v4: Some(28),
            v6: None,
        },
        8,
        30,
        8,
    );
    if let SourceChoice::ClusterPool(p) = &mut cfg.source {
        p.cidrs = vec!["10.0.0.0/24".into()];
    }
    // the minimum counts claims; a scarce pool also moves idle blocks between nodes (issue
    // 30), a release and a claim each, which it does not model: measured without them
    let mut plain = cfg.clone();
    plain.world.engine.scarcity.enabled = false;
    let r = simulate_paused(plain).unwrap();
    assert!(r.invariants.ok(), "{:?}", r.violations);
    assert_eq!(
        (r.api.source_calls, r.api.source_calls_minimum),
        (16, Some(16)),
        "{:?}",
        r.api
    );
    // with them, the moves serve pods the idle blocks would have kept waiting
    let moved = simulate_paused(cfg).unwrap();
    assert!(moved.invariants.ok(), "{:?}", moved.violations);
    assert!(
        moved.pods.never_served < r.pods.never_served,
        "{:?} against {:?}",
        moved.pods,
        r.pods
    );
}
