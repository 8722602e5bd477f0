//! The conditions a pass sets on the operator's fields: `Blocked` with the plan's reason,
//! `WatermarksValid` while the overrides are invalid; each new one with its event.
//! (`Deleting` is `deletion`'s.)

use std::borrow::Cow;

use crate::error::IpamError;
use crate::pods::PodView;
use crate::shared::{NodeHandle, Shared};
use crate::source::IpSource;
use crate::store::{EventType, NodeStore};
use crate::types::{BlockedPool, Condition, OperatorFields};
use crate::vocab::{Blocked, ConditionReason, ConditionType, EventReason};

const WATERMARKS_VALID: ConditionType = ConditionType::WatermarksValid;
const BLOCKED: ConditionType = ConditionType::Blocked;

/// Sets `Blocked` (status True, with the reason; its message names the blocked pools) while
/// the node needs addresses it cannot get, and drops it once it can grow again or needs
/// none; a pool exhausted for the node also gets a `PoolExhausted` warning event when the
/// condition appears.
pub(super) fn set_blocked_condition<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    fields: &mut Cow<'_, OperatorFields>,
    blocked: Option<Blocked>,
) {
    let current = fields.conditions.iter().find(|c| c.type_ == BLOCKED);
    let Some(b) = blocked else {
        if current.is_some() {
            drop_condition(fields.to_mut(), BLOCKED);
        }
        return;
    };
    let reason = ConditionReason::Blocked(b);
    let message = blocked_message(b, &fields.blocked_pools);
    if current.is_some_and(|c| c.reason == reason && c.message == message) {
        return;
    }
    let new_reason = current.is_none_or(|c| c.reason != reason);
    let condition = Condition {
        type_: BLOCKED,
        status: true,
        reason,
        message: message.clone(),
        // the status stays True: a new list of pools is no transition
        last_transition: (current.filter(|c| c.status))
            .map_or_else(|| shared.clock.utc(), |c| c.last_transition),
    };
    replace_condition(fields.to_mut(), condition);
    if b == Blocked::Exhausted && new_reason {
        shared.store.event(
            &h.name,
            EventType::Warning,
            EventReason::PoolExhausted,
            message,
        );
    }
}

/// The `Blocked` condition's message: why, and the pools that give the node's waiting pods
/// nothing.
fn blocked_message(b: Blocked, pools: &[BlockedPool]) -> String {
    let named = || {
        let list: Vec<String> = (pools.iter())
            .map(|p| format!("{} ({})", p.pool, p.family.as_str()))
            .collect();
        list.join(", ")
    };
    match (b, pools.is_empty()) {
        (Blocked::Pools, _) => {
            format!("pods wait for pools that give them no address: {}", named())
        }
        (_, true) => format!("the node needs addresses and gets none: {}", b.as_str()),
        (_, false) => format!(
            "the node needs addresses and gets none: {}; blocked pools: {}",
            b.as_str(),
            named()
        ),
    }
}

pub(super) fn drop_condition(fields: &mut OperatorFields, type_: ConditionType) {
    fields.conditions.retain(|c| c.type_ != type_);
}

/// Sets `condition`, in place of any of its type.
pub(super) fn replace_condition(fields: &mut OperatorFields, condition: Condition) {
    drop_condition(fields, condition.type_);
    fields.conditions.push(condition);
}

/// `WatermarksValid`: dropped once the overrides are valid (`invalid` none); with invalid
/// overrides, set ([`set_invalid_condition`]).
pub(super) fn set_watermarks_condition<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    fields: &mut Cow<'_, OperatorFields>,
    invalid: Option<&IpamError>,
) {
    match invalid {
        None => {
            if fields
                .conditions
                .iter()
                .any(|c| c.type_ == WATERMARKS_VALID)
            {
                drop_condition(fields.to_mut(), WATERMARKS_VALID);
            }
        }
        Some(e) => set_invalid_condition(shared, h, fields.to_mut(), e),
    }
}

/// Invalid watermarks: a condition (and, when it is new, a warning event). The node gets no
/// new addresses until the spec changes; reclaim and handshakes go on.
fn set_invalid_condition<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    fields: &mut OperatorFields,
    e: &IpamError,
) {
    let message = e.to_string();
    let already = fields
        .conditions
        .iter()
        .any(|c| c.type_ == WATERMARKS_VALID && c.message == message);
    if already {
        return;
    }
    let condition = Condition {
        type_: WATERMARKS_VALID,
        status: false,
        reason: ConditionReason::InvalidWatermarks,
        message: message.clone(),
        last_transition: shared.clock.utc(),
    };
    replace_condition(fields, condition);
    shared.store.event(
        &h.name,
        EventType::Warning,
        EventReason::InvalidWatermarks,
        message,
    );
}
