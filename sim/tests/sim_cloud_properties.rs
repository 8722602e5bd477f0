//! Property test of the simulated cloud as an IP source: over random sequences of instance
//! launches, assigns, unassigns and terminations, no address is held twice, primaries are
//! never granted, every instance stays within its type's limits, `describe` is the cloud's
//! truth, and free + held = capacity.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::collections::BTreeSet;
use std::net::IpAddr;

use proptest::prelude::*;
use tidepool_ipam::{AddrSet, IpSource, Ungated};
use tidepool_ipam::{Family, NodeName};
use tidepool_sim::cloud::{InstanceType, SimCloud};

#[derive(Debug, Clone)]
enum Op {
    Launch(usize, usize),
    Assign(usize, u64),
    Unassign(usize, usize),
    Terminate(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0usize..4, 0usize..6).prop_map(|(n, t)| Op::Launch(n, t)),
        3 => (0usize..4, 1u64..40).prop_map(|(n, c)| Op::Assign(n, c)),
        2 => (0usize..4, 0usize..30).prop_map(|(n, k)| Op::Unassign(n, k)),
        1 => (0usize..4).prop_map(Op::Terminate),
    ]
}

fn name(i: usize) -> NodeName {
    format!("node-{i}").into()
}

fn check(cloud: &SimCloud, rt: &tokio::runtime::Runtime) -> Result<(), TestCaseError> {
    let granted = cloud.granted();
    let addrs: BTreeSet<IpAddr> = granted.iter().map(|(a, _)| *a).collect();
    prop_assert_eq!(addrs.len(), granted.len(), "an address held twice");
    let mut primaries = 0u64;
    for i in 0..4 {
        let n = name(i);
        let Some(inst) = cloud.instance(&n) else {
            prop_assert!(granted.iter().all(|(_, owner)| *owner != n));
            continue;
        };
        let t = inst.instance_type;
        prop_assert!(inst.interfaces.len() as u32 <= t.max_interfaces);
        for iface in &inst.interfaces {
            primaries += 1;
            prop_assert!(
                !addrs.contains(&IpAddr::V4(iface.primary)),
                "primary granted"
            );
            prop_assert!(iface.secondaries.len() as u64 <= t.pod_addresses_per_interface());
        }
        prop_assert!(inst.pod_addresses() <= t.max_pod_addresses());
        let truth = rt.block_on(cloud.describe(&n)).unwrap();
        let held: AddrSet = granted
            .iter()
            .filter(|(_, o)| *o == n)
            .map(|(a, _)| *a)
            .collect();
        prop_assert_eq!(&truth, &held, "describe is the truth");
        let secondaries: AddrSet = inst
            .interfaces
            .iter()
            .flat_map(|i| i.secondaries.iter().map(|a| IpAddr::V4(*a)))
            .collect();
        prop_assert_eq!(&truth, &secondaries);
    }
    let q = cloud.quota().v4;
    prop_assert_eq!(q.capacity - q.free, granted.len() as u64 + primaries);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn the_cloud_keeps_its_books(ops in proptest::collection::vec(op(), 1..60), seed in any::<u64>()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        // one small subnet, so exhaustion happens too
        let cloud = SimCloud::new(1, 24, seed).unwrap();
        for op in ops {
            match op {
                Op::Launch(n, t) => {
                    if cloud.instance(&name(n)).is_none() {
                        cloud.add_instance(&name(n), InstanceType::ALL[t]).unwrap();
                    }
                }
                Op::Assign(n, c) => {
                    let want = cloud.prepare_allocation(&name(n), Family::V4, c, u64::MAX);
                    let before = rt.block_on(cloud.describe(&name(n))).unwrap();
                    match rt.block_on(cloud.allocate(&name(n), Family::V4, want, &mut Ungated)) {
                        Ok(got) => {
                            prop_assert_eq!(got.total(), u128::from(want));
                            prop_assert!(got.iter().all(|a| !before.contains(&a)));
                        }
                        Err(_) => prop_assert!(want == 0 || cloud.instance(&name(n)).is_none()),
                    }
                }
                Op::Unassign(n, k) => {
                    let held = rt.block_on(cloud.describe(&name(n))).unwrap();
                    let pick = cloud.prepare_release(&name(n), &held, k as u64);
                    prop_assert!(pick.total() <= k as u128);
                    rt.block_on(cloud.release(&name(n), &pick, &mut Ungated)).unwrap();
                    let after = rt.block_on(cloud.describe(&name(n))).unwrap();
                    prop_assert!(pick.iter().all(|a| !after.contains(&a)));
                }
                Op::Terminate(n) => {
                    cloud.terminate_instance(&name(n));
                }
            }
            check(&cloud, &rt)?;
        }
    }
}
