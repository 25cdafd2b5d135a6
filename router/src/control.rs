//! The control protocol between `lnetctl` and the `lnet-router` daemon: one JSON object per line
//! over a Unix socket (mode 0600), a [`Request`] from the client, one [`Response`] back.
//!
//! Server side, [`Control`] turns requests into responses against an [`LnetNode`]. Show commands
//! are answered at once from snapshots; a ping starts node pings and is answered when their
//! [`LnetEvent::PingDone`]s arrive: the daemon loop hands every node event to
//! [`Control::on_event`], which returns the finished replies with the token the request came with
//! (a reply channel, a connection id: whatever the driver needs to route the answer).
//!
//! Client side, [`ControlClient`] is a small blocking client; [`call_local`] answers a request
//! with an in-process node instead (what `lnetctl ping` does when no daemon runs).
//!
//! The response data carries lnetctl's own key names (`primary nid`, `Multi-Rail`, `peer ni`, ...)
//! so that `lnetctl --json` prints the same data as its YAML.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use lnd::time::{Duration, Instant};
use lnd::wire::Nid;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::{LnetError, LnetEvent, LnetNode, NiIndex, PingId, MAX_PING_NIS};

// ---------------------------------------------------------------------------------- errnos

/// errno values used in [`ControlError::errno`] (Linux numbering, positive).
pub mod errno {
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const EBUSY: i32 = 16;
    pub const EINVAL: i32 = 22;
    pub const EPROTO: i32 = 71;
    pub const EOPNOTSUPP: i32 = 95;
    pub const EMSGSIZE: i32 = 90;
    pub const ESHUTDOWN: i32 = 108;
    pub const ETIMEDOUT: i32 = 110;
    pub const ECONNREFUSED: i32 = 111;
    pub const EHOSTUNREACH: i32 = 113;
}

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
    GlobalShow,
    /// `lnetctl capture`: stream a copy of every kib message every NI sends and receives. The
    /// daemon answers [`Response::CaptureStarted`] (or an error: one capture at a time), then
    /// [`Response::CaptureData`] chunks, then one [`Response::CaptureDone`], on this connection,
    /// which the capture then owns. See [`CaptureSession`].
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
    Error(ControlError),
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
    /// `on` or `off`: whether we checksum what we send.
    pub checksum: String,
    /// The flavour sent to a peer whose own is not known yet: `none`, `signed` or `unsigned`.
    #[serde(rename = "checksum default")]
    pub checksum_default: String,
    /// `nidhash` (Lustre 2.16+) or `nid` (Lustre <= 2.15).
    #[serde(rename = "race order")]
    pub race_order: String,
    #[serde(rename = "peer limit")]
    pub peer_limit: u64,
    /// Peers the LND holds now.
    pub peers: u64,
}

impl UlnetSettings {
    fn of(ni: &crate::stats::NiInfo) -> UlnetSettings {
        let c = &ni.lnd_config;
        UlnetSettings {
            checksum: if c.checksum.emit { "on" } else { "off" }.into(),
            checksum_default: c
                .checksum
                .default_flavour
                .map_or("none", |f| f.name())
                .into(),
            race_order: c.race_order.name().into(),
            peer_limit: c.peer_limit as u64,
            peers: ni.lnd_peers as u64,
        }
    }
}

/// Named counters in a fixed order, shown as a map (`name: value`) in YAML and JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamedCounters(pub Vec<(String, u64)>);

impl NamedCounters {
    /// The counter called `name`, if present.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
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

/// `lnd statistics:` of an NI in `net show -v` (ours): the o2ib LND engine's counters
/// ([`lnd::engine::LndStats`]) under their field names, and the rejects it sent and received by
/// reason (`conn_race`, `conn_stale`, `fatal`, ...; `other` for unknown codes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LndCounters {
    #[serde(flatten)]
    pub counters: NamedCounters,
    pub rejects_sent: NamedCounters,
    pub rejects_received: NamedCounters,
}

/// The reject reasons by wire code (index), as `lnd statistics` names them.
pub const REJECT_NAMES: [&str; 10] = [
    "other",
    "conn_race",
    "no_resources",
    "fatal",
    "conn_uncompat",
    "conn_stale",
    "rdma_frags",
    "msg_queue_size",
    "invalid_srv_id",
    "early",
];

impl LndCounters {
    /// The counters of `s`, in the order an operator reads them: connection setup, races,
    /// liveness, traffic, closes, protocol errors, capture.
    pub fn from_stats(s: &lnd::engine::LndStats) -> LndCounters {
        let fields: [(&str, u64); 37] = [
            ("connects", s.connects),
            ("reconnects", s.reconnects),
            ("accepts", s.accepts),
            ("established", s.established),
            ("connect_failures", s.connect_failures),
            ("connect_timeouts", s.connect_timeouts),
            ("races", s.races),
            ("race_yields", s.race_yields),
            ("race_order_disagreements", s.race_order_disagreements),
            ("race_order_adoptions", s.race_order_adoptions),
            ("stale_abandons", s.stale_abandons),
            ("peer_reboots", s.peer_reboots),
            ("peers_down", s.peers_down),
            ("silent_peers", s.silent_peers),
            ("tx_timeouts", s.tx_timeouts),
            ("keepalives", s.keepalives),
            ("credit_noops", s.credit_noops),
            ("msgs_sent", s.msgs_sent),
            ("msgs_received", s.msgs_received),
            ("bytes_sent", s.bytes_sent),
            ("bytes_received", s.bytes_received),
            ("graceful_closes", s.graceful_closes),
            ("conns_lost", s.conns_lost),
            ("close_timeouts", s.close_timeouts),
            ("ungraceful_drops", s.ungraceful_drops),
            ("zombies", s.zombies),
            ("reaped", s.reaped),
            ("bad_msgs", s.bad_msgs),
            ("bad_connreqs", s.bad_connreqs),
            ("stale_rx", s.stale_rx),
            ("credit_overflows", s.credit_overflows),
            ("unsupported_msgs", s.unsupported_msgs),
            ("capture_drops", s.capture_drops),
            ("cksum_signed_peers", s.cksum_signed_peers),
            ("cksum_unsigned_peers", s.cksum_unsigned_peers),
            ("peers_forgotten", s.peers_forgotten),
            ("peer_table_full", s.peer_table_full),
        ];
        let by_reason = |t: &[u64; 10]| {
            NamedCounters(
                REJECT_NAMES
                    .iter()
                    .zip(t.iter())
                    .map(|(k, v)| (k.to_string(), *v))
                    .collect(),
            )
        };
        LndCounters {
            counters: NamedCounters(fields.iter().map(|(k, v)| (k.to_string(), *v)).collect()),
            rejects_sent: by_reason(&s.rejects_sent),
            rejects_received: by_reason(&s.rejects_received),
        }
    }
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LndTunables {
    /// As configured (0 = automatic).
    pub peercredits_hiw: u32,
    pub concurrent_sends: u32,
    /// Seconds.
    pub timeout: u64,
    /// Seconds.
    pub keepalive: u64,
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerNiDetail {
    pub max_ni_tx_credits: i64,
    pub available_tx_credits: i64,
    pub min_tx_credits: i64,
    pub tx_q_num_of_buf: u64,
    pub available_rtr_credits: i64,
    pub min_rtr_credits: i64,
    pub statistics: Counts,
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
    /// Ours, from the daemon: its control socket's counters ([`ControlCounters`]): clients
    /// accepted, refused (too many at once), closed for idling, for a half-sent request, for an
    /// oversized request, and malformed requests. Absent from an in-process node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<NamedCounters>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statistics {
    pub msgs_alloc: u64,
    pub msgs_max: u64,
    pub errors: u64,
    pub send_count: u64,
    pub response_timeout_count: u64,
    pub local_aborted_count: u64,
    pub local_no_route_count: u64,
    pub local_timeout_count: u64,
    pub local_error_count: u64,
    pub network_timeout_count: u64,
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
    /// 0: no LNet resends (no health).
    pub retry_count: u32,
    /// The LND timeout of the first NI, seconds.
    pub lnd_timeout: u64,
    /// 0: this node does not forward yet.
    pub routing: u32,
    /// Ours: the PID we answer as.
    pub pid: u32,
}

// ---------------------------------------------------------------------------------- capture
//
// `lnetctl capture` and where the file is written.
//
// The daemon streams the records to lnetctl, and lnetctl writes the pcap file; the daemon never
// opens a file for a capture. Why this way round, as an HPC admin would want it:
//
// - The daemon typically runs as root. Writing a path that arrives over a socket would let it
//   create or truncate files where the caller could not (and follow symlinks the caller planted);
//   written by lnetctl, the file belongs to the user who asked, with their permissions and umask,
//   relative paths mean their working directory, and `--file -` can feed `tshark -r -` directly.
// - The capture's life is the lnetctl command's: Ctrl-C, `--duration`, or lnetctl dying (its
//   connection closes) all end it, with nothing left running in the daemon.
// - The cost, a copy of each message through the control socket, is bounded: the engines hold at
//   most `lnd::engine`'s capture queue per NI, the stream at most [`CAPTURE_QUEUE`] chunks of
//   [`CAPTURE_CHUNK`] records; beyond that records are dropped and counted, never queued without
//   bound, so a slow disk or a stalled lnetctl cannot hurt the data path.
//
// One capture at a time: a second `capture_start` is refused with EBUSY while one runs.

/// Records per [`Response::CaptureData`] chunk, at most.
pub const CAPTURE_CHUNK: usize = 256;
/// Chunks the daemon may have queued for the capturing connection before it drops (and counts)
/// further records.
pub const CAPTURE_QUEUE: usize = 64;
/// Records one event-loop turn may drain into the capture stream (bounds the loop's work).
pub const CAPTURE_TURN: usize = 4 * CAPTURE_CHUNK;

/// The answer to [`Request::CaptureStart`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureStarted {
    /// Names this capture in [`Request::CaptureStop`].
    pub id: u64,
    /// The NIs whose messages are recorded.
    pub nis: Vec<String>,
}

/// One chunk of captured messages, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureData {
    pub records: Vec<CaptureRecord>,
}

