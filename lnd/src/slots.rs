//! [`Slots`]: a slab (values at stable integer keys, O(1) insert and remove, freed keys reused)
//! that can give its memory back after a burst.
//!
//! It is `slab::Slab` with one difference that matters for memory: `slab` reuses the most
//! recently freed key first, so after a burst drained in order the next values keep landing at
//! the highest keys, and a slab that only drops vacant slots past its last value can never
//! shrink while any traffic goes on. [`Slots::trim`] rebuilds the free list lowest key first,
//! so the values that follow settle at the bottom and the top becomes free for the next trim.
//! Values are never moved: a key stays valid for as long as its value is there.

use core::ops;

use crate::trim::{self, Trim};

/// End of the free list.
const NONE: usize = usize::MAX;

enum Entry<T> {
    Occupied(T),
    /// The next free key, or [`NONE`].
    Vacant(usize),
}

/// Values at stable `usize` keys; see the [module documentation](self).
pub struct Slots<T> {
    entries: Vec<Entry<T>>,
    len: usize,
    /// The first free key, or [`NONE`] (then the next value goes at the end).
    free: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots::new()
    }
}

impl<T> Slots<T> {
    /// An empty table.
    pub const fn new() -> Self {
        Slots {
            entries: Vec::new(),
            len: 0,
            free: NONE,
        }
    }

    /// An empty table with room for `cap` values.
    pub fn with_capacity(cap: usize) -> Self {
        Slots {
            entries: Vec::with_capacity(cap),
            len: 0,
            free: NONE,
        }
    }

    /// Stores `value` and returns its key.
    pub fn insert(&mut self, value: T) -> usize {
        self.len += 1;
        if self.free == NONE {
            self.entries.push(Entry::Occupied(value));
            return self.entries.len() - 1;
        }
        let key = self.free;
        match core::mem::replace(&mut self.entries[key], Entry::Occupied(value)) {
            Entry::Vacant(next) => self.free = next,
            Entry::Occupied(_) => unreachable!("the free list names an occupied slot"),
        }
        key
    }

    /// The value at `key`, if there is one.
    pub fn get(&self, key: usize) -> Option<&T> {
        match self.entries.get(key) {
            Some(Entry::Occupied(v)) => Some(v),
            _ => None,
        }
    }

    /// The value at `key`, if there is one.
    pub fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        match self.entries.get_mut(key) {
            Some(Entry::Occupied(v)) => Some(v),
            _ => None,
        }
    }

    /// True while a value is stored at `key`.
    pub fn contains(&self, key: usize) -> bool {
        self.get(key).is_some()
    }

    /// Takes the value at `key` out, if there is one.
    pub fn try_remove(&mut self, key: usize) -> Option<T> {
        let slot = self.entries.get_mut(key)?;
        if matches!(slot, Entry::Vacant(_)) {
            return None;
        }
        let Entry::Occupied(v) = core::mem::replace(slot, Entry::Vacant(self.free)) else {
            unreachable!("checked occupied above");
        };
        self.free = key;
        self.len -= 1;
        Some(v)
    }

    /// Takes the value at `key` out. Panics if there is none (as `Slab::remove`).
    pub fn remove(&mut self, key: usize) -> T {
        match self.try_remove(key) {
            Some(v) => v,
            None => panic!("Slots::remove: no value at key {key}"),
        }
    }

    /// Values stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots allocated.
    pub fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    /// Every value with its key, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(k, e)| match e {
                Entry::Occupied(v) => Some((k, v)),
                Entry::Vacant(_) => None,
            })
    }

    /// Every value with its key, in key order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut T)> + '_ {
        self.entries
            .iter_mut()
            .enumerate()
            .filter_map(|(k, e)| match e {
                Entry::Occupied(v) => Some((k, v)),
                Entry::Vacant(_) => None,
            })
    }

    /// Gives back every slot it can: see [`Slots::shrink_to`].
    pub fn shrink_to_fit(&mut self) {
        self.shrink_to(0);
    }

    /// Drops the free slots past the last value, keeps room for at least `min` slots, and
    /// makes the lowest free keys the next ones used.
    ///
    /// Only slots past the last value can go: a value is never moved, so one long-lived value
    /// at a high key holds the table at that size until it leaves. Reordering the free list is
    /// what makes it leave in time: the values stored from now on take the lowest keys, so the
    /// top empties as its current occupants finish and the next call can cut it. O(slots).
    pub fn shrink_to(&mut self, min: usize) {
        while matches!(self.entries.last(), Some(Entry::Vacant(_))) {
            self.entries.pop();
        }
        self.free = NONE;
        for (k, e) in self.entries.iter_mut().enumerate().rev() {
            if let Entry::Vacant(next) = e {
                *next = self.free;
                self.free = k;
            }
        }
        self.entries.shrink_to(min.max(self.entries.len()));
    }
}

