//! Forwarding, by stage: what a router does with a message for another node, from its arrival on
//! an ingress NI to the end of its egress (reference sections 3.4 and 6.3). Inline messages and
//! bulk PUTs go through the same stages; where they differ, the stage says so in one `match` on
//! [`FwdKind`]. The types the rest of the crate sees (the pools, the books, [`Handover`],
//! [`FwdKey`]) are in `crate::forward`; the lending rules of the large buffers in `bulk.rs`.
//!
//! A held message is a [`Fwd`] in the ingress runtime's slab, named by its [`FwdKey`]; where it
//! stands is its [`FwdStage`]. The stages, in order (Lustre's functions are in lib-move.c unless
//! said otherwise):
//!
//! 1. **Admission** (`forward_arrived`, its verdict from `admit`). Lustre's lnet_parse, finding
//!    the message not for the NI it came in on, refuses a destination on that net or one of our
//!    own NIDs (-EPROTO, and the LND closes the connection) and an optimized GET; then
//!    lnet_parse_forward_locked drops it while routing is off. We also refuse it while shutting
//!    down, and a payload shorter than its header says or beyond LNET_MTU; a bulk PUT, whose
//!    data we have not seen yet, also when there are no large buffers, when no live route
//!    reaches its destination (looked up now, before a buffer is lent, where Lustre waits until
//!    the data is in), when its egress NI has not registered the router buffers, and when its
//!    sender is refused for its strikes. A refusal is counted in the books and the receive slot
//!    answered as its [`RxAnswer`] says.
//! 2. **Router credit** (`take_rtr_credit`): as in lnet_post_routed_recv_locked, first a router
//!    credit of the peer it came from (lpni_rtrcredits), so that one upstream peer cannot take
//!    every buffer; none left: [`FwdStage::WaitingCredit`] on that peer's queue.
//! 3. **Buffer** (`take_router_buffer`): then a buffer of the pool its size needs
//!    (lnet_msg2bufpool: tiny, small or large); none left: [`FwdStage::WaitingBuffer`] on the
//!    pool's queue. A bulk PUT of a sender not yet proven passes the lending gate first
//!    (`admit_bulk`, [`FwdStage::WaitingUnproven`]). Until it has both, the message keeps its
//!    LND receive slot, so its sender's LND credit does not come back: that is the back
//!    pressure upstream (o2iblnd has no eager receive). With both: [`FwdStage::Ready`].
//! 4. **Commit** (`commit_forward`, from `process`): the slot goes back. An inline message has
//!    its payload and goes on to its egress; a bulk PUT is first written by its sender into a
//!    large router buffer (`Lnd::accept_bulk`: for o2ib PUT_ACK, RDMA, PUT_DONE; Lustre's
//!    lnet_ni_recv into the router buffer's pages), [`FwdStage::Receiving`], and goes on once it
//!    is in (`forward_received`).
//! 5. **Egress** (`egress`, the one choice for the local commit, the bulk PUT once in and a
//!    sibling's handover): the route, looked up again under the hop rule, as Lustre sends a
//!    routed message on with lnet_send once it is received (lib-msg.c
//!    lnet_complete_msg_locked); never back to the peer it came from (split horizon); and not
//!    to a next hop the LND reported down, on a router (lnet_check_message_drop, one probe a
//!    second).
//! 6. **Send** (`forward_out`): out of our NI like any message, taking peer and NI tx credits
//!    (lnet_post_send_locked), a bulk PUT from its router buffer as that NI registered it; or
//!    to the sibling runtime with an NI on the next hop's net, as a [`Handover::Forward`].
//!    [`FwdStage::Sending`].
//! 7. **Completion and the books** (`forward_sent`, `forward_done`): the egress's outcome
//!    comes back to the ingress (from a sibling as a [`Handover::Done`]), which alone counts
//!    it, so that `received = forwarded + dropped + in flight` holds in one place. Then, as
//!    lnet_return_rx_credits_locked does, the buffer goes back to its pool and the router
//!    credit to its sender, each to the oldest message waiting for one.

