//! CRD validation rules: the `x-kubernetes-validations` of a custom resource's schema, checked
//! when the CRD is written and evaluated on every create, update and status update of its
//! objects, as kubernetes/apiextensions-apiserver `pkg/apiserver/schema/cel/validation.go`
//! (`Validator.validate`, `validateExpressions`) does on Kubernetes 1.33:
//!
//! - `self` is the node the rule sits on; a null or absent node is not checked.
//! - A transition rule (one reading `oldSelf`) runs only on an update where the node has an
//!   old value to correlate: object properties by name, `x-kubernetes-list-type: map` items by
//!   their keys; nothing else correlates.
//! - A failed rule gives `{path}: Invalid value: "{type}": {message}`, the path being the
//!   node's (`<nil>` at the root) or the rule's `fieldPath` under it, the message its
//!   `messageExpression`'s string, else `message`, else `failed rule: {rule}`; `reason` picks
//!   Forbidden, Required or Duplicate instead of Invalid.
//! - Ratcheting (CRDValidationRatcheting, on since 1.30): a failed rule that does not read
//!   `oldSelf`, on a node equal to its correlated old value (or, uncorrelated, under the
//!   nearest correlated ancestor that is), is a warning, not an error.
//!
//! A rule that calls a function this server's CEL does not evaluate (`cel_expr`: the
//! Kubernetes CEL libraries) is not enforced here: the CRD is accepted, as the real server
//! accepts it, with a warning naming the rule (tests/README.md lists the libraries).

use std::collections::HashMap;
use std::sync::Arc;

use cel::Context;
use parking_lot::Mutex;
use serde_json::Value;

use crate::cel_expr::{CompileError, Expr, to_cel};
use crate::schema::correlated_item;

type Causes = Vec<(String, String)>;

/// The variables a CRD rule may read.
const VARIABLES: [&str; 2] = ["self", "oldSelf"];

/// `supportedValidationReason` of the CRD validation.
const REASONS: [&str; 4] = [
    "FieldValueDuplicate",
    "FieldValueForbidden",
    "FieldValueInvalid",
    "FieldValueRequired",
];

const EXTENSION: &str = "x-kubernetes-validations";

/// Compiled rule expressions by source (`None`: not evaluated here), and the CEL environment.
pub(crate) struct Rules {
    compiled: Mutex<HashMap<String, Option<Arc<Expr>>>>,
    env: Arc<cel::Env>,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            compiled: Mutex::default(),
            env: crate::cel_expr::env(),
        }
    }
}

impl Rules {
    fn get(&self, source: &str) -> Option<Arc<Expr>> {
        self.compiled
            .lock()
            .entry(source.to_string())
            .or_insert_with(|| Expr::compile(source, &VARIABLES).ok().map(Arc::new))
            .clone()
    }

    /// Evaluates every rule of `schema` over `obj`; `old` is the stored object of an update.
    /// Failures go to `out`, ratcheted ones to `warnings` (module docs).
    pub(crate) fn validate(
        &self,
        schema: &Value,
        obj: &Value,
        old: Option<&Value>,
        out: &mut Causes,
        warnings: &mut Vec<String>,
    ) {
        let mut w = Walk {
            rules: self,
            out,
            warnings,
        };
        w.node(schema, obj, old, None, None);
    }
}

/// Whether a schema declares any rule.
pub(crate) fn has_rules(schema: &Value) -> bool {
    match schema {
        Value::Object(m) => m.contains_key(EXTENSION) || m.values().any(has_rules),
        Value::Array(a) => a.iter().any(has_rules),
        _ => false,
    }
}

struct Walk<'a> {
    rules: &'a Rules,
    out: &'a mut Causes,
    warnings: &'a mut Vec<String>,
}

/// The nearest correlated node's (old, new) values: whether its value is unchanged decides
/// whether a failed rule below it is ratcheted.
type Nearest<'v> = Option<(&'v Value, &'v Value)>;

