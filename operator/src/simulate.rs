//! `tidepool-operator simulate`: the real engine on a simulated cluster.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Context;

use tidepool_ipam::sim::cloud::InstanceType;
use tidepool_ipam::sim::{
    CloudChoice, Report, SimConfig, SourceChoice, WarmUp, WorldConfig, simulate,
};
use tidepool_ipam::source::Faults;
use tidepool_ipam::types::{Family, PerFamily};

use crate::cli::{ReportFormat, SimulateFlags, SourceArg, WarmUpArg};

/// Builds the simulation from the flags; bad combinations fail here, before anything runs.
pub fn config(f: &SimulateFlags) -> anyhow::Result<SimConfig> {
    let source = match f.source {
        SourceArg::Memory => SourceChoice::Memory,
        SourceArg::SimCloud => {
            if f.dual_stack {
                anyhow::bail!("--dual-stack: sim-cloud serves IPv4 only");
            }
            if f.cloud_burst.is_some() && f.cloud_qps.is_none() {
                anyhow::bail!("--cloud-burst needs --cloud-qps");
            }
            let instance_type = InstanceType::by_name(&f.instance_type)
                .with_context(|| format!("--instance-type {}", f.instance_type))?;
            SourceChoice::SimCloud(CloudChoice {
                instance_type,
                subnet_size: f.subnet_size,
                rate_limit: f
                    .cloud_qps
                    .map(|q| (q, f.cloud_burst.unwrap_or_else(|| q.ceil().max(1.0) as u32))),
            })
        }
    };
    // sim-cloud nodes can hold what their instance type can address
    let max_pods = match source {
        SourceChoice::SimCloud(c) => {
            c.instance_type.max_pod_addresses().min(u64::from(u32::MAX)) as u32
        }
        SourceChoice::Memory => f.max_pods,
    };
    let families = if f.dual_stack {
        vec![Family::V4, Family::V6]
    } else {
        vec![Family::V4]
    };
    let cfg = SimConfig {
        world: WorldConfig {
            families,
            max_pods,
            capacity: PerFamily {
                v4: f.source_capacity,
                v6: f.source_capacity,
            },
            source_latency: f.cloud_latency,
            faults: Faults {
                error_rate: f.fault_rate,
                ..Faults::default()
            },
            reuse_cooldown: f.run.reuse_cooldown,
            engine: f.run.engine(),
            source_qps: f.run.api_qps,
            source_burst: f.run.api_burst,
            kube_qps: f.run.kube_api_qps,
            kube_burst: f.run.kube_api_burst,
            scheduling: f.run.scheduling(),
            seed: f.seed,
            ..WorldConfig::default()
        },
        source,
        nodes: f.nodes,
        pods_per_node: f.pods_per_node,
        churn: f.churn,
        crash_rate: f.crash_rate,
        node_churn: f.node_churn,
        duration: f.duration,
        warm_up: match f.warm_up {
            WarmUpArg::None => WarmUp::None,
            WarmUpArg::Steady => WarmUp::Steady,
        },
        report_nodes: f.report_nodes,
    };
    cfg.validate().context("invalid simulation")?;
    Ok(cfg)
}

/// Runs the simulation and prints the report. Returns whether every invariant held.
pub fn run(f: &SimulateFlags) -> anyhow::Result<bool> {
    let cfg = config(f)?;
    let mut rt = tokio::runtime::Builder::new_current_thread();
    rt.enable_time();
    if f.realtime {
        rt.enable_io();
    } else {
        rt.start_paused(true);
    }
    let rt = rt.build().context("building the runtime")?;
    let report = rt.block_on(async {
        if f.realtime {
            tidepool_metrics::install_exporter(f.metrics_addr)
                .with_context(|| format!("serving metrics on --metrics-addr {}", f.metrics_addr))?;
        }
        let show = std::io::stderr().is_terminal();
        let report = simulate(cfg, |done, total| {
            if show {
                progress(done, total);
            }
        })
        .await?;
        if show {
            eprintln!();
        }
        anyhow::Ok(report)
    })?;
    match f.report {
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        ReportFormat::Text => print!("{}", text(&report)),
    }
    Ok(report.invariants.double_allocations == 0
        && report.invariants.live_ip_reclaimed == 0
        && report.invariants.lost_allocations == 0)
}

fn progress(done: Duration, total: Duration) {
    let frac = (done.as_secs_f64() / total.as_secs_f64().max(1e-9)).clamp(0.0, 1.0);
    let width = 30;
    let filled = (frac * width as f64).round() as usize;
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r[{}{}] {:>3.0}%  simulated {} of {}",
        "=".repeat(filled),
        " ".repeat(width - filled),
        frac * 100.0,
        humantime::format_duration(Duration::from_secs(done.as_secs())),
        humantime::format_duration(Duration::from_secs(total.as_secs())),
    );
    let _ = err.flush();
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

/// The readable summary.
pub fn text(r: &Report) -> String {
    let inv = &r.invariants;
    let verdict = if inv.double_allocations + inv.live_ip_reclaimed + inv.lost_allocations == 0 {
        "all invariants held"
    } else {
        "INVARIANTS VIOLATED"
    };
    format!(
        "tidepool simulate: {verdict}\n\
         convergence      {} s after t0 (converged: {})\n\
         simulated        {:.0} s in {:.2} s wall, {} CPU s, peak RSS {} MiB, {:.0} events/s\n\
         nodes            {} total, {} in deficit, {} at capacity, {} blocked\n\
         addresses        {} allocated, {} used, {} free, {} cooling down\n\
         api              {} source calls, {} kube writes, {} conflicts, {} throttled\n\
         pods             {} started, {} deleted, {} leaked by crashes, {} waited for an address\n\
         ip wait (s)      p50 {}  p99 {}  max {}\n\
         reclaim          {} reclaimed, {} held by min age; latency (s) p50 {}  p99 {}  max {}\n\
         invariants       {} double allocations, {} live addresses reclaimed, {} lost\n",
        opt(r.convergence_seconds),
        r.converged,
        r.virtual_seconds,
        r.wall_seconds,
        opt(r.cpu_seconds),
        r.peak_rss_bytes
            .map_or("-".into(), |b| format!("{:.1}", b as f64 / 1048576.0)),
        r.events_per_second,
        r.nodes.total,
        r.nodes.in_deficit,
        r.nodes.at_capacity,
        r.nodes.blocked,
        r.ips.allocated,
        r.ips.used,
        r.ips.free,
        r.ips.cooldown,
        r.api.source_calls,
        r.api.kube_writes,
        r.api.conflicts,
        r.api.throttled,
        r.pods.started,
        r.pods.deleted,
        r.pods.leaked_by_crash,
        r.pods.waited_for_ip,
        opt(r.pods.ip_wait_seconds.p50),
        opt(r.pods.ip_wait_seconds.p99),
        opt(r.pods.ip_wait_seconds.max),
        r.reclaim.reclaimed,
        r.reclaim.held_by_min_age,
        opt(r.reclaim.latency_seconds.p50),
        opt(r.reclaim.latency_seconds.p99),
        opt(r.reclaim.latency_seconds.max),
        inv.double_allocations,
        inv.live_ip_reclaimed,
        inv.lost_allocations,
    )
}
