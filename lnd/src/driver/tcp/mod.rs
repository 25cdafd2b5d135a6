//! The `tcp` fabric: reliable-connection queue-pair semantics emulated over TCP sockets, driven by
//! io_uring, so real processes can talk over loopback or any network with the same engine that
//! drives verbs. One [`TcpFabric`] serves one NI's event loop, single-threaded: the driver hands it
//! the engine's actions ([`Fabric::apply`]), then calls [`TcpFabric::poll`], which submits the
//! queued io_uring work, waits (bounded), reaps completions and feeds a [`FabricSink`] the
//! matching events. [`turn`] / [`run_endpoint`] are that loop; only they read the clock.
//!
//! The contract, where it differs from RC (the ordering contract of `crate::fabric` holds as is):
//! - a connection's byte stream is length-prefixed [`frame`]s; a bad stream closes that
//!   connection only, and is counted in [`TcpStats`];
//! - a send completes `Success` once written to the local socket, not once in the peer's slot;
//! - a complete MSG that finds no posted slot stops reads on that socket (TCP holds the sender
//!   back, as RNR NAKs do) and breaks the connection after [`TcpConfig::rnr_horizon`];
//! - a peer may RDMA-write only inside a grant of that connection, checked by key and bounds
//!   before a byte lands; a refused write costs the connection, and the writer sees the
//!   connection fail rather than an `Error` on the write itself;
//! - handshakes are bounded in time, count and memory, and accepting backs off when descriptors
//!   run short.
//!
//! How each operation maps, the semantics in full, the performance shape and the design choices
//! (why no provided buffer ring, what is left to do): `docs/tcp-fabric.md`.
//!
//! Layout: `config` (what is set and counted), `sockets` (binding, the poll loop, socket
//! bookkeeping), `accept` (connects and the listener's handshakes), `rx` (reads, frames parsed in
//! place), `tx` (write buffers: sends and RDMA writes), `close` (disconnect, destroy, every failure
//! path), `regions` (registered memory), `grants` and [`frame`]; the per-connection state and the
//! [`Fabric`] impl are here.

mod accept;
mod close;
mod config;
pub mod frame;
mod grants;
mod regions;
mod rx;
mod sockets;
#[cfg(test)]
mod tests;
mod tx;

pub use config::*;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};

use tracing::{debug, trace, warn};

use crate::driver::report::{Report, Resolver};
use crate::driver::uring_sock::{accept_failed, tag, untag, GEN_BITS};
use crate::driver::Doorbell;
use crate::engine::Tunables;
use crate::fabric::{
    check_rdma_write, rdma_pieces, ConnId, ConnectFailure, DisconnectReason, Fabric, FabricAction,
    FabricSink, LocalFrag, PrivateData, RegionId, Registration, Registry, RemoteFrag, RequestId,
    SharedMem, WcStatus, WrId,
};

/// Why a connection ended, in `broken` / `report_down` calls (see [`DisconnectReason`]).
const CLOSED: DisconnectReason = DisconnectReason::Closed;
const PROTOCOL: DisconnectReason = DisconnectReason::ProtocolError;
const TRANSPORT: DisconnectReason = DisconnectReason::TransportError;
use crate::handle::{Handle, HandleSlab, Tag};
use crate::sys::uring::{self, Completion, Ring, RingStats};
use crate::time::Instant;
use crate::wire::kib::MSG_SIZE;
use crate::wire::Nid;

use frame::{FrameError, FrameKind, HEAD_LEN, MAX_FRAME, WRITE_CHUNK, WRITE_HEAD_LEN};

/// The tag of [`SockId`].
#[derive(Debug)]
enum SockTag {}

impl Tag for SockTag {
    const NAME: &'static str = "sock";
}

/// A socket's handle: its slot in `TcpFabric::socks` and the generation of the socket there, so
/// a late completion, ready entry or request for a socket already freed never reaches the next
/// socket in its slot.
type SockId = Handle<SockTag>;

/// The handle in user_data of operations that are not a socket's (accept, waker): generation 0,
/// which no socket has.
const NO_SOCK: SockId = Handle::from_parts(0, 0);

coded_enum! {
    /// The kind of an io_uring operation, in the top bits of its user_data.
    enum OpTag {
        Accept = 1,
        Connect = 2,
        Recv = 3,
        Send = 4,
        Cancel = 5,
        Waker = 6,
        /// The cancel of the multishot accept when accepting pauses.
        AcceptCancel = 7,
    }
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
    /// The last frame of an RDMA write is out (`len` data bytes).
    Write(WrId, u32),
    /// An RDMA write whose local side is invalid: everything before it is out; it completes
    /// `Error` and the connection breaks (what is behind it flushes).
    Fault(WrId),
    /// The CONNACK is out: the passive side is established.
    Established,
    /// The DISCONNECT is out: shut down the write side.
    ShutWr,
    /// The REJECT is out: close.
    RejectSent,
}

