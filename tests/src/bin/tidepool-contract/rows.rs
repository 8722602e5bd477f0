//! The sequence of request shapes, in the order the binaries send them, each recorded as
//! one row (the table in tests/README.md names the same rows). Requests are built with
//! kube's own request builder and parameters, as the binaries' `Api` calls build them.

use std::time::Duration;

use anyhow::Context;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchParams,
};
use serde_json::{Value, json};
use tidepool_api::names::{AGENT_MANAGER, EXHAUSTED_TAINT, FINALIZER, OPERATOR_MANAGER};

use crate::{Answer, Recorder, at, poll};

const IPAM: &str = "/apis/ipam.tidepool.dev/v1alpha1";
const API_VERSION: &str = "ipam.tidepool.dev/v1alpha1";
const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
const NODES: &str = "/api/v1/nodes";
const PODS: &str = "/api/v1/namespaces/default/pods";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
/// The IPAMNode's `spec.nodeUID` (a Node's uid, as the operator writes it).
const NODE_UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
/// A uid no object has.
const OTHER_UID: &str = "11111111-2222-4333-8444-555555555555";

const CRD_YAML: [&str; 3] = [
    include_str!("../../../../deploy/crds/ipamnodes.yaml"),
    include_str!("../../../../deploy/crds/ipamblocks.yaml"),
    include_str!("../../../../deploy/crds/ippools.yaml"),
];

fn ipam(plural: &str) -> kube::core::Request {
    at(&format!("{IPAM}/{plural}"))
}

fn json_body(v: &Value) -> anyhow::Result<Vec<u8>> {
    Ok(serde_json::to_vec(v)?)
}

fn operator_apply() -> PatchParams {
    PatchParams::apply(OPERATOR_MANAGER)
}

fn agent_apply() -> PatchParams {
    PatchParams::apply(AGENT_MANAGER).force()
}

fn post() -> PostParams {
    PostParams {
        field_manager: Some(OPERATOR_MANAGER.into()),
        ..PostParams::default()
    }
}

/// A merge patch of `metadata.finalizers` at `rv`: the operator's finalizer removal.
fn finalizers_patch(rv: &str) -> Value {
    json!({ "metadata": { "finalizers": [], "resourceVersion": rv } })
}

fn delete_at(rv: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: Some(rv.into()),
            uid: None,
        }),
        ..DeleteParams::default()
    }
}

/// Creates each CRD of deploy/crds that the server does not have, and waits until it is
/// Established.
pub async fn install_crds(r: &Recorder) -> anyhow::Result<()> {
    for yaml in CRD_YAML {
        let crd: Value = serde_saphyr::from_str(yaml).context("a CRD of deploy/crds")?;
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        let get = at(CRDS).get(name, &Default::default())?;
        if r.call(get).await?.code == 404 {
            let create = at(CRDS).create(&PostParams::default(), json_body(&crd)?)?;
            r.setup("creating a CRD", create).await?;
        }
        poll(
            "the CRDs to be Established",
            Duration::from_secs(60),
            || async {
                let a = r.call(at(CRDS).get(name, &Default::default())?).await?;
                let conditions = a.body["status"]["conditions"].as_array().cloned();
                Ok(conditions
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Established" && c["status"] == "True"))
            },
        )
        .await?;
    }
    Ok(())
}

/// The names this run uses.
struct Names {
    node: String,
    node_b: String,
    ipamnode: String,
    created_by_apply: String,
    missing: String,
    block: String,
    block_b: String,
    pool: String,
    pod: String,
    lease: String,
}

impl Names {
    fn of(p: &str) -> Self {
        Names {
            node: format!("{p}-node-a"),
            node_b: format!("{p}-node-b"),
            ipamnode: format!("{p}-node-a"),
            created_by_apply: format!("{p}-node-c"),
            missing: format!("{p}-missing"),
            block: format!("{p}-block-1"),
            block_b: format!("{p}-block-2"),
            pool: format!("{p}-pool"),
            pod: format!("{p}-pod"),
            lease: format!("{p}-lease"),
        }
    }
}

/// Every row, in order.
pub async fn run(r: &Recorder) -> anyhow::Result<()> {
    let n = Names::of(&r.prefix);
    set_up(r, &n).await?;
    r.row("version", http::Request::get("/version").body(vec![])?)
        .await?;
    let start = list_rv(r).await?;
    ipamnode_writes(r, &n).await?;
    lists(r, &n).await?;
    ipamnode_deletion(r, &n).await?;
    let watch = WatchParams::default().fields(&format!("metadata.name={}", n.ipamnode));
    r.watch_row(
        "ipamnode-watch-by-name",
        ipam("ipamnodes").watch(&watch, &start)?,
        1,
    )
    .await?;
    blocks(r, &n).await?;
    let watch = WatchParams::default().fields(&format!("spec.node={}", n.node));
    r.watch_row(
        "ipamblock-watch-by-node",
        ipam("ipamblocks").watch(&watch, &start)?,
        2,
    )
    .await?;
    core(r, &n).await?;
    lease(r, &n).await?;
    events(r, &n).await
}

/// The objects the rows read or point at: two Nodes, an unschedulable Pod, an IPPool.
async fn set_up(r: &Recorder, n: &Names) -> anyhow::Result<()> {
    for node in [&n.node, &n.node_b] {
        let body = json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": node } });
        r.setup(
            "creating a Node",
            at(NODES).create(&PostParams::default(), json_body(&body)?)?,
        )
        .await?;
    }
    // A scheduling gate keeps it unbound: no kubelet is involved, and it goes at once.
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": n.pod, "namespace": "default" },
        "spec": {
            "schedulingGates": [{ "name": "ipam.tidepool.dev/contract" }],
            "containers": [{ "name": "c", "image": "registry.k8s.io/pause:3.10" }],
        },
    });
    r.setup(
        "creating a Pod",
        at(PODS).create(&PostParams::default(), json_body(&pod)?)?,
    )
    .await?;
    let pool = json!({
        "apiVersion": API_VERSION, "kind": "IPPool",
        "metadata": { "name": n.pool },
        "spec": { "cidrs": ["10.255.0.0/24"], "nodeSelector": { "contract": "none" } },
    });
    let create = ipam("ippools").create(&PostParams::default(), json_body(&pool)?)?;
    r.setup("creating an IPPool", create).await?;
    Ok(())
}

