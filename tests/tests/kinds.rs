//! Issue 12's kinds through the kube client: apps/v1 DaemonSet, networking.k8s.io/v1
//! NetworkPolicy and scheduling.k8s.io/v1 PriorityClass — discovery, defaults, generation,
//! the seeded system priority classes and refusals in the real server's words.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn daemonset(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name}, "spec": spec})
}

fn ds_spec() -> Value {
    json!({
        "selector": {"matchLabels": {"app": "agent"}},
        "template": {
            "metadata": {"labels": {"app": "agent", "tier": "node"}},
            "spec": {"containers": [{"name": "agent", "image": "tidepool/agent:1"}]}
        }
    })
}

/// Creates `body` through `api` and returns the 422's message and causes.
async fn refused(api: &Api<DynamicObject>, body: Value) -> (String, Vec<(String, String)>) {
    let e = api
        .create(&PostParams::default(), &dynamic(body))
        .await
        .expect_err("refused");
    assert_eq!(code(&e), 422, "{e:?}");
    let s = status(&e);
    assert_eq!(s.reason, "Invalid");
    let causes = s
        .details
        .as_ref()
        .map(|d| {
            d.causes
                .iter()
                .map(|c| (c.field.clone(), c.message.clone()))
                .collect()
        })
        .unwrap_or_default();
    (s.message.clone(), causes)
}

