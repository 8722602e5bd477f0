//! The kube 5 client (and kube-lease-manager) against the in-process API server.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};
use tidepool_tests::{ApiServer, Config, Faults, TargetedFault};

fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c.data = Some(
        data.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_resource_version_conflicts_and_status_bodies() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();

    let a = cms
        .create(&pp, &cm("a", &[("k", "1")]))
        .await
        .expect("create");
    let uid = a.metadata.uid.clone().expect("uid set on create");
    assert_eq!(uid.len(), 36, "uid looks like a UUID: {uid}");
    assert!(
        a.metadata.creation_timestamp.is_some(),
        "creationTimestamp set"
    );
    let rv1: u64 = a
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();

    // A second create of the same name: 409 AlreadyExists with a Status body.
    let err = cms.create(&pp, &cm("a", &[])).await.unwrap_err();
    let s = status(&err);
    assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(s.message, "configmaps \"a\" already exists");

    // Replace with the current resourceVersion works and bumps it.
    let mut next = a.clone();
    next.data = Some(BTreeMap::from([("k".to_string(), "2".to_string())]));
    let b = cms.replace("a", &pp, &next).await.expect("replace");
    let rv2: u64 = b
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1, "resourceVersion increases: {rv1} -> {rv2}");
    assert_eq!(b.metadata.uid.as_deref(), Some(uid.as_str()));

    // Replace with the stale one: 409 Conflict.
    let err = cms.replace("a", &pp, &next).await.unwrap_err();
    let s = status(&err);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(
        s.message.contains("the object has been modified"),
        "{}",
        s.message
    );

    // A merge patch carrying a stale resourceVersion is also refused.
    let err = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"resourceVersion": rv1.to_string()}, "data": {"x": "y"}}),
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), 409);

    // 404 NotFound.
    let err = cms.get("missing").await.unwrap_err();
    let s = status(&err);
    assert_eq!(
        (s.code, s.reason.as_str(), s.message.as_str()),
        (404, "NotFound", "configmaps \"missing\" not found")
    );

    // 422 Invalid: bad name, with a cause naming the field.
    let err = cms.create(&pp, &cm("Not_Valid", &[])).await.unwrap_err();
    let s = status(&err);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    let causes = &s.details.as_ref().expect("details").causes;
    assert_eq!(causes[0].field, "metadata.name");

    // generateName.
    let mut g = ConfigMap::default();
    g.metadata.generate_name = Some("gen-".into());
    let g = cms.create(&pp, &g).await.unwrap();
    let gname = g.metadata.name.unwrap();
    assert!(gname.starts_with("gen-") && gname.len() == 9, "{gname}");
    // Namespace must exist.
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    let err = other.create(&pp, &cm("x", &[])).await.unwrap_err();
    assert_eq!(status(&err).message, "namespaces \"nope\" not found");

    // Delete preconditions on uid and resourceVersion.
    let bad_uid = DeleteParams::default().preconditions(Preconditions {
        uid: Some("other".into()),
        resource_version: None,
    });
    let err = cms.delete("a", &bad_uid).await.unwrap_err();
    assert_eq!(code(&err), 409);
    assert!(
        status(&err).message.contains("Precondition failed: UID"),
        "{}",
        status(&err).message
    );
    let bad_rv = DeleteParams::default().preconditions(Preconditions {
        uid: None,
        resource_version: Some(rv1.to_string()),
    });
    assert_eq!(code(&cms.delete("a", &bad_rv).await.unwrap_err()), 409);
    let good = DeleteParams::default().preconditions(Preconditions {
        uid: Some(uid),
        resource_version: Some(rv2.to_string()),
    });
    cms.delete("a", &good)
        .await
        .expect("delete with matching preconditions");
    assert_eq!(code(&cms.get("a").await.unwrap_err()), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_status_bodies_and_discovery() {
    let (server, client) = start().await;
    let token = Some(server.token("tester"));
    let (c, _, body) = raw(
        &server,
        "GET",
        "/api/v1/namespaces/default/pods/nope",
        token.clone(),
        None,
    )
    .await;
    assert_eq!(c, 404);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "Status");
    assert_eq!(v["status"], "Failure");
    assert_eq!(v["reason"], "NotFound");
    assert_eq!(v["details"], json!({"name": "nope", "kind": "pods"}));
    let (c, _, _) = raw(&server, "GET", "/api/v1/pods", Some("bogus".into()), None).await;
    assert_eq!(c, 401, "unknown tokens are refused");

    let v = client.apiserver_version().await.expect("version");
    assert_eq!((v.major.as_str(), v.minor.as_str()), ("1", "33"));
    install_crd(&client).await;
    let d = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let groups: Vec<String> = d.groups().map(|g| g.name().to_string()).collect();
    for g in [
        "",
        "apps",
        "coordination.k8s.io",
        "ipam.tidepool.dev",
        "apiextensions.k8s.io",
        "policy",
        "rbac.authorization.k8s.io",
        "events.k8s.io",
    ] {
        assert!(
            groups.contains(&g.to_string()),
            "group {g:?} discovered in {groups:?}"
        );
    }
    let (ar, caps) = d
        .resolve_gvk(&kube::api::GroupVersionKind::gvk(
            "ipam.tidepool.dev",
            "v1alpha1",
            "IPAMNode",
        ))
        .expect("ipamnode found");
    assert_eq!(ar.plural, "ipamnodes");
    assert_eq!(caps.scope, kube::discovery::Scope::Cluster);
    assert!(
        caps.subresources
            .iter()
            .any(|(s, _)| s.plural == "ipamnodes/status" || s.plural == "status")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_schema_validation_generation_and_status_subresource() {
    let (_server, client) = start().await;
    // A CRD whose list-map key is neither required nor defaulted is refused, like the real
    // server does (a common mistake in generated schemas).
    {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let mut bad: serde_json::Value = serde_saphyr::from_str(CRD_YAML).unwrap();
        let items = bad.pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/conditions/items").unwrap();
        items.as_object_mut().unwrap().remove("required");
        let bad: CustomResourceDefinition = serde_json::from_value(bad).unwrap();
        let err = Api::<CustomResourceDefinition>::all(client.clone())
            .create(&PostParams::default(), &bad)
            .await
            .unwrap_err();
        assert_eq!(code(&err), 422);
        assert!(
            status(&err)
                .message
                .contains("must have a default or be a required property"),
            "{}",
            status(&err).message
        );
    }
    let nodes = install_crd(&client).await;
    let pp = PostParams::default();

    let mk = |name: &str, spec: serde_json::Value| {
        dynamic(
            json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode", "metadata": {"name": name}, "spec": spec}),
        )
    };
    let cases = [
        (
            json!({"nodeUID": 5}),
            "spec.nodeUID",
            "must be of type string",
        ),
        (
            json!({"watermarks": {"preAllocate": -1}}),
            "spec.watermarks.preAllocate",
            "greater than or equal to 0",
        ),
        (
            json!({"watermarks": {"mode": "chaotic"}}),
            "spec.watermarks.mode",
            "Unsupported value",
        ),
        (
            json!({"pools": {"ipv4": "Bad Pool"}}),
            "spec.pools.ipv4",
            "should match",
        ),
        (
            json!({"reclaim": {"10.0.0.1": {"reason": "gone"}}}),
            "spec.reclaim.10.0.0.1.podUID",
            "Required value",
        ),
    ];
    for (spec, field, msg) in cases {
        let err = nodes
            .create(&pp, &mk("bad", spec.clone()))
            .await
            .unwrap_err();
        let s = status(&err);
        assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "for {spec}");
        let causes = &s.details.as_ref().expect("details").causes;
        assert!(
            causes
                .iter()
                .any(|c| c.field == field && c.message.contains(msg)),
            "{spec}: {causes:?}"
        );
    }
    let err = nodes.create(&pp, &dynamic(json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode", "metadata": {"name": "nospec"}}))).await.unwrap_err();
    assert_eq!(
        status(&err).details.as_ref().unwrap().causes[0].field,
        "spec"
    );

    // Unknown fields are pruned (Warn), defaults applied, status dropped on create.
    let created = nodes
        .create(&pp, &dynamic(json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode", "metadata": {"name": "n1"},
            "spec": {"nodeUID": "u1", "bogus": true, "watermarks": {"preAllocate": 2}}, "status": {"used": {"10.0.0.1": {"pod": "p"}}}})))
        .await
        .expect("create");
    assert_eq!(
        created.data["spec"],
        json!({"nodeUID": "u1", "watermarks": {"preAllocate": 2, "mode": "dynamic"}})
    );
    assert!(
        created.data.get("status").is_none(),
        "status ignored on create: {:?}",
        created.data
    );
    assert_eq!(created.metadata.generation, Some(1));
    // Strict field validation refuses unknown fields.
    let err = nodes
        .patch(
            "n1",
            &PatchParams::default().validation_strict(),
            &Patch::Merge(json!({"spec": {"bogus": 1}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), 400);
    assert!(
        status(&err)
            .message
            .contains("unknown field \"spec.bogus\""),
        "{}",
        status(&err).message
    );

    // Spec change bumps generation; metadata change does not.
    let p = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"watermarks": {"preAllocate": 3}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.generation, Some(2));
    let p = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.generation, Some(2));

    // Status subresource: writes there cannot change spec, writes to the main resource cannot change status.
    let s = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"nodeUID": "hacked"}, "status": {"used": {"10.0.0.1": {"pod": "p1"}}}})))
        .await
        .unwrap();
    assert_eq!(s.data["spec"]["nodeUID"], "u1");
    assert_eq!(s.data["status"]["used"]["10.0.0.1"]["pod"], "p1");
    assert_eq!(
        s.metadata.generation,
        Some(2),
        "status writes do not bump generation"
    );
    let m = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeUID": "u2"}, "status": {"used": null}})),
        )
        .await
        .unwrap();
    assert_eq!(m.data["spec"]["nodeUID"], "u2");
    assert_eq!(
        m.data["status"]["used"]["10.0.0.1"]["pod"], "p1",
        "status unchanged by main resource patch"
    );
    let got = nodes.get_status("n1").await.unwrap();
    assert_eq!(got.data["status"]["used"]["10.0.0.1"]["pod"], "p1");
    // An invalid status is refused too.
    let err = nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"releaseAck": {"10.0.0.9": "maybe"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422);
    // Custom resources take no strategic merge patches.
    let err = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), 415);
    // selectableFields from the CRD work in field selectors; other fields do not.
    let sel = nodes
        .list(&ListParams::default().fields("spec.nodeUID=u2"))
        .await
        .unwrap();
    assert_eq!(sel.items.len(), 1);
    assert_eq!(
        code(
            &nodes
                .list(&ListParams::default().fields("spec.pools.ipv4=x"))
                .await
                .unwrap_err()
        ),
        400
    );
    // Replace on a CR requires a resourceVersion.
    let mut no_rv = got.clone();
    no_rv.metadata.resource_version = None;
    assert_eq!(
        code(&nodes.replace("n1", &pp, &no_rv).await.unwrap_err()),
        422
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizers_deletion_timestamp_and_owner_gc() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let mut f = cm("fin", &[]);
    f.metadata.finalizers = Some(vec!["tidepool.dev/keep".into()]);
    cms.create(&pp, &f).await.unwrap();
    let r = cms.delete("fin", &DeleteParams::default()).await.unwrap();
    let obj = r.left().expect("object returned while finalizers pending");
    assert!(
        obj.metadata.deletion_timestamp.is_some(),
        "deletionTimestamp set"
    );
    assert!(
        cms.get("fin").await.is_ok(),
        "still there while finalizers remain"
    );
    let err = cms
        .patch(
            "fin",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["tidepool.dev/keep", "new/one"]}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422, "no new finalizers on a terminating object");
    cms.patch(
        "fin",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(
        code(&cms.get("fin").await.unwrap_err()),
        404,
        "gone once the last finalizer is removed"
    );

    // Owner references: background GC deletes dependents whose owners are all gone.
    let owner = cms.create(&pp, &cm("owner", &[])).await.unwrap();
    let other = cms.create(&pp, &cm("other-owner", &[])).await.unwrap();
    let oref = |o: &ConfigMap| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": o.metadata.name, "uid": o.metadata.uid});
    for (name, refs) in [
        ("child", vec![oref(&owner)]),
        ("shared", vec![oref(&owner), oref(&other)]),
        ("orphan", vec![oref(&other)]),
    ] {
        let c: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": refs}}))
                .unwrap();
        cms.create(&pp, &c).await.unwrap();
    }
    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "child collected", || async {
        (code(&cms.get("child").await.err()?) == 404).then_some(())
    })
    .await;
    assert!(
        cms.get("shared").await.is_ok(),
        "a dependent with a remaining owner survives"
    );
    // Foreground: dependents go first, then the owner.
    let fg_owner = cms.create(&pp, &cm("fg-owner", &[])).await.unwrap();
    let c: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "fg-child", "ownerReferences": [oref(&fg_owner)]}}),
    )
    .unwrap();
    cms.create(&pp, &c).await.unwrap();
    cms.delete("fg-owner", &DeleteParams::foreground())
        .await
        .unwrap();
    assert_eq!(code(&cms.get("fg-child").await.unwrap_err()), 404);
    assert_eq!(code(&cms.get("fg-owner").await.unwrap_err()), 404);
    // Orphan propagation keeps dependents and strips the reference.
    cms.delete("other-owner", &DeleteParams::orphan())
        .await
        .unwrap();
    let o = cms.get("orphan").await.expect("orphaned dependent kept");
    assert!(o.metadata.owner_references.unwrap_or_default().is_empty());
    // References set and dropped by later writes count, as at create.
    let late = cms.create(&pp, &cm("late-owner", &[])).await.unwrap();
    let dropped = cms.create(&pp, &cm("dropped-owner", &[])).await.unwrap();
    cms.create(&pp, &cm("late-child", &[])).await.unwrap();
    let c: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "kept", "ownerReferences": [oref(&dropped)]}}),
    )
    .unwrap();
    cms.create(&pp, &c).await.unwrap();
    let refs = |r: Value| Patch::Merge(json!({"metadata": {"ownerReferences": r}}));
    let p = PatchParams::default();
    cms.patch("late-child", &p, &refs(json!([oref(&late)])))
        .await
        .unwrap();
    cms.patch("kept", &p, &refs(Value::Null)).await.unwrap();
    for owner in ["late-owner", "dropped-owner"] {
        cms.delete(owner, &DeleteParams::background())
            .await
            .unwrap();
    }
    eventually(Duration::from_secs(5), "late-child collected", || async {
        (code(&cms.get("late-child").await.err()?) == 404).then_some(())
    })
    .await;
    assert!(
        cms.get("kept").await.is_ok(),
        "a dependent whose reference was dropped survives"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_field_ownership() {
    let (_server, client) = start().await;
    let nodes = install_crd(&client).await;
    let op = PatchParams::apply("tidepool-operator");
    let node_side = PatchParams::apply("tidepool-node");
    let base = |spec: serde_json::Value| json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode", "metadata": {"name": "n1"}, "spec": spec});

    // Apply creates; two managers own different keys of one granular map.
    let a = nodes
        .patch(
            "n1",
            &op,
            &Patch::Apply(base(
                json!({"nodeUID": "u", "release": {"10.0.0.1": "marked-for-release"}}),
            )),
        )
        .await
        .unwrap();
    assert_eq!(a.metadata.generation, Some(1));
    let b = nodes
        .patch(
            "n1",
            &node_side,
            &Patch::Apply(base(json!({"release": {"10.0.0.2": "released"}}))),
        )
        .await
        .unwrap();
    assert_eq!(
        b.data["spec"]["release"],
        json!({"10.0.0.1": "marked-for-release", "10.0.0.2": "released"})
    );
    let mf = b.metadata.managed_fields.clone().unwrap();
    let owner_of = |key: &str| -> Vec<String> {
        mf.iter()
            .filter(|e| {
                e.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.pointer(&format!("/f:spec/f:release/f:{key}")).is_some())
            })
            .map(|e| e.manager.clone().unwrap())
            .collect()
    };
    assert_eq!(owner_of("10.0.0.1"), vec!["tidepool-operator"]);
    assert_eq!(owner_of("10.0.0.2"), vec!["tidepool-node"]);
    assert!(mf.iter().all(|e| e.operation.as_deref() == Some("Apply")));

    // Changing a key owned by another manager conflicts (409 with the field in the causes).
    let err = nodes
        .patch(
            "n1",
            &node_side,
            &Patch::Apply(base(
                json!({"release": {"10.0.0.1": "released", "10.0.0.2": "released"}}),
            )),
        )
        .await
        .unwrap_err();
    let s = status(&err);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(
        s.message.contains("conflict with \"tidepool-operator\""),
        "{}",
        s.message
    );
    assert_eq!(
        s.details.as_ref().unwrap().causes[0].field,
        ".spec.release.10.0.0.1"
    );
    // Applying the same value is shared ownership, not a conflict.
    nodes
        .patch(
            "n1",
            &node_side,
            &Patch::Apply(base(
                json!({"release": {"10.0.0.1": "marked-for-release", "10.0.0.2": "released"}}),
            )),
        )
        .await
        .expect("same value: no conflict");
    // The operator drops its key: it stays because the node side co-owns it.
    let c = nodes
        .patch("n1", &op, &Patch::Apply(base(json!({"nodeUID": "u"}))))
        .await
        .unwrap();
    assert_eq!(c.data["spec"]["release"]["10.0.0.1"], "marked-for-release");
    // The node side drops both: both go, being owned by nobody else.
    let d = nodes
        .patch("n1", &node_side, &Patch::Apply(base(json!({}))))
        .await
        .unwrap();
    assert!(
        d.data["spec"]
            .get("release")
            .is_none_or(|r| r.as_object().unwrap().is_empty()),
        "{:?}",
        d.data["spec"]
    );

    // Force takes ownership.
    nodes
        .patch(
            "n1",
            &op,
            &Patch::Apply(base(
                json!({"nodeUID": "u", "release": {"10.0.0.3": "marked-for-release"}}),
            )),
        )
        .await
        .unwrap();
    let e = nodes
        .patch(
            "n1",
            &node_side.clone().force(),
            &Patch::Apply(base(json!({"release": {"10.0.0.3": "released"}}))),
        )
        .await
        .unwrap();
    assert_eq!(e.data["spec"]["release"]["10.0.0.3"], "released");
    let err = nodes
        .patch(
            "n1",
            &op,
            &Patch::Apply(base(
                json!({"nodeUID": "u", "release": {"10.0.0.3": "marked-for-release"}}),
            )),
        )
        .await
        .unwrap_err();
    assert!(
        status(&err).message.contains("tidepool-node"),
        "ownership moved to the forcing manager"
    );

    // Conditions: a list-type map keyed by type, applied through the status subresource.
    let cond = |t: &str, st: &str| json!({"type": t, "status": st, "reason": "Test"});
    let status_of = |conds: serde_json::Value| json!({"apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode", "metadata": {"name": "n1"}, "status": {"conditions": conds}});
    nodes
        .patch_status(
            "n1",
            &op,
            &Patch::Apply(status_of(json!([cond("Ready", "True")]))),
        )
        .await
        .unwrap();
    let f = nodes
        .patch_status(
            "n1",
            &node_side,
            &Patch::Apply(status_of(json!([cond("NodeSynced", "True")]))),
        )
        .await
        .unwrap();
    let types: Vec<&str> = f.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, vec!["Ready", "NodeSynced"]);
    let entry = f
        .metadata
        .managed_fields
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| {
            e.manager.as_deref() == Some("tidepool-operator")
                && e.subresource.as_deref() == Some("status")
        })
        .expect("operator status entry");
    assert!(
        entry
            .fields_v1
            .as_ref()
            .unwrap()
            .0
            .pointer("/f:status/f:conditions/k:{\"type\":\"Ready\"}/f:status")
            .is_some(),
        "{:?}",
        entry.fields_v1
    );
    let err = nodes
        .patch_status(
            "n1",
            &node_side,
            &Patch::Apply(status_of(json!([
                cond("NodeSynced", "True"),
                cond("Ready", "False")
            ]))),
        )
        .await
        .unwrap_err();
    assert_eq!(
        code(&err),
        409,
        "node side may not flip the operator's condition"
    );
    let g = nodes
        .patch_status("n1", &op, &Patch::Apply(status_of(json!([]))))
        .await
        .unwrap();
    let types: Vec<&str> = g.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        vec!["NodeSynced"],
        "operator's condition removed, node's kept"
    );

    // An update (merge patch) takes ownership without conflicts.
    let h = nodes
        .patch(
            "n1",
            &PatchParams {
                field_manager: Some("admin".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"spec": {"release": {"10.0.0.3": "marked-for-release"}}})),
        )
        .await
        .unwrap();
    let admin = h
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .find(|e| e.manager.as_deref() == Some("admin"))
        .expect("admin entry");
    assert_eq!(admin.operation.as_deref(), Some("Update"));
    nodes
        .patch(
            "n1",
            &op,
            &Patch::Apply(base(
                json!({"nodeUID": "u", "release": {"10.0.0.3": "released"}}),
            )),
        )
        .await
        .expect_err("now conflicts with admin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resume_bookmarks_and_gone() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    cms.create(&pp, &cm("w0", &[])).await.unwrap();
    let list = cms.list(&ListParams::default()).await.unwrap();
    let rv0 = list.metadata.resource_version.clone().unwrap();
    for i in 1..=3 {
        cms.create(&pp, &cm(&format!("w{i}"), &[])).await.unwrap();
    }
    cms.delete("w1", &DeleteParams::default()).await.unwrap();
    // Resume from rv0: exactly the 4 changes since, in order, then bookmarks.
    let mut s = cms
        .watch(&WatchParams::default().timeout(10), &rv0)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    let mut bookmark_rv = None;
    let deadline = Instant::now() + Duration::from_secs(5);
    while bookmark_rv.is_none() && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(2), s.try_next())
            .await
            .expect("event in time")
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(o) => seen.push(format!("A:{}", o.metadata.name.unwrap())),
            WatchEvent::Deleted(o) => seen.push(format!("D:{}", o.metadata.name.unwrap())),
            WatchEvent::Modified(o) => seen.push(format!("M:{}", o.metadata.name.unwrap())),
            WatchEvent::Bookmark(b) => bookmark_rv = Some(b.metadata.resource_version),
            WatchEvent::Error(e) => panic!("unexpected error {e:?}"),
        }
    }
    assert_eq!(seen, vec!["A:w1", "A:w2", "A:w3", "D:w1"]);
    assert_eq!(
        bookmark_rv.expect("bookmark received"),
        server.resource_version().to_string()
    );

    // Label selectors: an object leaving the selector is seen as DELETED.
    let mut sel = cms
        .watch(&WatchParams::default().labels("app=x").timeout(10), "0")
        .await
        .unwrap()
        .boxed();
    cms.patch(
        "w2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "x"}}})),
    )
    .await
    .unwrap();
    cms.patch(
        "w2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "y"}}})),
    )
    .await
    .unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(2), sel.try_next())
            .await
            .expect("event")
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(_) => kinds.push("ADDED"),
            WatchEvent::Deleted(_) => kinds.push("DELETED"),
            WatchEvent::Modified(_) => kinds.push("MODIFIED"),
            _ => {}
        }
    }
    assert_eq!(kinds, vec!["ADDED", "DELETED"]);

    // Beyond the retained window (50 events): 410 Gone as an ERROR event.
    for i in 0..60 {
        cms.patch(
            "w3",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"i": i.to_string()}})),
        )
        .await
        .unwrap();
    }
    let mut old = cms
        .watch(&WatchParams::default().timeout(10), &rv0)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(Duration::from_secs(2), old.try_next())
        .await
        .expect("event")
        .unwrap()
        .unwrap()
    {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert!(
                e.message.starts_with("too old resource version"),
                "{}",
                e.message
            );
        }
        other => panic!("expected 410, got {other:?}"),
    }
    // Server-side timeout: a watch with timeoutSeconds=1 ends by itself.
    let started = Instant::now();
    let mut short = cms
        .watch(
            &WatchParams::default().timeout(1),
            &server.resource_version().to_string(),
        )
        .await
        .unwrap()
        .boxed();
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(5), short.next())
        .await
        .expect("watch ended by server")
    {
        assert!(matches!(ev, Ok(WatchEvent::Bookmark(_))), "{ev:?}");
    }
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "ended after the timeout, not before"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_watch_timeout_follows_min_request_timeout() {
    let server = ApiServer::start_with(Config {
        min_request_timeout: Duration::from_millis(300),
        ..fast_config()
    })
    .await
    .unwrap();
    // kube always sends timeoutSeconds, so watch without it over raw HTTP.
    let started = Instant::now();
    let (c, _, body) = raw(
        &server,
        "GET",
        "/api/v1/namespaces/default/configmaps?watch=true",
        None,
        None,
    )
    .await;
    assert_eq!(c, 200);
    assert!(
        body.contains("\"ADDED\"") || body.is_empty() || body.contains("0\r\n"),
        "{body}"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "ended after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_relists_after_gone_and_reflector_converges() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    for i in 0..5 {
        cms.create(&pp, &cm(&format!("r{i}"), &[])).await.unwrap();
    }
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(cms.clone(), watcher::Config::default().page_size(2)),
    )
    .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    eventually(Duration::from_secs(5), "initial list in store", || async {
        (reader.state().len() == 5).then_some(())
    })
    .await;
    assert!(
        server.request_count("list", "configmaps") >= 3,
        "paged list (page size 2): {:?}",
        server.requests()
    );
    let lists_before = server.request_count("list", "configmaps");

    // Hold the fan-out, write past the window, then cut the watch: the resume gets 410 and
    // the watcher must relist.
    server.pause_watches(true);
    for i in 5..70 {
        cms.create(&pp, &cm(&format!("r{i}"), &[])).await.unwrap();
    }
    cms.delete("r0", &DeleteParams::default()).await.unwrap();
    server.close_watches();
    server.pause_watches(false);
    eventually(
        Duration::from_secs(10),
        "reflector converged after relist",
        || async {
            let names: std::collections::BTreeSet<String> = reader
                .state()
                .iter()
                .map(|o| o.metadata.name.clone().unwrap())
                .collect();
            (names.len() == 69 && !names.contains("r0")).then_some(())
        },
    )
    .await;
    assert!(
        server.request_count("list", "configmaps") > lists_before,
        "relisted after 410"
    );
    // Live events keep flowing afterwards.
    cms.create(&pp, &cm("after", &[])).await.unwrap();
    eventually(
        Duration::from_secs(5),
        "live event after relist",
        || async {
            reader
                .state()
                .iter()
                .any(|o| o.metadata.name.as_deref() == Some("after"))
                .then_some(())
        },
    )
    .await;
    task.abort();
}