use lnd::iface::BulkOp;
use lnd::wire::errno::{EHOSTUNREACH, EPROTO};
use lnd::wire::LnetMsgType;

use crate::forward::FwdKey;

use super::fwd_state::{Arrival, Fwd, FwdKind, FwdStage};
use super::*;

/// While a next hop is down, how often a forwarded message still goes to it (lnet_queryinterval).
const DOWN_PEER_PROBE: Duration = Duration::from_secs(1);

/// The admission verdict against a message: why it is not forwarded, and how its receive slot
/// is answered.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Refusal {
    why: FwdDrop,
    answer: RxAnswer,
}

/// How the receive slot of a message refused at admission is answered.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum RxAnswer {
    /// Consumed (`recv_done`): its sender's credit comes back.
    Done,
    /// Failed (`recv_failed`): the LND closes the connection (lnet_parse's -EPROTO).
    Fail,
    /// A bulk PUT refused with this errno, so that its sender fails it (PUT_NAK 0, Lustre's
    /// lnet_drop_message, would tell its LNet the PUT was done).
    Refuse(i32),
}

/// Where a held message leaves, as the egress stage chose.
enum Egress {
    /// By our NI `ni` to `next` (its destination, or the gateway towards it).
    Here { ni: usize, next: Nid },
    /// By a sibling runtime's NI on this net (the daemon runs one runtime per NI).
    Sibling(Net),
    /// Not at all, for this reason.
    Drop(LnetError),
}

/// What a forward takes to its egress.
enum Carry {
    Inline(Vec<u8>),
    /// The large router buffer its payload is in (see `BulkBuffers`).
    Bulk(usize),
}

impl LnetNode {
    // ------------------------------------------------------------------ 1. admission

    /// A message for another node arrived on NI `ni` from `from` (lnet_parse with `for_me`
    /// false): admitted and held, or refused and counted.
    pub(super) fn forward_arrived(
        &mut self,
        ni: usize,
        from: Nid,
        hdr: LnetHdr,
        arrival: Arrival,
        rx: RxToken,
    ) {
        let now = self.now;
        self.fwd.stats.received += 1;
        let class = match self.admit(ni, from, &hdr, &arrival) {
            Ok(class) => class,
            Err(Refusal { why, answer }) => {
                let lnd = &mut self.nis[ni].lnd;
                match answer {
                    RxAnswer::Done => lnd.recv_done(now, rx),
                    RxAnswer::Fail => lnd.recv_failed(now, rx),
                    RxAnswer::Refuse(errno) => lnd.refuse_bulk(now, rx, errno),
                }
                debug!(%from, dest = %hdr.dest_nid, %why, "not forwarding a message");
                self.count_forward_drop(ni, from, u64::from(hdr.payload_length), why);
                return;
            }
        };
        let kind = match arrival {
            Arrival::Inline(mut payload) => {
                payload.truncate(hdr.payload_length as usize);
                FwdKind::Inline(payload)
            }
            Arrival::Bulk(_) => FwdKind::Bulk { unproven: false },
        };
        let key = FwdKey(self.fwd.held.insert(Fwd {
            from,
            ni,
            hdr,
            class,
            kind,
            rtr_credit: false,
            stage: FwdStage::WaitingCredit(rx),
        }));
        self.fwd.stats.in_flight += 1;
        self.take_rtr_credit(key);
    }

