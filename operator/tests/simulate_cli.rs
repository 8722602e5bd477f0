//! The `simulate` binary end to end: scenario errors exit 2 before anything runs,
//! `--seeds` and `--compare-scheduling` print the JSON their sections describe, `crds` prints
//! what `deploy/crds/` holds.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tidepool-operator"))
}

/// The binary run with `args` and `--report json`: it exits 0; its report.
fn json_report(args: &[&str]) -> serde_json::Value {
    let out = bin()
        .args(args)
        .args(["--report", "json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("tidepool-cli-{}-{name}", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_bad_scenario_exits_2_naming_file_and_phase() {
    let path = temp_file(
        "bad.yaml",
        "phases:\n- kind: churn\n  at: 1m\n  churn: 1\n- kind: volcano\n  at: 2m\n",
    );
    let out = bin()
        .args(["simulate", "--scenario", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(path.to_str().unwrap()) && err.contains("phase #2 (volcano)"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing ran");
    let _ = std::fs::remove_file(path);
}

const SMALL: &str = "duration: 3m\nstart: {nodes: 6, pods_per_node: 4, churn: 1, crash_rate: 0.2, node_churn: 0}\n\
phases:\n\
- kind: watermark-change\n  at: 0\n  group: idle\n  min_allocate: 32\n\
- kind: scale-up\n  at: 5s\n  every: 30s\n  duration: 2m\n  nodes: 8\n  pods_per_node: 0\n  group: idle\n\
- kind: scale-up\n  at: 7s\n  every: 30s\n  duration: 2m\n  pods: 12\n  share: 0.5\n\
- kind: brown-out\n  at: 1m\n  duration: 20s\n  error_rate: 0.05\n";

#[test]
fn seeds_print_one_report_per_seed() {
    let path = temp_file("seeds.yaml", SMALL);
    let scenario = ["simulate", "--scenario", path.to_str().unwrap()];
    let v = json_report(&[&scenario[..], &["--seeds", "1..3", "--jobs", "2"]].concat());
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    assert_eq!(runs[2]["seed"], 3);
    assert!(runs[0]["report"]["pods"]["started"].as_u64().unwrap() > 0);
    assert_eq!(v["runs_violating"], 0);
    let _ = std::fs::remove_file(path);
}

#[test]
fn compare_scheduling_prints_both_modes_side_by_side() {
    let path = temp_file("compare.yaml", SMALL);
    let scenario = ["simulate", "--scenario", path.to_str().unwrap()];
    let v = json_report(&[&scenario[..], &["--compare-scheduling", "--seeds", "1,2"]].concat());
    let seeds = v["seeds"].as_array().unwrap();
    assert_eq!(seeds.len(), 2);
    for s in seeds {
        for mode in ["priority", "fifo"] {
            assert!(s[mode]["p99"].is_number(), "{s}");
            assert!(s[mode]["p50"].is_number(), "{s}");
        }
    }
    assert!(v["mean"]["priority"]["p99"].is_number());
    assert!(v["mean"]["fifo"]["p99"].is_number());
    assert!(v["priority_not_worse_at_p99"].is_boolean());
    assert_eq!(v["invariants"]["lost_allocations"], 0);
    // the text form has the table and the verdict
    let out = bin()
        .args(["simulate", "--scenario", path.to_str().unwrap()])
        .args(["--compare-scheduling", "--seeds", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("priority p50") && text.contains("mean over 1 seeds"),
        "{text}"
    );
    let _ = std::fs::remove_file(path);
}

/// The text summary says what convergence means under churn instead of a bare "-", and
/// how the drain went; a violation exits 1 and lists each violating address.
#[test]
fn the_text_summary_explains_convergence_and_lists_violations() {
    let small = ["simulate", "--nodes", "20", "--duration", "5m"];
    let out = bin().args(small).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("convergence      does not apply under churn"),
        "{text}"
    );
    assert!(!text.contains("converged: false"), "{text}");
    let out = bin()
        .args(small)
        .args(["--churn", "0", "--node-churn", "0", "--crash-rate", "0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("s after t0 (every node settled from then on)"),
        "{text}"
    );
    // half the source calls fail and nothing may run past the tail: the retries still
    // queued count as lost, and each is named
    let out = bin()
        .args(small)
        .args(["--fault-rate", "0.5", "--drain-limit", "0s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("INVARIANTS VIOLATED"), "{text}");
    assert!(text.contains("  violation      10."), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the report lists the violations"), "{err}");
    // a warm-up that ends inside the bring-up is named, with the pods it leaves waiting
    let out = bin()
        .args(small)
        .args([
            "--warm-up",
            "steady",
            "--api-qps",
            "0.02",
            "--api-burst",
            "1",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("pods still waited for an address when the measured period began"),
        "{text}"
    );
    assert!(
        !String::from_utf8_lossy(&bin().args(small).output().unwrap().stdout)
            .contains("measured period began")
    );
}

/// An IPv6-only cluster: a pool of one IPv6 CIDR gives every pod an IPv6 address.
#[test]
fn an_ipv6_only_pool_runs_with_ipv6_only_pods() {
    let v = json_report(&[
        "simulate",
        "--source",
        "cluster-pool",
        "--pool-cidr",
        "fd00:10::/64",
        "--nodes",
        "10",
        "--duration",
        "3m",
    ]);
    // 10 nodes x 30 pods, one address each: every one from the IPv6-only pool
    assert_eq!(v["ips"]["used"], 300, "{v}");
    assert_eq!(v["invariants"]["lost_allocations"], 0);
}

/// `crds` prints the three CRDs, exactly as `deploy/crds/` holds them.
#[test]
fn crds_prints_what_deploy_crds_holds() {
    let out = bin().arg("crds").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let printed = String::from_utf8(out.stdout).unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    let files: String = ["ippools.yaml", "ipamblocks.yaml", "ipamnodes.yaml"]
        .iter()
        .map(|f| format!("---\n{}", std::fs::read_to_string(dir.join(f)).unwrap()))
        .collect();
    assert_eq!(printed, files);
    for name in ["ippools", "ipamblocks", "ipamnodes"] {
        assert!(printed.contains(&format!("name: {name}.ipam.tidepool.dev")));
    }
}

/// Runs sharing the process (`--seeds --jobs 2`) report their own CPU time and leave the
/// process-wide figures (peak RSS, the engine's heap per address) null.
#[test]
fn seeds_report_per_run_figures_only() {
    let v = json_report(&[
        "simulate",
        "--nodes",
        "10",
        "--duration",
        "2m",
        "--seeds",
        "1..2",
        "--jobs",
        "2",
    ]);
    for run in v["runs"].as_array().unwrap() {
        let r = &run["report"];
        assert!(r["peak_rss_bytes"].is_null(), "{r}");
        assert!(r["memory"]["engine_bytes_per_address"].is_null(), "{r}");
        assert!(r["cpu_seconds"].as_f64().is_some_and(|c| c >= 0.0), "{r}");
    }
    // alone, a run reports them
    let out = bin()
        .args([
            "simulate",
            "--nodes",
            "10",
            "--duration",
            "2m",
            "--report",
            "json",
        ])
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["peak_rss_bytes"].as_u64().is_some_and(|b| b > 0), "{r}");
}

/// A metrics port in use: exit 2, the flag and the cause named once (issue 11: the cause
/// was printed twice).
#[test]
fn a_metrics_port_in_use_is_named_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = bin()
        .args([
            "simulate",
            "--realtime",
            "--metrics-addr",
            &addr,
            "--duration",
            "1m",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("--metrics-addr {addr}")), "{err}");
    assert_eq!(err.matches("Address already in use").count(), 1, "{err}");
}

/// A /26 of /28 blocks (64 addresses) for 10 nodes x 30 pods: the pods that never got an
/// address are counted (`pods.never_served`: every pod that waited in the measured period
/// and never got one), headlined with their cause, and `--fail-on-unserved` exits 1 on
/// them. Before: "all invariants held", "0 waited for an address", exit 0.
#[test]
fn pods_that_never_got_an_address_are_counted_and_headlined() {
    let exhausted = [
        "simulate",
        "--source",
        "cluster-pool",
        "--pool-cidr",
        "10.0.0.0/26",
        "--nodes",
        "10",
        "--pods-per-node",
        "30",
        "--duration",
        "2m",
        "--churn",
        "0",
        "--node-churn",
        "0",
        "--crash-rate",
        "0",
    ];
    let v = json_report(&exhausted);
    let started = v["pods"]["started"].as_u64().unwrap();
    let never = v["pods"]["never_served"]
        .as_u64()
        .expect("pods.never_served");
    // no churn: every one of the 300 pods either got an address or never did
    assert_eq!(started + never, 300, "{v}");
    // at most the pool's 62 usable addresses are used (node-00000 keeps some spare)
    assert!(never >= 300 - 62, "{v}");
    assert_eq!(
        v["pods"]["never_served_cause"], "the pool is exhausted",
        "{v}"
    );
    let out = bin().args(exhausted).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let headline = text.lines().next().unwrap();
    assert!(
        headline.contains(&format!(
            "{never} pods never got an address: the pool is exhausted"
        )),
        "{text}"
    );
    let out = bin()
        .args(exhausted)
        .arg("--fail-on-unserved")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{never} pods never got an address")),
        "{err}"
    );
    // a pool with room: 0, present, and --fail-on-unserved passes
    let roomy = [
        "simulate",
        "--source",
        "cluster-pool",
        "--pool-cidr",
        "10.0.0.0/16",
        "--nodes",
        "10",
        "--duration",
        "2m",
        "--fail-on-unserved",
    ];
    let v = json_report(&roomy);
    assert_eq!(v["pods"]["never_served"], 0, "{v}");
}

/// The text report echoes its inputs, prints the lower bound next to convergence, and says
/// when the bring-up's waits make the percentiles, naming the flag that limits it.
#[test]
fn the_text_report_echoes_inputs_and_names_a_dominating_bring_up() {
    let out = bin()
        .args([
            "simulate",
            "--nodes",
            "50",
            "--duration",
            "3m",
            "--api-qps",
            "4",
        ])
        .args(["--churn", "0", "--node-churn", "0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("inputs           50 nodes × 30 pods, source memory, churn 0/node/min"),
        "{text}"
    );
    assert!(text.contains("lower bound "), "{text}");
    assert!(text.contains("the bring-up dominates"), "{text}");
    assert!(text.contains("--api-qps 4"), "{text}");
    // with a steady warm-up the bring-up is not measured, and not named
    let out = bin()
        .args([
            "simulate",
            "--nodes",
            "50",
            "--duration",
            "3m",
            "--warm-up",
            "steady",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("the bring-up dominates"), "{text}");
}

/// Addresses per family; IPv6 counts in blocks (`10 × /64`), and no memory line per
/// address where a /64 per node makes it meaningless.
#[test]
fn addresses_are_reported_per_family_with_readable_ipv6_counts() {
    let out = bin()
        .args(["simulate", "--source", "cluster-pool"])
        .args(["--pool-cidr", "10.0.0.0/16", "--pool-cidr", "fd00:10::/48"])
        .args(["--block-size-v6", "64", "--nodes", "10", "--duration", "2m"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ipv4 addresses "), "{text}");
    assert!(
        text.contains("ipv6 addresses   10 × /64 allocated"),
        "{text}"
    );
    assert!(!text.contains("18446744073709551616"), "{text}");
    assert!(!text.contains("bytes per address"), "{text}");
    // where addresses are few, the memory line stays, explained
    let out = bin()
        .args(["simulate", "--nodes", "10", "--duration", "2m"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("bytes per allocated address"), "{text}");
}
