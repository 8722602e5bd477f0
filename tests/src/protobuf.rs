//! The Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`) of the built-in
//! kinds kubectl's imperative `create` commands send: the `k8s\0` envelope around a
//! `runtime.Unknown`, whose `raw` message becomes the object's JSON form through a table of
//! field numbers (from k8s.io/api and k8s.io/apimachinery `generated.proto`). Only ConfigMap,
//! Secret, ServiceAccount, Namespace and the self access reviews (`kubectl auth can-i`) are
//! decoded; other kinds are answered 415.

use serde_json::{Map, Value, json};

use crate::error::Error;

/// How one field's value is written in JSON.
#[derive(Clone, Copy)]
enum Ty {
    Str,
    Bool,
    Int,
    Msg(&'static [Field]),
    /// `map<string, string>`.
    MapStr,
    /// `map<string, bytes>`.
    MapBytes,
    /// `meta.v1.Time` (seconds, nanos): RFC 3339, or nothing for the zero time.
    Time,
    /// `meta.v1.FieldsV1`: its raw JSON.
    FieldsV1,
}

struct Field(u32, &'static str, Ty, bool);

const TIME_ZERO_SECONDS: i64 = -62_135_596_800;

const OWNER_REFERENCE: &[Field] = &[
    Field(5, "apiVersion", Ty::Str, false),
    Field(1, "kind", Ty::Str, false),
    Field(3, "name", Ty::Str, false),
    Field(4, "uid", Ty::Str, false),
    Field(6, "controller", Ty::Bool, false),
    Field(7, "blockOwnerDeletion", Ty::Bool, false),
];
const MANAGED_FIELDS_ENTRY: &[Field] = &[
    Field(1, "manager", Ty::Str, false),
    Field(2, "operation", Ty::Str, false),
    Field(3, "apiVersion", Ty::Str, false),
    Field(4, "time", Ty::Time, false),
    Field(6, "fieldsType", Ty::Str, false),
    Field(7, "fieldsV1", Ty::FieldsV1, false),
    Field(8, "subresource", Ty::Str, false),
];
const OBJECT_META: &[Field] = &[
    Field(1, "name", Ty::Str, false),
    Field(2, "generateName", Ty::Str, false),
    Field(3, "namespace", Ty::Str, false),
    Field(4, "selfLink", Ty::Str, false),
    Field(5, "uid", Ty::Str, false),
    Field(6, "resourceVersion", Ty::Str, false),
    Field(7, "generation", Ty::Int, false),
    Field(8, "creationTimestamp", Ty::Time, false),
    Field(9, "deletionTimestamp", Ty::Time, false),
    Field(10, "deletionGracePeriodSeconds", Ty::Int, false),
    Field(11, "labels", Ty::MapStr, false),
    Field(12, "annotations", Ty::MapStr, false),
    Field(13, "ownerReferences", Ty::Msg(OWNER_REFERENCE), true),
    Field(14, "finalizers", Ty::Str, true),
    Field(17, "managedFields", Ty::Msg(MANAGED_FIELDS_ENTRY), true),
];
const CONFIG_MAP: &[Field] = &[
    Field(1, "metadata", Ty::Msg(OBJECT_META), false),
    Field(2, "data", Ty::MapStr, false),
    Field(3, "binaryData", Ty::MapBytes, false),
    Field(4, "immutable", Ty::Bool, false),
];
const SECRET: &[Field] = &[
    Field(1, "metadata", Ty::Msg(OBJECT_META), false),
    Field(2, "data", Ty::MapBytes, false),
    Field(3, "type", Ty::Str, false),
    Field(4, "stringData", Ty::MapStr, false),
    Field(5, "immutable", Ty::Bool, false),
];
const OBJECT_REFERENCE: &[Field] = &[
    Field(1, "kind", Ty::Str, false),
    Field(2, "namespace", Ty::Str, false),
    Field(3, "name", Ty::Str, false),
    Field(4, "uid", Ty::Str, false),
    Field(5, "apiVersion", Ty::Str, false),
    Field(6, "resourceVersion", Ty::Str, false),
    Field(7, "fieldPath", Ty::Str, false),
];
const LOCAL_OBJECT_REFERENCE: &[Field] = &[Field(1, "name", Ty::Str, false)];
const SERVICE_ACCOUNT: &[Field] = &[
    Field(1, "metadata", Ty::Msg(OBJECT_META), false),
    Field(2, "secrets", Ty::Msg(OBJECT_REFERENCE), true),
    Field(3, "imagePullSecrets", Ty::Msg(LOCAL_OBJECT_REFERENCE), true),
    Field(4, "automountServiceAccountToken", Ty::Bool, false),
];
const NAMESPACE_CONDITION: &[Field] = &[
    Field(1, "type", Ty::Str, false),
    Field(2, "status", Ty::Str, false),
    Field(4, "lastTransitionTime", Ty::Time, false),
    Field(5, "reason", Ty::Str, false),
    Field(6, "message", Ty::Str, false),
];
const NAMESPACE: &[Field] = &[
    Field(1, "metadata", Ty::Msg(OBJECT_META), false),
    Field(
        2,
        "spec",
        Ty::Msg(&[Field(1, "finalizers", Ty::Str, true)]),
        false,
    ),
    Field(
        3,
        "status",
        Ty::Msg(&[
            Field(1, "phase", Ty::Str, false),
            Field(2, "conditions", Ty::Msg(NAMESPACE_CONDITION), true),
        ]),
        false,
    ),
];
const RESOURCE_ATTRIBUTES: &[Field] = &[
    Field(1, "namespace", Ty::Str, false),
    Field(2, "verb", Ty::Str, false),
    Field(3, "group", Ty::Str, false),
    Field(4, "version", Ty::Str, false),
    Field(5, "resource", Ty::Str, false),
    Field(6, "subresource", Ty::Str, false),
    Field(7, "name", Ty::Str, false),
];
const NON_RESOURCE_ATTRIBUTES: &[Field] = &[
    Field(1, "path", Ty::Str, false),
    Field(2, "verb", Ty::Str, false),
];
/// authorization/v1 SelfSubjectAccessReview (its status is the server's to fill).
const SELF_SUBJECT_ACCESS_REVIEW: &[Field] = &[
    Field(1, "metadata", Ty::Msg(OBJECT_META), false),
    Field(
        2,
        "spec",
        Ty::Msg(&[
            Field(1, "resourceAttributes", Ty::Msg(RESOURCE_ATTRIBUTES), false),
            Field(
                2,
                "nonResourceAttributes",
                Ty::Msg(NON_RESOURCE_ATTRIBUTES),
                false,
            ),
        ]),
        false,
    ),
];
const SELF_SUBJECT_RULES_REVIEW: &[Field] = &[
    Field(1, "metadata", Ty::Msg(OBJECT_META), false),
    Field(
        2,
        "spec",
        Ty::Msg(&[Field(1, "namespace", Ty::Str, false)]),
        false,
    ),
];
const TYPE_META: &[Field] = &[
    Field(1, "apiVersion", Ty::Str, false),
    Field(2, "kind", Ty::Str, false),
];

/// The message table of a kind we decode.
fn kind_fields(api_version: &str, kind: &str) -> Option<&'static [Field]> {
    match (api_version, kind) {
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => Some(SELF_SUBJECT_ACCESS_REVIEW),
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => Some(SELF_SUBJECT_RULES_REVIEW),
        ("v1", "ConfigMap") => Some(CONFIG_MAP),
        ("v1", "Secret") => Some(SECRET),
        ("v1", "ServiceAccount") => Some(SERVICE_ACCOUNT),
        ("v1", "Namespace") => Some(NAMESPACE),
        _ => None,
    }
}

fn malformed() -> Error {
    Error::bad_request("the object provided is unrecognized: malformed protobuf message")
}

/// A protobuf reader over one message's bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, Error> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first().ok_or_else(malformed)?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(malformed())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if n > self.0.len() {
            return Err(malformed());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    /// The next field: its number and either a varint or the bytes of a length-delimited
    /// value (fixed-width values are skipped).
    fn field(&mut self) -> Result<(u32, Raw<'a>), Error> {
        let key = self.varint()?;
        let num = u32::try_from(key >> 3).map_err(|_| malformed())?;
        let raw = match key & 7 {
            0 => Raw::Varint(self.varint()?),
            1 => self.take(8).map(|_| Raw::Skipped)?,
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| malformed())?;
                Raw::Bytes(self.take(n)?)
            }
            5 => self.take(4).map(|_| Raw::Skipped)?,
            _ => return Err(malformed()),
        };
        Ok((num, raw))
    }
}

