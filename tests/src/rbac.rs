//! RBAC authorization, decided as the real server's RBAC authorizer decides
//! (`plugin/pkg/auth/authorizer/rbac`): the rules of every ClusterRoleBinding whose subjects
//! match the user apply everywhere; those of RoleBindings apply in their own namespace only.
//! A rule matches on verb, API group, resource (`resource/subresource`, `*`, `*/subresource`)
//! and, when it lists any, resource names. Members of `system:masters` are not checked.
//!
//! What the real server's bootstrap policy grants every user is granted here without objects:
//! non-resource paths (discovery, `/version`, health) and creating self access reviews
//! (`system:discovery`, `system:public-info-viewer`, `system:basic-user`). Aggregated
//! ClusterRoles are not supported.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::error::Error;
use crate::identity::UserInfo;
use crate::store::Store;

/// What a resource request asks to do (the authorizer's attributes).
#[derive(Debug, Clone)]
pub(crate) struct Attributes<'a> {
    /// RBAC verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    /// Empty: cluster scope (or all namespaces).
    pub namespace: &'a str,
    /// Empty: no name (create, list, watch, deletecollection without a name selector).
    pub name: &'a str,
}

impl Attributes<'_> {
    fn combined_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    /// The refusal the real server sends (`forbiddenMessage` + `NewForbidden`).
    pub fn forbidden(&self, user: &UserInfo, reason: &str) -> Error {
        let scope = if self.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {:?}", self.namespace)
        };
        let mut why = format!(
            "User {:?} cannot {} resource {:?} in API group {:?} {scope}",
            user.name,
            self.verb,
            self.combined_resource(),
            self.group
        );
        if !reason.is_empty() {
            why = format!("{why}: {reason}");
        }
        Error::forbidden(self.group, self.resource, self.name, &why)
    }
}

/// The RBAC objects of the store, decoded once per decision.
pub(crate) struct Policy {
    cluster_roles: HashMap<String, Vec<PolicyRule>>,
    roles: HashMap<(String, String), Vec<PolicyRule>>,
    cluster_bindings: Vec<ClusterRoleBinding>,
    bindings: Vec<RoleBinding>,
}

fn decode<T: serde::de::DeserializeOwned>(objects: Vec<Arc<Value>>) -> Vec<T> {
    // The store only holds objects that decoded through these types on the way in.
    objects
        .into_iter()
        .filter_map(|o| serde_json::from_value((*o).clone()).ok())
        .collect()
}

const GROUP: &str = "rbac.authorization.k8s.io";

const KINDS: [&str; 4] = [
    "clusterroles",
    "roles",
    "clusterrolebindings",
    "rolebindings",
];

/// The policy decoded at the last write to any RBAC kind (decoding on every request halved
/// the server's patch rate).
#[derive(Default)]
pub(crate) struct PolicyCache(Mutex<Option<([u64; 4], Arc<Policy>)>>);

impl PolicyCache {
    pub fn current(&self, store: &Store) -> Arc<Policy> {
        let versions = KINDS.map(|k| store.last_write(&format!("{k}.{GROUP}")));
        let mut cached = self.0.lock();
        match &*cached {
            Some((v, policy)) if *v == versions => policy.clone(),
            _ => {
                let policy = Arc::new(Policy::load(store));
                *cached = Some((versions, policy.clone()));
                policy
            }
        }
    }
}

impl Policy {
    fn load(store: &Store) -> Policy {
        let of = |plural: &str| store.objects_of(&format!("{plural}.{GROUP}"));
        let cluster_roles = decode::<ClusterRole>(of("clusterroles"))
            .into_iter()
            .map(|r| {
                (
                    r.metadata.name.unwrap_or_default(),
                    r.rules.unwrap_or_default(),
                )
            })
            .collect();
        let roles = decode::<Role>(of("roles"))
            .into_iter()
            .map(|r| {
                let key = (
                    r.metadata.namespace.unwrap_or_default(),
                    r.metadata.name.unwrap_or_default(),
                );
                (key, r.rules.unwrap_or_default())
            })
            .collect();
        Policy {
            cluster_roles,
            roles,
            cluster_bindings: decode(of("clusterrolebindings")),
            bindings: decode(of("rolebindings")),
        }
    }

