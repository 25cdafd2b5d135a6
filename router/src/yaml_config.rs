//! The `lnet-router` configuration file: YAML in the shape `lnetctl export` writes (`net:` with
//! `net type`, `local NI(s)`, `tunables`, `lnd tunables`; `route:`, `routing:`, `buffers:`;
//! `global:`, `numa:` and one-NI `peer:` entries accepted), plus ours: a `fabric` key per net
//! (`tcp` when absent, `sim` or `verbs`), a `listen` address per NI, and a `peers:` list that
//! tells the fabric where a peer NID listens (both default to the NID's address and o2iblnd's
//! port 987). `udsp:`, `ip2nets:` and Multi-Rail peers are refused by name.
//!
//! ```yaml
//! net:
//!     - net type: o2ib
//!       fabric: tcp
//!       local NI(s):
//!         - nid: 10.0.0.1@o2ib
//!           listen: 127.0.0.1:9870
//!           tunables:
//!               peer_credits: 8
//!           lnd tunables:
//!               timeout: 50
//! peers:
//!     - nid: 10.0.0.2@o2ib
//!       address: 127.0.0.1:9871
//! ```
//!
//! Unknown keys and bad values are errors naming the file and the line
//! (`lnet.yaml:7: unknown key 'peer_credit' (did you mean peer_credits?)`). Keys that
//! `lnetctl export` writes but that mean nothing here (`status`, `interfaces`, `dev cpt`, `CPT`,
//! `map_on_demand`, the FMR pool sizes, `ntx`, `tos`) are accepted and ignored.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use lnd::engine::config::DEFAULT_PEER_LIMIT;
use lnd::engine::{RaceOrder, Tunables};
use lnd::time::Duration;
use lnd::wire::kib::CksumFlavour;
use lnd::wire::{Net, Nid};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::GlobalError;

use crate::config::{
    BufferCounts, NiConfig, NodeConfig, RoutingConfig, BUFFERS_RANGE, DEFAULT_CREDITS,
    DEFAULT_PEER_CREDITS,
};
use crate::gateway::GatewayHealthConfig;
use crate::routes::{RouteConfig, RouteError, RouteTable};

/// Microseconds an NI's fabric busy-polls before sleeping, unless `busy poll us` says otherwise.
pub const DEFAULT_BUSY_POLL_US: u32 = 50;

pub use crate::config::DEFAULT_PEER_TIMEOUT;

/// Which network carries a net's NIs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FabricKind {
    /// TCP sockets framed as RC queue pairs (`lnd::driver::tcp`).
    Tcp,
    /// The deterministic simulator (tests).
    Sim,
    /// rdma_cm + verbs (`lnd::driver::verbs`, in a daemon built with the `verbs` feature).
    Verbs,
}

impl FabricKind {
    /// `tcp`, `sim` or `verbs`.
    pub fn as_str(self) -> &'static str {
        match self {
            FabricKind::Tcp => "tcp",
            FabricKind::Sim => "sim",
            FabricKind::Verbs => "verbs",
        }
    }
}

/// One local NI as configured.
#[derive(Clone, Debug)]
pub struct NiSettings {
    /// NID, credits and LND tunables (incarnation 0: [`DaemonConfig::node_config`] sets it).
    pub ni: NiConfig,
    /// Where the fabric listens for this NI (default: the NID's address, o2iblnd's port 987).
    pub listen: Option<SocketAddr>,
    /// `busy poll us` (ours): how long the NI's fabric spins on its completions before it
    /// sleeps, in microseconds (default 50; 0: never spin, for a router without cores of its
    /// own: a little latency for no idle CPU).
    pub busy_poll_us: u32,
    /// `handshake limit` (ours): accepted sockets that may be in their handshake at once on the
    /// NI's tcp fabric; the excess is closed at once and counted (default
    /// `lnd::driver::tcp::DEFAULT_HANDSHAKE_LIMIT`, 4096; 0: no limit).
    pub handshake_limit: u32,
    /// `tunables: peer_timeout` (seconds; shown by `net show -v`, not enforced yet).
    pub peer_timeout: u32,
    /// `tunables: peer_buffer_credits` (router buffer credits per upstream peer; also in
    /// `ni.peer_buffer_credits`).
    pub peer_buffer_credits: u32,
    /// The line of the NI's `nid:` key.
    pub line: u64,
}

/// One `net:` entry.
#[derive(Clone, Debug)]
pub struct NetSettings {
    pub net: Net,
    pub fabric: FabricKind,
    /// The file named the fabric (else tcp was taken).
    pub fabric_given: bool,
    pub nis: Vec<NiSettings>,
}

/// The whole file, checked.
#[derive(Clone, Debug, Default)]
pub struct DaemonConfig {
    pub nets: Vec<NetSettings>,
    /// Where peer NIDs listen on the tcp fabric (ours; the resolver's table).
    pub peers: HashMap<Nid, SocketAddr>,
    /// `route:`, checked against our NIDs, in file order.
    pub routes: Vec<RouteSettings>,
    /// `routing:` and `buffers:`.
    pub routing: RoutingConfig,
    /// `routing:`'s router-checking settings.
    pub gateway_health: GatewayHealthConfig,
    /// `selftest: enable: 1` (ours): the daemon runs lnet_selftest's service and console, as
    /// a Lustre node does once `lnet_selftest` is loaded. Off by default: a node without it
    /// answers no selftest RPC, so no console can make it send test traffic.
    pub selftest: bool,
    /// `global:` (and `numa: range:`): LNet's global tunables.
    pub globals: crate::GlobalTunables,
    /// Which sections the document had (what `lnetctl import` applies).
    pub given: GivenSections,
}

/// The sections a document had, beyond its nets and routes: an import applies only these, and
/// leaves the rest of the running daemon as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GivenSections {
    /// `routing: enable:`.
    pub routing: bool,
    /// `buffers:`.
    pub buffers: bool,
    /// `peer:` entries (one NI each: what discovery would find, nothing to apply).
    pub peers: usize,
    /// `global:` keys (and `numa: range:`), settable ones only, in file order.
    pub globals: Vec<(String, i64)>,
    /// `routing:`'s module parameters the document gave, as given (seconds; an import sets
    /// these and leaves the others).
    pub router_checks: RouterChecksGiven,
    /// `selftest: enable:` as given.
    pub selftest: Option<bool>,
}

/// The `routing:` module parameters a document gave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouterChecksGiven {
    pub alive_router_check_interval: Option<u32>,
    pub router_ping_timeout: Option<u32>,
    pub avoid_asym_router_failure: Option<bool>,
}

impl RouterChecksGiven {
    /// How many were given.
    pub fn count(&self) -> usize {
        usize::from(self.alive_router_check_interval.is_some())
            + usize::from(self.router_ping_timeout.is_some())
            + usize::from(self.avoid_asym_router_failure.is_some())
    }
}

/// One `route:` entry and its line.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RouteSettings {
    pub route: RouteConfig,
    pub line: u64,
}

