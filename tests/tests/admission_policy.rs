//! ValidatingAdmissionPolicy through the kube client: the agent's own-node policy (DESIGN.md
//! "Scope") allows and refuses by the node its token is bound to, and the refusals, failure
//! policies, actions and creation-time checks read as the real server's.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use common::*;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tidepool_tests::{ADMIN, ApiServer};

const POLICY: &str = "tidepool-agent-own-node";

/// The policy of DESIGN.md "Scope": the agent writes only its own node's IPAMNode and blocks.
fn own_node_policy() -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["ipam.tidepool.dev"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE", "DELETE"],
                "resources": ["ipamnodes", "ipamnodes/status"]}]},
            "matchConditions": [{"name": "is-agent",
                "expression": "request.userInfo.username == 'system:serviceaccount:tidepool:agent'"}],
            "variables": [{"name": "node",
                "expression": "'authentication.kubernetes.io/node-name' in request.userInfo.extra ? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''"}],
            "validations": [
                {"expression": "variables.node != ''",
                 "message": "the agent's token must be bound to a node"},
                {"expression": "request.name == variables.node",
                 "messageExpression": "'agent on node ' + variables.node + ' may not write ' + request.resource.resource + ' ' + request.name"},
            ],
        },
    })
}

fn binding(name: &str, policy: &str, actions: &[&str]) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": policy, "validationActions": actions},
    })
}

async fn create(client: &kube::Client, v: Value) -> Result<DynamicObject, kube::Error> {
    let obj = dynamic(v);
    let gvk = kube::api::GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
    let (ar, _) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    Api::<DynamicObject>::all_with(client.clone(), &ar)
        .create(&PostParams::default(), &obj)
        .await
}

/// A server with the IPAMNode CRD, IPAMNodes node-a and node-b, and `policies` created.
async fn setup(policies: Vec<Value>) -> (ApiServer, Api<DynamicObject>) {
    let server = ApiServer::start_with(fast_config()).await.unwrap();
    let admin = server.client(ADMIN).await.unwrap();
    let nodes = install_crd(&admin).await;
    for n in ["node-a", "node-b"] {
        nodes
            .create(
                &PostParams::default(),
                &dynamic(json!({
                "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
                "metadata": {"name": n}, "spec": {}})),
            )
            .await
            .unwrap();
    }
    for p in policies {
        create(&admin, p).await.expect("policy accepted");
    }
    (server, nodes)
}

async fn nodes_as(server: &ApiServer, identity: &str) -> Api<DynamicObject> {
    Api::all_with(server.client(identity).await.unwrap(), &ipamnode_resource())
}

fn status_patch() -> Patch<Value> {
    Patch::Merge(json!({"status": {"used": {}}}))
}

fn refused(r: Result<DynamicObject, kube::Error>, code: u16) -> kube::core::Status {
    let e = r.expect_err("should be refused");
    let s = status(&e).clone();
    assert_eq!(s.code, code, "{s:?}");
    s
}

#[tokio::test]
async fn the_agent_writes_only_its_own_nodes_objects() {
    let (server, admin_nodes) =
        setup(vec![own_node_policy(), binding(POLICY, POLICY, &["Deny"])]).await;
    let agent = nodes_as(&server, "system:serviceaccount:tidepool:agent@node-a").await;
    let pp = PatchParams::default();
    agent
        .patch_status("node-a", &pp, &status_patch())
        .await
        .expect("its own node");
    let s = refused(
        agent.patch_status("node-b", &pp, &status_patch()).await,
        422,
    );
    let why = format!(
        "ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: agent on \
         node node-a may not write ipamnodes node-b"
    );
    assert_eq!(s.reason, "Invalid");
    assert_eq!(
        s.message,
        format!("ipamnodes.ipam.tidepool.dev \"node-b\" is forbidden: {why}")
    );
    let details = s.details.expect("details");
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        ("node-b", "ipamnodes")
    );
    assert_eq!(details.causes[0].message, why);

    let unbound = nodes_as(&server, "system:serviceaccount:tidepool:agent").await;
    let s = refused(
        unbound.patch_status("node-a", &pp, &status_patch()).await,
        422,
    );
    assert!(
        s.message
            .ends_with("denied request: the agent's token must be bound to a node"),
        "{}",
        s.message
    );

    // the policy's match condition leaves everybody else alone
    admin_nodes
        .patch_status("node-b", &pp, &status_patch())
        .await
        .expect("the admin");
    let other = nodes_as(&server, "system:serviceaccount:tidepool:operator@node-a").await;
    other
        .patch_status("node-b", &pp, &status_patch())
        .await
        .expect("another account");
    // deletes are checked on the old object's name
    let s = refused(
        agent
            .delete("node-b", &Default::default())
            .await
            .map(|_| dynamic(json!({}))),
        422,
    );
    assert!(
        s.message.contains("may not write ipamnodes node-b"),
        "{}",
        s.message
    );
}

