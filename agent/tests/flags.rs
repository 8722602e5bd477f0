//! The built `tidepool-agent` refuses a duration or count flag outside its range before it
//! does anything, naming the flag and the range it allows (issue 27, defect 9: `1ns` pinned
//! a core, a cooldown of `300000000000y` panicked the first DEL).

use std::process::Command;

/// Runs the agent with `flag value` (and the flags it needs); its exit success and stderr.
fn agent_with(flag: &str, value: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tidepool-agent"))
        .env_clear()
        .args(["--node-name", "node-a", "--pod-network", "10.250.0.0/16"])
        // never reached when the flags are refused; unreadable otherwise, so no wait
        .args(["--kubeconfig", "/nonexistent/kubeconfig"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args([flag, value])
        .output()
        .expect("run tidepool-agent");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn out_of_range_durations_and_counts_are_refused_naming_flag_and_range() {
    for (flag, value, range) in [
        ("--reconcile-interval", "1ns", "1s to 1h"),
        ("--reconcile-interval", "2h", "1s to 1h"),
        ("--reuse-cooldown", "300000000000y", "0s to 1h"),
        ("--reuse-cooldown", "2h", "0s to 1h"),
        ("--node-wait", "0s", "1s to 1h"),
        ("--node-wait", "1000d", "1s to 1h"),
        ("--node-routes-interval", "1ms", "1s to 1h"),
        ("--node-routes-interval", "1y", "1s to 1h"),
        ("--reconcile-max-frees", "0", "1 to 10000"),
        (
            "--reconcile-max-frees",
            "18446744073709551615",
            "1 to 10000",
        ),
    ] {
        let (ok, stderr) = agent_with(flag, value);
        assert!(!ok, "{flag} {value} accepted: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(value) && stderr.contains(range),
            "{flag} {value}: the error names neither the flag nor the range {range}: {stderr}"
        );
    }
}

/// The bounds themselves are accepted: the agent gets past its flags (and fails later, on
/// the missing kubeconfig).
#[test]
fn the_bounds_themselves_are_accepted() {
    for (flag, value) in [
        ("--reconcile-interval", "1s"),
        ("--reconcile-interval", "1h"),
        ("--reuse-cooldown", "0s"),
        ("--reuse-cooldown", "1h"),
        ("--node-wait", "1s"),
        ("--node-routes-interval", "1h"),
        ("--reconcile-max-frees", "1"),
        ("--reconcile-max-frees", "10000"),
    ] {
        let (ok, stderr) = agent_with(flag, value);
        assert!(!ok, "no kubeconfig: {stderr}");
        assert!(
            stderr.contains("--kubeconfig") && !stderr.contains(&format!("'{flag}")),
            "{flag} {value} refused: {stderr}"
        );
    }
}

/// `--node-routes` takes `=false` and `=true` as every other boolean does (issue 28: it
/// refused a value); anything else is refused naming the flag.
#[test]
fn node_routes_takes_a_value_as_every_boolean_does() {
    for value in ["false", "true"] {
        let (ok, stderr) = agent_with("--node-routes", value);
        assert!(!ok, "the kubeconfig is unreadable: {stderr}");
        assert!(
            !stderr.contains("--node-routes") && stderr.contains("kubeconfig"),
            "--node-routes {value} refused: {stderr}"
        );
    }
    let (ok, stderr) = agent_with("--node-routes", "maybe");
    assert!(!ok && stderr.contains("--node-routes"), "{stderr}");
}
