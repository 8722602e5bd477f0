//! Answers that must match the real kube-apiserver's (issue 12, fidelity gaps): media types,
//! object names, namespace deletion, CRD validation, list parameters and error wording.

mod common;

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
        let (code_, v) = send(&server, "GET", &format!("{CM_PATH}?{q}"), None, "").await;
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
        let (code_, v) = send(&server, "GET", &format!("{CM_PATH}?{q}"), None, "").await;
        assert_eq!(code_, 422, "{q}: {v}");
        assert_status(&v, 422, "Invalid", msg);
    }
    // Well-formed parameters still list.
    for q in [
        "limit=5",
        "labelSelector=!app",
        "resourceVersion=0&resourceVersionMatch=NotOlderThan",
    ] {
        let (code_, v) = send(&server, "GET", &format!("{CM_PATH}?{q}"), None, "").await;
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
    let (_, got) = send(
        &server,
        "GET",
        &format!("{path}/p"),
        None,
        "application/json",
    )
    .await;
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
    let (_, got) = send(
        &server,
        "GET",
        &format!("{path}/p"),
        None,
        "application/json",
    )
    .await;
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
    let (_, list) = send(&server, "GET", "/apis/apps/v1", None, "application/json").await;
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
    let (code, s) = send(&server, "GET", &scale, None, "application/json").await;
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
    let (_, d) = send(
        &server,
        "GET",
        &format!("{path}/web"),
        None,
        "application/json",
    )
    .await;
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
    let (_, d) = send(
        &server,
        "GET",
        &format!("{path}/web"),
        None,
        "application/json",
    )
    .await;
    assert_eq!(
        d["spec"]["replicas"], 1,
        "unchanged by the refused PUT: {d}"
    );

    let (code, _) = send(
        &server,
        "GET",
        &format!("{path}/missing/scale"),
        None,
        "application/json",
    )
    .await;
    assert_eq!(code, 404);
    let (code, _) = send(
        &server,
        "GET",
        &format!("{CM_PATH}/any/scale"),
        None,
        "application/json",
    )
    .await;
    assert_eq!(code, 404, "config maps have no scale subresource");
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
