//! Scenario files for `simulate --scenario FILE`: timed phases that change the workload, the
//! source's faults or the nodes' watermarks while the simulation runs.
//!
//! ```yaml
//! name: node-loss
//! duration: 15m              # the active period (a --duration flag wins)
//! start:                     # the cluster at the start (flags given explicitly win)
//!   nodes: 100
//!   pods_per_node: 30
//!   churn: 1
//! phases:
//!   - kind: node-loss        # 20 machines vanish at 5m, one every 6 s
//!     at: 5m
//!     duration: 2m
//!     nodes: 20
//! ```
//!
//! Kinds and their fields (every phase also takes `at`, and optionally `duration` and
//! `group`):
//!
//! | kind | fields | effect |
//! |---|---|---|
//! | `scale-up` | `nodes`, `pods_per_node`, `pods`, `share`, `every` | `nodes` new nodes join (in `group`, default `default`) with `pods_per_node` pods each; `pods` more pods are scheduled to each of a `share` of the live nodes of `group` |
//! | `mass-deletion` | `share`, `crash_rate`, `every` | a `share` of the pods of `group`'s nodes is deleted, a `crash_rate` share of them without a DEL |
//! | `node-loss` | `nodes`, `replace`, `every` | `nodes` machines of `group` vanish with their pods; their Node objects go a minute later; with `replace` a new node joins then |
//! | `churn` | `churn`, `crash_rate`, `node_churn` | sets the pod churn, crash share and node churn while the phase lasts |
//! | `brown-out` | `error_rate`, `lost_reply_rate`, `throttle_rate`, `retry_after`, `outage` | source faults while the phase lasts (on top of `--fault-rate`); `outage` fails every call |
//! | `watermark-change` | `pre_allocate`, `min_allocate`, `max_allocate`, `max_above_watermark` | per-node overrides (`spec.watermarks`) on every node of `group` (or all), nodes joining later included |
//!
//! Actions (`scale-up`, `mass-deletion`, `node-loss`) happen at `at`; with `duration` alone
//! they are spread evenly over it (a ramp), with `every` and `duration` they are repeated
//! whole every `every` within it. Settings (`churn`, `brown-out`, `watermark-change`) are in
//! force from `at` for `duration`, or without one: churn and faults until the end of the
//! active period, watermarks until the end of the run; overlapping settings layer, the
//! later-starting phase winning field by field (faults add up).

mod tenancy;

pub use tenancy::{ScenarioPool, Tenant};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use tidepool_ipam::WatermarkOverrides;
use tidepool_ipam::Watermarks;

/// The most times one phase may repeat (`every` within `duration`).
pub const MAX_REPEATS: u64 = 100_000;
/// The most nodes (or pods per node) one phase may add or lose at a time.
pub const MAX_UNITS: u32 = 1_000_000;

/// The group of nodes that start the run and of nodes added without a group.
pub const DEFAULT_GROUP: &str = "default";

/// A parsed and checked scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Where it came from (for messages).
    pub file: String,
    pub name: Option<String>,
    pub start: Start,
    /// The active period, if the scenario sets it.
    pub duration: Option<Duration>,
    pub phases: Vec<Phase>,
    /// Cluster pools beyond the flags' `default`.
    pub pools: Vec<ScenarioPool>,
    /// The namespaces new pods are created in (the rest: no labels, no annotation).
    pub tenants: Vec<Tenant>,
}

/// The cluster at the start; unset values come from the flags.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Start {
    pub nodes: Option<u32>,
    pub pods_per_node: Option<u32>,
    pub churn: Option<f64>,
    pub crash_rate: Option<f64>,
    pub node_churn: Option<f64>,
}

/// One timed phase.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    /// Since the start of the measured period.
    pub at: Duration,
    pub duration: Option<Duration>,
    /// Repeat an action every so long within `duration`.
    pub every: Option<Duration>,
    /// The nodes it concerns (None: all).
    pub group: Option<String>,
    pub action: Action,
}

/// What a phase does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    ScaleUp {
        nodes: u32,
        /// Pods on each new node (None: the start's pods per node).
        pods_per_node: Option<u32>,
        /// Pods added to each chosen existing node.
        pods: u32,
        /// Share of the group's live nodes that get `pods`.
        share: f64,
    },
    MassDeletion {
        share: f64,
        crash_rate: f64,
    },
    NodeLoss {
        nodes: u32,
        replace: bool,
    },
    Churn {
        churn: Option<f64>,
        crash_rate: Option<f64>,
        node_churn: Option<f64>,
    },
    BrownOut(FaultSettings),
    WatermarkChange(WatermarkOverrides),
}

/// Source faults a `brown-out` phase adds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultSettings {
    pub error_rate: f64,
    pub lost_reply_rate: f64,
    pub throttle_rate: f64,
    pub retry_after: Duration,
    /// Every call fails.
    pub outage: bool,
}

