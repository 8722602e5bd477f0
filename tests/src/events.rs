//! Events, as the real server keeps them: one store of core v1 Events, readable and writable
//! through both `v1` and `events.k8s.io/v1` (kubernetes/kubernetes
//! pkg/registry/events/rest/storage_events.go serves the core Event storage,
//! pkg/registry/core/event/storage, for events.k8s.io), converted field by
//! field (pkg/apis/events/v1/conversion.go, `Convert_v1_Event_To_core_Event` and
//! `Convert_core_Event_To_v1_Event`), and validated by pkg/apis/core/validation/events.go:
//! `legacyValidateEvent` for every write, plus the strict rules of `ValidateEventCreate` and
//! `ValidateEventUpdate` for writes through events.k8s.io/v1. Field paths in errors are the
//! core Event's, whichever API was used, as upstream validates the internal (core) type.

use serde_json::{Map, Value, json};

use crate::registry::ResType;

type Causes = Vec<(String, String)>;

/// `ReportingInstanceLengthLimit`, `ActionLengthLimit`, `ReasonLengthLimit`.
const SHORT_LIMIT: usize = 128;
/// `NoteLengthLimit`.
const NOTE_LIMIT: usize = 1024;

/// The events.k8s.io/v1 fields that core v1 names otherwise (`Convert_v1_Event_To_core_Event`
/// and the generated conversion of `ReportingController`): (events.k8s.io, core).
const RENAMED: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("reportingController", "reportingComponent"),
];

/// Whether `rt` is events.k8s.io's Event, which is stored as a core v1 Event.
pub(crate) fn is_events_api(rt: &ResType) -> bool {
    rt.group == "events.k8s.io" && rt.kind == "Event"
}

/// Whether `rt` is an Event of either API.
pub(crate) fn is_event(rt: &ResType) -> bool {
    rt.kind == "Event" && (rt.group.is_empty() || rt.group == "events.k8s.io")
}

fn renamed(obj: &Value, pairs: impl Iterator<Item = (&'static str, &'static str)>) -> Value {
    let Some(m) = obj.as_object() else {
        return obj.clone();
    };
    let mut out: Map<String, Value> = m.clone();
    for (from, to) in pairs {
        out.remove(to);
        if let Some(v) = m.get(from) {
            out.remove(from);
            out.insert(to.into(), v.clone());
        }
    }
    Value::Object(out)
}

/// An events.k8s.io/v1 Event as the core v1 Event it is stored as.
pub(crate) fn to_core(obj: &Value) -> Value {
    let mut core = renamed(obj, RENAMED.into_iter());
    core["apiVersion"] = json!("v1");
    core
}

/// A stored core v1 Event as events.k8s.io/v1 shows it.
pub(crate) fn from_core(obj: &Value) -> Value {
    let mut ev = renamed(obj, RENAMED.into_iter().map(|(e, c)| (c, e)));
    ev["apiVersion"] = json!("events.k8s.io/v1");
    ev
}

fn text<'a>(o: &'a Value, p: &str) -> &'a str {
    o.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn set(o: &Value, p: &str) -> bool {
    o.pointer(p).is_some_and(|v| !v.is_null())
}

/// `field.Invalid(path, "", detail)` as the server prints it.
fn invalid_empty(path: &str, detail: &str) -> (String, String) {
    (path.into(), format!("Invalid value: \"\": {detail}"))
}

fn required(path: &str) -> (String, String) {
    (path.into(), "Required value".into())
}

/// The rules of a write of an Event (`obj`, in the request's shape) through `rt`; `old` is
/// the stored object on an update.
pub(crate) fn validate(rt: &ResType, obj: &Value, old: Option<&Value>, causes: &mut Causes) {
    if !is_event(rt) {
        return;
    }
    let core = |o: &Value| {
        if is_events_api(rt) {
            to_core(o)
        } else {
            o.clone()
        }
    };
    let new = core(obj);
    legacy(&new, causes);
    if !is_events_api(rt) {
        return; // core v1: "No further validation for backwards compatibility."
    }
    match old.map(core) {
        None => strict_create(&new, causes),
        Some(old) => strict_update(&new, &old, causes),
    }
}

