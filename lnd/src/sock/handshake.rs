//! Connections coming and going: the LNet acceptor's checks (reference 2.4), the HELLO as
//! listener (3.4) and as dialer (3.5), the race, incarnation and duplicate rules (3.7-3.9),
//! our dials and their backoff.

use super::*;
use crate::stream::{DialError, RecvTarget, SockOpts};
use crate::wire::lnet::LNET_PID_LUSTRE;
use crate::wire::sock::{
    acceptor_refusal, classify_acceptor, hello_head, AcceptorMagic, ConnReq, Hello,
};

impl SockEngine {
    fn new_conn(&self, active: bool, remote: SocketAddrV4, local: SocketAddrV4) -> Conn {
        let now = self.now;
        Conn {
            state: if active {
                ConnState::Dialing
            } else {
                ConnState::AwaitRequest
            },
            active,
            remote,
            local,
            peer: None,
            ctype: ConnType::Any,
            version: HelloVersion::V3,
            userspace: false,
            hs: if active {
                HsStep::HelloHead
            } else {
                HsStep::Magic
            },
            carry: Vec::new(),
            posted: false,
            mem_left: 0,
            rx: RxPhase::Header,
            held: 0,
            last_rx: now,
            hs_deadline: None,
            inflight: VecDeque::new(),
            queued_bytes: 0,
            last_tx_progress: now,
            last_keepalive: now,
            last_used: now,
            timer_at: None,
            zc_acks_sent: 0,
            zc_acks_received: 0,
        }
    }

    /// A connection at the listener (`acceptor.c:lnet_acceptor`): the port rule, then our
    /// own bound on connections not yet through their HELLO; otherwise adopt it and read the
    /// request's magic, `accept_timeout` per read.
    pub(super) fn on_incoming(
        &mut self,
        incoming: IncomingId,
        peer: SocketAddrV4,
        local: SocketAddrV4,
    ) {
        if self.shutting_down || self.cfg.accept == AcceptMode::None {
            self.stats.refused_unauthenticated_limit += 1;
            self.actions.push_back(StreamAction::Refuse { incoming });
            return;
        }
        if self.cfg.accept == AcceptMode::Secure && peer.port() > 1023 {
            // "Refusing connection from ... insecure port": nothing is read.
            self.stats.refused_insecure_port += 1;
            debug!(%peer, "socklnd: insecure port refused");
            self.actions.push_back(StreamAction::Refuse { incoming });
            return;
        }
        if self.stats.unauthenticated >= u64::from(self.cfg.max_unauthenticated) {
            self.stats.refused_unauthenticated_limit += 1;
            debug!(%peer, "socklnd: too many connections without a HELLO");
            self.actions.push_back(StreamAction::Refuse { incoming });
            return;
        }
        let mut c = self.new_conn(false, peer, local);
        c.hs_deadline = Some(self.now.saturating_add(self.cfg.accept_timeout));
        let stream = self.conns.insert(c);
        self.stats.accepts += 1;
        self.stats.unauthenticated += 1;
        self.stats.conns = self.conns.len() as u64;
        self.actions
            .push_back(StreamAction::Adopt { incoming, stream });
        self.hs_pump(stream);
        self.arm_conn(stream);
    }

    /// Bytes still needed in the carry before the handshake step can be taken.
    fn hs_need(hs: HsStep) -> usize {
        match hs {
            HsStep::Magic => 4,
            HsStep::ReqVersion(_) => 8,
            HsStep::ReqBody(_, n) => 8 + n,
            HsStep::HelloHead => 8,
            HsStep::HelloBody(h) => 8 + h.body_len(),
            HsStep::HelloIps(h, n) => 8 + h.body_len() + 4 * n as usize,
        }
    }