    /// The admission verdict: the pool the message needs, or its [`Refusal`]. The errors of a
    /// refusal are counted here, the refusal itself by the caller.
    fn admit(
        &mut self,
        ni: usize,
        from: Nid,
        hdr: &LnetHdr,
        arrival: &Arrival,
    ) -> Result<PoolClass, Refusal> {
        let refuse = |why, answer| Err(Refusal { why, answer });
        let dest = hdr.dest_nid;
        if let Arrival::Bulk(BulkOp::Get { .. }) = arrival {
            // An optimized GET is never routed (lnet_parse: "Bad optimized GET").
            return refuse(FwdDrop::Malformed, RxAnswer::Fail);
        }
        if dest.net() == self.nis[ni].nid.net()
            || self.is_own(dest)
            || dest.net() == Net::LO
            || dest.is_any()
        {
            // It should have gone directly: the sender is confused, and Lustre closes its
            // connection (-EPROTO).
            return refuse(FwdDrop::WrongNet, RxAnswer::Fail);
        }
        // From here an inline message is consumed and a bulk PUT refused with -EPROTO.
        let soft = match arrival {
            Arrival::Inline(_) => RxAnswer::Done,
            Arrival::Bulk(_) => RxAnswer::Refuse(EPROTO),
        };
        if !self.fwd.on {
            return refuse(FwdDrop::RoutingDisabled, soft);
        }
        if self.shutting_down {
            return refuse(FwdDrop::Shutdown, soft);
        }
        let payload = match arrival {
            Arrival::Inline(payload) => payload,
            Arrival::Bulk(_) => return self.admit_bulk_put(from, hdr),
        };
        match PoolClass::for_len(hdr.payload_length as usize) {
            Some(class) if payload.len() >= hdr.payload_length as usize => Ok(class),
            _ => refuse(FwdDrop::Malformed, soft),
        }
    }

    /// The admission checks of a bulk PUT (a large buffer will be lent for it: refused before
    /// that if it could not be forwarded).
    fn admit_bulk_put(&mut self, from: Nid, hdr: &LnetHdr) -> Result<PoolClass, Refusal> {
        let refuse = |why| {
            Err(Refusal {
                why,
                answer: RxAnswer::Refuse(EPROTO),
            })
        };
        if hdr.payload_length == 0
            || hdr.payload_length > LNET_MTU
            || !matches!(hdr.msg_type(), LnetMsgType::Put | LnetMsgType::Reply)
        {
            return refuse(FwdDrop::Malformed);
        }
        if self.fwd.pools.0[PoolClass::Large.index()].nbuffers == 0
            || self.large.table.bufs.is_empty()
        {
            return refuse(FwdDrop::NoBulkBuffer);
        }
        // A destination no route reaches is refused before a router buffer is lent for it.
        // Lustre looks the route up only once the data is in (lnet_parse_forward_locked takes
        // the credit and buffer first): a peer could then hold every large buffer until its LND
        // timeout with PUT_REQs to an unreachable net (the hostile-peer audit: 512 buffers
        // pinned, other peers' bulk forwarding down to 10 RPCs in 5 s). The egress stage looks
        // the route up again when the data is in.
        let onward = self
            .peek_route(hdr.dest_nid, Leg::of(hdr.src_nid, from))
            .map(|(r, _)| r);
        if !matches!(onward, Ok(Route::Remote { .. } | Route::Sibling(_))) {
            let e = match onward {
                Err(e @ LnetError::HopLimit(_)) => e,
                _ => LnetError::NoRoute(hdr.dest_nid),
            };
            self.count_error(&e);
            return Err(Refusal {
                why: FwdDrop::of(&e),
                answer: RxAnswer::Refuse(EHOSTUNREACH),
            });
        }
        // An egress that cannot send from router buffers (an NI added at run time): the
        // sender's PUT fails now, rather than ending done while the router drops the data.
        if !onward.as_ref().is_ok_and(|r| self.egress_has_bulk(r)) {
            return refuse(FwdDrop::NoBulkBuffer);
        }
        // A sender whose last bulk PUTs stalled or came in short is refused for a while
        // (doubling per strike), before any buffer is lent: asking again right after a reclaim
        // gets it nothing.
        if self.bulk_refused(from) {
            return refuse(FwdDrop::BulkRefused);
        }
        Ok(PoolClass::Large)
    }

    // ------------------------------------------------------------------ 2. router credit

