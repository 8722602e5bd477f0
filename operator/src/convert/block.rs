//! IPAMBlock: the object a claim creates and the operator's apply of a release mark
//! (reading one is [`tidepool_api::convert`]'s).

use serde_json::{Value, json};
use tidepool_api as api;
use tidepool_api::convert::apply_envelope;
use tidepool_api::names::FINALIZER;
use tidepool_ipam::{IpamBlock, ReleaseMark};

/// The object a claim creates (POST), with the operator's finalizer.
pub fn block_for_create(b: &IpamBlock) -> api::IPAMBlock {
    let mark = if b.release {
        ReleaseMark::Set
    } else {
        ReleaseMark::Withdraw
    };
    let mut obj = api::IPAMBlock::new(&b.name, spec(b, mark));
    obj.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    obj
}

/// The operator's server-side apply of a block's release mark (set or withdrawn), with
/// the spec fields it created the block with, which it keeps owning, and the block's
/// `metadata.uid` when known: an apply to a block that was deleted, or replaced by another
/// of that name, is then refused instead of creating one.
pub fn block_mark_body(b: &IpamBlock, uid: Option<&str>, mark: ReleaseMark) -> Value {
    let mut body = apply_envelope("IPAMBlock", &b.name, uid);
    body["metadata"]["finalizers"] = json!([FINALIZER]);
    body["spec"] = serde_json::to_value(spec(b, mark)).expect("a spec serializes");
    body
}

/// The block's spec as the operator writes it, with the release mark set or not.
fn spec(b: &IpamBlock, mark: ReleaseMark) -> api::IPAMBlockSpec {
    api::IPAMBlockSpec {
        pool: b.pool.to_string(),
        cidr: api::Cidr(b.cidr.to_string()),
        node: b.node.to_string(),
        node_uid: b.node_uid.to_string(),
        release: (mark == ReleaseMark::Set).then_some(api::BlockRelease::MarkedForRelease),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidepool_api::convert::{block_from_api, parse_uid};
    use tidepool_ipam::NodeUid;

    const UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";

    fn block() -> IpamBlock {
        IpamBlock {
            name: "v6-fd00-0000-0000-0007-0000-0000-0000-0000-64".into(),
            cidr: "fd00:0:0:7::/64".parse().unwrap(),
            pool: "default".into(),
            node: "n1".into(),
            node_uid: NodeUid(parse_uid(UID).unwrap()),
            release: true,
            ack: None,
            resource_version: None,
            deleting: false,
        }
    }

    #[test]
    fn a_block_round_trips_through_its_object() {
        let b = block();
        let obj = block_for_create(&b);
        assert_eq!(obj.spec.node_uid, UID);
        assert_eq!(obj.metadata.finalizers, Some(vec![FINALIZER.to_string()]));
        let back = block_from_api(&obj).unwrap();
        assert_eq!(back, b);
        let body = block_mark_body(&b, None, ReleaseMark::Withdraw);
        assert!(body["spec"].get("release").is_none());
        assert!(body["metadata"].get("uid").is_none());
        assert_eq!(
            block_mark_body(&b, Some(UID), ReleaseMark::Withdraw)["metadata"]["uid"],
            UID
        );
        assert_eq!(
            block_mark_body(&b, None, ReleaseMark::Set)["spec"]["release"],
            "marked-for-release"
        );
    }

    #[test]
    fn an_unreadable_block_is_reported_not_used() {
        let mut obj = block_for_create(&block());
        obj.spec.cidr = api::Cidr("fd00::7/xx".into());
        obj.spec.node_uid = "n1".into();
        let bad = block_from_api(&obj).unwrap_err();
        let fields: Vec<&str> = bad.iter().map(|m| m.field.as_str()).collect();
        assert_eq!(fields, vec!["spec.cidr", "spec.nodeUID"]);
        assert!(bad[0].to_string().starts_with("ipamblock/v6-"));
    }
}
