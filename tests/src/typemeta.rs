//! The type meta (`apiVersion`, `kind`) of a create or update body checked against the
//! endpoint, with the errors the real server's decoders and validators give.

use serde_json::Value;

use crate::error::Error;
use crate::registry::ResType;

/// Go package of the internal type a built-in group decodes into (`core.ConfigMap`).
fn internal_package(group: &str) -> &str {
    match group {
        "" | "events.k8s.io" => "core",
        g => g.split('.').next().unwrap_or(g),
    }
}

/// `(group, version)` of an `apiVersion`, the endpoint's when it is empty.
fn group_version<'a>(rt: &'a ResType, av: &'a str) -> (&'a str, &'a str) {
    match av.split_once('/') {
        _ if av.is_empty() => (&rt.group, &rt.version),
        Some((g, v)) => (g, v),
        None => ("", av),
    }
}

/// Checks a body sent to `rt`'s endpoint. `registered(group, version, kind)` tells whether a
/// built-in kind exists (the real server's scheme).
pub(crate) fn check(
    rt: &ResType,
    obj: &Value,
    registered: impl Fn(&str, &str, &str) -> bool,
) -> Result<(), Error> {
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .unwrap_or(&rt.kind);
    let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let (group, version) = group_version(rt, av);
    if kind != rt.kind && rt.crd && group == rt.group {
        let name = obj.pointer("/metadata/name").and_then(Value::as_str);
        return Err(Error::invalid(
            &rt.group,
            &rt.kind,
            name.unwrap_or(""),
            vec![(
                "kind".into(),
                format!("Invalid value: {kind:?}: must be {}", rt.kind),
            )],
        ));
    }
    if kind != rt.kind && !rt.crd {
        let why = if registered(group, version, kind) {
            format!(
                "converting ({version}.{kind}) to ({}.{}): unknown conversion",
                internal_package(&rt.group),
                rt.kind
            )
        } else {
            format!(
                "no kind {kind:?} is registered for version {av:?} in scheme \"k8s.io/kubernetes/pkg/api/legacyscheme/scheme.go:30\""
            )
        };
        return Err(Error::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {}: {why}",
            rt.kind
        )));
    }
    check_version(rt, obj)
}

/// The body's `apiVersion` must be the endpoint's group (and, for the core group, version).
pub(crate) fn check_version(rt: &ResType, obj: &Value) -> Result<(), Error> {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or(&rt.kind);
    let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let group_ok = if rt.group.is_empty() {
        av.is_empty() || av == rt.version
    } else {
        av.is_empty() || av.starts_with(&format!("{}/", rt.group))
    };
    if kind != rt.kind || !group_ok {
        return Err(Error::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            rt.api_version()
        )));
    }
    Ok(())
}
