//! One generational handle type for everything that names a slot in a table: connections,
//! messages, timers, a driver's sockets and queue pairs, LNet's outgoing messages.
//!
//! A [`Handle`] is a slab index and the generation of the value that was inserted there. A
//! [`HandleSlab`] hands them out and only answers to the handle of the value it holds now, so a
//! late event for something already gone (a completion for a reaped connection, a timer for a
//! finished message) is recognised and dropped, never misapplied to the slot's next occupant. The
//! tag type parameter keeps a connection's handle from being used as a timer's.

use core::fmt;
use core::hash::{Hash, Hasher};
use core::marker::PhantomData;

use crate::slots::Slots;
use crate::trim::Trim;

/// What a handle names; its `NAME` prefixes the handle in logs (`conn#3.7`).
pub trait Tag {
    const NAME: &'static str;
}

/// Declares a handle type, `$Id` = [`Handle`]`<$Tag>`, with its tag: an uninhabited enum whose
/// [`Tag::NAME`] is `$name`. Every table keyed by handles declares its key this way.
macro_rules! handle_type {
    ($(#[$doc:meta])* $vis:vis type $Id:ident = Handle<$Tag:ident>, $name:literal;) => {
        $(#[$doc])*
        $vis type $Id = $crate::handle::Handle<$Tag>;

        #[doc = concat!("The tag of [`", stringify!($Id), "`].")]
        #[derive(Debug)]
        $vis enum $Tag {}

        impl $crate::handle::Tag for $Tag {
            const NAME: &'static str = $name;
        }
    };
}
pub(crate) use handle_type;

/// A slab key with a generation, for a `T`.
pub struct Handle<T> {
    index: u32,
    generation: u32,
    _tag: PhantomData<fn() -> T>,
}

impl<T> Handle<T> {
    /// The handle with this index and generation.
    pub const fn from_parts(index: u32, generation: u32) -> Handle<T> {
        Handle {
            index,
            generation,
            _tag: PhantomData,
        }
    }

    /// The slot.
    pub const fn index(self) -> u32 {
        self.index
    }

    /// The generation of the value it names.
    pub const fn generation(self) -> u32 {
        self.generation
    }

    /// A stable integer for tables, logs and ids carried through the kernel (wr_id, io_uring
    /// user_data): the index in the low half, the generation in the high half.
    pub const fn as_u64(self) -> u64 {
        (self.generation as u64) << 32 | self.index as u64
    }

    /// The inverse of [`Handle::as_u64`].
    pub const fn from_u64(v: u64) -> Handle<T> {
        Handle::from_parts(v as u32, (v >> 32) as u32)
    }
}

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Handle<T> {}

impl<T> PartialEq for Handle<T> {
    fn eq(&self, other: &Self) -> bool {
        self.as_u64() == other.as_u64()
    }
}

impl<T> Eq for Handle<T> {}

impl<T> Hash for Handle<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_u64().hash(state);
    }
}

impl<T> PartialOrd for Handle<T> {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Handle<T> {
    fn cmp(&self, other: &Self) -> core::cmp::Ordering {
        (self.index, self.generation).cmp(&(other.index, other.generation))
    }
}

impl<T: Tag> fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}.{}", T::NAME, self.index, self.generation)
    }
}

/// A slab whose keys are [`Handle<K>`]s. Generations count up from 1 (never 0, so a zeroed id
/// is never live) and wrap within `generation_bits` bits, for drivers that carry them in fewer.
pub struct HandleSlab<T, K = T> {
    slots: Slots<(u32, T)>,
    next_generation: u32,
    mask: u32,
    _key: PhantomData<fn() -> K>,
}

impl<T, K> Default for HandleSlab<T, K> {
    fn default() -> Self {
        HandleSlab::new()
    }
}

impl<T, K> HandleSlab<T, K> {
    /// An empty table with 32-bit generations.
    pub fn new() -> Self {
        HandleSlab::with_generation_bits(32)
    }

    /// An empty table whose generations fit in `bits` bits (1..=32).
    pub fn with_generation_bits(bits: u32) -> Self {
        let mask = if bits >= 32 {
            u32::MAX
        } else {
            (1u32 << bits.max(1)) - 1
        };
        HandleSlab {
            slots: Slots::new(),
            next_generation: 1,
            mask,
            _key: PhantomData,
        }
    }

