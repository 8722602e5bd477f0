//! Admission of single API requests: the engine budgets requests, not calls, where one
//! call makes several (a cluster-pool claim of k blocks is k creates; an IPAMNode write may
//! be a spec and a status apply; a release is a delete and a finalizer's removal).

use std::future::Future;

use tokio::sync::watch;

use crate::budget::{Budget, Pass, PriorityCell};
use crate::error::IpamError;

/// Admits each API request of a call before it is sent.
pub trait Gate: Send {
    /// Waits until one more request may go. An error (the caller lost the lead) ends the
    /// call: no further request is made, and what was done stays done.
    fn request(&mut self) -> impl Future<Output = Result<(), IpamError>> + Send;
}

/// A maintenance pass's place in a budget's queue admits its requests: the first takes the
/// place's token, each further one a token of the pass lane.
impl Gate for Pass {
    async fn request(&mut self) -> Result<(), IpamError> {
        self.call().await;
        Ok(())
    }
}

/// No admission: every request goes at once (a caller that budgeted the call as a whole,
/// or a test).
#[derive(Debug, Default, Clone, Copy)]
pub struct Ungated;

impl Gate for Ungated {
    async fn request(&mut self) -> Result<(), IpamError> {
        Ok(())
    }
}

/// Writes outside a node's pass (a resync's repair and drain, the operator's count and
/// pool-status writes): each request takes a token of `budget` at the lowest priority, so
/// nodes with pods waiting go first, and is refused once the lead is lost.
pub struct Background {
    budget: Budget,
    prio: PriorityCell,
    leader: watch::Receiver<bool>,
}

impl Background {
    pub fn new(budget: Budget, leader: watch::Receiver<bool>) -> Self {
        Background {
            budget,
            prio: PriorityCell::default(),
            leader,
        }
    }
}

impl Gate for Background {
    async fn request(&mut self) -> Result<(), IpamError> {
        self.budget.acquire(&self.prio).await;
        if *self.leader.borrow() {
            Ok(())
        } else {
            Err(IpamError::NotLeader)
        }
    }
}

/// A gate that counts the requests it admitted: whether a call wrote anything.
pub(crate) struct Counted<G> {
    pub inner: G,
    pub admitted: u64,
}

impl<G: Gate> Gate for Counted<G> {
    async fn request(&mut self) -> Result<(), IpamError> {
        self.inner.request().await?;
        self.admitted += 1;
        Ok(())
    }
}
