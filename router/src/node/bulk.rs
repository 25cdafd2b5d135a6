//! Bulk data: LNet memory descriptors over registered memory, moved by the LND's RDMA
//! rendezvous (reference 2.4).
//!
//! The user registers memory with the fabric of the NI it will use (the driver's `Registry`)
//! and names a range of it with a [`BulkBuf`]. Then:
//! - [`LnetNode::send_put_bulk`] PUTs a range to a peer (PUT_REQ, the peer's sink written by
//!   RDMA, PUT_DONE): [`LnetEvent::PutDone`] when its data is in the peer's sink.
//! - [`LnetNode::post_sink`] posts a range for one PUT on (portal, match bits): the PUT's data is
//!   written there and [`LnetEvent::BulkPut`] says how much (lnet_parse_put matching an MD;
//!   LNet's truncation: a PUT longer than the MD fills the MD).
//! - [`LnetNode::post_source`] posts a range one GET on (portal, match bits) reads:
//!   [`LnetEvent::BulkGetServed`] once it is written into the requester's sink.
//! - [`LnetNode::send_get_bulk`] GETs from a peer's source into a range (GET_REQ carrying the
//!   sink): [`LnetEvent::GetDone`] with the bytes written.
//!
//! MDs here are one-shot (LNet's threshold 1, unlinked once used), as selftest and Lustre's
//! bulk MDs are. The node itself never reads or writes registered memory: the fabric does;
//! except for a source its user lends with the memory (`post_source_shared`), read to answer
//! a GET from a sibling runtime's NI in memory, since no fabric joins two runtimes.
//! A GET into registered memory goes only to a peer on a local net: Lustre never routes an
//! optimized GET (a routed GET is IMMEDIATE and its REPLY would come back as a PUT).

use std::sync::Arc;

use lnd::iface::{BulkMem, BulkOp, BulkSend, TxError};

use super::bulk_state::{Md, RoutedGet};
use crate::config::BulkScrub;
use crate::forward::BulkBuffers;
use lnd::mem::SharedMem;

use super::fwd_state::{Arrival, FwdKind};
use super::*;

impl LnetNode {
    /// PUTs the bytes of `buf` to (`dst`, `portal`, `match_bits`) by rendezvous, without an ACK.
    /// The outcome comes as [`LnetEvent::PutDone`]: `Ok` once the data is in the peer's sink
    /// (or the peer matched nothing: LNet PUTs are not acknowledged), `Err` with the LND's or
    /// the peer's reason. `buf` must stay registered and unchanged until then. An error here
    /// means nothing was sent and no event follows.
    pub fn send_put_bulk(
        &mut self,
        now: Instant,
        dst: Nid,
        portal: u32,
        match_bits: u64,
        buf: BulkBuf,
    ) -> Result<MsgId, LnetError> {
        self.advance(now);
        let (ni, next) = self.bulk_route(dst, &buf)?;
        let id = self.next_msg_id();
        let hdr = self.put_hdr(self.nis[ni].nid, dst, buf.len, portal, match_bits);
        let bulk = BulkSend::Put(buf.mem(buf.len, None));
        self.launch_bulk(ni, next, hdr, bulk, Purpose::Put(id));
        self.process(now);
        Ok(id)
    }

    /// GETs up to `buf.len` bytes from (`dst`, `portal`, `match_bits`) into `buf`. To a peer on
    /// a net of ours it is an optimized GET (GET_REQ with `buf` as the sink); through a router
    /// it is an IMMEDIATE GET whose REPLY comes back by rendezvous into `buf` (Lustre never
    /// routes an optimized GET), bounded by twice the LND timeout. The outcome comes as
    /// [`LnetEvent::GetDone`] with the bytes written; a direct GET that matched nothing fails
    /// with `Lnd(Rdma(-61))` (ENODATA), a routed one at its deadline (`Timeout`: LNet drops a
    /// GET nothing matches). `buf` must stay registered until then.
    pub fn send_get_bulk(
        &mut self,
        now: Instant,
        dst: Nid,
        portal: u32,
        match_bits: u64,
        buf: BulkBuf,
    ) -> Result<MsgId, LnetError> {
        self.advance(now);
        // To a sibling runtime's NI: an IMMEDIATE GET it answers in memory, its REPLY inline,
        // as through a router.
        let sibling = self.is_sibling_nid(dst) && !self.shutting_down;
        let (ni, next) = match sibling {
            true if buf.ni.0 < self.nis.len() => (buf.ni.0, Nid::ANY),
            _ => self.bulk_route(dst, &buf)?,
        };
        let id = self.next_msg_id();
        // A routed GET's REPLY is matched by its wire handle, in the pings' cookie space.
        let object_cookie = if next == dst {
            id.0
        } else {
            self.pings.next_id()
        };
        let wmd = WireHandle {
            interface_cookie: self.interface_cookie,
            object_cookie,
        };
        let hdr = LnetHdr {
            src_pid: self.pid,
            ..LnetHdr::get(self.nis[ni].nid, dst, wmd, portal, match_bits, buf.len)
        };
        if next == dst {
            let bulk = BulkSend::Get(buf.mem(buf.len, None));
            self.launch_bulk(ni, next, hdr, bulk, Purpose::GetBulk(id));
        } else {
            let wait = self.nis[ni].lnd.timeout() * 2;
            let deadline = now.saturating_add(wait);
            let timer = self
                .timers
                .arm(deadline, super::timers::NodeTimer::RoutedGet(object_cookie));
            let g = RoutedGet {
                id,
                buf,
                dst,
                timer,
            };
            self.bulk_gets.insert(object_cookie, g);
            let route = if sibling {
                Route::SiblingNi
            } else {
                Route::Remote { ni, next }
            };
            self.launch(route, hdr, Vec::new(), Purpose::GetRouted(object_cookie));
        }
        self.process(now);
        Ok(id)
    }

