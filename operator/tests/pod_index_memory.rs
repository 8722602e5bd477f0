//! Heap bytes per pod in the [`PodIndex`], counted by the allocator (a measurement, not a
//! timing): the target is ≤ 3 KB per pod, against ~35 KB for a full Pod in a kube
//! reflector. Run alone to see the figures:
//! `cargo test -p tidepool-operator --test pod_index_memory -- --nocapture`.
//! (One test in this binary, so nothing else allocates while it counts.)
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use tidepool_ipam::{PodUid, PodView};
use tidepool_operator::index::{PodGetter, PodIndex};
use tidepool_sim::alloc::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

fn live() -> isize {
    ALLOCATOR.live_bytes()
}

struct NoServer;

impl PodGetter for NoServer {
    fn get(&self, _: &str, _: &str) -> BoxFuture<'static, Result<Option<Pod>, kube::Error>> {
        Box::pin(async { Ok(None) })
    }
}

const PODS: usize = 10_000;
const PODS_PER_NODE: usize = 110;

/// A Deployment's pod as a kubelet reports it (5.9 KB of compact JSON: labels, annotations,
/// managedFields, two containers, conditions, container statuses).
fn pod(i: usize) -> Pod {
    let uid = PodUid(0x5eed_0000_0000_0000_0000_0000_0000_0000 + i as u128).to_string();
    let node = format!(
        "ip-10-12-{}-{}.eu-west-1.compute.internal",
        i / PODS_PER_NODE / 250,
        i / PODS_PER_NODE % 250
    );
    let json = include_str!("pod_template.json")
        .replace("@UID@", &uid)
        .replace("@NAME@", &format!("checkout-api-7d9f8b6c5d-{i:05x}"))
        .replace("@NODE@", &node)
        .replace(
            "@IP@",
            &format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
        );
    serde_json::from_str(&json).expect("the template is a Pod")
}

/// One relist of every pod; returns the heap the index held just before `InitDone`.
fn relist(idx: &PodIndex) -> isize {
    idx.apply(&Event::Init);
    for i in 0..PODS {
        idx.apply(&Event::InitApply(pod(i)));
    }
    let before_done = live();
    idx.apply(&Event::InitDone);
    before_done
}

#[test]
fn a_pod_costs_at_most_3_kb_in_the_index() {
    ALLOCATOR.start();
    let full = {
        let start = live();
        let pods: Vec<Pod> = (0..PODS).map(pod).collect();
        let bytes = live() - start;
        drop(pods);
        bytes
    };
    let start = live();
    let idx = PodIndex::new(NoServer);
    relist(&idx);
    let steady = live() - start;
    let during = relist(&idx) - start;
    let after = live() - start;
    assert_eq!(
        idx.bound_pods("ip-10-12-0-0.eu-west-1.compute.internal"),
        PODS_PER_NODE
    );
    let per = |b: isize| b as f64 / PODS as f64;
    println!(
        "heap bytes per pod ({PODS} pods, {PODS_PER_NODE} per node): index {:.0}, \
         during a relist {:.0}, after it {:.0}; a full Pod (Vec<Pod>) {:.0}",
        per(steady),
        per(during),
        per(after),
        per(full)
    );
    assert!(per(steady) <= 3072.0, "{:.0} bytes per pod", per(steady));
    assert!(
        per(during) <= 2.0 * 3072.0,
        "{:.0} bytes per pod",
        per(during)
    );
    assert!(
        per(full) > 10.0 * per(steady),
        "the template is a realistic Pod"
    );
}
