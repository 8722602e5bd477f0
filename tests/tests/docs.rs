//! Every command of README.md and docs/*.md runs, so the docs cannot drift from the code.
//!
//! Each shell block with no tag runs with `bash -euo pipefail` from the repository root and
//! must exit 0, after the one rewrite `fences::SUBSTITUTION` (printed by the test). A shell
//! block tagged with one of `TAGS` is left to what the tag names; any other tag, a
//! block with no language, or one in a language that is not in `NOT_COMMANDS` fails.
//! Needs the workspace's binaries built (`cargo test --workspace` builds them).
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod fences;

use std::collections::BTreeSet;
use std::process::Command;

use fences::Fence;

/// Fence tags of shell blocks that are not run by `docs.rs`, and why.
pub const TAGS: &[(&str, &str)] = &[
    (
        "cluster",
        "talks to a cluster: README's are run by quickstart.rs against a tidepool-apiserver",
    ),
    (
        "ci",
        "a build or test command: CI runs it (bash scripts/test.sh runs this very test)",
    ),
];

/// Languages of blocks that hold no command to run.
pub const NOT_COMMANDS: &[&str] = &["text", "yaml", "json", "rust"];

/// README.md and every docs/*.md, in a stable order.
pub fn doc_files() -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(fences::repo().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    let mut files = vec!["README.md".to_string()];
    files.extend(docs);
    files
}

/// Every fenced block of the docs, each checked to be a command block or plainly not one.
fn checked_fences() -> Vec<Fence> {
    let mut all = Vec::new();
    let mut problems = Vec::new();
    for file in doc_files() {
        for f in fences::fences(&file) {
            if f.is_shell() {
                if let Some(tag) = &f.tag
                    && !TAGS.iter().any(|(t, _)| t == tag)
                {
                    problems.push(format!("{}: unknown tag `{tag}`", f.at));
                }
            } else if !NOT_COMMANDS.contains(&f.lang.as_str()) {
                problems.push(format!(
                    "{}: a block in `{}`: commands go in ```sh, other text in one of {:?}",
                    f.at, f.lang, NOT_COMMANDS
                ));
            }
            all.push(f);
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    all
}

#[test]
fn every_fence_is_run_or_says_why_not() {
    for (tag, why) in TAGS {
        println!("```sh {tag}: {why}");
    }
    let all = checked_fences();
    let shell = all.iter().filter(|f| f.is_shell()).count();
    assert!(shell >= 5, "only {shell} shell blocks found: {all:?}");
    // README's quick start is run by quickstart.rs: it must have its cluster steps.
    assert!(
        all.iter()
            .any(|f| f.at.starts_with("README.md:") && f.tag.as_deref() == Some("cluster")),
        "README.md has no `sh cluster` block for quickstart.rs to run"
    );
}

#[test]
fn every_untagged_command_runs_from_the_repository_root() {
    println!("rewrite: {}", fences::SUBSTITUTION);
    let mut seen = BTreeSet::new();
    let mut blocks = Vec::new();
    for f in checked_fences() {
        if !f.is_shell() || f.tag.is_some() || !seen.insert(f.body.clone()) {
            continue;
        }
        let script = fences::substitute(&f.body);
        assert!(
            !script.contains("cargo "),
            "{}: a command block runs cargo beyond `cargo run -p X --`; tag it `ci`:\n{}",
            f.at,
            f.body
        );
        blocks.push((f.at, script));
    }
    assert!(!blocks.is_empty(), "no command ran");
    // The blocks are independent (none writes a file another reads), and each simulation
    // runs on one thread: run them side by side, so that the test takes its longest block's
    // time rather than their sum.
    let failures: Vec<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = blocks
            .iter()
            .map(|(at, script)| scope.spawn(move || run_block(at, script)))
            .collect();
        runs.into_iter()
            .filter_map(|r| r.join().expect("a block's thread panicked"))
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Runs one command block with `bash -euo pipefail` from the repository root, printing it and
/// how it ended; a failure's description, if it failed.
fn run_block(at: &str, script: &str) -> Option<String> {
    let started = std::time::Instant::now();
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(fences::repo())
        .output()
        .expect("run bash");
    println!(
        "{at}:\n{script}\n  exit {:?} in {:.1?}",
        out.status.code(),
        started.elapsed()
    );
    (!out.status.success()).then(|| {
        format!(
            "{at} exited {:?}:\n{script}\nstdout:\n{}\nstderr:\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn the_substitution_is_the_only_rewrite() {
    let bin = fences::bin_dir().join("tidepool-operator");
    if !bin.is_file() {
        // substitute() names the build command when the binary is missing
        fences::substitute("cargo run -p tidepool-operator -- x");
    }
    let dir = fences::bin_dir().display().to_string();
    for (from, to) in [
        (
            "cargo run --release -p tidepool-operator -- simulate --nodes 5",
            format!("{dir}/tidepool-operator simulate --nodes 5"),
        ),
        (
            "a && cargo run -p tidepool-tests --bin tidepool-apiserver -- --port 0 &",
            format!("a && {dir}/tidepool-apiserver --port 0 &"),
        ),
        (
            "kubectl apply -k deploy/ # cargo run is named here",
            "kubectl apply -k deploy/ # cargo run is named here".to_string(),
        ),
    ] {
        assert_eq!(fences::substitute(from), to);
    }
}
