//! Structural-schema handling for custom resources: pruning of unknown fields, nulls and
//! defaults, validation (types, required, minimum/maximum, enum, pattern, lengths, items), and
//! the shape lookups server-side apply needs (granular/atomic maps, list types and keys).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use regex::Regex;
use serde_json::Value;

/// How a node of an object merges under server-side apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Object merged field by field (structs and `x-kubernetes-map-type: granular` maps).
    Granular,
    /// Replaced as a whole (scalars, atomic maps, atomic lists).
    Atomic,
    /// `x-kubernetes-list-type: map` with its keys.
    ListMap(Vec<String>),
    /// `x-kubernetes-list-type: set`.
    ListSet,
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Child schema of an object property.
pub(crate) fn prop<'a>(schema: &'a Value, key: &str) -> Option<&'a Value> {
    schema
        .get("properties")
        .and_then(|p| p.get(key))
        .or_else(|| match schema.get("additionalProperties") {
            Some(a @ Value::Object(_)) => Some(a),
            _ => None,
        })
}

fn preserves(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        || schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true))
        || schema.get("additionalProperties") == Some(&Value::Bool(true))
}

/// The SSA shape of a schema node.
pub(crate) fn shape(schema: Option<&Value>, v: &Value) -> Shape {
    match (schema, v) {
        (Some(s), Value::Array(_)) => match s.get("x-kubernetes-list-type").and_then(Value::as_str)
        {
            Some("map") => Shape::ListMap(
                s.get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|k| k.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            Some("set") => Shape::ListSet,
            _ => Shape::Atomic,
        },
        (Some(s), Value::Object(_)) => {
            if s.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic") {
                Shape::Atomic
            } else {
                Shape::Granular
            }
        }
        (None, Value::Object(_)) => Shape::Granular,
        _ => Shape::Atomic,
    }
}

/// Compiled `pattern`s, shared by all validations.
#[derive(Default)]
pub(crate) struct Patterns(Mutex<HashMap<String, Option<Arc<Regex>>>>);

impl Patterns {
    fn get(&self, p: &str) -> Option<Arc<Regex>> {
        let mut m = self.0.lock();
        m.entry(p.to_string())
            .or_insert_with(|| Regex::new(p).ok().map(Arc::new))
            .clone()
    }
}

/// Drops unknown fields (recording their paths), drops nulls for non-nullable fields, and
/// applies defaults, in place.
pub(crate) fn prune_and_default(
    schema: &Value,
    v: &mut Value,
    path: &str,
    unknown: &mut Vec<String>,
) {
    prune_walk(schema, v, path, unknown, true);
}

/// Like [`prune_and_default`] without defaulting (for apply configurations: the applier does
/// not own defaulted fields).
pub(crate) fn prune(schema: &Value, v: &mut Value, unknown: &mut Vec<String>) {
    prune_walk(schema, v, "", unknown, false);
}

fn prune_walk(
    schema: &Value,
    v: &mut Value,
    path: &str,
    unknown: &mut Vec<String>,
    defaults: bool,
) {
    match v {
        Value::Object(map) => {
            if schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true))
                || schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
                    && schema.get("properties").is_none()
            {
                return;
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let addl = schema.get("additionalProperties");
            let keep_unknown = preserves(schema);
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if path.is_empty() && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let child = props.and_then(|p| p.get(&k)).or(match addl {
                    Some(a @ Value::Object(_)) => Some(a),
                    _ => None,
                });
                match child {
                    Some(cs) => {
                        let cv = map.get_mut(&k).expect("key present");
                        if cv.is_null() && cs.get("nullable") != Some(&Value::Bool(true)) {
                            map.remove(&k);
                            continue;
                        }
                        prune_walk(cs, cv, &join(path, &k), unknown, defaults);
                    }
                    None if keep_unknown => {}
                    None => {
                        map.remove(&k);
                        unknown.push(join(path, &k));
                    }
                }
            }
            if let (Some(props), true) = (props, defaults) {
                for (k, cs) in props {
                    if !map.contains_key(k)
                        && let Some(d) = cs.get("default")
                    {
                        let mut d = d.clone();
                        prune_and_default(cs, &mut d, &join(path, k), &mut Vec::new());
                        map.insert(k.clone(), d);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune_walk(is, item, &format!("{path}[{i}]"), unknown, defaults);
                }
            }
        }
        _ => {}
    }
}