/// `legacyValidateEvent`.
fn legacy(e: &Value, causes: &mut Causes) {
    let ns = text(e, "/metadata/namespace");
    let regarding_ns = text(e, "/involvedObject/namespace");
    let mismatch = || {
        (
            "involvedObject.namespace".to_string(),
            format!(
                "Invalid value: {}: does not match event.namespace",
                json!(regarding_ns)
            ),
        )
    };
    if !set(e, "/eventTime") {
        // "event.Namespace must also be empty (or "default", for compatibility with old clients)"
        let ok = if regarding_ns.is_empty() {
            ns.is_empty() || ns == "default"
        } else {
            ns == regarding_ns
        };
        if !ok {
            causes.push(mismatch());
        }
        return;
    }
    if regarding_ns.is_empty() && ns != "default" && ns != "kube-system" {
        causes.push(mismatch());
    }
    let controller = text(e, "/reportingComponent");
    if controller.is_empty() {
        causes.push(required("reportingController"));
    }
    for m in crate::names::qualified_name(controller) {
        causes.push((
            "reportingController".into(),
            format!("Invalid value: {}: {m}", json!(controller)),
        ));
    }
    for (p, f, max) in [
        ("/reportingInstance", "reportingInstance", SHORT_LIMIT),
        ("/action", "action", SHORT_LIMIT),
        ("/reason", "reason", SHORT_LIMIT),
        ("/message", "message", NOTE_LIMIT),
    ] {
        let v = text(e, p);
        if v.is_empty() && f != "message" {
            causes.push(required(f));
        }
        if v.len() > max {
            causes.push(invalid_empty(
                f,
                &format!("can have at most {max} characters"),
            ));
        }
    }
}

/// `validateV1EventSeries`.
fn series(e: &Value, causes: &mut Causes) {
    if !set(e, "/series") {
        return;
    }
    if e.pointer("/series/count")
        .and_then(Value::as_i64)
        .unwrap_or(0)
        < 2
    {
        causes.push(invalid_empty("series.count", "should be at least 2"));
    }
    if !set(e, "/series/lastObservedTime") {
        causes.push(required("series.lastObservedTime"));
    }
}

/// The rest of `ValidateEventCreate` for events.k8s.io/v1.
fn strict_create(e: &Value, causes: &mut Causes) {
    series(e, causes);
    if !set(e, "/eventTime") {
        causes.push(required("eventTime"));
    }
    let t = text(e, "/type");
    if t != "Normal" && t != "Warning" {
        causes.push(invalid_empty("type", &format!("has invalid value: {t}")));
    }
    for f in ["firstTimestamp", "lastTimestamp"] {
        if set(e, &format!("/{f}")) {
            causes.push(invalid_empty(f, "needs to be unset"));
        }
    }
    if e.get("count").and_then(Value::as_i64).unwrap_or(0) != 0 {
        causes.push(invalid_empty("count", "needs to be unset"));
    }
    if !text(e, "/source/component").is_empty() || !text(e, "/source/host").is_empty() {
        causes.push(invalid_empty("source", "needs to be unset"));
    }
}

/// The rest of `ValidateEventUpdate` for events.k8s.io/v1: the series if it changed, and
/// every field but the series and metadata immutable (`ValidateImmutableField`, which
/// compares with semantic equality: timestamps as instants, to the microsecond for
/// `eventTime`). `reason` is checked twice upstream, so it is reported twice.
fn strict_update(new: &Value, old: &Value, causes: &mut Causes) {
    if new.get("series") != old.get("series") {
        series(new, causes);
    }
    for f in [
        "involvedObject",
        "reason",
        "message",
        "source",
        "firstTimestamp",
        "lastTimestamp",
        "count",
        "reason",
        "type",
        "eventTime",
        "action",
        "related",
        "reportingComponent",
        "reportingInstance",
    ] {
        let (n, o) = (new.get(f), old.get(f));
        if !same(f, n, o) {
            let path = if f == "reportingComponent" {
                "reportingController"
            } else {
                f
            };
            causes.push((
                path.into(),
                format!("Invalid value: {}: field is immutable", go_value(f, n)),
            ));
        }
    }
}

