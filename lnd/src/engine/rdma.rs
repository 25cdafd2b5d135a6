//! Bulk data by RDMA rendezvous (o2iblnd_cb.c: kiblnd_send's rendezvous branch, kiblnd_recv for
//! PUT_REQ / GET_REQ, kiblnd_reply, kiblnd_init_rdma, kiblnd_handle_completion).
//!
//! - **PUT** (or a REPLY) from registered memory: we send PUT_REQ; the sink answers PUT_ACK with
//!   its buffer's descriptor (or PUT_NAK); we write our data into that buffer and send PUT_DONE
//!   right behind the write on the same connection, which the fabric delivers only once the data
//!   is in place. We write only what the descriptor advertises (a smaller sink truncates); a
//!   descriptor larger than our data fails this one PUT with PUT_DONE -EPROTO.
//! - **GET** into registered memory: we send GET_REQ carrying our sink's descriptor; the target
//!   writes its data there and sends GET_DONE with the length (or -ENODATA if nothing matched).
//! - The sink side of both: a peer's PUT_REQ / GET_REQ reaches LNet as
//!   [`LndEvent::BulkRequest`], and LNet answers it once (`accept_put_rdma`, `reply_get_rdma`,
//!   `refuse_rdma`, or `recv_done` for "nothing matched").
//!
//! Credits (reference 2.4, kiblnd_handle_rx): PUT_REQ and GET_REQ take a credit and a reserved
//! credit; every answer travels without a credit. The slot that held a PUT_REQ we accepted is
//! reposted without returning a credit (it is where PUT_DONE lands) and PUT_DONE's slot with
//! one; the slots of PUT_ACK, PUT_NAK and GET_DONE give us back a reserved credit.
//!
//! A completion is matched by (cookie, expected type, waiting, same connection), the cookie
//! being our message's generational handle, so a stale or forged one finds nothing; an
//! unmatched completion closes the connection (EPROTO), counted in `unmatched_completions`.

use super::*;

/// Where a peer may write: one registered region's key and fragments of it (o2iblnd's
/// kib_rdma_desc: one rkey for the whole descriptor). At most 257 fragments, none empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RdmaSink {
    pub key: u32,
    pub frags: Vec<RdmaFrag>,
}

impl RdmaSink {
    /// The sink `[offset, offset + len)` of a registered region, in one fragment.
    pub fn of(reg: &Registration, offset: u64, len: u32) -> RdmaSink {
        RdmaSink {
            key: reg.key(),
            frags: vec![RdmaFrag {
                nob: len,
                addr: reg.addr().wrapping_add(offset),
            }],
        }
    }

    /// Bytes advertised.
    pub fn len(&self) -> u64 {
        self.frags.iter().map(|f| u64::from(f.nob)).sum()
    }

    /// True when no byte is advertised.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// 1 to 257 fragments, none empty, none wrapping around, at most `i32::MAX` bytes in all (a
    /// completion's status carries the length).
    fn is_valid(&self) -> bool {
        !self.frags.is_empty()
            && self.frags.len() <= MAX_RDMA_FRAGS
            && self
                .frags
                .iter()
                .all(|f| f.nob > 0 && f.addr.checked_add(u64::from(f.nob)).is_some())
            && self.len() <= i32::MAX as u64
    }

    /// The fragments as write targets.
    pub(super) fn remote(&self) -> Vec<RemoteFrag> {
        self.frags
            .iter()
            .map(|f| RemoteFrag {
                key: self.key,
                addr: f.addr,
                len: f.nob,
            })
            .collect()
    }
}

use crate::fabric::{rdma_pieces, Registration};
use crate::wire::RdmaFrag;

