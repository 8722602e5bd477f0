//! The crate's one error type. API errors carry everything needed to render a Kubernetes
//! `Status` body; the other variants are failures of the server itself (binding, I/O).

use serde_json::{Value, json};

/// Errors of the in-process API server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error answered to the client as a `Status` object.
    #[error("{code} {reason}: {message}")]
    Api {
        /// HTTP status code.
        code: u16,
        /// Kubernetes `StatusReason` (e.g. `NotFound`, `Conflict`).
        reason: &'static str,
        /// Human-readable message, as the real server words it.
        message: String,
        /// `details` of the Status (name, group, kind, causes, retryAfterSeconds).
        details: Option<Value>,
    },
    /// A continue token whose snapshot expired (its etcd revision compacted): 410
    /// `Expired` with kubernetes/apiserver's `inconsistentContinue` message and, in the
    /// Status's `metadata.continue`, this token to go on from the latest state.
    #[error("410 Expired: {}", crate::paging::INCONSISTENT_CONTINUE)]
    ContinueExpired(String),
    /// I/O error (binding the listener, writing a kubeconfig).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// JSON (de)serialisation error outside of request handling.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// Making the server's TLS certificate or configuration failed.
    #[error("tls: {0}")]
    Tls(String),
    /// Building a kube client configuration failed.
    #[error("kube config: {0}")]
    KubeConfig(String),
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Resource identity used in messages: `pods`, `leases.coordination.k8s.io`.
pub(crate) fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn details(group: &str, plural: &str, name: &str) -> Value {
    let mut d = json!({ "name": name, "kind": plural });
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

impl Error {
    pub(crate) fn api(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Error::Api {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub(crate) fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Error::Api {
            code: 404,
            reason: "NotFound",
            message: format!("{} \"{name}\" not found", qualified(group, plural)),
            details: Some(details(group, plural, name)),
        }
    }

    pub(crate) fn not_found_path() -> Self {
        Error::api(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub(crate) fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Error::Api {
            code: 409,
            reason: "AlreadyExists",
            message: format!("{} \"{name}\" already exists", qualified(group, plural)),
            details: Some(details(group, plural, name)),
        }
    }

    pub(crate) fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Error::Api {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
            details: Some(details(group, plural, name)),
        }
    }

    pub(crate) fn stale(group: &str, plural: &str, name: &str) -> Self {
        Error::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with one cause per `(field, message)`; `kind` is the object's kind.
    pub(crate) fn invalid(
        group: &str,
        kind: &str,
        name: &str,
        causes: Vec<(String, String)>,
    ) -> Self {
        let qkind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let list: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let msg = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut d = json!({
            "name": name,
            "kind": kind,
            "causes": causes.iter().map(|(f, m)| json!({
                "reason": if m.starts_with("Required value") { "FieldValueRequired" }
                    else if m.starts_with("Unsupported value") { "FieldValueNotSupported" }
                    else if m.starts_with("Forbidden") { "FieldValueForbidden" }
                    else if m.starts_with("Duplicate value") { "FieldValueDuplicate" }
                    else { "FieldValueInvalid" },
                "message": m, "field": f })).collect::<Vec<_>>(),
        });
        if !group.is_empty() {
            d["group"] = json!(group);
        }
        Error::Api {
            code: 422,
            reason: "Invalid",
            message: format!("{qkind} \"{name}\" is invalid: {msg}"),
            details: Some(d),
        }
    }

    /// 403 as `NewForbidden` words it: `{resource} "{name}" is forbidden: {why}` (no name part
    /// when `name` is empty).
    pub(crate) fn forbidden(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let q = qualified(group, plural);
        let message = if name.is_empty() {
            format!("{q} is forbidden: {why}")
        } else {
            format!("{q} \"{name}\" is forbidden: {why}")
        };
        let mut d = details(group, plural, name);
        if name.is_empty()
            && let Some(m) = d.as_object_mut()
        {
            m.remove("name");
        }
        Error::Api {
            code: 403,
            reason: "Forbidden",
            message,
            details: Some(d),
        }
    }

    /// 415 listing the media types the endpoint accepts.
    pub(crate) fn unsupported_media_type(accepted: &[&str]) -> Self {
        Error::api(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    /// Appends a `details.causes` entry (`reason` is the cause type).
    pub(crate) fn with_cause(mut self, reason: &str, message: &str, field: &str) -> Self {
        if let Error::Api {
            details: Some(d), ..
        } = &mut self
        {
            let cause = json!({"reason": reason, "message": message, "field": field});
            match d.get_mut("causes").and_then(Value::as_array_mut) {
                Some(a) => a.push(cause),
                None => d["causes"] = json!([cause]),
            }
        }
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Error::api(400, "BadRequest", message)
    }

    pub(crate) fn gone(message: impl Into<String>) -> Self {
        Error::api(410, "Expired", message)
    }

    pub(crate) fn method_not_allowed() -> Self {
        Error::api(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Error::api(500, "InternalError", message)
    }

    pub(crate) fn too_many_requests(retry_after: u64) -> Self {
        Error::Api {
            code: 429,
            reason: "TooManyRequests",
            message:
                "the server has received too many requests and has asked us to try again later"
                    .into(),
            details: Some(json!({ "retryAfterSeconds": retry_after })),
        }
    }

    /// HTTP status code this error is answered with.
    pub fn code(&self) -> u16 {
        match self {
            Error::Api { code, .. } => *code,
            Error::ContinueExpired(_) => 410,
            _ => 500,
        }
    }

    /// The `Status` object the server sends for this error.
    pub fn status(&self) -> Value {
        let (code, reason, message, details) = match self {
            Error::Api {
                code,
                reason,
                message,
                details,
            } => (*code, *reason, message.clone(), details.clone()),
            Error::ContinueExpired(token) => {
                let mut s = Error::gone(crate::paging::INCONSISTENT_CONTINUE).status();
                s["metadata"]["continue"] = json!(token);
                return s;
            }
            other => (500, "InternalError", other.to_string(), None),
        };
        let mut s = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code,
        });
        if let Some(d) = details {
            s["details"] = d;
        }
        s
    }
}