    /// The sender's router credit (lpni_rtrcredits); negative: wait on its queue.
    fn take_rtr_credit(&mut self, key: FwdKey) {
        let Some(f) = self.fwd.held.get_mut(key.0) else {
            return;
        };
        if let Some(p) = self.peers.get_mut(&f.from) {
            f.rtr_credit = true;
            p.rtr_credits -= 1;
            p.min_rtr_credits = p.min_rtr_credits.min(p.rtr_credits);
            if p.rtr_credits < 0 {
                // Its stage is `WaitingCredit` from its arrival.
                p.rtrq.push_back(key);
                self.fwd.stats.waited_rtr_credit += 1;
                return;
            }
        }
        // (A sender the peer table had no room for is limited by the pools alone.)
        self.take_router_buffer(key);
    }

    // ------------------------------------------------------------------ 3. buffer

    /// A buffer of the message's pool (rbp_credits); negative: wait on the pool. A bulk PUT
    /// of a sender not yet proven passes the unproven share's gate first (`bulk.rs`).
    pub(super) fn take_router_buffer(&mut self, key: FwdKey) {
        if !self.admit_bulk(key) {
            if let Some(f) = self.fwd.held.get_mut(key.0) {
                f.stage = f.stage.then(FwdStage::WaitingUnproven);
            }
            return;
        }
        let Some(f) = self.fwd.held.get_mut(key.0) else {
            return;
        };
        let pool = self.fwd.pools.get_mut(f.class);
        pool.credits -= 1;
        pool.min_credits = pool.min_credits.min(pool.credits);
        if pool.credits < 0 {
            f.stage = f.stage.then(FwdStage::WaitingBuffer);
            pool.waiting.push_back(key);
            self.fwd.stats.waited_buffer += 1;
            return;
        }
        f.stage = f.stage.then(FwdStage::Ready);
        self.fwd.ready.push_back(key);
    }

    /// A message that waited on its pool has its buffer: it is committed in `process`.
    fn buffer_granted(&mut self, key: FwdKey) {
        if let Some(f) = self.fwd.held.get_mut(key.0) {
            f.stage = f.stage.then(FwdStage::Ready);
        }
        self.fwd.ready.push_back(key);
    }

    /// A buffer of pool `class` is free again: the oldest message waiting for one takes it.
    pub(super) fn return_pool_credit(&mut self, class: PoolClass) {
        let pool = self.fwd.pools.get_mut(class);
        pool.credits += 1;
        if pool.credits <= 0 {
            if let Some(next) = pool.waiting.pop_front() {
                self.buffer_granted(next);
            }
        }
    }

    // ------------------------------------------------------------------ 4. commit

    /// The message has its credit and buffer: its LND slot goes back (the sender's credit with
    /// it). An inline message goes to its egress; a bulk PUT is first received into a large
    /// router buffer.
    pub(super) fn commit_forward(&mut self, key: FwdKey) {
        let now = self.now;
        let Some(f) = self.fwd.held.get_mut(key.0) else {
            return;
        };
        let FwdStage::Ready(rx) = f.stage else {
            return;
        };
        let (ni, from, hdr) = (f.ni, f.from, f.hdr);
        match &mut f.kind {
            FwdKind::Inline(payload) => {
                let payload = std::mem::take(payload);
                f.stage = FwdStage::Sending(None);
                self.nis[ni].lnd.recv_done(now, rx);
                let origin = self.nis[ni].nid;
                self.forward_out(origin, key, from, hdr, Carry::Inline(payload), false);
            }
            FwdKind::Bulk { .. } => self.receive_bulk(key, ni, from, hdr, rx),
        }
    }

