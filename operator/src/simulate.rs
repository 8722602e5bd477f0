//! `tidepool-operator simulate`: the real engine on a simulated cluster.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use tidepool_ipam::Faults;
use tidepool_ipam::SchedulingMode;
use tidepool_ipam::{Family, PerFamily};
use tidepool_sim::cloud::InstanceType;
use tidepool_sim::run::{Quantiles, simulate_many};
use tidepool_sim::scenario::Scenario;
use tidepool_sim::{
    CloudChoice, Invariants, PoolChoice, Report, SimConfig, SourceChoice, WarmUp, WorldConfig,
    simulate,
};

use crate::cli::{self, ReportFormat, SimulateFlags, SourceArg, WarmUpArg};

/// Builds the simulation from the flags; bad combinations fail here, before anything runs.
pub fn config(f: &SimulateFlags) -> anyhow::Result<SimConfig> {
    let source = source(f)?;
    // sim-cloud nodes can hold what their instance type can address
    let max_pods = match &source {
        SourceChoice::SimCloud(c) => {
            c.instance_type.max_pod_addresses().min(u64::from(u32::MAX)) as u32
        }
        SourceChoice::Memory | SourceChoice::ClusterPool(_) => f.max_pods,
    };
    let scenario = match &f.scenario {
        Some(path) => Some(Arc::new(Scenario::load(path)?)),
        None => None,
    };
    let start = scenario.as_ref().map(|s| s.start).unwrap_or_default();
    let nodes = f.nodes.or(start.nodes).unwrap_or(cli::DEFAULT_NODES);
    let duration = f
        .duration
        .or(scenario.as_ref().and_then(|s| s.duration))
        .unwrap_or(cli::DEFAULT_DURATION);
    if let Some(s) = &scenario {
        // the scenario's own errors, named by file and phase, before anything runs
        s.check(duration, nodes, max_pods, &f.run.engine().watermarks)?;
    }
    let families = families(f, &source)?;
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
            source_qps: f.api_qps,
            source_burst: f.api_burst,
            kube_qps: f.run.kube_api_qps,
            kube_burst: f.run.kube_api_burst,
            scheduling: f.run.scheduling(),
            seed: f.seed,
            ..WorldConfig::default()
        },
        source,
        nodes,
        pods_per_node: f
            .pods_per_node
            .or(start.pods_per_node)
            .unwrap_or(cli::DEFAULT_PODS_PER_NODE),
        churn: f.churn.or(start.churn).unwrap_or(cli::DEFAULT_CHURN),
        crash_rate: f
            .crash_rate
            .or(start.crash_rate)
            .unwrap_or(cli::DEFAULT_CRASH_RATE),
        node_churn: f
            .node_churn
            .or(start.node_churn)
            .unwrap_or(cli::DEFAULT_NODE_CHURN),
        duration,
        warm_up: match f.warm_up {
            WarmUpArg::None => WarmUp::None,
            WarmUpArg::Steady => WarmUp::Steady,
        },
        report_nodes: f.report_nodes,
        scenario,
        drain_limit: f.drain_limit,
    };
    cfg.validate().context("invalid simulation")?;
    Ok(cfg)
}

/// The IP source the flags choose, with the flags that belong to it checked.
fn source(f: &SimulateFlags) -> anyhow::Result<SourceChoice> {
    let cluster_pool_only = [
        ("--pool-cidr", !f.pool_cidrs.is_empty()),
        ("--block-size", f.block_size != 28),
        ("--block-size-v6", f.block_size_v6 != 124),
    ];
    if f.source != SourceArg::ClusterPool
        && let Some((flag, _)) = cluster_pool_only.iter().find(|(_, set)| *set)
    {
        anyhow::bail!("{flag} needs --source cluster-pool");
    }
    Ok(match f.source {
        SourceArg::Memory => SourceChoice::Memory,
        SourceArg::ClusterPool => {
            if f.pool_cidrs.is_empty() {
                anyhow::bail!("--source cluster-pool needs at least one --pool-cidr");
            }
            SourceChoice::ClusterPool(PoolChoice {
                cidrs: f.pool_cidrs.clone(),
                block_size: PerFamily {
                    v4: f.block_size,
                    v6: f.block_size_v6,
                },
            })
        }
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
    })
}

