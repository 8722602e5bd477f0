//! The Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`) of the built-in
//! kinds kubectl's imperative `create` commands send: the `k8s\0` envelope around a
//! `runtime.Unknown`, whose `raw` message becomes the object's JSON form through tables of
//! field numbers (from k8s.io/api and k8s.io/apimachinery `generated.proto`). Decoded: v1
//! ConfigMap, Secret, ServiceAccount, Namespace, apps/v1 Deployment and the self access
//! reviews (`kubectl auth can-i`); other kinds are answered 415.
//!
//! Unknown fields: a field number a table does not list is skipped, as the real server's
//! generated decoders skip numbers they do not know. A field the real type has but this
//! server does not decode is listed as `Ty::Unsupported` and refused with 415 when present,
//! so that a body is never stored with less than its JSON form would carry.

mod apps;
mod authorization;
mod core;
mod fields;
mod wire;

use serde_json::{Map, Value, json};

use crate::error::Error;
use fields::{Card, Field, TYPE_META, Ty};
use wire::{Raw, Reader, malformed};

/// `metav1.Time`'s zero value, `0001-01-01T00:00:00Z`, in Unix seconds.
const TIME_ZERO_SECONDS: i64 = -62_135_596_800;

/// The message table of a kind we decode.
fn kind_fields(api_version: &str, kind: &str) -> Option<&'static [Field]> {
    match (api_version, kind) {
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => {
            Some(authorization::SELF_SUBJECT_ACCESS_REVIEW)
        }
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => {
            Some(authorization::SELF_SUBJECT_RULES_REVIEW)
        }
        ("v1", "ConfigMap") => Some(core::CONFIG_MAP),
        ("v1", "Secret") => Some(core::SECRET),
        ("v1", "ServiceAccount") => Some(core::SERVICE_ACCOUNT),
        ("v1", "Namespace") => Some(core::NAMESPACE),
        ("apps/v1", "Deployment") => Some(apps::DEPLOYMENT),
        _ => None,
    }
}

/// 415 for a field of the real type that the tables do not decode.
fn unsupported_field(path: &str) -> Error {
    Error::api(
        415,
        "UnsupportedMediaType",
        format!(
            "the body of the request was in an unknown format - this test server does not decode field {path} from {}: send application/json",
            crate::media::PROTOBUF
        ),
    )
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
    while !r.is_empty() {
        match r.field()? {
            (1, Raw::Bytes(k)) => key = utf8(k)?,
            (2, Raw::Bytes(v)) => value = v,
            _ => {}
        }
    }
    Ok((key, value))
}

/// A map value as JSON writes it.
fn map_value(ty: Ty, v: &[u8]) -> Result<Value, Error> {
    Ok(match ty {
        Ty::MapStr => json!(utf8(v)?),
        Ty::MapBytes => json!(base64(v)),
        _ => json!(quantity(v)?),
    })
}

/// `resource.Quantity`: its canonical string (field 1).
fn quantity(b: &[u8]) -> Result<String, Error> {
    let (mut s, mut r) = (String::new(), Reader(b));
    while !r.is_empty() {
        if let (1, Raw::Bytes(v)) = r.field()? {
            s = utf8(v)?;
        }
    }
    Ok(s)
}

