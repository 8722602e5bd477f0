//! Serves tidepool's in-process Kubernetes API server on a port and writes a kubeconfig.
//!
//! `tidepool-apiserver [--port N] [--kubeconfig PATH] [--tls] [--rbac] [--identity NAME]...`
//! Each identity gets its own bearer token; the kubeconfig's context uses the first one and
//! one extra file `PATH.NAME` is written per further identity. An identity is `admin` (not
//! subject to authorization), `system:serviceaccount:NS:NAME`, or any user name, each
//! optionally bound to a node with `@NODE`. `--rbac` authorizes every request with the RBAC
//! objects and implies `--tls` (HTTPS with a self-signed certificate the kubeconfigs trust:
//! kubectl sends no token to a plain-HTTP server). Runs until interrupted.

use std::path::PathBuf;

use tidepool_tests::{ApiServer, Config};

fn usage() -> ! {
    eprintln!(
        "usage: tidepool-apiserver [--port N] [--kubeconfig PATH] [--tls] [--rbac] [--identity NAME]..."
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> Result<(), tidepool_tests::Error> {
    let mut port = 0u16;
    let mut kubeconfig = PathBuf::from("kubeconfig");
    let mut identities = Vec::new();
    let mut config = Config::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--port" => {
                port = args
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or_else(|| usage())
            }
            "--kubeconfig" => {
                kubeconfig = args.next().map(PathBuf::from).unwrap_or_else(|| usage())
            }
            "--identity" => identities.push(args.next().unwrap_or_else(|| usage())),
            // kubectl sends its token only over TLS, so authorization implies it.
            "--rbac" => (config.rbac, config.tls) = (true, true),
            "--tls" => config.tls = true,
            _ => usage(),
        }
    }
    if identities.is_empty() {
        identities.push(tidepool_tests::ADMIN.to_string());
    }
    let server = ApiServer::bind(config, ([127, 0, 0, 1], port).into()).await?;
    server.write_kubeconfig(&identities[0], &kubeconfig)?;
    for id in &identities[1..] {
        let mut p = kubeconfig.clone().into_os_string();
        p.push(format!(".{id}"));
        server.write_kubeconfig(id, &PathBuf::from(p))?;
    }
    println!(
        "serving {} (kubeconfig {})",
        server.url(),
        kubeconfig.display()
    );
    tokio::signal::ctrl_c().await?;
    server.shutdown();
    Ok(())
}
