//! The deploy bundle, checked without a cluster (issue 17's static part):
//! - `kubectl kustomize deploy/` renders, alone and with every component, and every
//!   built-in object it renders passes `kubernetes-validate --strict` against the minimum
//!   Kubernetes (1.31) and the in-process server's (1.33);
//! - the examples pass the generated CRDs' schemas (the in-process API server, dry run);
//! - the operator's pod meets Pod Security "restricted" and the HA shape; the agent's holds
//!   only what CNI work needs, and its paths are the plugin's;
//! - the images (deploy/Dockerfile) put the binaries where the manifests run them, as the
//!   users the manifests name; hadolint passes;
//! - the CNI installer installs, and refuses when another network config sorts first;
//! - yamllint passes on deploy/;
//! - the alert rules pass `promtool check rules` and `promtool test rules`, follow the
//!   kubernetes-mixin conventions, and every alert has a firing and a quiet test case;
//! - the Grafana dashboard parses, uses current panel types and its variables, and every
//!   query and rule names only metrics and labels tidepool-metrics defines.
//!
//! Each tool missing fails its test saying what to install (scripts/test.sh installs them).
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod deploy {
    pub mod dockerfile;
    pub mod promql;
    pub mod queries;
    pub mod tools;
}
mod common;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::Path;

use deploy::queries::{self, RULES, panels};
use deploy::tools::{self, HADOLINT, KUBERNETES_VALIDATE, PROMTOOL, SH, YAMLLINT};
use deploy::{dockerfile, promql};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::Value;

/// Every component of deploy/components/ (the test lists the directory and fails on one
/// it does not know, so a new component gets rendered and validated too).
const COMPONENTS: &[&str] = &[
    "agent-metrics",
    "cni-install",
    "operator-host-network",
    "servicemonitor",
    "taint-exhausted-nodes",
];

/// API groups of objects that are not built into Kubernetes (kubernetes-validate has no
/// schema for them): tidepool's CRDs and the Prometheus Operator's.
const CUSTOM_GROUPS: &[&str] = &["ipam.tidepool.dev/", "monitoring.coreos.com/"];

/// The Kubernetes versions the bundle must validate against: DESIGN.md's minimum and the
/// in-process server's.
const KUBERNETES_VERSIONS: &[&str] = &["1.31.0", "1.33.0"];

// ---------------------------------------------------------------------------------------------
// Reading the rendered objects.

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn pod(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

/// Containers and init containers.
fn all_containers(pod: &Value) -> Vec<&Value> {
    ["containers", "initContainers"]
        .iter()
        .filter_map(|k| pod[k].as_array())
        .flatten()
        .collect()
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    all_containers(pod)
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The value of `--name=value` in a container's args.
fn flag(c: &Value, name: &str) -> Option<String> {
    let prefix = format!("--{name}=");
    strs(&c["args"])
        .into_iter()
        .find_map(|a| a.strip_prefix(&prefix).map(str::to_string))
}

fn port_of(addr: &str) -> u64 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr}"))
}