/// The pods' address families: a cluster pool's serve them (an IPv6-only pool makes an
/// IPv6-only cluster, and --dual-stack then only insists on both), else --dual-stack.
fn families(f: &SimulateFlags, source: &SourceChoice) -> anyhow::Result<Vec<Family>> {
    Ok(match source {
        SourceChoice::ClusterPool(p) if !f.dual_stack => {
            let spec = p.spec(&[]).context("invalid simulation")?;
            Family::ALL
                .into_iter()
                .filter(|&f| spec.serves(f))
                .collect()
        }
        _ if f.dual_stack => vec![Family::V4, Family::V6],
        _ => vec![Family::V4],
    })
}

/// What a run's exit status reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Clean,
    /// An invariant was violated.
    Violated,
    /// With --fail-on-unserved: this many pods never got an address.
    Unserved(u64),
}

impl Outcome {
    fn of(violated: bool, never_served: u64, f: &SimulateFlags) -> Outcome {
        match (violated, never_served) {
            (true, _) => Outcome::Violated,
            (false, n) if n > 0 && f.fail_on_unserved => Outcome::Unserved(n),
            _ => Outcome::Clean,
        }
    }
}

/// Runs the simulation (or the seeds, or the comparison) and prints the report.
pub fn run(f: &SimulateFlags) -> anyhow::Result<Outcome> {
    if f.realtime && (f.seeds.is_some() || f.compare_scheduling) {
        anyhow::bail!("--realtime runs one simulation: not with --seeds or --compare-scheduling");
    }
    if f.jobs.is_some() && f.seeds.is_none() && !f.compare_scheduling {
        anyhow::bail!("--jobs needs --seeds or --compare-scheduling");
    }
    if f.compare_scheduling {
        return compare(f);
    }
    if let Some(seeds) = &f.seeds {
        return many_seeds(f, &seeds.0);
    }
    let cfg = config(f)?;
    let inputs = cfg.clone();
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
            tidepool_metrics::install_exporter_with(
                f.metrics_addr,
                tidepool_metrics::Binary::Operator,
                tidepool_metrics::build_info!(),
                f.run.gauge_idle_timeout(),
            )
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
        ReportFormat::Text => print!("{}", text(&report, &inputs)),
    }
    Ok(Outcome::of(
        violated(&report.invariants),
        report.pods.never_served,
        f,
    ))
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

/// The readable summary of a run of `cfg`.
pub fn text(r: &Report, cfg: &SimConfig) -> String {
    let inv = &r.invariants;
    let mut out = format!(
        "tidepool simulate: {}\n\
         inputs           {}\n\
         convergence      {}; lower bound {} s{}\n\
         simulated        {:.0} s ({}) in {:.2} s wall, {} CPU s, peak RSS {} MiB, {:.0} events/s\n\
         nodes            {} total, {} in deficit, {} at capacity, {} blocked\n",
        headline(r),
        inputs(cfg),
        convergence(r, cfg.churns()),
        opt(r.lower_bound_seconds),
        match (&r.limited_by, r.lower_bound_seconds) {
            (Some(l), Some(s)) if s > 0.0 => format!(" (limited by {l})"),
            _ => String::new(),
        },
        r.virtual_seconds,
        drain(r),
        r.wall_seconds,
        opt(r.cpu_seconds),
        r.peak_rss_bytes
            .map_or("-".into(), |b| format!("{:.1}", b as f64 / 1048576.0)),
        r.events_per_second,
        r.nodes.total,
        r.nodes.in_deficit,
        r.nodes.at_capacity,
        r.nodes.blocked,
    );
    out += &address_lines(r, cfg);
    out += &format!(
        "api              {} source calls, {} kube writes, {} conflicts, {} throttled\n\
         pods             {} started, {} deleted, {} leaked by crashes, {} waited for an address, {} never got one\n\
         ip wait (s)      p50 {}  p99 {}  max {}\n",
        r.api.source_calls,
        r.api.kube_writes,
        r.api.conflicts,
        r.api.throttled,
        r.pods.started,
        r.pods.deleted,
        r.pods.leaked_by_crash,
        r.pods.waited_for_ip,
        r.pods.never_served,
        opt(r.pods.ip_wait_seconds.p50),
        opt(r.pods.ip_wait_seconds.p99),
        opt(r.pods.ip_wait_seconds.max),
    );
    out += &bring_up_note(r);
    out += &format!(
        "reclaim          {} reclaimed, {} held by min age; latency (s) p50 {}  p99 {}  max {}\n",
        r.reclaim.reclaimed,
        r.reclaim.held_by_min_age,
        opt(r.reclaim.latency_seconds.p50),
        opt(r.reclaim.latency_seconds.p99),
        opt(r.reclaim.latency_seconds.max),
    );
    out += &scarcity_line(r);
    out += &memory_line(r);
    out += &format!(
        "invariants       {} double allocations, {} live addresses reclaimed, {} lost{}\n",
        inv.double_allocations,
        inv.live_ip_reclaimed,
        inv.lost_allocations,
        outside_line(inv),
    );
    if r.pods.waiting_at_start > 0 {
        out.push_str(&format!(
            "  warning        {} pods still waited for an address when the measured period \
             began (not in ip wait): the warm-up did not reach a steady state, so the \
             figures include the end of the bring-up\n",
            r.pods.waiting_at_start
        ));
    }
    for v in &r.violations {
        out.push_str(&format!("  violation      {v}\n"));
    }
    out
}