impl DaemonConfig {
    /// Every NI, in file order ([`NiIndex`](crate::NiIndex) `i` is the `i`th).
    pub fn nis(&self) -> impl Iterator<Item = (&NetSettings, &NiSettings)> + '_ {
        self.nets
            .iter()
            .flat_map(|n| n.nis.iter().map(move |ni| (n, ni)))
    }

    /// The node's configuration; NI `i` gets incarnation `incarnation + i`.
    pub fn node_config(&self, incarnation: u64) -> NodeConfig {
        let nis = self
            .nis()
            .enumerate()
            .map(|(i, (_, s))| {
                let mut c = s.ni.clone();
                c.incarnation = incarnation.wrapping_add(i as u64);
                c
            })
            .collect();
        // One transaction_timeout for the whole node when the file gives none: from the first
        // NI's LND timeout, so that every NI's runtime holds the same globals.
        let mut globals = self.globals.clone();
        if let Some((_, ni)) = self.nis().next() {
            globals.derive_transaction_timeout(ni.ni.tunables.timeout.as_secs());
        }
        NodeConfig {
            routes: self.routes.iter().map(|r| r.route).collect(),
            routing: self.routing,
            gateway_health: self.gateway_health,
            globals,
            ..NodeConfig::new(nis)
        }
    }

    /// The node split into one configuration per NI, for one runtime (thread) per NI: each
    /// knows every NID of the node (`NodeConfig::node_nids`), NI `i` gets incarnation
    /// `incarnation + i` as in [`DaemonConfig::node_config`], every runtime knows every route,
    /// and each gets an equal share of the router buffers (a runtime is a CPT).
    pub fn ni_node_configs(&self, incarnation: u64) -> Vec<NodeConfig> {
        let whole = self.node_config(incarnation);
        let nids: Vec<Nid> = whole.nis.iter().map(|n| n.nid).collect();
        let share = whole.routing.buffers.share(whole.nis.len());
        let board = crate::alive::NetAlive::new(nids.len());
        whole
            .nis
            .iter()
            .map(|ni| NodeConfig {
                nis: vec![ni.clone()],
                node_nids: nids.clone(),
                net_alive: Some(board.clone()),
                routing: RoutingConfig {
                    buffers: share,
                    ..whole.routing
                },
                ..whole.clone()
            })
            .collect()
    }

    /// Parses a configuration; `origin` names it in errors (usually the file name).
    pub fn parse(text: &str, origin: &str) -> Result<DaemonConfig, ConfigError> {
        Self::parse_with(text, origin, None, false)
    }

    /// Parses a configuration for a daemon started with `--no-nis` (lnet.service's flow: LNet
    /// comes up with no NI, `lnetctl import` or `net add` gives it its NIs): as [`parse`], but
    /// a file that names no NI, or is empty, is a daemon with none yet.
    ///
    /// [`parse`]: DaemonConfig::parse
    pub fn parse_allowing_no_nis(text: &str, origin: &str) -> Result<DaemonConfig, ConfigError> {
        Self::parse_with(text, origin, None, true)
    }

    /// Parses a document for `lnetctl import` into a running daemon whose NIs are `running`:
    /// checked as a configuration file is, except that it may name no NI, and its routes are
    /// only parsed (their values checked): whether each fits the daemon (its gateway on a
    /// local net, its net not local, not there already) is judged when it is applied, item by
    /// item. [`DaemonConfig::given`] says which sections it had.
    pub fn parse_import(
        text: &str,
        origin: &str,
        running: &[Nid],
    ) -> Result<DaemonConfig, ConfigError> {
        Self::parse_with(text, origin, Some(running), true)
    }

    fn parse_with(
        text: &str,
        origin: &str,
        running: Option<&[Nid]>,
        allow_no_nis: bool,
    ) -> Result<DaemonConfig, ConfigError> {
        // An empty file (or one of comments) is no document at all for the parser: refuse it
        // here, with its first line, before serde turns it into a config with nothing in it.
        let raw: Option<RawConfig> =
            serde_saphyr::from_str(text).map_err(|e| from_yaml(origin, text, &e))?;
        let raw = raw.unwrap_or(RawConfig {
            net: None,
            peers: Vec::new(),
            route: Vec::new(),
            routing: None,
            selftest: None,
            buffers: None,
            global: None,
            numa: None,
            peer: None,
            udsp: None,
            ip2nets: None,
        });
        let err = |line: u64, message: String| ConfigError::new(origin, Some(line), message);
        for (key, v) in [("udsp", &raw.udsp), ("ip2nets", &raw.ip2nets)] {
            if let Some(v) = v.as_ref().filter(|v| !v.value.empty) {
                return Err(err(
                    v.referenced.line(),
                    format!(
                        "'{key}:' is not supported by ulnet (remove it, or configure the \
                         NIs it would select under 'net:')"
                    ),
                ));
            }
        }
        for p in raw.peer.iter().flat_map(|p| p.value.iter()) {
            if p.peer_ni.len() > 1 {
                return Err(err(
                    p.primary_nid.referenced.line(),
                    format!(
                        "peer {}: Multi-Rail peers with several NIs are not supported by ulnet \
                         (one NI per peer; remove this 'peer:' entry)",
                        p.primary_nid.value.0
                    ),
                ));
            }
        }
        let mut cfg = DaemonConfig::default();
        let mut seen: HashMap<Nid, u64> = HashMap::new();
        let net_line = raw.net.as_ref().map_or(1, |n| n.referenced.line().max(1));
        for n in raw.net.map(|n| n.value).unwrap_or_default() {
            let net_line = n.net_type.referenced.line();
            let net: Net = n
                .net_type
                .value
                .parse()
                .map_err(|e| err(net_line, format!("bad 'net type': {e}")))?;
            if net == Net::LO {
                // lnetctl export lists the loopback net; it always exists.
                continue;
            }
            // Without `fabric`, tcp (the daemon says so once at start).
            let fabric_given = n.fabric.is_some();
            let fabric = n.fabric.unwrap_or(FabricKind::Tcp);
            let mut nis = Vec::new();
            for ni in n.local_nis {
                let (nid, line) = ni_nid(&ni, net, net_line).map_err(|(l, m)| err(l, m))?;
                if nid.net() != net {
                    return Err(err(
                        line,
                        format!("NID {nid} is not on net type {net} of its 'net:' entry"),
                    ));
                }
                if let Some(first) = seen.insert(nid, line) {
                    return Err(err(
                        line,
                        format!("NID {nid} is configured twice (first on line {first})"),
                    ));
                }
                let mut c = NiConfig::new(nid, 0);
                ulnet_settings(&ni, &mut c).map_err(|(l, m)| err(l, m))?;
                let mut t = ni.tunables.unwrap_or_default();
                let mut l = ni.lnd_tunables.unwrap_or_default();
                // A 2.12-2.14 export's LND tunables, under `tunables:`.
                l.peercredits_hiw = l.peercredits_hiw.or(t.peercredits_hiw.take());
                l.concurrent_sends = l.concurrent_sends.or(t.concurrent_sends.take());
                l.conns_per_peer = l.conns_per_peer.or(t.conns_per_peer.take());
                let credits = checked(&t.credits, DEFAULT_CREDITS, 1, u32::MAX, "credits")
                    .map_err(|(l, m)| err(l, m))?;
                let peer_credits = checked(
                    &t.peer_credits,
                    DEFAULT_PEER_CREDITS,
                    1,
                    255,
                    "peer_credits",
                )
                .map_err(|(l, m)| err(l, m))?;
                c.credits = credits;
                c.peer_timeout = Duration::from_secs(u64::from(
                    t.peer_timeout.unwrap_or(DEFAULT_PEER_TIMEOUT).max(1),
                ));
                c.peer_credits = peer_credits;
                c.peer_buffer_credits = t.peer_buffer_credits.unwrap_or(0);
                // `connect hedge ms` (ulnet's) lives among the LND's tunables.
                let hedge = c.tunables.connect_hedge;
                c.tunables = lnd_tunables(&l, peer_credits as u16).map_err(|(l, m)| err(l, m))?;
                c.tunables.connect_hedge = hedge;
                nis.push(NiSettings {
                    ni: c,
                    listen: ni.listen,
                    busy_poll_us: checked(
                        &ni.busy_poll_us,
                        DEFAULT_BUSY_POLL_US,
                        0,
                        1_000_000,
                        "busy poll us",
                    )
                    .map_err(|(l, m)| err(l, m))?,
                    handshake_limit: checked(
                        &ni.handshake_limit,
                        lnd::driver::tcp::DEFAULT_HANDSHAKE_LIMIT as u32,
                        0,
                        10_000_000,
                        "handshake limit",
                    )
                    .map_err(|(l, m)| err(l, m))?,
                    peer_timeout: t.peer_timeout.unwrap_or(DEFAULT_PEER_TIMEOUT),
                    peer_buffer_credits: t.peer_buffer_credits.unwrap_or(0),
                    line,
                });
            }
            if let Some(existing) = cfg.nets.iter_mut().find(|s| s.net == net) {
                existing.nis.extend(nis);
            } else {
                cfg.nets.push(NetSettings {
                    net,
                    fabric,
                    fabric_given,
                    nis,
                });
            }
        }
        if cfg.nis().next().is_none() && !allow_no_nis {
            // A daemon with no NI does nothing: almost surely a wrong or truncated file, unless
            // asked for (`--no-nis`: NIs come later through lnetctl, as with lnet.service).
            return Err(err(
                net_line,
                "no NI configured (an empty file, 'net: []', or nets without 'local NI(s)'): \
                 a daemon needs at least one, or --no-nis to start without and add them with \
                 lnetctl net add or import"
                    .to_string(),
            ));
        }
        for p in raw.peers {
            let line = p.nid.referenced.line();
            let nid = p.nid.value.0;
            if let Some(ni_line) = seen.get(&nid) {
                return Err(err(
                    line,
                    format!(
                        "peer {nid} is one of our own NIs (line {ni_line}); 'peers:' lists where \
                         other daemons listen"
                    ),
                ));
            }
            // An import's peers apply to the running daemon (every NI's next connect), so
            // its NIs are ours too.
            if running.is_some_and(|r| r.contains(&nid)) {
                return Err(err(
                    line,
                    format!(
                        "peer {nid} is one of this daemon's NIs; 'peers:' lists where other \
                         daemons listen"
                    ),
                ));
            }
            if cfg.peers.insert(nid, p.address).is_some() {
                return Err(err(line, format!("peer {nid} is listed twice")));
            }
        }
        let mut own: Vec<Nid> = cfg.nis().map(|(_, ni)| ni.ni.nid).collect();
        for &n in running.into_iter().flatten() {
            if !own.contains(&n) {
                own.push(n);
            }
        }
        let mut table = RouteTable::default();
        for r in raw.route {
            let line = r.net.referenced.line();
            let net: Net = r
                .net
                .value
                .parse()
                .map_err(|e| err(line, format!("route: bad 'net': {e}")))?;
            let hops = match r.hop {
                None => None,
                Some(h) if h.value == -1 => None,
                Some(h) => match u8::try_from(h.value) {
                    Ok(v) if v >= 1 => Some(v),
                    _ => {
                        return Err(err(
                            h.referenced.line(),
                            format!("route: {}", RouteError::BadHops(h.value)),
                        ))
                    }
                },
            };
            let route = RouteConfig {
                net,
                gateway: r.gateway.value.0,
                hops,
                priority: r.priority.map_or(0, |p| p.value),
            };
            // A configuration file's routes are checked here: a bad one stops the daemon from
            // starting. An import's are checked one by one as they are applied, against the
            // NIs the daemon has then (its own and those the document adds): a route to a net
            // that is local there fails that item only and the rest applies, as Lustre's
            // import does (lnetctl.c, jt_import: each item's error in its error block).
            if running.is_none() {
                table
                    .add(route, &own)
                    .map_err(|e| err(line, format!("route to {net} via {}: {e}", route.gateway)))?;
            }
            cfg.routes.push(RouteSettings { route, line });
        }
        cfg.given.buffers = raw.buffers.is_some();
        cfg.given.routing = raw.routing.as_ref().is_some_and(|r| r.0.enable.is_some());
        cfg.given.peers = raw.peer.as_ref().map_or(0, |p| p.value.len());
        if let Some(b) = raw.buffers {
            let d = BufferCounts::default();
            // The range `lnetctl set *_buffers` checks too.
            let (lo, hi) = (*BUFFERS_RANGE.start(), *BUFFERS_RANGE.end());
            cfg.routing.buffers = BufferCounts {
                tiny: checked(&b.tiny, d.tiny, lo, hi, "buffers: tiny")
                    .map_err(|(l, m)| err(l, m))?,
                small: checked(&b.small, d.small, lo, hi, "buffers: small")
                    .map_err(|(l, m)| err(l, m))?,
                large: checked(&b.large, d.large, lo, hi, "buffers: large")
                    .map_err(|(l, m)| err(l, m))?,
            };
            if let Some(s) = &b.scrub {
                cfg.routing.scrub = s
                    .value
                    .trim()
                    .parse()
                    .map_err(|m| err(s.referenced.line(), format!("buffers: scrub: {m}")))?;
            }
        }
        let numa = raw
            .numa
            .and_then(|n| n.range)
            .map(|r| ("numa_range".to_string(), r));
        // One key at a time for the ranges (an error names its line), then all together for
        // the rules that tie two of them (the section's first line).
        let global_line = raw.global.as_ref().map_or(1, |g| g.referenced.line());
        for (key, v) in raw.global.into_iter().flat_map(|g| g.value).chain(numa) {
            // Lustre <= 2.14's name, which lnetctl still reads (LU-13641 renamed it).
            let key = if key == "max_intf" {
                "max_interfaces".to_string()
            } else {
                key
            };
            if crate::globals::READ_ONLY.contains(&key.as_str()) {
                // Shown by `global show`, so in every export; set elsewhere or derived.
                continue;
            }
            if let Err(e @ (GlobalError::Unknown(_) | GlobalError::OutOfRange { .. })) =
                crate::GlobalTunables::default().set_all(&[(&key, v.value)])
            {
                return Err(err(v.referenced.line(), format!("global: {e}")));
            }
            cfg.given.globals.push((key, v.value));
        }
        // The rules that tie two values are checked against what they will join: the defaults
        // for a configuration file; for an import, the running daemon's values, which only
        // the daemon has (it applies the section all or nothing).
        if running.is_none() {
            let all: Vec<(&str, i64)> = cfg
                .given
                .globals
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect();
            cfg.globals
                .set_all(&all)
                .map_err(|e| err(global_line, format!("global: {e}")))?;
        }
        cfg.given.selftest = raw
            .selftest
            .as_ref()
            .and_then(|s| s.enable.as_ref().map(|e| e.0));
        cfg.selftest = cfg.given.selftest.unwrap_or(false);
        if let Some(RoutingSection(r)) = raw.routing {
            cfg.routing.enabled = r.enable.is_some_and(|s| s.0);
            cfg.given.router_checks = RouterChecksGiven {
                alive_router_check_interval: r
                    .alive_router_check_interval
                    .as_ref()
                    .map(|s| s.value),
                router_ping_timeout: r.router_ping_timeout.as_ref().map(|s| s.value),
                avoid_asym_router_failure: r.avoid_asym_router_failure.as_ref().map(|s| s.0),
            };
            let d = GatewayHealthConfig::default();
            let max = crate::gateway::MAX_ROUTER_CHECK_SECS;
            let secs = |v: &Option<Spanned<u32>>, def: Duration, key: &str| {
                checked(v, def.as_secs() as u32, 0, max, key)
                    .map(|s| Duration::from_secs(u64::from(s)))
                    .map_err(|(l, m)| err(l, m))
            };
            cfg.gateway_health = GatewayHealthConfig {
                check_interval: secs(
                    &r.alive_router_check_interval,
                    d.check_interval,
                    "alive_router_check_interval",
                )?,
                ping_timeout: secs(
                    &r.router_ping_timeout,
                    d.ping_timeout,
                    "router_ping_timeout",
                )?
                .max(Duration::from_secs(1)),
                avoid_asym: r.avoid_asym_router_failure.map_or(d.avoid_asym, |s| s.0),
            };
        }
        Ok(cfg)
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<DaemonConfig, ConfigError> {
        let origin = path.display().to_string();
        let text = crate::text::read_config_file(path)
            .map_err(|e| ConfigError::new(&origin, None, format!("cannot read: {e}")))?;
        DaemonConfig::parse(&text, &origin)
    }

    /// Reads the configuration of a daemon started with `--no-nis`: a missing file is a
    /// daemon with nothing configured yet (every default), else
    /// [`DaemonConfig::parse_allowing_no_nis`].
    pub fn load_allowing_no_nis(path: &Path) -> Result<DaemonConfig, ConfigError> {
        let origin = path.display().to_string();
        match crate::text::read_config_file(path) {
            Ok(text) => DaemonConfig::parse_allowing_no_nis(&text, &origin),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DaemonConfig::default()),
            Err(e) => Err(ConfigError::new(&origin, None, format!("cannot read: {e}"))),
        }
    }
}

