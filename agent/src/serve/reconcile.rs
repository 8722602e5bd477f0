//! Reconcile run by the agent ([`crate::reconcile`] has the rules): probe the runtime, then
//! decide and free on the locked state — DEL's path, durable before it is published — and
//! report.

use std::time::SystemTime;

use serde_json::json;

use super::agent::Agent;
use super::request::Reply;
use crate::error::{Error, Result};
use crate::reconcile::{self, Decision, Evidence, probe};

impl Agent {
    /// One reconcile cycle with `cfg`: the probe (on the blocking pool), then the decision
    /// and the frees under the state's lock, saved before they are published. Every free is
    /// logged with its evidence; a cycle that cannot free anything says why once (a warning
    /// when the reason changes). Returns the decision.
    pub async fn reconcile(&self, cfg: &reconcile::Config) -> Result<Decision> {
        let ev = self.probe(cfg).await?;
        let max_frees = cfg.max_frees;
        let evidence = ev.clone();
        let ((d, before), saved) = self
            .locked(None, move |s, i| {
                let mut tracker = i.reconcile.lock().unwrap_or_else(|e| e.into_inner());
                let held: Vec<_> = s.allocations().collect();
                let held = held.iter().map(|(k, a)| (*k, a));
                let d = reconcile::decide(held, &evidence, &mut tracker.memory, max_frees);
                let now = SystemTime::now();
                for f in &d.free {
                    s.del(&f.key, Some(f.uid), now);
                }
                let before = tracker.blocked.clone();
                tracker.record(&d, &evidence, now);
                (d, before)
            })
            .await?;
        saved?;
        log(&d, &ev, before.as_ref());
        Ok(d)
    }

    /// Runs [`Agent::reconcile`] every `cfg.interval` (the first one an interval from now),
    /// for as long as the task lives.
    pub async fn reconcile_every(self, cfg: reconcile::Config) {
        let start = tokio::time::Instant::now() + cfg.interval;
        let mut ticks = tokio::time::interval_at(start, cfg.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(e) = self.reconcile(&cfg).await {
                tracing::warn!(error = %e, "reconcile failed; trying again next cycle");
            }
        }
    }

    /// `GET /v1/reconcile`: the cycles so far, the last one, the recent frees.
    pub fn reconcile_report(&self) -> Reply {
        let tracker = self.inner().reconcile.lock();
        let tracker = tracker.unwrap_or_else(|e| e.into_inner());
        Reply::ok(tracker.to_json())
    }

    /// What the runtime and the API server show now.
    async fn probe(&self, cfg: &reconcile::Config) -> Result<Evidence> {
        // before every read: an allocation made while the probe runs is not judged by it
        let taken_at = SystemTime::now();
        let pods = self.inner().pods.live_pods();
        let (netns_dir, cache_dir) = (cfg.netns_dir.clone(), cfg.cni_cache_dir.clone());
        let (netns, cache) = tokio::task::spawn_blocking(move || {
            (probe::netns(&netns_dir), probe::cache(&cache_dir))
        })
        .await
        .map_err(|e| Error::Task(e.to_string()))?;
        Ok(Evidence {
            taken_at,
            netns,
            cache,
            pods,
        })
    }
}

/// Logs the cycle: each free with its evidence; a change of why nothing can be freed.
fn log(d: &Decision, ev: &Evidence, before: Option<&reconcile::Blocked>) {
    match (&d.blocked, before) {
        (Some(now), b) if b != Some(now) => {
            tracing::warn!(reason = %now, "reconcile frees nothing until its evidence is complete")
        }
        (None, Some(b)) => tracing::info!(was = %b, "reconcile's evidence is complete again"),
        _ => {}
    }
    for f in &d.free {
        let evidence = json!({
            "netnsEntries": count_netns(ev),
            "cacheEntries": count_cache(ev),
            "livePods": ev.pods.as_ref().map(|p| p.len()),
            "candidateSinceCycle": f.first_seen,
        });
        tracing::info!(
            container_id = %f.key.container_id,
            ifname = %f.key.ifname,
            pod_uid = %f.uid,
            addresses = ?f.addrs,
            cycle = d.cycle,
            %evidence,
            "reconcile freed an allocation whose sandbox is gone: the netns directory is \
             populated, no CNI cache entry names the attachment, no live pod with its UID \
             lists the addresses, in two consecutive cycles"
        );
    }
    if d.deferred > 0 {
        tracing::info!(
            deferred = d.deferred,
            "reconcile's per-cycle cap reached; the rest next cycle"
        );
    }
}

fn count_netns(ev: &Evidence) -> Option<usize> {
    match &ev.netns {
        reconcile::Netns::Populated(n) => Some(n.len()),
        _ => None,
    }
}

fn count_cache(ev: &Evidence) -> Option<usize> {
    match &ev.cache {
        reconcile::Cache::Known(n) => Some(n.len()),
        _ => None,
    }
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
