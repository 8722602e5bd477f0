//! Media types of request bodies: which ones an endpoint accepts (415 UnsupportedMediaType
//! otherwise, worded as the real server's negotiation words it) and decoding them to JSON.

use serde_json::Value;

use crate::error::Error;
use crate::registry::ResType;

/// The Kubernetes protobuf encoding.
pub(crate) const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Body types of built-in kinds, in the real server's order (CBOR is off by default).
const BUILTIN_TYPES: [&str; 3] = ["application/json", "application/yaml", PROTOBUF];
/// Custom resources have no protobuf encoding.
const CR_TYPES: [&str; 2] = ["application/json", "application/yaml"];
const BUILTIN_PATCH_TYPES: [&str; 4] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];
pub(crate) const CR_PATCH_TYPES: [&str; 3] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
];

/// The media type without parameters, lower-cased (`application/json; charset=utf-8`).
fn essence(ctype: &str) -> String {
    ctype
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Decodes a JSON or YAML body (`null` when empty).
pub(crate) fn parse_body(bytes: &[u8], ctype: &str) -> Result<Value, Error> {
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    match serde_json::from_slice(bytes) {
        Ok(v) => Ok(v),
        Err(e) if ctype.contains("yaml") => std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| serde_saphyr::from_str::<Value>(s).ok())
            .ok_or_else(|| Error::bad_request(format!("error decoding YAML: {e}"))),
        Err(e) => Err(Error::bad_request(format!(
            "couldn't get version/kind; json parse error: {e}"
        ))),
    }
}

/// The object of a create or update body, refused with 415 unless `rt` accepts its type.
pub(crate) fn object_body(rt: &ResType, bytes: &[u8], ctype: &str) -> Result<Value, Error> {
    let accepted: &[&str] = if rt.crd { &CR_TYPES } else { &BUILTIN_TYPES };
    decode_as(accepted, bytes, ctype)
}

/// The object of a body sent to a built-in endpoint that stores nothing (access reviews).
pub(crate) fn builtin_body(bytes: &[u8], ctype: &str) -> Result<Value, Error> {
    decode_as(&BUILTIN_TYPES, bytes, ctype)
}

fn decode_as(accepted: &[&str], bytes: &[u8], ctype: &str) -> Result<Value, Error> {
    let mt = essence(ctype);
    if !accepted.contains(&mt.as_str()) {
        return Err(Error::unsupported_media_type(accepted));
    }
    if mt == PROTOBUF {
        return crate::protobuf::decode(bytes);
    }
    parse_body(bytes, ctype)
}

/// The patch type of a PATCH body: `merge`, `json`, `strategic` or `apply`.
pub(crate) fn patch_type(rt: &ResType, ctype: &str) -> Result<&'static str, Error> {
    let accepted: &[&str] = if rt.crd {
        &CR_PATCH_TYPES
    } else {
        &BUILTIN_PATCH_TYPES
    };
    let mt = essence(ctype);
    if !accepted.contains(&mt.as_str()) {
        return Err(Error::unsupported_media_type(accepted));
    }
    Ok(match mt.as_str() {
        "application/merge-patch+json" => "merge",
        "application/json-patch+json" => "json",
        "application/strategic-merge-patch+json" => "strategic",
        _ => "apply",
    })
}