    /// The wire handle a routed GET still waiting for its REPLY carries (for tests).
    #[cfg(test)]
    pub(crate) fn pending_bulk_get_handle(&self, id: MsgId) -> Option<WireHandle> {
        self.bulk_gets
            .iter()
            .find(|(_, g)| g.id == id)
            .map(|(&cookie, _)| WireHandle {
                interface_cookie: self.interface_cookie,
                object_cookie: cookie,
            })
    }

    /// A routed GET into registered memory is finished: report it (once).
    pub(super) fn end_bulk_get(
        &mut self,
        cookie: u64,
        result: Result<u32, LnetError>,
        counted: bool,
    ) {
        let Some(g) = self.take_bulk_get(cookie) else {
            return;
        };
        if let Err(e) = &result {
            if !counted {
                self.count_error(e);
            }
        }
        self.events
            .push_back(LnetEvent::GetDone { id: g.id, result });
    }

    /// A routed GET answered by an inline REPLY: the bytes (cut to its buffer) go to the user,
    /// who copies them into the GET's memory.
    pub(super) fn end_bulk_get_inline(&mut self, cookie: u64, mut payload: Vec<u8>) {
        let Some(g) = self.take_bulk_get(cookie) else {
            return;
        };
        payload.truncate(g.buf.len as usize);
        self.events
            .push_back(LnetEvent::GetDoneInline { id: g.id, payload });
    }

    /// The routed GET of `cookie`, if still waiting, its deadline disarmed.
    fn take_bulk_get(&mut self, cookie: u64) -> Option<RoutedGet> {
        let g = self.bulk_gets.remove(&cookie)?;
        self.timers.cancel(g.timer);
        Some(g)
    }

    /// Fails every routed GET still waiting (shutdown).
    pub(super) fn fail_bulk_gets(&mut self) {
        let all: Vec<u64> = self.bulk_gets.keys().copied().collect();
        for cookie in all {
            self.end_bulk_get(cookie, Err(LnetError::Shutdown), false);
        }
    }

