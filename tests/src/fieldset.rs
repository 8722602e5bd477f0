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
                if !child.is_empty() {
                    fs.children.insert(format!("f:{k}"), child);
                }
            }
        }
        fs
    }

    fn of_node(v: &Value, schema: Option<&Value>, key: &str) -> Self {
        match (child_shape(schema, key, v), v) {
            (Shape::Granular, Value::Object(m)) if !m.is_empty() => Self::of_object(v, schema),
            // An associative list records its items only: an empty one records nothing
            // (structured-merge-diff `typed/tofieldset.go`, `doList`/`visitListItems`).
            (Shape::ListMap(_) | Shape::ListSet, Value::Array(items)) if items.is_empty() => {
                FieldSet::default()
            }
            (Shape::ListMap(keys), Value::Array(items)) => {
                let mut fs = FieldSet::default();
                for item in items {
                    let mut child = Self::of_object(item, items_schema(schema));
                    child.me = true;
                    fs.children.insert(item_key(item, &keys), child);
                }
                fs
            }
            (Shape::ListSet, Value::Array(items)) => {
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
            md.me = false;
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

    pub(crate) fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        for p in other.members() {
            out.insert(&p);
        }
        out
    }

    pub(crate) fn difference(&self, other: &FieldSet) -> FieldSet {
        self.filtered(|p| !other.is_member(p))
    }

    pub(crate) fn intersection(&self, other: &FieldSet) -> FieldSet {
        self.filtered(|p| other.is_member(p))
    }

    fn filtered(&self, keep: impl Fn(&[String]) -> bool) -> FieldSet {
        let mut out = FieldSet::default();
        for p in self.members().iter().filter(|p| keep(p)) {
            out.insert(p);
        }
        out
    }

    /// structured-merge-diff `fieldpath.Set.EnsureNamedFieldsAreMembers`: a declared field
    /// with owned fields below it becomes a member itself; map entries and list items do not.
    /// The object's `metadata` never does: an applier always names the object in it.
    fn ensure_named(&self, schema: Option<&Value>) -> FieldSet {
        self.named_below(schema, true)
    }

    fn named_below(&self, schema: Option<&Value>, root: bool) -> FieldSet {
        let mut out = FieldSet {
            children: BTreeMap::new(),
            me: self.me,
        };
        for (k, c) in &self.children {
            let (cs, named) = match k.strip_prefix("f:") {
                Some(f) => (
                    schema.and_then(|s| prop(s, f)),
                    !(root && f == "metadata") && schema.is_none_or(|s| !is_map_entry(s, f)),
                ),
                None => (items_schema(schema), false),
            };
            let mut nc = c.named_below(cs, false);
            nc.me |= named && !c.children.is_empty();
            out.children.insert(k.clone(), nc);
        }
        out
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

/// Merges an apply configuration into the live object (structured-merge-diff
/// `typed/merge.go`): granular maps key by key, associative lists item by item in the order
/// `merge_items` gives, everything else replaced.
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
            (shape @ (Shape::ListMap(_) | Shape::ListSet), Some(Value::Array(litems))) => {
                let ritems = cv.as_array().map(Vec::as_slice).unwrap_or_default();
                *litems = merge_items(litems, ritems, &shape, items_schema(cs));
            }
            _ => {
                l.insert(k.clone(), cv.clone());
            }
        }
    }
}

/// The path element of a list item: `k:{...}` in a list-map, `v:...` in a set.
fn item_element(item: &Value, shape: &Shape) -> String {
    match shape {
        Shape::ListMap(keys) => item_key(item, keys),
        _ => format!("v:{item}"),
    }
}

/// A list's items by path element, the first of duplicates only, in list order.
fn index_items<'a>(items: &'a [Value], shape: &Shape) -> Vec<(String, &'a Value)> {
    let mut out: Vec<(String, &Value)> = Vec::with_capacity(items.len());
    for item in items {
        let pe = item_element(item, shape);
        if !out.iter().any(|(p, _)| *p == pe) {
            out.push((pe, item));
        }
    }
    out
}

