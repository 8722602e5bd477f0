//! The server's version and who a token says its holder is: a server configured as 1.30 and
//! SelfSubjectReview, which the binaries' preflight checks read.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use tidepool_tests::{ADMIN, ApiServer, Config, NODE_NAME_EXTRA, NODE_UID_EXTRA};

use crate::common::*;

async fn get(server: &ApiServer, path: &str) -> Value {
    let (code, _, body) = raw(server, "GET", path, Some(server.token(ADMIN)), None).await;
    assert_eq!(code, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("json")
}

/// tidepool's CRDs created; the ipamblocks CRD as stored.
async fn install_blocks_crd(client: &kube::Client) -> CustomResourceDefinition {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in tidepool_api::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("CRD");
    }
    crds.get("ipamblocks.ipam.tidepool.dev").await.expect("CRD")
}

/// A server configured as Kubernetes 1.30 reports it at /version and behaves as 1.30 with its
/// default gates, where CustomResourceFieldSelectors is alpha and off: a CRD's
/// selectableFields are dropped when it is written (kubernetes/apiextensions-apiserver
/// `pkg/registry/customresourcedefinition/strategy.go` `dropDisabledFields`, v1.30.0), so a
/// field selector on `spec.node` is answered 400 `field label not supported: spec.node`
/// (`pkg/apiserver/conversion/converter.go` `crConverter.ConvertFieldLabel`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_30_server_drops_selectable_fields_and_refuses_the_field_selector() {
    let server = ApiServer::start_with(Config {
        git_version: "v1.30.4".into(),
        ..fast_config()
    })
    .await
    .expect("start");
    let v = get(&server, "/version").await;
    assert_eq!(
        (&v["major"], &v["minor"]),
        (&json!("1"), &json!("30")),
        "{v}"
    );
    assert_eq!(v["gitVersion"], "v1.30.4");
    let client = server.client(ADMIN).await.expect("client");
    let stored = install_blocks_crd(&client).await;
    assert_eq!(stored.spec.versions[0].selectable_fields, None);
    let blocks: Api<tidepool_api::IPAMBlock> = Api::all(client.clone());
    let err = blocks
        .list(&ListParams::default().fields("spec.node=").limit(1))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 400, "{err}");
    assert_eq!(status(&err).reason, "BadRequest");
    assert_eq!(status(&err).message, "field label not supported: spec.node");

    // the default server is 1.33: the field is kept and the selector served
    let (now, client) = start().await;
    assert_eq!(get(&now, "/version").await["minor"], "33");
    let stored = install_blocks_crd(&client).await;
    assert!(stored.spec.versions[0].selectable_fields.is_some());
    let blocks: Api<tidepool_api::IPAMBlock> = Api::all(client);
    let listed = blocks
        .list(&ListParams::default().fields("spec.node=").limit(1))
        .await
        .expect("served");
    assert!(listed.items.is_empty());
}

/// SelfSubjectReview (authentication.k8s.io/v1) answers the caller's user name, groups and
/// extra, 201 with `metadata.creationTimestamp` set (kubernetes/kubernetes
/// `pkg/registry/authentication/selfsubjectreview/rest.go` `REST.Create`), to any
/// authenticated user under RBAC (the bootstrap `system:basic-user` role), and discovery
/// lists it, create only. An identity bound to a node (`NAME@NODE`) carries the node-name
/// extra (and the node's UID once the Node exists); one without `@NODE` stands for a token
/// not bound to a pod, or minted with ServiceAccountTokenPodNodeInfo off: no extra.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_subject_review_answers_who_the_caller_is() {
    let server = ApiServer::start_with(Config {
        rbac: true,
        ..fast_config()
    })
    .await
    .expect("start");
    let admin = server.client(ADMIN).await.expect("client");
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-a"}})).unwrap();
    let node = Api::<Node>::all(admin)
        .create(&PostParams::default(), &node)
        .await
        .expect("node");
    let agent = "system:serviceaccount:tidepool:tidepool-agent";
    let review = |identity: String| {
        let server = &server;
        async move {
            let client = server.client(&identity).await.expect("client");
            Api::<SelfSubjectReview>::all(client)
                .create(&PostParams::default(), &SelfSubjectReview::default())
                .await
                .expect("a review")
        }
    };
    let bound = review(format!("{agent}@node-a")).await;
    assert!(bound.metadata.creation_timestamp.is_some());
    let user = bound.status.unwrap().user_info.unwrap();
    assert_eq!(user.username.as_deref(), Some(agent));
    assert_eq!(
        user.groups.unwrap(),
        [
            "system:serviceaccounts",
            "system:serviceaccounts:tidepool",
            "system:authenticated"
        ]
    );
    let extra = user.extra.unwrap();
    assert_eq!(extra[NODE_NAME_EXTRA], ["node-a"]);
    assert_eq!(extra[NODE_UID_EXTRA], [node.metadata.uid.unwrap()]);
    let unbound = review(agent.to_string()).await;
    let user = unbound.status.unwrap().user_info.unwrap();
    assert_eq!(user.username.as_deref(), Some(agent));
    assert_eq!(user.extra, None, "no extra at all");

    let (code, _, body) = raw(
        &server,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        Some(server.token("someone")),
        Some(r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "SelfSubjectReview");
    assert_eq!(
        v["status"]["userInfo"],
        json!({"username": "someone", "groups": ["system:authenticated"]})
    );

    let groups = get(&server, "/apis").await;
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "authentication.k8s.io"),
        "{groups}"
    );
    let resources = get(&server, "/apis/authentication.k8s.io/v1").await;
    assert_eq!(
        resources["resources"],
        json!([{"name": "selfsubjectreviews", "singularName": "selfsubjectrulesreview",
            "namespaced": false, "kind": "SelfSubjectReview", "verbs": ["create"]}])
    );
}
