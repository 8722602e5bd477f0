//! The run judged by the simulator's invariants (issue 16): no address on two live pods,
//! no live pod's address reclaimed, every address of the nodes' blocks either used by a
//! live pod (`status.used` ↔ live pods) or free, reclaims equal to crashed pods, and every
//! address in its pod's pool (issue 29).
//!
//! [`Tombstones`] watches the IPAMNodes for the whole run and keeps every tombstone the
//! operator wrote (`spec.reclaim`), however briefly it lived; [`Snapshot`] is the cluster
//! at the end; [`violations`] is the judgement, pure.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use tidepool_api as api;

/// A reclaim as written: (node, address, pod UID) — an operator's tombstone or an agent's
/// reconcile free.
pub type Tombstone = (String, String, String);

/// Every tombstone seen on any IPAMNode since [`Tombstones::watch`], and the node side's
/// answers to them.
pub struct Tombstones {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

/// The tombstones and answers seen, fed by [`Seen::record`].
#[derive(Default)]
pub struct Seen {
    tombstones: BTreeSet<Tombstone>,
    /// The answered tombstones (`status.reclaimAck`): whether every answer was `stale`.
    only_stale: BTreeMap<Tombstone, bool>,
}

impl Drop for Tombstones {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Tombstones {
    pub fn watch(admin: kube::Client) -> Tombstones {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let nodes: Api<api::IPAMNode> = Api::all(admin);
        let s = seen.clone();
        let task = tokio::spawn(async move {
            // every event: the in-process server sends each write, none coalesced
            let mut events = std::pin::pin!(watcher(nodes, watcher::Config::default()));
            while let Some(ev) = events.next().await {
                if let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = ev {
                    s.lock().expect("lock").record(&n);
                }
            }
        });
        Tombstones { seen, task }
    }

    /// [`Seen::judged`] of everything seen so far.
    pub fn seen(&self) -> BTreeSet<Tombstone> {
        self.seen.lock().expect("lock").judged()
    }
}

impl Seen {
    /// The tombstones that may have freed an address: all but those only ever answered
    /// `stale` — the entry was no longer that allocation (its DEL had freed it, and the
    /// node side's `status.used` had not yet said so when the operator judged it), so
    /// nothing was removed (DESIGN.md "Node side" answers).
    pub fn judged(&self) -> BTreeSet<Tombstone> {
        self.tombstones
            .iter()
            .filter(|t| self.only_stale.get(*t) != Some(&true))
            .cloned()
            .collect()
    }

