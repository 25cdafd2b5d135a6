//! The wire protocol: [`Request`] and [`Response`] (one JSON object per line), the errnos and the
//! show structs a response carries in lnetctl's own key names, the encoders and decoders of a
//! line, the request size cap, and where the socket is by default.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::capture::{CaptureData, CaptureStarted, CaptureSummary};

// ---------------------------------------------------------------------------------- errnos

/// errno values used in [`ControlError::errno`]: the workspace's table (Linux numbering,
/// positive), here under `router::control::errno` where lnetctl and the tests name them.
pub use lnd::wire::errno;

/// Lustre's ping timeout when none is given, and the most it accepts (DEFAULT_PEER_TIMEOUT,
/// reference section 7.2).
pub const MAX_PING_TIMEOUT_SECS: u64 = 180;

// ---------------------------------------------------------------------------------- protocol

/// What `lnetctl` asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// `lnetctl ping NID... [--timeout S] [--source NID]`.
    Ping {
        nids: Vec<String>,
        /// Seconds; `None` = 180 (Lustre's cap), larger values are capped.
        #[serde(default)]
        timeout_secs: Option<u64>,
        /// Must be one of our NIDs on the target's net (we send from the first NI on a net).
        #[serde(default)]
        source: Option<String>,
    },
    NetShow {
        #[serde(default)]
        verbose: bool,
    },
    PeerShow {
        #[serde(default)]
        nid: Option<String>,
        #[serde(default)]
        verbose: bool,
    },
    ConnShow,
    StatsShow,
    /// `lnetctl stats reset`: LNet's counters back to zero on every NI.
    StatsReset,
    GlobalShow,
    /// `lnetctl capture`: stream a copy of every kib message every NI sends and receives. The
    /// daemon answers [`Response::CaptureStarted`] (or an error: one capture at a time), then
    /// [`Response::CaptureData`] chunks, then one [`Response::CaptureDone`], on this connection,
    /// which the capture then owns. See [`CaptureSession`](super::CaptureSession).
    CaptureStart {
        /// Stop after this many seconds (`None`: until stopped or the connection closes).
        #[serde(default)]
        duration_secs: Option<u64>,
    },
    /// Ends capture `id` (lnetctl sends it on the capture's connection on Ctrl-C). The capture
    /// then drains what the engines still hold and ends with [`Response::CaptureDone`].
    CaptureStop {
        id: u64,
    },
    /// `lnetctl selftest ...`: one of lst's commands, run by the daemon's selftest console
    /// (on its first NI, whose NID is the session's console NID).
    Selftest {
        cmd: crate::selftest::LstCommand,
    },
    /// `lnetctl route show [--net N] [--gateway NID] [-v]`.
    RouteShow {
        #[serde(default)]
        net: Option<String>,
        #[serde(default)]
        gateway: Option<String>,
        #[serde(default)]
        verbose: bool,
    },
    /// `lnetctl route add --net N --gateway NID [--hop H] [--priority P]`.
    RouteAdd {
        net: String,
        gateway: String,
        /// 1..=255, or -1 (undefined).
        #[serde(default)]
        hop: Option<i64>,
        #[serde(default)]
        priority: Option<u32>,
    },
    /// `lnetctl route del --net N [--gateway NID]`.
    RouteDel {
        net: String,
        #[serde(default)]
        gateway: Option<String>,
    },
    /// `lnetctl routing show`.
    RoutingShow,
    /// `lnetctl set routing 0|1`.
    SetRouting {
        enable: bool,
    },
    /// `lnetctl import [--add|--del|--show] FILE`: a document as `lnetctl export` or lnet.conf
    /// writes it, checked first as a configuration file is (errors name its lines), then
    /// applied to the running daemon item by item ([`ImportOp`]).
    Import {
        yaml: String,
        #[serde(default)]
        op: ImportOp,
        /// A document over [`MAX_REQUEST`] goes in parts (lnetctl cuts it between items),
        /// each an import of its own; under `--show`, where nothing is added, a part's
        /// routes are checked as if the whole document's `net:` section, given here, were
        /// there (it is not applied or counted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nets: Option<String>,
    },
    /// `lnetctl debug recovery --local|--peer`.
    DebugRecovery {
        local: bool,
    },
    /// `lnetctl set NAME VALUE` for one of LNet's global tunables
    /// ([`TUNABLES`](crate::globals::TUNABLES)), on every NI; an import's `global:` section
    /// sets several at once, all or nothing, so that the rules tying two of them hold for the
    /// result and not for each step (`GlobalTunables::set_all`).
    SetGlobals {
        values: Vec<(String, i64)>,
    },
    /// `lnetctl set tiny_buffers|small_buffers|large_buffers N`: the node's total of that
    /// size (a daemon gives each NI its share).
    SetBuffers {
        pool: String,
        count: u32,
    },
    /// An import's `routing:` module parameters (Lustre sets them under
    /// /sys/module/lnet/parameters; lnetctl has no `set` for them): each given one changes,
    /// the others stay. Seconds, 0..=[`MAX_ROUTER_CHECK_SECS`](crate::gateway::MAX_ROUTER_CHECK_SECS).
    SetRouterChecks {
        #[serde(default)]
        alive_router_check_interval: Option<u32>,
        #[serde(default)]
        router_ping_timeout: Option<u32>,
        #[serde(default)]
        avoid_asym_router_failure: Option<bool>,
    },
    /// `lnetctl net del`: stop every NI of `net`, or the one NI `nid`, closing its
    /// connections gracefully first (`net add` is an import of one `net:` item).
    NetDel {
        #[serde(default)]
        net: Option<String>,
        #[serde(default)]
        nid: Option<String>,
    },
    /// `lnetctl lnet configure [-a]`: LNet is up while the daemon runs; with `all`, as Lustre's
    /// `--all` (LNet configured from its module parameters), whatever the daemon's configuration
    /// file names and no longer runs comes back, its NIs then its routes (after `lnet
    /// unconfigure`, say). Answered with [`Response::Done`], or with `all` an
    /// [`ImportReport`] of what came back.
    LnetConfigure {
        #[serde(default)]
        all: bool,
    },
}