/// Whether two values of field `f` are semantically equal (`apiequality.Semantic`, on the
/// decoded Go values): a missing field and its zero value are the same, and timestamps
/// compare as instants (to the microsecond: `MicroTime`'s precision).
fn same(f: &str, a: Option<&Value>, b: Option<&Value>) -> bool {
    normal(f, a) == normal(f, b)
}

fn is_time(f: &str) -> bool {
    f.ends_with("Timestamp") || f.ends_with("Time")
}

/// `v` with zero values dropped and timestamps as microseconds since the epoch.
fn normal(f: &str, v: Option<&Value>) -> Value {
    match v {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(s)) if s.is_empty() => Value::Null,
        Some(Value::Number(n)) if n.as_i64() == Some(0) => Value::Null,
        Some(Value::String(s)) if is_time(f) => match s.parse::<jiff::Timestamp>() {
            Ok(t) => json!((t.as_nanosecond() / 1000).to_string()),
            Err(_) => json!(s),
        },
        Some(Value::Object(m)) => {
            let kept: Map<String, Value> = m
                .iter()
                .map(|(k, v)| (k.clone(), normal(k, Some(v))))
                .filter(|(_, v)| !v.is_null())
                .collect();
            // a `related` pointer to an empty reference is not nil
            if kept.is_empty() && f != "related" {
                Value::Null
            } else {
                Value::Object(kept)
            }
        }
        Some(v) => v.clone(),
    }
}

/// A rejected value as `field.Error` prints it: strings quoted, numbers bare, timestamps by
/// Go's `Time.String`, references as `%#v` of the internal struct, nil as `null`.
fn go_value(f: &str, v: Option<&Value>) -> String {
    let o = v.cloned().unwrap_or(json!({}));
    let s = |k: &str| json!(o.get(k).and_then(Value::as_str).unwrap_or("")).to_string();
    match f {
        "related" if v.is_none_or(Value::is_null) => "null".into(),
        "involvedObject" | "related" => format!(
            "core.ObjectReference{{Kind:{}, Namespace:{}, Name:{}, UID:{}, APIVersion:{}, ResourceVersion:{}, FieldPath:{}}}",
            s("kind"),
            s("namespace"),
            s("name"),
            s("uid"),
            s("apiVersion"),
            s("resourceVersion"),
            s("fieldPath")
        ),
        "source" => format!(
            "core.EventSource{{Component:{}, Host:{}}}",
            s("component"),
            s("host")
        ),
        "count" => v.and_then(Value::as_i64).unwrap_or(0).to_string(),
        f if is_time(f) => go_time(v),
        _ => json!(v.and_then(Value::as_str).unwrap_or("")).to_string(),
    }
}

/// Go's `time.Time.String()` of a UTC timestamp: `2006-01-02 15:04:05.999999999 +0000 UTC`
/// (fraction without trailing zeros), the zero time when unset.
fn go_time(v: Option<&Value>) -> String {
    let Some(t) = v
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
    else {
        return "0001-01-01 00:00:00 +0000 UTC".into();
    };
    let base = t.strftime("%Y-%m-%d %H:%M:%S").to_string();
    let nanos = t.subsec_nanosecond();
    let frac = if nanos == 0 {
        String::new()
    } else {
        format!(".{nanos:09}").trim_end_matches('0').to_string()
    };
    format!("{base}{frac} +0000 UTC")
}