#[tokio::test]
async fn failure_policies_reasons_and_warnings() {
    let policy = |name: &str, failure: &str, expression: &str, reason: Option<&str>| {
        let mut v = json!({"expression": expression});
        if let Some(r) = reason {
            v["reason"] = json!(r);
        }
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {"failurePolicy": failure,
                "matchConstraints": {"resourceRules": [{"apiGroups": ["ipam.tidepool.dev"],
                    "apiVersions": ["v1alpha1"], "operations": ["UPDATE"], "resources": ["ipamnodes"],
                    "resourceNames": [name.trim_start_matches("p-")]}]},
                "validations": [v]}})
    };
    let (server, _) = setup(vec![
        // node-a: an expression that errors (no such key), failing closed
        policy("p-node-a", "Fail", "object.spec.missing == 'x'", None),
        binding("b-node-a", "p-node-a", &["Deny"]),
        // node-b: the same failing open, plus a false validation that only warns
        policy("p-node-b", "Ignore", "object.spec.missing == 'x'", None),
        binding("b-node-b", "p-node-b", &["Deny"]),
    ])
    .await;
    let admin = server.client(ADMIN).await.unwrap();
    let tester = nodes_as(&server, "tester").await;
    let spec = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
    let s = refused(
        tester.patch("node-a", &PatchParams::default(), &spec).await,
        422,
    );
    assert!(
        s.message.contains(
            "denied request: expression 'object.spec.missing == 'x'' resulted in error: "
        ),
        "{}",
        s.message
    );
    tester
        .patch("node-b", &PatchParams::default(), &spec)
        .await
        .expect("failurePolicy Ignore");
    tester
        .patch_status("node-a", &PatchParams::default(), &status_patch())
        .await
        .expect("a rule for `ipamnodes` leaves `ipamnodes/status` alone");

    // reason Forbidden answers 403; Warn lets the write through with a Warning header
    let mut p = policy("p-forbidden", "Fail", "false", Some("Forbidden"));
    p["spec"]["matchConstraints"]["resourceRules"][0]["resourceNames"] = json!(["node-b"]);
    create(&admin, p).await.unwrap();
    let mut p = policy("p-warn", "Fail", "object.metadata.name != 'node-b'", None);
    p["spec"]["matchConstraints"]["resourceRules"][0]["resourceNames"] = json!(["node-b"]);
    create(&admin, p).await.unwrap();
    create(&admin, binding("b-warn", "p-warn", &["Warn"]))
        .await
        .unwrap();
    let (code, headers, body) = raw_typed(
        &server,
        "PATCH",
        "/apis/ipam.tidepool.dev/v1alpha1/ipamnodes/node-b",
        Some(server.token("tester")),
        Some(r#"{"metadata": {"labels": {"w": "1"}}}"#),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let warning = headers
        .iter()
        .find(|(k, _)| k == "warning")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    assert!(
        warning.contains("Validation failed for ValidatingAdmissionPolicy 'p-warn' with binding 'b-warn': failed expression: object.metadata.name != 'node-b'"),
        "{warning}"
    );
    create(&admin, binding("b-forbidden", "p-forbidden", &["Deny"]))
        .await
        .unwrap();
    let s = refused(
        tester.patch("node-b", &PatchParams::default(), &spec).await,
        403,
    );
    assert_eq!(s.reason, "Forbidden");
    assert!(
        s.message
            .ends_with("denied request: failed expression: false"),
        "{}",
        s.message
    );
}

#[tokio::test]
async fn what_cannot_be_enforced_is_refused_when_written() {
    let (server, _) = setup(vec![]).await;
    let admin = server.client(ADMIN).await.unwrap();
    let mut p = own_node_policy();
    p["spec"]["validations"][1]["expression"] =
        json!("request.name.lowerAscii() == variables.node");
    let e = create(&admin, p).await.expect_err("refused");
    let s = status(&e);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(
        s.message.starts_with(&format!(
            "ValidatingAdmissionPolicy.admissionregistration.k8s.io \"{POLICY}\" is invalid: \
             spec.validations[1].expression: Invalid value: \"request.name.lowerAscii() == \
             variables.node\": compilation failed: ERROR: <input>: undeclared reference to \
             'lowerAscii'"
        )),
        "{}",
        s.message
    );
    let mut p = own_node_policy();
    p["spec"]["validations"][0]["expression"] = json!("variables.node != '");
    let s = status(&create(&admin, p).await.expect_err("refused")).clone();
    assert!(s.message.contains("spec.validations[0].expression: Invalid value: \"variables.node != '\": compilation failed: ERROR: <input>:1:"), "{}", s.message);
    // `params` is declared only with a paramKind (k8s.io/kubernetes pkg/apis/
    // admissionregistration/validation/validation.go `validateValidation`: HasParams)
    let mut p = own_node_policy();
    p["spec"]["validations"][0]["expression"] = json!("params.x == 1");
    let s = status(&create(&admin, p).await.expect_err("refused")).clone();
    assert!(
        s.message.contains("spec.validations[0].expression: Invalid value: \"params.x == 1\": compilation failed: ERROR: <input>: undeclared reference to 'params'"),
        "{}",
        s.message
    );
    // `validateParamKind`
    let mut p = own_node_policy();
    p["spec"]["paramKind"] = json!({"kind": "ConfigMap"});
    let s = status(&create(&admin, p).await.expect_err("refused")).clone();
    assert!(
        s.message
            .contains("spec.paramKind.apiVersion: Required value"),
        "{}",
        s.message
    );
    // `authorizer` is not evaluated here: refused, naming it
    let mut p = own_node_policy();
    p["spec"]["validations"][0]["expression"] =
        json!("authorizer.group('').resource('pods').check('get').allowed()");
    let s = status(&create(&admin, p).await.expect_err("refused")).clone();
    assert!(
        s.message.contains("spec.validations[0].expression: Forbidden: the 'authorizer' variable is not evaluated by this test server"),
        "{}",
        s.message
    );
    // `validateParamRef`
    let mut b = binding("b", POLICY, &["Deny"]);
    b["spec"]["paramRef"] =
        json!({"name": "x", "selector": {}, "parameterNotFoundAction": "Block"});
    let s = status(&create(&admin, b).await.expect_err("refused")).clone();
    for cause in [
        "spec.paramRef.name: Forbidden: name and selector are mutually exclusive",
        "spec.paramRef.selector: Forbidden: name and selector are mutually exclusive",
        "spec.paramRef.parameterNotFoundAction: Unsupported value: \"Block\": supported values: \"Deny\", \"Allow\"",
    ] {
        assert!(s.message.contains(cause), "{cause}: {}", s.message);
    }
    let mut b = binding("b", POLICY, &["Deny"]);
    b["spec"]["paramRef"] = json!({});
    let s = status(&create(&admin, b).await.expect_err("refused")).clone();
    for cause in [
        "spec.paramRef: Required value: one of name or selector must be specified",
        "spec.paramRef.parameterNotFoundAction: Required value",
    ] {
        assert!(s.message.contains(cause), "{cause}: {}", s.message);
    }
    let s = status(
        &create(&admin, binding("b", POLICY, &["Deny", "Warn"]))
            .await
            .expect_err("refused"),
    )
    .clone();
    assert!(
        s.message.contains("spec.validationActions: Invalid value"),
        "{}",
        s.message
    );
    let s = status(
        &create(&admin, binding("b", POLICY, &[]))
            .await
            .expect_err("refused"),
    )
    .clone();
    assert!(
        s.message.contains("spec.validationActions: Required value"),
        "{}",
        s.message
    );
    create(&admin, own_node_policy())
        .await
        .expect("the policy as written in DESIGN.md compiles");
}

#[tokio::test]
async fn admission_denials_are_recorded_as_refusals() {
    let (server, _) = setup(vec![own_node_policy(), binding(POLICY, POLICY, &["Deny"])]).await;
    let identity = "system:serviceaccount:tidepool:agent@node-a";
    let agent = nodes_as(&server, identity).await;
    let pp = PatchParams::default();
    agent
        .patch_status("node-a", &pp, &status_patch())
        .await
        .expect("its own node");
    assert!(server.failed_requests().is_empty(), "nothing failed yet");
    let s = refused(
        agent.patch_status("node-b", &pp, &status_patch()).await,
        422,
    );
    let failed = server.failed_requests();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let f = &failed[0];
    assert_eq!(
        (f.identity.as_str(), f.verb.as_str(), f.resource.as_str()),
        (identity, "patch", "ipamnodes.ipam.tidepool.dev/status")
    );
    assert_eq!((f.code, f.reason.as_str()), (422, "Invalid"));
    assert_eq!(f.message, s.message);
    assert!(
        f.is_refusal(),
        "an admission denial is a refusal whatever its code"
    );
}

/// The bundle's `tidepool-node-uid` policy (deploy/operator/rbac.yaml): only the operator's
/// service account may change an IPAMNode's `spec.nodeUID`, by apply or by patch; anyone may
/// still patch `spec.pools` and `spec.watermarks`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_operator_changes_an_ipamnodes_node_uid() {
    let (server, admin) = operator_cluster().await;
    let uid = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
    let operator = server.client(OPERATOR).await.unwrap();
    let as_operator: Api<DynamicObject> = Api::all_with(operator, &ipamnode_resource());
    let node = json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": {"name": "node-a"}, "spec": {"nodeUID": uid}});
    as_operator
        .create(&PostParams::default(), &dynamic(node))
        .await
        .expect("the operator creates it");
    let nodes: Api<DynamicObject> = Api::all_with(admin.clone(), &ipamnode_resource());
    let pp = PatchParams::default();
    let users =
        Patch::Merge(json!({"spec": {"pools": {"ipv4": "gpu"}, "watermarks": {"preAllocate": 4}}}));
    nodes
        .patch("node-a", &pp, &users)
        .await
        .expect("the users' fields");
    let other = "6f1c2a9e-3b7d-4c1a-9e2f-0a1b2c3d4e5f";
    let why = "ValidatingAdmissionPolicy 'tidepool-node-uid' with binding 'tidepool-node-uid' \
        denied request: only the tidepool operator may change spec.nodeUID of ipamnode node-a";
    let by_patch = Patch::Merge(json!({"spec": {"nodeUID": other}}));
    let s = refused(nodes.patch("node-a", &pp, &by_patch).await, 403);
    assert_eq!(
        s.message,
        format!("ipamnodes.ipam.tidepool.dev \"node-a\" is forbidden: {why}")
    );
    let apply = Patch::Apply(
        json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": {"name": "node-a"}, "spec": {"nodeUID": other}}),
    );
    let s = refused(
        nodes
            .patch("node-a", &PatchParams::apply("kubectl").force(), &apply)
            .await,
        403,
    );
    assert!(s.message.ends_with(why), "{}", s.message);
    as_operator
        .patch("node-a", &pp, &by_patch)
        .await
        .expect("the operator may");
}

