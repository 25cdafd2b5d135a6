//! Giving memory back after a burst.
//!
//! Collections keep their peak capacity: a router that once held 100,000 messages behind a
//! stalled peer would keep the room for them (hundreds of MB) for ever. Every owner of
//! collections that a burst can grow (the LND endpoint, the LNet node) runs one periodic pass
//! from its timers: each collection that is mostly empty ([`is_sparse`]: less than a quarter
//! used and above a floor) is shrunk to twice what it holds ([`target`]), never below the
//! floor. The pass costs nothing per message: it runs at most every [`TRIM_INTERVAL`], and only
//! while something is still large ([`still_large`]), so an idle node with small tables has no
//! such timer at all.
//!
//! The quarter / twice rule is the hysteresis: a collection shrunk to twice its load grows
//! again only if that load doubles, and is shrunk again only if it falls below half; and a
//! shrink happens at most once an interval, so a steady load never loops between growing and
//! shrinking.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};

use crate::time::Duration;

/// How often a node that has a large collection looks at its collections.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(5);

/// Entries a node-wide collection (messages, connections, peers, timers, event queues) keeps
/// room for whatever its load: below this, reallocating is not worth what it gives back.
pub const TRIM_FLOOR: usize = 1024;

/// The same for a collection one per peer or connection (its queues), of which there may be
/// thousands: a smaller floor, so that many idle peers do not keep much each.
pub const TRIM_FLOOR_SMALL: usize = 64;

/// Whether a collection holding `len` with room for `capacity` is worth shrinking.
pub fn is_sparse(len: usize, capacity: usize, floor: usize) -> bool {
    capacity > floor && len.saturating_mul(4) < capacity
}

/// The room a sparse collection holding `len` is shrunk to.
pub fn target(len: usize, floor: usize) -> usize {
    len.saturating_mul(2).max(floor)
}

/// Whether a collection is still large enough after a pass that a later pass may have
/// something to give back (it is busy now, or a live entry pins a slab). Twice the floor,
/// not the floor: a hash map's room comes in powers of two, so one shrunk to the floor may
/// hold a little more, and that alone must not keep the pass running.
pub fn still_large(capacity: usize, floor: usize) -> bool {
    capacity > floor.saturating_mul(2)
}

/// A collection that can give memory back. A collection says how to measure and shrink
/// itself; the rule ([`Trim::trim`]) is the same for all.
pub trait Trim {
    /// Entries held and room allocated, for [`Capacity`] reports and the rule.
    fn capacity_len(&self) -> (usize, usize);

    /// Gives back room down to at least `min` entries (less only if it cannot). Never moves an
    /// entry to another key or invalidates a handle.
    fn shrink_room_to(&mut self, min: usize);

    /// Shrinks the collection if it [`is_sparse`]; returns whether it is [`still_large`].
    fn trim(&mut self, floor: usize) -> bool {
        let (len, capacity) = self.capacity_len();
        if is_sparse(len, capacity, floor) {
            self.shrink_room_to(target(len, floor));
        }
        still_large(self.capacity_len().1, floor)
    }
}

impl<T> Trim for VecDeque<T> {
    fn capacity_len(&self) -> (usize, usize) {
        (self.len(), self.capacity())
    }

    fn shrink_room_to(&mut self, min: usize) {
        self.shrink_to(min);
    }
}

impl<T> Trim for Vec<T> {
    fn capacity_len(&self) -> (usize, usize) {
        (self.len(), self.capacity())
    }

    fn shrink_room_to(&mut self, min: usize) {
        self.shrink_to(min);
    }
}

impl<K: Eq + Hash, V, S: BuildHasher> Trim for HashMap<K, V, S> {
    fn capacity_len(&self) -> (usize, usize) {
        (self.len(), self.capacity())
    }

    fn shrink_room_to(&mut self, min: usize) {
        self.shrink_to(min);
    }
}

/// One line of a memory report: a collection, what it holds and the room it keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Which collection; the per-peer and per-connection queues are summed under one name.
    pub name: &'static str,
    pub len: usize,
    pub capacity: usize,
}

/// Collects [`Capacity`] lines, summing those with the same name.
#[derive(Default)]
pub struct CapacityReport {
    lines: Vec<Capacity>,
}

impl CapacityReport {
    /// Adds `c`'s entries and room under `name`.
    pub fn add(&mut self, name: &'static str, c: &impl Trim) {
        let (len, capacity) = c.capacity_len();
        self.add_raw(name, len, capacity);
    }

    /// Adds `len` entries and `capacity` room under `name`.
    pub fn add_raw(&mut self, name: &'static str, len: usize, capacity: usize) {
        match self.lines.iter_mut().find(|l| l.name == name) {
            Some(l) => {
                l.len += len;
                l.capacity += capacity;
            }
            None => self.lines.push(Capacity {
                name,
                len,
                capacity,
            }),
        }
    }

    /// The lines, in the order their names were first added.
    pub fn finish(self) -> Vec<Capacity> {
        self.lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_queue_shrinks_to_twice_its_load_and_a_busy_one_does_not() {
        let mut q: VecDeque<u64> = (0..100_000).collect();
        assert!(q.trim(TRIM_FLOOR), "busy: left alone, looked at again");
        assert!(q.capacity() >= 100_000);
        q.drain(..97_000);
        assert!(
            q.trim(TRIM_FLOOR),
            "3000 held: room for 6000 kept, still large"
        );
        assert_eq!(q.capacity(), 6000);
        q.drain(..2500);
        assert!(
            !q.trim(TRIM_FLOOR),
            "500 held: room for the floor kept, settled"
        );
        assert_eq!(q.capacity(), TRIM_FLOOR);
        q.clear();
        assert!(!q.trim(TRIM_FLOOR), "empty: down to the floor, settled");
        assert_eq!(q.capacity(), TRIM_FLOOR);
        assert!(!q.trim(TRIM_FLOOR));
        assert_eq!(q.capacity(), TRIM_FLOOR, "never below the floor");
    }

    #[test]
    fn a_hash_map_rounded_above_the_floor_is_settled() {
        let mut m: HashMap<u64, u64> = (0..50_000).map(|i| (i, i)).collect();
        m.retain(|k, _| *k < 3);
        assert!(!m.trim(TRIM_FLOOR), "{}", m.capacity());
        assert!(m.capacity() <= 2 * TRIM_FLOOR);
        assert_eq!(m.len(), 3);
    }
}