impl Action {
    pub fn kind(&self) -> &'static str {
        match self {
            Action::ScaleUp { .. } => "scale-up",
            Action::MassDeletion { .. } => "mass-deletion",
            Action::NodeLoss { .. } => "node-loss",
            Action::Churn { .. } => "churn",
            Action::BrownOut(_) => "brown-out",
            Action::WatermarkChange(_) => "watermark-change",
        }
    }

    /// A setting in force for a while (rather than an action at an instant).
    pub fn is_setting(&self) -> bool {
        matches!(
            self,
            Action::Churn { .. } | Action::BrownOut(_) | Action::WatermarkChange(_)
        )
    }

    /// Changes what the nodes need (t0 is the start of the last such phase).
    pub fn changes_demand(&self) -> bool {
        !matches!(self, Action::Churn { .. } | Action::BrownOut(_))
    }
}

impl Phase {
    /// When a setting stops being in force, relative to the measured period's start
    /// (None: it is not a setting, or it has no end of its own).
    pub fn end(&self) -> Option<Duration> {
        self.duration.map(|d| self.at + d)
    }

    /// The instants (relative to the measured period's start) at which an action phase
    /// acts whole: `at`, or every `every` within `duration`.
    pub fn instants(&self) -> Vec<Duration> {
        match (self.duration, self.every) {
            (Some(d), Some(e)) => {
                let mut v = Vec::new();
                let mut t = Duration::ZERO;
                while t < d {
                    v.push(self.at + t);
                    t += e;
                }
                v
            }
            _ => vec![self.at],
        }
    }

    /// Spread over `duration` (a ramp) rather than at once or repeated.
    pub fn is_ramp(&self) -> bool {
        !self.action.is_setting() && self.duration.is_some() && self.every.is_none()
    }

    /// When the phase adds (scale-up) or removes (node-loss) nodes, and how many each time,
    /// as the run applies them: a ramp one node at a time spread over its duration, else
    /// `nodes` at each of [`Phase::instants`].
    fn node_steps(&self) -> Vec<(Duration, u64)> {
        let nodes = match self.action {
            Action::ScaleUp { nodes, .. } | Action::NodeLoss { nodes, .. } => nodes,
            _ => 0,
        };
        if nodes == 0 {
            return Vec::new();
        }
        match self.duration {
            Some(d) if self.is_ramp() => (0..nodes)
                .map(|k| (self.at + d.mul_f64(f64::from(k) / f64::from(nodes)), 1))
                .collect(),
            _ => self
                .instants()
                .into_iter()
                .map(|t| (t, u64::from(nodes)))
                .collect(),
        }
    }
}

/// What went wrong with a scenario, naming the file and the phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    pub file: String,
    /// 1-based index and kind of the phase concerned.
    pub phase: Option<(usize, String)>,
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "scenario {}: ", self.file)?;
        if let Some((i, kind)) = &self.phase {
            write!(f, "phase #{i} ({kind}): ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ScenarioError {}

/// The longest duration a scenario may give anything (the flags' limit too).
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// A duration in a scenario: `30s`, `5m`, `1h30m`, `250ms`, `1.5s`, or `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let bad = || format!("bad duration {s:?} (write durations like 30s, 5m, 1h30m, 250ms)");
    if s.is_empty() {
        return Err(bad());
    }
    let mut total = 0.0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if n == 0 {
            return Err(bad());
        }
        let v: f64 = rest[..n].parse().map_err(|_| bad())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..u] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        rest = &rest[u..];
        total += v * secs;
    }
    if !total.is_finite() || total > MAX_DURATION.as_secs_f64() {
        return Err(format!(
            "duration {s:?} is too long (at most {} in a scenario)",
            humantime::format_duration(MAX_DURATION)
        ));
    }
    Ok(Duration::from_secs_f64(total))
}

