//! tidepool-operator: `run` (against a cluster, one replica), `simulate` (the real engine on
//! a simulated cluster), `check` (a read-only report) and `crds`.

mod check_cmd;
mod cli;
mod run;
mod simulate;

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::Parser;

use cli::{Cli, Command, LogFormat};

/// The system allocator, counting live heap bytes for the simulate report's memory figures
/// (`tidepool_sim::run::LIVE_HEAP_BYTES`). One relaxed atomic add per call.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_heap_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

fn init_logging(cli: &Cli) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
        .map_err(|e| anyhow::anyhow!("--log-level {:?}: {e}", cli.log_level))?;
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => fmt.init(),
        LogFormat::Json => fmt.json().init(),
    }
    Ok(())
}

fn main() -> ExitCode {
    let _ = tidepool_sim::run::LIVE_HEAP_BYTES.set(live_heap_bytes);
    let cli = Cli::parse();
    if let Err(e) = init_logging(&cli) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let result = match &cli.command {
        Command::Simulate(f) => simulate::run(f),
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
