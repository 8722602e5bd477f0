//! RBAC enforcement (`Config::rbac`) through the kube client: per rule a request it allows and
//! one it refuses, each refusal checked against the real server's words.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tidepool_tests::{ADMIN, ApiServer, Config};

const AGENT: &str = "system:serviceaccount:tidepool:agent@node-a";
const AGENT_USER: &str = "system:serviceaccount:tidepool:agent";

async fn rbac_server() -> (ApiServer, kube::Client) {
    let server = ApiServer::start_with(Config {
        rbac: true,
        ..fast_config()
    })
    .await
    .expect("start server");
    let admin = server.client(ADMIN).await.expect("admin client");
    (server, admin)
}

/// Applies RBAC objects (and namespaces) as the admin.
async fn grant(admin: &kube::Client, objects: serde_json::Value) {
    for o in objects.as_array().expect("a list of objects") {
        let obj = dynamic(o.clone());
        let gvk = kube::api::GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
        let (ar, caps) = kube::discovery::pinned_kind(admin, &gvk).await.unwrap();
        let ns = obj.metadata.namespace.clone();
        let api: Api<kube::api::DynamicObject> = match (caps.scope, ns) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(admin.clone(), &ns, &ar)
            }
            _ => Api::all_with(admin.clone(), &ar),
        };
        api.create(&PostParams::default(), &obj)
            .await
            .expect("create RBAC object");
    }
}

fn forbidden(r: Result<impl std::fmt::Debug, kube::Error>) -> String {
    let e = r.expect_err("should be refused");
    let s = status(&e);
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"), "{s:?}");
    s.message.clone()
}

fn cluster_role(name: &str, rules: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
           "metadata": {"name": name}, "rules": rules})
}

fn cluster_binding(name: &str, role: &str, subject: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": {"name": name},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
           "subjects": [subject]})
}

fn agent_subject() -> serde_json::Value {
    json!({"kind": "ServiceAccount", "name": "agent", "namespace": "tidepool"})
}

