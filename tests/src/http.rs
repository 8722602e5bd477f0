//! HTTP front end: authentication by bearer token, fault injection, request counting,
//! routing of Kubernetes API paths, and the watch stream.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::access_review;
use crate::admission_policy::Admission;
use crate::discovery;
use crate::error::Error;
use crate::identity::UserInfo;
use crate::media;
use crate::rbac::Attributes;
use crate::registry::ResType;
use crate::selector::Selector;
use crate::server::State;
use crate::store::{DeleteOpts, Store, WatchEvent, WriteOpts, event_line};
use crate::watch_lag::Outbox;

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// The real server's request body limit.
const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(v) => {
                    out.push(v);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn json_response(code: u16, v: &Value, warnings: &[String]) -> Response<Body> {
    let body = serde_json::to_vec(v).expect("serialise");
    let mut r = Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::OK))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .expect("response");
    for w in warnings {
        if let Ok(h) = HeaderValue::from_str(&format!("299 - {}", Value::String(w.clone()))) {
            r.headers_mut().append(header::WARNING, h);
        }
    }
    r
}

fn error_response(e: &Error) -> Response<Body> {
    let mut r = json_response(e.code(), &e.status(), &[]);
    if let Error::Api {
        details: Some(d), ..
    } = e
        && let Some(s) = d.get("retryAfterSeconds").and_then(Value::as_u64)
    {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

fn success_status() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
}

/// What a delete that removed a custom resource answers: the custom-resource store has no
/// `ReturnDeletedObject`, so `finalizeDelete` answers a `Status` naming it
/// (kubernetes/apiserver pkg/registry/generic/registry/store.go; kubernetes/apiextensions-apiserver
/// pkg/registry/customresource/etcd.go).
fn deleted_status(rt: &ResType, obj: &Value) -> Value {
    let md = |k: &str| obj.pointer(&format!("/metadata/{k}")).cloned();
    let mut s = success_status();
    s["details"] =
        json!({"name": md("name"), "group": rt.group, "kind": rt.plural, "uid": md("uid")});
    s
}

fn is_empty_list(v: &Value) -> bool {
    v.as_array().is_some_and(Vec::is_empty)
}

/// A parsed resource request.
struct Target {
    rt: Arc<ResType>,
    ns: Option<String>,
    name: Option<String>,
    sub: String,
}

fn parse_target(store: &Store, group: &str, version: &str, rest: &[&str]) -> Option<Target> {
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if store
                .resolve(group, version, plural)
                .is_some_and(|t| t.namespaced) =>
        {
            (Some(ns.to_string()), [&[*plural][..], tail].concat())
        }
        _ => (None, rest.to_vec()),
    };
    let rt = store.resolve(group, version, rest.first()?)?;
    if ns.is_some() && !rt.namespaced || rest.len() > 3 {
        return None;
    }
    let sub = rest.get(2).map(|s| s.to_string()).unwrap_or_default();
    let binding = sub == "binding" && rt.kind == "Pod" && rt.group.is_empty();
    let scale = sub == "scale" && crate::scale::has_scale(&rt);
    if !(sub.is_empty() || sub == "status" && rt.status || binding || scale) {
        return None;
    }
    Some(Target {
        rt,
        ns,
        name: rest.get(1).map(|s| s.to_string()),
        sub,
    })
}

fn verb_of(method: &Method, t: &Target, q: &HashMap<String, String>, ctype: &str) -> &'static str {
    let watch = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    match (method.as_str(), t.name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", false) => "create",
        // pods/binding: the scheduler's write (a create of a Binding on the pod)
        ("POST", true) if t.sub == "binding" => "create",
        ("PUT", true) => "update",
        ("PATCH", true) if ctype.starts_with("application/apply-patch") => "apply",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unsupported",
    }
}

/// The identity string and user of the request's bearer token (anonymous without one).
fn identity(st: &State, req: &Request<Incoming>) -> Result<(String, Arc<UserInfo>), Error> {
    match req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
    {
        None => Ok(("anonymous".into(), Arc::new(UserInfo::anonymous()))),
        Some(h) => {
            let tok = h.strip_prefix("Bearer ").unwrap_or("");
            st.tokens
                .read()
                .get(tok)
                .cloned()
                .ok_or_else(|| Error::api(401, "Unauthorized", "Unauthorized"))
        }
    }
}

