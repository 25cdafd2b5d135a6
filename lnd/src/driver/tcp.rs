//! The `tcp` fabric: reliable-connection queue-pair semantics emulated over TCP sockets, driven by
//! io_uring. It runs anywhere (no RDMA device), so real processes can talk over loopback or a
//! network namespace with the same engine that drives verbs.
//!
//! One [`TcpFabric`] serves one NI's event loop: single-threaded, run to completion. The driver
//! drains [`Endpoint::poll_action`](crate::engine::Endpoint::poll_action) into [`TcpFabric::apply`], then calls [`TcpFabric::poll`], which
//! submits the queued io_uring work, waits (bounded), reaps completions and feeds the endpoint the
//! matching `handle_*` calls. [`turn`] / [`run_endpoint`] are that loop, with the clock read
//! (CLOCK_MONOTONIC through [`MonotonicClock`]) done only there.
//!
//! # Frames
//!
//! The byte stream of a connection is a sequence of length-prefixed frames,
//! `[u32 len LE][u8 kind][body]`: CONNREQ, CONNACK, REJECT (private data), MSG (one o2iblnd
//! message), DISCONNECT, and RDMA_WRITE (`[u32 rkey][u64 addr][data]`). See [`frame`] for the
//! exact format and limits.
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
//! | `RdmaWrite`                   | RDMA_WRITE frames (at most 64 KiB of data each, one or more per piece where a local and a remote fragment overlap) copied from the local regions into the same write queue, in posting order with the MSG frames |
//! | [`Registry`] (driver-side)    | `impl Registry for TcpFabric`: a buffer in a table keyed by its rkey |
//! | `handle_send_complete`        | `Success` when the whole frame (a write: its last frame) is written to the socket; `RetryExceeded` on ETIMEDOUT (TCP_USER_TIMEOUT); `Error` on another socket error (the first failed send), `Flushed` for those queued behind it or posted on a closing connection |
//! | `Disconnect`                  | DISCONNECT frame after what is queued, then shutdown(WR)                    |
//! | `handle_disconnected(why)`    | `Closed`: DISCONNECT frame read, or (after our own `Disconnect`) the peer's DISCONNECT/EOF; `ProtocolError`: a bad or unexpected frame, garbage, an RDMA write outside a granted region; `TransportError`: EOF without DISCONNECT, RST, a socket error or timeout, a write of ours refused locally |
//! | `Destroy`                     | cancel the socket's io_uring work, shutdown, close once the kernel let go   |
//!
//! # Semantics, and where they differ from RC
//!
//! - **Receive slots and back-pressure.** MSG frames are parsed out of one receive buffer per
//!   connection and handed to the engine in order, each into the lowest posted slot. When a
//!   complete MSG frame finds no posted slot, parsing stops and no further read is posted on that
//!   socket until a `PostRecv`: the kernel's socket buffer and TCP flow control then hold the
//!   sender back, as RC's RNR NAKs do while the sender retries. With a peer that respects credits
//!   it never happens: credits bound what may be in flight to the receive slots posted. If no
//!   slot is posted within `TcpConfig::rnr_horizon` (20 ms), the connection breaks as a
//!   protocol error (`credit_overruns`), as RC's does once the sender's RNR retries are spent.
//!   While a connection is stalled, an EOF or RST behind the stalled frames is seen only once the
//!   engine reposts a slot or the horizon passes.
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
//!   death), as `DisconnectReason::TransportError`: only a DISCONNECT frame is a close. Dropping a
//!   [`TcpFabric`] without a `Disconnect` is exactly that.
//! - **Disconnect** writes what is already queued first (frames are never cut in half), then the
//!   DISCONNECT frame, then shuts down the write side. Sends posted after it complete `Flushed`.
//! - **RDMA writes.** A write is a work request on the connection's send queue like a send: its
//!   data is copied from the local region into the write queue as RDMA_WRITE frames of at most
//!   64 KiB ([`frame::WRITE_CHUNK`]), at most 256 KiB ahead of the socket (the rest, and any
//!   message posted behind it, waits in a per-connection backlog in posting order, so a large
//!   write does not grow the buffers); it completes `Success` when its last frame is written, in
//!   posting order with the sends, and a MSG posted behind it is parsed by the peer only after
//!   the write's data is in place (one byte stream, parsed in order). The receiver checks the key
//!   and the bounds `[addr, addr + len)` as soon as the frame's 17-byte head is in, before a byte
//!   is written, then copies the data from its receive buffer into the region as it arrives (a
//!   frame need not fit in the receive buffer). Nothing is reported to the receiver's engine and
//!   no receive slot is used.
//!   - *Malformed or local side invalid* (see `FabricAction::RdmaWrite`: more than 257
//!     fragments a side, totals that differ, an empty fragment; or a local fragment whose region
//!     is not registered or that lies outside it; all checked before the first frame): the write completes `Error` once everything posted before
//!     it has completed, exactly as IBV_WC_LOC_PROT_ERR, nothing of it is sent, then the
//!     connection breaks: what is queued behind it completes `Flushed`, the socket is closed
//!     and the engine hears `handle_disconnected` (counted in `rdma_local_errors`).
//!   - *Grants.* A peer may write only where we told it to over that very connection: the
//!     engine opens a grant (`FabricAction::GrantWrites`: the fragments of the sink it
//!     advertises in a PUT_ACK or GET_REQ) and closes it when the transfer ends
//!     (`RevokeWrites`), and a frame that no open grant of its connection covers is refused
//!     like one under an unknown key (counted in `rdma_ungranted` too). Keys alone would let a
//!     peer that once saw a router buffer's key write into it later, while it holds another
//!     peer's data.
//!   - *Remote side invalid* (unknown or deregistered key, address below or past the region, not granted):
//!     the receiver writes nothing, counts `rdma_access_errors`, fails its own queued sends
//!     `Flushed` and closes the socket (its engine hears `handle_disconnected`). **The writer
//!     does not see `Error` for that write**, unlike IBV_WC_REM_ACCESS_ERR on RC: over TCP a
//!     write completes when its bytes are in the local socket, which is usually before the peer
//!     has parsed them (there is no per-write acknowledgement; adding one would hold every
//!     completion behind it, sends included, for a round trip). What the writer sees is the
//!     connection failing: the EOF or RST from the peer's close makes whatever it has not yet
//!     completed finish `Error` (the first) and `Flushed` (the rest), and its engine hears
//!     `handle_disconnected`. A bad write therefore never goes unnoticed: it costs the
//!     connection, as on RC; only the status lands on the first incomplete work request rather
//!     than on the write itself. Keys are a secret permutation of region numbers, per
//!     instance: a peer cannot derive one region's key from others it has seen, and another
//!     instance's keys do not hit new regions.
//!   - *Disconnects.* A write posted on a closing or broken connection completes `Flushed`. The
//!     peer's DISCONNECT frame (its DREQ) flushes every send and write not yet completed, in
//!     posting order, and drops what was not handed to the socket yet; the peer's EOF without a
//!     DISCONNECT (a dead process) fails them as an RST does (first `Error`, rest `Flushed`).
//!     Writes arriving after our own Disconnect are read and dropped (`discarded_writes`).
//!   - `local` must not change until the write completes (it is read while the frames are
//!     built); a region deregistered in the middle of a write fails the rest of it like a
//!     local error (some of its data may already be in place, as on RC).
//! - **Bounded handshakes.** An accepted socket that does not send its CONNREQ within
//!   [`TcpConfig::handshake_timeout`] (or does not take our REJECT) is closed and counted; an
//!   active connect is bounded by the engine's connect deadline (its `Disconnect`/`Destroy`
//!   cancel the connect in flight).
//! - **Cheap unauthenticated sockets.** Until the engine accepts it, an accepted socket holds a
//!   receive buffer of [`TcpConfig::handshake_buffer`] bytes (512: a CONNREQ frame is at most 69
//!   and nothing may follow it before our answer; any other frame head is refused at once) and
//!   no write buffer; it gets the full [`TcpConfig::recv_buffer`] once established, and the
//!   small buffer is freed, never pooled. At most [`TcpConfig::handshake_limit`] sockets may be
//!   in their handshake at once: the kernel's further accepts are closed at once and counted
//!   (`handshakes_refused`). Active sockets (our own connects, one per peer) get the full buffer
//!   from the start: a CONNACK may be followed at once by messages.
//! - **The descriptor limit.** A socket accepted when fewer than [`TcpConfig::fd_reserve`]
//!   descriptors would remain under RLIMIT_NOFILE is closed at once (`accepts_shed`), so the
//!   rest of the process (the daemon's control socket) always has some; that, and EMFILE,
//!   ENFILE, ENOBUFS or ENOMEM from accept, pauses accepting for [`ACCEPT_BACKOFF_MIN`],
//!   doubling up to [`ACCEPT_BACKOFF_MAX`] while it keeps happening (`accept_backoffs`), with
//!   one warning per 10 s at most. Connections wait in the listen backlog meanwhile, and after a
//!   pause sockets are accepted one at a time until one is kept (a multishot accept would take
//!   the whole backlog up to EMFILE, only to shed it). Re-arming the accept at once failed
//!   ~700,000 times a second and held a core.
//! - **Restart after a crash.** [`TcpFabric::bind_with`] retries a listen address in use for up
//!   to [`TcpConfig::bind_retry`] (10 s): the listening socket of a process killed a moment ago
//!   lingers while its io_uring's files are released asynchronously.
//!
//! # Performance shape, and what is simplified
//!
//! Connections live in a [`HandleSlab`]; io_uring `user_data` encodes (op kind, the socket's
//! handle: slab key and generation), so a late completion for a closed socket is recognised, never
//! applied to the socket that reuses its slot. Steady state allocates nothing and takes no lock
//! per message in the fabric: each connection has one receive buffer
//! ([`TcpConfig::recv_buffer`]) parsed in place and two write buffers that alternate (frames are
//! appended to one while the other is being written, so many frames go out per `send`); all
//! buffers come back from the ring and are reused, and buffers of closed connections return to a
//! small pool. The engine's message buffers are copied into the write buffer and handed back at
//! the next `poll` (`Endpoint::recycle`), so the engine reuses them too. RDMA writes are copied
//! from the region into the same write buffers (at most 256 KiB ahead of the socket) and, at the
//! receiver, from the receive buffer into the region: one copy each side besides the kernel's,
//! no allocation, one hash lookup of the rkey per frame. SQEs are batched: everything queued
//! during a turn is submitted by one `io_uring_enter`, and SQEs that do not fit in a full
//! submission queue wait in a backlog. Sends and writes applied between two polls only queue
//! their frames; the connection's `send` is armed when `poll` starts, so they all leave
//! in one `send` (arming it at the first frame made the frames behind it wait for that send's
//! completion, one more round through the kernel: lnet_perf --put-rate at peer_credits 8 went
//! from ~290k to ~470k PUT/s on 2 vCPUs with this). `poll` busy-polls the completion queue for
//! [`TcpConfig::busy_poll`] before sleeping in the kernel, and a waker descriptor
//! ([`TcpFabric::set_waker`]) cuts a sleep short.
//!
//! **Why receives do not use a provided buffer ring** (`RecvMulti` + `register_buf_ring`), after
//! weighing it for this version:
//! - *Back-pressure.* This fabric's flow control is "no read is posted on a connection whose
//!   next MSG finds no posted slot": the kernel's socket buffer and TCP's window then hold the
//!   sender back. A multishot receive keeps pulling bytes out of the socket into shared ring
//!   buffers whatever the engine's slots, so one stalled connection would drain the ring for all
//!   (it would have to be cancelled on every stall and re-armed on every `PostRecv`).
//! - *Frames span buffers.* A MSG frame that straddles two provided buffers has to be copied
//!   into a contiguous one before the engine can parse it, and a buffer can go back to the ring
//!   only once every frame in it is consumed: the per-connection buffer does that reassembly for
//!   free (frames are parsed in place; a partial frame is moved to the front at most once).
//! - *Nothing to win on the measured path.* With one connection per peer and many frames per
//!   recv (a 64 KiB buffer holds ~16 full MSGs or ~900 64-byte PUTs), the single-shot recv's
//!   cost is one SQE per batch of frames, and its memory is 64 KiB per connection, not per
//!   message. Provided buffers pay off with thousands of mostly idle connections (memory), which
//!   a router's handful of peers per NI is not.
//!
//! Follow-ups, not done here:
//! - provided buffer rings, for NIs with very many connections (see above for what they must
//!   solve first);
//! - registered (fixed) files and buffers, SQPOLL as an option; `SendZc` for RDMA_WRITE data
//!   (the region's pages straight to the socket instead of a copy into the write buffer; to a
//!   local socket the kernel copies it anyway, see the kernel's msg_zerocopy document);
//! - a per-write acknowledgement frame, if an exact `Error` for a refused remote write (rather
//!   than the connection failing) turns out to matter;
//! - a poll for POLLRDHUP on a stalled connection so that its peer's death is seen at once too.

