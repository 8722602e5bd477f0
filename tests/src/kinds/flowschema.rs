//! flowcontrol.apiserver.k8s.io/v1 FlowSchema: its default (`SetDefaults_FlowSchemaSpec`,
//! pkg/apis/flowcontrol/v1/defaults.go) and the rules of `ValidateFlowSchemaSpec`
//! (kubernetes/kubernetes pkg/apis/flowcontrol/validation/validation.go) in their words and
//! field paths. Not emulated: the fixed specs of the mandatory schemas, non-resource URL
//! paths, and the APF controller's `Dangling` condition.

use serde_json::{Value, json};

use super::Causes;

/// `FlowSchemaDefaultMatchingPrecedence`.
const DEFAULT_PRECEDENCE: i64 = 1000;
/// `FlowSchemaMaxMatchingPrecedence`.
const MAX_PRECEDENCE: i64 = 10000;

const VERBS: [&str; 9] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "proxy",
    "update",
    "watch",
];

pub(super) fn default(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec
        .get("matchingPrecedence")
        .and_then(Value::as_i64)
        .unwrap_or(0)
        == 0
    {
        spec.insert("matchingPrecedence".into(), json!(DEFAULT_PRECEDENCE));
    }
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `%#v` of a Go `[]string`.
fn go_strings(list: &[&str]) -> String {
    let items: Vec<String> = list.iter().map(|s| json!(s).to_string()).collect();
    format!("[]string{{{}}}", items.join(", "))
}

fn supported(value: &str, list: &[&str]) -> String {
    let quoted: Vec<String> = list.iter().map(|s| json!(s).to_string()).collect();
    format!(
        "Unsupported value: {value}: supported values: {}",
        quoted.join(", ")
    )
}

/// `ValidateFlowSchemaSpec`.
pub(super) fn validate(obj: &Value, causes: &mut Causes) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    let p = spec
        .get("matchingPrecedence")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let precedence = "spec.matchingPrecedence".to_string();
    if p <= 0 {
        causes.push((
            precedence.clone(),
            format!("Invalid value: {p}: must be a positive value"),
        ));
    }
    if p > MAX_PRECEDENCE {
        causes.push((
            precedence.clone(),
            format!("Invalid value: {p}: must not be greater than {MAX_PRECEDENCE}"),
        ));
    }
    if p == 1 && name != "exempt" {
        causes.push((
            precedence,
            format!(
                "Invalid value: {p}: only the schema named 'exempt' may have matchingPrecedence 1"
            ),
        ));
    }
    if let Some(t) = spec
        .pointer("/distinguisherMethod/type")
        .and_then(Value::as_str)
        && !matches!(t, "ByNamespace" | "ByUser")
    {
        causes.push((
            "spec.distinguisherMethod.type".into(),
            supported(
                &format!("flowcontrol.FlowDistinguisherMethod{{Type:{}}}", json!(t)),
                &["ByNamespace", "ByUser"],
            ),
        ));
    }
    let level = spec
        .pointer("/priorityLevelConfiguration/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if level.is_empty() {
        causes.push((
            "spec.priorityLevelConfiguration.name".into(),
            "Required value: must reference a priority level".into(),
        ));
    }
    for m in crate::names::dns1123_subdomain(level)
        .into_iter()
        .filter(|_| !level.is_empty())
    {
        causes.push((
            "spec.priorityLevelConfiguration.name".into(),
            format!("Invalid value: {}: {m}", json!(level)),
        ));
    }
    for (i, rule) in spec
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        rule_with_subjects(rule, &format!("spec.rules[{i}]"), causes);
    }
}

