//! The API server's answers as the engine's errors and retry classes.

use std::time::Duration;

use tidepool_ipam::{ErrorClass, IpamError, ResourceVersion};

/// Maps a failed request on `name` to the engine's error. `expected`: the resourceVersion
/// a precondition named (a 409 on it is a lost race, not a field-manager conflict).
pub fn store_error(
    op: &'static str,
    name: &str,
    expected: Option<&ResourceVersion>,
    e: kube::Error,
) -> IpamError {
    let kube::Error::Api(s) = e else {
        // connection refused, timeouts, TLS, decoding: try again after the backoff
        return store(op, name, ErrorClass::Transient, e.to_string());
    };
    match (s.code, s.reason.as_str()) {
        (404, _) => IpamError::NotFound { name: name.into() },
        (409, "AlreadyExists") => IpamError::AlreadyExists { name: name.into() },
        // server-side apply: another field manager owns a field we set. The operator
        // forces its applies, so none should remain; one that does is reported, and not
        // retried until the object changes (retrying the same apply would loop)
        (409, _) if manager_conflict(&s) => store(
            op,
            name,
            ErrorClass::Permanent,
            format!("{MANAGER_CONFLICT}: {}", s.message),
        ),
        // a lost race, or an apply whose uid names an object that is gone ("uid mismatch")
        // or was replaced (422 below): the engine re-reads and re-plans
        (code, _) if code == 409 || (code == 422 && uid_refused(&s)) => IpamError::Conflict {
            name: name.into(),
            expected: expected
                .cloned()
                .unwrap_or_else(|| ResourceVersion::server("")),
        },
        (429, _) => {
            let after = s.details.as_ref().map(|d| d.retry_after_seconds);
            let retry_after = after
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(s.into()));
            store(op, name, ErrorClass::Throttled { retry_after }, s.message)
        }
        (400 | 422, _) => store(op, name, ErrorClass::Permanent, s.message),
        // 5xx, and 401/403 a person may fix while we back off
        _ => store(
            op,
            name,
            ErrorClass::Transient,
            format!("{} {}", s.code, s.message),
        ),
    }
}

const MANAGER_CONFLICT: &str = "field-manager conflict";

/// The error of an apply that another field manager's ownership refused.
pub fn is_manager_conflict(e: &IpamError) -> bool {
    matches!(e, IpamError::Store { message, .. } if message.starts_with(MANAGER_CONFLICT))
}

/// A 422 for a `metadata.uid` that is not the object's: the object was replaced.
fn uid_refused(s: &kube::core::Status) -> bool {
    s.details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
}

fn manager_conflict(s: &kube::core::Status) -> bool {
    s.details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.reason == "FieldManagerConflict"))
}

fn store(op: &'static str, name: &str, class: ErrorClass, message: String) -> IpamError {
    IpamError::Store {
        op,
        name: name.into(),
        class,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Status::failure("m", reason).with_code(code).boxed())
    }

    #[test]
    fn answers_map_to_the_engines_classes() {
        let rv = ResourceVersion::server("5");
        assert!(matches!(
            store_error("get", "n", None, api(404, "NotFound")),
            IpamError::NotFound { .. }
        ));
        assert!(matches!(
            store_error("create", "b", None, api(409, "AlreadyExists")),
            IpamError::AlreadyExists { .. }
        ));
        assert_eq!(
            store_error("delete", "b", Some(&rv), api(409, "Conflict")),
            IpamError::Conflict {
                name: "b".into(),
                expected: rv
            }
        );
        let mut s = Status::failure("Apply failed with 1 conflict", "Conflict").with_code(409);
        s.details = Some(
            serde_json::from_value(serde_json::json!({
                "causes": [{"reason": "FieldManagerConflict", "message": "conflict with \"x\"", "field": ".spec.nodeUID"}]
            }))
            .expect("StatusDetails"),
        );
        let e = store_error("apply", "n", None, kube::Error::Api(s.boxed()));
        assert!(e.to_string().contains("field-manager conflict"), "{e}");
        assert!(is_manager_conflict(&e));
        assert_eq!(
            e.class(),
            ErrorClass::Permanent,
            "reported, never looped on"
        );
        // an apply whose uid names a replaced object: re-read, not Permanent
        let mut s = Status::failure("metadata.uid: field is immutable", "Invalid").with_code(422);
        s.details = Some(
            serde_json::from_value(serde_json::json!({
                "causes": [{"reason": "FieldValueInvalid", "message": "field is immutable", "field": "metadata.uid"}]
            }))
            .expect("StatusDetails"),
        );
        assert!(matches!(
            store_error("apply", "n", None, kube::Error::Api(s.boxed())),
            IpamError::Conflict { .. }
        ));
        // a 409 without such a cause is a lost race, whatever the request
        assert!(matches!(
            store_error("apply", "n", None, api(409, "Conflict")),
            IpamError::Conflict { .. }
        ));
        assert_eq!(
            store_error("apply", "n", None, api(422, "Invalid")).class(),
            ErrorClass::Permanent
        );
        assert_eq!(
            store_error("apply", "n", None, api(503, "ServiceUnavailable")).class(),
            ErrorClass::Transient
        );
    }

    #[test]
    fn a_429_carries_its_retry_after() {
        let mut s = Status::failure("slow down", "TooManyRequests").with_code(429);
        s.details = Some(
            serde_json::from_value(serde_json::json!({ "retryAfterSeconds": 3 }))
                .expect("StatusDetails"),
        );
        let e = store_error("apply", "n", None, kube::Error::Api(s.boxed()));
        assert_eq!(
            e.class(),
            ErrorClass::Throttled {
                retry_after: Some(Duration::from_secs(3))
            }
        );
    }
}