/// What the daemon answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ping(PingShow),
    Net(NetShow),
    Peer(PeerShow),
    Conn(ConnShow),
    Stats(StatsShow),
    Global(GlobalShow),
    CaptureStarted(CaptureStarted),
    CaptureData(CaptureData),
    CaptureDone(CaptureSummary),
    Route(RouteShow),
    Routing(RoutingShow),
    Selftest(crate::selftest::LstReply),
    /// What an import did, item by item.
    Import(ImportReport),
    Recovery(RecoveryShow),
    /// A change was made (route add/del, set): lnetctl prints nothing, as real lnetctl.
    Done,
    Error(ControlError),
}

/// What an import does with its document.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportOp {
    /// Configure what it names (`--add`, the default).
    #[default]
    Add,
    /// Remove what it names (`--del`): its routes.
    Del,
    /// Change nothing; report what `Add` would do (`--show`).
    Show,
}

/// What `lnetctl import` did: each item of the document applied, already so, or failed (in
/// document order), so that a partly applied import says exactly what is left to do.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportReport {
    pub op: ImportOp,
    /// Items changed.
    pub applied: u32,
    /// Items the daemon already had as the document says (an export imported back).
    pub unchanged: u32,
    pub failed: Vec<ImportFailure>,
}

/// One item an import could not apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportFailure {
    /// The section: `net`, `route`, `routing`, `buffers`, `global`.
    pub section: String,
    /// Negative, as lnetctl prints it.
    pub errno: i32,
    pub descr: String,
    /// The document's line of the item, where one item of a section failed (a route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
}

/// A request that failed as a whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlError {
    /// A positive errno ([`errno`]).
    pub errno: i32,
    pub message: String,
}