    /// An IMMEDIATE GET for us (it came through a router, or from a peer that sends no
    /// optimized GET) matching a posted source: the REPLY goes back by rendezvous from the
    /// source's memory, as any bulk PUT (lnet_parse_get then lnet_send of the REPLY).
    pub(super) fn serve_get_by_reply(
        &mut self,
        ni: usize,
        hdr: &LnetHdr,
    ) -> Result<usize, &'static str> {
        let LnetBody::Get {
            return_wmd,
            match_bits,
            ptl_index,
            sink_length,
            ..
        } = hdr.body
        else {
            return Err("not a GET");
        };
        if ptl_index == LNET_RESERVED_PORTAL {
            return Err("GET on the reserved portal matched nothing");
        }
        let Some((md, m)) = self.mds.take(ni, ptl_index, match_bits, false) else {
            return Err("GET matched no posted source");
        };
        let len = m.buf.len.min(sink_length);
        let reply = LnetHdr {
            dest_nid: hdr.src_nid,
            src_nid: hdr.dest_nid,
            dest_pid: hdr.src_pid,
            src_pid: self.pid,
            payload_length: len,
            body: LnetBody::Reply {
                dst_wmd: return_wmd,
            },
        };
        match self.route(hdr.src_nid) {
            Ok(Route::Remote { ni: e, next }) if e == m.buf.ni.0 && len > 0 => {
                let src = BulkSend::Put(m.buf.mem(len, m.mem.clone()));
                self.launch_bulk(e, next, reply, src, Purpose::ServeReply(md));
                Ok(0)
            }
            Ok(r @ Route::Remote { .. }) if len == 0 => {
                self.launch(r, reply, Vec::new(), Purpose::ServeReply(md));
                Ok(0)
            }
            _ => {
                self.events.push_back(LnetEvent::BulkGetServed {
                    md,
                    to: hdr.src_nid,
                    result: Err(LnetError::NoRoute(hdr.src_nid)),
                });
                Err("the REPLY's route does not leave by the source's NI")
            }
        }
    }

    /// Posts `buf` for the next PUT to (`portal`, `match_bits`) arriving on `buf.ni`; its
    /// outcome comes as [`LnetEvent::BulkPut`].
    pub fn post_sink(&mut self, portal: u32, match_bits: u64, buf: BulkBuf) -> MdId {
        self.post_md(portal, match_bits, buf, true, None)
    }

    /// Posts `buf` for the next GET of (`portal`, `match_bits`) arriving on `buf.ni`; its
    /// outcome comes as [`LnetEvent::BulkGetServed`].
    pub fn post_source(&mut self, portal: u32, match_bits: u64, buf: BulkBuf) -> MdId {
        self.post_md(portal, match_bits, buf, false, None)
    }

    /// [`LnetNode::post_source`] for a GET from one of the node's NIDs that a sibling runtime
    /// runs ([`LnetNode::is_sibling_nid`]): `mem` is the memory `buf` names (its offsets are
    /// `buf`'s), read to answer that GET in memory with an inline REPLY, as Lustre's lolnd
    /// copies between a node's own MDs. No LND moves memory between two runtimes' fabrics.
    pub fn post_source_shared(
        &mut self,
        portal: u32,
        match_bits: u64,
        buf: BulkBuf,
        mem: SharedMem,
    ) -> MdId {
        self.post_md(portal, match_bits, buf, false, Some(mem))
    }

    fn post_md(
        &mut self,
        portal: u32,
        match_bits: u64,
        buf: BulkBuf,
        sink: bool,
        mem: Option<SharedMem>,
    ) -> MdId {
        self.mds.post(Md {
            portal,
            match_bits,
            buf,
            sink,
            mem,
        })
    }

    /// A GET delivered in memory (from a sibling runtime, [`Handover::Local`]): answered from
    /// a source posted with its memory on any of our NIs, with an inline REPLY that goes back
    /// the same way; the source's user gets [`LnetEvent::BulkGetServed`].
    pub(super) fn serve_get_in_memory(&mut self, hdr: &LnetHdr) -> Result<usize, &'static str> {
        let LnetBody::Get {
            return_wmd,
            match_bits,
            ptl_index,
            sink_length,
            ..
        } = hdr.body
        else {
            return Err("not a GET");
        };
        let found =
            (0..self.nis.len()).find_map(|ni| self.mds.take(ni, ptl_index, match_bits, false));
        let Some((md, m)) = found else {
            return Err("GET matched nothing");
        };
        let len = m.buf.len.min(sink_length) as usize;
        let start = m.buf.offset as usize;
        let bytes = m
            .mem
            .as_ref()
            .and_then(|mem| mem.with(|b| b.get(start..start + len).map(<[u8]>::to_vec)));
        let Some(bytes) = bytes else {
            self.events.push_back(LnetEvent::BulkGetServed {
                md,
                to: hdr.src_nid,
                result: Err(LnetError::BulkUnsupported(
                    "a GET in memory of a source posted without its memory",
                )),
            });
            return Err("GET in memory of a source without memory");
        };
        let body = LnetBody::Reply {
            dst_wmd: return_wmd,
        };
        self.respond(hdr, None, len as u32, body, bytes);
        self.events.push_back(LnetEvent::BulkGetServed {
            md,
            to: hdr.src_nid,
            result: Ok(len as u32),
        });
        Ok(0)
    }

    /// Takes back an MD nothing has matched yet (LNetMDUnlink); false if it was used already or
    /// never posted. No event follows.
    pub fn unlink_md(&mut self, md: MdId) -> bool {
        self.mds.unlink(md)
    }

    /// MDs posted and not used yet.
    pub fn posted_mds(&self) -> usize {
        self.mds.len()
    }

    /// Sends `hdr` as it is to `next` through NI `ni`, for unit tests that play a misbehaving
    /// sender or a hostile peer: with `sink`, a GET with `buf` as its sink (an optimized GET
    /// through a router, which LNet never builds), outcome [`LnetEvent::GetDone`]; else any
    /// header with the bytes of `buf` by rendezvous (a forged REPLY), outcome
    /// [`LnetEvent::PutDone`]. Either with id 0.
    #[cfg(test)]
    pub(crate) fn send_raw_bulk(
        &mut self,
        now: Instant,
        ni: NiIndex,
        next: Nid,
        hdr: LnetHdr,
        buf: BulkBuf,
        sink: bool,
    ) {
        self.advance(now);
        let mem = buf.mem(buf.len, None);
        let (bulk, purpose) = if sink {
            (BulkSend::Get(mem), Purpose::GetBulk(MsgId(0)))
        } else {
            (BulkSend::Put(mem), Purpose::Put(MsgId(0)))
        };
        self.launch_bulk(ni.0, next, hdr, bulk, purpose);
        self.process(now);
    }

    /// The NI and next hop for a bulk message to `dst` from `buf`; a refusal is counted.
    fn bulk_route(&mut self, dst: Nid, buf: &BulkBuf) -> Result<(usize, Nid), LnetError> {
        let checked = if self.shutting_down {
            Err(LnetError::Shutdown)
        } else {
            match self.route(dst) {
                Ok(Route::Remote { ni, next }) if ni == buf.ni.0 => Ok((ni, next)),
                Ok(Route::Remote { .. }) => Err(LnetError::BulkUnsupported(
                    "registered memory of another NI than the one the message leaves by",
                )),
                Ok(Route::Local(_)) => Err(LnetError::BulkUnsupported(
                    "bulk data to ourselves (registered memory moves through an LND)",
                )),
                // A GET goes in memory (`send_get_bulk`); a PUT's user sends the bytes.
                Ok(Route::SiblingNi) => Err(LnetError::BulkUnsupported(
                    "a bulk PUT to a sibling runtime's NI (send its bytes inline)",
                )),
                Ok(Route::Sibling(_)) => Err(LnetError::NoRoute(dst)),
                Err(e) => Err(e),
            }
        };
        if let Err(e) = &checked {
            self.count_error(e);
        }
        checked
    }

    /// Starts a bulk message through NI `ni` to `next` (credits as any message).
    pub(super) fn launch_bulk(
        &mut self,
        ni: usize,
        next: Nid,
        hdr: LnetHdr,
        bulk: BulkSend,
        purpose: Purpose,
    ) {
        self.alloc_msg();
        let known = self.peer_entry(next, ni).is_some();
        let len = match &bulk {
            BulkSend::Put(src) => src.len as usize,
            _ => 0,
        };
        let cookie = self.msgs.insert(OutMsg {
            bulk: Some(bulk),
            len,
            ..OutMsg::new(next, ni, hdr, purpose, self.now)
        });
        if known {
            self.post_send(cookie);
        } else {
            let e = LnetError::Refused(SendError::PeerTableFull(next));
            self.refused.push_back((cookie, e));
        }
    }

    /// A rendezvous request from `from` on NI `ni` (lnet_parse for a PUT_REQ or GET_REQ).
    pub(super) fn on_rdma_request(
        &mut self,
        ni: usize,
        from: Nid,
        hdr: LnetHdr,
        op: BulkOp,
        rx: RxToken,
    ) {
        let now = self.now;
        self.note_arrival(ni, from, &hdr);
        if hdr.dest_nid != self.nis[ni].nid {
            return self.forward_arrived(ni, from, hdr, Arrival::Bulk(op), rx);
        }
        self.alloc_msg();
        let verdict = match (op, hdr.body) {
            (
                BulkOp::Put,
                LnetBody::Put {
                    ptl_index,
                    match_bits,
                    hdr_data,
                    ack_wmd,
                    ..
                },
            ) if ptl_index != LNET_RESERVED_PORTAL => {
                match self.mds.take(ni, ptl_index, match_bits, true) {
                    Some((md, m)) => {
                        let mlen = hdr.payload_length.min(m.buf.len);
                        let purpose = Purpose::SinkPut {
                            md,
                            match_bits,
                            hdr_data,
                            ack: ack_wmd,
                        };
                        let cookie = self.inbound(ni, from, hdr, mlen, purpose);
                        self.accept_put(ni, rx, m.buf.mem(mlen, m.mem.clone()), cookie);
                        Ok(())
                    }
                    None => Err("PUT matched no posted sink"),
                }
            }
            (
                BulkOp::Get { sink_len },
                LnetBody::Get {
                    ptl_index,
                    match_bits,
                    sink_length,
                    ..
                },
            ) if ptl_index != LNET_RESERVED_PORTAL => {
                match self.mds.take(ni, ptl_index, match_bits, false) {
                    Some((md, m)) => {
                        let len = m
                            .buf
                            .len
                            .min(sink_length)
                            .min(u32::try_from(sink_len).unwrap_or(u32::MAX));
                        let cookie = self.inbound(ni, from, hdr, len, Purpose::ServeGet(md));
                        let src = m.buf.mem(len, m.mem.clone());
                        self.nis[ni].lnd.reply_bulk(now, rx, src, cookie);
                        Ok(())
                    }
                    None => Err("GET matched no posted source"),
                }
            }
            (BulkOp::Put, LnetBody::Reply { dst_wmd })
                if dst_wmd.interface_cookie == self.interface_cookie
                    && self
                        .bulk_gets
                        .get(&dst_wmd.object_cookie)
                        .is_some_and(|g| g.buf.ni.0 == ni && g.dst == hdr.src_nid) =>
            {
                // The REPLY of a routed GET of ours, into its registered memory.
                let g = self
                    .take_bulk_get(dst_wmd.object_cookie)
                    .expect("checked above");
                let mlen = hdr.payload_length.min(g.buf.len);
                let cookie = self.inbound(ni, from, hdr, mlen, Purpose::GetBulk(g.id));
                self.accept_put(ni, rx, g.buf.mem(mlen, None), cookie);
                Ok(())
            }
            (BulkOp::Put, LnetBody::Reply { .. }) => Err("REPLY by rendezvous for no GET of ours"),
            _ => Err("rendezvous request for nothing we serve"),
        };
        if let Err(why) = verdict {
            // lnet_drop_message: the LND answers "nothing matched" (PUT_NAK 0, GET_DONE
            // -ENODATA).
            debug!(%from, kind = ?hdr.msg_type(), why, "dropping a rendezvous request");
            self.nis[ni].lnd.recv_done(now, rx);
            self.count_rx_drop(Some(ni), from, u64::from(hdr.payload_length));
            self.free_msg();
        }
    }

    /// Takes a PUT (or REPLY) by rendezvous into `sink`, for the inbound transfer `cookie`.
    fn accept_put(&mut self, ni: usize, rx: RxToken, sink: BulkMem, cookie: u64) {
        let now = self.now;
        if sink.len == 0 {
            // Nothing to move (kiblnd_recv: mlen 0 is PUT_NAK 0, and the PUT is done).
            self.nis[ni].lnd.recv_done(now, rx);
            self.finish_out(cookie, Ok(()));
        } else {
            self.nis[ni].lnd.accept_bulk(now, rx, sink, cookie);
        }
    }

    /// Records an inbound transfer the LND reports on with the returned cookie.
    pub(super) fn inbound(
        &mut self,
        ni: usize,
        from: Nid,
        hdr: LnetHdr,
        len: u32,
        purpose: Purpose,
    ) -> u64 {
        self.msgs.insert(OutMsg {
            len: len as usize,
            ..OutMsg::new(from, ni, hdr, purpose, self.now)
        })
    }

    /// Gives this runtime the node's large router buffers in registered memory (`table`, shared
    /// with its sibling runtimes) and the ones it lends out (`owned`: its share, as the large
    /// pool's buffers). Without them a router refuses bulk PUTs to forward (`no_bulk_buffer`).
    ///
    /// The daemon calls it again whenever the node's pool changes (NIs come and go, `set
    /// large_buffers`, `set routing 1`): a buffer this runtime has lent stays lent, whatever
    /// `owned` says. One it no longer owns is released once it is free again, never while a
    /// forward still writes into or out of it ([`LnetNode::take_released_bulk`] hands the
    /// released ones back), so that the daemon gives it to another runtime only then.
    pub fn set_bulk_buffers(&mut self, now: Instant, table: Arc<BulkBuffers>, owned: Vec<usize>) {
        self.advance(now);
        let free: std::collections::HashSet<usize> = self.large.free.iter().copied().collect();
        let keep: std::collections::HashSet<usize> = owned.iter().copied().collect();
        // Lent: taken out of the free list and not back yet (a forward holds it).
        let lent: std::collections::HashSet<usize> = self
            .large
            .mine
            .iter()
            .copied()
            .filter(|k| !free.contains(k))
            .collect();
        self.large.released.extend(
            self.large
                .free
                .iter()
                .copied()
                .filter(|k| !keep.contains(k)),
        );
        self.large.free = owned
            .iter()
            .copied()
            .filter(|k| !lent.contains(k))
            .collect();
        self.large.leaving = self
            .large
            .mine
            .iter()
            .copied()
            .filter(|k| lent.contains(k) && !keep.contains(k))
            .collect();
        self.large.mine = owned.iter().chain(&self.large.leaving).copied().collect();
        let n = owned.len() as u32;
        self.large.table = table;
        self.large.owned = n;
        // No table, no bulk forwarding at all (refused at admission): the large pool keeps the
        // count the settings gave it, as `routing show` and `export` say it.
        if !self.large.table.bufs.is_empty() {
            self.set_buffers(now, PoolClass::Large, n);
        }
    }

    /// The router buffers this runtime has let go since the last call: the ones taken back from
    /// it that were free then, and those lent then that have come back since. The daemon may give
    /// them to another runtime or retire them. Cheap when nothing is leaving.
    pub fn take_released_bulk(&mut self) -> Vec<usize> {
        if !self.large.leaving.is_empty() {
            let leaving: std::collections::HashSet<usize> =
                self.large.leaving.iter().copied().collect();
            let back: std::collections::HashSet<usize> = self
                .large
                .free
                .iter()
                .copied()
                .filter(|k| leaving.contains(k))
                .collect();
            if !back.is_empty() {
                self.large.free.retain(|k| !back.contains(k));
                self.large.leaving.retain(|k| !back.contains(k));
                self.large.mine.retain(|k| !back.contains(k));
                self.large.released.extend(back);
            }
        }
        std::mem::take(&mut self.large.released)
    }

    /// Whether router buffers taken back from this runtime are still lent (see
    /// [`LnetNode::take_released_bulk`]).
    pub fn bulk_leaving(&self) -> bool {
        !self.large.leaving.is_empty()
    }

    /// The router buffers this runtime has lent and not had back (a forward in flight holds
    /// each).
    pub fn bulk_held(&self) -> Vec<usize> {
        let free: std::collections::HashSet<usize> = self.large.free.iter().copied().collect();
        self.large
            .mine
            .iter()
            .copied()
            .filter(|k| !free.contains(k))
            .collect()
    }

    /// The registrations of router buffers made by an NI no longer in `nids` are forgotten:
    /// its fabric is gone, and an NI added later, even under the same NID, has registered
    /// nothing until the daemon says it has (a new table), so bulk PUTs to forward through it
    /// are refused before a buffer is lent ([`LnetNode::egress_has_bulk`]).
    pub(super) fn forget_bulk_registrations(&mut self, nids: &[Nid]) {
        let gone = |n: &Nid| !nids.contains(n);
        let stale = self
            .large
            .table
            .bufs
            .iter()
            .any(|v| v.iter().any(|(n, _)| gone(n)));
        if stale {
            let bufs = self
                .large
                .table
                .bufs
                .iter()
                .map(|v| v.iter().filter(|(n, _)| !gone(n)).copied().collect())
                .collect();
            let mem = self.large.table.mem.clone();
            self.large.table = Arc::new(BulkBuffers { bufs, mem });
        }
    }

    /// Whether a bulk PUT leaving by `route` can be written on from a router buffer: its
    /// egress NI, here or in a sibling runtime, has the buffers registered. The daemon lists an
    /// NI in a buffer's entry only if it registered every buffer of the table, so one entry
    /// says it (a retired buffer leaves an empty entry: the first one in use is asked).
    pub(super) fn egress_has_bulk(&self, route: &Route) -> bool {
        let Some(any) = self.large.table.bufs.iter().find(|v| !v.is_empty()) else {
            return false;
        };
        let registered = |nid: Nid| any.iter().any(|(n, _)| *n == nid);
        match *route {
            Route::Remote { ni, .. } => self.nis.get(ni).is_some_and(|n| registered(n.nid)),
            Route::Sibling(net) => self
                .node_nids
                .iter()
                .any(|&n| n.net() == net && registered(n)),
            Route::Local(_) | Route::SiblingNi => false,
        }
    }

    /// Router buffer `k` as NI `ni`'s fabric registered it, its first `len` bytes.
    pub(super) fn bulk_view(&self, k: usize, ni: usize, len: u32) -> Option<BulkBuf> {
        let r = self.large.table.view(k, self.nis.get(ni)?.nid)?;
        (u64::from(len) <= r.len && len > 0).then_some(BulkBuf {
            ni: NiIndex(ni),
            region: r.region,
            key: r.key,
            addr: r.addr,
            offset: 0,
            len,
            shared: None,
        })
    }

    /// Router buffer `k` as NI `ni`'s LND moves it: its first `len` bytes, registered with
    /// that NI's fabric, and the memory itself.
    pub(super) fn bulk_mem(&self, k: usize, ni: usize, len: u32) -> Option<BulkMem> {
        let shared = self.large.table.mem.get(k).cloned().flatten();
        Some(self.bulk_view(k, ni, len)?.mem(len, shared))
    }

    /// The LND finished a transfer into our memory (`BulkDone`).
    pub(super) fn on_rdma_done(&mut self, cookie: u64, result: Result<u32, TxError>) {
        if let (Some(m), Ok(n)) = (self.msgs.get_mut(&cookie), result) {
            m.len = n as usize;
        }
        self.finish_out(cookie, result.map(|_| ()).map_err(LnetError::Lnd));
    }
}

