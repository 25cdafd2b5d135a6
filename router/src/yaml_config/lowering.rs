//! Lowering: the raw document (`raw`) checked and turned into a [`DaemonConfig`], section by
//! section. Each step answers a [`Located`] error (the line and the message); `parse_with`
//! names the origin once.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::path::Path;

use lnd::engine::config::DEFAULT_PEER_LIMIT;
use lnd::engine::{RaceOrder, Tunables};
use lnd::time::Duration;
use lnd::wire::kib::CksumFlavour;
use lnd::wire::{Net, Nid};
use serde_saphyr::Spanned;

use crate::config::{
    BufferCounts, NiConfig, BUFFERS_RANGE, DEFAULT_CREDITS, DEFAULT_PEER_CREDITS,
    DEFAULT_PEER_TIMEOUT,
};
use crate::gateway::GatewayHealthConfig;
use crate::routes::{RouteConfig, RouteError, RouteTable};
use crate::GlobalError;

use super::errors::{from_yaml, ConfigError, Located};
use super::model::{
    AcceptorSettings, DaemonConfig, FabricKind, MetricsConfig, NetSettings, NiSettings,
    RouteSettings, RouterChecksGiven, DEFAULT_BUSY_POLL_US, DEFAULT_METRICS_MAX_CONNECTIONS,
    DEFAULT_METRICS_TOP_PEERS, METRICS_MAX_CONNECTIONS_MAX, METRICS_TOP_PEERS_MAX,
};
use super::raw::{
    RawAcceptor, RawBuffers, RawConfig, RawLndTunables, RawMetrics, RawMrPeer, RawNet, RawNi,
    RawPeer, RawRoute, RoutingSection,
};

impl DaemonConfig {
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
        lower(raw.unwrap_or_default(), running, allow_no_nis)
            .map_err(|(line, message)| ConfigError::new(origin, Some(line), message))
    }
}

/// The whole document, section by section, in the order the checks have always run (the first
/// error found is the one reported).
fn lower(
    raw: RawConfig,
    running: Option<&[Nid]>,
    allow_no_nis: bool,
) -> Result<DaemonConfig, Located> {
    refuse_unsupported(&raw)?;
    let mut cfg = DaemonConfig::default();
    let mut seen: HashMap<Nid, u64> = HashMap::new();
    let net_line = raw.net.as_ref().map_or(1, |n| n.referenced.line().max(1));
    for n in raw.net.map(|n| n.value).unwrap_or_default() {
        lower_net(n, &mut cfg, &mut seen)?;
    }
    if cfg.nis().next().is_none() && !allow_no_nis {
        // A daemon with no NI does nothing: almost surely a wrong or truncated file, unless
        // asked for (`--no-nis`: NIs come later through lnetctl, as with lnet.service).
        return Err((
            net_line,
            "no NI configured (an empty file, 'net: []', or nets without 'local NI(s)'): \
             a daemon needs at least one, or --no-nis to start without and add them with \
             lnetctl net add or import"
                .to_string(),
        ));
    }
    lower_peers(raw.peers, &seen, running, &mut cfg)?;
    lower_routes(raw.route, running, &mut cfg)?;
    cfg.given.buffers = raw.buffers.is_some();
    cfg.given.routing = raw.routing.as_ref().is_some_and(|r| r.0.enable.is_some());
    cfg.given.peers = raw.peer.as_ref().map_or(0, |p| p.value.len());
    if let Some(b) = raw.buffers {
        lower_buffers(&b, &mut cfg)?;
    }
    let numa = raw
        .numa
        .and_then(|n| n.range)
        .map(|r| ("numa_range".to_string(), r));
    let global_line = raw.global.as_ref().map_or(1, |g| g.referenced.line());
    let globals = raw.global.into_iter().flat_map(|g| g.value).chain(numa);
    lower_globals(globals, global_line, running, &mut cfg)?;
    cfg.given.selftest = raw
        .selftest
        .as_ref()
        .and_then(|s| s.enable.as_ref().map(|e| e.0));
    cfg.selftest = cfg.given.selftest.unwrap_or(false);
    if let Some(r) = raw.routing {
        lower_routing(r, &mut cfg)?;
    }
    if let Some(m) = raw.metrics {
        cfg.metrics = Some(lower_metrics(&m)?);
    }
    if let Some(a) = raw.acceptor {
        cfg.acceptor = lower_acceptor(&a.value)?;
        cfg.given.acceptor = true;
    }
    let acceptor = cfg.acceptor.clone();
    for ni in cfg.nets.iter_mut().flat_map(|n| n.nis.iter_mut()) {
        if let crate::LndSettings::Sock(s) = &mut ni.ni.lnd {
            apply_acceptor(&acceptor, s);
        }
    }
    Ok(cfg)
}

