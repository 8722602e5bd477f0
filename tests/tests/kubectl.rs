//! kubectl as an independent client of the in-process API server. These tests FAIL when
//! kubectl is missing: run them with `cargo test -p tidepool-tests kubectl`.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DynamicObject};
use serde_json::Value;
use tidepool_tests::ApiServer;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// The pinned v1.32 binary behind the machine's kubectl dispatcher (which picks the binary
/// matching the server's minor version, 1.33 for us).
const KUBECTL_1_32: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.32";

fn kubectl_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("TIDEPOOL_KUBECTL") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "TIDEPOOL_KUBECTL={} is not a file",
            p.display()
        );
        return p;
    }
    let candidates = [PathBuf::from("/usr/bin/kubectl")].into_iter().chain(
        std::env::var_os("PATH").into_iter().flat_map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("kubectl"))
                .collect::<Vec<_>>()
        }),
    );
    for c in candidates {
        if c.is_file() {
            return c;
        }
    }
    panic!(
        "kubectl not found (looked at /usr/bin/kubectl and on PATH): the kubectl tests need kubectl v1.32 installed; they do not skip"
    );
}

struct Kubectl {
    bin: PathBuf,
    dir: PathBuf,
}

static N: AtomicUsize = AtomicUsize::new(0);

impl Kubectl {
    fn new(server: &ApiServer) -> Self {
        Self::with_binary(server, kubectl_binary())
    }

    fn with_binary(server: &ApiServer, bin: PathBuf) -> Self {
        Self::with_identity(server, bin, "kubectl")
    }

    /// kubectl whose kubeconfig authenticates as `identity` (tidepool_tests::UserInfo).
    fn with_identity(server: &ApiServer, bin: PathBuf, identity: &str) -> Self {
        assert!(
            bin.is_file(),
            "kubectl binary {} not found: the kubectl tests need it; they do not skip",
            bin.display()
        );
        let dir = std::env::temp_dir().join(format!(
            "tidepool-kubectl-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        server
            .write_kubeconfig(identity, &dir.join("kubeconfig"))
            .expect("kubeconfig");
        Kubectl { bin, dir }
    }

    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let mut cmd = Command::new(&self.bin);
        // The cache flag goes first: after `args`, it would land behind a `--` (a command).
        cmd.arg("--cache-dir")
            .arg(self.dir.join("cache"))
            .args(args)
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("HOME", &self.dir)
            .env_remove("KUBERNETES_SERVICE_HOST");
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .expect("join")
            .expect("run kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\nstdout: {out}\nstderr: {err}");
        out
    }

    /// `kubectl apply`s deploy/crds/ and waits until the three CRDs are Established; the
    /// apply's output.
    async fn install_crds(&self) -> String {
        let out = self.ok(&["apply", "-f", &format!("{DEPLOY}/crds/")]).await;
        self.ok(&[
            "wait",
            "--for=condition=Established",
            "crd/ippools.ipam.tidepool.dev",
            "crd/ipamblocks.ipam.tidepool.dev",
            "crd/ipamnodes.ipam.tidepool.dev",
            "--timeout=20s",
        ])
        .await;
        out
    }

    async fn fails(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args).await;
        assert!(!ok, "kubectl {args:?} should fail but printed: {out}");
        err
    }
}

