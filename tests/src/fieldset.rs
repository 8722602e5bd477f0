//! Server-side apply: field sets in the `FieldsV1` format, ownership tracking in
//! `metadata.managedFields`, conflict detection and the apply merge.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::patch::merge_keys;
use crate::schema::{Shape, prop, shape};

/// A set of fields, in the shape of `FieldsV1`: `f:name`, `k:{...}`, `v:value` children;
/// `me` marks the node itself as owned (a leaf, or a list item's `.`).
#[derive(Clone, Default, Debug, PartialEq)]
pub(crate) struct FieldSet {
    children: BTreeMap<String, FieldSet>,
    me: bool,
}

/// The shape of a child field, from the schema or, without one, from well-known field names.
pub(crate) fn child_shape(schema: Option<&Value>, key: &str, v: &Value) -> Shape {
    if schema.is_some() {
        return shape(schema, v);
    }
    match v {
        Value::Array(items) => {
            if key == "finalizers" {
                return Shape::ListSet;
            }
            match merge_keys(key, items.first()) {
                Some(k) if items.iter().all(Value::is_object) => {
                    Shape::ListMap(k.into_iter().map(String::from).collect())
                }
                _ => Shape::Atomic,
            }
        }
        Value::Object(_) => Shape::Granular,
        _ => Shape::Atomic,
    }
}

/// Whether `key` of an object of this schema is a map entry rather than a declared field.
fn is_map_entry(schema: &Value, key: &str) -> bool {
    let declared = schema.get("properties").and_then(|p| p.get(key)).is_some();
    !declared
        && schema
            .get("additionalProperties")
            .is_some_and(Value::is_object)
}

fn item_key(item: &Value, keys: &[String]) -> String {
    let mut m = Map::new();
    for k in keys {
        if let Some(v) = item.get(k) {
            m.insert(k.clone(), v.clone());
        }
    }
    format!("k:{}", Value::Object(m))
}

fn items_schema(schema: Option<&Value>) -> Option<&Value> {
    schema.and_then(|s| s.get("items"))
}