/// One kib message as one of our NIs sent or received it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureRecord {
    /// Nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// `true`: our NI sent it to `peer`; `false`: our NI received it from `peer`.
    pub sent: bool,
    /// Our NI's NID.
    pub ni: String,
    /// The peer's NID.
    pub peer: String,
    /// The LND connection (`ConnId::as_u64`; 0 for a CONNREQ received before it had one).
    pub conn: u64,
    /// The whole kib message, hex.
    pub msg: String,
}

/// The end of a capture.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureSummary {
    /// Records the daemon streamed.
    pub captured: u64,
    /// Records lost: the engines' capture queues overflowed (`capture_drops`), or the stream to
    /// lnetctl was full.
    pub dropped: u64,
    /// Why it ended: `stopped`, `duration elapsed`, `daemon shutting down`.
    pub reason: String,
}

/// What happened to a chunk handed to the capture's connection.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Queued for the client.
    Queued,
    /// The stream is full: the chunk is dropped and counted.
    Full,
    /// The client is gone: end the capture.
    Gone,
}

/// A running capture on the daemon side: turns the engines' capture on, drains their records
/// into chunks, and turns it off again. The driver owns the stream to the client.
#[derive(Debug)]
pub struct CaptureSession {
    id: u64,
    start: Instant,
    start_unix_ns: u64,
    deadline: Option<Instant>,
    nis: Vec<Nid>,
    /// Per NI, the engine's `capture_drops` when the capture began.
    base_drops: Vec<u64>,
    captured: u64,
    lost: u64,
    /// The last delivery found the client's stream full: stop draining for this turn.
    client_full: bool,
}