/// A duration as YAML writes it: a string with units, or the number 0.
#[derive(Debug, Clone, Copy)]
struct Dur(Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration like 30s, 5m or 1h30m")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Dur, E> {
                parse_duration(s).map(Dur).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Dur, E> {
                if v == 0 {
                    Ok(Dur(Duration::ZERO))
                } else {
                    Err(E::custom(format!(
                        "bad duration {v}: give a unit, like {v}s or {v}m"
                    )))
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Dur, E> {
                if v < 0 {
                    Err(E::custom(format!("bad duration {v}: negative")))
                } else {
                    self.visit_u64(v as u64)
                }
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "bad duration {v}: give a unit, like {v}s"
                )))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    duration: Option<Dur>,
    #[serde(default)]
    start: Option<RawStart>,
    #[serde(default)]
    phases: Option<Vec<RawPhase>>,
    #[serde(default)]
    pools: Vec<tenancy::RawPool>,
    #[serde(default)]
    tenants: Vec<tenancy::RawTenant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStart {
    #[serde(default)]
    nodes: Option<u32>,
    #[serde(default)]
    pods_per_node: Option<u32>,
    #[serde(default)]
    churn: Option<f64>,
    #[serde(default)]
    crash_rate: Option<f64>,
    #[serde(default)]
    node_churn: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPhase {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    at: Option<Dur>,
    #[serde(default)]
    duration: Option<Dur>,
    #[serde(default)]
    every: Option<Dur>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    nodes: Option<u32>,
    #[serde(default)]
    pods_per_node: Option<u32>,
    #[serde(default)]
    pods: Option<u32>,
    #[serde(default)]
    share: Option<f64>,
    #[serde(default)]
    replace: Option<bool>,
    #[serde(default)]
    churn: Option<f64>,
    #[serde(default)]
    crash_rate: Option<f64>,
    #[serde(default)]
    node_churn: Option<f64>,
    #[serde(default)]
    error_rate: Option<f64>,
    #[serde(default)]
    lost_reply_rate: Option<f64>,
    #[serde(default)]
    throttle_rate: Option<f64>,
    #[serde(default)]
    retry_after: Option<Dur>,
    #[serde(default)]
    outage: Option<bool>,
    #[serde(default)]
    pre_allocate: Option<u32>,
    #[serde(default)]
    min_allocate: Option<u32>,
    #[serde(default)]
    max_allocate: Option<u32>,
    #[serde(default)]
    max_above_watermark: Option<u32>,
}

const KINDS: &[&str] = &[
    "scale-up",
    "mass-deletion",
    "node-loss",
    "churn",
    "brown-out",
    "watermark-change",
];

impl RawPhase {
    /// The kind-specific fields present.
    fn present(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut f = |name: &'static str, set: bool| {
            if set {
                v.push(name);
            }
        };
        f("every", self.every.is_some());
        f("nodes", self.nodes.is_some());
        f("pods_per_node", self.pods_per_node.is_some());
        f("pods", self.pods.is_some());
        f("share", self.share.is_some());
        f("replace", self.replace.is_some());
        f("churn", self.churn.is_some());
        f("crash_rate", self.crash_rate.is_some());
        f("node_churn", self.node_churn.is_some());
        f("error_rate", self.error_rate.is_some());
        f("lost_reply_rate", self.lost_reply_rate.is_some());
        f("throttle_rate", self.throttle_rate.is_some());
        f("retry_after", self.retry_after.is_some());
        f("outage", self.outage.is_some());
        f("pre_allocate", self.pre_allocate.is_some());
        f("min_allocate", self.min_allocate.is_some());
        f("max_allocate", self.max_allocate.is_some());
        f("max_above_watermark", self.max_above_watermark.is_some());
        v
    }
}

fn allowed(kind: &str) -> &'static [&'static str] {
    match kind {
        "scale-up" => &["nodes", "pods_per_node", "pods", "share", "every"],
        "mass-deletion" => &["share", "crash_rate", "every"],
        "node-loss" => &["nodes", "replace", "every"],
        "churn" => &["churn", "crash_rate", "node_churn"],
        "brown-out" => &[
            "error_rate",
            "lost_reply_rate",
            "throttle_rate",
            "retry_after",
            "outage",
        ],
        "watermark-change" => &[
            "pre_allocate",
            "min_allocate",
            "max_allocate",
            "max_above_watermark",
        ],
        _ => &[],
    }
}

/// Only for finding which phase a parse error is in: each phase's line.
#[derive(Deserialize)]
struct Lenient {
    #[serde(default)]
    phases: Option<Vec<serde_saphyr::Spanned<serde::de::IgnoredAny>>>,
}

/// (line, kind) of each phase, as far as the file can be read loosely.
fn phase_lines(text: &str) -> Vec<(u64, Option<String>)> {
    #[derive(Deserialize)]
    struct Kinds {
        #[serde(default)]
        phases: Option<Vec<KindOnly>>,
    }
    #[derive(Deserialize)]
    struct KindOnly {
        #[serde(default)]
        kind: Option<String>,
    }
    let Ok(l) = serde_saphyr::from_str::<Lenient>(text) else {
        return Vec::new();
    };
    let kinds: Vec<Option<String>> = serde_saphyr::from_str::<Kinds>(text)
        .ok()
        .and_then(|k| k.phases)
        .map(|p| p.into_iter().map(|k| k.kind).collect())
        .unwrap_or_default();
    l.phases
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, p)| (p.referenced.line(), kinds.get(i).cloned().flatten()))
        .collect()
}

/// A YAML error in words for whoever wrote the file: the file's name (not the parser's
/// `<input>`), and the parser's user-facing message, in plain terms for what the parser's
/// own text words for a programmer (a duplicate key, a second document, a file over its
/// limits).
fn yaml_error(file: &str, e: &serde_saphyr::Error) -> String {
    use serde_saphyr::Error as E;
    let at = e
        .location()
        .map(|l| format!("line {} column {}: ", l.line(), l.column()))
        .unwrap_or_default();
    match e.without_snippet() {
        E::DuplicateMappingKey { key, .. } => format!(
            "{at}the key {} appears twice (write each key once)",
            key.as_deref().map_or("here".into(), |k| format!("`{k}`"))
        ),
        E::MultipleDocuments { .. } => format!(
            "{at}a second YAML document (a scenario is one document: remove the `---` line)"
        ),
        E::Budget { .. } => format!(
            "{at}too large for a scenario: more than {} YAML values (a scenario has a few \
             phases; use `every` and `duration` to repeat one)",
            serde_saphyr::Budget::default().max_nodes
        ),
        _ => e
            .render_with_options(serde_saphyr::render_options! {
                formatter: &serde_saphyr::UserMessageFormatter,
                source_name: Some(file),
            })
            .trim_end()
            .to_string(),
    }
}