impl FieldSet {
    fn leaf() -> Self {
        FieldSet {
            children: BTreeMap::new(),
            me: true,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        !self.me && self.children.is_empty()
    }

    /// The fields set in the object `v` (its contents, not the node itself).
    pub(crate) fn of_object(v: &Value, schema: Option<&Value>) -> Self {
        let mut fs = FieldSet::default();
        if let Value::Object(m) = v {
            for (k, cv) in m {
                let cs = schema.and_then(|s| prop(s, k));
                let mut child = Self::of_node(cv, cs, k);
                // An entry of a map (a key the schema does not declare, under
                // `additionalProperties`) is itself a member, as structured-merge-diff's
                // `visitMapItems` inserts it: a manager that stops applying the entry
                // removes it whole, not just its fields (which would leave `{}`).
                if schema.is_some_and(|s| is_map_entry(s, k)) {
                    child.me = true;
                }
                fs.children.insert(format!("f:{k}"), child);
            }
        }
        fs
    }

    fn of_node(v: &Value, schema: Option<&Value>, key: &str) -> Self {
        match (child_shape(schema, key, v), v) {
            (Shape::Granular, Value::Object(m)) if !m.is_empty() => Self::of_object(v, schema),
            (Shape::ListMap(keys), Value::Array(items)) if !items.is_empty() => {
                let mut fs = FieldSet::default();
                for item in items {
                    let mut child = Self::of_object(item, items_schema(schema));
                    child.me = true;
                    fs.children.insert(item_key(item, &keys), child);
                }
                fs
            }
            (Shape::ListSet, Value::Array(items)) if !items.is_empty() => {
                let mut fs = FieldSet::default();
                for item in items {
                    fs.children.insert(format!("v:{item}"), Self::leaf());
                }
                fs
            }
            _ => Self::leaf(),
        }
    }

    /// Removes fields server-side apply does not track, and status or non-status fields
    /// according to the endpoint (`status_only` for `/status`, `strip_status` for the main one).
    pub(crate) fn strip(&mut self, strip_status: bool, status_only: bool) {
        self.children.remove("f:apiVersion");
        self.children.remove("f:kind");
        if status_only {
            self.children.retain(|k, _| k == "f:status");
        } else if strip_status {
            self.children.remove("f:status");
        }
        if let Some(md) = self.children.get_mut("f:metadata") {
            md.children.retain(|k, _| {
                matches!(
                    k.as_str(),
                    "f:labels" | "f:annotations" | "f:ownerReferences" | "f:finalizers"
                )
            });
            if md.children.is_empty() {
                self.children.remove("f:metadata");
            }
        }
    }

    /// Paths of all owned nodes.
    pub(crate) fn members(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.walk(&mut Vec::new(), &mut out);
        out
    }

    fn walk(&self, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.me {
            out.push(prefix.clone());
        }
        for (k, c) in &self.children {
            prefix.push(k.clone());
            c.walk(prefix, out);
            prefix.pop();
        }
    }

    fn node(&self, path: &[String]) -> Option<&FieldSet> {
        let mut cur = self;
        for p in path {
            cur = cur.children.get(p)?;
        }
        Some(cur)
    }

    pub(crate) fn is_member(&self, path: &[String]) -> bool {
        self.node(path).is_some_and(|n| n.me)
    }

    /// True if `path` or anything below it is owned.
    pub(crate) fn touches(&self, path: &[String]) -> bool {
        self.node(path).is_some_and(|n| !n.is_empty())
    }

    pub(crate) fn insert(&mut self, path: &[String]) {
        let mut cur = self;
        for p in path {
            cur = cur.children.entry(p.clone()).or_default();
        }
        cur.me = true;
    }

    pub(crate) fn remove(&mut self, path: &[String]) {
        fn rec(n: &mut FieldSet, path: &[String]) {
            match path.split_first() {
                None => n.me = false,
                Some((h, rest)) => {
                    if let Some(c) = n.children.get_mut(h) {
                        rec(c, rest);
                        if c.is_empty() {
                            n.children.remove(h);
                        }
                    }
                }
            }
        }
        rec(self, path);
    }

    /// Keeps only members whose path exists in `obj`.
    pub(crate) fn retain_existing(&mut self, obj: &Value) {
        for p in self.members() {
            if value_at(obj, &p).is_none() {
                self.remove(&p);
            }
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        let mut m = Map::new();
        if self.me && !self.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &self.children {
            m.insert(k.clone(), c.to_json());
        }
        Value::Object(m)
    }

    pub(crate) fn from_json(v: &Value) -> Self {
        let mut fs = FieldSet::default();
        if let Value::Object(m) = v {
            if m.is_empty() {
                fs.me = true;
            }
            for (k, c) in m {
                if k == "." {
                    fs.me = true;
                } else {
                    fs.children.insert(k.clone(), Self::from_json(c));
                }
            }
        }
        fs
    }
}

/// Value at a field-set path in an object.
pub(crate) fn value_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for p in path {
        cur = if let Some(f) = p.strip_prefix("f:") {
            cur.get(f)?
        } else if let Some(k) = p.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(k).ok()?;
            cur.as_array()?
                .iter()
                .find(|item| key.iter().all(|(kk, kv)| item.get(kk) == Some(kv)))?
        } else if let Some(x) = p.strip_prefix("v:") {
            let val: Value = serde_json::from_str(x).ok()?;
            cur.as_array()?.iter().find(|i| **i == val)?
        } else {
            return None;
        };
    }
    Some(cur)
}

