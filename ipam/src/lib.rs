//! tidepool's IPAM engine.
//!
//! Pure planning ([`watermarks`], [`plan`], [`reclaim`], [`handshake`]) is kept apart from
//! the runtime that executes plans ([`maintainer`], [`manager`]) through the traits in
//! [`source`], [`store`], [`pods`] and [`clock`]. No Kubernetes types and no HTTP here.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod budget;
pub mod clock;
pub mod config;
pub mod error;
pub mod handshake;
pub mod maintainer;
pub mod manager;
pub mod node;
pub mod plan;
pub mod pods;
pub mod pool;
pub mod reclaim;
mod shared;
pub mod source;
pub mod stats;
pub mod store;
pub mod trigger;
pub mod types;
pub mod uid_table;
pub mod used;
pub mod watermarks;

pub use error::{ErrorClass, IpamError};
