//! CRD validation rules (`x-kubernetes-validations`) and validation ratcheting, as
//! kubernetes/apiextensions-apiserver 1.33 enforces them.

use serde_json::{Value, json};
use tidepool_tests::ApiServer;

use crate::common::*;
use crate::{crd, invalid_causes};

const WIDGETS: &str = "/apis/example.com/v1/namespaces/default/widgets";
const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// A request as `tester`: code, the `Warning` headers' texts and the parsed body.
async fn send(
    server: &ApiServer,
    method: &str,
    path: &str,
    body: &Value,
    ctype: &str,
) -> (u16, Vec<String>, Value) {
    let text = body.to_string();
    let token = Some(server.token("tester"));
    let (code, headers, out) = raw_typed(server, method, path, token, Some(&text), ctype).await;
    let warnings = headers
        .into_iter()
        .filter(|(k, _)| k == "warning")
        .map(|(_, v)| v)
        .collect();
    (
        code,
        warnings,
        serde_json::from_str(&out).unwrap_or(Value::String(out)),
    )
}

/// A merge patch as `tester`, answered as [`send`] answers.
async fn patch(server: &ApiServer, path: &str, body: &Value) -> (u16, Vec<String>, Value) {
    send(server, "PATCH", path, body, "application/merge-patch+json").await
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// The widgets CRD with a status subresource and the rules of `spec` and `status` given.
fn ruled(spec: Value, status: Value) -> Value {
    crd(|c| {
        let v = &mut c["spec"]["versions"][0];
        v["subresources"] = json!({"status": {}});
        let root = &mut v["schema"]["openAPIV3Schema"];
        root["properties"]["spec"] = spec;
        root["properties"]["status"] = status;
        root["x-kubernetes-validations"] = json!([{"rule": "self.metadata.name.startsWith('w')"}]);
    })
}

fn widget(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name},
        "spec": spec})
}

/// Rules on the root, on objects, on scalars, with `message`, `messageExpression`, `reason`
/// and `fieldPath`; a transition rule on update; a status rule on a status update; schema
/// errors that block the rules. Each failure in the real server's words (kubernetes/
/// apiextensions-apiserver `pkg/apiserver/schema/cel/validation.go` `validateExpressions`,
/// `fieldErrorForReason`, `ruleMessageOrDefault`; `pkg/registry/customresource/strategy.go`
/// `Validate`, `ValidateUpdate` and `hasBlockingErr`; `status_strategy.go` `ValidateUpdate`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_validation_rules_are_enforced_in_the_real_servers_words() {
    let (server, _client) = start().await;
    let spec = json!({"type": "object",
        "x-kubernetes-validations": [
            {"rule": "self.min <= self.max", "message": "min must not exceed max"},
            {"rule": "!has(self.ports) || size(self.ports) < 3", "message": "too many ports",
             "fieldPath": ".ports"}],
        "properties": {
            "min": {"type": "integer"}, "max": {"type": "integer"},
            "ports": {"type": "array", "items": {"type": "integer"}},
            "size": {"type": "integer", "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "size is immutable"}]},
            "name": {"type": "string", "x-kubernetes-validations": [
                {"rule": "self.startsWith('a')", "reason": "FieldValueForbidden",
                 "messageExpression": "'name ' + self + ' must start with a'"}]}}});
    let status = json!({"type": "object", "properties": {"phase": {"type": "string",
        "x-kubernetes-validations": [{"rule": "self != 'Bad'"}]}}});
    let (code, _, v) = send(
        &server,
        "POST",
        CRDS,
        &ruled(spec, status),
        "application/json",
    )
    .await;
    assert_eq!(code, 201, "{v}");

    // create: the root's rule (no message), an object's, a scalar's with a reason and a
    // message expression; the transition rule does not run
    let bad = widget("x1", json!({"min": 3, "max": 1, "name": "b", "size": 1}));
    let (code, _, v) = send(&server, "POST", WIDGETS, &bad, "application/json").await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(v["reason"], "Invalid", "{v}");
    assert_eq!(
        sorted(invalid_causes(&v)),
        [
            "<nil>: \"Invalid value: \\\"object\\\": failed rule: self.metadata.name.startsWith('w')\"",
            "spec.name: \"Forbidden: name b must start with a\"",
            "spec: \"Invalid value: \\\"object\\\": min must not exceed max\"",
        ]
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("Widget.example.com \"x1\" is invalid: ["),
        "{v}"
    );
    // a rule's fieldPath names the field under the rule's node
    let ports = widget("w0", json!({"min": 1, "max": 2, "ports": [1, 2, 3]}));
    let (code, _, v) = send(&server, "POST", WIDGETS, &ports, "application/json").await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        v["message"],
        "Widget.example.com \"w0\" is invalid: spec.ports: Invalid value: \"object\": too many ports"
    );
    // a type error blocks the rules
    let typed = widget("w0", json!({"min": "three", "max": 1}));
    let (code, _, v) = send(&server, "POST", WIDGETS, &typed, "application/json").await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        invalid_causes(&v),
        [
            "spec.min: \"Invalid value: \\\"string\\\": spec.min in body must be of type integer: \\\"string\\\"\"",
            "<nil>: \"Invalid value: \\\"null\\\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation\"",
        ]
    );

    // update: the transition rule compares with the stored value
    let good = widget("w1", json!({"min": 1, "max": 2, "name": "abc", "size": 4}));
    let (code, _, v) = send(&server, "POST", WIDGETS, &good, "application/json").await;
    assert_eq!(code, 201, "{v}");
    let path = format!("{WIDGETS}/w1");
    let resize = json!({"spec": {"size": 5}});
    let (code, _, v) = patch(&server, &path, &resize).await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        v["message"],
        "Widget.example.com \"w1\" is invalid: spec.size: Invalid value: \"integer\": size is immutable"
    );
    let ok = json!({"spec": {"max": 3}});
    let (code, _, v) = patch(&server, &path, &ok).await;
    assert_eq!(code, 200, "{v}");

    // a status update runs the status's rules
    let phase = json!({"status": {"phase": "Bad"}});
    let status_path = format!("{path}/status");
    let (code, _, v) = patch(&server, &status_path, &phase).await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        v["message"],
        "Widget.example.com \"w1\" is invalid: status.phase: Invalid value: \"string\": failed rule: self != 'Bad'"
    );
    let phase = json!({"status": {"phase": "Good"}});
    let (code, _, v) = patch(&server, &status_path, &phase).await;
    assert_eq!(code, 200, "{v}");
}

