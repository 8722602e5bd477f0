//! IPPool: its spec as the engine's [`PoolSpec`], read as written (not validated: a pool the
//! API server accepted but the engine cannot use still names its pool, and is held Invalid
//! with [`PoolSpec::validate`]'s reason).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use tidepool_ipam::pool::{PoolConfig, PoolSpec, choice};
use tidepool_ipam::{PerFamily, WatermarkOverrides};

use crate as api;
use crate::IPPoolSpec;

/// Pool `name`'s spec; an error (naming the pool and the value) only for a string that is
/// no CIDR at all.
pub fn pool_spec(name: &str, spec: &IPPoolSpec) -> Result<PoolSpec, String> {
    let cidrs: Vec<&str> = spec.cidrs.iter().map(|c| c.0.as_str()).collect();
    let exclude: Vec<&str> = spec.exclude.iter().map(|c| c.0.as_str()).collect();
    let block_size = PerFamily {
        v4: spec.block_size.ipv4,
        v6: spec.block_size.ipv6,
    };
    PoolSpec::read(name, &cidrs, block_size, &exclude).map_err(|e| e.to_string())
}

/// Pool `name`'s `spec.watermarks` as overrides (none set: no override); an error names
/// a value out of range.
pub fn pool_watermarks(spec: &IPPoolSpec) -> Result<WatermarkOverrides, String> {
    let Some(w) = &spec.watermarks else {
        return Ok(WatermarkOverrides::default());
    };
    let one = |field: &str, v: Option<i64>| match v {
        None => Ok(None),
        Some(v) => (u32::try_from(v).map(Some))
            .map_err(|_| format!("spec.watermarks.{field}: {v} is out of range")),
    };
    Ok(WatermarkOverrides {
        pre_allocate: one("preAllocate", w.pre_allocate)?,
        min_allocate: one("minAllocate", w.min_allocate)?,
        max_allocate: one("maxAllocate", w.max_allocate)?,
        max_above_watermark: one("maxAboveWatermark", w.max_above_watermark)?,
    })
}

/// Pool `name`'s spec with its node, namespace and pod selectors, read, not validated (see
/// [`pool_spec`]); an error names the field that cannot be read. The operator's source and
/// the agent's pool choice read IPPools with it.
pub fn pool_config(name: &str, spec: &IPPoolSpec) -> Result<PoolConfig, String> {
    let selector = |s: &Option<LabelSelector>, field: &str| match s {
        Some(s) => selector(s).map_err(|e| format!("spec.{field}: {e}")),
        None => Ok(choice::Selector::default()),
    };
    Ok(PoolConfig {
        spec: pool_spec(name, spec)?,
        node_selector: spec.node_selector.clone().unwrap_or_default(),
        namespace_selector: selector(&spec.namespace_selector, "namespaceSelector")?,
        pod_selector: selector(&spec.pod_selector, "podSelector")?,
        watermarks: pool_watermarks(spec)?,
    })
}

/// A label selector as the pool choice reads it (apimachinery's `LabelSelectorAsSelector`):
/// an error names an unknown operator, or `In`/`NotIn` without values, or
/// `Exists`/`DoesNotExist` with some.
pub fn selector(s: &LabelSelector) -> Result<choice::Selector, String> {
    let expressions = s.match_expressions.iter().flatten();
    let match_expressions = expressions
        .map(|e| {
            let values = e.values.clone().unwrap_or_default();
            let op = match (e.operator.as_str(), values.is_empty()) {
                ("In", false) => choice::Operator::In(values),
                ("NotIn", false) => choice::Operator::NotIn(values),
                ("Exists", true) => choice::Operator::Exists,
                ("DoesNotExist", true) => choice::Operator::DoesNotExist,
                ("In" | "NotIn", true) => {
                    return Err(format!(
                        "{} {}: values must be non-empty",
                        e.key, e.operator
                    ));
                }
                ("Exists" | "DoesNotExist", false) => {
                    return Err(format!("{} {}: values must be empty", e.key, e.operator));
                }
                (other, _) => {
                    return Err(format!(
                        "{}: {other:?} is not a valid label selector operator",
                        e.key
                    ));
                }
            };
            Ok((e.key.clone(), op))
        })
        .collect::<Result<_, String>>()?;
    Ok(choice::Selector {
        match_labels: s.match_labels.clone().unwrap_or_default(),
        match_expressions,
    })
}

