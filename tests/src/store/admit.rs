//! Validation, pruning and defaulting every write goes through (the strategies'
//! `Validate`/`PrepareFor…` and the decoding of built-in kinds), and the NamespaceLifecycle
//! and type-meta checks of a body.

use serde_json::Value;

use super::meta::{label_part, meta, meta_str};
use super::{Inner, Store};
use crate::error::Error;
use crate::names;
use crate::registry::{ResType, from_crd};
use crate::schema::{prune_and_default, validate_update};
use crate::{events, typemeta};

/// etcd's default request size limit, which bounds a stored object.
const MAX_OBJECT_BYTES: usize = 1_572_864;

/// `(field path, message)` pairs of a 422.
type Causes = Vec<(String, String)>;

impl Store {
    /// Validation, pruning and defaulting shared by all writes.
    /// `old` is the stored object (in `rt`'s shape) on an update.
    pub(super) fn admit(
        &self,
        rt: &ResType,
        obj: &mut Value,
        old: Option<&Value>,
        strict: bool,
        warnings: &mut Vec<String>,
    ) -> Result<(), Error> {
        let name = meta_str(obj, "name").to_string();
        if let (true, Some(schema)) = (rt.crd, rt.schema.as_ref()) {
            self.admit_custom(rt, schema, obj, old, strict, warnings)?;
        }
        if !rt.crd {
            admit_typed(rt, obj, strict, warnings)?;
        }
        let mut causes = crate::admission_policy::check_object(rt, obj);
        events::validate(rt, obj, old, &mut causes);
        // DaemonSet, NetworkPolicy, PriorityClass: defaults, then their validations
        if !rt.crd {
            crate::kinds::default(&rt.group, &rt.kind, obj);
            crate::kinds::validate(&rt.group, &rt.kind, obj, &mut causes);
        }
        self.kind_rules(rt, obj, old, &mut causes, warnings)?;
        metadata_rules(obj, &mut causes);
        if !causes.is_empty() {
            return Err(Error::invalid(&rt.group, &rt.kind, &name, causes));
        }
        within_size_limit(obj)
    }

    /// A custom resource: pruned and defaulted by its schema, then validated (schema and
    /// rules).
    fn admit_custom(
        &self,
        rt: &ResType,
        schema: &Value,
        obj: &mut Value,
        old: Option<&Value>,
        strict: bool,
        warnings: &mut Vec<String>,
    ) -> Result<(), Error> {
        let mut unknown = Vec::new();
        prune_and_default(schema, obj, "", &mut unknown);
        unknown.retain(|u| u != "metadata" && u != "apiVersion" && u != "kind");
        if !unknown.is_empty() {
            if strict {
                return Err(strict_decoding(rt, &rt.api_version(), &unknown));
            }
            warnings.extend(unknown.iter().map(|u| format!("unknown field \"{u}\"")));
        }
        let mut causes = Vec::new();
        validate_update(schema, obj, old, "", &self.pats, &mut causes);
        self.check_rules(schema, obj, old, &mut causes, warnings);
        if causes.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid(
                &rt.group,
                &rt.kind,
                meta_str(obj, "name"),
                causes,
            ))
        }
    }

    /// The checks of single kinds the real strategies make (Pod, Deployment, Lease) and a
    /// CRD's own: its selectable fields, its schema, its rules' warnings.
    fn kind_rules(
        &self,
        rt: &ResType,
        obj: &mut Value,
        old: Option<&Value>,
        causes: &mut Causes,
        warnings: &mut Vec<String>,
    ) -> Result<(), Error> {
        match rt.kind.as_str() {
            "Pod"
                if obj
                    .pointer("/spec/containers")
                    .and_then(Value::as_array)
                    .is_none_or(|c| c.is_empty()) =>
            {
                causes.push(("spec.containers".into(), "Required value".into()));
            }
            "Deployment" if obj.pointer("/spec/selector").is_none() => {
                causes.push(("spec.selector".into(), "Required value".into()));
            }
            "Lease" => {
                if let Some(d) = obj
                    .pointer("/spec/leaseDurationSeconds")
                    .and_then(Value::as_i64)
                    && d <= 0
                {
                    causes.push((
                        "spec.leaseDurationSeconds".into(),
                        format!("Invalid value: {d}: must be greater than 0"),
                    ));
                }
            }
            "CustomResourceDefinition" => {
                if !self.crd_field_selectors {
                    super::crd::drop_selectable_fields(obj, old);
                }
                from_crd(obj)?;
                warnings.extend(crate::crd_validation::rule_warnings(obj));
            }
            _ => {}
        }
        Ok(())
    }

    /// A custom resource's validation rules (`crd_rules`), unless the schema validation found
    /// an error that blocks them (kubernetes/apiextensions-apiserver
    /// `pkg/registry/customresource/strategy.go` `hasBlockingErr`: a type, required, enum or
    /// length error).
    fn check_rules(
        &self,
        schema: &Value,
        obj: &Value,
        old: Option<&Value>,
        causes: &mut Causes,
        warnings: &mut Vec<String>,
    ) {
        if !crate::crd_rules::has_rules(schema) {
            return;
        }
        let blocking = causes.iter().any(|(_, m)| {
            [
                "Required value",
                "Unsupported value",
                "Too long",
                "Too many",
            ]
            .iter()
            .any(|p| m.starts_with(p))
                || m.contains(" in body must be of type ")
        });
        if blocking {
            causes.push((
                "<nil>".into(),
                "Invalid value: \"null\": some validation rules were not checked because the \
                 object was invalid; correct the existing errors to complete validation"
                    .into(),
            ));
        } else {
            self.rules.validate(schema, obj, old, causes, warnings);
        }
    }

    /// NamespaceLifecycle: the namespace must exist and not be terminating.
    pub(super) fn check_namespace(
        i: &Inner,
        rt: &ResType,
        ns: &str,
        name: &str,
    ) -> Result<(), Error> {
        if !rt.namespaced {
            return Ok(());
        }
        match i
            .objects
            .get("namespaces")
            .and_then(|m| m.get(&(String::new(), ns.to_string())))
        {
            None => Err(Error::not_found("", "namespaces", ns)),
            Some(n) if meta(n, "deletionTimestamp").is_some() => {
                Err(crate::admission::terminating(rt, name, ns))
            }
            Some(_) => Ok(()),
        }
    }

    /// The type meta of a create or update body (see [`typemeta::check`]).
    pub(super) fn check_type_meta_in(i: &Inner, rt: &ResType, obj: &Value) -> Result<(), Error> {
        typemeta::check(rt, obj, |g, v, k| {
            i.types
                .values()
                .any(|t| !t.crd && t.group == g && t.version == v && t.kind == k)
        })
    }
}

