//! `tidepool-cni`: the CNI IPAM plugin. Everything is in `tidepool_agent::cni::run`; this only
//! wires the process's environment, stdin and stdout to it.

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let getenv = |name: &str| std::env::var_os(name);
    let out = tidepool_agent::cni::run(&getenv, &mut std::io::stdin().lock());
    // a person's about line; nothing a runtime reads
    let _ = std::io::stderr().write_all(out.stderr.as_bytes());
    let mut stdout = std::io::stdout().lock();
    // If stdout is gone the runtime cannot read an answer anyway; the exit status still tells.
    let written = stdout
        .write_all(out.stdout.as_bytes())
        .and_then(|()| stdout.flush());
    match (written, out.exit_code) {
        (Ok(()), 0) => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}
