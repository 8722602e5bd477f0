//! The pod's pool at ADD (issue 29; DESIGN.md "Pools per namespace and per pod"), through the
//! real `tidepool-cni` and the agent as it runs on node-a, against the in-process API server
//! with RBAC on: two namespaces labelled team=blue and team=red, IPPool `default` and IPPool
//! `blue` (namespaceSelector team=blue), a block of each on node-a made as the operator
//! makes them. A blue pod gets a blue address, a red pod a default one, each with its own
//! pool's prefix and gateway; a red pod whose annotation names `blue` gets no address and
//! an error naming the pool and why; a pod of pool `green`, of which node-a holds no block,
//! waits for one and then gets code 11; `status.used` names each address's pool. A new
//! sandbox of a pod takes its earlier sandbox's pool after the namespace no longer selects it.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use common::running::RunningAgent;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tidepool_api as api;

/// Creates namespace `name` labelled team=`team`.
async fn namespace(admin: &kube::Client, name: &str, team: &str) {
    let ns = json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": { "name": name, "labels": { "team": team } },
    });
    create_object(admin, ns).await;
}

/// IPPool `name` over `cidr` in /28 blocks for the namespaces labelled team=`team`.
async fn team_pool(admin: &kube::Client, name: &str, cidr: &str, team: &str) {
    let pool = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
        "metadata": { "name": name },
        "spec": { "cidrs": [cidr], "blockSize": { "ipv4": 28 },
                  "namespaceSelector": { "matchLabels": { "team": team } } },
    });
    create_object(admin, pool).await;
}

/// A block of pool `pool` on node-a, as the operator claims one.
async fn pool_block(admin: &kube::Client, pool: &str, cidr: &str) {
    let name = format!("v4-{}", cidr.replace(['.', '/'], "-"));
    let block = json!({
        "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
        "metadata": { "name": name },
        "spec": { "pool": pool, "cidr": cidr, "node": "node-a", "nodeUID": UID_A },
    });
    create_object(admin, block).await;
}

/// Pod `name` in `ns` bound to node-a (annotated with `pools` when given); its UID.
async fn pod(admin: &kube::Client, ns: &str, name: &str, pools: Option<&str>) -> String {
    let mut meta = json!({ "name": name, "namespace": ns });
    if let Some(p) = pools {
        meta["annotations"] = json!({ "ipam.tidepool.dev/pools": p });
    }
    let obj: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": { "nodeName": "node-a", "containers": [{ "name": "c", "image": "pause" }] },
    }))
    .expect("a pod");
    let made = Api::<Pod>::namespaced(admin.clone(), ns)
        .create(&Default::default(), &obj)
        .await
        .expect("create pod");
    made.metadata.uid.expect("a UID")
}