fn remove_value_at(v: &mut Value, path: &[String]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for p in parent {
        let next = if let Some(f) = p.strip_prefix("f:") {
            cur.get_mut(f)
        } else if p.starts_with("k:") || p.starts_with("v:") {
            let idx = find_index(cur, p);
            match (idx, cur.as_array_mut()) {
                (Some(i), Some(a)) => a.get_mut(i),
                _ => None,
            }
        } else {
            None
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(i) = find_index(cur, last)
        && let Some(a) = cur.as_array_mut()
    {
        a.remove(i);
    }
}

fn find_index(list: &Value, p: &str) -> Option<usize> {
    let a = list.as_array()?;
    if let Some(k) = p.strip_prefix("k:") {
        let key: Map<String, Value> = serde_json::from_str(k).ok()?;
        a.iter()
            .position(|item| key.iter().all(|(kk, kv)| item.get(kk) == Some(kv)))
    } else {
        let val: Value = serde_json::from_str(p.strip_prefix("v:")?).ok()?;
        a.iter().position(|i| *i == val)
    }
}

/// Merges an apply configuration into the live object.
pub(crate) fn apply_merge(live: &mut Value, config: &Value, schema: Option<&Value>) {
    let (Value::Object(l), Value::Object(c)) = (&mut *live, config) else {
        *live = config.clone();
        return;
    };
    for (k, cv) in c {
        let cs = schema.and_then(|s| prop(s, k));
        if cv.is_null() {
            l.remove(k);
            continue;
        }
        match (child_shape(cs, k, cv), l.get_mut(k)) {
            (Shape::Granular, Some(lv @ Value::Object(_))) => apply_merge(lv, cv, cs),
            (Shape::ListMap(keys), Some(Value::Array(litems))) => {
                for item in cv.as_array().into_iter().flatten() {
                    let key = item_key(item, &keys);
                    match litems.iter_mut().find(|li| item_key(li, &keys) == key) {
                        Some(li) => apply_merge(li, item, items_schema(cs)),
                        None => litems.push(item.clone()),
                    }
                }
            }
            (Shape::ListSet, Some(Value::Array(litems))) => {
                for item in cv.as_array().into_iter().flatten() {
                    if !litems.contains(item) {
                        litems.push(item.clone());
                    }
                }
            }
            _ => {
                l.insert(k.clone(), cv.clone());
            }
        }
    }
}

/// One `managedFields` entry.
#[derive(Clone, Debug)]
pub(crate) struct Managed {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: String,
    pub set: FieldSet,
}

impl Managed {
    fn same(&self, manager: &str, op: &str, sub: &str) -> bool {
        self.manager == manager && self.operation == op && self.subresource == sub
    }
}

pub(crate) fn read_managed(obj: &Value) -> Vec<Managed> {
    let s = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| Managed {
                    manager: s(e, "manager"),
                    operation: s(e, "operation"),
                    api_version: s(e, "apiVersion"),
                    time: s(e, "time"),
                    subresource: s(e, "subresource"),
                    set: FieldSet::from_json(e.get("fieldsV1").unwrap_or(&Value::Null)),
                })
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn write_managed(obj: &mut Value, entries: &[Managed]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.set.is_empty())
        .map(|e| {
            let mut m = json!({
                "manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": e.set.to_json(),
            });
            if !e.subresource.is_empty() {
                m["subresource"] = json!(e.subresource);
            }
            m
        })
        .collect();
    if let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            md.remove("managedFields");
        } else {
            md.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Context of one write for ownership bookkeeping.
pub(crate) struct Writer<'a> {
    pub manager: &'a str,
    pub subresource: &'a str,
    pub api_version: &'a str,
    pub time: &'a str,
    pub schema: Option<&'a Value>,
    pub strip_status: bool,
}

impl Writer<'_> {
    fn set_of(&self, v: &Value) -> FieldSet {
        let mut fs = FieldSet::of_object(v, self.schema);
        fs.strip(self.strip_status, self.subresource == "status");
        fs
    }

    fn entry<'e>(&self, entries: &'e mut Vec<Managed>, op: &str) -> &'e mut Managed {
        let i = match entries
            .iter()
            .position(|e| e.same(self.manager, op, self.subresource))
        {
            Some(i) => i,
            None => {
                entries.push(Managed {
                    manager: self.manager.into(),
                    operation: op.into(),
                    api_version: self.api_version.into(),
                    time: String::new(),
                    subresource: self.subresource.into(),
                    set: FieldSet::default(),
                });
                entries.len() - 1
            }
        };
        let e = &mut entries[i];
        e.time = self.time.into();
        e.api_version = self.api_version.into();
        e
    }

    /// Records a non-apply write (create, update, patch) from `old` to `new`.
    pub(crate) fn record_update(&self, old: Option<&Value>, new: &mut Value) {
        let mut entries = old.map(read_managed).unwrap_or_default();
        let all = self.set_of(new);
        let changed: Vec<Vec<String>> = all
            .members()
            .into_iter()
            .filter(|p| old.and_then(|o| value_at(o, p)) != value_at(new, p))
            .collect();
        if !changed.is_empty() {
            for e in entries.iter_mut() {
                for p in &changed {
                    e.set.remove(p);
                }
            }
            let e = self.entry(&mut entries, "Update");
            for p in &changed {
                e.set.insert(p);
            }
        }
        finish(&mut entries, new);
    }

    /// Server-side apply of `config` onto `live` (an empty object for a create). Returns the
    /// new object, or the list of conflicts `(manager, field path)` unless `force`.
    pub(crate) fn apply(
        &self,
        live: &Value,
        config: &Value,
        force: bool,
    ) -> Result<Value, Vec<(String, String)>> {
        let mut entries = read_managed(live);
        let applied = self.set_of(config);
        let mut conflicts = Vec::new();
        for p in applied.members() {
            let lv = value_at(live, &p);
            if lv.is_none()
                || lv == value_at(config, &p)
                || p.last().is_some_and(|l| l.starts_with("k:"))
            {
                continue;
            }
            for e in entries.iter_mut() {
                if e.same(self.manager, "Apply", self.subresource) || !e.set.is_member(&p) {
                    continue;
                }
                if force {
                    e.set.remove(&p);
                } else {
                    conflicts.push((e.manager.clone(), display_path(&p)));
                }
            }
        }
        if !conflicts.is_empty() {
            return Err(conflicts);
        }
        let mut merged = live.clone();
        apply_merge(&mut merged, config, self.schema);
        let prev = entries
            .iter()
            .find(|e| e.same(self.manager, "Apply", self.subresource))
            .map(|e| e.set.clone())
            .unwrap_or_default();
        for p in prev.members() {
            if applied.is_member(&p) || applied.touches(&p) {
                continue;
            }
            let owned_by_other = entries
                .iter()
                .any(|e| !e.same(self.manager, "Apply", self.subresource) && e.set.touches(&p));
            if !owned_by_other {
                remove_value_at(&mut merged, &p);
            }
        }
        self.entry(&mut entries, "Apply").set = applied;
        finish(&mut entries, &mut merged);
        Ok(merged)
    }
}

