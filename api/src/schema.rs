//! Schema pieces the derive cannot say: string formats, granular address-keyed maps, and
//! conditions as a list-map keyed by `type`.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// A CIDR (`10.0.0.0/16`, `fd00::/64`): Kubernetes' `cidr` string format, checked by the API
/// server (Go's `net.ParseCIDR`: host bits may be set), and a CRD rule ([`CIDR_HOST_BITS`])
/// that refuses host bits, as the engine does.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(transparent)]
pub struct Cidr(pub String);

impl JsonSchema for Cidr {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Cidr".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // 43: the longest IPv6 CIDR text (39 characters, "/", 3 digits)
        json_schema!({
            "type": "string", "format": "cidr", "maxLength": 43,
            "x-kubernetes-validations": [{
                "rule": "!isCIDR(self) || cidr(self) == cidr(self).masked()",
                "message": CIDR_HOST_BITS,
            }],
        })
    }
}

/// The message of the CRD rule refusing a CIDR with host bits (Kubernetes' CIDR library,
/// in the CEL environment since 1.30).
pub const CIDR_HOST_BITS: &str =
    "must have no host bits set (the network address, e.g. 10.2.0.0/16, not 10.2.0.1/16)";

impl From<&str> for Cidr {
    fn from(s: &str) -> Self {
        Cidr(s.to_string())
    }
}

/// `x-kubernetes-map-type: granular` on a map keyed by address, so server-side apply merges
/// it entry by entry (the operator and the node side each own their entries).
pub fn granular_map<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    let values = g.subschema_for::<T>();
    json_schema!({
        "type": "object",
        "additionalProperties": values,
        "x-kubernetes-map-type": "granular",
    })
}

/// `status.poolUsage`: a list-map keyed by pool `name` and `family`.
pub fn pool_usage(g: &mut SchemaGenerator) -> Schema {
    let item = g.subschema_for::<crate::node::NodePoolUsage>();
    json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name", "family"],
    })
}

/// Standard conditions: a list-map keyed by `type` (`x-kubernetes-list-type: map`), so a
/// writer's apply touches only the condition types it owns.
pub fn conditions(g: &mut SchemaGenerator) -> Schema {
    let item = g.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>();
    json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    })
}