struct Sock {
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
    /// In `TcpFabric::tx_pending`: frames were queued by `apply` since the last `poll`.
    tx_pending: bool,
    /// When it was accepted (passive sockets).
    since: Instant,
    /// Counted in `TcpFabric::handshakes` (accepted, handshake not finished, not shut).
    handshake: bool,
    /// The peer's address, for a socket counted in `handshakes_by_source`.
    source: Option<std::net::IpAddr>,
    /// Bytes of `rbuf` (also while it is lent to the ring): `handshake_buffer` until the
    /// connection is established, then `recv_buffer`.
    rbuf_len: usize,
    // receive side
    /// Where the peer may write now (`FabricAction::GrantWrites`), and what it wrote there.
    grants: grants::Grants,
    /// The RDMA_WRITE frame whose data is streaming into a region.
    rx_write: Option<RxWrite>,
    /// The last RDMA_WRITE frame's data came straight from the socket: the next read takes one
    /// frame's heads only, so that the next frame's data can too (see `TcpFabric::parse`).
    heads_only: bool,
    rbuf: Option<Vec<u8>>,
    rstart: usize,
    rend: usize,
    recv_armed: bool,
    stalled: bool,
    /// A MSG frame waits for a slot (the peer sent past its credits): the connection breaks
    /// at this instant unless a slot is posted first.
    overrun_deadline: Option<std::time::Instant>,
    slots: Slots,
    // send side
    wq: Vec<u8>,
    spare: Option<Vec<u8>>,
    w_off: usize,
    send_armed: bool,
    tx_dead: bool,
    /// Work not yet copied into `wq`, in posting order: non-empty only behind an RDMA write that
    /// is copied piece by piece (see `TcpFabric::fill`).
    backlog: VecDeque<Tx>,
    /// A `Done::Fault` is queued: nothing more goes into `wq`.
    faulted: bool,
    markers: VecDeque<(u64, Done)>,
    queued: u64,
    written: u64,
}

impl Sock {
    fn live_conn(&self) -> Option<ConnId> {
        self.conn.filter(|_| !self.destroyed)
    }

    /// Sends and writes may be queued (else they complete `Flushed`).
    fn can_post(&self) -> bool {
        self.phase == Phase::Open
            && !self.tx_dead
            && !self.shut
            && !self.local_disconnect
            && !self.peer_disconnect
    }

    /// Empties the backlog (the connection failed or was flushed): the work requests it held,
    /// in posting order, each to complete without being sent. Message buffers go back to
    /// `spare`; a queued DISCONNECT has no work request.
    fn drain_backlog<'a>(
        &'a mut self,
        spare: &'a mut Vec<Vec<u8>>,
    ) -> impl Iterator<Item = WrId> + 'a {
        self.backlog.drain(..).filter_map(move |tx| match tx {
            Tx::Msg(wr, bytes) => {
                spare.push(bytes);
                Some(wr)
            }
            Tx::Write(w) => Some(w.wr),
            Tx::Disconnect => None,
        })
    }

    fn queue_frame(&mut self, kind: FrameKind, body: &[u8], done: Option<Done>) {
        frame::push_frame(&mut self.wq, kind, body);
        self.queued += (HEAD_LEN + body.len()) as u64;
        if let Some(d) = done {
            self.markers.push_back((self.queued, d));
        }
    }
}

/// Posted work waiting behind an RDMA write for room in the write buffer.
#[derive(Debug)]
enum Tx {
    /// A message (the engine's buffer, given back once copied).
    Msg(WrId, Vec<u8>),
    Write(TxWrite),
    Disconnect,
}

/// An RDMA write being copied into the write buffer: a frame of at most `WRITE_CHUNK` at a time,
/// each inside one piece (where a local and a remote fragment overlap, [`rdma_pieces`]).
#[derive(Debug)]
struct TxWrite {
    wr: WrId,
    local: Vec<LocalFrag>,
    remote: Vec<RemoteFrag>,
    /// The total length; `None` for a malformed write (refused when it reaches the front).
    len: Option<u32>,
    /// Data bytes already framed; pieces done, and bytes framed of the current one.
    sent: u32,
    piece: usize,
    piece_sent: u32,
}

