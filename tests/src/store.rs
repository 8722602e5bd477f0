//! The object store: one monotonically increasing resourceVersion, per-resource event windows
//! for watches, and the generic write semantics (create, update, patch, apply, delete,
//! finalizers, garbage collection, status subresource, generation, CRD registration).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::admission_policy::Admission;
use crate::error::Error;
use crate::events;
use crate::fieldset::Writer;
use crate::names;
use crate::paging::{Snapshot, Token, key_of, start_after};
use crate::registry::{ResType, builtins, from_crd};
use crate::schema::{Patterns, prune_and_default, validate_update};
use crate::selector::Selector;
use crate::typemeta;

/// etcd's default request size limit, which bounds a stored object.
const MAX_OBJECT_BYTES: usize = 1_572_864;

const CRD_GR: &str = "customresourcedefinitions.apiextensions.k8s.io";

/// One change, as retained for watches.
#[derive(Debug)]
pub(crate) struct WatchEvent {
    pub rv: u64,
    pub gr: String,
    pub ns: String,
    pub etype: &'static str,
    pub obj: Arc<Value>,
    pub prev: Option<Arc<Value>>,
    /// `{"type":...,"object":...}\n` in the storage version.
    pub line: Bytes,
}

pub(crate) fn event_line(etype: &str, obj: &Value) -> Bytes {
    let mut v = Vec::with_capacity(512);
    v.extend_from_slice(b"{\"type\":\"");
    v.extend_from_slice(etype.as_bytes());
    v.extend_from_slice(b"\",\"object\":");
    serde_json::to_writer(&mut v, obj).expect("serialise");
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

#[derive(Default)]
struct Log {
    events: VecDeque<Arc<WatchEvent>>,
    compacted: u64,
}

type Key = (String, String);

/// What a new watch starts with: events to send first, the live feed, the current version.
pub(crate) type WatchStart = (
    Vec<Arc<WatchEvent>>,
    broadcast::Receiver<Arc<WatchEvent>>,
    u64,
);

struct Inner {
    rv: u64,
    types: BTreeMap<(String, String, String), Arc<ResType>>,
    objects: HashMap<String, BTreeMap<Key, Arc<Value>>>,
    uids: HashMap<String, (String, Key)>,
    /// Owner UID → the objects whose `ownerReferences` name it, as (group/resource, key):
    /// garbage collection looks dependents up here instead of scanning every object (a
    /// scan made each delete cost ~25 ms at 30,000 pods).
    owned: HashMap<String, BTreeSet<(String, Key)>>,
    logs: HashMap<String, Log>,
    snapshots: BTreeMap<u64, Snapshot>,
    next_snapshot: u64,
    discovery_gen: u64,
}

impl Inner {
    /// Keeps a list for its continue tokens (the 64 newest lists); returns its id.
    fn keep_snapshot(&mut self, rv: u64, items: Arc<Vec<Arc<Value>>>) -> u64 {
        let id = self.next_snapshot;
        self.next_snapshot += 1;
        let taken = Instant::now();
        self.snapshots.insert(id, Snapshot { rv, items, taken });
        while self.snapshots.len() > 64 {
            self.snapshots.pop_first();
        }
        id
    }
}

/// How a write's `managedFields` are computed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owners {
    Record,
    Precomputed,
}

/// Per-request write options.
#[derive(Default)]
pub(crate) struct WriteOpts {
    pub manager: String,
    pub subresource: String,
    pub dry_run: bool,
    pub strict: bool,
    pub force: bool,
    /// Admission policies to check the write against (`None`: the server's own writes).
    pub admission: Option<Admission>,
}

/// Result of a write: the object and any warnings (pruned unknown fields).
pub(crate) struct Written {
    pub obj: Arc<Value>,
    pub warnings: Vec<String>,
    pub code: u16,
}

/// Deletion options from the body or query.
#[derive(Default)]
pub(crate) struct DeleteOpts {
    pub uid: Option<String>,
    pub rv: Option<String>,
    pub propagation: Option<String>,
    pub dry_run: bool,
    /// `gracePeriodSeconds` (pods only).
    pub grace: Option<i64>,
    /// Admission policies to check the delete against (`None`: the server's own deletes).
    pub admission: Option<Admission>,
    /// `orphanDependents` of the DeleteOptions (deprecated; `false` makes a delete that
    /// waits answer 202).
    pub orphan_dependents: Option<bool>,
    /// A deleted CRD turns Terminating and keeps a finalizer until its objects are gone
    /// (the CRD finalizer controller, [`Store::crd_cleanup_step`]); false: its objects go at
    /// once with it.
    pub crd_finalizer: bool,
}

/// The finalizer the real server puts on a CRD being deleted (kubernetes/apiextensions-apiserver
/// `pkg/apis/apiextensions/v1/types.go`, `CustomResourceCleanupFinalizer`).
const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// A CRD's `selectableFields` (top level and per version) are dropped unless the stored CRD
/// uses them, as a server with CustomResourceFieldSelectors off does (kubernetes/
/// apiextensions-apiserver `pkg/registry/customresourcedefinition/strategy.go`
/// `dropDisabledFields`, 1.30).
fn drop_selectable_fields(crd: &mut Value, old: Option<&Value>) {
    let uses = |c: &Value| {
        c.pointer("/spec/selectableFields").is_some()
            || c.pointer("/spec/versions")
                .and_then(Value::as_array)
                .is_some_and(|vs| vs.iter().any(|v| v.get("selectableFields").is_some()))
    };
    if old.is_some_and(uses) {
        return;
    }
    if let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("selectableFields");
    }
    let versions = crd
        .pointer_mut("/spec/versions")
        .and_then(Value::as_array_mut);
    for v in versions.into_iter().flatten() {
        if let Some(v) = v.as_object_mut() {
            v.remove("selectableFields");
        }
    }
}

/// A list result.
pub(crate) struct Listed {
    pub items: Vec<Arc<Value>>,
    pub rv: u64,
    pub cont: Option<String>,
    pub remaining: Option<usize>,
}

pub(crate) struct Store {
    inner: Mutex<Inner>,
    pub tx: broadcast::Sender<Arc<WatchEvent>>,
    window: usize,
    pats: Patterns,
    rules: crate::crd_rules::Rules,
    /// CRD `selectableFields` are kept (CustomResourceFieldSelectors on: Kubernetes ≥ 1.31).
    crd_field_selectors: bool,
    rng: AtomicU64,
}

fn meta<'a>(o: &'a Value, k: &str) -> Option<&'a Value> {
    o.get("metadata").and_then(|m| m.get(k))
}

fn meta_str<'a>(o: &'a Value, k: &str) -> &'a str {
    meta(o, k).and_then(Value::as_str).unwrap_or("")
}