fn finish(entries: &mut Vec<Managed>, obj: &mut Value) {
    for e in entries.iter_mut() {
        e.set.retain_existing(obj);
    }
    entries.retain(|e| !e.set.is_empty());
    write_managed(obj, entries);
}

/// `.spec.used[10.0.0.1]`-style rendering of a field path, as in real conflict messages.
pub(crate) fn display_path(p: &[String]) -> String {
    let mut s = String::new();
    for el in p {
        if let Some(f) = el.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = el.strip_prefix("k:") {
            s.push('[');
            s.push_str(k);
            s.push(']');
        } else if let Some(v) = el.strip_prefix("v:") {
            s.push_str("[=");
            s.push_str(v);
            s.push(']');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w<'a>(manager: &'a str, schema: Option<&'a Value>) -> Writer<'a> {
        Writer {
            manager,
            subresource: "",
            api_version: "v1",
            time: "2026-01-01T00:00:00Z",
            schema,
            strip_status: false,
        }
    }

    #[test]
    fn fields_v1_roundtrip_and_list_map_keys() {
        let obj = json!({"metadata": {"name": "x", "labels": {"a": "1"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let fs = FieldSet::of_object(&obj, None);
        let j = fs.to_json();
        assert_eq!(
            j["f:status"]["f:conditions"]["k:{\"type\":\"Ready\"}"],
            json!({".": {}, "f:status": {}, "f:type": {}})
        );
        assert_eq!(FieldSet::from_json(&j), fs);
    }

    /// A map of objects (`additionalProperties`, like IPAMNode `status.used`): each entry
    /// is a member (`.`), and an entry its manager stops applying goes whole, while another
    /// manager's entries stay.
    #[test]
    fn map_entries_are_members_and_go_whole() {
        let schema = json!({"type": "object", "properties": {"status": {"type": "object",
            "properties": {"used": {"type": "object", "additionalProperties": {
                "type": "object", "properties": {"pod": {"type": "string"}}}}}}}});
        let live = json!({"metadata": {"name": "x"}});
        let entry = |pod: &str| json!({"pod": pod});
        let a = w("agent", Some(&schema))
            .apply(
                &live,
                &json!({"status": {"used": {"10.0.0.1": entry("p1"), "10.0.0.2": entry("p2")}}}),
                false,
            )
            .unwrap();
        let fs = FieldSet::of_object(
            &json!({"status": {"used": {"10.0.0.1": entry("p1")}}}),
            Some(&schema),
        );
        assert_eq!(
            fs.to_json()["f:status"]["f:used"]["f:10.0.0.1"],
            json!({".": {}, "f:pod": {}})
        );
        let b = w("other", Some(&schema))
            .apply(
                &a,
                &json!({"status": {"used": {"10.0.0.3": entry("p3")}}}),
                false,
            )
            .unwrap();
        let c = w("agent", Some(&schema))
            .apply(
                &b,
                &json!({"status": {"used": {"10.0.0.2": entry("p2")}}}),
                false,
            )
            .unwrap();
        assert_eq!(
            c["status"]["used"],
            json!({"10.0.0.2": entry("p2"), "10.0.0.3": entry("p3")}),
            "10.0.0.1 gone whole, the other manager's entry kept"
        );
    }

    #[test]
    fn apply_conflicts_then_force_and_removal() {
        let live = json!({"metadata": {"name": "x"}});
        let a = w("a", None)
            .apply(&live, &json!({"spec": {"m": {"k1": 1}}}), false)
            .unwrap();
        let b = w("b", None)
            .apply(&a, &json!({"spec": {"m": {"k2": 2}}}), false)
            .unwrap();
        assert_eq!(b["spec"]["m"], json!({"k1": 1, "k2": 2}));
        let err = w("b", None)
            .apply(&b, &json!({"spec": {"m": {"k1": 5}}}), false)
            .unwrap_err();
        assert_eq!(err, vec![("a".to_string(), ".spec.m.k1".to_string())]);
        let forced = w("b", None)
            .apply(&b, &json!({"spec": {"m": {"k1": 5, "k2": 2}}}), true)
            .unwrap();
        assert_eq!(forced["spec"]["m"], json!({"k1": 5, "k2": 2}));
        // b drops k2 from its apply: removed since nobody else owns it.
        let dropped = w("b", None)
            .apply(&forced, &json!({"spec": {"m": {"k1": 5}}}), false)
            .unwrap();
        assert_eq!(dropped["spec"]["m"], json!({"k1": 5}));
        // a no longer owns anything and has no entry left.
        let managers: Vec<&str> = dropped["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(managers, vec!["b"]);
    }
}
