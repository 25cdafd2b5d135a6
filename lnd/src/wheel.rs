//! A hierarchical timer wheel: O(1) insert and cancel, expiry in exact
//! deadline order, no `unsafe`.
//!
//! # Design
//!
//! The layout follows tokio's timer wheel (`tokio::runtime::time::wheel`):
//!
//! * Time is counted in *ticks* (the wheel's resolution, 1 ms in ulnet)
//!   since the wheel's start instant. A deadline is rounded **up** to a tick
//!   (`ceil`, as tokio's `TimeSource` does by adding `tick - 1`), so the
//!   slot an entry sits in can never become due before the entry does.
//! * There are [`NUM_LEVELS`] = 6 levels of 64 slots. A level-`l` slot spans
//!   `64^l` ticks and a whole level spans `64^(l+1)` ticks, so six levels
//!   cover `2^36` ticks (about 2.2 years at 1 ms).
//! * An entry is filed at the level given by the highest bit in which its
//!   tick differs from the wheel's current tick `elapsed`
//!   (`(elapsed ^ when) | SLOT_MASK`, leading-zero count, divided by 6). All
//!   entries of level `l` therefore lie in the current level-`l` block and
//!   precede every entry of level `l + 1`, so the earliest pending work is
//!   always in the *lowest* non-empty level.
//! * Every level keeps a `u64` occupancy bitfield with one bit per non-empty
//!   slot. The next non-empty slot at or after the current one is found with
//!   `occupied.rotate_right(now_slot).trailing_zeros()`, so long stretches
//!   of empty slots cost nothing: `poll` jumps straight from one occupied
//!   slot to the next instead of walking tick by tick.
//! * When a slot above level 0 becomes due (at its *start*), all of its
//!   entries are taken out and re-filed relative to the new current tick
//!   ("cascading"); each entry moves down at most once per level.
//!
//! Unlike tokio, which threads raw pointers through intrusive lists and
//! therefore needs `unsafe`, entries live in a [`Slots`] slab and the
//! per-slot doubly linked lists are threaded through slab *indices*
//! (`prev`/`next` as `u32`, `NIL` = `u32::MAX`). Insert is "push on a
//! slot's list head", cancel is "unlink by index"; both O(1), neither
//! allocates once the slab has grown to the working-set size. A
//! [`TimerKey`] carries the slab index plus a generation (the low 32 bits of
//! the entry's insertion sequence number), so a key whose timer has already
//! fired or been cancelled never matches a later entry that reused the slot.
//!
//! # Exact ordering
//!
//! A tick is coarse (1 ms), but ulnet wants timers to fire in exact deadline
//! order, with ties in insertion order. When a level-0 slot (exactly one
//! tick) becomes due, its entries are moved to a small *ready* queue sorted
//! by `(deadline, insertion sequence)`, and `poll` hands them out from
//! there, one at a time and only once `deadline <= now`; a later slot is
//! processed only after the ready queue is empty, so when many ticks have
//! passed since the last poll they are still drained tick by tick, in order.
//! The ready queue is a `VecDeque` reused across polls (no steady-state
//! allocation); a timer inserted with a deadline in an already-processed
//! tick (including the past) is placed straight into it at its sorted
//! position.
//!
//! Because a tick's slot is processed as soon as `now` enters the tick, the
//! ready queue can briefly hold entries whose deadline is later in that same
//! tick; they stay there until `now` reaches them. `poll(now)` thus never
//! returns an entry with `deadline > now`, and always returns every entry
//! with `deadline <= now` (after any earlier ones).
//!
//! # Deadlines beyond the wheel's range
//!
//! Deadlines more than one top-level rotation (`2^36` ticks) away cannot be
//! represented by the six levels. Like tokio (which clamps them into the top
//! level), we park such entries in the top level's *furthest* slot, the one
//! just before the current top-level slot in ring order, which becomes due
//! almost one rotation from now but strictly before the entry's deadline.
//! When it does, the entry is re-filed relative to the then-current tick:
//! normally if it is now in range, or parked again. Nothing is lost, nothing
//! fires early, and a far-future timer costs one re-filing per rotation
//! (every ~2.2 years at 1 ms). Deadlines that fall in the *next* rotation
//! but in a slot numerically before the current one are filed in that slot
//! directly; the top level is treated as a ring, and a top-level slot whose
//! start lies behind the current tick is understood to be one rotation ahead.
//!
//! # Time
//!
//! The wheel never reads a clock (see [`crate::time`]): `poll(now)` is
//! handed the current time, and time never goes backwards: a `now` earlier
//! than the wheel's current time is treated as the current time.

use std::collections::VecDeque;
use std::fmt;

use crate::slots::Slots;
use crate::trim::Trim;

use crate::handle::handle_type;
use crate::time::{Duration, Instant};