fn find_item<'a>(index: &[(String, &'a Value)], pe: &str) -> Option<&'a Value> {
    index.iter().find(|(p, _)| p == pe).map(|(_, v)| *v)
}

/// Merges the items of an associative list in structured-merge-diff's order
/// (`typed/merge.go`, `visitListItems`): the live order, with the applied items that are new
/// placed where they stand relative to the items both lists share.
fn merge_items(lhs: &[Value], rhs: &[Value], shape: &Shape, schema: Option<&Value>) -> Vec<Value> {
    let (l, r) = (index_items(lhs, shape), index_items(rhs, shape));
    let merge_one = |pe: &str, rv: &Value| match find_item(&l, pe) {
        Some(lv) if matches!(shape, Shape::ListMap(_)) => {
            let mut m = lv.clone();
            apply_merge(&mut m, rv, schema);
            m
        }
        _ => rv.clone(),
    };
    let mut shared = r
        .iter()
        .filter(|(pe, _)| find_item(&l, pe).is_some())
        .map(|(pe, _)| pe.as_str());
    let mut next_shared = shared.next();
    let mut merged: Vec<&str> = Vec::new();
    let mut out = Vec::with_capacity(l.len().max(r.len()));
    let (mut li, mut ri) = (0, 0);
    while li < l.len() || ri < r.len() {
        if li < l.len() && ri < r.len() {
            let pe = l[li].0.as_str();
            if pe == r[ri].0 {
                merged.push(pe);
                out.push(merge_one(pe, r[ri].1));
                (li, ri) = (li + 1, ri + 1);
                next_shared = shared.next();
                continue;
            }
            if find_item(&r, pe).is_some() && next_shared.is_some_and(|n| n != pe) {
                li += 1;
                continue;
            }
        }
        if li < l.len() {
            let pe = l[li].0.as_str();
            if find_item(&r, pe).is_none() {
                out.push(l[li].1.clone());
                li += 1;
                continue;
            } else if merged.contains(&pe) {
                li += 1;
            }
        }
        if ri < r.len() {
            let pe = r[ri].0.as_str();
            merged.push(pe);
            out.push(merge_one(pe, r[ri].1));
            ri += 1;
            if next_shared == Some(pe) {
                next_shared = shared.next();
            }
        }
    }
    out
}

/// structured-merge-diff `typed/remove.go` (`RemoveItems`): drops every node of `v` that is a
/// member of `set`, whole, and descends where `set` owns something below. A map or list left
/// empty becomes null.
fn remove_items(v: &Value, set: &FieldSet, schema: Option<&Value>, key: &str) -> Value {
    let emptied = |empty: bool, out: Value| if empty { Value::Null } else { out };
    let keep = |c: &FieldSet, cv: &Value, cs: Option<&Value>, k: &str| {
        if c.children.is_empty() {
            cv.clone()
        } else {
            remove_items(cv, c, cs, k)
        }
    };
    match (child_shape(schema, key, v), v) {
        (Shape::Granular, Value::Object(m)) => {
            let mut out = Map::new();
            for (k, cv) in m {
                match set.children.get(&format!("f:{k}")) {
                    Some(c) if c.me => {}
                    Some(c) => {
                        out.insert(k.clone(), keep(c, cv, schema.and_then(|s| prop(s, k)), k));
                    }
                    None => {
                        out.insert(k.clone(), cv.clone());
                    }
                }
            }
            emptied(out.is_empty(), Value::Object(out))
        }
        (shape @ (Shape::ListMap(_) | Shape::ListSet), Value::Array(items)) => {
            let mut out = Vec::new();
            for item in items {
                match set.children.get(&item_element(item, &shape)) {
                    Some(c) if c.me => {}
                    Some(c) => out.push(keep(c, item, items_schema(schema), "")),
                    None => out.push(item.clone()),
                }
            }
            emptied(out.is_empty(), Value::Array(out))
        }
        (Shape::Atomic, Value::Object(_) | Value::Array(_)) => Value::Null,
        _ => v.clone(),
    }
}