/// The current resourceVersion (a consistent list's), where the watch rows start.
async fn list_rv(r: &Recorder) -> anyhow::Result<String> {
    let a = r.setup(
        "a list",
        ipam("ipamnodes").list(&ListParams::default().limit(1))?,
    );
    Ok(a.await?.rv())
}

fn ipamnode_spec(name: &str, uid: Option<&str>) -> Value {
    let mut body = json!({
        "apiVersion": API_VERSION, "kind": "IPAMNode",
        "metadata": { "name": name, "finalizers": [FINALIZER] },
        "spec": { "nodeUID": NODE_UID },
    });
    if let Some(uid) = uid {
        body["metadata"]["uid"] = json!(uid);
    }
    body
}

fn operator_status(name: &str, conditions: Value) -> Value {
    json!({
        "apiVersion": API_VERSION, "kind": "IPAMNode",
        "metadata": { "name": name },
        "status": { "conditions": conditions, "allocated": 16 },
    })
}

fn agent_status(name: &str, used: Value) -> Value {
    json!({
        "apiVersion": API_VERSION, "kind": "IPAMNode",
        "metadata": { "name": name },
        "status": {
            "used": used, "cooldown": {}, "releaseAck": {}, "reclaimAck": {},
            "inUse": used.as_object().map_or(0, serde_json::Map::len),
            "conditions": [{
                "type": "AgentReady", "status": "True", "reason": "Serving", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        },
    })
}

/// The operator's POST, spec and status applies, the agent's status applies, a user's
/// edits, and the applies the uid guard and forcing are about.
async fn ipamnode_writes(r: &Recorder, n: &Names) -> anyhow::Result<()> {
    let created = ipamnode_create(r, &n.ipamnode).await?;
    ipamnode_status_writes(r, n).await?;
    ipamnode_spec_writes(r, n, &created).await
}

/// The operator's POST (missing, then existing) and its spec applies.
async fn ipamnode_create(r: &Recorder, name: &str) -> anyhow::Result<Answer> {
    let nodes = || ipam("ipamnodes");
    r.row(
        "ipamnode-get-missing",
        nodes().get(name, &Default::default())?,
    )
    .await?;
    let body = json_body(&ipamnode_spec(name, None))?;
    let created = r
        .row("ipamnode-create", nodes().create(&post(), body.clone())?)
        .await?;
    r.row("ipamnode-create-exists", nodes().create(&post(), body)?)
        .await?;
    let spec = ipamnode_spec(name, None);
    let applied = r
        .row(
            "ipamnode-spec-apply",
            nodes().patch(name, &operator_apply(), &Patch::Apply(&spec))?,
        )
        .await?;
    let before = json!({ "resourceVersion": applied.rv() });
    let req = nodes().patch(name, &operator_apply(), &Patch::Apply(&spec))?;
    r.row_after("ipamnode-spec-apply-unchanged", req, before)
        .await?;
    Ok(created)
}

/// The operator's and the agent's status applies, a user's edit of the status, and the
/// operator's status apply to an IPAMNode that does not exist.
async fn ipamnode_status_writes(r: &Recorder, n: &Names) -> anyhow::Result<()> {
    let name = &n.ipamnode;
    let nodes = || ipam("ipamnodes");
    let status = |c| operator_status(name, c);
    let req = nodes().patch_subresource(
        "status",
        name,
        &operator_apply(),
        &Patch::Apply(&status(json!([]))),
    )?;
    r.row("ipamnode-status-apply-no-conditions", req).await?;
    let ready = json!([{
        "type": "PoolReady", "status": "True", "reason": "Served", "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]);
    let req = nodes().patch_subresource(
        "status",
        name,
        &operator_apply(),
        &Patch::Apply(&status(ready)),
    )?;
    r.row("ipamnode-status-apply", req).await?;
    let entry = json!({
        "podUID": OTHER_UID, "namespace": "default", "pod": "p", "containerID": "c1",
        "ifname": "eth0", "since": "2026-01-01T00:00:00Z",
    });
    let used = agent_status(name, json!({ "10.255.0.1": entry, "10.255.0.2": entry }));
    let req = nodes().patch_subresource("status", name, &agent_apply(), &Patch::Apply(&used))?;
    r.row("ipamnode-agent-status-apply", req).await?;
    // Someone edits one field of one entry (kubectl edit --subresource=status) …
    let edit = json!({ "status": { "used": { "10.255.0.1": { "pod": "edited" } } } });
    let pp = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..Default::default()
    };
    let req = nodes().patch_subresource("status", name, &pp, &Patch::Merge(&edit))?;
    r.row("ipamnode-user-status-edit", req).await?;
    // … and the agent stops sending both entries: each goes whole.
    let req = nodes().patch_subresource(
        "status",
        name,
        &agent_apply(),
        &Patch::Apply(&agent_status(name, json!({}))),
    )?;
    r.row("ipamnode-agent-status-withdraw", req).await?;
    let missing = operator_status(&n.missing, json!([]));
    let req = nodes().patch_subresource(
        "status",
        &n.missing,
        &operator_apply(),
        &Patch::Apply(&missing),
    )?;
    r.row("ipamnode-status-apply-missing", req).await?;
    Ok(())
}

/// A user's spec patch, then the operator's spec applies: the conflict, forcing with the
/// object's uid and another one, and the applies that find no object or create one.
async fn ipamnode_spec_writes(r: &Recorder, n: &Names, created: &Answer) -> anyhow::Result<()> {
    let name = &n.ipamnode;
    let nodes = || ipam("ipamnodes");
    let spec = ipamnode_spec(name, None);
    // A user's merge patch of the spec (kubectl patch), then the operator's applies.
    let user = json!({ "spec": { "nodeUID": OTHER_UID, "pools": { "ipv4": "gpu" } } });
    let pp = PatchParams {
        field_manager: Some("kubectl-patch".into()),
        ..Default::default()
    };
    r.row(
        "ipamnode-user-spec-patch",
        nodes().patch(name, &pp, &Patch::Merge(&user))?,
    )
    .await?;
    let req = nodes().patch(name, &operator_apply(), &Patch::Apply(&spec))?;
    r.row("ipamnode-spec-apply-conflict", req).await?;
    let forced = operator_apply().force();
    let uid = created.uid();
    let with_uid = ipamnode_spec(name, Some(&uid));
    r.row(
        "ipamnode-spec-apply-forced-with-uid",
        nodes().patch(name, &forced, &Patch::Apply(&with_uid))?,
    )
    .await?;
    let wrong = ipamnode_spec(name, Some(OTHER_UID));
    r.row(
        "ipamnode-spec-apply-other-uid",
        nodes().patch(name, &forced, &Patch::Apply(&wrong))?,
    )
    .await?;
    let gone = ipamnode_spec(&n.missing, Some(OTHER_UID));
    let req = nodes().patch(&n.missing, &forced, &Patch::Apply(&gone))?;
    r.row("ipamnode-spec-apply-uid-no-object", req).await?;
    let fresh = ipamnode_spec(&n.created_by_apply, None);
    let req = nodes().patch(&n.created_by_apply, &forced, &Patch::Apply(&fresh))?;
    r.row("ipamnode-spec-apply-creates", req).await?;
    r.row("ipamnode-get", nodes().get(name, &Default::default())?)
        .await?;
    Ok(())
}

/// The watchers' and `check`'s lists (two IPAMNodes of this run exist now).
async fn lists(r: &Recorder, n: &Names) -> anyhow::Result<()> {
    let page = r
        .row(
            "ipamnode-list-page",
            ipam("ipamnodes").list(&ListParams::default().limit(1))?,
        )
        .await?;
    let token = page.body["metadata"]["continue"]
        .as_str()
        .unwrap_or_default();
    let next = ListParams::default().limit(1).continue_token(token);
    r.row("ipamnode-list-continue", ipam("ipamnodes").list(&next)?)
        .await?;
    let by_name = ListParams::default()
        .fields(&format!("metadata.name={}", n.ipamnode))
        .limit(500);
    r.row("ipamnode-list-by-name", ipam("ipamnodes").list(&by_name)?)
        .await?;
    // kube leaves `resourceVersion=0` out of a list with a limit (kube-core ListParams),
    // so a watcher lists from the watch cache only with no page size.
    let any = ListParams::default().match_any();
    r.row("node-list-rv0", at(NODES).list(&any)?).await?;
    r.row("pod-list-rv0", at("/api/v1/pods").list(&any)?)
        .await?;
    let on_node = ListParams::default()
        .fields(&format!("spec.nodeName={}", n.node))
        .limit(100);
    r.row("pod-list-by-node", at(PODS).list(&on_node)?).await?;
    let check = ListParams::default().limit(500);
    r.row("pod-list-check", at("/api/v1/pods").list(&check)?)
        .await?;
    Ok(())
}

/// DELETE while the finalizer holds, the finalizer-removal patch (stale, then current),
/// and what is left to answer afterwards.
async fn ipamnode_deletion(r: &Recorder, n: &Names) -> anyhow::Result<()> {
    let name = &n.ipamnode;
    let nodes = || ipam("ipamnodes");
    let before = r.call(nodes().get(name, &Default::default())?).await?.rv();
    let deleting = r
        .row(
            "ipamnode-delete-finalizer-pending",
            nodes().delete(name, &DeleteParams::default())?,
        )
        .await?;
    let patch = finalizers_patch(&before);
    let req = nodes().patch(name, &PatchParams::default(), &Patch::Merge(&patch))?;
    r.row("ipamnode-finalizer-patch-stale", req).await?;
    let rv = deleting.rv();
    let patch = finalizers_patch(&rv);
    let req = nodes().patch(name, &PatchParams::default(), &Patch::Merge(&patch))?;
    r.row("ipamnode-finalizer-patch-last", req).await?;
    let req = nodes().patch(name, &PatchParams::default(), &Patch::Merge(&patch))?;
    r.row("ipamnode-finalizer-patch-gone", req).await?;
    r.row(
        "ipamnode-delete-missing",
        nodes().delete(name, &DeleteParams::default())?,
    )
    .await?;
    Ok(())
}

fn block_body(name: &str, node: &str, cidr: &str, finalizers: bool, release: bool) -> Value {
    let mut spec = json!({ "pool": "default", "cidr": cidr, "node": node, "nodeUID": NODE_UID });
    if release {
        spec["release"] = json!("marked-for-release");
    }
    let finalizers: Vec<&str> = if finalizers { vec![FINALIZER] } else { vec![] };
    json!({
        "apiVersion": API_VERSION, "kind": "IPAMBlock",
        "metadata": { "name": name, "finalizers": finalizers },
        "spec": spec,
    })
}

fn block_status(name: &str, ack: Option<&str>) -> Value {
    let status = ack.map_or(json!({}), |a| json!({ "releaseAck": a }));
    json!({
        "apiVersion": API_VERSION, "kind": "IPAMBlock",
        "metadata": { "name": name },
        "status": status,
    })
}

/// A claim, a mark, the agent's answer and its withdrawal, and a release.
async fn blocks(r: &Recorder, n: &Names) -> anyhow::Result<()> {
    let (name, node) = (&n.block, &n.node);
    let blocks = || ipam("ipamblocks");
    let claim = json_body(&block_body(name, node, "10.255.0.0/28", true, false))?;
    r.row("ipamblock-create", blocks().create(&post(), claim.clone())?)
        .await?;
    r.row("ipamblock-create-exists", blocks().create(&post(), claim)?)
        .await?;
    r.row("ipamblock-get", blocks().get(name, &Default::default())?)
        .await?;
    let mark = block_body(name, node, "10.255.0.0/28", true, true);
    r.row(
        "ipamblock-mark-apply",
        blocks().patch(name, &operator_apply(), &Patch::Apply(&mark))?,
    )
    .await?;
    let ack = block_status(name, Some("ready-for-release"));
    let req = blocks().patch_subresource("status", name, &agent_apply(), &Patch::Apply(&ack))?;
    let acked = r.row("ipamblock-agent-ack", req).await?;
    let req = blocks().patch_subresource(
        "status",
        name,
        &agent_apply(),
        &Patch::Apply(&block_status(name, None)),
    )?;
    r.row("ipamblock-agent-ack-withdraw", req).await?;
    let missing = block_status(&n.missing, Some("ready-for-release"));
    let req = blocks().patch_subresource(
        "status",
        &n.missing,
        &agent_apply(),
        &Patch::Apply(&missing),
    )?;
    r.row("ipamblock-agent-ack-missing", req).await?;
    let unmark = block_body(name, node, "10.255.0.0/28", true, false);
    let unmarked = r
        .row(
            "ipamblock-unmark-apply",
            blocks().patch(name, &operator_apply(), &Patch::Apply(&unmark))?,
        )
        .await?;
    let by_node = ListParams::default()
        .fields(&format!("spec.node={node}"))
        .limit(500);
    r.row("ipamblock-list-by-node", blocks().list(&by_node)?)
        .await?;
    let req = blocks().delete(name, &delete_at(&acked.rv()))?;
    r.row("ipamblock-delete-stale", req).await?;
    let req = blocks().delete(name, &delete_at(&unmarked.rv()))?;
    let deleting = r.row("ipamblock-delete", req).await?;
    let patch = finalizers_patch(&deleting.rv());
    r.row(
        "ipamblock-finalizer-patch-last",
        blocks().patch(name, &PatchParams::default(), &Patch::Merge(&patch))?,
    )
    .await?;
    let free = json_body(&block_body(
        &n.block_b,
        node,
        "10.255.0.16/28",
        false,
        false,
    ))?;
    let created = r
        .row(
            "ipamblock-create-no-finalizer",
            blocks().create(&post(), free)?,
        )
        .await?;
    let req = blocks().delete(&n.block_b, &delete_at(&created.rv()))?;
    r.row("ipamblock-delete-immediate", req).await?;
    Ok(())
}

/// The operator's Node taint, its live pod lookup and its IPPool status.
async fn core(r: &Recorder, n: &Names) -> anyhow::Result<()> {
    let node = r
        .row("node-get", at(NODES).get(&n.node, &Default::default())?)
        .await?;
    let taint = |rv: &str| {
        json!({
            "metadata": { "resourceVersion": rv },
            "spec": { "taints": [{ "key": EXHAUSTED_TAINT, "effect": "NoSchedule" }] },
        })
    };
    let patch = taint(&node.rv());
    let req = at(NODES).patch(&n.node, &PatchParams::default(), &Patch::Merge(&patch))?;
    r.row("node-taint-patch", req).await?;
    let req = at(NODES).patch(&n.node, &PatchParams::default(), &Patch::Merge(&patch))?;
    r.row("node-taint-patch-stale", req).await?;
    r.row("pod-get", at(PODS).get(&n.pod, &Default::default())?)
        .await?;
    r.row(
        "pod-get-missing",
        at(PODS).get(&n.missing, &Default::default())?,
    )
    .await?;
    let status = json!({
        "apiVersion": API_VERSION, "kind": "IPPool",
        "metadata": { "name": n.pool },
        "status": {
            "conditions": [{
                "type": "Valid", "status": "True", "reason": "Valid", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
            "ipv4": { "capacity": "256", "allocated": "16", "free": "240" },
        },
    });
    let req = ipam("ippools").patch_subresource(
        "status",
        &n.pool,
        &operator_apply(),
        &Patch::Apply(&status),
    )?;
    r.row("ippool-status-apply", req).await?;
    Ok(())
}

fn lease_body(name: &str, renewed: &str, rv: Option<&str>) -> Value {
    let mut body = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "holderIdentity": "a", "leaseDurationSeconds": 15,
            "acquireTime": "2026-01-01T00:00:00.000000Z",
            "renewTime": renewed, "leaseTransitions": 0,
        },
    });
    if let Some(rv) = rv {
        body["metadata"]["resourceVersion"] = json!(rv);
    }
    body
}

/// The leader election's Lease: GET, create, replace under a resourceVersion.
async fn lease(r: &Recorder, n: &Names) -> anyhow::Result<()> {
    let leases = || at(LEASES);
    r.row(
        "lease-get-missing",
        leases().get(&n.lease, &Default::default())?,
    )
    .await?;
    let body = json_body(&lease_body(&n.lease, "2026-01-01T00:00:00.000000Z", None))?;
    let created = r
        .row("lease-create", leases().create(&post(), body.clone())?)
        .await?;
    r.row("lease-create-exists", leases().create(&post(), body)?)
        .await?;
    r.row("lease-get", leases().get(&n.lease, &Default::default())?)
        .await?;
    let renewed = "2026-01-01T00:00:02.000000Z";
    let renew = json_body(&lease_body(&n.lease, renewed, Some(&created.rv())))?;
    r.row(
        "lease-replace",
        leases().replace(&n.lease, &post(), renew.clone())?,
    )
    .await?;
    r.row(
        "lease-replace-stale",
        leases().replace(&n.lease, &post(), renew)?,
    )
    .await?;
    Ok(())
}

/// An events.k8s.io Event as kube's `Recorder` writes it, about an IPAMBlock.
fn event_body(name: &str, regarding: &str, note: &str) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": { "name": name, "namespace": "default" },
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "action": "Reclaim", "reason": "IPAddressGarbageCollected", "note": note,
        "type": "Normal",
        "reportingController": OPERATOR_MANAGER, "reportingInstance": "contract",
        "regarding": { "apiVersion": API_VERSION, "kind": "IPAMBlock", "name": regarding },
    })
}