impl Drop for Kubectl {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fixture(name: &str) -> String {
    Path::new(FIXTURES).join(name).display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_crd_and_custom_resources() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    crd_scenario(&server, &k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_32_pinned_binary_crd_and_kustomize() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::with_binary(&server, PathBuf::from(KUBECTL_1_32));
    let (_, out, _) = k.run(&["version", "--client"]).await;
    assert!(out.contains("v1.32"), "{out}");
    crd_scenario(&server, &k).await;
    kustomize_scenario(&server, &k).await;
}

async fn crd_scenario(server: &ApiServer, k: &Kubectl) {
    let client = server.client("checker").await.unwrap();

    let out = k.ok(&["apply", "-f", &fixture("crd-ipamnodes.yaml")]).await;
    assert!(
        out.contains(
            "customresourcedefinition.apiextensions.k8s.io/ipamnodes.ipam.tidepool.dev created"
        ),
        "{out}"
    );
    let out = k
        .ok(&[
            "wait",
            "--for=condition=Established",
            "crd/ipamnodes.ipam.tidepool.dev",
            "--timeout=20s",
        ])
        .await;
    assert!(out.contains("condition met"), "{out}");

    let out = k.ok(&["apply", "-f", &fixture("ipamnode-a.yaml")]).await;
    assert!(
        out.contains("ipamnode.ipam.tidepool.dev/node-a created"),
        "{out}"
    );
    let nodes: Api<DynamicObject> = Api::all_with(client.clone(), &ipamnode_resource());
    let a = nodes.get("node-a").await.expect("created through kubectl");
    assert_eq!(a.data["spec"]["nodeUID"], "uid-a");
    assert_eq!(
        a.data["spec"]["watermarks"]["mode"], "dynamic",
        "schema default applied"
    );
    assert!(
        a.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("kubectl.kubernetes.io/last-applied-configuration"),
        "client-side apply annotation kept"
    );

    // Validation as kubectl sees it: unknown fields (strict field validation) and schema errors.
    let err = k
        .fails(&["apply", "-f", &fixture("ipamnode-bad-unknown.yaml")])
        .await;
    assert!(err.contains("unknown field \"spec.bogusField\""), "{err}");
    let err = k
        .fails(&["apply", "-f", &fixture("ipamnode-bad-min.yaml")])
        .await;
    assert!(
        err.contains("spec.watermarks.preAllocate") && err.contains("greater than or equal to 0"),
        "{err}"
    );
    assert_eq!(code(&nodes.get("node-bad").await.unwrap_err()), 404);

    // get: default table (printer columns from the CRD), by short name, and JSON.
    let table = k.ok(&["get", "ipn"]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        vec!["NAME", "READY", "PREALLOCATE"],
        "{table}"
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        vec!["node-a", "8"],
        "{table}"
    );
    let one: Value =
        serde_json::from_str(&k.ok(&["get", "ipamnode", "node-a", "-o", "json"]).await).unwrap();
    assert_eq!(one["metadata"]["uid"].as_str(), a.metadata.uid.as_deref());
    let list: Value =
        serde_json::from_str(&k.ok(&["get", "ipamnodes", "-o", "json"]).await).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let labelled = k
        .ok(&["get", "ipamnodes", "-l", "tier=edge", "-o", "name"])
        .await;
    assert_eq!(labelled.trim(), "ipamnode.ipam.tidepool.dev/node-a");
    assert!(
        k.ok(&["get", "ipamnodes", "-l", "tier=core", "-o", "name"])
            .await
            .trim()
            .is_empty()
    );

    // patch --type merge and --type json.
    let out = k
        .ok(&[
            "patch",
            "ipamnode",
            "node-a",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"watermarks":{"preAllocate":4}}}"#,
        ])
        .await;
    assert!(out.contains("patched"), "{out}");
    let b = nodes.get("node-a").await.unwrap();
    assert_eq!(b.data["spec"]["watermarks"]["preAllocate"], 4);
    assert_eq!(b.metadata.generation, Some(2));
    k.ok(&[
        "patch",
        "ipamnode",
        "node-a",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/pools/ipv4","value":"other"}]"#,
    ])
    .await;
    assert_eq!(
        nodes.get("node-a").await.unwrap().data["spec"]["pools"]["ipv4"],
        "other"
    );
    let err = k
        .fails(&[
            "patch",
            "ipamnode",
            "node-a",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"watermarks":{"preAllocate":-3}}}"#,
        ])
        .await;
    assert!(err.contains("is invalid"), "{err}");
    let err = k
        .fails(&[
            "patch",
            "ipamnode",
            "node-a",
            "--type",
            "json",
            "-p",
            r#"[{"op":"test","path":"/spec/nodeUID","value":"nope"}]"#,
        ])
        .await;
    assert!(!err.is_empty());
    // Status subresource through kubectl.
    k.ok(&[
        "patch",
        "ipamnode",
        "node-a",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#,
    ])
    .await;
    let table = k.ok(&["get", "ipn", "node-a"]).await;
    assert!(
        table
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .eq(["node-a", "True", "4"]),
        "{table}"
    );

    // Re-applying the file restores what it says (three-way merge against last-applied).
    let out = k.ok(&["apply", "-f", &fixture("ipamnode-a.yaml")]).await;
    assert!(out.contains("configured"), "{out}");
    let c = nodes.get("node-a").await.unwrap();
    assert_eq!(
        (
            c.data["spec"]["watermarks"]["preAllocate"].clone(),
            c.data["spec"]["pools"]["ipv4"].clone()
        ),
        (serde_json::json!(8), serde_json::json!("default"))
    );
    let out = k.ok(&["apply", "-f", &fixture("ipamnode-a.yaml")]).await;
    assert!(out.contains("unchanged"), "{out}");

    // delete.
    let out = k.ok(&["delete", "ipamnode", "node-a"]).await;
    assert!(out.contains("deleted"), "{out}");
    assert_eq!(code(&nodes.get("node-a").await.unwrap_err()), 404);
    let (_, out, err) = k.run(&["get", "ipamnodes"]).await;
    assert!(
        out.is_empty() && err.contains("No resources found"),
        "{out} / {err}"
    );
    let out = k
        .ok(&["delete", "-f", &fixture("crd-ipamnodes.yaml")])
        .await;
    assert!(out.contains("deleted"), "{out}");
    // (kubectl's discovery cache may still list the type: either error is a "not found".)
    let err = k.fails(&["get", "ipamnodes"]).await;
    assert!(
        err.contains("the server doesn't have a resource type \"ipamnodes\"")
            || err.contains("the server could not find the requested resource"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_kustomize_builtin_kinds() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    kustomize_scenario(&server, &k).await;
}

async fn kustomize_scenario(server: &ApiServer, k: &Kubectl) {
    let client = server.client("checker").await.unwrap();
    let dir = fixture("kustomize");

    let out = k.ok(&["apply", "-k", &dir]).await;
    for what in [
        "namespace/tidepool-system created",
        "serviceaccount/tidepool-operator created",
        "role.rbac.authorization.k8s.io/tidepool-leases created",
        "clusterrole.rbac.authorization.k8s.io/tidepool-operator created",
        "rolebinding.rbac.authorization.k8s.io/tidepool-leases created",
        "clusterrolebinding.rbac.authorization.k8s.io/tidepool-operator created",
        "configmap/tidepool-config created",
        "service/tidepool-metrics created",
        "deployment.apps/tidepool-operator created",
        "poddisruptionbudget.policy/tidepool-operator created",
    ] {
        assert!(out.contains(what), "missing {what:?} in:\n{out}");
    }
    let ns = "tidepool-system";
    let label = |m: &kube::api::ObjectMeta| {
        m.labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/name").cloned())
    };
    let n = Api::<Namespace>::all(client.clone()).get(ns).await.unwrap();
    assert_eq!(label(&n.metadata).as_deref(), Some("tidepool"));
    let sa = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .get("tidepool-operator")
        .await
        .unwrap();
    assert_eq!(label(&sa.metadata).as_deref(), Some("tidepool"));
    let cr = Api::<ClusterRole>::all(client.clone())
        .get("tidepool-operator")
        .await
        .unwrap();
    assert_eq!(
        cr.rules.unwrap()[0].resources.as_ref().unwrap(),
        &vec!["ipamnodes".to_string(), "ipamnodes/status".to_string()]
    );
    let crb = Api::<ClusterRoleBinding>::all(client.clone())
        .get("tidepool-operator")
        .await
        .unwrap();
    assert_eq!(crb.subjects.unwrap()[0].namespace.as_deref(), Some(ns));
    Api::<Role>::namespaced(client.clone(), ns)
        .get("tidepool-leases")
        .await
        .unwrap();
    let rb = Api::<RoleBinding>::namespaced(client.clone(), ns)
        .get("tidepool-leases")
        .await
        .unwrap();
    assert_eq!(
        rb.subjects.unwrap()[0].namespace.as_deref(),
        Some(ns),
        "kustomize set the subject namespace"
    );
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get("tidepool-config")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["reuseCooldown"], "30s");
    let svc = Api::<Service>::namespaced(client.clone(), ns)
        .get("tidepool-metrics")
        .await
        .unwrap();
    assert_eq!(svc.spec.unwrap().ports.unwrap()[0].port, 9090);
    let pdb = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .get("tidepool-operator")
        .await
        .unwrap();
    assert_eq!(
        pdb.spec.unwrap().min_available,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    let deploy = Api::<Deployment>::namespaced(client.clone(), ns)
        .get("tidepool-operator")
        .await
        .unwrap();
    let spec = deploy.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(
        spec.template.spec.unwrap().containers[0].image.as_deref(),
        Some("tidepool/operator:dev")
    );
    assert_eq!(deploy.metadata.generation, Some(1));

    // Applying the same directory again changes nothing on the server.
    let rv_before = server.resource_version();
    let out = k.ok(&["apply", "-k", &dir]).await;
    assert!(
        out.contains("deployment.apps/tidepool-operator unchanged"),
        "{out}"
    );
    assert!(out.contains("configmap/tidepool-config unchanged"), "{out}");
    assert_eq!(
        server.resource_version(),
        rv_before,
        "no writes on a re-apply:\n{out}"
    );

    // get in the default table and as JSON.
    let table = k.ok(&["get", "deployments", "-n", ns]).await;
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("tidepool-operator")),
        "{table}"
    );
    let all: Value = serde_json::from_str(
        &k.ok(&[
            "get",
            "configmaps,services,serviceaccounts",
            "-n",
            ns,
            "-o",
            "json",
        ])
        .await,
    )
    .unwrap();
    let kinds: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, vec!["ConfigMap", "Service", "ServiceAccount"]);

    // A strategic-merge patch through kubectl on a built-in kind (containers merged by name).
    k.ok(&["patch", "deployment", "tidepool-operator", "-n", ns, "-p", r#"{"spec":{"template":{"spec":{"containers":[{"name":"operator","image":"tidepool/operator:v2"}]}}}}"#]).await;
    let deploy = Api::<Deployment>::namespaced(client.clone(), ns)
        .get("tidepool-operator")
        .await
        .unwrap();
    let c = &deploy.spec.unwrap().template.spec.unwrap().containers[0];
    assert_eq!(
        (c.image.as_deref(), c.args.clone()),
        (Some("tidepool/operator:v2"), Some(vec!["run".to_string()]))
    );
    assert_eq!(deploy.metadata.generation, Some(2));

    // delete -k removes everything, the namespace last.
    let out = k.ok(&["delete", "-k", &dir]).await;
    assert!(
        out.contains("namespace \"tidepool-system\" deleted"),
        "{out}"
    );
    assert_eq!(
        code(
            &Api::<ConfigMap>::namespaced(client.clone(), ns)
                .get("tidepool-config")
                .await
                .unwrap_err()
        ),
        404
    );
    assert_eq!(
        code(
            &Api::<ClusterRole>::all(client.clone())
                .get("tidepool-operator")
                .await
                .unwrap_err()
        ),
        404
    );
    assert_eq!(
        code(&Api::<Namespace>::all(client).get(ns).await.unwrap_err()),
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_against_the_standalone_binary() {
    use std::io::BufRead;
    let bin = kubectl_binary();
    let dir = std::env::temp_dir().join(format!("tidepool-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kc = dir.join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidepool-apiserver"))
        .args(["--port", "0", "--kubeconfig"])
        .arg(&kc)
        .args(["--identity", "admin", "--identity", "replica-b"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start tidepool-apiserver");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("serving http://127.0.0.1:"), "{line}");
    let run = |kubeconfig: PathBuf, args: Vec<&'static str>| {
        let bin = bin.clone();
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(bin)
                .args(args)
                .arg("--cache-dir")
                .arg(dir.join("cache"))
                .env("KUBECONFIG", kubeconfig)
                .env("HOME", &dir)
                .output()
                .unwrap()
        })
    };
    let out = run(kc.clone(), vec!["get", "namespaces", "-o", "name"])
        .await
        .unwrap();
    // tidepool's CRDs, then its examples (issue 10's acceptance names the standalone server)
    let crds = run(
        kc.clone(),
        vec![
            "apply",
            "-f",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds/"),
        ],
    )
    .await
    .unwrap();
    let wait = run(
        kc.clone(),
        vec![
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=20s",
        ],
    )
    .await
    .unwrap();
    let examples = run(
        kc.clone(),
        vec![
            "apply",
            "-f",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples/"),
        ],
    )
    .await
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let names = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut other = kc.clone().into_os_string();
    other.push(".replica-b");
    let second_exists = std::path::Path::new(&other).is_file();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        names.lines().collect::<Vec<_>>(),
        vec![
            "namespace/default",
            "namespace/kube-node-lease",
            "namespace/kube-public",
            "namespace/kube-system"
        ]
    );
    assert!(second_exists, "a kubeconfig per extra identity");
    for (what, out) in [("crds", &crds), ("wait", &wait), ("examples", &examples)] {
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let applied = String::from_utf8_lossy(&examples.stdout);
    assert!(
        applied.contains("ippool.ipam.tidepool.dev/default created"),
        "{applied}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_side_apply_and_conflicts() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client("checker").await.unwrap();
    let k = Kubectl::new(&server);
    let out = k
        .ok(&[
            "apply",
            "--server-side",
            "-f",
            &fixture("crd-ipamnodes.yaml"),
        ])
        .await;
    assert!(out.contains("serverside-applied"), "{out}");
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/ipamnodes.ipam.tidepool.dev",
        "--timeout=20s",
    ])
    .await;
    k.ok(&["apply", "--server-side", "-f", &fixture("ipamnode-a.yaml")])
        .await;
    let nodes: Api<DynamicObject> = Api::all_with(client.clone(), &ipamnode_resource());
    let a = nodes.get("node-a").await.unwrap();
    let mf = a.metadata.managed_fields.clone().unwrap();
    assert_eq!(
        (
            mf.len(),
            mf[0].manager.as_deref(),
            mf[0].operation.as_deref()
        ),
        (1, Some("kubectl"), Some("Apply"))
    );
    let owned = &mf[0].fields_v1.as_ref().unwrap().0;
    assert!(
        owned
            .pointer("/f:spec/f:watermarks/f:preAllocate")
            .is_some()
    );
    assert!(
        owned.pointer("/f:spec/f:watermarks/f:mode").is_none(),
        "defaulted fields are not the applier's: {owned}"
    );

    // Another manager takes a field; kubectl's apply then conflicts until --force-conflicts.
    k.ok(&[
        "patch",
        "ipamnode",
        "node-a",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"watermarks":{"preAllocate":4}}}"#,
    ])
    .await;
    let err = k
        .fails(&["apply", "--server-side", "-f", &fixture("ipamnode-a.yaml")])
        .await;
    assert!(
        err.contains("Apply failed with 1 conflict: conflict with \"kubectl-patch\"")
            && err.contains(".spec.watermarks.preAllocate"),
        "{err}"
    );
    k.ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &fixture("ipamnode-a.yaml"),
    ])
    .await;
    assert_eq!(
        nodes.get("node-a").await.unwrap().data["spec"]["watermarks"]["preAllocate"],
        8
    );

    // Built-in kinds through server-side apply, twice (idempotent: no writes the second time).
    let dir = fixture("kustomize");
    k.ok(&["apply", "--server-side", "-k", &dir]).await;
    let rv = server.resource_version();
    let out = k.ok(&["apply", "--server-side", "-k", &dir]).await;
    assert_eq!(out.matches("serverside-applied").count(), 10, "{out}");
    assert_eq!(
        server.resource_version(),
        rv,
        "re-applying the same configuration writes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_prints_table_rows() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client("checker").await.unwrap();
    let k = Kubectl::new(&server);
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(
        &Default::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": "before"}})).unwrap(),
    )
    .await
    .unwrap();
    let watching = {
        let (bin, dir) = (k.bin.clone(), k.dir.clone());
        tokio::task::spawn_blocking(move || {
            Command::new(bin)
                .args([
                    "get",
                    "configmaps",
                    "-w",
                    "--request-timeout=3s",
                    "--cache-dir",
                ])
                .arg(dir.join("cache"))
                .env("KUBECONFIG", dir.join("kubeconfig"))
                .env("HOME", &dir)
                .output()
                .unwrap()
        })
    };
    eventually(
        std::time::Duration::from_secs(10),
        "kubectl's watch open",
        || async { (server.request_count("watch", "configmaps") >= 1).then_some(()) },
    )
    .await;
    cms.create(
        &Default::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": "during"}})).unwrap(),
    )
    .await
    .unwrap();
    let out = watching.await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        rows,
        vec!["NAME", "before", "during"],
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");

/// tidepool's own CRDs and examples through kubectl (issue 10): `apply -f deploy/crds/`
/// then `apply -f deploy/examples/` works, the printer columns show, a field selector on
/// `spec.node` (the CRD's selectableFields) picks one node's blocks, and each malformed
/// resource is refused by the schema with the field named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_tidepool_crds_and_examples() {
    let (server, _) = start().await;
    let k = Kubectl::new(&server);
    let out = k.install_crds().await;
    for crd in ["ippools", "ipamblocks", "ipamnodes"] {
        assert!(
            out.contains(&format!(
                "customresourcedefinition.apiextensions.k8s.io/{crd}.ipam.tidepool.dev created"
            )),
            "{out}"
        );
    }
    let out = k.ok(&["apply", "-f", &format!("{DEPLOY}/examples/")]).await;
    for made in [
        "ippool.ipam.tidepool.dev/default created",
        "ippool.ipam.tidepool.dev/gpu created",
    ] {
        assert!(out.contains(made), "{out}");
    }
    // the per-node overrides: docs/operations.md's `kubectl patch` of an IPAMNode (which the operator
    // creates; here by hand) sets pools and watermarks and leaves nodeUID alone
    let node = k.dir.join("worker-1.yaml");
    std::fs::write(
        &node,
        "apiVersion: ipam.tidepool.dev/v1alpha1\nkind: IPAMNode\nmetadata:\n  name: worker-1\nspec:\n  nodeUID: uid-worker-1\n",
    )
    .unwrap();
    k.ok(&["create", "-f", node.to_str().unwrap()]).await;
    let patch = format!("{DEPLOY}/examples/patches/ipamnode-overrides.yaml");
    let patch_args = [
        "patch",
        "ipamnode",
        "worker-1",
        "--type",
        "merge",
        "--patch-file",
    ];
    let out = k.ok(&[&patch_args[..], &[patch.as_str()]].concat()).await;
    assert!(
        out.contains("ipamnode.ipam.tidepool.dev/worker-1 patched"),
        "{out}"
    );
    let spec = k
        .ok(&["get", "ipamnode", "worker-1", "-o", "jsonpath={.spec}"])
        .await;
    let spec: Value = serde_json::from_str(&spec).unwrap();
    assert_eq!(spec["nodeUID"], "uid-worker-1", "{spec}");
    assert!(
        spec["pools"].is_object() && spec["watermarks"].is_object(),
        "{spec}"
    );
    // a pool chosen per namespace and pod: label selectors, stored as written
    let tenant = k.dir.join("tenant.yaml");
    std::fs::write(
        &tenant,
        "apiVersion: ipam.tidepool.dev/v1alpha1\nkind: IPPool\nmetadata:\n  name: tenant-a\nspec:\n  cidrs: [10.81.0.0/16]\n  namespaceSelector:\n    matchLabels: {team: a}\n  podSelector:\n    matchExpressions:\n    - {key: app, operator: In, values: [web]}\n  watermarks: {preAllocate: 4}\n",
    )
    .unwrap();
    k.ok(&["apply", "-f", tenant.to_str().unwrap()]).await;
    let selectors = k
        .ok(&["get", "ippool", "tenant-a", "-o", "jsonpath={.spec}"])
        .await;
    let selectors: Value = serde_json::from_str(&selectors).unwrap();
    assert_eq!(
        selectors["namespaceSelector"]["matchLabels"]["team"], "a",
        "{selectors}"
    );
    assert_eq!(
        selectors["podSelector"]["matchExpressions"][0]["values"][0], "web",
        "{selectors}"
    );
    assert_eq!(selectors["watermarks"]["preAllocate"], 4, "{selectors}");
    k.ok(&["delete", "ippool", "tenant-a"]).await;
    // the schema's default filled the gpu pool's IPv6 block size
    let gpu = k
        .ok(&["get", "ippool", "gpu", "-o", "jsonpath={.spec.blockSize}"])
        .await;
    assert_eq!(
        serde_json::from_str::<Value>(&gpu).unwrap(),
        serde_json::json!({"ipv4": 27, "ipv6": 124})
    );
    // the printer columns, by the short name that collides with neither Calico's nor
    // whereabouts' `ippools`; capacity and allocated in the wide output
    let header = |table: &str| -> Vec<String> {
        let first = table.lines().next().unwrap_or_default();
        first.split_whitespace().map(String::from).collect()
    };
    let table = k.ok(&["get", "tpool"]).await;
    assert_eq!(
        header(&table),
        ["NAME", "VALID", "CIDRS", "V4-FREE", "V6-FREE", "AGE"],
        "{table}"
    );
    assert!(table.contains("[\"10.80.0.0/16\"]"), "{table}");
    let wide = k.ok(&["get", "tpool", "-o", "wide"]).await;
    assert_eq!(
        header(&wide)[6..],
        ["V4-CAPACITY", "V4-ALLOCATED", "V6-CAPACITY", "V6-ALLOCATED"],
        "{wide}"
    );
    let table = k.ok(&["get", "tpnode"]).await;
    assert_eq!(
        header(&table),
        [
            "NAME",
            "V4-ALLOCATED",
            "V4-USED",
            "V6-ALLOCATED",
            "V6-USED",
            "AGENT",
            "BLOCKED",
            "POOL",
            "AGE"
        ],
        "{table}"
    );

    // blocks of two nodes; a field selector on spec.node finds one node's
    for (name, cidr, node) in [
        ("v4-10-64-1-0-28", "10.64.1.0/28", "worker-1"),
        ("v4-10-64-1-16-28", "10.64.1.16/28", "worker-2"),
    ] {
        let path = k.dir.join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: ipam.tidepool.dev/v1alpha1\nkind: IPAMBlock\nmetadata:\n  name: {name}\nspec:\n  pool: default\n  cidr: {cidr}\n  node: {node}\n  nodeUID: uid-{node}\n"
            ),
        )
        .unwrap();
        k.ok(&["apply", "-f", &path.display().to_string()]).await;
    }
    // the `tidepool` category: every kind of ours at once
    let all = k.ok(&["get", "tidepool", "-o", "name"]).await;
    for name in [
        "ippool.ipam.tidepool.dev/default",
        "ipamnode.ipam.tidepool.dev/worker-1",
        "ipamblock.ipam.tidepool.dev/v4-10-64-1-0-28",
    ] {
        assert!(all.lines().any(|l| l == name), "{name} in {all}");
    }
    let picked = k
        .ok(&[
            "get",
            "ipamblocks",
            "--field-selector",
            "spec.node=worker-2",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(
        picked.trim(),
        "ipamblock.ipam.tidepool.dev/v4-10-64-1-16-28"
    );

    // malformed resources: refused, the field named
    for (file, field, says) in [
        (
            "ippool-bad-cidr.yaml",
            "spec.cidrs[1]",
            "must be of type cidr",
        ),
        (
            "ippool-bad-block-size.yaml",
            "spec.blockSize.ipv4",
            "less than or equal to 32",
        ),
        (
            "ipamnode-negative-watermark.yaml",
            "spec.watermarks.preAllocate",
            "greater than or equal to 0",
        ),
        (
            "ipamblock-bad-mark.yaml",
            "spec.release",
            "Unsupported value: \"please\"",
        ),
    ] {
        let err = k
            .fails(&["apply", "-f", &fixture(&format!("bad-crs/{file}"))])
            .await;
        assert!(err.contains(field) && err.contains(says), "{file}: {err}");
    }
    let names = k
        .ok(&["get", "ippools,ipamnodes,ipamblocks", "-o", "name"])
        .await;
    assert_eq!(
        names.lines().count(),
        5,
        "nothing malformed was stored: {names}"
    );
}

/// The CRDs' CEL rules (Kubernetes' CIDR library, in the CEL environment since 1.30): an
/// IPPool, IPAMBlock or IPAMNode the operator could not use is refused at `kubectl apply` with
/// 422 and the rule's message, the field named; nothing of it is stored, and objects on the
/// edge of each rule are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_refuses_what_the_crd_rules_forbid() {
    let (server, _) = start().await;
    let k = Kubectl::new(&server);
    k.install_crds().await;
    let host_bits = tidepool_api::rule_messages::CIDR_HOST_BITS;
    for (file, field, says) in [
        ("ippool-host-bits.yaml", "spec.cidrs[0]", host_bits),
        (
            "ippool-exclude-host-bits.yaml",
            "spec.exclude[0]",
            host_bits,
        ),
        ("ipamblock-host-bits.yaml", "spec.cidr", host_bits),
        (
            "ippool-block-shorter-than-cidr.yaml",
            "spec",
            tidepool_api::rule_messages::BLOCK_NOT_SHORTER,
        ),
        (
            "ippool-too-many-blocks.yaml",
            "spec",
            tidepool_api::rule_messages::AT_MOST_2_64_BLOCKS,
        ),
        (
            "ipamnode-min-above-max.yaml",
            "spec.watermarks",
            tidepool_api::rule_messages::MIN_ABOVE_MAX,
        ),
    ] {
        let err = k
            .fails(&["apply", "-v=6", "-f", &fixture(&format!("bad-crs/{file}"))])
            .await;
        assert!(
            err.contains("422 Unprocessable Entity"),
            "{file}: not a 422: {err}"
        );
        let cause = format!("{field}: Invalid value: ");
        assert!(err.contains(&cause) && err.contains(says), "{file}: {err}");
    }
    let names = k
        .ok(&["get", "ippools,ipamnodes,ipamblocks", "-o", "name"])
        .await;
    assert_eq!(names.trim(), "", "nothing refused was stored: {names}");
    // the edges: a /16 in /16 blocks, a /48 in /112 blocks (2^64), no cap with a minimum
    let edges = k.dir.join("edges.yaml");
    std::fs::write(
        &edges,
        "apiVersion: ipam.tidepool.dev/v1alpha1\nkind: IPPool\nmetadata:\n  name: edges\nspec:\n  cidrs: [10.4.0.0/16, \"fd00:1::/48\"]\n  blockSize: {ipv4: 16, ipv6: 112}\n---\napiVersion: ipam.tidepool.dev/v1alpha1\nkind: IPAMNode\nmetadata:\n  name: no-cap\nspec:\n  nodeUID: 00000000-0000-0000-0000-000000000003\n  watermarks: {minAllocate: 32, maxAllocate: 0}\n",
    )
    .unwrap();
    let out = k.ok(&["apply", "-f", edges.to_str().unwrap()]).await;
    assert!(
        out.contains("ippool.ipam.tidepool.dev/edges created"),
        "{out}"
    );
    assert!(
        out.contains("ipamnode.ipam.tidepool.dev/no-cap created"),
        "{out}"
    );
}