// ---------------------------------------------------------------------- lending large buffers
//
// A router lends its large buffers to the senders of bulk PUTs: each PUT_ACK grants one to a
// peer, which fills it by RDMA and says so with PUT_DONE; the buffer is passed on from there.
// Peers could hold them without end (a grant never filled pins a buffer until the LND timeout,
// 50 s; kernel LNet has that weakness) or fill them short (what the previous user left would
// be passed on). Three rules keep the buffers for those who use them:
// - the LND reclaims a grant not filled within its `grant_timeout` (1 s), and checks, where
//   the fabric can see writes (tcp), that a PUT_DONE's data all arrived (`rdma_short_writes`);
// - a sender whose transfer stalled or came in short gets a strike: its bulk PUTs are refused
//   (`bulk_refused`) for `grant_timeout` (at least 1 s) times 2^(strikes - 1), at most 64
//   times that; a PUT that comes in whole takes one strike away;
// - a sender that has not yet brought one bulk PUT in whole (a NID never seen, or one that
//   still has a strike) holds at most one large buffer at a time, and all such senders together at most
//   half of the pool: the other half stays for peers that have shown they fill what they are
//   lent. Their further PUTs wait (`waited_unproven`), in order of arrival.
// A buffer whose data came in on a fabric that cannot see writes (verbs) is scrubbed before
// it is lent again (`BulkScrub`), after the fabric has been handed the close of a stalled
// connection, so the grantee can no longer write into it.