    /// Notes `n`'s tombstones and answers.
    pub fn record(&mut self, n: &api::IPAMNode) {
        let node = n.metadata.name.clone().unwrap_or_default();
        for (addr, t) in &n.spec.reclaim {
            self.tombstones
                .insert((node.clone(), addr.clone(), t.pod_uid.clone()));
        }
        let acks = n.status.iter().flat_map(|s| &s.reclaim_ack);
        for (addr, a) in acks {
            let key = (node.clone(), addr.clone(), a.pod_uid.clone());
            let stale = a.outcome == api::ReclaimOutcome::Stale;
            *self.only_stale.entry(key).or_insert(true) &= stale;
        }
    }
}

/// A live pod as the judge reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LivePod {
    pub name: String,
    pub namespace: String,
    /// `spec.nodeName` (empty while unbound).
    pub node: String,
    /// `status.podIPs`.
    pub ips: Vec<String>,
}

/// The cluster at the end of a run.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Live pods of every namespace, by UID.
    pub pods: BTreeMap<String, LivePod>,
    /// Per node: address → pod UID in `status.used`.
    pub used: BTreeMap<String, BTreeMap<String, String>>,
    /// (node, address) → the pool its `status.used` entry names (entries naming none are
    /// absent).
    pub used_pools: BTreeMap<(String, String), String>,
    /// Per node: tombstones still pending in `spec.reclaim`.
    pub pending_reclaims: usize,
    /// Per node: its blocks' CIDRs.
    pub blocks: BTreeMap<String, Vec<ipnet::IpNet>>,
    /// Each block's pool (`spec.pool`), by CIDR.
    pub block_pools: BTreeMap<ipnet::IpNet, String>,
    /// The blocks the operator marked for release (`spec.release`): draining.
    pub draining: BTreeSet<ipnet::IpNet>,
    /// Every pool's CIDRs.
    pub pool: Vec<ipnet::IpNet>,
    /// The pools with a `namespaceSelector`: name → its `matchLabels`.
    pub namespace_selectors: BTreeMap<String, BTreeMap<String, String>>,
    /// Namespace → its labels.
    pub namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl Snapshot {
    pub async fn take(admin: &kube::Client) -> kube::Result<Snapshot> {
        let mut snap = Snapshot::default();
        let pods: Api<Pod> = Api::all(admin.clone());
        for p in pods.list(&ListParams::default()).await? {
            let st = p.status.unwrap_or_default();
            let pod = LivePod {
                name: p.metadata.name.unwrap_or_default(),
                namespace: p.metadata.namespace.unwrap_or_default(),
                node: p.spec.and_then(|s| s.node_name).unwrap_or_default(),
                ips: st
                    .pod_ips
                    .unwrap_or_default()
                    .into_iter()
                    .map(|i| i.ip)
                    .collect(),
            };
            snap.pods.insert(p.metadata.uid.unwrap_or_default(), pod);
        }
        let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
        for n in nodes.list(&ListParams::default()).await? {
            let name = n.metadata.name.clone().unwrap_or_default();
            snap.pending_reclaims += n.spec.reclaim.len();
            let used = n.status.map(|s| s.used).unwrap_or_default();
            for (a, e) in &used {
                if let Some(pool) = &e.pool {
                    snap.used_pools
                        .insert((name.clone(), a.clone()), pool.clone());
                }
            }
            snap.used.insert(
                name,
                used.into_iter().map(|(a, e)| (a, e.pod_uid)).collect(),
            );
        }
        let blocks: Api<api::IPAMBlock> = Api::all(admin.clone());
        for b in blocks.list(&ListParams::default()).await? {
            let net = b.spec.cidr.0.parse().expect("a block's CIDR");
            if b.spec.release.is_some() {
                snap.draining.insert(net);
            }
            snap.block_pools.insert(net, b.spec.pool.clone());
            snap.blocks
                .entry(b.spec.node.clone())
                .or_default()
                .push(net);
        }
        snap.take_pools(admin).await?;
        Ok(snap)
    }

    /// The pools' CIDRs and namespace selectors, and the namespaces' labels.
    async fn take_pools(&mut self, admin: &kube::Client) -> kube::Result<()> {
        let pools: Api<api::IPPool> = Api::all(admin.clone());
        for p in pools.list(&ListParams::default()).await? {
            let name = p.metadata.name.clone().unwrap_or_default();
            self.pool.extend(
                p.spec
                    .cidrs
                    .iter()
                    .map(|c| c.0.parse::<ipnet::IpNet>().expect("a CIDR")),
            );
            if let Some(sel) = p.spec.namespace_selector {
                assert!(
                    sel.match_expressions.unwrap_or_default().is_empty(),
                    "the judge reads a namespaceSelector's matchLabels only ({name})"
                );
                let labels = sel.match_labels.unwrap_or_default();
                self.namespace_selectors.insert(name, labels);
            }
        }
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        for ns in namespaces.list(&ListParams::default()).await? {
            let labels = ns.metadata.labels.unwrap_or_default();
            self.namespace_labels
                .insert(ns.metadata.name.unwrap_or_default(), labels);
        }
        Ok(())
    }

    /// Live pods' addresses as `status.used` should hold them: node → address → UID.
    pub fn expected_used(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let mut want: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (uid, p) in &self.pods {
            for ip in &p.ips {
                want.entry(p.node.clone())
                    .or_default()
                    .insert(ip.clone(), uid.clone());
            }
        }
        want
    }

    /// `status.used` of nodes that have an entry (empty maps dropped).
    pub fn used_nonempty(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        self.used
            .iter()
            .filter(|(_, u)| !u.is_empty())
            .map(|(n, u)| (n.clone(), u.clone()))
            .collect()
    }

    /// Settled: every live pod has an address, the nodes' `status.used` is exactly the
    /// live pods', no tombstone waits, and every block outside the pool still has a user
    /// (a drained block goes once free).
    pub fn settled(&self) -> bool {
        self.pods.values().all(|p| !p.ips.is_empty())
            && self.used_nonempty() == self.expected_used()
            && self.pending_reclaims == 0
            && self.blocks.iter().all(|(node, blocks)| {
                blocks
                    .iter()
                    .all(|b| self.in_pool(b) || self.has_user(node, b))
            })
    }

    /// The pool a pod of `namespace` resolves to, as the run sets pools up (DESIGN.md "Pools
    /// per namespace and per pod", without annotations, pod or node selectors): the first
    /// pool by name whose `namespaceSelector` selects the namespace, else `default`.
    pub fn pool_of(&self, namespace: &str) -> &str {
        let labels = self.namespace_labels.get(namespace);
        let selects = |sel: &BTreeMap<String, String>| {
            !sel.is_empty()
                && sel
                    .iter()
                    .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        };
        self.namespace_selectors
            .iter()
            .find(|(_, sel)| selects(sel))
            .map_or("default", |(name, _)| name)
    }

    /// Whether block `b` lies in one of the pool's CIDRs.
    pub fn in_pool(&self, b: &ipnet::IpNet) -> bool {
        self.pool.iter().any(|p| p.contains(b))
    }

    /// Whether a live pod on `node` holds an address in block `b`.
    pub fn has_user(&self, node: &str, b: &ipnet::IpNet) -> bool {
        self.pods.values().any(|p| {
            p.node == node
                && p.ips
                    .iter()
                    .any(|ip| ip.parse::<IpAddr>().is_ok_and(|a| b.contains(&a)))
        })
    }
}

/// What the run broke on purpose, for the judge.
#[derive(Debug, Clone, Default)]
pub struct Crashes {
    /// (address, pod UID) of the sandboxes crashed or lost without a DEL.
    pub sandboxes: BTreeSet<(String, String)>,
    /// Pods deleted while their node's agent was down (their DELs spooled).
    pub spooled: BTreeSet<String>,
    /// Crashed nodes: their pods' (address, pod UID) when they went.
    pub nodes: BTreeMap<String, BTreeSet<(String, String)>>,
    /// (address, pod UID) of the pods deleted on a crashed node before it went: its dead
    /// agent may have freed such an address on the DEL without yet writing `status.used`,
    /// and then the operator rightly tombstones the entry of a pod that is gone (CI once
    /// saw it for a pod deleted just before the crash).
    pub deleted_before: BTreeSet<(String, String)>,
    /// CIDRs the run removed from the pool: their blocks may stay while they drain.
    pub removed_cidrs: Vec<ipnet::IpNet>,
}

/// Every broken invariant, in words (empty: the run is sound). `tombstones` are every
/// tombstone the operators wrote, `frees` every allocation the agents' reconcile freed.
/// Each crashed sandbox must be reclaimed by one path at least (both may race to it), and
/// nothing else by either — except that the operator may tombstone the address of a pod
/// deleted while its agent was down (the DEL waits in the spool and the pod's object is
/// gone, so the entry looks like a crash's until the replay) or of a crashed node's pod.
/// A crashed node's addresses go with its whole-node reclaim: its IPAMNode and blocks gone.
/// A block outside the pool is allowed only while it drains (DESIGN.md "Release
/// handshake"): it lies in a CIDR the run removed, is marked for release, and a live pod
/// on its node still holds an address in it.
pub fn violations(
    snap: &Snapshot,
    crashes: &Crashes,
    tombstones: &BTreeSet<Tombstone>,
    frees: &BTreeSet<Tombstone>,
) -> Vec<String> {
    let mut bad = Vec::new();
    // no address on two live pods
    let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
    for (uid, p) in &snap.pods {
        for ip in &p.ips {
            if let Some(other) = owner.insert(ip, &p.name) {
                bad.push(format!(
                    "{ip} on two live pods: {other} and {} ({uid})",
                    p.name
                ));
            }
        }
    }
    // every live pod's address in a block of its node, every block in the pool
    for p in snap.pods.values() {
        for ip in &p.ips {
            let a: IpAddr = ip.parse().expect("an address");
            let blocks = snap.blocks.get(&p.node).map(Vec::as_slice).unwrap_or(&[]);
            if !blocks.iter().any(|b| b.contains(&a)) {
                bad.push(format!("{}'s {ip} is in no block of {}", p.name, p.node));
            }
        }
    }
    bad.extend(outside_their_pools(snap));
    for (node, blocks) in &snap.blocks {
        for b in blocks.iter().filter(|b| !snap.in_pool(b)) {
            bad.extend(outside_the_pool(snap, crashes, node, b));
        }
    }
    // status.used ↔ live pods: what is not used by a live pod is free
    let (want, have) = (snap.expected_used(), snap.used_nonempty());
    if want != have {
        bad.push(format!(
            "status.used is not the live pods' addresses: live {want:?}, used {have:?}"
        ));
    }
    // no live pod's address reclaimed; reclaims equal crashed pods
    let mut reclaimed = BTreeSet::new();
    for (path, set) in [("tombstoned", tombstones), ("freed by reconcile", frees)] {
        for (node, addr, uid) in set {
            let listed = snap.pods.get(uid).is_some_and(|p| p.ips.contains(addr));
            if listed {
                bad.push(format!("{addr} of live pod {uid} on {node} was {path}"));
            }
            let pair = (addr.clone(), uid.clone());
            let excused = path == "tombstoned"
                && (crashes.spooled.contains(uid)
                    || crashes.nodes.get(node).is_some_and(|p| p.contains(&pair))
                    || crashes.deleted_before.contains(&pair));
            if !crashes.sandboxes.contains(&pair) && !excused {
                bad.push(format!(
                    "{addr} of pod {uid} on {node} {path} but never crashed"
                ));
            }
            reclaimed.insert((addr.clone(), uid.clone()));
        }
    }
    for c in crashes.sandboxes.difference(&reclaimed) {
        bad.push(format!("crashed {c:?} was never reclaimed"));
    }
    for node in crashes.nodes.keys() {
        if snap.used.contains_key(node) || snap.blocks.contains_key(node) {
            bad.push(format!(
                "crashed {node}'s IPAMNode or blocks were not reclaimed"
            ));
        }
        if snap.pods.values().any(|p| p.node == *node) {
            bad.push(format!("a pod is still bound to crashed {node}"));
        }
    }
    bad
}

/// Every live pod's address that is not in a block of the pool its pod resolves to
/// ([`Snapshot::pool_of`]), or whose `status.used` entry names another pool (or none). An
/// address in no block of its node is named by the caller.
fn outside_their_pools(snap: &Snapshot) -> Vec<String> {
    let mut bad = Vec::new();
    for p in snap.pods.values() {
        let want = snap.pool_of(&p.namespace);
        let blocks = snap.blocks.get(&p.node).map(Vec::as_slice).unwrap_or(&[]);
        let used = snap.used.get(&p.node);
        for ip in &p.ips {
            let a: IpAddr = ip.parse().expect("an address");
            let block = blocks.iter().find(|b| b.contains(&a));
            let block_pool = block.and_then(|b| snap.block_pools.get(b));
            if let (Some(b), Some(pool)) = (block, block_pool)
                && pool != want
            {
                bad.push(format!(
                    "{}'s {ip} is in block {b} of pool {pool}, not of its pool {want}",
                    p.name
                ));
            }
            let entry = snap.used_pools.get(&(p.node.clone(), ip.clone()));
            if used.is_some_and(|u| u.contains_key(ip)) && entry.map(String::as_str) != Some(want) {
                bad.push(format!(
                    "{}'s {ip}: status.used on {} names pool {entry:?}, not its pool {want}",
                    p.name, p.node
                ));
            }
        }
    }
    bad
}

/// What is wrong with `node`'s block `b`, which lies outside the pool: nothing while it
/// drains (a removed CIDR's, marked for release, still used by a live pod).
fn outside_the_pool(
    snap: &Snapshot,
    crashes: &Crashes,
    node: &str,
    b: &ipnet::IpNet,
) -> Option<String> {
    let Some(removed) = crashes.removed_cidrs.iter().find(|c| c.contains(b)) else {
        return Some(format!("{node}'s block {b} is outside the pool"));
    };
    if !snap.draining.contains(b) {
        return Some(format!(
            "{node}'s block {b} of removed CIDR {removed} is not marked for release"
        ));
    }
    if !snap.has_user(node, b) {
        return Some(format!(
            "{node}'s block {b} of removed CIDR {removed} has no user left but was not released"
        ));
    }
    None
}