/// The server's list log ([`ApiServer::lists`], for the scale bench's "no paginated LIST
/// above 500"): each response's requested limit and resourceVersion, its items and its
/// bytes. A `resourceVersion=0` list is served whole from the watch cache, its limit
/// ignored (kubernetes/apiserver pkg/storage/cacher/cacher.go `computeListLimit`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_logs_each_list_with_its_limit_items_and_bytes() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..7 {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": format!("p{i}")},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let first = pods.list(&ListParams::default().limit(3)).await.unwrap();
    let token = first.metadata.continue_.clone().expect("a continue token");
    pods.list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    let (code, _, body) = raw(
        &server,
        "GET",
        "/api/v1/namespaces/default/pods?limit=3&resourceVersion=0",
        None,
        None,
    )
    .await;
    assert_eq!(code, 200);
    let lists: Vec<_> = server
        .lists()
        .into_iter()
        .filter(|l| l.resource == "pods")
        .collect();
    let seen: Vec<_> = lists
        .iter()
        .map(|l| (l.limit, l.resource_version.as_str(), l.continued, l.items))
        .collect();
    assert_eq!(
        seen,
        [
            (Some(3), "", false, 3),
            (Some(3), "", true, 3),
            (Some(3), "0", false, 7)
        ]
    );
    assert_eq!(lists[2].bytes, body.len() as u64, "the bytes sent");
    assert!(lists[0].bytes < lists[2].bytes);
    assert_eq!(lists[0].identity, "tester");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pagination_and_selectors() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..7 {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": format!("p{i}"), "labels": {"parity": if i % 2 == 0 {"even"} else {"odd"}}},
            "spec": {"nodeName": format!("node-{}", i % 3), "containers": [{"name": "c", "image": "i"}]}})).unwrap();
        let created = pods.create(&PostParams::default(), &p).await.unwrap();
        assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
    }
    let first = pods.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(first.items.len(), 3);
    let token = first.metadata.continue_.clone().expect("continue token");
    assert_eq!(first.metadata.remaining_item_count, Some(4));
    let second = pods
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    let third = pods
        .list(
            &ListParams::default()
                .limit(3)
                .continue_token(second.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert!(third.metadata.continue_.is_none());
    assert_eq!(
        first.items.len() + second.items.len() + third.items.len(),
        7
    );
    assert_eq!(
        second.metadata.resource_version, first.metadata.resource_version,
        "pages come from one snapshot"
    );
    assert_eq!(
        pods.list(&ListParams::default().labels("parity=even"))
            .await
            .unwrap()
            .items
            .len(),
        4
    );
    assert_eq!(
        pods.list(&ListParams::default().labels("parity in (odd),parity!=even"))
            .await
            .unwrap()
            .items
            .len(),
        3
    );
    assert_eq!(
        pods.list(&ListParams::default().fields("spec.nodeName=node-1"))
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    assert_eq!(
        pods.list(&ListParams::default().fields("metadata.name=p3"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let err = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "nocontainers"}, "spec": {"containers": []}}),
            )
            .unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422);
    // Graceful deletion of a pod bound to a node: terminating first, then removed by the
    // simulated kubelet; watchers see MODIFIED (deletionTimestamp) then DELETED.
    let mut w = pods
        .watch(
            &WatchParams::default()
                .fields("metadata.name=p1")
                .timeout(10),
            &pods
                .get("p1")
                .await
                .unwrap()
                .metadata
                .resource_version
                .unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let gone = pods
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("pod returned");
    assert!(gone.metadata.deletion_timestamp.is_some());
    assert_eq!(gone.metadata.deletion_grace_period_seconds, Some(30));
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout(Duration::from_secs(5), w.try_next())
            .await
            .expect("event")
            .unwrap()
            .unwrap()
        {
            WatchEvent::Modified(p) => seen.push(format!(
                "MODIFIED:{}",
                p.metadata.deletion_timestamp.is_some()
            )),
            WatchEvent::Deleted(_) => seen.push("DELETED".to_string()),
            _ => {}
        }
    }
    assert_eq!(seen, vec!["MODIFIED:true", "DELETED"]);
    // Grace 0 deletes at once.
    pods.delete("p2", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert_eq!(code(&pods.get("p2").await.unwrap_err()), 404);
    // Namespace deletion removes its content.
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "scratch"}})).unwrap(),
    )
    .await
    .unwrap();
    let scratch: Api<ConfigMap> = Api::namespaced(client.clone(), "scratch");
    scratch
        .create(&PostParams::default(), &cm("x", &[]))
        .await
        .unwrap();
    let terminating = nss
        .delete("scratch", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("namespace returned");
    assert_eq!(
        terminating.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    let err = scratch
        .create(&PostParams::default(), &cm("y", &[]))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 403, "no new content in a terminating namespace");
    eventually(
        Duration::from_secs(5),
        "namespace and content removed",
        || async { (code(&nss.get("scratch").await.err()?) == 404).then_some(()) },
    )
    .await;
    assert_eq!(code(&scratch.get("x").await.unwrap_err()), 404);
}

