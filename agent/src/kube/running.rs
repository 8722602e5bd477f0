//! The handle both watches hand out: their shared state, and their task, stopped when the
//! last clone of the handle goes.

use std::sync::Arc;

use tokio::task::JoinHandle;

/// A watch's shared state and its task; dropping it (the last clone's `Arc`) stops the task.
pub(super) struct Running<S> {
    pub(super) shared: Arc<S>,
    pub(super) task: JoinHandle<()>,
}

impl<S> Drop for Running<S> {
    fn drop(&mut self) {
        self.task.abort();
    }
}