/// Serves one request. An `Err` makes hyper drop the connection (refused identities).
pub(crate) async fn handle(
    st: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Error> {
    let (who, user) = match identity(&st, &req) {
        Ok(w) => w,
        Err(e) => return Ok(error_response(&e)),
    };
    let (latency, refused) = {
        let f = st.faults.read();
        (f.latency, f.refused.contains(&who))
    };
    if refused {
        tracing::debug!(identity = %who, "connection dropped: identity refused");
        return Err(Error::api(503, "ServiceUnavailable", "identity refused"));
    }
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let types = || st.store.types();
    let nonresource = |v: Option<Value>| {
        st.count("get", &path);
        match v {
            Some(v) => json_response(200, &v, &[]),
            None => error_response(&Error::not_found_path()),
        }
    };
    let resp = match segs.as_slice() {
        ["version"] => nonresource(Some(discovery::version(&st.config.git_version))),
        ["healthz" | "livez" | "readyz"] => {
            st.count("get", &path);
            Response::new(Full::new(Bytes::from_static(b"ok")).boxed())
        }
        ["api"] => nonresource(Some(discovery::api_versions(&st.addr.to_string()))),
        ["apis"] => nonresource(Some(discovery::group_list(&types().0))),
        ["openapi", "v3"] => {
            let (t, g) = types();
            nonresource(Some(discovery::openapi_root(&t, g)))
        }
        ["openapi", "v3", rest @ ..] => {
            nonresource(discovery::openapi_gv(&types().0, &rest.join("/")))
        }
        ["api", "v1"] => nonresource(discovery::resource_list(&types().0, "", "v1")),
        ["apis", g] => nonresource(discovery::group(&types().0, g)),
        ["apis", g, v] => nonresource(discovery::resource_list(&types().0, g, v)),
        ["apis", access_review::GROUP, "v1", kind] if access_review::serves(kind) => {
            let kind = kind.to_string();
            st.count("create", &format!("{kind}.{}", access_review::GROUP));
            let ctype = content_type(&req);
            match read_body(req).await {
                Ok(body) => match access_review::review(&st, &user, &kind, &body, &ctype) {
                    Ok(v) => json_response(201, &v, &[]),
                    Err(e) => error_response(&e),
                },
                Err(e) => error_response(&e),
            }
        }
        [
            "apis",
            access_review::AUTHN_GROUP,
            "v1",
            access_review::SELF_REVIEW,
        ] => {
            st.count(
                "create",
                &format!(
                    "{}.{}",
                    access_review::SELF_REVIEW,
                    access_review::AUTHN_GROUP
                ),
            );
            let ctype = content_type(&req);
            match read_body(req).await {
                Ok(body) => match access_review::self_review(&user, &body, &ctype) {
                    Ok(v) => json_response(201, &v, &[]),
                    Err(e) => error_response(&e),
                },
                Err(e) => error_response(&e),
            }
        }
        ["api", "v1", rest @ ..] => resource(&st, req, "", "v1", rest, &who, &user).await,
        ["apis", g, v, rest @ ..] => {
            let (g, v) = (g.to_string(), v.to_string());
            resource(&st, req, &g, &v, rest, &who, &user).await
        }
        _ => nonresource(None),
    };
    Ok(resp)
}

async fn resource(
    st: &Arc<State>,
    req: Request<Incoming>,
    group: &str,
    version: &str,
    rest: &[&str],
    who: &str,
    user: &Arc<UserInfo>,
) -> Response<Body> {
    let Some(t) = parse_target(&st.store, group, version, rest) else {
        st.count("unknown", req.uri().path());
        return error_response(&Error::not_found_path());
    };
    let q = query(req.uri().query());
    let ctype = content_type(&req);
    let verb = verb_of(req.method(), &t, &q, &ctype);
    let res_name = if t.sub.is_empty() {
        t.rt.gr()
    } else {
        format!("{}/{}", t.rt.gr(), t.sub)
    };
    st.count(verb, &res_name);
    if st.config.rbac
        && let Err(e) = authorize(st, user, &t, verb, &q)
    {
        tracing::debug!(verb, resource = %res_name, identity = who, error = %e, "forbidden");
        return failed(st, &t, verb, &res_name, who, &e);
    }
    let injected = {
        let f = st.faults.read();
        if f.error_rate > 0.0
            && (f.error_verbs.is_empty() || f.error_verbs.contains(verb))
            && (st.store.random() % 1_000_000) as f64 / 1_000_000.0 < f.error_rate
        {
            Some(injected_error(f.error_code, f.retry_after_secs))
        } else {
            None
        }
    };
    if let Some(e) = injected {
        return failed(st, &t, verb, &res_name, who, &e);
    }
    let hang = match targeted_fault(st, who, &res_name, verb).await {
        Targeted::Fail(e) => return failed(st, &t, verb, &res_name, who, &e),
        Targeted::Hang(bytes) if verb != "watch" => Some(bytes),
        _ => None,
    };
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    let as_table = accept.contains("as=Table");
    let ua = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(e) => return failed(st, &t, verb, &res_name, who, &e),
    };
    let result = serve(st, &t, verb, &q, &ctype, &body, as_table, &ua, who, user).await;
    match result {
        Ok(r) => {
            tracing::debug!(verb, resource = %res_name, identity = who, code = r.status().as_u16(), "served");
            match hang {
                Some(bytes) => hung(r, bytes).await,
                None => r,
            }
        }
        Err(e) => {
            tracing::debug!(verb, resource = %res_name, identity = who, error = %e, "refused");
            failed(st, &t, verb, &res_name, who, &e)
        }
    }
}

