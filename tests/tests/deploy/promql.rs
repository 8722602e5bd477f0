//! Which metrics and labels a PromQL expression names, checked against tidepool-metrics'
//! table (the dashboard's queries and the alert rules).
//!
//! Hand-rolled on purpose: whether an expression parses is left to promtool (the real
//! parser, run on every expression by the tests); this only needs the selectors, their
//! matchers and the grouping labels, which a small tokenizer finds. The crate that parses
//! PromQL in Rust (promql-parser) builds an LR parser generator at compile time, over a
//! minute of CI for what a tokenizer does here.

use tidepool_metrics::{Def, Kind, Values};

/// Labels Prometheus attaches to every scraped series (target labels), plus `node`, which
/// components/servicemonitor adds to the agents' series, and `cluster`, which a Prometheus
/// shared by several clusters puts on each (external labels, or relabelling).
pub const TARGET_LABELS: &[&str] = &[
    "cluster",
    "job",
    "instance",
    "namespace",
    "pod",
    "service",
    "endpoint",
    "container",
    "node",
];

/// Metrics Prometheus itself makes for every target, and the standard process collector's
/// (metrics-process, refreshed on each scrape) that every binary exports beside
/// tidepool-metrics' table.
pub const PROMETHEUS_METRICS: &[&str] = &[
    "up",
    "process_start_time_seconds",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_threads",
];

const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset"];
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    /// The text between `[` and `]`.
    Range(String),
    Punct(String),
}

/// One `name{label op "value", ...}` of an expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    pub name: String,
    pub matchers: Vec<(String, String, String)>,
}

/// What an expression names.
#[derive(Debug, Default)]
pub struct Names {
    pub selectors: Vec<Selector>,
    /// Labels of `by`, `without`, `on`, `ignoring`, `group_left`, `group_right`.
    pub grouping: Vec<String>,
    /// Every range, as written (`5m`, `$__rate_interval`, `6h`).
    pub ranges: Vec<String>,
}

fn tokens(expr: &str) -> Result<Vec<Token>, String> {
    let cs: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < cs.len() && cs[i] != '\n' {
                i += 1;
            }
        } else if c == '"' || c == '\'' || c == '`' {
            let mut s = String::new();
            i += 1;
            while i < cs.len() && cs[i] != c {
                if cs[i] == '\\' && c != '`' && i + 1 < cs.len() {
                    i += 1;
                }
                s.push(cs[i]);
                i += 1;
            }
            if i == cs.len() {
                return Err(format!("unterminated string in {expr:?}"));
            }
            i += 1;
            out.push(Token::Str(s));
        } else if c == '[' {
            let end = cs[i..]
                .iter()
                .position(|&x| x == ']')
                .ok_or_else(|| format!("unterminated range in {expr:?}"))?;
            out.push(Token::Range(cs[i + 1..i + end].iter().collect()));
            i += end + 1;
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < cs.len() && (cs[i].is_ascii_alphanumeric() || cs[i] == '_' || cs[i] == ':') {
                i += 1;
            }
            out.push(Token::Ident(cs[start..i].iter().collect()));
        } else if c.is_ascii_digit() || c == '.' {
            // numbers (and durations such as 5m after `offset`): nothing to check
            while i < cs.len() && (cs[i].is_ascii_alphanumeric() || cs[i] == '.') {
                i += 1;
            }
        } else {
            let two: String = cs[i..(i + 2).min(cs.len())].iter().collect();
            if ["=~", "!~", "!=", "==", "<=", ">="].contains(&two.as_str()) {
                out.push(Token::Punct(two));
                i += 2;
            } else {
                out.push(Token::Punct(c.to_string()));
                i += 1;
            }
        }
    }
    Ok(out)
}

fn is_punct(t: Option<&Token>, p: &str) -> bool {
    matches!(t, Some(Token::Punct(x)) if x == p)
}