/// The operator's events: POST, the series merge patch, a note over 1 KB.
async fn events(r: &Recorder, n: &Names) -> anyhow::Result<()> {
    let name = format!("{}.1", n.block);
    let ev = event_body(&name, &n.block, "10.255.0.1 reclaimed");
    r.row(
        "event-create",
        at(EVENTS).create(&PostParams::default(), json_body(&ev)?)?,
    )
    .await?;
    let mut series = ev.clone();
    series["series"] = json!({ "count": 2, "lastObservedTime": "2026-01-01T00:00:01.000000Z" });
    let req = at(EVENTS).patch(&name, &PatchParams::default(), &Patch::Merge(&series))?;
    r.row("event-series-patch", req).await?;
    let long = event_body(&format!("{}.2", n.block), &n.block, &"x".repeat(1025));
    r.row(
        "event-note-too-long",
        at(EVENTS).create(&PostParams::default(), json_body(&long)?)?,
    )
    .await?;
    Ok(())
}

/// Deletes what the run created (finalizers first), ignoring what is gone already.
pub async fn clean_up(r: &Recorder) {
    let n = Names::of(&r.prefix);
    let unfinalize = json!({ "metadata": { "finalizers": null } });
    for (plural, names) in [
        (
            "ipamnodes",
            vec![&n.ipamnode, &n.created_by_apply, &n.missing],
        ),
        ("ipamblocks", vec![&n.block, &n.block_b]),
        ("ippools", vec![&n.pool]),
    ] {
        for name in names {
            let patch =
                ipam(plural).patch(name, &PatchParams::default(), &Patch::Merge(&unfinalize));
            let delete = ipam(plural).delete(name, &DeleteParams::default());
            for req in [patch, delete].into_iter().flatten() {
                let _ = r.call(req).await;
            }
        }
    }
    let events = [format!("{}.1", n.block), format!("{}.2", n.block)];
    let core = [
        (NODES, &n.node),
        (NODES, &n.node_b),
        (PODS, &n.pod),
        (LEASES, &n.lease),
    ];
    let others = core.iter().map(|(p, name)| (*p, name.as_str()));
    for (path, name) in others.chain(events.iter().map(|e| (EVENTS, e.as_str()))) {
        if let Ok(req) = at(path).delete(name, &DeleteParams::default()) {
            let _ = r.call(req).await;
        }
    }
}