impl Walk<'_> {
    /// One node: its rules, then the children whose schemas hold rules.
    fn node<'v>(
        &mut self,
        schema: &Value,
        v: &'v Value,
        old: Option<&'v Value>,
        path: Option<&str>,
        nearest: Nearest<'v>,
    ) {
        if v.is_null() {
            return;
        }
        let nearest = old.map(|o| (o, v)).or(nearest);
        if let Some(rules) = schema.get(EXTENSION).and_then(Value::as_array) {
            for rule in rules {
                self.rule(schema, rule, v, old, path, nearest);
            }
        }
        match v {
            Value::Object(m) => {
                let props = schema.get("properties").and_then(Value::as_object);
                let addl = schema.get("additionalProperties").filter(|a| a.is_object());
                for (k, cv) in m {
                    let (cs, child) = match props.and_then(|p| p.get(k)) {
                        Some(cs) => (cs, child(path, k)),
                        None => match addl {
                            Some(cs) => (cs, format!("{}[{k}]", path.unwrap_or_default())),
                            None => continue,
                        },
                    };
                    if has_rules(cs) {
                        let co = old.and_then(|o| o.get(k));
                        self.node(cs, cv, co, Some(&child), nearest);
                    }
                }
            }
            Value::Array(items) => {
                let Some(is) = schema.get("items").filter(|is| has_rules(is)) else {
                    return;
                };
                for (i, item) in items.iter().enumerate() {
                    let co = correlated_item(schema, item, old);
                    let p = format!("{}[{i}]", path.unwrap_or_default());
                    self.node(is, item, co, Some(&p), nearest);
                }
            }
            _ => {}
        }
    }

    fn rule(
        &mut self,
        schema: &Value,
        rule: &Value,
        v: &Value,
        old: Option<&Value>,
        path: Option<&str>,
        nearest: Nearest<'_>,
    ) {
        let text = |k: &str| rule.get(k).and_then(Value::as_str).unwrap_or_default();
        let Some(expr) = self.rules.get(text("rule")) else {
            return;
        };
        let transition = expr.reads("oldSelf");
        if transition && old.is_none() {
            return;
        }
        let mut ctx = Context::with_env(self.rules.env.clone());
        ctx.add_variable_from_value("self", to_cel(v));
        if let Some(o) = old {
            ctx.add_variable_from_value("oldSelf", to_cel(o));
        }
        let ty = schema
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let at = path.map_or_else(|| "<nil>".to_string(), str::to_string);
        let detail = match expr.truth(&ctx) {
            Ok(true) => return,
            Ok(false) => None,
            Err(err) => Some(format!("{err} evaluating rule: {}", rule_text(rule))),
        };
        if let Some(d) = detail {
            self.out.push((at, format!("Invalid value: {ty:?}: {d}")));
            return;
        }
        let message = match text("messageExpression") {
            "" => None,
            src => self.rules.get(src).and_then(|e| e.message(&ctx)),
        };
        let message = message.unwrap_or_else(|| default_message(rule));
        let at = match text("fieldPath").trim().trim_start_matches('.') {
            "" => at,
            fp => child(path, fp),
        };
        let body = match text("reason") {
            "FieldValueForbidden" => format!("Forbidden: {message}"),
            "FieldValueRequired" => format!("Required value: {message}"),
            "FieldValueDuplicate" => format!("Duplicate value: {ty:?}"),
            _ => format!("Invalid value: {ty:?}: {message}"),
        };
        if !transition && nearest.is_some_and(|(o, n)| o == n) {
            self.warnings.push(format!("{at}: {body}"));
        } else {
            self.out.push((at, body));
        }
    }
}

fn child(path: Option<&str>, name: &str) -> String {
    match path {
        Some(p) => format!("{p}.{name}"),
        None => name.to_string(),
    }
}

