//! What a ValidatingAdmissionPolicy reads besides the request: its `params` (the policy's
//! `paramKind`, the binding's `paramRef`) and `namespaceObject`, resolved as kube-apiserver
//! resolves them, and the write-time checks of both fields.
//!
//! Upstream: k8s.io/apiserver pkg/admission/plugin/policy/generic/policy_dispatcher.go
//! `CollectParams`, policy_source.go `ensureParamsForPolicyLocked`, validating/dispatcher.go
//! `Dispatch` (the namespace), plugin/cel/filter.go `CreateNamespaceObject`; k8s.io/kubernetes
//! pkg/apis/admissionregistration/validation/validation.go `validateParamKind`,
//! `validateParamRef`.

use std::sync::Arc;

use serde_json::{Map, Value, json};

/// The stored objects admission reads (the store implements it over its locked state).
pub(crate) trait Objects {
    /// Every object of the kind `api_version`/`kind`, in that version, and whether the kind is
    /// namespaced; `None` when no served resource has the kind.
    fn of_kind(&self, api_version: &str, kind: &str) -> Option<(bool, Vec<Arc<Value>>)>;
    /// The Namespace `name`.
    fn namespace(&self, name: &str) -> Option<Arc<Value>>;
}

/// A policy's `spec.paramKind`.
#[derive(Clone)]
pub(crate) struct ParamKind {
    api_version: String,
    kind: String,
}

impl ParamKind {
    pub(crate) fn of(spec: &Value) -> Option<ParamKind> {
        let p = spec.get("paramKind").filter(|p| p.is_object())?;
        let s = |k: &str| p[k].as_str().unwrap_or_default().to_string();
        Some(ParamKind {
            api_version: s("apiVersion"),
            kind: s("kind"),
        })
    }

    /// `schema.GroupVersionKind.String()`: `group/version, Kind=kind`.
    fn gvk(&self) -> String {
        let (group, version) = self
            .api_version
            .split_once('/')
            .unwrap_or(("", &self.api_version));
        format!("{group}/{version}, Kind={}", self.kind)
    }
}

/// A binding's `spec.paramRef`.
pub(crate) struct ParamRef {
    name: String,
    namespace: String,
    selector: Option<Value>,
    deny_when_none: bool,
}

impl ParamRef {
    pub(crate) fn of(spec: &Value) -> Option<ParamRef> {
        let p = spec.get("paramRef").filter(|p| p.is_object())?;
        let s = |k: &str| p[k].as_str().unwrap_or_default().to_string();
        Some(ParamRef {
            name: s("name"),
            namespace: s("namespace"),
            selector: p.get("selector").filter(|s| !s.is_null()).cloned(),
            deny_when_none: s("parameterNotFoundAction") == "Deny",
        })
    }
}

/// Why the params of a policy and binding could not be collected (the real server's words);
/// the dispatcher prefixes them and applies the policy's failurePolicy.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ConfigError {
    /// `failed to configure policy: …`, reported without the binding.
    Policy(String),
    /// `failed to configure binding: …`.
    Binding(String),
}

