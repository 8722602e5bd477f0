//! tidepool-operator: `run` (against a cluster; not available yet), `simulate` (the real
//! engine on a simulated cluster), `check` and `crds` (not available yet).

mod cli;
mod simulate;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command, LogFormat};

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
    let cli = Cli::parse();
    if let Err(e) = init_logging(&cli) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let result = match &cli.command {
        Command::Simulate(f) => simulate::run(f),
        Command::Run(_) | Command::Check | Command::Crds => Err(anyhow::anyhow!(
            "this subcommand is not available yet; `simulate` is (see README.md)"
        )),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: an invariant was violated (see the report)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