/// What a write changed, as structured-merge-diff's `typed/compare.go` reports it: `changed`
/// is its Modified ∪ Added, `removed` its Removed. A leaf (a scalar, an atomic list or map, an
/// empty map or list) is modified when its value differs; a node on one side only is added
/// or removed with every node below it.
#[derive(Default)]
struct Comparison {
    changed: FieldSet,
    removed: FieldSet,
}

impl Comparison {
    fn of(old: &Value, new: &Value, schema: Option<&Value>) -> Self {
        let mut c = Comparison::default();
        c.node(Some(old), Some(new), schema, "", &mut Vec::new());
        c
    }

    fn node(
        &mut self,
        old: Option<&Value>,
        new: Option<&Value>,
        schema: Option<&Value>,
        key: &str,
        path: &mut Vec<String>,
    ) {
        let (o, n) = match (old, new) {
            (Some(o), Some(n)) => (o, n),
            (None, Some(n)) => return every_node(n, schema, key, path, &mut self.changed),
            (Some(o), None) => return every_node(o, schema, key, path, &mut self.removed),
            (None, None) => return,
        };
        match (child_shape(schema, key, n), o, n) {
            (Shape::Granular, Value::Object(lo), Value::Object(ln))
                if !(lo.is_empty() && ln.is_empty()) =>
            {
                let keys: std::collections::BTreeSet<&String> =
                    lo.keys().chain(ln.keys()).collect();
                for k in keys {
                    path.push(format!("f:{k}"));
                    self.node(
                        lo.get(k),
                        ln.get(k),
                        schema.and_then(|s| prop(s, k)),
                        k,
                        path,
                    );
                    path.pop();
                }
            }
            (shape @ (Shape::ListMap(_) | Shape::ListSet), Value::Array(lo), Value::Array(ln))
                if !(lo.is_empty() && ln.is_empty()) =>
            {
                let (li, ri) = (index_items(lo, &shape), index_items(ln, &shape));
                let mut pes: Vec<&str> = li.iter().map(|(p, _)| p.as_str()).collect();
                pes.extend(
                    ri.iter()
                        .map(|(p, _)| p.as_str())
                        .filter(|p| find_item(&li, p).is_none()),
                );
                for pe in pes {
                    path.push(pe.to_string());
                    self.node(
                        find_item(&li, pe),
                        find_item(&ri, pe),
                        items_schema(schema),
                        "",
                        path,
                    );
                    path.pop();
                }
            }
            _ if o != n && !path.is_empty() => self.changed.insert(path),
            _ => {}
        }
    }

    /// Keeps only what `Writer::set_of` tracks (the reset fields of the endpoint aside).
    fn strip(mut self, strip_status: bool, status_only: bool) -> Self {
        self.changed.strip(strip_status, status_only);
        self.removed.strip(strip_status, status_only);
        self
    }
}

/// Inserts `path` and every node below it that is not inside an atomic value.
fn every_node(
    v: &Value,
    schema: Option<&Value>,
    key: &str,
    path: &mut Vec<String>,
    set: &mut FieldSet,
) {
    set.insert(path);
    match (child_shape(schema, key, v), v) {
        (Shape::Granular, Value::Object(m)) => {
            for (k, cv) in m {
                path.push(format!("f:{k}"));
                every_node(cv, schema.and_then(|s| prop(s, k)), k, path, set);
                path.pop();
            }
        }
        (shape @ (Shape::ListMap(_) | Shape::ListSet), Value::Array(items)) => {
            for (pe, item) in index_items(items, &shape) {
                path.push(pe);
                every_node(item, items_schema(schema), "", path, set);
                path.pop();
            }
        }
        _ => {}
    }
}