pub mod frame;
mod grants;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};

use tracing::{debug, trace, warn};

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
    /// How long a MSG frame may wait for a receive slot before the connection breaks (default
    /// 20 ms; see [`RNR_HORIZON`]).
    pub rnr_horizon: std::time::Duration,
    /// How long `poll` spins on the completion queue before it sleeps in the kernel (default
    /// 50 us; zero: never spin). Spinning keeps a ping-pong's round trip near the socket's own
    /// (a sleep and wake-up costs tens of microseconds); the budget bounds the CPU it burns on an
    /// idle link to that much per loop turn.
    pub busy_poll: std::time::Duration,
    /// Bytes of the receive buffer an accepted socket gets until its handshake is done (default
    /// 512): a CONNREQ frame is at most 69 bytes and nothing may follow it before our answer, so
    /// an unauthenticated socket never needs more. The socket gets `recv_buffer` bytes once the
    /// engine accepts it.
    pub handshake_buffer: usize,
    /// The most accepted sockets that may be in their handshake at once (waiting for the
    /// CONNREQ, for the engine's answer, or for our REJECT to go out); sockets accepted beyond
    /// it are closed at once and counted in `handshakes_refused` (default 4096, see
    /// [`DEFAULT_HANDSHAKE_LIMIT`]). Zero: no limit.
    pub handshake_limit: usize,
    /// The most of those that one source address may hold (default 1024, a quarter of the
    /// default limit; zero: no share): one host holding thousands of silent sockets, reopened
    /// as they time out, otherwise kept every new peer out (hostile-peer audit). Beyond it the
    /// socket is closed at once, counted in `handshakes_refused` and `handshakes_refused_source`.
    pub handshake_limit_per_source: usize,
    /// Descriptors kept free for the rest of the process (the daemon's control socket, logs):
    /// a socket accepted when fewer than this many descriptors would remain under
    /// RLIMIT_NOFILE is closed at once, counted in `accepts_shed`, and accepting pauses
    /// (default 16).
    pub fd_reserve: u32,
    /// How long [`TcpFabric::bind_with`] retries a listen address that is in use (EADDRINUSE)
    /// before it fails (default 10 s; zero: no retry). A process killed a moment ago may hold
    /// its listening socket for a while: a dead io_uring's files are released asynchronously.
    pub bind_retry: std::time::Duration,
}

/// The default [`TcpConfig::handshake_limit`]. A handshake lasts about one round trip and one
/// loop turn (the client sends its CONNREQ right after connecting), so even 20,000 clients
/// reconnecting at once after a router restart keep far fewer than this many in flight; those
/// refused retry under their engine's reconnect pacing. At the limit, handshake sockets hold
/// about 4096 x (512 B buffer + ~1 KiB of state) = 6 MiB, against 256 MiB of 64 KiB buffers.
pub const DEFAULT_HANDSHAKE_LIMIT: usize = 4096;

/// How long a MSG frame may wait for a receive slot before its connection breaks (see
/// `TcpFabric::break_overruns`). On RC the sender retries an RNR NAK `rnr_retry_count` times
/// (o2iblnd: 6) at the receiver's RNR timer, milliseconds in all; a reposted slot takes our
/// loop a turn, microseconds.
pub const RNR_HORIZON: std::time::Duration = std::time::Duration::from_millis(20);

/// The first pause of accepting after the descriptor limit was hit; it doubles up to
/// [`ACCEPT_BACKOFF_MAX`] while the limit keeps being hit, and resets after a kept accept.
pub const ACCEPT_BACKOFF_MIN: std::time::Duration = std::time::Duration::from_millis(100);
/// The longest pause of accepting (see [`ACCEPT_BACKOFF_MIN`]).
pub const ACCEPT_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(1);
/// At most one warning per this interval about the descriptor limit (with the count since).
const FD_WARN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// The listen backlog asked for (the kernel caps it at net.core.somaxconn, 4096 by default
/// since Linux 5.4): the size of the handshake limit, so a reconnect storm waits in the queue
/// rather than in SYN retransmissions.
const LISTEN_BACKLOG: u32 = DEFAULT_HANDSHAKE_LIMIT as u32;
/// How long `bind_with` sleeps between two tries of a listen address in use.
const BIND_RETRY_STEP: std::time::Duration = std::time::Duration::from_millis(100);

impl Default for TcpConfig {
    fn default() -> TcpConfig {
        TcpConfig {
            user_timeout: Tunables::default().timeout.into(),
            recv_buffer: 64 * 1024,
            ring_entries: 256,
            handshake_timeout: std::time::Duration::from_secs(5),
            rnr_horizon: RNR_HORIZON,
            busy_poll: std::time::Duration::from_micros(50),
            handshake_buffer: 512,
            handshake_limit: DEFAULT_HANDSHAKE_LIMIT,
            handshake_limit_per_source: DEFAULT_HANDSHAKE_LIMIT / 4,
            fd_reserve: 16,
            bind_retry: std::time::Duration::from_secs(10),
        }
    }
}

/// Counters of one tcp fabric. All only grow, except the gauges `handshakes` and
/// `rx_buffer_bytes` that [`TcpFabric::counters`] adds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpStats {
    /// Sockets accepted on the listener (those refused or shed at once included).
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
    /// Frames of a reserved kind. Every kind is handled in this version (RDMA_WRITE was the
    /// last reserved one), so this stays zero; kept so that the counter names stay stable.
    pub unsupported_frames: u64,
    pub truncated: u64,
    pub unexpected_frames: u64,
    /// Times a complete MSG frame found no posted slot and reading stopped (back-pressure).
    pub rx_stalls: u64,
    /// Connections closed because a MSG frame found no posted slot for longer than
    /// `rnr_horizon`: the peer sent past its credits (RC: RNR retries exhausted).
    pub credit_overruns: u64,
    /// MSG frames dropped because they arrived after our own Disconnect.
    pub discarded_msgs: u64,
    /// Actions naming a connection or request this fabric does not know.
    pub unknown_actions: u64,
    /// RDMA writes completed at this end (all their frames written) and their data bytes.
    pub rdma_writes_tx: u64,
    pub rdma_bytes_tx: u64,
    /// RDMA_WRITE frames placed in this fabric's regions by peers (a write of more than
    /// `frame::WRITE_CHUNK` bytes is several), and their data bytes.
    pub rdma_frames_rx: u64,
    pub rdma_bytes_rx: u64,
    /// Of `rdma_bytes_rx`, the bytes read from the socket straight into their region (the
    /// rest came through the receive buffer and a copy).
    pub rdma_direct_bytes_rx: u64,
    /// RDMA_WRITE frames refused because their key names no region here (unknown or
    /// deregistered), their bytes fall outside it, or no open grant of their connection covers
    /// them: nothing written, the connection closed.
    pub rdma_access_errors: u64,
    /// Of `rdma_access_errors`, the writes into a registered region that their connection was
    /// not (or no longer) granted (`FabricAction::GrantWrites`): a key used after its transfer,
    /// or by another peer.
    pub rdma_ungranted: u64,
    /// `RdmaWrite` actions whose local side is not a registered region or lies outside it
    /// (IBV_WC_LOC_PROT_ERR): completed `Error`, the connection closed.
    pub rdma_local_errors: u64,
    /// RDMA_WRITE frames whose data was dropped because they arrived after our own Disconnect.
    pub discarded_writes: u64,
    /// `Send` actions with an empty or oversized message.
    pub bad_sends: u64,
    /// Accepted sockets closed for not finishing the handshake within `handshake_timeout`.
    pub handshake_timeouts: u64,
    /// Accepted sockets closed at once because `handshake_limit` sockets were already in their
    /// handshake.
    pub handshakes_refused: u64,
    /// Of `handshakes_refused`, those over `handshake_limit_per_source`.
    pub handshakes_refused_source: u64,
    /// Accepted sockets closed at once because fewer than `fd_reserve` descriptors would have
    /// remained (each also pauses accepting).
    pub accepts_shed: u64,
    /// Pauses of accepting at the descriptor limit (EMFILE/ENFILE/ENOBUFS/ENOMEM from accept,
    /// or a shed socket), each [`ACCEPT_BACKOFF_MIN`] doubling up to [`ACCEPT_BACKOFF_MAX`].
    pub accept_backoffs: u64,
}

