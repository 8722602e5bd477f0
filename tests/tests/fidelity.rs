//! Answers that must match the real kube-apiserver's (issue 12, fidelity gaps): media types,
//! object names, namespace deletion, CRD validation, list parameters and error wording.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;
mod fidelity {
    pub mod crd_rules;
    pub mod versions;
}

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tidepool_tests::{ApiServer, Config};

/// A raw request with a JSON body sent as `ctype`; returns the code and the parsed body.
async fn send(
    server: &ApiServer,
    method: &str,
    path: &str,
    body: Option<Value>,
    ctype: &str,
) -> (u16, Value) {
    let token = Some(server.token("tester"));
    let text = body.map(|b| b.to_string());
    let (code, _, out) = raw_typed(server, method, path, token, text.as_deref(), ctype).await;
    let v = serde_json::from_str(&out).unwrap_or(Value::String(out));
    (code, v)
}

/// A GET as `tester`.
async fn get(server: &ApiServer, path: &str) -> (u16, Value) {
    send(server, "GET", path, None, "").await
}

fn assert_status(v: &Value, code: u16, reason: &str, message: &str) {
    assert_eq!(v["kind"], "Status", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["reason"], reason, "{v}");
    assert_eq!(v["message"], message, "{v}");
}

const CM_PATH: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_body_media_types_are_415() {
    let (server, client) = start().await;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plain"}});
    let builtin = "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf";
    for ctype in ["text/plain", "application/xml"] {
        let (code, v) = send(&server, "POST", CM_PATH, Some(cm.clone()), ctype).await;
        assert_eq!(code, 415, "{ctype}: {v}");
        assert_status(&v, 415, "UnsupportedMediaType", builtin);
    }
    let (code, v) = send(
        &server,
        "POST",
        CM_PATH,
        Some(cm.clone()),
        "application/json",
    )
    .await;
    assert_eq!(code, 201, "{v}");
    let (code, v) = send(
        &server,
        "PUT",
        &format!("{CM_PATH}/plain"),
        Some(cm.clone()),
        "text/plain",
    )
    .await;
    assert_eq!(code, 415, "{v}");
    assert_status(&v, 415, "UnsupportedMediaType", builtin);
    // Custom resources are served as JSON and YAML only.
    install_crd(&client).await;
    let node = json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": {"name": "n1"}, "spec": {}});
    let (code, v) = send(
        &server,
        "POST",
        "/apis/ipam.tidepool.dev/v1alpha1/ipamnodes",
        Some(node),
        "text/plain",
    )
    .await;
    assert_eq!(code, 415, "{v}");
    assert_status(
        &v,
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_415_lists_strategic_merge_for_builtin_kinds() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap(),
    )
    .await
    .unwrap();
    let (code, v) = send(
        &server,
        "PATCH",
        &format!("{CM_PATH}/p"),
        Some(json!({"data": {"a": "b"}})),
        "text/plain",
    )
    .await;
    assert_eq!(code, 415, "{v}");
    assert_status(
        &v,
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml",
    );
}

fn invalid_causes(v: &Value) -> Vec<String> {
    v.pointer("/details/causes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|c| format!("{}: {}", c["field"].as_str().unwrap_or(""), c["message"]))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_dns_subdomains_and_namespace_names_dns_labels() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let long_label = "a".repeat(100);
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    cms.create(&PostParams::default(), &cm(&long_label))
        .await
        .expect("a 100-character single-label name is a valid DNS subdomain");
    let dotted = format!("{}.{}", "b".repeat(120), "c".repeat(120));
    cms.create(&PostParams::default(), &cm(&dotted))
        .await
        .expect("a 241-character dotted name is a valid DNS subdomain");
    let too_long = "d".repeat(254);
    let err = cms
        .create(&PostParams::default(), &cm(&too_long))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422);
    assert!(
        status(&err).message.contains(&format!(
            "metadata.name: Invalid value: \"{too_long}\": must be no more than 253 characters"
        )),
        "{}",
        status(&err).message
    );
    // Namespace names are DNS labels: the label wording, never the subdomain one.
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns = |name: &str| -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    let label64 = "e".repeat(64);
    let err = nss
        .create(&PostParams::default(), &ns(&label64))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422);
    assert_eq!(
        status(&err).message,
        format!(
            "Namespace \"{label64}\" is invalid: metadata.name: Invalid value: \"{label64}\": must be no more than 63 characters"
        )
    );
    let err = nss
        .create(&PostParams::default(), &ns("Bad_Name"))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422);
    assert_eq!(
        status(&err).message,
        "Namespace \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
    );
    nss.create(&PostParams::default(), &ns(&"f".repeat(63)))
        .await
        .expect("63 characters is a valid namespace name");
    // The subdomain wording for other kinds, as before.
    let (code_, v) = send(
        &server,
        "POST",
        CM_PATH,
        Some(json!({"metadata": {"name": "Upper"}})),
        "application/json",
    )
    .await;
    assert_eq!(code_, 422);
    assert_eq!(
        invalid_causes(&v),
        vec!["metadata.name: \"Invalid value: \\\"Upper\\\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')\"".to_string()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_have_no_deletecollection_and_system_namespaces_stay() {
    let (server, client) = start().await;
    let (code_, v) = send(
        &server,
        "DELETE",
        "/api/v1/namespaces",
        None,
        "application/json",
    )
    .await;
    assert_eq!(code_, 405, "{v}");
    assert_status(
        &v,
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
    );
    let nss: Api<Namespace> = Api::all(client.clone());
    for ns in ["default", "kube-system", "kube-public"] {
        let n = nss.get(ns).await.unwrap();
        assert!(n.metadata.deletion_timestamp.is_none(), "{ns} untouched");
        let err = nss.delete(ns, &DeleteParams::default()).await.unwrap_err();
        assert_eq!(code(&err), 403, "{ns}");
        let s = status(&err);
        assert_eq!(s.reason, "Forbidden");
        assert_eq!(
            s.message,
            format!("namespaces \"{ns}\" is forbidden: this namespace may not be deleted")
        );
        let n = nss.get(ns).await.unwrap();
        assert!(n.metadata.deletion_timestamp.is_none(), "{ns} still active");
    }
    // Other namespaces can still be deleted.
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "mortal"}})).unwrap(),
    )
    .await
    .unwrap();
    nss.delete("mortal", &DeleteParams::default())
        .await
        .expect("an ordinary namespace is deleted");
}

/// A valid CRD for `widgets.example.com`, changed by `edit`.
fn crd(edit: impl FnOnce(&mut Value)) -> Value {
    let mut c = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "replicas": {"type": "integer"},
                        "tags": {"type": "array", "items": {"type": "string"}}
                    }}
                }}}
            }]
        }
    });
    edit(&mut c);
    c
}