/// A configuration error: where, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file name (or whatever `parse` was given).
    pub origin: String,
    /// 1-based line, when known.
    pub line: Option<u64>,
    pub message: String,
}

impl ConfigError {
    /// An error whose message quotes at most an excerpt of whatever it quotes: a 50 MB value
    /// in the file must not make a 50 MB line (the message is cut at
    /// 2 × [`EXCERPT_CHARS`](crate::text::EXCERPT_CHARS) characters, with "…").
    pub fn new(origin: &str, line: Option<u64>, message: impl AsRef<str>) -> ConfigError {
        let max = 2 * crate::text::EXCERPT_CHARS;
        ConfigError {
            origin: crate::text::excerpt(origin, max).into_owned(),
            line,
            message: crate::text::excerpt(message.as_ref(), max).into_owned(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}: {}", self.origin, self.message),
            None => write!(f, "{}: {}", self.origin, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

// ---------------------------------------------------------------------------------- raw shape

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // the ignored sections are only checked, never read
struct RawConfig {
    #[serde(default)]
    net: Option<Spanned<Vec<RawNet>>>,
    #[serde(default)]
    peers: Vec<RawPeer>,
    #[serde(default)]
    route: Vec<RawRoute>,
    #[serde(default)]
    routing: Option<RoutingSection>,
    #[serde(default)]
    selftest: Option<RawSelftest>,
    #[serde(default)]
    buffers: Option<RawBuffers>,
    // Written by `lnetctl export` and lnet.conf. `global:` and `numa: range:` set LNet's global
    // tunables, checked as `lnetctl set` checks them (`crate::globals`); `peer:` entries with
    // one NI are what discovery would find anyway; what we do not implement is refused by name.
    #[serde(default)]
    global: Option<Spanned<std::collections::BTreeMap<String, Spanned<i64>>>>,
    #[serde(default)]
    numa: Option<RawNuma>,
    #[serde(default)]
    peer: Option<Spanned<Vec<RawMrPeer>>>,
    #[serde(default)]
    udsp: Option<Spanned<UnsupportedValue>>,
    #[serde(default)]
    ip2nets: Option<Spanned<UnsupportedValue>>,
}

/// `numa:` as lnetctl exports it: `range: N` is the global `numa_range`.
#[derive(Deserialize)]
struct RawNuma {
    #[serde(default)]
    range: Option<Spanned<i64>>,
}

/// An NI's NID: `nid`, else the IPv4 address of its first interface on `net` (as the kernel
/// makes an NI from `interfaces:`, lnet_ipif_query), with the line to name in errors.
fn ni_nid(ni: &RawNi, net: Net, net_line: u64) -> Result<(Nid, u64), (u64, String)> {
    if let Some(n) = &ni.nid {
        return Ok((n.value.0, n.referenced.line()));
    }
    let Some(ifs) = ni.interfaces.as_ref().filter(|i| !i.value.is_empty()) else {
        return Err((
            net_line,
            "an NI needs 'nid' (or 'interfaces:' to take the NID from)".to_string(),
        ));
    };
    let line = ifs.referenced.line();
    let name = ifs.value.values().next().map_or("", String::as_str);
    let addrs = if_addrs::get_if_addrs().map_err(|e| {
        (
            line,
            format!("interface {name}: cannot list interfaces: {e}"),
        )
    })?;
    let ip = addrs
        .iter()
        .filter(|a| a.name == name)
        .find_map(|a| match a.ip() {
            std::net::IpAddr::V4(v4) => Some(v4),
            std::net::IpAddr::V6(_) => None,
        });
    match ip {
        Some(ip) => Ok((Nid::new(net, u32::from(ip)), line)),
        None if addrs.iter().any(|a| a.name == name) => Err((
            line,
            format!("interface {name} has no IPv4 address to make an NID on {net} from"),
        )),
        None => Err((line, format!("no interface {name} on this host"))),
    }
}

/// A `peer:` entry as `lnetctl export` writes it (Multi-Rail peers): accepted with one NI.
#[derive(Deserialize)]
#[allow(dead_code)] // only checked
struct RawMrPeer {
    #[serde(rename = "primary nid")]
    primary_nid: Spanned<NidValue>,
    #[serde(rename = "peer ni", default)]
    peer_ni: Vec<IgnoredAny>,
}

/// A section we do not implement: its value is only looked at for emptiness.
struct UnsupportedValue {
    empty: bool,
}

impl<'de> Deserialize<'de> for UnsupportedValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Anything; an empty list, map or a null counts as absent.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Any {
            Seq(Vec<IgnoredAny>),
            Map(HashMap<String, IgnoredAny>),
            Other(IgnoredAny),
        }
        Ok(match Option::<Any>::deserialize(d)? {
            None => UnsupportedValue { empty: true },
            Some(Any::Seq(v)) => UnsupportedValue {
                empty: v.is_empty(),
            },
            Some(Any::Map(m)) => UnsupportedValue {
                empty: m.is_empty(),
            },
            Some(Any::Other(_)) => UnsupportedValue { empty: false },
        })
    }
}

/// A `route:` entry, as `lnetctl export` (and `route show -v`) write it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
struct RawRoute {
    net: Spanned<String>,
    gateway: Spanned<NidValue>,
    #[serde(default)]
    hop: Option<Spanned<i64>>,
    #[serde(default)]
    priority: Option<Spanned<u32>>,
    #[serde(default)]
    health_sensitivity: Option<IgnoredAny>,
    #[serde(default)]
    state: Option<IgnoredAny>,
    #[serde(rename = "type", default)]
    kind: Option<IgnoredAny>,
    #[serde(default)]
    detail: Option<IgnoredAny>,
    #[serde(default)]
    seq_no: Option<IgnoredAny>,
}

/// `routing:`: Lustre's `enable`, and the router-checking module parameters under their
/// Lustre names.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
struct RawRouting {
    #[serde(default)]
    enable: Option<Switch>,
    #[serde(default)]
    alive_router_check_interval: Option<Spanned<u32>>,
    #[serde(default)]
    router_ping_timeout: Option<Spanned<u32>>,
    #[serde(default)]
    avoid_asym_router_failure: Option<Switch>,
    #[serde(default)]
    seq_no: Option<IgnoredAny>,
}

/// `routing:` either as a mapping (lnet.conf, `export --backup`) or as `routing show` and a
/// plain `lnetctl export` print it: one `- cpt[N]:` item per CPT (state, skipped) and a last
/// `- enable: N` item.
struct RoutingSection(RawRouting);

impl<'de> Deserialize<'de> for RoutingSection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RoutingSection;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping (enable: 1), or routing show's list of cpt[N] and enable")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                m: A,
            ) -> Result<RoutingSection, A::Error> {
                RawRouting::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(RoutingSection)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut s: A,
            ) -> Result<RoutingSection, A::Error> {
                let mut r = RawRouting {
                    enable: None,
                    alive_router_check_interval: None,
                    router_ping_timeout: None,
                    avoid_asym_router_failure: None,
                    seq_no: None,
                };
                while let Some(item) = s.next_element::<RoutingItem>()? {
                    let RoutingItem(i) = item;
                    r.enable = i.enable.or(r.enable);
                    r.alive_router_check_interval = i
                        .alive_router_check_interval
                        .or(r.alive_router_check_interval);
                    r.router_ping_timeout = i.router_ping_timeout.or(r.router_ping_timeout);
                    r.avoid_asym_router_failure =
                        i.avoid_asym_router_failure.or(r.avoid_asym_router_failure);
                }
                Ok(RoutingSection(r))
            }
        }
        d.deserialize_any(V)
    }
}