/// kube-apiserver counts request bodies by resource and verb
/// (`apiserver_request_body_size_bytes`) and the watch events it sends
/// (`apiserver_watch_events_sizes`): so does this server, the bytes as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_body_and_watch_event_bytes_are_counted() {
    let (server, _client) = start().await;
    let token = Some(server.token("tester"));
    let body =
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"sized"},"data":{"k":"v"}}"#;
    let path = "/api/v1/namespaces/default/configmaps";
    let (c, _, _) = raw(&server, "POST", path, token.clone(), Some(body)).await;
    assert_eq!(c, 201);
    let sent = server.request_bytes();
    assert_eq!(
        sent.get(&("create".into(), "configmaps".into())),
        Some(&(body.len() as u64))
    );
    let before = server.watch_bytes("configmaps", "tester");
    let watch = format!("{path}?watch=true&resourceVersion=0&timeoutSeconds=1");
    let (c, headers, chunked) = raw(&server, "GET", &watch, token, None).await;
    assert_eq!(c, 200);
    assert!(
        headers.contains(&("transfer-encoding".into(), "chunked".into())),
        "{headers:?}"
    );
    // the data bytes of the chunked body: each chunk's size line, then its bytes
    let (mut rest, mut data) = (chunked.as_str(), String::new());
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
        if n == 0 {
            break;
        }
        data.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    assert!(
        data.contains("\"ADDED\"") && data.contains("\"sized\""),
        "{data}"
    );
    assert_eq!(
        server.watch_bytes("configmaps", "tester") - before,
        data.len() as u64
    );
    assert_eq!(server.watch_bytes("configmaps", "someone-else"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_and_request_counters() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("f", &[]))
        .await
        .unwrap();
    server.reset_counters();

    // Every request answered 500.
    server.set_faults(Faults {
        error_rate: 1.0,
        error_code: 500,
        ..Faults::default()
    });
    let err = cms.get("f").await.unwrap_err();
    assert_eq!(
        (status(&err).code, status(&err).reason.as_str()),
        (500, "InternalError")
    );
    // 429 with Retry-After, seen raw.
    server.set_faults(Faults {
        error_rate: 1.0,
        error_code: 429,
        retry_after_secs: 7,
        ..Faults::default()
    });
    let (c, headers, body) = raw(
        &server,
        "GET",
        "/api/v1/namespaces/default/configmaps/f",
        Some(server.token("tester")),
        None,
    )
    .await;
    assert_eq!(c, 429);
    assert!(
        headers.contains(&("retry-after".into(), "7".into())),
        "{headers:?}"
    );
    assert!(body.contains("\"retryAfterSeconds\":7"), "{body}");
    // kube retries 429s by default: lift the fault once a retry was seen and the call succeeds.
    server.set_faults(Faults {
        error_rate: 1.0,
        error_code: 429,
        retry_after_secs: 1,
        ..Faults::default()
    });
    let before = server.request_count("get", "configmaps");
    let _t = Instant::now();
    let pending = tokio::spawn({
        let cms = cms.clone();
        async move { cms.get("f").await }
    });
    eventually(Duration::from_secs(5), "a retried request", || async {
        (server.request_count("get", "configmaps") >= before + 2).then_some(())
    })
    .await;
    server.set_faults(Faults::default());
    pending
        .await
        .unwrap()
        .expect("succeeds after the fault is lifted");
    // Only some verbs.
    server.set_faults(Faults {
        error_rate: 1.0,
        error_verbs: ["list".to_string()].into(),
        ..Faults::default()
    });
    assert!(cms.get("f").await.is_ok());
    assert_eq!(
        code(&cms.list(&ListParams::default()).await.unwrap_err()),
        500
    );
    server.set_faults(Faults::default());

    // Added latency.
    server.set_faults(Faults {
        latency: Duration::from_millis(300),
        ..Faults::default()
    });
    let t = Instant::now();
    cms.get("f").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));
    server.set_faults(Faults::default());

    // One identity refused entirely; its watch is cut, the other client is unaffected.
    let other = server.client("replica-b").await.unwrap();
    let other_cms: Api<ConfigMap> = Api::namespaced(other, "default");
    let mut w = other_cms
        .watch(&WatchParams::default().timeout(30), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        w.try_next().await.unwrap(),
        Some(WatchEvent::Added(_))
    ));
    server.update_faults(|f| {
        f.refused.insert("replica-b".into());
    });
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match w.next().await {
                None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "refused identity's watch closed");
    let err = other_cms.get("f").await.unwrap_err();
    assert_eq!(
        code(&err),
        0,
        "no answer at all for a refused identity: {err:?}"
    );
    assert!(cms.get("f").await.is_ok());
    server.set_faults(Faults::default());
    assert!(
        other_cms.get("f").await.is_ok(),
        "back once the refusal is lifted"
    );

    // Watches closed early.
    server.set_faults(Faults {
        watch_max: Some(Duration::from_millis(200)),
        ..Faults::default()
    });
    let mut w = cms
        .watch(&WatchParams::default().timeout(30), "0")
        .await
        .unwrap()
        .boxed();
    let t = Instant::now();
    while tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("closed early")
        .is_some()
    {}
    assert!(t.elapsed() < Duration::from_secs(3));
    server.set_faults(Faults::default());

    // Paused fan-out: events are held, then delivered in order.
    let mut w = cms
        .watch(
            &WatchParams::default().timeout(30),
            &server.resource_version().to_string(),
        )
        .await
        .unwrap()
        .boxed();
    server.pause_watches(true);
    cms.create(&PostParams::default(), &cm("held", &[]))
        .await
        .unwrap();
    let early = tokio::time::timeout(Duration::from_millis(300), async {
        loop {
            if let Some(Ok(WatchEvent::Added(_))) = w.next().await {
                return;
            }
        }
    })
    .await;
    assert!(early.is_err(), "no event while paused");
    server.pause_watches(false);
    let got = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(Ok(WatchEvent::Added(o))) = w.next().await {
                return o.metadata.name;
            }
        }
    })
    .await
    .expect("delivered after resume");
    assert_eq!(got.as_deref(), Some("held"));

    // Counters per verb and resource.
    let counts = server.requests();
    assert!(
        counts
            .get(&("create".into(), "configmaps".into()))
            .copied()
            .unwrap_or(0)
            >= 1,
        "{counts:?}"
    );
    assert!(server.request_count("watch", "configmaps") >= 3);
    assert_eq!(
        server.request_count("list", "configmaps"),
        1,
        "the one list answered 500 is counted"
    );
}