/// A CRD whose rule does not compile is refused, naming the rule (kubernetes/
/// apiextensions-apiserver `pkg/apis/apiextensions/validation/validation.go`
/// `ValidateCustomResourceDefinitionOpenAPISchema`, `pkg/apiserver/schema/cel/compilation.go`
/// `compileRule`). A rule calling a Kubernetes CEL library function this server does not
/// evaluate is accepted, as the real server accepts it, with a warning saying it is not
/// enforced here (tests/README.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_rules_are_checked_when_the_crd_is_written() {
    let (server, _client) = start().await;
    let with_rule = |rule: Value| {
        crd(|c| {
            c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"] =
                json!([rule]);
        })
    };
    let spec_rules =
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0]";
    let (code, _, v) = send(
        &server,
        "POST",
        CRDS,
        &with_rule(json!({"rule": "self.replicas >"})),
        "application/json",
    )
    .await;
    assert_eq!(code, 422, "{v}");
    let causes = invalid_causes(&v);
    assert_eq!(causes.len(), 1, "{v}");
    assert!(
        causes[0].starts_with(&format!("{spec_rules}.rule: \"Invalid value: apiextensions.ValidationRule{{Rule:\\\"self.replicas >\\\", Message:\\\"\\\", MessageExpression:\\\"\\\", Reason:(*apiextensions.FieldValueErrorReason)(nil), FieldPath:\\\"\\\", OptionalOldSelf:(*bool)(nil)}}: compilation failed: ERROR: <input>:1:")),
        "{causes:?}"
    );
    let (code, _, v) = send(
        &server,
        "POST",
        CRDS,
        &with_rule(json!({"rule": " "})),
        "application/json",
    )
    .await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        invalid_causes(&v),
        [format!(
            "{spec_rules}.rule: \"Required value: rule is not specified\""
        )]
    );

    let library = json!({"rule": "self.tags.all(t, t.lowerAscii() == t)"});
    let (code, warnings, v) = send(
        &server,
        "POST",
        CRDS,
        &with_rule(library),
        "application/json",
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert!(
        warnings.iter().any(|w| w.contains(&format!(
            "{spec_rules}.rule: not enforced by this test server: it calls 'lowerAscii'"
        ))),
        "{warnings:?}"
    );
    let upper = widget("w1", json!({"tags": ["A"]}));
    let (code, _, v) = send(&server, "POST", WIDGETS, &upper, "application/json").await;
    assert_eq!(code, 201, "not enforced here: {v}");
}