    /// A bulk PUT committed: its sender writes it into a free large router buffer (PUT_ACK), and
    /// it goes to its egress once it is in (`forward_received`).
    fn receive_bulk(&mut self, key: FwdKey, ni: usize, from: Nid, hdr: LnetHdr, rx: RxToken) {
        let now = self.now;
        let len = hdr.payload_length;
        let buf = self
            .large
            .free
            .pop()
            .map(|k| (k, self.bulk_mem(k, ni, len.max(1))));
        let (k, buf) = match buf {
            Some((k, Some(buf))) => (k, buf),
            other => {
                // The pool counts more buffers than this runtime registered (large_buffers set
                // above what the daemon registered at start), or one is not on this NI. Still
                // `Ready`, it is refused with its slot.
                if let Some((k, None)) = other {
                    self.large.free.push(k);
                }
                return self.forward_done(key, Err(FwdDrop::NoBulkBuffer));
            }
        };
        if let Some(f) = self.fwd.held.get_mut(key.0) {
            f.stage = FwdStage::Receiving(k);
        }
        self.alloc_msg();
        let cookie = self.inbound(ni, from, hdr, len, Purpose::ForwardIn(key));
        if len == 0 {
            self.nis[ni].lnd.recv_done(now, rx);
            self.finish_out(cookie, Ok(()));
        } else {
            self.nis[ni].lnd.accept_bulk(now, rx, buf, cookie);
        }
    }

    /// A bulk PUT to forward is in its router buffer (or failed to come in): on to its egress,
    /// from the same memory. Its sender is proven, or gets a strike.
    pub(super) fn forward_received(&mut self, key: FwdKey, result: Result<(), LnetError>) {
        let Some(f) = self.fwd.held.get(key.0) else {
            return;
        };
        let (ni, from, hdr) = (f.ni, f.from, f.hdr);
        let FwdStage::Receiving(k) = f.stage else {
            return self.forward_done(key, Err(FwdDrop::SendFailed));
        };
        match &result {
            Ok(()) => self.bulk_proven(from),
            // The sender did not fill the buffer in time (its grant was reclaimed), or its
            // PUT_DONE came with data missing: nothing to forward, and a strike.
            Err(LnetError::Lnd(TxError::GrantExpired)) => {
                self.bulk_strike(from, ni);
                return self.forward_done(key, Err(FwdDrop::BulkStalled));
            }
            Err(LnetError::Lnd(TxError::Rdma(e))) if *e == -EPROTO => {
                self.bulk_strike(from, ni);
                return self.forward_done(key, Err(FwdDrop::BulkShort));
            }
            // The write or PUT_DONE did not come for another reason (the connection failed).
            Err(_) => return self.forward_done(key, Err(FwdDrop::SendFailed)),
        }
        if let Some(f) = self.fwd.held.get_mut(key.0) {
            f.stage = FwdStage::Sending(Some(k));
        }
        let origin = self.nis[ni].nid;
        self.forward_out(origin, key, from, hdr, Carry::Bulk(k), false);
    }

    // ------------------------------------------------------------------ 5. egress

    /// The egress choice, the one every forward takes: the route under the hop rule, never
    /// back to the peer it came from, never to a next hop held down. `handed`: a sibling
    /// runtime (its ingress) handed it over, so it is not handed on again, and it is refused
    /// while this runtime shuts down.
    fn egress(&mut self, hdr: &LnetHdr, from: Nid, handed: bool) -> Egress {
        let route = self.route_leg(hdr.dest_nid, Leg::of(hdr.src_nid, from));
        if handed && self.shutting_down {
            return Egress::Drop(LnetError::Shutdown);
        }
        match route {
            Ok(Route::Remote { next, .. }) if next == from => Egress::Drop(LnetError::Loop(from)),
            Ok(Route::Remote { ni, next }) if self.drops_for_down_peer(next, ni) => {
                Egress::Drop(LnetError::PeerDown(next))
            }
            Ok(Route::Remote { ni, next }) => Egress::Here { ni, next },
            Ok(Route::Sibling(via)) if !handed => Egress::Sibling(via),
            Ok(Route::Sibling(_) | Route::Local(_) | Route::SiblingNi) => {
                Egress::Drop(LnetError::NoRoute(hdr.dest_nid))
            }
            Err(e) => Egress::Drop(e),
        }
    }

