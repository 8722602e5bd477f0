//! Server-side apply (k8s.io/apiserver pkg/endpoints/handlers/patch.go `applyPatcher`): the
//! configuration checked and pruned, merged by the field manager ([`crate::fieldset`]) with
//! its ownership and conflicts, then created or written as an update.

use serde_json::{Value, json};

use super::meta::{meta_str, now};
use super::{Inner, Owners, Store, WriteOpts, Written, writer};
use crate::error::Error;
use crate::registry::ResType;
use crate::typemeta;

impl Store {
    pub(super) fn apply_locked(
        &self,
        i: &mut Inner,
        rt: &ResType,
        ns: &str,
        name: &str,
        config: &Value,
        o: &WriteOpts,
    ) -> Result<Written, Error> {
        let config = checked_config(rt, name, config, o)?;
        let (t, av) = (now(), rt.api_version());
        let w = writer(rt, o, &o.subresource, &av, &t);
        let conflict = |c| conflict_error(rt, name, &av, c);
        match Self::lookup(i, rt, ns, name).ok() {
            None => {
                if o.subresource == "status" {
                    return Err(Error::not_found(&rt.group, &rt.plural, name));
                }
                refuse_uid_on_create(rt, name, &config)?;
                let mut live = json!({"apiVersion": config["apiVersion"], "kind": rt.kind,
                    "metadata": {"name": name}});
                if rt.namespaced {
                    live["metadata"]["namespace"] = json!(ns);
                }
                let merged = w.apply(&live, &config, o.force).map_err(conflict)?;
                let mut res = self.create_locked(i, rt, ns, merged, o, Owners::Precomputed)?;
                res.code = 201;
                Ok(res)
            }
            Some(old) => {
                let expect = meta_str(&config, "resourceVersion");
                if !expect.is_empty() && expect != meta_str(&old, "resourceVersion") {
                    return Err(Error::stale(&rt.group, &rt.plural, name));
                }
                let view = Self::present(rt, &old);
                let merged = w.apply(&view, &config, o.force).map_err(conflict)?;
                Self::uid_unchanged(rt, &old, meta_str(&config, "uid"))?;
                self.update_locked(i, rt, &old, merged, "", o, Owners::Precomputed)
            }
        }
    }
}

/// The configuration of an apply: a field manager is required, type meta must be set and
/// match, the name that of the URL; fields the schema does not have are pruned (400 when
/// strict).
fn checked_config(rt: &ResType, name: &str, config: &Value, o: &WriteOpts) -> Result<Value, Error> {
    if o.manager.is_empty() {
        return Err(Error::invalid(
            "meta.k8s.io",
            "PatchOptions",
            "",
            vec![(
                "fieldManager".into(),
                "Required value: is required for apply patch".into(),
            )],
        ));
    }
    if !config.is_object() || config.get("apiVersion").is_none() || config.get("kind").is_none() {
        return Err(Error::bad_request(
            "apiVersion and kind must be set in an apply configuration",
        ));
    }
    typemeta::check_version(rt, config)?;
    let cname = meta_str(config, "name");
    if !cname.is_empty() && cname != name {
        return Err(Error::bad_request(format!(
            "the name of the object ({cname}) does not match the name on the URL ({name})"
        )));
    }
    let mut config = config.clone();
    if let Some(schema) = rt.schema.as_ref() {
        let mut unknown = Vec::new();
        crate::schema::prune(schema, &mut config, &mut unknown);
        unknown.retain(|u| u != "metadata" && u != "apiVersion" && u != "kind");
        if o.strict && !unknown.is_empty() {
            let list: Vec<String> = unknown
                .iter()
                .map(|u| format!("unknown field \"{u}\""))
                .collect();
            return Err(Error::bad_request(format!(
                "{}: strict decoding error: {}",
                rt.kind,
                list.join(", ")
            )));
        }
    }
    Ok(config)
}

/// An apply that would create is refused when it names a uid (kubernetes/apiserver
/// pkg/endpoints/handlers/patch.go `applyPatch`); its resourceVersion is not compared: the
/// create-on-update path wipes it (pkg/registry/generic/registry/store.go `Update`).
fn refuse_uid_on_create(rt: &ResType, name: &str, config: &Value) -> Result<(), Error> {
    let uid = meta_str(config, "uid");
    if uid.is_empty() {
        return Ok(());
    }
    Err(Error::conflict(
        &rt.group,
        &rt.plural,
        name,
        &format!(
            "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
        ),
    ))
}

