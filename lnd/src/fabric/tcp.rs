//! The `tcp` fabric: reliable-connection queue-pair semantics emulated over TCP sockets, driven by
//! io_uring. It runs anywhere (no RDMA device), so real processes can talk over loopback or a
//! network namespace with the same engine that drives verbs.
//!
//! One [`TcpFabric`] serves one NI's event loop: single-threaded, run to completion. The driver
//! drains [`Endpoint::poll_action`] into [`TcpFabric::apply`], then calls [`TcpFabric::poll`], which
//! submits the queued io_uring work, waits (bounded), reaps completions and feeds the endpoint the
//! matching `handle_*` calls. [`turn`] / [`run_endpoint`] are that loop, with the clock read
//! (CLOCK_MONOTONIC through [`MonotonicClock`]) done only there.
//!
//! # Frames
//!
//! The byte stream of a connection is a sequence of length-prefixed frames,
//! `[u32 len LE][u8 kind][body]`: CONNREQ, CONNACK, REJECT (private data), MSG (one o2iblnd
//! message), DISCONNECT, and RDMA_WRITE reserved. See [`frame`] for the exact format and limits.
//! A garbage or truncated stream closes that connection only, and is counted in [`TcpStats`].
//!
//! # How each fabric operation maps
//!
//! | engine action / input         | tcp fabric                                                                 |
//! |-------------------------------|----------------------------------------------------------------------------|
//! | `Connect`                     | `socket()`, TCP_NODELAY, TCP_USER_TIMEOUT, io_uring connect to `resolver(nid)`, then a CONNREQ frame |
//! | `handle_connect_request`      | the first frame on an accepted socket, which must be a CONNREQ              |
//! | `Accept`                      | CONNACK frame; the passive `handle_established` when it is written          |
//! | `Reject`                      | REJECT frame, then the socket closes                                        |
//! | `handle_established` (active) | CONNACK frame read (its private data passed on)                             |
//! | `handle_connect_failed`       | `Unreachable`: no address, ECONNREFUSED, ETIMEDOUT, EOF/RST before a reply; `Rejected(private)`: REJECT frame; `Error`: other errors, bad frames |
//! | `PostRecv`                    | the slot is marked free; the next MSG frame lands in the lowest free slot   |
//! | `Send`                        | MSG frame appended to the connection's write queue                         |
//! | `handle_send_complete`        | `Success` when the whole frame is written to the socket; `RetryExceeded` on ETIMEDOUT (TCP_USER_TIMEOUT); `Error` on another socket error (the first failed send), `Flushed` for those queued behind it or posted on a closing connection |
//! | `Disconnect`                  | DISCONNECT frame after what is queued, then shutdown(WR)                    |
//! | `handle_disconnected`         | DISCONNECT frame read, EOF or RST, a socket error, or (after our own `Disconnect`) the peer's DISCONNECT/EOF |
//! | `Destroy`                     | cancel the socket's io_uring work, shutdown, close once the kernel let go   |
//!
//! # Semantics, and where they differ from RC
//!
//! - **Receive slots and back-pressure.** MSG frames are parsed out of one receive buffer per
//!   connection and handed to the engine in order, each into the lowest posted slot. When a
//!   complete MSG frame finds no posted slot, parsing stops and no further read is posted on that
//!   socket until a `PostRecv`: the kernel's socket buffer and TCP flow control then hold the
//!   sender back. That is the RNR-free back-pressure of this fabric (RC would fail the sender with
//!   an RNR error). With a peer that respects credits it never happens: credits bound what may be
//!   in flight to the receive slots posted. While a connection is stalled that way, an EOF or RST
//!   behind the stalled frames is seen only once the engine reposts a slot.
//! - **Send completion.** `Success` means "fully written to the local socket", not "placed in the
//!   peer's receive queue" as on RC. A message written just before the peer died completes
//!   `Success` and is lost; the engine's own deadlines and LNet's end-to-end checks cover that, as
//!   they must for a router crash on RDMA too.
//! - **Retry horizon.** TCP_USER_TIMEOUT ([`TcpConfig::user_timeout`], default the LND timeout,
//!   50 s) is the "retry exceeded" of this fabric: data unacknowledged that long fails the
//!   connection with ETIMEDOUT, completing the send `RetryExceeded`.
//! - **Dead processes are seen at once.** A process that exits or crashes has its sockets closed
//!   by the kernel: the peer reads EOF (or RST) immediately and reports `handle_disconnected`
//!   without waiting for any timeout (the lesson of 3FS #426: a fast out-of-band signal of process
//!   death). Dropping a [`TcpFabric`] without a `Disconnect` is exactly that.
//! - **Disconnect** writes what is already queued first (frames are never cut in half), then the
//!   DISCONNECT frame, then shuts down the write side. Sends posted after it complete `Flushed`.
//! - **RDMA writes** are not emulated yet: `RdmaWrite` completes with `Error` (counted).
//! - **Bounded handshakes.** An accepted socket that does not send its CONNREQ within
//!   [`TcpConfig::handshake_timeout`] (or does not take our REJECT) is closed and counted; an
//!   active connect is bounded by the engine's connect deadline (its `Disconnect`/`Destroy`
//!   cancel the connect in flight).
//!
//! # Performance shape, and what is simplified in this first version
//!
//! Connections live in a slab; io_uring `user_data` encodes (op kind, slab key, generation), so a
//! late completion for a closed socket is recognised. Steady state allocates nothing per message
//! in the fabric: each connection has one receive buffer ([`TcpConfig::recv_buffer`]) parsed in
//! place and two write buffers that alternate (frames are appended to one while the other is being
//! written, so many frames go out per `send`); all buffers come back from the ring and are reused,
//! and buffers of closed connections return to a small pool. SQEs are batched: everything queued
//! during a turn is submitted by one `io_uring_enter`, and SQEs that do not fit in a full
//! submission queue wait in a backlog. Follow-ups, not done here:
//! - receives into a provided buffer ring (`RecvMulti` + `register_buf_ring`) instead of one
//!   single-shot recv into a per-connection buffer;
//! - registered (fixed) files and buffers, SQPOLL as an option;
//! - the engine hands each message over as a fresh `Vec` (`FabricAction::Send`), which the fabric
//!   copies into its write buffer: a pooled message buffer type would remove both;
//! - the RDMA_WRITE frame;
//! - a poll for POLLRDHUP on a stalled connection so that its peer's death is seen at once too;
//! - `accept` errors such as EMFILE re-arm at once rather than with a backoff.