/// Total bytes of a source; `None` if malformed (no fragment, more than 257, an empty one, one
/// wrapping around, or more than `i32::MAX` bytes).
fn source_len(src: &[LocalFrag]) -> Option<u32> {
    if src.is_empty() || src.len() > MAX_RDMA_FRAGS {
        return None;
    }
    let mut total = 0u64;
    for f in src {
        if f.len == 0 {
            return None;
        }
        f.offset.checked_add(u64::from(f.len))?;
        total += u64::from(f.len);
    }
    // Statuses carry the length as an i32.
    u32::try_from(total).ok().filter(|&n| n <= i32::MAX as u32)
}

/// The first `len` bytes of a fragment list.
fn truncate<F: Copy>(
    frags: &[F],
    len: u64,
    frag_len: impl Fn(&F) -> u32,
    cut: impl Fn(F, u32) -> F,
) -> Vec<F> {
    let mut out = Vec::with_capacity(frags.len());
    let mut left = len;
    for &f in frags {
        if left == 0 {
            break;
        }
        let n = u64::from(frag_len(&f));
        if n <= left {
            out.push(f);
            left -= n;
        } else {
            out.push(cut(f, left as u32));
            left = 0;
        }
    }
    out
}

fn truncate_local(src: &[LocalFrag], len: u64) -> Vec<LocalFrag> {
    truncate(src, len, |f| f.len, |f, n| LocalFrag { len: n, ..f })
}

fn truncate_remote(dst: &[RemoteFrag], len: u64) -> Vec<RemoteFrag> {
    truncate(dst, len, |f| f.len, |f, n| RemoteFrag { len: n, ..f })
}

/// How the source side of a rendezvous goes on once it knows the sink.
enum WritePlan {
    /// Write these fragments, then complete with `len`.
    Write {
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
        len: u32,
    },
    /// Nothing to write: complete with this status (0, or a negative errno).
    Complete(i32),
}

impl Endpoint {
    // ------------------------------------------------------------ upper layer: starting

    /// Sends a PUT (or REPLY) whose `hdr.payload_length` bytes are the registered fragments
    /// `src`, by rendezvous (PUT_REQ): for payloads over 3976 bytes, or whenever the data is in
    /// registered memory. The regions must stay registered and unchanged until
    /// [`LndEvent::SendDone`] with `cookie`, which comes exactly once unless this returns an
    /// error: `Ok` once the data is written into the peer's sink (or the peer wanted none of it:
    /// PUT_NAK 0), `Err(TxError::Rdma(errno))` if the peer refused or advertised more than we
    /// hold.
    pub fn send_put_rdma(
        &mut self,
        now: Instant,
        peer: Nid,
        hdr: LnetHdr,
        src: Vec<LocalFrag>,
        cookie: u64,
    ) -> Result<(), SendError> {
        self.advance(now);
        if source_len(&src) != Some(hdr.payload_length) {
            return Err(SendError::BadBulk);
        }
        self.send_rendezvous(peer, TxBody::PutReq { hdr, src }, cookie)
    }

    /// Sends a GET (`hdr`) whose REPLY the peer writes into `sink` (GET_REQ carrying the sink's
    /// descriptor). The outcome is [`LndEvent::BulkDone`] with `cookie`, exactly once unless
    /// this returns an error: `Ok(bytes)` as the peer's GET_DONE says, `Err(TxError::Rdma(-61))`
    /// (ENODATA) if its GET matched nothing. `sink` must stay registered until then.
    pub fn send_get_rdma(
        &mut self,
        now: Instant,
        peer: Nid,
        hdr: LnetHdr,
        sink: RdmaSink,
        cookie: u64,
    ) -> Result<(), SendError> {
        self.advance(now);
        if !sink.is_valid() {
            return Err(SendError::BadBulk);
        }
        self.send_rendezvous(peer, TxBody::GetReq { hdr, sink }, cookie)
    }

    /// Queues a rendezvous request (`body`: PUT_REQ or GET_REQ) for `peer`; once sent it waits
    /// for the peer's answer (PUT_ACK / PUT_NAK, GET_DONE) to end.
    fn send_rendezvous(&mut self, peer: Nid, body: TxBody, cookie: u64) -> Result<(), SendError> {
        let p = self.peer_for_send(peer)?;
        let key = self.new_tx(p, body, Some(cookie));
        self.txs.get_mut(key).expect("live tx").waiting = true;
        self.launch_tx(key);
        Ok(())
    }

