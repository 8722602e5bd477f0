//! tidepool-operator: `run` (against a cluster, one replica), `simulate` (the real engine on
//! a simulated cluster), `check` (a read-only report) and `crds`.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod check_cmd;
mod cli;
mod run;
mod simulate;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command, LogFormat};
use tidepool_sim::alloc::CountingAllocator;

/// jemalloc, counting live heap bytes for the simulate report's memory figures
/// (`tidepool_sim::run::LIVE_HEAP_BYTES`; only `simulate` starts the count). jemalloc, not
/// glibc's malloc: at 150,000 pods the operator's RSS in steady state was ~20 MB lower with
/// it, the rest of glibc's freed but fragmented (BENCHMARKS.md, issue 31).
#[cfg(not(tidepool_system_malloc))]
#[global_allocator]
static ALLOCATOR: CountingAllocator<tikv_jemallocator::Jemalloc> =
    CountingAllocator::over(tikv_jemallocator::Jemalloc);

/// glibc's malloc, for a heap profiler that hooks it (heaptrack does not see jemalloc's
/// prefixed symbols): `RUSTFLAGS="--cfg tidepool_system_malloc"` (BENCHMARKS.md, "What grew
/// from minute 2").
#[cfg(tidepool_system_malloc)]
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

fn live_heap_bytes() -> usize {
    usize::try_from(ALLOCATOR.live_bytes()).unwrap_or(0)
}

/// Logs on stderr, coloured only on a terminal; `info` unless simulating.
fn init_logging(cli: &Cli) -> anyhow::Result<()> {
    let level = cli.log_level.as_deref().unwrap_or(match cli.command {
        Command::Simulate(_) => "warn",
        _ => "info",
    });
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .map_err(|e| anyhow::anyhow!("--log-level {level:?}: {e}"))?;
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => fmt.init(),
        LogFormat::Json => fmt.json().init(),
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Simulate(_)) {
        ALLOCATOR.start();
        let _ = tidepool_sim::run::LIVE_HEAP_BYTES.set(live_heap_bytes);
    }
    if let Err(e) = init_logging(&cli) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let result = match &cli.command {
        Command::Simulate(f) => match simulate::run(f) {
            Ok(simulate::Outcome::Unserved(n)) => {
                eprintln!(
                    "error: {n} pods never got an address (--fail-on-unserved; the report says why)"
                );
                return ExitCode::from(1);
            }
            r => r.map(|o| o == simulate::Outcome::Clean),
        },
        Command::Crds => {
            print!("{}", tidepool_api::crds_yaml());
            Ok(true)
        }
        Command::Run(f) => run::run(f),
        // its own exit status: 0 clean, 1 something needs a person, 2 an error
        Command::Check(f) => return check_cmd::run(f),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: an invariant was violated (the report lists the violations)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