/// An incoming RDMA_WRITE frame's data still to place: `left` bytes at `off` in the region under
/// `key` (`discard`: dropped instead, the connection being closed by us).
#[derive(Copy, Clone, Debug)]
struct RxWrite {
    key: u32,
    off: usize,
    left: usize,
    discard: bool,
    /// Where the grant this frame lies in ends (an offset in the region, like `off`): a write
    /// is cut into frames in address order, so `grant_end - off` is what it still brings.
    grant_end: usize,
}

/// A registered region (see `impl Registry for TcpFabric`): its own bytes, or memory shared
/// with other fabrics (then `bytes` is empty).
struct Region {
    id: u64,
    addr: u64,
    bytes: Vec<u8>,
    shared: Option<SharedMem>,
}

impl Region {
    fn len(&self) -> usize {
        self.shared.as_ref().map_or(self.bytes.len(), |m| m.len())
    }

    /// Runs `f` on the bytes (under the shared memory's lock, if shared).
    fn with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match &self.shared {
            Some(m) => m.with(f),
            None => f(&mut self.bytes),
        }
    }
}

/// How far the write buffer is filled from an RDMA write's source before it is handed to the
/// socket (the rest of the write is copied as the socket takes it).
const WQ_FILL: usize = 256 * 1024;
/// RDMA_WRITE data is read from the socket straight into its region only while the write has
/// at least this much still to bring (its grant, from the frame on): for a write of one or two
/// frames the extra non-blocking reads cost more than the copy they save (measured, pooled
/// interleaved runs: 64 KiB PUTs 28% slower with every frame read straight; 1 MiB PUTs 5-10%
/// faster with this floor).
const DIRECT_MIN: usize = 2 * WRITE_CHUNK;
/// Where region addresses start (names only; a guard page separates regions).
const REGION_BASE: u64 = 0x7e00_0000_0000;
const PAGE: u64 = 4096;

/// The slice `[off, off + len)` of a buffer of `size` bytes, if it lies inside.
fn span(size: usize, off: u64, len: u64) -> Option<std::ops::Range<usize>> {
    let start = usize::try_from(off).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    (end <= size).then_some(start..end)
}

/// How a fabric turns region numbers into remote keys: a keyed permutation of u32 (a 4-round
/// Feistel network over 16-bit halves, each round a 64-bit mix of a secret), so distinct ids
/// (modulo 2^32) give distinct keys, and a peer that has seen some keys cannot compute the
/// others. A router's buffers take writes from many peers: one that saw a PUT_ACK must not be
/// able to aim at another peer's buffer (a wrong key costs it its connection, so guessing is
/// one try per connection in 2^32).
#[derive(Copy, Clone, Debug)]
struct RegionKeys([u64; 4]);

impl RegionKeys {
    /// Secrets from the kernel's random source; the clock and pid if it cannot be read.
    fn new() -> RegionKeys {
        let mut b = [0u8; 32];
        let random = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
            .is_ok();
        if !random {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let seed = t ^ u64::from(std::process::id()).rotate_left(32);
            for (i, c) in b.chunks_mut(8).enumerate() {
                c.copy_from_slice(&mix(seed.wrapping_add(i as u64)).to_le_bytes());
            }
        }
        let k = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        RegionKeys([k(0), k(1), k(2), k(3)])
    }

    /// The remote key of region number `id`.
    fn key(&self, id: u64) -> u32 {
        let (mut l, mut r) = ((id >> 16) as u16, id as u16);
        for k in self.0 {
            let f = (mix(u64::from(r) ^ k) >> 48) as u16;
            (l, r) = (r, l ^ f);
        }
        u32::from(l) << 16 | u32::from(r)
    }
}

/// splitmix64's finalizer: every input bit moves every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Where a fabric's region numbers start: differs between instances (and processes), so a peer
/// still holding a key from an earlier instance does not hit a new region.
fn region_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ u64::from(std::process::id()).rotate_left(17)) & 0xffff_ffff
}

/// Completions handed to the engine, recorded in tests (the engine ignores WrIds it does not
/// know, such as those of writes a test posts directly).
#[cfg(test)]
type WcLog = Vec<(ConnId, WrId, WcStatus)>;
#[cfg(not(test))]
type WcLog = ();

/// Puts `sock` on `list` unless its flag `listed` says it is there already (whoever takes the
/// list clears the flags), so that a pass visits each socket once.
fn enlist(listed: &mut bool, list: &mut Vec<SockId>, sock: SockId) {
    if !*listed {
        *listed = true;
        list.push(sock);
    }
}