    /// The checks `send` makes of a destination; the peer's slot.
    pub(super) fn peer_for_send(&mut self, peer: Nid) -> Result<PeerIdx, SendError> {
        if self.shutting_down {
            return Err(SendError::Shutdown);
        }
        if peer.is_any() || peer.net() != self.cfg.nid.net() {
            return Err(SendError::BadPeer(peer));
        }
        self.peer_idx(peer).ok_or(SendError::PeerTableFull(peer))
    }

    // ------------------------------------------------------------ upper layer: answering

    /// Answers a peer's PUT_REQ (`rx` of an [`LndEvent::BulkRequest`] with [`BulkOp::Put`]):
    /// the peer writes into `sink` (PUT_ACK). The outcome is [`LndEvent::BulkDone`] with
    /// `cookie`, exactly once: `Ok(bytes)` when its PUT_DONE arrives. A malformed sink is
    /// answered with PUT_NAK -EPROTO and fails at once; a request that can no longer be answered
    /// (its connection closed) fails with `ConnAborted`.
    pub fn accept_put_rdma(&mut self, now: Instant, rx: RxToken, sink: RdmaSink, cookie: u64) {
        self.advance(now);
        let Some(req) = self.pending(rx, false) else {
            return self.rdma_done_now(rx, cookie, Err(TxError::ConnAborted));
        };
        if !sink.is_valid() {
            self.refuse_pending(rx, req, -EPROTO);
            return self.rdma_done_now(rx, cookie, Err(TxError::Rdma(-EPROTO)));
        }
        // The request's slot is where PUT_DONE will land: reposted without a credit.
        self.actions.push_back(FabricAction::PostRecv {
            conn: rx.conn_id(),
            slot: rx.slot16(),
        });
        let p = self.conn(rx.conn_id()).expect("pending implies live").peer;
        let body = TxBody::PutAck {
            src_cookie: req.cookie,
            sink,
        };
        let key = self.new_tx(p, body, Some(cookie));
        self.txs.get_mut(key).expect("live tx").waiting = true;
        self.queue_on_conn(key, rx.conn_id());
        self.check_sends(rx.conn_id(), false);
    }

    /// Answers a peer's GET_REQ (`rx` of an [`LndEvent::BulkRequest`] with [`BulkOp::Get`]):
    /// the registered fragments `src` (possibly none, for an empty REPLY) are written into the
    /// peer's sink and GET_DONE follows (kiblnd_reply). The outcome is [`LndEvent::SendDone`]
    /// with `cookie`, exactly once: `Err(TxError::Rdma(-EPROTO))` when `src` is malformed or
    /// larger than the sink (GET_DONE carries the error, nothing is written).
    pub fn reply_get_rdma(&mut self, now: Instant, rx: RxToken, src: Vec<LocalFrag>, cookie: u64) {
        self.advance(now);
        let Some(req) = self.pending(rx, true) else {
            return self.send_done_now(rx, cookie, Err(TxError::ConnAborted));
        };
        // GET_REQ's slot goes back with its credit at once (kiblnd_recv).
        self.repost(rx, Repost::PeerCredit);
        let plan = if !req.sink.is_valid() {
            // An empty or wrapping fragment in the peer's descriptor: nothing is written.
            self.stats.rdma_bad_descs += 1;
            WritePlan::Complete(-EPROTO)
        } else if src.is_empty() {
            WritePlan::Complete(0)
        } else if let Some(len) = source_len(&src) {
            if u64::from(len) > req.sink.len() {
                // The sink is smaller than the REPLY: LNet already cut the REPLY to the GET's
                // sink length, so the peer's descriptor disagrees with its own header.
                self.stats.rdma_bad_sinks += 1;
                WritePlan::Complete(-EPROTO)
            } else {
                let remote = truncate_remote(&req.sink.remote(), u64::from(len));
                self.plan_write(rx.conn_id(), src, remote, len)
            }
        } else {
            WritePlan::Complete(-EPROTO)
        };
        self.post_plan(
            rx.conn_id(),
            plan,
            KibMsgType::GetDone,
            req.cookie,
            Some(cookie),
        );
    }

