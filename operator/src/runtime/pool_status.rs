//! IPPool status: capacity, allocated and free addresses per family (strings: an IPv6 pool
//! counts past 2^64) and the `Valid` and `Scarce` conditions, written by the operator when
//! they change; a pool turning invalid (overlapping an older pool, host bits, a block size
//! that does not fit) also gets a warning event, while the other pools go on working. Each
//! pool's validity is also the gauge `tidepool_ipam_pool_valid{pool}`. A pool becoming
//! scarce gets a warning event (`PoolScarce`), and one when it ends (`PoolScarcityEnded`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::Value;
use tidepool_api as api;
use tidepool_api::convert;
use tidepool_api::names::{OPERATOR_MANAGER, condition};
use tidepool_ipam::pool::{AddressCounts, ClusterPoolSource, PoolError, forecast};
use tidepool_ipam::{Background, EventReason, EventType, Family, Gate, PerFamily, ScarcityState};

use crate::leader::Fence;
use crate::store::{Events, KubeStore};

/// What one pool's status says, as written.
#[derive(Debug, Clone, PartialEq)]
struct Shown {
    usage: PerFamily<Option<AddressCounts>>,
    /// Seconds until the pool runs out, rounded (`forecast::rounded`; None: not shrinking).
    runway: PerFamily<Option<u64>>,
    valid: Result<(), String>,
    since: SystemTime,
    scarce: Scarce,
}

/// The `Scarce` condition as written: its message is set when it turns, and kept.
#[derive(Debug, Clone, PartialEq)]
struct Scarce {
    on: bool,
    message: String,
    since: SystemTime,
}

/// Every pool's scarcity, from the engine ([`tidepool_ipam::NodeManager::scarcity`]).
pub type ScarcityOf = Arc<dyn Fn() -> Vec<ScarcityState> + Send + Sync>;