/// Number of levels. 6 levels of 64 slots cover `2^36` ticks.
pub const NUM_LEVELS: usize = 6;
/// `log2` of the number of slots per level.
const LEVEL_BITS: u32 = 6;
/// Slots per level: one bit each in a `u64` occupancy field.
const SLOTS: usize = 1 << LEVEL_BITS;
/// Mask for a slot number; also OR-ed into `elapsed ^ when` so that the
/// level computation never sees fewer than 6 significant bits (level 0).
const SLOT_MASK: u64 = (SLOTS as u64) - 1;
const TOP: usize = NUM_LEVELS - 1;
/// `log2` of the ticks spanned by the whole wheel (one top-level rotation).
const WHEEL_BITS: u32 = LEVEL_BITS * NUM_LEVELS as u32;

/// "No entry" in the index-linked lists.
const NIL: u32 = u32::MAX;
/// `Entry::level` value for entries that sit in the ready queue.
const IN_READY: u8 = u8::MAX;

handle_type! {
    /// Handle to a scheduled timer, returned by [`TimerWheel::insert`].
    ///
    /// A key becomes stale when its timer fires or is cancelled; a stale key
    /// never matches a later timer, even one that reuses the same storage slot
    /// (the generation is the low 32 bits of a per-wheel insertion counter, so
    /// that would take `2^32` insertions between the key going stale and the
    /// reuse, all landing on the same index).
    pub type TimerKey = Handle<TimerTag>, "timer";
}

struct Entry<T> {
    value: T,
    /// The exact deadline, as given to `insert`.
    deadline: Instant,
    /// `deadline` rounded up to a tick number (relative to `start`).
    when: u64,
    /// Insertion sequence number: tie-breaker for equal deadlines and, in
    /// its low 32 bits, the key generation.
    seq: u64,
    prev: u32,
    next: u32,
    /// Which list the entry is on: a level and slot, or [`IN_READY`].
    level: u8,
    slot: u8,
}

/// One level: a list head per slot plus the occupancy bitfield.
struct Level {
    occupied: u64,
    heads: [u32; SLOTS],
}

impl Level {
    const EMPTY: Level = Level {
        occupied: 0,
        heads: [NIL; SLOTS],
    };
}

/// A ready-queue element. The deadline and sequence number are copied out
/// of the entry so that sorting and binary searching do not chase slab
/// indices.
#[derive(Copy, Clone)]
struct Ready {
    deadline: u64,
    seq: u64,
    index: u32,
}

impl Ready {
    #[inline]
    fn key(&self) -> (u64, u64) {
        (self.deadline, self.seq)
    }
}

/// A hierarchical timer wheel holding values of type `T`.
///
/// See the [module documentation](self) for the design.
pub struct TimerWheel<T> {
    entries: Slots<Entry<T>>,
    levels: [Level; NUM_LEVELS],
    /// Entries whose tick has been processed, ascending by
    /// `(deadline, seq)`. Every entry here precedes every entry still in
    /// `levels`.
    ready: VecDeque<Ready>,
    start: Instant,
    /// Tick length in nanoseconds (at least 1).
    tick_ns: u64,
    /// Ticks processed so far: every entry with `when <= elapsed` is in
    /// `ready`, every entry in `levels` has `when > elapsed`.
    elapsed: u64,
    /// Latest `now` seen (never decreases).
    now: Instant,
    next_seq: u64,
}

impl<T> TimerWheel<T> {
    /// An empty wheel whose time starts at `start`, with resolution `tick`
    /// (ulnet uses 1 ms). A zero `tick` is treated as 1 ns; this never
    /// panics.
    pub fn new(start: Instant, tick: Duration) -> Self {
        Self::with_capacity(start, tick, 0)
    }

    /// Like [`new`](Self::new), with room for `cap` pending timers before
    /// the entry storage has to grow.
    pub fn with_capacity(start: Instant, tick: Duration, cap: usize) -> Self {
        TimerWheel {
            entries: Slots::with_capacity(cap),
            levels: [Level::EMPTY; NUM_LEVELS],
            ready: VecDeque::with_capacity(16),
            start,
            tick_ns: tick.as_nanos().max(1),
            elapsed: 0,
            now: start,
            next_seq: 0,
        }
    }

    /// Schedules `value` to expire at `deadline`; a deadline at or before
    /// the wheel's current time expires at the next [`poll`](Self::poll).
    ///
    /// O(1); does not allocate unless the entry storage has to grow.
    ///
    /// # Panics
    ///
    /// If more than `u32::MAX - 1` timers are pending at once (keys and
    /// list links are 32-bit indices).
    pub fn insert(&mut self, deadline: Instant, value: T) -> TimerKey {
        let when = self.tick_for(deadline);
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let key = self.entries.insert(Entry {
            value,
            deadline,
            when,
            seq,
            prev: NIL,
            next: NIL,
            level: 0,
            slot: 0,
        });
        let index = match u32::try_from(key) {
            Ok(i) if i != NIL => i,
            _ => panic!("TimerWheel: more than u32::MAX - 1 pending timers"),
        };
        self.schedule(index);
        TimerKey::from_parts(index, seq as u32)
    }

