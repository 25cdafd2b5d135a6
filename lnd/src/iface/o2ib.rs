//! Tunables and policies of one LND endpoint, with o2iblnd's defaults (reference section 9.1).

use crate::time::Duration;
use crate::wire::kib::CksumFlavour;
use crate::wire::{Nid, RejectReason};

/// How the passive side settles a connection race, and what ends a stuck active connect.
/// The first three reproduce Lustre's history so the simulator can compare them (S1).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum RacePolicy {
    /// Lustre 2.8: the higher NID always wins; nothing bounds a stuck active connect.
    Lustre28,
    /// LU-7646: as 2.8, but after `race_limit` CONN_RACE rejects the higher NID yields.
    Lu7646,
    /// LU-17480: LU-7646 plus a deadline on every active connect.
    Lu17480,
    /// Ours: LU-17480, and an active connect is abandoned the moment it is proven stale (the peer
    /// connected to us with an incarnation our attempt does not name).
    Ulnet,
}

impl RacePolicy {
    /// Every policy, in historical order.
    pub const ALL: [RacePolicy; 4] = [
        RacePolicy::Lustre28,
        RacePolicy::Lu7646,
        RacePolicy::Lu17480,
        RacePolicy::Ulnet,
    ];

    pub(crate) fn counts_races(self) -> bool {
        !matches!(self, RacePolicy::Lustre28)
    }

    pub(crate) fn bounds_connects(self) -> bool {
        matches!(self, RacePolicy::Lu17480 | RacePolicy::Ulnet)
    }

    pub(crate) fn abandons_stale(self) -> bool {
        matches!(self, RacePolicy::Ulnet)
    }

    /// Ours: learn a peer's race order from double rejects, and walk a peer that keeps
    /// answering CONN_RACE to its race limit at a quick bounded pace. Kernel Lustre does neither.
    pub(crate) fn adapts_to_peer(self) -> bool {
        matches!(self, RacePolicy::Ulnet)
    }

    /// Ours: an active connect with no answer after `connect_hedge` gets a second attempt
    /// beside it (see `Tunables::connect_hedge`). Kernel Lustre waits out each attempt.
    pub(crate) fn hedges(self) -> bool {
        matches!(self, RacePolicy::Ulnet)
    }
}

/// Which order of NIDs settles a connection race ("who is higher"). Both sides of a race must
/// compute the same one, and Lustre changed it, so it is a setting that follows the peers' kernels.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum RaceOrder {
    /// Lustre 2.16 and later (LU-17743): [`Nid::nidhash`], as a little-endian host computes it.
    #[default]
    NidHash,
    /// Lustre up to 2.15: the raw 64-bit NID.
    Nid,
}

impl RaceOrder {
    /// Both orders.
    pub const ALL: [RaceOrder; 2] = [RaceOrder::NidHash, RaceOrder::Nid];

    /// The value compared: a peer is "higher" when its key is strictly greater.
    pub fn key(self, nid: Nid) -> u64 {
        match self {
            RaceOrder::NidHash => u64::from(nid.nidhash()),
            RaceOrder::Nid => nid.raw(),
        }
    }

    /// True when `a` is strictly lower than `b` under this order.
    pub fn lower(self, a: Nid, b: Nid) -> bool {
        self.key(a) < self.key(b)
    }

    /// The other order: what a peer that disagrees with this one must be using.
    pub fn other(self) -> RaceOrder {
        match self {
            RaceOrder::NidHash => RaceOrder::Nid,
            RaceOrder::Nid => RaceOrder::NidHash,
        }
    }

    /// The name used in configs and tools.
    pub fn name(self) -> &'static str {
        match self {
            RaceOrder::NidHash => "nidhash",
            RaceOrder::Nid => "nid",
        }
    }
}

impl std::str::FromStr for RaceOrder {
    type Err = String;
    fn from_str(s: &str) -> Result<RaceOrder, String> {
        match s {
            "nidhash" => Ok(RaceOrder::NidHash),
            "nid" => Ok(RaceOrder::Nid),
            other => Err(format!(
                "unknown race order '{other}' (known: nidhash, nid)"
            )),
        }
    }
}

