//! The plugin ↔ agent protocol, and CNI's error JSON. The agent side is built against this text.
//!
//! # Transport
//! HTTP/1.1 over the agent's unix socket (`/run/tidepool/agent.sock` unless the IPAM config's
//! `socket` says otherwise; mode 0600, so only root reaches it). One request per connection:
//! the plugin sends `Connection: close`, `Content-Type: application/json` and a
//! `Content-Length`; the agent answers with a `Content-Length` (or a chunked body) and may close.
//! Debuggable with `curl --unix-socket /run/tidepool/agent.sock http://localhost/v1/allocations`.
//!
//! # Requests
//! `POST /v1/cni/add`, `/v1/cni/del`, `/v1/cni/check`, `/v1/cni/gc`, `/v1/cni/status`, each with
//! this body (members in this order, every member present; `null` where the runtime gave nothing):
//!
//! ```json
//! {"containerID":"…","ifname":"eth0","netns":"/var/run/netns/…",
//!  "podNamespace":"default","podName":"web-0","podUID":"…",
//!  "cniVersion":"1.1.0","config":{ …the network config object from stdin… }}
//! ```
//!
//! - `containerID`, `ifname`: the allocation's key; strings on add/del/check, `null` on gc/status.
//! - `netns`: `null` on del when the runtime sent none (the netns may be gone: free anyway), and
//!   on gc/status.
//! - `podNamespace`, `podName`, `podUID`: from `CNI_ARGS` (`K8S_POD_*`), `null` when absent. The
//!   UID is the allocation's identity (DESIGN.md: a stale DEL frees nothing).
//! - `cniVersion`: the config's, one of [`SUPPORTED_VERSIONS`]; the agent's result uses it.
//! - `config`: the whole network config as the runtime passed it (the main plugin's own keys, its
//!   `ipam` section, `prevResult` on check, `cni.dev/valid-attachments` on gc — the plugin has
//!   checked it is an array of `{containerID, ifname}` objects; an attachment missing from it is
//!   no longer valid).
//!
//! `GET /v1/allocations` (read-only, for `curl`) lists the agent's allocations; the plugin does
//! not use it.
//!
//! # Answers
//! - `200`: success. On add the body is the CNI result the plugin prints as it is:
//!   `{"cniVersion":"1.1.0","ips":[{"address":"10.250.1.5/16","gateway":"10.250.0.1"}],
//!   "routes":[{"dst":"0.0.0.0/0"}]}`. On del, check, gc and status the body is ignored (CNI
//!   prints nothing on their success); send `{}` or nothing.
//! - anything else: the body is a CNI error `{"code":11,"msg":"…","details":"…"}`; the plugin
//!   prints it with the request's `cniVersion` and exits 1. A body without a numeric `code`
//!   becomes code 999 naming the HTTP status.
//!
//! What the result must look like for `ptp` (containernetworking-plugins 1.1.1, tried in network
//! namespaces here): ptp gives the address to the pod's veth with the prefix length from the
//! result, deletes the kernel's prefix route for it, and routes `gateway/32` on-link and the
//! prefix via the gateway; on the host it puts `gateway/32` on the host veth and a `/32` route to
//! the pod. So the datapath is per-pod /32 routing, but the result's `address` must not be a /32:
//! ptp fails with "failed to delete route … no such process" (a /32 has no prefix route), and a
//! route in `routes` via a gateway outside the address's prefix fails with "network is
//! unreachable". Working shape: the pod address with the pool CIDR's prefix length, a gateway
//! inside that prefix that is never handed to a pod (the same on every node), and
//! `routes: [{"dst":"0.0.0.0/0"}]`. Two pods in different blocks of one node then reach each other
//! through the host (verified for IPv4; the IPv6 shape is untested).
//!
//! # The DEL spool
//! When the agent cannot be reached, the plugin records a DEL in the spool directory
//! (`/var/lib/tidepool/spool`, IPAM key `spoolDir`) and succeeds. One file per
//! (containerID, ifname), named by [`super::spool::file_name`] (both parts percent-encoded,
//! joined by `@`, `.json`); a second DEL for the same key replaces it. Written durably: temp file
//! (`.` prefix, `.tmp` suffix — the agent ignores such names), fsync, rename, fsync of the
//! directory. Content:
//!
//! ```json
//! {"spoolVersion":1,"spooledAtMs":1764000000000,"del":{ …the del request body above… }}
//! ```
//!
//! The agent replays each file as a del request (same rules: keyed, stale-safe; an allocation
//! made after `spooledAtMs` is not the DEL's and stays) and removes it once the result is
//! durable in its checkpoint: at start, and then whenever the spool holds a file while it
//! serves (checked each second).

