//! `metav1.Time` (a jiff timestamp) and the engine's `SystemTime`.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// A `metav1.Time` as the engine's `SystemTime`.
pub fn to_system(t: &Time) -> SystemTime {
    SystemTime::from(t.0)
}

/// A `SystemTime` as `metav1.Time`; times beyond jiff's range (year 9999) clamp to it.
pub fn from_system(t: SystemTime) -> Time {
    let ts = k8s_openapi::jiff::Timestamp::try_from(t).unwrap_or(if t > SystemTime::UNIX_EPOCH {
        k8s_openapi::jiff::Timestamp::MAX
    } else {
        k8s_openapi::jiff::Timestamp::MIN
    });
    // the API server keeps whole seconds (RFC 3339 without fractions)
    Time(ts.round(k8s_openapi::jiff::Unit::Second).unwrap_or(ts))
}