/// The verdict on the invariants, and the pods that never got an address with their cause.
fn headline(r: &Report) -> String {
    let verdict = if violated(&r.invariants) {
        "INVARIANTS VIOLATED"
    } else {
        "all invariants held"
    };
    match r.pods.never_served {
        0 => verdict.into(),
        n => format!(
            "{verdict}; {n} pods never got an address: {}",
            r.pods
                .never_served_cause
                .as_deref()
                .unwrap_or("cause unknown")
        ),
    }
}

/// What was simulated: the workload, the source and its pools, the churn.
fn inputs(cfg: &SimConfig) -> String {
    let families = &cfg.world.families;
    let source = match &cfg.source {
        SourceChoice::Memory => "memory".to_string(),
        SourceChoice::ClusterPool(p) => {
            let blocks: Vec<String> = (families.iter())
                .map(|&f| format!("/{}", p.block_size.get(f)))
                .collect();
            format!(
                "cluster-pool ({}; {} blocks)",
                p.cidrs.join(", "),
                blocks.join(" and ")
            )
        }
        SourceChoice::SimCloud(c) => {
            format!(
                "sim-cloud ({}, /{} subnets)",
                c.instance_type.name, c.subnet_size
            )
        }
    };
    let names: Vec<&str> = families.iter().map(|f| f.as_str()).collect();
    format!(
        "{} nodes × {} pods, source {source}, churn {}/node/min, crash rate {}, node churn {}/h, \
         {}, {} active, warm-up {}{}",
        cfg.nodes,
        cfg.pods_per_node,
        cfg.churn,
        cfg.crash_rate,
        cfg.node_churn,
        names.join(" and "),
        humantime::format_duration(cfg.duration),
        match cfg.warm_up {
            WarmUp::None => "none",
            WarmUp::Steady => "steady",
        },
        if cfg.scenario.is_some() {
            ", with a scenario"
        } else {
            ""
        },
    )
}

/// One line per family the pods use; a cluster pool's large counts in its blocks.
fn address_lines(r: &Report, cfg: &SimConfig) -> String {
    let block = |f: Family| match &cfg.source {
        SourceChoice::ClusterPool(p) => Some(*p.block_size.get(f)),
        _ => None,
    };
    let mut out = String::new();
    for (f, ips) in [(Family::V4, r.ips.ipv4), (Family::V6, r.ips.ipv6)] {
        if let Some(ips) = ips {
            out += &format!(
                "{:<17}{} allocated, {} used, {} free, {} cooling down\n",
                format!("{} addresses", f.as_str()),
                count(ips.allocated, block(f)),
                ips.used,
                count(ips.free, block(f)),
                ips.cooldown,
            );
        }
    }
    out
}

/// At most 2^32 addresses, the number; past that, in blocks of /`block` (`500 × /64`, or
/// `500 × /64 − 3000`), else in scientific notation.
fn count(n: u128, block: Option<u8>) -> String {
    const PLAIN: u128 = 1 << 32;
    if n <= PLAIN {
        return n.to_string();
    }
    let in_blocks = block.filter(|b| *b < 128).and_then(|b| {
        let unit = 1u128 << (128 - u32::from(b));
        let blocks = n.div_ceil(unit);
        let short = blocks.checked_mul(unit)? - n;
        match short {
            0 => Some(format!("{blocks} × /{b}")),
            s if s <= PLAIN => Some(format!("{blocks} × /{b} − {s}")),
            _ => None,
        }
    });
    in_blocks.unwrap_or_else(|| format!("{:.3e}", n as f64))
}

