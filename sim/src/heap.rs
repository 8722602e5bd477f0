//! Deterministic heap-size estimates of std collections, from element counts and sizes (not
//! allocator measurements): the simulator reports the world's memory with them.

/// Estimated heap bytes of a B-tree map of `len` entries of `entry` bytes each: leaves of
/// 11 slots about 2/3 full, plus the node header and parent edges (a deterministic
/// estimate, not a measurement).
pub(crate) fn btree_bytes(len: usize, entry: usize) -> usize {
    if len == 0 {
        return 0;
    }
    len.div_ceil(7) * (11 * entry + 112)
}

/// Estimated heap bytes of an `Arc<str>` of `len` bytes (counts + text, 8-byte rounded).
pub(crate) fn arc_str_bytes(len: usize) -> usize {
    16 + len.div_ceil(8) * 8
}
