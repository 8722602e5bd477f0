//! A global allocator that counts live heap bytes once it is started: the simulate report's
//! engine memory ([`crate::run::LIVE_HEAP_BYTES`]) and the memory benches read it.
//!
//! Written here rather than taken from a crate (`stats_alloc`, `cap`) because those count
//! from the first allocation on: the operator binary installs this allocator for all of its
//! commands, and only `simulate` starts it. Until then each call pays one relaxed load of a
//! flag that is never written, not a shared atomic add.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

/// An allocator (the system's unless [`CountingAllocator::over`] another), counting live
/// bytes after [`CountingAllocator::start`].
#[derive(Debug, Default)]
pub struct CountingAllocator<A = System> {
    inner: A,
    on: AtomicBool,
    live: AtomicIsize,
}

impl CountingAllocator {
    /// The system allocator, not counting yet.
    pub const fn new() -> Self {
        CountingAllocator::over(System)
    }
}

impl<A> CountingAllocator<A> {
    /// `inner`, not counting yet.
    pub const fn over(inner: A) -> Self {
        CountingAllocator {
            inner,
            on: AtomicBool::new(false),
            live: AtomicIsize::new(0),
        }
    }

    /// Counts from now on. Memory allocated before and freed after counts negative, so read
    /// differences, or start before the data to measure.
    pub fn start(&self) {
        self.on.store(true, Ordering::Relaxed);
    }

    /// Bytes allocated and not freed since [`CountingAllocator::start`].
    pub fn live_bytes(&self) -> isize {
        self.live.load(Ordering::Relaxed)
    }

    fn count(&self, delta: isize) {
        if self.on.load(Ordering::Relaxed) {
            self.live.fetch_add(delta, Ordering::Relaxed);
        }
    }
}

/// A layout's size as a count (a layout's size never exceeds `isize::MAX`).
fn size(bytes: usize) -> isize {
    isize::try_from(bytes).unwrap_or(isize::MAX)
}

// SAFETY: every call is forwarded to the inner allocator unchanged; only a counter is kept.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAllocator<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the inner allocator's.
        let p = unsafe { self.inner.alloc(layout) };
        if !p.is_null() {
            self.count(size(layout.size()));
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        if !p.is_null() {
            self.count(size(layout.size()));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { self.inner.dealloc(ptr, layout) };
        self.count(-size(layout.size()));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            self.count(size(new_size) - size(layout.size()));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Not installed as the global allocator: called directly, as the runtime would.
    #[test]
    fn counts_only_after_start_and_nets_frees() {
        let a = CountingAllocator::new();
        let l = Layout::from_size_align(64, 8).unwrap();
        // SAFETY: each pointer is freed once, with the layout it was allocated with.
        unsafe {
            let before = a.alloc(l);
            assert_eq!(a.live_bytes(), 0, "not started: nothing counted");
            a.start();
            let p = a.alloc(l);
            let p = a.realloc(p, l, 100);
            assert_eq!(a.live_bytes(), 100);
            a.dealloc(p, Layout::from_size_align(100, 8).unwrap());
            assert_eq!(a.live_bytes(), 0);
            a.dealloc(before, l);
            assert_eq!(a.live_bytes(), -64, "allocated before start, freed after");
        }
    }
}