/// kubectl's imperative `create` commands send built-in kinds as protobuf (issue 12).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_namespace_and_configmap_imperatively() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    let out = k.ok(&["create", "namespace", "imperative"]).await;
    assert!(out.contains("namespace/imperative created"), "{out}");
    let out = k
        .ok(&[
            "create",
            "configmap",
            "x",
            "--from-literal=a=b",
            "-n",
            "imperative",
        ])
        .await;
    assert!(out.contains("configmap/x created"), "{out}");
    let out = k
        .ok(&[
            "get",
            "configmap",
            "x",
            "-n",
            "imperative",
            "-o",
            "jsonpath={.data.a}",
        ])
        .await;
    assert_eq!(out, "b");
    let client = server.client("checker").await.unwrap();
    let cm = Api::<ConfigMap>::namespaced(client, "imperative")
        .get("x")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["a"], "b");
    let out = k
        .ok(&[
            "create",
            "secret",
            "generic",
            "s",
            "--from-literal=k=v",
            "-n",
            "imperative",
        ])
        .await;
    assert!(out.contains("secret/s created"), "{out}");
    let out = k
        .ok(&[
            "get",
            "secret",
            "s",
            "-n",
            "imperative",
            "-o",
            "jsonpath={.data.k}",
        ])
        .await;
    assert_eq!(out, "dg==", "base64 of v");
    let out = k
        .ok(&["create", "serviceaccount", "robot", "-n", "imperative"])
        .await;
    assert!(out.contains("serviceaccount/robot created"), "{out}");
    let err = k.fails(&["create", "namespace", "imperative"]).await;
    assert!(
        err.contains("namespaces \"imperative\" already exists"),
        "{err}"
    );
}