/// The error answer of a resource request, noted in the audit record of failed requests.
fn failed(
    st: &State,
    t: &Target,
    verb: &str,
    resource: &str,
    who: &str,
    e: &Error,
) -> Response<Body> {
    let status = e.status();
    let text = |k: &str| status[k].as_str().unwrap_or_default().to_string();
    st.failed.lock().push(crate::FailedRequest {
        identity: who.to_string(),
        verb: verb.to_string(),
        resource: resource.to_string(),
        namespace: t.ns.clone(),
        name: t.name.clone(),
        code: e.code(),
        reason: text("reason"),
        message: text("message"),
    });
    error_response(e)
}

/// The error an injected fault answers: 429 (with Retry-After), 503, 504, else 500.
fn injected_error(code: u16, retry_after_secs: u64) -> Error {
    match code {
        429 => Error::too_many_requests(retry_after_secs),
        503 => Error::api(
            503,
            "ServiceUnavailable",
            "injected fault: service unavailable",
        ),
        504 => Error::api(
            504,
            "Timeout",
            "injected fault: the server was unable to return a response in the time allotted",
        ),
        _ => Error::internal("injected fault: internal error"),
    }
}

/// What a matching [`TargetedFault`](crate::TargetedFault) does once its latency passed.
enum Targeted {
    Serve,
    Fail(Error),
    /// Serve, but send only this many bytes of the body.
    Hang(usize),
}

