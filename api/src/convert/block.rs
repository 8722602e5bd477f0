//! IPAMBlock: the object as the cluster-pool source and the agent read it.

use std::sync::Arc;

use tidepool_ipam::{IpamBlock, NodeName, ReleaseAck, ResourceVersion};

use super::uid::spec_node_uid;
use super::{Malformed, Report};
use crate as api;

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
    let uid = spec_node_uid(&mut r, &obj.spec.node_uid);
    let (Some(cidr), Some(node_uid)) = (cidr, uid) else {
        return Err(r.finish());
    };
    Ok(IpamBlock {
        name: Arc::from(name.as_str()),
        cidr,
        pool: Arc::from(obj.spec.pool.as_str()),
        node: NodeName::from(obj.spec.node.as_str()),
        node_uid,
        release: obj.spec.release == Some(api::BlockRelease::MarkedForRelease),
        ack: obj
            .status
            .as_ref()
            .and_then(|s| s.release_ack)
            .and_then(|a| match a {
                api::BlockAck::ReadyForRelease => Some(ReleaseAck::ReadyForRelease),
                api::BlockAck::DoNotRelease => Some(ReleaseAck::DoNotRelease),
                // a later release's answer: no answer yet
                api::BlockAck::Unknown => None,
            }),
        resource_version: obj
            .metadata
            .resource_version
            .as_deref()
            .map(ResourceVersion::server),
        deleting: obj.metadata.deletion_timestamp.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";

    fn object() -> api::IPAMBlock {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
            "metadata": { "name": "v6-fd00-0000-0000-0007-0000-0000-0000-0000-64", "resourceVersion": "7" },
            "spec": { "pool": "default", "cidr": "fd00:0:0:7::/64", "node": "n1", "nodeUID": UID,
                      "release": "marked-for-release" },
            "status": { "releaseAck": "do-not-release" },
        }))
        .expect("an IPAMBlock")
    }

    #[test]
    fn a_block_reads_as_the_engine_sees_it() {
        let b = block_from_api(&object()).unwrap();
        assert_eq!(b.cidr, "fd00:0:0:7::/64".parse::<ipnet::IpNet>().unwrap());
        assert_eq!(b.node_uid.to_string(), UID);
        assert_eq!(&*b.node, "n1");
        assert!(b.release);
        assert_eq!(b.ack, Some(ReleaseAck::DoNotRelease));
        assert_eq!(b.resource_version, Some(ResourceVersion::server("7")));
        assert!(!b.deleting);
    }

    #[test]
    fn an_unreadable_block_is_reported_not_used() {
        let mut obj = object();
        obj.spec.cidr = api::Cidr("fd00::7/xx".into());
        obj.spec.node_uid = "n1".into();
        let bad = block_from_api(&obj).unwrap_err();
        let fields: Vec<&str> = bad.iter().map(|m| m.field.as_str()).collect();
        assert_eq!(fields, vec!["spec.cidr", "spec.nodeUID"]);
        assert!(bad[0].to_string().starts_with("ipamblock/v6-"));
    }
}