/// Every send and write completion goes through here.
fn complete_wr(
    log: &mut WcLog,
    sink: &mut dyn FabricSink,
    now: Instant,
    conn: ConnId,
    wr: WrId,
    st: WcStatus,
) {
    #[cfg(test)]
    log.push((conn, wr, st));
    #[cfg(not(test))]
    let () = *log;
    sink.handle_send_complete(now, conn, wr, st);
}

/// Entries of the connection table a shrink keeps room for (see `TcpFabric::destroy`).
const BY_CONN_FLOOR: usize = 1024;

/// The tcp fabric of one NI (see the module doc).
pub struct TcpFabric {
    /// First field, so it drops first: in-flight I/O is cancelled before the sockets close.
    ring: Ring,
    listener: TcpListener,
    local: SocketAddr,
    accept_armed: bool,
    /// Accepting is paused until then (the descriptor limit was hit); the next pause's length.
    accept_pause: Option<std::time::Instant>,
    /// Sockets with a MSG frame waiting for a slot (`Sock::overrun_deadline`); empty as long as
    /// peers respect their credits.
    overruns: Vec<SockId>,
    accept_backoff: std::time::Duration,
    /// After a pause, accept one socket at a time until one is kept: a multishot accept would
    /// take the whole listen backlog at once, up to EMFILE, only for it to be shed.
    accept_probe: bool,
    /// The last warning about the descriptor limit, and the events not logged since.
    fd_warned: Option<std::time::Instant>,
    fd_suppressed: u64,
    /// Accepted sockets in their handshake (`Sock::handshake`).
    handshakes: usize,
    /// Sockets in their handshake, by source address (for `handshake_limit_per_source`).
    handshakes_by_source: HashMap<std::net::IpAddr, usize>,
    resolver: Resolver,
    cfg: TcpConfig,
    /// Generations in `GEN_BITS` bits (they travel in io_uring user_data).
    socks: HandleSlab<Sock, SockTag>,
    /// When to look for accepted sockets that outstayed `handshake_timeout`.
    next_sweep: Instant,
    scratch: Vec<SockId>,
    /// Engine connection index -> (the connection, its socket).
    by_conn: Vec<Option<(ConnId, SockId)>>,
    out: VecDeque<Report>,
    ready: Vec<SockId>,
    /// Sockets whose queued sends and writes `poll` hands to the ring first, so that everything
    /// applied between two polls leaves in one `send`.
    tx_pending: Vec<SockId>,
    cqes: Vec<Completion>,
    pool: Vec<Vec<u8>>,
    stats: TcpStats,
    /// Descriptors whose readiness ends a wait: the waker (`Driver::set_waker`) and what
    /// `Driver::watch` added (the rings of NIs sharing this loop's thread), each with whether
    /// its poll is in flight; a descriptor whose poll failed is -1 and no longer watched.
    watched: Vec<(std::os::fd::RawFd, bool)>,
    /// The waker fired since the owner last asked (`Driver::take_woken`).
    woken: bool,
    /// The owner's waker (one of `watched`).
    waker_fd: Option<std::os::fd::RawFd>,
    /// The owner's waker's flags, looked at while busy-polling (`Driver::set_doorbell`).
    bell: Option<Doorbell>,
    /// Message buffers of applied sends, given back to the engine (`Endpoint::recycle`).
    spare: Vec<Vec<u8>>,
    /// Registered regions by remote key; the next region number and address.
    regions: HashMap<u32, Region>,
    next_region: u64,
    /// How region numbers become remote keys (secret per instance).
    keys: RegionKeys,
    next_region_addr: u64,
    wc_log: WcLog,
}

/// Buffers of closed connections kept for reuse.
const POOL_MAX: usize = 64;

impl TcpFabric {
    /// Applies one engine action. I/O is only queued here; [`TcpFabric::poll`] submits it, and
    /// reports whatever `apply` decided at once (e.g. a send on a dead connection is flushed).
    pub fn apply(&mut self, now: Instant, action: FabricAction) {
        trace!(%now, ?action, "tcp fabric apply");
        Fabric::apply(self, now, action);
    }
}

