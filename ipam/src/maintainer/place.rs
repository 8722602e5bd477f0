//! A maintainer's place in a budget's queue across its passes: taken by a pass and let go
//! at its end, or kept for the next pass when the pass's wait for it was interrupted.

/// A place in a budget's queue (the source budget's ticket, the kube budget's [`Pass`]).
///
/// [`Pass`]: crate::budget::Pass
pub(super) enum Place<T> {
    Empty,
    /// This pass's: let go at its end.
    Taken(T),
    /// Kept for the next pass: this pass's wait for it was interrupted (by new work or its
    /// deadline) before it came up. Only then: a place nobody polls could hold the
    /// budget's dispatcher role and stall every other node.
    Kept(T),
}

impl<T> Place<T> {
    /// A pass begins: a place kept for it is its own now, let go at its end unless the
    /// pass keeps it again.
    pub(super) fn begin_pass(&mut self) {
        if let Place::Kept(t) = std::mem::replace(self, Place::Empty) {
            *self = Place::Taken(t);
        }
    }

    /// A pass ended (`ok`: without failing): only a place it kept, and only from a pass
    /// that did not fail, goes on to the next.
    pub(super) fn end_pass(&mut self, ok: bool) {
        if !(ok && matches!(self, Place::Kept(_))) {
            *self = Place::Empty;
        }
    }

    /// Kept for the next pass (nothing when there is no place).
    pub(super) fn keep(&mut self) {
        *self = match std::mem::replace(self, Place::Empty) {
            Place::Taken(t) | Place::Kept(t) => Place::Kept(t),
            Place::Empty => Place::Empty,
        };
    }

    pub(super) fn clear(&mut self) {
        *self = Place::Empty;
    }

    pub(super) fn get_mut(&mut self) -> Option<&mut T> {
        match self {
            Place::Empty => None,
            Place::Taken(t) | Place::Kept(t) => Some(t),
        }
    }

    /// The place, taken with `f` if there is none.
    pub(super) fn get_or_take(&mut self, f: impl FnOnce() -> T) -> &mut T {
        if let Place::Empty = self {
            *self = Place::Taken(f());
        }
        match self {
            Place::Taken(t) | Place::Kept(t) => t,
            Place::Empty => unreachable!("taken above"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Place;

    fn state(p: &Place<u8>) -> &'static str {
        match p {
            Place::Empty => "empty",
            Place::Taken(_) => "taken",
            Place::Kept(_) => "kept",
        }
    }

    #[test]
    fn a_place_outlives_its_pass_only_when_kept_by_a_pass_that_did_not_fail() {
        let mut p = Place::Empty;
        p.begin_pass();
        assert_eq!(*p.get_or_take(|| 1), 1);
        p.end_pass(true);
        assert_eq!(state(&p), "empty", "taken, not kept");

        p.get_or_take(|| 2);
        p.keep();
        p.end_pass(true);
        assert_eq!(state(&p), "kept");
        p.begin_pass();
        assert_eq!(state(&p), "taken", "the next pass's own now");
        assert_eq!(p.get_mut().copied(), Some(2), "the same place");
        p.keep();
        p.end_pass(false);
        assert_eq!(state(&p), "empty", "a failed pass lets it go");

        p.keep();
        assert_eq!(state(&p), "empty", "nothing to keep");
        p.get_or_take(|| 3);
        p.keep();
        assert_eq!(*p.get_or_take(|| 4), 3, "a kept place is not replaced");
        p.clear();
        assert_eq!(p.get_mut(), None);
    }
}
