//! Per-kind rules of apps/v1 DaemonSet, networking.k8s.io/v1 NetworkPolicy,
//! scheduling.k8s.io/v1 PriorityClass, v1 ResourceQuota ([`quota`]) and
//! flowcontrol.apiserver.k8s.io/v1 FlowSchema ([`flowschema`]), as the real server (v1.33) has them: defaults
//! (`SetDefaults_*` of the v1 types), the validations a deploy bundle would trip on in the
//! words and field paths of `pkg/apis/{apps,networking,scheduling}/validation`, immutable fields
//! on update, the system priority classes the server pre-creates, and the `Table` columns of
//! `pkg/printers/internalversion` for `kubectl get`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

mod flowschema;
mod quota;

type Causes = Vec<(String, String)>;

/// `scheduling.HighestUserDefinablePriority`.
const HIGHEST_USER_PRIORITY: i64 = 1_000_000_000;

/// The system priority classes (`SystemPriorityClasses()`): name, value, description.
pub(crate) const SYSTEM_PRIORITY_CLASSES: [(&str, i64, &str); 2] = [
    (
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
];

/// Applies the v1 defaults of the kind (before validation, as decoding does).
pub(crate) fn default(group: &str, kind: &str, obj: &mut Value) {
    match (group, kind) {
        ("apps", "DaemonSet") => {
            let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
                return;
            };
            let strategy = spec.entry("updateStrategy").or_insert_with(|| json!({}));
            if let Some(s) = strategy.as_object_mut() {
                if s.get("type")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    s.insert("type".into(), json!("RollingUpdate"));
                }
                if s.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
                    let ru = s.entry("rollingUpdate").or_insert_with(|| json!({}));
                    if ru.is_null() {
                        *ru = json!({});
                    }
                    if let Some(ru) = ru.as_object_mut() {
                        if ru.get("maxUnavailable").is_none_or(Value::is_null) {
                            ru.insert("maxUnavailable".into(), json!(1));
                        }
                        if ru.get("maxSurge").is_none_or(Value::is_null) {
                            ru.insert("maxSurge".into(), json!(0));
                        }
                    }
                }
            }
            if spec.get("revisionHistoryLimit").is_none_or(Value::is_null) {
                spec.insert("revisionHistoryLimit".into(), json!(10));
            }
        }
        ("networking.k8s.io", "NetworkPolicy") => {
            let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
                return;
            };
            for dir in ["ingress", "egress"] {
                for rule in spec
                    .get_mut(dir)
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    for port in rule
                        .get_mut("ports")
                        .and_then(Value::as_array_mut)
                        .into_iter()
                        .flatten()
                    {
                        if let Some(p) = port.as_object_mut()
                            && p.get("protocol").is_none_or(Value::is_null)
                        {
                            p.insert("protocol".into(), json!("TCP"));
                        }
                    }
                }
            }
            let empty = |v: Option<&Value>| v.and_then(Value::as_array).is_none_or(Vec::is_empty);
            if empty(spec.get("policyTypes")) {
                let mut types = vec![json!("Ingress")];
                if !empty(spec.get("egress")) {
                    types.push(json!("Egress"));
                }
                spec.insert("policyTypes".into(), Value::Array(types));
            }
        }
        ("flowcontrol.apiserver.k8s.io", "FlowSchema") => flowschema::default(obj),
        ("scheduling.k8s.io", "PriorityClass") => {
            if let Some(o) = obj.as_object_mut() {
                if o.get("preemptionPolicy").is_none_or(Value::is_null) {
                    o.insert("preemptionPolicy".into(), json!("PreemptLowerPriority"));
                }
                // `value` is an int32 without omitempty: a missing value is 0
                if o.get("value").is_none_or(Value::is_null) {
                    o.insert("value".into(), json!(0));
                }
            }
        }
        _ => {}
    }
}