impl ControlError {
    pub fn new(errno: i32, message: impl Into<String>) -> ControlError {
        ControlError {
            errno,
            message: message.into(),
        }
    }
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// `lnetctl ping`: the peers that answered (`ping:`) and the failures (`manage:`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingShow {
    pub ping: Vec<PingPeer>,
    pub manage: Vec<PingFailure>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingPeer {
    #[serde(rename = "primary nid")]
    pub primary_nid: String,
    #[serde(rename = "Multi-Rail")]
    pub multi_rail: bool,
    /// The peer's NIDs, `0@lo` omitted.
    pub peer_ni: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingFailure {
    /// The NID that was pinged.
    pub ping: String,
    /// Negative, as lnetctl prints it.
    pub errno: i32,
    pub descr: String,
}

/// `lnetctl net show`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetShow {
    pub net: Vec<NetEntry>,
    /// Ours, from the daemon with `-v`: where peer NIDs listen (its configuration's `peers:`
    /// and every imported document's since), by NID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PeerAddress>,
    /// With `-v`, when a `tcp` NI runs: the LNet acceptor's settings (`acceptor:` of the
    /// configuration; every tcp NI has the same), for `lnetctl export`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptor: Option<AcceptorShow>,
}

/// The LNet acceptor's settings as in effect, under the configuration's keys (the lnet
/// module's `accept`, `accept_port`, `accept_backlog`, `accept_timeout`, and the source ports
/// of our dials).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptorShow {
    /// `secure`, `all` or `none`.
    pub accept: String,
    pub port: u16,
    pub backlog: u32,
    /// Seconds.
    pub timeout: u64,
    /// `HI-LO` as the configuration writes it, or `0` (any port).
    #[serde(rename = "source ports")]
    pub source_ports: String,
}

impl AcceptorShow {
    /// The settings a tcp NI's socklnd runs with.
    pub fn of(c: &lnd::iface::sock::SockConfig) -> AcceptorShow {
        use lnd::iface::sock::AcceptMode;
        AcceptorShow {
            accept: match c.accept {
                AcceptMode::Secure => "secure",
                AcceptMode::All => "all",
                AcceptMode::None => "none",
            }
            .into(),
            port: c.accept_port,
            backlog: c.accept_backlog,
            timeout: c.accept_timeout.as_secs(),
            source_ports: if c.ports_from == 0 {
                "0".into()
            } else {
                format!("{}-{}", c.ports_from, c.ports_to)
            },
        }
    }
}

/// One entry of the daemon's `peers:` table: a peer NID and the address its fabric dials.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerAddress {
    pub nid: String,
    pub address: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetEntry {
    #[serde(rename = "net type")]
    pub net_type: String,
    #[serde(rename = "local NI(s)")]
    pub local_nis: Vec<NiEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NiEntry {
    pub nid: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statistics: Option<Counts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunables: Option<NiTunables>,
    #[serde(
        rename = "lnd tunables",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub lnd_tunables: Option<LndTunables>,
    /// With `-v`: LNet health of this NI (`health stats`, api-ni.c's local NI keys).
    #[serde(
        rename = "health stats",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub health_stats: Option<NiHealthShow>,
    /// Ours, with `-v`: the LND's counters for this NI ([`LndCounters`]).
    #[serde(
        rename = "lnd statistics",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub lnd_statistics: Option<LndCounters>,
    /// Ours, with `-v`: the fabric under this NI and its counters ([`FabricCounters`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<FabricCounters>,
    /// Ours, with `-v`: ulnet's own settings of this NI ([`UlnetSettings`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ulnet: Option<UlnetSettings>,
}

/// ulnet's own per-NI settings, as in effect (`net show -v`, beside ulnet's counters).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UlnetSettings {
    /// The address the NI listens on, as bound: the port the OS chose when the configuration
    /// says port 0. Absent when the daemon did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `on` or `off`: whether we checksum what we send.
    pub checksum: String,
    /// The flavour sent to a peer whose own is not known yet: `none`, `signed` or `unsigned`.
    #[serde(rename = "checksum default")]
    pub checksum_default: String,
    /// `nidhash` (Lustre 2.16+) or `nid` (Lustre <= 2.15).
    #[serde(rename = "race order")]
    pub race_order: String,
    /// How long an unanswered active connect waits for its second attempt (0: never).
    #[serde(rename = "connect hedge ms", default)]
    pub connect_hedge_ms: u64,
    /// How long a peer may take to fill memory we granted it (0: the LND timeout only).
    #[serde(rename = "grant timeout ms", default)]
    pub grant_timeout_ms: Option<u64>,
    #[serde(rename = "peer limit")]
    pub peer_limit: u64,
    /// Peers the LND holds now.
    pub peers: u64,
    /// Microseconds the NI's fabric spins before it sleeps (`busy poll us`); absent when the
    /// daemon did not say.
    #[serde(
        rename = "busy poll us",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub busy_poll_us: Option<u32>,
    /// Sockets the tcp fabric lets be in their handshake at once (`handshake limit`, 0: no
    /// limit); absent when the daemon did not say.
    #[serde(
        rename = "handshake limit",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub handshake_limit: Option<u32>,
}

