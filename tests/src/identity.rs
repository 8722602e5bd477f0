//! Who a request comes from: the user, groups and extra fields an authenticator gives the real
//! server, minted here from an identity string (one bearer token per string).
//!
//! - `system:serviceaccount:NS:NAME` is a service account, in the groups
//!   `system:serviceaccounts`, `system:serviceaccounts:NS` and `system:authenticated`, as a
//!   service-account token authenticates.
//! - `admin` is in `system:masters`, which every authorizer of the real server lets through.
//! - Any other name is a plain user in `system:authenticated`.
//! - A suffix `@NODE` binds the identity to a node, as a service-account token bound to a pod
//!   on that node does on Kubernetes ≥ 1.30: its requests carry the extra
//!   `authentication.kubernetes.io/node-name` and, when the Node exists when the token is
//!   minted, `authentication.kubernetes.io/node-uid`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The identity whose requests pass every authorization check.
pub const ADMIN: &str = "admin";
/// The group that bypasses authorization on the real server.
pub const MASTERS: &str = "system:masters";
/// The extra key naming the node a bound token's pod runs on.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// The extra key holding that node's UID.
pub const NODE_UID_EXTRA: &str = "authentication.kubernetes.io/node-uid";

const SA_PREFIX: &str = "system:serviceaccount:";

/// An authenticated (or anonymous) user, as the authorizers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// The user of requests without credentials.
    pub fn anonymous() -> Self {
        UserInfo {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }

    /// The user an identity string names (module docs); `node_uid` finds a node's UID.
    pub fn from_identity(identity: &str, node_uid: impl Fn(&str) -> Option<String>) -> Self {
        let (name, node) = match identity.rsplit_once('@') {
            Some((name, node)) if !node.is_empty() => (name, Some(node)),
            _ => (identity, None),
        };
        let mut groups = Vec::new();
        if name == ADMIN {
            groups.push(MASTERS.to_string());
        } else if let Some((ns, _)) = name
            .strip_prefix(SA_PREFIX)
            .and_then(|rest| rest.split_once(':'))
        {
            groups.push("system:serviceaccounts".to_string());
            groups.push(format!("system:serviceaccounts:{ns}"));
        }
        groups.push("system:authenticated".to_string());
        let mut extra = BTreeMap::new();
        if let Some(node) = node {
            extra.insert(NODE_NAME_EXTRA.to_string(), vec![node.to_string()]);
            if let Some(uid) = node_uid(node) {
                extra.insert(NODE_UID_EXTRA.to_string(), vec![uid]);
            }
        }
        UserInfo {
            name: name.to_string(),
            groups,
            extra,
        }
    }

    /// Whether authorization is skipped for this user.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    /// `(namespace, name)` when the user is a service account.
    pub fn service_account(&self) -> Option<(&str, &str)> {
        self.name.strip_prefix(SA_PREFIX)?.split_once(':')
    }

    /// The `userInfo` of admission requests and access reviews.
    pub fn to_json(&self) -> Value {
        let mut v = json!({"username": self.name, "groups": self.groups});
        if !self.extra.is_empty() {
            v["extra"] = json!(self.extra);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_carry_the_groups_and_extras_of_their_kind() {
        let sa = UserInfo::from_identity("system:serviceaccount:tidepool:agent@node-a", |n| {
            (n == "node-a").then(|| "uid-a".to_string())
        });
        assert_eq!(sa.name, "system:serviceaccount:tidepool:agent");
        assert_eq!(
            sa.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:tidepool",
                "system:authenticated"
            ]
        );
        assert_eq!(sa.extra[NODE_NAME_EXTRA], ["node-a"]);
        assert_eq!(sa.extra[NODE_UID_EXTRA], ["uid-a"]);
        assert_eq!(sa.service_account(), Some(("tidepool", "agent")));
        assert!(!sa.is_master());

        let unbound =
            UserInfo::from_identity("system:serviceaccount:tidepool:agent@node-b", |_| None);
        assert_eq!(unbound.extra[NODE_NAME_EXTRA], ["node-b"]);
        assert!(!unbound.extra.contains_key(NODE_UID_EXTRA));

        let admin = UserInfo::from_identity(ADMIN, |_| None);
        assert!(admin.is_master());
        let user = UserInfo::from_identity("replica-a", |_| None);
        assert_eq!(user.groups, ["system:authenticated"]);
        assert!(user.extra.is_empty() && !user.is_master());
        assert_eq!(user.service_account(), None);
    }
}
