//! structured-merge-diff's own merge tests, run against the in-process server's field manager.
//!
//! kubernetes-sigs/structured-merge-diff drives its merge tests (`merge/*_test.go`, through
//! `internal/fixture`) as tables: a schema, a series of Apply, ForceApply and Update operations by
//! named managers, and the expected object, managed fields and conflicts. The cases of six of
//! those files are re-expressed as data in `fixtures/smd/*.yaml` (facts about the real behaviour,
//! no upstream code), each naming its upstream test function and case. This runner replays every
//! case over HTTP, as the binaries write: a CRD carries the case's schema (served at v1, v2 and
//! v3, so that cases across versions keep their versions), an Apply is an apply PATCH with the
//! manager as `fieldManager` (`force=true` for ForceApply), an Update is a PUT (a POST while the
//! object does not exist). The server's answers then go through its store and `fieldset.rs`, the
//! code path of every apply the operator and the agent send. tests/README.md lists, per file, the
//! cases re-expressed and why the others are left out.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde::Deserialize;
use serde_json::{Map, Value, json};

const GROUP: &str = "smd.tidepool.test";

#[derive(Deserialize)]
struct File {
    upstream: String,
    cases_in_file: usize,
    groups: Vec<Group>,
    left_out: Vec<LeftOut>,
}

#[derive(Deserialize)]
struct Group {
    test: String,
    schema: Value,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct LeftOut {
    case: String,
    why: String,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    ops: Vec<Op>,
    object: Option<Value>,
    managed: Option<BTreeMap<String, Owned>>,
}

#[derive(Deserialize)]
struct Op {
    op: String,
    manager: String,
    version: String,
    object: Value,
    conflicts: Option<Vec<Conflict>>,
}

#[derive(Deserialize, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Conflict {
    manager: String,
    path: String,
}

