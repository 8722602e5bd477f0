//! The `tidepool-agent` binary for node-a, run without root: its paths in a temp dir
//! ([`super::settings`]), `--metrics-addr` and `--health-addr` on loopback, JSON logs
//! collected from stderr, stopped with SIGTERM or killed when dropped.

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use super::{KillOnDrop, eventually, settings};

/// Starts the agent binary for node-a with `kubeconfig` (node-a's identity), serving
/// metrics on `metrics` and probes on `health`; it waits for node-a's IPAMNode up to 60 s.
pub fn start_agent(
    dir: &Path,
    kubeconfig: &Path,
    metrics: SocketAddr,
    health: SocketAddr,
) -> Agent {
    let s = settings(dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidepool-agent"))
        .env_clear()
        .args(["--node-name", "node-a", "--pod-network", "10.250.0.0/16"])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--socket")
        .arg(&s.socket)
        .arg("--state-dir")
        .arg(&s.state_dir)
        .arg("--restored-marker")
        .arg(&s.restored_marker)
        .args(["--node-wait", "60s"])
        .args(["--metrics-addr", &metrics.to_string()])
        .args(["--health-addr", &health.to_string()])
        .args(["--log-format", "json"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tidepool-agent");
    // read the log as it comes (a full pipe would stall the agent)
    let mut stderr = child.stderr.take().expect("stderr");
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    Agent {
        process: KillOnDrop(child),
        log: Some(log),
    }
}

/// The running agent binary; killed if the test ends (or fails) while it runs.
pub struct Agent {
    pub process: KillOnDrop,
    log: Option<std::thread::JoinHandle<String>>,
}

impl Agent {
    /// Waits for it to exit on its own (at most 60 s); the exit status and everything it
    /// logged.
    pub async fn exited(mut self) -> (std::process::ExitStatus, String) {
        let status = super::eventually_within(
            std::time::Duration::from_secs(60),
            "the agent exited",
            || {
                let r = self.process.0.try_wait().expect("wait");
                async move { r }
            },
        )
        .await;
        let log = self.log.take().expect("log").join().expect("log reader");
        (status, log)
    }

    /// SIGTERM; the exit status and everything it logged.
    pub async fn stop(mut self) -> (std::process::ExitStatus, String) {
        let pid = self.process.0.id().to_string();
        let killed = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(killed.success());
        let status = eventually("the agent exited", || {
            let r = self.process.0.try_wait().expect("wait");
            async move { r }
        })
        .await;
        let log = self.log.take().expect("log").join().expect("log reader");
        (status, log)
    }
}