/// Validation of a create or update body (after [`default`]).
pub(crate) fn validate(group: &str, kind: &str, obj: &Value, causes: &mut Causes) {
    match (group, kind) {
        ("apps", "DaemonSet") => daemonset(obj, causes),
        ("networking.k8s.io", "NetworkPolicy") => network_policy(obj, causes),
        ("scheduling.k8s.io", "PriorityClass") => priority_class(obj, causes),
        ("", "ResourceQuota") => quota::validate(obj, causes),
        ("flowcontrol.apiserver.k8s.io", "FlowSchema") => flowschema::validate(obj, causes),
        _ => {}
    }
}

/// Rules that compare an update (before defaulting) with the stored object
/// (`Validate…Update`).
pub(crate) fn validate_update(
    group: &str,
    kind: &str,
    old: &Value,
    new: &Value,
    causes: &mut Causes,
) {
    if (group, kind) == ("", "ResourceQuota") {
        quota::validate_update(old, new, causes);
    }
    if (group, kind) == ("scheduling.k8s.io", "PriorityClass") {
        let mut new = new.clone();
        default(group, kind, &mut new);
        if old.get("value") != new.get("value") {
            causes.push((
                "value".into(),
                "Forbidden: may not be changed in an update.".into(),
            ));
        }
        let (o, n) = (old.get("preemptionPolicy"), new.get("preemptionPolicy"));
        if o != n {
            causes.push((
                "preemptionPolicy".into(),
                format!("Invalid value: {}: field is immutable", go_value(n)),
            ));
        }
    }
}

/// A bad value as `field.Error` prints it: strings quoted, numbers and booleans bare, nil as
/// `null`.
fn go_value(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "null".into(),
        Some(v) => v.to_string(),
    }
}

/// `fmt.Sprintf("%#v", map[string]string)`: keys sorted, `nil` for a missing map.
fn go_string_map(v: Option<&Value>) -> String {
    match v.and_then(Value::as_object) {
        None => "map[string]string(nil)".into(),
        Some(m) => {
            let sorted: BTreeMap<&String, &Value> = m.iter().collect();
            let entries: Vec<String> = sorted
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}:{}",
                        Value::String((*k).clone()),
                        Value::String(v.as_str().unwrap_or("").into())
                    )
                })
                .collect();
            format!("map[string]string{{{}}}", entries.join(", "))
        }
    }
}

fn unsupported(value: &str, supported: &[&str]) -> String {
    let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "Unsupported value: {}: supported values: {}",
        Value::String(value.into()),
        list.join(", ")
    )
}

/// One requirement of a LabelSelector, as `LabelSelectorAsSelector` converts it: a
/// `matchLabels` entry is `=` with its one value, an expression keeps its operator.
struct Requirement<'a> {
    key: &'a str,
    op: &'a str,
    values: Vec<&'a str>,
}

fn requirements(sel: &Value) -> Vec<Requirement<'_>> {
    let labels = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| Requirement {
            key: k,
            op: "=",
            values: vec![v.as_str().unwrap_or("")],
        });
    let expressions = sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| Requirement {
            key: e.get("key").and_then(Value::as_str).unwrap_or(""),
            op: e.get("operator").and_then(Value::as_str).unwrap_or(""),
            values: e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default(),
        });
    labels.chain(expressions).collect()
}