impl CaptureSession {
    /// Starts capturing on every NI of `node`. `unix_ns` is the wall-clock time at `now`
    /// (records are stamped with it plus their monotonic offset from `now`).
    pub fn start(
        node: &mut LnetNode,
        id: u64,
        now: Instant,
        unix_ns: u64,
        duration: Option<Duration>,
    ) -> CaptureSession {
        let nis = node.nids();
        let mut base_drops = Vec::with_capacity(nis.len());
        for i in 0..nis.len() {
            let ep = node.endpoint_mut(NiIndex(i));
            base_drops.push(ep.as_ref().map_or(0, |e| e.stats().capture_drops));
            if let Some(ep) = ep {
                ep.set_capture(true);
            }
        }
        CaptureSession {
            id,
            start: now,
            start_unix_ns: unix_ns,
            deadline: duration.map(|d| now.saturating_add(d)),
            nis,
            base_drops,
            captured: 0,
            lost: 0,
            client_full: false,
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The answer to the start request.
    pub fn started(&self) -> CaptureStarted {
        CaptureStarted {
            id: self.id,
            nis: self.nis.iter().map(Nid::to_string).collect(),
        }
    }

    /// True once the requested duration has passed.
    pub fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// Drains the NIs' captured messages into chunks of at most [`CAPTURE_CHUNK`], oldest
    /// first within each chunk, handing each to `deliver`. Returns `false` once `deliver` says
    /// the client is gone.
    ///
    /// Bounded so that capturing cannot stall the event loop: at most [`CAPTURE_TURN`] records
    /// per call, and none more once the stream to the client is full (what is not drained waits
    /// in the LND's own bounded queue, which drops and counts when it overflows).
    pub fn drain(
        &mut self,
        node: &mut LnetNode,
        mut deliver: impl FnMut(CaptureData) -> Delivery,
    ) -> bool {
        let mut chunk: Vec<(Instant, CaptureRecord)> = Vec::new();
        let mut budget = CAPTURE_TURN;
        self.client_full = false;
        for i in 0..self.nis.len() {
            let ni_s = self.nis[i].to_string();
            let Some(ep) = node.endpoint_mut(NiIndex(i)) else {
                continue;
            };
            while budget > 0 && !self.client_full {
                let Some(c) = ep.poll_captured() else {
                    break;
                };
                budget -= 1;
                let ts_ns = self
                    .start_unix_ns
                    .saturating_add(c.at.saturating_duration_since(self.start).as_nanos());
                let rec = CaptureRecord {
                    ts_ns,
                    sent: c.dir == lnd::engine::CaptureDir::Sent,
                    ni: ni_s.clone(),
                    peer: c.peer.to_string(),
                    conn: c.conn.as_u64(),
                    msg: hex_encode(&c.bytes),
                };
                ep.recycle(c.bytes);
                chunk.push((c.at, rec));
                if chunk.len() >= CAPTURE_CHUNK && !self.deliver(&mut chunk, &mut deliver) {
                    return false;
                }
            }
        }
        chunk.is_empty() || self.deliver(&mut chunk, &mut deliver)
    }

    fn deliver(
        &mut self,
        chunk: &mut Vec<(Instant, CaptureRecord)>,
        deliver: &mut impl FnMut(CaptureData) -> Delivery,
    ) -> bool {
        chunk.sort_by_key(|(at, _)| *at);
        let n = chunk.len() as u64;
        let records = chunk.drain(..).map(|(_, r)| r).collect();
        match deliver(CaptureData { records }) {
            Delivery::Queued => {
                self.captured += n;
                true
            }
            Delivery::Full => {
                self.lost += n;
                self.client_full = true;
                true
            }
            Delivery::Gone => false,
        }
    }

    /// Turns capturing off on every NI (records not drained are dropped: drain first) and
    /// returns the summary.
    pub fn finish(self, node: &mut LnetNode, reason: &str) -> CaptureSummary {
        let mut dropped = self.lost;
        for (i, base) in self.base_drops.iter().enumerate() {
            if let Some(ep) = node.endpoint_mut(NiIndex(i)) {
                dropped += ep.stats().capture_drops.saturating_sub(*base);
                ep.set_capture(false);
            }
        }
        CaptureSummary {
            captured: self.captured,
            dropped,
            reason: reason.to_string(),
        }
    }
}

/// Lower-case hex of `b`.
pub fn hex_encode(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(char::from(DIGITS[usize::from(x >> 4)]));
        s.push(char::from(DIGITS[usize::from(x & 15)]));
    }
    s
}

/// The bytes of hex `s` (either case); `None` if it is not hex.
pub fn hex_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if b.len() % 2 != 0 {
        return None;
    }
    let nibble = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    b.chunks_exact(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// Writes captured records as a pcap file that Wireshark's LNet dissector decodes
/// ([`lnd::wire::pcap`]: each message framed as the RoCEv2 packet a sniffer would have seen).
///
/// Addresses: each side gets its NID's address (`10.0.0.1@o2ib` is 10.0.0.1; for nets whose
/// NIDs are not IPv4 addresses, the 32-bit NID address read as one). Queue pairs: messages on a
/// connection use a QP number derived from the connection's id, the same for both directions, so
/// a connection's traffic is one conversation; CONNREQ and CONNACK are framed the same way (a
/// real fabric carries them in connection-manager MADs on QP 1, which Wireshark would hand to
/// its MAD dissector instead of LNet's). PSNs count per connection and direction.
pub struct CaptureWriter<W: Write> {
    pcap: lnd::wire::pcap::PcapWriter<W>,
    psn: HashMap<(u64, bool), u32>,
}

impl<W: Write> CaptureWriter<W> {
    /// Writes the pcap global header.
    pub fn new(out: W) -> io::Result<CaptureWriter<W>> {
        Ok(CaptureWriter {
            pcap: lnd::wire::pcap::PcapWriter::new(out)?,
            psn: HashMap::new(),
        })
    }

    /// Writes one record as one frame.
    pub fn write(&mut self, r: &CaptureRecord) -> io::Result<()> {
        use lnd::wire::pcap::Endpoint;
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let ni: Nid = r.ni.parse().map_err(|e| bad(format!("record NI: {e}")))?;
        let peer: Nid = r
            .peer
            .parse()
            .map_err(|e| bad(format!("record peer: {e}")))?;
        let msg = hex_decode(&r.msg).ok_or_else(|| bad("record message is not hex".into()))?;
        let qpn = conn_qpn(r.conn);
        let (src, dst) = if r.sent { (ni, peer) } else { (peer, ni) };
        let psn = self.psn.entry((r.conn, r.sent)).or_insert(0);
        let this = *psn;
        *psn = psn.wrapping_add(1);
        self.pcap.write_kib_with_psn(
            r.ts_ns,
            Endpoint::from_nid(src, qpn),
            Endpoint::from_nid(dst, qpn),
            this,
            &msg,
        )
    }

    /// Frames written.
    pub fn frames(&self) -> u64 {
        self.pcap.frames()
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.pcap.flush()
    }
}

/// A 24-bit QP number for a connection id, never 0 or 1 (reserved for SMI and GSI).
fn conn_qpn(conn: u64) -> u32 {
    let index = conn as u32;
    let generation = (conn >> 32) as u32;
    let q = (index.wrapping_add(generation.wrapping_mul(0x1000)) & 0x00ff_ffff) | 0x10_0000;
    q.max(2)
}

// ---------------------------------------------------------------------------------- server

/// Per-NI settings LNetNode does not keep (for `net show -v`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NiExtras {
    pub peer_timeout: u32,
    pub peer_buffer_credits: u32,
}

impl Default for NiExtras {
    fn default() -> NiExtras {
        NiExtras {
            peer_timeout: crate::yaml_config::DEFAULT_PEER_TIMEOUT,
            peer_buffer_credits: 0,
        }
    }
}

struct PendingReq<T> {
    token: T,
    /// Per pinged NID, in request order: the outcome once known.
    results: Vec<(Nid, Option<Result<PingPeer, PingFailure>>)>,
    open: usize,
}

/// The server half: answers requests against a node, keeps pings until their replies come.
/// `T` is the driver's token for routing a reply back.
pub struct Control<T> {
    extras: Vec<NiExtras>,
    /// Per NI: the fabric's name and its counters as last refreshed by the driver.
    fabric_counters: Vec<(&'static str, Vec<(&'static str, u64)>)>,
    pending: HashMap<u64, PendingReq<T>>,
    /// Node ping -> (request, index in its results).
    pings: HashMap<PingId, (u64, usize)>,
    next: u64,
}

impl<T> Default for Control<T> {
    fn default() -> Self {
        Control::new(Vec::new())
    }
}

impl<T> Control<T> {
    /// `extras[i]` describes NI `i` (missing entries: Lustre's defaults).
    pub fn new(extras: Vec<NiExtras>) -> Control<T> {
        Control {
            extras,
            fabric_counters: Vec::new(),
            pending: HashMap::new(),
            pings: HashMap::new(),
            next: 1,
        }
    }