fn share_ok(v: f64) -> bool {
    (0.0..=1.0).contains(&v)
}

/// The phase a YAML error is in (its number and kind), when the file can be read loosely.
fn phase_of_error(text: &str, e: &serde_saphyr::Error) -> Option<(usize, String)> {
    let line = e.location().map(|l| l.line()).unwrap_or(0);
    if line == 0 {
        return None;
    }
    phase_lines(text)
        .iter()
        .enumerate()
        .rev()
        .find(|(_, (l, _))| *l <= line)
        .map(|(i, (_, k))| (i + 1, k.clone().unwrap_or_else(|| "?".into())))
}

/// The `start:` section's checks.
fn check_start(s: RawStart) -> Result<Start, String> {
    for (name, v) in [("start.churn", s.churn), ("start.node_churn", s.node_churn)] {
        rate(name, v)?;
    }
    if let Some(v) = s.crash_rate
        && !share_ok(v)
    {
        return Err(format!("start.crash_rate = {v}: must be within 0..=1"));
    }
    if s.nodes == Some(0) {
        return Err("start.nodes = 0: must be at least 1".into());
    }
    Ok(Start {
        nodes: s.nodes,
        pods_per_node: s.pods_per_node,
        churn: s.churn,
        crash_rate: s.crash_rate,
        node_churn: s.node_churn,
    })
}

/// A rate: a finite number ≥ 0.
fn rate(name: &str, v: Option<f64>) -> Result<Option<f64>, String> {
    match v {
        Some(v) if !v.is_finite() || v < 0.0 => {
            Err(format!("{name} = {v}: must be a finite number ≥ 0"))
        }
        v => Ok(v),
    }
}

/// A share: within 0..=1.
fn share(name: &str, v: Option<f64>) -> Result<Option<f64>, String> {
    match v {
        Some(v) if !share_ok(v) => Err(format!("{name} = {v}: must be within 0..=1")),
        v => Ok(v),
    }
}

/// One phase's checks (the messages name no phase: the caller adds it).
fn check_phase(p: RawPhase, kind: &str) -> Result<Phase, String> {
    if !KINDS.contains(&kind) {
        return Err(format!(
            "unknown kind {kind:?} (one of {})",
            KINDS.join(", ")
        ));
    }
    let ok = allowed(kind);
    if let Some(f) = p.present().into_iter().find(|f| !ok.contains(f)) {
        return Err(format!(
            "field `{f}` does not apply to {kind} (it takes at, duration, group, {})",
            ok.join(", ")
        ));
    }
    let Some(at) = p.at else {
        return Err("missing `at` (when the phase starts, like 5m)".into());
    };
    let duration = p.duration.map(|d| d.0);
    let every = p.every.map(|d| d.0);
    check_window(duration, every)?;
    if let Some(g) = &p.group
        && (g.is_empty() || g.len() > 63)
    {
        return Err("group: a name of 1 to 63 characters".into());
    }
    for (name, v) in [("nodes", p.nodes), ("pods", p.pods)] {
        if let Some(v) = v
            && v > MAX_UNITS
        {
            return Err(format!("{name} = {v}: at most {MAX_UNITS} per phase"));
        }
    }
    let action = match kind {
        "scale-up" => scale_up(&p, duration.is_some() && every.is_none())?,
        "mass-deletion" => mass_deletion(&p)?,
        "node-loss" => node_loss(&p)?,
        "churn" => churn(&p)?,
        "brown-out" => brown_out(&p)?,
        "watermark-change" => watermark_change(&p)?,
        _ => unreachable!("kinds checked above"),
    };
    Ok(Phase {
        at: at.0,
        duration,
        every,
        group: p.group,
        action,
    })
}

/// A phase's `duration` and `every`: positive, and `every` repeats within the duration, at
/// most [`MAX_REPEATS`] times.
fn check_window(duration: Option<Duration>, every: Option<Duration>) -> Result<(), String> {
    if duration.is_some_and(|d| d.is_zero()) {
        return Err("duration = 0: must be positive".into());
    }
    let Some(e) = every else {
        return Ok(());
    };
    if e.is_zero() {
        return Err("every = 0: must be positive".into());
    }
    match duration {
        None => Err("`every` needs a `duration` (the window it repeats in)".into()),
        Some(d) if e > d => Err(format!("every {e:?} is longer than the duration {d:?}")),
        Some(d) if d.as_secs_f64() / e.as_secs_f64() > MAX_REPEATS as f64 => Err(format!(
            "repeats {:.0} times (every {e:?} for {d:?}); at most {MAX_REPEATS}",
            (d.as_secs_f64() / e.as_secs_f64()).ceil()
        )),
        _ => Ok(()),
    }
}