const SPEC_PATH: &str = "spec.versions[0].schema.openAPIV3Schema.properties[spec]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_crds_are_refused_with_field_paths() {
    let (server, _client) = start().await;
    let dns1035 = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
    let cases: Vec<(&str, Value, String)> = vec![
        (
            "duplicate version names",
            crd(|c| {
                let mut v = c["spec"]["versions"][0].clone();
                v["storage"] = json!(false);
                c["spec"]["versions"].as_array_mut().unwrap().push(v);
            }),
            "spec.versions: Invalid value: []apiextensions.CustomResourceDefinitionVersion{...}: must contain unique version names".into(),
        ),
        (
            "an upper-case version name",
            crd(|c| c["spec"]["versions"][0]["name"] = json!("V1")),
            format!("spec.versions[0].name: Invalid value: \"V1\": {dns1035}"),
        ),
        (
            "a group without a dot",
            crd(|c| {
                c["spec"]["group"] = json!("foo");
                c["metadata"]["name"] = json!("widgets.foo");
            }),
            "spec.group: Invalid value: \"foo\": should be a domain with at least one dot".into(),
        ),
        (
            "an array without items",
            crd(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                    ["properties"]["tags"] = json!({"type": "array"})
            }),
            format!("{SPEC_PATH}.properties[tags].items: Required value: must be specified"),
        ),
        (
            "a default of the wrong type",
            crd(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                    ["properties"]["replicas"]["default"] = json!("three")
            }),
            format!(
                "{SPEC_PATH}.properties[replicas].default: Invalid value: \"string\": {SPEC_PATH}.properties[replicas].default in body must be of type integer: \"string\""
            ),
        ),
        (
            "a root schema that is not an object",
            crd(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = json!({"type": "string"})
            }),
            "spec.versions[0].schema.openAPIV3Schema.type: Invalid value: \"string\": must be object at the root".into(),
        ),
        (
            "list-map keys without list-type map",
            crd(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                    ["properties"]["ports"] = json!({
                        "type": "array",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "required": ["name"],
                            "properties": {"name": {"type": "string"}}}
                    })
            }),
            format!(
                "{SPEC_PATH}.properties[ports].x-kubernetes-list-type: Required value: must be map if x-kubernetes-list-map-keys is non-empty"
            ),
        ),
    ];
    let path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    // Every case is checked before failing, so one run shows all that are accepted.
    let mut wrong = Vec::new();
    for (what, body, want) in cases {
        let (code_, v) = send(&server, "POST", path, Some(body), "application/json").await;
        let (f, m) = want.split_once(": ").unwrap();
        let has_cause = v
            .pointer("/details/causes")
            .and_then(Value::as_array)
            .is_some_and(|cs| cs.iter().any(|c| c["field"] == f && c["message"] == m));
        let msg = v["message"].as_str().unwrap_or("");
        if code_ != 422 || v["reason"] != "Invalid" || !msg.contains(&want) || !has_cause {
            wrong.push(format!("{what}: {code_}, want cause {want:?} in {v}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let (code_, v) = send(&server, "POST", path, Some(crd(|_| {})), "application/json").await;
    assert_eq!(code_, 201, "the valid CRD is accepted: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_list_parameters_are_refused() {
    let (server, _client) = start().await;
    let bad_request = [
        (
            "limit=abc",
            "strconv.ParseInt: parsing \"abc\": invalid syntax",
        ),
        (
            "timeoutSeconds=abc",
            "strconv.ParseInt: parsing \"abc\": invalid syntax",
        ),
        (
            "watch=true&timeoutSeconds=abc",
            "strconv.ParseInt: parsing \"abc\": invalid syntax",
        ),
        (
            "labelSelector=!!!",
            "unable to parse requirement: found '!', expected: identifier",
        ),
    ];
    for (q, msg) in bad_request {
        let (code_, v) = get(&server, &format!("{CM_PATH}?{q}")).await;
        assert_eq!(code_, 400, "{q}: {v}");
        assert_status(&v, 400, "BadRequest", msg);
    }
    // ListOptions validation: the real server answers these with 422 Invalid (ListResource
    // wraps ValidateListOptions' errors in NewInvalid for ListOptions.meta.k8s.io).
    let invalid = [
        (
            "resourceVersion=1&resourceVersionMatch=Sometimes",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: \"Sometimes\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
        ),
        (
            "resourceVersionMatch=NotOlderThan",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
    ];
    for (q, msg) in invalid {
        let (code_, v) = get(&server, &format!("{CM_PATH}?{q}")).await;
        assert_eq!(code_, 422, "{q}: {v}");
        assert_status(&v, 422, "Invalid", msg);
    }
    // Well-formed parameters still list.
    for q in [
        "limit=5",
        "labelSelector=!app",
        "resourceVersion=0&resourceVersionMatch=NotOlderThan",
    ] {
        let (code_, v) = get(&server, &format!("{CM_PATH}?{q}")).await;
        assert_eq!(code_, 200, "{q}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_kind_bodies_name_the_kinds() {
    let (server, client) = start().await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
    let (code_, v) = send(&server, "POST", CM_PATH, Some(pod), "application/json").await;
    assert_eq!(code_, 400, "{v}");
    assert_status(
        &v,
        400,
        "BadRequest",
        "Pod in version \"v1\" cannot be handled as a ConfigMap: converting (v1.Pod) to (core.ConfigMap): unknown conversion",
    );
    let lease = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}});
    let (code_, v) = send(
        &server,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        Some(lease),
        "application/json",
    )
    .await;
    assert_eq!(code_, 400, "{v}");
    assert_status(
        &v,
        400,
        "BadRequest",
        "Deployment in version \"v1\" cannot be handled as a Lease: converting (v1.Deployment) to (coordination.Lease): unknown conversion",
    );
    // A custom resource of the right group but another kind fails its type-meta validation.
    install_crd(&client).await;
    let other = json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": "n2"}, "spec": {}});
    let (code_, v) = send(
        &server,
        "POST",
        "/apis/ipam.tidepool.dev/v1alpha1/ipamnodes",
        Some(other),
        "application/json",
    )
    .await;
    assert_eq!(code_, 422, "{v}");
    assert_status(
        &v,
        422,
        "Invalid",
        "IPAMNode.ipam.tidepool.dev \"n2\" is invalid: kind: Invalid value: \"IPAMPool\": must be IPAMNode",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_in_a_terminating_namespace_name_the_object() {
    // The namespace stays terminating for the whole test.
    let server = ApiServer::start_with(Config {
        namespace_finalize_delay: Duration::from_secs(600),
        ..fast_config()
    })
    .await
    .unwrap();
    let client = server.client("tester").await.unwrap();
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap(),
    )
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    nss.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let late: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "late"}})).unwrap();
    let err = cms.create(&PostParams::default(), &late).await.unwrap_err();
    assert_eq!(code(&err), 403);
    let (code_, v) = send(
        &server,
        "POST",
        "/api/v1/namespaces/doomed/configmaps",
        Some(json!({"metadata": {"name": "late"}})),
        "application/json",
    )
    .await;
    assert_eq!(code_, 403);
    assert_status(
        &v,
        403,
        "Forbidden",
        "configmaps \"late\" is forbidden: unable to create new content in namespace doomed because it is being terminated",
    );
    assert_eq!(
        v["details"],
        json!({"name": "late", "kind": "configmaps", "causes": [{
            "reason": "NamespaceTerminating",
            "message": "namespace doomed is being terminated",
            "field": "metadata.namespace"
        }]})
    );
    // Without a name (generateName), the message and details have none either.
    let (code_, v) = send(
        &server,
        "POST",
        "/api/v1/namespaces/doomed/configmaps",
        Some(json!({"metadata": {"generateName": "late-"}})),
        "application/json",
    )
    .await;
    assert_eq!(code_, 403);
    assert_eq!(
        v["message"],
        "configmaps is forbidden: unable to create new content in namespace doomed because it is being terminated"
    );
    assert!(v["details"].get("name").is_none(), "{v}");
}

/// `pods/binding` as the scheduler uses it: a Binding sets `spec.nodeName` of an unbound
/// pod (201 Success); binding it again, or binding a pod being deleted, is the real 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_bound_through_the_binding_subresource_once() {
    let server = ApiServer::start_with(Config {
        kubelet_delay: None,
        ..Config::default()
    })
    .await
    .unwrap();
    let path = "/api/v1/namespaces/default/pods";
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "spec": {"containers": [{"name": "c", "image": "pause"}]}});
    let (code, _) = send(&server, "POST", path, Some(pod), "application/json").await;
    assert_eq!(code, 201);
    let binding = |node: &str| {
        json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
    };
    let bind = format!("{path}/p/binding");
    let (code, v) = send(
        &server,
        "POST",
        &bind,
        Some(binding("node-a")),
        "application/json",
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["status"], "Success", "{v}");
    let (_, got) = get(&server, &format!("{path}/p")).await;
    assert_eq!(got["spec"]["nodeName"], "node-a", "{got}");

    let (code, v) = send(
        &server,
        "POST",
        &bind,
        Some(binding("node-b")),
        "application/json",
    )
    .await;
    assert_eq!(code, 409);
    assert_status(
        &v,
        409,
        "Conflict",
        "Operation cannot be fulfilled on pods/binding \"p\": pod p is already assigned to node \"node-a\"",
    );
    let (_, got) = get(&server, &format!("{path}/p")).await;
    assert_eq!(got["spec"]["nodeName"], "node-a", "unchanged: {got}");

    // a bound pod deleted gracefully stays terminating: it cannot be bound (nor could an
    // unbound one, which goes at once)
    let q = send(
        &server,
        "DELETE",
        &format!("{path}/p"),
        None,
        "application/json",
    )
    .await;
    assert_eq!(q.0, 200);
    let (code, v) = send(
        &server,
        "POST",
        &bind,
        Some(binding("node-b")),
        "application/json",
    )
    .await;
    assert_eq!(code, 409, "{v}");
    let (code, _) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/pods/missing/binding",
        Some(binding("node-a")),
        "application/json",
    )
    .await;
    assert_eq!(code, 404);
}