use super::json::Value;

/// Where the agent listens unless the IPAM config's `socket` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/tidepool/agent.sock";
/// Where DELs wait while the agent is down, unless the IPAM config's `spoolDir` says otherwise.
pub const DEFAULT_SPOOL_DIR: &str = "/var/lib/tidepool/spool";
/// The agent creates this (on tmpfs) after its first restore since boot and refreshes its
/// modification time while it serves; STATUS uses it to tell "not ready since boot" or
/// "unreachable for longer than the grace" (code 50) from "restarting" (success). IPAM key
/// `restoredMarker`.
pub const DEFAULT_RESTORED_MARKER: &str = "/run/tidepool/restored";
/// The spool file format's version.
pub const SPOOL_VERSION: u64 = 1;

/// The CNI versions whose configs and results this plugin handles. Results before 1.0.0 differ
/// (`ips[].version`, no STATUS/GC), and nothing we ship sends them, so they are not claimed.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["1.0.0", "1.1.0"];
/// The version the plugin speaks best; its answer to VERSION and errors without a usable version.
pub const LATEST_VERSION: &str = "1.1.0";

/// CNI error codes (CNI spec 1.1.0, "Error").
pub mod code {
    pub const INCOMPATIBLE_VERSION: u64 = 1;
    pub const INVALID_ENV: u64 = 4;
    pub const IO_FAILURE: u64 = 5;
    pub const DECODING_FAILURE: u64 = 6;
    pub const INVALID_CONFIG: u64 = 7;
    pub const TRY_AGAIN_LATER: u64 = 11;
    pub const PLUGIN_NOT_AVAILABLE: u64 = 50;
    pub const GENERIC: u64 = 999;
}

/// A CNI error: printed to stdout (with `cniVersion`) and exit status 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u64,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u64, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The error JSON the spec asks for.
    pub fn to_json(&self, cni_version: &str) -> Value {
        Value::object([
            ("cniVersion", Value::str(cni_version)),
            ("code", Value::uint(self.code)),
            ("msg", Value::str(&self.msg)),
            ("details", Value::str(&self.details)),
        ])
    }

    /// The error an agent's non-200 answer carries; a body that is not a CNI error becomes code
    /// 999 naming the HTTP status, so the runtime still sees why.
    pub fn from_agent(status: u16, body: &[u8]) -> Self {
        let text = String::from_utf8_lossy(body);
        let parsed = super::json::parse(&text).ok();
        let code = parsed
            .as_ref()
            .and_then(|v| v.get("code"))
            .and_then(Value::as_u64);
        match (parsed.as_ref(), code) {
            (Some(v), Some(code)) if code > 0 => {
                let field = |k| {
                    v.get(k)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                CniError {
                    code,
                    msg: field("msg"),
                    details: field("details"),
                }
            }
            _ => {
                let snippet: String = text.trim().chars().take(200).collect();
                CniError::new(
                    code::GENERIC,
                    format!("tidepool agent answered HTTP {status}"),
                )
                .with_details(snippet)
            }
        }
    }
}

/// The CNI verbs that go to the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Add,
    Del,
    Check,
    Gc,
    Status,
}

impl Verb {
    pub const ALL: [Verb; 5] = [Verb::Add, Verb::Del, Verb::Check, Verb::Gc, Verb::Status];

    /// The verb whose request path is `path` (the agent routes by it).
    pub fn from_path(path: &str) -> Option<Verb> {
        Verb::ALL.into_iter().find(|v| v.path() == path)
    }

    /// The request path on the agent's socket.
    pub fn path(self) -> &'static str {
        match self {
            Verb::Add => "/v1/cni/add",
            Verb::Del => "/v1/cni/del",
            Verb::Check => "/v1/cni/check",
            Verb::Gc => "/v1/cni/gc",
            Verb::Status => "/v1/cni/status",
        }
    }
}