/// `CollectParams`: the params to evaluate a policy with, each once (`None`: `params` is
/// null, when the policy has no paramKind or the binding no paramRef); empty when none was
/// found and `parameterNotFoundAction` is Allow.
pub(crate) fn collect(
    kind: Option<&ParamKind>,
    pref: Option<&ParamRef>,
    request_namespace: &str,
    objects: &dyn Objects,
) -> Result<Vec<Option<Arc<Value>>>, ConfigError> {
    let Some(kind) = kind else {
        return Ok(vec![None]);
    };
    let Some((namespaced, all)) = objects.of_kind(&kind.api_version, &kind.kind) else {
        return Err(ConfigError::Policy(format!(
            "failed to find resource referenced by paramKind: '{}'",
            kind.gvk()
        )));
    };
    let Some(pref) = pref else {
        return Ok(vec![None]);
    };
    let binding = |m: &str| Err(ConfigError::Binding(m.to_string()));
    let namespace = if !namespaced {
        if !pref.namespace.is_empty() {
            return binding(
                "paramRef.namespace must not be provided for a cluster-scoped `paramKind`",
            );
        }
        ""
    } else if !pref.namespace.is_empty() {
        &pref.namespace
    } else if !request_namespace.is_empty() {
        request_namespace
    } else {
        return binding(
            "cannot use namespaced paramRef in policy binding that matches cluster-scoped resources",
        );
    };
    let in_scope = all
        .into_iter()
        .filter(|o| o["metadata"]["namespace"].as_str().unwrap_or_default() == namespace);
    let params: Vec<_> = if !pref.name.is_empty() {
        in_scope
            .filter(|o| o["metadata"]["name"] == pref.name.as_str())
            .collect()
    } else if let Some(selector) = &pref.selector {
        let mut selected = Vec::new();
        for o in in_scope {
            match crate::kinds::selector_matches(Some(selector), o["metadata"].get("labels")) {
                Some(true) => selected.push(o),
                Some(false) => {}
                None => return binding(&invalid_operator(selector)),
            }
        }
        selected
    } else {
        return binding("one of name or selector must be provided");
    };
    if params.is_empty() && pref.deny_when_none {
        return binding("no params found for policy binding with `Deny` parameterNotFoundAction");
    }
    Ok(params.into_iter().map(Some).collect())
}

/// `metav1.LabelSelectorAsSelector`'s error for the first operator it does not know.
fn invalid_operator(selector: &Value) -> String {
    let known = ["In", "NotIn", "Exists", "DoesNotExist"];
    let op = (selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten())
    .filter_map(|e| e["operator"].as_str())
    .find(|o| !known.contains(o))
    .unwrap_or_default();
    format!("{op:?} is not a valid label selector operator")
}