/// A client for `identity` without kube's retry layer, so each call is one request.
async fn client_without_retries(server: &ApiServer, identity: &str) -> kube::Client {
    let mut cfg = server.kube_config(identity).await.unwrap();
    cfg.default_retry = false;
    kube::Client::try_from(cfg).unwrap()
}

fn lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }))
    .unwrap()
}

/// A targeted fault hits one identity's requests on one resource and verb, nothing else:
/// replica a's Lease updates fail (or are slow) while its Lease reads, its other writes and
/// replica b's Lease updates go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targeted_faults_hit_one_identity_resource_and_verb() {
    let server = ApiServer::start_with(fast_config()).await.unwrap();
    let a = client_without_retries(&server, "a").await;
    let b = client_without_retries(&server, "b").await;
    let (la, lb): (Api<Lease>, Api<Lease>) = (
        Api::namespaced(a.clone(), "default"),
        Api::namespaced(b.clone(), "default"),
    );
    let cms: Api<ConfigMap> = Api::namespaced(a.clone(), "default");
    la.create(&PostParams::default(), &lease("l", "a"))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &cm("c", &[]))
        .await
        .unwrap();
    server.set_faults(Faults {
        targeted: vec![TargetedFault {
            identity: "a".into(),
            resource: "leases.coordination.k8s.io".into(),
            verbs: ["update".to_string()].into(),
            error_code: Some(503),
            ..TargetedFault::default()
        }],
        ..Faults::default()
    });
    let mut l = la.get("l").await.expect("a's reads pass");
    l.spec.as_mut().unwrap().holder_identity = Some("a2".into());
    let e = la
        .replace("l", &PostParams::default(), &l)
        .await
        .unwrap_err();
    assert_eq!(
        (code(&e), status(&e).reason.as_str()),
        (503, "ServiceUnavailable")
    );
    cms.replace("c", &PostParams::default(), &cm("c", &[("k", "v")]))
        .await
        .expect("a's other writes pass");
    l.spec.as_mut().unwrap().holder_identity = Some("b".into());
    lb.replace("l", &PostParams::default(), &l)
        .await
        .expect("b's Lease writes pass");

    // latency alone: served late
    server.set_faults(Faults {
        targeted: vec![TargetedFault {
            identity: "a".into(),
            resource: "leases.coordination.k8s.io".into(),
            latency: Duration::from_millis(400),
            ..TargetedFault::default()
        }],
        ..Faults::default()
    });
    let t = Instant::now();
    let got = la.get("l").await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(got.spec.unwrap().holder_identity.as_deref(), Some("b"));
    let t = Instant::now();
    lb.get("l").await.unwrap();
    cms.get("c").await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
}

