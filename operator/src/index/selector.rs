//! A label selector: `--node-selector` (which Nodes the operator manages) and
//! `--agent-pod-selector` (which pods are the node agents).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::Error;

/// A label selector in Kubernetes' string form, limited to what equality needs:
/// requirements separated by commas, each `key=value` (or `key==value`), `key!=value`
/// (matches an object without the label too, as in Kubernetes), `key` (the label is set) or
/// `!key` (it is not). Keys and values follow Kubernetes' label syntax. Set-based
/// requirements (`key in (a,b)`, `key notin (a)`) and anything else are refused with an
/// error naming the input. The empty selector selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
}

impl LabelSelector {
    /// Whether it has no requirement (it then selects everything).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

impl FromStr for LabelSelector {
    type Err = Error;

    fn from_str(input: &str) -> Result<Self, Error> {
        if input.trim().is_empty() {
            return Ok(Self::default());
        }
        let fail = |reason: String| Error::Selector {
            input: input.to_owned(),
            reason,
        };
        if input.contains(['(', ')']) {
            return Err(fail(
                "set-based requirements (in, notin) are not supported; use k=v, k!=v, k or !k"
                    .into(),
            ));
        }
        let parsed = input.split(',').map(|r| requirement(r.trim()));
        let reqs = parsed.collect::<Result<Vec<_>, _>>().map_err(fail)?;
        Ok(Self(reqs))
    }
}

fn requirement(r: &str) -> Result<Requirement, String> {
    let (req, key, value) = if let Some((k, v)) = r.split_once("!=") {
        (
            Requirement::NotEquals(k.trim().into(), v.trim().into()),
            k,
            Some(v),
        )
    } else if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
        (
            Requirement::Equals(k.trim().into(), v.trim().into()),
            k,
            Some(v),
        )
    } else if let Some(k) = r.strip_prefix('!') {
        (Requirement::NotExists(k.trim().into()), k, None)
    } else {
        (Requirement::Exists(r.into()), r, None)
    };
    check_key(key.trim()).map_err(|e| format!("{r:?}: {e}"))?;
    if let Some(v) = value {
        check_value(v.trim()).map_err(|e| format!("{r:?}: {e}"))?;
    }
    Ok(req)
}

/// `[prefix/]name`: the prefix a DNS subdomain, the name a label value that is not empty.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() {
        return Err("a requirement needs a label key (set-based forms are not supported)".into());
    }
    if name.contains(' ') {
        return Err("set-based requirements (in, notin) are not supported".into());
    }
    check_value(name).map_err(|e| format!("key {key:?}: {e}"))?;
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(format!("key prefix {p:?} is not a DNS subdomain"));
        }
    }
    Ok(())
}

/// At most 63 of `[A-Za-z0-9_.-]`, starting and ending with a letter or digit (or empty).
fn check_value(v: &str) -> Result<(), String> {
    let alnum = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    let chars_ok = v
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if v.len() > 63 || !chars_ok || !alnum(v.chars().next()) || !alnum(v.chars().last()) {
        return Err(format!(
            "{v:?} is not a label name or value (at most 63 of [A-Za-z0-9_.-], \
             starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::Equals(k, v) => write!(f, "{k}={v}")?,
                Requirement::NotEquals(k, v) => write!(f, "{k}!={v}")?,
                Requirement::Exists(k) => f.write_str(k)?,
                Requirement::NotExists(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}