/// Binds the listening socket, retrying for up to `retry` while the address is in use: right
/// after a crash the dead process's listening socket may linger (its io_uring's files are
/// released asynchronously), and a router restarted by systemd must come back. One warning at
/// the first failure; then a clear error. SO_REUSEADDR (std sets it) covers TIME_WAIT only.
fn bind_listener(addr: SocketAddr, retry: std::time::Duration) -> io::Result<TcpListener> {
    let start = std::time::Instant::now();
    let mut warned = false;
    loop {
        match TcpListener::bind(addr) {
            Ok(l) => {
                if warned {
                    debug!(%addr, after = ?start.elapsed(), "tcp fabric: listening after retrying");
                }
                return Ok(l);
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                if start.elapsed() >= retry {
                    if !warned {
                        return Err(e);
                    }
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{e} (still, after retrying for {retry:?})"),
                    ));
                }
                if !warned {
                    warn!(
                        %addr,
                        "tcp fabric: listen address in use; retrying for up to {retry:?} in \
                         case its holder is going away"
                    );
                    warned = true;
                }
                std::thread::sleep(BIND_RETRY_STEP.min(retry.saturating_sub(start.elapsed())));
            }
            Err(e) => return Err(e),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The event loop: shared with every real fabric (crate::driver).

pub use crate::driver::{run_endpoint, turn, MonotonicClock};

/// What each engine action means on sockets. I/O is only queued here: [`TcpFabric::poll`]
/// submits it and reports what was decided at once (e.g. a send on a dead connection is flushed).
impl Fabric for TcpFabric {
    forward_fabric_cm!(self, TcpFabric);

    fn send(&mut self, _: Instant, conn: ConnId, wr: WrId, bytes: Vec<u8>) {
        // Copied into the write buffer (unless it waits behind a write): back to the engine at
        // the next poll.
        if let Some(b) = TcpFabric::send(self, conn, wr, bytes) {
            self.spare.push(b);
        }
    }

    fn rdma_write(
        &mut self,
        _: Instant,
        conn: ConnId,
        wr: WrId,
        local: Vec<LocalFrag>,
        remote: Vec<RemoteFrag>,
    ) {
        let len = match check_rdma_write(&local, &remote) {
            Ok(n) => Some(n),
            Err(e) => {
                debug!(?conn, ?wr, error = %e, "tcp fabric: malformed RDMA write");
                None
            }
        };
        self.write(
            conn,
            TxWrite {
                wr,
                local,
                remote,
                len,
                sent: 0,
                piece: 0,
                piece_sent: 0,
            },
        )
    }

    fn grant_writes(&mut self, _: Instant, conn: ConnId, id: WrId, sink: Vec<RemoteFrag>) {
        if let Some(sock) = self.lookup(conn) {
            self.socks[sock].grants.open(id, sink);
        } else {
            self.stats.unknown_actions += 1;
        }
    }

    fn revoke_writes(&mut self, _: Instant, conn: ConnId, id: WrId) {
        // A connection already gone took its grants with it.
        if let Some(sock) = self.lookup(conn) {
            self.socks[sock].grants.revoke(id);
        }
    }
}

impl crate::driver::Driver for TcpFabric {
    forward_driver_io!(self, TcpFabric, self);

    fn registry(&mut self) -> Option<&mut dyn Registry> {
        Some(self)
    }

    /// Every write frame is checked and placed by this fabric: it reports coverage.
    fn sees_writes(&self) -> bool {
        true
    }

    fn take_woken(&mut self) -> bool {
        std::mem::take(&mut self.woken)
    }

    fn set_waker(&mut self, fd: std::os::fd::RawFd) {
        TcpFabric::set_waker(self, fd);
    }

    fn set_doorbell(&mut self, bell: Doorbell) {
        TcpFabric::set_doorbell(self, bell);
    }

    fn readiness_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(TcpFabric::readiness_fd(self))
    }

    fn watch(&mut self, fd: std::os::fd::RawFd) -> bool {
        TcpFabric::watch(self, fd);
        true
    }

    fn has_queued_work(&self) -> bool {
        self.has_work() || !self.tx_pending.is_empty() || self.ring.has_unsubmitted()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        TcpFabric::counters(self)
    }

    /// The ring failed: every socket is shut down by a plain system call (the ring can no
    /// longer close them), so that peers see the end at once (an EOF without DISCONNECT: a
    /// transport failure, not a graceful close) rather than at their keepalive horizon, and
    /// the listener stops taking connections that nobody would answer. The descriptors close
    /// when the fabric is dropped.
    fn abandon(&mut self) {
        use std::os::fd::AsFd;
        let _ = rustix::net::shutdown(self.listener.as_fd(), rustix::net::Shutdown::Both);
        for id in self.socks.handles() {
            if let Some(stream) = self.socks.get(id).and_then(|s| s.stream.as_ref()) {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
        self.accept_armed = false;
    }
}
