//! lnetctl's documents for each answer, built once as a [`tree`](crate::tree) and printed as
//! YAML in real lnetctl's layout (reference section 7) or as JSON with `--json`: the same keys,
//! order and values either way.

use router::control::{
    ConnShow, Counts, GlobalShow, Globals, ImportOp, ImportReport, LndTunables, NamedCounters,
    NetShow, NiHealthShow, NiTunables, PeerEntry, PeerHealthShow, PeerNiDetail, PeerNiEntry,
    PeerShow, PingShow, PoolShow, RecoveryShow, Response, RouteShow, RoutingShow, StatsShow,
    UlnetSettings,
};

use crate::tree::{fields, to_json, to_yaml, to_yaml_as, Map, Node, Scalar, Style, NETLINK, PING};

/// The document of a successful response and the printer lnetctl lays it out with; `None`
/// for an error, a capture's stream and selftest's replies (rendered by `selftest`).
#[cfg(test)]
pub fn tree(resp: &Response) -> Option<(Map, Style)> {
    tree_at(resp, u8::MAX)
}

/// The `-v` level from which `net show` adds ulnet's own keys (lnetctl's levels end at 4);
/// `stats show` and `global show`, which have no levels in lnetctl, add ours at any `-v`.
pub const ULNET_LEVEL: u8 = 5;

/// [`tree`] at `-v` level `level` (0: no `-v`).
pub fn tree_at(resp: &Response, level: u8) -> Option<(Map, Style)> {
    let style = match resp {
        Response::Ping(_) => PING,
        Response::Net(_) | Response::Peer(_) | Response::Route(_) | Response::Recovery(_) => {
            NETLINK
        }
        _ => Style::Cyaml,
    };
    Some((tree_of(resp, level)?, style))
}

fn tree_of(resp: &Response, level: u8) -> Option<Map> {
    Some(match resp {
        Response::Ping(p) => ping_tree(p),
        Response::Net(n) => net_tree(n, level),
        Response::Peer(p) => peer_tree(p, level),
        Response::Conn(c) => conn_tree(c),
        Response::Stats(s) => stats_tree(s, level > 0),
        Response::Global(g) => global_tree(g, level > 0),
        Response::Route(r) => route_tree(r),
        Response::Routing(r) => routing_tree(r),
        Response::Import(r) => import_tree(r),
        Response::Recovery(r) => recovery_tree(r),
        Response::Done => Map::new(),
        Response::Selftest(_)
        | Response::CaptureStarted(_)
        | Response::CaptureData(_)
        | Response::CaptureDone(_)
        | Response::Error(_) => return None,
    })
}

/// Renders any successful response as YAML, everything shown; `None` for an error response.
pub fn yaml(resp: &Response) -> Option<String> {
    yaml_at(resp, u8::MAX)
}

/// [`yaml`] at `-v` level `level`.
pub fn yaml_at(resp: &Response, level: u8) -> Option<String> {
    if let Response::Selftest(r) = resp {
        return Some(crate::selftest::render_reply(r));
    }
    tree_at(resp, level).map(|(t, style)| to_yaml_as(&t, style))
}

/// The same document as JSON; `None` for an error.
pub fn json(resp: &Response) -> Option<String> {
    json_at(resp, u8::MAX)
}

/// [`json`] at `-v` level `level`.
pub fn json_at(resp: &Response, level: u8) -> Option<String> {
    if let Response::Selftest(r) = resp {
        return serde_json::to_string_pretty(r).ok().map(|mut s| {
            s.push('\n');
            s
        });
    }
    let (t, _) = tree_at(resp, level)?;
    // A command without output stays silent; an empty show (`debug recovery` of an empty
    // queue, which YAML prints as nothing, as lnetctl) is still a JSON document: `{}`.
    Some(if t.0.is_empty() && matches!(resp, Response::Done) {
        String::new()
    } else {
        to_json(&t)
    })
}

pub(crate) fn counts(c: &Counts) -> Map {
    fields!(Map::new(), c => send_count, recv_count, drop_count)
}

fn named(c: &NamedCounters) -> Map {
    Map::new().counters(c.0.iter().map(|(k, v)| (k, v)))
}

/// `ping:` for the peers that answered, `manage:` for the failures (the netlink layout:
/// `peer_ni` with an underscore, `Multi-Rail` as true/false).
pub fn ping_tree(p: &PingShow) -> Map {
    ping_as(p, "ping")
}

