//! The object store: one monotonically increasing resourceVersion, per-resource event windows
//! for watches, and the generic write semantics of kube-apiserver's generic registry store.
//!
//! One [`Store`], its state behind one lock, and a file per concern:
//! - [`objects`]: reads (get, list with continue tokens) and `commit`, the one place a change
//!   is stored, versioned and logged;
//! - [`watch`]: the per-resource event windows, watches resuming from a resourceVersion, 410;
//! - [`create`], [`update`] (PUT, patches, the status subresource), [`apply`] (server-side
//!   apply: field ownership, conflicts);
//! - [`delete`]: deletion (preconditions, graceful pods, finalizers, namespaces,
//!   delete_collection) and [`dependents`]: the owner index and garbage collection;
//! - [`crd`]: a CRD's kinds registered and Established, Terminating, its cleanup;
//! - [`admit`]: validation, pruning and defaulting every write goes through;
//! - [`meta`]: small helpers reading and writing `metadata` and `status.conditions`.

mod admit;
mod apply;
mod crd;
mod create;
mod delete;
mod dependents;
mod meta;
mod objects;
mod update;
mod watch;

#[cfg(test)]
mod fixtures;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::admission_policy::Admission;
use crate::events;
use crate::fieldset::Writer;
use crate::paging::Snapshot;
use crate::registry::{ResType, builtins};
use crate::schema::Patterns;

pub(crate) use meta::now;
pub(crate) use watch::{WatchEvent, event_line};

/// An object's key in its resource: (namespace, name).
type Key = (String, String);

struct Inner {
    rv: u64,
    types: BTreeMap<(String, String, String), Arc<ResType>>,
    objects: HashMap<String, BTreeMap<Key, Arc<Value>>>,
    uids: HashMap<String, (String, Key)>,
    /// Owner UID → the objects whose `ownerReferences` name it, as (group/resource, key):
    /// garbage collection looks dependents up here instead of scanning every object (a
    /// scan made each delete cost ~25 ms at 30,000 pods).
    owned: HashMap<String, BTreeSet<(String, Key)>>,
    logs: HashMap<String, watch::Log>,
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
#[derive(Debug)]
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

/// A list result.
#[derive(Debug)]
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
        store.seed();
        store
    }

    /// What the real server creates at start: its namespaces and the PriorityClasses of
    /// `SystemPriorityClasses()`.
    fn seed(&self) {
        let opts = WriteOpts {
            manager: "kube-apiserver".into(),
            ..WriteOpts::default()
        };
        let ns_type = self.resolve("", "v1", "namespaces").expect("namespaces");
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
            self.create(&ns_type, "", obj, &opts)
                .expect("seed namespace");
        }
        let pc_type = self
            .resolve("scheduling.k8s.io", "v1", "priorityclasses")
            .expect("priorityclasses");
        for (name, value, description) in crate::kinds::SYSTEM_PRIORITY_CLASSES {
            let obj = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value, "description": description,
                "preemptionPolicy": "PreemptLowerPriority"});
            self.create(&pc_type, "", obj, &opts)
                .expect("seed priority class");
        }
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

    /// The storage version's type of a resource (`plural.group`).
    fn type_for_gr(i: &Inner, gr: &str) -> Option<Arc<ResType>> {
        i.types
            .values()
            .find(|t| t.gr() == gr && t.version == t.storage_version)
            .cloned()
    }
}

/// The field manager recording a write by `o.manager` at `time` (`subresource` as written).
fn writer<'a>(
    rt: &'a ResType,
    o: &'a WriteOpts,
    subresource: &'a str,
    api_version: &'a str,
    time: &'a str,
) -> Writer<'a> {
    Writer {
        manager: &o.manager,
        subresource,
        api_version,
        time,
        schema: rt.schema.as_ref(),
        strip_status: rt.status,
    }
}