    /// lnet_check_message_drop: on a router that tracks peer aliveness (routing on and the
    /// NI's peer_timeout > 0), a message for another node whose next hop is a peer NI the LND
    /// reported down is dropped at once, instead of holding a router buffer until the LND gives
    /// up on it: a dead server behind a router must not take the buffers that traffic to live
    /// ones needs. One message per `DOWN_PEER_PROBE` still goes to it, so that the LND tries the
    /// peer again and reports it up when it is back (Lustre asks the LND about a dead peer at
    /// most once a second, lnet_queryinterval).
    pub(super) fn drops_for_down_peer(&mut self, next: Nid, ni: usize) -> bool {
        let now = self.now;
        if !self.fwd.on || self.nis.get(ni).is_none_or(|n| n.peer_timeout.is_zero()) {
            return false;
        }
        let Some(p) = self.peers.get_mut(&next) else {
            return false;
        };
        if p.state != PeerState::Down {
            return false;
        }
        if p.down_probe
            .is_none_or(|t| now >= t.saturating_add(DOWN_PEER_PROBE))
        {
            p.down_probe = Some(now);
            return false;
        }
        true
    }

    // ------------------------------------------------------------------ 6. send

    /// Sends held message `key` of the runtime whose NI is `origin` out of its egress: our NI
    /// (like any message: credits, then the LND; a bulk PUT from its router buffer as this NI
    /// registered it), or a sibling runtime. A forward that cannot go is finished here, or
    /// handed back to its ingress when a sibling handed it over (`handed`).
    fn forward_out(
        &mut self,
        origin: Nid,
        key: FwdKey,
        from: Nid,
        hdr: LnetHdr,
        carry: Carry,
        handed: bool,
    ) {
        let leg = Leg::of(hdr.src_nid, from);
        let purpose = Purpose::Forward { origin, key, leg };
        match self.egress(&hdr, from, handed) {
            Egress::Here { ni, next } => match carry {
                Carry::Inline(payload) => {
                    self.launch(Route::Remote { ni, next }, hdr, payload, purpose)
                }
                Carry::Bulk(k) => match self.bulk_mem(k, ni, hdr.payload_length) {
                    Some(buf) => self.launch_bulk(ni, next, hdr, BulkSend::Put(buf), purpose),
                    None if handed => self.fwd.handovers.push_back(Handover::Done {
                        origin,
                        key,
                        result: Err(LnetError::BulkUnsupported(
                            "a router buffer not registered on the egress NI",
                        )),
                    }),
                    None => self.forward_done(key, Err(FwdDrop::NoBulkBuffer)),
                },
            },
            Egress::Sibling(via) => {
                let (payload, bulk) = match carry {
                    Carry::Inline(payload) => (payload, None),
                    Carry::Bulk(k) => (Vec::new(), Some(k)),
                };
                let fwd = HandedForward {
                    origin,
                    from,
                    key,
                    hdr,
                    payload,
                    bulk,
                };
                self.fwd.handovers.push_back(Handover::Forward { via, fwd });
            }
            Egress::Drop(e) if handed => self.fwd.handovers.push_back(Handover::Done {
                origin,
                key,
                result: Err(e),
            }),
            Egress::Drop(e) => {
                // The ingress counts its own route lookup's failure as an error; a next hop
                // held down is a drop by rule (lnet_check_message_drop), not an error.
                if !matches!(e, LnetError::PeerDown(_)) {
                    self.count_error(&e);
                }
                self.forward_done(key, Err(FwdDrop::of(&e)));
            }
        }
    }

    /// A forward a sibling runtime (its ingress, `origin`) handed over: out of our NI, or back
    /// to it as done.
    pub(super) fn forward_handed(&mut self, f: HandedForward) {
        let carry = match f.bulk {
            Some(k) => Carry::Bulk(k),
            None => Carry::Inline(f.payload),
        };
        self.forward_out(f.origin, f.key, f.from, f.hdr, carry, true);
    }

    // ------------------------------------------------------------------ 7. completion, books