    /// Answers a peer's rendezvous request without a transfer: PUT_NAK or GET_DONE carrying
    /// `-errno` (use [`Endpoint::recv_done`] for "nothing matched"). That one message fails at
    /// its sender; the connection stays.
    pub fn refuse_rdma(&mut self, now: Instant, rx: RxToken, errno: i32) {
        self.advance(now);
        let Some(c) = self.established_mut(rx.conn_id()) else {
            return;
        };
        if let Some(req) = Self::take_pending(c, rx.slot16()) {
            // A Linux errno is small and positive; anything else is sent as EPROTO.
            let errno = if (1..4096).contains(&errno) {
                errno
            } else {
                EPROTO
            };
            self.refuse_pending(rx, req, -errno);
        }
    }

    // ------------------------------------------------------------ helpers for the answers

    pub(super) fn take_pending(c: &mut Conn, slot: u16) -> Option<PendingRdma> {
        let i = c.rdma_rx.iter().position(|r| r.slot == slot)?;
        Some(c.rdma_rx.swap_remove(i))
    }

    /// The pending request behind `rx` if its connection is up and it is of the kind asked.
    fn pending(&mut self, rx: RxToken, get: bool) -> Option<PendingRdma> {
        let c = self.established_mut(rx.conn_id())?;
        let i = c
            .rdma_rx
            .iter()
            .position(|r| r.slot == rx.slot16() && r.get == get)?;
        Some(c.rdma_rx.swap_remove(i))
    }

    /// PUT_NAK / GET_DONE with `status` for `req`, its slot reposted with its credit.
    pub(super) fn refuse_pending(&mut self, rx: RxToken, req: PendingRdma, status: i32) {
        self.stats.rdma_refused += 1;
        self.repost(rx, Repost::PeerCredit);
        let kind = if req.get {
            KibMsgType::GetDone
        } else {
            KibMsgType::PutNak
        };
        self.post_plan(
            rx.conn_id(),
            WritePlan::Complete(status),
            kind,
            req.cookie,
            None,
        );
    }

    fn repost(&mut self, rx: RxToken, how: Repost) {
        let Some(c) = self.conn_mut(rx.conn_id()) else {
            return;
        };
        match how {
            Repost::PeerCredit => c.outstanding = c.outstanding.saturating_add(1),
            Repost::Reserved => c.reserved = c.reserved.saturating_add(1),
        }
        self.actions.push_back(FabricAction::PostRecv {
            conn: rx.conn_id(),
            slot: rx.slot16(),
        });
    }

    fn rdma_done_now(&mut self, rx: RxToken, cookie: u64, result: Result<u32, TxError>) {
        let peer = self.rx_peer(rx);
        self.events.push_back(LndEvent::BulkDone {
            cookie,
            peer,
            result,
        });
    }

    fn send_done_now(&mut self, rx: RxToken, cookie: u64, result: Result<(), TxError>) {
        let peer = self.rx_peer(rx);
        self.events.push_back(LndEvent::SendDone {
            cookie,
            peer,
            result,
            returned: Vec::new(),
        });
    }

    fn rx_peer(&self, rx: RxToken) -> Nid {
        self.conn(rx.conn_id())
            .and_then(|c| self.peers.get(c.peer))
            .map_or(Nid::ANY, |p| p.nid)
    }