/// A built-in kind decoded as its Go type would be: fields the type does not have are
/// dropped with a warning (400 with `fieldValidation=Strict`), a body that does not decode
/// is 400.
fn admit_typed(
    rt: &ResType,
    obj: &mut Value,
    strict: bool,
    warnings: &mut Vec<String>,
) -> Result<(), Error> {
    match crate::typed::decode(&rt.group, &rt.kind, obj) {
        None => Ok(()),
        Some(Ok(kept)) => {
            let mut unknown = Vec::new();
            crate::typed::unknown_fields(obj, &kept, "", &mut unknown);
            if unknown.is_empty() {
                return Ok(());
            }
            if strict {
                return Err(strict_decoding(rt, &rt.version, &unknown));
            }
            crate::typed::remove_fields(obj, &unknown);
            warnings.extend(unknown.iter().map(|u| format!("unknown field \"{u}\"")));
            Ok(())
        }
        Some(Err(e)) if !e.to_string().starts_with("missing field") => {
            Err(Error::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: {e}",
                rt.kind, rt.version, rt.kind
            )))
        }
        Some(Err(_)) => Ok(()),
    }
}

/// The 400 of unknown fields under `fieldValidation=Strict`.
fn strict_decoding(rt: &ResType, version: &str, unknown: &[String]) -> Error {
    let list: Vec<String> = unknown
        .iter()
        .map(|u| format!("unknown field \"{u}\""))
        .collect();
    Error::bad_request(format!(
        "{} in version \"{version}\" cannot be handled as a {}: strict decoding error: {}",
        rt.kind,
        rt.kind,
        list.join(", ")
    ))
}