/// Per-NI tunables. `Default` gives o2iblnd's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tunables {
    /// Queue depth offered to peers (peer_credits, clamped to 2..=255 here; o2iblnd clamps to 8..=255).
    pub peer_credits: u16,
    /// Outstanding credits at which a NOOP returns them; 0 = peer_credits / 2.
    pub peer_credits_hiw: u16,
    /// Posted-but-uncompleted sends per connection; 0 = peer_credits.
    pub concurrent_sends: u16,
    /// LND tx timeout: a queued or posted message older than this fails its connection.
    pub timeout: Duration,
    /// Idle time after which a keepalive NOOP is sent.
    pub keepalive: Duration,
    /// Deadline of an active connect; `None` = max(5 s, timeout / 4) (LU-17480).
    pub connect_timeout: Option<Duration>,
    /// How long a close waits for the peer's disconnect before tearing down anyway.
    pub close_timeout: Duration,
    /// CONN_RACE rejects before the higher NID yields (MAX_CONN_RACES_BEFORE_ABORT).
    pub race_limit: u32,
    /// Reconnects made as soon as the failed connection is reaped (KIB_RECONN_HIGH_RACE).
    pub fast_reconnects: u32,
    /// After the fast ones, at most one reconnect per this interval per peer.
    pub reconnect_interval: Duration,
    /// Random extra delay, up to this much, added to each paced reconnect.
    pub reconnect_jitter: Duration,
    /// Ours: the pace of retries to a peer that refused us with CONN_RACE, until it has done so
    /// `race_limit` + 1 times (then the usual pacing). The peer is alive and answering; a kernel
    /// peer lets the lower NID win after `race_limit` refusals (LU-7646), and at one try a
    /// second that takes 10 s more than it needs to.
    pub race_retry_interval: Duration,
    /// Ours: how long an active connect may go unanswered, while messages wait for it, before
    /// a second attempt starts beside it (zero: never). Both keep their deadlines; the first to
    /// be established is kept and the other aborted. A connect that never completes (LU-7646's
    /// stuck HCA, a lost CM message) then costs this long instead of a whole connect deadline,
    /// and two in a row cost one deadline rather than two. At most two attempts per peer are in
    /// flight, so a failed pair leaves at most one zombie at a time.
    pub connect_hedge: Duration,
    /// Connections we open to each peer (o2iblnd's `conns_per_peer`, 1..=127; 1 as its
    /// default). Each has its own `peer_credits`, so N connections carry N times the messages
    /// in flight: what a router needs towards a busy server. The first is opened when messages
    /// wait, each further one once the one before it is up; new messages take them in turn
    /// (kiblnd_get_conn_locked) when there are several.
    pub conns_per_peer: u16,
    /// Ours: how long a peer may take to fill memory we granted it (our PUT_ACK or GET_REQ)
    /// and send its completion; zero: only the LND `timeout`. A 1 MiB write takes
    /// microseconds to milliseconds, so a grant that outlives this is a stalled or hostile
    /// peer pinning our buffer (kernel LNet lets a router buffer be held until the LND
    /// timeout, 50 s): the transfer fails and the grant is reclaimed (`grants_reclaimed`).
    pub grant_timeout: Duration,
}

impl Default for Tunables {
    fn default() -> Tunables {
        Tunables {
            peer_credits: 8,
            peer_credits_hiw: 0,
            concurrent_sends: 0,
            timeout: Duration::from_secs(50),
            keepalive: Duration::from_secs(100),
            connect_timeout: None,
            close_timeout: Duration::from_secs(1),
            race_limit: 20,
            fast_reconnects: 10,
            reconnect_interval: Duration::from_secs(1),
            reconnect_jitter: Duration::from_millis(250),
            race_retry_interval: Duration::from_millis(100),
            connect_hedge: Duration::from_secs(1),
            conns_per_peer: 1,
            grant_timeout: Duration::from_secs(1),
        }
    }
}

impl Tunables {
    /// The queue depth we offer.
    pub fn queue_depth(&self) -> u16 {
        self.peer_credits.clamp(2, 255)
    }

    /// The credit high-water mark for a connection of `queue_depth` (LU-12569).
    pub fn credits_hiw(&self, queue_depth: u16) -> u16 {
        let pc = self.queue_depth();
        let hiw = if self.peer_credits_hiw == 0 {
            pc / 2
        } else {
            self.peer_credits_hiw.clamp(pc / 2, pc - 1)
        };
        ((u32::from(queue_depth) * u32::from(hiw)) / u32::from(pc)).max(1) as u16
    }

    /// Concurrent sends allowed per connection.
    pub fn concurrent_sends(&self) -> u16 {
        let pc = self.queue_depth();
        if self.concurrent_sends == 0 {
            pc
        } else {
            self.concurrent_sends.clamp(pc / 2, pc * 2)
        }
    }

    /// The deadline on an active connect.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout.unwrap_or_else(|| {
            Duration::from_secs(5).max(Duration::from_nanos(self.timeout.as_nanos() / 4))
        })
    }
}