    /// Cancels a pending timer and returns its value, or `None` if `key` is
    /// stale (the timer already fired or was cancelled). O(1) for timers
    /// still in the wheel; O(log r + r) for one already in the (small)
    /// ready queue of r entries.
    pub fn cancel(&mut self, key: TimerKey) -> Option<T> {
        self.lookup(key)?;
        self.unlink(key.index());
        Some(self.entries.remove(key.index() as usize).value)
    }

    /// The deadline of a pending timer, or `None` if `key` is stale.
    pub fn deadline(&self, key: TimerKey) -> Option<Instant> {
        self.lookup(key).map(|e| e.deadline)
    }

    /// Advances the wheel's time to `now` and returns the next expired
    /// timer (one with `deadline <= now`) as `(deadline, value)`, or `None`
    /// if none has expired. Call it repeatedly until `None` to drain
    /// everything due: timers come out in exact deadline order, ties in
    /// insertion order. A `now` earlier than [`now`](Self::now) is treated
    /// as `self.now()`.
    pub fn poll(&mut self, now: Instant) -> Option<(Instant, T)> {
        if now > self.now {
            self.now = now;
        }
        let now = self.now;
        let target = self.tick_for(now);
        loop {
            if let Some(head) = self.ready.front() {
                if head.deadline > now.as_nanos() {
                    // The earliest timer is due later within an already
                    // processed tick; everything still in the levels is
                    // later still. (Here `elapsed >= target` already.)
                    return None;
                }
                let index = head.index as usize;
                self.ready.pop_front();
                let entry = self.entries.remove(index);
                return Some((entry.deadline, entry.value));
            }
            match self.next_expiration() {
                Some((level, slot, tick)) if tick <= target => {
                    self.process_slot(level, slot, tick);
                }
                _ => {
                    // Nothing due up to `target`: jump there directly.
                    // Every occupied slot starts after `target`, so all
                    // entries stay validly filed relative to it.
                    if target > self.elapsed {
                        self.elapsed = target;
                    }
                    return None;
                }
            }
        }
    }

    /// An instant at or before which the next [`poll`](Self::poll) may
    /// return something, or `None` if the wheel is empty.
    ///
    /// Never later than the earliest pending deadline rounded up to its
    /// tick. It may be earlier: when the next work is a higher-level slot
    /// that has to be cascaded, this is the start of that slot, and polling
    /// then may return nothing (ask again afterwards). It may also be
    /// earlier than [`now`](Self::now) if expired timers have not been
    /// polled out yet.
    pub fn next_deadline(&self) -> Option<Instant> {
        if let Some(head) = self.ready.front() {
            return Some(Instant::from_nanos(head.deadline));
        }
        self.next_expiration()
            .map(|(_, _, tick)| self.tick_to_instant(tick))
    }

    /// Number of pending timers (including expired ones not yet polled).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// `true` if no timers are pending.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The wheel's notion of the current time: the latest `now` passed to
    /// [`poll`](Self::poll), or the start instant.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The wheel's resolution.
    pub fn tick(&self) -> Duration {
        Duration::from_nanos(self.tick_ns)
    }

    // ---- internals -------------------------------------------------------

    fn lookup(&self, key: TimerKey) -> Option<&Entry<T>> {
        self.entries
            .get(key.index() as usize)
            .filter(|e| e.seq as u32 == key.generation())
    }

    /// Tick number of `t`, rounded up: the first tick at whose start `t`
    /// has passed. Instants at or before `start` are tick 0.
    #[inline]
    fn tick_for(&self, t: Instant) -> u64 {
        match t.as_nanos().saturating_sub(self.start.as_nanos()) {
            0 => 0,
            d => (d - 1) / self.tick_ns + 1,
        }
    }

    #[inline]
    fn tick_to_instant(&self, tick: u64) -> Instant {
        Instant::from_nanos(
            self.start
                .as_nanos()
                .saturating_add(tick.saturating_mul(self.tick_ns)),
        )
    }

    /// Files entry `index` relative to the current tick: into the ready
    /// queue if its tick has already been processed, else into a slot.
    fn schedule(&mut self, index: u32) {
        let entry = &self.entries[index as usize];
        if entry.when <= self.elapsed {
            let item = Ready {
                deadline: entry.deadline.as_nanos(),
                seq: entry.seq,
                index,
            };
            // Usually the new entry is the latest (e.g. "due now"), so the
            // insertion point is the back and nothing has to move.
            let pos = self.ready.partition_point(|r| r.key() < item.key());
            self.ready.insert(pos, item);
            self.entries[index as usize].level = IN_READY;
        } else {
            let (level, slot) = self.slot_for(entry.when);
            self.link(index, level, slot);
        }
    }

