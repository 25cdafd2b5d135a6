//! What an operator sets ([`VerbsConfig`]), what can go wrong at start ([`VerbsError`]) and what
//! the fabric counts ([`VerbsStats`]).

use super::*;

/// The verbs fabric's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Where the listener binds (o2iblnd's `service` port is 987).
    pub listen: SocketAddr,
    /// Bound on address resolution and on route resolution, each (5 s, RDMA_RESOLVE_TIMEOUT).
    pub resolve_timeout: std::time::Duration,
    /// rdma_connect / rdma_accept retry_count (5) and rnr_retry_count (6).
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// How long `poll` busy-polls the CQs and the cm channel before it arms the CQs and blocks
    /// in poll(2) (default 50 us, as the tcp fabric; zero: never spin). Waking from the
    /// completion channel costs tens of microseconds, more than the next completion on a busy
    /// link; the budget bounds what an idle link burns per loop turn.
    pub busy_poll: std::time::Duration,
    /// Listen backlog.
    pub backlog: i32,
    /// RDMA fragments per message the send queue has room for (IBLND_MAX_RDMA_FRAGS, 257): send
    /// WRs = messages + queue depth x `max_frags`, reduced to what the device allows.
    pub max_frags: u16,
    /// Most work requests posted in one chain (one ibv_post_send).
    pub max_chain: usize,
}

impl Default for VerbsConfig {
    fn default() -> VerbsConfig {
        VerbsConfig {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 987),
            resolve_timeout: std::time::Duration::from_secs(5),
            retry_count: 5,
            rnr_retry_count: 6,
            busy_poll: std::time::Duration::from_micros(50),
            backlog: 256,
            max_frags: MAX_RDMA_FRAGS as u16,
            max_chain: 64,
        }
    }
}

/// Why a verbs fabric could not start.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error("no RDMA device: ibv_get_device_list found none; fabric: verbs needs an RDMA NIC or Soft-RoCE (rdma_rxe)")]
    NoDevice,
    #[error("verbs fabric: {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

pub(super) fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> VerbsError {
    move |source| VerbsError::Io { what, source }
}

counter_struct! {
    /// Counters. All only grow, except `regions` (a gauge).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct VerbsStats {
        pub connects: u64,
        pub connect_failures: u64,
        pub requests: u64,
        pub accepts: u64,
        pub rejects_sent: u64,
        pub rejects_received: u64,
        pub established: u64,
        pub disconnects: u64,
        pub msgs_tx: u64,
        pub msgs_rx: u64,
        pub early_rx: u64,
        pub send_errors: u64,
        pub recv_errors: u64,
        pub setup_errors: u64,
        pub unknown_actions: u64,
        pub bad_sends: u64,
        pub stale_events: u64,
        /// RDMA writes posted, and their bytes.
        pub rdma_writes: u64,
        pub rdma_write_bytes: u64,
        /// RDMA writes that completed with an error other than a flush, or were refused before
        /// reaching the device (outside their local region, unknown region).
        pub rdma_write_errors: u64,
        /// Regions registered, deregistered, and held now (gauge).
        pub regions_registered: u64,
        pub regions_deregistered: u64,
        pub regions: u64,
        /// ibv_post_send calls, and the work requests they carried.
        pub doorbells: u64,
        pub wrs_posted: u64,
        /// Times a connection's send queue was full and work waited in its backlog.
        pub sq_full: u64,
        /// Queue pairs made with a smaller RDMA share of the send queue than asked for.
        pub qp_shrinks: u64,
    }
}
