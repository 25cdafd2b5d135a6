//! One NI as the unit of execution: that NI's LNet node (an [`LnetNode`] running only this NI,
//! knowing its siblings' NIDs as its own), its driver, its clock and its waker. [`NiRuntime::turn`]
//! is the one loop body: the daemon runs one runtime per thread, `lnet_perf` drives one, and
//! tests drive them the same way.
//!
//! The node stays sans-IO; the runtime is where its inputs come from: the driver's events (pushed
//! into its LND through the driver's [`LndDriver::poll_into`]), the clock, and other threads' requests, which wake
//! the runtime through its [`WakeHandle`] instead of waiting out the poll bound.

use std::io;
use std::time::Duration as StdDuration;

use lnd::driver::{LndDriver, MonotonicClock, WakeHandle, Waker};
use lnd::time::Instant;

use crate::relay::{Links, Relay};
use crate::{LnetNode, NiIndex};

/// One NI's node, driver, clock and waker.
pub struct NiRuntime<D: LndDriver> {
    node: LnetNode,
    driver: D,
    clock: MonotonicClock,
    waker: Waker,
    /// The driver failed: the node runs on without it ([`NiRuntime::lose_fabric`]).
    lost: bool,
}

impl<D: LndDriver> NiRuntime<D> {
    /// A runtime for `node` (which should run one NI) over `driver`; the handle wakes its
    /// `turn` from other threads.
    pub fn new(
        mut node: LnetNode,
        mut driver: D,
        clock: MonotonicClock,
    ) -> io::Result<(NiRuntime<D>, WakeHandle)> {
        node.set_fabric_sees_writes(driver.sees_writes());
        let (waker, wake) = Waker::new()?;
        driver.set_waker(waker.fd());
        driver.set_doorbell(waker.doorbell());
        Ok((
            NiRuntime {
                node,
                driver,
                clock,
                waker,
                lost: false,
            },
            wake,
        ))
    }

    /// The node.
    pub fn node(&self) -> &LnetNode {
        &self.node
    }

    /// The node, for the upper layer's calls (`ping`, `send_put`, `shutdown`, the control
    /// requests); its actions reach the driver at the next [`NiRuntime::turn`] or
    /// [`NiRuntime::apply_actions`].
    pub fn node_mut(&mut self) -> &mut LnetNode {
        &mut self.node
    }

    /// The node and the driver at once, for an upper layer that drives the node with memory
    /// registered with the driver's fabric (the selftest).
    pub fn parts(&mut self) -> (&mut LnetNode, &mut D) {
        (&mut self.node, &mut self.driver)
    }

    /// The driver (its counters).
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// The driver, for what the upper layer does with it directly: registering memory for bulk
    /// data (`lnd::fabric::Registry`).
    pub fn driver_mut(&mut self) -> &mut D {
        &mut self.driver
    }

    /// The clock's time now.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Hands every action the node has queued to the driver (to nowhere once the fabric is
    /// lost).
    pub fn apply_actions(&mut self) {
        let now = self.clock.now();
        self.apply_actions_at(now);
    }

    fn apply_actions_at(&mut self, now: Instant) {
        match self.node.lnd_mut(NiIndex(0)) {
            Some(lnd) if !self.lost => self.driver.apply_from(now, lnd),
            // The fabric is gone: what the LND still asks of it goes nowhere.
            _ => while self.node.poll_action().is_some() {},
        }
    }

    /// The driver failed for good: the node is told ([`LnetNode::fabric_lost`]: its NI is
    /// reported down, what its LND held fails) and from now on [`NiRuntime::turn`] runs the
    /// node without the driver: its timers, its handovers and the control requests of the
    /// caller, its fabric actions dropped.
    pub fn lose_fabric(&mut self) {
        self.lost = true;
        self.driver.abandon();
        let now = self.clock.now();
        self.node.fabric_lost(now);
        self.apply_actions();
    }

    /// Whether the fabric was lost ([`NiRuntime::lose_fabric`]).
    pub fn fabric_is_lost(&self) -> bool {
        self.lost
    }