/// The server's log of accepted writes: each stored write with its time, writer, verb,
/// object and new resourceVersion, in order; refused writes and dry runs are not in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_writes_are_logged_with_time_and_writer() {
    let server = ApiServer::start_with(fast_config()).await.unwrap();
    let start = Instant::now();
    let a: Api<Lease> = Api::namespaced(client_without_retries(&server, "a").await, "default");
    let b: Api<Lease> = Api::namespaced(client_without_retries(&server, "b").await, "default");
    let created = a
        .create(&PostParams::default(), &lease("l", "a"))
        .await
        .unwrap();
    // a stale write (409) and a dry run are not accepted writes
    let mut stale = created.clone();
    stale.metadata.resource_version = Some("1".into());
    assert_eq!(
        code(
            &b.replace("l", &PostParams::default(), &stale)
                .await
                .unwrap_err()
        ),
        409
    );
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    b.replace("l", &dry, &created).await.unwrap();
    let updated = b
        .replace("l", &PostParams::default(), &created)
        .await
        .unwrap();
    b.delete("l", &DeleteParams::default()).await.unwrap();
    let log = server.accepted_writes();
    let seen: Vec<(&str, &str, &str)> = log
        .iter()
        .map(|w| (w.identity.as_str(), w.verb.as_str(), w.name.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("a", "create", "l"),
            ("b", "update", "l"),
            ("b", "delete", "l")
        ]
    );
    assert!(
        log.iter()
            .all(|w| w.resource == "leases.coordination.k8s.io"
                && w.namespace.as_deref() == Some("default"))
    );
    assert_eq!(
        log[0].resource_version,
        created.metadata.resource_version.unwrap()
    );
    assert_eq!(
        log[1].resource_version,
        updated.metadata.resource_version.unwrap()
    );
    assert!(log[0].at >= start && log.windows(2).all(|w| w[0].at <= w[1].at));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_manager_leader_election_and_partition() {
    let server = ApiServer::start_with(fast_config()).await.unwrap();
    let a = server.client("replica-a").await.unwrap();
    let b = server.client("replica-b").await.unwrap();
    let mk = |c: kube::Client, id: &str| {
        kube_lease_manager::LeaseManagerBuilder::new(c, "tidepool-leader")
            .with_identity(id)
            .with_duration(2)
            .with_grace(1)
            .build()
    };
    let ma = mk(a, "replica-a").await.expect("manager a");
    let (rx_a, task_a) = ma.watch().await;
    eventually(Duration::from_secs(10), "a leads", || async {
        (*rx_a.borrow()).then_some(())
    })
    .await;
    let mb = mk(b, "replica-b").await.expect("manager b");
    let (rx_b, task_b) = mb.watch().await;
    let leases: Api<Lease> = Api::namespaced(server.client("observer").await.unwrap(), "default");
    let lease = leases.get("tidepool-leader").await.unwrap();
    assert_eq!(
        lease.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("replica-a")
    );
    assert!(!*rx_b.borrow(), "b does not lead while a holds the lease");
    assert!(
        server.request_count("apply", "leases.coordination.k8s.io") >= 1,
        "{:?}",
        server.requests()
    );

    // Cut replica-a off: its lease expires and b takes over.
    server.update_faults(|f| {
        f.refused.insert("replica-a".into());
    });
    eventually(Duration::from_secs(15), "b takes over", || async {
        (*rx_b.borrow()).then_some(())
    })
    .await;
    let lease = leases.get("tidepool-leader").await.unwrap();
    assert_eq!(
        lease.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("replica-b")
    );
    assert!(lease.spec.unwrap().lease_transitions.unwrap_or(0) >= 1);
    drop(rx_a);
    drop(rx_b);
    task_a.abort();
    let _ = tokio::time::timeout(Duration::from_secs(5), task_b).await;
}