/// Whether `labels` satisfy `selector` (`LabelSelectorAsSelector(selector).Matches`); `None`
/// when the selector cannot be converted (an unknown operator), as then no match check is made.
pub(crate) fn selector_matches(selector: Option<&Value>, labels: Option<&Value>) -> Option<bool> {
    let Some(sel) = selector.filter(|s| !s.is_null()) else {
        return Some(false); // labels.Nothing()
    };
    let mut ok = true;
    for r in requirements(sel) {
        let have = labels.and_then(|l| l.get(r.key)).and_then(Value::as_str);
        ok &= match r.op {
            "=" | "In" => have.is_some_and(|h| r.values.contains(&h)),
            "NotIn" => have.is_none_or(|h| !r.values.contains(&h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => return None,
        };
    }
    Some(ok)
}

/// `metav1.FormatLabelSelector`: requirements sorted by key, `<none>` when there are none.
fn format_selector(selector: Option<&Value>) -> String {
    let mut reqs: Vec<(&str, String)> = Vec::new();
    for mut r in selector.map(requirements).unwrap_or_default() {
        r.values.sort_unstable();
        r.values.dedup();
        let (key, values) = (r.key, r.values.join(","));
        let s = match r.op {
            "=" => format!("{key}={values}"),
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            _ => return "<error>".into(),
        };
        reqs.push((key, s));
    }
    reqs.sort_by(|a, b| a.0.cmp(b.0));
    if reqs.is_empty() {
        "<none>".into()
    } else {
        reqs.into_iter()
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `labels.FormatLabels`: `k=v` sorted by key, `<none>` when empty.
fn format_labels(m: Option<&Value>) -> String {
    let s: BTreeMap<&String, &str> = m
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k, v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    if s.is_empty() {
        "<none>".into()
    } else {
        s.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// An IntOrString as `getIntOrPercentValue` reads it, and whether it was a percentage.
fn int_or_percent(v: Option<&Value>) -> (i64, bool) {
    match v {
        Some(Value::Number(n)) => (n.as_i64().unwrap_or(0), false),
        Some(Value::String(s)) => match s.strip_suffix('%').map(str::parse::<i64>) {
            Some(Ok(p)) if s.len() > 1 && s[..s.len() - 1].bytes().all(|b| b.is_ascii_digit()) => {
                (p, true)
            }
            _ => (s.parse().unwrap_or(0), false),
        },
        _ => (0, false),
    }
}

/// An IntOrString as its `String()` prints it (`1`, `25%`).
fn int_or_string(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "0".into(),
    }
}

/// `ValidateDaemonSetSpec` (selector, template, restart policy) and
/// `ValidateRollingUpdateDaemonSet`.
fn daemonset(obj: &Value, causes: &mut Causes) {
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    let selector = spec.get("selector");
    let labels = spec.pointer("/template/metadata/labels");
    if selector_matches(selector, labels) == Some(false) {
        causes.push((
            "spec.template.metadata.labels".into(),
            format!(
                "Invalid value: {}: `selector` does not match template `labels`",
                go_string_map(labels)
            ),
        ));
    }
    if let Some(sel) = selector.filter(|s| s.is_object()) {
        let n = sel
            .get("matchLabels")
            .and_then(Value::as_object)
            .map_or(0, |m| m.len())
            + sel
                .get("matchExpressions")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
        if n == 0 {
            causes.push((
                "spec.selector".into(),
                "Invalid value: &LabelSelector{MatchLabels:map[string]string{},MatchExpressions:[]LabelSelectorRequirement{},}: empty selector is invalid for daemonset".into(),
            ));
        }
    }
    if spec
        .pointer("/template/spec/containers")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
    {
        causes.push((
            "spec.template.spec.containers".into(),
            "Required value".into(),
        ));
    }
    if let Some(rp) = spec
        .pointer("/template/spec/restartPolicy")
        .and_then(Value::as_str)
        && rp != "Always"
    {
        causes.push((
            "spec.template.spec.restartPolicy".into(),
            unsupported(rp, &["Always"]),
        ));
    }
    if spec.pointer("/updateStrategy/type").and_then(Value::as_str) == Some("RollingUpdate") {
        let path = "spec.updateStrategy.rollingUpdate";
        let Some(ru) = spec.pointer("/updateStrategy/rollingUpdate") else {
            causes.push((path.into(), "Required value".into()));
            return;
        };
        let (mu, ms) = (ru.get("maxUnavailable"), ru.get("maxSurge"));
        for (name, v) in [("maxUnavailable", mu), ("maxSurge", ms)] {
            let (n, percent) = int_or_percent(v);
            if !percent && matches!(v, Some(Value::Number(_))) && n < 0 {
                causes.push((
                    format!("{path}.{name}"),
                    format!("Invalid value: {n}: must be greater than or equal to 0"),
                ));
            }
            if percent && n > 100 {
                causes.push((
                    format!("{path}.{name}"),
                    format!(
                        "Invalid value: {}: must not be greater than 100%",
                        int_or_string(v)
                    ),
                ));
            }
        }
        let has_unavailable = int_or_percent(mu).0 != 0;
        let has_surge = int_or_percent(ms).0 != 0;
        if has_unavailable && has_surge {
            causes.push((
                format!("{path}.maxSurge"),
                format!(
                    "Invalid value: {}: may not be set when maxUnavailable is non-zero",
                    int_or_string(ms)
                ),
            ));
        } else if !has_unavailable && !has_surge {
            causes.push((
                format!("{path}.maxUnavailable"),
                "Required value: cannot be 0 when maxSurge is 0".into(),
            ));
        }
    }
}

/// `ValidateNetworkPolicyPort` (protocol) and `ValidateNetworkPolicySpec` (policyTypes).
fn network_policy(obj: &Value, causes: &mut Causes) {
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    for dir in ["ingress", "egress"] {
        for (i, rule) in spec
            .get(dir)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            for (j, port) in rule
                .get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                if let Some(p) = port.get("protocol").and_then(Value::as_str)
                    && !matches!(p, "TCP" | "UDP" | "SCTP")
                {
                    causes.push((
                        format!("spec.{dir}[{i}].ports[{j}].protocol"),
                        unsupported(p, &["TCP", "UDP", "SCTP"]),
                    ));
                }
            }
        }
    }
    let types: Vec<&str> = spec
        .get("policyTypes")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|t| t.as_str().unwrap_or("")).collect())
        .unwrap_or_default();
    if types.len() > 2 {
        let quoted: Vec<String> = types
            .iter()
            .map(|t| Value::String((*t).into()).to_string())
            .collect();
        causes.push((
            "spec.policyTypes".into(),
            format!(
                "Invalid value: []networking.PolicyType{{{}}}: may not specify more than two policyTypes",
                quoted.join(", ")
            ),
        ));
        return;
    }
    for (i, t) in types.iter().enumerate() {
        if !matches!(*t, "Ingress" | "Egress") {
            causes.push((
                format!("spec.policyTypes[{i}]"),
                unsupported(t, &["Ingress", "Egress"]),
            ));
        }
    }
}

/// `ValidatePriorityClass`: reserved `system-` names, the user ceiling, `preemptionPolicy`.
fn priority_class(obj: &Value, causes: &mut Causes) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let value = obj.get("value").and_then(Value::as_i64).unwrap_or(0);
    let global_default = obj
        .get("globalDefault")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if name.starts_with("system-") {
        let err = match SYSTEM_PRIORITY_CLASSES.iter().find(|(n, _, _)| *n == name) {
            None => Some(format!("{name} is not a known system priority class")),
            Some((n, v, _)) if *v != value => {
                Some(format!("value of {n} PriorityClass must be {v}"))
            }
            Some((n, _, _)) if global_default => {
                Some(format!("globalDefault of {n} PriorityClass must be false"))
            }
            Some(_) => None,
        };
        if let Some(err) = err {
            causes.push((
                "metadata.name".into(),
                format!(
                    "Forbidden: priority class names with 'system-' prefix are reserved for system use only. error: {err}"
                ),
            ));
        }
    } else if value > HIGHEST_USER_PRIORITY {
        causes.push((
            "value".into(),
            format!(
                "Forbidden: maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}"
            ),
        ));
    }
    match obj.get("preemptionPolicy").and_then(Value::as_str) {
        None | Some("PreemptLowerPriority" | "Never") => {}
        Some("") => causes.push(("preemptionPolicy".into(), "Required value".into())),
        Some(p) => causes.push((
            "preemptionPolicy".into(),
            unsupported(p, &["PreemptLowerPriority", "Never"]),
        )),
    }
}

