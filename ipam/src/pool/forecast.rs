//! When a pool runs out, from the operator's own samples (`tidepool_ipam_pool_exhaustion_seconds`,
//! the IPPool's `status.<family>.runwaySeconds`, `check`'s RUNWAY): the same estimate as the
//! alert's `predict_linear` — a least-squares line through the last 6 hours of what the pool
//! could still grant (its addresses in no block plus those of whole free blocks), read where
//! it crosses 0. Pure: the caller samples at each resync.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The alert's range: `predict_linear(...[6h:], ...)`.
pub const WINDOW: Duration = Duration::from_secs(6 * 3600);

/// One pool and family's samples over [`WINDOW`].
#[derive(Debug, Clone, Default)]
pub struct Forecast {
    samples: VecDeque<(Instant, f64)>,
}

impl Forecast {
    /// Adds a sample, dropping those older than the window.
    pub fn sample(&mut self, at: Instant, value: f64) {
        while let Some((t, _)) = self.samples.front() {
            if at.saturating_duration_since(*t) <= WINDOW {
                break;
            }
            self.samples.pop_front();
        }
        self.samples.push_back((at, value));
    }

    /// Seconds from the last sample until the fitted line reaches 0 (0 when it already has);
    /// None while the pool is not shrinking (a flat or rising fit, or fewer than two samples
    /// at different times): the metric's +Inf.
    pub fn seconds_to_empty(&self) -> Option<f64> {
        let (&(t0, _), &(last, _)) = (self.samples.front()?, self.samples.back()?);
        let n = self.samples.len() as f64;
        let x = |t: Instant| t.duration_since(t0).as_secs_f64();
        let (sx, sy) =
            (self.samples.iter()).fold((0.0, 0.0), |(sx, sy), (t, v)| (sx + x(*t), sy + v));
        let (mx, my) = (sx / n, sy / n);
        let (mut sxy, mut sxx) = (0.0, 0.0);
        for (t, v) in &self.samples {
            let dx = x(*t) - mx;
            sxy += dx * (v - my);
            sxx += dx * dx;
        }
        if sxx == 0.0 {
            return None;
        }
        let slope = sxy / sxx;
        if slope >= 0.0 {
            return None;
        }
        let now = my + slope * (x(last) - mx);
        Some((now / -slope).max(0.0))
    }
}

/// `seconds` rounded to two significant digits: what the IPPool status shows, so the
/// estimate's drift from one resync to the next is no write.
pub fn rounded(seconds: f64) -> u64 {
    if seconds < 100.0 {
        return seconds.round() as u64;
    }
    let scale = 10f64.powi(seconds.log10().floor() as i32 - 1);
    ((seconds / scale).round() * scale) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_steady_fall_runs_out_where_the_line_crosses_zero() {
        let t0 = Instant::now();
        let mut f = Forecast::default();
        // 1000 free, 100 fewer each minute: 10 minutes left after the first sample
        for m in 0..4u64 {
            f.sample(t0 + Duration::from_secs(60 * m), 1000.0 - 100.0 * m as f64);
        }
        let s = f.seconds_to_empty().unwrap();
        assert!((s - 7.0 * 60.0).abs() < 1e-6, "{s}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flat_or_rising_pool_never_runs_out() {
        let t0 = Instant::now();
        let mut f = Forecast::default();
        assert_eq!(f.seconds_to_empty(), None, "no samples");
        f.sample(t0, 10.0);
        assert_eq!(f.seconds_to_empty(), None, "one sample");
        f.sample(t0 + Duration::from_secs(60), 10.0);
        assert_eq!(f.seconds_to_empty(), None, "flat");
        f.sample(t0 + Duration::from_secs(120), 30.0);
        assert_eq!(f.seconds_to_empty(), None, "rising");
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_last_six_hours_count() {
        let t0 = Instant::now();
        let mut f = Forecast::default();
        // a fall long ago, then 6 hours flat: not shrinking
        f.sample(t0, 5000.0);
        for h in 1..=7u64 {
            f.sample(t0 + Duration::from_secs(3600 * h), 100.0);
        }
        assert_eq!(f.seconds_to_empty(), None);
        // a sudden fall: the line through 6 hours (100 six times, then -50) is read where
        // it crosses 0, as predict_linear reads it: slope -450/28 an hour, at 30.36 now
        f.sample(t0 + Duration::from_secs(3600 * 8), -50.0);
        assert_eq!(f.samples.len(), 7, "6 hours and the new sample");
        let want = (550.0 / 7.0 - 3.0 * 450.0 / 28.0) / (450.0 / 28.0) * 3600.0;
        let got = f.seconds_to_empty().unwrap();
        assert!((got - want).abs() < 1e-6, "{got} against {want}");
    }

    #[test]
    fn rounding_keeps_two_significant_digits() {
        assert_eq!(rounded(42.4), 42);
        assert_eq!(rounded(1234.0), 1200);
        assert_eq!(rounded(86_399.0), 86_000);
        assert_eq!(rounded(1.5e9), 1_500_000_000);
    }
}
