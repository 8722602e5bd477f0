//! Resource types served: the built-in kinds and those defined by CustomResourceDefinitions.

use serde_json::{Value, json};

use crate::crd_validation;
use crate::error::Error;

/// One additional printer column of a CRD version.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    pub name: String,
    pub ty: String,
    pub json_path: String,
    pub priority: i64,
    pub description: String,
}

/// A served resource: one group/version/plural.
#[derive(Debug, Clone)]
pub(crate) struct ResType {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub status: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// `openAPIV3Schema` of a custom resource version.
    pub schema: Option<Value>,
    pub columns: Vec<Column>,
    /// Extra field labels usable in field selectors (`selectableFields` of a CRD).
    pub selectable: Vec<String>,
    /// Defined by a CRD (unstructured: strict validation and pruning apply).
    pub crd: bool,
    /// Version objects are stored in (conversion `None` only rewrites `apiVersion`).
    pub storage_version: String,
}

impl ResType {
    /// `plural.group` (or `plural` for the core group): the storage key.
    pub fn gr(&self) -> String {
        crate::error::qualified(&self.group, &self.plural)
    }

    /// The key of the store this type's objects live in: events.k8s.io Events are core
    /// Events (see [`crate::events`]).
    pub fn storage_gr(&self) -> String {
        if crate::events::is_events_api(self) {
            crate::error::qualified("", &self.plural)
        } else {
            self.gr()
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether writes to the main resource bump `metadata.generation`.
    pub fn has_generation(&self) -> bool {
        self.crd
            || matches!(
                self.kind.as_str(),
                "Deployment"
                    | "DaemonSet"
                    | "NetworkPolicy"
                    | "PodDisruptionBudget"
                    | "CustomResourceDefinition"
                    | "Pod"
                    | "ValidatingAdmissionPolicy"
                    | "FlowSchema"
            )
    }

    /// Whether the real server supports this field label in field selectors.
    pub fn field_label_supported(&self, label: &str) -> bool {
        if matches!(label, "metadata.name" | "metadata.namespace")
            || self.selectable.iter().any(|s| s == label)
        {
            return true;
        }
        let list: &[&str] = match (self.group.as_str(), self.kind.as_str()) {
            ("", "Pod") => &[
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.podIPs",
                "status.nominatedNodeName",
            ],
            ("", "Node") => &["spec.unschedulable"],
            ("", "Namespace") => &["status.phase"],
            ("", "Secret") => &["type"],
            ("", "Event") | ("events.k8s.io", "Event") => &[
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
            _ => &[],
        };
        list.contains(&label)
    }

    /// Verbs of the main resource; namespaces have no deletecollection.
    pub fn verbs(&self) -> &'static [&'static str] {
        if self.group.is_empty() && self.kind == "Namespace" {
            &[
                "create", "delete", "get", "list", "patch", "update", "watch",
            ]
        } else {
            &[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }

    pub fn discovery(&self) -> Vec<Value> {
        let mut r = json!({
            "name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
            "kind": self.kind, "verbs": self.verbs(),
        });
        if !self.short_names.is_empty() {
            r["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            r["categories"] = json!(self.categories);
        }
        let mut out = vec![r];
        if self.status {
            out.push(json!({
                "name": format!("{}/status", self.plural), "singularName": "",
                "namespaced": self.namespaced, "kind": self.kind, "verbs": ["get", "patch", "update"],
            }));
        }
        if crate::scale::has_scale(self) {
            out.push(crate::scale::discovery(self));
        }
        out
    }
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    status: bool,
    short: &[&str],
    categories: &[&str],
) -> ResType {
    ResType {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        namespaced,
        status,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories: categories.iter().map(|s| s.to_string()).collect(),
        schema: None,
        columns: Vec::new(),
        selectable: Vec::new(),
        crd: false,
        storage_version: version.into(),
    }
}

/// The built-in kinds.
pub(crate) fn builtins() -> Vec<ResType> {
    let rbac = "rbac.authorization.k8s.io";
    vec![
        builtin(
            "",
            "v1",
            "Namespace",
            "namespaces",
            false,
            true,
            &["ns"],
            &[],
        ),
        builtin("", "v1", "Node", "nodes", false, true, &["no"], &[]),
        builtin("", "v1", "Pod", "pods", true, true, &["po"], &["all"]),
        builtin("", "v1", "Event", "events", true, false, &["ev"], &[]),
        builtin(
            "",
            "v1",
            "ServiceAccount",
            "serviceaccounts",
            true,
            false,
            &["sa"],
            &[],
        ),
        builtin(
            "",
            "v1",
            "Service",
            "services",
            true,
            true,
            &["svc"],
            &["all"],
        ),
        builtin(
            "",
            "v1",
            "ConfigMap",
            "configmaps",
            true,
            false,
            &["cm"],
            &[],
        ),
        builtin("", "v1", "Secret", "secrets", true, false, &[], &[]),
        builtin(
            "",
            "v1",
            "ResourceQuota",
            "resourcequotas",
            true,
            true,
            &["quota"],
            &[],
        ),
        builtin(
            "flowcontrol.apiserver.k8s.io",
            "v1",
            "FlowSchema",
            "flowschemas",
            false,
            true,
            &[],
            &[],
        ),
        builtin(
            "events.k8s.io",
            "v1",
            "Event",
            "events",
            true,
            false,
            &["ev"],
            &[],
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "Lease",
            "leases",
            true,
            false,
            &[],
            &[],
        ),
        builtin(
            "apps",
            "v1",
            "Deployment",
            "deployments",
            true,
            true,
            &["deploy"],
            &["all"],
        ),
        builtin(
            "apps",
            "v1",
            "DaemonSet",
            "daemonsets",
            true,
            true,
            &["ds"],
            &["all"],
        ),
        // No status subresource: NetworkPolicyStatus was removed in 1.28.
        builtin(
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
            "networkpolicies",
            true,
            false,
            &["netpol"],
            &[],
        ),
        builtin(
            "scheduling.k8s.io",
            "v1",
            "PriorityClass",
            "priorityclasses",
            false,
            false,
            &["pc"],
            &[],
        ),
        builtin(rbac, "v1", "Role", "roles", true, false, &[], &[]),
        builtin(
            rbac,
            "v1",
            "RoleBinding",
            "rolebindings",
            true,
            false,
            &[],
            &[],
        ),
        builtin(
            rbac,
            "v1",
            "ClusterRole",
            "clusterroles",
            false,
            false,
            &[],
            &[],
        ),
        builtin(
            rbac,
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
            false,
            &[],
            &[],
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            false,
            true,
            &[],
            &["api-extensions"],
        ),
        builtin(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            false,
            false,
            &[],
            &["api-extensions"],
        ),
        builtin(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
            true,
            &["pdb"],
            &[],
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
            true,
            &["crd", "crds"],
            &["api-extensions"],
        ),
    ]
}

fn strs(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Validates a CRD object (422 causes) and returns the resource types it defines.
pub(crate) fn from_crd(crd: &Value) -> Result<Vec<ResType>, Error> {
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let s = |p: &str| {
        crd.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (group, plural, kind, scope) = (
        s("/spec/group"),
        s("/spec/names/plural"),
        s("/spec/names/kind"),
        s("/spec/scope"),
    );
    let mut causes = Vec::new();
    if group.is_empty() {
        causes.push(("spec.group".to_string(), "Required value".to_string()));
    } else {
        crd_validation::group(&group, &mut causes);
    }
    if plural.is_empty() {
        causes.push(("spec.names.plural".into(), "Required value".into()));
    }
    if kind.is_empty() {
        causes.push(("spec.names.kind".into(), "Required value".into()));
    }
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        causes.push((
            "metadata.name".into(),
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    if scope != "Namespaced" && scope != "Cluster" {
        causes.push((
            "spec.scope".into(),
            format!(
                "Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""
            ),
        ));
    }
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        causes.push((
            "spec.versions".into(),
            "Invalid value: null: must have exactly one version marked as storage version".into(),
        ));
    }
    crd_validation::version_names(&versions, &mut causes);
    let storage: Vec<&Value> = versions
        .iter()
        .filter(|v| v.get("storage") == Some(&Value::Bool(true)))
        .collect();
    if !versions.is_empty() && storage.len() != 1 {
        causes.push((
            "spec.versions".into(),
            "Invalid value: []apiextensions.CustomResourceDefinitionVersion{...}: must have exactly one version marked as storage version".to_string(),
        ));
    }
    let storage_version = storage
        .first()
        .and_then(|v| v.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut out = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let vname = v
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let path = format!("spec.versions[{i}].schema.openAPIV3Schema");
        let schema = v.pointer("/schema/openAPIV3Schema").cloned();
        match &schema {
            None => causes.push((path, "Required value: schemas are required".into())),
            Some(sch) => {
                crate::schema::check_structural(sch, &path, &mut causes);
                crd_validation::schema(sch, &path, &mut causes);
            }
        }
        if v.get("served") != Some(&Value::Bool(true)) {
            continue;
        }
        let columns = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .map(|c| Column {
                        name: c.get("name").and_then(Value::as_str).unwrap_or("").into(),
                        ty: c
                            .get("type")
                            .and_then(Value::as_str)
                            .unwrap_or("string")
                            .into(),
                        json_path: c
                            .get("jsonPath")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .into(),
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                        description: c
                            .get("description")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .into(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let singular = s("/spec/names/singular");
        let list_kind = s("/spec/names/listKind");
        out.push(ResType {
            group: group.clone(),
            version: vname,
            kind: kind.clone(),
            list_kind: if list_kind.is_empty() {
                format!("{kind}List")
            } else {
                list_kind
            },
            plural: plural.clone(),
            singular: if singular.is_empty() {
                kind.to_lowercase()
            } else {
                singular
            },
            namespaced: scope == "Namespaced",
            status: v.pointer("/subresources/status").is_some(),
            short_names: strs(crd.pointer("/spec/names/shortNames")),
            categories: strs(crd.pointer("/spec/names/categories")),
            schema,
            columns,
            selectable: v
                .get("selectableFields")
                .and_then(Value::as_array)
                .map(|f| {
                    f.iter()
                        .filter_map(|x| x.get("jsonPath").and_then(Value::as_str))
                        .map(|p| p.trim_start_matches('.').to_string())
                        .collect()
                })
                .unwrap_or_default(),
            crd: true,
            storage_version: storage_version.clone(),
        });
    }
    if !causes.is_empty() {
        return Err(Error::invalid(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            name,
            causes,
        ));
    }
    Ok(out)
}