pub mod frame;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;

use slab::Slab;
use tracing::{debug, trace};

use crate::engine::{Endpoint, Tunables};
use crate::fabric::{ConnId, ConnectFailure, FabricAction, PrivateData, RequestId, WcStatus, WrId};
use crate::sys::uring::{self, Completion, Ring, RingStats};
use crate::time::Instant;
use crate::wire::kib::MSG_SIZE;
use crate::wire::Nid;

use frame::{FrameError, FrameKind, HEAD_LEN, MAX_FRAME};

/// The tcp fabric's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// TCP_USER_TIMEOUT of every socket: how long written data may go unacknowledged before the
    /// connection fails (sends complete `RetryExceeded`). Default: the LND timeout (50 s).
    pub user_timeout: std::time::Duration,
    /// Bytes of each connection's receive buffer (at least two full frames; default 64 KiB).
    pub recv_buffer: usize,
    /// io_uring submission-queue entries (default 256).
    pub ring_entries: u32,
    /// How long an accepted socket may take to send its CONNREQ (or to take our REJECT) before
    /// it is closed (default 5 s, the connect deadline's floor). Active connects are bounded by
    /// the engine's connect deadline instead.
    pub handshake_timeout: std::time::Duration,
    /// How long `poll` spins on the completion queue before it sleeps in the kernel (default
    /// 50 us; zero: never spin). Spinning keeps a ping-pong's round trip near the socket's own
    /// (a sleep and wake-up costs tens of microseconds); the budget bounds the CPU it burns on an
    /// idle link to that much per loop turn.
    pub busy_poll: std::time::Duration,
}

impl Default for TcpConfig {
    fn default() -> TcpConfig {
        TcpConfig {
            user_timeout: Tunables::default().timeout.into(),
            recv_buffer: 64 * 1024,
            ring_entries: 256,
            handshake_timeout: std::time::Duration::from_secs(5),
            busy_poll: std::time::Duration::from_micros(50),
        }
    }
}

/// Counters of one tcp fabric. All only grow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpStats {
    /// Sockets accepted on the listener.
    pub accepted: u64,
    /// Accept completions that failed.
    pub accept_errors: u64,
    /// Active connects started.
    pub connects: u64,
    /// Active connects that failed before a reply (no address, refused, timed out, reset).
    pub connect_failures: u64,
    /// Connections that reached the established state (both sides count theirs).
    pub established: u64,
    /// REJECT frames sent and received.
    pub rejects_sent: u64,
    pub rejects_received: u64,
    /// MSG frames sent (queued) and received (delivered to a slot).
    pub msgs_tx: u64,
    pub msgs_rx: u64,
    /// Bytes written to and read from sockets.
    pub bytes_tx: u64,
    pub bytes_rx: u64,
    /// DISCONNECT frames received.
    pub peer_disconnects: u64,
    /// Connections whose peer closed (EOF) without a DISCONNECT frame first: a process that died
    /// or dropped its fabric.
    pub eof_without_disconnect: u64,
    /// Connections reset by the peer (ECONNRESET / EPIPE).
    pub resets: u64,
    /// Connections failed by TCP_USER_TIMEOUT (ETIMEDOUT).
    pub user_timeouts: u64,
    /// Other socket errors.
    pub socket_errors: u64,
    /// Protocol errors, by reason: each closed its connection.
    pub bad_kind: u64,
    pub bad_length: u64,
    pub unsupported_frames: u64,
    pub truncated: u64,
    pub unexpected_frames: u64,
    /// Times a complete MSG frame found no posted slot and reading stopped (back-pressure).
    pub rx_stalls: u64,
    /// MSG frames dropped because they arrived after our own Disconnect.
    pub discarded_msgs: u64,
    /// Actions naming a connection or request this fabric does not know.
    pub unknown_actions: u64,
    /// `RdmaWrite` actions refused (not emulated yet).
    pub rdma_writes_refused: u64,
    /// `Send` actions with an empty or oversized message.
    pub bad_sends: u64,
    /// Accepted sockets closed for not finishing the handshake within `handshake_timeout`.
    pub handshake_timeouts: u64,
}

impl TcpStats {
    /// All protocol errors (garbage, truncation, frames out of place).
    pub fn protocol_errors(&self) -> u64 {
        self.bad_kind
            + self.bad_length
            + self.unsupported_frames
            + self.truncated
            + self.unexpected_frames
    }