/// Strikes beyond which the refusal stops doubling (2^6 = 64 grant timeouts).
const MAX_STRIKE_DOUBLINGS: u32 = 6;
impl LnetNode {
    /// Whether a large buffer whose data came in on NI `ni` must be scrubbed before it is
    /// lent again.
    pub(super) fn scrubs(&self, ni: usize) -> bool {
        match self.large.lending.scrub {
            BulkScrub::On => true,
            BulkScrub::Off => false,
            BulkScrub::Auto => self.nis.get(ni).is_none_or(|n| !n.lnd.sees_writes()),
        }
    }

    /// Whether large buffers wait to be scrubbed ([`LnetNode::scrub_bulk`]).
    pub fn has_bulk_to_scrub(&self) -> bool {
        !self.large.lending.dirty.is_empty()
    }

    /// Scrubs large buffers done with (their granted bytes zeroed), up to about `budget`
    /// bytes, and gives them back to the pool, where messages waiting for one take them. The
    /// loop calls this once it has handed the fabric the actions queued so far (the close of
    /// a connection whose grant was reclaimed comes before its buffer is cleared and lent
    /// again). Counted in `routing show` (`scrubbed`, `scrubbed_bytes`).
    pub fn scrub_bulk(&mut self, now: Instant, budget: usize) {
        self.advance(now);
        let mut done = 0usize;
        while done < budget {
            let Some((k, len, mem)) = self.large.lending.dirty.pop_front() else {
                break;
            };
            let cleared = mem.map(|m| {
                m.with(|b| {
                    let n = (len as usize).min(b.len());
                    b[..n].fill(0);
                    n
                })
            });
            match cleared {
                Some(n) => {
                    self.fwd.stats.scrubbed += 1;
                    self.fwd.stats.scrubbed_bytes += n as u64;
                    done += n.max(1);
                    self.large.free.push(k);
                    self.return_pool_credit(PoolClass::Large);
                }
                None => {
                    // Its memory was not in the table when it was released: it cannot be
                    // lent without a table that names it, so it goes back as it is (the
                    // daemon's pool hands it on or retires it: `take_released_bulk`).
                    warn!(
                        buffer = k,
                        "a large buffer to scrub had no memory in the table"
                    );
                    self.large.free.push(k);
                    self.return_pool_credit(PoolClass::Large);
                }
            }
        }
        self.process(now);
    }