/// A container's port number, from a probe's or a Service's port (a number or a name).
fn resolve_port(c: &Value, port: &Value) -> u64 {
    if let Some(n) = port.as_u64() {
        return n;
    }
    c["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == *port)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("container {} has no port {port}", c["name"]))
}

/// Does a `matchLabels` selector select the pod template of `workload`?
fn selects(selector: &Value, workload: &Value) -> bool {
    let labels = &workload["spec"]["template"]["metadata"]["labels"];
    let Some(m) = selector["matchLabels"].as_object() else {
        return false;
    };
    !m.is_empty() && m.iter().all(|(k, v)| labels[k] == *v)
}

/// A security-context field, the container's overriding the pod's.
fn effective<'a>(pod: &'a Value, c: &'a Value, field: &str) -> &'a Value {
    match &c["securityContext"][field] {
        Value::Null => &pod["securityContext"][field],
        v => v,
    }
}

/// What keeps a pod from Pod Security "restricted" (v1.31), plus a writable root
/// filesystem, which the issue asks for as well.
fn restricted_violations(pod: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        if pod[host] == true {
            out.push(host.to_string());
        }
    }
    const VOLUMES: &[&str] = &[
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ];
    for v in pod["volumes"].as_array().into_iter().flatten() {
        let kinds: Vec<&String> = v
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "name")
            .collect();
        if kinds.iter().any(|k| !VOLUMES.contains(&k.as_str())) {
            out.push(format!("volume {} is {kinds:?}", v["name"]));
        }
    }
    for c in all_containers(pod) {
        let name = c["name"].as_str().unwrap_or("?");
        let sc = &c["securityContext"];
        if sc["privileged"] == true {
            out.push(format!("{name}: privileged"));
        }
        if sc["allowPrivilegeEscalation"] != false {
            out.push(format!("{name}: allowPrivilegeEscalation is not false"));
        }
        if effective(pod, c, "runAsNonRoot") != true {
            out.push(format!("{name}: runAsNonRoot is not true"));
        }
        if effective(pod, c, "runAsUser") == 0 {
            out.push(format!("{name}: runAsUser 0"));
        }
        let seccomp = effective(pod, c, "seccompProfile");
        if !(seccomp["type"] == "RuntimeDefault" || seccomp["type"] == "Localhost") {
            out.push(format!("{name}: seccompProfile {seccomp}"));
        }
        if !strs(&sc["capabilities"]["drop"]).contains(&"ALL") {
            out.push(format!("{name}: capabilities not dropped"));
        }
        if strs(&sc["capabilities"]["add"])
            .iter()
            .any(|c| *c != "NET_BIND_SERVICE")
        {
            out.push(format!("{name}: capabilities added"));
        }
        if sc["readOnlyRootFilesystem"] != true {
            out.push(format!("{name}: writable root filesystem"));
        }
        for p in c["ports"].as_array().into_iter().flatten() {
            if p.get("hostPort").is_some() {
                out.push(format!("{name}: hostPort"));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Rendering and validation.

fn builtins(docs: &[Value]) -> Vec<&Value> {
    docs.iter()
        .filter(|d| {
            let api = d["apiVersion"].as_str().unwrap_or("");
            !CUSTOM_GROUPS.iter().any(|g| api.starts_with(g))
        })
        .collect()
}

/// Runs kubernetes-validate --strict on `objects` for `version`; (passed, its output).
fn validate(objects: &[&Value], version: &str) -> (bool, String) {
    let dir = tools::TempDir::new("validate");
    let path = dir.0.join("objects.yaml");
    let stream: Vec<String> = objects.iter().map(|o| o.to_string()).collect();
    std::fs::write(&path, stream.join("\n---\n")).unwrap();
    let out = tools::run(
        &KUBERNETES_VALIDATE,
        [
            "--strict",
            "--kubernetes-version",
            version,
            path.to_str().unwrap(),
        ],
    );
    let text = tools::text(&out);
    let passed =
        out.status.success() && text.matches("passed for resource").count() == objects.len();
    (passed, text)
}

#[test]
fn every_variant_renders_and_every_builtin_object_passes_kubernetes_validate() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(tools::repo().join("deploy/components"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        on_disk,
        COMPONENTS.iter().map(|c| c.to_string()).collect(),
        "COMPONENTS must list deploy/components/"
    );
    let base = tools::documents(&tools::render(&[]));
    for c in COMPONENTS {
        let docs = tools::documents(&tools::render(&[c]));
        assert!(docs.len() >= base.len(), "{c} renders fewer objects");
    }
    let all = tools::documents(&tools::render(COMPONENTS));
    for docs in [&base, &all] {
        // the only objects kubernetes-validate cannot check are the Prometheus Operator's
        for d in docs
            .iter()
            .filter(|d| builtins(std::slice::from_ref(d)).is_empty())
        {
            assert!(
                ["ServiceMonitor", "PrometheusRule"].contains(&d["kind"].as_str().unwrap()),
                "{d}"
            );
        }
        let objects = builtins(docs);
        for version in KUBERNETES_VERSIONS {
            let (passed, text) = validate(&objects, version);
            assert!(passed, "Kubernetes {version}:\n{text}");
        }
    }
    // and the validator does look: an unknown field in the Deployment's pod fails --strict
    let mut broken = find(&base, "Deployment", "tidepool-operator").clone();
    broken["spec"]["template"]["spec"]["hostNetwrok"] = Value::Bool(true);
    let (passed, text) = validate(&[&broken], KUBERNETES_VERSIONS[0]);
    assert!(!passed, "an unknown field must fail --strict:\n{text}");
}

/// The examples pass the CRDs of deploy/crds/ (which api/tests/crds.rs keeps equal to what
/// the types generate), as the in-process API server applies them; a dry run, so nothing
/// is stored. A broken example is refused, so the check can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_validate_against_the_generated_crd_schemas() {
    let (server, client) = common::start().await;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    for file in ["ippools.yaml", "ipamblocks.yaml", "ipamnodes.yaml"] {
        let text = std::fs::read_to_string(tools::repo().join("deploy/crds").join(file)).unwrap();
        let crd = serde_saphyr::from_str(&text).unwrap();
        let made = crds.create(&PostParams::default(), &crd).await.unwrap();
        let name = made.metadata.name.unwrap();
        kube::runtime::wait::await_condition(
            crds.clone(),
            &name,
            kube::runtime::wait::conditions::is_crd_established(),
        )
        .await
        .unwrap();
    }
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let api_of = |obj: &Value| {
        let kind = obj["kind"].as_str().unwrap();
        let api_version = obj["apiVersion"].as_str().unwrap();
        let (group, version) = api_version.split_once('/').unwrap();
        let ar = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
        };
        Api::<DynamicObject>::all_with(client.clone(), &ar)
    };
    let mut seen = 0;
    for path in example_files() {
        for obj in tools::documents(&std::fs::read_to_string(&path).unwrap()) {
            let typed: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
            if let Err(e) = api_of(&obj).create(&dry, &typed).await {
                panic!("{} refused: {e}", path.display());
            }
            seen += 1;
        }
    }
    assert!(seen >= 2, "examples found: {seen}");
    // the overrides example, patched onto an IPAMNode as its comment says: pools and
    // watermarks set, the operator's nodeUID untouched
    let overrides = tools::documents(
        &std::fs::read_to_string(
            tools::repo().join("deploy/examples/patches/ipamnode-overrides.yaml"),
        )
        .unwrap(),
    )
    .remove(0);
    let spec_keys: Vec<&String> = overrides["spec"].as_object().unwrap().keys().collect();
    assert_eq!(spec_keys, ["pools", "watermarks"], "users' fields only");
    let uid = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
    let node = serde_json::json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
        "metadata": {"name": "worker-1"}, "spec": {"nodeUID": uid}});
    let nodes = api_of(&node);
    let typed: DynamicObject = serde_json::from_value(node.clone()).unwrap();
    nodes.create(&PostParams::default(), &typed).await.unwrap();
    let patched = nodes
        .patch(
            "worker-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&overrides),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["spec"]["nodeUID"], uid);
    assert_eq!(patched.data["spec"]["pools"], overrides["spec"]["pools"]);
    assert_eq!(
        patched.data["spec"]["watermarks"],
        overrides["spec"]["watermarks"]
    );
    let mut bad = tools::documents(
        &std::fs::read_to_string(tools::repo().join("deploy/examples/ippool-gpu.yaml")).unwrap(),
    )
    .remove(0);
    bad["spec"]["blockSize"]["ipv4"] = Value::from(40);
    let typed: DynamicObject = serde_json::from_value(bad.clone()).unwrap();
    let err = api_of(&bad).create(&dry, &typed).await.unwrap_err();
    assert_eq!(common::code(&err), 422, "{err}");
    assert!(err.to_string().contains("blockSize"), "{err}");
    server.shutdown();
}

// ---------------------------------------------------------------------------------------------
// The workloads' shape.

