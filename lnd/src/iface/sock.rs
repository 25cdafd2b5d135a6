//! Tunables and counters of one socklnd NI (the `sock` module's `SockEngine`), with ksocklnd's names and
//! 2.16.1 defaults (shared/reference/lustre-socklnd.md section 7), as `net show -v` prints them.

use std::net::SocketAddrV4;

use crate::time::Duration;
use crate::wire::Nid;

/// Which dialers the LNet acceptor takes (the lnet module's `accept`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum AcceptMode {
    /// Only from source ports <= 1023 (the kernel's default: `acceptor.c:lnet_acceptor`).
    #[default]
    Secure,
    /// From any port (a dialer from a port above 1023 becomes a userspace peer).
    All,
    /// No listener: the NI takes no connections.
    None,
}

/// One NI's socklnd settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SockConfig {
    /// The NI's NID (an IPv4 address on a `tcp` net).
    pub nid: Nid,
    /// The NI's incarnation: the kernel takes the wall clock in ns at NI start-up
    /// (`socklnd.c:ksocknal_startup`); the layer that builds the engine passes it in.
    pub incarnation: u64,
    /// `sock_timeout` (lnetctl `timeout`): every LND deadline. 0 in the module means LNet's
    /// `lnd_timeout` = (transaction_timeout 150 - 1) / (retry_count 2 + 1) = 49 s.
    pub timeout: Duration,
    /// NI tx credits (`credits`, 256).
    pub credits: u32,
    /// Per-peer credits (`peer_credits`, 8); here also the most received messages LNet may
    /// hold per connection before we stop reading it.
    pub peer_credits: u32,
    /// Router buffer credits per peer (`peer_buffer_credits`; 0 = peer_credits).
    pub peer_buffer_credits: u32,
    /// `peer_timeout` (180 s): LNet's aliveness of peers on routers.
    pub peer_timeout: Duration,
    /// `typed_conns` (1): CONTROL + BULK_IN + BULK_OUT connections, else ANY ones.
    pub typed_conns: bool,
    /// `min_bulk` (1024): messages of at least this many bytes prefer BULK_OUT.
    pub min_bulk: u32,
    /// `conns_per_peer` (0 = from the link speed; we know none, so 1).
    pub conns_per_peer: u32,
    /// `nagle` (0: TCP_NODELAY).
    pub nagle: bool,
    /// `keepalive` (30 s): a NOOP after this long with nothing received; zero: none.
    pub keepalive: Duration,
    /// TCP keepalive: `keepalive_idle` / `_intvl` / `_count` (30 / 5 / 5).
    pub keepalive_idle: u32,
    pub keepalive_intvl: u32,
    pub keepalive_count: u32,
    /// `zc_min_payload` (16384): shown only; we never request zero-copy ACKs (a userspace
    /// sender frees its buffer on the local completion, reference section 10).
    pub zc_min_payload: u32,
    /// `tos` (-1 = off).
    pub tos: Option<u8>,
    /// `min_reconnectms` / `max_reconnectms` (1 s / 60 s): the dial backoff.
    pub min_reconnect: Duration,
    pub max_reconnect: Duration,
    /// The lnet module's `accept` (secure).
    pub accept: AcceptMode,
    /// `accept_port` (988): where we listen and where we dial (0: any, for tests).
    pub accept_port: u16,
    /// `accept_backlog` (127).
    pub accept_backlog: u32,
    /// `accept_timeout` (5 s): each read of the acceptor request and of a dialer's HELLO.
    pub accept_timeout: Duration,
    /// Source ports of our dials, tried from `ports_from` down to `ports_to` (1023..512 as
    /// the kernel's `lnet_connect`; `ports_from` 0 = any port, for unprivileged tests).
    pub ports_from: u16,
    pub ports_to: u16,
    /// Connections accepted whose HELLO is not in yet, at most (more are refused at once).
    pub max_unauthenticated: u32,
    /// Peers kept at most (a HELLO from a new NID beyond this is refused).
    pub max_peers: u32,
    /// Ours: how long a bulk payload may take to land once LNet lent it memory (a router's
    /// large buffer); the kernel only bounds the gap between two bytes (sock_timeout), so a
    /// peer trickling a byte every 48 s pins the buffer for ever (reference section 11).
    pub grant_timeout: Duration,
    /// Ours: payloads up to this come up to LNet inline with their header; larger ones as a
    /// bulk request, to land straight in the memory LNet chooses. [`super::INLINE_LIMIT`] by
    /// default (the contract every LND keeps, so a router can pass any inline payload on).
    pub max_inline: u32,
}

