//! Discovery documents, `/version`, OpenAPI v3 documents (enough for kubectl's field
//! validation and `explain`), and `Table` output for kubectl's default printer.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::registry::ResType;

/// `/version` of a server whose `gitVersion` is `git_version` (`v1.33.0-tidepool`): major and
/// minor are its numbers (kubernetes/apimachinery `pkg/version` `Info`).
pub(crate) fn version(git_version: &str) -> Value {
    let (major, minor) = major_minor(git_version);
    json!({
        "major": major.to_string(), "minor": minor.to_string(),
        "emulationMajor": major.to_string(), "emulationMinor": minor.to_string(),
        "minCompatibilityMajor": major.to_string(),
        "minCompatibilityMinor": minor.saturating_sub(1).to_string(),
        "gitVersion": git_version, "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.2",
        "compiler": "gc", "platform": "linux/amd64",
    })
}

/// The major and minor numbers of a `gitVersion` (`v1.30.2-x` → (1, 30)); (0, 0) when it has
/// none.
pub(crate) fn major_minor(git_version: &str) -> (u32, u32) {
    let mut parts = git_version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

pub(crate) fn api_versions(addr: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}]})
}

/// Resources served without storage, create only: `(group, version, plural, kind, singular)`.
/// The singular name of SelfSubjectReview is what kubernetes/kubernetes
/// `pkg/registry/authentication/selfsubjectreview/rest.go` `GetSingularName` returns.
const REVIEWS: [(&str, &str, &str, &str, &str); 1] = [(
    crate::access_review::AUTHN_GROUP,
    "v1",
    "selfsubjectreviews",
    "SelfSubjectReview",
    "selfsubjectrulesreview",
)];

/// group → versions (storage/preferred version first).
fn groups(types: &[Arc<ResType>]) -> BTreeMap<String, Vec<String>> {
    let mut g: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (group, version, ..) in REVIEWS {
        g.entry(group.into()).or_default().push(version.into());
    }
    for t in types.iter().filter(|t| !t.group.is_empty()) {
        let vs = g.entry(t.group.clone()).or_default();
        if !vs.contains(&t.version) {
            if t.version == t.storage_version {
                vs.insert(0, t.version.clone());
            } else {
                vs.push(t.version.clone());
            }
        }
    }
    g
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs[0].clone()})
}

pub(crate) fn group_list(types: &[Arc<ResType>]) -> Value {
    let gs: Vec<Value> = groups(types).iter().map(|(n, v)| group_doc(n, v)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

pub(crate) fn group(types: &[Arc<ResType>], name: &str) -> Option<Value> {
    groups(types).get(name).map(|v| {
        let mut d = group_doc(name, v);
        d["kind"] = json!("APIGroup");
        d["apiVersion"] = json!("v1");
        d
    })
}

pub(crate) fn resource_list(types: &[Arc<ResType>], group: &str, version: &str) -> Option<Value> {
    let reviews = REVIEWS
        .iter()
        .filter(|r| r.0 == group && r.1 == version)
        .map(|r| {
            json!({"name": r.2, "singularName": r.4, "namespaced": false, "kind": r.3,
                "verbs": ["create"]})
        });
    let rs: Vec<Value> = types
        .iter()
        .filter(|t| t.group == group && t.version == version)
        .flat_map(|t| t.discovery())
        .chain(reviews)
        .collect();
    if rs.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": rs}),
    )
}

fn gv_path(t: &ResType) -> String {
    if t.group.is_empty() {
        format!("api/{}", t.version)
    } else {
        format!("apis/{}/{}", t.group, t.version)
    }
}

pub(crate) fn openapi_root(types: &[Arc<ResType>], generation: u64) -> Value {
    let mut paths = serde_json::Map::new();
    for t in types {
        let p = gv_path(t);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={generation:016X}")}),
        );
    }
    json!({"paths": paths})
}

fn schema_name(t: &ResType) -> String {
    let mut g: Vec<&str> = if t.group.is_empty() {
        vec!["io", "k8s", "api", "core"]
    } else {
        t.group.split('.').rev().collect()
    };
    if t.group.is_empty() {
        g.truncate(4);
    }
    format!("{}.{}.{}", g.join("."), t.version, t.kind)
}

