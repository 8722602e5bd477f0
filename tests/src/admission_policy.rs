//! ValidatingAdmissionPolicy (`admissionregistration.k8s.io/v1`): every write that a policy's
//! `matchConstraints` and a binding's `matchResources` select is checked by the policy's CEL
//! validations over `object`, `oldObject`, `request`, `namespaceObject`, `variables` and, with
//! a `paramKind`, `params` (once per param the binding's `paramRef` finds:
//! [`crate::admission_params`]), as the real server's validating admission plugin does, and
//! refused in its words: `{resource} "{name}" is forbidden: ValidatingAdmissionPolicy
//! '{policy}' with binding '{binding}' denied request: {message}` (422 Invalid unless the
//! validation names another reason).
//!
//! CEL is evaluated as `cel_expr` says. What it cannot evaluate is refused when the policy is
//! written, never passed silently: functions beyond [`crate::cel_expr::FUNCTIONS`],
//! [`crate::cel_expr::STRINGS`] and the IP and CIDR library, the
//! `authorizer` variable, and namespace or object selectors.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cel::Context;
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::admission_params::{self, ConfigError, Objects, ParamKind, ParamRef};
use crate::cel_expr::{Expr, to_cel};
use crate::error::Error;
use crate::identity::UserInfo;
use crate::registry::ResType;
use crate::store::Store;

const GROUP: &str = "admissionregistration.k8s.io";
const POLICY: &str = "ValidatingAdmissionPolicy";
const BINDING: &str = "ValidatingAdmissionPolicyBinding";

/// The variables every policy's expressions may read; `params` too with a `paramKind`.
const VARIABLES: [&str; 5] = [
    "object",
    "oldObject",
    "request",
    "namespaceObject",
    "variables",
];

/// A variable of the real server's that this one does not evaluate (its library of
/// authorization checks); refused when a policy reads it.
const NOT_EVALUATED: &str = "authorizer";

struct Validation {
    expr: Expr,
    message: Option<String>,
    message_expr: Option<Expr>,
    /// Status reason of a refusal: Invalid (default, 422), Forbidden (403), Unauthorized
    /// (401), RequestEntityTooLarge (413).
    reason: String,
}

/// `resourceRules` or `excludeResourceRules`.
#[derive(Default)]
struct Rule {
    groups: Vec<String>,
    versions: Vec<String>,
    operations: Vec<String>,
    resources: Vec<String>,
    names: Vec<String>,
    scope: String,
}

#[derive(Default)]
struct Matcher {
    rules: Vec<Rule>,
    exclude: Vec<Rule>,
}

/// A policy as one of its bindings applies it.
struct Bound {
    policy: String,
    binding: String,
    constraints: Matcher,
    /// The binding's `matchResources`, when it has one.
    narrowed: Option<Matcher>,
    conditions: Vec<(String, Expr)>,
    variables: Vec<(String, Expr)>,
    validations: Vec<Validation>,
    param_kind: Option<ParamKind>,
    param_ref: Option<ParamRef>,
    fail_open: bool,
    deny: bool,
    warn: bool,
}

/// Every binding of every policy, compiled, and the CEL environment to run them in (built
/// once: making the standard library's environment per request cost a third of the patch
/// rate).
pub(crate) struct Policies {
    bound: Vec<Bound>,
    env: Arc<cel::Env>,
}

/// The admission attributes of one write.
pub(crate) struct Request<'a> {
    pub operation: &'a str,
    pub rt: &'a ResType,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub user: &'a UserInfo,
    pub dry_run: bool,
}

impl Request<'_> {
    fn to_json(&self) -> Value {
        let rt = self.rt;
        let kind = json!({"group": rt.group, "version": rt.version, "kind": rt.kind});
        let resource = json!({"group": rt.group, "version": rt.version, "resource": rt.plural});
        // An unset map reads as empty in CEL, as the real server's typed request does.
        let mut user = self.user.to_json();
        user["extra"] = user.get("extra").cloned().unwrap_or_else(|| json!({}));
        json!({
            "kind": kind, "resource": resource, "subResource": self.subresource,
            "requestKind": kind, "requestResource": resource,
            "requestSubResource": self.subresource,
            "name": self.name, "namespace": self.namespace, "operation": self.operation,
            "userInfo": user, "dryRun": self.dry_run, "options": {},
        })
    }
}