/// The same for `lnetctl discover` (`what` = "discover"): its header and failure items are
/// named after the command (lnetctl.c, jt_discover).
pub fn ping_as(p: &PingShow, what: &str) -> Map {
    let mut doc = Map::new();
    if !p.ping.is_empty() {
        let peers: Vec<Map> = p
            .ping
            .iter()
            .map(|peer| {
                Map::new()
                    .with("primary nid", &peer.primary_nid)
                    .with("Multi-Rail", peer.multi_rail)
                    .with(
                        "peer_ni",
                        peer.peer_ni
                            .iter()
                            .map(|n| Map::new().with("nid", n))
                            .collect::<Vec<_>>(),
                    )
            })
            .collect();
        doc.push(what, peers);
    }
    if !p.manage.is_empty() {
        let fails: Vec<Map> = p
            .manage
            .iter()
            .map(|f| {
                // lnetctl's failure item: an empty `ping:` then errno and descr beside it
                // (yaml_lnet_ping_display); the NID is in descr.
                let descr = match f.descr.strip_prefix("failed to ping ") {
                    Some(rest) => format!("failed to {what} {rest}"),
                    None => f.descr.clone(),
                };
                Map::new()
                    .with(what, Node::Scalar(Scalar::Null))
                    .with("errno", f.errno)
                    .with("descr", descr)
            })
            .collect();
        doc.push("manage", fails);
    }
    doc
}

/// What `import --show` would do (`import:`); an import that ran prints only its failures.
fn import_tree(r: &ImportReport) -> Map {
    let applied = if r.op == ImportOp::Show {
        "would apply"
    } else {
        "applied"
    };
    let failed: Vec<Map> = r
        .failed
        .iter()
        .map(|f| {
            Map::new()
                .with(&f.section, Node::Scalar(Scalar::Null))
                .with("errno", f.errno)
                .with("descr", &f.descr)
        })
        .collect();
    Map::new().with(
        "import",
        Map::new()
            .with(applied, r.applied)
            .with("unchanged", r.unchanged)
            .with("failed", failed),
    )
}

/// `debug recovery`: `Local NI recovery:` or `Peer NI recovery:` with `nid-0`, `nid-1`, ...
/// (lnetctl.c, yaml_debug_recovery); nothing at all for an empty queue.
fn recovery_tree(r: &RecoveryShow) -> Map {
    if r.nids.is_empty() {
        return Map::new();
    }
    let mut m = Map::new();
    for (i, n) in r.nids.iter().enumerate() {
        m.push(&format!("nid-{i}"), n);
    }
    let head = if r.local {
        "Local NI recovery"
    } else {
        "Peer NI recovery"
    };
    Map::new().with(head, m)
}

/// The `-v` level from which `health stats` show (lnetctl's second level).
pub const HEALTH_LEVEL: u8 = 2;

/// A local NI's `health stats:`.
pub fn ni_health(h: &NiHealthShow) -> Map {
    fields!(Map::new(), h =>
        fatal_error, "health value" = health_value, interrupts, dropped, aborted,
        "no route" = no_route, timeouts, error, ping_count, next_ping,
    )
}

/// A peer NI's `health stats:`.
pub fn peer_health(h: &PeerHealthShow) -> Map {
    fields!(Map::new(), h =>
        "health value" = health_value, dropped, timeout, error,
        "network timeout" = network_timeout, ping_count, next_ping,
    )
}

/// An NI's `tunables:`.
pub(crate) fn ni_tunables(t: &NiTunables) -> Map {
    fields!(Map::new(), t => peer_timeout, peer_credits, peer_buffer_credits, credits)
}

/// An NI's `lnd tunables:`: o2iblnd's that ulnet has and keepalive, or ksocklnd's
/// (conns_per_peer, timeout, tos), in the kernel's order.
pub(crate) fn lnd_tunables(l: &LndTunables) -> Map {
    fields!(Map::new(), l =>
        ?peercredits_hiw, ?concurrent_sends, conns_per_peer, timeout, ?keepalive, ?tos,
    )
}

/// ulnet's own per-NI settings after `m`'s keys, as `net show -v` shows them and an export
/// writes them back (the key a configuration takes); `peers` (a count, not a setting) only
/// with `with_peers`.
pub(crate) fn ulnet_settings(m: Map, u: &UlnetSettings, with_peers: bool) -> Map {
    let m = fields!(m, u =>
        ?listen, checksum, "checksum default" = checksum_default, "race order" = race_order,
        "connect hedge ms" = connect_hedge_ms, "grant timeout ms" = ?grant_timeout_ms,
        "peer limit" = peer_limit,
    );
    fields!(m.with_opt("peers", Some(u.peers).filter(|_| with_peers)), u =>
        "busy poll us" = ?busy_poll_us, "handshake limit" = ?handshake_limit,
    )
}

/// A peer NI's credits and `statistics` (`peer show -v`), after `m`'s keys.
pub(crate) fn peer_ni_detail(m: Map, d: &PeerNiDetail) -> Map {
    fields!(m, d =>
        max_ni_tx_credits, available_tx_credits, min_tx_credits, tx_q_num_of_buf,
        available_rtr_credits, min_rtr_credits,
    )
    .with("statistics", counts(&d.statistics))
}