    /// What to write for a source of `len` bytes onto `remote` (already cut to `len`), within
    /// the fragments the connection allows (kiblnd_init_rdma: -EMSGSIZE beyond).
    fn plan_write(
        &mut self,
        conn: ConnId,
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
        len: u32,
    ) -> WritePlan {
        let max = self.conn(conn).map_or(0, |c| usize::from(c.max_frags));
        if rdma_pieces(&local, &remote).count() > max.max(1) {
            self.stats.rdma_bad_sinks += 1;
            return WritePlan::Complete(-EMSGSIZE);
        }
        WritePlan::Write { local, remote, len }
    }

    /// Queues the write (if any) and the completion `kind` for the peer's `peer_cookie`, in that
    /// order on `conn`'s no-credit queue; `cookie` (LNet's) rides on the completion.
    fn post_plan(
        &mut self,
        conn: ConnId,
        plan: WritePlan,
        kind: KibMsgType,
        peer_cookie: u64,
        cookie: Option<u64>,
    ) {
        let Some(p) = self.conn(conn).map(|c| c.peer) else {
            return;
        };
        let status = match plan {
            WritePlan::Write { local, remote, len } => {
                let key = self.new_tx(p, TxBody::Write { local, remote }, None);
                self.queue_on_conn(key, conn);
                len as i32
            }
            WritePlan::Complete(status) => status,
        };
        let done = Completion {
            cookie: peer_cookie,
            status,
        };
        let key = self.new_tx(p, TxBody::Completion { kind, done }, cookie);
        self.txs.get_mut(key).expect("live tx").status = status;
        self.queue_on_conn(key, conn);
        self.check_sends(conn, false);
    }

    // ------------------------------------------------------------ what arrives

    /// A peer's PUT_REQ or GET_REQ: held for LNet (kiblnd_handle_rx -> lnet_parse with rdma_req).
    pub(super) fn on_rdma_request(
        &mut self,
        conn: ConnId,
        slot: u16,
        hdr: LnetHdr,
        cookie: u64,
        sink: Option<RdmaSink>,
    ) {
        let Some(c) = self.conn_mut(conn) else {
            return;
        };
        if c.rdma_rx.iter().any(|r| r.slot == slot) {
            // A slot we never reposted delivered again: the fabric broke its contract, and
            // answering would mix two requests up.
            self.stats.bad_msgs += 1;
            error!(
                ?conn,
                slot, "a receive slot reported twice before its repost"
            );
            return self.close_conn(conn, Some(DownReason::ProtocolError));
        }
        let from = c.peer;
        let op = match &sink {
            Some(s) => BulkOp::Get { sink_len: s.len() },
            None => BulkOp::Put,
        };
        c.rdma_rx.push(PendingRdma {
            slot,
            cookie,
            get: sink.is_some(),
            sink: sink.unwrap_or_default(),
        });
        let from = self.peers[from].nid;
        self.events.push_back(LndEvent::BulkRequest {
            from,
            hdr,
            op,
            rx: RxToken::of(conn, slot),
        });
    }

    /// The live message `cookie` names, if it waits on `conn` for a completion answering a
    /// message of type `sent`.
    fn waiting_tx(&self, conn: ConnId, cookie: u64, sent: KibMsgType) -> Option<TxKey> {
        let key = TxKey::from_u64(cookie);
        let tx = self.txs.get(key)?;
        let kind = match tx.body {
            TxBody::PutReq { .. } => KibMsgType::PutReq,
            TxBody::GetReq { .. } => KibMsgType::GetReq,
            TxBody::PutAck { .. } => KibMsgType::PutAck,
            _ => return None,
        };
        let on_conn = matches!(tx.place, TxPlace::Posted(c) | TxPlace::Waiting(c) if c == conn);
        (tx.waiting && kind == sent && on_conn).then_some(key)
    }

    fn unmatched(&mut self, conn: ConnId, what: KibMsgType, cookie: u64) {
        self.stats.unmatched_completions += 1;
        let peer = self.rx_peer(RxToken::of(conn, 0));
        warn!(%peer, ?what, cookie, "rendezvous completion matching nothing we wait for, closing the connection");
        self.close_conn(conn, Some(DownReason::ProtocolError));
    }