/// Whether `s` has string format `f`, for the formats the real server checks that our CRDs
/// use (kube-openapi's strfmt, Go's parsers): `cidr` (`net.ParseCIDR`: host bits may be
/// set), `ipv4`, `ipv6`. Other formats are not checked here (the real server checks more,
/// e.g. `date-time`, `uuid`; it ignores the ones it does not know).
fn format_ok(f: &str, s: &str) -> bool {
    use std::net::IpAddr;
    match f {
        "cidr" => s.split_once('/').is_some_and(|(a, p)| {
            let max = match a.parse::<IpAddr>() {
                Ok(IpAddr::V4(_)) => 32,
                Ok(IpAddr::V6(_)) => 128,
                Err(_) => return false,
            };
            // Go accepts decimal digits only, no sign, no leading zeros beyond "0"
            let digits = !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit());
            digits && (p == "0" || !p.starts_with('0')) && p.parse::<u32>().is_ok_and(|n| n <= max)
        }),
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        _ => true,
    }
}

/// Validates `v` against `schema`, appending `(field, message)` causes.
pub(crate) fn validate(
    schema: &Value,
    v: &Value,
    path: &str,
    pats: &Patterns,
    out: &mut Vec<(String, String)>,
) {
    validate_update(schema, v, None, path, pats, out);
}

/// The item of an `x-kubernetes-list-type: map` list `old` with the keys of `item`: what an
/// update correlates it with (no other list correlates its items).
pub(crate) fn correlated_item<'a>(
    schema: &Value,
    item: &Value,
    old: Option<&'a Value>,
) -> Option<&'a Value> {
    let Shape::ListMap(keys) = shape(Some(schema), &Value::Array(Vec::new())) else {
        return None;
    };
    old?.as_array()?
        .iter()
        .find(|o| keys.iter().all(|k| o.get(k) == item.get(k)))
}

/// [`validate`] with ratcheting (CRDValidationRatcheting, on since Kubernetes 1.30; kubernetes/
/// apiextensions-apiserver `pkg/apiserver/validation/ratcheting.go`): `old` is the value
/// correlated with `v` in the stored object (object properties by name, list-map items by
/// key), and a node equal to it passes whatever it holds, so an update that leaves an invalid
/// value unchanged passes.
pub(crate) fn validate_update(
    schema: &Value,
    v: &Value,
    old: Option<&Value>,
    path: &str,
    pats: &Patterns,
    out: &mut Vec<(String, String)>,
) {
    if old.is_some_and(|o| o == v) {
        return;
    }
    if !type_ok(schema, v, path, out) {
        return;
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array)
        && !e.contains(v)
    {
        let vals: Vec<String> = e.iter().map(|x| x.to_string()).collect();
        out.push((
            path.into(),
            format!(
                "Unsupported value: {}: supported values: {}",
                v,
                vals.join(", ")
            ),
        ));
    }
    match v {
        Value::Number(n) => number_bounds(schema, v, n.as_f64().unwrap_or(0.0), path, out),
        Value::String(s) => string_checks(schema, v, s, path, pats, out),
        Value::Array(items) => {
            item_counts(schema, items, path, out);
            if let Some(is) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    let o = correlated_item(schema, item, old);
                    validate_update(is, item, o, &format!("{path}[{i}]"), pats, out);
                }
            }
            if let Shape::ListMap(keys) = shape(Some(schema), v) {
                duplicate_keys(&keys, items, path, out);
            }
        }
        Value::Object(map) => {
            if let Some(req) = schema.get("required").and_then(Value::as_array) {
                for r in req.iter().filter_map(Value::as_str) {
                    if !map.contains_key(r) {
                        out.push((join(path, r), "Required value".into()));
                    }
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            for (k, cv) in map {
                if path.is_empty() && matches!(k.as_str(), "metadata" | "apiVersion" | "kind") {
                    continue;
                }
                let cs =
                    props
                        .and_then(|p| p.get(k))
                        .or(match schema.get("additionalProperties") {
                            Some(a @ Value::Object(_)) => Some(a),
                            _ => None,
                        });
                if let Some(cs) = cs {
                    let o = old.and_then(|o| o.get(k));
                    validate_update(cs, cv, o, &join(path, k), pats, out);
                }
            }
        }
        _ => {}
    }
}