/// `deployments/NAME/scale` as `kubectl scale` uses it: an autoscaling/v1 Scale showing the
/// Deployment's replicas and selector, listed in discovery; a merge PATCH or a PUT changes
/// `spec.replicas` of the Deployment alone; a stale resourceVersion is the real 409, a
/// negative count the real 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_scale_through_the_scale_subresource() {
    let (server, _) = start().await;
    let path = "/apis/apps/v1/namespaces/default/deployments";
    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web", "tier": "a"}},
                 "template": {"metadata": {"labels": {"app": "web", "tier": "a"}},
                              "spec": {"containers": [{"name": "c", "image": "pause"}]}}}});
    let (code, created) = send(&server, "POST", path, Some(deploy), "application/json").await;
    assert_eq!(code, 201, "{created}");
    let (_, list) = get(&server, "/apis/apps/v1").await;
    let entry = list["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .find(|r| r["name"] == "deployments/scale")
        .cloned()
        .unwrap_or_else(|| panic!("deployments/scale in discovery: {list}"));
    assert_eq!(
        (&entry["group"], &entry["version"], &entry["kind"]),
        (&json!("autoscaling"), &json!("v1"), &json!("Scale"))
    );

    let scale = format!("{path}/web/scale");
    let (code, s) = get(&server, &scale).await;
    assert_eq!(code, 200, "{s}");
    assert_eq!(s["kind"], "Scale");
    assert_eq!(s["apiVersion"], "autoscaling/v1");
    assert_eq!(s["spec"]["replicas"], 2);
    assert_eq!(
        s["status"]["replicas"], 0,
        "no controller wrote a status: {s}"
    );
    assert_eq!(s["status"]["selector"], "app=web,tier=a");
    assert_eq!(s["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(
        s["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );

    let patch = json!({"spec": {"replicas": 5}});
    let (code, s) = send(
        &server,
        "PATCH",
        &scale,
        Some(patch),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(code, 200, "{s}");
    assert_eq!(s["kind"], "Scale");
    assert_eq!(s["spec"]["replicas"], 5);
    let (_, d) = get(&server, &format!("{path}/web")).await;
    assert_eq!(d["spec"]["replicas"], 5, "{d}");
    assert_eq!(d["metadata"]["generation"], 2, "a spec change: {d}");
    assert_eq!(
        d["spec"]["template"], created["spec"]["template"],
        "only replicas changed"
    );
    assert_eq!(
        s["metadata"]["resourceVersion"],
        d["metadata"]["resourceVersion"]
    );

    // a PUT at a stale resourceVersion fails; at the current one it scales
    let mut put = s.clone();
    put["spec"]["replicas"] = json!(1);
    put["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    let (code, v) = send(
        &server,
        "PUT",
        &scale,
        Some(put.clone()),
        "application/json",
    )
    .await;
    assert_eq!(code, 409, "{v}");
    assert_status(
        &v,
        409,
        "Conflict",
        "Operation cannot be fulfilled on deployments.apps \"web\": the object has been modified; please apply your changes to the latest version and try again",
    );
    put["metadata"]["resourceVersion"] = s["metadata"]["resourceVersion"].clone();
    let (code, v) = send(
        &server,
        "PUT",
        &scale,
        Some(put.clone()),
        "application/json",
    )
    .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["spec"]["replicas"], 1);

    put["spec"]["replicas"] = json!(-1);
    put["metadata"]["resourceVersion"] = json!("");
    let (code, v) = send(&server, "PUT", &scale, Some(put), "application/json").await;
    assert_eq!(code, 422, "{v}");
    assert_status(
        &v,
        422,
        "Invalid",
        "Scale.autoscaling \"web\" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0",
    );
    let (_, d) = get(&server, &format!("{path}/web")).await;
    assert_eq!(
        d["spec"]["replicas"], 1,
        "unchanged by the refused PUT: {d}"
    );

    let (code, _) = get(&server, &format!("{path}/missing/scale")).await;
    assert_eq!(code, 404);
    let (code, _) = get(&server, &format!("{CM_PATH}/any/scale")).await;
    assert_eq!(code, 404, "config maps have no scale subresource");
}

// ---------------------------------------------------------------------------------------------
// Events (issue 25, "Events and kinds").

const EVENTS_V1: &str = "/apis/events.k8s.io/v1/namespaces";
const CORE_EVENTS: &str = "/api/v1/namespaces";

/// An events.k8s.io/v1 Event as kube's `Recorder` writes it.
fn new_event(name: &str, ns: &str, regarding: Value) -> Value {
    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "eventTime": "2026-01-01T00:00:00.123456Z", "reportingController": "tidepool-operator",
        "reportingInstance": "tidepool-operator-0", "action": "Act", "reason": "Reason",
        "type": "Normal", "note": "first", "regarding": regarding})
}

/// Core v1 and events.k8s.io/v1 Events are one store, each read through either API with
/// its own field names: events.k8s.io is served by the core Event storage
/// (kubernetes/kubernetes pkg/registry/events/rest/storage_events.go, `NewRESTStorage` →
/// pkg/registry/core/event/storage) and converted by pkg/apis/events/v1/conversion.go
/// (`Convert_v1_Event_To_core_Event`, `Convert_core_Event_To_v1_Event`: note↔message,
/// regarding↔involvedObject, deprecated*↔source/firstTimestamp/lastTimestamp/count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_and_events_k8s_io_events_are_one_store() {
    let (server, _client) = start().await;
    let pod = json!({"kind": "Pod", "namespace": "default", "name": "p", "apiVersion": "v1"});
    let ev = new_event("written-new", "default", pod.clone());
    let (code, _) = send(
        &server,
        "POST",
        &format!("{EVENTS_V1}/default/events"),
        Some(ev),
        "application/json",
    )
    .await;
    assert_eq!(code, 201);
    let (code, core) = get(
        &server,
        &format!("{CORE_EVENTS}/default/events/written-new"),
    )
    .await;
    assert_eq!(code, 200, "{core}");
    assert_eq!(core["apiVersion"], "v1");
    assert_eq!(core["message"], "first");
    assert_eq!(core["involvedObject"], pod);
    assert_eq!(core["reportingComponent"], "tidepool-operator");
    assert!(
        core.get("note").is_none() && core.get("regarding").is_none(),
        "{core}"
    );

    let old = json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "written-old", "namespace": "default"},
        "involvedObject": pod, "reason": "Old", "message": "legacy", "type": "Normal",
        "source": {"component": "kubelet"}, "count": 3,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:01:00Z"});
    let (code, _) = send(
        &server,
        "POST",
        &format!("{CORE_EVENTS}/default/events"),
        Some(old),
        "application/json",
    )
    .await;
    assert_eq!(code, 201);
    let (code, list) = get(&server, &format!("{EVENTS_V1}/default/events")).await;
    assert_eq!(code, 200);
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{list}");
    let legacy = items
        .iter()
        .find(|e| e["metadata"]["name"] == "written-old")
        .unwrap();
    assert_eq!(legacy["apiVersion"], "events.k8s.io/v1");
    assert_eq!(legacy["note"], "legacy");
    assert_eq!(legacy["regarding"], pod);
    assert_eq!(legacy["deprecatedSource"], json!({"component": "kubelet"}));
    assert_eq!(legacy["deprecatedCount"], 3);
    assert_eq!(legacy["deprecatedFirstTimestamp"], "2026-01-01T00:00:00Z");
    assert!(
        legacy.get("message").is_none() && legacy.get("source").is_none(),
        "{legacy}"
    );
    let (_, core_list) = get(&server, &format!("{CORE_EVENTS}/default/events")).await;
    assert_eq!(
        core_list["items"].as_array().unwrap().len(),
        2,
        "{core_list}"
    );
    server.shutdown();
}