/// `ruleErrorString`: the message, else the rule.
fn rule_text(rule: &Value) -> String {
    let m = rule["message"].as_str().unwrap_or_default().trim();
    if m.is_empty() {
        rule["rule"].as_str().unwrap_or_default().trim().to_string()
    } else {
        m.to_string()
    }
}

/// `ruleMessageOrDefault`.
fn default_message(rule: &Value) -> String {
    match rule["message"].as_str().map(str::trim) {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => format!("failed rule: {}", rule_text(rule)),
    }
}

/// The CRD-side checks of every rule under `node` (at `path`, as `crd_validation` names
/// schema paths), in the real server's words; `warnings` gets the rules not enforced here.
pub(crate) fn check(node: &Value, path: &str, out: &mut Causes, warnings: &mut Vec<String>) {
    let Some(rules) = node.get(EXTENSION).and_then(Value::as_array) else {
        return;
    };
    for (i, rule) in rules.iter().enumerate() {
        let at = |k: &str| format!("{path}.{EXTENSION}[{i}].{k}");
        let text = |k: &str| rule.get(k).and_then(Value::as_str).unwrap_or_default();
        let (source, message) = (text("rule"), text("message"));
        if source.trim().is_empty() {
            out.push((at("rule"), "Required value: rule is not specified".into()));
            continue;
        }
        if !message.is_empty() && message.trim().is_empty() {
            out.push((
                at("message"),
                format!("Invalid value: {message:?}: message must be non-empty if specified"),
            ));
        } else if message.trim().contains('\n') {
            out.push((
                at("message"),
                format!("Invalid value: {message:?}: message must not contain line breaks"),
            ));
        } else if source.trim().contains('\n') && message.trim().is_empty() {
            out.push((
                at("message"),
                "Required value: message must be specified if rule contains line breaks".into(),
            ));
        }
        let reason = text("reason");
        if rule.get("reason").is_some() && !REASONS.contains(&reason) {
            let supported: Vec<String> = REASONS.iter().map(|r| format!("{r:?}")).collect();
            out.push((
                at("reason"),
                format!(
                    "Unsupported value: {reason:?}: supported values: {}",
                    supported.join(", ")
                ),
            ));
        }
        for (key, prefix) in [("rule", ""), ("messageExpression", "messageExpression ")] {
            let src = text(key);
            if src.trim().is_empty() {
                continue;
            }
            match Expr::compile(src, &VARIABLES) {
                Ok(_) => {}
                Err(e @ CompileError::Invalid(_)) => out.push((
                    at(key),
                    format!("Invalid value: {}: {prefix}{}", go_rule(rule), e.detail()),
                )),
                Err(CompileError::Unsupported(f)) => warnings.push(format!(
                    "{}: not enforced by this test server: it calls '{f}', which its CEL does \
                     not evaluate",
                    at(key)
                )),
            }
        }
    }
}

