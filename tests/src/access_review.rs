//! Self reviews. `authorization.k8s.io/v1`, which `kubectl auth can-i` asks: a
//! SelfSubjectAccessReview answers whether the caller may do one thing, a
//! SelfSubjectRulesReview lists what the caller may do in a namespace. Both are decided by the
//! RBAC objects whether or not RBAC enforcement is on (the answer is what RBAC would say).
//! `authentication.k8s.io/v1` SelfSubjectReview, which `kubectl auth whoami` asks, answers who
//! the caller is: its user name, groups and extra (kubernetes/kubernetes
//! `pkg/registry/authentication/selfsubjectreview/rest.go` `Create`). Every authenticated
//! user may ask them (the bootstrap `system:basic-user` role).

use serde_json::{Value, json};

use crate::error::Error;
use crate::identity::UserInfo;
use crate::rbac::{Attributes, Policy};
use crate::server::State;

pub(crate) const GROUP: &str = "authorization.k8s.io";
pub(crate) const AUTHN_GROUP: &str = "authentication.k8s.io";
pub(crate) const SELF_REVIEW: &str = "selfsubjectreviews";
const ACCESS: &str = "selfsubjectaccessreviews";
const RULES: &str = "selfsubjectrulesreviews";

/// Whether `plural` is one of the reviews served here.
pub(crate) fn serves(plural: &str) -> bool {
    plural == ACCESS || plural == RULES
}

/// Answers a review: the request object with its `status` filled in.
pub(crate) fn review(
    st: &State,
    user: &UserInfo,
    plural: &str,
    body: &[u8],
    ctype: &str,
) -> Result<Value, Error> {
    let mut obj = crate::media::builtin_body(body, ctype)?;
    let policy = st.policy.current(&st.store);
    let status = if plural == ACCESS {
        access(&policy, user, &obj["spec"])?
    } else {
        let ns = obj["spec"]["namespace"].as_str().unwrap_or_default();
        policy.rules_review(user, ns)
    };
    obj["status"] = status;
    obj["metadata"]["creationTimestamp"] = Value::Null;
    Ok(obj)
}

/// Answers a SelfSubjectReview: the caller's user info, `uid` absent (our users have none).
pub(crate) fn self_review(user: &UserInfo, body: &[u8], ctype: &str) -> Result<Value, Error> {
    crate::media::builtin_body(body, ctype)?;
    let mut info = json!({"username": user.name});
    if !user.groups.is_empty() {
        info["groups"] = json!(user.groups);
    }
    if !user.extra.is_empty() {
        info["extra"] = json!(user.extra);
    }
    Ok(json!({
        "kind": "SelfSubjectReview", "apiVersion": format!("{AUTHN_GROUP}/v1"),
        "metadata": {"creationTimestamp": crate::store::now()},
        "status": {"userInfo": info},
    }))
}

fn access(policy: &Policy, user: &UserInfo, spec: &Value) -> Result<Value, Error> {
    let res = spec.get("resourceAttributes").filter(|v| v.is_object());
    let non = spec.get("nonResourceAttributes").filter(|v| v.is_object());
    let Some(ra) = res.filter(|_| non.is_none()) else {
        if non.is_some() && res.is_none() {
            // The bootstrap policy lets everybody read the non-resource paths served here.
            return Ok(json!({"allowed": true}));
        }
        return Err(Error::invalid(
            GROUP,
            "SelfSubjectAccessReview",
            "",
            vec![(
                "spec.resourceAttributes".into(),
                "Invalid value: \"null\": exactly one of nonResourceAttributes or \
                 resourceAttributes must be specified"
                    .into(),
            )],
        ));
    };
    let s = |k: &str| ra[k].as_str().unwrap_or_default();
    let attrs = Attributes {
        verb: s("verb"),
        group: s("group"),
        resource: s("resource"),
        subresource: s("subresource"),
        namespace: s("namespace"),
        name: s("name"),
    };
    Ok(match policy.authorize(user, &attrs) {
        Ok(()) => json!({"allowed": true}),
        Err(reason) if reason.is_empty() => json!({"allowed": false}),
        Err(reason) => json!({"allowed": false, "reason": reason}),
    })
}