/// `kubectl create deployment` sends an apps/v1 Deployment as protobuf: the stored object,
/// read back as JSON, has exactly the spec kubectl built (replicas, `--port`, `-- cmd args`).
/// Both the dispatcher's kubectl (1.33 for this server) and the pinned 1.32.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_deployment_imperatively() {
    for bin in [kubectl_binary(), PathBuf::from(KUBECTL_1_32)] {
        let server = ApiServer::start().await.unwrap();
        create_deployment_scenario(&Kubectl::with_binary(&server, bin)).await;
    }
}

async fn create_deployment_scenario(k: &Kubectl) {
    let spec_of = async |name: &str| -> Value {
        let out = k.ok(&["get", "deployment", name, "-o", "json"]).await;
        let d: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(d["metadata"]["labels"], serde_json::json!({"app": name}));
        d["spec"].clone()
    };
    let template = |name: &str, container: Value| {
        serde_json::json!({"metadata": {"labels": {"app": name}},
            "spec": {"containers": [container]}})
    };

    let out = k
        .ok(&[
            "create",
            "deployment",
            "web",
            "--image=pause",
            "--replicas=3",
            "--port=80",
            "--",
            "sleep",
            "3600",
        ])
        .await;
    assert!(out.contains("deployment.apps/web created"), "{out}");
    assert_eq!(
        spec_of("web").await,
        serde_json::json!({"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": template("web", serde_json::json!({"name": "pause", "image": "pause",
                "command": ["sleep", "3600"], "ports": [{"containerPort": 80}],
                "resources": {}})),
            "strategy": {}})
    );

    k.ok(&[
        "create",
        "deployment",
        "idle",
        "--image=registry.k8s.io/pause:3.10",
        "--replicas=0",
    ])
    .await;
    assert_eq!(
        spec_of("idle").await,
        serde_json::json!({"replicas": 0, "selector": {"matchLabels": {"app": "idle"}},
            "template": template("idle", serde_json::json!({"name": "pause",
                "image": "registry.k8s.io/pause:3.10", "resources": {}})),
            "strategy": {}})
    );

    let err = k
        .fails(&["create", "deployment", "web", "--image=pause"])
        .await;
    assert!(
        err.contains("deployments.apps \"web\" already exists"),
        "{err}"
    );
    // a kind the decoder has no table for is refused, not stored half-read
    let err = k
        .fails(&["create", "service", "clusterip", "s", "--tcp=80:80"])
        .await;
    assert!(
        err.contains("not v1 Service: send application/json"),
        "{err}"
    );
}