/// The events.k8s.io rules of kubernetes/kubernetes pkg/apis/core/validation/events.go:
/// `legacyValidateEvent` (an event about a cluster-scoped object lives in `default` or
/// `kube-system`; lengths, in the core field names) for both APIs; `ValidateEventCreate`'s
/// strict rules and `ValidateEventUpdate`'s immutable fields (eventTime compared to the
/// microsecond, `MicroTime`) only through events.k8s.io/v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_k8s_io_rules_namespace_lengths_and_immutable_fields() {
    let (server, client) = start().await;
    Api::<Namespace>::all(client)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
        )
        .await
        .unwrap();
    let node = json!({"kind": "Node", "name": "n", "apiVersion": "v1"});
    let post = |ns: &str, ev: Value| {
        let path = format!("{EVENTS_V1}/{ns}/events");
        let server = &server;
        async move { send(server, "POST", &path, Some(ev), "application/json").await }
    };
    let (code, v) = post("other", new_event("e", "other", node.clone())).await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        invalid_causes(&v),
        ["involvedObject.namespace: \"Invalid value: \\\"\\\": does not match event.namespace\""]
    );
    for ns in ["default", "kube-system"] {
        let (code, v) = post(ns, new_event("e", ns, node.clone())).await;
        assert_eq!(code, 201, "{ns}: {v}");
    }
    let mut bad = new_event("bad", "default", node.clone());
    bad["note"] = json!("x".repeat(1025));
    bad["type"] = json!("Weird");
    bad["reportingController"] = json!("not a name");
    let (code, v) = post("default", bad).await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        invalid_causes(&v),
        [
            "reportingController: \"Invalid value: \\\"not a name\\\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')\"",
            "message: \"Invalid value: \\\"\\\": can have at most 1024 characters\"",
            "type: \"Invalid value: \\\"\\\": has invalid value: Weird\"",
        ]
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("Event.events.k8s.io \"bad\" is invalid: ["),
        "{v}"
    );

    // Updates through events.k8s.io: the note and the event time are immutable, to the µs.
    let path = format!("{EVENTS_V1}/default/events/e");
    let (_, stored) = get(&server, &path).await;
    let mut changed = stored.clone();
    changed["note"] = json!("second");
    changed["eventTime"] = json!("2026-01-01T00:00:00.123457Z");
    let (code, v) = send(&server, "PUT", &path, Some(changed), "application/json").await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        invalid_causes(&v),
        [
            "message: \"Invalid value: \\\"second\\\": field is immutable\"",
            "eventTime: \"Invalid value: 2026-01-01 00:00:00.123457 +0000 UTC: field is immutable\"",
        ]
    );
    // the same instant written with nanoseconds, and a new series, pass
    let mut same = stored.clone();
    same["eventTime"] = json!("2026-01-01T00:00:00.123456000Z");
    same["series"] = json!({"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"});
    let (code, v) = send(&server, "PUT", &path, Some(same), "application/json").await;
    assert_eq!(code, 200, "{v}");
    let (code, v) = send(
        &server,
        "PATCH",
        &path,
        Some(json!({"series": {"count": 1}})),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        invalid_causes(&v),
        ["series.count: \"Invalid value: \\\"\\\": should be at least 2\""]
    );
    // Through core v1 only the legacy rules apply: the message may change.
    let core = format!("{CORE_EVENTS}/default/events/e");
    let (code, v) = send(
        &server,
        "PATCH",
        &core,
        Some(json!({"message": "third"})),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!((code, &v["message"]), (200, &json!("third")), "{v}");
    server.shutdown();
}

