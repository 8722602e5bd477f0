//! The simulated world the engine is judged in (cargo feature `sim`): node sides,
//! kubelets, a workload, an independent observer and the `simulate` run with its report.
#![cfg_attr(test, allow(clippy::too_many_lines))]

mod addr_bits;
pub mod alloc;
pub mod cloud;
mod heap;
mod names;
pub mod observer;
pub mod run;
pub mod scarcity;
pub mod scenario;
pub mod world;

pub use observer::{Invariants, Observer};
pub use run::{CloudChoice, PoolChoice, Report, SimConfig, SourceChoice, WarmUp, simulate};
pub use world::{SimSource, World, WorldConfig};