/// `scale-up`; `ramp`: a duration without `every`.
fn scale_up(p: &RawPhase, ramp: bool) -> Result<Action, String> {
    let nodes = p.nodes.unwrap_or(0);
    let pods = p.pods.unwrap_or(0);
    if nodes == 0 && pods == 0 {
        return Err(
            "adds nothing: give `nodes` (new nodes) or `pods` (pods per existing node)".into(),
        );
    }
    if p.pods_per_node.is_some() && nodes == 0 {
        return Err("`pods_per_node` needs `nodes` (the new nodes' pods)".into());
    }
    if p.share.is_some() && pods == 0 {
        return Err("`share` needs `pods` (which nodes get them)".into());
    }
    if nodes > 0 && pods > 0 && ramp {
        return Err(
            "a ramp (duration without every) spreads either nodes or pods, not both".into(),
        );
    }
    let share = share("share", p.share)?.unwrap_or(1.0);
    if pods > 0 && share <= 0.0 {
        return Err("share = 0: no node would get the pods".into());
    }
    Ok(Action::ScaleUp {
        nodes,
        pods_per_node: p.pods_per_node,
        pods,
        share,
    })
}

fn mass_deletion(p: &RawPhase) -> Result<Action, String> {
    let Some(s) = share("share", p.share)? else {
        return Err("missing `share` (of the pods to delete, 0..=1)".into());
    };
    if s <= 0.0 {
        return Err("share = 0: deletes nothing".into());
    }
    Ok(Action::MassDeletion {
        share: s,
        crash_rate: share("crash_rate", p.crash_rate)?.unwrap_or(0.0),
    })
}

fn node_loss(p: &RawPhase) -> Result<Action, String> {
    let nodes = p.nodes.unwrap_or(0);
    if nodes == 0 {
        return Err("missing `nodes` (how many machines vanish, ≥ 1)".into());
    }
    Ok(Action::NodeLoss {
        nodes,
        replace: p.replace.unwrap_or(false),
    })
}

fn churn(p: &RawPhase) -> Result<Action, String> {
    if p.group.is_some() {
        return Err("churn applies to the whole cluster: no `group`".into());
    }
    let a = Action::Churn {
        churn: rate("churn", p.churn)?,
        crash_rate: share("crash_rate", p.crash_rate)?,
        node_churn: rate("node_churn", p.node_churn)?,
    };
    if p.churn.is_none() && p.crash_rate.is_none() && p.node_churn.is_none() {
        return Err("sets nothing: give churn, crash_rate or node_churn".into());
    }
    Ok(a)
}

fn brown_out(p: &RawPhase) -> Result<Action, String> {
    if p.group.is_some() {
        return Err("the source is shared by all nodes: no `group`".into());
    }
    let f = FaultSettings {
        error_rate: share("error_rate", p.error_rate)?.unwrap_or(0.0),
        lost_reply_rate: share("lost_reply_rate", p.lost_reply_rate)?.unwrap_or(0.0),
        throttle_rate: share("throttle_rate", p.throttle_rate)?.unwrap_or(0.0),
        retry_after: p.retry_after.map_or(Duration::from_secs(1), |d| d.0),
        outage: p.outage.unwrap_or(false),
    };
    let sum = f.error_rate + f.lost_reply_rate + f.throttle_rate;
    if sum > 1.0 {
        return Err("error_rate + lost_reply_rate + throttle_rate above 1".into());
    }
    if sum <= 0.0 && !f.outage {
        return Err(
            "injects nothing: give error_rate, lost_reply_rate, throttle_rate or outage: true"
                .into(),
        );
    }
    if p.retry_after.is_some() && f.throttle_rate <= 0.0 {
        return Err("`retry_after` needs a `throttle_rate`".into());
    }
    Ok(Action::BrownOut(f))
}

fn watermark_change(p: &RawPhase) -> Result<Action, String> {
    let w = WatermarkOverrides {
        pre_allocate: p.pre_allocate,
        min_allocate: p.min_allocate,
        max_allocate: p.max_allocate,
        max_above_watermark: p.max_above_watermark,
    };
    if w == WatermarkOverrides::default() {
        return Err(
            "sets nothing: give pre_allocate, min_allocate, max_allocate or max_above_watermark"
                .into(),
        );
    }
    if let (Some(min), Some(max)) = (w.min_allocate, w.max_allocate)
        && max > 0
        && min > max
    {
        return Err(format!("min_allocate {min} above max_allocate {max}"));
    }
    Ok(Action::WatermarkChange(w))
}

