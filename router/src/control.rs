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
    pub const EINVAL: i32 = 22;
    pub const EPROTO: i32 = 71;
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
            Request::NetShow { verbose } => Response::Net(net_show(node, &self.extras, verbose)),
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
            if src != Nid::LO_0 && !node.nids().contains(&src) {
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

/// A blocking client: one request at a time.
pub struct ControlClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
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
        let mut line =
            serde_json::to_string(req).map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .map_err(ClientError::Io)?;
        let mut back = String::new();
        if self.reader.read_line(&mut back).map_err(ClientError::Io)? == 0 {
            return Err(ClientError::Protocol("daemon closed the connection".into()));
        }
        serde_json::from_str(&back).map_err(|e| ClientError::Protocol(e.to_string()))
    }
}

/// Decodes one request line; a bad one becomes the error to send back.
pub fn decode_request(line: &str) -> Result<Request, ControlError> {
    serde_json::from_str(line)
        .map_err(|e| ControlError::new(errno::EPROTO, format!("bad request: {e}")))
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
/// nobody answers on), and sets the socket's mode to 0600. Fails if a daemon already answers.
pub fn bind_socket(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("a daemon already answers on {}", path.display()),
            ));
        }
        debug!(path = %path.display(), "removing a stale control socket");
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Serves one client connection: reads request lines, hands each to `forward` (which returns the
/// response, e.g. after a round trip through the daemon loop), writes the response. Returns when
/// the client closes.
pub fn serve_connection(
    stream: UnixStream,
    mut forward: impl FnMut(Request) -> Response,
) -> io::Result<()> {
    let mut writer = stream.try_clone()?;
    let reader = BufReader::new(stream);
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let resp = match decode_request(&line) {
            Ok(req) => forward(req),
            Err(e) => Response::Error(e),
        };
        writer.write_all(encode_response(&resp).as_bytes())?;
    }
    Ok(())
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
        // A second bind replaces the now stale socket file.
        let _l2 = bind_socket(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(
            ControlClient::connect(&path),
            Err(ClientError::NoDaemon { .. })
        ));
    }
}