#[tokio::test]
async fn verbs_and_subresources_are_granted_one_by_one() {
    let (server, admin) = rbac_server().await;
    let nodes_admin = install_crd(&admin).await;
    nodes_admin
        .create(
            &PostParams::default(),
            &dynamic(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": {"name": "node-a"}, "spec": {}})),
        )
        .await
        .unwrap();
    grant(&admin, json!([
        cluster_role("agent", json!([
            {"apiGroups": ["ipam.tidepool.dev"], "resources": ["ipamnodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["ipam.tidepool.dev"], "resources": ["ipamnodes/status"], "verbs": ["patch"]}])),
        cluster_binding("agent", "agent", agent_subject()),
        cluster_role("spec-writer", json!([
            {"apiGroups": ["ipam.tidepool.dev"], "resources": ["ipamnodes"], "verbs": ["get", "patch"]}])),
        cluster_binding("spec-writer", "spec-writer", json!({"kind": "User", "name": "writer"})),
    ])).await;
    let agent: Api<kube::api::DynamicObject> =
        Api::all_with(server.client(AGENT).await.unwrap(), &ipamnode_resource());
    let status = json!({"status": {"used": {}}});

    agent.get("node-a").await.expect("get is granted");
    agent
        .list(&ListParams::default())
        .await
        .expect("list is granted");
    agent
        .patch_status("node-a", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the status subresource is granted");
    let msg = forbidden(agent.delete("node-a", &Default::default()).await);
    assert_eq!(
        msg,
        format!(
            "ipamnodes.ipam.tidepool.dev \"node-a\" is forbidden: User \"{AGENT_USER}\" \
                 cannot delete resource \"ipamnodes\" in API group \"ipam.tidepool.dev\" at the \
                 cluster scope"
        )
    );
    let msg = forbidden(
        agent
            .patch(
                "node-a",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {}})),
            )
            .await,
    );
    assert!(
        msg.contains("cannot patch resource \"ipamnodes\" in API group"),
        "{msg}"
    );

    let writer: Api<kube::api::DynamicObject> =
        Api::all_with(server.client("writer").await.unwrap(), &ipamnode_resource());
    writer
        .patch(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {}})),
        )
        .await
        .expect("the main resource is granted");
    let msg = forbidden(
        writer
            .patch_status("node-a", &PatchParams::default(), &Patch::Merge(&status))
            .await,
    );
    assert_eq!(
        msg,
        "ipamnodes.ipam.tidepool.dev \"node-a\" is forbidden: User \"writer\" cannot patch \
         resource \"ipamnodes/status\" in API group \"ipam.tidepool.dev\" at the cluster scope"
    );
    let msg = forbidden(writer.list(&ListParams::default()).await);
    assert_eq!(
        msg,
        "ipamnodes.ipam.tidepool.dev is forbidden: User \"writer\" cannot list resource \
         \"ipamnodes\" in API group \"ipam.tidepool.dev\" at the cluster scope"
    );
    // watch and deletecollection are verbs of their own
    let granted = agent
        .watch(&kube::api::WatchParams::default().timeout(1), "0")
        .await
        .expect("the agent may watch");
    drop(granted);
    let e = writer
        .watch(&kube::api::WatchParams::default().timeout(1), "0")
        .await
        .err()
        .expect("the writer may not watch");
    assert!(
        common::status(&e)
            .message
            .contains("User \"writer\" cannot watch resource \"ipamnodes\""),
        "{e:?}"
    );
    let msg = forbidden(
        agent
            .delete_collection(&Default::default(), &ListParams::default())
            .await,
    );
    assert!(
        msg.contains(&format!(
            "User \"{AGENT_USER}\" cannot deletecollection resource \"ipamnodes\""
        )),
        "{msg}"
    );
}

#[tokio::test]
async fn role_bindings_hold_in_their_namespace_only() {
    let (server, admin) = rbac_server().await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    for ns in ["tidepool", "other"] {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await
            .unwrap();
    }
    grant(&admin, json!([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "cm", "namespace": "tidepool"},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "cm", "namespace": "tidepool"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm"},
         // a ServiceAccount subject without a namespace is the binding's own
         "subjects": [{"kind": "ServiceAccount", "name": "agent"}]},
    ])).await;
    let client = server.client(AGENT).await.unwrap();
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"a": "b"}})).unwrap()
    };
    let here: Api<ConfigMap> = Api::namespaced(client.clone(), "tidepool");
    here.create(&PostParams::default(), &cm("x"))
        .await
        .expect("granted in its namespace");
    here.get("x").await.expect("granted in its namespace");
    let there: Api<ConfigMap> = Api::namespaced(client.clone(), "other");
    let msg = forbidden(there.create(&PostParams::default(), &cm("x")).await);
    assert_eq!(
        msg,
        format!(
            "configmaps is forbidden: User \"{AGENT_USER}\" cannot create resource \
                 \"configmaps\" in API group \"\" in the namespace \"other\""
        )
    );
    let everywhere: Api<ConfigMap> = Api::all(client);
    let msg = forbidden(everywhere.list(&ListParams::default()).await);
    assert!(
        msg.ends_with("cannot list resource \"configmaps\" in API group \"\" at the cluster scope"),
        "{msg}"
    );

    // a revoked binding holds no more, from the next request on
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> = Api::namespaced(admin, "tidepool");
    bindings.delete("cm", &Default::default()).await.unwrap();
    let msg = forbidden(here.get("x").await);
    assert!(msg.contains("cannot get resource \"configmaps\""), "{msg}");
}