/// What decides the writes of one request: the policies and the user making it.
#[derive(Clone)]
pub(crate) struct Admission {
    pub policies: Arc<Policies>,
    pub user: Arc<UserInfo>,
}

impl Admission {
    /// Checks one write (`object` absent on DELETE, `old` absent on CREATE), reading params
    /// and the namespace from `objects`; returns the warnings of `Warn` bindings, or the
    /// refusal of the first `Deny` binding that fails.
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &self,
        operation: &str,
        rt: &ResType,
        subresource: &str,
        namespace: &str,
        name: &str,
        object: Option<&Value>,
        old: Option<&Value>,
        dry_run: bool,
        objects: &dyn Objects,
    ) -> Result<Vec<String>, Error> {
        if self.policies.bound.is_empty() {
            return Ok(Vec::new());
        }
        let req = Request {
            operation,
            rt,
            subresource,
            namespace,
            name,
            user: &self.user,
            dry_run,
        };
        self.policies.admit(&req, object, old, objects)
    }
}

impl Policies {
    /// validating/dispatcher.go `Dispatch`: each selected binding's params collected, the
    /// policy evaluated once per param; a configuration error is a denial unless the policy
    /// fails open.
    fn admit(
        &self,
        req: &Request,
        object: Option<&Value>,
        old: Option<&Value>,
        objects: &dyn Objects,
    ) -> Result<Vec<String>, Error> {
        let mut selected = self.bound.iter().filter(|b| b.selects(req)).peekable();
        if selected.peek().is_none() {
            return Ok(Vec::new());
        }
        let mut warnings = Vec::new();
        let mut ctx = Context::with_env(self.env.clone());
        ctx.add_variable_from_value("object", object.map_or(cel::Value::Null, to_cel));
        ctx.add_variable_from_value("oldObject", old.map_or(cel::Value::Null, to_cel));
        ctx.add_variable_from_value("request", to_cel(&req.to_json()));
        ctx.add_variable_from_value("namespaceObject", to_cel(&namespace_object(req, objects)?));
        for b in selected {
            let params = admission_params::collect(
                b.param_kind.as_ref(),
                b.param_ref.as_ref(),
                req.namespace,
                objects,
            );
            let params = match params {
                Ok(params) => params,
                Err(_) if b.fail_open => continue,
                Err(e) => return Err(refusal(req, "Invalid", &b.config_denial(&e))),
            };
            for param in params {
                let mut scope = ctx.new_inner_scope();
                scope.add_variable_from_value(
                    "params",
                    param.as_deref().map_or(cel::Value::Null, to_cel),
                );
                if let Some(refused) = b.decide(req, &scope, &mut warnings) {
                    return Err(refused);
                }
            }
        }
        Ok(warnings)
    }
}

/// The request namespace's `namespaceObject` (null for a cluster-scoped resource and for a
/// Namespace itself); a namespace that is gone is the lister's NotFound, as upstream returns
/// it.
fn namespace_object(req: &Request, objects: &dyn Objects) -> Result<Value, Error> {
    let is_namespace = req.rt.group.is_empty() && req.rt.kind == "Namespace";
    if req.namespace.is_empty() || is_namespace {
        return Ok(Value::Null);
    }
    let ns = objects
        .namespace(req.namespace)
        .ok_or_else(|| Error::not_found("", "namespaces", req.namespace))?;
    Ok(admission_params::namespace_object(Some(&ns)))
}

/// `admission.NewForbidden` with the validation's reason and code, and the message as a cause.
fn refusal(req: &Request, reason: &str, message: &str) -> Error {
    let e = Error::forbidden(&req.rt.group, &req.rt.plural, req.name, message);
    let Error::Api {
        message: full,
        details,
        ..
    } = e
    else {
        unreachable!("forbidden is an API error")
    };
    let (code, reason) = match reason {
        "Forbidden" => (403, "Forbidden"),
        "Unauthorized" => (401, "Unauthorized"),
        "RequestEntityTooLarge" => (413, "RequestEntityTooLarge"),
        _ => (422, "Invalid"),
    };
    let mut details = details.unwrap_or_else(|| json!({}));
    details["causes"] = json!([{"message": message}]);
    Error::Api {
        code,
        reason,
        message: full,
        details: Some(details),
    }
}

impl Bound {
    fn selects(&self, req: &Request) -> bool {
        self.constraints.matches(req) && self.narrowed.as_ref().is_none_or(|m| m.matches(req))
    }

