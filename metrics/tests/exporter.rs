//! The Prometheus exporter's output, checked by promtool (Debian package `prometheus`), and the
//! installed exporter served over a real socket.
#![cfg(feature = "exporter")]
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use tidepool_metrics as m;

#[path = "../../tests/tests/system/process_metrics.rs"]
mod process_metrics;

/// Renders everything either binary's exporter would export after start-up (both tables in
/// one recorder) plus one sample of each kind, including the metrics with free labels.
fn render_sample() -> String {
    let recorder = m::prometheus_builder()
        .expect("builder with buckets")
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        for binary in m::Binary::ALL {
            m::describe_all(binary);
            m::register_zero(binary);
        }
        metrics::histogram!(m::AGENT_CNI_DURATION_SECONDS, m::cni_verb::KEY => m::cni_verb::ADD)
            .record(0.0031);
        metrics::counter!(m::AGENT_CNI_REQUESTS_TOTAL, m::cni_verb::KEY => m::cni_verb::DEL, m::cni_outcome::KEY => m::cni_outcome::STALE).increment(1);
        metrics::gauge!(m::AGENT_IPS, m::family::KEY => m::family::IPV4, m::agent_ips_state::KEY => m::agent_ips_state::POOL).set(16.0);
        metrics::gauge!(m::POOL_IPS, m::pool::KEY => "default", m::family::KEY => m::family::IPV4, m::pool_state::KEY => m::pool_state::FREE).set(240.0);
        metrics::gauge!(m::NODE_IPS, m::node::KEY => "node-1", m::family::KEY => m::family::IPV6, m::ips_state::KEY => m::ips_state::USED).set(3.0);
        metrics::gauge!(m::POOL_BLOCKS, m::pool::KEY => "default", m::family::KEY => m::family::IPV4, m::block_state::KEY => m::block_state::PARTIAL).set(7.0);
        m::record::pool_valid("default", false);
        m::record::ips(m::Family::Ipv4, m::IpsState::Used, "default", 12.0);
        m::record::pods_waiting(m::Family::Ipv6, "", 1.0);
        m::record::pool_scarcity("default", m::Family::Ipv4, 0.9, true, 0.25);
        m::record::scarcity_released_ips("default", m::Family::Ipv4, 16);
        m::record::pool_exhaustion("default", m::Family::Ipv4, f64::INFINITY);
        m::record::build_info(m::BuildInfo {
            version: "1.2.3",
            commit: "0abc123",
        });
        metrics::histogram!(m::POD_IP_WAIT_SECONDS).record(0.4);
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
    for d in m::all() {
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
    // a pool that is not shrinking has all the time in the world: the exporter writes
    // Rust's `inf`, which Prometheus's parser (Go's strconv.ParseFloat, case-insensitive)
    // reads as +Inf; the live-Prometheus test scrapes and queries it
    assert!(
        text.contains(
            "tidepool_ipam_pool_exhaustion_seconds{pool=\"default\",family=\"ipv4\"} inf"
        ),
        "{text}"
    );
    assert!(text.contains("tidepool_agent_cni_requests_total{verb=\"del\",outcome=\"stale\"} 1"));
    assert!(text.contains("tidepool_agent_ips{family=\"ipv4\",state=\"pool\"} 16"));
}

/// What one binary's start-up exports: its own series, none of the other's.
fn render_start_of(binary: m::Binary) -> String {
    let recorder = m::prometheus_builder()
        .expect("builder with buckets")
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        m::describe_all(binary);
        m::register_zero(binary);
    });
    handle.render()
}

#[test]
fn each_binary_exports_only_its_own_series() {
    let agent = render_start_of(m::Binary::Agent);
    let operator = render_start_of(m::Binary::Operator);
    let names = |text: &str| -> std::collections::BTreeSet<String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let end = l.find(['{', ' ']).unwrap_or(l.len());
                l[..end]
                    .trim_end_matches("_bucket")
                    .trim_end_matches("_sum")
                    .trim_end_matches("_count")
                    .to_owned()
            })
            .collect()
    };
    let want = |b: m::Binary| -> std::collections::BTreeSet<String> {
        b.defs()
            .iter()
            // metrics with a free label appear only once recorded
            .filter(|d| !d.series().is_empty())
            .map(|d| d.name.to_owned())
            .collect()
    };
    for (b, text) in [(m::Binary::Agent, &agent), (m::Binary::Operator, &operator)] {
        assert_eq!(names(text), want(b), "{b:?}:\n{text}");
        for d in b.defs().iter().filter(|d| !d.series().is_empty()) {
            assert!(text.contains(&format!("# HELP {} ", d.name)), "{}", d.name);
        }
    }
    assert!(!agent.contains("tidepool_ipam_"), "{agent}");
    assert!(!agent.contains("tidepool_leader"), "{agent}");
    assert!(!operator.contains("tidepool_agent_"), "{operator}");
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

/// With a gauge idle timeout (`--per-node-metrics`), a gauge series nobody sets any more
/// leaves the export, one set again in time stays, and counters never expire.
#[test]
fn gauges_not_set_within_the_idle_timeout_leave_the_export() {
    let idle = Duration::from_millis(300);
    let recorder = m::prometheus_builder_with(Some(idle))
        .expect("builder")
        .build_recorder();
    let handle = recorder.handle();
    let node = |name: &'static str| metrics::gauge!(m::NODE_IPS, m::node::KEY => name, m::family::KEY => m::family::IPV4, m::ips_state::KEY => m::ips_state::USED);
    metrics::with_local_recorder(&recorder, || {
        node("gone").set(3.0);
        node("live").set(5.0);
        metrics::counter!(m::RESYNC_TOTAL).increment(1);
    });
    let text = handle.render();
    assert!(text.contains("node=\"gone\""), "{text}");
    // keep setting "live" (as each resync does) until "gone" has left, bounded
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let text = loop {
        metrics::with_local_recorder(&recorder, || node("live").set(5.0));
        let text = handle.render();
        if !text.contains("node=\"gone\"") {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never expired:\n{text}"
        );
        std::thread::sleep(idle / 6);
    };
    assert!(text.contains("node=\"live\""), "{text}");
    assert!(text.contains("tidepool_ipam_resync_total 1"), "{text}");
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
    let build = m::BuildInfo {
        version: "1.2.3",
        commit: "0abc123",
    };
    let handle = m::install_exporter(addr, m::Binary::Operator, build).expect("install");
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
    assert!(
        !body.contains("tidepool_agent_"),
        "the operator's exporter: {body}"
    );
    assert!(handle.render().contains("tidepool_ipam_resync_total 1"));
    // the process itself, set at each scrape
    assert!(
        body.contains("tidepool_build_info{version=\"1.2.3\",commit=\"0abc123\"} 1"),
        "{body}"
    );
    process_metrics::assert_process_series(&body, "1.2.3");

    // The same address again: the bind fails, reported as a bind error.
    let err = m::install_exporter(addr, m::Binary::Operator, build).unwrap_err();
    assert!(matches!(err, m::MetricsError::Bind(_)), "{err}");
    // Another address: the global recorder is taken.
    let err = m::install_exporter(free_port(), m::Binary::Agent, build).unwrap_err();
    assert!(matches!(err, m::MetricsError::AlreadyInstalled), "{err}");
}