/// Whether `v` is null where the schema allows it or has the schema's type (an
/// `x-kubernetes-int-or-string` node takes an integer or a string); false, with the cause,
/// when the node is checked no further.
fn type_ok(schema: &Value, v: &Value, path: &str, out: &mut Vec<(String, String)>) -> bool {
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if v.is_null() {
        if schema.get("nullable") != Some(&Value::Bool(true))
            && let Some(t) = schema.get("type").and_then(Value::as_str)
        {
            out.push((
                path.into(),
                format!("Invalid value: \"null\": {path} in body must be of type {t}: \"null\""),
            ));
        }
        return false;
    }
    if int_or_string && !matches!(type_of(v), "integer" | "string") {
        let got = type_of(v);
        out.push((
            path.into(),
            format!(
                "Invalid value: \"{got}\": {path} in body must be of type integer,string: \"{got}\""
            ),
        ));
        return false;
    }
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        let got = type_of(v);
        let ok = got == t
            || (t == "number" && got == "integer")
            || (int_or_string && (got == "integer" || got == "string"));
        if !ok {
            out.push((
                path.into(),
                format!("Invalid value: \"{got}\": {path} in body must be of type {t}: \"{got}\""),
            ));
            return false;
        }
    }
    true
}

/// `minimum` and `maximum` (exclusive or not) of a number `x` (the value `v`).
fn number_bounds(schema: &Value, v: &Value, x: f64, path: &str, out: &mut Vec<(String, String)>) {
    let excl_min = schema.get("exclusiveMinimum") == Some(&Value::Bool(true));
    let excl_max = schema.get("exclusiveMaximum") == Some(&Value::Bool(true));
    if let Some(m) = schema.get("minimum").and_then(Value::as_f64) {
        if excl_min && x <= m {
            out.push((
                path.into(),
                format!("Invalid value: {v}: {path} in body should be greater than {m}"),
            ));
        } else if x < m {
            out.push((
                path.into(),
                format!(
                    "Invalid value: {v}: {path} in body should be greater than or equal to {m}"
                ),
            ));
        }
    }
    if let Some(m) = schema.get("maximum").and_then(Value::as_f64) {
        if excl_max && x >= m {
            out.push((
                path.into(),
                format!("Invalid value: {v}: {path} in body should be less than {m}"),
            ));
        } else if x > m {
            out.push((
                path.into(),
                format!("Invalid value: {v}: {path} in body should be less than or equal to {m}"),
            ));
        }
    }
}

/// `format`, `pattern`, `minLength` and `maxLength` of a string `s` (the value `v`).
fn string_checks(
    schema: &Value,
    v: &Value,
    s: &str,
    path: &str,
    pats: &Patterns,
    out: &mut Vec<(String, String)>,
) {
    if let Some(f) = schema.get("format").and_then(Value::as_str)
        && !format_ok(f, s)
    {
        out.push((
            path.into(),
            format!("Invalid value: {v}: {path} in body must be of type {f}: {v}"),
        ));
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str)
        && let Some(re) = pats.get(p)
        && !re.is_match(s)
    {
        out.push((
            path.into(),
            format!("Invalid value: {v}: {path} in body should match '{p}'"),
        ));
    }
    let len = s.chars().count() as u64;
    if let Some(m) = schema.get("minLength").and_then(Value::as_u64)
        && len < m
    {
        out.push((
            path.into(),
            format!("Invalid value: {v}: {path} in body should be at least {m} chars long"),
        ));
    }
    if let Some(m) = schema.get("maxLength").and_then(Value::as_u64)
        && len > m
    {
        out.push((
            path.into(),
            format!("Too long: may not be more than {m} bytes"),
        ));
    }
}

/// `minItems` and `maxItems` of a list.
fn item_counts(schema: &Value, items: &[Value], path: &str, out: &mut Vec<(String, String)>) {
    if let Some(m) = schema.get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < m
    {
        out.push((
            path.into(),
            format!(
                "Invalid value: {}: {path} in body should have at least {m} items",
                items.len()
            ),
        ));
    }
    if let Some(m) = schema.get("maxItems").and_then(Value::as_u64)
        && (items.len() as u64) > m
    {
        out.push((
            path.into(),
            format!("Too many: {}: must have at most {m} items", items.len()),
        ));
    }
}

/// The items of an `x-kubernetes-list-type: map` list whose keys an earlier item has.
fn duplicate_keys(keys: &[String], items: &[Value], path: &str, out: &mut Vec<(String, String)>) {
    let mut seen = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let k: Vec<Value> = keys
            .iter()
            .map(|k| item.get(k).cloned().unwrap_or(Value::Null))
            .collect();
        if seen.contains(&k) {
            out.push((
                format!("{path}[{i}]"),
                format!("Duplicate value: {}", Value::Array(k.clone())),
            ));
        }
        seen.push(k);
    }
}

