//! When each of a router's nets last heard from anyone: the liveness a router advertises for
//! its own NIs in its ping reply (reference section 6.4).
//!
//! Lustre keeps `net_last_alive` per net: set when the net starts (api-ni.c lnet_net_alloc) and
//! refreshed by every message a routing node receives on it (lib-move.c lnet_parse). Its router
//! checker (router.c lnet_update_ni_status_locked) marks every NI of a net DOWN in the ping
//! buffer once the net has been silent for `router_ping_timeout + alive_router_check_interval`,
//! and UP again at the next message. Nodes that use the router as a gateway then stop routing
//! through it to that net (`avoid_asym_router_failure`): a router that lost a net says so
//! instead of black-holing what is sent there.
//!
//! The daemon runs one [`LnetNode`](crate::LnetNode) per NI, each on its own thread, yet a ping
//! arriving on one NI must report all of them, so the board is shared: one slot per NID of the
//! node (`NodeConfig::node_nids`), written by the runtime that owns the NI, read by whichever
//! runtime answers a ping. Each slot holds the time of the last message, on the nodes' common
//! clock, written at most once per [`RESOLUTION`] so that the per-message cost is one relaxed
//! load.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lnd::time::{Duration, Instant};
use lnd::wire::Nid;

/// How stale a slot may get before a message refreshes it (Lustre's is one second too).
pub const RESOLUTION: Duration = Duration::from_secs(1);

/// A slot's value once its NI's fabric failed.
const FAILED: u64 = u64::MAX;

/// The last time each NID of a node heard a message; 0 until the first one.
#[derive(Clone)]
pub struct NetAlive {
    slots: Arc<[AtomicU64]>,
}

impl NetAlive {
    /// A board for a node with `nids` NIDs, none heard from yet.
    pub fn new(nids: usize) -> NetAlive {
        NetAlive {
            slots: (0..nids).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Slots on the board.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the board has no slot.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// NID `i` received a message at `now`.
    pub fn heard(&self, i: usize, now: Instant) {
        let Some(slot) = self.slots.get(i) else {
            return;
        };
        let t = now.as_nanos().max(1);
        if t.saturating_sub(slot.load(Ordering::Relaxed)) >= RESOLUTION.as_nanos() {
            slot.fetch_max(t, Ordering::Relaxed);
        }
    }

    /// When NID `i` last received a message (`None`: never, no such slot, or its fabric
    /// failed).
    pub fn last(&self, i: usize) -> Option<Instant> {
        let t = self.slots.get(i)?.load(Ordering::Relaxed);
        (t != 0 && t != FAILED).then(|| Instant::from_nanos(t))
    }

    /// NID `i`'s fabric failed for good: the NI is down whatever arrives (Lustre's
    /// ni_fatal_error_on, which lnet_update_ni_status_locked reports DOWN). It stays so, as the
    /// largest value a slot can hold ([`NetAlive::heard`] only raises a slot), until the NI is
    /// removed.
    pub fn fail(&self, i: usize) {
        if let Some(slot) = self.slots.get(i) {
            slot.store(FAILED, Ordering::Relaxed);
        }
    }

    /// Whether NID `i`'s fabric failed ([`NetAlive::fail`]).
    pub fn failed(&self, i: usize) -> bool {
        self.slots
            .get(i)
            .is_some_and(|s| s.load(Ordering::Relaxed) == FAILED)
    }

    /// Whether two handles share one board.
    pub fn same_board(&self, other: &NetAlive) -> bool {
        Arc::ptr_eq(&self.slots, &other.slots)
    }

    /// A new board for a node whose NIDs went from `old` (this board's order) to `new` (an NI
    /// added or removed at run time), each NID that stays keeping its last-heard time. A
    /// runtime still writing to this board until it adopts the new one loses at most one
    /// refresh ([`RESOLUTION`]).
    pub fn carried(&self, old: &[Nid], new: &[Nid]) -> NetAlive {
        let board = NetAlive::new(new.len());
        for (slot, nid) in board.slots.iter().zip(new) {
            if let Some(i) = old.iter().position(|o| o == nid) {
                if let Some(prev) = self.slots.get(i) {
                    slot.store(prev.load(Ordering::Relaxed), Ordering::Relaxed);
                }
            }
        }
        board
    }
}

impl fmt::Debug for NetAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.slots.iter().map(|s| s.load(Ordering::Relaxed)))
            .finish()
    }
}