#[test]
fn the_operator_is_highly_available_and_meets_pod_security_restricted() {
    let docs = tools::documents(&tools::render(&[]));
    let deploy = find(&docs, "Deployment", "tidepool-operator");
    let spec = pod(deploy);
    let c = container(spec, "operator");
    assert_eq!(restricted_violations(spec), Vec::<String>::new());
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(flag(c, "leader-elect").as_deref(), Some("true"));
    assert_eq!(spec["priorityClassName"], "system-cluster-critical");
    // the leader-election Role may touch exactly the Lease the flag names
    let lease = flag(c, "leader-elect-resource-name").expect("--leader-elect-resource-name");
    let role = find(&docs, "Role", "tidepool-operator-leader-election");
    assert!(
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| strs(&r["resourceNames"]) == [lease.as_str()]),
        "{role}"
    );
    assert_eq!(
        role["metadata"]["namespace"],
        deploy["metadata"]["namespace"]
    );
    // Leases only there: no ClusterRole grants them
    for cr in docs.iter().filter(|d| d["kind"] == "ClusterRole") {
        assert!(!cr["rules"].to_string().contains("leases"), "{cr}");
    }
    let ns_env = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "POD_NAMESPACE")
        .expect("POD_NAMESPACE (the Lease's namespace)");
    assert_eq!(
        ns_env["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    // anti-affinity on the hostname, a zone spread, both over these pods
    let anti =
        &spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
    assert!(selects(&anti["labelSelector"], deploy));
    let spread = &spec["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"], "topology.kubernetes.io/zone");
    assert!(selects(&spread["labelSelector"], deploy));
    // a PDB over these pods, one down at a time
    let pdb = find(&docs, "PodDisruptionBudget", "tidepool-operator");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(selects(&pdb["spec"]["selector"], deploy));
    // probes on --health-addr's port
    let health = port_of(&flag(c, "health-addr").expect("--health-addr"));
    for (probe, path) in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(
            resolve_port(c, &c[probe]["httpGet"]["port"]),
            health,
            "{probe}"
        );
    }
    for (kind, what) in [
        ("requests", "cpu"),
        ("requests", "memory"),
        ("limits", "cpu"),
        ("limits", "memory"),
    ] {
        assert!(
            c["resources"][kind][what].is_string(),
            "resources.{kind}.{what}"
        );
    }
    // the metrics Service and the NetworkPolicy cover --metrics-addr's port of these pods
    let metrics = port_of(&flag(c, "metrics-addr").expect("--metrics-addr"));
    let svc = find(&docs, "Service", "tidepool-operator-metrics");
    let sel = serde_json::json!({"matchLabels": svc["spec"]["selector"]});
    assert!(selects(&sel, deploy));
    assert_eq!(
        resolve_port(c, &svc["spec"]["ports"][0]["targetPort"]),
        metrics
    );
    let np = find(&docs, "NetworkPolicy", "tidepool-operator-metrics");
    assert!(selects(&np["spec"]["podSelector"], deploy));
    assert_eq!(strs(&np["spec"]["policyTypes"]), ["Ingress"]);
    let rules = np["spec"]["ingress"].as_array().unwrap();
    let ports: Vec<u64> = rules
        .iter()
        .flat_map(|r| r["ports"].as_array().unwrap().iter())
        .map(|p| resolve_port(c, &p["port"]))
        .collect();
    assert_eq!(ports, [metrics], "only the metrics port is opened");
    // the checker does find what "restricted" forbids (the agent's pod breaks it)
    let agent = pod(find(&docs, "DaemonSet", "tidepool-agent"));
    let found = restricted_violations(agent);
    for v in [
        "hostNetwork",
        "volume",
        "runAsNonRoot is not true",
        "runAsUser 0",
    ] {
        assert!(found.iter().any(|f| f.contains(v)), "{v}: {found:?}");
    }
}

#[test]
fn the_agent_daemonset_holds_only_what_cni_work_needs() {
    use tidepool_agent::cni::proto::{DEFAULT_RESTORED_MARKER, DEFAULT_SOCKET, DEFAULT_SPOOL_DIR};
    let docs = tools::documents(&tools::render(&[]));
    let ds = find(&docs, "DaemonSet", "tidepool-agent");
    let spec = pod(ds);
    let c = container(spec, "agent");
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["priorityClassName"], "system-node-critical");
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "RollingUpdate");
    assert_eq!(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"], 0);
    // tolerates every taint
    assert!(
        spec["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["operator"] == "Exists"
                && t.get("key").is_none()
                && t.get("effect").is_none()),
        "{}",
        spec["tolerations"]
    );
    let node = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "TIDEPOOL_NODE_NAME")
        .expect("TIDEPOOL_NODE_NAME");
    assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    // no privilege: no capability, no escalation, read-only root, seccomp
    let sc = &c["securityContext"];
    assert_ne!(sc["privileged"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(strs(&sc["capabilities"]["drop"]), ["ALL"]);
    assert!(sc["capabilities"]["add"].is_null());
    assert_eq!(
        effective(spec, c, "seccompProfile")["type"],
        "RuntimeDefault"
    );
    assert!(spec["hostPID"].is_null() && spec["hostIPC"].is_null());
    // metrics and probes on loopback only (a host-network port is beyond NetworkPolicy)
    let metrics = flag(c, "metrics-addr").expect("--metrics-addr");
    let health = flag(c, "health-addr").expect("--health-addr");
    assert!(metrics.starts_with("127.0.0.1:"), "{metrics}");
    assert!(health.starts_with("127.0.0.1:"), "{health}");
    assert!(c["ports"].is_null(), "the agent declares no port");
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["host"], "127.0.0.1", "{probe}");
        assert_eq!(
            c[probe]["httpGet"]["port"].as_u64(),
            Some(port_of(&health)),
            "{probe}"
        );
    }
    // exactly these host paths; the runtime's read-only
    let volumes: Vec<(&str, &str)> = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap(),
                v["hostPath"]["path"].as_str().expect("hostPath"),
            )
        })
        .collect();
    let host_paths: BTreeSet<&str> = volumes.iter().map(|(_, p)| *p).collect();
    assert_eq!(
        host_paths,
        BTreeSet::from([
            "/run/tidepool",
            "/var/lib/tidepool",
            "/var/run/netns",
            "/var/lib/cni/results"
        ])
    );
    let mounts = c["volumeMounts"].as_array().unwrap();
    let host_of = |m: &Value| volumes.iter().find(|(n, _)| m["name"] == *n).unwrap().1;
    for m in mounts {
        // the same path inside and out: the plugin, on the host, uses the agent's paths
        assert_eq!(m["mountPath"].as_str().unwrap(), host_of(m), "{m}");
        let runtime = ["/var/run/netns", "/var/lib/cni/results"].contains(&host_of(m));
        assert_eq!(m["readOnly"] == true, runtime, "{m}");
    }
    // every path flag lies on a mount; the shared ones are the plugin's defaults
    let mounted = |p: &str| {
        mounts
            .iter()
            .any(|m| Path::new(p).starts_with(m["mountPath"].as_str().unwrap()))
    };
    for f in [
        "socket",
        "restored-marker",
        "state-dir",
        "netns-dir",
        "cni-cache-dir",
    ] {
        let p = flag(c, f).unwrap_or_else(|| panic!("--{f}"));
        assert!(mounted(&p), "--{f}={p} is on no mount");
    }
    assert_eq!(flag(c, "socket").unwrap(), DEFAULT_SOCKET);
    assert_eq!(flag(c, "restored-marker").unwrap(), DEFAULT_RESTORED_MARKER);
    assert_eq!(
        Path::new(&flag(c, "state-dir").unwrap()).join("spool"),
        Path::new(DEFAULT_SPOOL_DIR),
        "the agent's spool (<state-dir>/spool) is where the plugin spools"
    );
    // the agent takes its pod networks from the IPPools: no hand-kept --pod-network list
    assert_eq!(
        flag(c, "pod-network"),
        None,
        "the pod networks come from the IPPools"
    );
    // the admission policy names the service account the agent runs as
    let sa = format!(
        "system:serviceaccount:{}:{}",
        ds["metadata"]["namespace"].as_str().unwrap(),
        spec["serviceAccountName"].as_str().unwrap()
    );
    let vap = find(
        &docs,
        "ValidatingAdmissionPolicy",
        "tidepool-agent-own-node",
    );
    assert!(
        vap["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .contains(&sa),
        "{sa}"
    );
}

