//! Indexes fed by watch events (`kube::runtime::watcher::Event`), kept as the small
//! projections the engine needs: pure logic, tested by handing them typed objects.

mod uid;

pub use uid::parse_uid;