    /// Level and slot for an entry due at tick `when > elapsed`.
    #[inline]
    fn slot_for(&self, when: u64) -> (usize, usize) {
        debug_assert!(when > self.elapsed);
        // The highest differing bit decides the level; OR-ing in the slot
        // mask makes anything that differs only in the low 6 bits level 0.
        let masked = (self.elapsed ^ when) | SLOT_MASK;
        let significant = 63 - masked.leading_zeros();
        let level = (significant / LEVEL_BITS) as usize;
        if level < NUM_LEVELS {
            let slot = (when >> (LEVEL_BITS * level as u32)) & SLOT_MASK;
            return (level, slot as usize);
        }
        // Beyond the current top-level rotation block.
        let shift = LEVEL_BITS * TOP as u32;
        let now_slot = (self.elapsed >> shift) & SLOT_MASK;
        let when_slot = (when >> shift) & SLOT_MASK;
        if when >> WHEEL_BITS == (self.elapsed >> WHEEL_BITS) + 1 && when_slot < now_slot {
            // In the next block, in a slot before the current one: that
            // slot's next occurrence (one rotation ahead) is exactly when
            // this entry must be looked at.
            (TOP, when_slot as usize)
        } else {
            // At least a full rotation away: park it in the furthest slot
            // (just before the current one in ring order). That slot comes
            // due strictly before `when`, and the entry is re-filed then.
            (TOP, ((now_slot + SLOT_MASK) & SLOT_MASK) as usize)
        }
    }

    /// Pushes entry `index` on the front of `levels[level].heads[slot]`.
    #[inline]
    fn link(&mut self, index: u32, level: usize, slot: usize) {
        let lvl = &mut self.levels[level];
        let head = lvl.heads[slot];
        lvl.heads[slot] = index;
        lvl.occupied |= 1 << slot;
        let entry = &mut self.entries[index as usize];
        entry.prev = NIL;
        entry.next = head;
        entry.level = level as u8;
        entry.slot = slot as u8;
        if head != NIL {
            self.entries[head as usize].prev = index;
        }
    }

    /// Removes entry `index` from whichever list (slot or ready) holds it.
    /// The entry itself stays in the slab.
    fn unlink(&mut self, index: u32) {
        let entry = &self.entries[index as usize];
        let (prev, next, level, slot) = (entry.prev, entry.next, entry.level, entry.slot);
        if level == IN_READY {
            let key = (entry.deadline.as_nanos(), entry.seq);
            let pos = self.ready.partition_point(|r| r.key() < key);
            debug_assert_eq!(self.ready.get(pos).map(|r| r.index), Some(index));
            self.ready.remove(pos);
            return;
        }
        let lvl = &mut self.levels[level as usize];
        if prev == NIL {
            lvl.heads[slot as usize] = next;
            if next == NIL {
                lvl.occupied &= !(1 << slot);
            }
        } else {
            self.entries[prev as usize].next = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        }
    }

    /// The earliest occupied slot as `(level, slot, tick at which it is
    /// due)`. The lowest non-empty level always holds the earliest work (see
    /// the module docs), so only that level is examined. O(levels).
    fn next_expiration(&self) -> Option<(usize, usize, u64)> {
        for (level, lvl) in self.levels.iter().enumerate() {
            if lvl.occupied == 0 {
                continue;
            }
            let shift = LEVEL_BITS * level as u32;
            let now_slot = (self.elapsed >> shift) & SLOT_MASK;
            // Rotate so that bit 0 is the current slot: the lowest set bit
            // is then the distance to the next occupied slot.
            let distance = u64::from(lvl.occupied.rotate_right(now_slot as u32).trailing_zeros());
            let slot = (now_slot + distance) & SLOT_MASK;
            // Ticks spanned by the whole level (at most 2^36): the level's
            // current block starts at `elapsed` rounded down to it.
            let level_bits = shift + LEVEL_BITS;
            let level_start = self.elapsed & !((1u64 << level_bits) - 1);
            let mut tick = level_start.saturating_add(slot << shift);
            if tick <= self.elapsed {
                // Only the top level wraps: a slot "behind" the current
                // one holds entries for the next rotation.
                debug_assert_eq!(level, TOP);
                tick = tick.saturating_add(1u64 << level_bits);
            }
            return Some((level, slot as usize, tick));
        }
        None
    }

