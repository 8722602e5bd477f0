//! v1 ResourceQuota: the main rules of `ValidateResourceQuota` and
//! `ValidateResourceQuotaUpdate` (kubernetes/kubernetes pkg/apis/core/validation/validation.go:
//! `ValidateResourceQuotaSpec`, `ValidateResourceQuotaResourceName`,
//! `ValidateResourceQuantityValue`, `validateResourceQuotaScopes`,
//! `validateScopedResourceSelectorRequirement`), in their words and field paths. Not
//! emulated: "unsupported scope applied to resource" (which resources each scope may limit).

use serde_json::Value;

use super::Causes;

/// `standardQuotaResources` (pkg/apis/core/helper/helpers.go).
const QUOTA_RESOURCES: [&str; 19] = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.storage",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
    "resourcequotas",
    "services",
    "replicationcontrollers",
    "secrets",
    "persistentvolumeclaims",
    "configmaps",
    "services.nodeports",
    "services.loadbalancers",
];

/// `IsIntegerResourceName`: object counts (`integerResources`) and `count/…`.
fn integer_resource(name: &str) -> bool {
    name.starts_with("count/")
        || matches!(
            name,
            "pods"
                | "resourcequotas"
                | "services"
                | "replicationcontrollers"
                | "secrets"
                | "persistentvolumeclaims"
                | "configmaps"
                | "services.nodeports"
                | "services.loadbalancers"
        )
}

/// `standardResourceQuotaScopes`.
const SCOPES: [&str; 7] = [
    "Terminating",
    "NotTerminating",
    "BestEffort",
    "NotBestEffort",
    "PriorityClass",
    "CrossNamespacePodAffinity",
    "VolumeAttributesClass",
];

/// Scopes whose selector operator must be `Exists`.
const EXISTS_ONLY: [&str; 5] = [
    "Terminating",
    "NotTerminating",
    "BestEffort",
    "NotBestEffort",
    "CrossNamespacePodAffinity",
];

/// A quantity's value (a decimal number with an optional SI, binary or exponent suffix).
fn quantity(s: &str) -> Option<f64> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    Some(n * scale)
}

fn quoted(s: &str) -> String {
    Value::String(s.into()).to_string()
}

/// `%#v` of a Go string slice of type `ty`.
fn go_slice(ty: &str, v: Option<&Value>) -> String {
    match v.and_then(Value::as_array) {
        None => format!("{ty}(nil)"),
        Some(a) => {
            let items: Vec<String> = a.iter().map(|s| s.to_string()).collect();
            format!("{ty}{{{}}}", items.join(", "))
        }
    }
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `ValidateResourceQuotaSpec` (the spec) and `ValidateResourceQuotaStatus`'s share of it.
pub(super) fn validate(obj: &Value, causes: &mut Causes) {
    for part in ["spec", "status"] {
        for sub in ["hard", "used"] {
            if part == "spec" && sub == "used" {
                continue;
            }
            let path = format!("{part}.{sub}");
            for (k, v) in obj
                .pointer(&format!("/{part}/{sub}"))
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                resource(&format!("{path}[{k}]"), k, v, causes);
            }
        }
    }
    scopes(obj, causes);
    scope_selector(obj, causes);
}