    /// The egress LND finished forwarded message `key` of the runtime whose NI is `origin`:
    /// its ingress counts it, here or in a sibling runtime.
    pub(super) fn forward_sent(&mut self, origin: Nid, key: FwdKey, result: Result<(), LnetError>) {
        if self.nis.iter().any(|n| n.nid == origin) {
            self.forward_done(key, result.map_err(|e| FwdDrop::of(&e)));
        } else {
            self.fwd.handovers.push_back(Handover::Done {
                origin,
                key,
                result,
            });
        }
    }

    /// Held message `key` is done, whatever its stage: count the outcome, answer the receive
    /// slot it still holds, and give back what it took, each to the oldest message waiting
    /// for one (lnet_return_rx_credits_locked). A message still waiting for a credit or a
    /// buffer is finished only by `drop_waiting_forwards`, which has emptied the queues: what
    /// it had counted is undone without waking anyone.
    pub(super) fn forward_done(&mut self, key: FwdKey, result: Result<(), FwdDrop>) {
        let now = self.now;
        let Some(f) = self.fwd.held.remove(key.0) else {
            debug!(?key, "completion for an unknown forwarded message");
            return;
        };
        self.fwd.stats.in_flight = self.fwd.stats.in_flight.saturating_sub(1);
        let len = u64::from(f.hdr.payload_length);
        match result {
            Ok(()) => {
                self.fwd.stats.forwarded += 1;
                self.fwd.stats.forwarded_bytes += len;
                self.stats.route_count += 1;
                self.stats.route_length += len;
            }
            Err(why) => self.count_forward_drop(f.ni, f.from, len, why),
        }
        let bulk = matches!(f.kind, FwdKind::Bulk { .. });
        if let Some(rx) = f.stage.rx() {
            if bulk {
                // A bulk PUT never taken in: its sender's PUT fails (PUT_NAK 0 would tell its
                // LNet the PUT was done).
                self.nis[f.ni].lnd.refuse_bulk(now, rx, EPROTO);
            } else {
                self.nis[f.ni].lnd.recv_done(now, rx);
            }
        }
        if let FwdKind::Bulk { unproven: true } = f.kind {
            self.release_unproven(f.from);
        }
        // A large buffer that must be scrubbed goes back to the pool, with its credit, only
        // once it is (`scrub_bulk`): a credit is a clean buffer free.
        let mut credit_back = f.stage.holds_buffer();
        if let Some(k) = f.stage.large_buffer() {
            if self.scrubs(f.ni) {
                // Its memory as the table names it now (a later table may no longer).
                let mem = self.large.table.mem.get(k).cloned().flatten();
                self.large
                    .lending
                    .dirty
                    .push_back((k, f.hdr.payload_length, mem));
                credit_back = false;
            } else {
                self.large.free.push(k);
            }
        }
        if credit_back {
            self.return_pool_credit(f.class);
        } else if let FwdStage::WaitingBuffer(_) = f.stage {
            self.fwd.pools.get_mut(f.class).credits += 1;
        }
        if f.rtr_credit {
            if let Some(p) = self.peers.get_mut(&f.from) {
                p.rtr_credits += 1;
                if p.rtr_credits <= 0 && !matches!(f.stage, FwdStage::WaitingCredit(_)) {
                    if let Some(next) = p.rtrq.pop_front() {
                        self.take_router_buffer(next);
                    }
                }
            }
        }
    }

    fn count_forward_drop(&mut self, ni: usize, from: Nid, len: u64, why: FwdDrop) {
        self.fwd.stats.count_drop(why);
        self.count_rx_drop(Some(ni), from, len);
    }

    /// Drops every held message still waiting for a router credit or a buffer (routing
    /// turned off, shutdown): they never got a buffer, so nothing waits behind them.
    pub(super) fn drop_waiting_forwards(&mut self, why: FwdDrop) {
        let mut waiting = Vec::new();
        for p in self.peers.values_mut() {
            waiting.extend(p.rtrq.drain(..));
        }
        for class in PoolClass::ALL {
            waiting.extend(self.fwd.pools.get_mut(class).waiting.drain(..));
        }
        // Bulk PUTs waiting for room in the unproven share hold their router credit only.
        let unproven: Vec<FwdKey> = self.large.lending.unproven_wait.drain(..).collect();
        for k in unproven.into_iter().chain(waiting) {
            self.forward_done(k, Err(why));
        }
    }