    /// Processes the due slot `levels[level].heads[slot]` at tick `tick`:
    /// advances `elapsed` to `tick`, moves expired entries (all of them for
    /// level 0; those due exactly at the slot start otherwise) to the ready
    /// queue, and re-files the rest one or more levels down.
    fn process_slot(&mut self, level: usize, slot: usize, tick: u64) {
        debug_assert!(tick > self.elapsed);
        self.elapsed = tick;
        let lvl = &mut self.levels[level];
        let mut cur = lvl.heads[slot];
        lvl.heads[slot] = NIL;
        lvl.occupied &= !(1u64 << slot);
        let mut pushed = false;
        while cur != NIL {
            let entry = &mut self.entries[cur as usize];
            let (next, when) = (entry.next, entry.when);
            if when <= tick {
                debug_assert_eq!(when, tick);
                entry.level = IN_READY;
                self.ready.push_back(Ready {
                    deadline: entry.deadline.as_nanos(),
                    seq: entry.seq,
                    index: cur,
                });
                pushed = true;
            } else {
                debug_assert!(level > 0);
                let (l, s) = self.slot_for(when);
                self.link(cur, l, s);
            }
            cur = next;
        }
        if pushed {
            // All entries of one tick, in list (LIFO) order: sort them by
            // exact deadline, then insertion order. Sequence numbers are
            // unique, so an unstable sort is deterministic.
            self.ready
                .make_contiguous()
                .sort_unstable_by_key(Ready::key);
        }
    }
}

impl<T> fmt::Debug for TimerWheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerWheel")
            .field("len", &self.len())
            .field("now", &self.now)
            .field("tick", &self.tick())
            .field("ready", &self.ready.len())
            .field("next_deadline", &self.next_deadline())
            .finish()
    }
}

/// After a burst of timers (one per message in flight) the entry slab and the ready queue keep
/// their peak room; this gives it back. Entries never move, so keys and the index links stay
/// valid.
impl<T> Trim for TimerWheel<T> {
    fn trim(&mut self, floor: usize) -> bool {
        let entries = self.entries.trim(floor);
        let ready = self.ready.trim(floor);
        entries || ready
    }

    fn capacity_len(&self) -> (usize, usize) {
        let (n, cap) = self.entries.capacity_len();
        (n, cap + self.ready.capacity())
    }

