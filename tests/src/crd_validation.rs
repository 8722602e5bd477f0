//! CustomResourceDefinition rules of apiextensions' validation beyond the structural checks in
//! `schema`: the group, version names, the root type, array items, list-map keys, defaults
//! and validation rules (`crd_rules::check`), each as a `(field, message)` cause worded as the
//! real server words it.

use serde_json::Value;

use crate::crd_rules;
use crate::names;
use crate::schema::{Patterns, validate};

type Causes = Vec<(String, String)>;

/// `spec.group`: a DNS subdomain with at least one dot (`group` is not empty).
pub(crate) fn group(group: &str, out: &mut Causes) {
    let errs = names::dns1123_subdomain(group);
    let why = if !errs.is_empty() {
        errs.join(",")
    } else if !group.contains('.') {
        "should be a domain with at least one dot".to_string()
    } else {
        return;
    };
    out.push((
        "spec.group".into(),
        format!("Invalid value: {group:?}: {why}"),
    ));
}

/// `spec.versions[*].name`: DNS-1035 labels, unique.
pub(crate) fn version_names(versions: &[Value], out: &mut Causes) {
    let mut seen = Vec::new();
    let mut unique = true;
    for (i, v) in versions.iter().enumerate() {
        let name = v.get("name").and_then(Value::as_str).unwrap_or("");
        unique &= !seen.contains(&name);
        seen.push(name);
        let errs = names::dns1035_label(name);
        if !errs.is_empty() {
            out.push((
                format!("spec.versions[{i}].name"),
                format!("Invalid value: {name:?}: {}", errs.join(",")),
            ));
        }
    }
    if !unique {
        out.push((
            "spec.versions".into(),
            "Invalid value: []apiextensions.CustomResourceDefinitionVersion{...}: must contain unique version names".into(),
        ));
    }
}

/// The warnings of a CRD write: its validation rules this server does not enforce.
pub(crate) fn rule_warnings(crd: &Value) -> Vec<String> {
    let mut warnings = Vec::new();
    let versions = crd.pointer("/spec/versions").and_then(Value::as_array);
    for (i, v) in versions.into_iter().flatten().enumerate() {
        if let Some(root) = v.pointer("/schema/openAPIV3Schema") {
            let path = format!("spec.versions[{i}].schema.openAPIV3Schema");
            walk(
                root,
                &path,
                &Patterns::default(),
                &mut Vec::new(),
                &mut warnings,
            );
        }
    }
    warnings
}

/// The checks of one version's `openAPIV3Schema` at `path`.
pub(crate) fn schema(root: &Value, path: &str, out: &mut Causes) {
    if let Some(t) = root.get("type").and_then(Value::as_str)
        && t != "object"
    {
        out.push((
            format!("{path}.type"),
            format!("Invalid value: {t:?}: must be object at the root"),
        ));
    }
    walk(root, path, &Patterns::default(), out, &mut Vec::new());
}

/// Every node: arrays need items, list-map keys need a map list, defaults must validate, rules
/// must compile.
fn walk(node: &Value, path: &str, pats: &Patterns, out: &mut Causes, warnings: &mut Vec<String>) {
    let Some(m) = node.as_object() else { return };
    if m.get("type").and_then(Value::as_str) == Some("array") && !m.contains_key("items") {
        out.push((
            format!("{path}.items"),
            "Required value: must be specified".into(),
        ));
    }
    list_map_keys(node, path, out);
    crd_rules::check(node, path, out, warnings);
    if let Some(d) = m.get("default") {
        validate(node, d, &format!("{path}.default"), pats, out);
    }
    if let Some(Value::Object(props)) = m.get("properties") {
        for (k, v) in props {
            walk(v, &format!("{path}.properties[{k}]"), pats, out, warnings);
        }
    }
    if let Some(a @ Value::Object(_)) = m.get("additionalProperties") {
        walk(
            a,
            &format!("{path}.additionalProperties"),
            pats,
            out,
            warnings,
        );
    }
    if let Some(i) = m.get("items") {
        walk(i, &format!("{path}.items"), pats, out, warnings);
    }
}

/// `x-kubernetes-list-map-keys` only with `x-kubernetes-list-type: map`.
fn list_map_keys(node: &Value, path: &str, out: &mut Causes) {
    let has_keys = node
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if !has_keys {
        return;
    }
    let field = format!("{path}.x-kubernetes-list-type");
    let why = "must be map if x-kubernetes-list-map-keys is non-empty";
    match node.get("x-kubernetes-list-type").and_then(Value::as_str) {
        None => out.push((field, format!("Required value: {why}"))),
        Some("map") => {}
        Some(t) => out.push((field, format!("Invalid value: {t:?}: {why}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_validated_against_their_node() {
        let mut out = Vec::new();
        schema(
            &json!({"type": "object", "properties": {"n": {"type": "integer", "default": "x"}}}),
            "s",
            &mut out,
        );
        assert_eq!(
            out,
            vec![(
                "s.properties[n].default".to_string(),
                "Invalid value: \"string\": s.properties[n].default in body must be of type integer: \"string\"".to_string()
            )]
        );
    }
}