/// One item of `routing show`'s list: `cpt[N]:` (the pools' state, skipped) or `enable:`, which
/// ulnet's export follows with the module parameters (`alive_router_check_interval`, ...).
struct RoutingItem(RawRouting);

impl<'de> Deserialize<'de> for RoutingItem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RoutingItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping (cpt[N]: ..., or enable: N)")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<RoutingItem, A::Error> {
                let mut r = RawRouting {
                    enable: None,
                    alive_router_check_interval: None,
                    router_ping_timeout: None,
                    avoid_asym_router_failure: None,
                    seq_no: None,
                };
                while let Some(key) = m.next_key::<String>()? {
                    match key.as_str() {
                        "enable" => r.enable = Some(m.next_value()?),
                        "alive_router_check_interval" => {
                            r.alive_router_check_interval = Some(m.next_value()?)
                        }
                        "router_ping_timeout" => r.router_ping_timeout = Some(m.next_value()?),
                        "avoid_asym_router_failure" => {
                            r.avoid_asym_router_failure = Some(m.next_value()?)
                        }
                        // `cpt[N]:`: the pools' state.
                        _ => {
                            m.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(RoutingItem(r))
            }
        }
        d.deserialize_map(V)
    }
}

/// `selftest:` (ours): whether the daemon runs lnet_selftest.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSelftest {
    #[serde(default)]
    enable: Option<Switch>,
}