    pub(super) fn post_bytes(&mut self, id: StreamId, max: u32) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if c.posted || max == 0 {
            return;
        }
        c.posted = true;
        self.actions.push_back(StreamAction::Recv {
            stream: id,
            target: RecvTarget::Bytes { max },
        });
    }

    /// Handshake bytes in.
    pub(super) fn hs_data(&mut self, id: StreamId, bytes: &[u8]) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        c.posted = false;
        c.carry.extend_from_slice(bytes);
        self.hs_pump(id);
        self.arm_conn(id);
    }

    /// Takes every handshake step the carry allows, then asks for exactly the bytes the next
    /// one needs (so memory before the HELLO stays below 4 KiB: reference 10).
    fn hs_pump(&mut self, id: StreamId) {
        loop {
            let Some(c) = self.conns.get(id) else { return };
            if !c.state.handshaking() || c.state == ConnState::Dialing {
                return;
            }
            let need = Self::hs_need(c.hs);
            if c.carry.len() < need {
                let max = (need - c.carry.len()) as u32;
                self.post_bytes(id, max);
                return;
            }
            let step = c.hs;
            let active = c.active;
            let per_read = self.now.saturating_add(self.cfg.accept_timeout);
            match step {
                HsStep::Magic => {
                    let mut m = [0u8; 4];
                    m.copy_from_slice(&c.carry[..4]);
                    match classify_acceptor(m) {
                        AcceptorMagic::Acceptor { order } => {
                            self.set_hs(id, HsStep::ReqVersion(order), Some(per_read));
                        }
                        AcceptorMagic::LnetProto => {
                            // A HELLO with no request: the 16-B reply, then close (-EPROTO).
                            self.refuse_acceptor(id);
                            return;
                        }
                        AcceptorMagic::V1Socknal | AcceptorMagic::Other(_) => {
                            self.stats.bad_magic += 1;
                            self.close(id, ConnInput::ProtocolError, DownReason::ProtocolError);
                            return;
                        }
                    }
                }
                HsStep::ReqVersion(order) => {
                    let v = order.get_u32(&c.carry, 4);
                    match ConnReq::body_len(v) {
                        Some(n) => self.set_hs(id, HsStep::ReqBody(order, n), Some(per_read)),
                        None => {
                            self.refuse_acceptor(id);
                            return;
                        }
                    }
                }
                HsStep::ReqBody(order, n) => {
                    match ConnReq::parse(order, &c.carry[..8 + n]) {
                        Ok(r) if r.target == self.cfg.nid => {
                            if !self.step(id, ConnInput::RequestOk) {
                                return;
                            }
                            if let Some(c) = self.conns.get_mut(id) {
                                c.carry = Vec::new();
                            }
                            self.set_hs(id, HsStep::HelloHead, Some(per_read));
                        }
                        other => {
                            // Not our NID (or a 20-byte one we cannot be): "No matching NI".
                            debug!(?other, "socklnd: acceptor request not for us");
                            self.stats.refused_no_ni += 1;
                            self.close(id, ConnInput::Refused, DownReason::ProtocolError);
                            return;
                        }
                    }
                }
                HsStep::HelloHead => {
                    let mut h = [0u8; 8];
                    h.copy_from_slice(&c.carry[..8]);
                    match hello_head(&h) {
                        Ok(head) if head.version.is_spoken() => {
                            let d = if active {
                                c.hs_deadline
                            } else {
                                Some(per_read)
                            };
                            self.set_hs(id, HsStep::HelloBody(head), d);
                        }
                        Ok(_) | Err(crate::wire::sock::SockError::BadVersion(_)) if !active => {
                            // V1, V4 or unknown: a V3 HELLO of ctype -1 (as a 2.15 kernel
                            // answers V4), then close.
                            self.stats.refused_version += 1;
                            let me = self.cfg.nid;
                            self.refuse_hello(id, me);
                            return;
                        }
                        Ok(_) | Err(crate::wire::sock::SockError::BadVersion(_)) => {
                            // Answered in a version we do not run: -EPROTO, back off.
                            self.stats.bad_hello += 1;
                            self.active_failed(id, ConnInput::ProtocolError);
                            return;
                        }
                        Err(_) => {
                            self.stats.bad_magic += 1;
                            if active {
                                self.active_failed(id, ConnInput::ProtocolError);
                            } else {
                                self.close(id, ConnInput::ProtocolError, DownReason::ProtocolError);
                            }
                            return;
                        }
                    }
                }
                HsStep::HelloBody(head) => match Hello::parse_body(&head, &c.carry[8..need]) {
                    Ok(h) if h.nips > 0 => {
                        let d = if active {
                            c.hs_deadline
                        } else {
                            Some(per_read)
                        };
                        self.set_hs(id, HsStep::HelloIps(head, h.nips), d);
                    }
                    Ok(h) => {
                        self.hello_in(id, h);
                        return;
                    }
                    Err(e) => {
                        debug!(?e, "socklnd: bad HELLO");
                        self.stats.bad_hello += 1;
                        self.hs_bad(id, active);
                        return;
                    }
                },
                HsStep::HelloIps(head, _) => {
                    let body_end = 8 + head.body_len();
                    let ok = Hello::check_ips(&head, &c.carry[body_end..need]).is_ok();
                    match Hello::parse_body(&head, &c.carry[8..body_end]) {
                        Ok(h) if ok => {
                            self.hello_in(id, h);
                            return;
                        }
                        _ => {
                            self.stats.bad_hello += 1;
                            self.hs_bad(id, active);
                            return;
                        }
                    }
                }
            }
        }
    }

    fn hs_bad(&mut self, id: StreamId, active: bool) {
        if active {
            self.active_failed(id, ConnInput::ProtocolError);
        } else {
            self.close(id, ConnInput::ProtocolError, DownReason::ProtocolError);
        }
    }

    fn set_hs(&mut self, id: StreamId, hs: HsStep, deadline: Option<Instant>) {
        if let Some(c) = self.conns.get_mut(id) {
            c.hs = hs;
            c.hs_deadline = deadline;
        }
    }

    /// Applies the transition table; false (and the connection closed) if the state cannot
    /// take `input`.
    pub(super) fn step(&mut self, id: StreamId, input: ConnInput) -> bool {
        let Some(c) = self.conns.get_mut(id) else {
            return false;
        };
        match next_state(c.state, input) {
            Some(s) => {
                c.state = s;
                true
            }
            None => {
                warn!(
                    ?id,
                    state = c.state.name(),
                    ?input,
                    "socklnd: no such transition"
                );
                self.stats.protocol_errors += 1;
                self.close(id, ConnInput::ProtocolError, DownReason::ProtocolError);
                false
            }
        }
    }

    /// The 16-byte acceptor refusal {0xacce7100, 1, NID 0}, then close.
    fn refuse_acceptor(&mut self, id: StreamId) {
        self.stats.acceptor_refusals += 1;
        let head = acceptor_refusal().to_vec();
        self.send_raw(id, head, SendPayload::None, None);
        self.close(id, ConnInput::Refused, DownReason::ProtocolError);
    }

    /// A V3 HELLO of ctype -1 to `dst`, then close (3.4: "refuse").
    fn refuse_hello(&mut self, id: StreamId, dst: Nid) {
        let h = Hello::refusal(self.cfg.nid, dst, self.cfg.incarnation);
        if let Ok(b) = h.emit() {
            self.send_raw(id, b, SendPayload::None, None);
        }
        self.close(id, ConnInput::Refused, DownReason::ProtocolError);
    }

    /// A whole HELLO is in.
    fn hello_in(&mut self, id: StreamId, h: Hello) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        c.carry = Vec::new();
        if c.active {
            self.active_answer(id, h);
        } else {
            self.passive_hello(id, h);
        }
    }

    fn count_same(&self, remote: Ipv4Addr, local: Ipv4Addr, t: ConnType) -> u32 {
        self.conns
            .iter()
            .filter(|(_, c)| {
                c.state == ConnState::Established
                    && *c.remote.ip() == remote
                    && *c.local.ip() == local
                    && c.ctype == t
            })
            .count() as u32
    }

    fn dialing_to(&self, ip: Ipv4Addr) -> bool {
        self.conns.iter().any(|(_, c)| {
            c.active
                && matches!(c.state, ConnState::Dialing | ConnState::HelloSent)
                && *c.remote.ip() == ip
        })
    }

    /// The listener's rules on a dialer's HELLO, in the kernel's order (3.4 steps 3-8).
    fn passive_hello(&mut self, id: StreamId, h: Hello) {
        let Some(c) = self.conns.get(id) else { return };
        let (remote, local) = (c.remote, c.local);
        let me = self.cfg.nid;
        // Step 3: a dialer from a port above 1023 (only with accept=all) is a userspace peer:
        // its NID is its source address on our net, whatever the HELLO says.
        let userspace = remote.port() > 1023;
        let nid = if userspace {
            Nid::new(me.net(), u32::from(*remote.ip()))
        } else {
            h.src_nid
        };
        if nid.net() != me.net() || nid == me {
            // Another net's NID, or ours (we never dial ourselves: local delivery).
            self.stats.bad_hello += 1;
            self.close(id, ConnInput::ProtocolError, DownReason::ProtocolError);
            return;
        }
        // Step 4: my type is the inverse of the dialer's.
        let Some(peer_type) = h.conn_type() else {
            self.stats.bad_hello += 1;
            self.close(id, ConnInput::ProtocolError, DownReason::ProtocolError);
            return;
        };
        let my_type = peer_type.inverse();
        if !self.peers.contains_key(&nid) && self.peers.len() >= self.cfg.max_peers as usize {
            self.stats.refused_peer_limit += 1;
            self.refuse_hello(id, h.src_nid);
            return;
        }
        // Step 5, the race rule (3.8): the lower NID yields while I dial the same IP. Strict.
        if nid.raw() < me.raw() && self.dialing_to(*remote.ip()) {
            self.stats.refused_race += 1;
            debug!(peer = %nid, "socklnd: connection race, refused");
            self.refuse_hello(id, h.src_nid);
            return;
        }
        // Step 6, incarnation and protocol (3.7).
        let stale = self.peers.get(&nid).is_some_and(|p| {
            p.incarnation
                .is_some_and(|i| i != h.src_incarnation || p.version != Some(h.version))
        });
        if stale {
            self.stats.refused_stale += 1;
            if *remote.ip() == Ipv4Addr::from(nid.addr()) {
                // From the NID's own address: the peer restarted. Its old connections go.
                self.peer_rebooted(nid);
            } else {
                // Someone else claiming the NID: it does not get to close the real one's
                // connections (reference 11, "kill someone else's connections").
                warn!(peer = %nid, from = %remote, "socklnd: new incarnation from another address, refused");
            }
            self.refuse_hello(id, h.src_nid);
            return;
        }
        // Step 7, duplicates (3.9); loopback exempt.
        if remote.ip() != local.ip() {
            let cpp = self
                .peers
                .get(&nid)
                .map(|p| p.cpp)
                .filter(|&n| n > 0)
                .unwrap_or_else(|| self.cfg.conns_per_peer());
            let n = self.count_same(*remote.ip(), *local.ip(), my_type);
            if n >= cpp {
                self.stats.refused_duplicate += 1;
                self.refuse_hello(id, h.src_nid);
                return;
            }
        }
        // Step 8: accept, in the dialer's version.
        let reply = Hello {
            version: h.version,
            src_nid: me,
            dst_nid: h.src_nid,
            src_pid: LNET_PID_LUSTRE,
            dst_pid: 0,
            src_incarnation: self.cfg.incarnation,
            dst_incarnation: 0,
            ctype: my_type.to_wire(),
            nips: 0,
        };
        let Ok(bytes) = reply.emit() else {
            self.close(id, ConnInput::ProtocolError, DownReason::ProtocolError);
            return;
        };
        if !self.step(id, ConnInput::HelloOk) {
            return;
        }
        self.stats.unauthenticated = self.stats.unauthenticated.saturating_sub(1);
        self.send_raw(id, bytes, SendPayload::None, None);
        self.established(id, nid, my_type, &h, userspace);
    }

    /// Common to both sides once the HELLOs are through.
    fn established(&mut self, id: StreamId, nid: Nid, t: ConnType, h: &Hello, userspace: bool) {
        let now = self.now;
        let opts = self.sock_opts();
        if let Some(c) = self.conns.get_mut(id) {
            c.peer = Some(nid);
            c.ctype = t;
            c.version = h.version;
            c.userspace = userspace;
            c.hs_deadline = None;
            c.carry = Vec::new();
            c.last_rx = now;
            c.last_keepalive = now;
        }
        self.actions
            .push_back(StreamAction::Configure { stream: id, opts });
        self.stats.established += 1;
        let cpp = self.cfg.conns_per_peer();
        let p = self.peers.entry(nid).or_default();
        if p.cpp == 0 {
            p.cpp = cpp;
        }
        p.userspace |= userspace;
        if !p.conns.contains(&id) {
            p.conns.push(id);
        }
        if p.incarnation.is_none() {
            p.incarnation = Some(h.src_incarnation);
            p.version = Some(h.version);
        }
        let was_up = p.up;
        p.up = true;
        if !was_up {
            info!(peer = %nid, "socklnd peer up");
            self.events.push_back(LndEvent::PeerUp { nid });
        }
        self.rx_pump(id);
        self.drain_queue(nid);
        self.arm_conn(id);
    }

    fn sock_opts(&self) -> SockOpts {
        let c = &self.cfg;
        let keepalive = (c.keepalive_idle > 0 && c.keepalive_intvl > 0 && c.keepalive_count > 0)
            .then_some((c.keepalive_idle, c.keepalive_intvl, c.keepalive_count));
        SockOpts {
            nodelay: !c.nagle,
            // The kernel skips IP_TOS when TCP keepalive is off (reference 5.6).
            tos: c.tos.filter(|_| keepalive.is_some()),
            keepalive,
            user_timeout: Some(c.timeout),
            send_buffer: None,
            recv_buffer: None,
        }
    }

    /// Closes every connection of `nid` (a new incarnation from its address).
    fn peer_rebooted(&mut self, nid: Nid) {
        self.stats.peers_rebooted += 1;
        info!(peer = %nid, "socklnd peer rebooted: closing its connections");
        let conns: Vec<StreamId> = self
            .peers
            .get(&nid)
            .map(|p| p.conns.clone())
            .unwrap_or_default();
        for s in conns {
            self.close(s, ConnInput::Close, DownReason::Rebooted);
        }
        if let Some(p) = self.peers.get_mut(&nid) {
            p.incarnation = None;
            p.version = None;
        }
    }

    // ------------------------------------------------------------------ dialing

    /// The types a full set has (4.2): CONTROL, then BULK_IN and BULK_OUT per
    /// conns_per_peer, in the kernel's order; or conns_per_peer ANY.
    fn wanted(&self, cpp: u32) -> Vec<ConnType> {
        if !self.cfg.typed_conns {
            return vec![ConnType::Any; cpp as usize];
        }
        let mut v = vec![ConnType::Control];
        for _ in 0..cpp {
            v.push(ConnType::BulkIn);
            v.push(ConnType::BulkOut);
        }
        v
    }

    /// Dials whatever types `nid` lacks (established or under way, passive ones included),
    /// unless its backoff says not yet. The kernel does the same on every send to a peer it
    /// has dial state for (reference 4.4).
    pub(super) fn kick_peer(&mut self, nid: Nid) {
        if self.shutting_down || nid == self.cfg.nid {
            return;
        }
        let now = self.now;
        let Some(p) = self.peers.get(&nid) else {
            return;
        };
        if p.userspace {
            return;
        }
        if p.next_dial.is_some_and(|t| t > now) {
            self.arm_peer(nid);
            return;
        }
        let cpp = if p.cpp == 0 {
            self.cfg.conns_per_peer()
        } else {
            p.cpp
        };
        // 2.16 (LU-16191): after RACES_COVERED refusals in a row, one of each type will do (a
        // peer whose conns_per_peer is lower refuses the rest as duplicates).
        let want = if p.races >= RACES_COVERED { 1 } else { cpp };
        let mut have: Vec<ConnType> = p
            .conns
            .iter()
            .filter_map(|&s| self.conns.get(s))
            .filter(|c| c.state == ConnState::Established || c.active)
            .map(|c| c.ctype)
            .collect();
        let mut missing = Vec::new();
        for t in self.wanted(want) {
            match have.iter().position(|&x| x == t) {
                Some(i) => {
                    have.swap_remove(i);
                }
                None => missing.push(t),
            }
        }
        if let Some(p) = self.peers.get_mut(&nid) {
            p.cpp = cpp;
            p.next_dial = None;
        }
        for t in missing {
            self.dial(nid, t);
        }
    }

    fn dial(&mut self, nid: Nid, t: ConnType) {
        let remote = SocketAddrV4::new(Ipv4Addr::from(nid.addr()), self.cfg.accept_port);
        let local = SocketAddrV4::new(self.my_ip(), 0);
        let mut c = self.new_conn(true, remote, local);
        c.peer = Some(nid);
        c.ctype = t;
        // The kernel's TCP connect has no LND deadline; ours does (every connect ends).
        c.hs_deadline = Some(self.now.saturating_add(self.cfg.timeout));
        let stream = self.conns.insert(c);
        self.stats.connects += 1;
        self.stats.conns = self.conns.len() as u64;
        if let Some(p) = self.peers.get_mut(&nid) {
            p.conns.push(stream);
        }
        debug!(peer = %nid, ?t, "socklnd dial");
        self.actions.push_back(StreamAction::Dial {
            stream,
            local: self.my_ip(),
            ports_from: self.cfg.ports_from,
            ports_to: self.cfg.ports_to,
            remote,
        });
        self.arm_conn(stream);
    }

    /// Our dial connected: the acceptor request and our HELLO, back to back as two writes
    /// (reference 1), then the answer within `timeout`.
    pub(super) fn on_connected(&mut self, id: StreamId, local: SocketAddrV4) {
        if !self.step(id, ConnInput::Connected) {
            return;
        }
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        c.local = local;
        c.hs = HsStep::HelloHead;
        c.hs_deadline = Some(self.now.saturating_add(self.cfg.timeout));
        let (nid, t) = (c.peer.unwrap_or(Nid::ANY), c.ctype);
        let req = ConnReq::new(nid).emit().to_vec();
        let hello = Hello {
            version: HelloVersion::V3,
            src_nid: self.cfg.nid,
            dst_nid: nid,
            src_pid: LNET_PID_LUSTRE,
            dst_pid: 0,
            src_incarnation: self.cfg.incarnation,
            dst_incarnation: 0,
            ctype: t.to_wire(),
            nips: 0,
        };
        self.send_raw(id, req, SendPayload::None, None);
        if let Ok(b) = hello.emit() {
            self.send_raw(id, b, SendPayload::None, None);
        }
        self.hs_pump(id);
        self.arm_conn(id);
    }

    pub(super) fn on_dial_failed(&mut self, id: StreamId, error: DialError) {
        let Some(c) = self.conns.get(id) else { return };
        let nid = c.peer;
        self.stats.connect_failures += 1;
        debug!(?id, ?nid, %error, "socklnd dial failed");
        // The backoff first, so that the close does not redial at once.
        if let Some(nid) = nid {
            let err = match error {
                DialError::Refused => TxError::ConnectRefused,
                _ => TxError::ConnectFailed,
            };
            self.dial_failed_hard(nid, err);
        }
        self.close(id, ConnInput::Ended, DownReason::ConnectFailed);
    }

    /// An active handshake failed on our side's checks: close and back off.
    fn active_failed(&mut self, id: StreamId, input: ConnInput) {
        let nid = self.conns.get(id).and_then(|c| c.peer);
        if let Some(nid) = nid {
            self.dial_failed_hard(nid, TxError::ConnectFailed);
        }
        self.close(id, input, DownReason::ProtocolError);
    }

    /// A hard dial failure (3.9): the interval doubles from `min_reconnect` to
    /// `max_reconnect`; with no connection up, what waits for the peer fails and LNet hears
    /// it is down. Several dials of one round failing count once.
    pub(super) fn dial_failed_hard(&mut self, nid: Nid, err: TxError) {
        let now = self.now;
        let (min, max) = (self.cfg.min_reconnect, self.cfg.max_reconnect);
        // The failing connection is still listed (callers close it after): others of the
        // round still under way keep what waits (`ksocknal_connect` fails the queue only
        // with no connection and no connect in progress).
        let others = self.peers.get(&nid).map_or(0, |p| {
            p.conns
                .iter()
                .filter(|&&s| self.conns.get(s).is_some_and(|c| c.state.handshaking()))
                .count()
        });
        let Some(p) = self.peers.get_mut(&nid) else {
            return;
        };
        if p.next_dial.is_none_or(|t| t <= now) {
            p.backoff = if p.backoff.is_zero() {
                min
            } else {
                p.backoff.saturating_mul(2).min(max)
            };
            p.next_dial = Some(now.saturating_add(p.backoff));
        }
        if p.up || others > 1 {
            self.arm_peer_dial(nid);
            return;
        }
        let queued: Vec<TxId> = p.queue.drain(..).collect();
        let had = !queued.is_empty();
        for tx in queued {
            self.fail_tx(tx, err);
        }
        if had {
            self.events.push_back(LndEvent::PeerDown {
                nid,
                reason: DownReason::ConnectFailed,
            });
        }
        self.arm_peer_dial(nid);
    }

    /// The listener's answer to our HELLO (3.5).
    fn active_answer(&mut self, id: StreamId, h: Hello) {
        let Some(c) = self.conns.get(id) else { return };
        let (Some(nid), my_type) = (c.peer, c.ctype) else {
            return;
        };
        let now = self.now;
        if h.is_refusal() {
            // EALREADY (a race or a duplicate: same version) -> redial after min_reconnect,
            // unless the peer's own connections cover the type by then; EPROTO (another
            // version) -> at once. Bounded: MAX_RACES in a row end the round.
            self.stats.refusals_received += 1;
            let same = h.version == HelloVersion::V3;
            let min = self.cfg.min_reconnect;
            let Some(p) = self.peers.get_mut(&nid) else {
                self.close(id, ConnInput::Refused, DownReason::ConnectFailed);
                return;
            };
            p.races += 1;
            if p.races >= MAX_RACES {
                self.stats.race_giveups += 1;
                warn!(peer = %nid, races = p.races, "socklnd: giving up dialing after repeated refusals");
                p.races = 0;
                p.next_dial = Some(now.saturating_add(self.cfg.max_reconnect));
                let queued: Vec<TxId> = p.queue.drain(..).collect();
                for tx in queued {
                    self.fail_tx(tx, TxError::ConnectRefused);
                }
                self.close(id, ConnInput::Refused, DownReason::ConnectFailed);
                return;
            }
            let races = p.races;
            // The redial time first, so that the close does not redial at once.
            p.next_dial = Some(if same { now.saturating_add(min) } else { now });
            if races >= RACES_COVERED {
                debug!(peer = %nid, races, "socklnd: repeated races");
            }
            self.close(id, ConnInput::Refused, DownReason::ConnectFailed);
            self.arm_peer_dial(nid);
            return;
        }
        if h.src_nid != nid || h.src_pid != LNET_PID_LUSTRE {
            self.stats.identity_mismatch += 1;
            warn!(
                "socklnd: connected to {nid} at {}, but they claimed they were {}",
                c.remote, h.src_nid
            );
            self.active_failed(id, ConnInput::ProtocolError);
            return;
        }
        if h.conn_type() != Some(my_type.inverse()) {
            self.stats.bad_hello += 1;
            self.active_failed(id, ConnInput::ProtocolError);
            return;
        }
        let stale = self.peers.get(&nid).is_some_and(|p| {
            p.incarnation
                .is_some_and(|i| i != h.src_incarnation || p.version != Some(h.version))
        });
        if stale {
            // We dialed the NID's own address, so this is the peer itself restarted: its old
            // connections go, this one too, and we redial at once (ESTALE).
            self.peer_rebooted(nid);
            self.close(id, ConnInput::Close, DownReason::Rebooted);
            if let Some(p) = self.peers.get_mut(&nid) {
                p.next_dial = Some(now);
            }
            self.arm_peer_dial(nid);
            return;
        }
        let (remote, local) = (*c.remote.ip(), *c.local.ip());
        let cpp = self.peers.get(&nid).map_or(1, |p| p.cpp.max(1));
        if remote != local && self.count_same(remote, local, my_type) >= cpp {
            // The peer's own connection of this type won meanwhile.
            self.close(id, ConnInput::Close, DownReason::Closed);
            return;
        }
        if !self.step(id, ConnInput::HelloAnswered) {
            return;
        }
        // A success resets the interval (3.9); a redial already planned for a type refused
        // in this round stays, so the set completes without waiting for the next send.
        if let Some(p) = self.peers.get_mut(&nid) {
            p.backoff = Duration::ZERO;
            p.races = 0;
        }
        self.established(id, nid, my_type, &h, false);
    }

    /// Arms the peer's timer for a redial even with nothing queued (the rest of a set).
    pub(super) fn arm_peer_dial(&mut self, nid: Nid) {
        let Some(p) = self.peers.get(&nid) else {
            return;
        };
        let Some(d) = p.next_dial else { return };
        if p.timer_at.is_some_and(|t| t <= d) {
            return;
        }
        self.wheel.insert(d, Timer::Peer(nid));
        if let Some(p) = self.peers.get_mut(&nid) {
            p.timer_at = Some(d);
        }
    }

    /// A peer's timer: messages that waited `timeout` for a connection fail (5.7), a due
    /// redial starts.
    pub(super) fn peer_timeouts(&mut self, nid: Nid) {
        let now = self.now;
        let t = self.cfg.timeout;
        let mut expired = Vec::new();
        if let Some(p) = self.peers.get_mut(&nid) {
            while let Some(&k) = p.queue.front() {
                match self.txs.get(k) {
                    Some(tx) if tx.queued_at.saturating_add(t) <= now => {
                        p.queue.pop_front();
                        expired.push(k);
                    }
                    Some(_) => break,
                    None => {
                        p.queue.pop_front();
                    }
                }
            }
        }
        for k in expired {
            self.fail_tx(k, TxError::Timeout);
        }
        let due = self
            .peers
            .get(&nid)
            .is_some_and(|p| p.next_dial.is_some_and(|d| d <= now));
        if due {
            // Redial only for a set under way or messages waiting (the kernel dials only
            // when it has traffic); otherwise the backoff is over and forgotten.
            let busy = self
                .peers
                .get(&nid)
                .is_some_and(|p| !p.queue.is_empty() || !p.conns.is_empty());
            if busy {
                self.kick_peer(nid);
            }
            // Whatever kick_peer did, a past redial time is spent (no timer loop on it).
            if let Some(p) = self.peers.get_mut(&nid) {
                if p.next_dial.is_some_and(|d| d <= now) {
                    p.next_dial = None;
                }
            }
        }
        self.forget_peer_if_idle(nid);
    }
}
