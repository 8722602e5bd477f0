//! Trigger latency of maintainers during resyncs, in real time: 10,000 nodes with 110
//! running pods each, 10% in deficit (the engine does not lead, so they stay in deficit and
//! every resync triggers them), 20 resyncs on one thread; prints the p50/p99/max of
//! `tidepool_ipam_trigger_latency_seconds{trigger="pool-maintainer"}` recorded meanwhile.
//!
//! `cargo bench -p tidepool-sim --bench trigger_latency`
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};

mod common;

fn main() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("recorder");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let w = common::ten_thousand_nodes(Duration::from_millis(200)).await;
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
