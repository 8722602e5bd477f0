//! The verbs of a resource request once it is allowed: get, list, watch, create, update,
//! patch and apply (the deletes are in [`super::delete`]), and the binding and scale
//! subresources.

use std::collections::HashMap;
use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};

use super::{Body, Target, delete, json_response, record_write, success_status, watch};
use crate::admission_policy::Admission;
use crate::discovery;
use crate::error::Error;
use crate::identity::UserInfo;
use crate::media;
use crate::registry::ResType;
use crate::selector::Selector;
use crate::server::{ListRequest, State};
use crate::store::{Store, WriteOpts, Written};

/// One resource request past authentication, authorization and faults.
pub(super) struct Call<'a> {
    pub(super) st: &'a Arc<State>,
    pub(super) t: &'a Target,
    pub(super) verb: &'a str,
    pub(super) q: &'a HashMap<String, String>,
    pub(super) ctype: &'a str,
    pub(super) body: &'a [u8],
    /// `as=Table` in the Accept header.
    pub(super) as_table: bool,
    /// The User-Agent (its product names the field manager when the query does not).
    pub(super) ua: &'a str,
    pub(super) who: &'a str,
    pub(super) user: &'a Arc<UserInfo>,
}

/// Answers an allowed resource request.
pub(super) async fn serve(c: &Call<'_>) -> Result<Response<Body>, Error> {
    let (st, rt) = (c.st, &c.t.rt);
    // reads pass no admission: no policy lookup on their path
    let writes = !matches!(c.verb, "get" | "list" | "watch");
    let admission = writes.then(|| Admission {
        policies: st.admission_policies.current(&st.store),
        user: c.user.clone(),
    });
    let ns = c.t.ns.clone().unwrap_or_default();
    c.check()?;
    let opts = c.write_opts(admission.clone());
    let name = c.t.name.clone().unwrap_or_default();
    if c.t.sub == "binding" {
        let b = media::parse_body(c.body, c.ctype)?;
        let w = bind_pod(&st.store, rt, &ns, &name, &b, opts)?;
        record_write(st, c.t, c.verb, c.who, &w.obj, w.dry_run);
        return Ok(json_response(201, &success_status(), &[]));
    }
    if c.t.sub == "scale" {
        return c.scale(&name, &opts);
    }
    let (body, ctype) = (c.body, c.ctype);
    match c.verb {
        "get" => c.get(&ns, &name),
        "list" => c.list(),
        "watch" => watch::watch(st, c.t, c.q, c.selector()?, c.who, c.as_table),
        "create" => {
            let w = st
                .store
                .create(rt, &ns, media::object_body(rt, body, ctype)?, &opts)?;
            Ok(c.written(&w, &opts))
        }
        "update" => {
            let obj = media::object_body(rt, body, ctype)?;
            let w = st.store.update(rt, &ns, &name, obj, &opts)?;
            Ok(c.written(&w, &opts))
        }
        "patch" | "apply" => {
            let ptype = media::patch_type(rt, ctype)?;
            let patch = media::parse_body(body, ctype)?;
            let w = st.store.patch(rt, &ns, &name, ptype, &patch, &opts)?;
            Ok(c.written(&w, &opts))
        }
        "delete" | "deletecollection" => delete::serve(c, admission, ns, &name),
        _ => Err(Error::method_not_allowed()),
    }
}