    /// `Ok` when a rule allows the request, else the reason to append to the refusal
    /// (`RBAC: …` naming roles that bindings refer to but that do not exist; usually empty).
    pub fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), String> {
        if user.is_master() {
            return Ok(());
        }
        let mut missing = Vec::new();
        let allowed = self
            .rules_for(user, attrs.namespace, &mut missing)
            .any(|rule| rule_allows(rule, attrs));
        if allowed {
            return Ok(());
        }
        Err(match missing.as_slice() {
            [] => String::new(),
            [one] => format!("RBAC: {one}"),
            many => format!("RBAC: [{}]", many.join(", ")),
        })
    }

    /// Every rule that applies to `user` in `namespace` (empty: cluster-wide rules only), in
    /// the real visitor's order; roles that bindings name but that are missing go to `missing`.
    fn rules_for<'a>(
        &'a self,
        user: &'a UserInfo,
        namespace: &'a str,
        missing: &mut Vec<String>,
    ) -> impl Iterator<Item = &'a PolicyRule> {
        let mut found: Vec<&'a [PolicyRule]> = Vec::new();
        for b in &self.cluster_bindings {
            if applies(b.subjects.as_deref(), user, "") {
                found.extend(self.role(&b.role_ref, "", missing));
            }
        }
        if !namespace.is_empty() {
            for b in &self.bindings {
                let ns = b.metadata.namespace.as_deref().unwrap_or_default();
                if ns == namespace && applies(b.subjects.as_deref(), user, ns) {
                    found.extend(self.role(&b.role_ref, ns, missing));
                }
            }
        }
        found.into_iter().flatten()
    }

    fn role(
        &self,
        r: &RoleRef,
        namespace: &str,
        missing: &mut Vec<String>,
    ) -> Option<&[PolicyRule]> {
        let rules = match r.kind.as_str() {
            "ClusterRole" => self.cluster_roles.get(&r.name),
            "Role" => self.roles.get(&(namespace.to_string(), r.name.clone())),
            _ => None,
        };
        if rules.is_none() {
            missing.push(format!(
                "{}.{GROUP} {:?} not found",
                r.kind.to_lowercase(),
                r.name
            ));
        }
        rules.map(Vec::as_slice)
    }

    /// The rules `user` has in `namespace`, for a SelfSubjectRulesReview: the bootstrap
    /// policy's (module docs) and those of the bindings.
    pub fn rules_review(&self, user: &UserInfo, namespace: &str) -> Value {
        let mut resource_rules = vec![json!({
            "verbs": ["create"],
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
        })];
        if user.is_master() {
            resource_rules.push(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
        }
        for rule in self.rules_for(user, namespace, &mut Vec::new()) {
            if rule.non_resource_urls.as_ref().is_none_or(Vec::is_empty) {
                let mut r = json!({
                    "verbs": rule.verbs,
                    "apiGroups": rule.api_groups.clone().unwrap_or_default(),
                    "resources": rule.resources.clone().unwrap_or_default(),
                });
                if let Some(names) = rule.resource_names.as_ref().filter(|n| !n.is_empty()) {
                    r["resourceNames"] = json!(names);
                }
                resource_rules.push(r);
            }
        }
        json!({
            "resourceRules": resource_rules,
            "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": [
                "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                "/openapi/*", "/readyz", "/version", "/version/"]}],
            "incomplete": false,
        })
    }
}

/// Whether a binding's subjects include `user` (`appliesTo`; a ServiceAccount subject
/// without a namespace means the binding's own).
fn applies(subjects: Option<&[Subject]>, user: &UserInfo, binding_ns: &str) -> bool {
    subjects
        .unwrap_or_default()
        .iter()
        .any(|s| match s.kind.as_str() {
            "User" => s.name == user.name,
            "Group" => user.groups.contains(&s.name),
            "ServiceAccount" => {
                let ns = s
                    .namespace
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(binding_ns);
                !ns.is_empty() && user.service_account() == Some((ns, s.name.as_str()))
            }
            _ => false,
        })
}

fn rule_allows(rule: &PolicyRule, a: &Attributes) -> bool {
    let has = |list: &Option<Vec<String>>, v: &str| {
        list.as_deref()
            .unwrap_or_default()
            .iter()
            .any(|x| x == "*" || x == v)
    };
    rule.verbs.iter().any(|v| v == "*" || v == a.verb)
        && has(&rule.api_groups, a.group)
        && resource_matches(rule.resources.as_deref().unwrap_or_default(), a)
        && rule
            .resource_names
            .as_deref()
            .is_none_or(|names| names.is_empty() || names.iter().any(|n| n == a.name))
}

/// `ResourceMatches`: `*`, the exact `resource[/subresource]`, or `*/subresource`.
fn resource_matches(resources: &[String], a: &Attributes) -> bool {
    let combined = a.combined_resource();
    resources.iter().any(|r| {
        r == "*"
            || *r == combined
            || (!a.subresource.is_empty() && r.strip_prefix("*/") == Some(a.subresource))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> PolicyRule {
        let v = |s: &[&str]| Some(s.iter().map(|x| x.to_string()).collect::<Vec<_>>());
        PolicyRule {
            verbs: verbs.iter().map(|x| x.to_string()).collect(),
            api_groups: v(groups),
            resources: v(resources),
            resource_names: if names.is_empty() { None } else { v(names) },
            non_resource_urls: None,
        }
    }

    fn attrs<'a>(verb: &'a str, resource: &'a str, sub: &'a str, name: &'a str) -> Attributes<'a> {
        Attributes {
            verb,
            group: "tidepool.io",
            resource,
            subresource: sub,
            namespace: "",
            name,
        }
    }

    #[test]
    fn rules_match_verbs_groups_resources_subresources_and_names() {
        let status = rule(&["patch"], &["tidepool.io"], &["ipamnodes/status"], &[]);
        assert!(rule_allows(
            &status,
            &attrs("patch", "ipamnodes", "status", "n")
        ));
        assert!(!rule_allows(&status, &attrs("patch", "ipamnodes", "", "n")));
        assert!(!rule_allows(
            &status,
            &attrs("update", "ipamnodes", "status", "n")
        ));

        let main = rule(&["get", "patch"], &["tidepool.io"], &["ipamnodes"], &[]);
        assert!(!rule_allows(
            &main,
            &attrs("patch", "ipamnodes", "status", "n")
        ));
        assert!(!rule_allows(&main, &attrs("get", "ipamblocks", "", "n")));
        let mut other_group = attrs("get", "ipamnodes", "", "n");
        other_group.group = "";
        assert!(!rule_allows(&main, &other_group));

        let any_status = rule(&["*"], &["*"], &["*/status"], &[]);
        assert!(rule_allows(
            &any_status,
            &attrs("update", "pods", "status", "p")
        ));
        assert!(!rule_allows(&any_status, &attrs("update", "pods", "", "p")));

        let named = rule(
            &["get", "watch"],
            &["tidepool.io"],
            &["ipamnodes"],
            &["node-a"],
        );
        assert!(rule_allows(
            &named,
            &attrs("get", "ipamnodes", "", "node-a")
        ));
        assert!(!rule_allows(
            &named,
            &attrs("get", "ipamnodes", "", "node-b")
        ));
        assert!(!rule_allows(&named, &attrs("watch", "ipamnodes", "", "")));
    }

    #[test]
    fn refusals_are_worded_as_the_real_server_words_them() {
        let user = UserInfo::from_identity("system:serviceaccount:tidepool:agent", |_| None);
        let e = attrs("patch", "ipamnodes", "status", "node-b").forbidden(&user, "");
        assert_eq!(
            e.to_string(),
            "403 Forbidden: ipamnodes.tidepool.io \"node-b\" is forbidden: User \
             \"system:serviceaccount:tidepool:agent\" cannot patch resource \"ipamnodes/status\" \
             in API group \"tidepool.io\" at the cluster scope"
        );
        let mut pods = attrs("list", "pods", "", "");
        pods.group = "";
        pods.namespace = "kube-system";
        assert_eq!(
            pods.forbidden(
                &user,
                "RBAC: role.rbac.authorization.k8s.io \"x\" not found"
            )
            .to_string(),
            "403 Forbidden: pods is forbidden: User \"system:serviceaccount:tidepool:agent\" \
             cannot list resource \"pods\" in API group \"\" in the namespace \"kube-system\": \
             RBAC: role.rbac.authorization.k8s.io \"x\" not found"
        );
    }
}