/// lnetctl's 13 globals in jt_show_global's order (`global show`, and an export's `global:`).
pub(crate) fn lnetctl_globals(g: &Globals) -> Map {
    fields!(Map::new(), g =>
        numa_range, max_interfaces, discovery, drop_asym_route, retry_count, transaction_timeout,
        health_sensitivity, recovery_interval, router_sensitivity, lnd_timeout,
        response_tracking, recovery_limit, max_recovery_ping_interval,
    )
}

/// `net:` with `net type` and `local NI(s)`; statistics and tunables with `-v`.
pub fn net_tree(n: &NetShow, level: u8) -> Map {
    let ours = level >= ULNET_LEVEL;
    let nets: Vec<Map> = n
        .net
        .iter()
        .map(|net| {
            let nis: Vec<Map> = net
                .local_nis
                .iter()
                .map(|ni| {
                    let mut m = Map::new().with("nid", &ni.nid).with("status", &ni.status);
                    if let Some(c) = &ni.statistics {
                        m.push("statistics", counts(c));
                    }
                    if let Some(h) = ni.health_stats.as_ref().filter(|_| level >= HEALTH_LEVEL) {
                        m.push("health stats", ni_health(h));
                    }
                    if let Some(t) = &ni.tunables {
                        m.push("tunables", ni_tunables(t));
                    }
                    if let Some(l) = &ni.lnd_tunables {
                        m.push("lnd tunables", lnd_tunables(l));
                    }
                    if let Some(l) = ni.lnd_statistics.as_ref().filter(|_| ours) {
                        // socklnd keeps no reject tables (its refusals are counters).
                        let mut t = named(&l.counters);
                        if !l.rejects_sent.is_empty() || !l.rejects_received.is_empty() {
                            t = t
                                .with("rejects_sent", named(&l.rejects_sent))
                                .with("rejects_received", named(&l.rejects_received));
                        }
                        m.push("lnd statistics", t);
                    }
                    if let Some(f) = ni.fabric.as_ref().filter(|_| ours) {
                        let mut fm = Map::new().with("type", &f.kind);
                        fm.0.extend(named(&f.counters).0);
                        m.push("fabric", fm);
                    }
                    if let Some(u) = ni.ulnet.as_ref().filter(|_| ours) {
                        m.push("ulnet", ulnet_settings(Map::new(), u, true));
                    }
                    m
                })
                .collect();
            Map::new()
                .with("net type", &net.net_type)
                .with("local NI(s)", nis)
        })
        .collect();
    let doc = Map::new().with("net", nets);
    if ours && !n.peers.is_empty() {
        // Ours: where peer NIDs listen (the daemon's `peers:` table).
        let peers: Vec<Map> = n
            .peers
            .iter()
            .map(|p| Map::new().with("nid", &p.nid).with("address", &p.address))
            .collect();
        doc.with("peers", peers)
    } else {
        doc
    }
}

/// What `lnetctl capture` prints when it ends (here, with how it is printed, so that
/// rendering names nothing of the capture loop).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    /// The pcap file (absolute), or "standard output".
    pub file: String,
    /// Messages written to the file.
    pub captured: u64,
    /// Messages the daemon could not record (its queues overflowed); unknown if the capture
    /// ended without the daemon's totals.
    pub dropped: Option<u64>,
    /// How long the capture ran.
    pub seconds: f64,
    /// Why it ended: `stopped`, `duration elapsed`, `daemon shutting down`, or `error`.
    pub reason: String,
}

/// `capture:`, what `lnetctl capture` prints when it ends.
fn capture_tree(r: &Report) -> Map {
    let dropped = match r.dropped {
        Some(d) => crate::tree::Node::from(d),
        None => crate::tree::Node::from("unknown"),
    };
    Map::new().with(
        "capture",
        Map::new()
            .with("file", &r.file)
            .with("captured", r.captured)
            .with("dropped", dropped)
            .with(
                "seconds",
                crate::tree::Node::Scalar(crate::tree::Scalar::Num(format!("{:.1}", r.seconds))),
            )
            .with("reason", &r.reason),
    )
}

pub fn capture_yaml(r: &Report) -> String {
    to_yaml(&capture_tree(r))
}

pub fn capture_json(r: &Report) -> String {
    to_json(&capture_tree(r))
}

/// `peer:` with `primary nid`, `Multi-Rail` and `peer ni`; credits and statistics with `-v`.
pub fn peer_tree(p: &PeerShow, level: u8) -> Map {
    let peers: Vec<Map> = p
        .peer
        .iter()
        .map(|peer| {
            peer_entry(peer, |ni| {
                let mut m = Map::new().with("nid", &ni.nid).with("state", &ni.state);
                if let Some(d) = &ni.detail {
                    m = peer_ni_detail(m, d);
                    if level >= HEALTH_LEVEL {
                        m.push("health stats", peer_health(&d.health_stats));
                    }
                }
                m
            })
        })
        .collect();
    Map::new().with("peer", peers)
}