/// Patch throughput with 4 watchers receiving every event. Run with
/// `cargo test -p tidepool-tests --test kube_client -- --ignored --nocapture patch_throughput`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn patch_throughput_with_four_watchers() {
    let (server, client) = start().await;
    patch_throughput(&server, &client).await;
}

/// The same with RBAC deciding every request (the patching identity is a service account
/// granted by one of 20 RoleBindings; the others bind other subjects) and one
/// ValidatingAdmissionPolicy checking every ConfigMap update in CEL.
/// `cargo test -p tidepool-tests --test kube_client -- --ignored --nocapture patch_throughput`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn patch_throughput_with_four_watchers_rbac_and_a_policy() {
    let server = ApiServer::start_with(tidepool_tests::Config {
        rbac: true,
        ..fast_config()
    })
    .await
    .unwrap();
    let admin = server.client(tidepool_tests::ADMIN).await.unwrap();
    let roles: Api<Role> = Api::namespaced(admin.clone(), "default");
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), "default");
    for i in 0..20 {
        let role = serde_json::from_value(json!({"metadata": {"name": format!("r{i}")},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                       "verbs": ["get", "list", "watch", "create", "patch"]}]}))
        .unwrap();
        roles.create(&PostParams::default(), &role).await.unwrap();
        let subject = if i == 19 {
            "writer".to_string()
        } else {
            format!("other-{i}")
        };
        let binding = serde_json::from_value(json!({"metadata": {"name": format!("b{i}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": format!("r{i}")},
            "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": "default"}]}))
        .unwrap();
        bindings
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "small-data"},
        "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""],
            "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["configmaps"]}]},
            "validations": [{"expression": "!has(object.data) || size(object.data) < 10"}]}});
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "small-data"},
        "spec": {"policyName": "small-data", "validationActions": ["Deny"]}});
    for (plural, obj) in [
        ("validatingadmissionpolicies", policy),
        ("validatingadmissionpolicybindings", binding),
    ] {
        let ar = kube::api::ApiResource {
            group: "admissionregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "admissionregistration.k8s.io/v1".into(),
            kind: obj["kind"].as_str().unwrap().into(),
            plural: plural.into(),
        };
        Api::<kube::api::DynamicObject>::all_with(admin.clone(), &ar)
            .create(&PostParams::default(), &dynamic(obj))
            .await
            .unwrap();
    }
    let client = server
        .client("system:serviceaccount:default:writer")
        .await
        .unwrap();
    patch_throughput(&server, &client).await;
}

