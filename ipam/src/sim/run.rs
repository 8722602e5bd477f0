//! `simulate`: a workload on the simulated world, the drain tail, and the report whose
//! fields DESIGN.md fixes.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::time::Instant;

use crate::error::IpamError;
use crate::sim::cloud::{CloudFaults, InstanceType, SimCloud};
use crate::sim::observer::Invariants;
use crate::sim::world::{SimSource, World, WorldConfig};
use crate::types::{Family, NodeName};
use crate::watermarks::Watermarks;

/// Whether steady state is reached before the measured period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmUp {
    None,
    Steady,
}

/// Which IP source the simulated cluster draws from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SourceChoice {
    /// The in-memory per-address source (any count in one call).
    Memory,
    /// The ENI-like simulated cloud.
    SimCloud(CloudChoice),
}

/// The simulated cloud's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CloudChoice {
    pub instance_type: InstanceType,
    /// Prefix length of each subnet (one subnet per 1,000 nodes).
    pub subnet_size: u8,
    /// The cloud's own rate limit (qps, burst); None = unlimited.
    pub rate_limit: Option<(f64, u32)>,
}

/// A simulate run: the world and its workload.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub world: WorldConfig,
    pub source: SourceChoice,
    pub nodes: u32,
    pub pods_per_node: u32,
    /// Pod replacements per node per minute.
    pub churn: f64,
    /// Share of deletions that never release their address.
    pub crash_rate: f64,
    /// Node losses per hour.
    pub node_churn: f64,
    /// The active period.
    pub duration: Duration,
    pub warm_up: WarmUp,
    pub report_nodes: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            world: WorldConfig::default(),
            source: SourceChoice::Memory,
            nodes: 200,
            pods_per_node: 30,
            churn: 2.0,
            crash_rate: 0.05,
            node_churn: 1.0,
            duration: Duration::from_secs(600),
            warm_up: WarmUp::None,
            report_nodes: false,
        }
    }
}