// ---------------------------------------------------------------------------------------------
// ResourceQuota and FlowSchema (the deploy bundle ships one of each).

/// v1 ResourceQuota and flowcontrol.apiserver.k8s.io/v1 FlowSchema are served (discovery,
/// create, read) and validated: kubernetes/kubernetes pkg/apis/core/validation/validation.go
/// (`ValidateResourceQuotaSpec`, `validateScopedResourceSelectorRequirement`,
/// `ValidateResourceQuotaUpdate`) and pkg/apis/flowcontrol/validation/validation.go
/// (`ValidateFlowSchemaSpec`), with the FlowSchema default of pkg/apis/flowcontrol/v1/defaults.go
/// (`SetDefaults_FlowSchemaSpec`: matchingPrecedence 1000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_quotas_and_flow_schemas_are_served_and_validated() {
    let (server, _client) = start().await;
    let (_, core) = get(&server, "/api/v1").await;
    assert!(
        core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "resourcequotas" && r["shortNames"] == json!(["quota"])),
        "{core}"
    );
    let (code, fc) = get(&server, "/apis/flowcontrol.apiserver.k8s.io/v1").await;
    assert_eq!(code, 200);
    assert!(
        fc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "flowschemas" && r["namespaced"] == false),
        "{fc}"
    );

    let quotas = "/api/v1/namespaces/default/resourcequotas";
    let quota = |hard: Value, exprs: Value| {
        json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "q"}, "spec": {"hard": hard, "scopeSelector": {"matchExpressions": exprs}}})
    };
    let (code, v) = send(&server, "POST", quotas, Some(quota(json!({"pods": "-1", "pots": "1"}),
        json!([{"scopeName": "PriorityClass", "operator": "In"}, {"scopeName": "Nope", "operator": "Exists"}]))), "application/json").await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        invalid_causes(&v),
        [
            "spec.hard[pods]: \"Invalid value: \\\"-1\\\": must be greater than or equal to 0\"",
            "spec.hard[pots]: \"Invalid value: \\\"pots\\\": must be a standard resource type or fully qualified\"",
            "spec.hard[pots]: \"Invalid value: \\\"pots\\\": must be a standard resource for quota\"",
            "spec.scopeSelector.matchExpressions.values: \"Required value: must be at least one value when `operator` is 'In' or 'NotIn' for scope selector\"",
            "spec.scopeSelector.matchExpressions.scopeName: \"Invalid value: \\\"Nope\\\": unsupported scope\"",
        ]
    );
    let good = quota(
        json!({"pods": "1000000"}),
        json!([{"scopeName": "PriorityClass", "operator": "In",
        "values": ["system-node-critical", "system-cluster-critical"]}]),
    );
    let (code, v) = send(&server, "POST", quotas, Some(good), "application/json").await;
    assert_eq!(code, 201, "{v}");
    let (code, v) = send(
        &server,
        "PATCH",
        &format!("{quotas}/q"),
        Some(json!({"spec": {"scopes": ["BestEffort"]}})),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        invalid_causes(&v),
        [
            "spec.scopes: \"Invalid value: []core.ResourceQuotaScope{\\\"BestEffort\\\"}: field is immutable\""
        ]
    );

    let schemas = "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas";
    let bad = json!({"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": "fs"}, "spec": {"matchingPrecedence": 1, "priorityLevelConfiguration": {"name": ""},
        "rules": [{"subjects": [], "resourceRules": [{"verbs": ["get"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}]}]}});
    let (code, v) = send(&server, "POST", schemas, Some(bad), "application/json").await;
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        invalid_causes(&v),
        [
            "spec.matchingPrecedence: \"Invalid value: 1: only the schema named 'exempt' may have matchingPrecedence 1\"",
            "spec.priorityLevelConfiguration.name: \"Required value: must reference a priority level\"",
            "spec.rules[0].subjects: \"Required value: subjects must contain at least one value\"",
            "spec.rules[0].resourceRules[0].namespaces: \"Required value: resource rules that are not cluster scoped must supply at least one namespace\"",
        ]
    );
    let good = json!({"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": "fs"}, "spec": {"priorityLevelConfiguration": {"name": "leader-election"},
        "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": "op", "namespace": "default"}}],
            "resourceRules": [{"verbs": ["get", "update"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "namespaces": ["default"]}]}]}});
    let (code, v) = send(&server, "POST", schemas, Some(good), "application/json").await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["spec"]["matchingPrecedence"], 1000, "defaulted: {v}");
    server.shutdown();
}

const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";

/// `metadata.uid` in an apply body: with no object of that name the apply does not create,
/// 409 "uid mismatch" (kubernetes/apiserver pkg/endpoints/handlers/patch.go `applyPatch`);
/// with another object of that name, 422 "field is immutable" (pkg/registry/rest/update.go
/// `BeforeUpdate`, the object meta update validation), as for a merge patch; a PUT's uid is
/// a precondition, 409 (`defaultUpdatedObjectInfo.Preconditions`). A resourceVersion in an
/// apply that creates is not compared (pkg/registry/generic/registry/store.go `Update`,
/// create-on-update).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_in_an_apply_refuses_to_create_or_to_replace() {
    let (server, _client) = start().await;
    let path = |n: &str| format!("{CM_PATH}/{n}?fieldManager=op");
    let cm = |n: &str, meta: Value| {
        let mut m = json!({"name": n});
        m.as_object_mut()
            .unwrap()
            .extend(meta.as_object().unwrap().clone());
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": m, "data": {"a": "1"}})
    };
    let ghost = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
    let (c, v) = send(
        &server,
        "PATCH",
        &path("gone"),
        Some(cm("gone", json!({"uid": ghost}))),
        APPLY,
    )
    .await;
    assert_eq!(c, 409, "{v}");
    assert_status(
        &v,
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on configmaps \"gone\": uid mismatch: the provided object specified uid {ghost}, and no existing object was found"
        ),
    );
    let (c, _) = get(&server, &format!("{CM_PATH}/gone")).await;
    assert_eq!(c, 404, "nothing created");
    // a resourceVersion does not stop an apply from creating
    let (c, v) = send(
        &server,
        "PATCH",
        &path("made"),
        Some(cm("made", json!({"resourceVersion": "12345"}))),
        APPLY,
    )
    .await;
    assert_eq!(c, 201, "{v}");
    let uid = v["metadata"]["uid"].as_str().unwrap().to_string();
    assert_ne!(v["metadata"]["resourceVersion"], "12345");
    // its own uid: applied
    let (c, v) = send(
        &server,
        "PATCH",
        &path("made"),
        Some(cm("made", json!({"uid": uid}))),
        APPLY,
    )
    .await;
    assert_eq!(c, 200, "{v}");
    // another object's uid: an immutable field, by apply and by merge patch alike
    let immutable = format!(
        "ConfigMap \"made\" is invalid: metadata.uid: Invalid value: \"{ghost}\": field is immutable"
    );
    let (c, v) = send(
        &server,
        "PATCH",
        &path("made"),
        Some(cm("made", json!({"uid": ghost}))),
        APPLY,
    )
    .await;
    assert_eq!(c, 422, "{v}");
    assert_status(&v, 422, "Invalid", &immutable);
    assert_eq!(v["details"]["causes"][0]["field"], "metadata.uid", "{v}");
    let patch = json!({"metadata": {"uid": ghost}});
    let (c, v) = send(
        &server,
        "PATCH",
        &format!("{CM_PATH}/made"),
        Some(patch),
        MERGE,
    )
    .await;
    assert_eq!(c, 422, "{v}");
    assert_status(&v, 422, "Invalid", &immutable);
    // a PUT's uid is a precondition
    let (_, mut cur) = get(&server, &format!("{CM_PATH}/made")).await;
    cur["metadata"]["uid"] = json!(ghost);
    let (c, v) = send(
        &server,
        "PUT",
        &format!("{CM_PATH}/made"),
        Some(cur),
        "application/json",
    )
    .await;
    assert_eq!(c, 409, "{v}");
    assert_status(
        &v,
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on configmaps \"made\": Precondition failed: UID in precondition: {ghost}, UID in object meta: {uid}"
        ),
    );
}

