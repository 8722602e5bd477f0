//! Describing each metric to the recorder, and registering its enumerated series at zero.

use metrics::Label;

use crate::table::{Binary, Kind};

/// Describes every metric of `binary` (help text and unit) to the installed recorder.
pub fn describe_all(binary: Binary) {
    for d in binary.exported() {
        let (name, help) = (d.name, d.help);
        match (d.kind, d.unit) {
            (Kind::Counter, Some(u)) => metrics::describe_counter!(name, u, help),
            (Kind::Counter, None) => metrics::describe_counter!(name, help),
            (Kind::Gauge, Some(u)) => metrics::describe_gauge!(name, u, help),
            (Kind::Gauge, None) => metrics::describe_gauge!(name, help),
            (Kind::Histogram, Some(u)) => metrics::describe_histogram!(name, u, help),
            (Kind::Histogram, None) => metrics::describe_histogram!(name, help),
        }
    }
}

/// Registers every enumerated label combination of every metric of `binary` at zero, so the
/// series exist before the first event. Values are not touched: a counter or gauge that
/// already has a value keeps it, and no histogram sample is recorded. Metrics with a
/// non-enumerable label (`pool`, `node`) are left to their first recording. Both `source`
/// values are registered, whichever source runs.
pub fn register_zero(binary: Binary) {
    for d in binary.exported() {
        for series in d.series() {
            let labels: Vec<Label> = series
                .iter()
                .map(|(k, v)| Label::from_static_parts(k, v))
                .collect();
            match d.kind {
                Kind::Counter => metrics::counter!(d.name, labels).increment(0),
                Kind::Gauge => metrics::gauge!(d.name, labels).increment(0.0),
                Kind::Histogram => {
                    let _ = metrics::histogram!(d.name, labels);
                }
            }
        }
    }
}