    /// PUT_NAK, PUT_DONE or GET_DONE for one of ours (kiblnd_handle_completion).
    pub(super) fn on_completion(
        &mut self,
        conn: ConnId,
        slot: u16,
        got: KibMsgType,
        done: Completion,
    ) {
        let (sent, repost) = match got {
            KibMsgType::PutNak => (KibMsgType::PutReq, Repost::Reserved),
            KibMsgType::PutDone => (KibMsgType::PutAck, Repost::PeerCredit),
            _ => (KibMsgType::GetReq, Repost::Reserved),
        };
        let Some(key) = self.waiting_tx(conn, done.cookie, sent) else {
            return self.unmatched(conn, got, done.cookie);
        };
        // A completion claiming more bytes than our sink holds is a lie (o2iblnd ignores
        // PUT_DONE's count and asserts on GET_DONE's): the transfer fails, the peer is cut off.
        let advertised = match &self.txs.get(key).expect("matched").body {
            TxBody::PutAck { sink, .. } | TxBody::GetReq { sink, .. } => sink.len(),
            _ => u64::MAX,
        };
        if done.status >= 0 && done.status as u64 > advertised {
            self.stats.rdma_bad_descs += 1;
            warn!(
                ?conn,
                status = done.status,
                advertised,
                "completion claims more than our sink holds, closing the connection"
            );
            let tx = self.txs.get_mut(key).expect("matched");
            tx.waiting = false;
            tx.status = -EPROTO;
            self.finish_tx(key, Ok(()));
            return self.close_conn(conn, Some(DownReason::ProtocolError));
        }
        self.repost(RxToken::of(conn, slot), repost);
        if got == KibMsgType::PutNak && done.status != 0 {
            debug!(?conn, status = done.status, "PUT_NAK");
        }
        let tx = self.txs.get_mut(key).expect("matched");
        // Data that did not all arrive is no transfer (the tcp fabric sees every write): a
        // sink lent before, a router buffer above all, would otherwise be passed on with its
        // previous user's bytes where the peer wrote none. PUT_DONE accounts for the whole
        // sink we advertised (the source writes all of it: kiblnd_init_rdma), GET_DONE for
        // the bytes its status says.
        let owed = match got {
            KibMsgType::PutDone if done.status >= 0 => advertised,
            KibMsgType::GetDone if done.status >= 0 => done.status as u64,
            _ => 0,
        };
        if self.fabric_sees_writes && tx.covered < owed {
            self.stats.rdma_short_writes += 1;
            warn!(
                ?conn,
                ?got,
                owed,
                written = tx.covered,
                "rendezvous completion whose data did not all arrive, closing the connection"
            );
            tx.waiting = false;
            tx.status = -EPROTO;
            self.finish_tx(key, Ok(()));
            return self.close_conn(conn, Some(DownReason::ProtocolError));
        }
        tx.waiting = false;
        tx.status = done.status;
        if matches!(tx.place, TxPlace::Waiting(_)) {
            self.finish_tx(key, Ok(()));
        }
        // Otherwise its own send completion, still to come, finishes it.
    }

    /// The fabric saw the peer write the first `prefix` bytes of grant `id` (see
    /// [`FabricEvent::WritesCovered`]); kept with the message until its completion.
    pub fn handle_writes_covered(&mut self, now: Instant, conn: ConnId, id: WrId, prefix: u64) {
        self.advance(now);
        let key = TxKey::from_u64(id.0);
        if let Some(tx) = self.txs.get_mut(key) {
            let ours = matches!(tx.place, TxPlace::Posted(c) | TxPlace::Waiting(c) if c == conn);
            if ours && matches!(tx.body, TxBody::PutAck { .. } | TxBody::GetReq { .. }) {
                tx.covered = tx.covered.max(prefix);
            }
        }
    }

