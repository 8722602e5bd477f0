//! A new user follows README.md from a clean clone: the quick start's own `sh cluster`
//! blocks, extracted from README.md (not retyped) and run in order in one `bash` from the
//! repository root, after the one rewrite `fences::SUBSTITUTION`. They start
//! `tidepool-apiserver`, apply the CRDs and the bundle, start the operator binary, apply the
//! default IPPool and a Node with a pod bound to it, and wait for blocks. Then this test
//! checks, with kubectl against the server README started: the IPPool is `Valid=True`, the
//! Node has an IPAMNode and blocks of the pool, and the operator that granted them is the one
//! README started before the pool existed, still running (no restart).
//!
//! The environment is the user's but for a fresh `TMPDIR` and `HOME` (README's `mktemp -d`
//! lands in the test's directory, where the kubeconfig is found) and no `KUBECONFIG`.
//! Every process README starts shares the shell's process group, which is killed at the end.
//! Needs kubectl on PATH and the workspace's binaries built.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod fences;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The shell README's blocks run in, its process group killed on drop, its directory removed.
struct Session {
    child: Child,
    dir: PathBuf,
}

impl Session {
    fn kill_group(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("session.log")).unwrap_or_default()
    }

    /// The processes of the session still running whose executable is named `name`.
    fn running(&self, name: &str) -> usize {
        let group = self.child.id().to_string();
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| {
                let p = e.ok()?.path();
                let stat = std::fs::read_to_string(p.join("stat")).ok()?;
                // pid (comm) state ppid pgrp ...: the fields after the last ')'
                let pgrp = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(2)?
                    .to_string();
                let exe = std::fs::read_link(p.join("exe")).ok()?;
                (pgrp == group && exe.file_name()? == name).then_some(())
            })
            .count()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.kill_group("-TERM");
        std::thread::sleep(Duration::from_millis(500));
        self.kill_group("-KILL");
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// README's `sh cluster` blocks, in order, rewritten.
fn readme_cluster_script() -> String {
    let blocks: Vec<_> = fences::fences("README.md")
        .into_iter()
        .filter(|f| f.is_shell() && f.tag.as_deref() == Some("cluster"))
        .collect();
    assert!(blocks.len() >= 3, "README's quick start: {blocks:?}");
    println!("rewrite: {}", fences::SUBSTITUTION);
    blocks
        .iter()
        .map(|f| format!("# {}\n{}", f.at, fences::substitute(&f.body)))
        .collect()
}

/// kubectl against the server README started, its kubeconfig found under `dir`.
fn kubectl(dir: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", dir)
        .output()
        .expect("kubectl on PATH");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The kubeconfig README's `mktemp -d` made under our TMPDIR.
fn find_kubeconfig(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path().join("kubeconfig")))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no kubeconfig under {}", dir.display()))
}

#[test]
fn readme_quick_start_grants_blocks_with_no_restart() {
    use std::os::unix::process::CommandExt;
    let script = readme_cluster_script();
    println!("{script}");
    let dir = std::env::temp_dir().join(format!("tidepool-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = std::fs::File::create(dir.join("session.log")).unwrap();
    let child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(fences::repo())
        .env("TMPDIR", &dir)
        .env("HOME", &dir)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("run bash");
    let mut session = Session { child, dir };
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(s) = session.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "README's quick start did not finish in 240 s:\n{}",
            session.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        status.success(),
        "README's quick start failed ({status}):\n{}",
        session.log()
    );
    let dir = session.dir.clone();
    let kc = find_kubeconfig(&dir);
    let valid = kubectl(
        &dir,
        &kc,
        &[
            "get",
            "ippool",
            "default",
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Valid")].status}"#,
        ],
    );
    assert_eq!(valid, "True", "{}", session.log());
    let node = kubectl(&dir, &kc, &["get", "ipamnode", "worker-1", "-o", "name"]);
    assert_eq!(node.trim(), "ipamnode.ipam.tidepool.dev/worker-1");
    let blocks = kubectl(
        &dir,
        &kc,
        &[
            "get",
            "ipamblocks",
            "-o",
            r#"jsonpath={range .items[*]}{.spec.node} {.spec.pool}{"\n"}{end}"#,
        ],
    );
    let granted: Vec<&str> = blocks.lines().collect();
    assert!(
        !granted.is_empty() && granted.iter().all(|l| *l == "worker-1 default"),
        "blocks: {blocks:?}\n{}",
        session.log()
    );
    // the pool's table as README shows it: counts people can read (`2^64`, `1.84e19`),
    // never a 20-digit IPv6 count
    let table = kubectl(&dir, &kc, &["get", "ippool", "default"]);
    let mut rows = table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>());
    let header = rows.next().expect("a header");
    let row = rows.next().expect("the default pool");
    for column in ["V4-FREE", "V6-FREE"] {
        let i = header.iter().position(|h| *h == column).expect(column);
        assert!(
            !row[i].is_empty() && row[i].len() <= 8,
            "{column} {:?}:\n{table}",
            row[i]
        );
    }
    assert_eq!(
        session.running("tidepool-operator"),
        1,
        "the operator README started is not running:\n{}",
        session.log()
    );
    println!(
        "granted {} blocks to worker-1; log:\n{}",
        granted.len(),
        session.log()
    );
    session.kill_group("-TERM");
}