/// `ValidateResourceQuotaResourceName` and `ValidateResourceQuantityValue` of one entry.
fn resource(path: &str, name: &str, value: &Value, causes: &mut Causes) {
    let names = crate::names::qualified_name(name);
    for m in &names {
        causes.push((path.into(), format!("Invalid value: {}: {m}", quoted(name))));
    }
    if names.is_empty() && !name.contains('/') && !QUOTA_RESOURCES.contains(&name) {
        if name != "storage" && !name.starts_with("hugepages-") {
            causes.push((
                path.into(),
                format!(
                    "Invalid value: {}: must be a standard resource type or fully qualified",
                    quoted(name)
                ),
            ));
        }
        if !name.starts_with("requests.hugepages-") {
            causes.push((
                path.into(),
                format!(
                    "Invalid value: {}: must be a standard resource for quota",
                    quoted(name)
                ),
            ));
        }
    }
    let text = match value {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let Some(q) = quantity(&text) else {
        return;
    };
    if q < 0.0 {
        causes.push((
            path.into(),
            format!(
                "Invalid value: {}: must be greater than or equal to 0",
                quoted(&text)
            ),
        ));
    }
    if integer_resource(name) && q.fract() != 0.0 {
        causes.push((
            path.into(),
            format!("Invalid value: {text}: must be an integer"),
        ));
    }
}

fn conflicting(set: &[&str]) -> bool {
    let has = |s: &str| set.contains(&s);
    (has("BestEffort") && has("NotBestEffort")) || (has("Terminating") && has("NotTerminating"))
}

/// `validateResourceQuotaScopes`.
fn scopes(obj: &Value, causes: &mut Causes) {
    let raw = obj.pointer("/spec/scopes");
    let list = strings(raw);
    let shown = || go_slice("[]core.ResourceQuotaScope", raw);
    for s in &list {
        if !SCOPES.contains(s) {
            causes.push((
                "spec.scopes".into(),
                format!("Invalid value: {}: unsupported scope", shown()),
            ));
        }
    }
    if conflicting(&list) {
        causes.push((
            "spec.scopes".into(),
            format!("Invalid value: {}: conflicting scopes", shown()),
        ));
    }
}

/// `validateScopedResourceSelectorRequirement`.
fn scope_selector(obj: &Value, causes: &mut Causes) {
    let path = "spec.scopeSelector.matchExpressions";
    let mut seen = Vec::new();
    for req in obj
        .pointer("/spec/scopeSelector/matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let scope = req.get("scopeName").and_then(Value::as_str).unwrap_or("");
        let op = req.get("operator").and_then(Value::as_str).unwrap_or("");
        let values = req.get("values");
        if !SCOPES.contains(&scope) {
            causes.push((
                format!("{path}.scopeName"),
                format!("Invalid value: {}: unsupported scope", quoted(scope)),
            ));
        }
        if EXISTS_ONLY.contains(&scope) && op != "Exists" {
            causes.push((
                format!("{path}.operator"),
                format!(
                    "Invalid value: {}: must be 'Exist' when scope is any of ResourceQuotaScopeTerminating, ResourceQuotaScopeNotTerminating, ResourceQuotaScopeBestEffort, ResourceQuotaScopeNotBestEffort or ResourceQuotaScopeCrossNamespacePodAffinity",
                    quoted(op)
                ),
            ));
        }
        let n = strings(values).len();
        match op {
            "In" | "NotIn" if n == 0 => causes.push((
                format!("{path}.values"),
                "Required value: must be at least one value when `operator` is 'In' or 'NotIn' for scope selector".into(),
            )),
            "Exists" | "DoesNotExist" if n != 0 => causes.push((
                format!("{path}.values"),
                format!(
                    "Invalid value: {}: must be no value when `operator` is 'Exist' or 'DoesNotExist' for scope selector",
                    go_slice("[]string", values)
                ),
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            _ => causes.push((
                format!("{path}.operator"),
                format!("Invalid value: {}: not a valid selector operator", quoted(op)),
            )),
        }
        seen.push(scope);
    }
    if conflicting(&seen) {
        causes.push((
            path.into(),
            format!(
                "Invalid value: {}: conflicting scopes",
                go_slice("[]core.ResourceQuotaScope", obj.pointer("/spec/scopes"))
            ),
        ));
    }
}

/// `ValidateResourceQuotaUpdate`: the scopes are immutable (as a set).
pub(super) fn validate_update(old: &Value, new: &Value, causes: &mut Causes) {
    let set = |o: &Value| {
        let mut s = strings(o.pointer("/spec/scopes"));
        s.sort_unstable();
        s.dedup();
        s.into_iter().map(String::from).collect::<Vec<_>>()
    };
    if set(old) != set(new) {
        causes.push((
            "spec.scopes".into(),
            format!(
                "Invalid value: {}: field is immutable",
                go_slice("[]core.ResourceQuotaScope", new.pointer("/spec/scopes"))
            ),
        ));
    }
}