/// ulnet's message-checksum settings for one NI (o2iblnd's `cksum` module parameter, plus what
/// o2iblnd does not need: a kernel only ever computes its own flavour).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct ChecksumConfig {
    /// Fill `ibm_cksum` on what we send (default off, as o2iblnd's `cksum=0`). Received
    /// checksums are always verified, in either flavour.
    pub emit: bool,
    /// What to send to a peer whose flavour is not known yet (it has sent us nothing
    /// checksummed): `None` sends no checksum (0), which every kernel accepts.
    pub default_flavour: Option<CksumFlavour>,
}

/// Peers the LND keeps at most by default: a router in front of 20,000+ clients, with room
/// for all of them at once and then some (about 0.5 KiB each).
pub const DEFAULT_PEER_LIMIT: usize = 131_072;

/// Everything an endpoint needs to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointConfig {
    /// This NI's NID.
    pub nid: Nid,
    /// This instance's incarnation: a fresh stamp at every start (o2iblnd uses wall-clock
    /// microseconds); the driver chooses it, the core never reads a clock.
    pub incarnation: u64,
    pub tunables: Tunables,
    pub race_policy: RacePolicy,
    /// The order of NIDs our race rule uses, until a peer shows it uses the other.
    pub race_order: RaceOrder,
    pub checksum: ChecksumConfig,
    /// Most peers kept at once; a connect request from a new peer beyond it is refused with
    /// NO_RESOURCES and a send to one fails with `SendError::PeerTableFull`.
    pub peer_limit: usize,
    /// Seed of the reconnect jitter.
    pub seed: u64,
}

impl EndpointConfig {
    /// A config with default tunables and our race policy.
    pub fn new(nid: Nid, incarnation: u64) -> EndpointConfig {
        EndpointConfig {
            nid,
            incarnation,
            tunables: Tunables::default(),
            race_policy: RacePolicy::Ulnet,
            race_order: RaceOrder::default(),
            checksum: ChecksumConfig::default(),
            peer_limit: DEFAULT_PEER_LIMIT,
            seed: incarnation ^ nid.raw(),
        }
    }
}