fn param(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

/// The OpenAPI v3 document of one group-version (`api/v1`, `apis/g/v`).
pub(crate) fn openapi_gv(types: &[Arc<ResType>], gv: &str) -> Option<Value> {
    let ts: Vec<&Arc<ResType>> = types.iter().filter(|t| gv_path(t) == gv).collect();
    if ts.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for t in ts {
        let gvk = json!({"group": t.group, "version": t.version, "kind": t.kind});
        let sname = schema_name(t);
        let sref = json!({"$ref": format!("#/components/schemas/{sname}")});
        let mut schema = t.schema.clone().unwrap_or_else(
            || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
        schema["x-kubernetes-group-version-kind"] = json!([gvk]);
        schemas.insert(sname, schema);
        let base = if t.namespaced {
            format!("/{gv}/namespaces/{{namespace}}/{}", t.plural)
        } else {
            format!("/{gv}/{}", t.plural)
        };
        let write_params = vec![
            param("dryRun"),
            param("fieldManager"),
            param("fieldValidation"),
        ];
        let mut patch_params = write_params.clone();
        patch_params.push(json!({"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}}));
        let resp = json!({"200": {"description": "OK", "content": {"application/json": {"schema": sref}}}});
        let op = |action: &str, params: &Vec<Value>, body: Option<Value>| {
            let mut o = json!({"operationId": format!("{action}{}", t.kind), "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": resp});
            if let Some(b) = body {
                o["requestBody"] = b;
            }
            o
        };
        let patch_body = json!({"content": {
            "application/apply-patch+yaml": {"schema": {"type": "object"}},
            "application/json-patch+json": {"schema": {"type": "object"}},
            "application/merge-patch+json": {"schema": {"type": "object"}},
        }, "required": true});
        let json_body =
            json!({"content": {"application/json": {"schema": sref}}, "required": true});
        paths.insert(
            base.clone(),
            json!({"get": op("list", &vec![], None), "post": op("post", &write_params, Some(json_body.clone()))}),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"get": op("get", &vec![], None), "put": op("put", &write_params, Some(json_body.clone())),
                "patch": op("patch", &patch_params, Some(patch_body.clone())), "delete": op("delete", &vec![], None)}),
        );
        if t.status {
            paths.insert(
                format!("{base}/{{name}}/status"),
                json!({"get": op("get", &vec![], None), "put": op("put", &write_params, Some(json_body)),
                    "patch": op("patch", &patch_params, Some(patch_body))}),
            );
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// Human-readable age, as kubectl prints it.
pub(crate) fn age(ts: &str) -> String {
    let Ok(t) = ts.parse::<jiff::Timestamp>() else {
        return "<unknown>".into();
    };
    let s = (jiff::Timestamp::now().as_second() - t.as_second()).max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    if s < 120 {
        format!("{s}s")
    } else if s < 600 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        format!("{h}h{}m", m % 60)
    } else if h < 48 {
        format!("{h}h")
    } else {
        format!("{d}d")
    }
}

/// A tiny JSONPath evaluator for printer columns: `.a.b`, `[0]`, `[?(@.k=="v")]`.
pub(crate) fn jsonpath(v: &Value, path: &str) -> Vec<Value> {
    let mut cur = vec![v.clone()];
    let p = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut rest = p.trim_start_matches('$');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            cur = cur.iter().filter_map(|c| c.get(field).cloned()).collect();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else { break };
            let inner = &r[..end];
            rest = &r[end + 1..];
            if let Some(f) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (k, want) = f.split_once("==").unwrap_or((f, ""));
                let want = want.trim().trim_matches(['"', '\'']);
                cur = cur
                    .iter()
                    .filter_map(Value::as_array)
                    .flatten()
                    .filter(|item| {
                        item.pointer(&format!("/{}", k.trim().replace('.', "/")))
                            .is_some_and(|x| {
                                x.as_str()
                                    .map(String::from)
                                    .unwrap_or_else(|| x.to_string())
                                    == want
                            })
                    })
                    .cloned()
                    .collect();
            } else if inner == "*" {
                cur = cur
                    .iter()
                    .filter_map(Value::as_array)
                    .flatten()
                    .cloned()
                    .collect();
            } else if let Ok(i) = inner.parse::<usize>() {
                cur = cur.iter().filter_map(|c| c.get(i).cloned()).collect();
            }
        } else {
            break;
        }
    }
    cur
}

fn cell(ty: &str, vals: Vec<Value>) -> Value {
    match (ty, vals.as_slice()) {
        (_, []) => Value::Null,
        ("date", [Value::String(s)]) => json!(age(s)),
        ("integer" | "number" | "boolean", [x]) => x.clone(),
        (_, [Value::String(s)]) => json!(s),
        (_, many) => json!(
            many.iter()
                .map(|x| x
                    .as_str()
                    .map(String::from)
                    .unwrap_or_else(|| x.to_string()))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

/// A `meta.k8s.io/v1` Table of `items`.
pub(crate) fn table(t: &ResType, items: &[Arc<Value>], rv: u64, include: &str) -> Value {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    let mut paths: Vec<(String, String)> = Vec::new();
    // Built-in kinds with a printer of their own (`pkg/printers/internalversion`).
    let printed = crate::kinds::columns(&t.group, &t.kind);
    if let Some(c) = &printed {
        cols.extend(c.iter().cloned());
    }
    for c in t.columns.iter().filter(|_| printed.is_none()) {
        cols.push(json!({"name": c.name, "type": c.ty, "format": "", "description": c.description, "priority": c.priority}));
        paths.push((c.ty.clone(), c.json_path.clone()));
    }
    if t.columns.is_empty() && printed.is_none() {
        cols.push(json!({"name": "Age", "type": "date", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}));
        paths.push(("date".into(), ".metadata.creationTimestamp".into()));
    }
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut cells = vec![o.pointer("/metadata/name").cloned().unwrap_or(Value::Null)];
            if printed.is_some() {
                cells.extend(crate::kinds::cells(&t.group, &t.kind, o, age));
            }
            for (ty, p) in &paths {
                cells.push(cell(ty, jsonpath(o, p)));
            }
            let mut row = json!({"cells": cells});
            match include {
                "None" => {}
                "Object" => row["object"] = (**o).clone(),
                _ => {
                    let mut md = o.get("metadata").cloned().unwrap_or(json!({}));
                    if let Some(m) = md.as_object_mut() {
                        m.remove("managedFields");
                    }
                    row["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": md});
                }
            }
            row
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": cols, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_filters_conditions() {
        let o = json!({"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]}, "spec": {"l": [1, 2]}});
        assert_eq!(
            jsonpath(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            vec![json!("True")]
        );
        assert_eq!(jsonpath(&o, ".spec.l[1]"), vec![json!(2)]);
        assert!(jsonpath(&o, ".spec.missing").is_empty());
    }
}