    /// The entry table's room (the ready queue is trimmed on its own by [`Trim::trim`]).
    fn shrink_room_to(&mut self, min: usize) {
        self.entries.shrink_room_to(min);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const MS: Duration = Duration::from_millis(1);

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    fn us(n: u64) -> Instant {
        Instant::from_nanos(n * 1_000)
    }

    fn drain<T>(w: &mut TimerWheel<T>, now: Instant) -> Vec<(Instant, T)> {
        std::iter::from_fn(|| w.poll(now)).collect()
    }

    #[test]
    fn empty_wheel() {
        let mut w: TimerWheel<()> = TimerWheel::new(Instant::ZERO, MS);
        assert!(w.is_empty());
        assert_eq!(w.len(), 0);
        assert_eq!(w.next_deadline(), None);
        assert!(w.poll(Instant::from_secs(1_000_000)).is_none());
        assert_eq!(w.now(), Instant::from_secs(1_000_000));
    }

    #[test]
    fn zero_tick_is_clamped() {
        let mut w = TimerWheel::new(Instant::ZERO, Duration::ZERO);
        assert_eq!(w.tick(), Duration::from_nanos(1));
        w.insert(Instant::from_nanos(5), 'a');
        assert!(w.poll(Instant::from_nanos(4)).is_none());
        assert_eq!(
            w.poll(Instant::from_nanos(5)),
            Some((Instant::from_nanos(5), 'a'))
        );
    }

    #[test]
    fn never_fires_early() {
        let mut w = TimerWheel::new(Instant::ZERO, MS);
        // Deadline in the middle of tick 3 (rounded up to 3 ms).
        let d = us(2_500);
        w.insert(d, 1);
        assert_eq!(w.next_deadline(), Some(ms(3)));
        assert!(w.poll(ms(2)).is_none());
        // The tick is entered and processed, but the deadline is not reached.
        assert!(w.poll(us(2_499)).is_none());
        // Now the ready entry's exact deadline is known.
        assert_eq!(w.next_deadline(), Some(d));
        assert_eq!(w.poll(d), Some((d, 1)));
        assert!(w.poll(d).is_none());
        assert!(w.is_empty());
    }

    #[test]
    fn exact_order_within_and_across_ticks() {
        let mut w = TimerWheel::new(Instant::ZERO, MS);
        let deadlines = [
            us(5_900),
            us(5_100),
            us(100),
            us(70_000),
            us(5_500),
            us(4_999),
            Instant::from_secs(5),
            us(64_000),
        ];
        for (i, d) in deadlines.iter().enumerate() {
            w.insert(*d, i);
        }
        let got = drain(&mut w, Instant::from_secs(10));
        let mut expected: Vec<(Instant, usize)> = deadlines.iter().copied().zip(0..).collect();
        expected.sort();
        assert_eq!(got, expected);
        assert!(w.is_empty());
    }

    #[test]
    fn ties_in_insertion_order() {
        let mut w = TimerWheel::new(Instant::ZERO, MS);
        for i in 0..100 {
            w.insert(ms(7), i);
        }
        // Also ties on a deadline that cascades from level 1.
        for i in 100..200 {
            w.insert(ms(128), i);
        }
        let got: Vec<usize> = drain(&mut w, ms(1_000))
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        assert_eq!(got, (0..200).collect::<Vec<_>>());
    }

    #[test]
    fn cancel_and_stale_keys() {
        let mut w = TimerWheel::new(Instant::ZERO, MS);
        let a = w.insert(ms(10), "a");
        let b = w.insert(ms(20), "b");
        let c = w.insert(ms(30_000), "c");
        assert_eq!(w.len(), 3);
        assert_eq!(w.deadline(b), Some(ms(20)));
        assert_eq!(w.cancel(b), Some("b"));
        assert_eq!(w.cancel(b), None);
        assert_eq!(w.deadline(b), None);
        // The freed slab slot is reused; the stale key must not match.
        let d = w.insert(ms(20), "d");
        assert_ne!(b, d);
        assert_eq!(w.cancel(b), None);
        assert_eq!(w.deadline(d), Some(ms(20)));
        assert_eq!(drain(&mut w, ms(25)), vec![(ms(10), "a"), (ms(20), "d")]);
        // Fired keys are stale too.
        assert_eq!(w.cancel(a), None);
        assert_eq!(w.cancel(d), None);
        assert_eq!(w.len(), 1);
        assert_eq!(w.cancel(c), Some("c"));
        assert!(w.is_empty());
        assert_eq!(w.next_deadline(), None);
        assert!(w.poll(ms(100_000)).is_none());
    }

    #[test]
    fn cancel_entry_in_ready_queue() {
        let mut w = TimerWheel::new(Instant::ZERO, MS);
        let d1 = us(1_200);
        let d2 = us(1_500);
        let d3 = us(1_800);
        let k1 = w.insert(d1, 1);
        let k2 = w.insert(d2, 2);
        let _k3 = w.insert(d3, 3);
        // Polling inside tick 2 moves all three into the ready queue.
        assert_eq!(w.poll(d1), Some((d1, 1)));
        assert!(w.poll(d1).is_none());
        assert_eq!(w.cancel(k1), None);
        assert_eq!(w.cancel(k2), Some(2));
        assert_eq!(w.next_deadline(), Some(d3));
        assert_eq!(drain(&mut w, ms(2)), vec![(d3, 3)]);
    }

    #[test]
    fn past_deadlines_fire_at_next_poll_in_order() {
        let mut w = TimerWheel::new(ms(1_000), MS);
        w.poll(ms(5_000));
        w.insert(ms(4_000), "b");
        w.insert(ms(10), "a"); // before the wheel's start
        w.insert(ms(5_000), "c");
        w.insert(ms(5_001), "later");
        assert_eq!(w.next_deadline(), Some(ms(10)));
        assert_eq!(
            drain(&mut w, ms(5_000)),
            vec![(ms(10), "a"), (ms(4_000), "b"), (ms(5_000), "c")]
        );
        assert_eq!(drain(&mut w, ms(6_000)), vec![(ms(5_001), "later")]);
    }

    #[test]
    fn now_going_backwards_is_ignored() {
        let mut w = TimerWheel::new(Instant::ZERO, MS);
        w.insert(ms(50), 1);
        assert!(w.poll(ms(40)).is_none());
        assert!(w.poll(ms(10)).is_none());
        assert_eq!(w.now(), ms(40));
        w.insert(ms(30), 2);
        // Treated as poll(40 ms): the 30 ms timer is due, the 50 ms one not.
        assert_eq!(w.poll(ms(0)), Some((ms(30), 2)));
        assert!(w.poll(ms(0)).is_none());
        assert_eq!(w.poll(ms(50)), Some((ms(50), 1)));
    }

    #[test]
    fn far_future_beyond_top_level() {
        const DAY: u64 = 86_400_000;
        let mut w = TimerWheel::new(Instant::ZERO, MS);
        // 2^36 ms is about 795 days; go well beyond.
        let far = [
            5 * 365 * DAY,
            3 * 365 * DAY + 17,
            (1 << 36) + 1,
            (1 << 36) - 1,
            800 * DAY,
        ];
        for (i, &d) in far.iter().enumerate() {
            w.insert(ms(d), i);
        }
        let mut expected: Vec<(Instant, usize)> = far.iter().map(|&d| ms(d)).zip(0..).collect();
        expected.sort();
        // Walk time forward following next_deadline; nothing may fire early.
        let mut got = Vec::new();
        let mut steps = 0;
        while let Some(next) = w.next_deadline() {
            steps += 1;
            assert!(steps < 10_000, "too many wake-ups");
            // next_deadline is never later than the earliest deadline.
            assert!(next <= expected[got.len()].0);
            while let Some((d, v)) = w.poll(next) {
                assert!(d <= next);
                got.push((d, v));
            }
        }
        assert_eq!(got, expected);
    }

    #[test]
    fn far_future_with_one_big_jump() {
        let mut w = TimerWheel::new(Instant::ZERO, Duration::from_nanos(1));
        // Tick 1 ns: a rotation is 2^36 ns (~69 s). Five minutes is >4
        // rotations away.
        let d = Instant::from_secs(300);
        w.insert(d, ());
        w.insert(Instant::from_secs(299), ());
        assert!(w.poll(Instant::from_secs(298)).is_none());
        assert_eq!(w.len(), 2);
        assert_eq!(w.poll(d).map(|x| x.0), Some(Instant::from_secs(299)));
        assert_eq!(w.poll(d).map(|x| x.0), Some(d));
        assert!(w.poll(d).is_none());
    }

    #[test]
    fn next_deadline_tracks_earliest() {
        let mut w = TimerWheel::new(Instant::ZERO, MS);
        w.insert(ms(5_000), ());
        let nd = w.next_deadline().unwrap();
        assert!(nd <= ms(5_000));
        w.insert(ms(3), ());
        assert_eq!(w.next_deadline(), Some(ms(3)));
        assert!(w.poll(ms(3)).is_some());
        let mut polls = 0;
        while let Some(nd) = w.next_deadline() {
            polls += 1;
            assert!(nd <= ms(5_000));
            if let Some((d, ())) = w.poll(nd) {
                assert_eq!(d, ms(5_000));
            }
        }
        // A cascade from a higher level costs a few extra wake-ups, bounded
        // by the number of levels.
        assert!(polls <= NUM_LEVELS + 1, "{polls}");
    }

    #[test]
    fn extreme_instants_do_not_panic() {
        let mut w = TimerWheel::new(Instant::from_nanos(u64::MAX - 10), Duration::from_nanos(3));
        w.insert(Instant::MAX, 1);
        w.insert(Instant::ZERO, 0);
        assert_eq!(
            w.poll(Instant::MAX - Duration::from_nanos(1)),
            Some((Instant::ZERO, 0))
        );
        assert!(w.poll(Instant::MAX - Duration::from_nanos(1)).is_none());
        assert_eq!(w.poll(Instant::MAX), Some((Instant::MAX, 1)));

        let mut w = TimerWheel::new(Instant::ZERO, Duration::from_secs(1));
        w.insert(Instant::MAX, ());
        assert!(w.next_deadline().is_some());
        assert!(w.poll(Instant::from_secs(1 << 30)).is_none());
        assert!(w.poll(Instant::MAX).is_some());
    }

    #[test]
    fn many_timers_drain_in_order() {
        let mut w = TimerWheel::with_capacity(Instant::ZERO, MS, 10_000);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut expected = Vec::new();
        for i in 0..10_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let d = Instant::from_nanos(x % 600_000_000_000);
            w.insert(d, i);
            expected.push((d, i));
        }
        expected.sort();
        let mut got = Vec::new();
        let mut now = Instant::ZERO;
        while !w.is_empty() {
            now += Duration::from_millis(777);
            got.extend(drain(&mut w, now));
        }
        assert_eq!(got, expected);
    }