/// Labels and annotations: maps of strings, label keys qualified names, label values valid,
/// annotations within 256 KiB (k8s.io/apimachinery pkg/api/validation/objectmeta.go).
fn metadata_rules(obj: &Value, causes: &mut Causes) {
    for (k, key) in [
        ("labels", "metadata.labels"),
        ("annotations", "metadata.annotations"),
    ] {
        if let Some(m) = meta(obj, k) {
            match m.as_object() {
                Some(m) if m.values().all(Value::is_string) => {}
                _ => causes.push((key.into(), "Invalid value: must be a map of strings".into())),
            }
        }
    }
    if let Some(labels) = meta(obj, "labels").and_then(Value::as_object) {
        for (k, v) in labels {
            for m in names::qualified_name(k) {
                causes.push((
                    "metadata.labels".into(),
                    format!("Invalid value: \"{k}\": {m}"),
                ));
            }
            let v = v.as_str().unwrap_or("");
            if !(v.is_empty() || label_part(v)) {
                causes.push((
                    "metadata.labels".into(),
                    format!("Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
                ));
            }
        }
    }
    if let Some(ann) = meta(obj, "annotations").and_then(Value::as_object) {
        let total: usize = ann
            .iter()
            .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
            .sum();
        if total > 256 * 1024 {
            causes.push((
                "metadata.annotations".into(),
                format!("Too long: must have at most 262144 bytes, got {total}"),
            ));
        }
    }
}

/// A stored object is at most etcd's request size: 413 beyond.
fn within_size_limit(obj: &Value) -> Result<(), Error> {
    let size = serde_json::to_vec(obj).map(|b| b.len()).unwrap_or(0);
    if size > MAX_OBJECT_BYTES {
        return Err(Error::api(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {MAX_OBJECT_BYTES}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::WriteOpts;
    use super::super::fixtures::{configmap, install_widgets, store, type_of, widget, writes};
    use serde_json::json;

    #[test]
    fn a_bad_label_value_is_422_in_apimachinerys_words() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        let mut body = configmap("a");
        body["metadata"]["labels"] = json!({"app": "-bad"});
        let err = store.create(&cms, "default", body, &writes()).unwrap_err();
        assert_eq!(err.code(), 422);
        let causes = &err.status()["details"]["causes"];
        assert_eq!(causes[0]["field"], "metadata.labels");
        let message = causes[0]["message"].as_str().unwrap();
        assert!(
            message.starts_with("Invalid value: \"-bad\": a valid label must be"),
            "{message}"
        );
    }

    #[test]
    fn a_pod_needs_containers_and_a_lease_a_positive_duration() {
        let store = store();
        let pods = type_of(&store, "pods");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}});
        let err = store.create(&pods, "default", pod, &writes()).unwrap_err();
        assert_eq!(err.code(), 422);
        assert_eq!(
            err.status()["details"]["causes"][0]["field"],
            "spec.containers"
        );
        let leases = store
            .resolve("coordination.k8s.io", "v1", "leases")
            .unwrap();
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 0}});
        let err = store
            .create(&leases, "default", lease, &writes())
            .unwrap_err();
        let cause = &err.status()["details"]["causes"][0];
        assert_eq!(cause["field"], "spec.leaseDurationSeconds");
        assert_eq!(cause["message"], "Invalid value: 0: must be greater than 0");
    }

    #[test]
    fn unknown_fields_are_dropped_with_a_warning_or_refused_when_strict() {
        // kube-apiserver's fieldValidation: Warn by default, Strict answers 400
        // (k8s.io/apiserver pkg/endpoints/handlers/create.go).
        let store = store();
        let cms = type_of(&store, "configmaps");
        let mut body = configmap("a");
        body["bogus"] = json!(1);
        let w = store
            .create(&cms, "default", body.clone(), &writes())
            .unwrap();
        assert_eq!(w.warnings, ["unknown field \"bogus\""]);
        assert_eq!(w.obj.get("bogus"), None);
        body["metadata"]["name"] = json!("b");
        let strict = WriteOpts {
            strict: true,
            ..writes()
        };
        let err = store.create(&cms, "default", body, &strict).unwrap_err();
        assert_eq!(
            err.to_string(),
            "400 BadRequest: ConfigMap in version \"v1\" cannot be handled as a ConfigMap: \
             strict decoding error: unknown field \"bogus\""
        );
        let widgets = install_widgets(&store);
        let mut cr = widget("w");
        cr["spec"]["extra"] = json!(true);
        let w = store.create(&widgets, "default", cr, &writes()).unwrap();
        assert_eq!(w.warnings, ["unknown field \"spec.extra\""]);
        assert_eq!(w.obj["spec"], json!({"replicas": 1}));
    }

    #[test]
    fn an_object_beyond_etcds_limit_is_413() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        let mut body = configmap("big");
        body["data"]["k"] = json!("x".repeat(super::MAX_OBJECT_BYTES));
        let err = store.create(&cms, "default", body, &writes()).unwrap_err();
        assert_eq!(err.code(), 413);
        assert_eq!(
            err.to_string(),
            "413 RequestEntityTooLarge: Request entity too large: limit is 1572864"
        );
    }

    #[test]
    fn content_needs_a_namespace_that_exists_and_is_not_terminating() {
        // NamespaceLifecycle (k8s.io/apiserver pkg/admission/plugin/namespace/lifecycle).
        let store = store();
        let cms = type_of(&store, "configmaps");
        let err = store
            .create(&cms, "nowhere", configmap("a"), &writes())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "404 NotFound: namespaces \"nowhere\" not found"
        );
        let nss = type_of(&store, "namespaces");
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}});
        store.create(&nss, "", ns, &writes()).unwrap();
        store
            .delete(&nss, "", "doomed", &Default::default())
            .unwrap();
        let err = store
            .create(&cms, "doomed", configmap("a"), &writes())
            .unwrap_err();
        assert_eq!(err.code(), 403);
        assert_eq!(
            err.status()["details"]["causes"][0]["reason"],
            "NamespaceTerminating"
        );
    }
}