    /// One turn of the loop: apply the node's actions, wait on the driver until the node's next
    /// deadline (at most `max_wait`, less if woken), hand what happened to the node, run the
    /// timers that are due, and apply what all that produced. The node's events are left for
    /// the caller to drain with `node_mut().poll_event()`.
    pub fn turn(&mut self, max_wait: StdDuration) -> io::Result<()> {
        let before = self.clock.now();
        self.apply_actions_at(before);
        let wait = self.until_deadline_at(before, max_wait);
        let clock = self.clock;
        // The clock is read twice a turn, before the wait and after it, not at every step (on
        // a busy router those reads were 5-7% of its CPU): the driver reads it once its wait
        // is over, for the completions it hands the node, and the rest of the turn goes on at
        // that time.
        let polled = std::cell::Cell::new(None);
        let now_fn = || {
            let t = clock.now();
            polled.set(Some(t));
            t
        };
        match self.node.lnd_mut(NiIndex(0)) {
            Some(lnd) if !self.lost => {
                self.driver.poll_into(Some(wait), lnd, &now_fn)?;
            }
            // No fabric to wait on: a short sleep, so that other threads' requests are seen
            // soon enough without the waker.
            _ => std::thread::sleep(wait.min(StdDuration::from_millis(20))),
        }
        // A wake-up by byte (the watch fired) or by flag only (seen while the driver spun):
        // taken before the caller looks at what other threads handed over.
        if self.driver.take_woken() {
            self.waker.drain();
        } else {
            self.waker.take_pending();
        }
        let now = polled.get().unwrap_or_else(|| clock.now());
        self.node.process(now);
        if self.node.poll_timeout().is_some_and(|d| d <= now) {
            self.node.handle_timeout(now);
        }
        self.apply_actions_at(now);
        // Large buffers done with are scrubbed only now, once the fabric has what came before
        // their release (the close of a connection whose grant was reclaimed): see
        // `LnetNode::scrub_bulk`. What they let through goes out in this turn too.
        if self.node.has_bulk_to_scrub() {
            self.node.scrub_bulk(now, crate::SCRUB_BUDGET);
            self.apply_actions_at(now);
        }
        Ok(())
    }

    /// How long from `now` until the node's next deadline, at most `max_wait`.
    fn until_deadline_at(&self, now: Instant, max_wait: StdDuration) -> StdDuration {
        self.node
            .poll_timeout()
            .map_or(max_wait, |d| d.saturating_duration_since(now).into())
            .min(max_wait)
    }

    /// How long this runtime could sleep in its next turn: zero while the driver holds queued
    /// work, else until the node's next deadline, at most `max_wait`. The node's pending
    /// actions are handed to the driver first (as the next turn would), so that work the upper
    /// layer just queued counts. A thread running several runtimes sleeps in one of them for
    /// the least of the others' (see [`NiRuntime::watch`]).
    pub fn wait_hint(&mut self, max_wait: StdDuration) -> StdDuration {
        let now = self.clock.now();
        self.apply_actions_at(now);
        if !self.lost && self.driver.has_queued_work() {
            return StdDuration::ZERO;
        }
        self.until_deadline_at(now, max_wait)
    }

    /// Makes this runtime's waits end also when `other` has work (its driver's readiness
    /// descriptor becomes readable), so that several runtimes share one thread: one sleeps,
    /// the others are polled without waiting. False when either driver cannot do that.
    pub fn watch(&mut self, other: &NiRuntime<D>) -> bool {
        match other.driver.readiness_fd() {
            Some(fd) => self.driver.watch(fd),
            None => false,
        }
    }

    /// [`NiRuntime::watch`]es each of `others`, the runtimes that share this one's thread
    /// ([`shared_round`]); the index of the first that cannot be watched.
    pub fn watch_all<'a>(
        &mut self,
        others: impl IntoIterator<Item = &'a NiRuntime<D>>,
    ) -> Result<(), usize>
    where
        D: 'a,
    {
        for (i, other) in others.into_iter().enumerate() {
            if !self.watch(other) {
                return Err(i);
            }
        }
        Ok(())
    }

    /// One relay of this runtime's handovers to its siblings' `links` ([`Relay::relay`]):
    /// what its node produced goes out, and the end of a forward nobody takes comes back to
    /// it (the clock read only then).
    pub fn relay<L: Links + ?Sized>(&mut self, relay: &mut Relay, links: &mut L) {
        let clock = self.clock;
        relay.relay(&mut self.node, links, || clock.now());
    }

    /// The last actions (a shutdown's Destroys) and one poll that does not wait, so they reach
    /// the wire before the runtime is dropped.
    pub fn flush(&mut self) {
        self.apply_actions();
        let clock = self.clock;
        if self.lost {
            return self.node.process(clock.now());
        }
        if let Some(lnd) = self.node.lnd_mut(NiIndex(0)) {
            let _ = self
                .driver
                .poll_into(Some(StdDuration::ZERO), lnd, &|| clock.now());
        }
        self.node.process(self.clock.now());
    }
}