impl SockConfig {
    /// ksocklnd's defaults for `nid`.
    pub fn new(nid: Nid, incarnation: u64) -> SockConfig {
        SockConfig {
            nid,
            incarnation,
            timeout: Duration::from_secs(49),
            credits: 256,
            peer_credits: 8,
            peer_buffer_credits: 0,
            peer_timeout: Duration::from_secs(180),
            typed_conns: true,
            min_bulk: 1024,
            conns_per_peer: 0,
            nagle: false,
            keepalive: Duration::from_secs(30),
            keepalive_idle: 30,
            keepalive_intvl: 5,
            keepalive_count: 5,
            zc_min_payload: 16384,
            tos: None,
            min_reconnect: Duration::from_secs(1),
            max_reconnect: Duration::from_secs(60),
            accept: AcceptMode::Secure,
            accept_port: 988,
            accept_backlog: 127,
            accept_timeout: Duration::from_secs(5),
            ports_from: 1023,
            ports_to: 512,
            max_unauthenticated: 256,
            max_peers: 16384,
            grant_timeout: Duration::from_secs(1),
            max_inline: super::INLINE_LIMIT as u32,
        }
    }

    /// Connections of each bulk type per peer: `conns_per_peer`, 0 (automatic from the link
    /// speed, which we do not know) counting as 1 as the kernel does for an unknown speed.
    pub fn conns_per_peer(&self) -> u32 {
        self.conns_per_peer.clamp(1, 127)
    }
}

/// Counters of one socklnd NI. All only grow, except the gauges marked so.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SockStats {
    /// Dials started.
    pub connects: u64,
    /// Dials that failed before a HELLO answer (refused, unreachable, no port, timed out).
    pub connect_failures: u64,
    /// Incoming connections adopted.
    pub accepts: u64,
    /// Connections that completed their HELLO exchange.
    pub established: u64,
    /// Incoming connections refused at once: source port above 1023 with `accept=secure`.
    pub refused_insecure_port: u64,
    /// Incoming connections refused at once: `max_unauthenticated` reached, or shutting down.
    pub refused_unauthenticated_limit: u64,
    /// 16-byte acceptor refusals sent (a HELLO without request, an unknown request version).
    pub acceptor_refusals: u64,
    /// Acceptor requests for a NID that is not ours.
    pub refused_no_ni: u64,
    /// Connections closed for a bad magic (acceptor or HELLO).
    pub bad_magic: u64,
    /// HELLOs with a bad field (NID ANY, too many IPs, a zero IP, a bad type, another net).
    pub bad_hello: u64,
    /// HELLO refusals (ctype -1) sent: unknown version (V1, V4, others).
    pub refused_version: u64,
    /// ... connection race (requester NID lower than ours while we dial it).
    pub refused_race: u64,
    /// ... new incarnation or protocol for a peer with connections.
    pub refused_stale: u64,
    /// ... duplicate connection type.
    pub refused_duplicate: u64,
    /// ... peer table full.
    pub refused_peer_limit: u64,
    /// HELLO refusals received as dialer (EALREADY and EPROTO).
    pub refusals_received: u64,
    /// Dials given up after too many consecutive races.
    pub race_giveups: u64,
    /// Answers whose NID or pid was not the one dialed ("they claimed they were Y").
    pub identity_mismatch: u64,
    /// Peers whose connections were closed because of a new incarnation from their address.
    pub peers_rebooted: u64,
    /// Handshakes that missed their deadline (acceptor read, HELLO, dial).
    pub handshake_timeouts: u64,
    /// Protocol errors on established connections (bad type, bad header, bogus ZC-ACK,
    /// payload > LNET_MTU, EOF inside a message).
    pub protocol_errors: u64,
    /// Checksum mismatches.
    pub checksum_errors: u64,
    /// Connections closed because a message stalled mid-way for `timeout`.
    pub rx_stalls: u64,
    /// Bulk receives not finished within `grant_timeout`.
    pub bulk_stalls: u64,
    /// Connections closed because a send made no progress for `timeout`.
    pub tx_stalls: u64,
    /// Messages sent / received (LNet messages, not NOOPs).
    pub msgs_sent: u64,
    pub msgs_received: u64,
    /// Payload bytes received straight into LNet's memory.
    pub bulk_bytes_received: u64,
    /// Zero-copy ACKs sent (for the peer's requests), NOOPs received, keepalives sent.
    pub zc_acks_sent: u64,
    pub noops_received: u64,
    pub keepalives_sent: u64,
    /// Messages delivered to ourselves without a connection.
    pub loopback_msgs: u64,
    /// Sends failed (any reason).
    pub send_failures: u64,
    /// Closes: graceful / aborted.
    pub closes_graceful: u64,
    pub closes_abort: u64,
    /// Capture records dropped because the capture queue was full (`lnetctl capture`).
    pub capture_drops: u64,
    /// Gauges: connections now, and of those not yet through their HELLO.
    pub conns: u64,
    pub unauthenticated: u64,
}

/// One connection as `conn show` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SockConnView {
    pub peer: Option<Nid>,
    pub remote: SocketAddrV4,
    pub local: SocketAddrV4,
    /// Our view of its type: "control", "bulk_in", "bulk_out", "any" ("" before the HELLO).
    pub ctype: &'static str,
    pub state: &'static str,
    pub active: bool,
    /// Bytes handed to the socket not yet reported sent.
    pub queued_bytes: u64,
    pub zc_acks_sent: u64,
    pub zc_acks_received: u64,
}
