//! The relay: how a node's NI runtimes hand each other [`Handover`]s (forwards, their ends, and
//! messages for a sibling's NID), the one implementation the daemon, `--ni-threads shared`, the
//! simulator's routed storm (`sim_storm`) and the in-process tests all run.
//!
//! The daemon runs one [`LnetNode`] per NI ([`crate::runtime`]). A message that comes in on one
//! NI and leaves on another crosses from the ingress runtime to the egress runtime as a
//! [`Handover::Forward`], and its outcome comes back as a [`Handover::Done`], so that the
//! ingress, which holds the sender's router credit and the router buffer, returns them and
//! counts the outcome. Kernel LNet does the same within one node across CPTs: a routed message
//! waits for its router credit and buffer (lib-move.c, lnet_post_routed_recv_locked, the
//! peer's `lp_rtrq` and the pool's `rbp_msgs`), then is sent on the egress NI, whose credits
//! and queues belong to that NI's CPT, and the receive side's credits are returned when the
//! send completes (lnet_return_rx_credits_locked). There the hand-off is a lock; here it crosses
//! threads, so the relay is where that lock's guarantees are kept:
//!
//! - **It never blocks.** What a full link would not take waits in the [`Relay`]'s outbox for
//!   the next relay (a forward and its end each stand for a router buffer held at the
//!   ingress, so the pools bound them); a loop never waits for another.
//! - **Order is kept per link.** Once a link refused a handover in a relay, the later ones for
//!   that link wait behind it in the outbox, even if the link frees room meanwhile (the
//!   sibling runs on another thread).
//! - **Nothing is lost: every Forward ends at its origin.** A Forward whose egress is gone (no
//!   runtime on its net, or a link whose runtime ended) comes back to the origin as a
//!   [`Handover::Done`] with [`LnetError::Shutdown`], so its router buffer and credit return.
//!   A Done for a runtime being removed (`net del`: no longer a sibling, but still owed the ends
//!   of what it forwarded) goes to that runtime.
//! - **Each sibling that got something is woken once per relay**, not once per handover.
//!
//! Which sibling takes a handover is one pure function, [`target_of`]. The links are the
//! user's ([`Links`]): crossbeam channels and wakers in the daemon (`ChannelLink`, feature
//! `daemon`), direct delivery into the sibling node in the simulator and the unit-test fabric.

use std::collections::VecDeque;

use lnd::time::Instant;
use lnd::wire::{Net, Nid};

use crate::alive::NetAlive;
use crate::{Handover, HandoverTarget, LnetError, LnetNode};

/// Which sibling of `nids` (the node's NI runtimes now, in the order of `board`, the node's
/// liveness board) takes `h`: the one with its NID (a [`Handover::Done`] or
/// [`Handover::Local`]), or for a [`Handover::Forward`] the egress on its net
/// ([`egress_on_net`]). `None`: no sibling has it.
pub fn target_of(h: &Handover, nids: &[Nid], board: &NetAlive) -> Option<usize> {
    match h.target() {
        HandoverTarget::Nid(nid) => nids.iter().position(|&n| n == nid),
        HandoverTarget::Net(net) => egress_on_net(nids.iter().copied(), board, net),
    }
}

/// Which of the NIs (`nids`, in board order) takes a message forwarded to `net`: the first on
/// that net whose fabric works, so that with two NIs on one net a lost one no longer takes (and
/// refuses) every forward; the first on the net if none works (it refuses them, counted).
pub fn egress_on_net(nids: impl Iterator<Item = Nid>, board: &NetAlive, net: Net) -> Option<usize> {
    let mut first = None;
    for (i, nid) in nids.enumerate() {
        if nid.net() != net {
            continue;
        }
        if !board.failed(i) {
            return Some(i);
        }
        first.get_or_insert(i);
    }
    first
}

/// Where the relay hands a handover.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Dest {
    /// The sibling at this index of [`Links::nids`].
    Sibling(usize),
    /// The runtime at this index of [`Links::leaving`] (only [`Handover::Done`]s go there).
    Leaving(usize),
}

/// What a link did with a handover.
#[derive(Debug)]
pub enum Handed {
    /// The sibling has it (or will: it is in its queue).
    Taken,
    /// The link is full: the handover waits in the outbox.
    Full(Handover),
    /// The sibling is gone: a Forward fails back at its origin, anything else is dropped.
    Gone(Handover),
}