/// Validation ratcheting (CRDValidationRatcheting, on by default since 1.30): after the schema
/// is tightened, an update that leaves an invalid value unchanged passes, the schema's checks
/// and the rules alike, and a status update passes while the spec stays invalid; a changed
/// value is checked (kubernetes/apiextensions-apiserver `pkg/registry/customresource/
/// strategy.go` `ValidateUpdate`, `pkg/apiserver/validation/ratcheting.go`
/// `ratchetingValueValidator.Validate`, `pkg/apiserver/schema/cel/validation.go`
/// `shouldRatchetError`: a ratcheted rule failure becomes a warning).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_ratcheting_lets_unchanged_invalid_values_pass() {
    let (server, _client) = start().await;
    let loose = crd(|c| c["spec"]["versions"][0]["subresources"] = json!({"status": {}}));
    let (code, _, v) = send(&server, "POST", CRDS, &loose, "application/json").await;
    assert_eq!(code, 201, "{v}");
    let w = widget("w1", json!({"replicas": 10, "tags": ["long-tag", "ok"]}));
    let (code, _, v) = send(&server, "POST", WIDGETS, &w, "application/json").await;
    assert_eq!(code, 201, "{v}");

    // tightened: at most 5 replicas, at most 2 by a rule, tags of at most 3 characters
    let crd_path = format!("{CRDS}/widgets.example.com");
    let tighten = json!({"spec": {"versions": [{"name": "v1", "served": true, "storage": true,
        "subresources": {"status": {}},
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "spec": {"type": "object", "properties": {
                "replicas": {"type": "integer", "maximum": 5, "x-kubernetes-validations": [
                    {"rule": "self <= 2", "message": "at most 2 replicas"}]},
                "note": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}}}}}}}}]}});
    let (code, _, v) = patch(&server, &crd_path, &tighten).await;
    assert_eq!(code, 200, "{v}");

    let ratcheted = "299 - \"spec.replicas: Invalid value: \\\"integer\\\": at most 2 replicas\"";
    let path = format!("{WIDGETS}/w1");
    let note = json!({"spec": {"note": "unrelated"}});
    let (code, warnings, v) = patch(&server, &path, &note).await;
    assert_eq!(code, 200, "unchanged invalid values pass: {v}");
    assert_eq!(v["spec"]["replicas"], 10);
    assert_eq!(
        warnings,
        [ratcheted],
        "the ratcheted rule failure is a warning"
    );
    let status = json!({"status": {"phase": "Running"}});
    let (code, warnings, v) = patch(&server, &format!("{path}/status"), &status).await;
    assert_eq!(
        code, 200,
        "a status update passes while the spec is invalid: {v}"
    );
    assert_eq!(warnings, [ratcheted]);

    // changed invalid values are checked
    let more = json!({"spec": {"replicas": 11}});
    let (code, _, v) = patch(&server, &path, &more).await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        invalid_causes(&v),
        [
            "spec.replicas: \"Invalid value: 11: spec.replicas in body should be less than or equal to 5\"",
            "spec.replicas: \"Invalid value: \\\"integer\\\": at most 2 replicas\"",
        ]
    );
    // an atomic list's items do not correlate: a changed list is checked whole (and a length
    // error blocks the rules)
    let retag = json!({"spec": {"tags": ["long-tag", "also-long"]}});
    let (code, _, v) = patch(&server, &path, &retag).await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        invalid_causes(&v),
        [
            "spec.tags[0]: \"Too long: may not be more than 3 bytes\"",
            "spec.tags[1]: \"Too long: may not be more than 3 bytes\"",
            "<nil>: \"Invalid value: \\\"null\\\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation\"",
        ]
    );
}
