//! What the benches and the longer end-to-end run print their figures with: latency
//! quantiles and sizes taken from the environment.

use std::time::Duration;

/// `name`'s value from the environment, or `default` when unset or unparsable.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `q` quantile (0 < q ≤ 1) of the sorted `d` by nearest rank: the smallest value with
/// at least a `q` share of the samples at or below it. `None` when `d` is empty.
pub fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    let rank = ((sorted.len() as f64 * q).ceil() as usize).max(1);
    sorted.get(rank - 1).copied()
}

/// p50 and p99 of `d` in milliseconds (0 when empty).
pub fn p50_p99_ms(mut d: Vec<Duration>) -> (f64, f64) {
    d.sort();
    let ms = |q| quantile(&d, q).map_or(0.0, |v| v.as_secs_f64() * 1e3);
    (ms(0.5), ms(0.99))
}
