//! What reconcile remembers between cycles and shows people (`GET /v1/reconcile`).

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::SystemTime;

use serde_json::{Value, json};

use super::decide::{Blocked, Cache, Decision, Evidence, Memory, Netns};

/// How many frees the report keeps.
const RECENT_FREES: usize = 32;

/// The cycles' memory (see [`mod@super::decide`]) and their report.
#[derive(Debug, Default)]
pub struct Tracker {
    pub memory: Memory,
    /// Why the last cycle freed nothing at all (logged when it changes).
    pub blocked: Option<Blocked>,
    last: Option<Value>,
    recent: VecDeque<Value>,
}

impl Tracker {
    /// Records cycle `d`, decided on `ev`, whose frees were made durable at `at`.
    pub fn record(&mut self, d: &Decision, ev: &Evidence, at: SystemTime) {
        let count = |n: usize| json!(n);
        let netns = match &ev.netns {
            Netns::Populated(n) => count(n.len()),
            Netns::Empty => count(0),
            Netns::Invisible(_) => Value::Null,
        };
        let cache = match &ev.cache {
            Cache::Known(n) => count(n.len()),
            _ => Value::Null,
        };
        self.last = Some(json!({
            "cycle": d.cycle,
            "at": ms(at),
            "blocked": d.blocked.as_ref().map(ToString::to_string),
            "candidates": d.candidates,
            "freed": d.free.len(),
            "deferred": d.deferred,
            "netnsEntries": netns,
            "cacheEntries": cache,
            "livePods": ev.pods.as_ref().map(|p| p.len()),
        }));
        for f in &d.free {
            if self.recent.len() == RECENT_FREES {
                self.recent.pop_front();
            }
            self.recent.push_back(json!({
                "cycle": d.cycle,
                "firstSeenCycle": f.first_seen,
                "containerID": f.key.container_id,
                "ifname": f.key.ifname,
                "podUID": f.uid.to_string(),
                "addresses": f.addrs.iter().map(IpAddr::to_string).collect::<Vec<_>>(),
                "at": ms(at),
            }));
        }
        self.blocked = d.blocked.clone();
    }

    /// The report: cycles so far, the last one, the recent frees (oldest first).
    pub fn to_json(&self) -> Value {
        json!({
            "cycles": self.memory.cycles(),
            "last": self.last,
            "recentFrees": self.recent,
        })
    }
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
