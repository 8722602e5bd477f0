//! The NamespaceLifecycle admission plugin: immortal namespaces and no new content in
//! terminating namespaces, refused with the plugin's words.

use crate::error::Error;
use crate::registry::ResType;

/// Namespaces the real server never deletes.
const IMMORTAL_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

fn is_namespace(rt: &ResType) -> bool {
    rt.group.is_empty() && rt.kind == "Namespace"
}

/// Refuses deleting an immortal namespace (403, before the object is looked up).
pub(crate) fn check_delete(rt: &ResType, name: &str) -> Result<(), Error> {
    if is_namespace(rt) && IMMORTAL_NAMESPACES.contains(&name) {
        return Err(Error::forbidden(
            &rt.group,
            &rt.plural,
            name,
            "this namespace may not be deleted",
        ));
    }
    Ok(())
}

/// The refusal of a create of `name` (possibly empty) in the terminating namespace `ns`.
pub(crate) fn terminating(rt: &ResType, name: &str, ns: &str) -> Error {
    Error::forbidden(
        &rt.group,
        &rt.plural,
        name,
        &format!("unable to create new content in namespace {ns} because it is being terminated"),
    )
    .with_cause(
        "NamespaceTerminating",
        &format!("namespace {ns} is being terminated"),
        "metadata.namespace",
    )
}
