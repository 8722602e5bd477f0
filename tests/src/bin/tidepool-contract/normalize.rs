//! One row's request and answer made comparable between clusters and runs: the run's name
//! prefix becomes `contract`, times become `<time>`, continue tokens `<token>`, and every
//! resourceVersion and uid a label (`rv1`, `uid1`, … in order of first appearance in the
//! row), so equalities within the row survive and values do not.

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

static TIME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$").unwrap()
});
static UUID: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").unwrap()
});
/// A resourceVersion quoted in a message ("ResourceVersion in precondition: 12, …").
static QUOTED_RV: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)((?:precondition|meta|version): )(\d+)").unwrap());

pub struct Normalizer {
    prefix: String,
    rvs: HashMap<String, String>,
    uids: HashMap<String, String>,
}

impl Normalizer {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
            rvs: HashMap::new(),
            uids: HashMap::new(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn rv(&mut self, v: &str) -> String {
        let n = self.rvs.len() + 1;
        self.rvs
            .entry(v.to_string())
            .or_insert(format!("rv{n}"))
            .clone()
    }

    fn uid(&mut self, v: &str) -> String {
        let n = self.uids.len() + 1;
        self.uids
            .entry(v.to_string())
            .or_insert(format!("uid{n}"))
            .clone()
    }

    /// A free text: the prefix, uids and quoted resourceVersions replaced.
    pub fn text(&mut self, s: &str) -> String {
        let s = s.replace(&self.prefix, "contract");
        let s = UUID
            .replace_all(&s, |c: &regex::Captures| self.uid(&c[0]))
            .into_owned();
        QUOTED_RV
            .replace_all(&s, |c: &regex::Captures| {
                format!("{}{}", &c[1], self.rv(&c[2]))
            })
            .into_owned()
    }

    /// A JSON value, keys decide what a string is.
    pub fn value(&mut self, v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut out = Map::new();
                for (k, v) in m {
                    out.insert(self.text(k), self.field(k, v));
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(|v| self.value(v)).collect()),
            Value::String(s) => Value::String(self.string(s)),
            other => other.clone(),
        }
    }

    fn field(&mut self, key: &str, v: &Value) -> Value {
        match (key, v) {
            ("resourceVersion", Value::String(s)) if !s.is_empty() => Value::String(self.rv(s)),
            ("continue", Value::String(s)) if !s.is_empty() => Value::String("<token>".into()),
            _ => self.value(v),
        }
    }

    fn string(&mut self, s: &str) -> String {
        if TIME.is_match(s) {
            "<time>".into()
        } else {
            self.text(s)
        }
    }

    /// A query string: each parameter's value normalized as that field would be.
    pub fn query(&mut self, q: &str) -> Value {
        let mut out = Map::new();
        for (k, v) in form_urlencoded::parse(q.as_bytes()) {
            out.insert(
                k.to_string(),
                self.field(&k, &Value::String(v.into_owned())),
            );
        }
        Value::Object(out)
    }
}
