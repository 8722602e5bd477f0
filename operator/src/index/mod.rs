//! Indexes fed by watch events (`kube::runtime::watcher::Event`), kept as the small
//! projections the engine needs: pure logic, tested by handing them typed objects.
//!
//! Both follow kube's reflector (`Writer::apply_watcher_event`): `Apply` and `Delete`
//! change the live view at once; `Init` starts a relist whose `InitApply` objects are
//! buffered while the old view keeps answering; at `InitDone` the buffered set replaces
//! the old one (objects not relisted are gone) and the index is ready.

mod namespaces;
mod nodes;
mod pods;
mod selector;

pub use namespaces::{NamespaceIndex, NamespaceTerms};
pub use nodes::{NodeChange, NodeIndex};
pub use pods::{PodGetter, PodIndex};
pub(crate) use pods::{WatchedPod, to_pod_event};
pub use selector::LabelSelector;
/// Shared with the agent: [`tidepool_api::convert::parse_uid`].
pub use tidepool_api::convert::parse_uid;