impl Call<'_> {
    /// What the real server refuses before it looks at the objects: a namespaced name
    /// outside a namespace, a deletecollection the resource does not serve, a delete the
    /// server's own admission forbids, malformed list parameters.
    fn check(&self) -> Result<(), Error> {
        let (rt, t, verb, q) = (&self.t.rt, self.t, self.verb, self.q);
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
        Ok(())
    }

    /// The label and field selectors of the query; a field label the resource does not
    /// support is a 400.
    pub(super) fn selector(&self) -> Result<Selector, Error> {
        let s = Selector::parse(
            self.q.get("labelSelector").map(String::as_str),
            self.q.get("fieldSelector").map(String::as_str),
        )?;
        if let Some(bad) = s
            .field_keys()
            .into_iter()
            .find(|k| !self.t.rt.field_label_supported(k))
        {
            return Err(Error::bad_request(format!(
                "field label not supported: {bad}"
            )));
        }
        Ok(s)
    }

    /// The write options of the query: the field manager (else the User-Agent's product,
    /// as the real server names it), dry run, strict field validation, forcing.
    fn write_opts(&self, admission: Option<Admission>) -> WriteOpts {
        let q = self.q;
        let manager = q.get("fieldManager").cloned().unwrap_or_else(|| {
            self.ua
                .split('/')
                .next()
                .unwrap_or("")
                .chars()
                .take(128)
                .collect()
        });
        WriteOpts {
            manager,
            subresource: self.t.sub.clone(),
            dry_run: q.get("dryRun").is_some_and(|d| d == "All"),
            strict: q.get("fieldValidation").is_some_and(|v| v == "Strict"),
            force: q.get("force").is_some_and(|f| f == "true"),
            admission,
        }
    }

    /// The answer of an accepted write, noted as a write unless it was a dry run.
    fn written(&self, w: &Written, opts: &WriteOpts) -> Response<Body> {
        record_write(self.st, self.t, self.verb, self.who, &w.obj, opts.dry_run);
        json_response(w.code, &w.obj, &w.warnings)
    }

    /// `items` as a Table (`as=Table` in the Accept header).
    fn table(&self, items: &[Arc<Value>], rv: u64) -> Response<Body> {
        let include = self
            .q
            .get("includeObject")
            .map(String::as_str)
            .unwrap_or("");
        json_response(200, &discovery::table(&self.t.rt, items, rv, include), &[])
    }

    fn get(&self, ns: &str, name: &str) -> Result<Response<Body>, Error> {
        let store = &self.st.store;
        let o = store.get(&self.t.rt, ns, name)?;
        if self.as_table {
            return Ok(self.table(&[o], store.current_rv()));
        }
        Ok(json_response(200, &o, &[]))
    }

    fn list(&self) -> Result<Response<Body>, Error> {
        let (q, rt) = (self.q, &self.t.rt);
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
        let max_age = self.st.config.continue_max_age;
        let sel = self.selector()?;
        let l = self
            .st
            .store
            .list(rt, self.t.ns.as_deref(), &sel, limit, cont, max_age)?;
        if self.as_table {
            return Ok(self.table(&l.items, l.rv));
        }
        let mut md = json!({"resourceVersion": l.rv.to_string()});
        if let Some(c) = l.cont {
            md["continue"] = json!(c);
            md["remainingItemCount"] = json!(l.remaining.unwrap_or(0));
        }
        let items: Vec<&Value> = l.items.iter().map(|a| &**a).collect();
        let r = json_response(
            200,
            &json!({"kind": rt.list_kind, "apiVersion": rt.api_version(), "metadata": md, "items": items}),
            &[],
        );
        self.st.lists.lock().push(ListRequest {
            identity: self.who.to_owned(),
            resource: rt.gr(),
            limit: q.get("limit").and_then(|l| l.parse().ok()),
            resource_version: rv.to_owned(),
            continued: cont.is_some(),
            items: items.len(),
            bytes: http_body::Body::size_hint(r.body()).exact().unwrap_or(0),
        });
        Ok(r)
    }

    /// `deployments/NAME/scale` ([`crate::scale`]): get, update and patch.
    fn scale(&self, name: &str, opts: &WriteOpts) -> Result<Response<Body>, Error> {
        let (store, rt, ctype, body) = (&self.st.store, &self.t.rt, self.ctype, self.body);
        let ns = self.t.ns.as_deref().unwrap_or_default();
        let w = match self.verb {
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
        Ok(self.written(&w, opts))
    }
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
