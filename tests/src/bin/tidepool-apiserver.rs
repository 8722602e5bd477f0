//! Serves tidepool's in-process Kubernetes API server on a port and writes a kubeconfig.
//!
//! `tidepool-apiserver [--port N] [--kubeconfig PATH] [--identity NAME]...`
//! Each identity gets its own bearer token; the kubeconfig's context uses the first one and
//! one extra file `PATH.NAME` is written per further identity. Runs until interrupted.

use std::path::PathBuf;

use tidepool_tests::{ApiServer, Config};

fn usage() -> ! {
    eprintln!("usage: tidepool-apiserver [--port N] [--kubeconfig PATH] [--identity NAME]...");
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> Result<(), tidepool_tests::Error> {
    let mut port = 0u16;
    let mut kubeconfig = PathBuf::from("kubeconfig");
    let mut identities = Vec::new();
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
            _ => usage(),
        }
    }
    if identities.is_empty() {
        identities.push("admin".to_string());
    }
    let server = ApiServer::bind(Config::default(), ([127, 0, 0, 1], port).into()).await?;
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