    // ---- model-based property test ---------------------------------------

    #[derive(Clone, Debug)]
    enum Op {
        /// Insert at `now + offset` (or `now - offset` if `past`).
        Insert { offset: u64, past: bool },
        /// Cancel the `n % issued`-th key ever issued (live or stale).
        Cancel(usize),
        /// Advance time by the given nanoseconds and drain.
        Advance(u64),
        /// Poll with a `now` this far in the past (must act as "now") and
        /// drain.
        PollBack(u64),
        /// Check `deadline()` of the `n % issued`-th key.
        Deadline(usize),
    }

    const NS_MS: u64 = 1_000_000;
    const NS_S: u64 = 1_000_000_000;
    const NS_DAY: u64 = 86_400 * NS_S;
    const NS_YEAR: u64 = 365 * NS_DAY;

    /// Real-time ranges, for ticks around 1 ms.
    fn op_real() -> impl Strategy<Value = Op> {
        let offset = prop_oneof![
            4 => 0..100 * NS_MS,
            3 => 0..10 * NS_S,
            2 => 0..NS_DAY,
            1 => 0..5 * NS_YEAR,
        ];
        let advance = prop_oneof![
            4 => 0..10 * NS_MS,
            3 => 0..2 * NS_S,
            2 => 0..NS_DAY,
            1 => 0..2 * NS_YEAR,
        ];
        prop_oneof![
            8 => (offset, prop::bool::weighted(0.15))
                .prop_map(|(offset, past)| Op::Insert { offset: if past { offset % NS_S } else { offset }, past }),
            2 => any::<usize>().prop_map(Op::Cancel),
            4 => advance.prop_map(Op::Advance),
            1 => (0..NS_S).prop_map(Op::PollBack),
            1 => any::<usize>().prop_map(Op::Deadline),
        ]
    }