/// Checks that a CRD's schema is structural enough for us to serve it (every node typed or
/// preserving unknown fields). Returns a list of causes.
pub(crate) fn check_structural(schema: &Value, path: &str, out: &mut Vec<(String, String)>) {
    let Some(m) = schema.as_object() else {
        out.push((
            path.into(),
            "Invalid value: schema must be an object".into(),
        ));
        return;
    };
    let typed = m.contains_key("type")
        || m.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        || m.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if !typed && !path.ends_with("openAPIV3Schema") {
        out.push((
            format!("{path}.type"),
            "Required value: must not be empty for specified object fields".into(),
        ));
    }
    if let Some(Value::Object(props)) = m.get("properties") {
        for (k, v) in props {
            check_structural(v, &format!("{path}.properties[{k}]"), out);
        }
    }
    if let Some(a @ Value::Object(_)) = m.get("additionalProperties") {
        check_structural(a, &format!("{path}.additionalProperties"), out);
    }
    if let Some(i) = m.get("items") {
        check_structural(i, &format!("{path}.items"), out);
    }
    if let Some(p) = m.get("pattern").and_then(Value::as_str)
        && Regex::new(p).is_err()
    {
        out.push((
            format!("{path}.pattern"),
            format!("Invalid value: {p:?}: must be a valid regular expression"),
        ));
    }
    if m.get("properties").is_some()
        && m.get("additionalProperties")
            .is_some_and(|a| a != &Value::Bool(false))
    {
        out.push((
            format!("{path}.additionalProperties"),
            "Forbidden: additionalProperties and properties are mutual exclusive".into(),
        ));
    }
    let ty = m.get("type").and_then(Value::as_str).unwrap_or("");
    if m.contains_key("x-kubernetes-map-type") && ty != "object" {
        out.push((
            format!("{path}.x-kubernetes-map-type"),
            "Invalid value: must only be used if type == \"object\"".into(),
        ));
    }
    let list_type = m.get("x-kubernetes-list-type").and_then(Value::as_str);
    if list_type.is_some() && ty != "array" {
        out.push((
            format!("{path}.x-kubernetes-list-type"),
            "Invalid value: must only be used if type == \"array\"".into(),
        ));
    }
    let items = m.get("items");
    let item_ty = items
        .and_then(|i| i.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    match list_type {
        Some("map") => list_map_causes(m, path, out),
        Some("set")
            if matches!(item_ty, "object" | "array")
                && items
                    .and_then(|i| i.get("x-kubernetes-map-type"))
                    .is_none_or(|t| t != "atomic") =>
        {
            out.push((
                format!("{path}.items.x-kubernetes-map-type"),
                "Required value: must be atomic as item of a list with x-kubernetes-list-type=set"
                    .into(),
            ));
        }
        Some("set" | "atomic") | None => {}
        Some(other) => out.push((
            format!("{path}.x-kubernetes-list-type"),
            format!(
                "Unsupported value: \"{other}\": supported values: \"atomic\", \"map\", \"set\""
            ),
        )),
    }
}

/// The causes against an `x-kubernetes-list-type: map` list schema: object items, and
/// map keys that are scalar item properties, each required or defaulted.
fn list_map_causes(
    m: &serde_json::Map<String, Value>,
    path: &str,
    out: &mut Vec<(String, String)>,
) {
    let items = m.get("items");
    let item_ty = items
        .and_then(|i| i.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if item_ty != "object" {
        out.push((
            format!("{path}.items.type"),
            "Invalid value: must be object if parent array's x-kubernetes-list-type is map".into(),
        ));
    }
    let keys: Vec<&str> = m
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if keys.is_empty() {
        out.push((
            format!("{path}.x-kubernetes-list-map-keys"),
            "Required value: must not be empty if x-kubernetes-list-type is map".into(),
        ));
    }
    let required: Vec<&str> = items
        .and_then(|i| i.get("required"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for k in keys {
        let prop = items
            .and_then(|i| i.get("properties"))
            .and_then(|p| p.get(k));
        match prop {
            None => out.push((
                format!("{path}.x-kubernetes-list-map-keys"),
                format!("Invalid value: \"{k}\": entries must all be names of item properties"),
            )),
            Some(p) => {
                if !required.contains(&k) && p.get("default").is_none() {
                    out.push((
                        format!("{path}.items.properties[{k}]"),
                        "Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property".into(),
                    ));
                }
                if matches!(
                    p.get("type").and_then(Value::as_str),
                    Some("object" | "array")
                ) {
                    out.push((
                        format!("{path}.items.properties[{k}].type"),
                        "Invalid value: must be a scalar type if parent array's x-kubernetes-list-type is map".into(),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn causes(schema: &Value, v: &Value) -> Vec<String> {
        let mut out = Vec::new();
        validate(schema, v, "", &Patterns::default(), &mut out);
        out.into_iter().map(|(f, m)| format!("{f}: {m}")).collect()
    }

    /// String formats as the real server checks them (Go's `net.ParseCIDR` and IP parsers),
    /// with its wording: "must be of type cidr".
    #[test]
    fn string_formats() {
        let s = json!({"type": "object", "properties": {
            "c": {"type": "string", "format": "cidr"},
            "v4": {"type": "string", "format": "ipv4"},
            "v6": {"type": "string", "format": "ipv6"},
            "other": {"type": "string", "format": "int32"}}});
        for ok in [
            "10.0.0.0/8",
            "10.0.0.1/8",
            "0.0.0.0/0",
            "fd00::/64",
            "::/0",
            "1.2.3.4/32",
        ] {
            assert!(causes(&s, &json!({"c": ok})).is_empty(), "{ok}");
        }
        for bad in [
            "10.0.0/8",
            "10.0.0.0/33",
            "10.0.0.0",
            "fd00::/129",
            "10.0.0.0/08",
            "x/1",
            "10.0.0.0/+8",
        ] {
            let c = causes(&s, &json!({"c": bad}));
            assert_eq!(
                c,
                vec![format!(
                    "c: Invalid value: \"{bad}\": c in body must be of type cidr: \"{bad}\""
                )],
                "{bad}"
            );
        }
        assert!(
            causes(
                &s,
                &json!({"v4": "10.1.2.3", "v6": "fd00::1", "other": "x"})
            )
            .is_empty()
        );
        assert_eq!(
            causes(&s, &json!({"v4": "fd00::1", "v6": "10.1.2.3"})).len(),
            2
        );
    }

    #[test]
    fn validation_rules() {
        let s = json!({"type": "object", "properties": {
            "n": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 10},
            "s": {"type": "string", "minLength": 2, "maxLength": 3},
            "l": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "integer"}},
            "m": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                  "items": {"type": "object", "properties": {"type": {"type": "string"}}}},
            "i": {"x-kubernetes-int-or-string": true}}});
        assert!(causes(&s, &json!({"n": 0.5, "s": "ab", "l": [1], "i": "50%"})).is_empty());
        let c = causes(
            &s,
            &json!({"n": 0, "s": "abcd", "l": [], "m": [{"type": "A"}, {"type": "A"}], "i": 1.5}),
        );
        assert_eq!(c.len(), 5, "{c:?}");
        assert!(c[0].starts_with("i: Invalid value"), "{c:?}");
        assert!(
            c.iter()
                .any(|m| m
                    .starts_with("l: Invalid value: 0: l in body should have at least 1 items")),
            "{c:?}"
        );
        assert!(
            c.iter().any(|m| m.starts_with("m[1]: Duplicate value")),
            "{c:?}"
        );
        assert!(
            c.iter()
                .any(|m| m == "n: Invalid value: 0: n in body should be greater than 0"),
            "{c:?}"
        );
        assert!(c.iter().any(|m| m.starts_with("s: Too long")), "{c:?}");
        assert_eq!(
            causes(&s, &json!({"n": 11})),
            vec!["n: Invalid value: 11: n in body should be less than or equal to 10"]
        );
    }

    #[test]
    fn structural_checks_on_list_maps() {
        let bad = json!({"type": "object", "properties": {"conditions": {"type": "array",
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
            "items": {"type": "object", "properties": {"type": {"type": "string"}}}}}});
        let mut out = Vec::new();
        check_structural(&bad, "openAPIV3Schema", &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(
            out[0]
                .1
                .contains("must have a default or be a required property"),
            "{out:?}"
        );
        let mut good = bad.clone();
        good["properties"]["conditions"]["items"]["required"] = json!(["type"]);
        let mut out = Vec::new();
        check_structural(&good, "openAPIV3Schema", &mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn pruning_nulls_and_defaults() {
        let s = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "a": {"type": "string", "default": "x"},
                "b": {"type": "string", "nullable": true},
                "c": {"type": "string"},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}});
        let mut v = json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "n"},
            "spec": {"b": null, "c": null, "zz": 1, "free": {"any": {"thing": 1}}}});
        let mut unknown = Vec::new();
        prune_and_default(&s, &mut v, "", &mut unknown);
        assert_eq!(unknown, vec!["spec.zz"]);
        assert_eq!(
            v["spec"],
            json!({"a": "x", "b": null, "free": {"any": {"thing": 1}}})
        );
        assert_eq!(v["metadata"]["name"], "n");
    }
}