/// Named counters in a fixed order, shown as a map (`name: value`) in YAML and JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamedCounters(pub Vec<(String, u64)>);

impl NamedCounters {
    /// The counter called `name`, if present.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }

    /// Whether there is no counter at all (a table the LND does not keep).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for NamedCounters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k.as_str(), *v)))
    }
}

impl<'de> Deserialize<'de> for NamedCounters {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = NamedCounters;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of counter names to unsigned integers")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<NamedCounters, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, u64>()? {
                    out.push((k, v));
                }
                Ok(NamedCounters(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// `fabric:` of an NI in `net show -v` (ours): which fabric carries it (`type: tcp` or
/// `verbs`) and that fabric's own counters (for tcp: accepted sockets, frames refused by reason
/// such as `bad_kind`, `bad_length`, `truncated`, `unexpected_frames`, socket errors, ...), as
/// the daemon last refreshed them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricCounters {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(flatten)]
    pub counters: NamedCounters,
}

/// `lnd statistics:` of an NI in `net show -v` (ours): its LND engine's counters under their
/// field names, either o2iblnd's ([`lnd::engine::LndStats`], with the rejects it sent and
/// received by reason: `conn_race`, `conn_stale`, `fatal`, ...; `other` for unknown codes) or
/// ksocklnd's ([`lnd::iface::sock::SockStats`], which has no reject tables: its refusals are
/// counters of their own, so both tables are empty and left out).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LndCounters {
    #[serde(flatten)]
    pub counters: NamedCounters,
    #[serde(default, skip_serializing_if = "NamedCounters::is_empty")]
    pub rejects_sent: NamedCounters,
    #[serde(default, skip_serializing_if = "NamedCounters::is_empty")]
    pub rejects_received: NamedCounters,
}

/// `statistics: {send_count, recv_count, drop_count}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub send_count: u64,
    pub recv_count: u64,
    pub drop_count: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NiTunables {
    pub peer_timeout: u32,
    pub peer_credits: u32,
    pub peer_buffer_credits: u32,
    pub credits: u32,
}

/// An NI's `lnd tunables:`, the keys of its LND: o2iblnd's (peercredits_hiw,
/// concurrent_sends, conns_per_peer, timeout, keepalive) or ksocklnd's (conns_per_peer,
/// timeout, tos), as the kernel's `lnetctl net show -v` prints each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LndTunables {
    /// o2iblnd's, in effect (a configured 0 means peer_credits / 2), as the kernel shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peercredits_hiw: Option<u32>,
    /// o2iblnd's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_sends: Option<u32>,
    /// Connections opened to each peer (o2iblnd's; ksocklnd's per bulk type).
    #[serde(default = "one")]
    pub conns_per_peer: u32,
    /// Seconds (ksocklnd's sock_timeout).
    pub timeout: u64,
    /// Seconds (o2iblnd's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<u64>,
    /// ksocklnd's IP type of service (-1: not set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tos: Option<i32>,
}

/// `lnetctl peer show`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerShow {
    pub peer: Vec<PeerEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerEntry {
    #[serde(rename = "primary nid")]
    pub primary_nid: String,
    #[serde(rename = "Multi-Rail")]
    pub multi_rail: bool,
    #[serde(rename = "peer ni")]
    pub peer_ni: Vec<PeerNiEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerNiEntry {
    pub nid: String,
    /// `up`, `down` or `NA`.
    pub state: String,
    /// Present with `-v`.
    #[serde(default, skip_serializing_if = "Option::is_none", flatten)]
    pub detail: Option<PeerNiDetail>,
}

/// A local NI's `health stats`, in lnetctl's key order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NiHealthShow {
    pub fatal_error: u32,
    pub health_value: u32,
    pub interrupts: u64,
    pub dropped: u64,
    pub aborted: u64,
    pub no_route: u64,
    pub timeouts: u64,
    pub error: u64,
    pub ping_count: u32,
    /// When the next recovery ping is due, seconds on the daemon's clock (0: none).
    pub next_ping: u64,
}

/// A peer NI's `health stats`, in lnetctl's key order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerHealthShow {
    pub health_value: u32,
    pub dropped: u64,
    pub timeout: u64,
    pub error: u64,
    pub network_timeout: u64,
    pub ping_count: u32,
    pub next_ping: u64,
}

