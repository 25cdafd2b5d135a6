//! What an operator can set ([`SocketConfig`]) and what the driver counts ([`SocketStats`]).

/// The socket driver's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketConfig {
    /// io_uring submission-queue entries (default 256).
    pub ring_entries: u32,
    /// The largest `Recv { target: Bytes }` one read serves: the size of the driver's one read
    /// buffer (default 64 KiB; a larger `max` gets at most this much per `Data`).
    pub read_buffer: usize,
    /// How long a graceful close may take (flush what is queued, FIN, read to the peer's EOF)
    /// before the socket is reset instead (default 2 s): a peer that never reads or never
    /// closes holds nothing longer than this.
    pub close_bound: std::time::Duration,
    /// Send a `Mem` payload of at least `zc_threshold` bytes with IORING_OP_SEND_ZC (the kernel
    /// reads LNet's memory in place, and `Sent` comes once it let go of it). Off by default: on
    /// loopback the kernel copies anyway and the zero-copy path only adds a completion (see
    /// the module doc for the figures); a NIC with scatter-gather is where it pays.
    pub zero_copy: bool,
    /// See `zero_copy` (default 64 KiB; below it a copy costs less than the page pinning and
    /// the second completion).
    pub zc_threshold: u32,
    /// How long `poll` spins on the completion queue before it sleeps in the kernel (default
    /// 50 us, as the tcp fabric; zero: never spin): a ping-pong's next completion is
    /// microseconds away, a sleep and wake-up costs tens of them.
    pub busy_poll: std::time::Duration,
    /// Descriptors kept free for the rest of the process: a connection accepted when fewer
    /// than this many would remain under RLIMIT_NOFILE is closed at once, counted in
    /// `accepts_shed`, and accepting pauses (default 16), as the tcp fabric does.
    pub fd_reserve: u32,
}

impl Default for SocketConfig {
    fn default() -> SocketConfig {
        SocketConfig {
            ring_entries: 256,
            read_buffer: 64 * 1024,
            close_bound: std::time::Duration::from_secs(2),
            zero_copy: false,
            zc_threshold: 64 * 1024,
            busy_poll: std::time::Duration::from_micros(50),
            fd_reserve: 16,
        }
    }
}

/// The first pause of accepting after the descriptor limit was hit; it doubles up to
/// [`ACCEPT_BACKOFF_MAX`] while the limit keeps being hit, and resets after a kept accept.
pub const ACCEPT_BACKOFF_MIN: std::time::Duration = std::time::Duration::from_millis(100);
/// The longest pause of accepting.
pub const ACCEPT_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(1);

counter_struct! {
    /// Counters of one socket driver; all only grow.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct SocketStats {
        /// Connections accepted on the listener (shed ones included).
        pub accepted: u64,
        /// Incoming connections the engine refused (closed with RST).
        pub refused: u64,
        /// Accept completions that failed.
        pub accept_errors: u64,
        /// Accepted connections closed at once to keep `fd_reserve` descriptors free.
        pub accepts_shed: u64,
        /// Times accepting paused at the descriptor limit (EMFILE, ENFILE, ENOBUFS, ENOMEM).
        pub emfile: u64,
        /// Dials started, and those that failed, by kind.
        pub dials: u64,
        pub dial_no_ports: u64,
        pub dial_not_permitted: u64,
        pub dial_refused: u64,
        pub dial_unreachable: u64,
        pub dial_other: u64,
        /// Source ports skipped while dialling (in use toward that peer, or bound elsewhere).
        pub dial_ports_skipped: u64,
        /// Bytes read from and written to sockets.
        pub bytes_in: u64,
        pub bytes_out: u64,
        /// Zero-copy sends issued (IORING_OP_SEND_ZC), and those the kernel copied after all.
        pub zc_sends: u64,
        pub zc_copied: u64,
        /// Closes asked for, by mode; graceful closes that hit `close_bound` (then reset).
        pub graceful_closes: u64,
        pub aborted_closes: u64,
        pub close_bound_hits: u64,
        /// Streams that ended under the engine, by reason.
        pub ended_eof: u64,
        pub ended_reset: u64,
        pub ended_timeout: u64,
        pub ended_error: u64,
        /// Actions naming a stream or incoming connection this driver does not know.
        pub unknown_actions: u64,
        /// Actions that break the contract (a second `Recv`, memory out of range, an empty read):
        /// refused with an error to the engine.
        pub bad_actions: u64,
        /// setsockopt calls of `Configure` that failed.
        pub option_errors: u64,
    }
}