const WIDGETS: &str = "/apis/example.com/v1/namespaces/default/widgets";

async fn widgets_crd(server: &ApiServer) {
    let (c, v) = send(
        server,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        Some(crd(|_| {})),
        "application/json",
    )
    .await;
    assert_eq!(c, 201, "{v}");
    eventually(Duration::from_secs(10), "widgets served", || async {
        let (c, _) = get(server, WIDGETS).await;
        (c == 200).then_some(())
    })
    .await;
}

fn widget(name: &str, finalizers: &[&str]) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": name, "finalizers": finalizers}, "spec": {"replicas": 1}})
}

/// DELETE as the generic registry store answers it (kubernetes/apiserver
/// pkg/registry/generic/registry/store.go `Delete`, `markAsDeleting`, `finalizeDelete`,
/// `deleteWithoutFinalizers`; pkg/endpoints/handlers/delete.go `DeleteResource`):
/// - a delete that waits for a finalizer answers 200 with the object (202 only with
///   `orphanDependents: false`), its generation bumped once, when deletionTimestamp is set;
/// - the patch that removes the last finalizer answers the patched object at the version it
///   was read at, and the DELETED event carries the last stored object (finalizers listed);
/// - a custom resource deleted at once answers a `Status` naming it (the custom-resource
///   store has no `ReturnDeletedObject`: kubernetes/apiextensions-apiserver
///   pkg/registry/customresource/etcd.go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_answer_as_the_generic_store_does() {
    let (server, _client) = start().await;
    widgets_crd(&server).await;
    let (c, created) = send(
        &server,
        "POST",
        WIDGETS,
        Some(widget("kept", &["example.com/hold"])),
        "application/json",
    )
    .await;
    assert_eq!(c, 201, "{created}");
    assert_eq!(created["metadata"]["generation"], 1);
    let (c, v) = send(
        &server,
        "DELETE",
        &format!("{WIDGETS}/kept"),
        None,
        "application/json",
    )
    .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["kind"], "Widget", "{v}");
    assert!(v["metadata"]["deletionTimestamp"].is_string(), "{v}");
    assert_eq!(v["metadata"]["generation"], 2, "bumped as deletion starts");
    let (c, again) = send(
        &server,
        "DELETE",
        &format!("{WIDGETS}/kept"),
        None,
        "application/json",
    )
    .await;
    assert_eq!(c, 200, "{again}");
    assert_eq!(again["metadata"]["generation"], 2, "bumped once");
    let body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "orphanDependents": false});
    let (c, _) = send(
        &server,
        "DELETE",
        &format!("{WIDGETS}/kept"),
        Some(body),
        "application/json",
    )
    .await;
    assert_eq!(c, 202, "orphanDependents=false on a delete that waits");
    // the last finalizer goes: a watch sees the last stored object deleted
    let read_at = v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let client = server.client("tester").await.unwrap();
    let widgets: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client,
        "default",
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("example.com", "v1", "Widget"),
            "widgets",
        ),
    );
    use futures::{StreamExt, TryStreamExt};
    let mut events = widgets
        .watch(&kube::api::WatchParams::default().timeout(10), &read_at)
        .await
        .unwrap()
        .boxed();
    let patch = json!({"metadata": {"finalizers": null, "resourceVersion": read_at}});
    let (c, answer) = send(
        &server,
        "PATCH",
        &format!("{WIDGETS}/kept"),
        Some(patch),
        MERGE,
    )
    .await;
    assert_eq!(c, 200, "{answer}");
    assert_eq!(
        answer["metadata"]["resourceVersion"],
        read_at.as_str(),
        "{answer}"
    );
    assert!(answer["metadata"].get("finalizers").is_none(), "{answer}");
    let deleted = loop {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .expect("an event")
            .unwrap()
            .expect("the watch goes on");
        if let kube::api::WatchEvent::Deleted(o) = ev {
            break o;
        }
    };
    assert_eq!(
        deleted.metadata.finalizers,
        Some(vec!["example.com/hold".to_string()])
    );
    assert!(deleted.metadata.deletion_timestamp.is_some());
    assert_ne!(
        deleted.metadata.resource_version.as_deref(),
        Some(read_at.as_str())
    );
    // no finalizer: gone at once, a Status answers
    let (_, made) = send(
        &server,
        "POST",
        WIDGETS,
        Some(widget("brief", &[])),
        "application/json",
    )
    .await;
    let (c, v) = send(
        &server,
        "DELETE",
        &format!("{WIDGETS}/brief"),
        None,
        "application/json",
    )
    .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(
        v,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": "brief", "group": "example.com", "kind": "widgets", "uid": made["metadata"]["uid"]}})
    );
}