/// One peer: `primary nid`, `Multi-Rail`, then `peer ni` with each NI as `ni` makes it (`peer
/// show` and an export's `peer:` list differ only there).
pub(crate) fn peer_entry(peer: &PeerEntry, ni: impl Fn(&PeerNiEntry) -> Map) -> Map {
    let nis: Vec<Map> = peer.peer_ni.iter().map(ni).collect();
    Map::new()
        .with("primary nid", &peer.primary_nid)
        .with("Multi-Rail", peer.multi_rail)
        .with("peer ni", nis)
}

/// `conn:` (ours): one entry per LND connection.
pub fn conn_tree(c: &ConnShow) -> Map {
    let conns: Vec<Map> = c
        .conn
        .iter()
        .map(|e| {
            // A socklnd connection: ksocklnd's fields (it has no per-connection credits).
            if let Some(s) = &e.sock {
                return Map::new()
                    .with("ni", &e.ni)
                    .with("peer", &e.peer)
                    .with("type", &s.ctype)
                    .with("state", &e.state)
                    .with("side", &e.side)
                    .with("local", &s.local)
                    .with("remote", &s.remote)
                    .with("queued_bytes", s.queued_bytes)
                    .with("zc_acks_sent", s.zc_acks_sent)
                    .with("zc_acks_received", s.zc_acks_received);
            }
            fields!(Map::new(), e =>
                ni, peer, state, side, credits, outstanding_credits, reserved_credits,
                queue_depth, sends_posted, queued, races, incarnation, age_ms,
            )
        })
        .collect();
    Map::new().with("conn", conns)
}

/// `statistics:`, in lnetctl's order (liblnetconfig.c's stats builder), then ours.
pub fn stats_tree(st: &StatsShow, ours: bool) -> Map {
    let s = &st.statistics;
    let stats = fields!(Map::new(), s =>
        msgs_alloc, msgs_max, rst_alloc, errors, send_count, resend_count,
        response_timeout_count, local_interrupt_count, local_dropped_count, local_aborted_count,
        local_no_route_count, local_timeout_count, local_error_count, remote_dropped_count,
        remote_error_count, remote_timeout_count, network_timeout_count, failed_resends,
        successful_resends, recv_count, route_count, drop_count, send_length, recv_length,
        route_length, drop_length,
    );
    if !ours {
        return Map::new().with("statistics", stats);
    }
    Map::new()
        .with(
            "statistics",
            fields!(stats, s => loopback_count, loopback_length),
        )
        // Ours: LNet's peer table (peer NIs now, aged out, refused at the limit).
        .with_opt("peer_table", st.peer_table.as_ref().map(named))
        // Ours: the daemon's control socket (clients served, refused, closed to make room,
        // timed out, oversized).
        .with_opt("control", st.control.as_ref().map(named))
}

/// `global:`, in lnetctl's order (jt_show_global), then ours.
pub fn global_tree(g: &GlobalShow, ours: bool) -> Map {
    let g = &g.global;
    let lnetctl = lnetctl_globals(g);
    let all = if ours {
        // Ours: whether this node forwards, the PID it answers as, whether selftest runs.
        lnetctl
            .with("routing", g.routing)
            .with("pid", g.pid)
            .with("selftest", g.selftest)
    } else {
        lnetctl
    };
    Map::new().with("global", all)
}

/// `route:` as lnetctl prints it (`route: []` when there is none).
pub fn route_tree(r: &RouteShow) -> Map {
    let routes: Vec<Map> = r
        .route
        .iter()
        .map(|e| fields!(Map::new(), e => net, gateway, ?hop, ?priority, ?state, "type" = ?kind))
        .collect();
    Map::new().with("route", routes)
}

/// `routing:` as lnetctl prints it: each CPT's pools, then `enable`; then ours, the
/// forwarding books.
pub fn routing_tree(r: &RoutingShow) -> Map {
    let f = &r.forwarding;
    Map::new()
        .with("routing", routing_items(r))
        .with(
            "forwarding",
            fields!(
                fields!(Map::new(), f => received, forwarded, forwarded_bytes, in_flight, dropped)
                    .with(
                        "dropped_by_reason",
                        Map::new().counters(f.dropped_by_reason.iter().map(|(k, v)| (k, v))),
                    ),
                f => waited_rtr_credit, waited_buffer, waited_unproven, scrubbed, scrubbed_bytes
            ),
        )
        .with_opt(
            "router_checks",
            r.router_checks.as_ref().map(|c| {
                fields!(Map::new(), c =>
                    alive_router_check_interval, router_ping_timeout, avoid_asym_router_failure,
                )
            }),
        )
}