/// `namespaceObject`: the request's Namespace as `CreateNamespaceObject` copies it (these
/// metadata fields, spec and status; no apiVersion, kind or managedFields); null for a
/// cluster-scoped resource and for a Namespace itself (validating/dispatcher.go `Dispatch`).
pub(crate) fn namespace_object(namespace: Option<&Value>) -> Value {
    const META: [&str; 12] = [
        "name",
        "generateName",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "finalizers",
    ];
    let Some(ns) = namespace else {
        return Value::Null;
    };
    let meta: Map<String, Value> = META
        .iter()
        .filter_map(|k| ns["metadata"].get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    let or_empty = |k: &str| ns.get(k).cloned().unwrap_or_else(|| json!({}));
    json!({"metadata": meta, "spec": or_empty("spec"), "status": or_empty("status")})
}

/// `validateParamKind` (the fields' presence and the version's).
pub(crate) fn check_param_kind(spec: &Value) -> Vec<(String, String)> {
    let Some(p) = spec.get("paramKind").filter(|p| p.is_object()) else {
        return Vec::new();
    };
    let mut causes = Vec::new();
    let s = |k: &str| p[k].as_str().unwrap_or_default();
    let api_version = s("apiVersion");
    if api_version.is_empty() {
        causes.push(("spec.paramKind.apiVersion".into(), "Required value".into()));
    } else if api_version
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .is_empty()
    {
        causes.push((
            "spec.paramKind.apiVersion".into(),
            format!("Invalid value: {api_version:?}: version must be specified"),
        ));
    }
    if s("kind").is_empty() {
        causes.push(("spec.paramKind.kind".into(), "Required value".into()));
    }
    causes
}

/// `validateParamRef`: a name or a selector, not both; `parameterNotFoundAction` Deny or
/// Allow.
pub(crate) fn check_param_ref(spec: &Value) -> Vec<(String, String)> {
    let Some(p) = spec.get("paramRef").filter(|p| p.is_object()) else {
        return Vec::new();
    };
    let mut causes = Vec::new();
    let name = p["name"].as_str().unwrap_or_default();
    let selector = p.get("selector").is_some_and(|s| !s.is_null());
    let exclusive = "Forbidden: name and selector are mutually exclusive";
    if !name.is_empty() && selector {
        causes.push(("spec.paramRef.name".into(), exclusive.into()));
        causes.push(("spec.paramRef.selector".into(), exclusive.into()));
    }
    if name.is_empty() && !selector {
        causes.push((
            "spec.paramRef".into(),
            "Required value: one of name or selector must be specified".into(),
        ));
    }
    let path = "spec.paramRef.parameterNotFoundAction";
    match p["parameterNotFoundAction"].as_str().unwrap_or_default() {
        "" => causes.push((path.into(), "Required value".into())),
        "Deny" | "Allow" => {}
        other => causes.push((
            path.into(),
            format!("Unsupported value: {other:?}: supported values: \"Deny\", \"Allow\""),
        )),
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<Arc<Value>>, Option<Arc<Value>>);

    impl Objects for Fixed {
        fn of_kind(&self, api_version: &str, kind: &str) -> Option<(bool, Vec<Arc<Value>>)> {
            (api_version == "ipam.tidepool.dev/v1alpha1" && kind == "IPPool")
                .then(|| (false, self.0.clone()))
        }
        fn namespace(&self, _: &str) -> Option<Arc<Value>> {
            self.1.clone()
        }
    }

    fn pool(name: &str, tier: &str) -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": name, "labels": {"tier": tier}}}))
    }

    fn names(r: Result<Vec<Option<Arc<Value>>>, ConfigError>) -> Vec<String> {
        r.expect("collected")
            .iter()
            .map(|p| {
                p.as_ref()
                    .map_or("null".into(), |p| p["metadata"]["name"].to_string())
            })
            .collect()
    }

    #[test]
    fn params_by_selector_by_name_and_none() {
        let objects = Fixed(vec![pool("a", "x"), pool("b", "x"), pool("c", "y")], None);
        let kind = ParamKind::of(
            &json!({"paramKind": {"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool"}}),
        );
        let pref = |r: Value| ParamRef::of(&json!({"paramRef": r}));
        let run = |r: Value| collect(kind.as_ref(), pref(r).as_ref(), "ns", &objects);
        let x =
            json!({"selector": {"matchLabels": {"tier": "x"}}, "parameterNotFoundAction": "Deny"});
        assert_eq!(names(run(x)), ["\"a\"", "\"b\""]);
        let all = json!({"selector": {}, "parameterNotFoundAction": "Allow"});
        assert_eq!(names(run(all)).len(), 3);
        let c = json!({"name": "c", "parameterNotFoundAction": "Deny"});
        assert_eq!(names(run(c)), ["\"c\""]);
        let none = json!({"name": "z", "parameterNotFoundAction": "Allow"});
        assert!(names(run(none)).is_empty());
        let deny =
            json!({"selector": {"matchLabels": {"tier": "z"}}, "parameterNotFoundAction": "Deny"});
        assert_eq!(
            run(deny).err(),
            Some(ConfigError::Binding(
                "no params found for policy binding with `Deny` parameterNotFoundAction".into()
            ))
        );
        assert_eq!(
            names(collect(kind.as_ref(), None, "ns", &objects)),
            ["null"]
        );
        assert_eq!(
            names(collect(
                None,
                pref(json!({"name": "c"})).as_ref(),
                "",
                &objects
            )),
            ["null"]
        );
        let unknown =
            ParamKind::of(&json!({"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}}));
        assert_eq!(
            collect(unknown.as_ref(), None, "ns", &objects).err(),
            Some(ConfigError::Policy(
                "failed to find resource referenced by paramKind: '/v1, Kind=ConfigMap'".into()
            ))
        );
    }

    #[test]
    fn namespace_object_keeps_what_create_namespace_object_keeps() {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "a", "labels": {"team": "a"}, "managedFields": [{}], "uid": "u"},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
        assert_eq!(
            namespace_object(Some(&ns)),
            json!({"metadata": {"name": "a", "labels": {"team": "a"}, "uid": "u"},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
        );
        assert_eq!(namespace_object(None), Value::Null);
    }
}
