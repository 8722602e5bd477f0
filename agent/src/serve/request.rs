//! A `POST /v1/cni/…` body as the plugin sends it ([`crate::cni::proto`], "Requests"), and
//! the server's answers.

use serde::Deserialize;
use serde_json::{Value, json};
use tidepool_ipam::PodUid;

use crate::cni::proto::code;
use crate::state::{AllocKey, parse_pod_uid};

/// The request body; absent members read as `null`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniRequest {
    #[serde(rename = "containerID", default)]
    pub container_id: Option<String>,
    #[serde(default)]
    pub ifname: Option<String>,
    #[serde(default)]
    pub netns: Option<String>,
    #[serde(default)]
    pub pod_namespace: Option<String>,
    #[serde(default)]
    pub pod_name: Option<String>,
    #[serde(rename = "podUID", default)]
    pub pod_uid: Option<String>,
    pub cni_version: String,
    pub config: Value,
}

/// The pod UID a request names, as a DEL reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UidArg {
    /// None given: the DEL is matched by its key alone.
    Absent,
    Valid(PodUid),
    /// Not a UUID: it matches no owner, so the DEL frees nothing.
    Invalid,
}

impl CniRequest {
    /// Parses a body; a body that is not one is a code-6 error naming the problem.
    pub fn parse(body: &[u8]) -> Result<Self, Reply> {
        let req: CniRequest = serde_json::from_slice(body).map_err(|e| {
            Reply::error(
                code::DECODING_FAILURE,
                "the request body is not a tidepool CNI request",
                e.to_string(),
            )
        })?;
        if req.cni_version.is_empty() {
            return Err(Reply::error(
                code::DECODING_FAILURE,
                "the request has an empty cniVersion",
                "",
            ));
        }
        Ok(req)
    }

    /// The allocation's key; both parts must be present and non-empty.
    pub fn key(&self) -> Result<AllocKey, Reply> {
        match (self.container_id.as_deref(), self.ifname.as_deref()) {
            (Some(c), Some(i)) if !c.is_empty() && !i.is_empty() => Ok(AllocKey::new(c, i)),
            _ => Err(Reply::error(
                code::INVALID_ENV,
                "the request lacks containerID or ifname",
                "CNI_CONTAINERID and CNI_IFNAME are required for ADD, DEL and CHECK",
            )),
        }
    }

    pub fn uid(&self) -> UidArg {
        match self.pod_uid.as_deref() {
            None | Some("") => UidArg::Absent,
            Some(s) => parse_pod_uid(s).map_or(UidArg::Invalid, UidArg::Valid),
        }
    }

    /// The pod UID an ADD needs: an allocation without its pod's identity could be neither
    /// published in `status.used` nor told from a stale DEL.
    pub fn required_uid(&self) -> Result<PodUid, Reply> {
        match self.uid() {
            UidArg::Valid(u) => Ok(u),
            UidArg::Absent => Err(Reply::error(
                code::INVALID_ENV,
                "ADD without a pod UID",
                "CNI_ARGS must carry K8S_POD_UID (the allocation's identity)",
            )),
            UidArg::Invalid => Err(Reply::error(
                code::INVALID_ENV,
                "ADD with a pod UID that is not a UUID",
                format!(
                    "K8S_POD_UID={:?}",
                    self.pod_uid.as_deref().unwrap_or_default()
                ),
            )),
        }
    }

    /// The CNI network the request is for: its network config's `name` (`None`: none given).
    pub fn network(&self) -> Option<&str> {
        self.config.get("name")?.as_str().filter(|n| !n.is_empty())
    }

    /// GC's `cni.dev/valid-attachments` as keys; `None` when the config has none (GC then
    /// frees nothing). Entries that are not `{containerID, ifname}` strings are skipped.
    pub fn valid_attachments(&self) -> Option<Vec<AllocKey>> {
        let list = self.config.get("cni.dev/valid-attachments")?.as_array()?;
        Some(
            list.iter()
                .filter_map(|a| {
                    let c = a.get("containerID")?.as_str()?;
                    let i = a.get("ifname")?.as_str()?;
                    Some(AllocKey::new(c, i))
                })
                .collect(),
        )
    }

    /// The addresses of CHECK's `prevResult` (`ips[].address` without the prefix length).
    pub fn prev_result_addresses(&self) -> Option<Vec<String>> {
        let ips = self.config.get("prevResult")?.get("ips")?.as_array()?;
        Some(
            ips.iter()
                .filter_map(|ip| ip.get("address")?.as_str())
                .map(|a| a.split('/').next().unwrap_or(a).to_owned())
                .collect(),
        )
    }
}

/// An answer: HTTP status and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    pub fn ok(body: Value) -> Self {
        Reply { status: 200, body }
    }

    /// Success with nothing to say (`{}`).
    pub fn empty() -> Self {
        Reply::ok(json!({}))
    }

    /// A CNI error `{code, msg, details}`, with the HTTP status its code suggests.
    pub fn error(code: u64, msg: impl Into<String>, details: impl Into<String>) -> Self {
        let status = match code {
            code::DECODING_FAILURE | code::INVALID_ENV | code::INVALID_CONFIG => 400,
            code::TRY_AGAIN_LATER | code::PLUGIN_NOT_AVAILABLE => 503,
            _ => 500,
        };
        Reply {
            status,
            body: json!({"code": code, "msg": msg.into(), "details": details.into()}),
        }
    }

    /// The CNI code of an error reply.
    pub fn code(&self) -> Option<u64> {
        self.body.get("code").and_then(Value::as_u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_that_is_not_json_is_code_6_naming_the_problem() {
        let r = CniRequest::parse(b"{not json").expect_err("bad");
        assert_eq!((r.status, r.code()), (400, Some(6)));
        assert!(r.body["details"].as_str().is_some_and(|d| !d.is_empty()));
        let r = CniRequest::parse(br#"{"containerID":"c"}"#).expect_err("no version");
        assert!(
            r.body["details"]
                .as_str()
                .is_some_and(|d| d.contains("cniVersion"))
        );
    }

    #[test]
    fn keys_uids_and_attachments_are_read() {
        let r = CniRequest::parse(
            br#"{"containerID":"c1","ifname":"eth0","netns":null,"podNamespace":"d","podName":"p",
            "podUID":"0badc0de-0000-4000-8000-000000000001","cniVersion":"1.1.0",
            "config":{"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"},{"x":1}],
            "prevResult":{"ips":[{"address":"10.0.0.5/16"}]}}}"#,
        )
        .expect("parse");
        assert_eq!(r.key().expect("key"), AllocKey::new("c1", "eth0"));
        assert!(matches!(r.uid(), UidArg::Valid(_)));
        assert_eq!(
            r.valid_attachments(),
            Some(vec![AllocKey::new("c1", "eth0")])
        );
        assert_eq!(r.prev_result_addresses(), Some(vec!["10.0.0.5".to_owned()]));
        let bad = CniRequest {
            pod_uid: Some("uid-1".into()),
            container_id: None,
            ..r
        };
        assert_eq!(bad.uid(), UidArg::Invalid);
        assert_eq!(bad.key().expect_err("no key").code(), Some(4));
        assert_eq!(bad.required_uid().expect_err("bad uid").code(), Some(4));
    }
}
