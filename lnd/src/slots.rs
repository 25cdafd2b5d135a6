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

use crate::trim::Trim;

/// End of the free list.
const NONE: usize = usize::MAX;

enum Entry<T> {
    Occupied(T),
    /// The next free key, or [`NONE`].
    Vacant(usize),
}

impl<T> Entry<T> {
    /// The value of an occupied slot: what `get` and `iter` see of a slot.
    fn value(&self) -> Option<&T> {
        match self {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant(_) => None,
        }
    }

    /// See [`Entry::value`].
    fn value_mut(&mut self) -> Option<&mut T> {
        match self {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant(_) => None,
        }
    }
}

/// Values at stable `usize` keys; see the [module documentation](self).
pub struct Slots<T> {
    entries: Vec<Entry<T>>,
    len: usize,
    /// The first free key below `limit`, or [`NONE`].
    free: usize,
    /// The first free key at or above `limit`, or [`NONE`]: used only when `free` is empty.
    /// Without it a key freed at the top went back to the head of the one list and was taken
    /// again by the next insert, so a steady load (a window of messages in flight) kept living
    /// at the burst's top keys and the table never shrank (review of the trim).
    free_high: usize,
    /// Keys below this are used first: the room the last shrink kept (`usize::MAX` before any).
    limit: usize,
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
            free_high: NONE,
            limit: usize::MAX,
        }
    }

    /// An empty table with room for `cap` values.
    pub fn with_capacity(cap: usize) -> Self {
        Slots {
            entries: Vec::with_capacity(cap),
            len: 0,
            free: NONE,
            free_high: NONE,
            limit: usize::MAX,
        }
    }

    /// Stores `value` and returns its key.
    pub fn insert(&mut self, value: T) -> usize {
        self.len += 1;
        let head = if self.free != NONE {
            &mut self.free
        } else {
            &mut self.free_high
        };
        if *head == NONE {
            self.entries.push(Entry::Occupied(value));
            return self.entries.len() - 1;
        }
        let key = *head;
        match core::mem::replace(&mut self.entries[key], Entry::Occupied(value)) {
            Entry::Vacant(next) => *head = next,
            Entry::Occupied(_) => unreachable!("the free list names an occupied slot"),
        }
        key
    }

    /// The value at `key`, if there is one.
    pub fn get(&self, key: usize) -> Option<&T> {
        self.entries.get(key)?.value()
    }

    /// The value at `key`, if there is one.
    pub fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        self.entries.get_mut(key)?.value_mut()
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
        let head = if key < self.limit {
            &mut self.free
        } else {
            &mut self.free_high
        };
        let Entry::Occupied(v) = core::mem::replace(slot, Entry::Vacant(*head)) else {
            unreachable!("checked occupied above");
        };
        *head = key;
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
        let values = self.entries.iter().map(Entry::value);
        values.enumerate().filter_map(|(k, v)| Some((k, v?)))
    }

    /// Every value with its key, in key order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut T)> + '_ {
        let values = self.entries.iter_mut().map(Entry::value_mut);
        values.enumerate().filter_map(|(k, v)| Some((k, v?)))
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
        self.free_high = NONE;
        self.limit = min.max(1);
        for (k, e) in self.entries.iter_mut().enumerate().rev() {
            if let Entry::Vacant(next) = e {
                let head = if k < self.limit {
                    &mut self.free
                } else {
                    &mut self.free_high
                };
                *next = *head;
                *head = k;
            }
        }
        self.entries.shrink_to(min.max(self.entries.len()));
    }
}

impl<T> Trim for Slots<T> {
    fn capacity_len(&self) -> (usize, usize) {
        (self.len, self.capacity())
    }

    fn shrink_room_to(&mut self, min: usize) {
        self.shrink_to(min);
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

    /// The review of the trim: after a burst, a steady window of values in flight (one freed,
    /// one stored, as a credit window of messages does) must not keep living at the burst's
    /// top keys; within a few trims the table is back at its floor.
    #[test]
    fn a_steady_window_after_a_burst_lets_the_table_shrink() {
        use crate::trim::TRIM_FLOOR;
        for window in [10usize, 100, 400] {
            for in_order in [true, false] {
                let mut s = Slots::new();
                let keys: Vec<usize> = (0..65_536).map(|i| s.insert(i)).collect();
                for k in keys {
                    s.remove(k);
                }
                let mut live: std::collections::VecDeque<usize> = Default::default();
                let mut rng = 0x9e37_79b9_7f4a_7c15u64;
                for step in 0..400_000usize {
                    if live.len() < window {
                        live.push_back(s.insert(step));
                    } else {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let i = if in_order {
                            0
                        } else {
                            rng as usize % live.len()
                        };
                        let k = live.remove(i).expect("in range");
                        s.remove(k);
                    }
                    if step % 50_000 == 0 {
                        s.trim(TRIM_FLOOR);
                    }
                }
                s.trim(TRIM_FLOOR);
                assert!(
                    s.capacity() <= 2 * TRIM_FLOOR,
                    "window {window}, in order {in_order}: room for {} kept",
                    s.capacity()
                );
            }
        }
    }

    /// Every key either holds the model's value or none, and the two free lists name every
    /// vacant slot once and nothing else, whatever mix of inserts, removes and shrinks.
    mod model {
        use super::super::*;
        use proptest::prelude::*;
        use std::collections::BTreeMap;

        #[derive(Debug, Clone)]
        enum Op {
            Insert,
            Remove(usize),
            Shrink(usize),
            Trim(usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => Just(Op::Insert),
                3 => (0usize..300).prop_map(Op::Remove),
                1 => (0usize..200).prop_map(Op::Shrink),
                1 => (0usize..64).prop_map(Op::Trim),
            ]
        }

        fn check(s: &Slots<u64>, model: &BTreeMap<usize, u64>) {
            assert_eq!(s.len(), model.len());
            for k in 0..s.entries.len() + 5 {
                assert_eq!(s.get(k), model.get(&k), "key {k}");
            }
            let mut seen = vec![false; s.entries.len()];
            let mut n = 0;
            for start in [s.free, s.free_high] {
                let mut f = start;
                while f != NONE {
                    assert!(f < s.entries.len(), "free list names {f}");
                    assert!(!seen[f], "free list cycles at {f}");
                    seen[f] = true;
                    match s.entries[f] {
                        Entry::Vacant(next) => f = next,
                        Entry::Occupied(_) => panic!("occupied slot {f} on a free list"),
                    }
                    n += 1;
                }
            }
            assert_eq!(n, s.entries.len() - s.len, "free lists' length");
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(500))]
            #[test]
            fn slots_match_a_model(ops in proptest::collection::vec(op(), 0..400)) {
                let mut s: Slots<u64> = Slots::new();
                let mut model = BTreeMap::new();
                let mut next = 0u64;
                for o in ops {
                    match o {
                        Op::Insert => {
                            next += 1;
                            let k = s.insert(next);
                            prop_assert!(!model.contains_key(&k));
                            model.insert(k, next);
                        }
                        Op::Remove(k) => prop_assert_eq!(s.try_remove(k), model.remove(&k)),
                        Op::Shrink(m) => s.shrink_to(m),
                        Op::Trim(f) => {
                            s.trim(f);
                        }
                    }
                    check(&s, &model);
                }
            }
        }
    }
}