/// `lnetctl debug recovery --local|--peer`: the NIDs in that recovery queue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryShow {
    pub local: bool,
    pub nids: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerNiDetail {
    pub max_ni_tx_credits: i64,
    pub available_tx_credits: i64,
    pub min_tx_credits: i64,
    pub tx_q_num_of_buf: u64,
    pub available_rtr_credits: i64,
    pub min_rtr_credits: i64,
    pub statistics: Counts,
    #[serde(rename = "health stats", default)]
    pub health_stats: PeerHealthShow,
}

/// `lnetctl conn show` (ours): every LND connection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnShow {
    pub conn: Vec<ConnEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnEntry {
    /// Our NI's NID.
    pub ni: String,
    pub peer: String,
    /// The connection state (`Established`, `ActiveConnect`, ...).
    pub state: String,
    /// `active` (we connected) or `passive`.
    pub side: String,
    /// Send credits we hold (c), credits owed to the peer (oc), reserved for replies (rc).
    pub credits: u16,
    pub outstanding_credits: u16,
    pub reserved_credits: u16,
    pub queue_depth: u16,
    pub sends_posted: u16,
    /// Messages queued on the connection.
    pub queued: usize,
    /// CONN_RACE rejects we sent this peer.
    pub races: u32,
    /// The peer's incarnation, hex.
    pub incarnation: String,
    /// Milliseconds since the connection was created.
    pub age_ms: u64,
    /// A socklnd connection's own fields (absent for o2ib, whose fields are the ones above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sock: Option<SockConnDetail>,
}

impl ConnEntry {
    /// One socklnd connection: ksocklnd has no per-connection credits, reserved credits or
    /// send queue depth (its credits are LNet's, per peer), so those o2ib fields are 0 and
    /// lnetctl prints the socklnd ones ([`SockConnDetail`]) instead.
    pub fn socklnd(
        ni: String,
        peer: String,
        state: String,
        side: &str,
        sock: SockConnDetail,
    ) -> Self {
        ConnEntry {
            ni,
            peer,
            state,
            side: side.into(),
            credits: 0,
            outstanding_credits: 0,
            reserved_credits: 0,
            queue_depth: 0,
            sends_posted: 0,
            queued: 0,
            races: 0,
            incarnation: String::new(),
            age_ms: 0,
            sock: Some(sock),
        }
    }
}

/// What `conn show` adds for a socklnd connection (ksocklnd's `ksock_conn`): its type as the
/// HELLO set it, its addresses, the bytes queued on the socket, and the zero-copy ACKs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SockConnDetail {
    /// `CONTROL`, `BULK_IN`, `BULK_OUT`, `ANY`, or empty before the peer's HELLO.
    #[serde(rename = "type")]
    pub ctype: String,
    pub local: String,
    pub remote: String,
    /// Bytes handed to the socket and not yet reported sent.
    pub queued_bytes: u64,
    pub zc_acks_sent: u64,
    pub zc_acks_received: u64,
}

/// `lnetctl stats show`: LNet's counters under lnetctl's names (those this implementation can
/// produce honestly; see [`LnetStats`](crate::LnetStats)), plus ours at the end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsShow {
    pub statistics: Statistics,
    /// Ours: LNet's peer table: `peers` (peer NIs now), `peers_aged` (forgotten after
    /// peer_timeout without traffic), `peer_table_full` (sends to a new peer refused at the
    /// limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_table: Option<NamedCounters>,
    /// Ours, from the daemon: its control socket's counters
    /// ([`ControlCounters`](super::ControlCounters)): clients accepted, refused (too many at
    /// once), closed for idling, for a half-sent request, for an oversized request, and malformed
    /// requests. Absent from an in-process node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<NamedCounters>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statistics {
    pub msgs_alloc: u64,
    pub msgs_max: u64,
    /// Response-tracking blocks allocated: 0, ulnet tracks no ACK/REPLY deadlines beyond its
    /// pings and routed GETs.
    #[serde(default)]
    pub rst_alloc: u64,
    pub errors: u64,
    pub send_count: u64,
    /// LNet resends of local failures (a node with two NIs or more, `retry_count` > 0).
    #[serde(default)]
    pub resend_count: u64,
    pub response_timeout_count: u64,
    /// Sends ended by an interrupted LND transfer: 0 (ulnet's LND reports none such).
    #[serde(default)]
    pub local_interrupt_count: u64,
    /// Health status LOCAL_DROPPED: ulnet's LND gives none.
    #[serde(default)]
    pub local_dropped_count: u64,
    pub local_aborted_count: u64,
    pub local_no_route_count: u64,
    pub local_timeout_count: u64,
    pub local_error_count: u64,
    /// Health status REMOTE_DROPPED: ulnet's LND gives none.
    #[serde(default)]
    pub remote_dropped_count: u64,
    pub remote_error_count: u64,
    /// Health status REMOTE_TIMEOUT: ulnet's LND gives none.
    #[serde(default)]
    pub remote_timeout_count: u64,
    pub network_timeout_count: u64,
    /// Resends that failed (no resend left) / succeeded.
    #[serde(default)]
    pub failed_resends: u64,
    #[serde(default)]
    pub successful_resends: u64,
    pub recv_count: u64,
    pub route_count: u64,
    pub drop_count: u64,
    pub send_length: u64,
    pub recv_length: u64,
    pub route_length: u64,
    pub drop_length: u64,
    pub loopback_count: u64,
    pub loopback_length: u64,
}