fn dyn_api<K>(client: &kube::Client, ns: Option<&str>) -> Api<DynamicObject>
where
    K: kube::Resource<DynamicType = ()>,
{
    let ar = ApiResource::erase::<K>(&());
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_scopes_short_names_categories_and_status() {
    let (_server, client) = start().await;
    let apps = client.list_api_group_resources("apps/v1").await.unwrap();
    let ds = apps
        .resources
        .iter()
        .find(|r| r.name == "daemonsets")
        .expect("daemonsets served");
    assert!(ds.namespaced);
    assert_eq!(ds.kind, "DaemonSet");
    assert_eq!(ds.short_names.as_deref(), Some(&["ds".to_string()][..]));
    assert_eq!(ds.categories.as_deref(), Some(&["all".to_string()][..]));
    assert!(apps.resources.iter().any(|r| r.name == "daemonsets/status"));

    let net = client
        .list_api_group_resources("networking.k8s.io/v1")
        .await
        .unwrap();
    let np = net
        .resources
        .iter()
        .find(|r| r.name == "networkpolicies")
        .expect("networkpolicies served");
    assert!(np.namespaced);
    assert_eq!(np.short_names.as_deref(), Some(&["netpol".to_string()][..]));
    assert!(
        !net.resources
            .iter()
            .any(|r| r.name == "networkpolicies/status"),
        "NetworkPolicy has no status subresource in 1.33"
    );

    let sched = client
        .list_api_group_resources("scheduling.k8s.io/v1")
        .await
        .unwrap();
    let pc = sched
        .resources
        .iter()
        .find(|r| r.name == "priorityclasses")
        .expect("priorityclasses served");
    assert!(!pc.namespaced, "PriorityClass is cluster-scoped");
    assert_eq!(pc.short_names.as_deref(), Some(&["pc".to_string()][..]));
    assert!(!sched.resources.iter().any(|r| r.name.contains('/')));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemonsets_defaults_generation_status_and_refusals() {
    let (_server, client) = start().await;
    let typed: Api<DaemonSet> = Api::namespaced(client.clone(), "default");
    let created = typed
        .create(
            &PostParams::default(),
            &serde_json::from_value(daemonset("agent", ds_spec())).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let spec = created.spec.as_ref().unwrap();
    // SetDefaults_DaemonSet
    let strategy = spec.update_strategy.as_ref().expect("defaulted strategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let ru = strategy.rolling_update.as_ref().expect("rollingUpdate");
    assert_eq!(serde_json::to_value(&ru.max_unavailable).unwrap(), json!(1));
    assert_eq!(serde_json::to_value(&ru.max_surge).unwrap(), json!(0));
    assert_eq!(spec.revision_history_limit, Some(10));

    let got = typed.get("agent").await.unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);
    let all: Api<DaemonSet> = Api::all(client.clone());
    let list = all.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);

    // a spec change bumps generation, a label change does not
    let pp = PatchParams::default();
    let p = typed
        .patch(
            "agent",
            &pp,
            &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "agent", "image": "tidepool/agent:2"}]}}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.generation, Some(2));
    let p = typed
        .patch(
            "agent",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.generation, Some(2));

    // status goes through the subresource only, and does not bump generation
    let s = typed
        .patch_status(
            "agent",
            &pp,
            &Patch::Merge(
                json!({"status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3,
                "numberReady": 2, "numberMisscheduled": 0}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(s.status.as_ref().unwrap().number_ready, 2);
    assert_eq!(s.metadata.generation, Some(2));
    let m = typed
        .patch(
            "agent",
            &pp,
            &Patch::Merge(json!({"status": {"numberReady": 7}})),
        )
        .await
        .unwrap();
    assert_eq!(m.status.as_ref().unwrap().number_ready, 2);

    // refusals
    let api = dyn_api::<DaemonSet>(&client, Some("default"));
    let mut spec = ds_spec();
    spec["template"]["metadata"]["labels"] = json!({"app": "other"});
    let (msg, causes) = refused(&api, daemonset("bad", spec)).await;
    assert_eq!(
        msg,
        "DaemonSet.apps \"bad\" is invalid: spec.template.metadata.labels: Invalid value: \
         map[string]string{\"app\":\"other\"}: `selector` does not match template `labels`"
    );
    assert_eq!(causes[0].0, "spec.template.metadata.labels");

    // no selector at all matches nothing (LabelSelectorAsSelector(nil) is labels.Nothing())
    let mut spec = ds_spec();
    spec.as_object_mut().unwrap().remove("selector");
    let (msg, _) = refused(&api, daemonset("nosel", spec)).await;
    assert!(
        msg.ends_with(
            "spec.template.metadata.labels: Invalid value: \
             map[string]string{\"app\":\"agent\", \"tier\":\"node\"}: `selector` does not match template `labels`"
        ),
        "{msg}"
    );

    let mut spec = ds_spec();
    spec["selector"] = json!({});
    let (msg, _) = refused(&api, daemonset("empty", spec)).await;
    assert!(
        msg.contains("spec.selector: Invalid value: ")
            && msg.ends_with(": empty selector is invalid for daemonset"),
        "{msg}"
    );

    let mut spec = ds_spec();
    spec["updateStrategy"] =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0}});
    let (msg, causes) = refused(&api, daemonset("zero", spec)).await;
    assert!(
        msg.ends_with(
            "spec.updateStrategy.rollingUpdate.maxUnavailable: Required value: \
             cannot be 0 when maxSurge is 0"
        ),
        "{msg}"
    );
    assert_eq!(
        causes,
        vec![(
            "spec.updateStrategy.rollingUpdate.maxUnavailable".to_string(),
            "Required value: cannot be 0 when maxSurge is 0".to_string()
        )]
    );

    let mut spec = ds_spec();
    spec["updateStrategy"] =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%", "maxSurge": 1}});
    let (msg, _) = refused(&api, daemonset("both", spec)).await;
    assert!(
        msg.ends_with(
            "spec.updateStrategy.rollingUpdate.maxSurge: Invalid value: 1: \
             may not be set when maxUnavailable is non-zero"
        ),
        "{msg}"
    );
    // surge alone is fine
    let mut spec = ds_spec();
    spec["updateStrategy"] =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}});
    api.create(&PostParams::default(), &dynamic(daemonset("surge", spec)))
        .await
        .unwrap();

    let mut spec = ds_spec();
    spec["template"]["spec"]["containers"] = json!([]);
    let (msg, _) = refused(&api, daemonset("empty-pod", spec)).await;
    assert!(
        msg.ends_with("spec.template.spec.containers: Required value"),
        "{msg}"
    );

    let mut spec = ds_spec();
    spec["template"]["spec"]["restartPolicy"] = json!("OnFailure");
    let (msg, _) = refused(&api, daemonset("restart", spec)).await;
    assert!(
        msg.ends_with(
            "spec.template.spec.restartPolicy: Unsupported value: \"OnFailure\": \
             supported values: \"Always\""
        ),
        "{msg}"
    );

    // an update is validated too
    let e = typed
        .patch(
            "agent",
            &pp,
            &Patch::Merge(
                json!({"spec": {"template": {"metadata": {"labels": {"app": "moved"}}}}}),
            ),
        )
        .await
        .expect_err("selector no longer matches");
    assert_eq!(code(&e), 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_policies_defaults_generation_and_refusals() {
    let (_server, client) = start().await;
    let typed: Api<NetworkPolicy> = Api::namespaced(client.clone(), "default");
    let np = |name: &str, spec: Value| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name}, "spec": spec})
    };
    let created = typed
        .create(
            &PostParams::default(),
            &serde_json::from_value(np(
                "agent-metrics",
                json!({"podSelector": {"matchLabels": {"app": "agent"}},
                    "ingress": [{"ports": [{"port": 9100}]}]}),
            ))
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let v = serde_json::to_value(&created).unwrap();
    assert_eq!(v["spec"]["ingress"][0]["ports"][0]["protocol"], "TCP");
    assert_eq!(v["spec"]["policyTypes"], json!(["Ingress"]));
    let with_egress = typed
        .create(
            &PostParams::default(),
            &serde_json::from_value(np(
                "egress",
                json!({"podSelector": {}, "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}),
            ))
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&with_egress).unwrap()["spec"]["policyTypes"],
        json!(["Ingress", "Egress"])
    );
    let p = typed
        .patch(
            "agent-metrics",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"podSelector": {"matchLabels": {"app": "other"}}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.generation, Some(2));
    assert_eq!(
        typed
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );

    let api = dyn_api::<NetworkPolicy>(&client, Some("default"));
    let (msg, causes) = refused(
        &api,
        np(
            "icmp",
            json!({"podSelector": {}, "ingress": [{"ports": [{"port": 1, "protocol": "ICMP"}]}]}),
        ),
    )
    .await;
    assert_eq!(
        msg,
        "NetworkPolicy.networking.k8s.io \"icmp\" is invalid: spec.ingress[0].ports[0].protocol: \
         Unsupported value: \"ICMP\": supported values: \"TCP\", \"UDP\", \"SCTP\""
    );
    assert_eq!(causes[0].0, "spec.ingress[0].ports[0].protocol");
    let (msg, _) = refused(
        &api,
        np(
            "egress-icmp",
            json!({"podSelector": {}, "egress": [{}, {"ports": [{"protocol": "icmp"}]}]}),
        ),
    )
    .await;
    assert!(
        msg.ends_with(
            "spec.egress[1].ports[0].protocol: Unsupported value: \"icmp\": \
             supported values: \"TCP\", \"UDP\", \"SCTP\""
        ),
        "{msg}"
    );
    let (msg, _) = refused(
        &api,
        np(
            "types",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egres"]}),
        ),
    )
    .await;
    assert!(
        msg.ends_with(
            "spec.policyTypes[1]: Unsupported value: \"Egres\": supported values: \"Ingress\", \"Egress\""
        ),
        "{msg}"
    );
    let (msg, _) = refused(
        &api,
        np(
            "three",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress", "Ingress"]}),
        ),
    )
    .await;
    assert!(
        msg.ends_with(
            "spec.policyTypes: Invalid value: []networking.PolicyType{\"Ingress\", \"Egress\", \
             \"Ingress\"}: may not specify more than two policyTypes"
        ),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_classes_seeded_defaulted_immutable_and_refused() {
    let (_server, client) = start().await;
    let typed: Api<PriorityClass> = Api::all(client.clone());
    let node = typed.get("system-node-critical").await.unwrap();
    assert_eq!(node.value, 2_000_001_000);
    let cluster = typed.get("system-cluster-critical").await.unwrap();
    assert_eq!(cluster.value, 2_000_000_000);
    assert_eq!(
        typed
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    let e = typed
        .create(&PostParams::default(), &node_clone(&node))
        .await
        .expect_err("exists");
    assert_eq!(code(&e), 409);

    let pc = |name: &str, extra: Value| {
        let mut v = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": 1000});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let created = typed
        .create(
            &PostParams::default(),
            &serde_json::from_value(pc("tidepool-high", json!({"description": "agents"}))).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        created.preemption_policy.as_deref(),
        Some("PreemptLowerPriority")
    );
    let top = typed
        .create(
            &PostParams::default(),
            &serde_json::from_value(pc("top", json!({"value": 1_000_000_000}))).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(top.value, 1_000_000_000);

    let api = dyn_api::<PriorityClass>(&client, None);
    let (msg, causes) = refused(&api, pc("too-high", json!({"value": 1_000_000_001}))).await;
    assert_eq!(
        msg,
        "PriorityClass.scheduling.k8s.io \"too-high\" is invalid: value: Forbidden: maximum \
         allowed value of a user defined priority is 1000000000"
    );
    assert_eq!(causes[0].0, "value");
    let (msg, _) = refused(&api, pc("system-mine", json!({}))).await;
    assert!(
        msg.ends_with(
            "metadata.name: Forbidden: priority class names with 'system-' prefix are reserved \
             for system use only. error: system-mine is not a known system priority class"
        ),
        "{msg}"
    );
    let (msg, _) = refused(&api, pc("never", json!({"preemptionPolicy": "Sometimes"}))).await;
    assert!(
        msg.ends_with(
            "preemptionPolicy: Unsupported value: \"Sometimes\": supported values: \
             \"PreemptLowerPriority\", \"Never\""
        ),
        "{msg}"
    );

    // value and preemptionPolicy are immutable; the description is not
    let pp = PatchParams::default();
    let e = typed
        .patch("tidepool-high", &pp, &Patch::Merge(json!({"value": 2000})))
        .await
        .expect_err("immutable");
    assert_eq!(code(&e), 422);
    assert!(
        status(&e)
            .message
            .ends_with("value: Forbidden: may not be changed in an update."),
        "{}",
        status(&e).message
    );
    let e = typed
        .patch(
            "tidepool-high",
            &pp,
            &Patch::Merge(json!({"preemptionPolicy": "Never"})),
        )
        .await
        .expect_err("immutable");
    assert!(
        status(&e)
            .message
            .ends_with("preemptionPolicy: Invalid value: \"Never\": field is immutable"),
        "{}",
        status(&e).message
    );
    let d = typed
        .patch(
            "tidepool-high",
            &pp,
            &Patch::Merge(json!({"description": "node agents"})),
        )
        .await
        .unwrap();
    assert_eq!(d.description.as_deref(), Some("node agents"));
    assert_eq!(d.value, 1000);
    // a PUT that leaves preemptionPolicy out gets the default again, so it is no change
    let mut put = d.clone();
    put.preemption_policy = None;
    put.description = Some("agents again".into());
    let r = typed
        .replace("tidepool-high", &PostParams::default(), &put)
        .await
        .unwrap();
    assert_eq!(r.preemption_policy.as_deref(), Some("PreemptLowerPriority"));
}

fn node_clone(pc: &PriorityClass) -> PriorityClass {
    let mut c = pc.clone();
    c.metadata.resource_version = None;
    c.metadata.uid = None;
    c.metadata.creation_timestamp = None;
    c.metadata.managed_fields = None;
    c
}
