//! The node's timer table, one of the sub-states an [`LnetNode`](crate::LnetNode) is built
//! from (as quinn-proto's `Connection` keeps a `TimerTable`): every deadline of LNet's own on one
//! wheel (`lnd::wheel`, 1 ms ticks), so [`LnetNode::poll_timeout`](crate::LnetNode::poll_timeout)
//! asks one table and `handle_timeout` takes what is due in deadline order. Beside it, the LNDs
//! keep their own wheels (each endpoint is its own state machine) and the gateways sub-state its
//! ping schedule; `poll_timeout` takes the least of those.
//!
//! A timer names what it is for; it is checked against the live object when it fires, so one
//! for something already gone (a ping answered, a peer forgotten) does nothing. The ones a
//! node keeps at most one of (the recovery tick, the trim pass) are re-armed earlier, never
//! doubled.

use lnd::time::{Duration, Instant};
use lnd::trim::{CapacityReport, Trim, TRIM_FLOOR};
use lnd::wheel::{TimerKey, TimerWheel};
use lnd::wire::Nid;

/// What a node timer is for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum NodeTimer {
    /// Look at a peer NI for aging (forgotten after `peer_timeout` idle).
    PeerAge(Nid),
    /// A ping's deadline: it fails with a timeout if still waiting.
    Ping(u64),
    /// A routed GET's deadline: its REPLY did not come in time.
    RoutedGet(u64),
    /// LNet health's look at the peer NIs and NIs in recovery (lnet_monitor_thread's tick).
    Recovery,
    /// Give back the room a burst left in the tables (`lnd::trim`).
    Trim,
}

/// One wheel for all of them, and the keys of the single-instance ones.
pub(super) struct TimerTable {
    wheel: TimerWheel<NodeTimer>,
    recovery: Option<(Instant, TimerKey)>,
    trim: Option<(Instant, TimerKey)>,
}

impl TimerTable {
    pub(super) fn new(now: Instant) -> TimerTable {
        TimerTable {
            wheel: TimerWheel::new(now, Duration::from_millis(1)),
            recovery: None,
            trim: None,
        }
    }

    /// Arms `t` for `at`; the key cancels it.
    pub(super) fn arm(&mut self, at: Instant, t: NodeTimer) -> TimerKey {
        self.wheel.insert(at, t)
    }

    /// Cancels a timer (nothing if it fired already).
    pub(super) fn cancel(&mut self, key: TimerKey) {
        self.wheel.cancel(key);
    }

    /// The recovery tick at `at`, or earlier if one is armed for earlier.
    pub(super) fn arm_recovery(&mut self, at: Instant) {
        Self::arm_once(&mut self.wheel, &mut self.recovery, at, NodeTimer::Recovery);
    }

    /// The trim pass at `at` (kept if one is armed for earlier).
    pub(super) fn arm_trim(&mut self, at: Instant) {
        Self::arm_once(&mut self.wheel, &mut self.trim, at, NodeTimer::Trim);
    }

    /// When the trim pass is armed for.
    pub(super) fn trim_at(&self) -> Option<Instant> {
        self.trim.map(|(t, _)| t)
    }

    fn arm_once(
        wheel: &mut TimerWheel<NodeTimer>,
        slot: &mut Option<(Instant, TimerKey)>,
        at: Instant,
        t: NodeTimer,
    ) {
        if let Some((armed, key)) = *slot {
            if armed <= at {
                return;
            }
            wheel.cancel(key);
        }
        *slot = Some((at, wheel.insert(at, t)));
    }

    /// The next timer due at `now`, in deadline order; `None` when none is.
    pub(super) fn poll(&mut self, now: Instant) -> Option<NodeTimer> {
        let (_, t) = self.wheel.poll(now)?;
        match t {
            NodeTimer::Recovery => self.recovery = None,
            NodeTimer::Trim => self.trim = None,
            _ => {}
        }
        Some(t)
    }

    /// At or before the earliest deadline (see `TimerWheel::next_deadline`).
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.wheel.next_deadline()
    }

    /// Gives back the room a burst left; true while still large.
    pub(super) fn trim(&mut self) -> bool {
        self.wheel.trim(TRIM_FLOOR)
    }

    pub(super) fn capacities(&self, r: &mut CapacityReport) {
        r.add("timers", &self.wheel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    /// Timers come out in deadline order; a cancelled one never; the single-instance ones are
    /// re-armed earlier, never doubled, and free to be armed again once fired.
    #[test]
    fn timers_fire_in_order_once_and_single_ones_never_double() {
        let mut t = TimerTable::new(at(0));
        let nid: Nid = "10.0.0.1@o2ib".parse().unwrap();
        t.arm(at(30), NodeTimer::Ping(1));
        let gone = t.arm(at(10), NodeTimer::Ping(2));
        t.arm(at(20), NodeTimer::PeerAge(nid));
        t.cancel(gone);
        t.arm_recovery(at(50));
        t.arm_recovery(at(40));
        t.arm_recovery(at(60));
        t.arm_trim(at(45));
        assert_eq!(t.trim_at(), Some(at(45)));
        let mut fired = Vec::new();
        while let Some(x) = t.poll(at(100)) {
            fired.push(x);
        }
        assert_eq!(
            fired,
            vec![
                NodeTimer::PeerAge(nid),
                NodeTimer::Ping(1),
                NodeTimer::Recovery,
                NodeTimer::Trim,
            ]
        );
        assert_eq!(t.next_deadline(), None);
        assert_eq!(t.trim_at(), None);
        t.arm_recovery(at(200));
        assert_eq!(t.poll(at(200)), Some(NodeTimer::Recovery));
    }
}