/// The 409 of an apply's conflicts, `(manager, field path)` each, as the real server words
/// it (k8s.io/apiserver pkg/endpoints/handlers/fieldmanager `NewConflictError`).
fn conflict_error(rt: &ResType, name: &str, av: &str, conflicts: Vec<(String, String)>) -> Error {
    let n = conflicts.len();
    let lines: Vec<String> = conflicts
        .iter()
        .map(|(m, f)| format!("conflict with \"{m}\" using {av}: {f}"))
        .collect();
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, f)| {
            json!({"reason": "FieldManagerConflict",
                "message": format!("conflict with \"{m}\" using {av}"), "field": f})
        })
        .collect();
    Error::Api {
        code: 409,
        reason: "Conflict",
        message: if n == 1 {
            format!("Apply failed with 1 conflict: {}", lines[0])
        } else {
            format!("Apply failed with {n} conflicts: {}", lines.join("\n"))
        },
        details: Some(json!({"name": name, "kind": rt.plural, "group": rt.group,
            "causes": causes})),
    }
}

#[cfg(test)]
mod tests {
    use super::super::WriteOpts;
    use super::super::fixtures::{store, type_of, writes_by};
    use serde_json::{Value, json};

    fn config(value: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"},
            "data": {"k": value}})
    }

    fn managers(obj: &Value) -> Vec<(String, String)> {
        obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["manager"].as_str().unwrap().into(),
                    e["operation"].as_str().unwrap().into(),
                )
            })
            .collect()
    }

    #[test]
    fn an_apply_creates_and_records_its_managers_fields() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        let w = store
            .patch(
                &cms,
                "default",
                "a",
                "apply",
                &config("1"),
                &writes_by("alice"),
            )
            .unwrap();
        assert_eq!(w.code, 201);
        assert_eq!(w.obj["data"], json!({"k": "1"}));
        assert_eq!(
            managers(&w.obj),
            [("alice".to_string(), "Apply".to_string())]
        );
        assert_eq!(
            w.obj["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:data": {"f:k": {}}})
        );
        let again = store
            .patch(
                &cms,
                "default",
                "a",
                "apply",
                &config("2"),
                &writes_by("alice"),
            )
            .unwrap();
        assert_eq!(
            (again.code, again.obj["data"]["k"].clone()),
            (200, json!("2"))
        );
    }

    #[test]
    fn another_managers_change_conflicts_until_forced() {
        // structured-merge-diff merge/update.go `Apply`: changing a field another manager
        // owns is a conflict; `force` takes the field over.
        let store = store();
        let cms = type_of(&store, "configmaps");
        store
            .patch(
                &cms,
                "default",
                "a",
                "apply",
                &config("1"),
                &writes_by("alice"),
            )
            .unwrap();
        let err = store
            .patch(
                &cms,
                "default",
                "a",
                "apply",
                &config("2"),
                &writes_by("bob"),
            )
            .unwrap_err();
        assert_eq!(err.code(), 409);
        assert_eq!(
            err.to_string(),
            "409 Conflict: Apply failed with 1 conflict: conflict with \"alice\" using v1: .data.k"
        );
        let cause = &err.status()["details"]["causes"][0];
        assert_eq!(cause["reason"], "FieldManagerConflict");
        assert_eq!(cause["field"], ".data.k");
        // The same value is no conflict: both own it.
        let same = store.patch(
            &cms,
            "default",
            "a",
            "apply",
            &config("1"),
            &writes_by("bob"),
        );
        assert_eq!(managers(&same.unwrap().obj).len(), 2);
        let force = WriteOpts {
            force: true,
            ..writes_by("bob")
        };
        let w = store
            .patch(&cms, "default", "a", "apply", &config("3"), &force)
            .unwrap();
        assert_eq!(w.obj["data"]["k"], "3");
        assert_eq!(managers(&w.obj), [("bob".to_string(), "Apply".to_string())]);
    }

    #[test]
    fn an_apply_needs_a_manager_and_refuses_a_uid_it_cannot_find() {
        let store = store();
        let cms = type_of(&store, "configmaps");
        let err = store
            .patch(&cms, "default", "a", "apply", &config("1"), &writes_by(""))
            .unwrap_err();
        assert_eq!(err.code(), 422);
        assert_eq!(
            err.status()["details"]["causes"][0]["message"],
            "Required value: is required for apply patch"
        );
        let mut with_uid = config("1");
        with_uid["metadata"]["uid"] = json!("u-1");
        let err = store
            .patch(
                &cms,
                "default",
                "a",
                "apply",
                &with_uid,
                &writes_by("alice"),
            )
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "409 Conflict: Operation cannot be fulfilled on configmaps \"a\": uid mismatch: the provided object specified uid u-1, and no existing object was found"
        );
    }
}