#[derive(Deserialize)]
struct Owned {
    version: String,
    fields: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_test() {
    run_file(include_str!("fixtures/smd/key.yaml")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_test() {
    run_file(include_str!("fixtures/smd/set.yaml")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_test() {
    run_file(include_str!("fixtures/smd/nested.yaml")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiple_appliers_test() {
    run_file(include_str!("fixtures/smd/multiple_appliers.yaml")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaf_test() {
    run_file(include_str!("fixtures/smd/leaf.yaml")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_level_overrides_test() {
    run_file(include_str!("fixtures/smd/field_level_overrides.yaml")).await;
}

/// The same rules on the shapes tidepool writes (an IPAMNode's `spec.reclaim` tombstones, a
/// map of objects, and its `status.conditions`, a list-map keyed by `type`). When a manager stops
/// applying a map entry or a list item, the whole entry goes unless another manager owns the
/// entry itself: owning a field inside it is not enough (kubernetes-sigs/structured-merge-diff
/// `merge/update.go`, `prune` → `addBackOwnedItems` with `EnsureNamedFieldsAreMembers`, which
/// makes declared fields members but never map keys or list items; `typed/remove.go` drops an
/// entry whole on `toRemove.Has(path)`). Before, the server kept the entry with the other
/// manager's field only, which the schema then refused on every write (`podUID` Required).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_another_manager_edited_goes_whole_when_its_applier_drops_it() {
    let (_server, client) = start().await;
    let nodes = install_crd(&client).await;
    let op = PatchParams::apply("tidepool-operator");
    let edit = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..PatchParams::default()
    };
    let node = |spec: Value, status: Option<Value>| {
        let mut v = json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": {"name": "n1"}, "spec": spec});
        if let Some(s) = status {
            v["status"] = s;
        }
        v
    };
    let tomb = json!({"10.0.0.5": {"podUID": "u1", "reason": "pod-deleted"}});
    nodes
        .patch(
            "n1",
            &op,
            &Patch::Apply(node(json!({"nodeUID": "u", "reclaim": tomb}), None)),
        )
        .await
        .expect("operator applies a tombstone");
    let ready = json!([{"type": "Ready", "status": "True", "reason": "Synced"}]);
    nodes
        .patch_status(
            "n1",
            &op,
            &Patch::Apply(node(json!({}), Some(json!({"conditions": ready})))),
        )
        .await
        .expect("operator applies a condition");
    // An admin edits one field inside each (`kubectl edit`, an update).
    nodes
        .patch(
            "n1",
            &edit,
            &Patch::Merge(json!({"spec": {"reclaim": {"10.0.0.5": {"reason": "edited"}}}})),
        )
        .await
        .expect("edit the tombstone");
    let edited = json!([{"type": "Ready", "status": "True", "reason": "Edited"}]);
    nodes
        .patch_status(
            "n1",
            &edit,
            &Patch::Merge(json!({"status": {"conditions": edited}})),
        )
        .await
        .expect("edit the condition");
    // The operator withdraws both: each goes whole, and the applies succeed.
    let a = nodes
        .patch(
            "n1",
            &op,
            &Patch::Apply(node(json!({"nodeUID": "u"}), None)),
        )
        .await
        .expect("withdrawing the tombstone succeeds");
    assert_eq!(a.data["spec"].get("reclaim"), None, "{}", a.data["spec"]);
    let b = nodes
        .patch_status(
            "n1",
            &op,
            &Patch::Apply(node(json!({}), Some(json!({"conditions": []})))),
        )
        .await
        .expect("withdrawing the condition succeeds");
    let conditions = b.data["status"].get("conditions").and_then(Value::as_array);
    assert!(conditions.is_none_or(Vec::is_empty), "{}", b.data["status"]);
    // Nobody owns anything in them any more; an empty list-map records no ownership
    // (structured-merge-diff `typed/tofieldset.go`, `doList`: items only).
    let owners = serde_json::to_value(b.metadata.managed_fields).unwrap();
    for path in ["/f:spec/f:reclaim", "/f:status/f:conditions"] {
        let who: Vec<&Value> = owners
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["fieldsV1"].pointer(path).is_some())
            .map(|e| &e["manager"])
            .collect();
        assert!(who.is_empty(), "{path} still owned by {who:?}: {owners}");
    }
}

/// An empty associative list records no ownership: structured-merge-diff records a list-map's
/// or a set's items, never the list itself (kubernetes-sigs/structured-merge-diff
/// `typed/tofieldset.go`, `doList` → `visitListItems`). The operator always sends
/// `status.conditions`, `[]` included. Before, the server recorded `f:conditions` as a leaf.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_associative_list_records_no_ownership() {
    let (_server, client) = start().await;
    let nodes = install_crd(&client).await;
    let op = PatchParams::apply("tidepool-operator");
    let body = |status: Value| {
        json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": {"name": "n1"}, "spec": {"nodeUID": "u"}, "status": status})
    };
    nodes
        .patch("n1", &op, &Patch::Apply(body(json!({}))))
        .await
        .expect("create");
    let a = nodes
        .patch_status(
            "n1",
            &op,
            &Patch::Apply(body(json!({"conditions": [], "used": {}}))),
        )
        .await
        .expect("status apply");
    let status_entry = a
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .find(|e| e.subresource.as_deref() == Some("status"))
        .and_then(|e| e.fields_v1.clone())
        .expect("the empty map is owned")
        .0;
    assert_eq!(status_entry, json!({"f:status": {"f:used": {}}}));
}

/// A conflict names the leaves that change, not the entry that holds them
/// (kubernetes-sigs/structured-merge-diff `merge/update.go`, `update`: a manager's set ∩
/// (Modified ∪ Added) of `typed/compare.go`, which descends into map entries and list items
/// and reports a leaf as modified only when its value differs). Before, the server compared
/// whole values at every path a manager owned, so a co-owned map entry conflicted as a whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_arise_only_on_leaves_that_change() {
    let (_server, client) = start().await;
    let nodes = install_crd(&client).await;
    let apply = |who: &str, reclaim: Value| {
        let nodes = nodes.clone();
        let pp = PatchParams::apply(who);
        let body = json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": {"name": "n1"}, "spec": {"reclaim": reclaim}});
        async move { nodes.patch("n1", &pp, &Patch::Apply(body)).await }
    };
    apply(
        "op",
        json!({"10.0.0.5": {"podUID": "u1", "reason": "pod-deleted"}}),
    )
    .await
    .expect("first applier");
    apply("other", json!({"10.0.0.5": {"podUID": "u1"}}))
        .await
        .expect("the same value co-owns the entry");
    let err = apply(
        "other",
        json!({"10.0.0.5": {"podUID": "u1", "reason": "pod-terminal"}}),
    )
    .await
    .expect_err("a changed leaf of another manager conflicts");
    let s = status(&err);
    let fields: Vec<&str> = s
        .details
        .as_ref()
        .unwrap()
        .causes
        .iter()
        .map(|c| c.field.as_str())
        .collect();
    assert_eq!(
        fields,
        vec![".spec.reclaim.10.0.0.5.reason"],
        "{}",
        s.message
    );
}

/// Runs every case of one fixture file; panics listing each case that fails.
async fn run_file(yaml: &str) {
    let file: File = serde_saphyr::from_str(yaml).expect("fixture yaml");
    let re_expressed: usize = file.groups.iter().map(|g| g.cases.len()).sum();
    assert_eq!(
        re_expressed + file.left_out.len(),
        file.cases_in_file,
        "{}: every upstream case is either re-expressed or left out with a reason",
        file.upstream
    );
    assert!(
        file.left_out
            .iter()
            .all(|l| !l.why.is_empty() && !l.case.is_empty())
    );
    let (_server, client) = start().await;
    let mut failures = Vec::new();
    for group in &file.groups {
        install(&client, &group.test, &group.schema).await;
        for case in &group.cases {
            if let Err(e) = run_case(&client, &group.test, case).await {
                failures.push(format!(
                    "{} {} {}: {e}",
                    file.upstream, group.test, case.name
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "failing cases:\n{}",
        failures.join("\n")
    );
}

fn kind_of(test: &str) -> String {
    let t = test.trim_start_matches("test").trim_start_matches("Test");
    format!("{t}Case")
}

fn resource(test: &str, version: &str) -> ApiResource {
    let kind = kind_of(test);
    ApiResource {
        group: GROUP.into(),
        version: version.into(),
        api_version: format!("{GROUP}/{version}"),
        plural: format!("{}s", kind.to_lowercase()),
        kind,
    }
}

/// A cluster-scoped CRD whose objects carry the case schema's fields at the top level.
async fn install(client: &kube::Client, test: &str, schema: &Value) {
    let r = resource(test, "v1");
    let mut props = schema["properties"].clone();
    props["apiVersion"] = json!({"type": "string"});
    props["kind"] = json!({"type": "string"});
    props["metadata"] = json!({"type": "object"});
    let version = |v: &str| {
        json!({"name": v, "served": true, "storage": v == "v1",
            "schema": {"openAPIV3Schema": {"type": "object", "properties": props}}})
    };
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{GROUP}", r.plural)},
        "spec": {"group": GROUP, "scope": "Cluster",
            "names": {"plural": r.plural, "singular": r.kind.to_lowercase(), "kind": r.kind},
            "versions": [version("v1"), version("v2"), version("v3")]},
    }))
    .expect("crd");
    create_established(client, &crd).await;
}

struct Target<'a> {
    client: &'a kube::Client,
    test: &'a str,
    name: String,
}

impl Target<'_> {
    fn api(&self, version: &str) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &resource(self.test, version))
    }

    fn body(&self, op: &Op, resource_version: Option<String>) -> Value {
        let r = resource(self.test, &op.version);
        let mut body = json!({"apiVersion": r.api_version, "kind": r.kind,
            "metadata": {"name": self.name}});
        if let Some(rv) = resource_version {
            body["metadata"]["resourceVersion"] = json!(rv);
        }
        for (k, v) in op.object.as_object().into_iter().flatten() {
            body[k] = v.clone();
        }
        body
    }

    /// Runs one operation; `Ok(conflicts)` for an apply that the server refused with 409.
    async fn run(&self, op: &Op) -> Result<Vec<Conflict>, String> {
        let api = self.api(&op.version);
        let res = match op.op.as_str() {
            "apply" | "force-apply" => {
                let mut pp = PatchParams::apply(&op.manager);
                pp.force = op.op == "force-apply";
                api.patch(&self.name, &pp, &Patch::Apply(self.body(op, None)))
                    .await
            }
            "update" => {
                let pp = PostParams {
                    field_manager: Some(op.manager.clone()),
                    ..PostParams::default()
                };
                match api.get_opt(&self.name).await.map_err(|e| e.to_string())? {
                    None => api.create(&pp, &dynamic(self.body(op, None))).await,
                    Some(live) => {
                        let body = self.body(op, live.metadata.resource_version);
                        api.replace(&self.name, &pp, &dynamic(body)).await
                    }
                }
            }
            other => return Err(format!("unknown operation {other}")),
        };
        match res {
            Ok(_) => Ok(Vec::new()),
            Err(kube::Error::Api(s)) if s.code == 409 && op.op == "apply" => {
                let causes = s.details.map(|d| d.causes).unwrap_or_default();
                Ok(causes
                    .iter()
                    .map(|c| Conflict {
                        manager: c.message.split('"').nth(1).unwrap_or_default().to_string(),
                        path: c.field.clone(),
                    })
                    .collect())
            }
            Err(e) => Err(format!("{} by {}: {e}", op.op, op.manager)),
        }
    }
}

async fn run_case(client: &kube::Client, test: &str, case: &Case) -> Result<(), String> {
    let target = Target {
        client,
        test,
        name: case.name.to_lowercase().replace('_', "-"),
    };
    for (i, op) in case.ops.iter().enumerate() {
        let mut got = target.run(op).await?;
        got.sort();
        let mut want: Vec<Conflict> = op
            .conflicts
            .iter()
            .flatten()
            .map(|c| Conflict {
                manager: c.manager.clone(),
                path: c.path.clone(),
            })
            .collect();
        want.sort();
        if got != want {
            return Err(format!(
                "operation {i}: conflicts {got:?}, expected {want:?}"
            ));
        }
    }
    let live = target
        .api("v1")
        .get_opt(&target.name)
        .await
        .map_err(|e| e.to_string())?;
    let live = live
        .map(|o| serde_json::to_value(o).expect("json"))
        .unwrap_or(json!({}));
    if let Some(want) = &case.object {
        let mut got = live.as_object().cloned().unwrap_or_default();
        for k in ["apiVersion", "kind", "metadata"] {
            got.remove(k);
        }
        if Value::Object(got.clone()) != *want {
            return Err(format!("object {}, expected {want}", Value::Object(got)));
        }
    }
    if let Some(want) = &case.managed {
        check_managed(&live, want)?;
    }
    Ok(())
}

/// Compares the object's managedFields with the case's: one entry per manager, at the
/// expected version, owning exactly the listed paths.
fn check_managed(live: &Value, want: &BTreeMap<String, Owned>) -> Result<(), String> {
    let entries = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut got: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
    for e in &entries {
        let manager = e["manager"].as_str().unwrap_or_default().to_string();
        let mut paths = BTreeSet::new();
        members(&e["fieldsV1"], String::new(), &mut paths);
        let version = e["apiVersion"].as_str().unwrap_or_default().to_string();
        if got.insert(manager.clone(), (version, paths)).is_some() {
            return Err(format!("two managedFields entries for {manager}"));
        }
    }
    let want: BTreeMap<String, (String, BTreeSet<String>)> = want
        .iter()
        .map(|(m, o)| {
            let paths = o.fields.iter().cloned().collect();
            (m.clone(), (format!("{GROUP}/{}", o.version), paths))
        })
        .collect();
    if got != want {
        return Err(format!("managed fields {got:?}, expected {want:?}"));
    }
    Ok(())
}

/// The member paths of a `FieldsV1` tree, in structured-merge-diff's notation
/// (`.list[name="a"].value`, `.set[="x"]`).
fn members(node: &Value, prefix: String, out: &mut BTreeSet<String>) {
    let Some(m) = node.as_object() else { return };
    if (m.is_empty() || m.contains_key(".")) && !prefix.is_empty() {
        out.insert(prefix.clone());
    }
    for (k, child) in m {
        let element = if let Some(f) = k.strip_prefix("f:") {
            format!(".{f}")
        } else if let Some(key) = k.strip_prefix("k:") {
            let fields: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
            let parts: Vec<String> = fields.iter().map(|(n, v)| format!("{n}={v}")).collect();
            format!("[{}]", parts.join(","))
        } else if let Some(v) = k.strip_prefix("v:") {
            format!("[={v}]")
        } else {
            continue;
        };
        members(child, format!("{prefix}{element}"), out);
    }
}