/// The applier's pruning (structured-merge-diff `merge/update.go`, `prune`,
/// `addBackOwnedItems`, `addBackDanglingItems`): of what the applier applied last time
/// (`last`), whatever no manager owns now (`owned`, the applier's new set included) goes.
/// Declared fields count as owned when anything below them is, map entries and list items
/// only when they are owned themselves, so an entry that its applier stops sending goes
/// whole even where another manager owns a field inside it.
fn prune(merged: &Value, last: &FieldSet, owned: &FieldSet, schema: Option<&Value>) -> Value {
    if last.is_empty() {
        return merged.clone();
    }
    let set_of = |v: &Value| FieldSet::of_object(v, schema).ensure_named(schema);
    let last = last.ensure_named(schema);
    let all = set_of(merged);
    let kept = set_of(&remove_items(merged, &last, schema, ""));
    let unowned = all.difference(&kept.union(&owned.ensure_named(schema)));
    let pruned = set_of(&remove_items(merged, &unowned, schema, ""));
    remove_items(
        merged,
        &all.difference(&pruned).intersection(&last),
        schema,
        "",
    )
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

    fn compare(&self, old: &Value, new: &Value) -> Comparison {
        Comparison::of(old, new, self.schema).strip(self.strip_status, self.subresource == "status")
    }

    /// Records a non-apply write (create, update, patch) from `old` to `new`, as
    /// structured-merge-diff's `Updater.Update` does (`merge/update.go`): the writer takes
    /// every changed or added field from the other managers, and nobody keeps a removed one.
    pub(crate) fn record_update(&self, old: Option<&Value>, new: &mut Value) {
        let mut entries = old.map(read_managed).unwrap_or_default();
        let c = self.compare(old.unwrap_or(&json!({})), new);
        for e in entries.iter_mut() {
            e.set = e.set.difference(&c.changed).difference(&c.removed);
        }
        if !c.changed.is_empty() {
            let e = self.entry(&mut entries, "Update");
            e.set = e.set.union(&c.changed);
        }
        finish(&mut entries, new);
    }

    /// Server-side apply of `config` onto `live` (an empty object for a create), as
    /// structured-merge-diff's `Updater.Apply` does (`merge/update.go`): merge, prune what
    /// the applier stopped sending, then conflict on the fields of other managers that the
    /// result changes or adds. Returns the new object, or the list of conflicts
    /// `(manager, field path)` unless `force`.
    pub(crate) fn apply(
        &self,
        live: &Value,
        config: &Value,
        force: bool,
    ) -> Result<Value, Vec<(String, String)>> {
        let mut entries = read_managed(live);
        let applied = self.set_of(config);
        let mine = |e: &Managed| e.same(self.manager, "Apply", self.subresource);
        let last = entries
            .iter()
            .find(|e| mine(e))
            .map(|e| e.set.clone())
            .unwrap_or_default();
        let owned = entries
            .iter()
            .filter(|e| !mine(e))
            .fold(applied.clone(), |acc, e| acc.union(&e.set));
        let mut merged = live.clone();
        apply_merge(&mut merged, config, self.schema);
        let mut merged = prune(&merged, &last, &owned, self.schema);
        let c = self.compare(live, &merged);
        let mut conflicts = Vec::new();
        for e in entries.iter_mut().filter(|e| !mine(e)) {
            let taken = e.set.intersection(&c.changed);
            conflicts.extend(
                taken
                    .members()
                    .iter()
                    .map(|p| (e.manager.clone(), display_path(p))),
            );
            e.set = e.set.difference(&taken).difference(&c.removed);
        }
        if !force && !conflicts.is_empty() {
            return Err(conflicts);
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
            // `[name="a",port=80]`, as structured-merge-diff's `PathElement.String`.
            let fields: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let parts: Vec<String> = fields.iter().map(|(n, v)| format!("{n}={v}")).collect();
            s.push('[');
            s.push_str(&parts.join(","));
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