async fn patch_throughput(server: &ApiServer, client: &kube::Client) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    const OBJECTS: usize = 16;
    const PATCHES: usize = 5000;
    for i in 0..OBJECTS {
        cms.create(&PostParams::default(), &cm(&format!("b{i}"), &[]))
            .await
            .unwrap();
    }
    let start_rv = server.resource_version().to_string();
    let mut watchers = Vec::new();
    for _ in 0..4 {
        let cms = cms.clone();
        let rv = start_rv.clone();
        let mut s = cms
            .watch(&WatchParams::default().timeout(120), &rv)
            .await
            .unwrap()
            .boxed();
        watchers.push(tokio::spawn(async move {
            let mut n = 0;
            while n < PATCHES {
                if let Some(Ok(WatchEvent::Modified(_))) = s.next().await {
                    n += 1;
                }
            }
            n
        }));
    }
    let t = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let cms = cms.clone();
        tasks.push(tokio::spawn(async move {
            for j in 0..PATCHES / 8 {
                let name = format!("b{}", (w * 7 + j) % OBJECTS);
                cms.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"data": {"n": j.to_string()}})),
                )
                .await
                .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let patched = t.elapsed();
    for w in watchers {
        assert_eq!(w.await.unwrap(), PATCHES);
    }
    let all = t.elapsed();
    println!(
        "patch throughput: {PATCHES} patches in {:.2}s = {:.0} patches/s (all 4 watchers had every event after {:.2}s = {:.0}/s)",
        patched.as_secs_f64(),
        PATCHES as f64 / patched.as_secs_f64(),
        all.as_secs_f64(),
        PATCHES as f64 / all.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_recorder_and_builtin_decoding() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};

    let (_server, client) = start().await;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "tidepool-operator".into(),
            instance: Some("replica-a".into()),
        },
    );
    let reference = ObjectReference {
        kind: Some("ConfigMap".into()),
        name: Some("cfg".into()),
        namespace: Some("default".into()),
        api_version: Some("v1".into()),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Warning,
        reason: "PoolExhausted".into(),
        note: Some("no free block".into()),
        action: "Allocate".into(),
        secondary: None,
    };
    recorder
        .publish(&ev, &reference)
        .await
        .expect("event created");
    recorder
        .publish(&ev, &reference)
        .await
        .expect("event series patched");
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let e = &list.items[0];
    assert_eq!(e.reason.as_deref(), Some("PoolExhausted"));
    assert_eq!(e.series.as_ref().map(|s| s.count), Some(2));
    // events.k8s.io validation: required fields and limits, reported under the core Event's
    // field names (kubernetes/kubernetes pkg/apis/core/validation/events.go validates the
    // internal type: the note is `message`).
    let bad: K8sEvent = serde_json::from_value(json!({"metadata": {"name": "bad"}, "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "c", "reportingInstance": "i", "action": "A", "reason": "R", "type": "Weird", "note": "x".repeat(2000)})).unwrap();
    let err = events
        .create(&PostParams::default(), &bad)
        .await
        .unwrap_err();
    let fields: Vec<String> = status(&err)
        .details
        .as_ref()
        .unwrap()
        .causes
        .iter()
        .map(|c| c.field.clone())
        .collect();
    assert_eq!(
        (code(&err), fields),
        (422, vec!["message".to_string(), "type".to_string()])
    );

    // Built-in kinds are decoded as typed objects: wrong types are 400, unknown fields are
    // dropped (or refused with strict field validation).
    let deploys: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &kube::api::ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
    );
    let deploy = |spec: serde_json::Value| {
        dynamic(
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": spec}),
        )
    };
    let base = json!({"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}});
    let mut wrong = base.clone();
    wrong["replicas"] = json!("two");
    let err = deploys
        .create(&PostParams::default(), &deploy(wrong))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 400, "{err:?}");
    let mut unknown = base.clone();
    unknown["replicaz"] = json!(2);
    let created = deploys
        .create(&PostParams::default(), &deploy(unknown.clone()))
        .await
        .unwrap();
    assert!(
        created.data["spec"].get("replicaz").is_none(),
        "unknown field dropped"
    );
    let err = deploys
        .patch("d", &PatchParams::default().validation_strict(), &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i", "imagePullPolizy": "Always"}]}}}})))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 400);
    assert!(
        status(&err)
            .message
            .contains("unknown field \"spec.template.spec.containers[0].imagePullPolizy\""),
        "{}",
        status(&err).message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_watcher_dry_run_and_delete_collection() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..4 {
        let mut c = cm(&format!("s{i}"), &[]);
        c.metadata.labels = Some(BTreeMap::from([("batch".to_string(), (i % 2).to_string())]));
        cms.create(&PostParams::default(), &c).await.unwrap();
    }
    server.reset_counters();
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(cms.clone(), watcher::Config::default().streaming_lists()),
    )
    .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    eventually(
        Duration::from_secs(5),
        "streaming list filled the store",
        || async { (reader.state().len() == 4).then_some(()) },
    )
    .await;
    assert_eq!(
        server.request_count("list", "configmaps"),
        0,
        "initial state came from the watch: {:?}",
        server.requests()
    );
    assert!(server.request_count("watch", "configmaps") >= 1);

    // Dry run: answered, not stored.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let d = cms
        .create(&dry, &cm("dry", &[]))
        .await
        .expect("dry-run create");
    assert_eq!(d.metadata.name.as_deref(), Some("dry"));
    assert_eq!(code(&cms.get("dry").await.unwrap_err()), 404);
    cms.delete("s0", &DeleteParams::default().dry_run())
        .await
        .unwrap();
    assert!(cms.get("s0").await.is_ok());

    // deletecollection with a label selector; the reflector sees the deletions.
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("batch=1"),
    )
    .await
    .unwrap();
    let left: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(left, vec!["s0", "s2"]);
    eventually(
        Duration::from_secs(5),
        "reflector saw the deletions",
        || async { (reader.state().len() == 2).then_some(()) },
    )
    .await;
    task.abort();

    // SSA with a stale resourceVersion in the configuration is a conflict.
    let err = cms
        .patch("s0", &PatchParams::apply("m"), &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s0", "resourceVersion": "1"}, "data": {"a": "b"}})))
        .await
        .unwrap_err();
    assert_eq!(
        (code(&err), status(&err).reason.as_str()),
        (409, "Conflict")
    );
    let err = cms
        .patch(
            "s0",
            &PatchParams::default(),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s0"}}),
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422, "apply needs a field manager");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_field_selectors_and_size_limits_are_enforced() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // An IPv6 address is not a valid label value (a real bug a lenient fake would miss).
    let mut c = cm("l", &[]);
    c.metadata.labels = Some(BTreeMap::from([(
        "tidepool.dev/address".to_string(),
        "fd00::1".to_string(),
    )]));
    let err = cms.create(&PostParams::default(), &c).await.unwrap_err();
    assert_eq!(code(&err), 422);
    assert_eq!(
        status(&err).details.as_ref().unwrap().causes[0].field,
        "metadata.labels"
    );
    c.metadata.labels = Some(BTreeMap::from([(
        "tidepool.dev/address".to_string(),
        "10.0.0.1".to_string(),
    )]));
    cms.create(&PostParams::default(), &c)
        .await
        .expect("IPv4 is a valid label value");
    // Field selectors the real server does not support are refused.
    let err = cms
        .list(&ListParams::default().fields("data.x=1"))
        .await
        .unwrap_err();
    assert_eq!(
        (code(&err), status(&err).message.as_str()),
        (400, "field label not supported: data.x")
    );
    let pods: Api<Pod> = Api::all(client.clone());
    pods.list(&ListParams::default().fields("spec.nodeName=n1,status.phase!=Succeeded"))
        .await
        .expect("supported pod field labels");
    // Objects beyond etcd's size limit are refused.
    let big = "x".repeat(1_600_000);
    let err = cms
        .create(&PostParams::default(), &cm("big", &[("k", big.as_str())]))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 413);
    let huge = "x".repeat(3_200_000);
    let err = cms
        .create(&PostParams::default(), &cm("huge", &[("k", huge.as_str())]))
        .await
        .unwrap_err();
    assert_eq!(
        (code(&err), status(&err).message.as_str()),
        (413, "Request entity too large: limit is 3145728")
    );
    assert!(cms.get("l").await.is_ok(), "the client keeps working");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_finalizer_helper_round_trip() {
    use kube::runtime::controller::Action;
    use kube::runtime::finalizer::{Event as Fin, finalizer};
    use std::sync::Arc;

    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("fz", &[]))
        .await
        .unwrap();
    let run = |obj: ConfigMap| {
        let cms = cms.clone();
        async move {
            finalizer(
                &cms,
                "tidepool.dev/cleanup",
                Arc::new(obj),
                |ev| async move {
                    Ok::<_, std::io::Error>(match ev {
                        Fin::Apply(_) => Action::requeue(Duration::from_secs(1)),
                        Fin::Cleanup(_) => Action::await_change(),
                    })
                },
            )
            .await
        }
    };
    // First pass adds the finalizer (JSON patch with a `test` against a missing path).
    run(cms.get("fz").await.unwrap())
        .await
        .expect("finalizer added");
    let obj = cms.get("fz").await.unwrap();
    assert_eq!(
        obj.metadata.finalizers.as_deref(),
        Some(&["tidepool.dev/cleanup".to_string()][..])
    );
    assert_eq!(
        run(obj).await.expect("apply"),
        Action::requeue(Duration::from_secs(1))
    );
    cms.delete("fz", &DeleteParams::default()).await.unwrap();
    let terminating = cms.get("fz").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    run(terminating)
        .await
        .expect("cleanup removes the finalizer");
    assert_eq!(code(&cms.get("fz").await.unwrap_err()), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_version_crd_serves_every_version() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{ApiResource, DynamicObject};
    let (_server, client) = start().await;
    let schema = json!({"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}});
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
    "metadata": {"name": "widgets.example.dev"},
    "spec": {"group": "example.dev", "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {"name": "v1", "served": true, "storage": true, "schema": schema},
            {"name": "v2", "served": true, "storage": false, "schema": schema},
        ]}}))
    .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let ar = |v: &str| ApiResource {
        group: "example.dev".into(),
        version: v.into(),
        api_version: format!("example.dev/{v}"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let v1: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar("v1"));
    let v2: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar("v2"));
    let list_rv = v2
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut w = v2
        .watch(&WatchParams::default().timeout(10), &list_rv)
        .await
        .unwrap()
        .boxed();
    v1.create(&PostParams::default(), &dynamic(json!({"apiVersion": "example.dev/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 3}}))).await.unwrap();
    let got = v2.get("w").await.unwrap();
    assert_eq!(got.types.unwrap().api_version, "example.dev/v2");
    assert_eq!(got.data["spec"]["size"], 3);
    match tokio::time::timeout(Duration::from_secs(5), w.try_next())
        .await
        .expect("event")
        .unwrap()
        .unwrap()
    {
        WatchEvent::Added(o) => assert_eq!(o.types.unwrap().api_version, "example.dev/v2"),
        other => panic!("{other:?}"),
    }
    // Written through v2, stored once: v1 sees the change.
    v2.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": 4}})),
    )
    .await
    .unwrap();
    assert_eq!(v1.get("w").await.unwrap().data["spec"]["size"], 4);
    let crd = crds.get("widgets.example.dev").await.unwrap();
    assert_eq!(
        crd.status.unwrap().stored_versions,
        Some(vec!["v1".to_string()])
    );
}
