//! Sets `TIDEPOOL_COMMIT`, the commit `tidepool_build_info` reports (read by
//! `tidepool_metrics::build_info!`): `$TIDEPOOL_COMMIT` when set (an image build, whose
//! context has no .git: deploy/Dockerfile passes it), else `git rev-parse --short HEAD` in a
//! git checkout, else `unknown`. The agent's package runs this same script.
//!
//! Reruns when HEAD moves, so the commit is never stale: a checkout rewrites HEAD, a commit
//! rewrites the branch's ref (its loose file, or packed-refs once packed).

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TIDEPOOL_COMMIT");
    let commit = std::env::var("TIDEPOOL_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TIDEPOOL_COMMIT={commit}");
}

/// HEAD's abbreviated commit, with the files that move it watched; `None` outside a checkout
/// or without git.
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short", "HEAD"])?;
    watch(git(&[
        "rev-parse",
        "--path-format=absolute",
        "--git-path",
        "HEAD",
    ]));
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        let git_path = ["rev-parse", "--path-format=absolute", "--git-path"];
        watch(git(&[&git_path[..], &[branch.as_str()]].concat()));
        watch(git(&[&git_path[..], &["packed-refs"]].concat()));
    }
    Some(commit)
}

/// `git args`' trimmed output, if it succeeded with some.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// Reruns this script when `path` changes; only for a path that exists (Cargo reruns a
/// script on every build for one that does not).
fn watch(path: Option<String>) {
    if let Some(p) = path.filter(|p| Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={p}");
    }
}