    /// Records NI `ni`'s fabric counters (`Driver::counters`), shown by `net show -v`. The driver
    /// refreshes them before it hands over control requests.
    pub fn set_fabric_counters(
        &mut self,
        ni: usize,
        fabric: &'static str,
        counters: Vec<(&'static str, u64)>,
    ) {
        if self.fabric_counters.len() <= ni {
            self.fabric_counters.resize(ni + 1, ("", Vec::new()));
        }
        self.fabric_counters[ni] = (fabric, counters);
    }

    /// Fills `fabric:` of each NI entry of `n` from the counters last set.
    fn add_fabric_counters(&self, node: &LnetNode, n: &mut NetShow) {
        let nids: Vec<String> = node.nids().iter().map(Nid::to_string).collect();
        for e in n.net.iter_mut().flat_map(|n| n.local_nis.iter_mut()) {
            let Some(i) = nids.iter().position(|s| *s == e.nid) else {
                continue;
            };
            if let Some((kind, c)) = self.fabric_counters.get(i).filter(|(k, _)| !k.is_empty()) {
                e.fabric = Some(FabricCounters {
                    kind: kind.to_string(),
                    counters: NamedCounters(c.iter().map(|(k, v)| (k.to_string(), *v)).collect()),
                });
            }
        }
    }

    /// Requests still waiting for ping replies.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Answers `req`. Returns the reply at once, or `None` when it waits for ping replies: it
    /// then comes out of [`Control::on_event`] with `token`. Drain the node's events into
    /// `on_event` after this call (a ping of `0@lo` completes inside it).
    pub fn handle(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        req: Request,
        token: T,
    ) -> Option<(T, Response)> {
        let resp = match req {
            Request::Ping {
                nids,
                timeout_secs,
                source,
            } => match self.start_ping(now, node, &nids, timeout_secs, source, token) {
                Ok(None) => return None,
                Ok(Some(done)) => return Some(done),
                Err((token, e)) => return Some((token, Response::Error(e))),
            },
            Request::NetShow { verbose } => {
                let mut n = net_show(node, &self.extras, verbose);
                if verbose {
                    self.add_fabric_counters(node, &mut n);
                }
                Response::Net(n)
            }
            Request::CaptureStart { .. } | Request::CaptureStop { .. } => {
                Response::Error(ControlError::new(
                    errno::EOPNOTSUPP,
                    "capture needs the lnet-router daemon (its driver streams the records)",
                ))
            }
            Request::PeerShow { nid, verbose } => match peer_show(node, nid.as_deref(), verbose) {
                Ok(p) => Response::Peer(p),
                Err(e) => Response::Error(e),
            },
            Request::ConnShow => Response::Conn(conn_show(node, now)),
            Request::StatsShow => Response::Stats(stats_show(node)),
            Request::GlobalShow => Response::Global(global_show(node)),
        };
        Some((token, resp))
    }

    /// Feeds a node event; returns a finished ping reply if this event completed one. Events that
    /// are not for control are ignored.
    pub fn on_event(&mut self, ev: &LnetEvent) -> Option<(T, Response)> {
        let LnetEvent::PingDone { id, target, result } = ev else {
            return None;
        };
        let (req, idx) = self.pings.remove(id)?;
        let p = self.pending.get_mut(&req)?;
        p.results[idx].1 = Some(ping_outcome(*target, result));
        p.open -= 1;
        if p.open > 0 {
            return None;
        }
        let p = self.pending.remove(&req)?;
        Some((p.token, Response::Ping(collect(p.results))))
    }

    fn start_ping(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        nids: &[String],
        timeout_secs: Option<u64>,
        source: Option<String>,
        token: T,
    ) -> Result<Option<(T, Response)>, (T, ControlError)> {
        let mut targets = Vec::new();
        for s in nids {
            match s.trim().parse::<Nid>() {
                Ok(n) => targets.push(n),
                Err(e) => return Err((token, ControlError::new(errno::EINVAL, e.to_string()))),
            }
        }
        if targets.is_empty() {
            return Err((token, ControlError::new(errno::EINVAL, "no NID to ping")));
        }
        if let Some(src) = source {
            let src: Nid = match src.trim().parse() {
                Ok(n) => n,
                Err(e) => return Err((token, ControlError::new(errno::EINVAL, e.to_string()))),
            };
            if src != Nid::LO_0 && !node.node_nids().contains(&src) {
                return Err((
                    token,
                    ControlError::new(errno::EINVAL, format!("source {src} is not a local NID")),
                ));
            }
        }
        let secs = timeout_secs
            .unwrap_or(MAX_PING_TIMEOUT_SECS)
            .clamp(1, MAX_PING_TIMEOUT_SECS);
        let timeout = Duration::from_secs(secs);
        let id = self.next;
        self.next += 1;
        let mut results: Vec<(Nid, Option<Result<PingPeer, PingFailure>>)> =
            targets.iter().map(|&n| (n, None)).collect();
        let mut open = 0;
        for (i, &t) in targets.iter().enumerate() {
            match node.ping(now, t, timeout) {
                Ok(pid) => {
                    self.pings.insert(pid, (id, i));
                    open += 1;
                }
                Err(e) => results[i].1 = Some(ping_outcome(t, &Err(e))),
            }
        }
        if open == 0 {
            return Ok(Some((token, Response::Ping(collect(results)))));
        }
        self.pending.insert(
            id,
            PendingReq {
                token,
                results,
                open,
            },
        );
        Ok(None)
    }
}

fn collect(results: Vec<(Nid, Option<Result<PingPeer, PingFailure>>)>) -> PingShow {
    let mut out = PingShow::default();
    for (nid, r) in results {
        match r {
            Some(Ok(p)) => out.ping.push(p),
            Some(Err(f)) => out.manage.push(f),
            None => out.manage.push(PingFailure {
                ping: nid.to_string(),
                errno: -errno::EIO,
                descr: format!("failed to ping {nid}: no outcome"),
            }),
        }
    }
    out
}

fn ping_outcome(
    target: Nid,
    result: &Result<crate::PingReply, LnetError>,
) -> Result<PingPeer, PingFailure> {
    match result {
        Ok(r) => Ok(PingPeer {
            primary_nid: r.primary_nid.to_string(),
            multi_rail: r.multi_rail,
            peer_ni: r.nids.iter().map(Nid::to_string).collect(),
        }),
        Err(e) => Err(PingFailure {
            ping: target.to_string(),
            errno: -lnet_errno(e),
            descr: format!("failed to ping {target}: {e}"),
        }),
    }
}

/// The errno Lustre would report for an LNet failure.
pub fn lnet_errno(e: &LnetError) -> i32 {
    use lnd::engine::TxError;
    match e {
        LnetError::NoRoute(_) => errno::EHOSTUNREACH,
        LnetError::PayloadTooLarge { .. } => errno::EMSGSIZE,
        LnetError::Timeout | LnetError::Lnd(TxError::Timeout) => errno::ETIMEDOUT,
        LnetError::Lnd(TxError::ConnectFailed) => errno::ECONNREFUSED,
        LnetError::Lnd(TxError::PeerUnreachable) => errno::EHOSTUNREACH,
        LnetError::Shutdown | LnetError::Lnd(TxError::Shutdown) => errno::ESHUTDOWN,
        LnetError::BadReply(_) => errno::EPROTO,
        _ => errno::EIO,
    }
}

/// `net show`: the loopback net first (as Lustre lists it), then each net with its NIs.
pub fn net_show(node: &LnetNode, extras: &[NiExtras], verbose: bool) -> NetShow {
    let mut nets: Vec<NetEntry> = vec![NetEntry {
        net_type: "lo".into(),
        local_nis: vec![NiEntry {
            nid: Nid::LO_0.to_string(),
            status: "up".into(),
            statistics: verbose.then(|| {
                let s = node.stats();
                Counts {
                    send_count: s.loopback_count,
                    recv_count: s.loopback_count,
                    drop_count: 0,
                }
            }),
            tunables: None,
            lnd_tunables: None,
            lnd_statistics: None,
            fabric: None,
            ulnet: None,
        }],
    }];
    for ni in node.nets() {
        let x = extras.get(ni.index.0).copied().unwrap_or_default();
        let entry = NiEntry {
            nid: ni.nid.to_string(),
            status: ni.status.to_string(),
            statistics: verbose.then_some(Counts {
                send_count: ni.send_count,
                recv_count: ni.recv_count,
                drop_count: ni.drop_count,
            }),
            tunables: verbose.then_some(NiTunables {
                peer_timeout: x.peer_timeout,
                peer_credits: ni.peer_credits,
                peer_buffer_credits: x.peer_buffer_credits,
                credits: ni.credits,
            }),
            lnd_tunables: verbose.then(|| LndTunables {
                peercredits_hiw: u32::from(ni.lnd_tunables.peer_credits_hiw),
                concurrent_sends: u32::from(ni.lnd_tunables.concurrent_sends),
                timeout: ni.lnd_tunables.timeout.as_secs(),
                keepalive: ni.lnd_tunables.keepalive.as_secs(),
            }),
            lnd_statistics: verbose.then(|| LndCounters::from_stats(&ni.lnd_stats)),
            fabric: None,
            ulnet: verbose.then(|| UlnetSettings::of(&ni)),
        };
        let net_type = ni.nid.net().to_string();
        match nets.iter_mut().find(|n| n.net_type == net_type) {
            Some(n) => n.local_nis.push(entry),
            None => nets.push(NetEntry {
                net_type,
                local_nis: vec![entry],
            }),
        }
    }
    NetShow { net: nets }
}

/// `peer show [--nid NID]`: every peer NI (each its own primary: no Multi-Rail yet).
pub fn peer_show(
    node: &LnetNode,
    nid: Option<&str>,
    verbose: bool,
) -> Result<PeerShow, ControlError> {
    let infos = match nid {
        Some(s) => {
            let n: Nid = s.trim().parse().map_err(|e: lnd::wire::NidParseError| {
                ControlError::new(errno::EINVAL, e.to_string())
            })?;
            match node.peer(n) {
                Some(p) => vec![p],
                None => return Err(ControlError::new(errno::ENOENT, format!("no peer {n}"))),
            }
        }
        None => node.peers(),
    };
    let peer = infos
        .into_iter()
        .map(|p| PeerEntry {
            primary_nid: p.primary_nid.to_string(),
            multi_rail: p.multi_rail,
            peer_ni: vec![PeerNiEntry {
                nid: p.nid.to_string(),
                state: p.state.as_str().to_string(),
                detail: verbose.then_some(PeerNiDetail {
                    max_ni_tx_credits: p.max_ni_tx_credits,
                    available_tx_credits: p.available_tx_credits,
                    min_tx_credits: p.min_tx_credits,
                    tx_q_num_of_buf: p.tx_q_num_of_buf,
                    available_rtr_credits: p.available_rtr_credits,
                    min_rtr_credits: p.min_rtr_credits,
                    statistics: Counts {
                        send_count: p.send_count,
                        recv_count: p.recv_count,
                        drop_count: p.drop_count,
                    },
                }),
            }],
        })
        .collect();
    Ok(PeerShow { peer })
}

/// `conn show`: every connection of every NI's LND.
pub fn conn_show(node: &LnetNode, now: Instant) -> ConnShow {
    let mut conn = Vec::new();
    for (i, nid) in node.nids().into_iter().enumerate() {
        let Some(ep) = node.endpoint(NiIndex(i)) else {
            continue;
        };
        for c in ep.conns() {
            conn.push(ConnEntry {
                ni: nid.to_string(),
                peer: c.peer.to_string(),
                state: format!("{:?}", c.state),
                side: if c.active { "active" } else { "passive" }.into(),
                credits: c.credits,
                outstanding_credits: c.outstanding_credits,
                reserved_credits: c.reserved_credits,
                queue_depth: c.queue_depth,
                sends_posted: c.sends_posted,
                queued: c.queued,
                races: ep.peer(c.peer).map_or(0, |p| p.races),
                incarnation: format!("{:#x}", c.peer_incarnation),
                age_ms: now.saturating_duration_since(c.created).as_millis(),
            });
        }
    }
    ConnShow { conn }
}

/// `stats show`.
pub fn stats_show(node: &LnetNode) -> StatsShow {
    let s = node.stats();
    StatsShow {
        statistics: Statistics {
            msgs_alloc: s.msgs_alloc,
            msgs_max: s.msgs_max,
            errors: s.errors,
            send_count: s.send_count,
            response_timeout_count: s.response_timeout_count,
            local_aborted_count: s.local_aborted_count,
            local_no_route_count: s.local_no_route_count,
            local_timeout_count: s.local_timeout_count,
            local_error_count: s.local_error_count,
            network_timeout_count: s.network_timeout_count,
            recv_count: s.recv_count,
            route_count: s.route_count,
            drop_count: s.drop_count,
            send_length: s.send_length,
            recv_length: s.recv_length,
            route_length: s.route_length,
            drop_length: s.drop_length,
            loopback_count: s.loopback_count,
            loopback_length: s.loopback_length,
        },
        peer_table: Some(NamedCounters(vec![
            ("peers".into(), node.peer_count() as u64),
            ("peers_aged".into(), s.peers_aged),
            ("peer_table_full".into(), s.peer_table_full),
        ])),
        control: None,
    }
}

/// `global show`.
pub fn global_show(node: &LnetNode) -> GlobalShow {
    let lnd_timeout = node
        .nets()
        .first()
        .map_or(lnd::engine::Tunables::default().timeout, |n| {
            n.lnd_tunables.timeout
        })
        .as_secs();
    GlobalShow {
        global: Globals {
            numa_range: 0,
            max_interfaces: MAX_PING_NIS as u32,
            discovery: 0,
            drop_asym_route: 0,
            retry_count: 0,
            lnd_timeout,
            routing: 0,
            pid: node.pid(),
        },
    }
}

/// Answers `req` with `node` in this process, driving it with `clock` until the reply is ready
/// (for nodes without fabric work: no NIs, or only local destinations). Used by `lnetctl` when no
/// daemon runs.
pub fn call_local(node: &mut LnetNode, req: Request, clock: impl Fn() -> Instant) -> Response {
    let mut control: Control<()> = Control::default();
    let mut reply = control.handle(clock(), node, req, ()).map(|(_, r)| r);
    loop {
        while let Some(ev) = node.poll_event() {
            if let Some((_, r)) = control.on_event(&ev) {
                reply = Some(r);
            }
        }
        while node.poll_action().is_some() {
            // No fabric in this process: the node only routes locally, so nothing comes here.
            warn!("embedded node produced fabric work; dropped");
        }
        if let Some(r) = reply {
            return r;
        }
        let now = clock();
        match node.poll_timeout() {
            Some(at) if at > now => {
                let wait = at.saturating_duration_since(now).as_nanos().min(50_000_000);
                std::thread::sleep(std::time::Duration::from_nanos(wait));
            }
            Some(_) => node.handle_timeout(clock()),
            None => {
                return Response::Error(ControlError::new(errno::EIO, "request cannot complete"))
            }
        }
    }
}

// ---------------------------------------------------------------------------------- socket

/// The control socket's default path: `/run/ulnet/lnet-router.sock` for root, else
/// `$XDG_RUNTIME_DIR/ulnet/lnet-router.sock` (or `/tmp/ulnet-UID/lnet-router.sock` without it).
pub fn default_socket_path() -> PathBuf {
    let uid = current_uid();
    if uid == Some(0) {
        return PathBuf::from("/run/ulnet/lnet-router.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("ulnet/lnet-router.sock"),
        None => PathBuf::from(format!(
            "/tmp/ulnet-{}/lnet-router.sock",
            uid.unwrap_or(u32::MAX)
        )),
    }
}

/// Our uid, without libc: the owner of `/proc/self`.
fn current_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// Why a client call failed.
#[derive(Debug)]
pub enum ClientError {
    /// Nothing listens at the path (absent, or connection refused).
    NoDaemon { path: PathBuf, source: io::Error },
    /// Any other I/O error.
    Io(io::Error),
    /// The daemon answered something that is not a response.
    Protocol(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::NoDaemon { path, source } => write!(
                f,
                "no lnet-router daemon at {} ({source}); start lnet-router or pass --socket",
                path.display()
            ),
            ClientError::Io(e) => write!(f, "control socket: {e}"),
            ClientError::Protocol(m) => write!(f, "control protocol: {m}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// A blocking client: one request at a time (or one capture stream).
pub struct ControlClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// A response line read in part when a [`ControlClient::recv_timeout`] timed out.
    partial: Vec<u8>,
}

impl ControlClient {
    /// Connects; a missing socket or a refused connection is [`ClientError::NoDaemon`].
    pub fn connect(path: &Path) -> Result<ControlClient, ClientError> {
        match UnixStream::connect(path) {
            Ok(s) => {
                let writer = s.try_clone().map_err(ClientError::Io)?;
                Ok(ControlClient {
                    reader: BufReader::new(s),
                    writer,
                    partial: Vec::new(),
                })
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                Err(ClientError::NoDaemon {
                    path: path.to_path_buf(),
                    source: e,
                })
            }
            Err(e) => Err(ClientError::Io(e)),
        }
    }

    /// Sends `req`, waits for its response.
    pub fn call(&mut self, req: &Request) -> Result<Response, ClientError> {
        self.send(req)?;
        loop {
            if let Some(r) = self.recv_timeout(None)? {
                return Ok(r);
            }
        }
    }

    /// Sends `req` without waiting for anything.
    pub fn send(&mut self, req: &Request) -> Result<(), ClientError> {
        let line = encode_request(req).map_err(ClientError::Protocol)?;
        self.writer
            .write_all(line.as_bytes())
            .map_err(ClientError::Io)
    }

    /// The next response, waiting at most `timeout` (`None`: as long as it takes). `Ok(None)`
    /// when the time passed first (or a signal interrupted the wait); a line read in part is
    /// kept for the next call. The daemon closing the connection is a protocol error.
    pub fn recv_timeout(
        &mut self,
        timeout: Option<std::time::Duration>,
    ) -> Result<Option<Response>, ClientError> {
        let timeout = timeout.map(|t| t.max(std::time::Duration::from_millis(1)));
        self.reader
            .get_ref()
            .set_read_timeout(timeout)
            .map_err(ClientError::Io)?;
        match self.reader.read_until(b'\n', &mut self.partial) {
            Ok(_) if self.partial.last() == Some(&b'\n') => {
                let r = serde_json::from_slice(&self.partial)
                    .map_err(|e| ClientError::Protocol(e.to_string()));
                self.partial.clear();
                r.map(Some)
            }
            Ok(_) => Err(ClientError::Protocol("daemon closed the connection".into())),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(ClientError::Io(e)),
        }
    }
}

/// Encodes one request line (with its newline), as [`ControlClient`] sends it.
pub fn encode_request(req: &Request) -> Result<String, String> {
    let mut line = serde_json::to_string(req).map_err(|e| e.to_string())?;
    line.push('\n');
    Ok(line)
}

/// Decodes one request line; a bad one becomes the error to send back (EPROTO, quoting at most
/// an excerpt of what was sent: serde's message repeats an unknown variant name whole).
pub fn decode_request(line: &str) -> Result<Request, ControlError> {
    serde_json::from_str(line).map_err(|e| {
        let msg = e.to_string();
        ControlError::new(
            errno::EPROTO,
            format!(
                "bad request: {}",
                crate::text::excerpt(&msg, 2 * crate::text::EXCERPT_CHARS)
            ),
        )
    })
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

// ---------------------------------------------------------------------------------- limits
//
// The control socket serves only its owner (mode 0600), but a buggy or stuck client must not
// cost the daemon memory, threads or its socket: requests are read with a size cap, idle and
// half-sent requests time out, and the clients served at once are bounded (the daemon refuses
// the excess with one error line). A capture's connection streams to its client and is never
// idle.

/// The longest request line the daemon reads, newline included: every request is small (the
/// largest, a ping of many NIDs, is a few KiB). Reading stops at the cap: the client gets an
/// EMSGSIZE error and is closed; the rest is never read.
pub const MAX_REQUEST: usize = 64 * 1024;
/// Control clients the daemon serves at once; the next get one error line ("too many control
/// clients") and are closed (counted as `refused`).
pub const MAX_CLIENTS: usize = 64;
/// A client that sends nothing for this long between requests is closed (`idle_timeouts`).
pub const DEFAULT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// A request line must be complete this long after its first byte (`request_timeouts`).
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The daemon's control socket counters (`stats show`, `control:`).
#[derive(Debug, Default)]
pub struct ControlCounters {
    /// Clients accepted and served.
    pub accepted: std::sync::atomic::AtomicU64,
    /// Clients served now (a gauge).
    pub active: std::sync::atomic::AtomicU64,
    /// Clients refused because [`MAX_CLIENTS`] were being served.
    pub refused: std::sync::atomic::AtomicU64,
    /// Clients closed after sending nothing for the idle timeout.
    pub idle_timeouts: std::sync::atomic::AtomicU64,
    /// Clients closed because a request was not complete within the request timeout.
    pub request_timeouts: std::sync::atomic::AtomicU64,
    /// Clients closed because a request line was longer than [`MAX_REQUEST`].
    pub oversized: std::sync::atomic::AtomicU64,
    /// Request lines that were not a request (answered with EPROTO).
    pub bad_requests: std::sync::atomic::AtomicU64,
}

impl ControlCounters {
    /// Adds one to `c`.
    pub fn bump(c: &std::sync::atomic::AtomicU64) {
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The counters by name, in the order `stats show` prints them.
    pub fn snapshot(&self) -> NamedCounters {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        NamedCounters(
            [
                ("clients", get(&self.accepted)),
                ("active", get(&self.active)),
                ("refused", get(&self.refused)),
                ("idle_timeouts", get(&self.idle_timeouts)),
                ("request_timeouts", get(&self.request_timeouts)),
                ("oversized", get(&self.oversized)),
                ("bad_requests", get(&self.bad_requests)),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        )
    }
}

/// What [`read_request`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadRequest {
    /// A whole line is in the buffer (without its newline; also the last, unterminated line
    /// before the client closed).
    Line,
    /// The client closed.
    Eof,
    /// Nothing arrived for the idle timeout.
    Idle,
    /// A request was begun but not finished within the request timeout.
    Stalled,
    /// The line reached [`MAX_REQUEST`] without a newline; reading stopped there.
    TooLong,
}

/// Reads one request line into `line` (cleared first), at most [`MAX_REQUEST`] bytes: waits at
/// most `idle` for its first byte (`None`: forever) and `request` from there for its newline.
/// What the reader holds past the line stays buffered for the next call; at most one buffer
/// beyond the cap is ever read.
pub fn read_request(
    r: &mut BufReader<UnixStream>,
    line: &mut Vec<u8>,
    idle: Option<std::time::Duration>,
    request: Option<std::time::Duration>,
) -> io::Result<ReadRequest> {
    use std::time::Instant as StdInstant;
    line.clear();
    let waiting = StdInstant::now();
    let mut first_byte: Option<StdInstant> = None;
    loop {
        let (deadline, what) = match first_byte {
            None => (idle.map(|d| waiting + d), ReadRequest::Idle),
            Some(t) => (request.map(|d| t + d), ReadRequest::Stalled),
        };
        if r.buffer().is_empty() {
            let timeout = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(StdInstant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(what),
                },
            };
            r.get_ref().set_read_timeout(timeout)?;
        }
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(what)
            }
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(if line.is_empty() {
                ReadRequest::Eof
            } else {
                ReadRequest::Line
            });
        }
        first_byte.get_or_insert_with(StdInstant::now);
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if line.len() + take >= MAX_REQUEST {
            return Ok(ReadRequest::TooLong);
        }
        line.extend_from_slice(&avail[..take]);
        r.consume(take + usize::from(done));
        if done {
            return Ok(ReadRequest::Line);
        }
    }
}

/// Encodes one response line (with its newline).
pub fn encode_response(resp: &Response) -> String {
    let mut s = serde_json::to_string(resp).unwrap_or_else(|e| {
        format!(
            r#"{{"error":{{"errno":{},"message":"encode: {e}"}}}}"#,
            errno::EIO
        )
    });
    s.push('\n');
    s
}

/// Binds the control socket: creates its directory (0700), replaces a stale socket file (one
/// nobody answers on), and puts the socket in place with mode 0600. Fails if a daemon already
/// answers.
///
/// The socket is never reachable by anyone else, not even for an instant, whatever the umask:
/// `bind` creates the file with the umask's mode, so it is bound inside a private directory made
/// for it (created 0700 or less, since a umask only removes bits, then set to exactly 0700, so
/// nobody else can even look up a name inside it), set to 0600 there, and only then given its
/// public name with a hard link (which, unlike a rename, fails instead of replacing a socket
/// another daemon put there meanwhile); the private name and directory are removed. No umask
/// change (process-wide, racy with threads) and no unsafe code.
pub fn bind_socket(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    if std::fs::symlink_metadata(path).is_ok() {
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("a daemon already answers on {}", path.display()),
            ));
        }
        debug!(path = %path.display(), "removing a stale control socket");
        std::fs::remove_file(path)?;
    }
    // Short, so that the private name fits in sun_path whenever the public one does.
    let private = dir.join(format!(".u{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&private); // left by a crashed daemon with our pid
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    struct RemoveDir<'a>(&'a Path);
    impl Drop for RemoveDir<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0);
        }
    }
    let _cleanup = RemoveDir(&private);
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
    let inner = private.join("s");
    let l = UnixListener::bind(&inner)?;
    std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))?;
    std::fs::hard_link(&inner, path).map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another daemon created {} meanwhile", path.display()),
            )
        } else {
            e
        }
    })?;
    Ok(l)
}

