//! Query parameters of list, watch and deletecollection requests: decoded as the real
//! server's parameter codec does (400 BadRequest on malformed numbers and selectors) and
//! checked like `ValidateListOptions` (422 Invalid for `ListOptions.meta.k8s.io`).

use std::collections::HashMap;
use std::num::IntErrorKind;

use crate::error::Error;
use crate::selector::Selector;

/// Go's `strconv.ParseInt(v, 10, 64)`, with its error text.
fn parse_int(v: &str) -> Result<i64, Error> {
    v.parse::<i64>().map_err(|e| {
        let why = match e.kind() {
            IntErrorKind::PosOverflow | IntErrorKind::NegOverflow => "value out of range",
            _ => "invalid syntax",
        };
        Error::bad_request(format!("strconv.ParseInt: parsing {v:?}: {why}"))
    })
}

/// Decodes the integer and selector parameters of a list or watch (400 when malformed).
pub(crate) fn decode(q: &HashMap<String, String>) -> Result<(), Error> {
    for key in ["limit", "timeoutSeconds"] {
        if let Some(v) = q.get(key) {
            parse_int(v)?;
        }
    }
    Selector::parse(q.get("labelSelector").map(String::as_str), None)?;
    Ok(())
}

/// `ValidateListOptions` for a list (not a watch): the `resourceVersionMatch` rules.
pub(crate) fn validate_list(q: &HashMap<String, String>) -> Result<(), Error> {
    let get = |k: &str| q.get(k).map(String::as_str).unwrap_or("");
    let (rv_match, rv) = (get("resourceVersionMatch"), get("resourceVersion"));
    if rv_match.is_empty() {
        return Ok(());
    }
    let forbidden = |why: &str| {
        (
            "resourceVersionMatch".to_string(),
            format!("Forbidden: {why}"),
        )
    };
    let mut causes = Vec::new();
    if rv.is_empty() {
        causes.push(forbidden(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if !get("continue").is_empty() {
        causes.push(forbidden(
            "resourceVersionMatch is forbidden when continue is provided",
        ));
    }
    if !matches!(rv_match, "Exact" | "NotOlderThan") {
        causes.push((
            "resourceVersionMatch".into(),
            format!(
                "Unsupported value: {rv_match:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""
            ),
        ));
    }
    if rv_match == "Exact" && rv == "0" {
        causes.push(forbidden(
            "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ));
    }
    if causes.is_empty() {
        return Ok(());
    }
    Err(Error::invalid("meta.k8s.io", "ListOptions", "", causes))
}