/// Counters for `lnetctl`. All only grow, except the gauges marked so.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LndStats {
    /// Active connects started (first attempts and reconnects).
    pub connects: u64,
    /// Of those, reconnects after a failed or rejected attempt.
    pub reconnects: u64,
    /// Connect requests accepted.
    pub accepts: u64,
    /// Connections that reached ESTABLISHED.
    pub established: u64,
    /// Rejects we sent, by reason code (index = IBLND_REJECT_* value, 0 = other).
    pub rejects_sent: [u64; 10],
    /// Rejects we received, by reason code.
    pub rejects_received: [u64; 10],
    /// CONN_RACE rejects we sent (the higher NID keeping its own attempt).
    pub races: u64,
    /// Times we let a lower NID win after `race_limit` races (LU-7646).
    pub race_yields: u64,
    /// Active connects abandoned because a request proved them stale (ours).
    pub stale_abandons: u64,
    /// Second active connects started beside one that went unanswered (ours, `connect_hedge`).
    pub connect_hedges: u64,
    /// The earlier of two attempts given up when the second went unanswered as long (ours,
    /// `connect_hedge`): a third starts beside the second instead of waiting out a deadline.
    pub hedge_abandons: u64,
    /// Active or passive handshakes that passed their deadline (LU-17480).
    pub connect_timeouts: u64,
    /// Connect attempts that failed at the fabric (unreachable, no listener, errors).
    pub connect_failures: u64,
    /// Zombie connections right now (gauge).
    pub zombies: u64,
    /// Connections reaped (destroyed).
    pub reaped: u64,
    /// Messages that passed the LND timeout.
    pub tx_timeouts: u64,
    /// Keepalive NOOPs sent.
    pub keepalives: u64,
    /// NOOPs sent to return credits.
    pub credit_noops: u64,
    /// Messages sent and received (all kib types, NOOPs included).
    pub msgs_sent: u64,
    pub msgs_received: u64,
    /// Payload bytes handed to and from LNet.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Connections closed gracefully: by us without an error, or by the peer's close handshake
    /// (the fabric reported `DisconnectReason::Closed`).
    pub graceful_closes: u64,
    /// Connections we lost to an error (timeout, retry exceeded, protocol error, a connection
    /// the fabric found broken).
    pub conns_lost: u64,
    /// Established connections the fabric ended for a protocol error it found (a bad frame, an
    /// RDMA write outside a granted region, garbage): each is in `conns_lost` too.
    pub fabric_protocol_errors: u64,
    /// Established connections the fabric ended because the transport failed (a reset, an EOF
    /// without a disconnect, a timeout, a queue pair in error): each is in `conns_lost` too.
    pub fabric_transport_errors: u64,
    /// Closes that waited the full close timeout for the peer.
    pub close_timeouts: u64,
    /// Connections torn down without a close: only possible if the endpoint is dropped while it
    /// owns connections (the 3FS #426 failure). Counted through `Endpoint::leak_counter` too.
    pub ungraceful_drops: u64,
    /// Messages refused by the parser, with the connection closed.
    pub bad_msgs: u64,
    /// Messages LNet refused as a protocol violation (`Endpoint::recv_failed`), with the
    /// connection closed.
    pub rx_refused: u64,
    /// Messages whose stamps named another instance (kiblnd "Stale rx").
    pub stale_rx: u64,
    /// Peers that returned more credits than the queue depth.
    pub credit_overflows: u64,
    /// Connect requests refused because they could not be parsed or were not for us.
    pub bad_connreqs: u64,
    /// RDMA completions (PUT_ACK, PUT_NAK, PUT_DONE, GET_DONE) matching no message of ours
    /// waiting for one on that connection, by (cookie, type): each closes its connection
    /// (EPROTO), as an unmatched completion does in o2iblnd (kiblnd_handle_completion).
    pub unmatched_completions: u64,
    /// Rendezvous requests (PUT_REQ, GET_REQ) answered without a transfer: nothing matched
    /// (PUT_NAK 0, GET_DONE -ENODATA) or LNet refused it (its errno).
    pub rdma_refused: u64,
    /// Rendezvous finished, by role: PUTs whose data we wrote (source), PUTs written into us
    /// (sink), GETs answered by our write, GETs written into us; and the bytes moved each way.
    pub rdma_puts_sent: u64,
    pub rdma_puts_received: u64,
    pub rdma_gets_served: u64,
    pub rdma_gets_received: u64,
    pub rdma_bytes_sent: u64,
    pub rdma_bytes_received: u64,
    /// Rendezvous whose peer advertised a sink larger than our source (PUT_DONE / GET_DONE
    /// -EPROTO, nothing written), or needing more fragments than the connection allows
    /// (-EMSGSIZE): that message fails, the connection stays.
    pub rdma_bad_sinks: u64,
    /// Malformed rendezvous descriptors or completions: a PUT_ACK's descriptor with an empty or
    /// wrapping fragment (the connection is closed), a GET_REQ's (answered GET_DONE -EPROTO),
    /// a PUT_DONE or GET_DONE claiming more bytes than our sink holds (the connection is closed).
    pub rdma_bad_descs: u64,
    /// PUT_DONEs and GET_DONEs with a success status whose data did not all arrive (a fabric
    /// that sees writes reported fewer bytes of the sink written, from its start, than the
    /// completion accounts for): the transfer fails with -EPROTO and the connection is closed,
    /// so a buffer lent before is never passed on with its previous user's bytes.
    pub rdma_short_writes: u64,
    /// Grants of our memory (PUT_ACK, GET_REQ sinks) reclaimed after `grant_timeout` without
    /// their completion; on a fabric that cannot see writes, each closed its connection.
    pub grants_reclaimed: u64,
    /// Connections closed because a message to the peer missed its LND deadline while the peer
    /// had said nothing since it was queued: a peer that owed us credits or a completion and
    /// went silent. (A peer that owes us nothing may stay silent forever, as in o2iblnd.)
    pub silent_peers: u64,
    /// Peers reported down.
    pub peers_down: u64,
    /// Peers whose incarnation changed (a reboot seen).
    pub peer_reboots: u64,
    /// Connect requests (or their answers) from an instance of the peer that a newer one had
    /// already replaced, refused as stale instead of taken for a restart back to it.
    pub superseded_connreqs: u64,
    /// Captured messages dropped because the driver did not drain the capture fast enough.
    pub capture_drops: u64,
    /// Races in which we refused the peer with CONN_RACE and it refused us too: it orders NIDs
    /// the other way (a Lustre 2.15 peer among 2.16 ones, or the reverse).
    pub race_order_disagreements: u64,
    /// Peers for which we switched to the other race order after such races.
    pub race_order_adoptions: u64,
    /// Peers whose checksum flavour we learned from their checksummed messages, by flavour.
    pub cksum_signed_peers: u64,
    pub cksum_unsigned_peers: u64,
    /// Peers forgotten once they had no connection and nothing queued (as o2iblnd frees its
    /// peer), and connect requests or sends refused because the peer table was full.
    pub peers_forgotten: u64,
    pub peer_table_full: u64,
    /// Connection state changes the transition table refused (a bug if ever non-zero: chaos
    /// tests assert 0).
    pub invalid_transitions: u64,
}

impl LndStats {
    pub(crate) fn count_reject(table: &mut [u64; 10], why: RejectReason) {
        let i = usize::from(why.code());
        if let Some(c) = table.get_mut(i) {
            *c += 1;
        } else {
            table[0] += 1;
        }
    }
}
