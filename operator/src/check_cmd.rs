//! `tidepool-operator check`: the client (as `run` builds it), the library's check
//! ([`tidepool_operator::check::io::run`]), the report on stdout, and the exit status: 0
//! when nothing needs a person, 1 when something does, 2 on errors (bad flags are clap's 2).

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use tidepool_operator::check::{self, Report};

use crate::cli::{CheckCmd, CheckOutput};

/// Runs the check and prints its report; errors go to stderr with exit status 2.
pub fn run(f: &CheckCmd) -> ExitCode {
    let written = report(f).and_then(|r| {
        let text = render(&r, f.output);
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .context("writing the report")?;
        Ok(r.exit_code())
    });
    match written {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn report(f: &CheckCmd) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async {
        let client = crate::run::client(f.kubeconfig.as_deref(), f.timeout).await?;
        Ok(check::io::run(&client).await?)
    })
}

fn render(r: &Report, output: CheckOutput) -> String {
    match output {
        CheckOutput::Table => check::table(r),
        CheckOutput::Json => r.to_json() + "\n",
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use crate::cli::{CheckOutput, Cli, Command};

    fn parse(args: &[&str]) -> Result<crate::cli::CheckCmd, String> {
        let argv = ["tidepool-operator", "check"].iter().chain(args);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Check(f) => Ok(f),
            other => panic!("not check: {other:?}"),
        }
    }

    #[test]
    fn flags_and_their_defaults() {
        let f = parse(&[]).unwrap();
        assert_eq!(f.output, CheckOutput::Table);
        assert_eq!(f.timeout, Duration::from_secs(30));
        assert_eq!(f.kubeconfig, None);
        let f = parse(&["-o", "json", "--kubeconfig", "/k", "--timeout", "2s"]).unwrap();
        assert_eq!(f.output, CheckOutput::Json);
        assert_eq!(f.kubeconfig.as_deref(), Some(std::path::Path::new("/k")));
        assert_eq!(f.timeout, Duration::from_secs(2));
        let e = parse(&["--output", "yaml"]).unwrap_err();
        assert!(e.contains("--output"), "{e}");
        let e = parse(&["--timeout", "10ms"]).unwrap_err();
        assert!(e.contains("--timeout") && e.contains("at least 1s"), "{e}");
    }

    /// An unreachable server is an error (exit status 2), after the bounded wait.
    #[test]
    fn an_unreachable_server_is_an_error() {
        let dir = std::env::temp_dir().join(format!("tidepool-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kubeconfig");
        // a port nothing listens on: bind one, then let it go
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let kc = serde_json::json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "x", "cluster": {"server": format!("http://127.0.0.1:{port}")}}],
            "users": [{"name": "x", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
        });
        std::fs::write(&path, kc.to_string()).unwrap();
        let f = parse(&["--kubeconfig", path.to_str().unwrap(), "--timeout", "1s"]).unwrap();
        let e = format!("{:#}", super::report(&f).unwrap_err());
        assert!(e.contains("did not answer within 1s"), "{e}");
        assert_eq!(super::run(&f), std::process::ExitCode::from(2));
        let e = parse(&["--kubeconfig", "/nonexistent/kubeconfig"]).unwrap();
        let e = format!("{:#}", super::report(&e).unwrap_err());
        assert!(e.contains("--kubeconfig /nonexistent/kubeconfig"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