/// A policy on ConfigMap CREATEs named `names` whose params are IPPools: a ConfigMap may not
/// take the name of a param (`validation` overrides the expression).
fn pool_param_policy(name: &str, names: &[&str], failure: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": failure,
            "paramKind": {"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool"},
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["configmaps"], "resourceNames": names}]},
            "validations": [{"expression": "object.metadata.name != params.metadata.name",
                "messageExpression": "'configmap ' + object.metadata.name + ' takes the name of IPPool ' + params.metadata.name"}]}})
}

fn param_binding(name: &str, policy: &str, param_ref: Value) -> Value {
    let mut b = binding(name, policy, &["Deny"]);
    b["spec"]["paramRef"] = param_ref;
    b
}

fn ippool(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name, "labels": labels},
        "spec": {"cidrs": ["10.0.0.0/16"], "blockSize": {"ipv4": 24}}})
}

fn configmap(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"}})
}

/// A server with every tidepool CRD and `objects` created.
async fn params_setup(objects: Vec<Value>) -> (ApiServer, kube::Client) {
    let server = ApiServer::start_with(fast_config()).await.unwrap();
    let admin = server.client(ADMIN).await.unwrap();
    for crd in tidepool_api::crds() {
        create_established(&admin, &crd).await;
    }
    for o in objects {
        create(&admin, o).await.expect("accepted");
    }
    (server, admin)
}

