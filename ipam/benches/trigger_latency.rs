//! Trigger latency of maintainers during resyncs, in real time: 10,000 nodes with 110
//! running pods each, 10% in deficit (the engine does not lead, so they stay in deficit and
//! every resync triggers them), 20 resyncs on one thread; prints the p50/p99/max of
//! `tidepool_ipam_trigger_latency_seconds{trigger="pool-maintainer"}` recorded meanwhile.
//!
//! `cargo bench -p tidepool-ipam --features sim --bench trigger_latency`

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tidepool_ipam::sim::{World, WorldConfig};

fn main() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("recorder");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let cfg = WorldConfig {
            source_qps: 1e6,
            source_burst: 1_000_000,
            kube_qps: 1e6,
            kube_burst: 1_000_000,
            ..WorldConfig::default()
        };
        let w = World::start(cfg).expect("world");
        let names: Vec<_> = (0..10_000)
            .map(|i| w.add_node(&format!("n{i:05}")))
            .collect();
        for n in &names {
            for _ in 0..110 {
                w.schedule_pod(n);
            }
        }
        assert!(
            w.settle(Duration::from_secs(600)).await,
            "setup must settle"
        );
        w.leader.send(false).expect("leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
        for n in names.iter().step_by(10) {
            for _ in 0..10 {
                w.schedule_pod(n);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = snapshotter.snapshot(); // drop what the setup recorded
        let mut resync = Vec::new();
        for _ in 0..20 {
            let t = std::time::Instant::now();
            w.manager.resync().await;
            resync.push(t.elapsed().as_secs_f64());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut lat: Vec<f64> = Vec::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let k = key.key();
            let ours = k.name() == tidepool_metrics::TRIGGER_LATENCY_SECONDS
                && k.labels().any(|l| l.value() == "pool-maintainer");
            if let (true, DebugValue::Histogram(v)) = (ours, value) {
                lat.extend(v.into_iter().map(|x| x.into_inner()));
            }
        }
        lat.sort_by(f64::total_cmp);
        resync.sort_by(f64::total_cmp);
        let q = |v: &[f64], p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
        assert!(!lat.is_empty(), "no trigger latency recorded");
        println!(
            "resync (real time, one thread): p50 {:.2} ms, max {:.2} ms over {} resyncs",
            q(&resync, 0.5) * 1e3,
            q(&resync, 1.0) * 1e3,
            resync.len()
        );
        println!(
            "trigger latency during resyncs: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} runs",
            q(&lat, 0.5) * 1e3,
            q(&lat, 0.99) * 1e3,
            q(&lat, 1.0) * 1e3,
            lat.len()
        );
        w.shutdown();
    });
}