/// Applies the first [`TargetedFault`](crate::TargetedFault) matching this identity,
/// resource and verb: its latency, then its error or its hang if it has one.
async fn targeted_fault(st: &State, who: &str, resource: &str, verb: &str) -> Targeted {
    let hit = {
        let f = st.faults.read();
        f.targeted
            .iter()
            .find(|t| {
                t.identity == who
                    && t.resource == resource
                    && (t.verbs.is_empty() || t.verbs.contains(verb))
            })
            .map(|t| {
                (
                    t.latency,
                    t.error_code,
                    t.hang_after_bytes,
                    f.retry_after_secs,
                )
            })
    };
    let Some((latency, code, hang, retry_after)) = hit else {
        return Targeted::Serve;
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    tracing::debug!(
        identity = who,
        resource,
        verb,
        ?code,
        ?hang,
        "targeted fault"
    );
    match (code, hang) {
        (Some(c), _) => Targeted::Fail(injected_error(c, retry_after)),
        (None, Some(bytes)) => Targeted::Hang(bytes),
        (None, None) => Targeted::Serve,
    }
}

/// The answer `r` cut after `bytes` bytes of its body, which then never ends (a hung
/// response: the client has the headers and part of the body, then waits).
async fn hung(r: Response<Body>, bytes: usize) -> Response<Body> {
    let (mut parts, body) = r.into_parts();
    let whole = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let head = whole.slice(..bytes.min(whole.len()));
    parts.headers.remove(header::CONTENT_LENGTH);
    let sent = futures::stream::iter([Ok::<_, Infallible>(Frame::data(head))]);
    let stream = futures::StreamExt::chain(sent, futures::stream::pending());
    Response::from_parts(parts, BodyExt::boxed(StreamBody::new(stream)))
}

/// Notes a write the store accepted (dry runs are not writes).
fn record_write(st: &State, t: &Target, verb: &str, who: &str, obj: &Value, dry_run: bool) {
    if dry_run {
        return;
    }
    let md = |k: &str| {
        obj.pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
    };
    let resource = if t.sub.is_empty() {
        t.rt.gr()
    } else {
        format!("{}/{}", t.rt.gr(), t.sub)
    };
    st.writes.lock().push(crate::AcceptedWrite {
        at: std::time::Instant::now(),
        identity: who.to_string(),
        verb: verb.to_string(),
        resource,
        namespace: t.ns.clone(),
        name: md("name").unwrap_or_default().to_string(),
        resource_version: md("resourceVersion").unwrap_or_default().to_string(),
    });
}

fn content_type(req: &Request<Incoming>) -> String {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("application/json")
        .to_string()
}

/// The request body, up to the real server's limit (413 past it).
async fn read_body(req: Request<Incoming>) -> Result<Bytes, Error> {
    match http_body_util::Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Error::api(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {MAX_BODY_BYTES}"),
        )),
        Err(e) => Err(Error::bad_request(e.to_string())),
    }
}

/// RBAC for a resource request, with the attributes the real server's RequestInfo gives it:
/// `apply` is a patch (and also a create when the object does not exist yet), a namespace's
/// own name is its namespace, and a list or watch selecting `metadata.name` carries that name.
fn authorize(
    st: &State,
    user: &UserInfo,
    t: &Target,
    verb: &str,
    q: &HashMap<String, String>,
) -> Result<(), Error> {
    if user.is_master() {
        return Ok(());
    }
    let name = t.name.clone().or_else(|| {
        // a malformed selector is refused later, when the list or watch parses it
        let sel = Selector::parse(None, q.get("fieldSelector").map(String::as_str)).ok()?;
        sel.required_field("metadata.name").map(String::from)
    });
    let name = name.as_deref().unwrap_or_default();
    let namespace = match t.ns.as_deref() {
        Some(ns) => ns,
        None if t.rt.group.is_empty() && t.rt.plural == "namespaces" => name,
        None => "",
    };
    let mut attrs = Attributes {
        verb: if verb == "apply" { "patch" } else { verb },
        group: &t.rt.group,
        resource: &t.rt.plural,
        subresource: &t.sub,
        namespace,
        name,
    };
    let policy = st.policy.current(&st.store);
    policy
        .authorize(user, &attrs)
        .map_err(|reason| attrs.forbidden(user, &reason))?;
    // An apply to a missing object creates it, and so needs `create` too; a subresource's
    // apply never creates (the status store answers 404, as StatusREST never allows create
    // on update), so it needs only `patch`.
    let creates = verb == "apply"
        && t.sub.is_empty()
        && st
            .store
            .get(&t.rt, t.ns.as_deref().unwrap_or_default(), name)
            .is_err();
    if creates {
        attrs.verb = "create";
        policy
            .authorize(user, &attrs)
            .map_err(|reason| attrs.forbidden(user, &reason))?;
    }
    Ok(())
}

/// What a binding wrote.
struct Bound {
    obj: Arc<Value>,
    dry_run: bool,
}

