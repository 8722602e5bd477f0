//! Paged LISTs: continue tokens, the snapshots they continue, and their expiry.
//!
//! A token names the snapshot its list was taken from and the last object it returned, so
//! the next page starts after that key, as the real server's token names its etcd key
//! and revision (kubernetes/apiserver pkg/storage/continue.go `EncodeContinue`). A
//! snapshot older than [`Config::continue_max_age`](crate::Config) is gone, as etcd's
//! revision is after a compaction: the answer is kubernetes/apiserver
//! pkg/storage/etcd3/errors.go `handleCompactedErrorForPaging`'s, a 410 `Expired` whose
//! `metadata.continue` continues the list at the latest state (an inconsistent list). A
//! token this server never handed out is a 400, as pkg/storage/interfaces.go
//! `ValidateListOptions` answers one `DecodeContinue` cannot read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// kubernetes/apiserver pkg/storage/etcd3/errors.go `inconsistentContinue`: a token whose
/// revision was compacted.
pub(crate) const INCONSISTENT_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// An object's place in a list: (namespace, name), the store's order.
pub(crate) type Key = (String, String);

/// A list kept for its continue tokens.
#[derive(Clone)]
pub(crate) struct Snapshot {
    pub rv: u64,
    pub items: Arc<Vec<Arc<Value>>>,
    pub taken: Instant,
}

impl Snapshot {
    /// Whether it is past `max_age` (its revision compacted).
    pub(crate) fn expired(&self, max_age: Option<Duration>) -> bool {
        max_age.is_some_and(|m| self.taken.elapsed() > m)
    }
}

/// Where a continued list goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    /// In snapshot `id`, after `after`.
    Snapshot { id: u64, after: Key },
    /// In the current state, after `after` (the token of a 410 for an expired one).
    Latest { after: Key },
}

impl Token {
    /// `ID:NAMESPACE/NAME`, or `latest:NAMESPACE/NAME` (neither a namespace nor a name
    /// holds a `/`).
    pub(crate) fn encode(&self) -> String {
        let (head, (ns, name)) = match self {
            Token::Snapshot { id, after } => (id.to_string(), after),
            Token::Latest { after } => ("latest".to_string(), after),
        };
        format!("{head}:{ns}/{name}")
    }

    /// None for a token this server did not hand out.
    pub(crate) fn parse(s: &str) -> Option<Token> {
        let (head, key) = s.split_once(':')?;
        let (ns, name) = key.split_once('/')?;
        let after = (ns.to_string(), name.to_string());
        match head {
            "latest" => Some(Token::Latest { after }),
            id => Some(Token::Snapshot {
                id: id.parse().ok()?,
                after,
            }),
        }
    }

    pub(crate) fn after(&self) -> &Key {
        match self {
            Token::Snapshot { after, .. } | Token::Latest { after } => after,
        }
    }
}

/// An object's key in a list.
pub(crate) fn key_of(o: &Value) -> Key {
    let md = |k: &str| {
        o.pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (md("namespace"), md("name"))
}

/// The index of the first item after `after` in `items` (sorted by key).
pub(crate) fn start_after(items: &[Arc<Value>], after: Option<&Key>) -> usize {
    after.map_or(0, |k| items.partition_point(|o| key_of(o) <= *k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip() {
        for t in [
            Token::Snapshot {
                id: 7,
                after: ("default".into(), "p:1".into()),
            },
            Token::Latest {
                after: (String::new(), "system:node".into()),
            },
        ] {
            assert_eq!(Token::parse(&t.encode()), Some(t));
        }
        assert_eq!(Token::parse("nonsense"), None);
        assert_eq!(Token::parse("x:a/b"), None);
    }
}