/// Serves one client connection: reads request lines (each at most [`MAX_REQUEST`] bytes),
/// hands each to `forward` (which returns the response, e.g. after a round trip through the
/// daemon loop), writes the response. Returns when the client closes; an oversized request is
/// answered with EMSGSIZE and the connection closed.
pub fn serve_connection(
    stream: UnixStream,
    mut forward: impl FnMut(Request) -> Response,
) -> io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        match read_request(&mut reader, &mut line, None, None)? {
            ReadRequest::Line => {}
            ReadRequest::TooLong => {
                let resp = Response::Error(too_long());
                return writer.write_all(encode_response(&resp).as_bytes());
            }
            _ => return Ok(()),
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        let resp = match decode_request_bytes(&line) {
            Ok(req) => forward(req),
            Err(e) => Response::Error(e),
        };
        writer.write_all(encode_response(&resp).as_bytes())?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NiConfig, NodeConfig};

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn node() -> LnetNode {
        LnetNode::new(
            NodeConfig::new(vec![NiConfig::new(nid("10.0.0.1@o2ib"), 7)]),
            Instant::from_secs(1),
        )
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

    #[test]
    fn responses_round_trip_through_json() {
        let mut n = node();
        let mut c: Control<u8> = Control::default();
        let now = Instant::from_secs(2);
        for req in [
            Request::NetShow { verbose: true },
            Request::NetShow { verbose: false },
            Request::PeerShow {
                nid: None,
                verbose: true,
            },
            Request::ConnShow,
            Request::StatsShow,
            Request::GlobalShow,
            Request::PeerShow {
                nid: Some("10.9.9.9@o2ib".into()),
                verbose: true,
            },
        ] {
            let (_, resp) = c.handle(now, &mut n, req, 0).unwrap();
            let line = encode_response(&resp);
            let back: Response = serde_json::from_str(&line).unwrap();
            assert_eq!(back, resp, "{line}");
        }
    }

    #[test]
    fn ping_lo_and_self_complete_through_events() {
        let mut n = node();
        let mut c: Control<&str> = Control::default();
        let now = Instant::from_secs(2);
        let req = Request::Ping {
            nids: vec!["0@lo".into(), "10.0.0.1@o2ib".into(), "10.1.0.1@tcp".into()],
            timeout_secs: None,
            source: None,
        };
        assert!(c.handle(now, &mut n, req, "tok").is_none());
        assert_eq!(c.pending(), 1);
        let mut done = None;
        while let Some(ev) = n.poll_event() {
            if let Some(d) = c.on_event(&ev) {
                done = Some(d);
            }
        }
        let (tok, resp) = done.expect("local pings complete at once");
        assert_eq!(tok, "tok");
        let Response::Ping(p) = resp else {
            panic!("{resp:?}")
        };
        assert_eq!(p.ping.len(), 2);
        assert_eq!(p.ping[0].primary_nid, "10.0.0.1@o2ib");
        assert_eq!(p.ping[0].peer_ni, vec!["10.0.0.1@o2ib".to_string()]);
        assert_eq!(p.manage.len(), 1);
        assert_eq!(p.manage[0].ping, "10.1.0.1@tcp");
        assert_eq!(p.manage[0].errno, -errno::EHOSTUNREACH);
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn ping_of_remote_waits_then_times_out() {
        let mut n = node();
        let mut c: Control<u8> = Control::default();
        let req = Request::Ping {
            nids: vec!["10.0.0.2@o2ib".into()],
            timeout_secs: Some(2),
            source: Some("10.0.0.1@o2ib".into()),
        };
        assert!(c.handle(Instant::from_secs(2), &mut n, req, 9).is_none());
        while n.poll_action().is_some() {}
        n.handle_timeout(Instant::from_secs(5));
        let mut done = None;
        while let Some(ev) = n.poll_event() {
            if let Some(d) = c.on_event(&ev) {
                done = Some(d);
            }
        }
        let (_, Response::Ping(p)) = done.unwrap() else {
            panic!()
        };
        assert_eq!(p.manage.len(), 1);
        assert_eq!(p.manage[0].errno, -errno::ETIMEDOUT);
    }

    #[test]
    fn bad_requests_are_errors() {
        let mut n = node();
        let mut c: Control<()> = Control::default();
        let now = Instant::from_secs(2);
        let mut r = |req| c.handle(now, &mut n, req, ()).unwrap().1;
        let bad_nid = r(Request::Ping {
            nids: vec!["10.0.0.2@ib".into()],
            timeout_secs: None,
            source: None,
        });
        assert!(matches!(
            bad_nid,
            Response::Error(ControlError {
                errno: errno::EINVAL,
                ..
            })
        ));
        let bad_src = r(Request::Ping {
            nids: vec!["0@lo".into()],
            timeout_secs: None,
            source: Some("10.0.0.9@o2ib".into()),
        });
        assert!(matches!(
            bad_src,
            Response::Error(ControlError {
                errno: errno::EINVAL,
                ..
            })
        ));
        let no_peer = r(Request::PeerShow {
            nid: Some("10.0.0.9@o2ib".into()),
            verbose: false,
        });
        assert!(matches!(
            no_peer,
            Response::Error(ControlError {
                errno: errno::ENOENT,
                ..
            })
        ));
    }

    #[test]
    fn capture_requests_round_trip_and_need_the_daemon() {
        for r in [
            Request::CaptureStart {
                duration_secs: Some(3),
            },
            Request::CaptureStart {
                duration_secs: None,
            },
            Request::CaptureStop { id: 7 },
        ] {
            let s = serde_json::to_string(&r).unwrap();
            assert_eq!(decode_request(&s).unwrap(), r, "{s}");
        }
        let mut n = node();
        let mut c: Control<()> = Control::default();
        let (_, resp) = c
            .handle(
                Instant::from_secs(2),
                &mut n,
                Request::CaptureStart {
                    duration_secs: None,
                },
                (),
            )
            .unwrap();
        assert!(matches!(
            resp,
            Response::Error(ControlError {
                errno: errno::EOPNOTSUPP,
                ..
            })
        ));
    }

    #[test]
    fn read_request_caps_lines_and_times_out() {
        use std::time::Duration as D;
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut r = BufReader::with_capacity(1024, a);
        let mut line = Vec::new();
        let t = Some(D::from_millis(50));
        // Several lines in one read, then a pause.
        b.write_all(b"\"conn_show\"\n\n{\"net_show\":{}}\n")
            .unwrap();
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Line
        );
        assert_eq!(line, b"\"conn_show\"");
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Line
        );
        assert!(line.is_empty());
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Line
        );
        assert_eq!(
            decode_request_bytes(&line).unwrap(),
            Request::NetShow { verbose: false }
        );
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Idle
        );
        // Half a line, then nothing: stalled.
        b.write_all(b"{\"net_").unwrap();
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Stalled
        );
        // A line at the cap without a newline: too long, and what was read is bounded.
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut r = BufReader::with_capacity(1024, a);
        let w = std::thread::spawn(move || {
            let chunk = vec![b'x'; 4096];
            let mut sent = 0;
            while let Ok(n) = b.write(&chunk) {
                sent += n;
            }
            sent
        });
        let long = Some(D::from_secs(10));
        assert_eq!(
            read_request(&mut r, &mut line, long, long).unwrap(),
            ReadRequest::TooLong
        );
        assert!(line.len() < MAX_REQUEST);
        drop(r);
        let sent = w.join().unwrap();
        assert!(sent < 4 * MAX_REQUEST, "{sent} bytes went in");
        // A last line without a newline, then EOF.
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut r = BufReader::new(a);
        b.write_all(b"\"stats_show\"").unwrap();
        drop(b);
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Line
        );
        assert_eq!(decode_request_bytes(&line).unwrap(), Request::StatsShow);
        assert_eq!(
            read_request(&mut r, &mut line, t, t).unwrap(),
            ReadRequest::Eof
        );
    }

    #[test]
    fn hex_round_trips() {
        let b: Vec<u8> = (0..=255).collect();
        let h = hex_encode(&b);
        assert_eq!(&h[..6], "000102");
        assert_eq!(hex_decode(&h).unwrap(), b);
        assert_eq!(hex_decode("0A0b").unwrap(), vec![10, 11]);
        assert!(hex_decode("abc").is_none());
        assert!(hex_decode("zz").is_none());
    }

    #[test]
    fn capture_session_streams_records_and_counts_losses() {
        let mut n = node();
        let t0 = Instant::from_secs(2);
        let unix = 1_700_000_000_000_000_000;
        let mut s = CaptureSession::start(&mut n, 1, t0, unix, Some(Duration::from_secs(5)));
        assert_eq!(s.started().nis, vec!["10.0.0.1@o2ib".to_string()]);
        assert!(n.endpoint(NiIndex(0)).unwrap().is_capturing());
        // A ping to a peer makes the LND connect: its CONNREQ is captured.
        let t1 = Instant::from_secs(3);
        n.ping(t1, nid("10.0.0.2@o2ib"), Duration::from_secs(5))
            .unwrap();
        let mut chunks = Vec::new();
        assert!(s.drain(&mut n, |c| {
            chunks.push(c);
            Delivery::Queued
        }));
        assert_eq!(chunks.len(), 1);
        let r = &chunks[0].records[0];
        assert!(r.sent);
        assert_eq!(r.ni, "10.0.0.1@o2ib");
        assert_eq!(r.peer, "10.0.0.2@o2ib");
        assert_eq!(r.ts_ns, unix + 1_000_000_000);
        let bytes = hex_decode(&r.msg).unwrap();
        let (msg, _) = lnd::wire::KibMsg::parse(&bytes).unwrap();
        assert!(matches!(msg.body, lnd::wire::KibBody::ConnReq(_)));

        // Written as one pcap frame around the message.
        let mut w = CaptureWriter::new(Vec::new()).unwrap();
        w.write(r).unwrap();
        assert_eq!(w.frames(), 1);
        let out = w.pcap.into_inner();
        assert_eq!(
            out.len(),
            lnd::wire::pcap::GLOBAL_HEADER_LEN
                + lnd::wire::pcap::RECORD_HEADER_LEN
                + lnd::wire::pcap::FRAME_OVERHEAD
                + bytes.len()
        );
        // IPv4 source and destination are the NIDs' addresses.
        let ip = lnd::wire::pcap::GLOBAL_HEADER_LEN + lnd::wire::pcap::RECORD_HEADER_LEN + 14;
        assert_eq!(&out[ip + 12..ip + 16], &[10, 0, 0, 1]);
        assert_eq!(&out[ip + 16..ip + 20], &[10, 0, 0, 2]);

        // A full stream loses the chunk (counted); a gone client ends the capture.
        n.ping(t1, nid("10.0.0.3@o2ib"), Duration::from_secs(5))
            .unwrap();
        assert!(s.drain(&mut n, |_| Delivery::Full));
        n.ping(t1, nid("10.0.0.4@o2ib"), Duration::from_secs(5))
            .unwrap();
        assert!(!s.drain(&mut n, |_| Delivery::Gone));
        assert!(!s.expired(Instant::from_secs(6)));
        assert!(s.expired(Instant::from_secs(7)));
        let sum = s.finish(&mut n, "stopped");
        assert_eq!(sum.captured, 1);
        assert_eq!(sum.dropped, 1);
        assert_eq!(sum.reason, "stopped");
        assert!(!n.endpoint(NiIndex(0)).unwrap().is_capturing());
    }

    #[test]
    fn net_show_verbose_has_lnd_counters() {
        let n = node();
        let s = net_show(&n, &[], true);
        let ni = &s.net[1].local_nis[0];
        let l = ni.lnd_statistics.as_ref().unwrap();
        assert_eq!(l.counters.get("connects"), Some(0));
        assert_eq!(l.counters.get("capture_drops"), Some(0));
        assert_eq!(l.rejects_sent.0.len(), REJECT_NAMES.len());
        assert_eq!(l.rejects_received.get("conn_stale"), Some(0));
        assert!(net_show(&n, &[], false).net[1].local_nis[0]
            .lnd_statistics
            .is_none());
        // Fabric counters come from the driver, by NI.
        let mut n = node();
        let mut c: Control<()> = Control::default();
        c.set_fabric_counters(0, "tcp", vec![("truncated", 2)]);
        let (_, Response::Net(s)) = c
            .handle(
                Instant::from_secs(2),
                &mut n,
                Request::NetShow { verbose: true },
                (),
            )
            .unwrap()
        else {
            panic!()
        };
        let f = s.net[1].local_nis[0].fabric.as_ref().unwrap();
        assert_eq!(f.kind, "tcp");
        assert_eq!(f.counters.get("truncated"), Some(2));
        assert!(s.net[0].local_nis[0].fabric.is_none(), "0@lo has no fabric");
    }

    #[test]
    fn call_local_pings_lo_without_nis() {
        let t0 = std::time::Instant::now();
        let clock = move || Instant::from_nanos(t0.elapsed().as_nanos() as u64 + 1);
        let mut n = LnetNode::new(NodeConfig::new(vec![]), clock());
        let resp = call_local(
            &mut n,
            Request::Ping {
                nids: vec!["0@lo".into()],
                timeout_secs: Some(1),
                source: None,
            },
            clock,
        );
        let Response::Ping(p) = resp else {
            panic!("{resp:?}")
        };
        assert_eq!(p.ping.len(), 1);
        assert_eq!(p.ping[0].primary_nid, "0@lo");
        assert!(p.manage.is_empty());
    }

    #[test]
    fn socket_is_private_and_serves() {
        let dir = std::env::temp_dir().join(format!("ulnet-ctl-{}", std::process::id()));
        let path = dir.join("s.sock");
        let l = bind_socket(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            serve_connection(s, |req| match req {
                Request::GlobalShow => Response::Global(GlobalShow::default()),
                _ => Response::Error(ControlError::new(errno::EINVAL, "no")),
            })
            .unwrap();
        });
        let mut cl = ControlClient::connect(&path).unwrap();
        assert_eq!(
            cl.call(&Request::GlobalShow).unwrap(),
            Response::Global(GlobalShow::default())
        );
        assert!(matches!(
            cl.call(&Request::ConnShow).unwrap(),
            Response::Error(_)
        ));
        drop(cl);
        t.join().unwrap();
        // A second bind replaces the now stale socket file, and leaves nothing else behind.
        let _l2 = bind_socket(&path).unwrap();
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("s.sock")]);
        // While one answers, a bind fails.
        assert_eq!(
            bind_socket(&path).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(
            ControlClient::connect(&path),
            Err(ClientError::NoDaemon { .. })
        ));
    }
}