/// Refusals as kubectl prints them: namespace names, immortal namespaces, selectors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_prints_the_real_servers_refusals() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    let long = "n".repeat(64);
    let err = k.fails(&["create", "namespace", &long]).await;
    assert!(
        err.contains(&format!(
            "Namespace \"{long}\" is invalid: metadata.name: Invalid value: \"{long}\": must be no more than 63 characters"
        )),
        "{err}"
    );
    let err = k.fails(&["delete", "namespace", "kube-system"]).await;
    assert!(
        err.contains(
            "Error from server (Forbidden): namespaces \"kube-system\" is forbidden: this namespace may not be deleted"
        ),
        "{err}"
    );
    let err = k.fails(&["get", "configmaps", "-l", "!!!"]).await;
    assert!(
        err.contains("unable to parse requirement: found '!', expected: identifier"),
        "{err}"
    );
}

/// RBAC as kubectl sees it (over TLS: kubectl sends no token to a plain-HTTP server):
/// `auth can-i` for single checks and `--list`, and refusals printed in the real words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_auth_can_i_and_rbac_refusals() {
    let server = ApiServer::start_with(tidepool_tests::Config {
        rbac: true,
        tls: true,
        ..fast_config()
    })
    .await
    .unwrap();
    assert!(server.url().starts_with("https://"), "{}", server.url());
    let admin = Kubectl::with_identity(&server, kubectl_binary(), tidepool_tests::ADMIN);
    admin
        .ok(&["apply", "-f", &fixture("rbac-agent.yaml")])
        .await;
    let sa = "system:serviceaccount:tidepool:agent@node-a";
    let agent = Kubectl::with_identity(&server, kubectl_binary(), sa);
    let can = |args: &'static [&'static str]| {
        let agent = &agent;
        async move {
            let (_, out, err) = agent.run(&[&["auth", "can-i"], args].concat()).await;
            assert!(
                err.is_empty() || err.contains("not namespace scoped"),
                "{err}"
            );
            out.trim().to_string()
        }
    };
    assert_eq!(can(&["list", "nodes"]).await, "yes");
    assert_eq!(can(&["delete", "nodes"]).await, "no", "a verb not granted");
    assert_eq!(
        can(&["patch", "pods", "--subresource=status", "-n", "tidepool"]).await,
        "yes"
    );
    assert_eq!(
        can(&["patch", "pods", "-n", "tidepool"]).await,
        "no",
        "only the subresource"
    );
    assert_eq!(
        can(&["get", "configmaps/agent-config", "-n", "tidepool"]).await,
        "yes"
    );
    assert_eq!(
        can(&["get", "configmaps/other", "-n", "tidepool"]).await,
        "no",
        "resourceNames"
    );
    assert_eq!(
        can(&["get", "configmaps/agent-config", "-n", "default"]).await,
        "no",
        "another namespace"
    );

    let list = agent
        .ok(&["auth", "can-i", "--list", "-n", "tidepool"])
        .await;
    let rows: Vec<Vec<&str>> = list
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        rows.contains(&vec!["nodes", "[]", "[]", "[get", "list", "watch]"]),
        "{list}"
    );
    assert!(
        rows.contains(&vec!["configmaps", "[]", "[agent-config]", "[get]"]),
        "{list}"
    );
    assert!(
        rows.contains(&vec!["pods/status", "[]", "[]", "[patch]"]),
        "{list}"
    );
    let elsewhere = agent
        .ok(&["auth", "can-i", "--list", "-n", "default"])
        .await;
    assert!(!elsewhere.contains("agent-config"), "{elsewhere}");

    let err = agent.fails(&["get", "pods", "-n", "kube-system"]).await;
    assert!(
        err.contains(
            "Error from server (Forbidden): pods is forbidden: User \
             \"system:serviceaccount:tidepool:agent\" cannot list resource \"pods\" in API group \
             \"\" in the namespace \"kube-system\""
        ),
        "{err}"
    );
    assert_eq!(
        admin.ok(&["auth", "can-i", "delete", "nodes"]).await.trim(),
        "yes"
    );
}