/// The selectors, grouping labels and ranges of `expr`.
pub fn names(expr: &str) -> Result<Names, String> {
    let ts = tokens(expr)?;
    let mut out = Names::default();
    let mut i = 0;
    while i < ts.len() {
        match &ts[i] {
            Token::Range(r) => out.ranges.push(r.clone()),
            Token::Ident(id) if GROUPING.contains(&id.as_str()) && is_punct(ts.get(i + 1), "(") => {
                i += 2;
                while i < ts.len() && !is_punct(ts.get(i), ")") {
                    if let Token::Ident(l) = &ts[i] {
                        out.grouping.push(l.clone());
                    }
                    i += 1;
                }
            }
            // `group_left` without labels, `and`, `or`, ...
            Token::Ident(id)
                if KEYWORDS.contains(&id.as_str()) || GROUPING.contains(&id.as_str()) => {}
            // a function or an aggregation (`sum(`, `sum by (`, `sum without (`)
            Token::Ident(_)
                if is_punct(ts.get(i + 1), "(")
                    || matches!(ts.get(i + 1), Some(Token::Ident(m)) if m == "by" || m == "without") =>
                {}
            Token::Ident(id) => {
                let mut sel = Selector {
                    name: id.clone(),
                    matchers: Vec::new(),
                };
                if is_punct(ts.get(i + 1), "{") {
                    i += 2;
                    while !is_punct(ts.get(i), "}") {
                        match (ts.get(i), ts.get(i + 1), ts.get(i + 2)) {
                            (
                                Some(Token::Ident(l)),
                                Some(Token::Punct(op)),
                                Some(Token::Str(v)),
                            ) => {
                                sel.matchers.push((l.clone(), op.clone(), v.clone()));
                                i += 3;
                            }
                            _ => return Err(format!("unreadable matchers of {id} in {expr:?}")),
                        }
                        if is_punct(ts.get(i), ",") {
                            i += 1;
                        }
                    }
                }
                out.selectors.push(sel);
            }
            Token::Punct(p) if p == "{" => {
                return Err(format!("a selector without a metric name in {expr:?}"));
            }
            _ => {}
        }
        i += 1;
    }
    Ok(out)
}

/// The metric a series name belongs to: a histogram's `_bucket`, `_sum` and `_count`
/// belong to it (and only `_bucket` has `le`); a histogram's bare name is no series.
fn metric_of(name: &str) -> Result<(&'static Def, bool), String> {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && let Some(d) = tidepool_metrics::def(base)
            && d.kind == Kind::Histogram
        {
            return Ok((d, suffix == "_bucket"));
        }
    }
    match tidepool_metrics::def(name) {
        Some(d) if d.kind == Kind::Histogram => Err(format!(
            "{name} is a histogram: name its _bucket, _sum or _count series"
        )),
        Some(d) => Ok((d, false)),
        None => Err(format!("{name} is not a metric tidepool-metrics defines")),
    }
}

/// Every value a label of `d` takes, or `None` when it is not enumerable.
fn values_of(d: &Def, key: &str) -> Option<Vec<&'static str>> {
    let (_, values) = d.labels.iter().find(|(k, _)| *k == key)?;
    match values {
        Values::Enumerated(v) => Some(v.to_vec()),
        Values::DependsOn { key: on, values } => {
            let parents = values_of(d, on)?;
            let mut all: Vec<&'static str> =
                parents.iter().flat_map(|p| values(p).to_vec()).collect();
            all.sort_unstable();
            all.dedup();
            Some(all)
        }
        Values::Free => None,
    }
}

/// A regex matcher's alternatives when it is a plain `a|b|c` of literal values.
fn literal_alternatives(re: &str) -> Option<Vec<&str>> {
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    let alts: Vec<&str> = re.split('|').collect();
    alts.iter().all(|a| plain(a)).then_some(alts)
}