#[test]
fn agent_metrics_are_served_to_prometheus_only_with_authentication() {
    let docs = tools::documents(&tools::render(&["agent-metrics", "servicemonitor"]));
    let ds = find(&docs, "DaemonSet", "tidepool-agent");
    let spec = pod(ds);
    let agent = container(spec, "agent");
    let proxy = container(spec, "kube-rbac-proxy");
    assert_eq!(
        flag(proxy, "upstream").unwrap(),
        format!("http://{}/", flag(agent, "metrics-addr").unwrap())
    );
    assert_eq!(flag(proxy, "allow-paths").as_deref(), Some("/metrics"));
    let listen = flag(proxy, "secure-listen-address").expect("TLS");
    let svc = find(&docs, "Service", "tidepool-agent-metrics");
    let sel = serde_json::json!({"matchLabels": svc["spec"]["selector"]});
    assert!(selects(&sel, ds));
    assert_eq!(
        resolve_port(proxy, &svc["spec"]["ports"][0]["targetPort"]),
        port_of(&listen)
    );
    let sm = find(&docs, "ServiceMonitor", "tidepool-agent");
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["port"], svc["spec"]["ports"][0]["name"]);
    // current settings, not the deprecated ones (the Prometheus Operator refuses a
    // bearerTokenFile when arbitrary file access is denied)
    for deprecated in ["bearerTokenFile", "bearerTokenSecret"] {
        assert!(endpoint[deprecated].is_null(), "{deprecated}");
    }
    assert!(endpoint["tlsConfig"]["insecureSkipVerify"].is_null());
    // the token: a service account's, bound to the role that may read /metrics
    assert_eq!(endpoint["authorization"]["type"], "Bearer");
    let token = find(
        &docs,
        "Secret",
        endpoint["authorization"]["credentials"]["name"]
            .as_str()
            .unwrap(),
    );
    assert_eq!(token["type"], "kubernetes.io/service-account-token");
    let scraper = &token["metadata"]["annotations"]["kubernetes.io/service-account.name"];
    assert!(docs.iter().any(|d| d["kind"] == "ClusterRoleBinding"
        && d["roleRef"]["name"] == "tidepool-metrics-reader"
        && d["subjects"][0]["name"] == *scraper
        && d["subjects"][0]["namespace"] == token["metadata"]["namespace"]));
    // the certificate: the proxy serves the Secret whose CA Prometheus checks it with, for
    // the Service's name
    let tls = &endpoint["tlsConfig"];
    assert_eq!(
        tls["serverName"],
        format!(
            "{}.{}.svc",
            svc["metadata"]["name"].as_str().unwrap(),
            svc["metadata"]["namespace"].as_str().unwrap()
        )
    );
    let secret = tls["ca"]["secret"]["name"].as_str().unwrap();
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == secret)
        .expect("the proxy's certificate volume");
    let mount = proxy["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("mounted in the proxy");
    let dir = mount["mountPath"].as_str().unwrap();
    assert_eq!(
        flag(proxy, "tls-cert-file").unwrap(),
        format!("{dir}/tls.crt")
    );
    assert_eq!(
        flag(proxy, "tls-private-key-file").unwrap(),
        format!("{dir}/tls.key")
    );
    assert_eq!(tls["ca"]["secret"]["key"], "ca.crt");
    // the job names the alert rules select on
    for (monitor, svc) in [
        ("tidepool-agent", "tidepool-agent-metrics"),
        ("tidepool-operator", "tidepool-operator-metrics"),
    ] {
        let sm = find(&docs, "ServiceMonitor", monitor);
        let key = sm["spec"]["jobLabel"].as_str().unwrap();
        assert_eq!(
            find(&docs, "Service", svc)["metadata"]["labels"][key],
            monitor
        );
    }
    // the proxy's reviews are granted, and not to the agent's own role
    let proxy_role = find(&docs, "ClusterRole", "tidepool-agent-metrics-proxy");
    let resources: Vec<&str> = proxy_role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| strs(&r["resources"]))
        .collect();
    assert_eq!(resources, ["tokenreviews", "subjectaccessreviews"]);
    let agent_role = find(&docs, "ClusterRole", "tidepool-agent");
    assert!(!agent_role.to_string().contains("tokenreviews"));
}

/// Ports Cilium (agent, operator, Envoy, Hubble, health, cluster mesh) and Calico (Felix,
/// Typha, kube-controllers) listen on: tidepool's must not collide with them, or a cluster
/// migrating from one to the other has two processes on one port.
const TAKEN_PORTS: &[std::ops::RangeInclusive<u64>] = &[
    9962..=9965,
    9876..=9876,
    9879..=9879,
    9890..=9893,
    9234..=9234,
    4240..=4240,
    4244..=4244,
    9091..=9099,
    5473..=5473,
];

/// Every port a container of `docs` listens on: its `containerPorts` and the ports of its
/// `*-addr`/`*-address` flags.
fn listened_ports(docs: &[Value]) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for w in docs
        .iter()
        .filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
    {
        for c in all_containers(pod(w)) {
            let name = c["name"].as_str().unwrap_or("?").to_string();
            for p in c["ports"].as_array().into_iter().flatten() {
                out.push((name.clone(), p["containerPort"].as_u64().unwrap()));
            }
            for a in strs(&c["args"]) {
                let Some((flag, value)) = a.split_once('=') else {
                    continue;
                };
                if flag.ends_with("-addr") || flag.ends_with("-address") {
                    out.push((format!("{name} {flag}"), port_of(value)));
                }
            }
        }
    }
    out
}