    /// The denial of a configuration error (dispatcher.go `addConfigError`): without the
    /// binding for the policy's own.
    fn config_denial(&self, e: &ConfigError) -> String {
        let p = &self.policy;
        match e {
            ConfigError::Policy(m) => format!(
                "ValidatingAdmissionPolicy '{p}' denied request: failed to configure policy: {m}"
            ),
            ConfigError::Binding(m) => format!(
                "ValidatingAdmissionPolicy '{p}' with binding '{}' denied request: failed to \
                 configure binding: {m}",
                self.binding
            ),
        }
    }

    /// Evaluates the policy in `ctx` (one param): a `Warn` failure adds to `warnings`, a
    /// `Deny` failure is the refusal.
    fn decide(&self, req: &Request, ctx: &Context, warnings: &mut Vec<String>) -> Option<Error> {
        let (message, reason) = self.failure(ctx)?;
        let (p, b) = (&self.policy, &self.binding);
        if self.warn {
            warnings.push(format!(
                "Validation failed for ValidatingAdmissionPolicy '{p}' with binding '{b}': \
                 {message}"
            ));
        }
        self.deny.then(|| {
            let message = format!(
                "ValidatingAdmissionPolicy '{p}' with binding '{b}' denied request: {message}"
            );
            refusal(req, &reason, &message)
        })
    }

    /// The first failing validation's message and reason; `None` when all pass or the policy
    /// does not apply (a match condition is false). Evaluation errors follow failurePolicy.
    /// A variable may read the ones before it.
    fn failure(&self, ctx: &Context) -> Option<(String, String)> {
        let mut scope = ctx.new_inner_scope();
        for (_, e) in &self.conditions {
            match truth(e, &scope) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(err) => return self.on_error(err),
            }
        }
        let mut vars = HashMap::new();
        scope.add_variable_from_value("variables", vars.clone());
        for (name, e) in &self.variables {
            match e.program.execute(&scope) {
                Ok(v) => vars.insert(name.clone(), v),
                Err(err) => return self.on_error(eval_error(e, &err)),
            };
            scope.add_variable_from_value("variables", vars.clone());
        }
        for v in &self.validations {
            match truth(&v.expr, &scope) {
                Ok(true) => {}
                Ok(false) => return Some((v.message(&scope), v.reason.clone())),
                Err(err) => return self.on_error(err),
            }
        }
        None
    }

    fn on_error(&self, message: String) -> Option<(String, String)> {
        (!self.fail_open).then(|| (message, "Invalid".to_string()))
    }
}

/// An expression's truth, or the error of an evaluation that failed, in the real server's
/// words.
fn truth(e: &Expr, ctx: &Context) -> Result<bool, String> {
    e.truth(ctx).map_err(|err| eval_error(e, &err))
}

fn eval_error(e: &Expr, err: &dyn std::fmt::Display) -> String {
    format!("expression '{}' resulted in error: {err}", e.source)
}

impl Validation {
    fn message(&self, ctx: &Context) -> String {
        if let Some(m) = self.message_expr.as_ref().and_then(|e| e.message(ctx)) {
            return m;
        }
        match &self.message {
            Some(m) if !m.is_empty() => m.clone(),
            _ => format!("failed expression: {}", self.expr.source),
        }
    }
}

impl Matcher {
    fn matches(&self, req: &Request) -> bool {
        self.rules.iter().any(|r| r.matches(req)) && !self.exclude.iter().any(|r| r.matches(req))
    }
}

impl Rule {
    fn matches(&self, req: &Request) -> bool {
        let any = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        let scope_ok = match self.scope.as_str() {
            "Cluster" => !req.rt.namespaced,
            "Namespaced" => req.rt.namespaced,
            _ => true,
        };
        any(&self.groups, &req.rt.group)
            && any(&self.versions, &req.rt.version)
            && any(&self.operations, req.operation)
            && self.resources.iter().any(|r| resource_matches(r, req))
            && (self.names.is_empty() || self.names.iter().any(|n| n == req.name))
            && scope_ok
    }
}

/// `pods` (main resource only), `pods/status`, `pods/*`, `*` (every main resource), `*/status`,
/// `*/*`.
fn resource_matches(rule: &str, req: &Request) -> bool {
    let (res, sub) = rule.split_once('/').unwrap_or((rule, ""));
    (res == "*" || res == req.rt.plural)
        && match sub {
            "" => req.subresource.is_empty(),
            "*" => true,
            s => s == req.subresource,
        }
}