/// Whether a net that started at `started` and last heard a message at `last` is still alive
/// at `now` for a router whose silence bound is `bound` (router_ping_timeout +
/// alive_router_check_interval).
pub fn net_alive(started: Instant, last: Option<Instant>, now: Instant, bound: Duration) -> bool {
    let since = last.map_or(started, |l| l.max(started));
    now.saturating_duration_since(since) <= bound
}

/// Which of a node's nets are alive, one of the sub-states an [`LnetNode`](crate::LnetNode) is
/// built from: the board (shared with the sibling runtimes when the configuration gives one),
/// this node's NIs' slots on it, the slots it may judge, and when it started.
pub(crate) struct NetLiveness {
    /// When each NID of the node's NIDs last heard a message.
    pub(crate) board: NetAlive,
    /// For each of our NIs, its slot on `board`.
    pub(crate) slot: Vec<usize>,
    /// Which slots this node may judge: its own NIs', and its siblings' when the board is
    /// shared.
    pub(crate) judged: Vec<bool>,
    /// When the node started: a net is alive for the silence bound from then (lnet_net_alloc).
    pub(crate) started: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_net_is_alive_until_it_has_been_silent_longer_than_the_bound() {
        let bound = Duration::from_secs(110);
        let start = Instant::from_secs(5);
        let b = NetAlive::new(2);
        assert!(net_alive(start, b.last(0), Instant::from_secs(115), bound));
        assert!(!net_alive(start, b.last(0), Instant::from_secs(116), bound));
        b.heard(0, Instant::from_secs(100));
        assert!(net_alive(start, b.last(0), Instant::from_secs(210), bound));
        assert!(!net_alive(start, b.last(0), Instant::from_secs(211), bound));
        // The other slot is untouched; an out-of-range slot is ignored.
        assert_eq!(b.last(1), None);
        b.heard(7, Instant::from_secs(1));
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn a_slot_is_written_at_most_once_per_resolution_and_never_goes_back() {
        let b = NetAlive::new(1);
        b.heard(0, Instant::from_millis(1000));
        b.heard(0, Instant::from_millis(1500));
        assert_eq!(b.last(0), Some(Instant::from_millis(1000)));
        b.heard(0, Instant::from_millis(2000));
        assert_eq!(b.last(0), Some(Instant::from_millis(2000)));
        // A runtime whose clock reading is a little older cannot move the slot back.
        b.heard(0, Instant::from_millis(500));
        assert_eq!(b.last(0), Some(Instant::from_millis(2000)));
        let c = b.clone();
        assert!(c.same_board(&b));
        assert!(!NetAlive::new(1).same_board(&b));
    }

    #[test]
    fn a_carried_board_keeps_the_times_of_the_nids_that_stay() {
        let nid = |s: &str| s.parse::<Nid>().unwrap();
        let (a, b, c) = (
            nid("10.0.0.1@o2ib"),
            nid("10.0.1.1@o2ib1"),
            nid("10.0.2.1@o2ib2"),
        );
        let old = NetAlive::new(2);
        old.heard(0, Instant::from_secs(3));
        old.heard(1, Instant::from_secs(4));
        // b removed, c added, a moved: a keeps its time, c starts unheard.
        let new = old.carried(&[a, b], &[c, a]);
        assert_eq!(new.len(), 2);
        assert_eq!(new.last(0), None);
        assert_eq!(new.last(1), Some(Instant::from_secs(3)));
        assert!(!new.same_board(&old));
    }
}