/// A loop that shares the calling thread with others ([`shared_round`]): a runtime, or the
/// daemon's NI loop around one.
pub trait SharedLoop {
    type Error;
    /// One turn, waiting at most `wait`.
    fn turn(&mut self, wait: StdDuration) -> Result<(), Self::Error>;
    /// How long it could sleep now ([`NiRuntime::wait_hint`]).
    fn wait_hint(&mut self, max_wait: StdDuration) -> StdDuration;
    /// Work waits for it that no driver's readiness shows (handovers from a loop of the same
    /// thread): the round must not sleep.
    fn has_pending(&self) -> bool {
        false
    }
    /// It has finished: it is turned no more.
    fn finished(&self) -> bool {
        false
    }
}

impl<D: LndDriver> SharedLoop for NiRuntime<D> {
    type Error = io::Error;

    fn turn(&mut self, wait: StdDuration) -> io::Result<()> {
        NiRuntime::turn(self, wait)
    }

    fn wait_hint(&mut self, max_wait: StdDuration) -> StdDuration {
        NiRuntime::wait_hint(self, max_wait)
    }
}

/// One round of several loops on the calling thread, the first of which watches the others'
/// drivers ([`NiRuntime::watch_all`]): every other loop turns without waiting, then the first
/// turns, sleeping for the least any of them may (at most `max_wait`; zero while a loop has
/// work no driver shows). The hints are asked once all have turned, so that what a loop handed
/// one turned before it in the round counts (with three NIs or more, such a handover waited
/// out the sleep: up to `max_wait` per forward). Finished loops are skipped; once the first
/// has finished, the others are polled at a short interval. [`Swarm`] and the daemon's
/// `--ni-threads shared` both run their rounds here.
pub fn shared_round<L: SharedLoop>(loops: &mut [L], max_wait: StdDuration) -> Result<(), L::Error> {
    let Some((first, rest)) = loops.split_first_mut() else {
        std::thread::sleep(max_wait);
        return Ok(());
    };
    for l in rest.iter_mut() {
        if !l.finished() {
            l.turn(StdDuration::ZERO)?;
        }
    }
    let mut wait = max_wait;
    for l in rest.iter_mut() {
        if !l.finished() {
            wait = wait.min(l.wait_hint(max_wait));
        }
    }
    let pending = std::iter::once(&*first)
        .chain(rest.iter())
        .any(|l| !l.finished() && l.has_pending());
    if pending {
        wait = StdDuration::ZERO;
    }
    if first.finished() {
        std::thread::sleep(wait.min(StdDuration::from_millis(1)));
        return Ok(());
    }
    first.turn(wait)
}

/// Several runtimes on the calling thread: a swarm of client NIs for tests and storms, each its
/// own node (its own NID, peers and connections), run by [`shared_round`]: the first runtime
/// sleeps, for the least time any may, and its driver watches the others' readiness descriptors
/// so that work for any of them ends the sleep; the others are polled without waiting.
/// Busy-polling should be off in their drivers: the thread spins through every runtime each
/// turn already.
pub struct Swarm<D: LndDriver> {
    runtimes: Vec<NiRuntime<D>>,
}

