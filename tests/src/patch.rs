//! Patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a strategic merge
//! patch that merges lists of objects by their well-known merge keys.

use serde_json::{Map, Value};

use crate::error::Error;

/// RFC 7386 merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Merge keys a strategic merge patch uses for lists of objects, by field name.
pub(crate) fn merge_keys(field: &str, sample: Option<&Value>) -> Option<Vec<&'static str>> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets" => {
            vec!["name"]
        }
        "conditions" => vec!["type"],
        "podIPs" | "hostIPs" => vec!["ip"],
        "ownerReferences" => vec!["uid"],
        "volumeMounts" => vec!["mountPath"],
        "ports" => {
            if sample.is_some_and(|s| s.get("containerPort").is_some()) {
                vec!["containerPort", "protocol"]
            } else {
                vec!["port", "protocol"]
            }
        }
        _ => return None,
    })
}

fn key_of(item: &Value, keys: &[&str]) -> Vec<Value> {
    keys.iter()
        .map(|k| match (item.get(*k), *k) {
            (Some(v), _) => v.clone(),
            (None, "protocol") => Value::String("TCP".into()),
            (None, _) => Value::Null,
        })
        .collect()
}

/// Strategic merge patch: merge patch, plus merging of keyed lists and the `$patch`,
/// `$setElementOrder`, `$retainKeys` and `$deleteFromPrimitiveList` directives.
pub(crate) fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut clean = patch.clone();
        clean.as_object_mut().expect("object").remove("$patch");
        *target = clean;
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(&k.as_str()) || p.contains_key(k));
    }
    for (k, v) in p {
        if k.starts_with('$') {
            if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/")
                && let (Some(Value::Array(cur)), Value::Array(del)) = (t.get_mut(field), v)
            {
                cur.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match v {
            Value::Array(items) => {
                let sample = items.first();
                let keys = merge_keys(k, sample).filter(|_| items.iter().all(Value::is_object));
                match (keys, t.get_mut(k)) {
                    (Some(keys), Some(Value::Array(cur))) => {
                        for item in items {
                            let key = key_of(item, &keys);
                            let pos = cur.iter().position(|c| key_of(c, &keys) == key);
                            let directive = item.get("$patch").and_then(Value::as_str);
                            match (pos, directive) {
                                (Some(i), Some("delete")) => {
                                    cur.remove(i);
                                }
                                (None, Some("delete")) => {}
                                (Some(i), _) => strategic_merge(&mut cur[i], item),
                                (None, _) => {
                                    let mut n = Value::Null;
                                    strategic_merge(&mut n, item);
                                    cur.push(n);
                                }
                            }
                        }
                    }
                    _ => {
                        let cleaned: Vec<Value> = items
                            .iter()
                            .filter(|i| i.get("$patch").is_none())
                            .map(|i| {
                                let mut n = Value::Null;
                                strategic_merge(&mut n, i);
                                n
                            })
                            .collect();
                        t.insert(k.clone(), Value::Array(cleaned));
                    }
                }
            }
            Value::Object(_) => strategic_merge(t.entry(k.clone()).or_insert(Value::Null), v),
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
}

fn unescape(tok: &str) -> String {
    tok.replace("~1", "/").replace("~0", "~")
}

fn split_pointer(p: &str) -> Result<Vec<String>, Error> {
    if p.is_empty() {
        return Ok(vec![]);
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(Error::bad_request(format!("invalid JSON pointer {p:?}")));
    };
    Ok(rest.split('/').map(unescape).collect())
}

fn parent_mut<'a>(doc: &'a mut Value, toks: &[String]) -> Result<&'a mut Value, Error> {
    let mut cur = doc;
    for t in toks {
        cur = match cur {
            Value::Object(m) => m.get_mut(t),
            Value::Array(a) => t.parse::<usize>().ok().and_then(move |i| a.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| {
            Error::api(
                422,
                "Invalid",
                format!("jsonpatch: path not found: /{}", toks.join("/")),
            )
        })?;
    }
    Ok(cur)
}

fn get_at(doc: &Value, path: &str) -> Result<Value, Error> {
    doc.pointer(path).cloned().ok_or_else(|| {
        Error::api(
            422,
            "Invalid",
            format!("jsonpatch: missing value at {path}"),
        )
    })
}

fn add_at(doc: &mut Value, path: &str, val: Value, replace: bool) -> Result<(), Error> {
    let toks = split_pointer(path)?;
    let Some((last, parent)) = toks.split_last() else {
        *doc = val;
        return Ok(());
    };
    match parent_mut(doc, parent)? {
        Value::Object(m) => {
            if replace && !m.contains_key(last) {
                return Err(Error::api(
                    422,
                    "Invalid",
                    format!(
                        "jsonpatch replace operation does not apply: doc is missing key: {path}"
                    ),
                ));
            }
            m.insert(last.clone(), val);
        }
        Value::Array(a) => {
            if replace {
                let i: usize = last.parse().map_err(|_| Error::bad_request("bad index"))?;
                *a.get_mut(i)
                    .ok_or_else(|| Error::api(422, "Invalid", "jsonpatch: index out of range"))? =
                    val;
            } else if last == "-" {
                a.push(val);
            } else {
                let i: usize = last.parse().map_err(|_| Error::bad_request("bad index"))?;
                if i > a.len() {
                    return Err(Error::api(422, "Invalid", "jsonpatch: index out of range"));
                }
                a.insert(i, val);
            }
        }
        _ => {
            return Err(Error::api(
                422,
                "Invalid",
                format!("jsonpatch: cannot add at {path}"),
            ));
        }
    }
    Ok(())
}

fn remove_at(doc: &mut Value, path: &str) -> Result<Value, Error> {
    let toks = split_pointer(path)?;
    let Some((last, parent)) = toks.split_last() else {
        return Err(Error::bad_request("cannot remove the root"));
    };
    let missing = || {
        Error::api(
            422,
            "Invalid",
            format!("jsonpatch remove operation does not apply: doc is missing path: {path}"),
        )
    };
    match parent_mut(doc, parent)? {
        Value::Object(m) => m.remove(last).ok_or_else(missing),
        Value::Array(a) => {
            let i: usize = last.parse().map_err(|_| missing())?;
            if i < a.len() {
                Ok(a.remove(i))
            } else {
                Err(missing())
            }
        }
        _ => Err(missing()),
    }
}

/// RFC 6902 JSON patch.
pub(crate) fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), Error> {
    let ops = ops
        .as_array()
        .ok_or_else(|| Error::bad_request("json patch must be an array"))?;
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::bad_request("json patch operation without path"))?;
        let from = op.get("from").and_then(Value::as_str);
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| Error::bad_request(format!("json patch {kind} without value")))
        };
        match kind {
            "add" => add_at(doc, path, value()?, false)?,
            "replace" => add_at(doc, path, value()?, true)?,
            "remove" => {
                remove_at(doc, path)?;
            }
            "move" => {
                let v = remove_at(
                    doc,
                    from.ok_or_else(|| Error::bad_request("move without from"))?,
                )?;
                add_at(doc, path, v, false)?;
            }
            "copy" => {
                let v = get_at(
                    doc,
                    from.ok_or_else(|| Error::bad_request("copy without from"))?,
                )?;
                add_at(doc, path, v, false)?;
            }
            "test" => {
                let want = value()?;
                // As in Go's json-patch, testing a missing path against null succeeds.
                if want.is_null() && doc.pointer(path).is_none() {
                    continue;
                }
                if get_at(doc, path)? != want {
                    return Err(Error::api(
                        422,
                        "Invalid",
                        format!("jsonpatch: test operation failed at {path}"),
                    ));
                }
            }
            other => {
                return Err(Error::bad_request(format!(
                    "unknown json patch operation {other:?}"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_removes_nulls_and_merges() {
        let mut d = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge_patch(&mut d, &json!({"a": {"b": null, "d": 3}, "l": [3]}));
        assert_eq!(d, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
    }

    #[test]
    fn json_patch_ops() {
        let mut d = json!({"a": [1, 2], "b": {"c": 1}});
        json_patch(
            &mut d,
            &json!([
                {"op": "add", "path": "/a/-", "value": 3},
                {"op": "replace", "path": "/b/c", "value": 5},
                {"op": "test", "path": "/b/c", "value": 5},
                {"op": "remove", "path": "/a/0"},
                {"op": "copy", "from": "/b", "path": "/e"}
            ]),
        )
        .unwrap();
        assert_eq!(d, json!({"a": [2, 3], "b": {"c": 5}, "e": {"c": 5}}));
        assert!(json_patch(&mut d, &json!([{"op": "test", "path": "/b/c", "value": 1}])).is_err());
        assert!(json_patch(&mut d, &json!([{"op": "remove", "path": "/zz"}])).is_err());
    }

    #[test]
    fn strategic_merges_keyed_lists() {
        let mut d = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        strategic_merge(
            &mut d,
            &json!({"spec": {"containers": [{"name": "b", "image": "z"}, {"name": "c", "image": "w"}],
            "$setElementOrder/containers": [{"name": "a"}]}}),
        );
        assert_eq!(
            d["spec"]["containers"],
            json!([{"name": "a", "image": "x"}, {"name": "b", "image": "z"}, {"name": "c", "image": "w"}])
        );
        strategic_merge(
            &mut d,
            &json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}),
        );
        assert_eq!(d["spec"]["containers"].as_array().unwrap().len(), 2);
    }
}