/// Column definitions (after `Name`) of the kinds with printers here, as
/// `pkg/printers/internalversion` defines them; `None` for other kinds.
pub(crate) fn columns(group: &str, kind: &str) -> Option<Vec<Value>> {
    let col = |name: &str, ty: &str, priority: i64, description: &str| json!({"name": name, "type": ty, "format": "", "description": description, "priority": priority});
    let age = col(
        "Age",
        "string",
        0,
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    Some(match (group, kind) {
        ("apps", "DaemonSet") => vec![
            col(
                "Desired",
                "integer",
                0,
                "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod).",
            ),
            col(
                "Current",
                "integer",
                0,
                "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.",
            ),
            col(
                "Ready",
                "integer",
                0,
                "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.",
            ),
            col(
                "Up-to-date",
                "integer",
                0,
                "The total number of nodes that are running updated daemon pod",
            ),
            col(
                "Available",
                "integer",
                0,
                "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
            ),
            col(
                "Node Selector",
                "string",
                0,
                "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node.",
            ),
            age,
            col(
                "Containers",
                "string",
                1,
                "Names of each container in the template.",
            ),
            col(
                "Images",
                "string",
                1,
                "Images referenced by each container in the template.",
            ),
            col(
                "Selector",
                "string",
                1,
                "A label query over pods that are managed by the daemon set.",
            ),
        ],
        ("networking.k8s.io", "NetworkPolicy") => vec![
            col(
                "Pod-Selector",
                "string",
                0,
                "Selects the pods to which this NetworkPolicy object applies.",
            ),
            age,
        ],
        ("scheduling.k8s.io", "PriorityClass") => vec![
            col(
                "Value",
                "integer",
                0,
                "value represents the integer value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec.",
            ),
            col(
                "Global-Default",
                "boolean",
                0,
                "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class.",
            ),
            age,
            col(
                "PreemptionPolicy",
                "string",
                0,
                "preemptionPolicy is the Policy for preempting pods with lower priority.",
            ),
        ],
        _ => return None,
    })
}

/// The cells (after the name) of [`columns`] for one object; `age` renders a timestamp.
pub(crate) fn cells(
    group: &str,
    kind: &str,
    o: &Value,
    age: impl Fn(&str) -> String,
) -> Vec<Value> {
    let created = age(o
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .unwrap_or(""));
    let int = |p: &str| json!(o.pointer(p).and_then(Value::as_i64).unwrap_or(0));
    match (group, kind) {
        ("apps", "DaemonSet") => {
            let containers: Vec<&Value> = o
                .pointer("/spec/template/spec/containers")
                .and_then(Value::as_array)
                .map(|c| c.iter().collect())
                .unwrap_or_default();
            let join = |f: &str| {
                containers
                    .iter()
                    .map(|c| c.get(f).and_then(Value::as_str).unwrap_or(""))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            vec![
                int("/status/desiredNumberScheduled"),
                int("/status/currentNumberScheduled"),
                int("/status/numberReady"),
                int("/status/updatedNumberScheduled"),
                int("/status/numberAvailable"),
                json!(format_labels(o.pointer("/spec/template/spec/nodeSelector"))),
                json!(created),
                json!(join("name")),
                json!(join("image")),
                json!(format_selector(o.pointer("/spec/selector"))),
            ]
        }
        ("networking.k8s.io", "NetworkPolicy") => vec![
            json!(format_selector(o.pointer("/spec/podSelector"))),
            json!(created),
        ],
        ("scheduling.k8s.io", "PriorityClass") => vec![
            int("/value"),
            json!(
                o.get("globalDefault")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            ),
            json!(created),
            json!(
                o.get("preemptionPolicy")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            ),
        ],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_renderings() {
        assert_eq!(
            go_string_map(Some(&json!({"b": "2", "a": "1"}))),
            "map[string]string{\"a\":\"1\", \"b\":\"2\"}"
        );
        assert_eq!(go_string_map(None), "map[string]string(nil)");
        assert_eq!(
            format_selector(Some(&json!({"matchLabels": {"b": "2"},
                "matchExpressions": [{"key": "a", "operator": "In", "values": ["y", "x"]},
                    {"key": "c", "operator": "DoesNotExist"}]}))),
            "a in (x,y),b=2,!c"
        );
        assert_eq!(format_selector(Some(&json!({}))), "<none>");
        assert_eq!(format_labels(Some(&json!({"z": "1", "k": "v"}))), "k=v,z=1");
        assert_eq!(int_or_percent(Some(&json!("25%"))), (25, true));
        assert_eq!(int_or_percent(Some(&json!(3))), (3, false));
        assert_eq!(
            selector_matches(
                Some(
                    &json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]})
                ),
                Some(&json!({"a": "y"}))
            ),
            Some(true)
        );
        assert_eq!(
            selector_matches(None, Some(&json!({"a": "y"}))),
            Some(false)
        );
    }
}