/// The standalone binary as a child process: killed and its directory removed on drop, so a
/// failing assertion does not leave it running.
struct Standalone {
    child: std::process::Child,
    dir: PathBuf,
    kubeconfig: PathBuf,
    url: String,
}

impl Standalone {
    /// Starts `tidepool-apiserver --port 0` with `flags` and one kubeconfig per identity (the
    /// first at `kubeconfig`, the others at `kubeconfig.<identity>`).
    fn start(name: &str, flags: &[&str], identities: &[&str]) -> Self {
        use std::io::BufRead;
        let dir = std::env::temp_dir().join(format!("tidepool-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tidepool-apiserver"));
        cmd.args(["--port", "0", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(flags);
        for id in identities {
            cmd.args(["--identity", id]);
        }
        let child = cmd
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start tidepool-apiserver");
        let mut s = Standalone {
            child,
            dir,
            kubeconfig,
            url: String::new(),
        };
        let mut line = String::new();
        std::io::BufReader::new(s.child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        s.url = line
            .strip_prefix("serving ")
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected first line: {line}"))
            .to_string();
        s
    }

    fn kubeconfig_of(&self, identity: &str) -> PathBuf {
        let mut p = self.kubeconfig.clone().into_os_string();
        p.push(format!(".{identity}"));
        PathBuf::from(p)
    }

    async fn run(&self, kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
        let mut cmd = Command::new(kubectl_binary());
        cmd.args(args)
            .arg("--cache-dir")
            .arg(self.dir.join(format!(
                "cache-{}",
                kubeconfig.file_name().unwrap().to_string_lossy()
            )))
            // not $KUBECONFIG: a path list, and service-account identities contain ':'
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env_remove("KUBECONFIG")
            .env("HOME", &self.dir)
            .env_remove("KUBERNETES_SERVICE_HOST");
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .expect("join")
            .expect("run kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(&self, kubeconfig: &Path, args: &[&str]) -> String {
        let (ok, out, err) = self.run(kubeconfig, args).await;
        assert!(ok, "kubectl {args:?} failed:\nstdout: {out}\nstderr: {err}");
        out
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Rows of a kubectl table as whitespace-separated cells.
fn rows(table: &str) -> Vec<Vec<&str>> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// Issue 12's deploy bundle (`fixtures/bundle`: Namespace, ServiceAccount, ClusterRole and
/// binding, a DaemonSet at `system-node-critical`, a NetworkPolicy, a PriorityClass, a
/// ValidatingAdmissionPolicy and its binding) applied with `kubectl apply -k` to the standalone
/// binary with `--rbac` (so over TLS), then read back with `kubectl get ds,netpol,pc -A` and
/// `kubectl auth can-i --list` as the admin and as the bundle's service account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_a_bundle_to_the_rbac_standalone_binary() {
    const AGENT: &str = "system:serviceaccount:tidepool-bundle:agent";
    let server = Standalone::start("bundle", &["--rbac"], &[tidepool_tests::ADMIN, AGENT]);
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );
    let admin = server.kubeconfig.clone();
    let agent = server.kubeconfig_of(AGENT);

    let applied = server
        .ok(&admin, &["apply", "-k", &fixture("bundle")])
        .await;
    for created in [
        "namespace/tidepool-bundle created",
        "serviceaccount/agent created",
        "clusterrole.rbac.authorization.k8s.io/tidepool-bundle-agent created",
        "clusterrolebinding.rbac.authorization.k8s.io/tidepool-bundle-agent created",
        "priorityclass.scheduling.k8s.io/tidepool-agent-high created",
        "daemonset.apps/tidepool-agent created",
        "networkpolicy.networking.k8s.io/agent-metrics created",
        "validatingadmissionpolicy.admissionregistration.k8s.io/tidepool-config-names created",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/tidepool-config-names created",
    ] {
        assert!(applied.contains(created), "{created}:\n{applied}");
    }

    // The real printers' columns; no controller runs, so the DaemonSet's counts stay 0.
    let table = server.ok(&admin, &["get", "ds,netpol,pc", "-A"]).await;
    let r = rows(&table);
    let has = |row: &[&str]| r.iter().any(|l| l.starts_with(row));
    for row in [
        &[
            "NAMESPACE",
            "NAME",
            "DESIRED",
            "CURRENT",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "NODE",
            "SELECTOR",
            "AGE",
        ][..],
        &[
            "tidepool-bundle",
            "daemonset.apps/tidepool-agent",
            "0",
            "0",
            "0",
            "0",
            "0",
            "kubernetes.io/os=linux",
        ],
        &["NAMESPACE", "NAME", "POD-SELECTOR", "AGE"],
        &[
            "tidepool-bundle",
            "networkpolicy.networking.k8s.io/agent-metrics",
            "app=tidepool-agent",
        ],
        &[
            "NAMESPACE",
            "NAME",
            "VALUE",
            "GLOBAL-DEFAULT",
            "AGE",
            "PREEMPTIONPOLICY",
        ],
        // cluster-scoped: the NAMESPACE cell is blank
        &[
            "priorityclass.scheduling.k8s.io/system-cluster-critical",
            "2000000000",
            "false",
        ],
        &[
            "priorityclass.scheduling.k8s.io/system-node-critical",
            "2000001000",
            "false",
        ],
        &[
            "priorityclass.scheduling.k8s.io/tidepool-agent-high",
            "1000000",
            "false",
        ],
    ] {
        assert!(has(row), "{row:?} in\n{table}");
    }
    let policy = |name: &str| {
        r.iter()
            .find(|l| l.first() == Some(&name))
            .and_then(|l| l.last().copied())
            .map(String::from)
    };
    assert_eq!(
        policy("priorityclass.scheduling.k8s.io/tidepool-agent-high").as_deref(),
        Some("Never"),
        "{table}"
    );
    assert_eq!(
        policy("priorityclass.scheduling.k8s.io/system-node-critical").as_deref(),
        Some("PreemptLowerPriority"),
        "{table}"
    );

    // the admin (system:masters) may do everything
    let list = server.ok(&admin, &["auth", "can-i", "--list"]).await;
    assert!(
        rows(&list).contains(&vec!["*.*", "[]", "[]", "[*]"]),
        "{list}"
    );
    // the service account has what the bundle's ClusterRoleBinding grants
    let list = server
        .ok(
            &agent,
            &["auth", "can-i", "--list", "-n", "tidepool-bundle"],
        )
        .await;
    let r = rows(&list);
    for row in [
        vec!["nodes", "[]", "[]", "[get", "list", "watch]"],
        vec!["daemonsets.apps", "[]", "[]", "[get", "list", "watch]"],
        vec![
            "priorityclasses.scheduling.k8s.io",
            "[]",
            "[tidepool-agent-high]",
            "[get]",
        ],
    ] {
        assert!(r.contains(&row), "{row:?} in\n{list}");
    }
    assert!(!r.iter().any(|l| l.first() == Some(&"*.*")), "{list}");

    // ... and RBAC holds it to that: its DaemonSet list (wide: the printers' priority-1
    // columns), its PriorityClass, and no other
    let wide = server.ok(&agent, &["get", "ds", "-A", "-o", "wide"]).await;
    assert!(
        rows(&wide).iter().any(|l| l.ends_with(&[
            "agent",
            "ghcr.io/tidepool/agent:0.1.0",
            "app=tidepool-agent"
        ])),
        "{wide}"
    );
    server
        .ok(&agent, &["get", "pc", "tidepool-agent-high"])
        .await;
    let (ok, _, err) = server
        .run(&agent, &["get", "pc", "system-node-critical"])
        .await;
    assert!(!ok);
    assert!(
        err.contains(
            "Error from server (Forbidden): priorityclasses.scheduling.k8s.io \
             \"system-node-critical\" is forbidden: User \"system:serviceaccount:tidepool-bundle:agent\" \
             cannot get resource \"priorityclasses\" in API group \"scheduling.k8s.io\" at the cluster scope"
        ),
        "{err}"
    );

    // the bundle's admission policy holds, even for the admin
    let (ok, _, err) = server
        .run(
            &admin,
            &["create", "configmap", "x", "-n", "tidepool-bundle"],
        )
        .await;
    assert!(!ok);
    assert!(
        err.contains(
            "error: failed to create configmap: configmaps \"x\" is forbidden: \
             ValidatingAdmissionPolicy 'tidepool-config-names' with binding \
             'tidepool-config-names' denied request: config map names in the bundle's namespace \
             start with tidepool-"
        ),
        "{err}"
    );
    server
        .ok(
            &admin,
            &["create", "configmap", "tidepool-x", "-n", "tidepool-bundle"],
        )
        .await;
}

/// `kubectl scale` through `deployments/NAME/scale`: a merge PATCH without preconditions;
/// with `--current-replicas` a GET of the Scale (a mismatch refused by kubectl) and a PUT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scales_a_deployment() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    let file = std::env::temp_dir().join(format!("tidepool-scale-{}.json", std::process::id()));
    let deploy = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "pause"}]}}}});
    std::fs::write(&file, deploy.to_string()).unwrap();
    k.ok(&["apply", "-f", &file.display().to_string()]).await;
    let _ = std::fs::remove_file(&file);
    let replicas = async || {
        k.ok(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.replicas}",
        ])
        .await
    };

    let out = k.ok(&["scale", "deployment", "web", "--replicas=4"]).await;
    assert!(out.contains("deployment.apps/web scaled"), "{out}");
    assert_eq!(replicas().await, "4");
    let err = k
        .fails(&[
            "scale",
            "deployment",
            "web",
            "--current-replicas=2",
            "--replicas=1",
        ])
        .await;
    assert!(err.contains("Expected replicas to be 2, was 4"), "{err}");
    assert_eq!(replicas().await, "4");
    k.ok(&[
        "scale",
        "deployment",
        "web",
        "--current-replicas=4",
        "--replicas=1",
    ])
    .await;
    assert_eq!(replicas().await, "1");
}