/// `lnetctl route show`: one entry per (net, gateway); the verbose fields only with `-v`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteShow {
    pub route: Vec<RouteEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteEntry {
    pub net: String,
    pub gateway: String,
    /// -1: undefined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hop: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_sensitivity: Option<u32>,
    /// `up` or `down`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// `single-hop` or `multi-hop`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// `lnetctl routing show`: each CPT's router buffer pools (a daemon NI runtime is one CPT),
/// `enable`, and ours: the forwarding books.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingShow {
    pub cpts: Vec<CptPools>,
    pub enable: u32,
    /// Ours: every message accepted for forwarding is forwarded, dropped for a reason, or in
    /// flight (`received == forwarded + dropped + in_flight`).
    pub forwarding: ForwardingCounts,
    /// Ours: how the gateways of the routes are watched (`routing:`'s module parameters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_checks: Option<RouterChecks>,
}

/// The router pinger's module parameters as in effect, under their Lustre names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterChecks {
    /// Seconds between pings of each gateway (0: never).
    pub alive_router_check_interval: u64,
    /// Seconds a gateway ping may take.
    pub router_ping_timeout: u64,
    /// 1: a single-hop route whose gateway has no NI up on the route's net is not used.
    pub avoid_asym_router_failure: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CptPools {
    pub tiny: PoolShow,
    pub small: PoolShow,
    pub large: PoolShow,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolShow {
    pub npages: u32,
    pub nbuffers: u32,
    pub credits: i64,
    pub mincredits: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardingCounts {
    pub received: u64,
    pub forwarded: u64,
    pub forwarded_bytes: u64,
    pub in_flight: u64,
    pub dropped: u64,
    /// Dropped, by reason (`routing_disabled`, `wrong_net`, `malformed`, `no_route`,
    /// `send_failed`, `shutdown`).
    pub dropped_by_reason: Vec<(String, u64)>,
    pub waited_rtr_credit: u64,
    pub waited_buffer: u64,
    /// Bulk PUTs that waited for room in the share of large buffers kept for senders not
    /// yet proven.
    #[serde(default)]
    pub waited_unproven: u64,
    /// Large buffers scrubbed before they were lent again, and the bytes cleared.
    #[serde(default)]
    pub scrubbed: u64,
    #[serde(default)]
    pub scrubbed_bytes: u64,
}

/// `lnetctl global show`: the globals that mean something here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalShow {
    pub global: Globals,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Globals {
    pub numa_range: u32,
    /// NIs a ping reply may list.
    pub max_interfaces: u32,
    /// 0: no peer discovery (no Multi-Rail yet).
    pub discovery: u32,
    pub drop_asym_route: u32,
    /// Resends of a local failure on a node with two NIs or more (none to a single-rail peer
    /// after a remote failure, as Lustre).
    pub retry_count: u32,
    /// Seconds a transaction may take: as Lustre relates them, lnd_timeout * (retry_count +
    /// 1) + 1.
    #[serde(default)]
    pub transaction_timeout: u64,
    /// 0 (at start): LNet health off (Lustre's 0 turns it off).
    #[serde(default)]
    pub health_sensitivity: u32,
    /// Accepted and ignored (deprecated in Lustre).
    #[serde(default)]
    pub recovery_interval: u32,
    /// 0: routes are judged by the router pinger alone, not by health values.
    #[serde(default)]
    pub router_sensitivity: u32,
    /// The LND timeout of the first NI, seconds.
    pub lnd_timeout: u64,
    /// 0: no response tracking (no ACK/REPLY deadlines beyond pings and routed GETs).
    #[serde(default)]
    pub response_tracking: u32,
    /// 0 (no recovery).
    #[serde(default)]
    pub recovery_limit: u32,
    /// 0 (no recovery pings).
    #[serde(default)]
    pub max_recovery_ping_interval: u32,
    /// 1 when this node forwards for others.
    pub routing: u32,
    /// Ours: the PID we answer as.
    pub pid: u32,
    /// Ours: 1 when the daemon runs lnet_selftest (`selftest: enable: 1`, fixed at start).
    #[serde(default)]
    pub selftest: u32,
}

// ---------------------------------------------------------------------------------- socket

/// The control socket's default path: `/run/ulnet/lnet-router.sock` for root, else
/// `$XDG_RUNTIME_DIR/ulnet/lnet-router.sock` (or `/tmp/ulnet-UID/lnet-router.sock` without it).
pub fn default_socket_path() -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    if uid == 0 {
        return PathBuf::from("/run/ulnet/lnet-router.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("ulnet/lnet-router.sock"),
        None => PathBuf::from(format!("/tmp/ulnet-{}/lnet-router.sock", uid)),
    }
}

/// Encodes one request line (with its newline), as [`ControlClient`](super::ControlClient)
/// sends it.
pub fn encode_request(req: &Request) -> Result<String, String> {
    let inner = serde_json::to_string(req).map_err(|e| e.to_string())?;
    Ok(format!("{{\"v\":{PROTOCOL_VERSION},\"req\":{inner}}}\n"))
}

/// The control protocol's version. Every line lnetctl and the daemon send is
/// `{"v":1,"req":{...}}` / `{"v":1,"resp":{...}}`; a line of another version is refused with one
/// plain line saying which two met. A bare request or response (what lnetctl and lnet-router
/// sent before the version existed) is taken as version 1.
pub const PROTOCOL_VERSION: u64 = 1;

/// A versioned line: the version, and the request or response as it was written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    v: serde_json::Value,
    #[serde(borrow, default)]
    req: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    resp: Option<&'a serde_json::value::RawValue>,
}

/// The error a line of another protocol version gets.
fn version_mismatch(theirs: &serde_json::Value, who: &str) -> String {
    format!(
        "control protocol mismatch: {who} speaks version {theirs}, this one version \
         {PROTOCOL_VERSION}; use an lnetctl and an lnet-router from the same build"
    )
}

/// Decodes one request line; a bad one becomes the error to send back (EPROTO, quoting at most
/// an excerpt of what was sent: serde's message repeats an unknown variant name whole; a line of
/// another protocol version, EPROTONOSUPPORT).
pub fn decode_request(line: &str) -> Result<Request, ControlError> {
    let bad = |e: serde_json::Error| {
        let msg = e.to_string();
        ControlError::new(
            errno::EPROTO,
            format!(
                "bad request: {}",
                crate::text::excerpt(&msg, 2 * crate::text::EXCERPT_CHARS)
            ),
        )
    };
    match serde_json::from_str::<Envelope<'_>>(line) {
        Ok(env) if env.v.as_u64() != Some(PROTOCOL_VERSION) => Err(ControlError::new(
            errno::EPROTONOSUPPORT,
            version_mismatch(&env.v, "lnetctl"),
        )),
        Ok(Envelope { req: Some(raw), .. }) => serde_json::from_str(raw.get()).map_err(bad),
        Ok(_) => Err(ControlError::new(
            errno::EPROTO,
            "bad request: a versioned line without 'req'",
        )),
        // Not an envelope: a bare request (version 1 without the envelope).
        Err(_) => serde_json::from_str(line).map_err(bad),
    }
}