    /// Stores `value` and returns its handle.
    pub fn insert(&mut self, value: T) -> Handle<K> {
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1) & self.mask;
        if self.next_generation == 0 {
            self.next_generation = 1;
        }
        let index = self.slots.insert((generation, value));
        Handle::from_parts(index as u32, generation)
    }

    /// The value `h` names, if it is still there.
    pub fn get(&self, h: Handle<K>) -> Option<&T> {
        self.slots
            .get(h.index as usize)
            .filter(|(g, _)| *g == h.generation)
            .map(|(_, v)| v)
    }

    /// The value `h` names, if it is still there.
    pub fn get_mut(&mut self, h: Handle<K>) -> Option<&mut T> {
        self.slots
            .get_mut(h.index as usize)
            .filter(|(g, _)| *g == h.generation)
            .map(|(_, v)| v)
    }

    /// True while `h` names a stored value.
    pub fn contains(&self, h: Handle<K>) -> bool {
        self.get(h).is_some()
    }

    /// Takes the value `h` names out, if it is still there.
    pub fn remove(&mut self, h: Handle<K>) -> Option<T> {
        if !self.contains(h) {
            return None;
        }
        Some(self.slots.remove(h.index as usize).1)
    }

    /// The handle of whatever occupies slot `index` now.
    pub fn handle_at(&self, index: u32) -> Option<Handle<K>> {
        self.slots
            .get(index as usize)
            .map(|(g, _)| Handle::from_parts(index, *g))
    }

    /// Values stored.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Slots allocated.
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// Gives back spare capacity (after a burst): see [`Slots::shrink_to`]. Handles stay valid.
    pub fn shrink_to_fit(&mut self) {
        self.slots.shrink_to_fit();
    }

    /// Every value with its handle, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (Handle<K>, &T)> + '_ {
        self.slots
            .iter()
            .map(|(i, (g, v))| (Handle::from_parts(i as u32, *g), v))
    }

    /// Every value with its handle, in slot order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Handle<K>, &mut T)> + '_ {
        self.slots
            .iter_mut()
            .map(|(i, (g, v))| (Handle::from_parts(i as u32, *g), v))
    }

    /// Every handle, collected (for loops that change the table).
    pub fn handles(&self) -> Vec<Handle<K>> {
        self.iter().map(|(h, _)| h).collect()
    }
}

/// Shrinks like [`Slots`]: a live handle is never invalidated, and since generations count
/// across the whole table a reused slot never answers to an old handle.
impl<T, K> Trim for HandleSlab<T, K> {
    fn capacity_len(&self) -> (usize, usize) {
        self.slots.capacity_len()
    }

    fn shrink_room_to(&mut self, min: usize) {
        self.slots.shrink_room_to(min);
    }
}

/// `slab[h]`: the value `h` names, for code that holds a handle it knows is live (the way a
/// `Slab` is indexed by key), borrowing only the table. Panics on a stale handle, never reaching
/// the slot's next occupant; use [`HandleSlab::get`] where the handle may be stale.
impl<T, K: Tag> core::ops::Index<Handle<K>> for HandleSlab<T, K> {
    type Output = T;

    fn index(&self, h: Handle<K>) -> &T {
        match self.get(h) {
            Some(v) => v,
            None => panic!("stale handle {h:?}"),
        }
    }
}

impl<T, K: Tag> core::ops::IndexMut<Handle<K>> for HandleSlab<T, K> {
    fn index_mut(&mut self, h: Handle<K>) -> &mut T {
        match self.get_mut(h) {
            Some(v) => v,
            None => panic!("stale handle {h:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    enum T1 {}
    impl Tag for T1 {
        const NAME: &'static str = "t1";
    }

    #[test]
    fn a_stale_handle_never_reaches_the_next_occupant() {
        let mut s: HandleSlab<&str, T1> = HandleSlab::new();
        let a = s.insert("a");
        assert_eq!(s.get(a), Some(&"a"));
        assert_eq!(s.remove(a), Some("a"));
        let b = s.insert("b");
        assert_eq!(a.index(), b.index(), "the slot is reused");
        assert_ne!(a, b);
        assert_eq!(s.get(a), None);
        assert_eq!(s.remove(a), None, "a stale remove takes nothing");
        assert_eq!(s.get(b), Some(&"b"));
        assert_eq!(
            format!("{b:?}"),
            format!("t1#{}.{}", b.index(), b.generation())
        );
        assert_eq!(Handle::<T1>::from_u64(b.as_u64()), b);
        assert_eq!(s.handle_at(b.index()), Some(b));
    }

    #[test]
    fn generations_wrap_within_their_bits_and_skip_zero() {
        let mut s: HandleSlab<u8, T1> = HandleSlab::with_generation_bits(2);
        let gens: Vec<u32> = (0..7)
            .map(|_| {
                let h = s.insert(0);
                s.remove(h);
                h.generation()
            })
            .collect();
        assert_eq!(gens, [1, 2, 3, 1, 2, 3, 1]);
    }

    #[test]
    fn indexing_by_a_live_handle_reaches_its_value() {
        let mut s: HandleSlab<u32, T1> = HandleSlab::new();
        let a = s.insert(1);
        s[a] += 41;
        assert_eq!(s[a], 42);
    }

    #[test]
    #[should_panic(expected = "stale handle t1#0.1")]
    fn indexing_by_a_stale_handle_panics_instead_of_reaching_the_next_occupant() {
        let mut s: HandleSlab<u32, T1> = HandleSlab::new();
        let a = s.insert(1);
        s.remove(a);
        let b = s.insert(2);
        assert_eq!(a.index(), b.index());
        let _ = s[a];
    }
}