    /// Every counter under its field name (for `lnetctl net show -v`).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("accepted", self.accepted),
            ("accept_errors", self.accept_errors),
            ("connects", self.connects),
            ("connect_failures", self.connect_failures),
            ("established", self.established),
            ("rejects_sent", self.rejects_sent),
            ("rejects_received", self.rejects_received),
            ("msgs_tx", self.msgs_tx),
            ("msgs_rx", self.msgs_rx),
            ("bytes_tx", self.bytes_tx),
            ("bytes_rx", self.bytes_rx),
            ("peer_disconnects", self.peer_disconnects),
            ("eof_without_disconnect", self.eof_without_disconnect),
            ("resets", self.resets),
            ("user_timeouts", self.user_timeouts),
            ("socket_errors", self.socket_errors),
            ("bad_kind", self.bad_kind),
            ("bad_length", self.bad_length),
            ("unsupported_frames", self.unsupported_frames),
            ("truncated", self.truncated),
            ("unexpected_frames", self.unexpected_frames),
            ("rx_stalls", self.rx_stalls),
            ("discarded_msgs", self.discarded_msgs),
            ("unknown_actions", self.unknown_actions),
            ("rdma_writes_refused", self.rdma_writes_refused),
            ("bad_sends", self.bad_sends),
            ("handshake_timeouts", self.handshake_timeouts),
        ]
    }

    fn count(&mut self, e: FrameError) {
        match e {
            FrameError::BadKind(_) => self.bad_kind += 1,
            FrameError::BadLength { .. } => self.bad_length += 1,
            FrameError::Unsupported(_) => self.unsupported_frames += 1,
            FrameError::Truncated => self.truncated += 1,
            FrameError::Unexpected(_) => self.unexpected_frames += 1,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// io_uring user_data: (op kind, slab key, generation)

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum OpTag {
    Accept = 1,
    Connect = 2,
    Recv = 3,
    Send = 4,
    Cancel = 5,
    Waker = 6,
}

const GEN_MASK: u32 = (1 << 28) - 1;

fn tag(op: OpTag, key: usize, generation: u32) -> u64 {
    (op as u64) << 60 | u64::from(generation & GEN_MASK) << 32 | (key as u64 & 0xffff_ffff)
}

fn untag(t: u64) -> (Option<OpTag>, usize, u32) {
    let op = match t >> 60 {
        1 => Some(OpTag::Accept),
        2 => Some(OpTag::Connect),
        3 => Some(OpTag::Recv),
        4 => Some(OpTag::Send),
        5 => Some(OpTag::Cancel),
        6 => Some(OpTag::Waker),
        _ => None,
    };
    (op, (t & 0xffff_ffff) as usize, (t >> 32) as u32 & GEN_MASK)
}

// ---------------------------------------------------------------------------------------------
// Per-connection state

/// Receive slots: a bitmap with "take the lowest". 512 covers 2 x 255 + 2.
#[derive(Clone, Debug, Default)]
struct Slots {
    words: [u64; 8],
}

impl Slots {
    const MAX: usize = 512;

    fn post(&mut self, slot: u16) -> bool {
        let s = usize::from(slot);
        if s >= Slots::MAX {
            return false;
        }
        self.words[s / 64] |= 1 << (s % 64);
        true
    }

    fn post_first(&mut self, n: u16) {
        for s in 0..n {
            self.post(s);
        }
    }

    fn take_lowest(&mut self) -> Option<u16> {
        for (i, w) in self.words.iter_mut().enumerate() {
            if *w != 0 {
                let b = w.trailing_zeros();
                *w &= !(1 << b);
                return Some((i * 64) as u16 + b as u16);
            }
        }
        None
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Active: the connect is in flight.
    Connecting,
    /// Active: CONNREQ sent, waiting for CONNACK or REJECT.
    AwaitReply,
    /// Passive: accepted, waiting for the CONNREQ frame.
    AwaitConnReq,
    /// Passive: CONNREQ handed to the engine, waiting for its Accept or Reject.
    RequestPending,
    /// Connected (passive: CONNACK queued).
    Open,
    /// Passive: REJECT queued; the socket closes once it is written.
    Rejecting,
    /// Shut down; waiting for the engine's Destroy (if bound) and for the kernel to let go.
    Closed,
}

/// What to do when the write queue has been written up to a position.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Done {
    Send(WrId),
    /// The CONNACK is out: the passive side is established.
    Established,
    /// The DISCONNECT is out: shut down the write side.
    ShutWr,
    /// The REJECT is out: close.
    RejectSent,
}

struct Sock {
    generation: u32,
    stream: Option<TcpStream>,
    phase: Phase,
    active: bool,
    conn: Option<ConnId>,
    /// io_uring operations in flight on the socket: it is closed only when this is zero.
    ops: u32,
    destroyed: bool,
    shut: bool,
    established: bool,
    reported_down: bool,
    local_disconnect: bool,
    peer_disconnect: bool,
    rx_eof: bool,
    in_ready: bool,
    /// When it was accepted (passive sockets).
    since: Instant,
    // receive side
    rbuf: Option<Vec<u8>>,
    rstart: usize,
    rend: usize,
    recv_armed: bool,
    stalled: bool,
    slots: Slots,
    // send side
    wq: Vec<u8>,
    spare: Option<Vec<u8>>,
    w_off: usize,
    send_armed: bool,
    tx_dead: bool,
    markers: VecDeque<(u64, Done)>,
    queued: u64,
    written: u64,
}

impl Sock {
    fn live_conn(&self) -> Option<ConnId> {
        self.conn.filter(|_| !self.destroyed)
    }

    fn queue_frame(&mut self, kind: FrameKind, body: &[u8], done: Option<Done>) {
        frame::push_frame(&mut self.wq, kind, body);
        self.queued += (HEAD_LEN + body.len()) as u64;
        if let Some(d) = done {
            self.markers.push_back((self.queued, d));
        }
    }
}

/// A report decided in `apply`, delivered at the start of the next `poll`.
#[derive(Copy, Clone, Debug)]
enum Report {
    SendDone(ConnId, WrId, WcStatus),
    Disconnected(ConnId),
    ConnectFailed(ConnId, ConnectFailure),
}

type Resolver = Box<dyn Fn(Nid) -> Option<SocketAddr> + Send>;

/// The tcp fabric of one NI (see the module doc).
pub struct TcpFabric {
    /// First field, so it drops first: in-flight I/O is cancelled before the sockets close.
    ring: Ring,
    listener: TcpListener,
    local: SocketAddr,
    accept_armed: bool,
    resolver: Resolver,
    cfg: TcpConfig,
    socks: Slab<Sock>,
    next_generation: u32,
    /// When to look for accepted sockets that outstayed `handshake_timeout`.
    next_sweep: Instant,
    scratch: Vec<usize>,
    /// Engine connection index -> (its generation, socket key).
    by_conn: Vec<Option<(u32, usize)>>,
    out: VecDeque<Report>,
    ready: Vec<(usize, u32)>,
    cqes: Vec<Completion>,
    pool: Vec<Vec<u8>>,
    stats: TcpStats,
    /// The waker descriptor (see `Driver::set_waker`) and whether its poll is in flight.
    waker: Option<std::os::fd::RawFd>,
    waker_armed: bool,
    /// Message buffers of applied sends, given back to the engine (`Endpoint::recycle`).
    spare: Vec<Vec<u8>>,
}

/// Buffers of closed connections kept for reuse.
const POOL_MAX: usize = 64;

impl TcpFabric {
    /// Listens on `listen` (port 0 for an ephemeral one, see [`TcpFabric::local_addr`]);
    /// `resolver` maps a peer NID to the address its fabric listens on.
    pub fn bind(
        listen: SocketAddr,
        resolver: impl Fn(Nid) -> Option<SocketAddr> + Send + 'static,
    ) -> io::Result<TcpFabric> {
        TcpFabric::bind_with(listen, resolver, TcpConfig::default())
    }

    /// [`TcpFabric::bind`] with explicit settings.
    pub fn bind_with(
        listen: SocketAddr,
        resolver: impl Fn(Nid) -> Option<SocketAddr> + Send + 'static,
        mut cfg: TcpConfig,
    ) -> io::Result<TcpFabric> {
        cfg.recv_buffer = cfg.recv_buffer.max(2 * MAX_FRAME);
        let ring = Ring::new(cfg.ring_entries.max(8))?;
        let listener = TcpListener::bind(listen)?;
        let local = listener.local_addr()?;
        let mut f = TcpFabric {
            ring,
            listener,
            local,
            accept_armed: false,
            resolver: Box::new(resolver),
            cfg,
            socks: Slab::new(),
            next_generation: 1,
            next_sweep: Instant::ZERO,
            scratch: Vec::new(),
            by_conn: Vec::new(),
            out: VecDeque::new(),
            ready: Vec::new(),
            cqes: Vec::new(),
            pool: Vec::new(),
            waker: None,
            waker_armed: false,
            spare: Vec::new(),
            stats: TcpStats::default(),
        };
        f.arm_accept();
        Ok(f)
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters.
    pub fn stats(&self) -> &TcpStats {
        &self.stats
    }

    /// The io_uring counters.
    pub fn ring_stats(&self) -> &RingStats {
        self.ring.stats()
    }

    /// The settings.
    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }

    /// Sockets this fabric still holds (connections, pending requests, closing sockets).
    pub fn sockets(&self) -> usize {
        self.socks.len()
    }

    /// True if `poll` has work that needs no waiting (reports to deliver, parsing to resume).
    pub fn has_work(&self) -> bool {
        !self.out.is_empty() || !self.ready.is_empty()
    }

    // ------------------------------------------------------------------ engine actions

    /// Applies one engine action. I/O is only queued here; [`TcpFabric::poll`] submits it, and
    /// reports whatever `apply` decided at once (e.g. a send on a dead connection is flushed).
    pub fn apply(&mut self, now: Instant, action: FabricAction) {
        trace!(%now, ?action, "tcp fabric apply");
        match action {
            FabricAction::Connect {
                conn,
                peer,
                private,
                recv_slots,
            } => self.connect(conn, peer, private, recv_slots),
            FabricAction::Accept {
                req,
                conn,
                private,
                recv_slots,
            } => self.accept(req, conn, private, recv_slots),
            FabricAction::Reject { req, private } => self.reject(req, private),
            FabricAction::PostRecv { conn, slot } => self.post_recv(conn, slot),
            FabricAction::Send { conn, wr, bytes } => {
                self.send(conn, wr, &bytes);
                // Copied into the write buffer: back to the engine at the next poll.
                self.spare.push(bytes);
            }
            FabricAction::RdmaWrite { conn, wr, .. } => {
                self.stats.rdma_writes_refused += 1;
                if self.lookup(conn).is_some() {
                    self.out
                        .push_back(Report::SendDone(conn, wr, WcStatus::Error));
                } else {
                    self.stats.unknown_actions += 1;
                }
            }
            FabricAction::Disconnect { conn } => self.disconnect(conn),
            FabricAction::Destroy { conn } => self.destroy(conn),
        }
    }

    fn connect(&mut self, conn: ConnId, peer: Nid, private: PrivateData, recv_slots: u16) {
        self.stats.connects += 1;
        let Some(addr) = (self.resolver)(peer) else {
            debug!(%peer, "tcp fabric: no address for peer");
            self.stats.connect_failures += 1;
            return self.dead_conn(
                conn,
                Report::ConnectFailed(conn, ConnectFailure::Unreachable),
            );
        };
        let stream = match self.open_socket(addr) {
            Ok(s) => s,
            Err(e) => {
                debug!(%peer, %addr, error = %e, "tcp fabric: cannot create a socket");
                self.stats.connect_failures += 1;
                return self.dead_conn(conn, Report::ConnectFailed(conn, ConnectFailure::Error));
            }
        };
        let key = self.new_sock(Some(stream), Phase::Connecting, true, Some(conn));
        self.map(conn, key);
        let s = &mut self.socks[key];
        s.slots.post_first(recv_slots);
        s.queue_frame(FrameKind::ConnReq, private.as_bytes(), None);
        let t = tag(OpTag::Connect, key, s.generation);
        if let Some(stream) = &s.stream {
            self.ring.connect(stream.as_fd(), addr, t);
            s.ops += 1;
        }
    }

    fn accept(&mut self, req: RequestId, conn: ConnId, private: PrivateData, recv_slots: u16) {
        let Some(key) = self.request_key(req) else {
            self.stats.unknown_actions += 1;
            return self.dead_conn(conn, Report::Disconnected(conn));
        };
        self.map(conn, key);
        let s = &mut self.socks[key];
        s.conn = Some(conn);
        if s.phase != Phase::RequestPending {
            // The requester went away meanwhile.
            s.reported_down = true;
            self.out.push_back(Report::Disconnected(conn));
            return;
        }
        s.slots.post_first(recv_slots);
        s.queue_frame(
            FrameKind::ConnAck,
            private.as_bytes(),
            Some(Done::Established),
        );
        s.phase = Phase::Open;
        self.arm_send(key);
        self.make_ready(key);
    }

    fn reject(&mut self, req: RequestId, private: PrivateData) {
        let Some(key) = self.request_key(req) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let s = &mut self.socks[key];
        if s.phase == Phase::RequestPending {
            s.queue_frame(
                FrameKind::Reject,
                private.as_bytes(),
                Some(Done::RejectSent),
            );
            s.phase = Phase::Rejecting;
            self.stats.rejects_sent += 1;
            self.arm_send(key);
        }
        self.maybe_free(key);
    }

    fn post_recv(&mut self, conn: ConnId, slot: u16) {
        let Some(key) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let s = &mut self.socks[key];
        if !s.slots.post(slot) {
            self.stats.unknown_actions += 1;
            return;
        }
        if s.stalled {
            self.make_ready(key);
        }
    }

    fn send(&mut self, conn: ConnId, wr: WrId, bytes: &[u8]) {
        let Some(key) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        if bytes.is_empty() || bytes.len() > MSG_SIZE {
            self.stats.bad_sends += 1;
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Error));
            return;
        }
        let s = &mut self.socks[key];
        if s.phase != Phase::Open || s.tx_dead || s.shut || s.local_disconnect {
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Flushed));
            return;
        }
        s.queue_frame(FrameKind::Msg, bytes, Some(Done::Send(wr)));
        self.stats.msgs_tx += 1;
        self.arm_send(key);
    }

    fn disconnect(&mut self, conn: ConnId) {
        let Some(key) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let s = &mut self.socks[key];
        if s.local_disconnect {
            return;
        }
        s.local_disconnect = true;
        if s.phase == Phase::Open && !s.tx_dead && !s.shut {
            // Written after what is queued; the peer's DISCONNECT or EOF confirms.
            s.queue_frame(FrameKind::Disconnect, &[], Some(Done::ShutWr));
            let stalled = s.stalled;
            self.arm_send(key);
            if stalled {
                // Parse on (dropping MSGs) so the peer's DISCONNECT or EOF is seen.
                self.make_ready(key);
            }
            return;
        }
        self.shut(key);
        let s = &mut self.socks[key];
        if !s.reported_down {
            s.reported_down = true;
            self.out.push_back(Report::Disconnected(conn));
        }
    }

    fn destroy(&mut self, conn: ConnId) {
        let Some(key) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        if let Some(e) = self.by_conn.get_mut(conn.index as usize) {
            *e = None;
        }
        self.socks[key].destroyed = true;
        self.shut(key);
        self.maybe_free(key);
    }

    // ------------------------------------------------------------------ driving

    /// Submits queued I/O, waits up to `timeout` for a completion (`None`: without limit; no wait
    /// at all if [`TcpFabric::has_work`]), then reads the clock once with `now_fn` and feeds `ep`
    /// everything that happened. Drain `ep`'s actions into [`TcpFabric::apply`] before calling it
    /// again.
    pub fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        ep: &mut Endpoint,
        now_fn: impl Fn() -> Instant,
    ) -> io::Result<()> {
        if !self.accept_armed {
            self.arm_accept();
        }
        if let (Some(fd), false) = (self.waker, self.waker_armed) {
            self.ring.poll_readable(fd, tag(OpTag::Waker, 0, 0));
            self.waker_armed = true;
        }
        let timeout = if self.has_work() {
            Some(std::time::Duration::ZERO)
        } else {
            timeout
        };
        // Busy-poll first (bounded by `busy_poll` and by the caller's timeout): on a loaded
        // link the next completion is microseconds away, and sleeping in the kernel and being
        // woken costs more than that.
        let spin = timeout.map_or(self.cfg.busy_poll, |t| t.min(self.cfg.busy_poll));
        let mut waited = false;
        if !spin.is_zero() {
            let start = std::time::Instant::now();
            // Each round enters the kernel without waiting: the ring is set up with
            // COOP_TASKRUN, so socket completions are posted when we enter, not by an IPI.
            loop {
                self.ring.submit_and_wait(Some(std::time::Duration::ZERO))?;
                if self.ring.has_completions() || start.elapsed() >= spin {
                    break;
                }
                std::hint::spin_loop();
            }
            waited = self.ring.has_completions();
        }
        if !waited {
            let rest = timeout.map(|t| t.saturating_sub(spin));
            self.ring.submit_and_wait(rest)?;
        }
        for b in self.spare.drain(..) {
            ep.recycle(b);
        }
        let now = now_fn();
        self.flush_out(ep, now);
        self.run_ready(ep, now);
        let mut cqes = std::mem::take(&mut self.cqes);
        self.ring.reap(&mut cqes);
        for c in cqes.drain(..) {
            self.complete(c, ep, now);
        }
        self.cqes = cqes;
        self.run_ready(ep, now);
        self.sweep(now);
        Ok(())
    }

    /// Closes accepted sockets that did not finish their handshake in time (at most a few times
    /// per `handshake_timeout`, so the scan's cost does not follow the message rate).
    /// See `Driver::set_waker`.
    pub fn set_waker(&mut self, fd: std::os::fd::RawFd) {
        self.waker = Some(fd);
    }

    fn sweep(&mut self, now: Instant) {
        if now < self.next_sweep {
            return;
        }
        let limit = crate::time::Duration::from(self.cfg.handshake_timeout);
        self.next_sweep = now
            + crate::time::Duration::from_nanos(limit.as_nanos() / 4)
                .max(crate::time::Duration::from_millis(10));
        let mut stale = std::mem::take(&mut self.scratch);
        stale.extend(self.socks.iter().filter_map(|(key, s)| {
            let waiting = matches!(s.phase, Phase::AwaitConnReq | Phase::Rejecting);
            (waiting && !s.shut && now.saturating_duration_since(s.since) >= limit).then_some(key)
        }));
        for key in stale.drain(..) {
            self.stats.handshake_timeouts += 1;
            debug!(
                key,
                "tcp fabric: accepted socket did not finish its handshake"
            );
            self.shut(key);
            self.maybe_free(key);
        }
        self.scratch = stale;
    }

    fn flush_out(&mut self, ep: &mut Endpoint, now: Instant) {
        while let Some(r) = self.out.pop_front() {
            let conn = match r {
                Report::SendDone(c, ..) | Report::Disconnected(c) | Report::ConnectFailed(c, _) => {
                    c
                }
            };
            if self.lookup(conn).is_none() {
                continue; // destroyed since: nothing more is reported for it
            }
            match r {
                Report::SendDone(c, wr, st) => ep.handle_send_complete(now, c, wr, st),
                Report::Disconnected(c) => ep.handle_disconnected(now, c),
                Report::ConnectFailed(c, why) => ep.handle_connect_failed(now, c, why),
            }
        }
    }

    fn run_ready(&mut self, ep: &mut Endpoint, now: Instant) {
        let mut ready = std::mem::take(&mut self.ready);
        for (key, generation) in ready.drain(..) {
            let Some(s) = self.socks.get_mut(key) else {
                continue;
            };
            if s.generation != generation {
                continue;
            }
            s.in_ready = false;
            if s.rbuf.is_some() && !s.recv_armed {
                s.stalled = false;
                self.parse(key, ep, now);
            }
        }
        if self.ready.is_empty() {
            self.ready = ready;
        }
    }

    fn complete(&mut self, c: Completion, ep: &mut Endpoint, now: Instant) {
        let (op, key, generation) = untag(c.tag);
        if op == Some(OpTag::Accept) {
            return self.on_accept(c, now);
        }
        if op == Some(OpTag::Waker) {
            // The owner drains the waker after this poll; re-armed at the next one.
            self.waker_armed = false;
            return;
        }
        let Some(s) = self
            .socks
            .get_mut(key)
            .filter(|s| s.generation == generation)
        else {
            return;
        };
        s.ops = s.ops.saturating_sub(1);
        match op {
            Some(OpTag::Recv) => {
                s.recv_armed = false;
                s.rbuf = c.buf;
                self.on_recv(key, c.result, ep, now);
            }
            Some(OpTag::Send) => {
                s.send_armed = false;
                self.on_send(key, c.result, c.buf, ep, now);
            }
            Some(OpTag::Connect) => self.on_connect(key, c.result, ep, now),
            Some(OpTag::Cancel) | Some(OpTag::Accept) | Some(OpTag::Waker) | None => {}
        }
        self.maybe_free(key);
    }

    fn on_accept(&mut self, c: Completion, now: Instant) {
        if !c.more {
            self.accept_armed = false;
        }
        let Some(fd) = c.fd else {
            if c.result != -libc::ECANCELED {
                self.stats.accept_errors += 1;
                debug!(errno = -c.result, "tcp fabric: accept failed");
            }
            return;
        };
        self.stats.accepted += 1;
        let stream = TcpStream::from(fd);
        if let Err(e) = self.configure(&stream) {
            self.stats.socket_errors += 1;
            debug!(error = %e, "tcp fabric: cannot configure an accepted socket");
        }
        let key = self.new_sock(Some(stream), Phase::AwaitConnReq, false, None);
        self.socks[key].since = now;
        self.arm_recv(key);
    }

    fn on_connect(&mut self, key: usize, res: i32, ep: &mut Endpoint, now: Instant) {
        let s = &mut self.socks[key];
        if s.shut {
            return;
        }
        if res == 0 {
            s.phase = Phase::AwaitReply;
            self.arm_send(key);
            self.arm_recv(key);
            return;
        }
        self.stats.connect_failures += 1;
        let errno = -res;
        let why = match errno {
            libc::ECONNREFUSED
            | libc::ETIMEDOUT
            | libc::EHOSTUNREACH
            | libc::ENETUNREACH
            | libc::ECONNRESET
            | libc::EADDRNOTAVAIL => ConnectFailure::Unreachable,
            _ => ConnectFailure::Error,
        };
        debug!(errno, "tcp fabric: connect failed");
        self.broken(key, WcStatus::Flushed, why, ep, now);
    }

    fn on_recv(&mut self, key: usize, res: i32, ep: &mut Endpoint, now: Instant) {
        let s = &mut self.socks[key];
        if s.shut {
            return;
        }
        if res > 0 {
            s.rend += res as usize;
            self.stats.bytes_rx += res as u64;
            return self.parse(key, ep, now);
        }
        if res == 0 {
            s.rx_eof = true;
            if s.rstart < s.rend {
                return self.protocol_error(key, FrameError::Truncated, ep, now);
            }
            if !s.peer_disconnect {
                self.stats.eof_without_disconnect += 1;
            }
            match s.phase {
                Phase::Open => self.report_down(key, ConnectFailure::Error, ep, now),
                Phase::AwaitReply => {
                    self.broken(key, WcStatus::Flushed, ConnectFailure::Unreachable, ep, now)
                }
                Phase::Rejecting => {} // closes once the REJECT is written
                _ => self.shut(key),
            }
            return;
        }
        let errno = -res;
        if errno == libc::ECANCELED {
            return;
        }
        let status = self.count_errno(errno);
        debug!(errno, "tcp fabric: receive failed");
        self.broken(key, status, ConnectFailure::Unreachable, ep, now);
    }

    fn on_send(
        &mut self,
        key: usize,
        res: i32,
        buf: Option<Vec<u8>>,
        ep: &mut Endpoint,
        now: Instant,
    ) {
        let Some(mut buf) = buf else {
            return;
        };
        let s = &mut self.socks[key];
        if s.shut || s.tx_dead {
            buf.clear();
            s.spare = Some(buf);
            return;
        }
        if res <= 0 {
            buf.clear();
            s.spare = Some(buf);
            let errno = -res;
            if errno == libc::ECANCELED {
                return;
            }
            let status = self.count_errno(errno);
            debug!(errno, "tcp fabric: send failed");
            return self.broken(key, status, ConnectFailure::Unreachable, ep, now);
        }
        let n = res as usize;
        self.stats.bytes_tx += n as u64;
        s.written += n as u64;
        s.w_off += n;
        if s.w_off < buf.len() {
            // Short write: the rest of the same buffer.
            let t = tag(OpTag::Send, key, s.generation);
            if let Some(stream) = &s.stream {
                let off = s.w_off;
                self.ring.send(stream.as_fd(), buf, off, t);
                s.ops += 1;
                s.send_armed = true;
            }
        } else {
            buf.clear();
            s.spare = Some(buf);
            s.w_off = 0;
        }
        self.run_markers(key, ep, now);
        self.arm_send(key);
    }

    /// Acts on every marker whose bytes are all written.
    fn run_markers(&mut self, key: usize, ep: &mut Endpoint, now: Instant) {
        loop {
            let Some(s) = self.socks.get_mut(key) else {
                return;
            };
            let Some(&(pos, done)) = s.markers.front() else {
                return;
            };
            if pos > s.written {
                return;
            }
            s.markers.pop_front();
            let conn = s.live_conn();
            match done {
                Done::Send(wr) => {
                    if let Some(c) = conn {
                        ep.handle_send_complete(now, c, wr, WcStatus::Success);
                    }
                }
                Done::Established => {
                    s.established = true;
                    self.stats.established += 1;
                    if let Some(c) = conn {
                        ep.handle_established(now, c, &[]);
                    }
                }
                Done::ShutWr => {
                    if let Some(st) = &s.stream {
                        let _ = st.shutdown(Shutdown::Write);
                    }
                }
                Done::RejectSent => self.shut(key),
            }
        }
    }

    /// Parses complete frames out of the receive buffer and acts on them, then posts the next
    /// read unless a frame is stalled (see the module doc).
    fn parse(&mut self, key: usize, ep: &mut Endpoint, now: Instant) {
        loop {
            let Some(s) = self.socks.get_mut(key) else {
                return;
            };
            if s.shut {
                return;
            }
            let Some(buf) = s.rbuf.as_ref() else {
                return;
            };
            let avail = &buf[s.rstart..s.rend];
            let head = match frame::parse_head(avail) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => return self.protocol_error(key, e, ep, now),
            };
            if avail.len() < head.frame_len() {
                break;
            }
            let body = s.rstart + HEAD_LEN..s.rstart + head.frame_len();
            let next = s.rstart + head.frame_len();
            let conn = s.live_conn();
            match (s.phase, head.kind) {
                (Phase::RequestPending | Phase::Rejecting, _) => {
                    // Nothing may follow a CONNREQ before the answer: wait for the engine.
                    s.stalled = true;
                    return;
                }
                (Phase::AwaitConnReq, FrameKind::ConnReq) => {
                    s.rstart = next;
                    s.phase = Phase::RequestPending;
                    let req = RequestId(u64::from(s.generation) << 32 | key as u64);
                    ep.handle_connect_request(now, req, &buf[body]);
                }
                (Phase::AwaitReply, FrameKind::ConnAck) => {
                    s.rstart = next;
                    s.phase = Phase::Open;
                    s.established = true;
                    self.stats.established += 1;
                    if let Some(c) = conn {
                        ep.handle_established(now, c, &buf[body]);
                    }
                }
                (Phase::AwaitReply, FrameKind::Reject) => {
                    s.rstart = next;
                    s.reported_down = true;
                    let private = PrivateData::new(&buf[body]);
                    self.stats.rejects_received += 1;
                    self.shut(key);
                    if let Some(c) = conn {
                        ep.handle_connect_failed(now, c, ConnectFailure::Rejected(private));
                    }
                    return;
                }
                (Phase::Open, FrameKind::Msg) if !s.peer_disconnect => {
                    if s.local_disconnect {
                        s.rstart = next;
                        self.stats.discarded_msgs += 1;
                        continue;
                    }
                    let Some(slot) = s.slots.take_lowest() else {
                        s.stalled = true;
                        self.stats.rx_stalls += 1;
                        return;
                    };
                    s.rstart = next;
                    self.stats.msgs_rx += 1;
                    if let Some(c) = conn {
                        ep.handle_recv(now, c, slot, &buf[body]);
                    }
                }
                (Phase::Open, FrameKind::Disconnect) if !s.peer_disconnect => {
                    s.rstart = next;
                    s.peer_disconnect = true;
                    self.stats.peer_disconnects += 1;
                    self.report_down(key, ConnectFailure::Error, ep, now);
                }
                (_, kind) => {
                    return self.protocol_error(key, FrameError::Unexpected(kind), ep, now)
                }
            }
        }
        // Only an incomplete frame (or nothing) is left: compact and read on.
        let Some(s) = self.socks.get_mut(key) else {
            return;
        };
        s.stalled = false;
        if s.rstart == s.rend {
            s.rstart = 0;
            s.rend = 0;
        } else if let Some(buf) = s.rbuf.as_mut() {
            if buf.len() - s.rend < MAX_FRAME {
                buf.copy_within(s.rstart..s.rend, 0);
                s.rend -= s.rstart;
                s.rstart = 0;
            }
        }
        self.arm_recv(key);
    }

    // ------------------------------------------------------------------ failure paths

    fn count_errno(&mut self, errno: i32) -> WcStatus {
        match errno {
            libc::ETIMEDOUT => {
                self.stats.user_timeouts += 1;
                WcStatus::RetryExceeded
            }
            libc::ECONNRESET | libc::EPIPE => {
                self.stats.resets += 1;
                WcStatus::Error
            }
            _ => {
                self.stats.socket_errors += 1;
                WcStatus::Error
            }
        }
    }

    fn protocol_error(&mut self, key: usize, e: FrameError, ep: &mut Endpoint, now: Instant) {
        self.stats.count(e);
        let (phase, conn) = {
            let s = &self.socks[key];
            (s.phase, s.conn)
        };
        debug!(error = %e, ?phase, ?conn, "tcp fabric: protocol error, closing the connection");
        self.broken(key, WcStatus::Error, ConnectFailure::Error, ep, now);
    }

    /// The connection is unusable: fail its queued sends (the first with `first`, the rest
    /// flushed), shut the socket and tell the engine once.
    fn broken(
        &mut self,
        key: usize,
        first: WcStatus,
        connect_why: ConnectFailure,
        ep: &mut Endpoint,
        now: Instant,
    ) {
        let s = &mut self.socks[key];
        s.tx_dead = true;
        s.wq.clear();
        let conn = s.live_conn();
        let mut status = first;
        while let Some((_, done)) = s.markers.pop_front() {
            if let (Done::Send(wr), Some(c)) = (done, conn) {
                ep.handle_send_complete(now, c, wr, status);
                status = WcStatus::Flushed;
            }
        }
        self.shut(key);
        self.report_down(key, connect_why, ep, now);
    }

    /// Tells the engine, once, that the connection is gone (or, for an active connect before its
    /// reply, that the connect failed with `why`).
    fn report_down(&mut self, key: usize, why: ConnectFailure, ep: &mut Endpoint, now: Instant) {
        let s = &mut self.socks[key];
        if s.reported_down {
            return;
        }
        s.reported_down = true;
        let Some(conn) = s.live_conn() else {
            return;
        };
        if s.active && !s.established {
            ep.handle_connect_failed(now, conn, why);
        } else {
            ep.handle_disconnected(now, conn);
        }
    }

    /// Shuts the socket down and cancels its I/O; it is closed once the kernel lets go.
    fn shut(&mut self, key: usize) {
        let s = &mut self.socks[key];
        if s.shut {
            return;
        }
        s.shut = true;
        s.phase = Phase::Closed;
        s.stalled = false;
        if let Some(stream) = &s.stream {
            let _ = stream.shutdown(Shutdown::Both);
            if s.ops > 0 {
                self.ring
                    .cancel_fd(stream.as_fd(), tag(OpTag::Cancel, key, s.generation));
                s.ops += 1;
            }
        }
    }

    fn maybe_free(&mut self, key: usize) {
        let Some(s) = self.socks.get(key) else {
            return;
        };
        if s.ops == 0 && s.shut && (s.conn.is_none() || s.destroyed) {
            let s = self.socks.remove(key);
            for mut b in [s.rbuf, s.spare, Some(s.wq)].into_iter().flatten() {
                if self.pool.len() < POOL_MAX && b.capacity() > 0 {
                    b.clear();
                    self.pool.push(b);
                }
            }
        }
    }

    // ------------------------------------------------------------------ helpers

    fn open_socket(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let stream = TcpStream::from(uring::tcp_socket(addr)?);
        self.configure(&stream)?;
        Ok(stream)
    }

    fn configure(&self, stream: &TcpStream) -> io::Result<()> {
        stream.set_nodelay(true)?;
        uring::set_tcp_user_timeout(stream.as_fd(), self.cfg.user_timeout)
    }

    fn new_sock(
        &mut self,
        stream: Option<TcpStream>,
        phase: Phase,
        active: bool,
        conn: Option<ConnId>,
    ) -> usize {
        let generation = self.next_generation;
        self.next_generation = (self.next_generation + 1) & GEN_MASK;
        let shut = stream.is_none();
        let rbuf = if shut {
            None
        } else {
            let mut b = self.pool.pop().unwrap_or_default();
            b.resize(self.cfg.recv_buffer, 0);
            Some(b)
        };
        let spare = (!shut).then(|| self.pool.pop().unwrap_or_default());
        let wq = if shut {
            Vec::new()
        } else {
            self.pool.pop().unwrap_or_default()
        };
        self.socks.insert(Sock {
            generation,
            stream,
            phase: if shut { Phase::Closed } else { phase },
            active,
            conn,
            ops: 0,
            destroyed: false,
            shut,
            established: false,
            reported_down: false,
            local_disconnect: false,
            peer_disconnect: false,
            rx_eof: false,
            in_ready: false,
            since: Instant::ZERO,
            rbuf,
            rstart: 0,
            rend: 0,
            recv_armed: false,
            stalled: false,
            slots: Slots::default(),
            wq,
            spare,
            w_off: 0,
            send_armed: false,
            tx_dead: shut,
            markers: VecDeque::new(),
            queued: 0,
            written: 0,
        })
    }

    /// A connection that failed before it had a socket: held until its Destroy so that the
    /// report stays valid.
    fn dead_conn(&mut self, conn: ConnId, report: Report) {
        if self.lookup(conn).is_some() {
            return;
        }
        let key = self.new_sock(None, Phase::Closed, true, Some(conn));
        self.socks[key].reported_down = true;
        self.map(conn, key);
        self.out.push_back(report);
    }

    fn map(&mut self, conn: ConnId, key: usize) {
        let i = conn.index as usize;
        if self.by_conn.len() <= i {
            self.by_conn.resize(i + 1, None);
        }
        self.by_conn[i] = Some((conn.generation, key));
    }

    fn lookup(&self, conn: ConnId) -> Option<usize> {
        match self.by_conn.get(conn.index as usize) {
            Some(&Some((generation, key))) if generation == conn.generation => Some(key),
            _ => None,
        }
    }

    fn request_key(&self, req: RequestId) -> Option<usize> {
        let key = (req.0 & 0xffff_ffff) as usize;
        let generation = (req.0 >> 32) as u32;
        let s = self.socks.get(key)?;
        (s.generation == generation
            && s.conn.is_none()
            && matches!(s.phase, Phase::RequestPending | Phase::Closed))
        .then_some(key)
    }

    fn make_ready(&mut self, key: usize) {
        let s = &mut self.socks[key];
        if !s.in_ready {
            s.in_ready = true;
            self.ready.push((key, s.generation));
        }
    }

    fn arm_accept(&mut self) {
        self.ring
            .accept_multi(self.listener.as_fd(), tag(OpTag::Accept, 0, 0));
        self.accept_armed = true;
    }

    fn arm_recv(&mut self, key: usize) {
        let s = &mut self.socks[key];
        if s.recv_armed || s.shut || s.rx_eof || s.stalled || s.phase == Phase::Connecting {
            return;
        }
        let Some(stream) = &s.stream else {
            return;
        };
        let Some(buf) = s.rbuf.take() else {
            return;
        };
        if s.rend >= buf.len() {
            s.rbuf = Some(buf);
            return;
        }
        let t = tag(OpTag::Recv, key, s.generation);
        self.ring.recv(stream.as_fd(), buf, s.rend, t);
        s.recv_armed = true;
        s.ops += 1;
    }

    fn arm_send(&mut self, key: usize) {
        let s = &mut self.socks[key];
        if s.send_armed || s.tx_dead || s.shut || s.wq.is_empty() || s.phase == Phase::Connecting {
            return;
        }
        let Some(stream) = &s.stream else {
            return;
        };
        let Some(mut buf) = s.spare.take() else {
            return;
        };
        std::mem::swap(&mut buf, &mut s.wq);
        s.w_off = 0;
        let t = tag(OpTag::Send, key, s.generation);
        self.ring.send(stream.as_fd(), buf, 0, t);
        s.send_armed = true;
        s.ops += 1;
    }
}

// ---------------------------------------------------------------------------------------------
// The event loop: shared with every real fabric (crate::fabric::driver).

pub use super::driver::{run_endpoint, turn, MonotonicClock};

impl super::driver::Driver for TcpFabric {
    fn apply(&mut self, now: Instant, action: FabricAction) {
        TcpFabric::apply(self, now, action);
    }

    fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        ep: &mut Endpoint,
        now: &dyn Fn() -> Instant,
    ) -> io::Result<()> {
        TcpFabric::poll(self, timeout, ep, now)
    }

    fn set_waker(&mut self, fd: std::os::fd::RawFd) {
        TcpFabric::set_waker(self, fd);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.stats.counters()
    }
}
