//! The engine's settings (the `run` flags that shape it).

use std::time::Duration;

use crate::backoff::BackoffConfig;
use crate::error::IpamError;
use crate::handshake::ReleaseConfig;
use crate::reclaim::ReclaimConfig;
use crate::scarcity::ScarcityConfig;
use crate::watermarks::Watermarks;

/// Engine settings (the `run` flags).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub watermarks: Watermarks,
    pub release: ReleaseConfig,
    pub reclaim: ReclaimConfig,
    /// Whole-node reclaim waits this long after the Node's deletion.
    pub node_reclaim_grace: Duration,
    pub backoff: BackoffConfig,
    pub resync_interval: Duration,
    /// Workers recalculating nodes during a resync.
    pub parallel_workers: usize,
    /// Start-to-start spacing of one node's passes.
    pub min_pass_interval: Duration,
    /// Re-plans after a 409 before backing off.
    pub conflict_retries: u32,
    /// Export `tidepool_ipam_node_ips` per node (`--per-node-metrics`): one series per node,
    /// family and state, so off by default on large clusters.
    pub per_node_metrics: bool,
    /// The `--scarcity-*` settings (DESIGN.md "The engine", Scarcity).
    pub scarcity: ScarcityConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            watermarks: Watermarks::default(),
            release: ReleaseConfig::default(),
            reclaim: ReclaimConfig::default(),
            node_reclaim_grace: Duration::from_secs(300),
            backoff: BackoffConfig::default(),
            resync_interval: Duration::from_secs(60),
            parallel_workers: 50,
            min_pass_interval: Duration::from_millis(10),
            conflict_retries: 3,
            per_node_metrics: false,
            scarcity: ScarcityConfig::default(),
        }
    }
}

impl EngineConfig {
    /// Rejects settings that cannot work, naming the setting.
    pub fn validate(&self) -> Result<(), IpamError> {
        self.watermarks.validate()?;
        self.backoff.validate()?;
        self.scarcity.validate()?;
        let bad = |name: &'static str, value: String, reason: &str| {
            Err(IpamError::InvalidSetting {
                name,
                value,
                reason: reason.into(),
            })
        };
        if self.resync_interval.is_zero() {
            return bad("resync-interval", "0s".into(), "must be positive");
        }
        if self.parallel_workers == 0 {
            return bad("parallel-alloc-workers", "0".into(), "must be at least 1");
        }
        Ok(())
    }
}