/// When the bring-up's waits make the percentiles: say so, and what limits it.
fn bring_up_note(r: &Report) -> String {
    if !r.pods.bring_up_dominates() {
        return String::new();
    }
    let why = match (&r.limited_by, r.lower_bound_seconds) {
        (Some(l), Some(s)) if s >= 1.0 => {
            format!("its calls are limited by {l} (lower bound {s:.3} s)")
        }
        _ => match &r.pods.never_served_cause {
            Some(cause) => format!("its pods waited because {cause}"),
            None => "its pods waited for addresses".into(),
        },
    };
    format!(
        "  note           the bring-up dominates these waits: p99 {} s with its {} pods, {}; \
         {why}; --warm-up steady measures past it\n",
        opt(r.pods.ip_wait_seconds.p99),
        r.pods.bring_up,
        r.pods
            .ip_wait_seconds_after_bring_up
            .p99
            .map_or("and no pod was scheduled later".into(), |p| format!(
                "p99 {p:.3} s without them"
            )),
    )
}

/// The scarcity section in a line, when a pool became scarce (docs/simulate.md "Scarcity").
fn scarcity_line(r: &Report) -> String {
    let s = &r.scarcity;
    if s.episodes == 0 {
        return String::new();
    }
    format!(
        "scarcity         {} episodes; {} pods waited past {:.3} s while a unit idled elsewhere \
         ({:.3} s beyond); pod-waiting {:.3} s, oracle {:.3} s\n",
        s.episodes,
        s.idle_while_waiting.pods,
        s.promise_seconds,
        s.idle_while_waiting.seconds,
        s.wait_seconds,
        s.oracle_wait_seconds,
    )
}

/// Heap bytes per allocated address; left out past 2^32 addresses (a /64 block per node),
/// where a figure per address means nothing.
fn memory_line(r: &Report) -> String {
    if r.ips.allocated > 1 << 32 {
        return String::new();
    }
    format!(
        "memory           {} bytes per allocated address in the engine (its live heap, \
         measured), {:.1} in the simulated world (estimated from its structures)\n",
        r.memory
            .engine_bytes_per_address
            .map_or("-".into(), |b| format!("{b:.1}")),
        r.memory.world_bytes_per_address,
    )
}

/// The convergence line: under churn every deletion starts a cooldown and a short-lived
/// excess, so no node stays settled and convergence does not apply.
fn convergence(r: &Report, churns: bool) -> String {
    match r.convergence_seconds {
        Some(s) => format!("{s:.3} s after t0 (every node settled from then on)"),
        None if churns => "does not apply under churn (pods kept changing to the end, so \
                           no node stays settled; a pure scale-up converges)"
            .into(),
        None => "not reached: some node was still short of or above its target at the end \
                 of the active period"
            .into(),
    }
}

/// How much of the run was drain tail past its nominal end, waiting for queued work.
fn drain(r: &Report) -> String {
    if r.drain_extra_seconds > 0.0 {
        format!(
            "{:.0} s of it past the drain tail for queued work",
            r.drain_extra_seconds
        )
    } else {
        "queued work done within the drain tail".into()
    }
}

fn jobs(f: &SimulateFlags) -> usize {
    f.jobs.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |j| j as usize,
    )
}

/// Runs `cfgs` in virtual time, `--jobs` at once, with a progress line on a terminal.
fn run_all(f: &SimulateFlags, cfgs: Vec<SimConfig>) -> anyhow::Result<Vec<Report>> {
    let show = std::io::stderr().is_terminal();
    let wall = std::time::Instant::now();
    let results = simulate_many(cfgs, jobs(f), &|done, total| {
        if show {
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r{done}/{total} runs, {:.0} s",
                wall.elapsed().as_secs_f64()
            );
            let _ = err.flush();
        }
    });
    if show {
        eprintln!();
    }
    results
        .into_iter()
        .map(|r| r.map_err(anyhow::Error::from))
        .collect()
}

/// The pool invariant's count, shown only when broken (runs without pools of their own
/// cannot break it).
fn outside_line(i: &Invariants) -> String {
    match i.outside_pod_pool {
        0 => String::new(),
        n => format!(", {n} addresses outside their pods' pools"),
    }
}

fn violated(i: &Invariants) -> bool {
    !i.ok()
}

fn add(a: &mut Invariants, b: &Invariants) {
    a.double_allocations += b.double_allocations;
    a.live_ip_reclaimed += b.live_ip_reclaimed;
    a.lost_allocations += b.lost_allocations;
    a.outside_pod_pool += b.outside_pod_pool;
}