/// Deleting a CRD: it turns Terminating with the cleanup finalizer
/// (kubernetes/apiextensions-apiserver pkg/registry/customresourcedefinition/etcd.go
/// `REST.Delete`); its objects are deleted one by one, finalizers honoured, and the CRD goes
/// once none is left (pkg/controller/finalizer/crd_finalizer.go `sync`, `deleteInstances`);
/// meanwhile a create is 405 (pkg/apiserver/customresource_handler.go `serveResource`,
/// v0.31–v0.33), while an apply may still create (v0.34 refuses both with 403).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_crd_deletes_its_objects_first() {
    let (server, _client) = start().await;
    widgets_crd(&server).await;
    for w in [widget("held", &["example.com/hold"]), widget("free", &[])] {
        let (c, v) = send(&server, "POST", WIDGETS, Some(w), "application/json").await;
        assert_eq!(c, 201, "{v}");
    }
    let crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";
    let (c, v) = send(&server, "DELETE", crd_path, None, "application/json").await;
    assert_eq!(c, 200, "{v}");
    assert!(v["metadata"]["deletionTimestamp"].is_string(), "{v}");
    assert_eq!(
        v["metadata"]["finalizers"],
        json!(["customresourcecleanup.apiextensions.k8s.io"])
    );
    let terminating = v["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Terminating")
        .cloned()
        .expect("Terminating");
    assert_eq!(terminating["status"], "True", "{terminating}");
    eventually(
        Duration::from_secs(10),
        "the free widget deleted, the held one terminating",
        || async {
            let (free, _) = get(&server, &format!("{WIDGETS}/free")).await;
            let (_, held) = get(&server, &format!("{WIDGETS}/held")).await;
            (free == 404 && held["metadata"]["deletionTimestamp"].is_string()).then_some(())
        },
    )
    .await;
    let (c, v) = send(
        &server,
        "POST",
        WIDGETS,
        Some(widget("late", &[])),
        "application/json",
    )
    .await;
    assert_eq!(c, 405, "{v}");
    assert_status(
        &v,
        405,
        "MethodNotAllowed",
        "create not allowed while custom resource definition is terminating",
    );
    assert_eq!(
        v["details"],
        json!({"group": "example.com", "kind": "widgets"})
    );
    let late = format!("{WIDGETS}/applied?fieldManager=op");
    let (c, v) = send(&server, "PATCH", &late, Some(widget("applied", &[])), APPLY).await;
    assert_eq!(c, 201, "an apply still creates on 1.31–1.33: {v}");
    // the CRD waits for the held widget's finalizer
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (c, _) = get(&server, crd_path).await;
    assert_eq!(c, 200, "the CRD waits for its objects");
    let patch = json!({"metadata": {"finalizers": null}});
    let (c, v) = send(
        &server,
        "PATCH",
        &format!("{WIDGETS}/held"),
        Some(patch),
        MERGE,
    )
    .await;
    assert_eq!(c, 200, "{v}");
    eventually(
        Duration::from_secs(10),
        "the CRD gone, and its kind",
        || async {
            let (crd, _) = get(&server, crd_path).await;
            let (kind, _) = get(&server, WIDGETS).await;
            (crd == 404 && kind == 404).then_some(())
        },
    )
    .await;
}

/// ConfigMaps `cm-00` … in `default`, created by `client`.
async fn config_maps(client: &kube::Client, n: usize) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..n {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm-{i:02}")}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
}

/// The names of a list's items.
fn names(v: &Value) -> Vec<String> {
    v["items"]
        .as_array()
        .unwrap_or_else(|| panic!("a list: {v}"))
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// `resourceVersion=0` is served from the watch cache, which ignores `limit` and hands out
/// no continue token: kubernetes/apiserver pkg/storage/cacher/cacher.go (v1.33)
/// `computeListLimit` returns 0 when `opts.ResourceVersion == "0"`, and `Cacher.GetList`
/// then selects every object; `delegator.ShouldDelegateList` keeps such lists (no
/// continue, match "" or NotOlderThan) in the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_version_0_lists_are_whole() {
    let (server, client) = start().await;
    config_maps(&client, 7).await;
    for q in [
        "limit=3&resourceVersion=0",
        "limit=3&resourceVersion=0&resourceVersionMatch=NotOlderThan",
    ] {
        let (code_, v) = get(&server, &format!("{CM_PATH}?{q}")).await;
        assert_eq!(code_, 200, "{q}: {v}");
        assert_eq!(names(&v).len(), 7, "{q}: every item, limit ignored: {v}");
        assert!(v["metadata"].get("continue").is_none(), "{q}: {v}");
        assert!(
            v["metadata"].get("remainingItemCount").is_none(),
            "{q}: {v}"
        );
    }
    // without resourceVersion=0 the limit holds (a consistent list, paged from etcd)
    let (_, v) = get(&server, &format!("{CM_PATH}?limit=3")).await;
    assert_eq!(names(&v).len(), 3, "{v}");
    assert!(v["metadata"]["continue"].is_string(), "{v}");
}

/// A continue token older than the server's compaction window is answered as
/// kubernetes/apiserver pkg/storage/etcd3/errors.go `handleCompactedErrorForPaging` answers
/// one whose revision etcd compacted: 410 `Expired`, the `inconsistentContinue` message, and
/// a new token in the Status's `metadata.continue` (`EncodeContinue` with revision -1) that
/// goes on after the last key returned, from the latest state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_continue_tokens_are_410_with_a_token_to_go_on() {
    let server = ApiServer::start_with(Config {
        continue_max_age: Some(Duration::from_secs(1)),
        ..fast_config()
    })
    .await
    .expect("start server");
    let client = server.client("tester").await.expect("client");
    config_maps(&client, 7).await;
    let (_, first) = get(&server, &format!("{CM_PATH}?limit=3")).await;
    assert_eq!(names(&first), ["cm-00", "cm-01", "cm-02"]);
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    // a fresh token continues
    let page = |t: &str| format!("{CM_PATH}?limit=3&continue={t}");
    let (code_, second) = get(&server, &page(&token)).await;
    assert_eq!(code_, 200, "{second}");
    assert_eq!(names(&second), ["cm-03", "cm-04", "cm-05"]);
    let token = second["metadata"]["continue"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // meanwhile cm-05b is created (after the last key returned) and cm-06 deleted
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "cm-05b"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms.delete("cm-06", &DeleteParams::default()).await.unwrap();
    let (code_, v) = get(&server, &page(&token)).await;
    assert_eq!(code_, 410, "{v}");
    assert_status(
        &v,
        410,
        "Expired",
        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
    );
    let fresh = v["metadata"]["continue"]
        .as_str()
        .expect("a token in the Status");
    let (code_, rest) = get(&server, &page(fresh)).await;
    assert_eq!(code_, 200, "{rest}");
    assert_eq!(names(&rest), ["cm-05b"], "the rest, from the latest state");
    assert!(rest["metadata"].get("continue").is_none(), "{rest}");
    // kube's client sees the 410 as an API error
    let e = cms
        .list(
            &kube::api::ListParams::default()
                .limit(3)
                .continue_token(&token),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), 410, "{e}");
    // a token this server never handed out, and a token with a resourceVersion: 400
    // (pkg/storage/interfaces.go ValidateListOptions; the real message goes on with Go's
    // base64 error)
    let (code_, v) = get(&server, &page("garbage")).await;
    assert_eq!(code_, 400, "{v}");
    assert_eq!(v["reason"], "BadRequest", "{v}");
    let message = v["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("invalid continue token: continue key is not valid"),
        "{v}"
    );
    let (code_, v) = get(&server, &format!("{}&resourceVersion=5", page(fresh))).await;
    assert_eq!(code_, 400, "{v}");
    assert_status(
        &v,
        400,
        "BadRequest",
        "specifying resource version is not allowed when using continue",
    );
}