    /// Ranges scaled for a 1 ns tick, so that the top level wraps many
    /// times (a rotation is 2^36 ns, about 69 s).
    fn op_small_tick() -> impl Strategy<Value = Op> {
        const ROT: u64 = 1 << 36;
        let offset = prop_oneof![
            3 => 0..1u64 << 12,
            3 => 0..1u64 << 26,
            2 => 0..ROT,
            2 => 0..4 * ROT,
        ];
        let advance = prop_oneof![
            3 => 0..1u64 << 10,
            3 => 0..1u64 << 24,
            2 => 0..ROT / 2,
            1 => 0..3 * ROT,
        ];
        prop_oneof![
            8 => (offset, prop::bool::weighted(0.15))
                .prop_map(|(offset, past)| Op::Insert { offset: if past { offset % 4096 } else { offset }, past }),
            2 => any::<usize>().prop_map(Op::Cancel),
            4 => advance.prop_map(Op::Advance),
            1 => (0..4096u64).prop_map(Op::PollBack),
            1 => any::<usize>().prop_map(Op::Deadline),
        ]
    }

    fn run_model(start: u64, tick: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let start = Instant::from_nanos(start);
        let tick_d = Duration::from_nanos(tick);
        let mut w: TimerWheel<u64> = TimerWheel::new(start, tick_d);
        let mut model: BTreeMap<(Instant, u64), u64> = BTreeMap::new();
        // Every key issued, with its model key.
        let mut keys: Vec<(TimerKey, (Instant, u64))> = Vec::new();
        let mut now = start;
        let mut seq = 0u64;

        let check_drain = |w: &mut TimerWheel<u64>,
                           model: &mut BTreeMap<(Instant, u64), u64>,
                           poll_at: Instant,
                           now: Instant|
         -> Result<(), TestCaseError> {
            let got: Vec<(Instant, u64)> = std::iter::from_fn(|| w.poll(poll_at)).collect();
            let mut expected = Vec::new();
            while let Some(entry) = model.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                let ((d, _), v) = entry.remove_entry();
                expected.push((d, v));
            }
            prop_assert_eq!(got, expected);
            prop_assert_eq!(w.len(), model.len());
            prop_assert_eq!(w.now(), now);
            if let Some((&(d, _), _)) = model.first_key_value() {
                let nd = w.next_deadline();
                prop_assert!(nd.is_some());
                // Never later than the earliest deadline rounded up to a tick.
                let rel = d.as_nanos().saturating_sub(start.as_nanos());
                let rounded = start
                    .as_nanos()
                    .saturating_add(rel.div_ceil(tick).saturating_mul(tick));
                prop_assert!(nd.unwrap().as_nanos() <= rounded, "{:?} > {}", nd, rounded);
            } else {
                prop_assert_eq!(w.next_deadline(), None);
            }
            Ok(())
        };

        for op in ops {
            match op {
                Op::Insert { offset, past } => {
                    let d = if past {
                        now - Duration::from_nanos(offset)
                    } else {
                        now + Duration::from_nanos(offset)
                    };
                    let v = seq;
                    let k = w.insert(d, v);
                    model.insert((d, seq), v);
                    keys.push((k, (d, seq)));
                    seq += 1;
                    prop_assert_eq!(w.len(), model.len());
                }
                Op::Cancel(n) => {
                    if keys.is_empty() {
                        continue;
                    }
                    let (k, mk) = keys[n % keys.len()];
                    prop_assert_eq!(w.cancel(k), model.remove(&mk));
                    prop_assert_eq!(w.len(), model.len());
                }
                Op::Deadline(n) => {
                    if keys.is_empty() {
                        continue;
                    }
                    let (k, mk) = keys[n % keys.len()];
                    let expected = model.contains_key(&mk).then_some(mk.0);
                    prop_assert_eq!(w.deadline(k), expected);
                }
                Op::Advance(dt) => {
                    now += Duration::from_nanos(dt);
                    check_drain(&mut w, &mut model, now, now)?;
                }
                Op::PollBack(dt) => {
                    check_drain(&mut w, &mut model, now - Duration::from_nanos(dt), now)?;
                }
            }
        }
        // Finally everything must come out, in order.
        now = Instant::MAX;
        check_drain(&mut w, &mut model, now, now)?;
        prop_assert!(w.is_empty());
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn matches_model_real_time(
            start in prop_oneof![Just(0u64), 0..1_000 * NS_S],
            tick in prop_oneof![4 => Just(NS_MS), 1 => Just(250_000u64), 1 => Just(3 * NS_MS), 1 => Just(NS_S)],
            ops in prop::collection::vec(op_real(), 1..120),
        ) {
            run_model(start, tick, ops)?;
        }

        #[test]
        fn matches_model_small_tick(
            start in prop_oneof![Just(0u64), 0..1u64 << 40],
            tick in prop_oneof![Just(1u64), Just(7u64)],
            ops in prop::collection::vec(op_small_tick(), 1..120),
        ) {
            run_model(start, tick, ops)?;
        }
    }
}