    /// Whether `from`'s bulk PUTs are refused now for its strikes.
    pub(super) fn bulk_refused(&self, from: Nid) -> bool {
        self.peers
            .get(&from)
            .and_then(|p| p.bulk_refused_until)
            .is_some_and(|t| self.now < t)
    }

    /// `from` brought a bulk PUT in whole: proven, its strikes cleared; its PUTs waiting in
    /// the unproven share may go.
    pub(super) fn bulk_proven(&mut self, from: Nid) {
        if let Some(p) = self.peers.get_mut(&from) {
            let was = p.bulk_proven;
            // One whole PUT takes one strike away, not all: a sender alternating an honest
            // PUT with a burst of stalled ones keeps its strikes growing, while a peer that
            // stalled once is itself again after its next whole PUT.
            p.bulk_strikes = p.bulk_strikes.saturating_sub(1);
            p.bulk_proven = p.bulk_strikes == 0;
            if p.bulk_proven && !was {
                self.admit_unproven();
            }
        }
    }

    /// `from`'s bulk PUT arriving on NI `ni` stalled or came in short: a strike. It is
    /// unproven again, refused for a while, and its PUTs waiting in the unproven share fail.
    pub(super) fn bulk_strike(&mut self, from: Nid, ni: usize) {
        let base = self
            .nis
            .get(ni)
            .map(|n| n.lnd.grant_timeout())
            .filter(|t| !t.is_zero())
            .unwrap_or(Duration::from_secs(1))
            .max(Duration::from_secs(1));
        let now = self.now;
        let Some(p) = self.peers.get_mut(&from) else {
            return;
        };
        p.bulk_proven = false;
        p.bulk_strikes = p.bulk_strikes.saturating_add(1);
        let doublings = (p.bulk_strikes - 1).min(MAX_STRIKE_DOUBLINGS);
        let until = now.saturating_add(base * (1u64 << doublings));
        p.bulk_refused_until = Some(until);
        debug!(peer = %from, strikes = p.bulk_strikes, "bulk PUTs from this peer refused for a while");
        let theirs: Vec<FwdKey> = self
            .large
            .lending
            .unproven_wait
            .iter()
            .copied()
            .filter(|&k| self.fwd.held.get(k.0).is_some_and(|f| f.from == from))
            .collect();
        self.large
            .lending
            .unproven_wait
            .retain(|k| !theirs.contains(k));
        for k in theirs {
            self.forward_done(k, Err(FwdDrop::BulkRefused));
        }
    }