/// Decodes one response line (lnetctl's side): a line of another protocol version is an error
/// saying so.
pub fn decode_response(line: &[u8]) -> Result<Response, String> {
    match serde_json::from_slice::<Envelope<'_>>(line) {
        Ok(env) if env.v.as_u64() != Some(PROTOCOL_VERSION) => {
            Err(version_mismatch(&env.v, "lnet-router"))
        }
        Ok(Envelope {
            resp: Some(raw), ..
        }) => serde_json::from_str(raw.get()).map_err(|e| e.to_string()),
        Ok(_) => Err("a versioned line without 'resp'".into()),
        Err(_) => serde_json::from_slice(line).map_err(|e| e.to_string()),
    }
}

/// Decodes one request as it came off the socket (bytes, trailing newline optional): longer
/// than [`MAX_REQUEST`] is EMSGSIZE, not UTF-8 or not a request is EPROTO. The daemon's decoder
/// (and the `control_request` fuzz target's).
pub fn decode_request_bytes(line: &[u8]) -> Result<Request, ControlError> {
    if line.len() > MAX_REQUEST {
        return Err(too_long());
    }
    let text = std::str::from_utf8(line)
        .map_err(|e| ControlError::new(errno::EPROTO, format!("bad request: not UTF-8 ({e})")))?;
    decode_request(text)
}