/// `kubectl get events` shows what the operator's event recorder wrote (issue 25): the
/// operator writes events.k8s.io/v1 Events and kubectl reads core v1 Events, which the real
/// server keeps in one store (kubernetes/kubernetes pkg/registry/events/rest/storage_events.go
/// serves the core Event storage; pkg/apis/events/v1/conversion.go converts note to message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_events_lists_the_operators_events() {
    use std::num::NonZeroU32;
    use std::time::Duration;

    let (server, client) = start().await;
    let k = Kubectl::new(&server);
    let rate = NonZeroU32::new(10).unwrap();
    let events = tidepool_operator::store::Events::new(client, rate, rate);
    events.emit(
        "IPAMNode",
        "node-a",
        tidepool_ipam::EventType::Warning,
        tidepool_ipam::EventReason::AgentNotReady,
        "its agent has never reported".into(),
    );
    // IPAMNodes are cluster-scoped: the event is in `default`
    let name = eventually(Duration::from_secs(20), "an event in default", || async {
        let out = k
            .ok(&["get", "events", "-n", "default", "-o", "name"])
            .await;
        out.lines().next().map(str::to_string)
    })
    .await;
    assert!(name.starts_with("event/node-a."), "{name}");
    let out = k.ok(&["get", "events", "-n", "default"]).await;
    assert!(out.contains(name.trim_start_matches("event/")), "{out}");
    let fields = k
        .ok(&[
            "get",
            "events",
            "-n",
            "default",
            "-o",
            "jsonpath={.items[0].apiVersion} {.items[0].reason} {.items[0].involvedObject.kind}/{.items[0].involvedObject.name}: {.items[0].message}",
        ])
        .await;
    assert_eq!(
        fields,
        "v1 AgentNotReady IPAMNode/node-a: its agent has never reported"
    );
    server.shutdown();
}

