//! Kubernetes UIDs as the numbers the engine keys by.

use tidepool_ipam::NodeUid;

use super::Report;

/// A UID in the form the API server gives (a UUID: `8-4-4-4-12` hex digits, either case)
/// as the number whose 32 hex digits it spells: the inverse of `PodUid`'s and `NodeUid`'s
/// `Display`, so a UID read from a Pod or Node and one written back (an IPAMNode's
/// `nodeUID`) agree.
/// `None` for anything else (no API server in use gives such a UID).
pub fn parse_uid(s: &str) -> Option<u128> {
    let mut groups = s.split('-');
    let mut v: u128 = 0;
    for len in [8, 4, 4, 4, 12] {
        let g = groups.next()?;
        if g.len() != len || !g.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        v = v << (4 * len) | u128::from_str_radix(g, 16).ok()?;
    }
    groups.next().is_none().then_some(v)
}

/// An IPAMNode's or IPAMBlock's `spec.nodeUID`; noted in `r` when it is not a UID.
pub(super) fn spec_node_uid(r: &mut Report<'_>, s: &str) -> Option<NodeUid> {
    parse_uid(s)
        .map(NodeUid)
        .or_else(|| r.bad("spec.nodeUID".into(), format!("{s:?} is not a UID")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidepool_ipam::PodUid;

    #[test]
    fn uids_round_trip_through_the_engines_display() {
        let s = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
        let v = parse_uid(s).expect("a UUID");
        assert_eq!(v, 0x0f1e2d3c_4b5a_4697_8a8b_9c0d1e2f3a4b);
        assert_eq!(PodUid(v).to_string(), s);
        assert_eq!(parse_uid(&s.to_uppercase()), Some(v));
    }

    #[test]
    fn anything_but_a_uuid_is_refused() {
        for bad in [
            "",
            "0f1e2d3c4b5a46978a8b9c0d1e2f3a4b",
            "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4",
            "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b-",
            "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4g",
            "+f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b",
            "0f1e2d3c-4b5a-4697-8a8b9-c0d1e2f3a4b",
        ] {
            assert_eq!(parse_uid(bad), None, "{bad:?}");
        }
    }
}