/// `acceptor:`: each key checked, with its line.
fn lower_acceptor(a: &RawAcceptor) -> Result<AcceptorSettings, Located> {
    use lnd::iface::sock::AcceptMode;
    let d = AcceptorSettings::default();
    let accept = match &a.accept {
        None => d.accept,
        Some(s) => match s.value.as_str() {
            "secure" => AcceptMode::Secure,
            "all" => AcceptMode::All,
            "none" => AcceptMode::None,
            other => {
                return Err((
                    s.referenced.line(),
                    format!("accept: '{other}' is not one of secure, all, none"),
                ))
            }
        },
    };
    let port = checked(&a.port, u32::from(d.port), 1..=65535, "port")? as u16;
    let backlog = checked(&a.backlog, d.backlog, 1..=65535, "backlog")?;
    let timeout = checked_in(SECS, &a.timeout, d.timeout, 1..=3600, "timeout")?;
    let source_ports = match &a.source_ports {
        None => d.source_ports,
        Some(s) => parse_ports(&s.value).ok_or_else(|| {
            (
                s.referenced.line(),
                format!(
                    "source ports: '{}' is not HI-LO with 1 <= LO <= HI <= 65535 (e.g. \
                     1023-512), nor 0 (any port)",
                    s.value
                ),
            )
        })?,
    };
    Ok(AcceptorSettings {
        accept,
        port,
        backlog,
        timeout,
        source_ports,
    })
}

/// `HI-LO`, or `0` for (0, 0).
fn parse_ports(s: &str) -> Option<(u16, u16)> {
    let s = s.trim();
    if s == "0" {
        return Some((0, 0));
    }
    let (hi, lo) = s.split_once('-')?;
    let (hi, lo): (u16, u16) = (hi.trim().parse().ok()?, lo.trim().parse().ok()?);
    (lo >= 1 && lo <= hi).then_some((hi, lo))
}

/// The acceptor's settings into one `tcp` NI's socklnd settings.
pub(crate) fn apply_acceptor(a: &AcceptorSettings, s: &mut lnd::iface::sock::SockConfig) {
    s.accept = a.accept;
    s.accept_port = a.port;
    s.accept_backlog = a.backlog;
    s.accept_timeout = a.timeout;
    (s.ports_from, s.ports_to) = a.source_ports;
}

/// The sections of an export ulnet does not implement, refused by name when not empty.
fn refuse_unsupported(raw: &RawConfig) -> Result<(), Located> {
    for (key, v) in [("udsp", &raw.udsp), ("ip2nets", &raw.ip2nets)] {
        if let Some(v) = v.as_ref().filter(|v| !v.value.empty) {
            return Err((
                v.referenced.line(),
                format!(
                    "'{key}:' is not supported by ulnet (remove it, or configure the \
                     NIs it would select under 'net:')"
                ),
            ));
        }
    }
    for p in raw.peer.iter().flat_map(|p| p.value.iter()) {
        refuse_multi_rail(p)?;
    }
    Ok(())
}