/// `POST pods/NAME/binding` as the real server's `BindingREST`: sets `spec.nodeName` of a
/// pod that has none, in one update with the pod's resourceVersion as its precondition;
/// a pod already assigned or being deleted is a 409 in the real words.
fn bind_pod(
    store: &Store,
    rt: &ResType,
    ns: &str,
    name: &str,
    binding: &Value,
    opts: WriteOpts,
) -> Result<Bound, Error> {
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Error::bad_request("a Binding needs target.name (the node)"))?;
    let pod = store.get(rt, ns, name)?;
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        return Err(Error::conflict(
            "",
            "pods/binding",
            name,
            &format!("pod {name} is being deleted, cannot be assigned to a host"),
        ));
    }
    if let Some(cur) = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        return Err(Error::conflict(
            "",
            "pods/binding",
            name,
            &format!("pod {name} is already assigned to node \"{cur}\""),
        ));
    }
    let mut next = (*pod).clone();
    next["spec"]["nodeName"] = Value::String(node.to_string());
    let dry_run = opts.dry_run;
    let opts = WriteOpts {
        subresource: String::new(),
        ..opts
    };
    let w = store.update(rt, ns, name, next, &opts)?;
    Ok(Bound {
        obj: w.obj,
        dry_run,
    })
}

/// `deployments/NAME/scale` ([`crate::scale`]): get, update and patch.
#[allow(clippy::too_many_arguments)]
fn serve_scale(
    st: &Arc<State>,
    t: &Target,
    verb: &str,
    ctype: &str,
    body: &[u8],
    who: &str,
    name: &str,
    opts: &WriteOpts,
) -> Result<Response<Body>, Error> {
    let (store, rt) = (&st.store, &t.rt);
    let ns = t.ns.as_deref().unwrap_or_default();
    let w = match verb {
        "get" => {
            return Ok(json_response(
                200,
                &crate::scale::get(store, rt, ns, name)?,
                &[],
            ));
        }
        "update" => {
            let scale = media::builtin_body(body, ctype)?;
            crate::scale::update(store, rt, ns, name, &scale, opts)?
        }
        "patch" | "apply" => {
            let ptype = media::patch_type(rt, ctype)?;
            let patch = media::parse_body(body, ctype)?;
            crate::scale::patch(store, rt, ns, name, ptype, &patch, opts)?
        }
        _ => return Err(Error::method_not_allowed()),
    };
    record_write(st, t, verb, who, &w.obj, opts.dry_run);
    Ok(json_response(w.code, &w.obj, &w.warnings))
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    st: &Arc<State>,
    t: &Target,
    verb: &str,
    q: &HashMap<String, String>,
    ctype: &str,
    body: &[u8],
    as_table: bool,
    ua: &str,
    who: &str,
    user: &Arc<UserInfo>,
) -> Result<Response<Body>, Error> {
    let rt = &t.rt;
    // reads pass no admission: no policy lookup on their path
    let writes = !matches!(verb, "get" | "list" | "watch");
    let admission = writes.then(|| Admission {
        policies: st.admission_policies.current(&st.store),
        user: user.clone(),
    });
    let store = &st.store;
    let ns = t.ns.clone().unwrap_or_default();
    if rt.namespaced && t.ns.is_none() && !matches!(verb, "list" | "watch") {
        return Err(Error::not_found_path());
    }
    if verb == "deletecollection" && !rt.verbs().contains(&verb) {
        return Err(Error::method_not_allowed());
    }
    if verb == "delete" {
        crate::admission::check_delete(rt, t.name.as_deref().unwrap_or(""))?;
    }
    if matches!(verb, "list" | "watch" | "deletecollection") {
        crate::params::decode(q)?;
    }
    if verb == "list" {
        crate::params::validate_list(q)?;
    }
    let sel = || -> Result<Selector, Error> {
        let s = Selector::parse(
            q.get("labelSelector").map(String::as_str),
            q.get("fieldSelector").map(String::as_str),
        )?;
        if let Some(bad) = s
            .field_keys()
            .into_iter()
            .find(|k| !rt.field_label_supported(k))
        {
            return Err(Error::bad_request(format!(
                "field label not supported: {bad}"
            )));
        }
        Ok(s)
    };
    let manager = q.get("fieldManager").cloned().unwrap_or_else(|| {
        ua.split('/')
            .next()
            .unwrap_or("")
            .chars()
            .take(128)
            .collect()
    });
    let opts = WriteOpts {
        manager,
        subresource: t.sub.clone(),
        dry_run: q.get("dryRun").is_some_and(|d| d == "All"),
        strict: q.get("fieldValidation").is_some_and(|v| v == "Strict"),
        force: q.get("force").is_some_and(|f| f == "true"),
        admission: admission.clone(),
    };
    let name = t.name.clone().unwrap_or_default();
    if t.sub == "binding" {
        let b = media::parse_body(body, ctype)?;
        let w = bind_pod(store, rt, &ns, &name, &b, opts)?;
        record_write(st, t, verb, who, &w.obj, w.dry_run);
        return Ok(json_response(201, &success_status(), &[]));
    }
    if t.sub == "scale" {
        return serve_scale(st, t, verb, ctype, body, who, &name, &opts);
    }
    match verb {
        "get" => {
            let o = store.get(rt, &ns, &name)?;
            if as_table {
                return Ok(json_response(
                    200,
                    &discovery::table(
                        rt,
                        &[o],
                        store.current_rv(),
                        q.get("includeObject").map(String::as_str).unwrap_or(""),
                    ),
                    &[],
                ));
            }
            Ok(json_response(200, &o, &[]))
        }
        "list" => {
            let cont = q
                .get("continue")
                .map(String::as_str)
                .filter(|c| !c.is_empty());
            let rv = q.get("resourceVersion").map(String::as_str).unwrap_or("");
            if cont.is_some() && !matches!(rv, "" | "0") {
                // kubernetes/apiserver pkg/storage/interfaces.go ValidateListOptions
                return Err(Error::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            // resourceVersion=0 is served whole from the watch cache: its limit is ignored
            // and no continue token is given (kubernetes/apiserver
            // pkg/storage/cacher/cacher.go `computeListLimit`, v1.33)
            let from_cache = rv == "0";
            let limit = q
                .get("limit")
                .and_then(|l| l.parse().ok())
                .filter(|_| !from_cache);
            let max_age = st.config.continue_max_age;
            let l = store.list(rt, t.ns.as_deref(), &sel()?, limit, cont, max_age)?;
            if as_table {
                return Ok(json_response(
                    200,
                    &discovery::table(
                        rt,
                        &l.items,
                        l.rv,
                        q.get("includeObject").map(String::as_str).unwrap_or(""),
                    ),
                    &[],
                ));
            }
            let mut md = json!({"resourceVersion": l.rv.to_string()});
            if let Some(c) = l.cont {
                md["continue"] = json!(c);
                md["remainingItemCount"] = json!(l.remaining.unwrap_or(0));
            }
            let items: Vec<&Value> = l.items.iter().map(|a| &**a).collect();
            Ok(json_response(
                200,
                &json!({"kind": rt.list_kind, "apiVersion": rt.api_version(), "metadata": md, "items": items}),
                &[],
            ))
        }
        "watch" => watch(st, t, q, sel()?, who, as_table),
        "create" => {
            let w = store.create(rt, &ns, media::object_body(rt, body, ctype)?, &opts)?;
            record_write(st, t, verb, who, &w.obj, opts.dry_run);
            Ok(json_response(w.code, &w.obj, &w.warnings))
        }
        "update" => {
            let obj = media::object_body(rt, body, ctype)?;
            let w = store.update(rt, &ns, &name, obj, &opts)?;
            record_write(st, t, verb, who, &w.obj, opts.dry_run);
            Ok(json_response(w.code, &w.obj, &w.warnings))
        }
        "patch" | "apply" => {
            let ptype = media::patch_type(rt, ctype)?;
            let w = store.patch(
                rt,
                &ns,
                &name,
                ptype,
                &media::parse_body(body, ctype)?,
                &opts,
            )?;
            record_write(st, t, verb, who, &w.obj, opts.dry_run);
            Ok(json_response(w.code, &w.obj, &w.warnings))
        }
        "delete" | "deletecollection" => {
            let b = media::parse_body(body, ctype)?;
            let dry = q.get("dryRun").is_some_and(|d| d == "All")
                || b.get("dryRun")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|x| x == "All"));
            let d = DeleteOpts {
                admission,
                uid: b
                    .pointer("/preconditions/uid")
                    .and_then(Value::as_str)
                    .map(String::from),
                rv: b
                    .pointer("/preconditions/resourceVersion")
                    .and_then(Value::as_str)
                    .map(String::from),
                propagation: b
                    .get("propagationPolicy")
                    .and_then(Value::as_str)
                    .map(String::from)
                    .or_else(|| q.get("propagationPolicy").cloned()),
                dry_run: dry,
                grace: b
                    .get("gracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .or_else(|| q.get("gracePeriodSeconds").and_then(|g| g.parse().ok())),
                orphan_dependents: b
                    .get("orphanDependents")
                    .and_then(Value::as_bool)
                    .or_else(|| q.get("orphanDependents").map(|o| o == "true")),
                crd_finalizer: st.config.crd_cleanup_interval.is_some(),
            };
            if verb == "deletecollection" {
                store.delete_collection(rt, t.ns.as_deref(), &sel()?, &d)?;
                return Ok(json_response(200, &success_status(), &[]));
            }
            let w = store.delete(rt, &ns, &name, &d)?;
            record_write(st, t, verb, who, &w.obj, d.dry_run);
            if let Some(every) = st.config.crd_cleanup_interval
                && rt.kind == "CustomResourceDefinition"
                && !d.dry_run
                && w.obj.pointer("/metadata/deletionTimestamp").is_some()
            {
                let (st, name) = (st.clone(), name.clone());
                tokio::spawn(async move {
                    while !st.store.crd_cleanup_step(&name) {
                        tokio::time::sleep(every).await;
                    }
                });
            }
            if rt.kind == "Namespace"
                && rt.group.is_empty()
                && !d.dry_run
                && w.obj.pointer("/metadata/deletionTimestamp").is_some()
            {
                let (st, name) = (st.clone(), name.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(st.config.namespace_finalize_delay).await;
                    st.store.finalize_namespace(&name);
                });
            }
            if rt.kind == "Pod"
                && rt.group.is_empty()
                && !d.dry_run
                && let Some(delay) = st.config.kubelet_delay
                && w.obj.pointer("/metadata/deletionTimestamp").is_some()
                && w.obj
                    .pointer("/metadata/deletionGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
                    > 0
            {
                let (st, rt) = (st.clone(), rt.clone());
                let uid = w
                    .obj
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    st.store.kubelet_delete(&rt, &ns, &name, &uid);
                });
            }
            if rt.crd
                && w.obj
                    .pointer("/metadata/finalizers")
                    .is_none_or(is_empty_list)
            {
                return Ok(json_response(w.code, &deleted_status(rt, &w.obj), &[]));
            }
            Ok(json_response(w.code, &w.obj, &[]))
        }
        _ => Err(Error::method_not_allowed()),
    }
}