impl SimConfig {
    /// Rejects settings that cannot run, naming the flag.
    pub fn validate(&self) -> Result<(), IpamError> {
        let bad = |name: &'static str, value: String, reason: &str| {
            Err(IpamError::InvalidSetting {
                name,
                value,
                reason: reason.into(),
            })
        };
        if self.nodes == 0 {
            return bad("nodes", "0".into(), "must be at least 1");
        }
        if let SourceChoice::SimCloud(c) = &self.source {
            // the subnet layout and the cloud's rate limit are checked as the run builds them
            let cloud = SimCloud::for_nodes(u64::from(self.nodes), c.subnet_size, 0)?;
            if let Some((qps, burst)) = c.rate_limit {
                cloud.with_rate_limit(qps, burst)?;
            }
        }
        if let SourceChoice::SimCloud(c) = &self.source
            && u64::from(self.pods_per_node) > c.instance_type.max_pod_addresses()
        {
            return bad(
                "pods-per-node",
                self.pods_per_node.to_string(),
                &format!(
                    "{} can address at most {} pods (--instance-type)",
                    c.instance_type.name,
                    c.instance_type.max_pod_addresses()
                ),
            );
        }
        if self.pods_per_node > self.world.max_pods {
            return bad(
                "pods-per-node",
                self.pods_per_node.to_string(),
                &format!(
                    "above the nodes' allocatable pods (--max-pods {})",
                    self.world.max_pods
                ),
            );
        }
        for (name, v) in [("churn", self.churn), ("node-churn", self.node_churn)] {
            if !v.is_finite() || v < 0.0 {
                return bad(name, v.to_string(), "must be a finite number ≥ 0");
            }
        }
        if !(0.0..=1.0).contains(&self.crash_rate) {
            return bad(
                "crash-rate",
                self.crash_rate.to_string(),
                "must be within 0..=1",
            );
        }
        if self.duration.is_zero() {
            return bad("duration", "0s".into(), "must be positive");
        }
        if self.world.families.is_empty() {
            return bad("families", "none".into(), "at least one address family");
        }
        self.world.engine.validate()
    }

    /// The drain tail after the active period: every leak reclaimable and every excess
    /// releasable by its end.
    pub fn drain_tail(&self) -> Duration {
        let e = &self.world.engine;
        e.reclaim.grace.max(e.reclaim.min_age)
            + self.world.reuse_cooldown
            + e.release.delay
            + e.resync_interval
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Quantiles {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

impl Quantiles {
    fn of(mut v: Vec<f64>) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
            Some(round3(v[i]))
        };
        Self {
            p50: q(0.50),
            p99: q(0.99),
            max: q(1.0),
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct NodesReport {
    pub total: u64,
    pub in_deficit: u64,
    pub at_capacity: u64,
    pub blocked: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct IpsReport {
    pub allocated: u64,
    pub used: u64,
    pub free: u64,
    pub cooldown: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ApiReport {
    pub source_calls: u64,
    pub source_calls_minimum: Option<u64>,
    pub kube_writes: u64,
    pub conflicts: u64,
    pub throttled: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PodsReport {
    pub started: u64,
    pub deleted: u64,
    pub leaked_by_crash: u64,
    pub waited_for_ip: u64,
    pub ip_wait_seconds: Quantiles,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ReclaimReport {
    pub reclaimed: u64,
    pub held_by_min_age: u64,
    pub latency_seconds: Quantiles,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeDetail {
    pub name: String,
    pub allocated: u64,
    pub used: u64,
    pub cooldown: u64,
    pub needed: u64,
    pub excess: u64,
    pub blocked: Option<&'static str>,
}

/// The simulate report (DESIGN.md "simulate"). With the same seed two reports are equal
/// except for `wall_seconds`, `cpu_seconds`, `peak_rss_bytes` and `events_per_second`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub converged: bool,
    pub convergence_seconds: Option<f64>,
    pub lower_bound_seconds: Option<f64>,
    pub virtual_seconds: f64,
    pub wall_seconds: f64,
    pub cpu_seconds: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    pub events_per_second: f64,
    pub nodes: NodesReport,
    pub ips: IpsReport,
    pub api: ApiReport,
    pub pods: PodsReport,
    pub reclaim: ReclaimReport,
    pub invariants: Invariants,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_details: Option<Vec<NodeDetail>>,
}

impl Report {
    /// The report with its machine-dependent fields zeroed, for comparisons.
    pub fn deterministic(&self) -> Report {
        Report {
            wall_seconds: 0.0,
            cpu_seconds: None,
            peak_rss_bytes: None,
            events_per_second: 0.0,
            ..self.clone()
        }
    }
}

enum Ev {
    Churn,
    NodeLoss,
    NodeDelete(NodeName),
}

/// Exponential inter-arrival time for a Poisson process of `per_second`.
fn next_after(rng: &mut SmallRng, per_second: f64) -> Option<Duration> {
    if per_second <= 0.0 {
        return None;
    }
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    Some(Duration::from_secs_f64(-u.ln() / per_second))
}

struct Workload {
    rng: SmallRng,
    heap: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    evs: Vec<Option<Ev>>,
    seq: u64,
    next_node: u32,
}

impl Workload {
    fn push(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        self.evs.push(Some(ev));
        self.heap.push(Reverse((at, self.seq, self.evs.len() - 1)));
    }
}

/// Runs a simulation to its end and reports. `progress` is called with the virtual time
/// done and the total, about once per simulated second.
pub async fn simulate(
    cfg: SimConfig,
    progress: impl FnMut(Duration, Duration),
) -> Result<Report, IpamError> {
    cfg.validate()?;
    let wall = std::time::Instant::now();
    let cpu0 = cpu_seconds();
    match cfg.source {
        SourceChoice::Memory => {
            let world = World::start(cfg.world.clone())?;
            drive(world, &cfg, progress, wall, cpu0).await
        }
        SourceChoice::SimCloud(c) => {
            let nodes = u64::from(cfg.nodes);
            let world = World::start_with(cfg.world.clone(), |w, observer| {
                let mut cloud = SimCloud::for_nodes(nodes, c.subnet_size, w.seed)?
                    .with_instance_type(c.instance_type)
                    .with_latency(w.source_latency)
                    .with_hook(observer);
                if let Some((qps, burst)) = c.rate_limit {
                    cloud = cloud.with_rate_limit(qps, burst)?;
                }
                cloud.set_faults(CloudFaults {
                    error_rate: w.faults.error_rate,
                    throttle_rate: w.faults.throttle_rate,
                    retry_after: w.faults.retry_after,
                    lost_reply_rate: w.faults.lost_reply_rate,
                    ..CloudFaults::default()
                });
                Ok(cloud)
            })?;
            drive(world, &cfg, progress, wall, cpu0).await
        }
    }
}

/// Runs the workload on a started world to the end of its drain tail and reports.
async fn drive<S: SimSource>(
    world: World<S>,
    cfg: &SimConfig,
    mut progress: impl FnMut(Duration, Duration),
    wall: std::time::Instant,
    cpu0: Option<f64>,
) -> Result<Report, IpamError> {
    let cfg = cfg.clone();
    let start = Instant::now();
    let mut wl = Workload {
        rng: SmallRng::seed_from_u64(cfg.world.seed ^ 0x5eed),
        heap: BinaryHeap::new(),
        evs: Vec::new(),
        seq: 0,
        next_node: 0,
    };
    for _ in 0..cfg.nodes {
        add_node_with_pods(&world, &cfg, &mut wl);
    }
    let warm = match cfg.warm_up {
        WarmUp::None => Duration::ZERO,
        WarmUp::Steady => cfg.drain_tail(),
    };
    let t0 = start + warm;
    let active_end = t0 + cfg.duration;
    let end = active_end + cfg.drain_tail();
    let total = end - start;
    let churn_rate = |w: &World<S>| cfg.churn / 60.0 * w.live_nodes().len() as f64;
    if let Some(d) = next_after(&mut wl.rng, churn_rate(&world)) {
        wl.push(start + d, Ev::Churn);
    }
    if let Some(d) = next_after(&mut wl.rng, cfg.node_churn / 3600.0) {
        wl.push(start + d, Ev::NodeLoss);
    }
    let mut measuring = warm.is_zero();
    // each node's state at t0, and the call oracle at the end of the active period
    let mut at_t0 = if measuring {
        snapshot(&world)
    } else {
        BTreeMap::new()
    };
    let mut oracle: Option<Oracle> = None;
    let mut settled_since: Option<Instant> = Some(t0);
    let mut next_sample = t0;
    let mut last_progress = start;
    loop {
        let now = Instant::now();
        if !measuring && now >= t0 {
            world.start_measuring();
            measuring = true;
            at_t0 = snapshot(&world);
        }
        if oracle.is_none() && now >= active_end {
            oracle = Some(minimum_calls(&world, &cfg, &at_t0));
        }
        if now >= next_sample && now <= active_end {
            if world.all_settled() {
                settled_since.get_or_insert(now);
            } else {
                settled_since = None;
            }
            next_sample += Duration::from_secs(1);
        }
        if now.duration_since(last_progress) >= Duration::from_secs(1) {
            progress(now - start, total);
            last_progress = now;
        }
        if now >= end {
            break;
        }
        let next_ev = wl.heap.peek().map(|Reverse((t, _, _))| *t);
        let mut wake = end.min(next_sample.max(now + Duration::from_millis(1)));
        if !measuring {
            wake = wake.min(t0);
        }
        if let Some(t) = next_ev {
            wake = wake.min(t);
        }
        tokio::time::sleep_until(wake).await;
        while let Some(Reverse((t, _, i))) = wl.heap.peek().copied() {
            if t > Instant::now() {
                break;
            }
            wl.heap.pop();
            let ev = wl.evs[i].take().expect("each event runs once");
            let active = t < active_end;
            match ev {
                Ev::Churn if active => {
                    churn(&world, &cfg, &mut wl);
                    if let Some(d) = next_after(&mut wl.rng, churn_rate(&world)) {
                        wl.push(t + d, Ev::Churn);
                    }
                }
                Ev::NodeLoss if active => {
                    let live = world.live_nodes();
                    if live.len() > 1 {
                        let n = live[wl.rng.random_range(0..live.len())].clone();
                        world.vanish_machine(&n);
                        wl.push(t + Duration::from_secs(60), Ev::NodeDelete(n));
                    }
                    if let Some(d) = next_after(&mut wl.rng, cfg.node_churn / 3600.0) {
                        wl.push(t + d, Ev::NodeLoss);
                    }
                }
                Ev::NodeDelete(n) => {
                    world.delete_node_object(&n);
                    if active {
                        add_node_with_pods(&world, &cfg, &mut wl);
                    }
                }
                Ev::Churn | Ev::NodeLoss => {}
            }
        }
    }
    progress(total, total);
    let oracle = oracle.unwrap_or_else(|| minimum_calls(&world, &cfg, &at_t0));
    let report = build_report(&world, &cfg, t0, settled_since, wall, cpu0, &oracle);
    world.shutdown();
    Ok(report)
}

/// DESIGN.md's call oracle: the fewest source calls C that take every node from its state
/// at t0 to its target for the demand at the end of the active period, and the lower
/// bound on convergence it implies.
#[derive(Debug, Clone, Copy, Default)]
struct Oracle {
    calls: u64,
    lower_bound_seconds: f64,
}

fn snapshot<S: SimSource>(world: &World<S>) -> BTreeMap<NodeName, Vec<u64>> {
    world
        .live_nodes()
        .into_iter()
        .map(|n| {
            let s = world.source.snapshot(&n);
            (n, s)
        })
        .collect()
}

/// The pool a node's demand calls for: the smallest with nothing needed, within its cap.
fn target_pool(w: &Watermarks, demand: u64, cap: u64) -> u64 {
    let mut t = (demand + u64::from(w.pre_allocate)).max(u64::from(w.min_allocate));
    if w.max_allocate > 0 {
        t = t.min(u64::from(w.max_allocate));
    }
    t.min(cap)
}

fn minimum_calls<S: SimSource>(
    world: &World<S>,
    cfg: &SimConfig,
    at_t0: &BTreeMap<NodeName, Vec<u64>>,
) -> Oracle {
    let w = &cfg.world.engine.watermarks;
    let cap = u64::from(cfg.world.max_pods);
    let mut calls = 0;
    let mut chain = 0;
    for node in world.live_nodes() {
        let used = world.node(&node).map_or(0, |n| n.node.used.len() as u64);
        let demand = used + world.waiting_on(&node) as u64;
        let from = at_t0.get(&node).map(Vec::as_slice).unwrap_or(&[]);
        let c = world
            .source
            .minimum_calls(from, target_pool(w, demand, cap));
        calls += c;
        chain = chain.max(c);
    }
    let (mut qps, mut burst) = (cfg.world.source_qps, u64::from(cfg.world.source_burst));
    if let Some((q, b)) = world.source.rate_limit() {
        qps = qps.min(q);
        burst = burst.min(u64::from(b));
    }
    let latency = world.source.call_latency().as_secs_f64();
    let by_rate = (calls.saturating_sub(burst) as f64 / qps).max(0.0) + latency;
    Oracle {
        calls,
        lower_bound_seconds: by_rate.max(chain as f64 * latency),
    }
}

fn add_node_with_pods<S: SimSource>(world: &World<S>, cfg: &SimConfig, wl: &mut Workload) {
    let name = world.add_node(&format!("node-{:05}", wl.next_node));
    wl.next_node += 1;
    for _ in 0..cfg.pods_per_node {
        world.schedule_pod(&name);
    }
}

/// A uniformly chosen pod of a uniformly chosen live node is deleted (crashing with
/// `crash_rate`) and a new one scheduled there at the same instant.
fn churn<S: SimSource>(world: &World<S>, cfg: &SimConfig, wl: &mut Workload) {
    let live = world.live_nodes();
    if live.is_empty() {
        return;
    }
    let node = live[wl.rng.random_range(0..live.len())].clone();
    let pods = world.pods_on(&node);
    if !pods.is_empty() {
        let uid = pods[wl.rng.random_range(0..pods.len())];
        let crash = wl.rng.random_bool(cfg.crash_rate);
        world.delete_pod(uid, crash);
    }
    world.schedule_pod(&node);
}

fn build_report<S: SimSource>(
    world: &World<S>,
    cfg: &SimConfig,
    t0: Instant,
    settled_since: Option<Instant>,
    wall: std::time::Instant,
    cpu0: Option<f64>,
    oracle: &Oracle,
) -> Report {
    let invariants = world
        .observer
        .finish(&world.source.granted(), &world.store.list());
    let stats = world.workload_stats();
    let summaries = world.manager.summaries();
    let mut nodes = NodesReport::default();
    for (_, s) in &summaries {
        nodes.total += 1;
        nodes.in_deficit += u64::from(s.needed() > 0 || s.waiting() > 0);
        nodes.at_capacity += u64::from(matches!(
            s.blocked,
            Some(crate::plan::Blocked::AtCap) | Some(crate::plan::Blocked::Exhausted)
        ));
        nodes.blocked += u64::from(s.blocked.is_some());
    }
    // Addresses from the store (the truth the node sides see), not from engine counters.
    let mut ips = IpsReport::default();
    for n in world.store.list() {
        let allocated = n.operator.addresses.len() as u64;
        let used = n.node.used.len() as u64;
        let cooldown = n
            .node
            .cooldown
            .keys()
            .filter(|a| n.operator.addresses.contains(a))
            .count() as u64;
        ips.allocated += allocated;
        ips.used += used;
        ips.cooldown += cooldown;
        ips.free += allocated.saturating_sub(used + cooldown);
    }
    let (source_calls, throttled) = world.source.calls();
    let wall_seconds = wall.elapsed().as_secs_f64();
    let node_details = cfg.report_nodes.then(|| {
        summaries
            .iter()
            .map(|(name, s)| NodeDetail {
                name: name.to_string(),
                allocated: Family::ALL.iter().map(|f| s.counts.get(*f).allocated).sum(),
                used: Family::ALL.iter().map(|f| s.counts.get(*f).used).sum(),
                cooldown: Family::ALL.iter().map(|f| s.counts.get(*f).cooldown).sum(),
                needed: s.needed(),
                excess: s.excess(),
                blocked: s.blocked.map(|b| b.as_str()),
            })
            .collect()
    });
    let convergence = settled_since.map(|t| round3(t.saturating_duration_since(t0).as_secs_f64()));
    Report {
        converged: convergence.is_some(),
        convergence_seconds: convergence,
        lower_bound_seconds: Some(round3(oracle.lower_bound_seconds)),
        virtual_seconds: round3(Instant::now().saturating_duration_since(t0).as_secs_f64()),
        wall_seconds,
        cpu_seconds: cpu_seconds().zip(cpu0).map(|(b, a)| b - a),
        peak_rss_bytes: peak_rss_bytes(),
        events_per_second: if wall_seconds > 0.0 {
            stats.events as f64 / wall_seconds
        } else {
            0.0
        },
        nodes,
        ips,
        api: ApiReport {
            source_calls,
            source_calls_minimum: Some(oracle.calls),
            kube_writes: world.store.operator_writes(),
            conflicts: 0,
            throttled,
        },
        pods: PodsReport {
            started: stats.started,
            deleted: stats.deleted,
            leaked_by_crash: stats.leaked_by_crash,
            waited_for_ip: stats.waited_for_ip,
            ip_wait_seconds: Quantiles::of(stats.wait_seconds),
        },
        reclaim: ReclaimReport {
            reclaimed: world.observer.reclaimed(),
            held_by_min_age: stats.held_by_min_age,
            latency_seconds: Quantiles::of(world.observer.reclaim_latencies()),
        },
        invariants,
        node_details,
    }
}

/// User + system CPU time of this process (Linux /proc), in seconds.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // fields after the ")" of the command name: utime is the 12th, stime the 13th
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Peak resident set size of this process (Linux /proc VmHWM), in bytes.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
