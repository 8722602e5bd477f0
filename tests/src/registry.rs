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

/// Whether a resource's objects live in namespaces.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    Namespaced,
    Cluster,
}

use Scope::{Cluster, Namespaced};

/// A built-in kind, served at v1: group, kind, plural, scope, whether it has a status
/// subresource, short names, categories.
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    Scope,
    bool,
    &'static [&'static str],
    &'static [&'static str],
);

const RBAC: &str = "rbac.authorization.k8s.io";
const ADMISSION: &str = "admissionregistration.k8s.io";

#[rustfmt::skip]
const BUILTINS: &[Builtin] = &[
    ("",                             "Namespace",                        "namespaces",                        Cluster,    true,  &["ns"],          &[]),
    ("",                             "Node",                             "nodes",                             Cluster,    true,  &["no"],          &[]),
    ("",                             "Pod",                              "pods",                              Namespaced, true,  &["po"],          &["all"]),
    ("",                             "Event",                            "events",                            Namespaced, false, &["ev"],          &[]),
    ("",                             "ServiceAccount",                   "serviceaccounts",                   Namespaced, false, &["sa"],          &[]),
    ("",                             "Service",                          "services",                          Namespaced, true,  &["svc"],         &["all"]),
    ("",                             "ConfigMap",                        "configmaps",                        Namespaced, false, &["cm"],          &[]),
    ("",                             "Secret",                           "secrets",                           Namespaced, false, &[],              &[]),
    ("",                             "ResourceQuota",                    "resourcequotas",                    Namespaced, true,  &["quota"],       &[]),
    ("flowcontrol.apiserver.k8s.io", "FlowSchema",                       "flowschemas",                       Cluster,    true,  &[],              &[]),
    ("events.k8s.io",                "Event",                            "events",                            Namespaced, false, &["ev"],          &[]),
    ("coordination.k8s.io",          "Lease",                            "leases",                            Namespaced, false, &[],              &[]),
    ("apps",                         "Deployment",                       "deployments",                       Namespaced, true,  &["deploy"],      &["all"]),
    ("apps",                         "DaemonSet",                        "daemonsets",                        Namespaced, true,  &["ds"],          &["all"]),
    // No status subresource: NetworkPolicyStatus was removed in 1.28.
    ("networking.k8s.io",            "NetworkPolicy",                    "networkpolicies",                   Namespaced, false, &["netpol"],      &[]),
    ("scheduling.k8s.io",            "PriorityClass",                    "priorityclasses",                   Cluster,    false, &["pc"],          &[]),
    (RBAC,                           "Role",                             "roles",                             Namespaced, false, &[],              &[]),
    (RBAC,                           "RoleBinding",                      "rolebindings",                      Namespaced, false, &[],              &[]),
    (RBAC,                           "ClusterRole",                      "clusterroles",                      Cluster,    false, &[],              &[]),
    (RBAC,                           "ClusterRoleBinding",               "clusterrolebindings",               Cluster,    false, &[],              &[]),
    (ADMISSION,                      "ValidatingAdmissionPolicy",        "validatingadmissionpolicies",       Cluster,    true,  &[],              &["api-extensions"]),
    (ADMISSION,                      "ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings", Cluster,    false, &[],              &["api-extensions"]),
    ("policy",                       "PodDisruptionBudget",              "poddisruptionbudgets",              Namespaced, true,  &["pdb"],         &[]),
    ("apiextensions.k8s.io",         "CustomResourceDefinition",         "customresourcedefinitions",         Cluster,    true,  &["crd", "crds"], &["api-extensions"]),
];