    /// The most large buffers bulk PUTs of unproven senders may hold at once: half the pool
    /// (at least one).
    fn unproven_cap(&self) -> u32 {
        let n = self.fwd.pools.0[PoolClass::Large.index()].nbuffers;
        (n / 2).max(1)
    }

    /// Whether held message `key` may go on to take a buffer of its pool: any message but a
    /// bulk PUT of a sender not yet proven; such a PUT only while its sender holds no other
    /// large buffer and the unproven share has room, else it waits (`waited_unproven`).
    pub(super) fn admit_bulk(&mut self, key: FwdKey) -> bool {
        let Some(f) = self.fwd.held.get(key.0) else {
            return true;
        };
        if !matches!(f.kind, FwdKind::Bulk { unproven: false }) {
            return true;
        }
        let from = f.from;
        let peer = self.peers.get(&from);
        if peer.is_some_and(|p| p.bulk_proven) {
            return true;
        }
        let held = peer.map_or(0, |p| p.bulk_held);
        if held == 0 && self.large.lending.unproven_held < self.unproven_cap() {
            self.large.lending.unproven_held += 1;
            if let Some(p) = self.peers.get_mut(&from) {
                p.bulk_held += 1;
            }
            self.fwd.held.get_mut(key.0).expect("live").kind = FwdKind::Bulk { unproven: true };
            return true;
        }
        self.large.lending.unproven_wait.push_back(key);
        self.fwd.stats.waited_unproven += 1;
        false
    }

