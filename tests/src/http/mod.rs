//! HTTP front end: authentication by bearer token, fault injection, request counting,
//! routing of Kubernetes API paths; the verbs are served in [`verbs`] and [`delete`], the
//! watch stream in [`watch`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};

use crate::access_review;
use crate::discovery;
use crate::error::Error;
use crate::identity::UserInfo;
use crate::rbac::Attributes;
use crate::registry::ResType;
use crate::selector::Selector;
use crate::server::State;
use crate::store::Store;
use verbs::Call;

mod delete;
mod verbs;
mod watch;

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
    if let Some(n) = (req.headers().get(header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    {
        st.count_body(verb, &res_name, n);
    }
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
    let as_table = header_text(&req, header::ACCEPT).contains("as=Table");
    let ua = header_text(&req, header::USER_AGENT);
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(e) => return failed(st, &t, verb, &res_name, who, &e),
    };
    let call = Call {
        st,
        t: &t,
        verb,
        q: &q,
        ctype: &ctype,
        body: &body,
        as_table,
        ua: &ua,
        who,
        user,
    };
    let result = verbs::serve(&call).await;
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

/// A request header's text ("" when it is missing or not text).
fn header_text(req: &Request<Incoming>, name: header::HeaderName) -> String {
    req.headers()
        .get(name)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string()
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
