//! The Prometheus exporter's output, checked by promtool (Debian package `prometheus`), and the
//! installed exporter served over a real socket.
#![cfg(feature = "exporter")]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use tidepool_metrics as m;

/// Renders everything the exporter would export after start-up plus one sample of each kind,
/// including the metrics with free labels.
fn render_sample() -> String {
    let recorder = m::prometheus_builder()
        .expect("builder with buckets")
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        m::describe_all();
        m::register_zero();
        metrics::gauge!(m::POOL_IPS, m::pool::KEY => "default", m::family::KEY => m::family::IPV4, m::pool_state::KEY => m::pool_state::FREE).set(240.0);
        metrics::gauge!(m::NODE_IPS, m::node::KEY => "node-1", m::family::KEY => m::family::IPV6, m::ips_state::KEY => m::ips_state::USED).set(3.0);
        metrics::histogram!(m::TRIGGER_LATENCY_SECONDS, m::trigger::KEY => m::trigger::POOL_MAINTAINER).record(0.012);
        metrics::histogram!(m::TRIGGER_FOLDS, m::trigger::KEY => m::trigger::RESYNC).record(4.0);
        metrics::histogram!(m::RECLAIM_LATENCY_SECONDS).record(151.0);
        metrics::counter!(m::RESYNC_TOTAL).increment(2);
        metrics::gauge!(m::LEADER).set(1.0);
    });
    handle.render()
}

#[test]
fn histograms_render_as_histograms_with_help() {
    let text = render_sample();
    for (name, buckets) in m::buckets() {
        assert!(
            text.contains(&format!("# TYPE {name} histogram")),
            "{name} is not exported as a histogram:\n{text}"
        );
        // One bucket line per bound plus +Inf, for each series; check the first series' bounds.
        for b in *buckets {
            let le = format!("le=\"{b}\"");
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{name}_bucket{{")) && l.contains(&le)),
                "{name}: bucket {b} missing:\n{text}"
            );
        }
    }
    assert!(!text.contains("summary"), "no summaries expected:\n{text}");
    for d in m::ALL {
        assert!(
            text.contains(&format!("# HELP {} ", d.name)),
            "{} has no HELP line",
            d.name
        );
    }
    assert!(text.contains(
        "tidepool_ipam_reclaims_total{reason=\"sandbox-replaced\",outcome=\"failed\"} 0"
    ));
    assert!(text.contains("tidepool_leader 1"));
}

#[test]
fn promtool_accepts_the_exposition() {
    let text = render_sample();
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => panic!(
            "promtool is needed for this test and could not be run ({e}); install it with \
             `apt-get install -y prometheus` (Debian package `prometheus`)"
        ),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed ({}):\nstdout: {}\nstderr: {}\n--- exposition ---\n{text}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // promtool prints lint findings on success too; there must be none.
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        findings.trim().is_empty(),
        "promtool lint findings:\n{findings}"
    );
}

fn free_port() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

async fn get_metrics(addr: std::net::SocketAddr) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    Ok(body)
}

/// The one test in this binary that installs the global recorder (a process has one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_exporter_serves_described_zeroed_series() {
    let addr = free_port();
    let handle = m::install_exporter(addr).expect("install");
    metrics::counter!(m::RESYNC_TOTAL).increment(1);

    // Poll until the listener answers, bounded (real sockets run in real time).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let body = loop {
        match get_metrics(addr).await {
            Ok(b) if b.contains("200 OK") => break b,
            other => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no /metrics on {addr}: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(body.contains("# TYPE tidepool_ipam_api_wait_seconds histogram"));
    assert!(body.contains("tidepool_ipam_nodes{category=\"in-deficit\"} 0"));
    assert!(body.contains("tidepool_ipam_resync_total 1"));
    assert!(handle.render().contains("tidepool_ipam_resync_total 1"));

    // The same address again: the bind fails, reported as a build error.
    let err = m::install_exporter(addr).unwrap_err();
    assert!(matches!(err, m::MetricsError::Build(_)), "{err}");
    // Another address: the global recorder is taken.
    let err = m::install_exporter(free_port()).unwrap_err();
    assert!(matches!(err, m::MetricsError::AlreadyInstalled), "{err}");
}