/// The built-in kinds.
pub(crate) fn builtins() -> Vec<ResType> {
    let owned = |s: &[&str]| s.iter().map(|s| s.to_string()).collect();
    BUILTINS
        .iter()
        .map(
            |&(group, kind, plural, scope, status, short, categories)| ResType {
                group: group.into(),
                version: "v1".into(),
                kind: kind.into(),
                list_kind: format!("{kind}List"),
                plural: plural.into(),
                singular: kind.to_lowercase(),
                namespaced: scope == Namespaced,
                status,
                short_names: owned(short),
                categories: owned(categories),
                schema: None,
                columns: Vec::new(),
                selectable: Vec::new(),
                crd: false,
                storage_version: "v1".into(),
            },
        )
        .collect()
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

/// The names a CRD's spec gives its resource.
struct CrdNames {
    group: String,
    plural: String,
    kind: String,
    scope: String,
    singular: String,
    list_kind: String,
}

impl CrdNames {
    fn of(crd: &Value) -> Self {
        let s = |p: &str| {
            crd.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        CrdNames {
            group: s("/spec/group"),
            plural: s("/spec/names/plural"),
            kind: s("/spec/names/kind"),
            scope: s("/spec/scope"),
            singular: s("/spec/names/singular"),
            list_kind: s("/spec/names/listKind"),
        }
    }

    /// The causes against the names: group, plural and kind required, the object named
    /// `plural.group`, a known scope.
    fn check(&self, name: &str, causes: &mut Vec<(String, String)>) {
        let (group, plural, kind, scope) = (&self.group, &self.plural, &self.kind, &self.scope);
        if group.is_empty() {
            causes.push(("spec.group".to_string(), "Required value".to_string()));
        } else {
            crd_validation::group(group, causes);
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
    }
}

/// Validates a CRD object (422 causes) and returns the resource types it defines.
pub(crate) fn from_crd(crd: &Value) -> Result<Vec<ResType>, Error> {
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let names = CrdNames::of(crd);
    let mut causes = Vec::new();
    names.check(name, &mut causes);
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let storage_version = storage_version(&versions, &mut causes);
    let mut out = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let path = format!("spec.versions[{i}].schema.openAPIV3Schema");
        let schema = v.pointer("/schema/openAPIV3Schema").cloned();
        match &schema {
            None => causes.push((path, "Required value: schemas are required".into())),
            Some(sch) => {
                crate::schema::check_structural(sch, &path, &mut causes);
                crd_validation::schema(sch, &path, &mut causes);
            }
        }
        if v.get("served") == Some(&Value::Bool(true)) {
            out.push(served_version(crd, &names, v, schema, &storage_version));
        }
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

/// The one version marked as storage version, with the causes against the version list
/// (none, names, not exactly one storage version).
fn storage_version(versions: &[Value], causes: &mut Vec<(String, String)>) -> String {
    if versions.is_empty() {
        causes.push((
            "spec.versions".into(),
            "Invalid value: null: must have exactly one version marked as storage version".into(),
        ));
    }
    crd_validation::version_names(versions, causes);
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
    storage
        .first()
        .and_then(|v| v.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// The resource type of one served version `v` of a CRD.
fn served_version(
    crd: &Value,
    names: &CrdNames,
    v: &Value,
    schema: Option<Value>,
    storage_version: &str,
) -> ResType {
    let kind = &names.kind;
    ResType {
        group: names.group.clone(),
        version: v
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        kind: kind.clone(),
        list_kind: if names.list_kind.is_empty() {
            format!("{kind}List")
        } else {
            names.list_kind.clone()
        },
        plural: names.plural.clone(),
        singular: if names.singular.is_empty() {
            kind.to_lowercase()
        } else {
            names.singular.clone()
        },
        namespaced: names.scope == "Namespaced",
        status: v.pointer("/subresources/status").is_some(),
        short_names: strs(crd.pointer("/spec/names/shortNames")),
        categories: strs(crd.pointer("/spec/names/categories")),
        schema,
        columns: columns(v),
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
        storage_version: storage_version.to_string(),
    }
}

/// The `additionalPrinterColumns` of a CRD version.
fn columns(v: &Value) -> Vec<Column> {
    let text = |c: &Value, k: &str, default: &str| {
        c.get(k)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_string()
    };
    v.get("additionalPrinterColumns")
        .and_then(Value::as_array)
        .map(|cols| {
            cols.iter()
                .map(|c| Column {
                    name: text(c, "name", ""),
                    ty: text(c, "type", "string"),
                    json_path: text(c, "jsonPath", ""),
                    priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                    description: text(c, "description", ""),
                })
                .collect()
        })
        .unwrap_or_default()
}