/// A rule as Go's `%#v` prints the internal `apiextensions.ValidationRule` (pointers as nil or
/// a placeholder address).
fn go_rule(rule: &Value) -> String {
    let text = |k: &str| rule.get(k).and_then(Value::as_str).unwrap_or_default();
    let ptr = |k: &str, ty: &str| match rule.get(k) {
        None | Some(Value::Null) => format!("(*{ty})(nil)"),
        Some(_) => format!("(*{ty})(0xc000000000)"),
    };
    format!(
        "apiextensions.ValidationRule{{Rule:{:?}, Message:{:?}, MessageExpression:{:?}, \
         Reason:{}, FieldPath:{:?}, OptionalOldSelf:{}}}",
        text("rule"),
        text("message"),
        text("messageExpression"),
        ptr("reason", "apiextensions.FieldValueErrorReason"),
        text("fieldPath"),
        ptr("optionalOldSelf", "bool"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(schema: &Value, obj: &Value, old: Option<&Value>) -> (Causes, Vec<String>) {
        let (mut out, mut warnings) = (Vec::new(), Vec::new());
        Rules::default().validate(schema, obj, old, &mut out, &mut warnings);
        (out, warnings)
    }

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "min must not exceed max"}],
            "properties": {
                "min": {"type": "integer"}, "max": {"type": "integer"},
                "size": {"type": "integer", "x-kubernetes-validations": [
                    {"rule": "self == oldSelf", "message": "size is immutable"}]},
                "name": {"type": "string", "x-kubernetes-validations": [
                    {"rule": "self.startsWith('a')", "messageExpression": "'name ' + self + ' must start with a'",
                     "reason": "FieldValueForbidden"}]},
                "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer"}},
                        "x-kubernetes-validations": [{"rule": "self.port == oldSelf.port", "fieldPath": ".port"}]}}}}}})
    }

    #[test]
    fn rules_fail_in_the_real_servers_words() {
        let obj = json!({"spec": {"min": 3, "max": 1, "name": "b"}});
        let (out, _) = run(&schema(), &obj, None);
        assert_eq!(
            out,
            vec![
                (
                    "spec".to_string(),
                    "Invalid value: \"object\": min must not exceed max".to_string()
                ),
                (
                    "spec.name".to_string(),
                    "Forbidden: name b must start with a".to_string()
                ),
            ]
        );
    }

    #[test]
    fn transition_rules_run_on_correlated_old_values_only() {
        let old =
            json!({"spec": {"min": 1, "max": 2, "size": 4, "ports": [{"name": "a", "port": 1}]}});
        let new = json!({"spec": {"min": 1, "max": 2, "size": 5,
            "ports": [{"name": "b", "port": 9}, {"name": "a", "port": 2}]}});
        let (out, _) = run(&schema(), &new, Some(&old));
        assert_eq!(
            out,
            vec![
                (
                    "spec.ports[1].port".to_string(),
                    "Invalid value: \"object\": failed rule: self.port == oldSelf.port".to_string()
                ),
                (
                    "spec.size".to_string(),
                    "Invalid value: \"integer\": size is immutable".to_string()
                ),
            ]
        );
        // no old value: the transition rules do not run
        let (out, _) = run(&schema(), &new, None);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn an_unchanged_invalid_value_is_ratcheted_to_a_warning() {
        let old = json!({"spec": {"min": 3, "max": 1, "size": 1}});
        let same = json!({"spec": {"min": 3, "max": 1, "size": 1}});
        let (out, warnings) = run(&schema(), &same, Some(&old));
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(
            warnings,
            ["spec: Invalid value: \"object\": min must not exceed max"]
        );
        let changed = json!({"spec": {"min": 4, "max": 1, "size": 1}});
        let (out, _) = run(&schema(), &changed, Some(&old));
        assert_eq!(out.len(), 1, "{out:?}");
    }

    #[test]
    fn the_crd_side_checks() {
        let node = json!({"x-kubernetes-validations": [
            {"rule": ""},
            {"rule": "self.x(", "message": "m"},
            {"rule": "self.s.lowerAscii() == 'a'"},
            {"rule": "self > 0", "reason": "Nope"}]});
        let (mut out, mut warnings) = (Vec::new(), Vec::new());
        check(&node, "p", &mut out, &mut warnings);
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[0].0, "p.x-kubernetes-validations[0].rule");
        assert!(out[1].1.starts_with("Invalid value: apiextensions.ValidationRule{Rule:\"self.x(\", Message:\"m\", MessageExpression:\"\", Reason:(*apiextensions.FieldValueErrorReason)(nil), FieldPath:\"\", OptionalOldSelf:(*bool)(nil)}: compilation failed: ERROR: <input>:1:"), "{out:?}");
        assert!(out[1].1.contains("Syntax error"), "{out:?}");
        assert!(
            out[2].1.starts_with("Unsupported value: \"Nope\""),
            "{out:?}"
        );
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("'lowerAscii'"), "{warnings:?}");
    }
}