/// A CNI ADD of container `c` for pod `name` (UID `uid`) in `ns`.
fn add(config: &str, ns: &str, name: &str, uid: &str, c: &str) -> Run {
    let args =
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID={uid}");
    let env = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_PATH", "/opt/cni/bin"),
        ("CNI_CONTAINERID", c),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", &args),
        ("CNI_NETNS", "/var/run/netns/pod"),
    ];
    plugin_with(&env, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_gets_an_address_of_its_namespaces_pool_only() {
    let (server, admin) = cluster().await;
    namespace(&admin, "blue", "blue").await;
    namespace(&admin, "red", "red").await;
    create_block(&admin, "10.250.0.16/28", "node-a", UID_A, false).await;
    team_pool(&admin, "blue", "10.60.0.0/24", "blue").await;
    team_pool(&admin, "green", "10.61.0.0/24", "green").await;
    pool_block(&admin, "blue", "10.60.0.16/28").await;
    let blue = pod(&admin, "blue", "b", None).await;
    let red = pod(&admin, "red", "r", None).await;
    let sneaky = pod(&admin, "red", "s", Some("blue")).await;
    namespace(&admin, "green", "green").await;
    let green = pod(&admin, "green", "g", None).await;

    let dir = tempfile::tempdir().expect("temp dir");
    let s = settings(dir.path());
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let agent = RunningAgent::start(client, &s).await;
    let call = |ns: &'static str, name: &'static str, uid: &String, c: &'static str| {
        let (config, uid) = (config(&s), uid.clone());
        blocking(move || add(&config, ns, name, &uid, c))
    };

    let got = call("blue", "b", &blue, "c-blue").await;
    assert_eq!(got.code, 0, "{}", got.stdout);
    let ip = &got.json()["ips"][0];
    let addr = ip["address"].as_str().expect("address");
    assert!(
        addr.starts_with("10.60.0.") && addr.ends_with("/24"),
        "{ip}"
    );
    assert_eq!(ip["gateway"], "10.60.0.1", "the blue pool's gateway");
    let blue_ip = got.addr();

    let got = call("red", "r", &red, "c-red").await;
    let red_ip = got.addr();
    assert!(
        red_ip.starts_with("10.250.0."),
        "{red_ip}: the default pool's"
    );

    // an annotation naming a pool the namespace may not use: no address, and why
    let refused = call("red", "s", &sneaky, "c-sneaky").await;
    assert_eq!(refused.error_code(), 11, "{}", refused.stdout);
    let details = refused.json()["details"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        details.contains("\"blue\"") && details.contains("namespaceSelector"),
        "{}",
        refused.stdout
    );

    // pool green has no block on node-a: the ADD waits for one, then code 11
    let waited = call("green", "g", &green, "c-green").await;
    assert_eq!(waited.error_code(), 11, "{}", waited.stdout);
    assert!(
        waited.took >= s.empty_pool_wait,
        "it waited for a block: {:?}",
        waited.took
    );
    assert!(waited.stdout.contains("green"), "{}", waited.stdout);

    // status.used names each address's pool
    let nodes: Api<api::IPAMNode> = Api::all(admin.clone());
    let pools = eventually("status.used with both pods' pools", || async {
        let used = nodes.get("node-a").await.ok()?.status?.used;
        let pool = |a: &str| used.get(a).and_then(|e| e.pool.clone());
        Some((pool(&blue_ip)?, pool(&red_ip)?))
    })
    .await;
    assert_eq!(pools, ("blue".to_string(), "default".to_string()));
    assert_eq!(
        nodes
            .get("node-a")
            .await
            .expect("node-a")
            .status
            .expect("status")
            .used
            .len(),
        2,
        "nothing for the refused or waiting pods"
    );
    agent.stop().await;
}

/// A new sandbox of a pod whose earlier sandbox still holds an address takes that address's
/// pool, even when the choice now says another (DESIGN.md: from the ADD on the pool is
/// `status.used[addr].pool`, never re-evaluated): namespace blue relabelled team=red makes
/// its new pods the default pool's, but pod b's second sandbox stays in blue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_sandbox_of_a_pod_keeps_its_pool() {
    let (server, admin) = cluster().await;
    namespace(&admin, "blue", "blue").await;
    create_block(&admin, "10.250.0.16/28", "node-a", UID_A, false).await;
    team_pool(&admin, "blue", "10.60.0.0/24", "blue").await;
    pool_block(&admin, "blue", "10.60.0.16/28").await;
    let b = pod(&admin, "blue", "b", None).await;

    let dir = tempfile::tempdir().expect("temp dir");
    let s = settings(dir.path());
    let client = server.client(&agent_on("node-a")).await.expect("client");
    let agent = RunningAgent::start(client, &s).await;
    let call = |uid: &String, c: &'static str| {
        let (config, uid) = (config(&s), uid.clone());
        blocking(move || add(&config, "blue", "b", &uid, c))
    };
    let first = call(&b, "c-b1").await;
    assert!(first.addr().starts_with("10.60.0."), "{}", first.stdout);

    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    let red = json!({ "metadata": { "labels": { "team": "red" } } });
    namespaces
        .patch("blue", &PatchParams::default(), &Patch::Merge(red))
        .await
        .expect("relabel");
    // once the agent sees the label, a new pod of the namespace is the default pool's
    // (a pod per try: one that got a blue address keeps blue)
    let mut tries = 0;
    let fresh = eventually(
        "a new pod of the relabelled namespace in the default pool",
        || {
            tries += 1;
            let (admin, config, name) = (admin.clone(), config(&s), format!("n{tries}"));
            async move {
                let uid = pod(&admin, "blue", &name, None).await;
                let c = format!("c-{name}");
                let r = blocking(move || add(&config, "blue", &name, &uid, &c)).await;
                (r.code == 0)
                    .then(|| r.addr())
                    .filter(|a| a.starts_with("10.250.0."))
            }
        },
    )
    .await;
    assert!(fresh.starts_with("10.250.0."));

    let second = call(&b, "c-b2").await;
    assert_eq!(second.code, 0, "{}", second.stdout);
    assert!(
        second.addr().starts_with("10.60.0.") && second.addr() != first.addr(),
        "the earlier sandbox's pool, blue: {}",
        second.stdout
    );
    agent.stop().await;
}
