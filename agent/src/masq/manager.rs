//! The `--masquerade` loop: whenever the pod networks change, and every
//! [`Config::interval`], each family's chain is replaced and its jump ensured.

use std::process::Stdio;
use std::time::Duration;

use ipnet::IpNet;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::rules::{Family, jump, restore_input};

/// How `--masquerade` runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// `--non-masquerade-cidrs`: destinations reached with the pod's own address.
    pub non_masquerade: Vec<IpNet>,
    /// How often the chains are rewritten without a change (repairs a flushed chain).
    pub interval: Duration,
}

impl Config {
    /// Keeping `non_masquerade`, rewritten every 30 s without a change.
    pub fn new(non_masquerade: Vec<IpNet>) -> Self {
        Self {
            non_masquerade,
            interval: Duration::from_secs(30),
        }
    }
}

/// The running masquerade manager; dropping it stops it (the rules stay: pods keep
/// reaching the outside while the agent restarts).
#[derive(Debug)]
pub struct Masquerade {
    task: JoinHandle<()>,
}

impl Drop for Masquerade {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Masquerade {
    /// Keeps the rules for the pod networks `networks` gives, read again on each bump of
    /// `changes`.
    pub fn start(
        networks: impl Fn() -> Vec<IpNet> + Send + 'static,
        changes: watch::Receiver<u64>,
        config: Config,
    ) -> Self {
        Self {
            task: tokio::spawn(keep(networks, changes, config)),
        }
    }
}

async fn keep(
    networks: impl Fn() -> Vec<IpNet>,
    mut changes: watch::Receiver<u64>,
    config: Config,
) {
    let mut last: Option<Vec<IpNet>> = None;
    // per family: whether its chain may hold rules (unknown at start: cleared once, so a
    // family's pools removed while the agent was down leave no rule behind)
    let mut held = [true; 2];
    loop {
        changes.borrow_and_update();
        let pools = networks();
        if last.as_ref() != Some(&pools) {
            tracing::info!(pools = ?pools, keep = ?config.non_masquerade, "masquerading pods' traffic to outside these networks");
        }
        for (i, family) in Family::ALL.into_iter().enumerate() {
            let has = pools.iter().any(|n| family.holds(n));
            if !has && !held[i] {
                continue;
            }
            match pass(family, &pools, &config.non_masquerade).await {
                Ok(()) => held[i] = has,
                Err(why) if has => tracing::warn!(%why, "masquerade rules not applied"),
                // a family without pools on a node without its tables: nothing to clear
                Err(why) => {
                    tracing::debug!(%why, "masquerade chain not cleared");
                    held[i] = false;
                }
            }
        }
        last = Some(pools);
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            () = tokio::time::sleep(config.interval) => {}
        }
    }
}

/// One family: its chain replaced, then (with a pool of the family) its jump ensured.
pub async fn pass(family: Family, pools: &[IpNet], keep: &[IpNet]) -> Result<(), String> {
    let input = restore_input(family, pools, keep);
    run(family.restore(), &["-w", "--noflush"], Some(&input)).await?;
    let jump = jump();
    let jump: Vec<&str> = jump.iter().map(String::as_str).collect();
    let check = [&["-w", "-t", "nat", "-C"][..], &jump].concat();
    if run(family.iptables(), &check, None).await.is_err() {
        let add = [&["-w", "-t", "nat", "-A"][..], &jump].concat();
        run(family.iptables(), &add, None).await?;
    }
    Ok(())
}

/// Runs `bin args`, with `stdin` written to it; its stderr as the error.
async fn run(bin: &str, args: &[&str], stdin: Option<&str>) -> Result<(), String> {
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{bin}: {e}"))?;
    let mut input = child.stdin.take().expect("piped stdin");
    if let Some(text) = stdin {
        input
            .write_all(text.as_bytes())
            .await
            .map_err(|e| format!("{bin}: writing its input: {e}"))?;
    }
    drop(input);
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("{bin}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "{bin} {}: {}: {}",
            args.join(" "),
            out.status,
            err.trim()
        ))
    }
}