#[derive(Serialize)]
struct SeedRun {
    seed: u64,
    report: Report,
}

/// `--seeds`: one report per seed.
#[derive(Serialize)]
struct SeedsReport {
    runs: Vec<SeedRun>,
    /// Runs with an invariant violated.
    runs_violating: u64,
    invariants: Invariants,
    wall_seconds: f64,
}

fn many_seeds(f: &SimulateFlags, seeds: &[u64]) -> anyhow::Result<Outcome> {
    let base = config(f)?;
    let wall = std::time::Instant::now();
    let cfgs = seeds
        .iter()
        .map(|&seed| {
            let mut c = base.clone();
            c.world.seed = seed;
            c
        })
        .collect();
    let reports = run_all(f, cfgs)?;
    let mut out = SeedsReport {
        runs: Vec::new(),
        runs_violating: 0,
        invariants: Invariants::default(),
        wall_seconds: 0.0,
    };
    for (seed, report) in seeds.iter().zip(reports) {
        out.runs_violating += u64::from(violated(&report.invariants));
        add(&mut out.invariants, &report.invariants);
        out.runs.push(SeedRun {
            seed: *seed,
            report,
        });
    }
    out.wall_seconds = wall.elapsed().as_secs_f64();
    match f.report {
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&out)?),
        ReportFormat::Text => print!("{}", seeds_text(&out)),
    }
    let never_served = out.runs.iter().map(|r| r.report.pods.never_served).sum();
    Ok(Outcome::of(out.runs_violating > 0, never_served, f))
}

fn seeds_text(r: &SeedsReport) -> String {
    let mut s = String::from(
        "seed   converged  ip wait p50/p99 (s)  reclaimed  source calls  invariants (double/live/lost)\n",
    );
    for run in &r.runs {
        let p = &run.report;
        let i = &p.invariants;
        s += &format!(
            "{:<6} {:<10} {:>8} / {:<9} {:>9}  {:>12}  {}/{}/{}{}\n",
            run.seed,
            p.converged,
            opt(p.pods.ip_wait_seconds.p50),
            opt(p.pods.ip_wait_seconds.p99),
            p.reclaim.reclaimed,
            p.api.source_calls,
            i.double_allocations,
            i.live_ip_reclaimed,
            i.lost_allocations,
            if violated(i) { "  VIOLATED" } else { "" },
        );
    }
    s += &format!(
        "{} runs in {:.1} s wall: {} with an invariant violated ({} double allocations, {} live addresses reclaimed, {} lost{})\n",
        r.runs.len(),
        r.wall_seconds,
        r.runs_violating,
        r.invariants.double_allocations,
        r.invariants.live_ip_reclaimed,
        r.invariants.lost_allocations,
        outside_line(&r.invariants),
    );
    s
}

/// One mode's pod waits in one run.
#[derive(Serialize, Clone, Copy)]
struct Waits {
    p50: Option<f64>,
    p99: Option<f64>,
    max: Option<f64>,
    waited_for_ip: u64,
    started: u64,
}

impl Waits {
    fn of(r: &Report) -> Waits {
        let Quantiles { p50, p99, max } = r.pods.ip_wait_seconds;
        Waits {
            p50,
            p99,
            max,
            waited_for_ip: r.pods.waited_for_ip,
            started: r.pods.started,
        }
    }
}

#[derive(Serialize)]
struct CompareSeed {
    seed: u64,
    priority: Waits,
    fifo: Waits,
}

#[derive(Serialize)]
struct MeanWaits {
    p50: f64,
    p99: f64,
}

#[derive(Serialize)]
struct CompareMeans {
    priority: MeanWaits,
    fifo: MeanWaits,
}

/// `--compare-scheduling`: the same workload under both admission orders.
#[derive(Serialize)]
struct CompareReport {
    seeds: Vec<CompareSeed>,
    /// Over the seeds (a run where no pod started counts 0).
    mean: CompareMeans,
    /// DESIGN's target: priority's mean p99 at most FIFO's.
    priority_not_worse_at_p99: bool,
    /// Seeds where priority's p99 is above FIFO's.
    seeds_priority_worse_at_p99: u64,
    invariants: Invariants,
    wall_seconds: f64,
}