fn refuse_multi_rail(p: &RawMrPeer) -> Result<(), Located> {
    if p.peer_ni.len() > 1 {
        return Err((
            p.primary_nid.referenced.line(),
            format!(
                "peer {}: Multi-Rail peers with several NIs are not supported by ulnet \
                 (one NI per peer; remove this 'peer:' entry)",
                p.primary_nid.value.0
            ),
        ));
    }
    Ok(())
}

/// One `net:` entry: its NIs join those of an earlier entry of the same net. `seen` holds
/// every NID configured so far and its line.
fn lower_net(
    n: RawNet,
    cfg: &mut DaemonConfig,
    seen: &mut HashMap<Nid, u64>,
) -> Result<(), Located> {
    let net_line = n.net_type.referenced.line();
    let net = parse_net(&n.net_type, "bad 'net type'")?;
    if net == Net::LO {
        // lnetctl export lists the loopback net; it always exists.
        return Ok(());
    }
    let (fabric, fabric_given) = net_fabric(net, n.fabric.as_ref(), net_line)?;
    let mut nis = Vec::new();
    for ni in n.local_nis {
        let (nid, line) = ni_nid(&ni, net, net_line)?;
        if nid.net() != net {
            return Err((
                line,
                format!("NID {nid} is not on net type {net} of its 'net:' entry"),
            ));
        }
        if let Some(first) = seen.insert(nid, line) {
            return Err((
                line,
                format!("NID {nid} is configured twice (first on line {first})"),
            ));
        }
        if net.lnd() == lnd::wire::LndType::Tcp && ni.listen.is_some() {
            return Err((
                line,
                format!(
                    "NI {nid}: a tcp NI listens on its NID's address and the acceptor's port \
                     (set 'acceptor: port:'), not at a 'listen:' address"
                ),
            ));
        }
        nis.push(lower_ni(ni, nid, line)?);
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
    Ok(())
}

/// A net's fabric: a `tcp` net is ksocklnd's, on plain sockets (`socket`, its default) or the
/// simulator; any other net is o2iblnd's, on `tcp` (ulnet's o2ib over TCP), `verbs` or the
/// simulator, chosen at start when the file names none (the flag says whether it did). Never
/// confused: ulnet's o2ib-over-TCP fabric on a `tcp` net would be a node kernel Lustre's
/// ksocklnd cannot talk to.
fn net_fabric(
    net: Net,
    given: Option<&Spanned<FabricKind>>,
    net_line: u64,
) -> Result<(FabricKind, bool), Located> {
    let tcp_net = net.lnd() == lnd::wire::LndType::Tcp;
    match given {
        None if tcp_net => Ok((FabricKind::Socket, true)),
        None => Ok((FabricKind::Tcp, false)),
        Some(f) => {
            let line = f.referenced.line().max(net_line);
            match (tcp_net, f.value) {
                (true, FabricKind::Socket | FabricKind::Sim)
                | (false, FabricKind::Tcp | FabricKind::Verbs | FabricKind::Sim) => {
                    Ok((f.value, true))
                }
                (true, other) => Err((
                    line,
                    format!(
                        "fabric: '{}' on net type {net}: a tcp net speaks ksocklnd, on fabric \
                         'socket' (the default) or 'sim'; 'tcp' and 'verbs' carry o2iblnd, for \
                         o2ib nets",
                        other.as_str()
                    ),
                )),
                (false, other) => Err((
                    line,
                    format!(
                        "fabric: '{}' on net type {net}: 'socket' carries ksocklnd, for tcp \
                         nets; an o2ib net runs on 'tcp' (o2iblnd over TCP), 'verbs' or 'sim'",
                        other.as_str()
                    ),
                )),
            }
        }
    }
}

/// One NI of a net, whose NID (at `line`) is already checked.
fn lower_ni(ni: RawNi, nid: Nid, line: u64) -> Result<NiSettings, Located> {
    let mut c = NiConfig::new(nid, 0);
    ulnet_settings(&ni, &mut c)?;
    let mut t = ni.tunables.unwrap_or_default();
    let mut l = ni.lnd_tunables.unwrap_or_default();
    // A 2.12-2.14 export's LND tunables, under `tunables:`.
    l.peercredits_hiw = l.peercredits_hiw.or(t.peercredits_hiw.take());
    l.concurrent_sends = l.concurrent_sends.or(t.concurrent_sends.take());
    l.conns_per_peer = l.conns_per_peer.or(t.conns_per_peer.take());
    let credits = checked(&t.credits, DEFAULT_CREDITS, 1..=u32::MAX, "credits")?;
    let peer_credits = checked(
        &t.peer_credits,
        DEFAULT_PEER_CREDITS,
        1..=255,
        "peer_credits",
    )?;
    c.credits = credits;
    c.peer_timeout = Duration::from_secs(u64::from(
        t.peer_timeout.unwrap_or(DEFAULT_PEER_TIMEOUT).max(1),
    ));
    c.peer_credits = peer_credits;
    c.peer_buffer_credits = t.peer_buffer_credits.unwrap_or(0);
    // `connect hedge ms` (ulnet's) lives among the LND's tunables.
    let hedge = c.tunables.connect_hedge;
    c.tunables = lnd_tunables(&l, peer_credits as u16)?;
    c.tunables.connect_hedge = hedge;
    if let crate::LndSettings::Sock(s) = &mut c.lnd {
        sock_tunables(&l, s)?;
    }
    Ok(NiSettings {
        ni: c,
        listen: ni.listen,
        busy_poll_us: checked(
            &ni.busy_poll_us,
            DEFAULT_BUSY_POLL_US,
            0..=1_000_000,
            "busy poll us",
        )?,
        handshake_limit: checked(
            &ni.handshake_limit,
            lnd::driver::tcp::DEFAULT_HANDSHAKE_LIMIT as u32,
            0..=10_000_000,
            "handshake limit",
        )?,
        peer_timeout: t.peer_timeout.unwrap_or(DEFAULT_PEER_TIMEOUT),
        peer_buffer_credits: t.peer_buffer_credits.unwrap_or(0),
        line,
    })
}

/// `peers:`: where other daemons listen; none of them one of ours (`seen`, and for an import
/// the running daemon's NIs).
fn lower_peers(
    peers: Vec<RawPeer>,
    seen: &HashMap<Nid, u64>,
    running: Option<&[Nid]>,
    cfg: &mut DaemonConfig,
) -> Result<(), Located> {
    for p in peers {
        let line = p.nid.referenced.line();
        let nid = p.nid.value.0;
        if let Some(ni_line) = seen.get(&nid) {
            return Err((
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
            return Err((
                line,
                format!(
                    "peer {nid} is one of this daemon's NIs; 'peers:' lists where other \
                     daemons listen"
                ),
            ));
        }
        if cfg.peers.insert(nid, p.address).is_some() {
            return Err((line, format!("peer {nid} is listed twice")));
        }
    }
    Ok(())
}

/// `route:` entries; a configuration file's are checked against its NIs as a table.
fn lower_routes(
    routes: Vec<RawRoute>,
    running: Option<&[Nid]>,
    cfg: &mut DaemonConfig,
) -> Result<(), Located> {
    let mut own: Vec<Nid> = cfg.nis().map(|(_, ni)| ni.ni.nid).collect();
    for &n in running.into_iter().flatten() {
        if !own.contains(&n) {
            own.push(n);
        }
    }
    let mut table = RouteTable::default();
    for r in routes {
        let line = r.net.referenced.line();
        let net = parse_net(&r.net, "route: bad 'net'")?;
        let hops = match r.hop {
            None => None,
            Some(h) if h.value == -1 => None,
            Some(h) => match u8::try_from(h.value) {
                Ok(v) if v >= 1 => Some(v),
                _ => {
                    return Err((
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
                .map_err(|e| (line, format!("route to {net} via {}: {e}", route.gateway)))?;
        }
        cfg.routes.push(RouteSettings { route, line });
    }
    Ok(())
}

/// `buffers:`: the router buffer counts and the scrub mode.
fn lower_buffers(b: &RawBuffers, cfg: &mut DaemonConfig) -> Result<(), Located> {
    let d = BufferCounts::default();
    // The range `lnetctl set *_buffers` checks too.
    cfg.routing.buffers = BufferCounts {
        tiny: checked(&b.tiny, d.tiny, BUFFERS_RANGE, "buffers: tiny")?,
        small: checked(&b.small, d.small, BUFFERS_RANGE, "buffers: small")?,
        large: checked(&b.large, d.large, BUFFERS_RANGE, "buffers: large")?,
    };
    if let Some(s) = &b.scrub {
        cfg.routing.scrub = s
            .value
            .trim()
            .parse()
            .map_err(|m| (s.referenced.line(), format!("buffers: scrub: {m}")))?;
    }
    Ok(())
}

/// `metrics:` (ours): `listen` is required and must be an address with its port (no
/// default address: the endpoint listens on every interface only when written so).
fn lower_metrics(m: &Spanned<RawMetrics>) -> Result<MetricsConfig, Located> {
    let section = m.referenced.line();
    let m = &m.value;
    let Some(l) = &m.listen else {
        return Err((
            section,
            "metrics: 'listen' is required (the address and port to serve /metrics on, e.g. \
             127.0.0.1:9170)"
                .to_string(),
        ));
    };
    let listen = l.value.trim().parse().map_err(|_| {
        (
            l.referenced.line(),
            format!(
                "metrics: listen: '{}' is not an address and port (e.g. 127.0.0.1:9170)",
                crate::text::excerpt(&l.value, 64)
            ),
        )
    })?;
    Ok(MetricsConfig {
        listen,
        top_peers: checked(
            &m.top_peers,
            DEFAULT_METRICS_TOP_PEERS,
            0..=METRICS_TOP_PEERS_MAX,
            "metrics: top_peers",
        )?,
        max_connections: checked(
            &m.max_connections,
            DEFAULT_METRICS_MAX_CONNECTIONS,
            1..=METRICS_MAX_CONNECTIONS_MAX,
            "metrics: max_connections",
        )?,
    })
}

/// `global:` (and `numa: range:`): LNet's global tunables. One key at a time for the ranges
/// (an error names its line), then all together for the rules that tie two of them (the
/// section's first line, `global_line`).
fn lower_globals(
    globals: impl Iterator<Item = (String, Spanned<i64>)>,
    global_line: u64,
    running: Option<&[Nid]>,
    cfg: &mut DaemonConfig,
) -> Result<(), Located> {
    for (key, v) in globals {
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
            return Err((v.referenced.line(), format!("global: {e}")));
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
            .map_err(|e| (global_line, format!("global: {e}")))?;
    }
    Ok(())
}

/// `routing:`: whether this node forwards, and how it checks its gateways.
fn lower_routing(RoutingSection(r): RoutingSection, cfg: &mut DaemonConfig) -> Result<(), Located> {
    cfg.routing.enabled = r.enable.is_some_and(|s| s.0);
    cfg.given.router_checks = RouterChecksGiven {
        alive_router_check_interval: r.alive_router_check_interval.as_ref().map(|s| s.value),
        router_ping_timeout: r.router_ping_timeout.as_ref().map(|s| s.value),
        avoid_asym_router_failure: r.avoid_asym_router_failure.as_ref().map(|s| s.0),
    };
    let d = GatewayHealthConfig::default();
    let max = crate::gateway::MAX_ROUTER_CHECK_SECS;
    let secs =
        |v: &Option<Spanned<u32>>, def: Duration, key: &str| checked_in(SECS, v, def, 0..=max, key);
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
    Ok(())
}

impl DaemonConfig {
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
    c.tunables.connect_hedge = checked_in(
        MILLIS,
        &ni.connect_hedge_ms,
        c.tunables.connect_hedge,
        0..=60_000,
        "connect hedge ms",
    )?;
    // 0: only the LND timeout, as kernel o2iblnd.
    c.tunables.grant_timeout = checked_in(
        MILLIS,
        &ni.grant_timeout_ms,
        c.tunables.grant_timeout,
        0..=600_000,
        "grant timeout ms",
    )?;
    c.peer_limit = checked(
        &ni.peer_limit,
        DEFAULT_PEER_LIMIT as u32,
        1..=16 * 1024 * 1024,
        "peer limit",
    )? as usize;
    Ok(())
}

/// A net name; a bad one is an error at its line, `what` saying which key it is.
fn parse_net(s: &Spanned<String>, what: &str) -> Result<Net, Located> {
    s.value
        .parse()
        .map_err(|e| (s.referenced.line(), format!("{what}: {e}")))
}

/// A tunable's value, or its default; out of `range` is an error at its line.
fn checked(
    v: &Option<Spanned<u32>>,
    default: u32,
    range: RangeInclusive<u32>,
    key: &str,
) -> Result<u32, Located> {
    match v {
        None => Ok(default),
        Some(s) if range.contains(&s.value) => Ok(s.value),
        Some(s) => Err((
            s.referenced.line(),
            crate::config::out_of_range(key, s.value, &range),
        )),
    }
}

/// A tunable counted in `unit`s (seconds, milliseconds), or its default; out of `range` (in
/// units) is an error at its line.
fn checked_in(
    unit: Duration,
    v: &Option<Spanned<u32>>,
    default: Duration,
    range: RangeInclusive<u32>,
    key: &str,
) -> Result<Duration, Located> {
    let n = checked(v, (default.as_nanos() / unit.as_nanos()) as u32, range, key)?;
    Ok(unit * u64::from(n))
}

const SECS: Duration = Duration::from_secs(1);
const MILLIS: Duration = Duration::from_millis(1);

/// ksocklnd's tunables from `lnd tunables:` (`timeout` is sock_timeout; `conns_per_peer` 0 is
/// automatic: 1 here, as we know no link speed).
fn sock_tunables(l: &RawLndTunables, s: &mut lnd::iface::sock::SockConfig) -> Result<(), Located> {
    s.timeout = checked_in(SECS, &l.timeout, s.timeout, 1..=3600, "timeout")?;
    s.conns_per_peer = checked(
        &l.conns_per_peer,
        s.conns_per_peer,
        0..=127,
        "conns_per_peer",
    )?;
    s.keepalive = checked_in(SECS, &l.keepalive, s.keepalive, 0..=3600, "keepalive")?;
    Ok(())
}

/// The o2ib LND's tunables from `lnd tunables:` (0 = automatic, as in o2iblnd).
fn lnd_tunables(l: &RawLndTunables, peer_credits: u16) -> Result<Tunables, Located> {
    let d = Tunables::default();
    let hiw = checked(&l.peercredits_hiw, 0, 0..=255, "peercredits_hiw")?;
    let cs = checked(&l.concurrent_sends, 0, 0..=510, "concurrent_sends")?;
    let timeout = checked_in(SECS, &l.timeout, d.timeout, 1..=3600, "timeout")?;
    let keepalive = checked_in(SECS, &l.keepalive, d.keepalive, 0..=86400, "keepalive")?;
    // As the kernel's setter (o2iblnd.c, kiblnd_nl_set: 0..127, 0 meaning the default of 1).
    let cpp = checked(&l.conns_per_peer, 1, 0..=127, "conns_per_peer")?.max(1);
    Ok(Tunables {
        peer_credits,
        peer_credits_hiw: hiw as u16,
        concurrent_sends: cs as u16,
        timeout,
        keepalive,
        conns_per_peer: cpp as u16,
        ..d
    })
}