/// `paramKind` and `paramRef` as kube-apiserver's policy dispatcher resolves them
/// (k8s.io/apiserver pkg/admission/plugin/policy/generic/policy_dispatcher.go
/// `CollectParams`, validating/dispatcher.go `Dispatch`): a selector evaluates the policy
/// once per matching param and every one must pass; a name, one param; none found is
/// allowed, or refused by `parameterNotFoundAction: Deny` as a configuration error of the
/// binding (failurePolicy decides); a paramKind no resource serves is one of the policy
/// (policy_source.go `ensureParamsForPolicyLocked`); a policy with paramKind whose binding has
/// no paramRef runs once with `params` null.
#[tokio::test]
async fn params_are_collected_as_the_policy_dispatcher_collects_them() {
    let selected = json!({"selector": {"matchLabels": {"tier": "x"}},
        "parameterNotFoundAction": "Deny"});
    let (server, admin) = params_setup(vec![
        pool_param_policy(
            "p-selector",
            &["pool-a", "pool-b", "pool-c", "other"],
            "Fail",
        ),
        param_binding("b-selector", "p-selector", selected),
        pool_param_policy("p-by-name", &["named"], "Fail"),
        param_binding(
            "b-by-name",
            "p-by-name",
            json!({"name": "named", "parameterNotFoundAction": "Allow"}),
        ),
        pool_param_policy("p-ignored", &["ignored"], "Ignore"),
        param_binding(
            "b-ignored",
            "p-ignored",
            json!({"selector": {}, "parameterNotFoundAction": "Deny"}),
        ),
    ])
    .await;
    let cms: Api<DynamicObject> = Api::namespaced_with(
        server.client("tester").await.unwrap(),
        "default",
        &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    let pp = PostParams::default();
    let denied = "ValidatingAdmissionPolicy 'p-selector' with binding 'b-selector' denied \
        request: failed to configure binding: no params found for policy binding with `Deny` \
        parameterNotFoundAction";
    let s = refused(cms.create(&pp, &dynamic(configmap("other"))).await, 422);
    assert_eq!(s.reason, "Invalid");
    assert_eq!(
        s.message,
        format!("configmaps \"other\" is forbidden: {denied}")
    );
    cms.create(&pp, &dynamic(configmap("named")))
        .await
        .expect("Allow: no param named `named` yet");
    cms.create(&pp, &dynamic(configmap("ignored")))
        .await
        .expect("a binding's configuration error follows failurePolicy Ignore");

    for (name, tier) in [
        ("pool-a", "x"),
        ("pool-b", "x"),
        ("pool-c", "y"),
        ("named", "z"),
    ] {
        create(&admin, ippool(name, json!({"tier": tier})))
            .await
            .unwrap();
    }
    for name in ["pool-a", "pool-b"] {
        let s = refused(cms.create(&pp, &dynamic(configmap(name))).await, 422);
        assert!(
            s.message.ends_with(&format!(
                "denied request: configmap {name} takes the name of IPPool {name}"
            )),
            "every selected param is checked: {}",
            s.message
        );
    }
    cms.create(&pp, &dynamic(configmap("pool-c")))
        .await
        .expect("pool-c is not selected");
    cms.create(&pp, &dynamic(configmap("other")))
        .await
        .expect("params found, and every one passes");
    let public: Api<DynamicObject> = Api::namespaced_with(
        server.client("tester").await.unwrap(),
        "kube-public",
        &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    let mut named = configmap("named");
    named["metadata"]["namespace"] = json!("kube-public");
    let s = refused(public.create(&pp, &dynamic(named)).await, 422);
    assert!(
        s.message.contains("takes the name of IPPool named"),
        "{}",
        s.message
    );
}

/// The configuration errors of params, in the real server's words, and `params` null when a
/// binding of a policy with paramKind has no paramRef.
#[tokio::test]
async fn params_configuration_errors_and_a_binding_without_param_ref() {
    let mut unknown = pool_param_policy("p-unknown", &["unknown"], "Fail");
    unknown["spec"]["paramKind"] = json!({"apiVersion": "example.com/v1", "kind": "Nope"});
    let mut null = pool_param_policy("p-null", &["null"], "Fail");
    null["spec"]["validations"] =
        json!([{"expression": "params == null", "message": "params is set"}]);
    let (server, _) = params_setup(vec![
        unknown,
        param_binding(
            "b-unknown",
            "p-unknown",
            json!({"selector": {}, "parameterNotFoundAction": "Allow"}),
        ),
        pool_param_policy("p-namespaced", &["namespaced"], "Fail"),
        param_binding(
            "b-namespaced",
            "p-namespaced",
            json!({"name": "x", "namespace": "default", "parameterNotFoundAction": "Allow"}),
        ),
        null,
        binding("b-null", "p-null", &["Deny"]),
    ])
    .await;
    let cms: Api<DynamicObject> = Api::namespaced_with(
        server.client("tester").await.unwrap(),
        "default",
        &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    let pp = PostParams::default();
    let s = refused(cms.create(&pp, &dynamic(configmap("unknown"))).await, 422);
    assert_eq!(
        s.message,
        "configmaps \"unknown\" is forbidden: ValidatingAdmissionPolicy 'p-unknown' denied \
         request: failed to configure policy: failed to find resource referenced by paramKind: \
         'example.com/v1, Kind=Nope'"
    );
    let s = refused(
        cms.create(&pp, &dynamic(configmap("namespaced"))).await,
        422,
    );
    assert!(
        s.message.ends_with(
            "with binding 'b-namespaced' denied request: failed to configure binding: \
             paramRef.namespace must not be provided for a cluster-scoped `paramKind`"
        ),
        "{}",
        s.message
    );
    cms.create(&pp, &dynamic(configmap("null")))
        .await
        .expect("no paramRef: params is null");
}

/// `namespaceObject` (k8s.io/apiserver pkg/admission/plugin/cel/filter.go
/// `CreateNamespaceObject`): the request namespace's Namespace with its metadata's name,
/// labels, annotations, …, spec and status; null for a cluster-scoped resource.
#[tokio::test]
async fn namespace_object_is_the_requests_namespace() {
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "p-ns"},
        "spec": {"failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                 "resources": ["configmaps"]},
                {"apiGroups": ["ipam.tidepool.dev"], "apiVersions": ["v1alpha1"],
                 "operations": ["CREATE"], "resources": ["ippools"]}]},
            "validations": [
                {"expression": "request.namespace == '' ? namespaceObject == null : namespaceObject.metadata.name == request.namespace && namespaceObject.status.phase == 'Active' && !has(namespaceObject.metadata.managedFields)",
                 "message": "not the request's namespace"},
                {"expression": "namespaceObject == null || (has(namespaceObject.metadata.labels) && 'team' in namespaceObject.metadata.labels && namespaceObject.metadata.labels['team'] == 'a')",
                 "messageExpression": "'namespace ' + namespaceObject.metadata.name + ' is not team a'"}]}});
    let (server, admin) = params_setup(vec![policy, binding("b-ns", "p-ns", &["Deny"])]).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    for (ns, team) in [("team-a", "a"), ("team-b", "b")] {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                "metadata": {"name": ns, "labels": {"team": team}}}))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    let tester = server.client("tester").await.unwrap();
    let cm = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    let pp = PostParams::default();
    let ok = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
    Api::<DynamicObject>::namespaced_with(tester.clone(), "team-a", &cm)
        .create(&pp, &dynamic(ok.clone()))
        .await
        .expect("team a's namespace");
    let s = refused(
        Api::<DynamicObject>::namespaced_with(tester.clone(), "team-b", &cm)
            .create(&pp, &dynamic(ok))
            .await,
        422,
    );
    assert!(
        s.message
            .ends_with("denied request: namespace team-b is not team a"),
        "{}",
        s.message
    );
    create(&tester, ippool("cluster-scoped", json!({})))
        .await
        .expect("a cluster-scoped resource: namespaceObject is null");
}
