//! The PromQL the deploy bundle ships, read from deploy/: the Grafana dashboard's panels,
//! their queries and its template variables, and the alert rules' expressions. Shared by
//! the static checks (tests/tests/deploy.rs) and the live one against a real Prometheus
//! (agent/tests/live_prometheus.rs includes this file by path: Cargo shares no test modules
//! between crates).
// Each including test binary uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::Value;

pub const DASHBOARD: &str = "deploy/grafana/tidepool.json";
pub const RULES: &str = "deploy/prometheus/tidepool-rules.yaml";

/// The repository's root (both crates that include this file sit one level below it).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate sits in the repository")
        .to_path_buf()
}

/// The dashboard, parsed.
pub fn dashboard() -> Value {
    let text = std::fs::read_to_string(repo().join(DASHBOARD)).expect("the dashboard");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every panel, rows' nested panels included.
pub fn panels(dash: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// One query of a panel.
#[derive(Debug, Clone)]
pub struct PanelQuery {
    pub title: String,
    pub ref_id: String,
    /// As written, Grafana's variables unsubstituted.
    pub expr: String,
}

/// Every query of every panel that is not a row.
pub fn panel_queries(dash: &Value) -> Vec<PanelQuery> {
    let mut out = Vec::new();
    for p in panels(dash).into_iter().filter(|p| p["type"] != "row") {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(PanelQuery {
                title: p["title"].as_str().unwrap_or("?").to_owned(),
                ref_id: t["refId"].as_str().unwrap_or("?").to_owned(),
                expr: t["expr"].as_str().expect("a PromQL target").to_owned(),
            });
        }
    }
    out
}

/// A query variable `label_values(metric, label)`: (name, metric, label).
pub fn label_values_variables(dash: &Value) -> Vec<(String, String, String)> {
    let vars = dash["templating"]["list"].as_array().expect("variables");
    vars.iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let q = v["query"]["query"].as_str().expect("a query");
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|s| s.strip_suffix(')'))
                .unwrap_or_else(|| panic!("not label_values(metric, label): {q}"));
            let (metric, label) = inner.split_once(", ").expect("metric, label");
            let name = v["name"].as_str().expect("a name");
            (name.to_owned(), metric.to_owned(), label.to_owned())
        })
        .collect()
}

/// The alert rules file, parsed.
pub fn rules() -> Value {
    let text = std::fs::read_to_string(repo().join(RULES)).expect("the rules");
    serde_saphyr::from_str(&text).expect("the rules are YAML")
}

/// Every alert: (name, expression).
pub fn alerts(rules: &Value) -> Vec<(String, String)> {
    let groups = rules["groups"].as_array().expect("groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .map(|r| {
            let name = r["alert"].as_str().expect("only alerts here").to_owned();
            (name, r["expr"].as_str().expect("an expr").to_owned())
        })
        .collect()
}