/// An address count for people (`kubectl get`): exact below a million, `2^k` for a power
/// of two, else three significant digits rounded down (`1.84e19`: free space is never
/// overstated).
pub fn readable_count(n: u128) -> String {
    if n < 1_000_000 {
        return n.to_string();
    }
    if n.is_power_of_two() {
        return format!("2^{}", n.trailing_zeros());
    }
    let exp = n.ilog10();
    let digits = n / 10u128.pow(exp - 2);
    format!("{}.{:02}e{exp}", digits / 100, digits % 100)
}

/// The readable counts of one family's usage.
pub fn readable_usage(capacity: u128, allocated: u128, free: u128) -> api::UsageReadable {
    api::UsageReadable {
        capacity: readable_count(capacity),
        allocated: readable_count(allocated),
        free: readable_count(free),
    }
}

#[cfg(test)]
mod selector_tests {
    use super::*;

    #[test]
    fn a_label_selector_reads_as_apimachinery_reads_it() {
        let s: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"team": "a"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["1", "2"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        }))
        .unwrap();
        let sel = selector(&s).unwrap();
        let labels = |pairs: &[(&str, &str)]| -> choice::Labels {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(sel.matches(&labels(&[("team", "a"), ("tier", "2")])));
        assert!(!sel.matches(&labels(&[("team", "a"), ("tier", "3")])));
        assert!(!sel.matches(&labels(&[("team", "a"), ("tier", "1"), ("legacy", "y")])));
        assert!(selector(&LabelSelector::default()).unwrap().is_empty());
        for (op, values, says) in [
            ("Equals", None, "not a valid label selector operator"),
            ("In", None, "must be non-empty"),
            ("Exists", Some(vec!["x".to_string()]), "must be empty"),
        ] {
            let bad: LabelSelector = serde_json::from_value(serde_json::json!({
                "matchExpressions": [{"key": "k", "operator": op, "values": values}],
            }))
            .unwrap();
            let e = selector(&bad).unwrap_err();
            assert!(e.contains(says) && e.starts_with("k"), "{op}: {e}");
        }
    }
}

#[cfg(test)]
mod readable_tests {
    use super::readable_count;

    #[test]
    fn counts_read_as_people_read_them() {
        assert_eq!(readable_count(0), "0");
        assert_eq!(readable_count(999_999), "999999");
        assert_eq!(readable_count(1 << 24), "2^24");
        assert_eq!(readable_count(1 << 64), "2^64");
        assert_eq!(readable_count(u128::MAX), "3.40e38");
        assert_eq!(readable_count((1 << 64) - 16), "1.84e19");
        assert_eq!(readable_count(16_777_200), "1.67e7");
        assert_eq!(readable_count(1_000_001), "1.00e6");
    }
}

#[cfg(test)]
mod watermarks_tests {
    use super::*;

    #[test]
    fn a_pools_watermarks_read_as_overrides_and_a_value_out_of_range_is_named() {
        let spec = |w: serde_json::Value| -> IPPoolSpec {
            serde_json::from_value(serde_json::json!({"cidrs": ["10.0.0.0/16"], "watermarks": w}))
                .unwrap()
        };
        let got = pool_watermarks(&spec(serde_json::json!({"preAllocate": 4}))).unwrap();
        let want = WatermarkOverrides {
            pre_allocate: Some(4),
            ..WatermarkOverrides::NONE
        };
        assert_eq!(got, want);
        let none = pool_watermarks(&spec(serde_json::Value::Null)).unwrap();
        assert_eq!(none, WatermarkOverrides::NONE);
        let e = pool_watermarks(&spec(serde_json::json!({"maxAllocate": -1}))).unwrap_err();
        assert_eq!(e, "spec.watermarks.maxAllocate: -1 is out of range");
    }
}