impl TcpStats {
    /// All protocol errors (garbage, truncation, frames out of place).
    pub fn protocol_errors(&self) -> u64 {
        self.bad_kind
            + self.bad_length
            + self.unsupported_frames
            + self.truncated
            + self.unexpected_frames
            + self.credit_overruns
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
            ("credit_overruns", self.credit_overruns),
            ("discarded_msgs", self.discarded_msgs),
            ("unknown_actions", self.unknown_actions),
            ("rdma_writes_tx", self.rdma_writes_tx),
            ("rdma_bytes_tx", self.rdma_bytes_tx),
            ("rdma_frames_rx", self.rdma_frames_rx),
            ("rdma_bytes_rx", self.rdma_bytes_rx),
            ("rdma_direct_bytes_rx", self.rdma_direct_bytes_rx),
            ("rdma_access_errors", self.rdma_access_errors),
            ("rdma_ungranted", self.rdma_ungranted),
            ("rdma_local_errors", self.rdma_local_errors),
            ("discarded_writes", self.discarded_writes),
            ("bad_sends", self.bad_sends),
            ("handshake_timeouts", self.handshake_timeouts),
            ("handshakes_refused", self.handshakes_refused),
            ("handshakes_refused_source", self.handshakes_refused_source),
            ("accepts_shed", self.accepts_shed),
            ("accept_backoffs", self.accept_backoffs),
        ]
    }

    fn count(&mut self, e: FrameError) {
        match e {
            FrameError::BadKind(_) => self.bad_kind += 1,
            FrameError::BadLength { .. } => self.bad_length += 1,
            FrameError::Truncated => self.truncated += 1,
            FrameError::Unexpected(_) => self.unexpected_frames += 1,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Sockets' handles, and io_uring user_data: (op kind, socket handle)

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

/// Bits of a socket generation: the op kind takes the top 4 bits of user_data, the slab index
/// the low 32.
const GEN_BITS: u32 = 28;

/// The handle in user_data of operations that are not a socket's (accept, waker): generation 0,
/// which no socket has.
const NO_SOCK: SockId = Handle::from_parts(0, 0);

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
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

/// The bits of user_data below the op kind: the handle's `as_u64` (generation above the index).
const HANDLE_MASK: u64 = (1 << (32 + GEN_BITS)) - 1;

fn tag(op: OpTag, sock: SockId) -> u64 {
    (op as u64) << 60 | (sock.as_u64() & HANDLE_MASK)
}

fn untag(t: u64) -> (Option<OpTag>, SockId) {
    let op = match t >> 60 {
        1 => Some(OpTag::Accept),
        2 => Some(OpTag::Connect),
        3 => Some(OpTag::Recv),
        4 => Some(OpTag::Send),
        5 => Some(OpTag::Cancel),
        6 => Some(OpTag::Waker),
        7 => Some(OpTag::AcceptCancel),
        _ => None,
    };
    (op, Handle::from_u64(t & HANDLE_MASK))
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
mod key_tests {
    use super::*;

    /// Keys are a permutation (no two region numbers share one) and unrelated between
    /// instances and between neighbours: no constant step, no shared key for the same number.
    #[test]
    fn region_keys_are_distinct_and_unpredictable() {
        let (a, b) = (RegionKeys::new(), RegionKeys::new());
        let ka: Vec<u32> = (1000..3000).map(|i| a.key(i)).collect();
        let mut sorted = ka.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ka.len(), "distinct numbers, distinct keys");
        let steps: std::collections::HashSet<u32> =
            ka.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        assert!(
            steps.len() > 1900,
            "no arithmetic progression: {} steps",
            steps.len()
        );
        let same = (1000..3000).filter(|&i| a.key(i) == b.key(i)).count();
        assert!(same < 5, "two instances agree on {same} keys");
        // Not the identity, nor the previous fixed multiplier.
        assert!((1000..3000).filter(|&i| a.key(i) == i as u32).count() < 5);
        let old = (1000..3000u64)
            .filter(|&i| a.key(i) == (i as u32).wrapping_mul(0x9e37_79b1))
            .count();
        assert!(old < 5);
    }
}

#[cfg(test)]
type WcLog = Vec<(ConnId, WrId, WcStatus)>;
#[cfg(not(test))]
type WcLog = ();

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

/// A report decided in `apply`, delivered at the start of the next `poll`.
#[derive(Copy, Clone, Debug)]
enum Report {
    SendDone(ConnId, WrId, WcStatus),
    Disconnected(ConnId, DisconnectReason),
    ConnectFailed(ConnId, ConnectFailure),
}

type Resolver = Box<dyn Fn(Nid) -> Option<SocketAddr> + Send>;

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
        // Room for a whole CONNREQ frame (and its compaction), never more than the full buffer.
        cfg.handshake_buffer = cfg
            .handshake_buffer
            .clamp(2 * (HEAD_LEN + PrivateData::MAX), cfg.recv_buffer);
        let listener = bind_listener(listen, cfg.bind_retry)?;
        // std listens with a backlog of 128: a burst of reconnecting clients beyond that has
        // its SYNs dropped and retried a second later, however fast we accept.
        uring::set_listen_backlog(listener.as_fd(), LISTEN_BACKLOG)?;
        let ring = Ring::new(cfg.ring_entries.max(8))?;
        let local = listener.local_addr()?;
        let mut f = TcpFabric {
            ring,
            listener,
            local,
            accept_armed: false,
            accept_pause: None,
            overruns: Vec::new(),
            accept_backoff: ACCEPT_BACKOFF_MIN,
            accept_probe: false,
            fd_warned: None,
            fd_suppressed: 0,
            handshakes: 0,
            handshakes_by_source: HashMap::new(),
            resolver: Box::new(resolver),
            cfg,
            socks: HandleSlab::with_generation_bits(GEN_BITS),
            next_sweep: Instant::ZERO,
            scratch: Vec::new(),
            by_conn: Vec::new(),
            out: VecDeque::new(),
            ready: Vec::new(),
            tx_pending: Vec::new(),
            cqes: Vec::new(),
            pool: Vec::new(),
            watched: Vec::new(),
            woken: false,
            waker_fd: None,
            bell: None,
            spare: Vec::new(),
            regions: HashMap::new(),
            next_region: region_seed(),
            keys: RegionKeys::new(),
            next_region_addr: REGION_BASE,
            wc_log: WcLog::default(),
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

    /// Accepted sockets in their handshake now (waiting for the CONNREQ, for the engine's
    /// answer, or for our REJECT to go out): what [`TcpConfig::handshake_limit`] bounds.
    pub fn handshakes(&self) -> usize {
        self.handshakes
    }

    /// Bytes of receive buffers the sockets hold now (buffers kept for reuse not included).
    pub fn rx_buffer_bytes(&self) -> usize {
        self.socks.iter().map(|(_, s)| s.rbuf_len).sum()
    }

    /// The counters of [`TcpStats::counters`], then the gauges `handshakes` and
    /// `rx_buffer_bytes` (for `lnetctl net show -v`).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut v = self.stats.counters();
        v.push(("handshakes", self.handshakes as u64));
        v.push(("rx_buffer_bytes", self.rx_buffer_bytes() as u64));
        v
    }

    /// True if `poll` has work that needs no waiting (reports to deliver, parsing to resume).
    pub fn has_work(&self) -> bool {
        !self.out.is_empty() || !self.ready.is_empty()
    }

    // ------------------------------------------------------------------ registered memory

    /// The contents of region `id`, to fill a write's source. A region must not change while a
    /// write from it (or a peer's write into it) is in progress. `None` for shared memory
    /// (reach it through its [`SharedMem`]).
    pub fn region_mut(&mut self, reg: &Registration) -> Option<&mut [u8]> {
        let id = reg.id();
        self.regions
            .get_mut(&self.keys.key(id.0))
            .filter(|r| r.id == id.0 && r.shared.is_none())
            .map(|r| &mut r.bytes[..])
    }

    /// Test hook: raw bytes on a connection's stream, after what is queued (garbage frames).
    #[cfg(test)]
    fn inject_raw(&mut self, conn: ConnId, bytes: &[u8]) {
        let sock = self.lookup(conn).expect("a known connection");
        let s = &mut self.socks[sock];
        s.wq.extend_from_slice(bytes);
        s.queued += bytes.len() as u64;
        self.arm_send(sock);
    }

    fn region_ref(&self, id: RegionId) -> Option<&Region> {
        self.regions
            .get(&self.keys.key(id.0))
            .filter(|r| r.id == id.0)
    }

    /// The contents of a region (no copy; [`Registry::read`] copies). `None` for shared memory.
    pub fn region(&self, reg: &Registration) -> Option<&[u8]> {
        self.region_ref(reg.id())
            .filter(|r| r.shared.is_none())
            .map(|r| &r.bytes[..])
    }

    // ------------------------------------------------------------------ engine actions

    /// Applies one engine action. I/O is only queued here; [`TcpFabric::poll`] submits it, and
    /// reports whatever `apply` decided at once (e.g. a send on a dead connection is flushed).
    pub fn apply(&mut self, now: Instant, action: FabricAction) {
        trace!(%now, ?action, "tcp fabric apply");
        Fabric::apply(self, now, action);
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
        let sock = self.new_sock(Some(stream), Phase::Connecting, true, Some(conn));
        self.map(conn, sock);
        let s = &mut self.socks[sock];
        s.slots.post_first(recv_slots);
        s.queue_frame(FrameKind::ConnReq, private.as_bytes(), None);
        let t = tag(OpTag::Connect, sock);
        if let Some(stream) = &s.stream {
            self.ring.connect(stream.as_fd(), addr, t);
            s.ops += 1;
        }
    }

    fn accept(&mut self, req: RequestId, conn: ConnId, private: PrivateData, recv_slots: u16) {
        let Some(sock) = self.request_sock(req) else {
            self.stats.unknown_actions += 1;
            return self.dead_conn(
                conn,
                Report::Disconnected(conn, DisconnectReason::TransportError),
            );
        };
        self.map(conn, sock);
        let s = &mut self.socks[sock];
        s.conn = Some(conn);
        if s.phase != Phase::RequestPending {
            // The requester went away meanwhile.
            s.reported_down = true;
            self.out
                .push_back(Report::Disconnected(conn, DisconnectReason::TransportError));
            return;
        }
        s.slots.post_first(recv_slots);
        self.end_handshake(sock);
        let s = &mut self.socks[sock];
        s.queue_frame(
            FrameKind::ConnAck,
            private.as_bytes(),
            Some(Done::Established),
        );
        s.phase = Phase::Open;
        self.arm_send(sock);
        self.make_ready(sock);
    }

    fn reject(&mut self, req: RequestId, private: PrivateData) {
        let Some(sock) = self.request_sock(req) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let s = &mut self.socks[sock];
        if s.phase == Phase::RequestPending {
            s.queue_frame(
                FrameKind::Reject,
                private.as_bytes(),
                Some(Done::RejectSent),
            );
            s.phase = Phase::Rejecting;
            self.stats.rejects_sent += 1;
            self.arm_send(sock);
        }
        self.maybe_free(sock);
    }

    fn post_recv(&mut self, conn: ConnId, slot: u16) {
        let Some(sock) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let s = &mut self.socks[sock];
        if !s.slots.post(slot) {
            self.stats.unknown_actions += 1;
            return;
        }
        if s.stalled {
            self.make_ready(sock);
        }
    }

    /// Queues a MSG frame; gives `bytes` back unless they wait in the backlog.
    fn send(&mut self, conn: ConnId, wr: WrId, bytes: Vec<u8>) -> Option<Vec<u8>> {
        let Some(sock) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return Some(bytes);
        };
        if bytes.is_empty() || bytes.len() > MSG_SIZE {
            self.stats.bad_sends += 1;
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Error));
            return Some(bytes);
        }
        let s = &mut self.socks[sock];
        if !s.can_post() {
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Flushed));
            return Some(bytes);
        }
        if !s.backlog.is_empty() || s.faulted {
            s.backlog.push_back(Tx::Msg(wr, bytes));
            return None;
        }
        s.queue_frame(FrameKind::Msg, &bytes, Some(Done::Send(wr)));
        self.stats.msgs_tx += 1;
        self.defer_send(sock);
        Some(bytes)
    }

    fn write(&mut self, conn: ConnId, w: TxWrite) {
        let Some(sock) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let s = &mut self.socks[sock];
        if !s.can_post() {
            self.out
                .push_back(Report::SendDone(conn, w.wr, WcStatus::Flushed));
            return;
        }
        s.backlog.push_back(Tx::Write(w));
        self.defer_send(sock);
    }

    /// Copies backlogged work into the write buffer, in order, until it holds `WQ_FILL` bytes:
    /// messages whole, writes a frame of at most `WRITE_CHUNK` data bytes at a time. A write whose
    /// local side is not (or no longer) inside a registered region becomes a `Done::Fault`.
    fn fill(&mut self, sock: SockId) {
        let s = &mut self.socks[sock];
        while !s.faulted && s.wq.len() < WQ_FILL {
            let Some(front) = s.backlog.front_mut() else {
                break;
            };
            match front {
                Tx::Msg(..) => {
                    let Some(Tx::Msg(wr, bytes)) = s.backlog.pop_front() else {
                        unreachable!("front is a message")
                    };
                    s.queue_frame(FrameKind::Msg, &bytes, Some(Done::Send(wr)));
                    self.stats.msgs_tx += 1;
                    self.spare.push(bytes);
                }
                Tx::Disconnect => {
                    s.backlog.pop_front();
                    s.queue_frame(FrameKind::Disconnect, &[], Some(Done::ShutWr));
                }
                Tx::Write(w) => {
                    // A malformed write, or one with a local fragment outside its region, is
                    // refused before its first frame (nothing of it is sent); the current piece
                    // is checked again each frame, in case its region went away.
                    let regions = &mut self.regions;
                    let keys = self.keys;
                    let region_len = |regions: &HashMap<u32, Region>, id: RegionId| {
                        regions
                            .get(&keys.key(id.0))
                            .filter(|r| r.id == id.0)
                            .map(Region::len)
                    };
                    let whole_ok = w.len.is_some()
                        && (w.sent > 0
                            || w.local.iter().all(|f| {
                                region_len(regions, f.region).is_some_and(|len| {
                                    span(len, f.offset, u64::from(f.len)).is_some()
                                })
                            }));
                    let next = whole_ok
                        .then(|| rdma_pieces(&w.local, &w.remote).nth(w.piece))
                        .flatten()
                        .and_then(|p| {
                            let n = u64::from(p.len - w.piece_sent).min(WRITE_CHUNK as u64);
                            let off = p.offset.checked_add(u64::from(w.piece_sent))?;
                            let range = span(region_len(regions, p.region)?, off, n)?;
                            Some((p, range))
                        });
                    let Some((p, range)) = next else {
                        let wr = w.wr;
                        s.backlog.pop_front();
                        s.faulted = true;
                        s.markers.push_back((s.queued, Done::Fault(wr)));
                        self.stats.rdma_local_errors += 1;
                        debug!(
                            ?sock,
                            ?wr,
                            "tcp fabric: RDMA write malformed or outside the local region"
                        );
                        if !s.in_ready {
                            s.in_ready = true;
                            self.ready.push(sock);
                        }
                        break;
                    };
                    let at = p.addr.wrapping_add(u64::from(w.piece_sent));
                    let n = range.len();
                    frame::push_write_head(&mut s.wq, p.key, at, n);
                    let wq = &mut s.wq;
                    if let Some(r) = regions.get_mut(&keys.key(p.region.0)) {
                        r.with(|b| wq.extend_from_slice(&b[range]));
                    }
                    s.queued += (HEAD_LEN + WRITE_HEAD_LEN + n) as u64;
                    w.sent += n as u32;
                    w.piece_sent += n as u32;
                    if w.piece_sent == p.len {
                        w.piece += 1;
                        w.piece_sent = 0;
                    }
                    if Some(w.sent) == w.len {
                        let (wr, len) = (w.wr, w.sent);
                        s.backlog.pop_front();
                        s.markers.push_back((s.queued, Done::Write(wr, len)));
                    }
                }
            }
        }
    }

    fn disconnect(&mut self, conn: ConnId) {
        let Some(sock) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let s = &mut self.socks[sock];
        if s.local_disconnect {
            return;
        }
        s.local_disconnect = true;
        if s.phase == Phase::Open && !s.tx_dead && !s.shut {
            // Written after what is queued; the peer's DISCONNECT or EOF confirms.
            if s.backlog.is_empty() && !s.faulted {
                s.queue_frame(FrameKind::Disconnect, &[], Some(Done::ShutWr));
            } else {
                s.backlog.push_back(Tx::Disconnect);
            }
            let stalled = s.stalled;
            self.arm_send(sock);
            if stalled {
                // Parse on (dropping MSGs) so the peer's DISCONNECT or EOF is seen.
                self.make_ready(sock);
            }
            return;
        }
        self.shut(sock);
        let s = &mut self.socks[sock];
        if !s.reported_down {
            // Never open, or already broken (then reported): our close is all there is.
            s.reported_down = true;
            self.out
                .push_back(Report::Disconnected(conn, DisconnectReason::Closed));
        }
    }

    fn destroy(&mut self, conn: ConnId) {
        let Some(sock) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        if let Some(e) = self.by_conn.get_mut(conn.index() as usize) {
            *e = None;
        }
        // The table is indexed by the engine's connection keys, which settle low once a storm
        // is over (`lnd::slots`): the entries above the highest live one go, and so does the
        // room a storm left (each entry is popped once, so this costs nothing over time).
        while self.by_conn.last().is_some_and(Option::is_none) {
            self.by_conn.pop();
        }
        if self.by_conn.capacity() > BY_CONN_FLOOR
            && self.by_conn.len() * 4 < self.by_conn.capacity()
        {
            self.by_conn
                .shrink_to((self.by_conn.len() * 2).max(BY_CONN_FLOOR));
        }
        self.socks[sock].destroyed = true;
        self.shut(sock);
        self.maybe_free(sock);
    }

    // ------------------------------------------------------------------ driving

    /// Submits queued I/O, waits up to `timeout` for a completion (`None`: without limit; no wait
    /// at all if [`TcpFabric::has_work`]), then reads the clock once with `now_fn` and feeds `sink`
    /// everything that happened. Drain `sink`'s actions into [`TcpFabric::apply`] before calling it
    /// again.
    pub fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        sink: &mut dyn FabricSink,
        now_fn: impl Fn() -> Instant,
    ) -> io::Result<()> {
        self.arm_pending_sends();
        let mut timeout = timeout;
        if let Some(until) = self.next_overrun() {
            let left = until.saturating_duration_since(std::time::Instant::now());
            timeout = Some(timeout.map_or(left, |t| t.min(left)));
        }
        if let Some(until) = self.accept_pause {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                self.accept_pause = None;
            } else {
                // Wake up in time to accept again.
                timeout = Some(timeout.map_or(left, |t| t.min(left)));
            }
        }
        if !self.accept_armed && self.accept_pause.is_none() {
            self.arm_accept();
        }
        for (i, w) in self.watched.iter_mut().enumerate() {
            if w.0 >= 0 && !w.1 {
                self.ring
                    .poll_readable(w.0, tag(OpTag::Waker, Handle::from_parts(i as u32, 0)));
                w.1 = true;
            }
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
            // Between rounds the thread yields the CPU: with as many spinning threads as cores
            // or more (a router beside its clients, a shared login node, a CI box) the spinning
            // must not starve the peer, or the kernel work that produces the very completion it
            // waits for. With a core to itself, the yield returns at once. Measured on 2 vCPUs
            // (lnet_perf, client, router and server processes): yielding from the first round
            // against yielding only after 15 us of spinning, routed 64-B PUT rate +35-60%,
            // routed ping RTT -30-45%, the direct PUT rate within 10% (noise). Under CPU hogs
            // (`yes` on every core) any spinning collapses: give a busy-polling router its own
            // cores.
            // The doorbell: a wake-up from another thread (a handover to this NI) is seen as
            // a flag in each round, not as a byte on the waker (see `Doorbell`).
            if let Some(b) = &self.bell {
                b.spin_begin();
            }
            let spun = loop {
                if let Err(e) = self.ring.submit_and_wait(Some(std::time::Duration::ZERO)) {
                    break Err(e);
                }
                if self.ring.has_completions()
                    || self.bell.as_ref().is_some_and(Doorbell::rung)
                    || start.elapsed() >= spin
                {
                    break Ok(());
                }
                std::thread::yield_now();
            };
            let rung = self.bell.as_ref().is_some_and(Doorbell::spin_end);
            spun?;
            waited = rung || self.ring.has_completions();
        }
        if !waited {
            let rest = timeout.map(|t| t.saturating_sub(spin));
            self.ring.submit_and_wait(rest)?;
        }
        for b in self.spare.drain(..) {
            sink.recycle(b);
        }
        let now = now_fn();
        self.flush_out(sink, now);
        self.run_ready(sink, now);
        let mut cqes = std::mem::take(&mut self.cqes);
        self.ring.reap(&mut cqes);
        for c in cqes.drain(..) {
            self.complete(c, sink, now);
        }
        self.cqes = cqes;
        self.run_ready(sink, now);
        self.break_overruns(sink, now);
        self.sweep(now);
        Ok(())
    }

    /// The earliest instant a connection breaks for a credit overrun, if one waits.
    fn next_overrun(&self) -> Option<std::time::Instant> {
        self.overruns
            .iter()
            .filter_map(|&sock| self.socks.get(sock).and_then(|s| s.overrun_deadline))
            .min()
    }

    /// Breaks the connections whose peer sent past its credits and got no slot within
    /// `rnr_horizon`, as RC breaks the sender's queue pair once its RNR retries are spent
    /// (o2iblnd asks for 6, kiblnd_connect_peer / kiblnd_passive_connect); and forgets the
    /// sockets whose frame got a slot. An honest peer never gets here: credits bound what it
    /// may send to the slots posted. Failing it fast (the 3FS lesson: rnr_retry 0, "a credit
    /// bug fails fast instead of stalling") names the fault, where a stall hid it.
    fn break_overruns(&mut self, sink: &mut dyn FabricSink, now: Instant) {
        if self.overruns.is_empty() {
            return;
        }
        let at = std::time::Instant::now();
        let mut due = Vec::new();
        self.overruns.retain(
            |&sock| match self.socks.get(sock).and_then(|s| s.overrun_deadline) {
                Some(d) if d <= at => {
                    due.push(sock);
                    false
                }
                Some(_) => true,
                None => false,
            },
        );
        for sock in due {
            // Taken once: a socket that stalled, got a slot and stalled again between two
            // passes is listed twice, and is broken and counted once.
            let Some(s) = self.socks.get_mut(sock) else {
                continue;
            };
            if s.overrun_deadline.take().is_none() || s.shut {
                continue;
            }
            self.stats.credit_overruns += 1;
            debug!(conn = ?s.conn, "tcp fabric: the peer sent past its credits, closing the connection");
            self.broken(
                sock,
                WcStatus::Error,
                (ConnectFailure::Error, PROTOCOL),
                sink,
                now,
            );
        }
    }

    /// See `Driver::set_waker`.
    pub fn set_waker(&mut self, fd: std::os::fd::RawFd) {
        self.waker_fd = Some(fd);
        self.watch(fd);
    }

    /// See `Driver::set_doorbell`: the busy-poll looks at its flag in every round.
    pub fn set_doorbell(&mut self, bell: Doorbell) {
        self.bell = Some(bell);
    }

    /// Ends a wait also when `fd` becomes readable (see `Driver::watch`).
    pub fn watch(&mut self, fd: std::os::fd::RawFd) {
        self.watched.push((fd, false));
    }

    /// A descriptor that is readable whenever this fabric has completions to reap (its
    /// io_uring): another loop on the same thread watches it (see `Driver::readiness_fd`).
    pub fn readiness_fd(&self) -> std::os::fd::RawFd {
        self.ring.raw_fd()
    }

    /// Closes accepted sockets that did not finish their handshake in time (at most a few times
    /// per `handshake_timeout`, so the scan's cost does not follow the message rate).
    fn sweep(&mut self, now: Instant) {
        if now < self.next_sweep {
            return;
        }
        let limit = crate::time::Duration::from(self.cfg.handshake_timeout);
        self.next_sweep = now
            + crate::time::Duration::from_nanos(limit.as_nanos() / 4)
                .max(crate::time::Duration::from_millis(10));
        let mut stale = std::mem::take(&mut self.scratch);
        stale.extend(self.socks.iter().filter_map(|(sock, s)| {
            let waiting = matches!(s.phase, Phase::AwaitConnReq | Phase::Rejecting);
            (waiting && !s.shut && now.saturating_duration_since(s.since) >= limit).then_some(sock)
        }));
        for sock in stale.drain(..) {
            self.stats.handshake_timeouts += 1;
            debug!(
                ?sock,
                "tcp fabric: accepted socket did not finish its handshake"
            );
            self.shut(sock);
            self.maybe_free(sock);
        }
        self.scratch = stale;
        // A burst of sockets (a reconnect storm, a flood of silent ones) leaves the slab's
        // capacity behind when it is over: give it back (keys of live sockets stay valid; the
        // slab shrinks down to its highest live key).
        if self.socks.capacity() > 1024 && self.socks.len() * 4 < self.socks.capacity() {
            self.socks.shrink_to_fit();
        }
    }

    fn flush_out(&mut self, sink: &mut dyn FabricSink, now: Instant) {
        while let Some(r) = self.out.pop_front() {
            let conn = match r {
                Report::SendDone(c, ..)
                | Report::Disconnected(c, _)
                | Report::ConnectFailed(c, _) => c,
            };
            if self.lookup(conn).is_none() {
                continue; // destroyed since: nothing more is reported for it
            }
            match r {
                Report::SendDone(c, wr, st) => complete_wr(&mut self.wc_log, sink, now, c, wr, st),
                Report::Disconnected(c, why) => sink.handle_disconnected(now, c, why),
                Report::ConnectFailed(c, why) => sink.handle_connect_failed(now, c, why),
            }
        }
    }

    fn run_ready(&mut self, sink: &mut dyn FabricSink, now: Instant) {
        let mut ready = std::mem::take(&mut self.ready);
        for sock in ready.drain(..) {
            let Some(s) = self.socks.get_mut(sock) else {
                continue; // freed since it was queued
            };
            s.in_ready = false;
            if s.faulted {
                self.run_markers(sock, sink, now);
                let Some(s) = self.socks.get_mut(sock) else {
                    continue;
                };
                if s.shut {
                    continue;
                }
            }
            let s = &mut self.socks[sock];
            if s.rbuf.is_some() && !s.recv_armed {
                s.stalled = false;
                self.parse(sock, sink, now);
            }
        }
        if self.ready.is_empty() {
            self.ready = ready;
        }
    }

    fn complete(&mut self, c: Completion, sink: &mut dyn FabricSink, now: Instant) {
        let (op, sock) = untag(c.tag);
        if op == Some(OpTag::Accept) {
            return self.on_accept(c, now);
        }
        if op == Some(OpTag::AcceptCancel) {
            return; // the accept itself completes with ECANCELED
        }
        if op == Some(OpTag::Waker) {
            // The owner drains the waker after this poll; re-armed at the next one.
            let Some(w) = self.watched.get_mut(sock.index() as usize) else {
                return;
            };
            w.1 = false;
            // Only the owner's own waker needs draining; another loop's ring (watched when
            // several share a thread) is drained by its own poll.
            self.woken |= Some(w.0) == self.waker_fd;
            if c.result < 0 && c.result != -libc::ECANCELED {
                // A broken waker would complete at once on every poll and spin the loop: stop
                // watching it (the loop's own bound still brings control requests in).
                tracing::error!(
                    errno = -c.result,
                    "tcp fabric: waker poll failed; no longer watching it"
                );
                w.0 = -1;
            }
            return;
        }
        let Some(s) = self.socks.get_mut(sock) else {
            return; // a late completion for a freed socket
        };
        s.ops = s.ops.saturating_sub(1);
        match op {
            Some(OpTag::Recv) => {
                s.recv_armed = false;
                s.rbuf = c.buf;
                self.on_recv(sock, c.result, sink, now);
            }
            Some(OpTag::Send) => {
                s.send_armed = false;
                self.on_send(sock, c.result, c.buf, sink, now);
            }
            Some(OpTag::Connect) => self.on_connect(sock, c.result, sink, now),
            Some(OpTag::Cancel)
            | Some(OpTag::Accept)
            | Some(OpTag::Waker)
            | Some(OpTag::AcceptCancel)
            | None => {}
        }
        self.maybe_free(sock);
    }

    fn on_accept(&mut self, c: Completion, now: Instant) {
        if !c.more {
            self.accept_armed = false;
        }
        let Some(fd) = c.fd else {
            if c.result != -libc::ECANCELED {
                self.stats.accept_errors += 1;
                let errno = -c.result;
                if matches!(
                    errno,
                    libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM
                ) {
                    // Re-arming at once would fail again at once, and spin the loop.
                    self.pause_accept(errno);
                } else {
                    debug!(errno, "tcp fabric: accept failed");
                }
            }
            return;
        };
        self.stats.accepted += 1;
        if self.fd_short(fd.as_raw_fd()) {
            // Keep the last descriptors for the rest of the process (the control socket).
            self.stats.accepts_shed += 1;
            drop(fd);
            self.pause_accept(libc::EMFILE);
            return;
        }
        if self.cfg.handshake_limit > 0 && self.handshakes >= self.cfg.handshake_limit {
            self.stats.handshakes_refused += 1;
            trace!(
                limit = self.cfg.handshake_limit,
                "tcp fabric: too many handshakes, accepted socket closed"
            );
            return;
        }
        if self.accept_pause.is_none() {
            self.accept_backoff = ACCEPT_BACKOFF_MIN;
            self.accept_probe = false;
        }
        let stream = TcpStream::from(fd);
        let source = stream.peer_addr().ok().map(|a| a.ip());
        let per_source = self.cfg.handshake_limit_per_source;
        if let Some(ip) = source.filter(|_| per_source > 0) {
            if self.handshakes_by_source.get(&ip).copied().unwrap_or(0) >= per_source {
                self.stats.handshakes_refused += 1;
                self.stats.handshakes_refused_source += 1;
                trace!(%ip, per_source, "tcp fabric: too many handshakes from one source, closed");
                return;
            }
        }
        if let Err(e) = self.configure(&stream) {
            self.stats.socket_errors += 1;
            debug!(error = %e, "tcp fabric: cannot configure an accepted socket");
        }
        let sock = self.new_sock(Some(stream), Phase::AwaitConnReq, false, None);
        let s = &mut self.socks[sock];
        s.since = now;
        s.handshake = true;
        s.source = source;
        self.handshakes += 1;
        if let Some(ip) = source {
            *self.handshakes_by_source.entry(ip).or_insert(0) += 1;
        }
        self.arm_recv(sock);
    }

    /// True if accepting descriptor `fd` leaves fewer than `fd_reserve` descriptors under
    /// RLIMIT_NOFILE. Descriptors are allocated lowest first, so every number below `fd` is
    /// open: at most `limit - fd - 1` remain.
    fn fd_short(&self, fd: std::os::fd::RawFd) -> bool {
        let reserve = u64::from(self.cfg.fd_reserve);
        if reserve == 0 {
            return false;
        }
        match uring::nofile_limit() {
            Ok(Some(limit)) => u64::try_from(fd).unwrap_or(0) + reserve >= limit,
            _ => false,
        }
    }

    /// Stops accepting for the current back-off (then doubles it, capped), counted in
    /// `accept_backoffs`, and warns at most once per `FD_WARN_INTERVAL`. Connections wait in
    /// the listen backlog meanwhile.
    fn pause_accept(&mut self, errno: i32) {
        if self.accept_pause.is_some() {
            return; // Already paused: a socket the kernel accepted before the cancel landed.
        }
        let pause = self.accept_backoff;
        self.accept_backoff = (pause * 2).min(ACCEPT_BACKOFF_MAX);
        let t = std::time::Instant::now();
        self.accept_pause = Some(t + pause);
        self.accept_probe = true;
        self.stats.accept_backoffs += 1;
        if self.accept_armed {
            self.ring
                .cancel_fd(self.listener.as_fd(), tag(OpTag::AcceptCancel, NO_SOCK));
        }
        match self.fd_warned {
            Some(last) if t.duration_since(last) < FD_WARN_INTERVAL => self.fd_suppressed += 1,
            _ => {
                warn!(
                    errno,
                    pause_ms = pause.as_millis() as u64,
                    not_logged_since = self.fd_suppressed,
                    accept_errors = self.stats.accept_errors,
                    accepts_shed = self.stats.accepts_shed,
                    reserve = self.cfg.fd_reserve,
                    "tcp fabric: at the descriptor limit (RLIMIT_NOFILE); accepting paused \
                     (logged at most once per {FD_WARN_INTERVAL:?})"
                );
                self.fd_warned = Some(t);
                self.fd_suppressed = 0;
            }
        }
    }

    /// The socket's handshake is over (established or shut): it no longer counts against the
    /// limit.
    fn end_handshake(&mut self, sock: SockId) {
        let s = &mut self.socks[sock];
        if s.handshake {
            s.handshake = false;
            self.handshakes -= 1;
            let source = s.source;
            self.source_done(source);
        }
    }

    /// One handshake from `source` is over.
    fn source_done(&mut self, source: Option<std::net::IpAddr>) {
        if let Some(ip) = source {
            if let Some(n) = self.handshakes_by_source.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    self.handshakes_by_source.remove(&ip);
                }
            }
        }
    }

    /// Gives an established connection its full receive buffer (the bytes not parsed yet move
    /// along); the small handshake buffer is freed, never pooled. A buffer lent to the ring is
    /// grown when it comes back (every parse starts here).
    fn grow_rbuf(&mut self, sock: SockId) {
        let full = self.cfg.recv_buffer;
        let s = &mut self.socks[sock];
        if s.phase != Phase::Open || s.rbuf_len >= full {
            return;
        }
        let Some(old) = s.rbuf.take() else {
            return;
        };
        let mut b = self.pool.pop().unwrap_or_default();
        b.clear();
        b.resize(full, 0);
        let n = s.rend - s.rstart;
        b[..n].copy_from_slice(&old[s.rstart..s.rend]);
        s.rstart = 0;
        s.rend = n;
        s.rbuf = Some(b);
        s.rbuf_len = full;
    }

    fn on_connect(&mut self, sock: SockId, res: i32, sink: &mut dyn FabricSink, now: Instant) {
        let s = &mut self.socks[sock];
        if s.shut {
            return;
        }
        if res == 0 {
            s.phase = Phase::AwaitReply;
            self.arm_send(sock);
            self.arm_recv(sock);
            return;
        }
        self.stats.connect_failures += 1;
        let errno = -res;
        let why = match errno {
            // Nothing listens there: refused, as rdma_cm's REJECTED with reason 8.
            libc::ECONNREFUSED => ConnectFailure::NoListener,
            libc::ETIMEDOUT
            | libc::EHOSTUNREACH
            | libc::ENETUNREACH
            | libc::ECONNRESET
            | libc::EADDRNOTAVAIL => ConnectFailure::Unreachable,
            _ => ConnectFailure::Error,
        };
        debug!(errno, "tcp fabric: connect failed");
        self.broken(sock, WcStatus::Flushed, (why, TRANSPORT), sink, now);
    }

    fn on_recv(&mut self, sock: SockId, res: i32, sink: &mut dyn FabricSink, now: Instant) {
        let s = &mut self.socks[sock];
        if s.shut {
            return;
        }
        if res > 0 {
            s.rend += res as usize;
            self.stats.bytes_rx += res as u64;
            return self.parse(sock, sink, now);
        }
        if res == 0 {
            s.rx_eof = true;
            if s.rstart < s.rend || s.rx_write.is_some() {
                return self.protocol_error(sock, FrameError::Truncated, sink, now);
            }
            if !s.peer_disconnect {
                self.stats.eof_without_disconnect += 1;
            }
            match s.phase {
                // The peer died (it sends DISCONNECT before any orderly EOF): what is queued
                // cannot arrive. Fail it as an RST would, without waiting for a write to fail.
                // Not a close: the transport failed under us (3FS #426).
                Phase::Open if !s.peer_disconnect && !s.local_disconnect => self.broken(
                    sock,
                    WcStatus::Error,
                    (ConnectFailure::Error, TRANSPORT),
                    sink,
                    now,
                ),
                Phase::Open => self.report_down(sock, (ConnectFailure::Error, CLOSED), sink, now),
                Phase::AwaitReply => self.broken(
                    sock,
                    WcStatus::Flushed,
                    (ConnectFailure::Unreachable, TRANSPORT),
                    sink,
                    now,
                ),
                Phase::Rejecting => {} // closes once the REJECT is written
                _ => self.shut(sock),
            }
            return;
        }
        let errno = -res;
        if errno == libc::ECANCELED {
            return;
        }
        let status = self.count_errno(errno);
        debug!(errno, "tcp fabric: receive failed");
        self.broken(
            sock,
            status,
            (ConnectFailure::Unreachable, TRANSPORT),
            sink,
            now,
        );
    }

    fn on_send(
        &mut self,
        sock: SockId,
        res: i32,
        buf: Option<Vec<u8>>,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        let Some(mut buf) = buf else {
            return;
        };
        let s = &mut self.socks[sock];
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
            return self.broken(
                sock,
                status,
                (ConnectFailure::Unreachable, TRANSPORT),
                sink,
                now,
            );
        }
        let n = res as usize;
        self.stats.bytes_tx += n as u64;
        s.written += n as u64;
        s.w_off += n;
        if s.w_off < buf.len() {
            // Short write: the rest of the same buffer.
            let t = tag(OpTag::Send, sock);
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
        self.run_markers(sock, sink, now);
        self.arm_send(sock);
    }

    /// Acts on every marker whose bytes are all written.
    fn run_markers(&mut self, sock: SockId, sink: &mut dyn FabricSink, now: Instant) {
        loop {
            let Some(s) = self.socks.get_mut(sock) else {
                return;
            };
            let Some(&(pos, done)) = s.markers.front() else {
                return;
            };
            if pos > s.written {
                return;
            }
            if let Done::Fault(_) = done {
                // Completes `Error` (first in the queue now), the rest flushes.
                return self.broken(
                    sock,
                    WcStatus::Error,
                    (ConnectFailure::Error, TRANSPORT),
                    sink,
                    now,
                );
            }
            s.markers.pop_front();
            let conn = s.live_conn();
            match done {
                Done::Send(wr) => {
                    if let Some(c) = conn {
                        complete_wr(&mut self.wc_log, sink, now, c, wr, WcStatus::Success);
                    }
                }
                Done::Write(wr, len) => {
                    self.stats.rdma_writes_tx += 1;
                    self.stats.rdma_bytes_tx += u64::from(len);
                    if let Some(c) = conn {
                        complete_wr(&mut self.wc_log, sink, now, c, wr, WcStatus::Success);
                    }
                }
                Done::Fault(_) => unreachable!("handled above"),
                Done::Established => {
                    s.established = true;
                    self.stats.established += 1;
                    if let Some(c) = conn {
                        sink.handle_established(now, c, &[]);
                    }
                }
                Done::ShutWr => {
                    if let Some(st) = &s.stream {
                        let _ = st.shutdown(Shutdown::Write);
                    }
                }
                Done::RejectSent => self.shut(sock),
            }
        }
    }

    /// Parses complete frames out of the receive buffer and acts on them, then posts the next
    /// read unless a frame is stalled (see the module doc).
    fn parse(&mut self, sock: SockId, sink: &mut dyn FabricSink, now: Instant) {
        if self.socks.contains(sock) {
            self.grow_rbuf(sock);
        }
        loop {
            let Some(s) = self.socks.get_mut(sock) else {
                return;
            };
            if s.shut {
                return;
            }
            let Some(buf) = s.rbuf.as_ref() else {
                return;
            };
            if let Some(w) = s.rx_write.as_mut() {
                // An RDMA_WRITE's data: straight from the receive buffer into the region.
                let n = w.left.min(s.rend - s.rstart);
                let src = &buf[s.rstart..s.rstart + n];
                if !w.discard {
                    let landed = self.regions.get_mut(&w.key).is_some_and(|r| {
                        r.with(|b| {
                            b.get_mut(w.off..w.off + n)
                                .map(|dst| dst.copy_from_slice(src))
                                .is_some()
                        })
                    });
                    if !landed {
                        // Deregistered while the write was streaming in.
                        return self.access_error(sock, "region deregistered", sink, now);
                    }
                    self.stats.rdma_bytes_rx += n as u64;
                }
                w.off += n;
                w.left -= n;
                s.rstart += n;
                if w.left > 0
                    && !w.discard
                    && s.rstart == s.rend
                    && w.grant_end - w.off >= DIRECT_MIN
                {
                    // The rest of the data is still in the socket: read it straight into the
                    // region (no recv is in flight: the ring holds `rbuf` while one is), not
                    // through `rbuf` and a copy. Non-blocking: what has not arrived comes by
                    // the ring as usual.
                    let Some(stream) = s.stream.as_ref() else {
                        break;
                    };
                    while w.left > 0 {
                        let Some(region) = self.regions.get_mut(&w.key) else {
                            return self.access_error(sock, "region deregistered", sink, now);
                        };
                        let (off, left) = (w.off, w.left);
                        let got = region.with(|b| {
                            b.get_mut(off..off + left).map(|dst| {
                                rustix::net::recv(stream, dst, rustix::net::RecvFlags::DONTWAIT)
                            })
                        });
                        match got {
                            None => {
                                return self.access_error(sock, "region deregistered", sink, now)
                            }
                            Some(Ok((0, _))) => return self.on_recv(sock, 0, sink, now),
                            Some(Ok((n, _))) => {
                                self.stats.bytes_rx += n as u64;
                                self.stats.rdma_bytes_rx += n as u64;
                                self.stats.rdma_direct_bytes_rx += n as u64;
                                w.off += n;
                                w.left -= n;
                            }
                            Some(Err(rustix::io::Errno::INTR)) => {}
                            Some(Err(rustix::io::Errno::AGAIN)) => break,
                            Some(Err(e)) => {
                                return self.on_recv(sock, -e.raw_os_error(), sink, now)
                            }
                        }
                    }
                    // The next frame's data straight too, if the write goes on long enough.
                    s.heads_only = w.left == 0 && w.grant_end - w.off >= DIRECT_MIN;
                }
                if w.left > 0 {
                    break;
                }
                if !w.discard {
                    self.stats.rdma_frames_rx += 1;
                }
                s.rx_write = None;
                continue;
            }
            let avail = &buf[s.rstart..s.rend];
            let head = match frame::parse_head(avail) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => return self.protocol_error(sock, e, sink, now),
            };
            if s.phase == Phase::AwaitConnReq && head.kind != FrameKind::ConnReq {
                // Refused on its head: the handshake buffer only ever holds a CONNREQ.
                return self.protocol_error(sock, FrameError::Unexpected(head.kind), sink, now);
            }
            // An RDMA_WRITE's data streams: only its write head must be here.
            let need = if head.kind == FrameKind::RdmaWrite {
                HEAD_LEN + WRITE_HEAD_LEN
            } else {
                head.frame_len()
            };
            if avail.len() < need {
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
                    let req = RequestId(sock.as_u64());
                    sink.handle_connect_request(now, req, &buf[body]);
                }
                (Phase::AwaitReply, FrameKind::ConnAck) => {
                    s.rstart = next;
                    s.phase = Phase::Open;
                    s.established = true;
                    self.stats.established += 1;
                    if let Some(c) = conn {
                        sink.handle_established(now, c, &buf[body]);
                    }
                }
                (Phase::AwaitReply, FrameKind::Reject) => {
                    s.rstart = next;
                    s.reported_down = true;
                    let private = PrivateData::new(&buf[body]);
                    self.stats.rejects_received += 1;
                    self.shut(sock);
                    if let Some(c) = conn {
                        sink.handle_connect_failed(now, c, ConnectFailure::Rejected(private));
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
                        if s.overrun_deadline.is_none() {
                            s.overrun_deadline =
                                Some(std::time::Instant::now() + self.cfg.rnr_horizon);
                            self.overruns.push(sock);
                        }
                        return;
                    };
                    s.overrun_deadline = None;
                    s.rstart = next;
                    self.stats.msgs_rx += 1;
                    if let Some(c) = conn {
                        // What the writes before this message covered, first: it may be the
                        // PUT_DONE or GET_DONE that ends them.
                        if s.grants.has_changed() {
                            for (id, prefix) in s.grants.take_changed() {
                                sink.handle_writes_covered(now, c, id, prefix);
                            }
                        }
                        sink.handle_recv(now, c, slot, &buf[body]);
                    }
                }
                (Phase::Open, FrameKind::RdmaWrite) if !s.peer_disconnect => {
                    let Some((rkey, addr)) = frame::parse_write_head(&buf[body.start..]) else {
                        unreachable!("the write head is in the buffer");
                    };
                    let len = head.body_len - WRITE_HEAD_LEN;
                    s.rstart += HEAD_LEN + WRITE_HEAD_LEN;
                    if s.local_disconnect {
                        self.stats.discarded_writes += 1;
                        s.rx_write = Some(RxWrite {
                            key: rkey,
                            off: 0,
                            left: len,
                            discard: true,
                            grant_end: 0,
                        });
                        continue;
                    }
                    // Key, bounds and grant are checked before a byte is written. A frame lies
                    // within one remote fragment (writes are cut at every fragment boundary).
                    // How far past the frame its grant reaches: the most of the grants that
                    // hold it.
                    let past_frame = s.grants.reach_past(rkey, addr, len as u64);
                    let off = match self.regions.get(&rkey) {
                        None => Err("no region under the key"),
                        Some(r) => addr
                            .checked_sub(r.addr)
                            .and_then(|off| span(r.len(), off, len as u64))
                            .map(|range| range.start)
                            .ok_or("outside the region"),
                    };
                    let off = match off {
                        Ok(_) if past_frame.is_none() => {
                            self.stats.rdma_ungranted += 1;
                            Err("not granted to this connection")
                        }
                        other => other,
                    };
                    match off {
                        Ok(off) => {
                            // Its bytes land before anything behind it is read: counted
                            // written now (see grants.rs).
                            s.grants.mark(rkey, addr, len as u32);
                            let past = usize::try_from(past_frame.unwrap_or(0)).unwrap_or(0);
                            s.rx_write = Some(RxWrite {
                                key: rkey,
                                off,
                                left: len,
                                discard: false,
                                grant_end: off + len + past,
                            })
                        }
                        Err(why) => {
                            debug!(rkey, addr, len, "tcp fabric: RDMA write refused");
                            return self.access_error(sock, why, sink, now);
                        }
                    }
                }
                (Phase::Open, FrameKind::Disconnect) if !s.peer_disconnect => {
                    s.rstart = next;
                    s.peer_disconnect = true;
                    self.stats.peer_disconnects += 1;
                    self.flush_unsent(sock, sink, now);
                    self.report_down(sock, (ConnectFailure::Error, CLOSED), sink, now);
                }
                (_, kind) => {
                    return self.protocol_error(sock, FrameError::Unexpected(kind), sink, now)
                }
            }
        }
        // Only an incomplete frame (or nothing) is left: compact and read on.
        let Some(s) = self.socks.get_mut(sock) else {
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
        self.arm_recv(sock);
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

    /// A peer's RDMA write names memory we do not have (IBV_WC_REM_ACCESS_ERR at the writer):
    /// nothing is written, and the connection goes to error as an RC queue pair would. Our own
    /// pending sends flush; the writer sees the socket close.
    fn access_error(
        &mut self,
        sock: SockId,
        why: &'static str,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        self.stats.rdma_access_errors += 1;
        let conn = self.socks[sock].conn;
        debug!(
            why,
            ?conn,
            "tcp fabric: RDMA write access error, closing the connection"
        );
        self.socks[sock].rx_write = None;
        self.broken(
            sock,
            WcStatus::Flushed,
            (ConnectFailure::Error, PROTOCOL),
            sink,
            now,
        );
    }

    fn protocol_error(
        &mut self,
        sock: SockId,
        e: FrameError,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        self.stats.count(e);
        let (phase, conn) = {
            let s = &self.socks[sock];
            (s.phase, s.conn)
        };
        debug!(error = %e, ?phase, ?conn, "tcp fabric: protocol error, closing the connection");
        self.broken(
            sock,
            WcStatus::Error,
            (ConnectFailure::Error, PROTOCOL),
            sink,
            now,
        );
    }

    /// The peer's DISCONNECT arrived (its DREQ: our queue pair goes to error): every send and
    /// write not yet completed completes `Flushed`, in posting order, and what is not handed to
    /// the socket yet is dropped (the peer discards whatever arrives after its DISCONNECT).
    fn flush_unsent(&mut self, sock: SockId, sink: &mut dyn FabricSink, now: Instant) {
        let s = &mut self.socks[sock];
        if s.local_disconnect || s.tx_dead {
            return;
        }
        s.queued -= s.wq.len() as u64;
        s.wq.clear();
        s.faulted = false;
        let conn = s.live_conn();
        let log = &mut self.wc_log;
        s.markers.retain(|&(_, done)| match done {
            Done::Send(wr) | Done::Write(wr, _) | Done::Fault(wr) => {
                if let Some(c) = conn {
                    complete_wr(log, sink, now, c, wr, WcStatus::Flushed);
                }
                false
            }
            Done::Established | Done::ShutWr | Done::RejectSent => true,
        });
        while let Some(tx) = s.backlog.pop_front() {
            let wr = match tx {
                Tx::Msg(wr, bytes) => {
                    self.spare.push(bytes);
                    wr
                }
                Tx::Write(w) => w.wr,
                Tx::Disconnect => continue,
            };
            if let Some(c) = conn {
                complete_wr(log, sink, now, c, wr, WcStatus::Flushed);
            }
        }
    }

    /// The connection is unusable: fail its queued sends (the first with `first`, the rest
    /// flushed), shut the socket and tell the engine once (`why`: see [`Self::report_down`]).
    fn broken(
        &mut self,
        sock: SockId,
        first: WcStatus,
        why: (ConnectFailure, DisconnectReason),
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        let s = &mut self.socks[sock];
        s.tx_dead = true;
        s.wq.clear();
        let conn = s.live_conn();
        let mut status = first;
        while let Some((_, done)) = s.markers.pop_front() {
            let wr = match done {
                Done::Send(wr) | Done::Write(wr, _) | Done::Fault(wr) => wr,
                Done::Established | Done::ShutWr | Done::RejectSent => continue,
            };
            if let Some(c) = conn {
                complete_wr(&mut self.wc_log, sink, now, c, wr, status);
                status = WcStatus::Flushed;
            }
        }
        while let Some(tx) = s.backlog.pop_front() {
            let wr = match tx {
                Tx::Msg(wr, bytes) => {
                    self.spare.push(bytes);
                    wr
                }
                Tx::Write(w) => w.wr,
                Tx::Disconnect => continue,
            };
            if let Some(c) = conn {
                complete_wr(&mut self.wc_log, sink, now, c, wr, status);
                status = WcStatus::Flushed;
            }
        }
        self.shut(sock);
        self.report_down(sock, why, sink, now);
    }

    /// Tells the engine, once, that the connection is gone, and why (`why.1`); or, for an active
    /// connect before its reply, that the connect failed (`why.0`).
    fn report_down(
        &mut self,
        sock: SockId,
        why: (ConnectFailure, DisconnectReason),
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        let s = &mut self.socks[sock];
        if s.reported_down {
            return;
        }
        s.reported_down = true;
        let Some(conn) = s.live_conn() else {
            return;
        };
        if s.active && !s.established {
            sink.handle_connect_failed(now, conn, why.0);
        } else {
            sink.handle_disconnected(now, conn, why.1);
        }
    }

    /// Shuts the socket down and cancels its I/O; it is closed once the kernel lets go.
    fn shut(&mut self, sock: SockId) {
        let s = &mut self.socks[sock];
        if s.shut {
            return;
        }
        s.shut = true;
        s.phase = Phase::Closed;
        s.stalled = false;
        if s.handshake {
            s.handshake = false;
            self.handshakes -= 1;
            let source = s.source;
            self.source_done(source);
        }
        let s = &mut self.socks[sock];
        if let Some(stream) = &s.stream {
            let _ = stream.shutdown(Shutdown::Both);
            if s.ops > 0 {
                self.ring
                    .cancel_fd(stream.as_fd(), tag(OpTag::Cancel, sock));
                s.ops += 1;
            }
        }
    }

    fn maybe_free(&mut self, sock: SockId) {
        let Some(s) = self.socks.get(sock) else {
            return;
        };
        if s.ops == 0 && s.shut && (s.conn.is_none() || s.destroyed) {
            let Some(s) = self.socks.remove(sock) else {
                unreachable!("the socket was just found")
            };
            debug_assert!(
                !s.handshake,
                "a freed socket still counted in its handshake"
            );
            for mut b in [s.rbuf, s.spare, Some(s.wq)].into_iter().flatten() {
                // Small buffers (a handshake's) are freed: only the size worth reusing is kept.
                if self.pool.len() < POOL_MAX && b.capacity() >= self.cfg.recv_buffer {
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
    ) -> SockId {
        let shut = stream.is_none();
        // An accepted socket is unauthenticated until its handshake is done: a small receive
        // buffer and no write buffers from the pool (its CONNACK or REJECT allocates a little).
        let small = !active && phase == Phase::AwaitConnReq;
        let rbuf = if shut {
            None
        } else if small {
            Some(vec![0; self.cfg.handshake_buffer])
        } else {
            let mut b = self.pool.pop().unwrap_or_default();
            b.resize(self.cfg.recv_buffer, 0);
            Some(b)
        };
        let rbuf_len = rbuf.as_ref().map_or(0, Vec::len);
        let spare = (!shut).then(|| {
            if small {
                Vec::new()
            } else {
                self.pool.pop().unwrap_or_default()
            }
        });
        let wq = if shut || small {
            Vec::new()
        } else {
            self.pool.pop().unwrap_or_default()
        };
        self.socks.insert(Sock {
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
            tx_pending: false,
            since: Instant::ZERO,
            handshake: false,
            source: None,
            rbuf_len,
            grants: grants::Grants::default(),
            rx_write: None,
            heads_only: false,
            rbuf,
            rstart: 0,
            rend: 0,
            recv_armed: false,
            stalled: false,
            overrun_deadline: None,
            slots: Slots::default(),
            wq,
            spare,
            w_off: 0,
            send_armed: false,
            tx_dead: shut,
            backlog: VecDeque::new(),
            faulted: false,
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
        let sock = self.new_sock(None, Phase::Closed, true, Some(conn));
        self.socks[sock].reported_down = true;
        self.map(conn, sock);
        self.out.push_back(report);
    }

    fn map(&mut self, conn: ConnId, sock: SockId) {
        let i = conn.index() as usize;
        if self.by_conn.len() <= i {
            self.by_conn.resize(i + 1, None);
        }
        self.by_conn[i] = Some((conn, sock));
    }

    fn lookup(&self, conn: ConnId) -> Option<SockId> {
        match self.by_conn.get(conn.index() as usize) {
            Some(&Some((c, sock))) if c == conn => Some(sock),
            _ => None,
        }
    }

    /// The socket of connect request `req` (its handle's `as_u64`), if it still waits for the
    /// engine's answer (or closed meanwhile and nobody took it).
    fn request_sock(&self, req: RequestId) -> Option<SockId> {
        let sock = SockId::from_u64(req.0);
        let s = self.socks.get(sock)?;
        (s.conn.is_none() && matches!(s.phase, Phase::RequestPending | Phase::Closed))
            .then_some(sock)
    }

    /// Arms the socket's send at the start of the next `poll` rather than now: SQEs are only
    /// submitted there anyway, and a send armed at the first of several frames applied in a row
    /// would carry that frame alone, the rest waiting a round through the kernel for its
    /// completion.
    fn defer_send(&mut self, sock: SockId) {
        let s = &mut self.socks[sock];
        if !s.tx_pending {
            s.tx_pending = true;
            self.tx_pending.push(sock);
        }
    }

    /// Arms the sends deferred by `defer_send`.
    fn arm_pending_sends(&mut self) {
        let mut pending = std::mem::take(&mut self.tx_pending);
        for sock in pending.drain(..) {
            let Some(s) = self.socks.get_mut(sock) else {
                continue; // freed since
            };
            s.tx_pending = false;
            self.arm_send(sock);
        }
        self.tx_pending = pending;
    }

    fn make_ready(&mut self, sock: SockId) {
        let s = &mut self.socks[sock];
        if !s.in_ready {
            s.in_ready = true;
            self.ready.push(sock);
        }
    }

    fn arm_accept(&mut self) {
        let t = tag(OpTag::Accept, NO_SOCK);
        if self.accept_probe {
            self.ring.accept_one(self.listener.as_fd(), t);
        } else {
            self.ring.accept_multi(self.listener.as_fd(), t);
        }
        self.accept_armed = true;
    }

    fn arm_recv(&mut self, sock: SockId) {
        let s = &mut self.socks[sock];
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
        let t = tag(OpTag::Recv, sock);
        let max = if std::mem::take(&mut s.heads_only) {
            HEAD_LEN + WRITE_HEAD_LEN
        } else {
            usize::MAX
        };
        self.ring.recv(stream.as_fd(), buf, s.rend, max, t);
        s.recv_armed = true;
        s.ops += 1;
    }

    fn arm_send(&mut self, sock: SockId) {
        let s = &self.socks[sock];
        if !s.send_armed && !s.backlog.is_empty() && !s.tx_dead && !s.shut {
            self.fill(sock);
        }
        let s = &mut self.socks[sock];
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
        let t = tag(OpTag::Send, sock);
        self.ring.send(stream.as_fd(), buf, 0, t);
        s.send_armed = true;
        s.ops += 1;
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
    fn connect(&mut self, _: Instant, conn: ConnId, peer: Nid, private: PrivateData, slots: u16) {
        TcpFabric::connect(self, conn, peer, private, slots)
    }

    fn accept(
        &mut self,
        _: Instant,
        req: RequestId,
        conn: ConnId,
        private: PrivateData,
        slots: u16,
    ) {
        TcpFabric::accept(self, req, conn, private, slots)
    }

    fn reject(&mut self, _: Instant, req: RequestId, private: PrivateData) {
        TcpFabric::reject(self, req, private)
    }

    fn post_recv(&mut self, _: Instant, conn: ConnId, slot: u16) {
        TcpFabric::post_recv(self, conn, slot)
    }

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

    fn disconnect(&mut self, _: Instant, conn: ConnId) {
        TcpFabric::disconnect(self, conn)
    }

    fn destroy(&mut self, _: Instant, conn: ConnId) {
        TcpFabric::destroy(self, conn)
    }
}

impl crate::driver::Driver for TcpFabric {
    fn apply(&mut self, now: Instant, action: FabricAction) {
        TcpFabric::apply(self, now, action);
    }

    fn registry(&mut self) -> Option<&mut dyn Registry> {
        Some(self)
    }

    /// Every write frame is checked and placed by this fabric: it reports coverage.
    fn sees_writes(&self) -> bool {
        true
    }

    fn poll(
        &mut self,
        timeout: Option<std::time::Duration>,
        sink: &mut dyn FabricSink,
        now: &dyn Fn() -> Instant,
    ) -> io::Result<()> {
        TcpFabric::poll(self, timeout, sink, now)
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

/// The tcp fabric's ibv_reg_mr: a region is a buffer in a table keyed by its remote key.
/// Keys are a secret per-instance permutation of region numbers (`RegionKeys`), unique within
/// the fabric for 2^32 registrations, so a key of a deregistered region does not match a new
/// one, and a peer cannot compute a region's key from the keys it was shown (a router's
/// buffers serve many peers); addresses never repeat. A region lives until it is deregistered or
/// the fabric is dropped. Deregistering never fails: later writes into it are refused by this
/// fabric (the writer's connection is closed), a write from it that has not been copied out yet
/// fails like a write outside the local region.
impl Registry for TcpFabric {
    fn register(&mut self, bytes: Vec<u8>) -> io::Result<Registration> {
        self.next_region = self.next_region.wrapping_add(1);
        let id = self.next_region;
        let key = self.keys.key(id);
        let addr = self.next_region_addr;
        let len = bytes.len() as u64;
        let pages = len.div_ceil(PAGE) + 1;
        self.next_region_addr = self.next_region_addr.wrapping_add(pages * PAGE);
        self.regions.insert(
            key,
            Region {
                id,
                addr,
                bytes,
                shared: None,
            },
        );
        Ok(Registration::new(RegionId(id), key, addr, len))
    }

    fn register_shared(&mut self, mem: &SharedMem) -> io::Result<Registration> {
        self.next_region = self.next_region.wrapping_add(1);
        let id = self.next_region;
        let key = self.keys.key(id);
        let addr = self.next_region_addr;
        let len = mem.len() as u64;
        let pages = len.div_ceil(PAGE) + 1;
        self.next_region_addr = self.next_region_addr.wrapping_add(pages * PAGE);
        let region = Region {
            id,
            addr,
            bytes: Vec::new(),
            shared: Some(mem.clone()),
        };
        self.regions.insert(key, region);
        Ok(Registration::new(RegionId(id), key, addr, len))
    }

    fn read(&self, reg: &Registration, offset: u64, out: &mut [u8]) -> bool {
        let Some(r) = self.region_ref(reg.id()) else {
            return false;
        };
        let copy = |b: &mut [u8]| match span(b.len(), offset, out.len() as u64) {
            Some(range) => {
                out.copy_from_slice(&b[range]);
                true
            }
            None => false,
        };
        match &r.shared {
            Some(m) => m.with(copy),
            None => span(r.bytes.len(), offset, out.len() as u64)
                .map(|range| out.copy_from_slice(&r.bytes[range]))
                .is_some(),
        }
    }

    fn deregister(&mut self, reg: Registration) -> Option<Vec<u8>> {
        self.region_ref(reg.id())?;
        self.regions.remove(&reg.key()).map(|r| r.bytes)
    }
}