/// Whether a change passes a watch's selector; the event type seen by that watch.
fn filtered(ev: &WatchEvent, sel: &Selector) -> Option<&'static str> {
    if sel.is_empty() {
        return Some(ev.etype);
    }
    let now = sel.matches(&ev.obj);
    let before = ev.prev.as_ref().is_some_and(|p| sel.matches(p));
    match ev.etype {
        "ADDED" => now.then_some("ADDED"),
        "DELETED" => (now || before).then_some("DELETED"),
        _ => match (before, now) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        },
    }
}

fn plain_line(ev: &WatchEvent, etype: &'static str, rt: &ResType) -> Bytes {
    let av = rt.api_version();
    if etype == ev.etype && ev.obj.get("apiVersion").and_then(Value::as_str) == Some(av.as_str()) {
        return ev.line.clone();
    }
    event_line(etype, &Store::present(rt, &ev.obj))
}

fn watch(
    st: &Arc<State>,
    t: &Target,
    q: &HashMap<String, String>,
    sel: Selector,
    who: &str,
    as_table: bool,
) -> Result<Response<Body>, Error> {
    let rt = t.rt.clone();
    let include = q.get("includeObject").cloned().unwrap_or_default();
    let gr = rt.storage_gr();
    let initial_events = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let from = match q.get("resourceVersion").map(String::as_str) {
        _ if initial_events => None,
        None | Some("") => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| Error::bad_request(format!("invalid resource version {v:?}")))?,
        ),
    };
    let timeout = match q.get("timeoutSeconds").and_then(|s| s.parse::<u64>().ok()) {
        Some(s) => Duration::from_secs(s),
        None => {
            let base = st.config.min_request_timeout;
            base + Duration::from_millis(st.store.random() % (base.as_millis() as u64).max(1))
        }
    };
    let timeout = match st.faults.read().watch_max {
        Some(m) => timeout.min(m),
        None => timeout,
    };
    let (tx, out_rx) = mpsc::channel::<Bytes>(256);
    let started = st.store.watch(&rt, t.ns.as_deref(), from);
    let st = st.clone();
    let ns = t.ns.clone();
    let who = who.to_string();
    tokio::spawn(async move {
        let (first, mut rx, start_rv) = match started {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(event_line("ERROR", &e.status())).await;
                return;
            }
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = st.changes.subscribe();
        let mut paused = st.paused.subscribe();
        let close_epoch = *st.close_epoch.lock();
        let mut last_rv = start_rv;
        // With `as=Table` (kubectl get -w) each event carries a one-row Table; only the first
        // has column definitions, as the real server sends them.
        let mut headers_sent = false;
        let mut render = |ev: &WatchEvent, et: &'static str| -> Bytes {
            if !as_table {
                return plain_line(ev, et, &rt);
            }
            let mut tbl = discovery::table(&rt, &[Store::present(&rt, &ev.obj)], ev.rv, &include);
            if headers_sent {
                tbl["columnDefinitions"] = json!([]);
            }
            headers_sent = true;
            event_line(et, &tbl)
        };
        // every line goes through the watch's lag (held back for one identity, if asked)
        let mut out = Outbox::new(st.clone(), &who, &gr);
        for ev in &first {
            if let Some(et) = filtered(ev, &sel)
                && !out.send(&tx, render(ev, et)).await
            {
                return;
            }
            last_rv = last_rv.max(ev.rv);
        }
        let bookmark = |rv: u64, end: bool| {
            let mut md = json!({"resourceVersion": rv.to_string()});
            if end {
                md["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            event_line(
                "BOOKMARK",
                &json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": md}),
            )
        };
        if initial_events && bookmarks && !out.send(&tx, bookmark(start_rv, true)).await {
            return;
        }
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + st.config.bookmark_interval,
            st.config.bookmark_interval,
        );
        let relevant = |ev: &WatchEvent| ev.gr == gr && ns.as_deref().is_none_or(|n| n == ev.ns);
        loop {
            let is_paused = *paused.borrow();
            let due = out.next_due();
            tokio::select! {
                biased;
                _ = tx.closed() => return,
                _ = tokio::time::sleep_until(deadline) => return,
                _ = changes.changed() => {
                    if *st.close_epoch.lock() != close_epoch || st.faults.read().refused.contains(&who) {
                        return;
                    }
                    // the lag may have changed
                    if !out.flush(&tx).await { return; }
                }
                _ = paused.changed() => {}
                _ = tokio::time::sleep_until(due.unwrap_or(deadline)), if due.is_some() => {
                    if !out.flush(&tx).await { return; }
                }
                _ = tick.tick(), if bookmarks && !is_paused => {
                    let now_rv = st.store.current_rv();
                    loop {
                        match rx.try_recv() {
                            Ok(ev) => {
                                if ev.rv > last_rv && relevant(&ev) && let Some(et) = filtered(&ev, &sel)
                                    && !out.send(&tx, render(&ev, et)).await { return; }
                                last_rv = last_rv.max(ev.rv);
                            }
                            Err(broadcast::error::TryRecvError::Empty) => break,
                            Err(_) => return,
                        }
                    }
                    // a bookmark never overtakes a held event
                    if !out.holding() {
                        last_rv = last_rv.max(now_rv);
                        if tx.send(bookmark(last_rv, false)).await.is_err() { return; }
                    }
                }
                ev = rx.recv(), if !is_paused => {
                    match ev {
                        Ok(ev) => {
                            if ev.rv > last_rv && relevant(&ev) && let Some(et) = filtered(&ev, &sel) {
                                if !out.send(&tx, render(&ev, et)).await { return; }
                                last_rv = ev.rv;
                            }
                        }
                        Err(_) => return,
                    }
                }
            }
        }
    });
    let stream = futures::stream::unfold(out_rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::TRANSFER_ENCODING, "chunked")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("response"))
}