/// Compiled policies, rebuilt when a policy or binding was written since the last build.
#[derive(Default)]
pub(crate) struct PoliciesCache(Mutex<Option<([u64; 2], Arc<Policies>)>>);

impl PoliciesCache {
    pub fn current(&self, store: &Store) -> Arc<Policies> {
        let versions = [
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
        ]
        .map(|k| store.last_write(&format!("{k}.{GROUP}")));
        let mut cached = self.0.lock();
        match &*cached {
            Some((v, p)) if *v == versions => p.clone(),
            _ => {
                let p = Arc::new(load(store));
                *cached = Some((versions, p.clone()));
                p
            }
        }
    }
}

fn load(store: &Store) -> Policies {
    let objects = |plural: &str| store.objects_of(&format!("{plural}.{GROUP}"));
    let policies: BTreeMap<String, Arc<Value>> = objects("validatingadmissionpolicies")
        .into_iter()
        .map(|p| (meta_name(&p).to_string(), p))
        .collect();
    let mut bound = Vec::new();
    for b in objects("validatingadmissionpolicybindings") {
        let spec = &b["spec"];
        let Some(policy) = spec["policyName"].as_str().and_then(|n| policies.get(n)) else {
            continue; // a binding of a policy that does not exist does nothing
        };
        // Written policies passed `check_object`, so they compile.
        if let Ok(p) = compile_bound(policy, &b) {
            bound.push(p);
        }
    }
    Policies {
        bound,
        env: crate::cel_expr::env(),
    }
}

fn meta_name(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or_default()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The items of a list field with their compiled `key` expression, which may read
/// `variables`; failures go to `causes`.
fn exprs<'a>(
    list: &'a Value,
    field: &str,
    key: &str,
    variables: &[&str],
    causes: &mut Vec<(String, String)>,
) -> Vec<(&'a Value, Expr)> {
    let mut out = Vec::new();
    for (i, item) in list.as_array().into_iter().flatten().enumerate() {
        let path = format!("spec.{field}[{i}].{key}");
        match compile(item[key].as_str().unwrap_or_default(), &path, variables) {
            Ok(e) => out.push((item, e)),
            Err(c) => causes.push(c),
        }
    }
    out
}

fn compile_bound(policy: &Value, binding: &Value) -> Result<Bound, Vec<(String, String)>> {
    let spec = &policy["spec"];
    let param_kind = ParamKind::of(spec);
    let mut vars = VARIABLES.to_vec();
    if param_kind.is_some() {
        vars.push("params");
    }
    let mut causes = Vec::new();
    let conditions = exprs(
        &spec["matchConditions"],
        "matchConditions",
        "expression",
        &vars,
        &mut causes,
    )
    .into_iter()
    .map(|(item, e)| (item["name"].as_str().unwrap_or_default().to_string(), e))
    .collect();
    let variables = exprs(
        &spec["variables"],
        "variables",
        "expression",
        &vars,
        &mut causes,
    )
    .into_iter()
    .map(|(item, e)| (item["name"].as_str().unwrap_or_default().to_string(), e))
    .collect();
    let mut validations = Vec::new();
    for (i, (item, expr)) in exprs(
        &spec["validations"],
        "validations",
        "expression",
        &vars,
        &mut causes,
    )
    .into_iter()
    .enumerate()
    {
        let message_expr = match item["messageExpression"].as_str() {
            Some(src) => match compile(
                src,
                &format!("spec.validations[{i}].messageExpression"),
                &vars,
            ) {
                Ok(e) => Some(e),
                Err(c) => {
                    causes.push(c);
                    None
                }
            },
            None => None,
        };
        validations.push(Validation {
            expr,
            message: item["message"].as_str().map(String::from),
            message_expr,
            reason: item["reason"].as_str().unwrap_or("Invalid").to_string(),
        });
    }
    if !causes.is_empty() {
        return Err(causes);
    }
    let actions = strings(&binding["spec"]["validationActions"]);
    Ok(Bound {
        policy: meta_name(policy).to_string(),
        binding: meta_name(binding).to_string(),
        constraints: matcher(&spec["matchConstraints"]),
        narrowed: binding["spec"]
            .get("matchResources")
            .filter(|m| m.is_object())
            .map(matcher),
        conditions,
        variables,
        validations,
        param_kind,
        param_ref: ParamRef::of(&binding["spec"]),
        fail_open: spec["failurePolicy"].as_str() == Some("Ignore"),
        deny: actions.iter().any(|a| a == "Deny"),
        warn: actions.iter().any(|a| a == "Warn"),
    })
}

