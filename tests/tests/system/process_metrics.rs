//! What every binary's `/metrics` says of the process itself: `tidepool_build_info` and the
//! standard `process_*` families, with sane values. Shared by the exporter's test
//! (metrics/tests/exporter.rs, by path), the operator binary's test
//! (operator/tests/binary.rs, which includes this file by path) and the agent's
//! (agent/tests/observability.rs, through the system harness). Standard library only.

use std::time::{SystemTime, UNIX_EPOCH};

/// The process families metrics-process exports on Linux (client_golang's process collector).
pub const PROCESS_FAMILIES: &[&str] = &[
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
    "process_max_fds",
    "process_threads",
];

/// The value of the unlabelled series `name` in `exposition`.
fn value(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Asserts `exposition` (one scrape of a binary built as `version`) has every process family,
/// described, with sane values (started in the past, some memory, threads and descriptors),
/// and `tidepool_build_info` 1 under `version` and a commit (hex, or `unknown`).
pub fn assert_process_series(exposition: &str, version: &str) {
    for family in PROCESS_FAMILIES {
        assert!(
            exposition.contains(&format!("# HELP {family} ")),
            "{family} not described:\n{exposition}"
        );
        let v = value(exposition, family).unwrap_or_else(|| panic!("{family}:\n{exposition}"));
        assert!(v >= 0.0, "{family} {v}");
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let started = value(exposition, "process_start_time_seconds").expect("start time");
    assert!(
        started > 0.0 && started <= now,
        "started {started}, now {now}"
    );
    for positive in [
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_threads",
    ] {
        let v = value(exposition, positive).expect("present");
        assert!(v > 0.0, "{positive} {v}");
    }
    let build: Vec<&str> = exposition
        .lines()
        .filter(|l| l.starts_with("tidepool_build_info{"))
        .collect();
    assert_eq!(
        build.len(),
        1,
        "one tidepool_build_info series:\n{exposition}"
    );
    let (labels, v) = build[0].rsplit_once(' ').expect("a sample");
    assert_eq!(v, "1", "{}", build[0]);
    let commit = labels
        .strip_prefix(&format!(
            "tidepool_build_info{{version=\"{version}\",commit=\""
        ))
        .and_then(|c| c.strip_suffix("\"}"))
        .unwrap_or_else(|| panic!("version {version} and a commit: {}", build[0]));
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "commit {commit:?}"
    );
}
