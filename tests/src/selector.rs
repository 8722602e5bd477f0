//! Label and field selectors.

use serde_json::Value;

use crate::error::Error;

#[derive(Debug, Clone)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector plus field selector.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selector {
    labels: Vec<Req>,
    fields: Vec<Req>,
}

fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn is_set(v: &str) -> bool {
    let v = v.trim();
    v.starts_with('(') && v.ends_with(')')
}

fn set_values(s: &str) -> Vec<String> {
    s.trim()
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(|v| v.trim().to_string())
        .collect()
}

/// The first token the real selector lexer reads from `s` (for error messages).
fn first_token(s: &str) -> &str {
    if s.starts_with("!=") || s.starts_with("==") {
        return &s[..2];
    }
    match s.chars().next() {
        None => "",
        Some(c) if "!=(),<>".contains(c) => &s[..1],
        Some(_) => s
            .split(|c: char| c.is_whitespace() || "!=(),<>".contains(c))
            .next()
            .unwrap_or(""),
    }
}

/// A key after `!`: the lexer must find an identifier there.
fn identifier(k: &str) -> Result<&str, Error> {
    let tok = first_token(k);
    if tok.is_empty() || tok.starts_with(|c: char| "!=(),<>".contains(c)) {
        return Err(Error::bad_request(format!(
            "unable to parse requirement: found '{tok}', expected: identifier"
        )));
    }
    Ok(k)
}

fn parse_labels(s: &str) -> Result<Vec<Req>, Error> {
    let mut out = Vec::new();
    for part in split_top(s) {
        let req = if let Some((k, v)) = part.split_once("!=") {
            Req::Ne(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = part.split_once(" notin ").filter(|(_, v)| is_set(v)) {
            Req::NotIn(k.trim().into(), set_values(v))
        } else if let Some((k, v)) = part.split_once(" in ").filter(|(_, v)| is_set(v)) {
            Req::In(k.trim().into(), set_values(v))
        } else if let Some(k) = part.strip_prefix('!') {
            Req::NotExists(identifier(k.trim())?.into())
        } else if part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        {
            Req::Exists(part.into())
        } else {
            return Err(Error::bad_request(format!(
                "unable to parse requirement: {part:?}"
            )));
        };
        out.push(req);
    }
    Ok(out)
}

fn matches(reqs: &[Req], get: impl Fn(&str) -> Option<String>) -> bool {
    reqs.iter().all(|r| match r {
        Req::Eq(k, v) => get(k).as_deref() == Some(v.as_str()),
        Req::Ne(k, v) => get(k).as_deref() != Some(v.as_str()),
        Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
        Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
        Req::Exists(k) => get(k).is_some(),
        Req::NotExists(k) => get(k).is_none(),
    })
}

impl Selector {
    pub(crate) fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Self, Error> {
        let fields = match fields {
            Some(f) => parse_labels(f)?
                .into_iter()
                .map(|r| match r {
                    Req::Eq(..) | Req::Ne(..) => Ok(r),
                    _ => Err(Error::bad_request(format!("invalid field selector: {f:?}"))),
                })
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        Ok(Selector {
            labels: labels.map(parse_labels).transpose()?.unwrap_or_default(),
            fields,
        })
    }

    /// Field labels used by the field selector.
    pub(crate) fn field_keys(&self) -> Vec<&str> {
        self.fields
            .iter()
            .map(|r| match r {
                Req::Eq(k, _)
                | Req::Ne(k, _)
                | Req::In(k, _)
                | Req::NotIn(k, _)
                | Req::Exists(k)
                | Req::NotExists(k) => k.as_str(),
            })
            .collect()
    }

    /// The value the field selector requires `key` to equal (`RequiresExactMatch`).
    pub(crate) fn required_field(&self, key: &str) -> Option<&str> {
        self.fields.iter().find_map(|r| match r {
            Req::Eq(k, v) if k == key => Some(v.as_str()),
            _ => None,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        matches(&self.labels, |k| {
            labels
                .and_then(|l| l.get(k))
                .and_then(Value::as_str)
                .map(String::from)
        }) && matches(&self.fields, |k| {
            let ptr = format!("/{}", k.replace('.', "/"));
            match obj.pointer(&ptr) {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Null) | None => Some(String::new()),
                Some(other) => Some(other.to_string()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_and_field_selectors() {
        let o = json!({"metadata": {"name": "a", "labels": {"app": "x", "tier": "web"}}});
        let m = |l: Option<&str>, f: Option<&str>| Selector::parse(l, f).unwrap().matches(&o);
        assert!(m(Some("app=x,tier in (web,db)"), None));
        assert!(!m(Some("app=x,tier notin (web)"), None));
        assert!(m(Some("app,!missing"), None));
        assert!(!m(Some("app!=x"), None));
        assert!(m(None, Some("metadata.name=a")));
        assert!(!m(None, Some("metadata.name!=a")));
        assert!(Selector::parse(Some("a in b c"), None).is_err());
        let err = Selector::parse(Some("!!!"), None).unwrap_err();
        assert_eq!(
            err.status()["message"],
            "unable to parse requirement: found '!', expected: identifier"
        );
    }
}
