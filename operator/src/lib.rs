//! The library half of tidepool-operator: what `run` builds on, kept apart from the
//! binary (`main.rs`) so it can be tested without a server. For now, the watch-fed indexes
//! of Pods and Nodes ([`index`]).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod check;
pub mod convert;
pub mod error;
pub mod index;
pub mod leader;
pub mod runtime;
pub mod store;

pub use error::Error;