#[tokio::test]
async fn names_groups_missing_roles_and_apply_that_creates() {
    let (server, admin) = rbac_server().await;
    grant(&admin, json!([
        // RBAC names are path segments: `system:`-style names are fine
        cluster_role("tidepool:one-cm", json!([
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "watch", "list", "patch"],
             "resourceNames": ["mine"]}])),
        cluster_binding("tidepool:one-cm", "tidepool:one-cm", json!({"kind": "Group", "name": "system:serviceaccounts:tidepool"})),
        cluster_binding("ghost", "ghost", agent_subject()),
    ])).await;
    let agent: Api<ConfigMap> = Api::namespaced(server.client(AGENT).await.unwrap(), "default");
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    admin_cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "theirs"}})).unwrap(),
        )
        .await
        .unwrap();

    // resourceNames: a named get, and a list selecting that name, are granted
    let msg = forbidden(agent.get("theirs").await);
    assert_eq!(
        msg,
        format!(
            "configmaps \"theirs\" is forbidden: User \"{AGENT_USER}\" cannot get resource \
                 \"configmaps\" in API group \"\" in the namespace \"default\": RBAC: \
                 clusterrole.rbac.authorization.k8s.io \"ghost\" not found"
        )
    );
    agent
        .list(&ListParams::default().fields("metadata.name=mine"))
        .await
        .expect("a list selecting the granted name");
    let msg = forbidden(agent.list(&ListParams::default()).await);
    assert!(msg.contains("cannot list resource \"configmaps\""), "{msg}");

    // server-side apply that would create needs `create` as well as `patch`
    let apply = PatchParams::apply("agent");
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mine"}, "data": {"k": "v"}});
    let msg = forbidden(agent.patch("mine", &apply, &Patch::Apply(&body)).await);
    assert!(
        msg.starts_with(&format!(
            "configmaps \"mine\" is forbidden: User \"{AGENT_USER}\" cannot create resource"
        )),
        "{msg}"
    );
    admin_cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "mine"}})).unwrap(),
        )
        .await
        .unwrap();
    agent
        .patch("mine", &apply, &Patch::Apply(&body))
        .await
        .expect("apply to an existing object is a patch");

    // the admin is never checked; no credentials is system:anonymous
    admin_cms
        .delete("theirs", &Default::default())
        .await
        .expect("admin");
    let (code, _, body) = raw(
        &server,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        None,
        None,
    )
    .await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(r#"User \"system:anonymous\" cannot list resource \"configmaps\""#),
        "{body}"
    );
}

/// A node-bound identity carries the node's name, and its UID when the Node exists at mint
/// time, as a bound service-account token does.
#[tokio::test]
async fn node_bound_identities_carry_the_nodes_name_and_uid() {
    use tidepool_tests::{NODE_NAME_EXTRA, NODE_UID_EXTRA};
    let (server, admin) = rbac_server().await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin);
    let node = nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node-a"}})).unwrap(),
        )
        .await
        .unwrap();
    let user = server.user(AGENT);
    assert_eq!(user.name, AGENT_USER);
    assert_eq!(user.extra[NODE_NAME_EXTRA], ["node-a"]);
    assert_eq!(user.extra[NODE_UID_EXTRA], [node.metadata.uid.unwrap()]);
    let early = server.user("system:serviceaccount:tidepool:agent@node-b");
    assert_eq!(early.extra[NODE_NAME_EXTRA], ["node-b"]);
    assert!(
        !early.extra.contains_key(NODE_UID_EXTRA),
        "no Node node-b yet"
    );
}

#[tokio::test]
async fn failed_requests_are_recorded_with_requester_and_the_servers_words() {
    let (server, admin) = rbac_server().await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "seen"}})).unwrap(),
    )
    .await
    .expect("the admin creates");
    cms.get("seen").await.expect("the admin reads");
    assert!(server.failed_requests().is_empty(), "nothing failed yet");

    let agent: Api<ConfigMap> = Api::namespaced(server.client(AGENT).await.unwrap(), "default");
    let message = forbidden(agent.get("seen").await);
    let missing = cms.get("missing").await.expect_err("no such object");
    assert_eq!(status(&missing).code, 404);

    let failed = server.failed_requests();
    assert_eq!(failed.len(), 2, "{failed:?}");
    let refused = &failed[0];
    assert_eq!(
        (
            refused.identity.as_str(),
            refused.verb.as_str(),
            refused.resource.as_str()
        ),
        (AGENT, "get", "configmaps")
    );
    assert_eq!(
        (refused.namespace.as_deref(), refused.name.as_deref()),
        (Some("default"), Some("seen"))
    );
    assert_eq!((refused.code, refused.reason.as_str()), (403, "Forbidden"));
    assert_eq!(refused.message, message);
    assert!(refused.is_refusal());
    assert_eq!((failed[1].identity.as_str(), failed[1].code), (ADMIN, 404));
    assert_eq!(failed[1].reason, "NotFound");
    assert!(!failed[1].is_refusal(), "a missing object is no refusal");
}