    /// A bulk PUT admitted under the unproven share is done: its room goes to the next that
    /// may take it.
    pub(super) fn release_unproven(&mut self, from: Nid) {
        self.large.lending.unproven_held = self.large.lending.unproven_held.saturating_sub(1);
        if let Some(p) = self.peers.get_mut(&from) {
            p.bulk_held = p.bulk_held.saturating_sub(1);
        }
        self.admit_unproven();
    }

    /// Lets the waiting bulk PUTs of unproven senders go, oldest first, as far as the share
    /// and each sender's one buffer allow (those of a sender proven since go at once).
    fn admit_unproven(&mut self) {
        let mut i = 0;
        while i < self.large.lending.unproven_wait.len() {
            let key = self.large.lending.unproven_wait[i];
            let Some(f) = self.fwd.held.get(key.0) else {
                self.large.lending.unproven_wait.remove(i);
                continue;
            };
            let peer = self.peers.get(&f.from);
            let proven = peer.is_some_and(|p| p.bulk_proven);
            let room = peer.map_or(0, |p| p.bulk_held) == 0
                && self.large.lending.unproven_held < self.unproven_cap();
            if proven || room {
                self.large.lending.unproven_wait.remove(i);
                // Passes the gate now (proven, or takes the room just checked).
                self.take_router_buffer(key);
            } else {
                i += 1;
            }
        }
    }
}