/// The `Scarce` condition of `pool` now, after `last`: its families' states, a message
/// naming the scarce ones when it turns on.
fn scarce_now(pool: &str, states: &[ScarcityState], last: Option<&Scarce>) -> Scarce {
    let scarce: Vec<&ScarcityState> = (states.iter())
        .filter(|s| &*s.pool == pool && s.scarce)
        .collect();
    let on = !scarce.is_empty();
    match last {
        Some(l) if l.on == on => l.clone(),
        _ => Scarce {
            on,
            message: scarce
                .iter()
                .map(|s| {
                    format!(
                        "{}: pressure {:.2} (used + waiting + cooldown / capacity); pre-allocation kept {:.0}%",
                        family_name(s.family),
                        s.pressure,
                        s.kept * 100.0
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
            since: SystemTime::now(),
        },
    }
}

fn family_name(f: Family) -> &'static str {
    match f {
        Family::V4 => "ipv4",
        Family::V6 => "ipv6",
    }
}

/// The status apply body of one pool.
fn body(name: &str, s: &Shown) -> Value {
    let usage = |c: &Option<AddressCounts>, runway: Option<u64>| {
        c.map(|c| api::PoolUsage {
            capacity: c.capacity.to_string(),
            allocated: c.allocated.to_string(),
            free: c.free.to_string(),
            readable: Some(convert::readable_usage(c.capacity, c.allocated, c.free)),
            runway_seconds: runway,
        })
    };
    let (reason, message) = match &s.valid {
        Ok(()) => ("Valid", ""),
        Err(e) => ("Invalid", e.as_str()),
    };
    let scarce = &s.scarce;
    let status = api::IPPoolStatus {
        ipv4: usage(&s.usage.v4, s.runway.v4),
        ipv6: usage(&s.usage.v6, s.runway.v6),
        conditions: vec![
            convert::condition(condition::VALID, s.valid.is_ok(), reason, message, s.since),
            convert::condition(
                condition::SCARCE,
                scarce.on,
                if scarce.on { "Scarce" } else { "NotScarce" },
                &scarce.message,
                scarce.since,
            ),
        ],
    };
    let mut body = convert::apply_envelope("IPPool", name, None);
    body["status"] = serde_json::to_value(status).expect("a status serializes");
    body
}

/// Every `every`, writes each pool's status that changed since it was last written, each
/// write admitted by `gate` (the kube budget, behind the nodes).
pub async fn keep_written(
    pools: Api<api::IPPool>,
    source: ClusterPoolSource<KubeStore>,
    events: Events,
    scarcity: ScarcityOf,
    every: Duration,
    mut gate: Background,
    fence: Fence,
) {
    let mut shown: HashMap<String, Shown> = HashMap::new();
    loop {
        let states = scarcity();
        for u in source.usage() {
            let (name, usage) = (u.name, u.addresses);
            let valid = u.valid.map_err(|e: PoolError| e.to_string());
            tidepool_metrics::record::pool_valid(&name, valid.is_ok());
            let last = shown.get(&name);
            let flipped = last.is_none_or(|l| l.valid.is_ok() != valid.is_ok());
            let since = match last {
                Some(l) if !flipped => l.since,
                _ => SystemTime::now(),
            };
            let scarce = scarce_now(&name, &states, last.map(|l| &l.scarce));
            let turned = last.map_or(scarce.on, |l| l.scarce.on != scarce.on);
            let next = Shown {
                usage,
                runway: PerFamily {
                    v4: u.runway.v4.map(forecast::rounded),
                    v6: u.runway.v6.map(forecast::rounded),
                },
                valid,
                since,
                scarce,
            };
            if last == Some(&next) {
                continue;
            }
            if turned {
                tell_scarcity(&events, &name, &next.scarce);
            }
            if flipped && let Err(e) = &next.valid {
                events.emit(
                    "IPPool",
                    &name,
                    EventType::Warning,
                    EventReason::InvalidPool,
                    e.clone(),
                );
            }
            if gate.request().await.is_err() {
                break; // the lead is gone: write nothing more this round
            }
            // forced, as every apply of the operator's: it owns the status it writes
            let pp = PatchParams::apply(OPERATOR_MANAGER).force();
            let patch = Patch::Apply(body(&name, &next));
            match fence.send(pools.patch_status(&name, &pp, &patch)).await {
                Ok(Ok(_)) => {
                    shown.insert(name, next);
                }
                Ok(Err(e)) => {
                    tracing::warn!(pool = %name, error = %e, "could not write IPPool status");
                }
                Err(e) => tracing::warn!(pool = %name, error = %e, "IPPool status not written"),
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// The event of a pool turning scarce, or no longer.
fn tell_scarcity(events: &Events, pool: &str, scarce: &Scarce) {
    let (kind, reason, note) = match scarce.on {
        true => (
            EventType::Warning,
            EventReason::PoolScarce,
            format!(
                "the pool is scarce, its nodes' warm pools give way: {}",
                scarce.message
            ),
        ),
        false => (
            EventType::Normal,
            EventReason::PoolScarcityEnded,
            "the pool is no longer scarce: the watermarks are back".to_owned(),
        ),
    };
    events.emit("IPPool", pool, kind, reason, note);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_status_counts_as_strings_and_says_why_a_pool_is_invalid() {
        let c = AddressCounts {
            capacity: 1 << 64,
            allocated: 16,
            free: (1 << 64) - 16,
        };
        let s = Shown {
            usage: PerFamily {
                v4: None,
                v6: Some(c),
            },
            runway: PerFamily {
                v4: None,
                v6: Some(7200),
            },
            valid: Err("overlaps pool a".into()),
            since: SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000),
            scarce: Scarce {
                on: false,
                message: String::new(),
                since: SystemTime::UNIX_EPOCH,
            },
        };
        let b = body("p", &s);
        assert_eq!(b["status"]["ipv6"]["capacity"], "18446744073709551616");
        assert_eq!(b["status"]["ipv6"]["runwaySeconds"], 7200);
        assert!(b["status"].get("ipv4").is_none());
        let cond = &b["status"]["conditions"][0];
        assert_eq!(
            (cond["type"].as_str(), cond["status"].as_str()),
            (Some("Valid"), Some("False"))
        );
        assert_eq!(cond["message"], "overlaps pool a");
        assert_eq!(cond["reason"], "Invalid");
        assert_eq!(cond["lastTransitionTime"], "2026-11-18T11:06:40Z");
        // the body is an IPPool as the CRD has it
        let typed: api::IPPool = serde_json::from_value(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": "p"}, "spec": {"cidrs": ["fd00::/64"]},
            "status": b["status"],
        }))
        .unwrap();
        assert_eq!(
            typed.status.unwrap().ipv6.unwrap().free,
            "18446744073709551600"
        );
    }
}