/// What a request body says besides the config; `None` becomes `null`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request<'a> {
    pub container_id: Option<&'a str>,
    pub ifname: Option<&'a str>,
    pub netns: Option<&'a str>,
    pub pod_namespace: Option<&'a str>,
    pub pod_name: Option<&'a str>,
    pub pod_uid: Option<&'a str>,
}

/// The JSON body of a `POST /v1/cni/…` request, members in the documented order.
pub fn request_body(req: &Request<'_>, cni_version: &str, config: &Value) -> Value {
    Value::object([
        ("containerID", Value::opt_str(req.container_id)),
        ("ifname", Value::opt_str(req.ifname)),
        ("netns", Value::opt_str(req.netns)),
        ("podNamespace", Value::opt_str(req.pod_namespace)),
        ("podName", Value::opt_str(req.pod_name)),
        ("podUID", Value::opt_str(req.pod_uid)),
        ("cniVersion", Value::str(cni_version)),
        ("config", config.clone()),
    ])
}

/// The content of a spool file for a DEL whose request body is `del`.
pub fn spool_record(del: Value, spooled_at_ms: u64) -> Value {
    Value::object([
        ("spoolVersion", Value::uint(SPOOL_VERSION)),
        ("spooledAtMs", Value::uint(spooled_at_ms)),
        ("del", del),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::json::parse;

    #[test]
    fn request_body_has_every_member_in_order() {
        let config = parse(r#"{"cniVersion":"1.1.0","name":"n","ipam":{"type":"tidepool-cni"}}"#)
            .expect("config");
        let req = Request {
            container_id: Some("c1"),
            ifname: Some("eth0"),
            netns: None,
            pod_namespace: Some("ns"),
            pod_name: Some("p"),
            pod_uid: Some("u"),
        };
        assert_eq!(
            request_body(&req, "1.1.0", &config).to_string(),
            r#"{"containerID":"c1","ifname":"eth0","netns":null,"podNamespace":"ns","podName":"p","podUID":"u","cniVersion":"1.1.0","config":{"cniVersion":"1.1.0","name":"n","ipam":{"type":"tidepool-cni"}}}"#
        );
    }

    #[test]
    fn agent_errors_pass_through_and_garbage_becomes_999() {
        let e = CniError::from_agent(
            503,
            br#"{"code":11,"msg":"pool empty","details":"no block yet"}"#,
        );
        assert_eq!(
            e,
            CniError::new(11, "pool empty").with_details("no block yet")
        );
        assert_eq!(
            e.to_json("1.0.0").to_string(),
            r#"{"cniVersion":"1.0.0","code":11,"msg":"pool empty","details":"no block yet"}"#
        );
        let e = CniError::from_agent(500, b"internal error\n");
        assert_eq!(e.code, code::GENERIC);
        assert_eq!(e.msg, "tidepool agent answered HTTP 500");
        assert_eq!(e.details, "internal error");
        assert_eq!(
            CniError::from_agent(400, br#"{"code":0}"#).code,
            code::GENERIC
        );
        assert_eq!(
            CniError::from_agent(400, br#"{"code":"7"}"#).code,
            code::GENERIC
        );
    }

    #[test]
    fn verbs_map_to_their_paths() {
        let paths: Vec<_> = Verb::ALL.map(Verb::path).into();
        assert_eq!(
            paths,
            [
                "/v1/cni/add",
                "/v1/cni/del",
                "/v1/cni/check",
                "/v1/cni/gc",
                "/v1/cni/status"
            ]
        );
        for v in Verb::ALL {
            assert_eq!(Verb::from_path(v.path()), Some(v));
        }
        assert_eq!(Verb::from_path("/v1/cni/version"), None);
        assert_eq!(Verb::from_path("/v1/cni/"), None);
    }

    #[test]
    fn spool_record_wraps_the_del_body() {
        let rec = spool_record(Value::object([("containerID", Value::str("c"))]), 42);
        assert_eq!(
            rec.to_string(),
            r#"{"spoolVersion":1,"spooledAtMs":42,"del":{"containerID":"c"}}"#
        );
    }
}