fn matcher(m: &Value) -> Matcher {
    let rules = |v: &Value| -> Vec<Rule> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|r| Rule {
                groups: strings(&r["apiGroups"]),
                versions: strings(&r["apiVersions"]),
                operations: strings(&r["operations"]),
                resources: strings(&r["resources"]),
                names: strings(&r["resourceNames"]),
                scope: r["scope"].as_str().unwrap_or("*").to_string(),
            })
            .collect()
    };
    Matcher {
        rules: rules(&m["resourceRules"]),
        exclude: rules(&m["excludeResourceRules"]),
    }
}

/// Compiles one expression that may read `variables`, refusing what the `cel` crate cannot
/// evaluate (module docs), with the cause the real server gives a policy whose expression does
/// not compile, or one naming what this server does not evaluate.
fn compile(source: &str, path: &str, variables: &[&str]) -> Result<Expr, (String, String)> {
    let reads = |v| cel::Program::compile(source).is_ok_and(|p| p.references().has_variable(v));
    if reads(NOT_EVALUATED) {
        return Err((
            path.to_string(),
            format!(
                "Forbidden: the '{NOT_EVALUATED}' variable is not evaluated by this test server"
            ),
        ));
    }
    Expr::compile(source, variables).map_err(|e| {
        (
            path.to_string(),
            format!("Invalid value: {source:?}: {}", e.detail()),
        )
    })
}

/// The causes refusing a ValidatingAdmissionPolicy or Binding the server could not enforce.
pub(crate) fn check_object(rt: &ResType, obj: &Value) -> Vec<(String, String)> {
    if rt.group != GROUP {
        return Vec::new();
    }
    let spec = &obj["spec"];
    let mut causes = Vec::new();
    match rt.kind.as_str() {
        POLICY => {
            causes.extend(admission_params::check_param_kind(spec));
            causes.extend(selectors(
                &spec["matchConstraints"],
                "spec.matchConstraints",
            ));
            if let Err(c) = compile_bound(obj, &json!({})) {
                causes.extend(c);
            }
        }
        BINDING => {
            causes.extend(admission_params::check_param_ref(spec));
            causes.extend(selectors(&spec["matchResources"], "spec.matchResources"));
            let actions = strings(&spec["validationActions"]);
            if actions.is_empty() {
                causes.push(("spec.validationActions".into(), "Required value".into()));
            }
            if actions.iter().any(|a| a == "Deny") && actions.iter().any(|a| a == "Warn") {
                causes.push((
                    "spec.validationActions".into(),
                    format!("Invalid value: {actions:?}: must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)"),
                ));
            }
        }
        _ => {}
    }
    causes
}

fn selectors(m: &Value, path: &str) -> Vec<(String, String)> {
    ["namespaceSelector", "objectSelector"]
        .into_iter()
        .filter(|s| {
            let sel = &m[*s];
            sel["matchLabels"]
                .as_object()
                .is_some_and(|l| !l.is_empty())
                || sel["matchExpressions"]
                    .as_array()
                    .is_some_and(|l| !l.is_empty())
        })
        .map(|s| {
            (
                format!("{path}.{s}"),
                "Forbidden: not supported by this test server".to_string(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_cannot_be_evaluated_is_refused_naming_it() {
        let (path, msg) = compile(
            "object.s.lowerAscii() == 'abc'",
            "spec.validations[0].expression",
            &VARIABLES,
        )
        .err()
        .expect("refused");
        assert_eq!(path, "spec.validations[0].expression");
        assert!(
            msg.contains("undeclared reference to 'lowerAscii'"),
            "{msg}"
        );
        let (_, msg) = compile("params.x == 1", "p", &VARIABLES)
            .err()
            .expect("refused");
        assert!(msg.contains("undeclared reference to 'params'"), "{msg}");
        let (_, msg) = compile("object.foo(", "p", &VARIABLES)
            .err()
            .expect("refused");
        assert!(msg.starts_with("Invalid value: \"object.foo(\": compilation failed: ERROR: <input>:1:12: Syntax error"), "{msg}");
        assert!(
            compile("object.l.all(item, item > 0)", "p", &VARIABLES).is_ok(),
            "a comprehension's variable"
        );
    }
}