/// The shipped bundle applies to the server as documented (`kubectl apply -k deploy/crds`,
/// then `kubectl apply -k deploy/`), its ResourceQuota and FlowSchema among the objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_the_shipped_bundle() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    k.ok(&["apply", "-k", &deploy.join("crds").display().to_string()])
        .await;
    for crd in ["ippools", "ipamnodes", "ipamblocks"] {
        k.ok(&[
            "wait",
            "--for=condition=Established",
            &format!("crd/{crd}.ipam.tidepool.dev"),
            "--timeout=20s",
        ])
        .await;
    }
    let out = k.ok(&["apply", "-k", &deploy.display().to_string()]).await;
    for what in [
        "resourcequota/tidepool-critical-pods created",
        "flowschema.flowcontrol.apiserver.k8s.io/tidepool-operator-leader-election created",
        "deployment.apps/tidepool-operator created",
        "daemonset.apps/tidepool-agent created",
    ] {
        assert!(out.contains(what), "missing {what:?} in:\n{out}");
    }
    let out = k
        .ok(&["get", "quota", "-n", "tidepool", "-o", "name"])
        .await;
    assert_eq!(out.trim(), "resourcequota/tidepool-critical-pods");
    server.shutdown();
}

/// The bundle's `tidepool-pod-pools` policy (deploy/operator/pod-pools-policy.yaml, issue
/// 29): a pod whose `ipam.tidepool.dev/pools` annotation names an IPPool whose
/// `namespaceSelector` does not select the pod's namespace is refused at CREATE, naming the
/// pod, the pool and the namespace; an unrestricted pool is allowed everywhere; a pod without
/// the annotation is never judged (its matchConditions), even where the policy would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_the_bundles_pod_pools_policy_keeps_a_namespace_to_its_pools() {
    let server = ApiServer::start().await.unwrap();
    let k = Kubectl::new(&server);
    k.install_crds().await;
    let out = k.ok(&["apply", "-k", DEPLOY]).await;
    for what in [
        "validatingadmissionpolicy.admissionregistration.k8s.io/tidepool-pod-pools created",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/tidepool-pod-pools created",
    ] {
        assert!(out.contains(what), "missing {what:?} in:\n{out}");
    }
    let file = |name: &str, yaml: &str| {
        let p = k.dir.join(name);
        std::fs::write(&p, yaml).unwrap();
        p.display().to_string()
    };
    let pod = |name: &str, ns: &str, pools: Option<&str>| {
        let annotations = pools.map_or(String::new(), |p| {
            format!("\n  annotations:\n    ipam.tidepool.dev/pools: \"{p}\"")
        });
        file(
            &format!("{ns}-{name}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}{annotations}\n\
                 spec:\n  containers:\n  - name: c\n    image: registry.k8s.io/pause:3.10\n"
            ),
        )
    };
    // no pool yet: parameterNotFoundAction Allow lets an annotated pod through
    k.ok(&["create", "namespace", "team-a"]).await;
    k.ok(&["create", "namespace", "team-b"]).await;
    k.ok(&["apply", "-f", &pod("early", "team-b", Some("team-a"))])
        .await;
    k.ok(&["label", "namespace", "team-a", "team=a"]).await;
    k.ok(&["label", "namespace", "team-b", "team=b"]).await;
    let pools = file(
        "pools.yaml",
        "apiVersion: ipam.tidepool.dev/v1alpha1\nkind: IPPool\nmetadata:\n  name: team-a\n\
         spec:\n  cidrs: [10.70.0.0/16]\n  namespaceSelector:\n    matchLabels:\n      team: a\n\
         ---\napiVersion: ipam.tidepool.dev/v1alpha1\nkind: IPPool\nmetadata:\n  name: shared\n\
         spec:\n  cidrs: [10.80.0.0/16, fd00:80::/64]\n\
         ---\napiVersion: ipam.tidepool.dev/v1alpha1\nkind: IPPool\nmetadata:\n  name: not-b\n\
         spec:\n  cidrs: [fd00:90::/64]\n  namespaceSelector:\n    matchExpressions:\n\
         \x20   - {key: team, operator: NotIn, values: [b]}\n    - {key: team, operator: Exists}\n",
    );
    k.ok(&["apply", "-f", &pools]).await;

    let err = k
        .fails(&["apply", "-f", &pod("web", "team-b", Some("shared, team-a"))])
        .await;
    assert!(
        err.contains(
            "pods \"web\" is forbidden: ValidatingAdmissionPolicy 'tidepool-pod-pools' with \
             binding 'tidepool-pod-pools' denied request: pod team-b/web may not use IPPool \
             team-a: its namespaceSelector does not select namespace team-b"
        ),
        "{err}"
    );
    let err = k
        .fails(&["apply", "-f", &pod("v6", "team-b", Some("not-b"))])
        .await;
    assert!(err.contains("may not use IPPool not-b"), "{err}");
    k.ok(&["apply", "-f", &pod("web", "team-a", Some("team-a,not-b"))])
        .await;
    for ns in ["team-a", "team-b", "default"] {
        k.ok(&["apply", "-f", &pod("any", ns, Some("shared"))])
            .await;
    }
    k.ok(&["apply", "-f", &pod("plain", "team-b", None)]).await;

    // matchConditions: with every validation failing (a broken copy of the policy), a pod
    // without the annotation is still created
    let shipped =
        std::fs::read_to_string(format!("{DEPLOY}/operator/pod-pools-policy.yaml")).unwrap();
    for doc in shipped.split("\n---\n") {
        let mut v: Value = serde_saphyr::from_str(doc).unwrap();
        v["metadata"]["name"] = "broken-pod-pools".into();
        if v["kind"] == "ValidatingAdmissionPolicy" {
            v["spec"]["validations"] = serde_json::json!([{"expression": "false"}]);
        } else {
            v["spec"]["policyName"] = "broken-pod-pools".into();
        }
        let f = file(
            &format!("broken-{}.json", v["kind"].as_str().unwrap()),
            &v.to_string(),
        );
        k.ok(&["apply", "-f", &f]).await;
    }
    k.ok(&["apply", "-f", &pod("plain2", "team-a", None)]).await;
    let err = k
        .fails(&["apply", "-f", &pod("web2", "team-a", Some("shared"))])
        .await;
    assert!(
        err.contains("ValidatingAdmissionPolicy 'broken-pod-pools'"),
        "the broken copy judges annotated pods: {err}"
    );
    server.shutdown();
}