/// The error an oversized request gets ([`MAX_REQUEST`]).
pub fn too_long() -> ControlError {
    ControlError::new(
        errno::EMSGSIZE,
        format!("request too long (over {MAX_REQUEST} bytes without a newline); closing"),
    )
}

/// The longest request line the daemon reads, newline included: an `import` carries its
/// document (an export of a router with thousands of peers is some hundred KiB); every other
/// request is small. Reading stops at the cap: the client gets an EMSGSIZE error and is
/// closed; the rest is never read. At most 64 clients at once hold a line each.
pub const MAX_REQUEST: usize = 1024 * 1024;

/// Encodes one response line (with its newline).
pub fn encode_response(resp: &Response) -> String {
    let inner = serde_json::to_string(resp).unwrap_or_else(|e| {
        format!(
            r#"{{"error":{{"errno":{},"message":"encode: {e}"}}}}"#,
            errno::EIO
        )
    });
    format!("{{\"v\":{PROTOCOL_VERSION},\"resp\":{inner}}}\n")
}

/// serde's default for a count that is at least one.
fn one() -> u32 {
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines carry the protocol version; another version is refused with one plain line
    /// naming both; a bare (pre-version) line is taken as version 1.
    #[test]
    fn lines_carry_the_version_and_a_mismatch_says_so() {
        let line = encode_request(&Request::ConnShow).unwrap();
        assert_eq!(line, "{\"v\":1,\"req\":\"conn_show\"}\n");
        assert_eq!(decode_request(&line), Ok(Request::ConnShow));
        assert_eq!(decode_request("\"conn_show\""), Ok(Request::ConnShow));
        let e = decode_request("{\"v\":2,\"req\":\"conn_show\"}").unwrap_err();
        assert_eq!(e.errno, errno::EPROTONOSUPPORT);
        assert!(
            e.message
                .contains("lnetctl speaks version 2, this one version 1"),
            "{e}"
        );
        assert!(!e.message.contains('\n'));
        let resp = encode_response(&Response::Done);
        assert_eq!(resp, "{\"v\":1,\"resp\":\"done\"}\n");
        assert_eq!(decode_response(resp.as_bytes()), Ok(Response::Done));
        assert_eq!(decode_response(b"\"done\""), Ok(Response::Done));
        let e = decode_response(b"{\"v\":7,\"resp\":\"done\"}").unwrap_err();
        assert!(e.contains("lnet-router speaks version 7"), "{e}");
    }

    #[test]
    fn requests_round_trip_through_json() {
        let reqs = vec![
            Request::Ping {
                nids: vec!["0@lo".into(), "10.0.0.2@o2ib".into()],
                timeout_secs: Some(3),
                source: Some("10.0.0.1@o2ib".into()),
            },
            Request::NetShow { verbose: true },
            Request::PeerShow {
                nid: Some("10.0.0.2@o2ib".into()),
                verbose: false,
            },
            Request::ConnShow,
            Request::StatsShow,
            Request::GlobalShow,
        ];
        for r in reqs {
            let s = serde_json::to_string(&r).unwrap();
            assert!(!s.contains('\n'));
            assert_eq!(decode_request(&s).unwrap(), r, "{s}");
        }
        assert_eq!(
            decode_request(r#"{"net_show":{}}"#).unwrap(),
            Request::NetShow { verbose: false }
        );
        assert_eq!(decode_request(r#""conn_show""#).unwrap(), Request::ConnShow);
        match decode_request(r#"{"reboot":{}}"#) {
            Err(e) => assert_eq!(e.errno, errno::EPROTO),
            other => panic!("{other:?}"),
        }
    }
}