/// `routing:`'s items as lnetctl prints them: each CPT's pools, then `enable`.
pub(crate) fn routing_items(r: &RoutingShow) -> Vec<Map> {
    fn pool(p: &PoolShow) -> Map {
        fields!(Map::new(), p => npages, nbuffers, credits, mincredits)
    }
    let mut items: Vec<Map> = r
        .cpts
        .iter()
        .enumerate()
        .map(|(i, c)| {
            Map::new().with(
                &format!("cpt[{i}]"),
                Map::new()
                    .with("tiny", pool(&c.tiny))
                    .with("small", pool(&c.small))
                    .with("large", pool(&c.large)),
            )
        })
        .collect();
    items.push(Map::new().with("enable", r.enable));
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ping(p: &PingShow) -> String {
        yaml(&Response::Ping(p.clone())).unwrap()
    }
    fn net(n: &NetShow) -> String {
        yaml(&Response::Net(n.clone())).unwrap()
    }
    fn peer(p: &PeerShow) -> String {
        yaml_at(&Response::Peer(p.clone()), 1).unwrap()
    }
    fn conn(c: &ConnShow) -> String {
        yaml(&Response::Conn(c.clone())).unwrap()
    }
    fn stats(st: &StatsShow) -> String {
        yaml(&Response::Stats(st.clone())).unwrap()
    }
    fn global(g: &GlobalShow) -> String {
        yaml(&Response::Global(g.clone())).unwrap()
    }
    use lnd::time::Instant;
    use lnd::wire::Nid;
    use router::control::*;
    use router::{LnetNode, NiConfig, NodeConfig};

    fn node() -> LnetNode {
        let nid: Nid = "10.0.0.1@o2ib".parse().unwrap();
        LnetNode::new(
            NodeConfig::new(vec![NiConfig::new(nid, 1)]),
            Instant::from_secs(1),
        )
    }

    #[test]
    fn ping_snapshot() {
        let p = PingShow {
            ping: vec![PingPeer {
                primary_nid: "10.0.0.5@o2ib".into(),
                multi_rail: true,
                peer_ni: vec!["10.0.0.5@o2ib".into(), "10.0.1.5@o2ib1".into()],
            }],
            manage: vec![PingFailure {
                ping: "10.0.0.9@o2ib".into(),
                errno: -110,
                descr: "failed to ping 10.0.0.9@o2ib: timed out".into(),
            }],
        };
        assert_eq!(
            ping(&p),
            "\
ping:
- primary nid: 10.0.0.5@o2ib
  Multi-Rail: true
  peer_ni:
  - nid: 10.0.0.5@o2ib
  - nid: 10.0.1.5@o2ib1
manage:
- ping:
  errno: -110
  descr: \"failed to ping 10.0.0.9@o2ib: timed out\"
"
        );
    }

    #[test]
    fn net_snapshots() {
        let n = node();
        assert_eq!(
            net(&net_show(&n, &[], false)),
            include_str!("fixtures/net-show.yaml")
        );
        let v = net(&net_show(&n, &[], true));
        let (head, lnd) = v.split_once("            lnd statistics:\n").expect(&v);
        assert_eq!(
            head,
            crate::golden::net_show_v_head(0)
                + concat!(
                    include_str!("fixtures/ni-health.yaml"),
                    include_str!("fixtures/ni-tunables.yaml")
                )
        );
        let (lnd, ulnet) = lnd.split_once("            ulnet:\n").expect(lnd);
        // The LND's counters: 54 of them, then the rejects by reason, each 0 here.
        let lines: Vec<&str> = lnd.lines().collect();
        assert_eq!(lines[0], "                  connects: 0");
        assert_eq!(lines[8], "                  race_order_disagreements: 0");
        assert_eq!(lines[11], "                  connect_hedges: 0");
        assert_eq!(lines[12], "                  hedge_abandons: 0");
        assert_eq!(lines[14], "                  superseded_connreqs: 0");
        assert!(lines.contains(&"                  rx_refused: 0"), "{lnd}");
        assert_eq!(lines[38], "                  rdma_refused: 0");
        assert_eq!(lines[39], "                  rdma_puts_sent: 0");
        assert_eq!(lines[46], "                  rdma_bad_descs: 0");
        assert_eq!(lines[47], "                  rdma_short_writes: 0");
        assert_eq!(lines[48], "                  grants_reclaimed: 0");
        assert_eq!(lines[49], "                  capture_drops: 0");
        assert_eq!(lines[53], "                  peer_table_full: 0");
        assert_eq!(lines[54], "                  rejects_sent:");
        assert_eq!(lines[55], "                        other: 0");
        assert_eq!(lines[60], "                        conn_stale: 0");
        assert_eq!(lines[65], "                  rejects_received:");
        assert_eq!(lines.len(), 76, "{lnd}");
        assert!(lines.iter().all(|l| l.ends_with(':') || l.ends_with(" 0")));
        // ulnet's own settings, after its counters: the defaults.
        assert_eq!(
            ulnet,
            crate::golden::ulnet_defaults("                  ") + "                  peers: 0\n"
        );
        // With the address the NI listens on (a daemon's NI): first in ulnet's settings.
        let x = NiExtras {
            listen: Some("127.0.0.1:40123".parse().unwrap()),
            ..Default::default()
        };
        let v = net(&net_show(&n, &[x], true));
        let ulnet = v.split_once("            ulnet:\n").expect(&v).1;
        assert!(
            ulnet.starts_with(
                "                  listen: 127.0.0.1:40123\n                  checksum: \"off\"\n"
            ),
            "{ulnet}"
        );
    }

    #[test]
    fn net_fabric_counters() {
        let n = NetShow {
            net: vec![NetEntry {
                net_type: "o2ib".into(),
                local_nis: vec![NiEntry {
                    nid: "10.0.0.1@o2ib".into(),
                    status: "up".into(),
                    statistics: None,
                    tunables: None,
                    lnd_tunables: None,
                    health_stats: None,
                    lnd_statistics: None,
                    ulnet: None,
                    fabric: Some(FabricCounters {
                        kind: "tcp".into(),
                        counters: NamedCounters(vec![
                            ("accepted".into(), 3),
                            ("truncated".into(), 1),
                        ]),
                    }),
                }],
            }],
            peers: Vec::new(),
            acceptor: None,
        };
        assert_eq!(
            net(&n),
            "\
net:
-     net type: o2ib
      local NI(s):
      -     nid: 10.0.0.1@o2ib
            status: up
            fabric:
                  type: tcp
                  accepted: 3
                  truncated: 1
"
        );
        let j = json(&Response::Net(n.clone())).unwrap();
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        let f = &v["net"][0]["local NI(s)"][0]["fabric"];
        assert_eq!(f["type"], "tcp", "{j}");
        assert_eq!(f["truncated"], 1, "{j}");
        // And it comes back the same through the control protocol.
        let line = router::control::encode_response(&Response::Net(n.clone()));
        let back = router::control::decode_response(line.as_bytes()).unwrap();
        assert_eq!(back, Response::Net(n));
    }

    #[test]
    fn capture_report() {
        let r = Report {
            file: "/tmp/x.pcap".into(),
            captured: 12,
            dropped: Some(0),
            seconds: 2.04,
            reason: "stopped".into(),
        };
        assert_eq!(
            capture_yaml(&r),
            "capture:\n    file: /tmp/x.pcap\n    captured: 12\n    dropped: 0\n    seconds: 2.0\n    reason: stopped\n"
        );
        let v: serde_json::Value = serde_json::from_str(&capture_json(&r)).unwrap();
        assert_eq!(v["capture"]["captured"], 12);
        assert!(capture_yaml(&Report { dropped: None, ..r }).contains("dropped: unknown\n"));
    }

    #[test]
    fn peer_snapshots() {
        let mut n = node();
        let peer_nid: Nid = "10.0.0.2@o2ib".parse().unwrap();
        n.ping(
            Instant::from_secs(2),
            peer_nid,
            lnd::time::Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(peer(&PeerShow::default()), "peer: []\n");
        assert_eq!(
            peer(&peer_show(&n, None, false).unwrap()),
            include_str!("fixtures/peer-show.yaml")
        );
        assert_eq!(
            peer(&peer_show(&n, Some("10.0.0.2@o2ib"), true).unwrap()),
            include_str!("fixtures/peer-show-v.yaml")
        );
    }

    /// A tcp NI (socklnd): `net show -v` prints ksocklnd's counters as `lnd statistics`, without
    /// o2iblnd's reject tables; `conn show` prints a socklnd connection's own fields.
    #[test]
    fn socklnd_net_and_conn_snapshots() {
        let nid: Nid = "127.0.0.1@tcp".parse().unwrap();
        let n = LnetNode::new(
            NodeConfig::new(vec![NiConfig::new(nid, 1)]),
            Instant::from_secs(1),
        );
        let v = net(&net_show(&n, &[], true));
        let (_, lnd) = v.split_once("            lnd statistics:\n").expect(&v);
        let keys: Vec<&str> = lnd
            .lines()
            .take_while(|l| l.starts_with("                  "))
            .map(|l| l.trim().split_once(": ").expect(l).0)
            .collect();
        assert_eq!(keys.len(), 37, "{lnd}");
        assert_eq!(
            keys[..4],
            ["connects", "connect_failures", "accepts", "established"]
        );
        for k in [
            "refused_insecure_port",
            "refused_unauthenticated_limit",
            "bad_magic",
            "bad_hello",
            "refused_version",
            "protocol_errors",
            "bulk_stalls",
            "zc_acks_sent",
            "unauthenticated",
        ] {
            assert!(keys.contains(&k), "{k}: {lnd}");
        }
        assert!(!v.contains("rejects_sent"), "{v}");
        // The control protocol's form round-trips with the reject tables left out.
        let j = serde_json::to_string(&net_show(&n, &[], true)).unwrap();
        assert!(!j.contains("rejects"), "{j}");
        let back: NetShow = serde_json::from_str(&j).unwrap();
        let l = back.net[1].local_nis[0].lnd_statistics.clone().unwrap();
        assert_eq!(l.counters.get("bad_hello"), Some(0));
        assert!(l.rejects_sent.is_empty());
        let c = ConnShow {
            conn: vec![ConnEntry::socklnd(
                "127.0.0.1@tcp".into(),
                "127.0.0.2@tcp".into(),
                "established".into(),
                "passive",
                SockConnDetail {
                    ctype: "BULK_IN".into(),
                    local: "127.0.0.1:988".into(),
                    remote: "127.0.0.2:1021".into(),
                    queued_bytes: 4096,
                    zc_acks_sent: 3,
                    zc_acks_received: 0,
                },
            )],
        };
        assert_eq!(
            conn(&c),
            "\
conn:
    - ni: 127.0.0.1@tcp
      peer: 127.0.0.2@tcp
      type: BULK_IN
      state: established
      side: passive
      local: 127.0.0.1:988
      remote: 127.0.0.2:1021
      queued_bytes: 4096
      zc_acks_sent: 3
      zc_acks_received: 0
"
        );
    }

    #[test]
    fn conn_stats_global_snapshots() {
        let n = node();
        assert_eq!(conn(&conn_show(&n, Instant::from_secs(1))), "conn: []\n");
        let c = ConnShow {
            conn: vec![ConnEntry {
                ni: "10.0.0.1@o2ib".into(),
                peer: "10.0.0.2@o2ib".into(),
                state: "Established".into(),
                side: "active".into(),
                credits: 7,
                outstanding_credits: 1,
                reserved_credits: 0,
                queue_depth: 8,
                sends_posted: 1,
                queued: 0,
                races: 2,
                incarnation: "0x62a3b00000002".into(),
                age_ms: 1500,
                sock: None,
            }],
        };
        assert_eq!(
            conn(&c),
            "\
conn:
    - ni: 10.0.0.1@o2ib
      peer: 10.0.0.2@o2ib
      state: Established
      side: active
      credits: 7
      outstanding_credits: 1
      reserved_credits: 0
      queue_depth: 8
      sends_posted: 1
      queued: 0
      races: 2
      incarnation: \"0x62a3b00000002\"
      age_ms: 1500
"
        );
        let s = stats(&stats_show(&n));
        // lnetctl's keys in lnetctl's order (reference 7.4: liblnetconfig.c's stats builder
        // and the counter structs of lnet-idl.h), then ours: loopback, the peer table.
        let lnetctl_keys = [
            "msgs_alloc",
            "msgs_max",
            "rst_alloc",
            "errors",
            "send_count",
            "resend_count",
            "response_timeout_count",
            "local_interrupt_count",
            "local_dropped_count",
            "local_aborted_count",
            "local_no_route_count",
            "local_timeout_count",
            "local_error_count",
            "remote_dropped_count",
            "remote_error_count",
            "remote_timeout_count",
            "network_timeout_count",
            "failed_resends",
            "successful_resends",
            "recv_count",
            "route_count",
            "drop_count",
            "send_length",
            "recv_length",
            "route_length",
            "drop_length",
        ];
        let keys: Vec<&str> = s
            .lines()
            .skip(1)
            .take(lnetctl_keys.len())
            .map(|l| l.trim().split(':').next().unwrap())
            .collect();
        assert_eq!(keys, lnetctl_keys, "{s}");
        assert!(s.starts_with("statistics:\n    msgs_alloc: 0\n"));
        assert!(s.contains(
            "    drop_length: 0\n    loopback_count: 0\n    loopback_length: 0\npeer_table:\n"
        ));
        assert!(
            s.ends_with("peer_table:\n    peers: 0\n    peers_aged: 0\n    peer_table_full: 0\n")
        );
        assert_eq!(s.lines().count(), 1 + 26 + 2 + 4);
        // The daemon adds its control socket's counters after LNet's.
        let mut with_control = stats_show(&n);
        with_control.control = Some(router::control::NamedCounters(vec![
            ("clients".into(), 3),
            ("refused".into(), 1),
        ]));
        let s = stats(&with_control);
        assert!(
            s.ends_with("    peer_table_full: 0\ncontrol:\n    clients: 3\n    refused: 1\n"),
            "{s}"
        );
        assert_eq!(
            global(&global_show(&n)),
            concat!(
                include_str!("fixtures/global-show.yaml"),
                "    routing: 0
    pid: 12345
    selftest: 0
"
            )
        );
    }

    #[test]
    fn json_has_lnetctl_keys() {
        let p = PingShow {
            ping: vec![PingPeer {
                primary_nid: "0@lo".into(),
                multi_rail: false,
                peer_ni: vec![],
            }],
            manage: vec![],
        };
        let j = json(&Response::Ping(p)).unwrap();
        assert!(j.contains("\"primary nid\": \"0@lo\""), "{j}");
        assert!(j.contains("\"Multi-Rail\": false"), "{j}");
        assert!(json(&Response::Error(ControlError::new(1, "x"))).is_none());
    }

    /// The operator audit: `--json debug recovery --local` of an empty queue printed nothing,
    /// which is not JSON. A command without output (`Done`) stays silent.
    #[test]
    fn json_of_an_empty_show_is_still_json() {
        for local in [true, false] {
            let r = Response::Recovery(RecoveryShow {
                local,
                nids: Vec::new(),
            });
            let j = json(&r).unwrap();
            let v: serde_json::Value = serde_json::from_str(&j).expect(&j);
            assert_eq!(v, serde_json::json!({}), "{j}");
            assert_eq!(yaml(&r).unwrap(), "", "YAML stays as lnetctl's: nothing");
        }
        assert_eq!(json(&Response::Done).unwrap(), "");
    }

    /// Every answer lnetctl renders, with content in each field that has any.
    fn every_response() -> Vec<Response> {
        let mut n = node();
        let now = Instant::from_secs(2);
        n.ping(
            now,
            "10.0.0.2@o2ib".parse().unwrap(),
            lnd::time::Duration::from_secs(5),
        )
        .unwrap();
        route_add(now, &mut n, "o2ib1", "10.0.0.3@o2ib", Some(2), Some(1)).unwrap();
        route_add(now, &mut n, "tcp", "10.0.0.4@o2ib", None, None).unwrap();
        let mut routing = routing_show(&n);
        routing.forwarding.dropped_by_reason = vec![("no_route".into(), 3)];
        vec![
            Response::Ping(PingShow {
                ping: vec![PingPeer {
                    primary_nid: "10.0.0.5@o2ib".into(),
                    multi_rail: true,
                    peer_ni: vec!["10.0.0.5@o2ib".into()],
                }],
                manage: vec![PingFailure {
                    ping: "10.0.0.9@o2ib".into(),
                    errno: -110,
                    descr: "failed to ping 10.0.0.9@o2ib: Connection timed out".into(),
                }],
            }),
            Response::Net(net_show(&n, &[], true)),
            Response::Peer(peer_show(&n, None, true).unwrap()),
            Response::Peer(PeerShow::default()),
            Response::Conn(conn_show(&n, now)),
            Response::Stats(stats_show(&n)),
            Response::Global(global_show(&n)),
            Response::Route(route_show(&n, None, None, true).unwrap()),
            Response::Route(route_show(&n, None, None, false).unwrap()),
            Response::Routing(routing),
        ]
    }

    /// The acceptance's "a test converts one to the other": each answer's YAML, read by a YAML
    /// 1.2 reader, and its JSON, read by a JSON reader, are the same tree as the one built.
    #[test]
    fn yaml_and_json_carry_the_same_tree() {
        use crate::tree::{canonical, from_json, Node};
        for resp in every_response() {
            let built = canonical(&Node::from(tree(&resp).unwrap().0));
            let y = yaml(&resp).unwrap();
            let from_yaml: serde_json::Value =
                serde_saphyr::from_str(&y).unwrap_or_else(|e| panic!("not YAML: {e}\n{y}"));
            let j = json(&resp).unwrap();
            let from_json_text: serde_json::Value = serde_json::from_str(&j).unwrap();
            assert_eq!(canonical(&from_json(&from_yaml)), built, "{y}");
            assert_eq!(canonical(&from_json(&from_json_text)), built, "{j}");
        }
    }

    /// Order is part of the tree: the JSON lists each mapping's keys in the YAML's order.
    #[test]
    fn json_keys_come_in_the_yaml_order() {
        for resp in every_response() {
            let y = yaml(&resp).unwrap();
            let j = json(&resp).unwrap();
            let ykeys: Vec<&str> = y
                .lines()
                .filter_map(|l| {
                    l.trim_start()
                        .trim_start_matches('-')
                        .trim_start()
                        .split_once(':')
                })
                .map(|(k, _)| k)
                .collect();
            let jkeys: Vec<&str> = j
                .lines()
                .filter_map(|l| l.trim_start().strip_prefix('"'))
                .filter_map(|l| l.split_once("\": "))
                .map(|(k, _)| k)
                .collect();
            assert_eq!(ykeys, jkeys, "{y}{j}");
        }
    }
}