/// `metav1.Time`; an empty message is the zero time (`Time.Unmarshal`), which JSON leaves out.
fn time(b: &[u8]) -> Result<Option<Value>, Error> {
    if b.is_empty() {
        return Ok(None);
    }
    let (mut secs, mut r) = (0i64, Reader(b));
    while !r.is_empty() {
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
    while !r.is_empty() {
        if let (1, Raw::Bytes(j)) = r.field()? {
            out = Some(serde_json::from_slice(j).map_err(|_| malformed())?);
        }
    }
    Ok(out)
}

/// `intstr.IntOrString` (type, intVal, strVal): a number for type 0, else the string.
fn int_or_string(b: &[u8]) -> Result<Value, Error> {
    let (mut is_str, mut int, mut s) = (false, 0i64, String::new());
    let mut r = Reader(b);
    while !r.is_empty() {
        match r.field()? {
            (1, Raw::Varint(t)) => is_str = t == 1,
            (2, Raw::Varint(v)) => int = i64::from(v as i32),
            (3, Raw::Bytes(v)) => s = utf8(v)?,
            _ => {}
        }
    }
    Ok(if is_str { json!(s) } else { json!(int) })
}

/// One field value in JSON; `None` for a zero value that Go's JSON encoding omits (`keep`
/// false: `omitempty` on a value).
fn value(ty: Ty, raw: Raw, keep: bool, path: &str) -> Result<Option<Value>, Error> {
    let v = match (ty, raw) {
        (Ty::Unsupported, _) => return Err(unsupported_field(path)),
        (Ty::Str, Raw::Bytes(b)) => Some(json!(utf8(b)?)).filter(|s| keep || s != ""),
        (Ty::Bool, Raw::Varint(v)) => (keep || v != 0).then_some(json!(v != 0)),
        (Ty::Int, Raw::Varint(v)) => (keep || v != 0).then(|| json!(v as i64)),
        (Ty::Msg(fields), Raw::Bytes(b)) => Some(message(fields, b, path)?),
        (Ty::Time, Raw::Bytes(b)) => time(b)?,
        (Ty::FieldsV1, Raw::Bytes(b)) => fields_v1(b)?,
        (Ty::IntOrString, Raw::Bytes(b)) => Some(int_or_string(b)?),
        _ => return Err(malformed()),
    };
    Ok(v)
}

/// Decodes one message with its field table into a JSON object; `path` names it in errors.
fn message(fields: &[Field], b: &[u8], path: &str) -> Result<Value, Error> {
    let mut out = Map::new();
    let mut r = Reader(b);
    while !r.is_empty() {
        let (num, raw) = r.field()?;
        let Some(&Field(_, name, ty, card)) = fields.iter().find(|f| f.0 == num) else {
            continue;
        };
        let path = if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        };
        match (ty, raw) {
            (Ty::MapStr | Ty::MapBytes | Ty::MapQuantity, Raw::Bytes(e)) => {
                let (k, v) = map_entry(e)?;
                let m = out.entry(name).or_insert_with(|| json!({}));
                m[k] = map_value(ty, v)?;
            }
            (ty, raw) if card == Card::Rep => {
                let v = value(ty, raw, true, &path)?.unwrap_or(Value::Null);
                let a = out.entry(name).or_insert_with(|| json!([]));
                a.as_array_mut().ok_or_else(malformed)?.push(v);
            }
            (ty, raw) => {
                if let Some(v) = value(ty, raw, card == Card::Keep, &path)? {
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
    while !r.is_empty() {
        match r.field()? {
            (1, Raw::Bytes(b)) => type_meta = message(TYPE_META, b, "")?,
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
                "the body of the request was in an unknown format - this test server decodes {} only for v1 ConfigMap, Secret, ServiceAccount, Namespace, apps/v1 Deployment and authorization.k8s.io/v1 self access reviews, not {av} {kind}: send application/json",
                crate::media::PROTOBUF
            ),
        ));
    };
    let mut obj = message(fields, raw, "")?;
    obj["apiVersion"] = json!(av);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64) -> Vec<u8> {
        let mut out = vec![];
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    /// A length-delimited field.
    fn ld(num: u32, b: &[u8]) -> Vec<u8> {
        [
            varint(u64::from(num << 3 | 2)),
            varint(b.len() as u64),
            b.to_vec(),
        ]
        .concat()
    }

    /// A varint field (negative numbers sign-extended, as Go writes int32 and int64).
    fn vi(num: u32, v: i64) -> Vec<u8> {
        [varint(u64::from(num << 3)), varint(v as u64)].concat()
    }

    fn envelope(api_version: &str, kind: &str, obj: &[u8]) -> Vec<u8> {
        let tm = [ld(1, api_version.as_bytes()), ld(2, kind.as_bytes())].concat();
        [b"k8s\0".to_vec(), ld(1, &tm), ld(2, obj)].concat()
    }

    fn deployment(spec: &[u8]) -> Vec<u8> {
        let meta = ld(1, b"d");
        envelope(
            "apps/v1",
            "Deployment",
            &[ld(1, &meta), ld(2, spec)].concat(),
        )
    }

    /// kubectl's JSON form of an object, without the `creationTimestamp: null` of its zero
    /// times (which the decoder leaves out, as the server's typed round trip does).
    fn without_null_times(mut v: Value) -> Value {
        if let Some(o) = v.as_object_mut() {
            o.retain(|k, v| !(k == "creationTimestamp" && v.is_null()));
            o.values_mut()
                .for_each(|v| *v = without_null_times(v.take()));
        } else if let Some(a) = v.as_array_mut() {
            a.iter_mut().for_each(|v| *v = without_null_times(v.take()));
        }
        v
    }

    #[test]
    fn config_map_in_its_envelope() {
        let meta = [ld(1, b"x"), ld(3, b""), ld(8, &[8, 0])].concat();
        let entry = [ld(1, b"a"), ld(2, b"b")].concat();
        let cm = [
            ld(1, &meta),
            ld(2, &entry),
            ld(3, &[ld(1, b"k"), ld(2, b"hi!")].concat()),
            vi(4, 0),
        ]
        .concat();
        assert_eq!(
            decode(&envelope("v1", "ConfigMap", &cm)).unwrap(),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "x", "creationTimestamp": "1970-01-01T00:00:00Z"},
                "data": {"a": "b"}, "binaryData": {"k": "aGkh"}, "immutable": false})
        );
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"a"), "YQ==");
    }

    /// Bodies captured from kubectl 1.32 (`kubectl create deployment ... -n default`, sent
    /// to a listener that saved them) decode to what the same kubectl prints for the same
    /// command with `--dry-run=client -o json`.
    #[test]
    fn kubectl_create_deployment_bodies_decode_to_kubectls_json() {
        let cases: [(&[u8], &str); 2] = [
            (
                include_bytes!("testdata/create-deployment-web.pb"),
                include_str!("testdata/create-deployment-web.json"),
            ),
            (
                include_bytes!("testdata/create-deployment-two-images.pb"),
                include_str!("testdata/create-deployment-two-images.json"),
            ),
        ];
        for (body, json) in cases {
            let want = without_null_times(serde_json::from_str(json).unwrap());
            assert_eq!(decode(body).unwrap(), want);
        }
        let two = decode(cases[1].0).unwrap();
        assert_eq!(two["spec"]["replicas"], json!(0), "a zero pointer is kept");
    }

    #[test]
    fn deployment_spec_fields_and_json_omission() {
        let expr = [ld(1, b"tier"), ld(2, b"In"), ld(3, b"a"), ld(3, b"")].concat();
        let selector = [
            ld(2, &expr),
            ld(2, &[ld(1, b""), ld(2, b"Exists")].concat()),
        ]
        .concat();
        let rolling = [
            ld(1, &[vi(1, 0), vi(2, 2)].concat()),
            ld(2, &[vi(1, 1), ld(3, b"25%")].concat()),
        ]
        .concat();
        let strategy = [ld(1, b"RollingUpdate"), ld(2, &rolling)].concat();
        let container = [
            ld(1, b""),
            ld(2, b"img"),
            ld(4, b"-v"),
            ld(6, &[vi(2, 0), vi(3, 0)].concat()),
            ld(8, &ld(2, &[ld(1, b"cpu"), ld(2, &ld(1, b"100m"))].concat())),
            vi(16, 0),
        ]
        .concat();
        let pod = [
            ld(2, &container),
            vi(4, -1),
            vi(21, 0),
            vi(11, 0),
            ld(29, b""),
        ]
        .concat();
        let template = [ld(1, &[ld(8, b""), ld(1, b"")].concat()), ld(2, &pod)].concat();
        let spec = [
            vi(1, 0),
            ld(2, &selector),
            ld(3, &template),
            ld(4, &strategy),
            vi(5, 0),
            vi(6, 0),
            vi(7, 1),
            vi(9, 600),
            vi(99, 7),
        ]
        .concat();
        let d = decode(&deployment(&spec)).unwrap();
        assert_eq!(
            d["spec"],
            json!({
                "replicas": 0,
                "selector": {"matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["a", ""]},
                    {"key": "", "operator": "Exists"}]},
                "template": {"metadata": {}, "spec": {
                    "containers": [{"name": "", "image": "img", "args": ["-v"],
                        "ports": [{"containerPort": 0}],
                        "resources": {"requests": {"cpu": "100m"}}}],
                    "terminationGracePeriodSeconds": -1,
                    "automountServiceAccountToken": false,
                    "runtimeClassName": ""}},
                "strategy": {"type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": 2, "maxSurge": "25%"}},
                "revisionHistoryLimit": 0,
                "paused": true,
                "progressDeadlineSeconds": 600
            })
        );
    }

    #[test]
    fn deployment_status_conditions() {
        let cond = [
            ld(1, b"Available"),
            ld(2, b"True"),
            ld(7, &vi(1, 1_700_000_000)),
            ld(6, b""),
        ]
        .concat();
        let status = [vi(1, 2), vi(2, 0), ld(6, &cond), vi(8, 0)].concat();
        let obj = [ld(1, &ld(1, b"d")), ld(3, &status)].concat();
        let d = decode(&envelope("apps/v1", "Deployment", &obj)).unwrap();
        assert_eq!(
            d["status"],
            json!({"observedGeneration": 2, "collisionCount": 0, "conditions": [
                {"type": "Available", "status": "True",
                 "lastTransitionTime": "2023-11-14T22:13:20Z"}]})
        );
    }

    #[test]
    fn fields_not_decoded_are_refused_by_path() {
        let pod = ld(2, &[ld(1, b"c"), ld(7, &ld(1, b"X"))].concat());
        let spec = ld(3, &ld(2, &pod));
        let Err(Error::Api { code, message, .. }) = decode(&deployment(&spec)) else {
            panic!("an env var must not be dropped");
        };
        assert_eq!(code, 415);
        assert!(
            message.contains("field spec.template.spec.containers.env from"),
            "{message}"
        );
        let volumes = ld(3, &ld(2, &ld(1, &ld(1, b"v"))));
        let err = decode(&deployment(&volumes)).unwrap_err().to_string();
        assert!(err.contains("spec.template.spec.volumes"), "{err}");
    }

    #[test]
    fn other_kinds_and_broken_bodies() {
        let err = decode(&envelope("v1", "Pod", b"")).unwrap_err().to_string();
        assert!(
            err.starts_with("415 UnsupportedMediaType") && err.contains("not v1 Pod"),
            "{err}"
        );
        let err = decode(b"{}").unwrap_err().to_string();
        assert!(err.starts_with("400 BadRequest"), "{err}");
        let mut truncated = deployment(&vi(1, 3));
        truncated.pop();
        let err = decode(&truncated).unwrap_err().to_string();
        assert!(err.contains("malformed protobuf message"), "{err}");
        let wrong_wire_type = deployment(&ld(1, b"3"));
        assert!(decode(&wrong_wire_type).is_err(), "replicas is a varint");
    }
}