enum Raw<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Skipped,
}

/// `[]byte` as JSON writes it: standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn utf8(b: &[u8]) -> Result<String, Error> {
    String::from_utf8(b.to_vec()).map_err(|_| malformed())
}

/// A `map<string, V>` entry: `(key, value bytes)`.
fn map_entry(b: &[u8]) -> Result<(String, &[u8]), Error> {
    let (mut key, mut value) = (String::new(), &b[..0]);
    let mut r = Reader(b);
    while !r.0.is_empty() {
        match r.field()? {
            (1, Raw::Bytes(k)) => key = utf8(k)?,
            (2, Raw::Bytes(v)) => value = v,
            _ => {}
        }
    }
    Ok((key, value))
}

fn time(b: &[u8]) -> Result<Option<Value>, Error> {
    let (mut secs, mut r) = (0i64, Reader(b));
    while !r.0.is_empty() {
        if let (1, Raw::Varint(v)) = r.field()? {
            secs = v as i64;
        }
    }
    if secs == TIME_ZERO_SECONDS {
        return Ok(None);
    }
    let t = jiff::Timestamp::from_second(secs).map_err(|_| malformed())?;
    Ok(Some(json!(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())))
}

/// `FieldsV1.Raw`: JSON bytes.
fn fields_v1(b: &[u8]) -> Result<Option<Value>, Error> {
    let (mut out, mut r) = (None, Reader(b));
    while !r.0.is_empty() {
        if let (1, Raw::Bytes(j)) = r.field()? {
            out = Some(serde_json::from_slice(j).map_err(|_| malformed())?);
        }
    }
    Ok(out)
}