fn meta_mut(o: &mut Value) -> &mut Map<String, Value> {
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
fn label_part(s: &str) -> bool {
    s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn spec_part(o: &Value, with_status: bool) -> Value {
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
fn without_managed(o: &Value) -> Value {
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

/// `plural.group` of a CRD's objects.
fn crd_resource(crd: &Value) -> String {
    let s = |p: &str| crd.pointer(p).and_then(Value::as_str).unwrap_or("");
    format!("{}.{}", s("/spec/names/plural"), s("/spec/group"))
}

/// Sets a condition of `status.conditions` (its transition time when its status changes).
fn set_condition(o: &mut Value, type_: &str, status: &str, reason: &str, message: &str) {
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

fn finalizers(o: &Value) -> Vec<String> {
    meta(o, "finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

impl Store {
    pub(crate) fn new(window: usize, crd_field_selectors: bool) -> Self {
        let (tx, _) = broadcast::channel(1 << 16);
        let mut types = BTreeMap::new();
        for rt in builtins() {
            types.insert(
                (rt.group.clone(), rt.version.clone(), rt.plural.clone()),
                Arc::new(rt),
            );
        }
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        let store = Store {
            inner: Mutex::new(Inner {
                rv: 1,
                types,
                objects: HashMap::new(),
                uids: HashMap::new(),
                owned: HashMap::new(),
                logs: HashMap::new(),
                snapshots: BTreeMap::new(),
                next_snapshot: 1,
                discovery_gen: 1,
            }),
            tx,
            window: window.max(1),
            pats: Patterns::default(),
            rules: crate::crd_rules::Rules::default(),
            crd_field_selectors,
            rng: AtomicU64::new(seed),
        };
        let ns_type = store.resolve("", "v1", "namespaces").expect("namespaces");
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
            let opts = WriteOpts {
                manager: "kube-apiserver".into(),
                subresource: String::new(),
                dry_run: false,
                strict: false,
                force: false,
                admission: None,
            };
            store
                .create(&ns_type, "", obj, &opts)
                .expect("seed namespace");
        }
        // The PriorityClasses the real server creates at start (`SystemPriorityClasses()`).
        let pc_type = store
            .resolve("scheduling.k8s.io", "v1", "priorityclasses")
            .expect("priorityclasses");
        for (name, value, description) in crate::kinds::SYSTEM_PRIORITY_CLASSES {
            let obj = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value, "description": description,
                "preemptionPolicy": "PreemptLowerPriority"});
            let opts = WriteOpts {
                manager: "kube-apiserver".into(),
                ..WriteOpts::default()
            };
            store
                .create(&pc_type, "", obj, &opts)
                .expect("seed priority class");
        }
        store
    }

    pub(crate) fn random(&self) -> u64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }

    fn uid(&self) -> String {
        let (a, b) = (self.random(), self.random());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | (b >> 48) & 0x3fff,
            b & 0xffff_ffff_ffff
        )
    }

    pub(crate) fn resolve(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResType>> {
        self.inner
            .lock()
            .types
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    pub(crate) fn types(&self) -> (Vec<Arc<ResType>>, u64) {
        let i = self.inner.lock();
        (i.types.values().cloned().collect(), i.discovery_gen)
    }

    pub(crate) fn current_rv(&self) -> u64 {
        self.inner.lock().rv
    }

    /// The object as seen through `rt`'s version (a stored core Event converted for
    /// events.k8s.io).
    pub(crate) fn present(rt: &ResType, obj: &Arc<Value>) -> Arc<Value> {
        let av = rt.api_version();
        if obj.get("apiVersion").and_then(Value::as_str) == Some(av.as_str()) {
            obj.clone()
        } else if events::is_events_api(rt) {
            Arc::new(events::from_core(obj))
        } else {
            let mut o = (**obj).clone();
            o["apiVersion"] = json!(av);
            Arc::new(o)
        }
    }

    /// A written object (in `rt`'s shape) as it is stored: events.k8s.io Events as core ones.
    fn to_storage(rt: &ResType, obj: Value) -> Value {
        if events::is_events_api(rt) {
            events::to_core(&obj)
        } else {
            obj
        }
    }

    /// The resourceVersion of the last write to a resource (`plural.group`), 0 before any.
    pub(crate) fn last_write(&self, gr: &str) -> u64 {
        let i = self.inner.lock();
        i.logs
            .get(gr)
            .map(|l| l.events.back().map_or(l.compacted, |e| e.rv))
            .unwrap_or(0)
    }

    /// Every stored object of a resource (`plural.group`), in all namespaces.
    pub(crate) fn objects_of(&self, gr: &str) -> Vec<Arc<Value>> {
        let i = self.inner.lock();
        i.objects
            .get(gr)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn get(&self, rt: &ResType, ns: &str, name: &str) -> Result<Arc<Value>, Error> {
        let i = self.inner.lock();
        i.objects
            .get(&rt.storage_gr())
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .map(|o| Self::present(rt, o))
            .ok_or_else(|| Error::not_found(&rt.group, &rt.plural, name))
    }

    /// One page of a list: from the current state, or from the snapshot a continue token
    /// names (see [`crate::paging`]; a snapshot older than `max_age` is expired).
    pub(crate) fn list(
        &self,
        rt: &ResType,
        ns: Option<&str>,
        sel: &Selector,
        limit: Option<usize>,
        cont: Option<&str>,
        max_age: Option<Duration>,
    ) -> Result<Listed, Error> {
        let mut i = self.inner.lock();
        let token = match cont {
            Some(c) => Some(Token::parse(c).ok_or_else(|| {
                Error::bad_request("invalid continue token: continue key is not valid")
            })?),
            None => None,
        };
        let (rv, all, id) = match &token {
            Some(Token::Snapshot { id, after }) => match i.snapshots.get(id) {
                Some(s) if !s.expired(max_age) => (s.rv, s.items.clone(), Some(*id)),
                _ => {
                    i.snapshots.remove(id);
                    let after = after.clone();
                    return Err(Error::ContinueExpired(Token::Latest { after }.encode()));
                }
            },
            Some(Token::Latest { .. }) | None => {
                let items: Vec<Arc<Value>> = i
                    .objects
                    .get(&rt.storage_gr())
                    .map(|m| {
                        m.iter()
                            .filter(|((ons, _), o)| ns.is_none_or(|n| n == ons) && sel.matches(o))
                            .map(|(_, o)| Self::present(rt, o))
                            .collect()
                    })
                    .unwrap_or_default();
                (i.rv, Arc::new(items), None)
            }
        };
        let offset = start_after(&all, token.as_ref().map(Token::after));
        let limit = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let end = offset.saturating_add(limit).min(all.len());
        let items = all[offset.min(end)..end].to_vec();
        let mut next = None;
        if end < all.len() {
            let id = id.unwrap_or_else(|| i.keep_snapshot(rv, all.clone()));
            let after = key_of(&items[items.len() - 1]);
            next = Some(Token::Snapshot { id, after }.encode());
        } else if let Some(id) = id {
            i.snapshots.remove(&id);
        }
        Ok(Listed {
            items,
            rv,
            remaining: next.as_ref().map(|_| all.len() - end),
            cont: next,
        })
    }

    /// Starts a watch: returns the events to send first and the live receiver.
    /// `from == None` means "current state first" (synthetic ADDED events).
    pub(crate) fn watch(
        &self,
        rt: &ResType,
        ns: Option<&str>,
        from: Option<u64>,
    ) -> Result<WatchStart, Error> {
        let i = self.inner.lock();
        let gr = rt.storage_gr();
        let rx = self.tx.subscribe();
        let first = match from {
            None | Some(0) => i
                .objects
                .get(&gr)
                .map(|m| {
                    m.iter()
                        .filter(|((ons, _), _)| ns.is_none_or(|n| n == ons))
                        .map(|((ons, _), o)| {
                            Arc::new(WatchEvent {
                                rv: 0,
                                gr: gr.clone(),
                                ns: ons.clone(),
                                etype: "ADDED",
                                obj: o.clone(),
                                prev: None,
                                line: event_line("ADDED", o),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default(),
            Some(rv) => {
                let log = i.logs.get(&gr);
                let compacted = log.map(|l| l.compacted).unwrap_or(0);
                if rv < compacted {
                    return Err(Error::gone(format!(
                        "too old resource version: {rv} ({compacted})"
                    )));
                }
                log.map(|l| {
                    l.events
                        .iter()
                        .filter(|e| e.rv > rv && ns.is_none_or(|n| n == e.ns))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default()
            }
        };
        Ok((first, rx, i.rv))
    }

    fn commit(
        &self,
        i: &mut Inner,
        gr: &str,
        etype: &'static str,
        mut obj: Value,
        prev: Option<Arc<Value>>,
    ) -> Arc<Value> {
        i.rv += 1;
        let rv = i.rv;
        let ns = meta_str(&obj, "namespace").to_string();
        let name = meta_str(&obj, "name").to_string();
        let uid = meta_str(&obj, "uid").to_string();
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let obj = Arc::new(obj);
        let key = (ns.clone(), name);
        let map = i.objects.entry(gr.to_string()).or_default();
        let stored = if etype == "DELETED" {
            i.uids.remove(&uid);
            map.remove(&key)
        } else {
            i.uids.insert(uid, (gr.to_string(), key.clone()));
            map.insert(key.clone(), obj.clone())
        };
        let now = (etype != "DELETED").then_some(&obj);
        Self::index_owners(i, gr, &key, stored.as_deref(), now.map(|o| &**o));
        let ev = Arc::new(WatchEvent {
            rv,
            gr: gr.to_string(),
            ns,
            etype,
            line: event_line(etype, &obj),
            obj: obj.clone(),
            prev,
        });
        let log = i.logs.entry(gr.to_string()).or_default();
        log.events.push_back(ev.clone());
        while log.events.len() > self.window {
            if let Some(old) = log.events.pop_front() {
                log.compacted = old.rv;
            }
        }
        let _ = self.tx.send(ev);
        obj
    }

    fn type_for_gr(i: &Inner, gr: &str) -> Option<Arc<ResType>> {
        i.types
            .values()
            .find(|t| t.gr() == gr && t.version == t.storage_version)
            .cloned()
    }

    /// Validation, pruning and defaulting shared by all writes.
    /// `old` is the stored object (in `rt`'s shape) on an update.
    fn admit(
        &self,
        rt: &ResType,
        obj: &mut Value,
        old: Option<&Value>,
        strict: bool,
        warnings: &mut Vec<String>,
    ) -> Result<(), Error> {
        let name = meta_str(obj, "name").to_string();
        if let (true, Some(schema)) = (rt.crd, rt.schema.as_ref()) {
            let mut unknown = Vec::new();
            prune_and_default(schema, obj, "", &mut unknown);
            unknown.retain(|u| u != "metadata" && u != "apiVersion" && u != "kind");
            if !unknown.is_empty() {
                if strict {
                    let list: Vec<String> = unknown
                        .iter()
                        .map(|u| format!("unknown field \"{u}\""))
                        .collect();
                    return Err(Error::bad_request(format!(
                        "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                        rt.kind,
                        rt.api_version(),
                        rt.kind,
                        list.join(", ")
                    )));
                }
                warnings.extend(unknown.iter().map(|u| format!("unknown field \"{u}\"")));
            }
            let mut causes = Vec::new();
            validate_update(schema, obj, old, "", &self.pats, &mut causes);
            self.check_rules(schema, obj, old, &mut causes, warnings);
            if !causes.is_empty() {
                return Err(Error::invalid(&rt.group, &rt.kind, &name, causes));
            }
        }
        if !rt.crd
            && let Some(decoded) = crate::typed::decode(&rt.group, &rt.kind, obj)
        {
            match decoded {
                Ok(kept) => {
                    let mut unknown = Vec::new();
                    crate::typed::unknown_fields(obj, &kept, "", &mut unknown);
                    if !unknown.is_empty() {
                        let list: Vec<String> = unknown
                            .iter()
                            .map(|u| format!("unknown field \"{u}\""))
                            .collect();
                        if strict {
                            return Err(Error::bad_request(format!(
                                "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                                rt.kind,
                                rt.version,
                                rt.kind,
                                list.join(", ")
                            )));
                        }
                        crate::typed::remove_fields(obj, &unknown);
                        warnings.extend(list);
                    }
                }
                Err(e) if !e.to_string().starts_with("missing field") => {
                    return Err(Error::bad_request(format!(
                        "{} in version \"{}\" cannot be handled as a {}: {e}",
                        rt.kind, rt.version, rt.kind
                    )));
                }
                Err(_) => {}
            }
        }
        let mut causes = crate::admission_policy::check_object(rt, obj);
        events::validate(rt, obj, old, &mut causes);
        // DaemonSet, NetworkPolicy, PriorityClass: defaults, then their validations
        if !rt.crd {
            crate::kinds::default(&rt.group, &rt.kind, obj);
            crate::kinds::validate(&rt.group, &rt.kind, obj, &mut causes);
        }
        match rt.kind.as_str() {
            "Pod"
                if obj
                    .pointer("/spec/containers")
                    .and_then(Value::as_array)
                    .is_none_or(|c| c.is_empty()) =>
            {
                causes.push(("spec.containers".into(), "Required value".into()));
            }
            "Deployment" if obj.pointer("/spec/selector").is_none() => {
                causes.push(("spec.selector".into(), "Required value".into()));
            }
            "Lease" => {
                if let Some(d) = obj
                    .pointer("/spec/leaseDurationSeconds")
                    .and_then(Value::as_i64)
                    && d <= 0
                {
                    causes.push((
                        "spec.leaseDurationSeconds".into(),
                        format!("Invalid value: {d}: must be greater than 0"),
                    ));
                }
            }
            "CustomResourceDefinition" => {
                if !self.crd_field_selectors {
                    drop_selectable_fields(obj, old);
                }
                from_crd(obj)?;
                warnings.extend(crate::crd_validation::rule_warnings(obj));
            }
            _ => {}
        }
        for (k, key) in [
            ("labels", "metadata.labels"),
            ("annotations", "metadata.annotations"),
        ] {
            if let Some(m) = meta(obj, k) {
                match m.as_object() {
                    Some(m) if m.values().all(Value::is_string) => {}
                    _ => {
                        causes.push((key.into(), "Invalid value: must be a map of strings".into()))
                    }
                }
            }
        }
        if let Some(labels) = meta(obj, "labels").and_then(Value::as_object) {
            for (k, v) in labels {
                for m in names::qualified_name(k) {
                    causes.push((
                        "metadata.labels".into(),
                        format!("Invalid value: \"{k}\": {m}"),
                    ));
                }
                let v = v.as_str().unwrap_or("");
                if !(v.is_empty() || label_part(v)) {
                    causes.push((
                        "metadata.labels".into(),
                        format!("Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
                    ));
                }
            }
        }
        if let Some(ann) = meta(obj, "annotations").and_then(Value::as_object) {
            let total: usize = ann
                .iter()
                .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                .sum();
            if total > 256 * 1024 {
                causes.push((
                    "metadata.annotations".into(),
                    format!("Too long: must have at most 262144 bytes, got {total}"),
                ));
            }
        }
        if !causes.is_empty() {
            return Err(Error::invalid(&rt.group, &rt.kind, &name, causes));
        }
        let size = serde_json::to_vec(obj).map(|b| b.len()).unwrap_or(0);
        if size > MAX_OBJECT_BYTES {
            return Err(Error::api(
                413,
                "RequestEntityTooLarge",
                format!("Request entity too large: limit is {MAX_OBJECT_BYTES}"),
            ));
        }
        Ok(())
    }

    /// A custom resource's validation rules (`crd_rules`), unless the schema validation found
    /// an error that blocks them (kubernetes/apiextensions-apiserver
    /// `pkg/registry/customresource/strategy.go` `hasBlockingErr`: a type, required, enum or
    /// length error).
    fn check_rules(
        &self,
        schema: &Value,
        obj: &Value,
        old: Option<&Value>,
        causes: &mut Vec<(String, String)>,
        warnings: &mut Vec<String>,
    ) {
        if !crate::crd_rules::has_rules(schema) {
            return;
        }
        let blocking = causes.iter().any(|(_, m)| {
            [
                "Required value",
                "Unsupported value",
                "Too long",
                "Too many",
            ]
            .iter()
            .any(|p| m.starts_with(p))
                || m.contains(" in body must be of type ")
        });
        if blocking {
            causes.push((
                "<nil>".into(),
                "Invalid value: \"null\": some validation rules were not checked because the \
                 object was invalid; correct the existing errors to complete validation"
                    .into(),
            ));
        } else {
            self.rules.validate(schema, obj, old, causes, warnings);
        }
    }

    /// NamespaceLifecycle: the namespace must exist and not be terminating.
    fn check_namespace(i: &Inner, rt: &ResType, ns: &str, name: &str) -> Result<(), Error> {
        if !rt.namespaced {
            return Ok(());
        }
        match i
            .objects
            .get("namespaces")
            .and_then(|m| m.get(&(String::new(), ns.to_string())))
        {
            None => Err(Error::not_found("", "namespaces", ns)),
            Some(n) if meta(n, "deletionTimestamp").is_some() => {
                Err(crate::admission::terminating(rt, name, ns))
            }
            Some(_) => Ok(()),
        }
    }

    /// The type meta of a create or update body (see [`typemeta::check`]).
    fn check_type_meta_in(i: &Inner, rt: &ResType, obj: &Value) -> Result<(), Error> {
        typemeta::check(rt, obj, |g, v, k| {
            i.types
                .values()
                .any(|t| !t.crd && t.group == g && t.version == v && t.kind == k)
        })
    }

    pub(crate) fn create(
        &self,
        rt: &ResType,
        ns: &str,
        obj: Value,
        o: &WriteOpts,
    ) -> Result<Written, Error> {
        let mut i = self.inner.lock();
        if rt.crd && Self::crd_terminating(&i, rt) {
            // kubernetes/apiextensions-apiserver pkg/apiserver/customresource_handler.go
            // `serveResource` (v0.31–v0.33; from v0.34 a 403 that an apply that creates gets too)
            return Err(Error::Api {
                code: 405,
                reason: "MethodNotAllowed",
                message: "create not allowed while custom resource definition is terminating"
                    .into(),
                details: Some(json!({"group": rt.group, "kind": rt.plural})),
            });
        }
        self.create_locked(&mut i, rt, ns, obj, o, Owners::Record)
    }

    fn create_locked(
        &self,
        i: &mut Inner,
        rt: &ResType,
        ns: &str,
        mut obj: Value,
        o: &WriteOpts,
        owners: Owners,
    ) -> Result<Written, Error> {
        if !obj.is_object() {
            return Err(Error::bad_request(
                "the body of the request was in an unknown format",
            ));
        }
        Self::check_type_meta_in(i, rt, &obj)?;
        obj["apiVersion"] = json!(if rt.group.is_empty() {
            rt.storage_version.clone()
        } else {
            format!("{}/{}", rt.group, rt.storage_version)
        });
        obj["kind"] = json!(rt.kind);
        let body_ns = meta_str(&obj, "namespace").to_string();
        if rt.namespaced && !body_ns.is_empty() && body_ns != ns {
            return Err(Error::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let mut name = meta_str(&obj, "name").to_string();
        Self::check_namespace(i, rt, ns, &name)?;
        let generate = meta_str(&obj, "generateName").to_string();
        if name.is_empty() && !generate.is_empty() {
            const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            let suffix: String = (0..5)
                .map(|_| ALPHA[(self.random() % ALPHA.len() as u64) as usize] as char)
                .collect();
            name = format!("{generate}{suffix}");
        }
        let uid = self.uid();
        {
            let m = meta_mut(&mut obj);
            for k in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "selfLink",
            ] {
                m.remove(k);
            }
            if owners == Owners::Record {
                m.remove("managedFields");
            }
            m.insert("name".into(), json!(name));
            if rt.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(now()));
        }
        if rt.has_generation() {
            meta_mut(&mut obj).insert("generation".into(), json!(1));
        }
        if name.is_empty() {
            return Err(Error::invalid(
                &rt.group,
                &rt.kind,
                "",
                vec![(
                    "metadata.name".into(),
                    "Required value: name or generateName is required".into(),
                )],
            ));
        }
        let name_errors = names::object_name(&rt.kind, &name);
        if !name_errors.is_empty() {
            return Err(Error::invalid(
                &rt.group,
                &rt.kind,
                &name,
                name_errors
                    .into_iter()
                    .map(|m| {
                        (
                            "metadata.name".into(),
                            format!("Invalid value: \"{name}\": {m}"),
                        )
                    })
                    .collect(),
            ));
        }
        let gr = rt.storage_gr();
        if i.objects.get(&gr).is_some_and(|m| {
            m.contains_key(&(
                if rt.namespaced {
                    ns.to_string()
                } else {
                    String::new()
                },
                name.clone(),
            ))
        }) {
            return Err(Error::already_exists(&rt.group, &rt.plural, &name));
        }
        if rt.status
            && rt.kind != "Node"
            && rt.kind != "Namespace"
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        if rt.kind == "Pod" {
            obj["status"] = json!({"phase": "Pending"});
        }
        if rt.kind == "Namespace" && obj.get("status").is_none() {
            obj["status"] = json!({"phase": "Active"});
        }
        let mut warnings = Vec::new();
        self.admit(rt, &mut obj, None, o.strict, &mut warnings)?;
        if let Some(a) = &o.admission {
            let name = meta_str(&obj, "name").to_string();
            warnings.extend(a.check("CREATE", rt, "", ns, &name, Some(&obj), None, o.dry_run)?);
        }
        let t = now();
        let av = rt.api_version();
        let w = Writer {
            manager: &o.manager,
            subresource: "",
            api_version: &av,
            time: &t,
            schema: rt.schema.as_ref(),
            strip_status: rt.status,
        };
        if owners == Owners::Record {
            w.record_update(None, &mut obj);
        }
        if o.dry_run {
            return Ok(Written {
                obj: Arc::new(obj),
                warnings,
                code: 201,
            });
        }
        let stored = self.commit(i, &gr, "ADDED", Self::to_storage(rt, obj), None);
        if gr == CRD_GR {
            self.crd_changed(i, &stored)?;
        }
        let stored = i
            .objects
            .get(&gr)
            .and_then(|m| m.get(&(meta_str(&stored, "namespace").to_string(), name.clone())))
            .cloned()
            .unwrap_or(stored);
        Ok(Written {
            obj: Self::present(rt, &stored),
            warnings,
            code: 201,
        })
    }

    /// Registers the kinds of a CRD and marks it Established (a separate write, as the real
    /// server's controllers do).
    fn crd_changed(&self, i: &mut Inner, crd: &Arc<Value>) -> Result<(), Error> {
        let types = from_crd(crd)?;
        let group = crd
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let plural = crd
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        i.types
            .retain(|(g, _, p), _| !(g == &group && p == &plural));
        for t in types {
            i.types.insert(
                (t.group.clone(), t.version.clone(), t.plural.clone()),
                Arc::new(t),
            );
        }
        i.discovery_gen += 1;
        let established = crd
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
            });
        if !established {
            let mut next = (**crd).clone();
            let t = now();
            let storage: Vec<Value> = crd
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .map(|vs| {
                    vs.iter()
                        .filter(|v| v["storage"] == json!(true))
                        .map(|v| v["name"].clone())
                        .collect()
                })
                .unwrap_or_default();
            let mut accepted = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
            if accepted.get("listKind").is_none() {
                accepted["listKind"] =
                    json!(format!("{}List", accepted["kind"].as_str().unwrap_or("")));
            }
            if accepted.get("singular").is_none() {
                accepted["singular"] =
                    json!(accepted["kind"].as_str().unwrap_or("").to_lowercase());
            }
            next["status"] = json!({
                "acceptedNames": accepted,
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": t},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": t},
                ],
                "storedVersions": storage,
            });
            self.commit(i, CRD_GR, "MODIFIED", next, Some(crd.clone()));
        }
        Ok(())
    }

    pub(crate) fn update(
        &self,
        rt: &ResType,
        ns: &str,
        name: &str,
        body: Value,
        o: &WriteOpts,
    ) -> Result<Written, Error> {
        let mut i = self.inner.lock();
        let old = Self::lookup(&i, rt, ns, name)?;
        if !body.is_object() {
            return Err(Error::bad_request(
                "the body of the request was in an unknown format",
            ));
        }
        let body_rv = meta_str(&body, "resourceVersion").to_string();
        if body_rv.is_empty() && rt.crd {
            return Err(Error::invalid(
                &rt.group,
                &rt.kind,
                name,
                vec![(
                    "metadata.resourceVersion".into(),
                    "Invalid value: 0x0: must be specified for an update".into(),
                )],
            ));
        }
        // A PUT's body uid is a precondition (kubernetes/apiserver pkg/registry/rest/update.go,
        // `defaultUpdatedObjectInfo.Preconditions`): a 409 before anything else.
        let body_uid = meta_str(&body, "uid");
        if !body_uid.is_empty() && body_uid != meta_str(&old, "uid") {
            return Err(Error::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {body_uid}, UID in object meta: {}",
                    meta_str(&old, "uid")
                ),
            ));
        }
        self.update_locked(&mut i, rt, &old, body, &body_rv, o, Owners::Record)
    }

    /// A patch or an apply naming another uid than the object's changes an immutable field:
    /// 422 (kubernetes/apiserver pkg/registry/rest/update.go `BeforeUpdate`, which validates
    /// the object meta update: `ValidateImmutableField` of `metadata.uid`).
    fn uid_unchanged(rt: &ResType, old: &Value, uid: &str) -> Result<(), Error> {
        if uid.is_empty() || uid == meta_str(old, "uid") {
            return Ok(());
        }
        Err(Error::invalid(
            &rt.group,
            &rt.kind,
            meta_str(old, "name"),
            vec![(
                "metadata.uid".into(),
                format!("Invalid value: \"{uid}\": field is immutable"),
            )],
        ))
    }

    fn lookup(i: &Inner, rt: &ResType, ns: &str, name: &str) -> Result<Arc<Value>, Error> {
        i.objects
            .get(&rt.storage_gr())
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
            .ok_or_else(|| Error::not_found(&rt.group, &rt.plural, name))
    }

    #[allow(clippy::too_many_arguments)]
    fn update_locked(
        &self,
        i: &mut Inner,
        rt: &ResType,
        old: &Arc<Value>,
        mut new: Value,
        expect_rv: &str,
        o: &WriteOpts,
        owners: Owners,
    ) -> Result<Written, Error> {
        let stored_old = old;
        let old = &Self::present(rt, stored_old);
        let name = meta_str(old, "name").to_string();
        Self::check_type_meta_in(i, rt, &new)?;
        if !expect_rv.is_empty() && expect_rv != meta_str(old, "resourceVersion") {
            return Err(Error::stale(&rt.group, &rt.plural, &name));
        }
        let body_name = meta_str(&new, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(Error::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        Self::uid_unchanged(rt, old, meta_str(&new, "uid"))?;
        new["apiVersion"] = old["apiVersion"].clone();
        new["kind"] = json!(rt.kind);
        if o.subresource == "status" {
            let status = new.get("status").cloned();
            let managed = meta(&new, "managedFields").cloned();
            new = (**old).clone();
            match status {
                Some(s) => new["status"] = s,
                None => {
                    new.as_object_mut().expect("object").remove("status");
                }
            }
            if owners == Owners::Precomputed {
                match managed {
                    Some(m) => {
                        meta_mut(&mut new).insert("managedFields".into(), m);
                    }
                    None => {
                        meta_mut(&mut new).remove("managedFields");
                    }
                }
            }
        } else if rt.status {
            match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    new.as_object_mut().expect("object").remove("status");
                }
            }
        }
        {
            let om = old["metadata"].as_object().cloned().unwrap_or_default();
            let m = meta_mut(&mut new);
            for k in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "resourceVersion",
            ] {
                match om.get(k) {
                    Some(v) => m.insert(k.into(), v.clone()),
                    None => m.remove(k),
                };
            }
            if owners == Owners::Record {
                match om.get("managedFields") {
                    Some(v) => m.insert("managedFields".into(), v.clone()),
                    None => m.remove("managedFields"),
                };
            }
        }
        let terminating = meta(old, "deletionTimestamp").is_some();
        if terminating {
            let oldf = finalizers(old);
            if let Some(f) = finalizers(&new).iter().find(|f| !oldf.contains(f)) {
                return Err(Error::invalid(
                    &rt.group,
                    &rt.kind,
                    &name,
                    vec![(
                        "metadata.finalizers".into(),
                        format!(
                            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{\"{f}\"}}"
                        ),
                    )],
                ));
            }
        }
        if !rt.crd {
            let mut causes = Vec::new();
            crate::kinds::validate_update(&rt.group, &rt.kind, old, &new, &mut causes);
            if !causes.is_empty() {
                return Err(Error::invalid(&rt.group, &rt.kind, &name, causes));
            }
        }
        let mut warnings = Vec::new();
        self.admit(rt, &mut new, Some(old.as_ref()), o.strict, &mut warnings)?;
        if let Some(a) = &o.admission {
            let ns = meta_str(old, "namespace");
            let (sub, dry) = (o.subresource.as_str(), o.dry_run);
            warnings.extend(a.check("UPDATE", rt, sub, ns, &name, Some(&new), Some(old), dry)?);
        }
        let t = now();
        let av = rt.api_version();
        let w = Writer {
            manager: &o.manager,
            subresource: &o.subresource,
            api_version: &av,
            time: &t,
            schema: rt.schema.as_ref(),
            strip_status: rt.status,
        };
        if owners == Owners::Record {
            w.record_update(Some(old), &mut new);
        }
        if rt.has_generation() && spec_part(old, rt.status) != spec_part(&new, rt.status) {
            let g = meta(old, "generation").and_then(Value::as_i64).unwrap_or(0) + 1;
            meta_mut(&mut new).insert("generation".into(), json!(g));
        }
        if without_managed(&new) == without_managed(old) {
            return Ok(Written {
                obj: Self::present(rt, old),
                warnings,
                code: 200,
            });
        }
        if o.dry_run {
            return Ok(Written {
                obj: Arc::new(new),
                warnings,
                code: 200,
            });
        }
        let gr = rt.storage_gr();
        if terminating && finalizers(&new).is_empty() {
            // `deleteWithoutFinalizers` (kubernetes/apiserver
            // pkg/registry/generic/registry/store.go): the stored object is deleted, so the
            // DELETED event carries its last stored state (finalizers still listed); the
            // answer is the request's object at the version it was read at.
            let gone = self.commit(
                i,
                &gr,
                "DELETED",
                (**stored_old).clone(),
                Some(stored_old.clone()),
            );
            if gr == CRD_GR {
                Self::crd_gone(i, &gone);
            }
            self.after_delete(i, &gone);
            let rv = meta_str(old, "resourceVersion").to_string();
            meta_mut(&mut new).insert("resourceVersion".into(), json!(rv));
            return Ok(Written {
                obj: Self::present(rt, &Arc::new(new)),
                warnings,
                code: 200,
            });
        }
        let stored = self.commit(
            i,
            &gr,
            "MODIFIED",
            Self::to_storage(rt, new),
            Some(stored_old.clone()),
        );
        if gr == CRD_GR {
            self.crd_changed(i, &stored)?;
        }
        Ok(Written {
            obj: Self::present(rt, &stored),
            warnings,
            code: 200,
        })
    }

    /// PATCH with a merge, JSON or strategic patch, or a server-side apply.
    pub(crate) fn patch(
        &self,
        rt: &ResType,
        ns: &str,
        name: &str,
        ptype: &str,
        body: &Value,
        o: &WriteOpts,
    ) -> Result<Written, Error> {
        let mut i = self.inner.lock();
        if ptype == "apply" {
            return self.apply_locked(&mut i, rt, ns, name, body, o);
        }
        let old = Self::lookup(&i, rt, ns, name)?;
        let mut new = (*Self::present(rt, &old)).clone();
        match ptype {
            "merge" => crate::patch::merge_patch(&mut new, body),
            "json" => crate::patch::json_patch(&mut new, body)?,
            _ => {
                if rt.crd {
                    return Err(Error::unsupported_media_type(&crate::media::CR_PATCH_TYPES));
                }
                crate::patch::strategic_merge(&mut new, body)
            }
        }
        let rv = meta_str(&new, "resourceVersion").to_string();
        self.update_locked(&mut i, rt, &old, new, &rv, o, Owners::Record)
    }

    fn apply_locked(
        &self,
        i: &mut Inner,
        rt: &ResType,
        ns: &str,
        name: &str,
        config: &Value,
        o: &WriteOpts,
    ) -> Result<Written, Error> {
        if o.manager.is_empty() {
            return Err(Error::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                vec![(
                    "fieldManager".into(),
                    "Required value: is required for apply patch".into(),
                )],
            ));
        }
        if !config.is_object() || config.get("apiVersion").is_none() || config.get("kind").is_none()
        {
            return Err(Error::bad_request(
                "apiVersion and kind must be set in an apply configuration",
            ));
        }
        typemeta::check_version(rt, config)?;
        let cname = meta_str(config, "name");
        if !cname.is_empty() && cname != name {
            return Err(Error::bad_request(format!(
                "the name of the object ({cname}) does not match the name on the URL ({name})"
            )));
        }
        let mut config = config.clone();
        if let Some(schema) = rt.schema.as_ref() {
            let mut unknown = Vec::new();
            crate::schema::prune(schema, &mut config, &mut unknown);
            unknown.retain(|u| u != "metadata" && u != "apiVersion" && u != "kind");
            if o.strict && !unknown.is_empty() {
                let list: Vec<String> = unknown
                    .iter()
                    .map(|u| format!("unknown field \"{u}\""))
                    .collect();
                return Err(Error::bad_request(format!(
                    "{}: strict decoding error: {}",
                    rt.kind,
                    list.join(", ")
                )));
            }
        }
        let t = now();
        let av = rt.api_version();
        let w = Writer {
            manager: &o.manager,
            subresource: &o.subresource,
            api_version: &av,
            time: &t,
            schema: rt.schema.as_ref(),
            strip_status: rt.status,
        };
        let existing = Self::lookup(i, rt, ns, name).ok();
        let conflict_err = |conflicts: Vec<(String, String)>| {
            let n = conflicts.len();
            let lines: Vec<String> = conflicts
                .iter()
                .map(|(m, f)| format!("conflict with \"{m}\" using {av}: {f}"))
                .collect();
            Error::Api {
                code: 409,
                reason: "Conflict",
                message: if n == 1 {
                    format!("Apply failed with 1 conflict: {}", lines[0])
                } else {
                    format!("Apply failed with {n} conflicts: {}", lines.join("\n"))
                },
                details: Some(json!({
                    "name": name, "kind": rt.plural, "group": rt.group,
                    "causes": conflicts.iter().map(|(m, f)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\" using {av}"), "field": f})).collect::<Vec<_>>(),
                })),
            }
        };
        match existing {
            None => {
                if o.subresource == "status" {
                    return Err(Error::not_found(&rt.group, &rt.plural, name));
                }
                // An apply that would create is refused when it names a uid
                // (kubernetes/apiserver pkg/endpoints/handlers/patch.go `applyPatch`); its
                // resourceVersion is not compared: the create-on-update path wipes it
                // (pkg/registry/generic/registry/store.go `Update`).
                let uid = meta_str(&config, "uid");
                if !uid.is_empty() {
                    return Err(Error::conflict(
                        &rt.group,
                        &rt.plural,
                        name,
                        &format!(
                            "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
                        ),
                    ));
                }
                let mut live = json!({"apiVersion": config["apiVersion"], "kind": rt.kind, "metadata": {"name": name}});
                if rt.namespaced {
                    live["metadata"]["namespace"] = json!(ns);
                }
                let merged = w.apply(&live, &config, o.force).map_err(conflict_err)?;
                let mut res = self.create_locked(i, rt, ns, merged, o, Owners::Precomputed)?;
                res.code = 201;
                Ok(res)
            }
            Some(old) => {
                let expect = meta_str(&config, "resourceVersion").to_string();
                if !expect.is_empty() && expect != meta_str(&old, "resourceVersion") {
                    return Err(Error::stale(&rt.group, &rt.plural, name));
                }
                let view = Self::present(rt, &old);
                let merged = w.apply(&view, &config, o.force).map_err(conflict_err)?;
                Self::uid_unchanged(rt, &old, meta_str(&config, "uid"))?;
                self.update_locked(i, rt, &old, merged, "", o, Owners::Precomputed)
            }
        }
    }

    pub(crate) fn delete(
        &self,
        rt: &ResType,
        ns: &str,
        name: &str,
        d: &DeleteOpts,
    ) -> Result<Written, Error> {
        let mut i = self.inner.lock();
        let old = Self::lookup(&i, rt, ns, name)?;
        self.delete_locked(&mut i, rt, &old, d)
    }

    fn delete_locked(
        &self,
        i: &mut Inner,
        rt: &ResType,
        old: &Arc<Value>,
        d: &DeleteOpts,
    ) -> Result<Written, Error> {
        let name = meta_str(old, "name").to_string();
        if let Some(uid) = d.uid.as_deref()
            && uid != meta_str(old, "uid")
        {
            return Err(Error::conflict(
                &rt.group,
                &rt.plural,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(old, "uid")
                ),
            ));
        }
        if let Some(rv) = d.rv.as_deref()
            && rv != meta_str(old, "resourceVersion")
        {
            return Err(Error::conflict(
                &rt.group,
                &rt.plural,
                &name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(old, "resourceVersion")
                ),
            ));
        }
        let mut warnings: Vec<String> = Vec::new();
        if let Some(a) = &d.admission {
            let ns = meta_str(old, "namespace");
            warnings = a.check("DELETE", rt, "", ns, &name, None, Some(old), d.dry_run)?;
        }
        if d.dry_run {
            return Ok(Written {
                obj: Self::present(rt, old),
                warnings,
                code: 200,
            });
        }
        let gr = rt.storage_gr();
        if rt.kind == "Pod" && rt.group.is_empty() {
            // Graceful deletion: a pod bound to a node and not terminal stays, terminating,
            // until its kubelet deletes it with grace 0.
            let bound = old
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            let terminal = matches!(
                old.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            );
            let grace = d.grace.unwrap_or_else(|| {
                old.pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(30)
            });
            if bound && !terminal && grace > 0 {
                if meta(old, "deletionTimestamp").is_some() {
                    return Ok(Written {
                        obj: Self::present(rt, old),
                        warnings: warnings.clone(),
                        code: 200,
                    });
                }
                let at = jiff::Timestamp::now()
                    .checked_add(jiff::SignedDuration::from_secs(grace))
                    .unwrap_or_else(|_| jiff::Timestamp::now());
                let mut next = (**old).clone();
                let m = meta_mut(&mut next);
                m.insert(
                    "deletionTimestamp".into(),
                    json!(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
                );
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                let stored = self.commit(i, &gr, "MODIFIED", next, Some(old.clone()));
                return Ok(Written {
                    obj: Self::present(rt, &stored),
                    warnings: warnings.clone(),
                    code: 200,
                });
            }
        }
        let policy = d.propagation.as_deref().unwrap_or("Background");
        if policy == "Orphan" {
            self.orphan_dependents(i, meta_str(old, "uid"));
        }
        if policy == "Foreground" {
            self.delete_dependents(i, meta_str(old, "uid"));
        }
        if gr == CRD_GR && d.crd_finalizer {
            return Ok(self.mark_crd_deleting(i, rt, old, warnings));
        }
        if !finalizers(old).is_empty() {
            // 200 with the object: 202 only for `orphanDependents: false`
            // (kubernetes/apiserver pkg/endpoints/handlers/delete.go `DeleteResource`)
            let code = if d.orphan_dependents == Some(false) {
                202
            } else {
                200
            };
            if meta(old, "deletionTimestamp").is_some() {
                return Ok(Written {
                    obj: Self::present(rt, old),
                    warnings: warnings.clone(),
                    code,
                });
            }
            let next = Self::marked_deleting(old);
            let stored = self.commit(i, &gr, "MODIFIED", next, Some(old.clone()));
            return Ok(Written {
                obj: Self::present(rt, &stored),
                warnings: warnings.clone(),
                code,
            });
        }
        if rt.kind == "Namespace" && rt.group.is_empty() {
            // Like the real namespace lifecycle: Terminating now, content removed later by
            // `finalize_namespace` (the namespace controller's job).
            if meta(old, "deletionTimestamp").is_some() {
                return Ok(Written {
                    obj: Self::present(rt, old),
                    warnings: warnings.clone(),
                    code: 200,
                });
            }
            let mut next = (**old).clone();
            meta_mut(&mut next).insert("deletionTimestamp".into(), json!(now()));
            next["status"] = json!({"phase": "Terminating"});
            let stored = self.commit(i, &gr, "MODIFIED", next, Some(old.clone()));
            return Ok(Written {
                obj: Self::present(rt, &stored),
                warnings: warnings.clone(),
                code: 200,
            });
        }
        if gr == CRD_GR {
            let cr_gr = crd_resource(old);
            let victims: Vec<Arc<Value>> = i
                .objects
                .get(&cr_gr)
                .map(|m| m.values().cloned().collect())
                .unwrap_or_default();
            for o in victims {
                self.commit(i, &cr_gr, "DELETED", (*o).clone(), Some(o.clone()));
            }
            Self::crd_gone(i, old);
        }
        let gone = self.commit(i, &gr, "DELETED", (**old).clone(), Some(old.clone()));
        self.after_delete(i, &gone);
        Ok(Written {
            obj: Self::present(rt, &gone),
            warnings: warnings.clone(),
            code: 200,
        })
    }

    /// The object with `deletionTimestamp` set, as `markAsDeleting` does
    /// (kubernetes/apiserver pkg/registry/generic/registry/store.go): the generation is
    /// bumped when the timestamp is first set.
    fn marked_deleting(old: &Value) -> Value {
        let mut next = old.clone();
        let generation = meta(old, "generation").and_then(Value::as_i64).unwrap_or(0);
        let m = meta_mut(&mut next);
        if generation > 0 && !m.contains_key("deletionTimestamp") {
            m.insert("generation".into(), json!(generation + 1));
        }
        m.entry("deletionTimestamp").or_insert_with(|| json!(now()));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
        next
    }

    /// The first delete of a CRD: Terminating, with the cleanup finalizer, until its objects
    /// are gone (kubernetes/apiextensions-apiserver pkg/registry/customresourcedefinition/etcd.go
    /// `REST.Delete`). A later delete answers the object as it is.
    fn mark_crd_deleting(
        &self,
        i: &mut Inner,
        rt: &ResType,
        old: &Arc<Value>,
        warnings: Vec<String>,
    ) -> Written {
        if meta(old, "deletionTimestamp").is_some() {
            return Written {
                obj: Self::present(rt, old),
                warnings,
                code: 200,
            };
        }
        let mut next = (**old).clone();
        let m = meta_mut(&mut next);
        m.insert("deletionTimestamp".into(), json!(now()));
        let list = m.entry("finalizers").or_insert_with(|| json!([]));
        if let Some(list) = list.as_array_mut()
            && !list.iter().any(|f| f == CRD_CLEANUP_FINALIZER)
        {
            list.push(json!(CRD_CLEANUP_FINALIZER));
        }
        set_condition(
            &mut next,
            "Terminating",
            "True",
            "InstanceDeletionPending",
            "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
        );
        let stored = self.commit(i, CRD_GR, "MODIFIED", next, Some(old.clone()));
        Written {
            obj: Self::present(rt, &stored),
            warnings,
            code: 200,
        }
    }

    /// The kinds of a CRD that is gone leave discovery.
    fn crd_gone(i: &mut Inner, crd: &Value) {
        let gr = crd_resource(crd);
        i.types.retain(|_, t| t.gr() != gr);
        i.discovery_gen += 1;
    }

    /// The CRD of a custom resource type is being deleted: its `Terminating` condition is
    /// True (kubernetes/apiextensions-apiserver pkg/apiserver/customresource_handler.go
    /// `ServeHTTP`).
    fn crd_terminating(i: &Inner, rt: &ResType) -> bool {
        i.objects
            .get(CRD_GR)
            .and_then(|m| m.get(&(String::new(), rt.gr())))
            .and_then(|c| c.pointer("/status/conditions"))
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Terminating" && c["status"] == "True")
            })
    }

    /// One round of the CRD finalizer controller for a CRD being deleted
    /// (kubernetes/apiextensions-apiserver pkg/controller/finalizer/crd_finalizer.go `sync`):
    /// every object of the CRD is deleted (its finalizers honoured); once none is left the
    /// cleanup finalizer comes off and the CRD goes. Returns whether the CRD is done (gone, or
    /// no longer being deleted).
    pub(crate) fn crd_cleanup_step(&self, name: &str) -> bool {
        let mut i = self.inner.lock();
        let Some(crd) = i
            .objects
            .get(CRD_GR)
            .and_then(|m| m.get(&(String::new(), name.to_string())))
            .cloned()
        else {
            return true;
        };
        let cleaning = finalizers(&crd).iter().any(|f| f == CRD_CLEANUP_FINALIZER);
        if meta(&crd, "deletionTimestamp").is_none() || !cleaning {
            return true;
        }
        let cr_gr = crd_resource(&crd);
        let left: Vec<Arc<Value>> = i
            .objects
            .get(&cr_gr)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        let mut next = (*crd).clone();
        if let Some(crt) = Self::type_for_gr(&i, &cr_gr).filter(|_| !left.is_empty()) {
            let (reason, message) = (
                "InstanceDeletionInProgress",
                "CustomResource deletion is in progress",
            );
            set_condition(&mut next, "Terminating", "True", reason, message);
            if next != *crd {
                self.commit(&mut i, CRD_GR, "MODIFIED", next, Some(crd.clone()));
            }
            for obj in left {
                let _ = self.delete_locked(&mut i, &crt, &obj, &DeleteOpts::default());
            }
            return false;
        }
        let (reason, message) = ("InstanceDeletionCompleted", "removed all instances");
        set_condition(&mut next, "Terminating", "False", reason, message);
        if let Some(list) = meta_mut(&mut next)
            .get_mut("finalizers")
            .and_then(Value::as_array_mut)
        {
            list.retain(|f| f != CRD_CLEANUP_FINALIZER);
        }
        if !finalizers(&next).is_empty() {
            self.commit(&mut i, CRD_GR, "MODIFIED", next, Some(crd.clone()));
            return true;
        }
        let gone = self.commit(&mut i, CRD_GR, "DELETED", (*crd).clone(), Some(crd.clone()));
        Self::crd_gone(&mut i, &gone);
        self.after_delete(&mut i, &gone);
        true
    }

    /// What a kubelet does once a pod it runs is terminating: delete it with grace 0.
    pub(crate) fn kubelet_delete(&self, rt: &ResType, ns: &str, name: &str, uid: &str) {
        let mut i = self.inner.lock();
        if let Ok(cur) = Self::lookup(&i, rt, ns, name)
            && meta_str(&cur, "uid") == uid
            && meta(&cur, "deletionTimestamp").is_some()
        {
            let d = DeleteOpts {
                admission: None,
                uid: Some(uid.to_string()),
                grace: Some(0),
                ..DeleteOpts::default()
            };
            let _ = self.delete_locked(&mut i, rt, &cur, &d);
        }
    }

    /// Removes everything in a terminating namespace, then the namespace.
    pub(crate) fn finalize_namespace(&self, ns: &str) {
        let mut i = self.inner.lock();
        let victims: Vec<(String, Arc<Value>)> = i
            .objects
            .iter()
            .flat_map(|(g, m)| {
                m.iter()
                    .filter(|((n, _), _)| n == ns)
                    .map(move |(_, o)| (g.clone(), o.clone()))
            })
            .collect();
        for (g, o) in victims {
            let gone = self.commit(&mut i, &g, "DELETED", (*o).clone(), Some(o.clone()));
            self.after_delete(&mut i, &gone);
        }
        let key = (String::new(), ns.to_string());
        if let Some(n) = i
            .objects
            .get("namespaces")
            .and_then(|m| m.get(&key))
            .cloned()
        {
            let gone = self.commit(
                &mut i,
                "namespaces",
                "DELETED",
                (*n).clone(),
                Some(n.clone()),
            );
            self.after_delete(&mut i, &gone);
        }
    }

    /// Keeps [`Inner::owned`] right across one object's change from `before` to `after`.
    fn index_owners(
        i: &mut Inner,
        gr: &str,
        key: &Key,
        before: Option<&Value>,
        after: Option<&Value>,
    ) {
        let owners = |o: Option<&Value>| -> BTreeSet<String> {
            o.and_then(|o| meta(o, "ownerReferences"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_string))
                .collect()
        };
        let (was, is) = (owners(before), owners(after));
        let entry = (gr.to_string(), key.clone());
        for u in was.difference(&is) {
            if let Some(set) = i.owned.get_mut(u) {
                set.remove(&entry);
                if set.is_empty() {
                    i.owned.remove(u);
                }
            }
        }
        for u in is.difference(&was) {
            i.owned.entry(u.clone()).or_default().insert(entry.clone());
        }
    }

    /// The objects whose `ownerReferences` name `uid`, in (group/resource, key) order.
    fn dependents(i: &Inner, uid: &str) -> Vec<(String, Arc<Value>)> {
        let Some(set) = i.owned.get(uid) else {
            return Vec::new();
        };
        set.iter()
            .filter_map(|(g, k)| {
                let o = i.objects.get(g)?.get(k)?;
                Some((g.clone(), o.clone()))
            })
            .collect()
    }

    fn orphan_dependents(&self, i: &mut Inner, uid: &str) {
        for (g, o) in Self::dependents(i, uid) {
            let mut next = (*o).clone();
            if let Some(refs) = meta_mut(&mut next)
                .get_mut("ownerReferences")
                .and_then(Value::as_array_mut)
            {
                refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
            }
            self.commit(i, &g, "MODIFIED", next, Some(o));
        }
    }

    fn delete_dependents(&self, i: &mut Inner, uid: &str) {
        for (g, o) in Self::dependents(i, uid) {
            if let Some(rt) = Self::type_for_gr(i, &g) {
                let _ = self.delete_locked(i, &rt, &o, &DeleteOpts::default());
            }
        }
    }

    /// Garbage collection: dependents all of whose owners are gone are deleted (background).
    fn after_delete(&self, i: &mut Inner, gone: &Value) {
        let uid = meta_str(gone, "uid").to_string();
        for (g, o) in Self::dependents(i, &uid) {
            let owners_left = meta(&o, "ownerReferences")
                .and_then(Value::as_array)
                .map(|refs| {
                    refs.iter().any(|r| {
                        r.get("uid")
                            .and_then(Value::as_str)
                            .is_some_and(|u| i.uids.contains_key(u))
                    })
                })
                .unwrap_or(false);
            if owners_left {
                continue;
            }
            if let Some(rt) = Self::type_for_gr(i, &g)
                && let Some(cur) = i
                    .objects
                    .get(&g)
                    .and_then(|m| {
                        m.get(&(
                            meta_str(&o, "namespace").to_string(),
                            meta_str(&o, "name").to_string(),
                        ))
                    })
                    .cloned()
            {
                let _ = self.delete_locked(i, &rt, &cur, &DeleteOpts::default());
            }
        }
    }

    pub(crate) fn delete_collection(
        &self,
        rt: &ResType,
        ns: Option<&str>,
        sel: &Selector,
        d: &DeleteOpts,
    ) -> Result<u64, Error> {
        let mut i = self.inner.lock();
        let victims: Vec<Arc<Value>> = i
            .objects
            .get(&rt.storage_gr())
            .map(|m| {
                m.iter()
                    .filter(|((n, _), o)| ns.is_none_or(|x| x == n) && sel.matches(o))
                    .map(|(_, o)| o.clone())
                    .collect()
            })
            .unwrap_or_default();
        for o in victims {
            self.delete_locked(&mut i, rt, &o, d)?;
        }
        Ok(i.rv)
    }
}