impl<D: LndDriver> Swarm<D> {
    /// The runtimes, first the one that sleeps. Fails if a driver cannot be watched or the
    /// first cannot watch (tcp can).
    pub fn new(mut runtimes: Vec<NiRuntime<D>>) -> io::Result<Swarm<D>> {
        if let Some((first, rest)) = runtimes.split_first_mut() {
            if first.watch_all(rest.iter()).is_err() {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a driver that cannot share a thread",
                ));
            }
        }
        Ok(Swarm { runtimes })
    }

    /// One turn of every runtime, sleeping at most `max_wait` (less if any has work sooner).
    /// Every node's events are left for the caller to drain.
    pub fn turn(&mut self, max_wait: StdDuration) -> io::Result<()> {
        shared_round(&mut self.runtimes, max_wait)
    }

    /// The runtimes, in the order given.
    pub fn runtimes(&self) -> &[NiRuntime<D>] {
        &self.runtimes
    }

    /// The runtimes, in the order given.
    pub fn runtimes_mut(&mut self) -> &mut [NiRuntime<D>] {
        &mut self.runtimes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// What the loops of one thread share: per loop, work handed to it (a handover) and the
    /// waits it was turned with.
    #[derive(Default)]
    struct Thread {
        pending: Vec<bool>,
        turns: Vec<Vec<StdDuration>>,
    }

    /// A loop whose hint is fixed, that may hand loop `hands_to` something when it turns, and
    /// takes in what it was handed at its turn.
    struct Fake {
        me: usize,
        hint: StdDuration,
        hands_to: Option<usize>,
        finished: bool,
        t: Rc<RefCell<Thread>>,
    }

    impl SharedLoop for Fake {
        type Error = std::convert::Infallible;

        fn turn(&mut self, wait: StdDuration) -> Result<(), Self::Error> {
            let mut t = self.t.borrow_mut();
            t.turns[self.me].push(wait);
            t.pending[self.me] = false;
            if let Some(to) = self.hands_to {
                t.pending[to] = true;
            }
            Ok(())
        }

        fn wait_hint(&mut self, max_wait: StdDuration) -> StdDuration {
            self.hint.min(max_wait)
        }

        fn has_pending(&self) -> bool {
            self.t.borrow().pending[self.me]
        }

        fn finished(&self) -> bool {
            self.finished
        }
    }

    const MAX: StdDuration = StdDuration::from_millis(100);

    fn thread(hints: &[u64]) -> (Vec<Fake>, Rc<RefCell<Thread>>) {
        let t = Rc::new(RefCell::new(Thread {
            pending: vec![false; hints.len()],
            turns: vec![Vec::new(); hints.len()],
        }));
        let loops = hints
            .iter()
            .enumerate()
            .map(|(me, &ms)| Fake {
                me,
                hint: StdDuration::from_millis(ms),
                hands_to: None,
                finished: false,
                t: Rc::clone(&t),
            })
            .collect();
        (loops, t)
    }

    fn run(loops: &mut [Fake]) {
        match shared_round(loops, MAX) {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }

    #[test]
    fn the_first_loop_sleeps_the_least_any_other_may_and_the_others_do_not_wait() {
        let (mut loops, t) = thread(&[500, 30, 20, 40]);
        run(&mut loops);
        let t = t.borrow();
        assert_eq!(t.turns[0], vec![StdDuration::from_millis(20)]);
        for turns in &t.turns[1..] {
            assert_eq!(turns, &vec![StdDuration::ZERO]);
        }
    }

    /// Three NIs: the last hands the second something after the second has turned; the
    /// round must not sleep, or the handover waits out the whole sleep (`--ni-threads shared`,
    /// found in review: up to its MAX_WAIT per forward).
    #[test]
    fn a_handover_for_a_loop_already_turned_keeps_the_round_from_sleeping() {
        let (mut loops, t) = thread(&[500, 30, 40]);
        loops[2].hands_to = Some(1);
        run(&mut loops);
        assert_eq!(t.borrow().turns[0], vec![StdDuration::ZERO]);
        // The next round takes it in; nothing new is pending, so it sleeps again (loop 2
        // hands nothing more).
        loops[2].hands_to = None;
        run(&mut loops);
        assert_eq!(t.borrow().turns[1].len(), 2);
        assert_eq!(
            t.borrow().turns[0],
            vec![StdDuration::ZERO, StdDuration::from_millis(30)]
        );
    }

    #[test]
    fn finished_loops_are_not_turned_and_a_finished_sleeper_leaves_the_others_polled() {
        let (mut loops, t) = thread(&[500, 5, 40]);
        loops[1].finished = true;
        run(&mut loops);
        {
            let t = t.borrow();
            assert!(t.turns[1].is_empty());
            // Loop 1's hint no longer counts.
            assert_eq!(t.turns[0], vec![StdDuration::from_millis(40)]);
        }
        loops[0].finished = true;
        loops[2].hint = StdDuration::ZERO;
        run(&mut loops);
        let t = t.borrow();
        assert_eq!(t.turns[0].len(), 1);
        assert_eq!(t.turns[2].len(), 2);
    }
}