/// The siblings one runtime hands to, as its user reaches them.
pub trait Links {
    /// The node's NI runtimes now (this one included), in the order of [`Links::board`].
    fn nids(&self) -> &[Nid];
    /// Runtimes being removed: not siblings any more, but owed the Dones of what they
    /// forwarded.
    fn leaving(&self) -> &[Nid] {
        &[]
    }
    /// The node's liveness board (one slot per NID of [`Links::nids`]): a failed fabric is
    /// not chosen as an egress while another NI on its net works.
    fn board(&self) -> &NetAlive;
    /// Hands `h` to `to` without blocking.
    fn try_hand(&mut self, to: Dest, h: Handover) -> Handed;
    /// `to` got something in this relay (called once per relay and destination).
    fn wake(&mut self, to: Dest);
}

/// One runtime's side of the relay: what waits for a full link, in order.
#[derive(Debug, Default)]
pub struct Relay {
    outbox: VecDeque<Handover>,
    /// Per destination, in this relay: it got something (wake it), it refused something (the
    /// later ones wait behind). Reused: a relay runs every turn of every loop.
    woken: Vec<bool>,
    blocked: Vec<bool>,
}

impl Relay {
    /// An empty relay.
    pub fn new() -> Relay {
        Relay::default()
    }

    /// Handovers waiting for a full link.
    pub fn waiting(&self) -> usize {
        self.outbox.len()
    }

    /// Takes what `node` produced for its siblings, after what waits already.
    pub fn take(&mut self, node: &mut LnetNode) {
        while let Some(h) = node.poll_handover() {
            self.outbox.push_back(h);
        }
    }

    /// Hands out everything that waits, in order, without blocking; wakes each destination
    /// that got something once. Returns what goes back to the origin: a
    /// [`Handover::Done`] with [`LnetError::Shutdown`] for each Forward no sibling took.
    #[must_use = "every Forward must end at its origin"]
    pub fn hand_out<L: Links + ?Sized>(&mut self, links: &mut L) -> Vec<Handover> {
        let mut back = Vec::new();
        if self.outbox.is_empty() {
            return back;
        }
        let (n, m) = (links.nids().len(), links.leaving().len());
        self.woken.clear();
        self.woken.resize(n + m, false);
        self.blocked.clear();
        self.blocked.resize(n + m, false);
        let slot = |d: Dest| match d {
            Dest::Sibling(i) => i,
            Dest::Leaving(j) => n + j,
        };
        // Each handover is tried once; what finds its link full (or behind one that was)
        // goes back in the outbox, in order.
        for _ in 0..self.outbox.len() {
            let Some(h) = self.outbox.pop_front() else {
                break;
            };
            let to = match target_of(&h, links.nids(), links.board()) {
                Some(i) => Dest::Sibling(i),
                None => match (&h, h.target()) {
                    // The end of a forward of an NI being removed: it still waits for it.
                    (Handover::Done { .. }, HandoverTarget::Nid(nid)) => {
                        match links.leaving().iter().position(|&l| l == nid) {
                            Some(j) => Dest::Leaving(j),
                            None => {
                                gone(h, &mut back);
                                continue;
                            }
                        }
                    }
                    _ => {
                        gone(h, &mut back);
                        continue;
                    }
                },
            };
            let s = slot(to);
            if self.blocked[s] {
                self.outbox.push_back(h);
                continue;
            }
            match links.try_hand(to, h) {
                Handed::Taken => self.woken[s] = true,
                Handed::Full(h) => {
                    self.blocked[s] = true;
                    self.outbox.push_back(h);
                }
                Handed::Gone(h) => gone(h, &mut back),
            }
        }
        for (s, w) in self.woken.iter_mut().enumerate() {
            if std::mem::take(w) {
                links.wake(if s < n {
                    Dest::Sibling(s)
                } else {
                    Dest::Leaving(s - n)
                });
            }
        }
        back
    }

    /// One relay for `node`: takes what it produced, hands out everything that waits, and
    /// hands back to it the end of each Forward no sibling took (`now` read only then).
    pub fn relay<L: Links + ?Sized>(
        &mut self,
        node: &mut LnetNode,
        links: &mut L,
        now: impl FnOnce() -> Instant,
    ) {
        self.take(node);
        let back = self.hand_out(links);
        if !back.is_empty() {
            let now = now();
            for h in back {
                node.handle_handover(now, h);
            }
        }
    }
}

