//! Replaying the DEL spool: the DELs the plugin recorded while the agent was down.

use std::path::Path;
use std::time::SystemTime;

use crate::error::Result;
use crate::state::{Fs, NodeState, SpooledDel, Unreadable, drain_spool, parse_pod_uid};

/// What [`replay_spool`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// Spooled DELs applied (and their files removed).
    pub applied: usize,
    /// Of those, the ones that freed an allocation.
    pub freed: usize,
    /// Of those, the ones whose key holds an allocation made after the DEL was spooled (a
    /// later ADD re-created it): that allocation is not the DEL's, nothing freed.
    pub superseded: usize,
    /// Files that could not be read as a DEL; left in place and reported.
    pub unreadable: Vec<Unreadable>,
}

/// Applies every spooled DEL in `spool_dir` to `state` (keyed and stale-safe, as a live
/// DEL; a pod UID that is not a UUID frees nothing; an allocation made since the DEL was
/// spooled, to the millisecond, is not the DEL's and stays). Returns what it did and the
/// DELs to remove (counted in `applied` then) once the state is durable: a crash before
/// that replays them again, which DEL's idempotence makes harmless.
pub fn replay_spool(
    state: &mut NodeState,
    fs: &dyn Fs,
    spool_dir: &Path,
) -> Result<(Replayed, Vec<SpooledDel>)> {
    let drained = drain_spool(fs, spool_dir)?;
    let now = SystemTime::now();
    let mut out = Replayed {
        unreadable: drained.unreadable,
        ..Replayed::default()
    };
    for d in &drained.dels {
        if state.get(&d.key).is_some_and(|a| a.since >= d.spooled_at) {
            out.superseded += 1;
            continue;
        }
        let uid = match d.pod_uid.as_deref() {
            None | Some("") => None,
            Some(s) => match parse_pod_uid(s) {
                Ok(u) => Some(u),
                Err(_) => continue, // matches no owner
            },
        };
        if !state.del(&d.key, uid, now).freed().is_empty() {
            out.freed += 1;
        }
    }
    Ok((out, drained.dels))
}