/// Problems with what `expr` names: metrics tidepool does not export, labels a metric does
/// not have, values an enumerated label never takes, grouping labels none of its metrics
/// has. Empty when all is well.
pub fn check(expr: &str) -> Vec<String> {
    let n = match names(expr) {
        Ok(n) => n,
        Err(e) => return vec![e],
    };
    let mut problems = Vec::new();
    let mut known_labels: Vec<&str> = TARGET_LABELS.to_vec();
    if n.selectors.is_empty() {
        problems.push(format!("no metric in {expr:?}"));
    }
    for s in &n.selectors {
        if PROMETHEUS_METRICS.contains(&s.name.as_str()) {
            for (label, _, _) in &s.matchers {
                if !TARGET_LABELS.contains(&label.as_str()) {
                    problems.push(format!("{}{{{label}}}: not a target label", s.name));
                }
            }
            continue;
        }
        let (def, bucket) = match metric_of(&s.name) {
            Ok(x) => x,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        known_labels.extend(def.labels.iter().map(|(k, _)| *k));
        if bucket {
            known_labels.push("le");
        }
        for (label, op, value) in &s.matchers {
            let own = def.labels.iter().any(|(k, _)| k == label);
            if !(own || TARGET_LABELS.contains(&label.as_str()) || (bucket && label == "le")) {
                problems.push(format!("{} has no label {label}", s.name));
                continue;
            }
            let Some(allowed) = values_of(def, label) else {
                continue;
            };
            let named: Vec<&str> = match op.as_str() {
                "=" | "!=" => vec![value.as_str()],
                _ => literal_alternatives(value).unwrap_or_default(),
            };
            for v in named {
                if !allowed.contains(&v) {
                    problems.push(format!(
                        "{}{{{label}{op}{value:?}}}: {v:?} is none of {allowed:?}",
                        s.name
                    ));
                }
            }
        }
    }
    for g in &n.grouping {
        if !known_labels.contains(&g.as_str()) {
            problems.push(format!(
                "grouping label {g} is on none of the metrics of {expr:?}"
            ));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// The parts of an alert expression that must return data.

/// An operator at the top level of an expression (outside parentheses, braces, brackets
/// and strings): its byte span and whether it is a set operator (`and`, `or`, `unless`)
/// or a comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TopOp {
    start: usize,
    end: usize,
    set: bool,
}

fn top_level_ops(expr: &str) -> Vec<TopOp> {
    let b = expr.as_bytes();
    let (mut out, mut depth, mut i) = (Vec::new(), 0i32, 0);
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' | b'\'' | b'`' => {
                i += 1;
                while i < b.len() && b[i] != c {
                    i += if b[i] == b'\\' && c != b'`' { 2 } else { 1 };
                }
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ if depth > 0 => {}
            _ if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':')
                {
                    i += 1;
                }
                if ["and", "or", "unless"].contains(&&expr[start..i]) {
                    out.push(TopOp {
                        start,
                        end: i,
                        set: true,
                    });
                }
                continue;
            }
            b'=' | b'!' | b'<' | b'>' => {
                let two = b.get(i + 1) == Some(&b'=');
                // `=` alone is no operator outside braces; `!` only starts `!=`
                if two || c == b'<' || c == b'>' {
                    let end = i + if two { 2 } else { 1 };
                    out.push(TopOp {
                        start: i,
                        end,
                        set: false,
                    });
                    i = end;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// `expr` without parentheses around all of it.
fn without_outer_parens(expr: &str) -> &str {
    let mut e = expr.trim();
    while e.starts_with('(') && e.ends_with(')') {
        let inner = &e[1..e.len() - 1];
        // only when the first `(` closes at the end: `(a) / (b)` stays
        let mut depth = 0i32;
        let closes_early = inner.chars().any(|c| {
            depth += match c {
                '(' => 1,
                ')' => -1,
                _ => 0,
            };
            depth < 0
        });
        if closes_early {
            break;
        }
        e = inner.trim();
    }
    e
}

/// `s` without a leading vector-matching modifier (`on (..)`, `ignoring (..)`,
/// `group_left (..)`, `group_right`) or `bool`.
fn without_modifiers(s: &str) -> &str {
    let mut s = s.trim_start();
    loop {
        let word_end = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        let word = &s[..word_end];
        if !["on", "ignoring", "group_left", "group_right", "bool"].contains(&word) {
            return s;
        }
        s = s[word_end..].trim_start();
        if word != "bool"
            && s.starts_with('(')
            && let Some(close) = s.find(')')
        {
            s = s[close + 1..].trim_start();
        }
    }
}

fn is_number(s: &str) -> bool {
    s.trim().parse::<f64>().is_ok()
}

/// The parts of an alert expression that must return data even while the alert is quiet:
/// a threshold keeps an alert quiet by design, the series under it must still be there.
/// Operands of the top-level set operators (`and`, `or`, `unless`) are taken one by one;
/// each loses its outermost comparison with a number (the side that is not the number is
/// kept; a comparison of two vectors keeps both); `absent(x)` is quiet exactly when `x`
/// has data, so its part is `x`. Anything else is its own part.
pub fn data_parts(expr: &str) -> Vec<String> {
    let e = without_outer_parens(expr);
    let ops = top_level_ops(e);
    let sets: Vec<&TopOp> = ops.iter().filter(|o| o.set).collect();
    if !sets.is_empty() {
        let mut parts = Vec::new();
        let mut from = 0;
        for op in sets {
            parts.extend(data_parts(without_modifiers(&e[from..op.start])));
            from = op.end;
        }
        parts.extend(data_parts(without_modifiers(&e[from..])));
        return parts;
    }
    // comparisons associate to the left: the last one is the outermost
    if let Some(op) = ops.last() {
        let (lhs, rhs) = (&e[..op.start], without_modifiers(&e[op.end..]));
        return [lhs, rhs]
            .into_iter()
            .filter(|side| !is_number(side))
            .map(|side| without_outer_parens(side).to_owned())
            .collect();
    }
    if let Some(inner) = e.strip_prefix("absent(").and_then(|r| r.strip_suffix(')')) {
        return vec![without_outer_parens(inner).to_owned()];
    }
    vec![e.to_owned()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_selectors_grouping_and_ranges() {
        let n = names(
            r#"sum by (pool, family) (rate(tidepool_ipam_pool_ips{pool=~"a|b", state!="free"}[$__rate_interval])) / on (pool) tidepool_leader"#,
        )
        .unwrap();
        assert_eq!(n.grouping, ["pool", "family", "pool"]);
        assert_eq!(n.ranges, ["$__rate_interval"]);
        assert_eq!(n.selectors.len(), 2);
        assert_eq!(n.selectors[0].name, "tidepool_ipam_pool_ips");
        assert_eq!(
            n.selectors[0].matchers,
            [
                ("pool".into(), "=~".into(), "a|b".into()),
                ("state".into(), "!=".into(), "free".into())
            ]
        );
        assert_eq!(n.selectors[1].name, "tidepool_leader");
    }

    #[test]
    fn accepts_what_the_table_defines() {
        for ok in [
            r#"max by (family, state) (tidepool_ipam_ips{state="free"})"#,
            r#"sum by (pool) (tidepool_ipam_pods_waiting{pool=~"blue|default"})"#,
            r#"histogram_quantile(0.99, sum by (le, api) (rate(tidepool_ipam_api_wait_seconds_bucket[5m])))"#,
            r#"sum(rate(tidepool_ipam_api_requests_total{api="kube", op="apply", outcome=~"failure|throttled"}[5m]))"#,
            r#"up{job="tidepool-agent"} == 0"#,
        ] {
            assert_eq!(check(ok), Vec::<String>::new(), "{ok}");
        }
    }

    #[test]
    fn refuses_what_the_table_does_not_define() {
        for (bad, why) in [
            ("tidepool_ipam_bogus", "not a metric"),
            (r#"tidepool_ipam_ips{colour="red"}"#, "no label colour"),
            (r#"tidepool_ipam_ips{state="lost"}"#, "\"lost\" is none of"),
            (
                r#"tidepool_ipam_ips{state=~"free|lost"}"#,
                "\"lost\" is none of",
            ),
            ("rate(tidepool_ipam_api_wait_seconds[5m])", "is a histogram"),
            (
                "sum by (colour) (tidepool_ipam_ips)",
                "grouping label colour",
            ),
            (r#"tidepool_ipam_ips{le="1"}"#, "no label le"),
            (r#"up{state="x"}"#, "not a target label"),
            ("sum(rate(node_cpu_seconds_total[5m]))", "not a metric"),
        ] {
            let problems = check(bad);
            assert!(
                problems.iter().any(|p| p.contains(why)),
                "{bad}: {problems:?}"
            );
        }
    }

    #[test]
    fn data_parts_drop_the_outermost_threshold() {
        let parts = |e: &str| data_parts(e);
        assert_eq!(parts("(\n  a\n  /\n  b\n) < 0.10\n"), ["a\n  /\n  b"]);
        assert_eq!(parts(r#"up{job="a"} == 0"#), [r#"up{job="a"}"#]);
        assert_eq!(
            parts(r#"x{a!="b", c=~"d|e"} >= 1"#),
            [r#"x{a!="b", c=~"d|e"}"#]
        );
        assert_eq!(parts("rate(x[5m]) > bool 2"), ["rate(x[5m])"]);
        assert_eq!(parts("0 < x"), ["x"]);
        assert_eq!(parts("x > y"), ["x", "y"]);
        assert_eq!(parts("(a) / (b) > 1"), ["(a) / (b)"]);
        assert_eq!(parts("sum(x)"), ["sum(x)"]);
        // set operators: every operand, each without its own threshold
        assert_eq!(
            parts("sum by (ns) (x) < 1\nor\nabsent(x)\n"),
            ["sum by (ns) (x)", "x"]
        );
        assert_eq!(
            parts("(a / b) < 0.25\nand\nmax by (p) (predict_linear(c[6h], 4 * 24 * 3600)) < 0"),
            ["a / b", "max by (p) (predict_linear(c[6h], 4 * 24 * 3600))"]
        );
        // only the outermost: a comparison inside an aggregation stays
        assert_eq!(
            parts("a > 0 and on (n) count by (n) (b <= 0 and on (f) c > 0)"),
            ["a", "count by (n) (b <= 0 and on (f) c > 0)"]
        );
        // names that contain operator words are no operators
        assert_eq!(parts("random_or_band > 1"), ["random_or_band"]);
    }
}