impl Scenario {
    /// Reads and checks a scenario file.
    pub fn load(path: &std::path::Path) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: file.clone(),
            phase: None,
            message: format!("cannot read it: {e}"),
        })?;
        Scenario::parse(&file, &text)
    }

    /// Parses and checks a scenario's text (`file` names it in errors).
    pub fn parse(file: &str, text: &str) -> Result<Scenario, ScenarioError> {
        let err = |phase: Option<(usize, String)>, message: String| ScenarioError {
            file: file.to_string(),
            phase,
            message,
        };
        let raw: RawFile = serde_saphyr::from_str(text)
            .map_err(|e| err(phase_of_error(text, &e), yaml_error(file, &e)))?;
        let start = raw.start.map_or(Ok(Start::default()), check_start);
        let start = start.map_err(|m| err(None, m))?;
        if let Some(d) = raw.duration
            && d.0.is_zero()
        {
            return Err(err(None, "duration = 0: must be positive".into()));
        }
        let raw_phases = raw.phases.unwrap_or_default();
        if raw_phases.is_empty() {
            return Err(err(
                None,
                "no phases (write `phases:` with at least one)".into(),
            ));
        }
        let mut phases = Vec::with_capacity(raw_phases.len());
        for (i, p) in raw_phases.into_iter().enumerate() {
            let n = i + 1;
            let Some(kind) = p.kind.clone() else {
                return Err(err(
                    Some((n, "?".into())),
                    format!("missing `kind` (one of {})", KINDS.join(", ")),
                ));
            };
            phases.push(check_phase(p, &kind).map_err(|m| err(Some((n, kind)), m))?);
        }
        Ok(Scenario {
            file: file.to_string(),
            name: raw.name,
            start,
            duration: raw.duration.map(|d| d.0),
            phases,
            pools: tenancy::check_pools(raw.pools).map_err(|m| err(None, m))?,
            tenants: tenancy::check_tenants(raw.tenants).map_err(|m| err(None, m))?,
        })
    }

    fn phase_err(&self, i: usize, message: String) -> ScenarioError {
        ScenarioError {
            file: self.file.clone(),
            phase: Some((i + 1, self.phases[i].action.kind().to_string())),
            message,
        }
    }

    /// Checks the scenario against the run it is part of: every phase within the active
    /// period, groups that exist, node losses that can happen, pods that fit, watermarks
    /// that combine with the defaults.
    pub fn check(
        &self,
        active: Duration,
        start_nodes: u32,
        max_pods: u32,
        defaults: &Watermarks,
    ) -> Result<(), ScenarioError> {
        let groups: BTreeSet<&str> = std::iter::once(DEFAULT_GROUP)
            .chain(self.phases.iter().filter_map(|p| match p.action {
                Action::ScaleUp { nodes, .. } if nodes > 0 => {
                    Some(p.group.as_deref().unwrap_or(DEFAULT_GROUP))
                }
                _ => None,
            }))
            .collect();
        for (i, p) in self.phases.iter().enumerate() {
            if p.at >= active {
                return Err(self.phase_err(
                    i,
                    format!(
                        "starts at {:?}, not within the active period ({:?})",
                        p.at, active
                    ),
                ));
            }
            if let Some(end) = p.end()
                && end > active
            {
                return Err(self.phase_err(
                    i,
                    format!(
                        "ends at {end:?}, after the active period ({active:?}); shorten it or lengthen the run"
                    ),
                ));
            }
            if let Some(g) = &p.group
                && !groups.contains(g.as_str())
            {
                return Err(self.phase_err(
                    i,
                    format!(
                        "group {g:?} has no nodes: groups are {} and those scale-up phases add nodes to",
                        DEFAULT_GROUP
                    ),
                ));
            }
            match &p.action {
                Action::ScaleUp {
                    pods_per_node,
                    pods,
                    ..
                } => {
                    if let Some(ppn) = pods_per_node
                        && *ppn > max_pods
                    {
                        return Err(self.phase_err(
                            i,
                            format!(
                                "pods_per_node {ppn} above the nodes' allocatable pods ({max_pods})"
                            ),
                        ));
                    }
                    if *pods > max_pods {
                        return Err(self.phase_err(
                            i,
                            format!("pods {pods} above the nodes' allocatable pods ({max_pods})"),
                        ));
                    }
                }
                Action::NodeLoss { .. } => self.check_losses(i, start_nodes)?,
                Action::WatermarkChange(w) => {
                    if let Err(e) = defaults.with_overrides(w) {
                        return Err(self.phase_err(i, format!("{e}")));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Every loss of node-loss phase `i` must find a node of its group that has joined by
    /// its time (the start's nodes, and the scale-ups' nodes as they arrive: a ramp adds
    /// them one by one), counting the group's earlier losses; churn's losses and
    /// replacements aside. A loss planned before its nodes arrive is refused.
    fn check_losses(&self, i: usize, start_nodes: u32) -> Result<(), ScenarioError> {
        let p = &self.phases[i];
        let group = p.group.as_deref().unwrap_or(DEFAULT_GROUP);
        let in_group = |q: &Phase| q.group.as_deref().unwrap_or(DEFAULT_GROUP) == group;
        let start = if group == DEFAULT_GROUP {
            u64::from(start_nodes)
        } else {
            0
        };
        let scale_ups = || {
            self.phases
                .iter()
                .filter(|q| matches!(q.action, Action::ScaleUp { .. }) && in_group(q))
        };
        let joins: Vec<(Duration, u64)> = scale_ups().flat_map(Phase::node_steps).collect();
        let ramps = scale_ups().any(Phase::is_ramp);
        let mut losses: Vec<(Duration, u64, bool)> = self
            .phases
            .iter()
            .enumerate()
            .filter(|(j, q)| *j <= i && matches!(q.action, Action::NodeLoss { .. }) && in_group(q))
            .flat_map(|(j, q)| q.node_steps().into_iter().map(move |(t, n)| (t, n, j == i)))
            .collect();
        losses.sort_by_key(|l| l.0);
        let mut lost = 0u64;
        for (t, n, ours) in losses {
            lost += n;
            let joined = start + joins.iter().filter(|j| j.0 <= t).map(|j| j.1).sum::<u64>();
            if ours && lost > joined {
                let whom = if group == DEFAULT_GROUP && p.group.is_none() {
                    "the cluster".to_string()
                } else {
                    format!("group {group:?}")
                };
                let hint = if ramps {
                    " (a ramp's nodes join one by one over its duration: lose them after they \
                     arrive)"
                } else {
                    ""
                };
                return Err(self.phase_err(
                    i,
                    format!("by {t:?} it has lost {lost} nodes of {whom}, which has {joined} by then{hint}"),
                ));
            }
        }
        Ok(())
    }

    /// When demand last changes (t0), relative to the measured period's start.
    pub fn last_demand_change(&self) -> Option<Duration> {
        self.phases
            .iter()
            .filter(|p| p.action.changes_demand())
            .map(|p| p.at)
            .max()
    }

    /// The group names in use, `default` first.
    pub fn groups(&self) -> Vec<String> {
        let mut v = vec![DEFAULT_GROUP.to_string()];
        let mut seen: BTreeMap<String, ()> = BTreeMap::new();
        seen.insert(DEFAULT_GROUP.into(), ());
        for p in &self.phases {
            if let Some(g) = &p.group
                && seen.insert(g.clone(), ()).is_none()
            {
                v.push(g.clone());
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Scenario, String> {
        Scenario::parse("t.yaml", s).map_err(|e| e.to_string())
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "5", "5x", "m", "-1s", "1..2s", "s5"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    /// YAML errors in the writer's terms (issue 11): the file is named (not `<input>`),
    /// and a duplicate key, a second document, a file over the parser's limits and a
    /// duration over the limit each say what was wrong and where.
    #[test]
    fn yaml_errors_name_the_file_and_the_problem() {
        let e = |text: &str| Scenario::parse("mine.yaml", text).unwrap_err().to_string();
        let dup = e("duration: 1m\nduration: 2m\nphases: []\n");
        assert!(
            dup.contains("mine.yaml")
                && dup.contains("line 2 column 1: the key `duration` appears twice"),
            "{dup}"
        );
        assert!(!dup.contains("DuplicateKeyPolicy"), "{dup}");
        let two = e("duration: 1m\n---\nduration: 2m\n");
        assert!(
            two.contains("line 3 column 1: a second YAML document"),
            "{two}"
        );
        assert!(!two.contains("from_str_multiple"), "{two}");
        let big: String = std::iter::once("phases:\n".to_string())
            .chain((0..50_001).map(|_| "- {kind: churn, at: 1m}\n".to_string()))
            .collect();
        let big = e(&big);
        assert!(
            big.contains("too large for a scenario: more than 250000 YAML values"),
            "{big}"
        );
        assert!(!big.contains("Nodes {"), "{big}");
        let long = e("duration: 277778h\nphases: []\n");
        assert!(
            long.contains("\"277778h\" is too long (at most 30days"),
            "{long}"
        );
        let syntax = e("duration: [1\n");
        assert!(
            syntax.contains("mine.yaml:1:") && !syntax.contains("<input>"),
            "{syntax}"
        );
        assert_eq!(parse_duration("720h"), Ok(MAX_DURATION));
    }

    #[test]
    fn a_full_scenario_parses() {
        let s = parse(
            "name: x\nduration: 20m\nstart: {nodes: 10, churn: 1}\nphases:\n\
             - kind: scale-up\n  at: 1m\n  nodes: 5\n  pods_per_node: 3\n  group: new\n\
             - kind: scale-up\n  at: 2m\n  pods: 4\n  share: 0.5\n  every: 30s\n  duration: 2m\n\
             - kind: mass-deletion\n  at: 5m\n  share: 0.5\n  crash_rate: 0.1\n\
             - kind: node-loss\n  at: 6m\n  nodes: 2\n  replace: true\n  group: new\n\
             - kind: churn\n  at: 0\n  churn: 3\n  duration: 1m\n\
             - kind: brown-out\n  at: 7m\n  duration: 1m\n  outage: true\n\
             - kind: watermark-change\n  at: 8m\n  min_allocate: 16\n",
        )
        .unwrap();
        assert_eq!(s.duration, Some(Duration::from_secs(1200)));
        assert_eq!(s.start.nodes, Some(10));
        assert_eq!(s.phases.len(), 7);
        assert_eq!(s.phases[1].instants().len(), 4);
        assert_eq!(s.last_demand_change(), Some(Duration::from_secs(480)));
        assert_eq!(s.groups(), vec!["default".to_string(), "new".into()]);
        s.check(Duration::from_secs(1200), 10, 250, &Watermarks::default())
            .unwrap();
    }

    #[test]
    fn bad_files_name_the_file_the_phase_and_the_problem() {
        let cases: &[(&str, &[&str])] = &[
            (
                "phases:\n- kind: explode\n  at: 1m\n",
                &["t.yaml", "phase #1", "unknown kind"],
            ),
            (
                "phases:\n- kind: churn\n  at: 1m\n  churn: 1\n- kind: node-loss\n  at: 2m\n  nodez: 3\n",
                &["t.yaml", "phase #2", "node-loss", "nodez"],
            ),
            (
                "phases:\n- kind: churn\n  at: 5 minutes\n  churn: 1\n",
                &["phase #1", "duration"],
            ),
            (
                "phases:\n- kind: churn\n  at: 300\n  churn: 1\n",
                &["phase #1", "unit"],
            ),
            (
                "phases:\n- kind: node-loss\n  at: 1m\n  pods: 3\n",
                &["phase #1", "`pods` does not apply"],
            ),
            (
                "phases:\n- kind: node-loss\n  at: 1m\n",
                &["phase #1", "missing `nodes`"],
            ),
            (
                "phases:\n- kind: scale-up\n  nodes: 1\n",
                &["phase #1", "missing `at`"],
            ),
            ("phases:\n- at: 1m\n", &["phase #1", "missing `kind`"]),
            ("phases: [\n", &["t.yaml"]),
            ("phases: []\n", &["no phases"]),
            ("phasez: []\n", &["t.yaml", "phasez"]),
            (
                "phases:\n- kind: scale-up\n  at: 1m\n  pods: 1\n  every: 10s\n",
                &["phase #1", "needs a `duration`"],
            ),
            (
                "phases:\n- kind: mass-deletion\n  at: 1m\n  share: 1.5\n",
                &["phase #1", "share = 1.5"],
            ),
            (
                "phases:\n- kind: brown-out\n  at: 1m\n",
                &["phase #1", "injects nothing"],
            ),
            (
                "phases:\n- kind: watermark-change\n  at: 1m\n  min_allocate: 9\n  max_allocate: 4\n",
                &["phase #1", "min_allocate 9 above max_allocate 4"],
            ),
            (
                "phases:\n- kind: scale-up\n  at: 1m\n  nodes: 2\n  pods: 2\n  duration: 1m\n",
                &["phase #1", "ramp"],
            ),
            (
                "phases:\n- kind: churn\n  at: 1m\n  churn: -1\n",
                &["phase #1", "churn = -1"],
            ),
            (
                "phases:\n- kind: scale-up\n  at: 1m\n  pods: 1\n  every: 1ms\n  duration: 700h\n",
                &["phase #1", "at most 100000"],
            ),
            (
                "phases:\n- kind: node-loss\n  at: 1m\n  nodes: 4000000000\n",
                &["phase #1", "at most 1000000"],
            ),
            ("phases:\n- 3\n", &["t.yaml"]),
            ("- just\n- a list\n", &["t.yaml"]),
            ("", &["t.yaml"]),
        ];
        for (text, wants) in cases {
            let e = parse(text).expect_err(text);
            for w in *wants {
                assert!(e.contains(w), "{text:?}: {e:?} lacks {w:?}");
            }
        }
    }

    #[test]
    fn checks_against_the_run() {
        let check = |text: &str| {
            parse(text)
                .unwrap()
                .check(Duration::from_secs(600), 10, 100, &Watermarks::default())
                .map_err(|e| e.to_string())
        };
        let e = check("phases:\n- kind: churn\n  at: 10m\n  churn: 1\n").unwrap_err();
        assert!(e.contains("phase #1") && e.contains("active period"), "{e}");
        let e =
            check("phases:\n- kind: churn\n  at: 9m\n  duration: 2m\n  churn: 1\n").unwrap_err();
        assert!(e.contains("after the active period"), "{e}");
        let e = check("phases:\n- kind: node-loss\n  at: 1m\n  nodes: 11\n").unwrap_err();
        assert!(
            e.contains("lost 11 nodes of the cluster, which has 10 by then"),
            "{e}"
        );
        // a loss is checked at its time: 100 nodes lost at 1m while the group ramps in over
        // 1m-6m (issue 11: it was checked against the ramp's end and 99 losses were dropped)
        let ramp =
            "phases:\n- kind: scale-up\n  at: 1m\n  duration: 5m\n  nodes: 100\n  group: r\n";
        let e = check(&format!(
            "{ramp}- kind: node-loss\n  at: 1m\n  nodes: 100\n  group: r\n"
        ))
        .unwrap_err();
        assert!(
            e.contains("phase #2") && e.contains("which has 1 by then"),
            "{e}"
        );
        check(&format!(
            "{ramp}- kind: node-loss\n  at: 6m\n  nodes: 100\n  group: r\n"
        ))
        .unwrap();
        // losses add up across phases of the group
        let e = check(&format!(
            "{ramp}- kind: node-loss\n  at: 6m\n  nodes: 60\n  group: r\n\
             - kind: node-loss\n  at: 7m\n  nodes: 60\n  group: r\n"
        ))
        .unwrap_err();
        assert!(
            e.contains("phase #3") && e.contains("lost 120 nodes"),
            "{e}"
        );
        let e =
            check("phases:\n- kind: node-loss\n  at: 1m\n  nodes: 1\n  group: x\n").unwrap_err();
        assert!(e.contains("group \"x\" has no nodes"), "{e}");
        let e = check("phases:\n- kind: scale-up\n  at: 1m\n  nodes: 1\n  pods_per_node: 101\n")
            .unwrap_err();
        assert!(e.contains("allocatable"), "{e}");
        check(
            "phases:\n- kind: scale-up\n  at: 1m\n  nodes: 5\n  group: x\n- kind: node-loss\n  at: 2m\n  nodes: 5\n  group: x\n",
        )
        .unwrap();
    }
}
