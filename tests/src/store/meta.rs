//! Small helpers reading and writing an object's `metadata` and `status.conditions`.

use serde_json::{Map, Value, json};

pub(super) fn meta<'a>(o: &'a Value, k: &str) -> Option<&'a Value> {
    o.get("metadata").and_then(|m| m.get(k))
}

pub(super) fn meta_str<'a>(o: &'a Value, k: &str) -> &'a str {
    meta(o, k).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn meta_mut(o: &mut Value) -> &mut Map<String, Value> {
    if !o.get("metadata").is_some_and(Value::is_object) {
        o["metadata"] = json!({});
    }
    o["metadata"].as_object_mut().expect("metadata object")
}

pub(crate) fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A label value or the name part of a label key.
pub(super) fn label_part(s: &str) -> bool {
    s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// What a change of bumps `metadata.generation`: all but metadata, type meta and (with a
/// status subresource) status.
pub(super) fn spec_part(o: &Value, with_status: bool) -> Value {
    let mut c = o.clone();
    if let Some(m) = c.as_object_mut() {
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
        if with_status {
            m.remove("status");
        }
    }
    c
}

/// The object without managedFields timestamps (a write changing only those is a no-op).
pub(super) fn without_managed(o: &Value) -> Value {
    let mut c = o.clone();
    if let Some(Value::Array(entries)) = c.pointer_mut("/metadata/managedFields") {
        for e in entries.iter_mut() {
            if let Some(m) = e.as_object_mut() {
                m.remove("time");
            }
        }
    }
    c
}

/// Sets a condition of `status.conditions` (its transition time when its status changes).
pub(super) fn set_condition(o: &mut Value, type_: &str, status: &str, reason: &str, message: &str) {
    if !o.get("status").is_some_and(Value::is_object) {
        o["status"] = json!({});
    }
    let list = o["status"]
        .as_object_mut()
        .expect("status object")
        .entry("conditions")
        .or_insert_with(|| json!([]));
    let Some(list) = list.as_array_mut() else {
        return;
    };
    let at = list.iter().position(|c| c["type"] == type_);
    let since = at
        .map(|n| &list[n])
        .filter(|c| c["status"] == status)
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(now()));
    let c = json!({"type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": since});
    match at {
        Some(n) => list[n] = c,
        None => list.push(c),
    }
}

pub(super) fn finalizers(o: &Value) -> Vec<String> {
    meta(o, "finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_mut_makes_metadata_an_object() {
        let mut o = json!({"metadata": "junk"});
        meta_mut(&mut o).insert("name".into(), json!("a"));
        assert_eq!(o, json!({"metadata": {"name": "a"}}));
        assert_eq!(meta_str(&o, "name"), "a");
        assert_eq!(meta_str(&o, "namespace"), "");
    }

    #[test]
    fn label_parts_follow_apimachinery() {
        // k8s.io/apimachinery pkg/util/validation `IsValidLabelValue`: up to 63 characters,
        // alphanumeric at both ends, '-', '_', '.' inside.
        assert!(label_part("a"));
        assert!(label_part("my_value.v-1"));
        assert!(label_part(&"a".repeat(63)));
        assert!(!label_part(&"a".repeat(64)));
        assert!(!label_part("-a"));
        assert!(!label_part("a."));
        assert!(!label_part("a b"));
        assert!(!label_part(""));
    }

    #[test]
    fn the_spec_part_leaves_out_metadata_and_status_only_with_the_subresource() {
        let o = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"},
            "spec": {"n": 1}, "status": {"s": 2}});
        assert_eq!(spec_part(&o, true), json!({"spec": {"n": 1}}));
        assert_eq!(
            spec_part(&o, false),
            json!({"spec": {"n": 1}, "status": {"s": 2}})
        );
    }

    #[test]
    fn managed_field_times_do_not_count_as_a_change() {
        let a = json!({"metadata": {"managedFields": [{"manager": "m", "time": "t1"}]}});
        let b = json!({"metadata": {"managedFields": [{"manager": "m", "time": "t2"}]}});
        let c = json!({"metadata": {"managedFields": [{"manager": "n", "time": "t1"}]}});
        assert_eq!(without_managed(&a), without_managed(&b));
        assert_ne!(without_managed(&a), without_managed(&c));
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        // k8s.io/apimachinery pkg/api/meta/conditions.go `SetStatusCondition`: the
        // lastTransitionTime changes only with the status.
        let mut o = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
            "reason": "Old", "message": "", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}});
        set_condition(&mut o, "Ready", "True", "New", "still");
        let c = &o["status"]["conditions"][0];
        assert_eq!(c["reason"], "New");
        assert_eq!(c["lastTransitionTime"], "2020-01-01T00:00:00Z");
        set_condition(&mut o, "Ready", "False", "Down", "gone");
        let c = &o["status"]["conditions"][0];
        assert_eq!(c["status"], "False");
        assert_ne!(c["lastTransitionTime"], "2020-01-01T00:00:00Z");
        set_condition(&mut o, "Other", "True", "R", "m");
        assert_eq!(o["status"]["conditions"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn finalizers_are_read_as_strings() {
        let o = json!({"metadata": {"finalizers": ["a", 1, "b"]}});
        assert_eq!(finalizers(&o), ["a", "b"]);
        assert!(finalizers(&json!({})).is_empty());
    }
}