/// `buffers:`: router buffers of each size, for the whole node.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
struct RawBuffers {
    #[serde(default)]
    tiny: Option<Spanned<u32>>,
    #[serde(default)]
    small: Option<Spanned<u32>>,
    #[serde(default)]
    large: Option<Spanned<u32>>,
    /// ulnet's: `auto`, `on` or `off` (see `router::BulkScrub`).
    #[serde(default)]
    scrub: Option<Spanned<String>>,
    #[serde(default)]
    seq_no: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNet {
    #[serde(rename = "net type")]
    net_type: Spanned<String>,
    #[serde(default)]
    fabric: Option<FabricKind>,
    #[serde(rename = "local NI(s)", default)]
    local_nis: Vec<RawNi>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
struct RawNi {
    /// Absent in `lnetctl export --backup`, which names the NI by its interface.
    #[serde(default)]
    nid: Option<Spanned<NidValue>>,
    #[serde(default)]
    listen: Option<SocketAddr>,
    #[serde(rename = "busy poll us", default)]
    busy_poll_us: Option<Spanned<u32>>,
    #[serde(rename = "handshake limit", default)]
    handshake_limit: Option<Spanned<u32>>,
    #[serde(default)]
    checksum: Option<Spanned<Switch>>,
    #[serde(rename = "checksum default", default)]
    checksum_default: Option<Spanned<String>>,
    #[serde(rename = "race order", default)]
    race_order: Option<Spanned<String>>,
    #[serde(rename = "connect hedge ms", default)]
    connect_hedge_ms: Option<Spanned<u32>>,
    #[serde(rename = "grant timeout ms", default)]
    grant_timeout_ms: Option<Spanned<u32>>,
    #[serde(rename = "peer limit", default)]
    peer_limit: Option<Spanned<u32>>,
    #[serde(default)]
    tunables: Option<RawTunables>,
    #[serde(rename = "lnd tunables", default)]
    lnd_tunables: Option<RawLndTunables>,
    // Written by `lnetctl export`, meaningless here.
    #[serde(default)]
    status: Option<IgnoredAny>,
    /// `0: ib0`: the network interface whose IPv4 address makes the NID when `nid` is absent
    /// (lnetctl's `net add --if`; the kernel takes the interface's first address).
    #[serde(default)]
    interfaces: Option<Spanned<std::collections::BTreeMap<u32, String>>>,
    #[serde(rename = "dev cpt", default)]
    dev_cpt: Option<IgnoredAny>,
    #[serde(rename = "CPT", default)]
    cpt: Option<IgnoredAny>,
    /// Written for every NI by Lustre 2.10-2.14's `lnetctl export` (the socklnd bonding
    /// removed by LU-13641); meaningless here.
    #[serde(rename = "tcp bonding", default)]
    tcp_bonding: Option<IgnoredAny>,
    // Read-only state `lnetctl export` (without --backup) writes per NI.
    #[serde(default)]
    statistics: Option<IgnoredAny>,
    #[serde(default)]
    sent_stats: Option<IgnoredAny>,
    #[serde(default)]
    received_stats: Option<IgnoredAny>,
    #[serde(default)]
    dropped_stats: Option<IgnoredAny>,
    #[serde(rename = "health stats", default)]
    health_stats: Option<IgnoredAny>,
    #[serde(rename = "udsp info", default)]
    udsp_info: Option<IgnoredAny>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
struct RawTunables {
    #[serde(default)]
    peer_timeout: Option<u32>,
    #[serde(default)]
    peer_credits: Option<Spanned<u32>>,
    #[serde(default)]
    peer_buffer_credits: Option<u32>,
    #[serde(default)]
    credits: Option<Spanned<u32>>,
    // Lustre 2.12-2.14's `lnetctl export` writes o2iblnd's tunables here, beside LNet's, and
    // leaves `lnd tunables:` empty (liblnetconfig.c, lustre_lnet_show_net, until 2.15): taken
    // as the LND's when `lnd tunables` does not give them.
    #[serde(default)]
    peercredits_hiw: Option<Spanned<u32>>,
    #[serde(default)]
    concurrent_sends: Option<Spanned<u32>>,
    #[serde(default)]
    conns_per_peer: Option<Spanned<u32>>,
    #[serde(default)]
    map_on_demand: Option<IgnoredAny>,
    #[serde(default)]
    fmr_pool_size: Option<IgnoredAny>,
    #[serde(default)]
    fmr_flush_trigger: Option<IgnoredAny>,
    #[serde(default)]
    fmr_cache: Option<IgnoredAny>,
    #[serde(default)]
    ntx: Option<IgnoredAny>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // the ignored keys are only checked, never read
struct RawLndTunables {
    #[serde(default)]
    peercredits_hiw: Option<Spanned<u32>>,
    #[serde(default)]
    concurrent_sends: Option<Spanned<u32>>,
    /// Seconds.
    #[serde(default)]
    timeout: Option<Spanned<u32>>,
    /// Seconds.
    #[serde(default)]
    keepalive: Option<Spanned<u32>>,
    // Written by `lnetctl export`, meaningless here.
    #[serde(default)]
    map_on_demand: Option<IgnoredAny>,
    #[serde(default)]
    fmr_pool_size: Option<IgnoredAny>,
    #[serde(default)]
    fmr_flush_trigger: Option<IgnoredAny>,
    #[serde(default)]
    fmr_cache: Option<IgnoredAny>,
    #[serde(default)]
    ntx: Option<IgnoredAny>,
    /// o2iblnd's: connections opened to each peer (0: 1).
    #[serde(default)]
    conns_per_peer: Option<Spanned<u32>>,
    #[serde(default)]
    tos: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    nid: Spanned<NidValue>,
    address: SocketAddr,
}

/// An on/off setting: YAML's `true`/`false` or the words `on`/`off`.
struct Switch(bool);

impl<'de> Deserialize<'de> for Switch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Switch, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Switch;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("on or off")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Switch, E> {
                Ok(Switch(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Switch, E> {
                match v.trim() {
                    "on" | "true" | "yes" | "1" => Ok(Switch(true)),
                    "off" | "false" | "no" | "0" => Ok(Switch(false)),
                    other => Err(E::custom(format!("'{other}' is not on or off"))),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Switch, E> {
                match v {
                    0 => Ok(Switch(false)),
                    1 => Ok(Switch(true)),
                    other => Err(E::custom(format!("{other} is not on or off"))),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Switch, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::custom(format!("{v} is not on or off"))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// ulnet's own per-NI settings (beside `listen` and `busy poll us`), checked at their lines.
fn ulnet_settings(ni: &RawNi, c: &mut NiConfig) -> Result<(), Located> {
    if let Some(s) = &ni.checksum {
        c.checksum.emit = s.value.0;
    }
    if let Some(s) = &ni.checksum_default {
        c.checksum.default_flavour = match s.value.trim() {
            "none" => None,
            "signed" => Some(CksumFlavour::Signed),
            "unsigned" => Some(CksumFlavour::Unsigned),
            other => {
                return Err((
                    s.referenced.line(),
                    format!(
                    "checksum default: unknown flavour '{other}' (known: none, signed, unsigned)"
                ),
                ))
            }
        };
    }
    if let Some(s) = &ni.race_order {
        c.race_order = s
            .value
            .trim()
            .parse::<RaceOrder>()
            .map_err(|m| (s.referenced.line(), format!("race order: {m}")))?;
    }
    let hedge = checked(
        &ni.connect_hedge_ms,
        c.tunables.connect_hedge.as_millis() as u32,
        0,
        60_000,
        "connect hedge ms",
    )?;
    c.tunables.connect_hedge = lnd::time::Duration::from_millis(hedge.into());
    // 0: only the LND timeout, as kernel o2iblnd.
    let grant = checked(
        &ni.grant_timeout_ms,
        c.tunables.grant_timeout.as_millis() as u32,
        0,
        600_000,
        "grant timeout ms",
    )?;
    c.tunables.grant_timeout = lnd::time::Duration::from_millis(grant.into());
    c.peer_limit = checked(
        &ni.peer_limit,
        DEFAULT_PEER_LIMIT as u32,
        1,
        16 * 1024 * 1024,
        "peer limit",
    )? as usize;
    Ok(())
}

/// A NID, parsed while deserializing so that a bad one is reported at its line with lnd's
/// [`NidParseError`](lnd::wire::NidParseError) message.
struct NidValue(Nid);

impl<'de> Deserialize<'de> for NidValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<NidValue, D::Error> {
        let s = String::deserialize(d)?;
        s.trim()
            .parse()
            .map(NidValue)
            .map_err(serde::de::Error::custom)
    }
}

type Located = (u64, String);

/// A tunable's value, or its default; out of `lo..=hi` is an error at its line.
fn checked(
    v: &Option<Spanned<u32>>,
    default: u32,
    lo: u32,
    hi: u32,
    key: &str,
) -> Result<u32, Located> {
    match v {
        None => Ok(default),
        Some(s) if (lo..=hi).contains(&s.value) => Ok(s.value),
        Some(s) => Err((
            s.referenced.line(),
            crate::config::out_of_range(key, s.value, &(lo..=hi)),
        )),
    }
}

/// The o2ib LND's tunables from `lnd tunables:` (0 = automatic, as in o2iblnd).
fn lnd_tunables(l: &RawLndTunables, peer_credits: u16) -> Result<Tunables, Located> {
    let d = Tunables::default();
    let hiw = checked(&l.peercredits_hiw, 0, 0, 255, "peercredits_hiw")?;
    let cs = checked(&l.concurrent_sends, 0, 0, 510, "concurrent_sends")?;
    let timeout = checked(&l.timeout, d.timeout.as_secs() as u32, 1, 3600, "timeout")?;
    let keepalive = checked(
        &l.keepalive,
        d.keepalive.as_secs() as u32,
        0,
        86400,
        "keepalive",
    )?;
    // As the kernel's setter (o2iblnd.c, kiblnd_nl_set: 0..127, 0 meaning the default of 1).
    let cpp = checked(&l.conns_per_peer, 1, 0, 127, "conns_per_peer")?.max(1);
    Ok(Tunables {
        peer_credits,
        peer_credits_hiw: hiw as u16,
        concurrent_sends: cs as u16,
        timeout: Duration::from_secs(u64::from(timeout)),
        keepalive: Duration::from_secs(u64::from(keepalive)),
        conns_per_peer: cpp as u16,
        ..d
    })
}

// ---------------------------------------------------------------------------------- errors

/// Turns serde-saphyr's error into `origin:line: message`, rewording serde's unknown-field
/// message as "unknown key 'x' (did you mean y?)" and quoting the offending line otherwise.
/// Whatever the parser's message holds (a whole value, a deeply nested structure), the result
/// quotes at most an excerpt of it and of the line ([`EXCERPT_CHARS`](crate::text::EXCERPT_CHARS)
/// characters of the line, with "…").
fn from_yaml(origin: &str, text: &str, e: &serde_saphyr::Error) -> ConfigError {
    use crate::text::{excerpt, EXCERPT_CHARS};
    let line = e.location().map(|l| l.line()).filter(|&l| l > 0);
    let mut msg = e.without_snippet().to_string();
    // serde-saphyr appends " at line L, column C"; we print the line ourselves.
    if let Some(i) = msg.rfind(" at line ") {
        msg.truncate(i);
    }
    let msg = crate::text::reword_yaml(&msg).unwrap_or(msg);
    let message = if let Some(m) = reword_unknown(&msg) {
        m
    } else {
        let msg = excerpt(&msg, EXCERPT_CHARS);
        match line.and_then(|l| text.lines().nth(l as usize - 1)) {
            Some(src) if !src.trim().is_empty() => {
                format!("{msg}: `{}`", excerpt(src.trim(), EXCERPT_CHARS))
            }
            _ => msg.into_owned(),
        }
    };
    ConfigError::new(origin, line, message)
}

/// "unknown field `x`, expected one of a, b" -> "unknown key 'x' (did you mean a?)".
fn reword_unknown(msg: &str) -> Option<String> {
    let rest = msg.strip_prefix("unknown field `")?;
    let (key, rest) = rest.split_once('`')?;
    // A key may be as long as the file: compare and quote an excerpt.
    let key = &*crate::text::excerpt(key, crate::text::EXCERPT_CHARS);
    let expected: Vec<String> = rest
        .split_once("expected")
        .map(|(_, list)| {
            list.trim_start_matches(" one of")
                .split(',')
                .map(|s| s.trim().trim_matches('`').to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let best = expected
        .iter()
        .map(|k| (strsim::levenshtein(key, k), k))
        .min_by_key(|&(d, _)| d)
        .filter(|&(d, k)| d <= 3.max(k.len() / 3));
    Some(match best {
        Some((_, k)) => format!("unknown key '{key}' (did you mean {k}?)"),
        None if expected.is_empty() => format!("unknown key '{key}'"),
        None => format!("unknown key '{key}' (known: {})", expected.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
net:
    - net type: o2ib
      fabric: tcp
      local NI(s):
        - nid: 10.0.0.1@o2ib
          listen: 127.0.0.1:9870
          status: up
          tunables:
              peer_timeout: 180
              peer_credits: 16
              peer_buffer_credits: 0
              credits: 512
          lnd tunables:
              peercredits_hiw: 8
              concurrent_sends: 16
              timeout: 40
              keepalive: 90
              map_on_demand: 1
peers:
    - nid: 10.0.0.2@o2ib
      address: 127.0.0.1:9871
";

    #[test]
    fn good_config_parses() {
        let c = DaemonConfig::parse(GOOD, "t.yaml").unwrap();
        assert_eq!(c.nets.len(), 1);
        let (net, ni) = c.nis().next().unwrap();
        assert_eq!(net.fabric, FabricKind::Tcp);
        assert_eq!(ni.ni.nid.to_string(), "10.0.0.1@o2ib");
        assert_eq!(ni.listen, Some("127.0.0.1:9870".parse().unwrap()));
        assert_eq!(ni.busy_poll_us, DEFAULT_BUSY_POLL_US);
        assert_eq!((ni.ni.credits, ni.ni.peer_credits), (512, 16));
        assert_eq!(ni.ni.tunables.peer_credits, 16);
        assert_eq!(ni.ni.tunables.peer_credits_hiw, 8);
        assert_eq!(ni.ni.tunables.concurrent_sends, 16);
        assert_eq!(ni.ni.tunables.timeout, Duration::from_secs(40));
        assert_eq!(ni.ni.tunables.keepalive, Duration::from_secs(90));
        assert_eq!(ni.ni.tunables.conns_per_peer, 1, "o2iblnd's default");
        assert_eq!(ni.line, 5);
        // o2iblnd's conns_per_peer: 0 is its default of 1, 127 at most (kiblnd_nl_set).
        for (v, want) in [
            ("0", Ok(1)),
            ("4", Ok(4)),
            ("127", Ok(127)),
            ("128", Err(())),
        ] {
            let y = GOOD.replace(
                "              keepalive: 90\n",
                &format!("              keepalive: 90\n              conns_per_peer: {v}\n"),
            );
            match (DaemonConfig::parse(&y, "t.yaml"), want) {
                (Ok(c), Ok(n)) => {
                    assert_eq!(c.nis().next().unwrap().1.ni.tunables.conns_per_peer, n)
                }
                (Err(e), Err(())) => {
                    let e = e.to_string();
                    assert!(e.contains("t.yaml:18: conns_per_peer"), "{e}");
                }
                (got, want) => panic!("conns_per_peer {v}: {:?} for {want:?}", got.is_ok()),
            }
        }
        let peer: Nid = "10.0.0.2@o2ib".parse().unwrap();
        assert_eq!(c.peers[&peer], "127.0.0.1:9871".parse().unwrap());
        let node = c.node_config(77);
        assert_eq!(node.nis.len(), 1);
        assert_eq!(node.nis[0].incarnation, 77);
    }

    #[test]
    fn defaults_apply() {
        let y = "net:\n  - net type: tcp1\n    fabric: sim\n    local NI(s):\n      - nid: 1.2.3.4@tcp1\n";
        let c = DaemonConfig::parse(y, "t.yaml").unwrap();
        let (_, ni) = c.nis().next().unwrap();
        assert_eq!((ni.ni.credits, ni.ni.peer_credits), (256, 8));
        assert_eq!(ni.ni.tunables, Tunables::default());
        assert_eq!(ni.peer_timeout, 180);
    }

    #[test]
    fn unknown_key_names_line_and_suggests() {
        let y = GOOD.replace("peer_credits: 16", "peer_credit: 16");
        let e = DaemonConfig::parse(&y, "config.yaml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "config.yaml:10: unknown key 'peer_credit' (did you mean peer_credits?)"
        );
    }

    #[test]
    fn bad_nid_names_line_with_lnd_message() {
        let y = GOOD.replace("nid: 10.0.0.2@o2ib", "nid: 10.0.0.2@ib0");
        let e = DaemonConfig::parse(&y, "config.yaml").unwrap_err();
        assert_eq!(e.line, Some(20));
        assert!(
            e.message
                .contains("bad NID '10.0.0.2@ib0': unknown network type 'ib'"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_name_line_and_value() {
        let y = GOOD.replace("credits: 512", "credits: lots");
        let e = DaemonConfig::parse(&y, "c.yaml").unwrap_err();
        assert_eq!(e.line, Some(12), "{e}");
        assert!(e.message.contains("credits: lots"), "{e}");

        let y = GOOD.replace("peer_credits: 16", "peer_credits: 300");
        let e = DaemonConfig::parse(&y, "c.yaml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "c.yaml:10: peer_credits: 300 is out of range 1..=255"
        );

        let y = GOOD.replace("fabric: tcp", "fabric: ib");
        let e = DaemonConfig::parse(&y, "c.yaml").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");

        let y = GOOD.replace("listen: 127.0.0.1:9870", "listen: nowhere");
        let e = DaemonConfig::parse(&y, "c.yaml").unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
    }

    #[test]
    fn semantic_errors_name_line() {
        let y = GOOD.replace("nid: 10.0.0.1@o2ib", "nid: 10.0.0.1@o2ib1");
        let e = DaemonConfig::parse(&y, "c.yaml").unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.message.contains("not on net type o2ib"), "{e}");

        // Without `listen`, the NI listens where o2iblnd would (its address, port 987: the
        // daemon's default), and a net without `fabric` is tcp.
        let y = GOOD.replace("          listen: 127.0.0.1:9870\n", "");
        let c = DaemonConfig::parse(&y, "c.yaml").unwrap();
        assert_eq!(c.nis().next().unwrap().1.listen, None);
        let y = GOOD.replace("      fabric: tcp\n", "");
        let c = DaemonConfig::parse(&y, "c.yaml").unwrap();
        assert_eq!(
            (c.nets[0].fabric, c.nets[0].fabric_given),
            (FabricKind::Tcp, false)
        );
    }

    /// A file in the shape `lnetctl export` writes (lnetctl.c and liblnetconfig.c's YAML
    /// builders: the `lo` net, each NI's status, interfaces, statistics, sent/received/dropped
    /// stats, health stats, tunables with the LND's, `dev cpt` and `CPT`; `route:` with
    /// health_sensitivity; one-NI `peer:` entries; `global:` with 2.16's keys; `numa:`),
    /// written from those sources' key lists, loads unedited; `udsp:`, `ip2nets:` and
    /// Multi-Rail peers are refused, each with one line naming it.
    #[test]
    fn an_lnetctl_export_loads_and_unsupported_sections_are_named() {
        let export = "\
net:
    - net type: lo
      local NI(s):
        - nid: 0@lo
          status: up
          statistics:
              send_count: 0
              recv_count: 0
              drop_count: 0
          sent_stats:
              put: 0
              get: 0
              reply: 0
              ack: 0
              hello: 0
          received_stats:
              put: 0
              get: 0
              reply: 0
              ack: 0
              hello: 0
          dropped_stats:
              put: 0
              get: 0
              reply: 0
              ack: 0
              hello: 0
          health stats:
              health value: 0
              interrupts: 0
              dropped: 0
              aborted: 0
              no route: 0
              timeouts: 0
              error: 0
              ping_count: 0
              next_ping: 0
          tunables:
              peer_timeout: 0
              peer_credits: 0
              peer_buffer_credits: 0
              credits: 0
          dev cpt: 0
          CPT: \"[0]\"
    - net type: o2ib
      local NI(s):
        - nid: 10.0.0.1@o2ib
          status: up
          interfaces:
              0: ib0
          statistics:
              send_count: 12
              recv_count: 12
              drop_count: 0
          health stats:
              health value: 1000
              interrupts: 0
              dropped: 0
              aborted: 0
              no route: 0
              timeouts: 0
              error: 0
              ping_count: 0
              next_ping: 0
          tunables:
              peer_timeout: 180
              peer_credits: 8
              peer_buffer_credits: 0
              credits: 256
          lnd tunables:
              peercredits_hiw: 4
              map_on_demand: 1
              concurrent_sends: 8
              fmr_pool_size: 512
              fmr_flush_trigger: 384
              fmr_cache: 1
              ntx: 512
              conns_per_peer: 1
              timeout: 50
          dev cpt: -1
          CPT: \"[0,1]\"
route:
    - net: o2ib1
      gateway: 10.0.0.254@o2ib
      hop: -1
      priority: 0
      health_sensitivity: 1
peer:
    - primary nid: 10.0.0.2@o2ib
      Multi-Rail: True
      peer ni:
        - nid: 10.0.0.2@o2ib
          state: NA
routing:
    enable: 0
buffers:
    tiny: 2048
    small: 16384
    large: 1024
global:
    numa_range: 0
    max_interfaces: 200
    discovery: 1
    drop_asym_route: 0
    retry_count: 2
    transaction_timeout: 150
    health_sensitivity: 100
    recovery_interval: 1
    router_sensitivity: 100
    lnd_timeout: 49
    response_tracking: 3
    recovery_limit: 0
    max_recovery_ping_interval: 900
numa:
    range: 0
";
        let c = DaemonConfig::parse(export, "export.yaml").unwrap();
        let nis: Vec<_> = c
            .nis()
            .map(|(n, ni)| (n.fabric, ni.ni.nid, ni.listen))
            .collect();
        assert_eq!(
            nis,
            vec![(FabricKind::Tcp, "10.0.0.1@o2ib".parse().unwrap(), None)]
        );
        assert!(!c.nets[0].fabric_given);
        // `global:` is applied, read-only keys (lnd_timeout) skipped.
        let g = &c.node_config(1).globals;
        assert_eq!(g.get("retry_count"), Some(2));
        assert_eq!(g.get("transaction_timeout"), Some(150));
        assert_eq!(g.get("max_recovery_ping_interval"), Some(900));
        assert_eq!(g.get("discovery"), Some(1));
        for (bad, want) in [
            (
                "    health_sensitivity: 100\n",
                "    health_sensitivity: 1001\n",
            ),
            ("    numa_range: 0\n", "    numa_rnge: 0\n"),
            ("    range: 0\n", "    range: -4\n"),
        ] {
            let text = export.replace(bad, want);
            let line = text.lines().position(|l| l == want.trim_end()).unwrap() + 1;
            let e = DaemonConfig::parse(&text, "export.yaml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("export.yaml:{line}")), "{e}");
            assert!(e.contains("global: "), "{e}");
        }
        assert!(!c.selftest, "lnet_selftest is off unless asked for");
        let on = DaemonConfig::parse(&format!("{export}selftest:\n    enable: 1\n"), "x").unwrap();
        assert!(on.selftest);
        assert_eq!(c.routes.len(), 1);
        assert_eq!(
            c.nis().next().unwrap().1.ni.tunables.timeout,
            Duration::from_secs(50)
        );

        let with = |extra: &str| format!("{export}{extra}");
        let e = DaemonConfig::parse(
            &with("udsp:\n    - src: o2ib\n      action:\n          priority: 0\n"),
            "x.yaml",
        )
        .unwrap_err();
        assert!(e.message.contains("'udsp:' is not supported"), "{e}");
        let e =
            DaemonConfig::parse(&with("ip2nets:\n    - net-spec: o2ib\n"), "x.yaml").unwrap_err();
        assert!(e.message.contains("'ip2nets:' is not supported"), "{e}");
        // An empty udsp list (what an export without rules writes) is fine.
        DaemonConfig::parse(&with("udsp: []\n"), "x.yaml").unwrap();
        let mr = export.replace(
            "        - nid: 10.0.0.2@o2ib\n          state: NA\n",
            "        - nid: 10.0.0.2@o2ib\n          state: NA\n        - nid: 10.0.1.2@o2ib1\n          state: NA\n",
        );
        let e = DaemonConfig::parse(&mr, "x.yaml").unwrap_err();
        assert!(
            e.message.contains("Multi-Rail peers with several NIs"),
            "{e}"
        );
        assert_eq!(e.to_string().lines().count(), 1, "{e}");
    }

    #[test]
    fn shipped_example_parses() {
        let text = include_str!("../examples/lnet-router.yaml");
        let c = DaemonConfig::parse(text, "lnet-router.yaml").unwrap();
        assert!(c.nis().count() >= 1);
    }

    #[test]
    fn ulnet_keys_checksum_race_order_and_peer_limit() {
        use lnd::engine::RaceOrder;
        use lnd::wire::kib::CksumFlavour;
        let d = DaemonConfig::parse(GOOD, "t.yaml").unwrap();
        let ni = &d.nis().next().unwrap().1.ni;
        assert!(
            !ni.checksum.emit,
            "checksums are off by default, as cksum=0"
        );
        assert_eq!(ni.checksum.default_flavour, None);
        assert_eq!(ni.race_order, RaceOrder::NidHash, "2.16's order by default");
        assert_eq!(ni.peer_limit, DEFAULT_PEER_LIMIT);
        assert_eq!(
            ni.tunables.connect_hedge,
            lnd::time::Duration::from_secs(1),
            "a stuck connect gets a second attempt after 1 s by default"
        );
        let with = |extra: &str| {
            GOOD.replace(
                "          listen: 127.0.0.1:9870\n",
                &format!("          listen: 127.0.0.1:9870\n{extra}"),
            )
        };
        let y = with(
            "          checksum: on\n          checksum default: signed\n          race order: nid\n          peer limit: 50000\n          connect hedge ms: 0\n",
        );
        let c = DaemonConfig::parse(&y, "t.yaml").unwrap();
        let ni = &c.nis().next().unwrap().1.ni;
        assert!(ni.tunables.connect_hedge.is_zero(), "0 turns it off");
        assert!(ni.checksum.emit);
        assert_eq!(ni.checksum.default_flavour, Some(CksumFlavour::Signed));
        assert_eq!(ni.race_order, RaceOrder::Nid);
        assert_eq!(ni.peer_limit, 50_000);
        let y = with("          checksum: true\n          checksum default: unsigned\n");
        let ni = DaemonConfig::parse(&y, "t.yaml")
            .unwrap()
            .nis()
            .next()
            .unwrap()
            .1
            .ni
            .clone();
        assert!(ni.checksum.emit);
        assert_eq!(ni.checksum.default_flavour, Some(CksumFlavour::Unsigned));
        // Bad values name their line and the key.
        for (bad, key) in [
            ("          race order: hash\n", "race order"),
            ("          checksum default: maybe\n", "checksum default"),
            ("          checksum: sometimes\n", "on or off"),
            ("          peer limit: 0\n", "peer limit"),
            ("          connect hedge ms: 60001\n", "connect hedge ms"),
        ] {
            let e = DaemonConfig::parse(&with(bad), "t.yaml").unwrap_err();
            assert!(e.to_string().contains(key), "{bad}: {e}");
            assert!(e.to_string().starts_with("t.yaml:"), "{bad}: {e}");
        }
    }

    #[test]
    fn configs_without_nis_and_self_peers_are_refused() {
        for (y, line) in [
            ("", 1),
            ("# just a comment\n", 1),
            ("\nnet: []\n", 2),
            ("net:\n    - net type: lo\n", 2),
            ("net:\n    - net type: o2ib\n      local NI(s): []\n", 2),
        ] {
            let e = DaemonConfig::parse(y, "t.yaml").unwrap_err();
            assert_eq!(e.line, Some(line), "{y:?}: {e}");
            assert!(e.message.contains("no NI configured"), "{e}");
            // Asked for (--no-nis), each is a daemon with no NI yet.
            let c = DaemonConfig::parse_allowing_no_nis(y, "t.yaml").unwrap();
            assert_eq!(c.nis().count(), 0, "{y:?}");
        }
        // --no-nis still reads what the file says, and still refuses what is wrong in it.
        let c = DaemonConfig::parse_allowing_no_nis("routing:\n    enable: 1\n", "t.yaml").unwrap();
        assert!(c.routing.enabled);
        let e = DaemonConfig::parse_allowing_no_nis("routing:\n    enable: maybe\n", "t.yaml")
            .unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        let missing = std::path::Path::new("/nonexistent/ulnet/lnet-router.yaml");
        assert_eq!(
            DaemonConfig::load_allowing_no_nis(missing)
                .unwrap()
                .nis()
                .count(),
            0
        );
        assert!(DaemonConfig::load(missing).is_err());
        let y = GOOD.replace("nid: 10.0.0.2@o2ib", "nid: 10.0.0.1@o2ib");
        let e = DaemonConfig::parse(&y, "t.yaml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.yaml:20: peer 10.0.0.1@o2ib is one of our own NIs (line 5); 'peers:' lists \
             where other daemons listen"
        );
    }

    #[test]
    fn errors_quote_excerpts_only() {
        let big = "7".repeat(100_000);
        let y = GOOD.replace("credits: 512", &format!("credits: {big}"));
        let e = DaemonConfig::parse(&y, "c.yaml").unwrap_err();
        assert_eq!(e.line, Some(12), "{e}");
        assert!(e.to_string().chars().count() < 400, "{e}");
        assert!(e.message.ends_with("…`") || e.message.ends_with('…'), "{e}");
        // (YAML's simple keys are at most 1024 characters.)
        let y = GOOD.replace(
            "peer_credits: 16",
            &format!("peer_credit{}: 16", &big[..600]),
        );
        let e = DaemonConfig::parse(&y, "c.yaml").unwrap_err();
        assert_eq!(e.line, Some(10), "{e}");
        assert!(e.message.starts_with("unknown key 'peer_credit7"), "{e}");
        assert!(e.to_string().chars().count() < 400, "{e}");
        let nested = format!("net: {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
        let e = DaemonConfig::parse(&nested, "c.yaml").unwrap_err();
        assert!(e.to_string().chars().count() < 400, "{e}");
    }

    #[test]
    fn busy_poll_is_per_ni_and_checked() {
        let y = GOOD.replace(
            "          listen: 127.0.0.1:9870\n",
            "          listen: 127.0.0.1:9870\n          busy poll us: 0\n",
        );
        let c = DaemonConfig::parse(&y, "t.yaml").unwrap();
        assert_eq!(c.nis().next().unwrap().1.busy_poll_us, 0);
        let y = GOOD.replace(
            "          listen: 127.0.0.1:9870\n",
            "          listen: 127.0.0.1:9870\n          busy poll us: 2000000\n",
        );
        let e = DaemonConfig::parse(&y, "t.yaml").unwrap_err();
        assert_eq!(e.line, Some(7), "{e}");
        assert!(e.message.contains("busy poll us"), "{e}");
    }

    #[test]
    fn handshake_limit_is_per_ni_and_checked() {
        let c = DaemonConfig::parse(GOOD, "t.yaml").unwrap();
        assert_eq!(c.nis().next().unwrap().1.handshake_limit, 4096);
        let y = GOOD.replace(
            "          listen: 127.0.0.1:9870\n",
            "          listen: 127.0.0.1:9870\n          handshake limit: 100\n",
        );
        let c = DaemonConfig::parse(&y, "t.yaml").unwrap();
        assert_eq!(c.nis().next().unwrap().1.handshake_limit, 100);
        let y = GOOD.replace(
            "          listen: 127.0.0.1:9870\n",
            "          listen: 127.0.0.1:9870\n          handshake limit: -1\n",
        );
        let e = DaemonConfig::parse(&y, "t.yaml").unwrap_err();
        assert_eq!(e.line, Some(7), "{e}");
    }

    /// What `lnetctl export` writes on a Lustre router (net, route, routing, buffers, peer,
    /// global), plus ulnet's `fabric`/`listen`: it loads, with the routing sections read.
    const ROUTER_EXPORT: &str = "\
net:
    - net type: lo
      local NI(s):
        - nid: 0@lo
          status: up
    - net type: o2ib
      fabric: tcp
      local NI(s):
        - nid: 10.0.0.254@o2ib
          listen: 127.0.0.1:9881
          status: up
          interfaces:
              0: ib0
          tunables:
              peer_timeout: 180
              peer_credits: 8
              peer_buffer_credits: 16
              credits: 256
          lnd tunables:
              peercredits_hiw: 4
              map_on_demand: 1
              concurrent_sends: 8
              fmr_pool_size: 512
              fmr_flush_trigger: 384
              fmr_cache: 1
              ntx: 512
              conns_per_peer: 1
          dev cpt: 0
          CPT: \"[0]\"
    - net type: o2ib1
      fabric: tcp
      local NI(s):
        - nid: 10.1.0.254@o2ib1
          listen: 127.0.0.1:9882
route:
    - net: o2ib2
      gateway: 10.1.0.253@o2ib1
      hop: 2
      priority: 1
      health_sensitivity: 1
    - net: o2ib3
      gateway: 10.0.0.253@o2ib
      hop: -1
      priority: 0
      health_sensitivity: 1
routing:
    enable: 1
buffers:
    tiny: 512
    small: 4096
    large: 256
peer:
    - primary nid: 10.0.0.1@o2ib
      Multi-Rail: False
      peer ni:
        - nid: 10.0.0.1@o2ib
global:
    numa_range: 0
    max_interfaces: 200
    discovery: 1
";

    /// `lnetctl export --backup` of a Lustre 2.16 node with one o2ib NI on an interface, one
    /// route, routing on and the default globals, in the layout lnetctl writes it (libyaml's
    /// indent 6 for net, route and peer; cYAML for the rest). Facts from lnetctl.c
    /// (jt_export), api-ni.c (the backup dumps: no nid, no lnd `timeout`, `map_on_demand` as a
    /// flag, `CPT` quoted) and liblnetconfig.c (routing/buffers/global); the interface is `lo`
    /// here so that the test host has it.
    const LUSTRE_BACKUP: &str = include_str!("../tests/data/lustre-2.16-export-backup.yaml");

    #[test]
    fn a_lustre_backup_loads_its_ni_named_by_interface() {
        let c = DaemonConfig::parse(LUSTRE_BACKUP, "backup.yaml").unwrap();
        let nids: Vec<Nid> = c.nis().map(|(_, ni)| ni.ni.nid).collect();
        assert_eq!(nids, vec!["127.0.0.1@o2ib".parse::<Nid>().unwrap()]);
        let ni = &c.nis().next().unwrap().1.ni;
        assert_eq!((ni.credits, ni.peer_credits), (256, 8));
        assert_eq!(c.routes.len(), 1);
        assert!(c.routing.enabled);
        assert_eq!(c.routing.buffers.small, 16384);
        let g = &c.globals;
        assert_eq!(
            (
                g.get("retry_count"),
                g.get("health_sensitivity"),
                g.get("max_interfaces")
            ),
            (Some(2), Some(100), Some(4096))
        );
        assert_eq!(c.given.globals.len(), 12, "lnd_timeout is shown, not set");
        // An interface this host does not have is named, with its line.
        let e = DaemonConfig::parse(
            &LUSTRE_BACKUP.replace("0: lo\n", "0: ulnet-nosuch0\n"),
            "backup.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("backup.yaml:5") && e.contains("no interface ulnet-nosuch0"),
            "{e}"
        );
        // Neither nid nor interfaces: said plainly.
        let e = DaemonConfig::parse(
            "net:\n-     net type: o2ib\n      local NI(s):\n      -     status: up\n",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs 'nid'"), "{e}");
    }

    /// A Lustre 2.12-2.14 `lnetctl export` (liblnetconfig.c and lnetctl.c of 2.12.9, before
    /// LU-13641 and the 2.15 layout): `tcp bonding` and `dev cpt` per NI, o2iblnd's tunables
    /// under `tunables:` with an empty `lnd tunables:`, and `global: max_intf:`. It loads as a
    /// file and as an import, `max_intf` taken as `max_interfaces`, the LND's tunables as such.
    #[test]
    fn a_lustre_2_12_export_loads() {
        let export = "\
net:
    - net type: lo
      local NI(s):
        - nid: 0@lo
          status: up
          statistics:
              send_count: 0
              recv_count: 0
              drop_count: 0
          tunables:
              peer_timeout: 0
              peer_credits: 0
              peer_buffer_credits: 0
              credits: 0
          dev cpt: 0
          tcp bonding: 0
          CPT: \"[0,1]\"
    - net type: o2ib
      local NI(s):
        - nid: 10.0.0.1@o2ib
          status: up
          interfaces:
              0: ib0
          statistics:
              send_count: 10
              recv_count: 10
              drop_count: 0
          tunables:
              peer_timeout: 180
              peer_credits: 16
              peer_buffer_credits: 0
              credits: 512
              peercredits_hiw: 8
              map_on_demand: 0
              concurrent_sends: 16
              fmr_pool_size: 512
              fmr_flush_trigger: 384
              fmr_cache: 1
              ntx: 512
              conns_per_peer: 2
          lnd tunables:
          dev cpt: -1
          tcp bonding: 0
          CPT: \"[0,1]\"
routing:
    - cpt[0]:
          tiny:
              npages: 0
              nbuffers: 512
              credits: 512
              mincredits: 512
    - enable: 0
buffers:
    tiny: 512
    small: 4096
    large: 256
global:
    numa_range: 0
    max_intf: 300
    discovery: 1
    drop_asym_route: 0
    retry_count: 0
    transaction_timeout: 50
    health_sensitivity: 0
    recovery_interval: 1
";
        let c = DaemonConfig::parse(export, "l212.yaml").unwrap_or_else(|e| panic!("{e}"));
        let (_, ni) = c.nis().next().unwrap();
        assert_eq!(ni.ni.nid.to_string(), "10.0.0.1@o2ib");
        assert_eq!((ni.ni.credits, ni.ni.peer_credits), (512, 16));
        let t = &ni.ni.tunables;
        assert_eq!(
            (t.peer_credits_hiw, t.concurrent_sends, t.conns_per_peer),
            (8, 16, 2),
            "the LND's tunables, from under tunables:"
        );
        assert_eq!(c.globals.get("max_interfaces"), Some(300));
        assert!(c
            .given
            .globals
            .contains(&("max_interfaces".to_string(), 300)));
        let nid = ni.ni.nid;
        let i =
            DaemonConfig::parse_import(export, "import", &[nid]).unwrap_or_else(|e| panic!("{e}"));
        assert!(i
            .given
            .globals
            .contains(&("max_interfaces".to_string(), 300)));
        // `lnd tunables` win over the 2.12 place when both say.
        let both = export.replace(
            "          lnd tunables:\n          dev cpt: -1",
            "          lnd tunables:\n              peercredits_hiw: 4\n          dev cpt: -1",
        );
        let c = DaemonConfig::parse(&both, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.nis().next().unwrap().1.ni.tunables.peer_credits_hiw, 4);
    }

    #[test]
    fn a_routers_lnetctl_export_loads_with_its_routes_and_buffers() {
        let c = DaemonConfig::parse(ROUTER_EXPORT, "export.yaml").unwrap();
        assert!(c.routing.enabled);
        assert_eq!(
            c.routing.buffers,
            BufferCounts {
                tiny: 512,
                small: 4096,
                large: 256
            }
        );
        let routes: Vec<RouteConfig> = c.routes.iter().map(|r| r.route).collect();
        assert_eq!(routes.len(), 2);
        assert_eq!(routes[0].net.to_string(), "o2ib2");
        assert_eq!(routes[0].hops, Some(2));
        assert_eq!(routes[0].priority, 1);
        assert_eq!(routes[1].hops, None);
        assert_eq!(c.routes[0].line, 36);
        assert_eq!(c.routes[1].line, 41);
        let ni = &c.nis().next().unwrap().1.ni;
        assert_eq!(ni.peer_buffer_credits, 16);
        // Each NI runtime gets the routes, routing on, and its share of the buffers.
        let per_ni = c.ni_node_configs(1);
        assert_eq!(per_ni.len(), 2);
        for n in &per_ni {
            assert_eq!(n.routes, routes);
            assert!(n.routing.enabled);
            assert_eq!(n.routing.buffers.small, 2048);
        }
        // Without `routing:`, a node does not forward.
        let plain = ROUTER_EXPORT.replace("routing:\n    enable: 1\n", "");
        assert!(
            !DaemonConfig::parse(&plain, "x.yaml")
                .unwrap()
                .routing
                .enabled
        );
    }

    /// Each bad route is refused with its line and the reason.
    #[test]
    fn bad_routes_are_refused_with_their_line_and_reason() {
        let rows = [
            (
                "      gateway: 10.1.0.253@o2ib1\n",
                "      gateway: 10.9.0.1@o2ib9\n",
                "not on any local net",
            ),
            ("    - net: o2ib2\n", "    - net: o2ib1\n", "is local"),
            ("      hop: 2\n", "      hop: 0\n", "outside 1..=255"),
            ("      hop: 2\n", "      hop: 300\n", "outside 1..=255"),
            (
                "      gateway: 10.1.0.253@o2ib1\n",
                "      gateway: 10.1.0.254@o2ib1\n",
                "own NIDs",
            ),
            (
                "      gateway: 10.0.0.253@o2ib\n",
                "      gateway: 10.1.0.253@o2ib1\n      bogus: 1\n",
                "unknown",
            ),
        ];
        for (from, to, why) in rows {
            let y = ROUTER_EXPORT.replacen(from, to, 1);
            let e = DaemonConfig::parse(&y, "export.yaml").unwrap_err();
            assert!(e.message.contains(why), "{to:?}: {e}");
            assert!(
                e.line.is_some_and(|l| (36..=46).contains(&l)),
                "{to:?}: {e}"
            );
        }
        let dup = ROUTER_EXPORT.replace(
            "routing:",
            "    - net: o2ib2\n      gateway: 10.1.0.253@o2ib1\nrouting:",
        );
        let e = DaemonConfig::parse(&dup, "export.yaml").unwrap_err();
        assert!(e.message.contains("already exists"), "{e}");
        assert_eq!(e.line, Some(46), "{e}");
    }
}
