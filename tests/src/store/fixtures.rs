//! What the store's unit tests share: a store, its types, bodies and options.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{DeleteOpts, Store, WriteOpts};
use crate::registry::ResType;

/// A store (CustomResourceFieldSelectors on) keeping `window` events per resource.
pub(super) fn store_with_window(window: usize) -> Store {
    Store::new(window, true)
}

pub(super) fn store() -> Store {
    store_with_window(100)
}

/// A core v1 type by its plural.
pub(super) fn type_of(store: &Store, plural: &str) -> Arc<ResType> {
    store.resolve("", "v1", plural).expect("a core v1 type")
}

/// Writes by the manager `test`.
pub(super) fn writes() -> WriteOpts {
    writes_by("test")
}

pub(super) fn writes_by(manager: &str) -> WriteOpts {
    WriteOpts {
        manager: manager.into(),
        ..WriteOpts::default()
    }
}

pub(super) fn deletes() -> DeleteOpts {
    DeleteOpts::default()
}

pub(super) fn configmap(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
        "data": {"k": "v"}})
}

/// The resourceVersion of a stored object, as a number.
pub(super) fn rv_of(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("a numeric resourceVersion")
}

/// A namespaced CRD for `widgets.example.com` (v1, `spec.replicas` an integer).
pub(super) fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}}
                }}}
            }]
        }
    })
}

pub(super) fn widget(name: &str) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name},
        "spec": {"replicas": 1}})
}

pub(super) fn crd_type(store: &Store) -> Arc<ResType> {
    store
        .resolve("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        .expect("the CRD type")
}

/// Creates the widgets CRD and returns the Widget type it registers.
pub(super) fn install_widgets(store: &Store) -> Arc<ResType> {
    store
        .create(&crd_type(store), "", widget_crd(), &writes())
        .expect("the CRD is created");
    store
        .resolve("example.com", "v1", "widgets")
        .expect("the CRD's kind is registered")
}