impl<T> Trim for Slots<T> {
    fn trim(&mut self, floor: usize) -> bool {
        if trim::is_sparse(self.len, self.capacity(), floor) {
            self.shrink_to(trim::target(self.len, floor));
        }
        trim::still_large(self.capacity(), floor)
    }

    fn capacity_len(&self) -> (usize, usize) {
        (self.len, self.capacity())
    }
}

/// `slots[key]`, for code that knows the key is live; panics otherwise.
impl<T> ops::Index<usize> for Slots<T> {
    type Output = T;

    fn index(&self, key: usize) -> &T {
        match self.get(key) {
            Some(v) => v,
            None => panic!("Slots: no value at key {key}"),
        }
    }
}

impl<T> ops::IndexMut<usize> for Slots<T> {
    fn index_mut(&mut self, key: usize) -> &mut T {
        match self.get_mut(key) {
            Some(v) => v,
            None => panic!("Slots: no value at key {key}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_reused() {
        let mut s = Slots::new();
        let a = s.insert("a");
        let b = s.insert("b");
        let c = s.insert("c");
        assert_eq!((a, b, c), (0, 1, 2));
        assert_eq!(s.remove(b), "b");
        assert_eq!(s.try_remove(b), None);
        assert!(!s.contains(b));
        assert_eq!(s.insert("d"), b, "the freed key is reused");
        assert_eq!(s.len(), 3);
        assert_eq!(s[c], "c");
        s[c] = "e";
        assert_eq!(
            s.iter().map(|(k, v)| (k, *v)).collect::<Vec<_>>(),
            [(0, "a"), (1, "d"), (2, "e")]
        );
    }

    #[test]
    fn a_drained_burst_is_given_back_even_under_light_traffic() {
        let mut s = Slots::new();
        let keys: Vec<usize> = (0..100_000).map(|i| s.insert(i)).collect();
        let big = s.capacity();
        // Drained in order: the last key freed is the highest, and a slab reuses it first.
        for k in keys {
            s.remove(k);
        }
        let live = s.insert(7);
        assert_eq!(live, 99_999, "most recently freed first");
        // Pinned: nothing past the live value can go yet, but the free list is reordered.
        assert!(s.trim(64));
        assert!(s.capacity() >= 100_000);
        assert_eq!(s[live], 7, "a live value is never moved");
        // Light traffic from now on settles at the bottom ...
        let low = s.insert(8);
        assert_eq!(low, 0);
        s.remove(live);
        // ... so the next trim gives the burst back.
        assert!(!s.trim(64));
        assert!(
            s.capacity() <= 128 && s.capacity() < big,
            "{}",
            s.capacity()
        );
        assert_eq!(s[low], 8);
        assert_eq!(s.insert(9), 1, "lowest free key first");
    }

    #[test]
    fn a_busy_table_is_left_alone() {
        let mut s = Slots::new();
        for i in 0..1000 {
            s.insert(i);
        }
        let cap = s.capacity();
        assert!(s.trim(64), "busy and large: look again later");
        assert_eq!(s.capacity(), cap);
        assert_eq!(s.len(), 1000);
    }
}