fn compare(f: &SimulateFlags) -> anyhow::Result<Outcome> {
    let base = config(f)?;
    let seeds: Vec<u64> = f.seeds.as_ref().map_or_else(
        || (1..=cli::DEFAULT_COMPARE_SEEDS).collect(),
        |s| s.0.clone(),
    );
    let wall = std::time::Instant::now();
    let mut cfgs = Vec::new();
    for &seed in &seeds {
        for mode in [SchedulingMode::Priority, SchedulingMode::Fifo] {
            let mut c = base.clone();
            c.world.seed = seed;
            c.world.scheduling = mode;
            cfgs.push(c);
        }
    }
    let reports = run_all(f, cfgs)?;
    let mut inv = Invariants::default();
    let mut rows = Vec::new();
    for (seed, pair) in seeds.iter().zip(reports.chunks(2)) {
        add(&mut inv, &pair[0].invariants);
        add(&mut inv, &pair[1].invariants);
        rows.push(CompareSeed {
            seed: *seed,
            priority: Waits::of(&pair[0]),
            fifo: Waits::of(&pair[1]),
        });
    }
    let n = rows.len().max(1) as f64;
    let mean = |g: fn(&CompareSeed) -> Option<f64>| {
        rows.iter().map(|r| g(r).unwrap_or(0.0)).sum::<f64>() / n
    };
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let means = CompareMeans {
        priority: MeanWaits {
            p50: r3(mean(|r| r.priority.p50)),
            p99: r3(mean(|r| r.priority.p99)),
        },
        fifo: MeanWaits {
            p50: r3(mean(|r| r.fifo.p50)),
            p99: r3(mean(|r| r.fifo.p99)),
        },
    };
    let out = CompareReport {
        priority_not_worse_at_p99: means.priority.p99 <= means.fifo.p99,
        seeds_priority_worse_at_p99: rows
            .iter()
            .filter(|r| r.priority.p99.unwrap_or(0.0) > r.fifo.p99.unwrap_or(0.0))
            .count() as u64,
        seeds: rows,
        mean: means,
        invariants: inv,
        wall_seconds: wall.elapsed().as_secs_f64(),
    };
    match f.report {
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&out)?),
        ReportFormat::Text => print!("{}", compare_text(&out)),
    }
    // --fail-on-unserved does not go with --compare-scheduling
    Ok(Outcome::of(violated(&inv), 0, f))
}

fn compare_text(r: &CompareReport) -> String {
    let mut s =
        String::from("pod wait for an address (s)   priority p50     p99   |   fifo p50     p99\n");
    for row in &r.seeds {
        s += &format!(
            "seed {:<24} {:>8} {:>8}   |   {:>8} {:>8}{}\n",
            row.seed,
            opt(row.priority.p50),
            opt(row.priority.p99),
            opt(row.fifo.p50),
            opt(row.fifo.p99),
            if row.priority.p99.unwrap_or(0.0) > row.fifo.p99.unwrap_or(0.0) {
                "   (priority worse at p99)"
            } else {
                ""
            },
        );
    }
    s += &format!(
        "mean over {} seeds            {:>8.3} {:>8.3}   |   {:>8.3} {:>8.3}\n",
        r.seeds.len(),
        r.mean.priority.p50,
        r.mean.priority.p99,
        r.mean.fifo.p50,
        r.mean.fifo.p99,
    );
    s += &format!(
        "priority is {} at p99 on average ({:.3} s against {:.3} s; worse on {} of {} seeds); invariants: {} double allocations, {} live addresses reclaimed, {} lost; {:.1} s wall\n",
        if r.priority_not_worse_at_p99 {
            "not worse than FIFO"
        } else {
            "WORSE than FIFO"
        },
        r.mean.priority.p99,
        r.mean.fifo.p99,
        r.seeds_priority_worse_at_p99,
        r.seeds.len(),
        r.invariants.double_allocations,
        r.invariants.live_ip_reclaimed,
        r.invariants.lost_allocations,
        r.wall_seconds,
    );
    s
}

#[cfg(test)]
mod tests {
    use super::count;

    /// Counts past 2^32 read in blocks (issue: a /64 per node printed 20-digit numbers).
    #[test]
    fn large_counts_read_in_blocks() {
        assert_eq!(count(300, Some(64)), "300");
        assert_eq!(count(500 << 64, Some(64)), "500 × /64");
        assert_eq!(count((500 << 64) - 3000, Some(64)), "500 × /64 − 3000");
        assert_eq!(count(1 << 40, None), "1.100e12");
        assert_eq!(count(u128::MAX, Some(64)), "3.403e38");
    }
}