/// A handover no sibling takes: a Forward fails back at its origin (its router buffer and
/// credit return there); a Done or Local for a runtime that is gone has nobody left to tell.
fn gone(h: Handover, back: &mut Vec<Handover>) {
    if let Handover::Forward { fwd, .. } = h {
        back.push(Handover::Done {
            origin: fwd.origin,
            key: fwd.key,
            result: Err(LnetError::Shutdown),
        });
    }
}

/// The daemon's link to one NI loop: a bounded crossbeam channel, and the loop's waker (none
/// when every loop shares one thread: each is stepped every round).
#[cfg(feature = "daemon")]
#[derive(Clone, Debug)]
pub struct ChannelLink {
    pub tx: crossbeam_channel::Sender<Handover>,
    pub wake: Option<lnd::driver::WakeHandle>,
}

#[cfg(feature = "daemon")]
impl ChannelLink {
    /// Queues `h` without blocking.
    pub fn try_hand(&self, h: Handover) -> Handed {
        match self.tx.try_send(h) {
            Ok(()) => Handed::Taken,
            Err(crossbeam_channel::TrySendError::Full(h)) => Handed::Full(h),
            Err(crossbeam_channel::TrySendError::Disconnected(h)) => Handed::Gone(h),
        }
    }

    /// Wakes the loop, if it sleeps on its own.
    pub fn wake(&self) {
        if let Some(w) = &self.wake {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HandedForward;
    use lnd::wire::LnetHdr;

    use testkit::nid;

    fn net(s: &str) -> Net {
        s.parse().unwrap()
    }

    const A: &str = "10.0.0.1@o2ib";
    const B: &str = "10.1.0.1@o2ib1";
    const B2: &str = "10.1.0.2@o2ib1";
    const C: &str = "10.2.0.1@o2ib2";

    fn forward(via: &str, origin: &str, key: u64) -> Handover {
        let fwd = HandedForward {
            origin: nid(origin),
            from: nid("10.0.0.9@o2ib"),
            key: fkey(key),
            hdr: LnetHdr::put(nid("10.0.0.9@o2ib"), nid(C), 1, 4, key),
            payload: vec![key as u8],
            bulk: None,
        };
        Handover::Forward { via: net(via), fwd }
    }

    fn done(origin: &str, key: u64) -> Handover {
        Handover::Done {
            origin: nid(origin),
            key: fkey(key),
            result: Ok(()),
        }
    }

    /// A held message's key made from a number, for tests only.
    fn fkey(k: u64) -> crate::forward::FwdKey {
        crate::forward::FwdKey(lnd::handle::Handle::from_u64(k))
    }

    fn key(h: &Handover) -> u64 {
        match h {
            Handover::Forward { fwd, .. } => fwd.key.0.as_u64(),
            Handover::Done { key, .. } => key.0.as_u64(),
            Handover::Local { .. } => u64::MAX,
        }
    }

    /// Siblings as queues: each with a capacity, gone or not, and what it got and its wakes.
    struct Queues {
        nids: Vec<Nid>,
        leaving: Vec<Nid>,
        board: NetAlive,
        cap: Vec<usize>,
        gone: Vec<bool>,
        got: Vec<Vec<Handover>>,
        wakes: Vec<u32>,
        /// A sibling that takes its queue in (room again) right after refusing one: another
        /// thread draining it in the middle of a relay.
        drains_after_full: Option<usize>,
    }

    impl Queues {
        fn new(nids: &[&str], leaving: &[&str]) -> Queues {
            let n = nids.len() + leaving.len();
            Queues {
                nids: nids.iter().map(|s| nid(s)).collect(),
                leaving: leaving.iter().map(|s| nid(s)).collect(),
                board: NetAlive::new(nids.len()),
                cap: vec![usize::MAX; n],
                gone: vec![false; n],
                got: (0..n).map(|_| Vec::new()).collect(),
                wakes: vec![0; n],
                drains_after_full: None,
            }
        }

        fn slot(&self, d: Dest) -> usize {
            match d {
                Dest::Sibling(i) => i,
                Dest::Leaving(j) => self.nids.len() + j,
            }
        }

        fn keys(&self, s: usize) -> Vec<u64> {
            self.got[s].iter().map(key).collect()
        }
    }

    impl Links for Queues {
        fn nids(&self) -> &[Nid] {
            &self.nids
        }
        fn leaving(&self) -> &[Nid] {
            &self.leaving
        }
        fn board(&self) -> &NetAlive {
            &self.board
        }
        fn try_hand(&mut self, to: Dest, h: Handover) -> Handed {
            let s = self.slot(to);
            if self.gone[s] {
                return Handed::Gone(h);
            }
            if self.cap[s] == 0 {
                if self.drains_after_full == Some(s) {
                    self.cap[s] = usize::MAX;
                }
                return Handed::Full(h);
            }
            self.cap[s] -= 1;
            self.got[s].push(h);
            Handed::Taken
        }
        fn wake(&mut self, to: Dest) {
            let s = self.slot(to);
            self.wakes[s] += 1;
        }
    }

    fn relay_all(r: &mut Relay, q: &mut Queues, hs: Vec<Handover>) -> Vec<Handover> {
        r.outbox.extend(hs);
        r.hand_out(q)
    }

    #[test]
    fn a_handover_by_nid_goes_to_the_runtime_with_that_nid() {
        let nids = [nid(A), nid(B), nid(C)];
        let board = NetAlive::new(3);
        assert_eq!(target_of(&done(B, 1), &nids, &board), Some(1));
        assert_eq!(target_of(&done(C, 1), &nids, &board), Some(2));
        assert_eq!(target_of(&done(B2, 1), &nids, &board), None);
        let local = Handover::Local {
            hdr: LnetHdr::put(nid(B), nid(A), 0, 4, 0),
            payload: Vec::new(),
        };
        assert_eq!(target_of(&local, &nids, &board), Some(0));
    }

    #[test]
    fn a_forward_goes_to_the_first_working_ni_on_its_net() {
        let nids = [nid(A), nid(B), nid(B2)];
        let board = NetAlive::new(3);
        assert_eq!(target_of(&forward("o2ib1", A, 1), &nids, &board), Some(1));
        // The first one's fabric failed: the next on the net takes it.
        board.fail(1);
        assert_eq!(target_of(&forward("o2ib1", A, 1), &nids, &board), Some(2));
        // None works: the first on the net (it refuses them, counted).
        board.fail(2);
        assert_eq!(target_of(&forward("o2ib1", A, 1), &nids, &board), Some(1));
        // No NI on the net.
        assert_eq!(target_of(&forward("o2ib2", A, 1), &nids, &board), None);
    }

    /// Review of the lost-fabric change: with two NIs
    /// on one net, forwards to that net go to the one whose fabric works, not always to the
    /// first.
    #[test]
    fn forwards_to_a_net_skip_an_ni_whose_fabric_failed() {
        let nids: Vec<Nid> = ["10.0.0.1@o2ib", "10.0.1.1@o2ib1", "10.0.1.2@o2ib1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let board = NetAlive::new(nids.len());
        let o2ib1 = nids[1].net();
        assert_eq!(egress_on_net(nids.iter().copied(), &board, o2ib1), Some(1));
        board.fail(1);
        assert_eq!(egress_on_net(nids.iter().copied(), &board, o2ib1), Some(2));
        board.fail(2);
        // None works: the first takes them and refuses them.
        assert_eq!(egress_on_net(nids.iter().copied(), &board, o2ib1), Some(1));
        let o2ib2 = "10.0.2.1@o2ib2".parse::<Nid>().unwrap().net();
        assert_eq!(egress_on_net(nids.iter().copied(), &board, o2ib2), None);
    }

    /// `back` is one Done: forward `key` of `origin`, failed as a shutdown.
    fn assert_failed_back(back: &[Handover], origin: &str, key: u64) {
        assert_eq!(back.len(), 1);
        assert!(matches!(
            &back[0],
            Handover::Done { origin: o, key: k, result: Err(LnetError::Shutdown) } if *o == nid(origin) && *k == fkey(key)
        ));
    }

    #[test]
    fn a_forward_with_no_egress_fails_back_at_its_origin() {
        let mut q = Queues::new(&[A, B], &[]);
        let mut r = Relay::new();
        let back = relay_all(&mut r, &mut q, vec![forward("o2ib2", A, 7), done(C, 8)]);
        // The Forward ends at its origin as a shutdown; the Done for nobody is dropped.
        assert_failed_back(&back, A, 7);
        assert_eq!(r.waiting(), 0);
        assert!(q.got.iter().all(Vec::is_empty));
        assert_eq!(q.wakes, vec![0, 0]);
    }

    #[test]
    fn a_gone_link_fails_the_forward_at_its_origin() {
        let mut q = Queues::new(&[A, B], &[]);
        q.gone[1] = true;
        let mut r = Relay::new();
        let back = relay_all(&mut r, &mut q, vec![forward("o2ib1", A, 3), done(B, 4)]);
        assert_failed_back(&back, A, 3);
        assert_eq!(r.waiting(), 0);
        assert_eq!(q.wakes, vec![0, 0]);
    }

    #[test]
    fn a_leaving_ni_gets_the_dones_it_is_owed_and_nothing_else() {
        let mut q = Queues::new(&[A], &[B]);
        let mut r = Relay::new();
        let local = Handover::Local {
            hdr: LnetHdr::put(nid(A), nid(B), 0, 4, 0),
            payload: Vec::new(),
        };
        let back = relay_all(
            &mut r,
            &mut q,
            vec![done(B, 1), forward("o2ib1", A, 2), local, done(B, 3)],
        );
        // Both Dones reach the leaving runtime, woken once; its net takes no forward (that
        // one fails back), and a Local for it is dropped.
        assert_eq!(q.keys(1), vec![1, 3]);
        assert_eq!(q.wakes, vec![0, 1]);
        assert_eq!(back.len(), 1);
        assert!(matches!(&back[0], Handover::Done { key, .. } if *key == fkey(2)));
        // A full leaving link keeps its Done for the next relay.
        q.cap[1] = 0;
        let back = relay_all(&mut r, &mut q, vec![done(B, 4)]);
        assert!(back.is_empty());
        assert_eq!(r.waiting(), 1);
        q.cap[1] = 1;
        assert!(r.hand_out(&mut q).is_empty());
        assert_eq!(q.keys(1), vec![1, 3, 4]);
    }

    #[test]
    fn a_full_link_keeps_the_rest_in_order_and_the_others_go_on() {
        let mut q = Queues::new(&[A, B, C], &[]);
        q.cap[1] = 1;
        let mut r = Relay::new();
        let hs = vec![
            forward("o2ib1", A, 1),
            forward("o2ib1", A, 2),
            forward("o2ib2", A, 3),
            forward("o2ib1", A, 4),
            forward("o2ib2", A, 5),
        ];
        assert!(relay_all(&mut r, &mut q, hs).is_empty());
        assert_eq!(q.keys(1), vec![1]);
        assert_eq!(q.keys(2), vec![3, 5]);
        assert_eq!(r.waiting(), 2);
        // One wake per sibling that got something, however many it got.
        assert_eq!(q.wakes, vec![0, 1, 1]);
        // Room again: what waited goes first, in order, then what came since.
        q.cap[1] = usize::MAX;
        assert!(relay_all(&mut r, &mut q, vec![forward("o2ib1", A, 6)]).is_empty());
        assert_eq!(q.keys(1), vec![1, 2, 4, 6]);
        assert_eq!(r.waiting(), 0);
        assert_eq!(q.wakes, vec![0, 2, 1]);
        // Nothing to hand out: nobody is woken.
        assert!(r.hand_out(&mut q).is_empty());
        assert_eq!(q.wakes, vec![0, 2, 1]);
    }

    /// A sibling on another thread may take its queue in between two of our tries: what it
    /// refused must still go before what came after it (the daemon's relay before this module
    /// tried every handover, so a later one could pass a refused one).
    #[test]
    fn a_link_that_frees_room_mid_relay_is_not_overtaken() {
        let mut q = Queues::new(&[A, B], &[]);
        q.cap[1] = 0;
        q.drains_after_full = Some(1);
        let mut r = Relay::new();
        let hs = vec![forward("o2ib1", A, 1), forward("o2ib1", A, 2)];
        assert!(relay_all(&mut r, &mut q, hs).is_empty());
        assert_eq!(q.keys(1), Vec::<u64>::new());
        assert_eq!(r.waiting(), 2);
        assert!(r.hand_out(&mut q).is_empty());
        assert_eq!(q.keys(1), vec![1, 2]);
    }

    #[test]
    fn a_relay_hands_the_origin_node_the_end_of_a_forward_nobody_took() {
        // A real node: the Done for a key it never forwarded is ignored, but the clock is
        // read only when something goes back.
        let mut node = LnetNode::new(
            crate::NodeConfig::new(vec![crate::NiConfig::new(nid(A), 1)]),
            Instant::from_secs(1),
        );
        let mut q = Queues::new(&[A, B], &[]);
        let mut r = Relay::new();
        let mut read = 0;
        r.relay(&mut node, &mut q, || {
            read += 1;
            Instant::from_secs(1)
        });
        assert_eq!(read, 0);
        r.outbox.push_back(forward("o2ib2", A, 1));
        r.relay(&mut node, &mut q, || {
            read += 1;
            Instant::from_secs(1)
        });
        assert_eq!(read, 1);
        assert_eq!(r.waiting(), 0);
    }
}