#[test]
fn ports_stay_clear_of_cilium_and_calico() {
    let docs = tools::documents(&tools::render(COMPONENTS));
    let ports = listened_ports(&docs);
    for (what, port) in &ports {
        assert!(
            !TAKEN_PORTS.iter().any(|r| r.contains(port)),
            "{what}: port {port} is Cilium's or Calico's"
        );
    }
    let numbers: BTreeSet<u64> = ports.iter().map(|(_, p)| *p).collect();
    assert_eq!(
        numbers,
        BTreeSet::from([9690, 9691, 9692, 9693, 9694]),
        "{ports:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Images.

#[test]
fn images_put_the_binaries_where_the_manifests_run_them_as_their_users() {
    tools::ok(&HADOLINT, ["deploy/Dockerfile"]);
    let text = std::fs::read_to_string(tools::repo().join("deploy/Dockerfile")).unwrap();
    let stages = dockerfile::stages(&text).unwrap();
    let build = stages
        .iter()
        .find(|s| s.name == "build")
        .expect("a build stage");
    assert!(
        build.runs.iter().any(|r| r.contains("+crt-static")),
        "static binaries"
    );
    assert!(
        build
            .runs
            .iter()
            .any(|r| r.contains("CARGO_PROFILE_RELEASE_STRIP=symbols")),
        "stripped binaries (the release profile keeps debug line tables)"
    );
    // the base and every component: cni-install swaps the agent's image for its datapath one
    let mut docs = tools::documents(&tools::render(&[]));
    docs.extend(tools::documents(&tools::render(COMPONENTS)));
    let mut checked = BTreeSet::new();
    for w in docs
        .iter()
        .filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
    {
        let spec = pod(w);
        for c in all_containers(spec) {
            let image = c["image"].as_str().unwrap();
            let repo = image
                .rsplit('/')
                .next()
                .unwrap()
                .split([':', '@'])
                .next()
                .unwrap();
            let Some(target) = repo.strip_prefix("tidepool-") else {
                continue; // kube-rbac-proxy
            };
            let stage = stages
                .iter()
                .find(|s| s.name == target)
                .unwrap_or_else(|| panic!("{image}: no stage {target} in deploy/Dockerfile"));
            let command = strs(&c["command"]);
            assert_eq!(
                command, stage.entrypoint,
                "{image}: command and ENTRYPOINT differ"
            );
            for path in command
                .iter()
                .filter(|p| p.starts_with('/') && !p.starts_with("/bin/"))
            {
                assert!(
                    stage.copies.iter().any(|d| d == path),
                    "{image}: {path} is not copied in"
                );
                let bin = Path::new(path).file_name().unwrap().to_str().unwrap();
                if bin.starts_with("tidepool-") {
                    assert!(
                        build
                            .runs
                            .iter()
                            .any(|r| r.contains(&format!("--bin {bin}"))),
                        "{bin} is not built"
                    );
                }
            }
            if target == "agent-datapath" {
                assert!(
                    stage.base.starts_with("debian:"),
                    "{image}: base {}",
                    stage.base
                );
                assert!(
                    stage
                        .runs
                        .iter()
                        .any(|r| r.contains("install") && r.contains("iptables")),
                    "{image}: iptables for --masquerade"
                );
            } else if target != "cni-installer" {
                assert!(
                    stage.base.contains("distroless/static"),
                    "{image}: base {}",
                    stage.base
                );
            }
            let (uid, gid) = stage
                .user
                .unwrap_or_else(|| panic!("stage {target} sets no USER"));
            assert_eq!(
                effective(spec, c, "runAsUser").as_u64(),
                Some(u64::from(uid)),
                "{image}: user"
            );
            assert_eq!(
                effective(spec, c, "runAsGroup").as_u64(),
                gid.map(u64::from),
                "{image}: group"
            );
            checked.insert(target.to_string());
        }
    }
    assert_eq!(
        checked,
        BTreeSet::from([
            "agent".into(),
            "agent-datapath".into(),
            "cni-installer".into(),
            "operator".into()
        ])
    );
    // the installer's script and plugin are where the script and the init container look
    let installer = stages.iter().find(|s| s.name == "cni-installer").unwrap();
    assert!(
        installer
            .copies
            .iter()
            .any(|d| d == "/opt/tidepool/tidepool-cni")
    );
}

// ---------------------------------------------------------------------------------------------
// The CNI installer.

/// A node's CNI directories in a temp dir, with a stand-in ptp and plugin binary.
struct Node {
    dir: tools::TempDir,
}

impl Node {
    fn new(with_ptp: bool) -> Node {
        let dir = tools::TempDir::new("cni");
        for d in ["bin", "net.d"] {
            std::fs::create_dir(dir.0.join(d)).unwrap();
        }
        std::fs::write(dir.0.join("tidepool-cni"), b"\x7fELF plugin bytes").unwrap();
        let plugins: &[&str] = if with_ptp {
            &["ptp", "portmap"]
        } else {
            &["portmap"]
        };
        for p in plugins {
            let p = dir.0.join("bin").join(p);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Node { dir }
    }

    fn conf(&self, name: &str) -> std::path::PathBuf {
        self.dir.0.join("net.d").join(name)
    }

    /// Runs install-cni.sh against this node: (succeeded, stderr).
    fn install(&self) -> (bool, String) {
        let script = tools::repo().join("deploy/components/cni-install/install-cni.sh");
        let out = std::process::Command::new(SH.name)
            .arg(script)
            .env("CNI_BIN_DIR", self.dir.0.join("bin"))
            .env("CNI_CONF_DIR", self.dir.0.join("net.d"))
            .env("PLUGIN_SRC", self.dir.0.join("tidepool-cni"))
            .output()
            .unwrap_or_else(|e| panic!("sh: {e}: install {}", SH.install));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn installed(&self) -> bool {
        self.dir.0.join("bin/tidepool-cni").exists() || self.conf("10-tidepool.conflist").exists()
    }
}

#[test]
fn cni_installer_installs_and_refuses_when_another_config_sorts_first() {
    use std::os::unix::fs::PermissionsExt;
    // an empty config directory: installs the plugin (executable, same bytes) and the conflist
    let node = Node::new(true);
    let (ok, log) = node.install();
    assert!(ok, "{log}");
    let bin = node.dir.0.join("bin/tidepool-cni");
    assert_eq!(
        std::fs::read(&bin).unwrap(),
        std::fs::read(node.dir.0.join("tidepool-cni")).unwrap()
    );
    assert_eq!(
        std::fs::metadata(&bin).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let conf: Value =
        serde_json::from_slice(&std::fs::read(node.conf("10-tidepool.conflist")).unwrap()).unwrap();
    assert_eq!(
        conf["cniVersion"], "1.0.0",
        "the reference plugins before v1.5 refuse 1.1.0"
    );
    assert_eq!(conf["plugins"][0]["type"], "ptp");
    assert_eq!(conf["plugins"][0]["ipam"]["type"], "tidepool-cni");
    assert_eq!(
        conf["plugins"][0].get("ipMasq"),
        None,
        "ptp masquerades nothing"
    );
    assert_eq!(conf["plugins"][1]["type"], "portmap");
    assert_eq!(conf["plugins"][1]["capabilities"]["portMappings"], true);
    // leftovers of the atomic writes: none
    let names: BTreeSet<String> = std::fs::read_dir(node.dir.0.join("net.d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, BTreeSet::from(["10-tidepool.conflist".to_string()]));
    // again (an agent restart): still fine, ours is the first
    let (ok, log) = node.install();
    assert!(ok, "{log}");

    // another config sorts first: refused, with the file named, and nothing installed
    let node = Node::new(true);
    std::fs::write(node.conf("00-other.conflist"), "{}").unwrap();
    let (ok, log) = node.install();
    assert!(!ok, "must refuse: {log}");
    assert!(
        log.contains("refusing") && log.contains("00-other.conflist"),
        "{log}"
    );
    assert!(!node.installed());

    // configs that sort after ours, and files the runtime does not read, do not stop it
    let node = Node::new(true);
    std::fs::write(node.conf("99-loopback.conf"), "{}").unwrap();
    std::fs::write(node.conf("00-notes.txt"), "").unwrap();
    let (ok, log) = node.install();
    assert!(ok, "{log}");
    assert!(node.installed());

    // no main plugin: refused, saying what to install
    let node = Node::new(false);
    let (ok, log) = node.install();
    assert!(!ok && log.contains("ptp"), "{log}");
    assert!(!node.installed());
    // no portmap: refused the same way
    let node = Node::new(true);
    std::fs::remove_file(node.dir.0.join("bin/portmap")).unwrap();
    let (ok, log) = node.install();
    assert!(!ok && log.contains("portmap"), "{log}");
    assert!(!node.installed());
}

#[test]
fn the_cni_install_component_runs_the_installer_before_the_agent() {
    let docs = tools::documents(&tools::render(&["cni-install"]));
    let spec = pod(find(&docs, "DaemonSet", "tidepool-agent"));
    let init = &spec["initContainers"][0];
    assert_eq!(
        strs(&init["command"]),
        ["/bin/sh", "/opt/tidepool/install-cni.sh"]
    );
    let env = |name: &str| {
        init["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap()["value"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let mounted_from = |path: String| {
        let m = init["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path.as_str())
            .unwrap();
        let v = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        v["hostPath"]["path"].as_str().unwrap().to_string()
    };
    assert_eq!(mounted_from(env("CNI_BIN_DIR")), "/opt/cni/bin");
    assert_eq!(mounted_from(env("CNI_CONF_DIR")), "/etc/cni/net.d");
    // and the operator no longer depends on the pod network it provides
    assert_eq!(
        pod(find(&docs, "Deployment", "tidepool-operator"))["hostNetwork"],
        true
    );
    // the agent is the datapath: NET_ADMIN and nothing else, routes and masquerade on
    let agent = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "agent")
        .unwrap();
    assert_eq!(agent["image"], "tidepool-agent-datapath:0.1.0");
    let caps = &agent["securityContext"]["capabilities"];
    assert_eq!(
        (strs(&caps["drop"]), strs(&caps["add"])),
        (vec!["ALL"], vec!["NET_ADMIN"])
    );
    assert_eq!(agent["securityContext"]["privileged"], false);
    let agent_env = |name: &str| {
        agent["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].as_str().unwrap().to_string())
    };
    assert_eq!(agent_env("TIDEPOOL_NODE_ROUTES").as_deref(), Some("true"));
    assert_eq!(agent_env("TIDEPOOL_MASQUERADE").as_deref(), Some("true"));
    let keep = agent_env("TIDEPOOL_NON_MASQUERADE_CIDRS").expect("non-masquerade CIDRs");
    for cidr in keep.split(',') {
        cidr.parse::<ipnet::IpNet>().expect("a CIDR");
    }
    // the base agent stays without a capability
    let base = tools::documents(&tools::render(&[]));
    let base_agent = &pod(find(&base, "DaemonSet", "tidepool-agent"))["containers"][0];
    assert_eq!(
        base_agent["securityContext"]["capabilities"]["add"],
        Value::Null
    );
}

// ---------------------------------------------------------------------------------------------
// Lint.

#[test]
fn yamllint_passes_on_deploy() {
    tools::ok(&YAMLLINT, ["--strict", "-c", ".yamllint.yaml", "deploy/"]);
}

// ---------------------------------------------------------------------------------------------
// Alerts and the dashboard.

const RULE_TESTS: &str = "deploy/prometheus/tests/tidepool-rules-test.yaml";
/// Where the runbooks are, and the one prefix of every alert's `runbook_url` (then `#` and
/// the alert's name in lower case: the heading's anchor).
const RUNBOOKS: &str = "docs/operations.md";
const RUNBOOK_BASE: &str = "https://github.com/tidepool-dev/tidepool/blob/main/docs/operations.md";

fn yaml_file(path: &str) -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(tools::repo().join(path)).unwrap()).unwrap()
}

#[test]
fn alert_rules_pass_promtool_and_follow_the_mixin_conventions() {
    tools::ok(&PROMTOOL, ["check", "rules", RULES]);
    tools::ok(&PROMTOOL, ["test", "rules", RULE_TESTS]);
    let rules = queries::rules();
    let tests = yaml_file(RULE_TESTS);
    let runbooks = std::fs::read_to_string(tools::repo().join(RUNBOOKS)).unwrap();
    let mut alerts = Vec::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"]
                .as_str()
                .expect("only alerts here")
                .to_string();
            assert!(
                ["critical", "warning", "info"]
                    .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
                "{name}: severity"
            );
            for a in ["summary", "description", "runbook_url"] {
                assert!(
                    rule["annotations"][a]
                        .as_str()
                        .is_some_and(|s| !s.is_empty()),
                    "{name}: {a}"
                );
            }
            let anchor = name.to_lowercase();
            assert_eq!(
                rule["annotations"]["runbook_url"],
                format!("{RUNBOOK_BASE}#{anchor}"),
                "{name}"
            );
            assert!(
                runbooks
                    .lines()
                    .any(|l| l.starts_with('#') && l.trim_start_matches('#').trim() == name),
                "{name}: no runbook heading in {RUNBOOKS}"
            );
            let for_ = rule["for"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no for"));
            assert!(
                for_.ends_with('m') || for_.ends_with('h'),
                "{name}: for {for_}"
            );
            let problems = promql::check(rule["expr"].as_str().unwrap());
            assert!(problems.is_empty(), "{name}: {problems:?}");
            alerts.push(name);
        }
    }
    assert!(alerts.len() >= 15, "{alerts:?}");
    for new in [
        "TidepoolPoolInvalid",
        "TidepoolReclaimLatencyHigh",
        "TidepoolOperatorDown",
        "TidepoolOperatorRestarting",
        "TidepoolPoolExhaustionForecast",
    ] {
        assert!(alerts.iter().any(|a| a == new), "{new} missing");
    }
    // one case that fires and one that does not, per alert
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .collect();
    for name in &alerts {
        let of: Vec<&&Value> = cases
            .iter()
            .filter(|c| c["alertname"] == name.as_str())
            .collect();
        let fires = |c: &&&Value| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
        assert!(of.iter().any(fires), "{name}: no case where it fires");
        assert!(
            of.iter().any(|c| !fires(c)),
            "{name}: no case where it stays quiet"
        );
    }
}

/// The overlay snippet components/servicemonitor documents for moving the runbook links:
/// its comment lines that start with `#   `, unindented.
fn runbook_snippet() -> String {
    let k = std::fs::read_to_string(
        tools::repo().join("deploy/components/servicemonitor/kustomization.yaml"),
    )
    .unwrap();
    k.lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn the_servicemonitor_component_ships_the_rules_and_the_dashboard() {
    let docs = tools::documents(&tools::render(&["servicemonitor"]));
    // the rules, as deploy/prometheus/ has them
    let rule = find(&docs, "PrometheusRule", "tidepool");
    assert_eq!(
        rule["spec"],
        queries::rules(),
        "prometheusrule.yaml's spec must be {RULES}'s content: copy it again"
    );
    // the dashboard, generated from deploy/grafana/
    let cm = find(&docs, "ConfigMap", "tidepool-grafana-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["metadata"]["namespace"], "tidepool");
    let shipped: Value =
        serde_json::from_str(cm["data"]["tidepool.json"].as_str().unwrap()).unwrap();
    assert_eq!(shipped, queries::dashboard());
    // every runbook link moves with the one documented replacement, its anchor kept
    let base = "https://docs.example.com/tidepool/operations";
    let snippet = runbook_snippet();
    assert!(snippet.contains(base), "{snippet}");
    let moved = tools::documents(&tools::render_with(&["servicemonitor"], &snippet));
    assert!(
        !moved
            .iter()
            .any(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "tidepool-runbooks"),
        "the snippet's ConfigMap is local: never applied"
    );
    let moved = find(&moved, "PrometheusRule", "tidepool");
    let mut n = 0;
    for (group, before) in moved["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .zip(rule["spec"]["groups"].as_array().unwrap())
    {
        for (r, was) in group["rules"]
            .as_array()
            .unwrap()
            .iter()
            .zip(before["rules"].as_array().unwrap())
        {
            let anchor = r["alert"].as_str().unwrap().to_lowercase();
            assert_eq!(
                was["annotations"]["runbook_url"],
                format!("{RUNBOOK_BASE}#{anchor}")
            );
            assert_eq!(r["annotations"]["runbook_url"], format!("{base}#{anchor}"));
            n += 1;
        }
    }
    assert_eq!(n, queries::alerts(&queries::rules()).len());
}

/// `patch` on Nodes (the exhaustion taint) is granted only with the component that also
/// turns `--taint-exhausted-nodes` on.
#[test]
fn nodes_are_patched_only_with_the_taint_component() {
    let patches_nodes = |docs: &[Value]| {
        find(docs, "ClusterRole", "tidepool-operator")["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| {
                strs(&r["resources"]).contains(&"nodes") && strs(&r["verbs"]).contains(&"patch")
            })
    };
    let tainting = |docs: &[Value]| {
        let op = container(
            pod(find(docs, "Deployment", "tidepool-operator")),
            "operator",
        );
        strs(&op["args"]).contains(&"--taint-exhausted-nodes")
    };
    let base = tools::documents(&tools::render(&[]));
    assert!(!patches_nodes(&base) && !tainting(&base));
    let with = tools::documents(&tools::render(&["taint-exhausted-nodes"]));
    assert!(patches_nodes(&with) && tainting(&with));
}

/// A query with the dashboard's variables replaced by what Grafana would send (each
/// variable's All, `.*`).
fn substituted(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$cluster", ".*")
        .replace("$pool", ".*")
        .replace("$node", ".*")
}

/// `metric` or `metric{matchers}` of a `label_values` variable with `label=~".+"` added.
fn with_label(metric: &str, label: &str) -> String {
    match metric.strip_suffix('}') {
        Some(open) => format!("{open}, {label}=~\".+\"}}"),
        None => format!("{metric}{{{label}=~\".+\"}}"),
    }
}

/// The variables that keep one cluster's series apart in a shared Prometheus (`cluster`,
/// All matching series without the label too) and pick node agents by node (`node`).
fn assert_scoping_variables(var: impl Fn(&str) -> Value) {
    let cluster = var("cluster");
    assert_eq!(
        cluster["query"]["query"],
        "label_values(tidepool_build_info, cluster)"
    );
    assert_eq!(cluster["includeAll"], true);
    assert_eq!(
        cluster["allValue"], ".*",
        "All matches a Prometheus of one cluster"
    );
    assert_eq!(
        var("node")["query"]["query"],
        "label_values(tidepool_agent_ips{cluster=~\"$cluster\"}, node)"
    );
    assert_eq!(
        var("pool")["query"]["query"],
        "label_values(tidepool_ipam_pool_ips{cluster=~\"$cluster\"}, pool)"
    );
}

#[test]
fn the_dashboard_names_only_exported_metrics_and_shows_them_all() {
    let dash = queries::dashboard();
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36);
    let vars = dash["templating"]["list"].as_array().unwrap();
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("variable {name}"))
            .clone()
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    for (name, metric, label) in queries::label_values_variables(&dash) {
        let problems = promql::check(&substituted(&with_label(&metric, &label)));
        assert!(problems.is_empty(), "variable {name}: {problems:?}");
    }
    assert_scoping_variables(var);

    const CURRENT: &[&str] = &[
        "row",
        "timeseries",
        "stat",
        "bargauge",
        "gauge",
        "table",
        "state-timeline",
        "heatmap",
        "text",
    ];
    let mut exprs = Vec::new();
    let mut ids = BTreeSet::new();
    for p in panels(&dash) {
        let title = p["title"].as_str().unwrap_or("?");
        // Grafana keys panels (and the recording rules below) by id
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "{title}: id {} twice",
            p["id"]
        );
        let kind = p["type"].as_str().unwrap();
        assert!(CURRENT.contains(&kind), "{title}: panel type {kind}");
        if kind == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            let expr = t["expr"].as_str().unwrap();
            let names = promql::names(expr).unwrap();
            for r in &names.ranges {
                assert_eq!(r, "$__rate_interval", "{title}: a fixed window in {expr}");
            }
            for s in &names.selectors {
                let applies = |label: &str, var: &str| {
                    s.matchers
                        .contains(&(label.into(), "=~".into(), format!("${var}")))
                };
                assert!(
                    applies("cluster", "cluster"),
                    "{title}: {} does not select the cluster variable in {expr}",
                    s.name
                );
                if s.name == tidepool_metrics::POOL_IPS {
                    assert!(applies("pool", "pool"), "{title}: no $pool in {expr}");
                }
                if s.name.starts_with("tidepool_agent_") {
                    assert!(applies("node", "node"), "{title}: no $node in {expr}");
                }
            }
            let problems = promql::check(&substituted(expr));
            assert!(problems.is_empty(), "{title}: {problems:?}");
            exprs.push((
                format!("{}:{}", p["id"], t["refId"].as_str().unwrap()),
                substituted(expr),
            ));
        }
    }
    // free addresses per family, held by the nodes and left in the pools
    let per_family = |metric: &str| {
        exprs.iter().any(|(_, e)| {
            let n = promql::names(e).unwrap();
            n.grouping.first().is_some_and(|g| g == "family")
                && n.selectors.iter().any(|s| {
                    s.name == metric
                        && s.matchers
                            .contains(&("state".into(), "=".into(), "free".into()))
                })
        })
    };
    assert!(
        per_family(tidepool_metrics::IPS),
        "nodes' free addresses per family"
    );
    assert!(
        per_family(tidepool_metrics::POOL_IPS),
        "pools' free addresses per family"
    );
    // every query parses (promtool's parser, through recording rules)
    let dir = tools::TempDir::new("dashboard");
    let mut rules = String::from("groups:\n- name: dashboard\n  rules:\n");
    for (id, expr) in &exprs {
        rules.push_str(&format!(
            "  - record: panel:{}\n    expr: {}\n",
            id.replace(':', "_"),
            serde_json::to_string(expr).unwrap()
        ));
    }
    let path = dir.0.join("dashboard-rules.yaml");
    std::fs::write(&path, rules).unwrap();
    let out = tools::ok(
        &PROMTOOL,
        [OsStr::new("check"), OsStr::new("rules"), path.as_os_str()],
    );
    assert!(
        out.contains(&format!("{} rules found", exprs.len())),
        "{out}"
    );
    // and every metric the binaries export has a panel
    let shown: BTreeSet<String> = exprs
        .iter()
        .flat_map(|(_, e)| promql::names(e).unwrap().selectors)
        .map(|s| {
            let n = s.name;
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|x| {
                    n.strip_suffix(x)
                        .filter(|b| tidepool_metrics::def(b).is_some())
                        .map(str::to_string)
                })
                .unwrap_or(n)
        })
        .collect();
    for d in tidepool_metrics::all() {
        assert!(shown.contains(d.name), "{} has no panel", d.name);
    }
}

// ---------------------------------------------------------------------------------------------
// What no test server can emulate: priority admission and API Priority and Fairness.

/// Issue 25: the bundle ships (1) a ResourceQuota that admits the priority classes both
/// workloads use, in their namespace, whose pod limit never caps the DaemonSet, and (2) a
/// FlowSchema that sends the operator's Lease requests to the built-in `leader-election`
/// priority level ahead of the `service-accounts` schema (precedence 9000) that would
/// otherwise match them (kubernetes/kubernetes
/// staging/src/k8s.io/apiserver/pkg/apis/flowcontrol/bootstrap/default.go,
/// `SuggestedFlowSchemaWorkloadLeaderElection` and `SuggestedFlowSchemaServiceAccounts`).
#[test]
fn the_bundle_admits_its_critical_pods_and_gives_the_lease_the_leader_election_level() {
    let docs = tools::documents(&tools::render(&[]));
    let operator = find(&docs, "Deployment", "tidepool-operator");
    let agent = find(&docs, "DaemonSet", "tidepool-agent");
    let ns = operator["metadata"]["namespace"].as_str().unwrap();
    assert_eq!(agent["metadata"]["namespace"], ns);

    let quotas: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ResourceQuota")
        .collect();
    let [quota] = quotas[..] else {
        panic!("one ResourceQuota expected, found {}", quotas.len())
    };
    assert_eq!(quota["metadata"]["namespace"], ns);
    let exprs = quota["spec"]["scopeSelector"]["matchExpressions"]
        .as_array()
        .unwrap();
    let [expr] = &exprs[..] else {
        panic!("one scope expression expected: {exprs:?}")
    };
    assert_eq!(
        (&expr["scopeName"], &expr["operator"]),
        (&Value::from("PriorityClass"), &Value::from("In"))
    );
    let classes = strs(&expr["values"]);
    for workload in [operator, agent] {
        let class = pod(workload)["priorityClassName"].as_str().unwrap();
        assert!(
            classes.contains(&class),
            "{class} not admitted by {classes:?}"
        );
    }
    // Above the largest clusters (Kubernetes' tested 5,000 nodes; GKE's 65,000) with room for
    // the operator's replicas: the DaemonSet is never capped.
    let pods: u64 = quota["spec"]["hard"]["pods"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        pods >= 1_000_000,
        "hard.pods {pods} could cap the DaemonSet"
    );

    let schemas: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "FlowSchema").collect();
    let [schema] = schemas[..] else {
        panic!("one FlowSchema expected, found {}", schemas.len())
    };
    let spec = &schema["spec"];
    assert_eq!(
        spec["priorityLevelConfiguration"]["name"],
        "leader-election"
    );
    let precedence = spec["matchingPrecedence"].as_i64().unwrap();
    assert!(
        (2..9000).contains(&precedence),
        "precedence {precedence} must come before service-accounts (9000)"
    );
    let rules = spec["rules"].as_array().unwrap();
    let [rule] = &rules[..] else {
        panic!("one rule expected: {rules:?}")
    };
    let account = pod(operator)["serviceAccountName"].as_str().unwrap();
    assert_eq!(
        rule["subjects"],
        serde_json::json!([{"kind": "ServiceAccount",
            "serviceAccount": {"name": account, "namespace": ns}}])
    );
    let resource_rules = rule["resourceRules"].as_array().unwrap();
    let [leases] = &resource_rules[..] else {
        panic!("one resource rule expected: {resource_rules:?}")
    };
    assert_eq!(strs(&leases["apiGroups"]), ["coordination.k8s.io"]);
    assert_eq!(strs(&leases["resources"]), ["leases"]);
    // the Lease lives in the operator's namespace (POD_NAMESPACE)
    assert_eq!(strs(&leases["namespaces"]), [ns]);
    let verbs = strs(&leases["verbs"]);
    for verb in ["get", "update", "create"] {
        assert!(verbs.contains(&verb), "{verb} missing from {verbs:?}");
    }
}

/// The example objects, `deploy/examples/*.yaml` in name order: what
/// `kubectl apply -f deploy/examples/` applies. Its `patches/` holds merge patches, not
/// objects, and kubectl does not descend into it.
fn example_files() -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(tools::repo().join("deploy/examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}
