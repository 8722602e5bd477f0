//! The elector's settings: client-go's three durations, the Lease's name and namespace, and
//! this replica's identity; the timeouts derived from them.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::Error;

/// The Lease's default name (`--leader-elect-resource-name`).
pub const DEFAULT_LEASE_NAME: &str = "tidepool-operator";

/// The largest clock-rate margin taken off the write timeout.
const MAX_MARGIN: Duration = Duration::from_secs(1);

/// Settings of one elector. Build it, then [`validate`](Self::validate) it (the CLI does
/// both at start; `run_elector` validates again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// How long a follower waits after it last saw the Lease change before it takes over.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// Time between two acquire or renew attempts.
    pub retry_period: Duration,
    /// The Lease's name.
    pub name: String,
    /// The Lease's namespace.
    pub namespace: String,
    /// This replica's holderIdentity: unique per process (see [`default_identity`]).
    pub identity: String,
}

impl LeaderConfig {
    /// client-go's rule, lease duration > renew deadline > 1.2 × retry period, plus ours:
    /// the gap between lease duration and renew deadline must exceed the clock margin, or no
    /// write could be given a timeout (see [`write_timeout`](Self::write_timeout)). Every
    /// message names the flags at fault.
    pub fn validate(&self) -> Result<(), Error> {
        let fail = |reason: String| Err(Error::LeaderConfig { reason });
        let show = |d: Duration| humantime::format_duration(d).to_string();
        if self.lease_duration <= self.renew_deadline {
            return fail(format!(
                "--leader-elect-lease-duration ({}) must be longer than --leader-elect-renew-deadline ({})",
                show(self.lease_duration),
                show(self.renew_deadline)
            ));
        }
        if self.renew_deadline.as_secs_f64() <= 1.2 * self.retry_period.as_secs_f64() {
            return fail(format!(
                "--leader-elect-renew-deadline ({}) must be longer than 1.2 × --leader-elect-retry-period ({})",
                show(self.renew_deadline),
                show(self.retry_period)
            ));
        }
        if self.lease_duration - self.renew_deadline <= self.margin() {
            return fail(format!(
                "--leader-elect-lease-duration ({}) must exceed --leader-elect-renew-deadline ({}) by more than {}: a write needs time to land before a follower may take over",
                show(self.lease_duration),
                show(self.renew_deadline),
                show(self.margin())
            ));
        }
        if self.namespace.is_empty() {
            return fail(
                "--leader-elect-resource-namespace is not given and POD_NAMESPACE is not set (the downward API sets it)".into(),
            );
        }
        if self.name.is_empty() {
            return fail("--leader-elect-resource-name must not be empty".into());
        }
        if self.identity.is_empty() {
            return fail("the leader-election identity must not be empty".into());
        }
        Ok(())
    }

    /// The allowance for clock rates (a follower's monotonic clock may run a little fast
    /// against the leader's): 10% of the lease duration, at most 1 s.
    pub fn margin(&self) -> Duration {
        (self.lease_duration / 10).min(MAX_MARGIN)
    }

    /// The longest a write may take from being sent to landing: lease duration − renew
    /// deadline − [`margin`](Self::margin). A write sent before the step-down instant (last
    /// successful renewal's start + renew deadline) with this timeout lands before that
    /// start + lease duration − margin, and a follower takes over no earlier than a full lease
    /// duration after it saw that renewal, which came after its start.
    pub fn write_timeout(&self) -> Duration {
        self.lease_duration
            .saturating_sub(self.renew_deadline)
            .saturating_sub(self.margin())
    }

    /// The Lease client's HTTP timeout and the bound of one attempt: renew deadline / 2, so
    /// one hung request leaves time for another before the deadline (Cilium PR #44500).
    pub fn request_timeout(&self) -> Duration {
        self.renew_deadline / 2
    }

    /// `spec.leaseDurationSeconds` to write: whole seconds, rounded up so that a reader of
    /// the record never judges the Lease free earlier than we do.
    pub fn lease_duration_seconds(&self) -> i32 {
        let d = self.lease_duration;
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// `POD_NAME` (the downward API), else the host name, plus `_` and a random suffix: client-go's
/// form. The suffix keeps a restarted process from passing as its former self, which would
/// inherit a lease it no longer guards.
pub fn default_identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(host_name)
        .unwrap_or_else(|| DEFAULT_LEASE_NAME.to_string());
    format!("{base}_{:08x}", random_u32())
}

fn host_name() -> Option<String> {
    let s = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// A random number from std's per-process random hasher keys (no extra dependency).
fn random_u32() -> u32 {
    let mut h = std::hash::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(lease: u64, renew: u64, retry: u64) -> LeaderConfig {
        LeaderConfig {
            lease_duration: Duration::from_millis(lease),
            renew_deadline: Duration::from_millis(renew),
            retry_period: Duration::from_millis(retry),
            name: DEFAULT_LEASE_NAME.into(),
            namespace: "tidepool".into(),
            identity: "a".into(),
        }
    }

    #[test]
    fn client_go_defaults_are_valid_and_give_a_four_second_write_timeout() {
        let c = cfg(15_000, 10_000, 2_000);
        assert!(c.validate().is_ok());
        assert_eq!(c.margin(), Duration::from_secs(1));
        assert_eq!(c.write_timeout(), Duration::from_secs(4));
        assert_eq!(c.request_timeout(), Duration::from_secs(5));
        assert_eq!(c.lease_duration_seconds(), 15);
    }

    #[test]
    fn short_leases_take_a_tenth_as_margin() {
        let c = cfg(2_000, 1_000, 250);
        assert!(c.validate().is_ok());
        assert_eq!(c.margin(), Duration::from_millis(200));
        assert_eq!(c.write_timeout(), Duration::from_millis(800));
        assert_eq!(cfg(1_500, 1_000, 250).lease_duration_seconds(), 2);
    }

    #[test]
    fn each_broken_rule_names_its_flags() {
        let err = |c: LeaderConfig| c.validate().unwrap_err().to_string();
        let e = err(cfg(10_000, 10_000, 2_000));
        assert!(
            e.contains("--leader-elect-lease-duration (10s)")
                && e.contains("--leader-elect-renew-deadline (10s)"),
            "{e}"
        );
        // 1.2 × 2s = 2.4s: 2.4s itself is refused, 2.5s accepted
        let e = err(cfg(15_000, 2_400, 2_000));
        assert!(
            e.contains("--leader-elect-renew-deadline")
                && e.contains("--leader-elect-retry-period"),
            "{e}"
        );
        assert!(cfg(15_000, 2_500, 2_000).validate().is_ok());
        let e = err(cfg(15_000, 14_500, 2_000));
        assert!(e.contains("by more than 1s"), "{e}");
        let mut c = cfg(15_000, 10_000, 2_000);
        c.namespace.clear();
        let e = err(c);
        assert!(
            e.contains("--leader-elect-resource-namespace") && e.contains("POD_NAMESPACE"),
            "{e}"
        );
        let mut c = cfg(15_000, 10_000, 2_000);
        c.name.clear();
        assert!(err(c).contains("--leader-elect-resource-name"));
    }

    #[test]
    fn identities_differ_per_call() {
        let (a, b) = (default_identity(), default_identity());
        assert_ne!(a, b);
        assert!(a.contains('_'), "{a}");
    }
}