/// `ValidateFlowSchemaPolicyRulesWithSubjects`.
fn rule_with_subjects(rule: &Value, path: &str, causes: &mut Causes) {
    let subjects = rule.get("subjects").and_then(Value::as_array);
    match subjects {
        Some(s) if !s.is_empty() => {
            for (i, subject) in s.iter().enumerate() {
                self::subject(subject, &format!("{path}.subjects[{i}]"), causes);
            }
        }
        _ => causes.push((
            format!("{path}.subjects"),
            "Required value: subjects must contain at least one value".into(),
        )),
    }
    let rules = |k: &str| {
        rule.get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (resource, non_resource) = (rules("resourceRules"), rules("nonResourceRules"));
    if resource.is_empty() && non_resource.is_empty() {
        causes.push((
            path.into(),
            "Required value: at least one of resourceRules and nonResourceRules has to be non-empty"
                .into(),
        ));
    }
    for (i, r) in resource.iter().enumerate() {
        resource_rule(r, &format!("{path}.resourceRules[{i}]"), causes);
    }
    for (i, r) in non_resource.iter().enumerate() {
        let p = format!("{path}.nonResourceRules[{i}]");
        verbs(r, &p, causes);
        if strings(r.get("nonResourceURLs")).is_empty() {
            causes.push((
                format!("{p}.nonResourceURLs"),
                "Required value: nonResourceURLs must contain at least one value".into(),
            ));
        }
    }
}

/// `ValidateFlowSchemaSubject` and the per-kind subject rules.
fn subject(s: &Value, path: &str, causes: &mut Causes) {
    let kind = s.get("kind").and_then(Value::as_str).unwrap_or("");
    let (field, what) = match kind {
        "ServiceAccount" => ("serviceAccount", "ServiceAccount"),
        "User" => ("user", "User"),
        "Group" => ("group", "Group"),
        _ => {
            causes.push((
                format!("{path}.kind"),
                supported(
                    &json!(kind).to_string(),
                    &["Group", "ServiceAccount", "User"],
                ),
            ));
            return;
        }
    };
    match s.get(field).filter(|v| !v.is_null()) {
        None => causes.push((
            format!("{path}.{field}"),
            format!("Required value: {field} is required when subject kind is '{what}'"),
        )),
        Some(sub) => {
            if sub
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                causes.push((format!("{path}.{field}.name"), "Required value".into()));
            }
            if field == "serviceAccount"
                && sub
                    .get("namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
            {
                causes.push((
                    format!("{path}.serviceAccount.namespace"),
                    "Required value: must specify namespace for service account".into(),
                ));
            }
        }
    }
    for (other, other_kind) in [
        ("user", "User"),
        ("group", "Group"),
        ("serviceAccount", "ServiceAccount"),
    ] {
        if other != field && s.get(other).is_some_and(|v| !v.is_null()) {
            causes.push((
                format!("{path}.{other}"),
                format!("Forbidden: {other} is forbidden when subject kind is not '{other_kind}'"),
            ));
        }
    }
}

/// The verb rules shared by resource and non-resource rules.
fn verbs(rule: &Value, path: &str, causes: &mut Causes) {
    let list = strings(rule.get("verbs"));
    let p = format!("{path}.verbs");
    if list.is_empty() {
        causes.push((
            p,
            "Required value: verbs must contain at least one value".into(),
        ));
    } else if list.contains(&"*") {
        if list.len() > 1 {
            causes.push((
                p,
                format!(
                    "Invalid value: {}: if '*' is present, must not specify other verbs",
                    go_strings(&list)
                ),
            ));
        }
    } else if !list.iter().all(|v| VERBS.contains(v)) {
        causes.push((p, supported(&go_strings(&list), &VERBS)));
    }
}

/// `ValidateFlowSchemaResourcePolicyRule`.
fn resource_rule(rule: &Value, path: &str, causes: &mut Causes) {
    verbs(rule, path, causes);
    for (field, what) in [("apiGroups", "api group"), ("resources", "resource")] {
        let list = strings(rule.get(field));
        if list.is_empty() {
            causes.push((
                format!("{path}.{field}"),
                format!("Required value: resource rules must supply at least one {what}"),
            ));
        } else if list.len() > 1 && list.contains(&"*") {
            causes.push((
                format!("{path}.{field}"),
                format!(
                    "Invalid value: {}: if '*' is present, must not specify other {what}s",
                    go_strings(&list)
                ),
            ));
        }
    }
    let namespaces = strings(rule.get("namespaces"));
    let cluster = rule
        .get("clusterScope")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let p = format!("{path}.namespaces");
    if namespaces.is_empty() && !cluster {
        causes.push((
            p,
            "Required value: resource rules that are not cluster scoped must supply at least one namespace".into(),
        ));
    } else if namespaces.contains(&"*") {
        if namespaces.len() > 1 {
            causes.push((
                p,
                format!(
                    "Invalid value: {}: if '*' is present, must not specify other namespaces",
                    go_strings(&namespaces)
                ),
            ));
        }
    } else {
        for (i, ns) in namespaces.iter().enumerate() {
            for m in crate::names::dns1123_label(ns) {
                causes.push((
                    format!("{p}[{i}]"),
                    format!(
                        "Invalid value: {}: each member of this list must be '*' or a DNS-1123 label; {m}",
                        json!(ns)
                    ),
                ));
            }
        }
    }
}
