//! What an operator can set ([`TcpConfig`]) and what the fabric counts ([`TcpStats`]).

use super::*;

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
pub(super) const FD_WARN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// The listen backlog asked for (the kernel caps it at net.core.somaxconn, 4096 by default
/// since Linux 5.4): the size of the handshake limit, so a reconnect storm waits in the queue
/// rather than in SYN retransmissions.
pub(super) const LISTEN_BACKLOG: u32 = DEFAULT_HANDSHAKE_LIMIT as u32;
/// How long `bind_with` sleeps between two tries of a listen address in use.
pub(super) const BIND_RETRY_STEP: std::time::Duration = std::time::Duration::from_millis(100);

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

counter_struct! {
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

    pub(super) fn count(&mut self, e: FrameError) {
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
