//! Between the CRD types (`tidepool_api`) and the engine's (`tidepool_ipam`): the reading
//! side ([`node_from_api`], [`block_from_api`], [`Malformed`]) is shared with the node agent
//! and lives in [`tidepool_api::convert`], re-exported here; what the operator writes becomes
//! apply bodies here. Pure functions: no client here.

mod block;
mod node;

pub use block::{block_for_create, block_mark_body};
pub use node::{Held, PoolTally, Target, pool_usage, spec_body, status_body};
pub use tidepool_api::convert::{Allocations, Malformed, NodeView, block_from_api, node_from_api};
