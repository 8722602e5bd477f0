//! The deploy bundle as rendered (`kubectl kustomize deploy/`), run as processes (issue 17):
//! the operator Deployment's and the agent DaemonSet's command, args, env and service
//! account read from the rendered YAML, never repeated here. Only what cannot hold outside a
//! cluster is changed, and every change is listed in [`overrides`] with its reason; env
//! entries from the downward API are filled in as the kubelet would ([`Workload::env`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::e2e::{Cluster, NodeRuntime, Proc, operator_bin};

/// Which workload a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Operator,
    Agent,
}

/// One workload of the rendered bundle: what its (single) container runs, as whom.
#[derive(Debug, Clone)]
pub struct Workload {
    pub kind: String,
    pub namespace: String,
    pub service_account: String,
    /// `spec.replicas` of a Deployment; `None` for a DaemonSet (one per node).
    pub replicas: Option<u64>,
    /// The container's `command[0]`.
    pub command: String,
    pub args: Vec<String>,
    /// The container's `env`, as rendered.
    pub env: Vec<Value>,
}

/// The pod a process stands for: what the downward API reads.
#[derive(Debug, Clone)]
pub struct PodFacts {
    pub name: String,
    pub namespace: String,
    pub node: String,
}

/// The rendered bundle's objects (`kubectl kustomize deploy/`).
pub async fn render(cluster: &Cluster) -> Vec<Value> {
    let deploy = repo().join("deploy").display().to_string();
    let yaml = cluster.kubectl.ok(&["kustomize", &deploy], None).await;
    serde_saphyr::from_multiple::<Value>(&yaml).expect("the rendered bundle parses")
}

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl Workload {
    /// The rendered `kind` named `name`; fails unless its pod has exactly one container.
    pub fn find(docs: &[Value], kind: &str, name: &str) -> Workload {
        let obj = docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} rendered"));
        let pod = &obj["spec"]["template"]["spec"];
        let containers = pod["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "{kind} {name} runs one container");
        let c = &containers[0];
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .map(|s| s.as_str().expect("a string").to_string())
                .collect()
        };
        Workload {
            kind: kind.to_string(),
            namespace: text(&obj["metadata"]["namespace"]),
            service_account: text(&pod["serviceAccountName"]),
            replicas: obj["spec"]["replicas"].as_u64(),
            command: strings(&c["command"]).first().cloned().expect("a command"),
            args: strings(&c["args"]),
            env: c["env"].as_array().cloned().unwrap_or_default(),
        }
    }

    /// The identity its service-account token authenticates as (`@NODE` when the token is
    /// bound to a pod on that node, as a projected token is on Kubernetes >= 1.30).
    pub fn identity(&self, node: Option<&str>) -> String {
        let user = format!(
            "system:serviceaccount:{}:{}",
            self.namespace, self.service_account
        );
        match node {
            Some(n) => format!("{user}@{n}"),
            None => user,
        }
    }

    /// The container's environment as the kubelet fills it in for `pod`: plain values and
    /// the downward API's `fieldRef`s (metadata.name, metadata.namespace, spec.nodeName).
    pub fn env(&self, pod: &PodFacts) -> Vec<(String, String)> {
        self.env
            .iter()
            .map(|e| {
                let name = text(&e["name"]);
                if let Some(v) = e["value"].as_str() {
                    return (name, v.to_string());
                }
                let field = text(&e["valueFrom"]["fieldRef"]["fieldPath"]);
                let value = match field.as_str() {
                    "metadata.name" => pod.name.clone(),
                    "metadata.namespace" => pod.namespace.clone(),
                    "spec.nodeName" => pod.node.clone(),
                    other => panic!("env {name}: no stand-in for the downward API's {other}"),
                };
                (name, value)
            })
            .collect()
    }

    /// The rendered args with `overrides` applied: a flag given as `--flag=value` or
    /// `--flag value` gets the override's value; one the bundle does not set is appended.
    pub fn args_with(&self, overrides: &[Override]) -> Vec<String> {
        let mut args = self.args.clone();
        for o in overrides {
            let eq = format!("{}=", o.flag);
            if let Some(a) = args.iter_mut().find(|a| a.starts_with(&eq)) {
                *a = format!("{eq}{}", o.value);
            } else if let Some(i) = args.iter().position(|a| a == o.flag) {
                args[i + 1] = o.value.clone();
            } else {
                args.push(format!("{eq}{}", o.value));
            }
        }
        args
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// One rendered flag changed for the run outside a cluster, and why.
#[derive(Debug, Clone)]
pub struct Override {
    pub flag: &'static str,
    pub value: String,
    pub why: &'static str,
}

/// Every change made to the rendered args, in one place. `dir` is the process's own temp
/// dir (the agent's: its node's). The agent's listen addresses stay as rendered
/// (127.0.0.1:9692/9693): each agent runs in its node's network namespace, whose loopback
/// is its own, as a host-network pod's is its node's. `--netns-dir` stays too: the
/// harness's sandboxes are `ip netns` namespaces in /var/run/netns, the rendered path.
pub fn overrides(role: Role, dir: &Path, kubeconfig: &Path) -> Vec<Override> {
    let at = |p: &str| dir.join(p).display().to_string();
    let mut o = vec![Override {
        flag: "--kubeconfig",
        value: kubeconfig.display().to_string(),
        why: "in a pod the in-cluster config (the mounted token and the kubernetes \
              Service); here a kubeconfig holding a token of the same service account \
              (bound to the same node, for the agent)",
    }];
    match role {
        Role::Operator => {
            let why = "two replicas share the host's network here (each pod has its own \
                       in a cluster), and tests listen on loopback only";
            o.push(Override {
                flag: "--metrics-addr",
                value: "127.0.0.1:0".into(),
                why,
            });
            o.push(Override {
                flag: "--health-addr",
                value: "127.0.0.1:0".into(),
                why,
            });
        }
        Role::Agent => {
            let why = "host paths: every test node gets its own under a temp dir (the \
                       CNI config the harness hands the plugin names the same paths)";
            for (flag, path) in [
                ("--socket", "run/agent.sock"),
                ("--restored-marker", "run/restored"),
                ("--state-dir", "state"),
                ("--cni-cache-dir", "cni/results"),
            ] {
                o.push(Override {
                    flag,
                    value: at(path),
                    why,
                });
            }
        }
    }
    o
}

/// Starts operator replica `i` of `w` on the host: the rendered command's binary, args
/// with [`overrides`], env as the kubelet fills it for pod `{name}-{i}`, nothing else
/// (the environment is cleared: no TIDEPOOL_* of the caller's leaks in).
pub fn spawn_operator(cluster: &mut Cluster, w: &Workload, i: usize) {
    let pod = PodFacts {
        name: format!("tidepool-operator-{i}"),
        namespace: w.namespace.clone(),
        node: format!("host-{i}"),
    };
    let dir = cluster.dir.path().join(&pod.name);
    std::fs::create_dir_all(&dir).expect("the replica's dir");
    let kubeconfig = dir.join("kubeconfig");
    cluster
        .server
        .write_kubeconfig(&w.identity(None), &kubeconfig)
        .expect("kubeconfig");
    let mut cmd = Command::new(binary(w, &operator_bin()));
    cmd.env_clear()
        .args(w.args_with(&overrides(Role::Operator, &dir, &kubeconfig)))
        .envs(w.env(&pod));
    let log = dir.join("operator.log");
    cluster.operators.push(Proc::spawn(&pod.name, cmd, log));
}

/// Starts the agent of `w` on node `rt` inside its network namespace, reaching the API
/// server through the node's forwarder on `port` (for [`Cluster::add_node_with`]).
pub fn spawn_agent(w: &Workload, cluster: &Cluster, rt: &NodeRuntime, port: u16) -> Proc {
    let kubeconfig = rt.dir.join("agent.kubeconfig");
    // after the Node exists: the node-bound token carries the Node's UID too
    let mut config: Value = serde_json::from_str(
        &cluster
            .server
            .kubeconfig(&w.identity(Some(rt.name.as_str()))),
    )
    .expect("a kubeconfig");
    config["clusters"][0]["cluster"]["server"] = format!("https://127.0.0.1:{port}").into();
    std::fs::write(&kubeconfig, config.to_string()).expect("kubeconfig");
    let pod = PodFacts {
        name: format!("tidepool-agent-{}", rt.name),
        namespace: w.namespace.clone(),
        node: rt.name.clone(),
    };
    let mut cmd = Command::new("ip");
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(w.env(&pod))
        .args(["netns", "exec", &rt.netns])
        .arg(binary(w, Path::new(super::e2e::AGENT_BIN)))
        .args(w.args_with(&overrides(Role::Agent, &rt.dir, &kubeconfig)));
    Proc::spawn(
        &format!("agent on {}", rt.name),
        cmd,
        rt.dir.join("agent.log"),
    )
}

/// The built binary the rendered command names (the image's path; the file name must be
/// the built binary's).
fn binary(w: &Workload, built: &Path) -> PathBuf {
    let name = Path::new(&w.command).file_name().expect("a file name");
    assert_eq!(
        Some(name),
        built.file_name(),
        "{} runs {}, not the built {}",
        w.kind,
        w.command,
        built.display()
    );
    built.to_path_buf()
}