    /// A grant outlived `grant_timeout` without its completion: the transfer fails
    /// (`GrantExpired`) and the memory is taken back. `finish_tx` revokes the grant, which a
    /// fabric that sees writes enforces from its next frame on (a later write costs the peer
    /// its connection); on one that cannot, the connection is closed, so that its queue pair
    /// is flushed and no late write lands in memory the upper layer reuses.
    pub(super) fn on_grant_deadline(&mut self, key: TxKey) {
        let Some(tx) = self.txs.get_mut(key) else {
            return;
        };
        tx.grant_timer = None;
        let (TxPlace::Posted(conn) | TxPlace::Waiting(conn)) = tx.place else {
            return;
        };
        if !tx.waiting || !matches!(tx.body, TxBody::PutAck { .. } | TxBody::GetReq { .. }) {
            return;
        }
        self.stats.grants_reclaimed += 1;
        let peer = self.peers[tx.peer].nid;
        debug!(%peer, ?conn, written = tx.covered, "reclaiming a grant the peer did not fill in time");
        tx.waiting = false;
        self.finish_tx(key, Err(TxError::GrantExpired));
        if !self.fabric_sees_writes {
            self.close_conn(conn, Some(DownReason::ProtocolError));
        }
    }

    /// PUT_ACK for one of our PUT_REQs: write into the sink, then PUT_DONE (the PUT_ACK branch
    /// of kiblnd_handle_rx, kiblnd_init_rdma).
    pub(super) fn on_put_ack(
        &mut self,
        conn: ConnId,
        slot: u16,
        src_cookie: u64,
        dst_cookie: u64,
        sink: RdmaSink,
    ) {
        let Some(key) = self.waiting_tx(conn, src_cookie, KibMsgType::PutReq) else {
            return self.unmatched(conn, KibMsgType::PutAck, src_cookie);
        };
        if !sink.is_valid() {
            // Parsing bounds the fragment count; an empty or wrapping fragment is malformed too.
            self.stats.rdma_bad_descs += 1;
            let tx = self.txs.get_mut(key).expect("matched");
            tx.waiting = false;
            tx.status = -EPROTO;
            self.finish_tx(key, Ok(()));
            warn!(
                ?conn,
                "PUT_ACK with a malformed descriptor, closing the connection"
            );
            return self.close_conn(conn, Some(DownReason::ProtocolError));
        }
        self.repost(RxToken::of(conn, slot), Repost::Reserved);
        // The PUT_REQ is answered: its LNet cookie moves to the PUT_DONE that ends the PUT.
        let tx = self.txs.get_mut(key).expect("matched");
        tx.waiting = false;
        let cookie = tx.cookie.take();
        let src = match &mut tx.body {
            TxBody::PutReq { src, .. } => std::mem::take(src),
            _ => Vec::new(),
        };
        if matches!(tx.place, TxPlace::Waiting(_)) {
            self.finish_tx(key, Ok(()));
        }
        let src_len = source_len(&src).map_or(0, u64::from);
        let sink_len = sink.len();
        let plan = if sink_len > src_len {
            // kiblnd_init_rdma runs out of source: this PUT fails, the connection stays.
            self.stats.rdma_bad_sinks += 1;
            debug!(
                ?conn,
                sink_len, src_len, "PUT_ACK advertises more than the PUT holds"
            );
            WritePlan::Complete(-EPROTO)
        } else {
            // A smaller sink is the sink truncating: write what it advertises.
            let local = truncate_local(&src, sink_len);
            self.plan_write(conn, local, sink.remote(), sink_len as u32)
        };
        self.post_plan(conn, plan, KibMsgType::PutDone, dst_cookie, cookie);
    }
}

/// How a receive slot goes back (kiblnd_post_rx's credit kinds).
#[derive(Copy, Clone)]
enum Repost {
    /// Returns a credit to the peer (IBLND_POSTRX_PEER_CREDIT).
    PeerCredit,
    /// Gives us back a reserved credit for another request (IBLND_POSTRX_RSRVD_CREDIT).
    Reserved,
}