/// One field value in JSON; `None` for what Go's JSON encoding omits (empty, zero, false).
fn value(ty: Ty, raw: Raw) -> Result<Option<Value>, Error> {
    let v = match (ty, raw) {
        (Ty::Str, Raw::Bytes(b)) => Some(json!(utf8(b)?)).filter(|s| s != ""),
        (Ty::Bool, Raw::Varint(v)) => (v != 0).then_some(json!(true)),
        (Ty::Int, Raw::Varint(v)) => (v != 0).then(|| json!(v as i64)),
        (Ty::Msg(fields), Raw::Bytes(b)) => Some(message(fields, b)?),
        (Ty::Time, Raw::Bytes(b)) => time(b)?,
        (Ty::FieldsV1, Raw::Bytes(b)) => fields_v1(b)?,
        _ => return Err(malformed()),
    };
    Ok(v)
}

/// Decodes one message with its field table into a JSON object.
fn message(fields: &[Field], b: &[u8]) -> Result<Value, Error> {
    let mut out = Map::new();
    let mut r = Reader(b);
    while !r.0.is_empty() {
        let (num, raw) = r.field()?;
        let Some(&Field(_, name, ty, repeated)) = fields.iter().find(|f| f.0 == num) else {
            continue;
        };
        match (ty, raw) {
            (Ty::MapStr | Ty::MapBytes, Raw::Bytes(e)) => {
                let (k, v) = map_entry(e)?;
                let v = match ty {
                    Ty::MapStr => json!(utf8(v)?),
                    _ => json!(base64(v)),
                };
                let m = out.entry(name).or_insert_with(|| json!({}));
                m[k] = v;
            }
            (ty, raw) if repeated => {
                let v = value(ty, raw)?.unwrap_or_else(|| json!(""));
                let a = out.entry(name).or_insert_with(|| json!([]));
                a.as_array_mut().ok_or_else(malformed)?.push(v);
            }
            (ty, raw) => {
                if let Some(v) = value(ty, raw)? {
                    out.insert(name.to_string(), v);
                }
            }
        }
    }
    Ok(Value::Object(out))
}

/// Decodes a protobuf-encoded object (the `k8s\0` envelope) into its JSON form.
pub(crate) fn decode(bytes: &[u8]) -> Result<Value, Error> {
    let unknown = bytes
        .strip_prefix(b"k8s\0")
        .ok_or_else(|| Error::bad_request("provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]"))?;
    let (mut type_meta, mut raw) = (json!({}), &unknown[..0]);
    let mut r = Reader(unknown);
    while !r.0.is_empty() {
        match r.field()? {
            (1, Raw::Bytes(b)) => type_meta = message(TYPE_META, b)?,
            (2, Raw::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let av = type_meta["apiVersion"].as_str().unwrap_or("");
    let kind = type_meta["kind"].as_str().unwrap_or("");
    let Some(fields) = kind_fields(av, kind) else {
        return Err(Error::api(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - this test server decodes {} only for v1 ConfigMap, Secret, ServiceAccount, Namespace and authorization.k8s.io/v1 self access reviews, not {av} {kind}: send application/json",
                crate::media::PROTOBUF
            ),
        ));
    };
    let mut obj = message(fields, raw)?;
    obj["apiVersion"] = json!(av);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ld(num: u32, b: &[u8]) -> Vec<u8> {
        let mut out = vec![(num << 3 | 2) as u8, b.len() as u8];
        out.extend_from_slice(b);
        out
    }

    #[test]
    fn config_map_in_its_envelope() {
        let meta = [ld(1, b"x"), ld(3, b""), ld(8, &[8, 0])].concat();
        let entry = [ld(1, b"a"), ld(2, b"b")].concat();
        let cm = [
            ld(1, &meta),
            ld(2, &entry),
            ld(3, &[ld(1, b"k"), ld(2, b"hi!")].concat()),
        ]
        .concat();
        let tm = [ld(1, b"v1"), ld(2, b"ConfigMap")].concat();
        let body = [b"k8s\0".to_vec(), ld(1, &tm), ld(2, &cm)].concat();
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "x", "creationTimestamp": "1970-01-01T00:00:00Z"},
                "data": {"a": "b"}, "binaryData": {"k": "aGkh"}})
        );
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"a"), "YQ==");
    }
}
