//! IPAMBlock: the object as the cluster-pool source reads it, the object a claim creates,
//! and the operator's apply of a release mark.

use std::sync::Arc;

use serde_json::{Value, json};
use tidepool_api as api;
use tidepool_api::names::{FINALIZER, GROUP, VERSION};
use tidepool_ipam::{IpamBlock, NodeName, PodUid, ReleaseAck, ResourceVersion};

use super::{Malformed, Report};
use crate::index::parse_uid;

/// The engine's view of an IPAMBlock; `Err` when its CIDR or node UID cannot be read (the
/// block is then left alone: neither granted nor released by this operator).
pub fn block_from_api(obj: &api::IPAMBlock) -> Result<IpamBlock, Vec<Malformed>> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let object = format!("ipamblock/{name}");
    let mut r = Report::new(&object);
    let cidr = obj.spec.cidr.0.parse::<ipnet::IpNet>().ok().or_else(|| {
        r.bad(
            "spec.cidr".into(),
            format!("{:?} is not a CIDR", obj.spec.cidr.0),
        )
    });
    let uid = parse_uid(&obj.spec.node_uid).or_else(|| {
        r.bad(
            "spec.nodeUID".into(),
            format!("{:?} is not a UID", obj.spec.node_uid),
        )
    });
    let (Some(cidr), Some(node_uid)) = (cidr, uid) else {
        return Err(r.finish());
    };
    Ok(IpamBlock {
        name: Arc::from(name.as_str()),
        cidr,
        pool: Arc::from(obj.spec.pool.as_str()),
        node: NodeName::from(obj.spec.node.as_str()),
        node_uid,
        release: obj.spec.release.is_some(),
        ack: obj
            .status
            .as_ref()
            .and_then(|s| s.release_ack)
            .map(|a| match a {
                api::BlockAck::ReadyForRelease => ReleaseAck::ReadyForRelease,
                api::BlockAck::DoNotRelease => ReleaseAck::DoNotRelease,
            }),
        resource_version: obj
            .metadata
            .resource_version
            .as_deref()
            .map(ResourceVersion::server),
        deleting: obj.metadata.deletion_timestamp.is_some(),
    })
}

/// The object a claim creates (POST), with the operator's finalizer.
pub fn block_for_create(b: &IpamBlock) -> api::IPAMBlock {
    let mut obj = api::IPAMBlock::new(
        &b.name,
        api::IPAMBlockSpec {
            pool: b.pool.to_string(),
            cidr: api::Cidr(b.cidr.to_string()),
            node: b.node.to_string(),
            node_uid: PodUid(b.node_uid).to_string(),
            release: b.release.then_some(api::BlockRelease::MarkedForRelease),
        },
    );
    obj.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    obj
}

/// The operator's server-side apply of a block's release mark (set or withdrawn), with
/// the spec fields it created the block with, which it keeps owning.
pub fn block_mark_body(b: &IpamBlock, release: bool) -> Value {
    let mut spec = json!({
        "pool": &*b.pool,
        "cidr": b.cidr.to_string(),
        "node": &*b.node,
        "nodeUID": PodUid(b.node_uid).to_string(),
    });
    if release {
        spec["release"] = json!("marked-for-release");
    }
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "IPAMBlock",
        "metadata": { "name": &*b.name, "finalizers": [FINALIZER] },
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";

    fn block() -> IpamBlock {
        IpamBlock {
            name: "v6-fd00-0000-0000-0007-0000-0000-0000-0000-64".into(),
            cidr: "fd00:0:0:7::/64".parse().unwrap(),
            pool: "default".into(),
            node: "n1".into(),
            node_uid: parse_uid(UID).unwrap(),
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
        let body = block_mark_body(&b, false);
        assert!(body["spec"].get("release").is_none());
        assert_eq!(
            block_mark_body(&b, true)["spec"]["release"],
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