/// Slow and hung LIST pages. A targeted fault's latency on `list` delays every page. A
/// hung response sends its headers and part of its body, then nothing: kube-apiserver
/// streams a list's JSON item by item (kubernetes/apiserver pkg/features/kube_features.go
/// `StreamingCollectionEncodingToJSON`, beta and on in v1.33; pkg/endpoints/handlers/
/// responsewriters/writers.go `deferredResponseWriter` sends a first write longer than
/// `firstWriteStreamingThresholdBytes` unbuffered), so a server or network that stalls
/// mid-list leaves the client holding half a body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_can_be_slow_or_hang_mid_body() {
    let (server, client) = start().await;
    config_maps(&client, 7).await;
    let slow = tidepool_tests::TargetedFault {
        identity: "tester".into(),
        resource: "configmaps".into(),
        verbs: ["list".to_string()].into(),
        latency: Duration::from_millis(300),
        ..Default::default()
    };
    server.update_faults(|f| f.targeted = vec![slow.clone()]);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let t0 = std::time::Instant::now();
    let mut params = kube::api::ListParams::default().limit(3);
    let mut pages = 0;
    loop {
        let page = cms.list(&params).await.unwrap();
        pages += 1;
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => params = params.continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "each page waited"
    );
    // another identity is not slowed
    let other = server.client("other").await.unwrap();
    let t0 = std::time::Instant::now();
    Api::<ConfigMap>::namespaced(other, "default")
        .list(&Default::default())
        .await
        .unwrap();
    assert!(t0.elapsed() < Duration::from_millis(300));
    // a hung page: the headers and 40 bytes of body come, then nothing
    server.update_faults(|f| {
        f.targeted = vec![tidepool_tests::TargetedFault {
            latency: Duration::ZERO,
            hang_after_bytes: Some(40),
            ..slow
        }]
    });
    let got = hung_read(&server, &format!("{CM_PATH}?limit=3")).await;
    let (head, body) = got.split_once("\r\n\r\n").expect("the headers came");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let body = dechunk(body);
    assert_eq!(body.len(), 40, "{body}");
    assert!(
        body.starts_with("{\"apiVersion\":\"v1\",\"items\":["),
        "{body}"
    );
    // through kube the list never completes
    let params = kube::api::ListParams::default();
    let stuck = tokio::time::timeout(Duration::from_millis(500), cms.list(&params)).await;
    assert!(stuck.is_err(), "the hung list did not complete");
}

/// Sends a GET as "tester" and reads what comes until nothing more does for 500 ms.
async fn hung_read(server: &ApiServer, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
        server.token("tester")
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await {
            Ok(Ok(0)) => panic!("the connection closed: {}", String::from_utf8_lossy(&out)),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => panic!("read: {e}"),
            Err(_) => return String::from_utf8_lossy(&out).into_owned(),
        }
    }
}

/// The data of a chunked body (its last chunk never came).
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size, 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The next ADDED/MODIFIED/DELETED object's name on a watch stream (bookmarks skipped),
/// within 10 s.
async fn next_name<S>(stream: &mut S) -> String
where
    S: futures::Stream<Item = kube::Result<kube::api::WatchEvent<ConfigMap>>> + Unpin,
{
    use futures::StreamExt;
    use kube::api::WatchEvent;
    let next = async {
        loop {
            match stream
                .next()
                .await
                .expect("the watch goes on")
                .expect("an event")
            {
                WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                    return o.metadata.name.unwrap_or_default();
                }
                WatchEvent::Bookmark(_) => {}
                WatchEvent::Error(e) => panic!("watch error {e:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("an event in time")
}

/// One identity's watch of one resource can run behind everything else: each watch is its
/// own HTTP stream, served from the watch cache of its resource (kubernetes/apiserver
/// `pkg/storage/cacher/cacher.go`, one `Cacher` per resource with its own reflector; each
/// client watch a `cacheWatcher` with its own buffer, `pkg/storage/cacher/cache_watcher.go`
/// `cacheWatcher.processInterval`), and behind a load balancer each may reach another
/// apiserver whose cache lags; a relist after 410 or a LIST throttled by API Priority and
/// Fairness holds one resource's view back for minutes (fidelity-review.md B1). Held
/// events come later, in order: a lagging watch, never a lost one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identitys_watch_of_one_resource_lags_while_the_rest_flows() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{ListParams, WatchParams};
    use tidepool_tests::Hold;

    let (server, admin) = start().await;
    let slow = server.client("slow").await.unwrap();
    let fast = server.client("fast").await.unwrap();
    let cms = |c: &kube::Client| Api::<ConfigMap>::namespaced(c.clone(), "default");
    let rv = cms(&admin)
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let wp = WatchParams::default().timeout(60);
    let mut slow_cms = cms(&slow).watch(&wp, &rv).await.unwrap().boxed();
    let mut fast_cms = cms(&fast).watch(&wp, &rv).await.unwrap().boxed();
    let mut slow_secrets = Api::<Secret>::namespaced(slow.clone(), "default")
        .watch(&wp, &rv)
        .await
        .unwrap()
        .boxed();
    server.lag_watch("slow", "configmaps", Hold::Paused);
    let create_cm = |name: &'static str| {
        let api = cms(&admin);
        async move {
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
            api.create(&PostParams::default(), &cm).await.unwrap();
        }
    };
    create_cm("cm1").await;
    create_cm("cm2").await;
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "s1"}})).unwrap();
    Api::<Secret>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    // another identity's watch, and this identity's watch of another resource, flow
    assert_eq!(next_name(&mut fast_cms).await, "cm1");
    assert_eq!(next_name(&mut fast_cms).await, "cm2");
    match tokio::time::timeout(Duration::from_secs(10), slow_secrets.next()).await {
        Ok(Some(Ok(kube::api::WatchEvent::Added(s)))) => {
            assert_eq!(s.metadata.name.as_deref(), Some("s1"))
        }
        other => panic!("the secret on the slow identity's watch: {other:?}"),
    }
    // the held watch has shown nothing of cm1 (created before s1, which it saw)
    assert!(
        futures::FutureExt::now_or_never(slow_cms.next()).is_none(),
        "held back"
    );
    // resumed: the held events arrive, in order, then new ones as usual
    server.resume_watch("slow", "configmaps");
    assert_eq!(next_name(&mut slow_cms).await, "cm1");
    assert_eq!(next_name(&mut slow_cms).await, "cm2");
    // a fixed delay: each event reaches the slow identity that long after the others
    let delay = Duration::from_millis(400);
    server.lag_watch("slow", "configmaps", Hold::Delay(delay));
    let t0 = std::time::Instant::now();
    create_cm("cm3").await;
    assert_eq!(next_name(&mut fast_cms).await, "cm3");
    assert_eq!(next_name(&mut slow_cms).await, "cm3");
    assert!(t0.elapsed() >= delay, "delivered after {:?}", t0.elapsed());
    server.resume_watch("slow", "configmaps");
}