    // ------------------------------------------------------------------ control

    /// Turns forwarding on or off (`lnetctl set routing 1|0`). Off: messages waiting for a
    /// credit or a buffer are dropped, those already with an egress finish; our ping replies
    /// say RTE_DISABLED from now on.
    pub fn set_routing(&mut self, now: Instant, on: bool) {
        self.advance(now);
        if self.fwd.on == on {
            return;
        }
        self.fwd.on = on;
        if !on {
            self.drop_waiting_forwards(FwdDrop::RoutingDisabled);
        }
        self.process(now);
    }

    /// Resizes the router buffer pools (`lnetctl set tiny_buffers|small_buffers|
    /// large_buffers`): growing admits waiting messages at once; shrinking takes effect as
    /// buffers come back.
    pub fn set_buffers(&mut self, now: Instant, class: PoolClass, mut nbuffers: u32) {
        self.advance(now);
        if class == PoolClass::Large
            && !self.large.table.bufs.is_empty()
            && nbuffers > self.large.owned
        {
            // Large buffers are registered memory: the pool lends no more than this runtime
            // owns; the daemon registers more for a larger share and says so again
            // (`set_bulk_buffers`).
            debug!(
                asked = nbuffers,
                registered = self.large.owned,
                "large_buffers capped at the router buffers this runtime owns"
            );
            nbuffers = self.large.owned;
        }
        let pool = self.fwd.pools.get_mut(class);
        pool.resize(nbuffers);
        // Each waiter already counted its credit: as many as the pool is no longer short of
        // may go (a pool at -3 with 5 waiting admits 2).
        loop {
            let pool = self.fwd.pools.get_mut(class);
            if pool.waiting.len() as i64 <= (-pool.credits).max(0) {
                break;
            }
            let Some(k) = pool.waiting.pop_front() else {
                break;
            };
            self.buffer_granted(k);
        }
        self.process(now);
    }

    /// This runtime is going away before its shutdown finished (an NI removed at run time
    /// whose peers did not take everything within the bound): every message it is still
    /// sending for a sibling runtime is failed back to that runtime (`Handover::Done` with
    /// `Shutdown`), so that the sibling's router buffer and its sender's credits come back.
    /// The messages are forgotten here; their credits go with this runtime.
    pub fn abandon_forwards(&mut self) {
        let ours: Vec<Nid> = self.nis.iter().map(|n| n.nid).collect();
        let owed: Vec<(u64, Nid, FwdKey)> = self
            .msgs
            .iter()
            .filter_map(|(cookie, m)| match m.purpose {
                Purpose::Forward { origin, key, .. } if !ours.contains(&origin) => {
                    Some((cookie, origin, key))
                }
                _ => None,
            })
            .collect();
        for (cookie, origin, key) in owed {
            self.msgs.remove(&cookie);
            self.free_msg();
            self.fwd.handovers.push_back(Handover::Done {
                origin,
                key,
                result: Err(LnetError::Shutdown),
            });
        }
    }

    /// The next message for a sibling runtime ([`Handover::target`] says which).
    pub fn poll_handover(&mut self) -> Option<Handover> {
        self.fwd.handovers.pop_front()
    }

    /// Forwarding on or off.
    pub fn routing_enabled(&self) -> bool {
        self.fwd.on
    }

    /// `routing show`: forwarding, the pools, the books.
    pub fn routing_info(&self) -> RoutingInfo {
        RoutingInfo {
            enabled: self.fwd.on,
            pools: PoolClass::ALL
                .iter()
                .map(|&c| {
                    let p = &self.fwd.pools.0[c.index()];
                    PoolInfo {
                        class: c,
                        npages: c.npages(),
                        nbuffers: p.nbuffers,
                        credits: p.credits,
                        min_credits: p.min_credits,
                    }
                })
                .collect(),
            stats: self.fwd.stats.clone(),
        }
    }
}
