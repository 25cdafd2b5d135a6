//! The show structs built from an [`LnetNode`]: `net show`, `peer show`, `conn show`,
//! `stats show` and `global show`, and the LND counters and settings `net show -v` adds.

use lnd::iface::LndInfo;
use lnd::time::Instant;
use lnd::wire::{Net, Nid};

use super::protocol::*;
use crate::{FwdDrop, LnetNode, NiIndex, PoolClass, RouteConfig, RouteError};

/// Per-NI settings LNetNode does not keep (for `net show -v`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NiExtras {
    pub peer_timeout: u32,
    pub peer_buffer_credits: u32,
    /// The address the NI's fabric listens on, as bound (a configured port 0 resolved).
    pub listen: Option<std::net::SocketAddr>,
    /// `busy poll us` of the NI's fabric, when the daemon says.
    pub busy_poll_us: Option<u32>,
    /// `handshake limit` of the NI's fabric, when the daemon says.
    pub handshake_limit: Option<u32>,
}

impl Default for NiExtras {
    fn default() -> NiExtras {
        NiExtras {
            peer_timeout: crate::config::DEFAULT_PEER_TIMEOUT,
            peer_buffer_credits: 0,
            listen: None,
            busy_poll_us: None,
            handshake_limit: None,
        }
    }
}

impl UlnetSettings {
    /// ulnet's own settings of an o2ib NI (`None` for another LND).
    fn of(ni: &crate::stats::NiInfo, x: &NiExtras) -> Option<UlnetSettings> {
        let LndInfo::O2ib { config: c, .. } = &ni.lnd else {
            return None;
        };
        Some(UlnetSettings {
            listen: x.listen.map(|a| a.to_string()),
            checksum: if c.checksum.emit { "on" } else { "off" }.into(),
            checksum_default: c
                .checksum
                .default_flavour
                .map_or("none", |f| f.name())
                .into(),
            race_order: c.race_order.name().into(),
            connect_hedge_ms: c.tunables.connect_hedge.as_millis(),
            grant_timeout_ms: Some(c.tunables.grant_timeout.as_millis()),
            peer_limit: c.peer_limit as u64,
            peers: ni.lnd_peers as u64,
            busy_poll_us: x.busy_poll_us,
            handshake_limit: x.handshake_limit,
        })
    }
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
        let fields: [(&str, u64); 54] = [
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
            ("connect_hedges", s.connect_hedges),
            ("hedge_abandons", s.hedge_abandons),
            ("peer_reboots", s.peer_reboots),
            ("superseded_connreqs", s.superseded_connreqs),
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
            ("rx_refused", s.rx_refused),
            ("conns_lost", s.conns_lost),
            ("fabric_protocol_errors", s.fabric_protocol_errors),
            ("fabric_transport_errors", s.fabric_transport_errors),
            ("close_timeouts", s.close_timeouts),
            ("ungraceful_drops", s.ungraceful_drops),
            ("zombies", s.zombies),
            ("reaped", s.reaped),
            ("bad_msgs", s.bad_msgs),
            ("bad_connreqs", s.bad_connreqs),
            ("stale_rx", s.stale_rx),
            ("credit_overflows", s.credit_overflows),
            ("unmatched_completions", s.unmatched_completions),
            ("rdma_refused", s.rdma_refused),
            ("rdma_puts_sent", s.rdma_puts_sent),
            ("rdma_puts_received", s.rdma_puts_received),
            ("rdma_gets_served", s.rdma_gets_served),
            ("rdma_gets_received", s.rdma_gets_received),
            ("rdma_bytes_sent", s.rdma_bytes_sent),
            ("rdma_bytes_received", s.rdma_bytes_received),
            ("rdma_bad_sinks", s.rdma_bad_sinks),
            ("rdma_bad_descs", s.rdma_bad_descs),
            ("rdma_short_writes", s.rdma_short_writes),
            ("grants_reclaimed", s.grants_reclaimed),
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

impl LndCounters {
    /// ksocklnd's counters of `s` (`lnd statistics` of a tcp NI), in the order an operator
    /// reads them: connection setup, refusals at the acceptor and at the HELLO, liveness,
    /// protocol errors, traffic, closes, then the two gauges.
    pub fn from_sock_stats(s: &lnd::iface::sock::SockStats) -> LndCounters {
        let fields: [(&str, u64); 37] = [
            ("connects", s.connects),
            ("connect_failures", s.connect_failures),
            ("accepts", s.accepts),
            ("established", s.established),
            ("refused_insecure_port", s.refused_insecure_port),
            (
                "refused_unauthenticated_limit",
                s.refused_unauthenticated_limit,
            ),
            ("acceptor_refusals", s.acceptor_refusals),
            ("refused_no_ni", s.refused_no_ni),
            ("bad_magic", s.bad_magic),
            ("bad_hello", s.bad_hello),
            ("refused_version", s.refused_version),
            ("refused_race", s.refused_race),
            ("refused_stale", s.refused_stale),
            ("refused_duplicate", s.refused_duplicate),
            ("refused_peer_limit", s.refused_peer_limit),
            ("refusals_received", s.refusals_received),
            ("race_giveups", s.race_giveups),
            ("identity_mismatch", s.identity_mismatch),
            ("peers_rebooted", s.peers_rebooted),
            ("handshake_timeouts", s.handshake_timeouts),
            ("protocol_errors", s.protocol_errors),
            ("checksum_errors", s.checksum_errors),
            ("rx_stalls", s.rx_stalls),
            ("bulk_stalls", s.bulk_stalls),
            ("tx_stalls", s.tx_stalls),
            ("msgs_sent", s.msgs_sent),
            ("msgs_received", s.msgs_received),
            ("bulk_bytes_received", s.bulk_bytes_received),
            ("zc_acks_sent", s.zc_acks_sent),
            ("noops_received", s.noops_received),
            ("keepalives_sent", s.keepalives_sent),
            ("loopback_msgs", s.loopback_msgs),
            ("send_failures", s.send_failures),
            ("closes_graceful", s.closes_graceful),
            ("closes_abort", s.closes_abort),
            ("conns", s.conns),
            ("unauthenticated", s.unauthenticated),
        ];
        LndCounters {
            counters: NamedCounters(fields.iter().map(|(k, v)| (k.to_string(), *v)).collect()),
            rejects_sent: NamedCounters::default(),
            rejects_received: NamedCounters::default(),
        }
    }
}

/// An NI's `lnd tunables:` as its LND has them in effect (a configured 0 is "automatic").
fn lnd_tunables(lnd: &LndInfo) -> Option<LndTunables> {
    match lnd {
        LndInfo::O2ib { config, .. } => {
            let t = &config.tunables;
            Some(LndTunables {
                peercredits_hiw: Some(u32::from(t.credits_hiw(t.queue_depth()))),
                concurrent_sends: Some(u32::from(t.concurrent_sends())),
                conns_per_peer: u32::from(t.conns_per_peer),
                timeout: t.timeout.as_secs(),
                keepalive: Some(t.keepalive.as_secs()),
                tos: None,
            })
        }
        LndInfo::Sock { config, .. } => Some(LndTunables {
            peercredits_hiw: None,
            concurrent_sends: None,
            conns_per_peer: config.conns_per_peer(),
            timeout: config.timeout.as_secs(),
            // ksocklnd's keepalive is a module parameter the kernel's net show does not print;
            // ours is per NI (`lnd tunables: keepalive`), shown only when not the default so
            // that an export keeps it and the default output stays the kernel's.
            keepalive: Some(config.keepalive.as_secs()).filter(|k| {
                *k != lnd::iface::sock::SockConfig::new(Nid::ANY, 0)
                    .keepalive
                    .as_secs()
            }),
            tos: Some(config.tos.map_or(-1, i32::from)),
        }),
        LndInfo::Plain { .. } => None,
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
            health_stats: None,
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
            lnd_tunables: verbose.then(|| lnd_tunables(&ni.lnd)).flatten(),
            health_stats: verbose.then(|| NiHealthShow {
                fatal_error: 0,
                health_value: ni.health.value,
                interrupts: ni.hstats.interrupts,
                dropped: ni.hstats.dropped,
                aborted: ni.hstats.aborted,
                no_route: ni.hstats.no_route,
                timeouts: ni.hstats.timeouts,
                error: ni.hstats.error,
                ping_count: ni.health.ping_count,
                next_ping: ni
                    .health
                    .next_ping
                    .map_or(0, |t| t.as_nanos() / 1_000_000_000),
            }),
            lnd_statistics: match &ni.lnd {
                _ if !verbose => None,
                LndInfo::O2ib { stats, .. } => Some(LndCounters::from_stats(stats)),
                LndInfo::Sock { stats, .. } => Some(LndCounters::from_sock_stats(stats)),
                LndInfo::Plain { .. } => None,
            },
            fabric: None,
            ulnet: verbose.then(|| UlnetSettings::of(&ni, &x)).flatten(),
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
    // Every tcp NI carries the same acceptor settings (the configuration's `acceptor:`).
    let acceptor = node.nets().into_iter().find_map(|ni| match &ni.lnd {
        LndInfo::Sock { config, .. } if verbose => Some(AcceptorShow::of(config)),
        _ => None,
    });
    NetShow {
        net: nets,
        peers: Vec::new(),
        acceptor,
    }
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
                    health_stats: PeerHealthShow {
                        health_value: p.health.value,
                        dropped: p.hstats.dropped,
                        timeout: p.hstats.timeout,
                        error: p.hstats.error,
                        network_timeout: p.hstats.network_timeout,
                        ping_count: p.health.ping_count,
                        next_ping: p
                            .health
                            .next_ping
                            .map_or(0, |t| t.as_nanos() / 1_000_000_000),
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
        if let Some(e) = crate::sock::sock_engine(node, NiIndex(i)) {
            conn.extend(e.conn_views().into_iter().map(|c| sock_conn(nid, &c)));
            continue;
        }
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
                sock: None,
            });
        }
    }
    ConnShow { conn }
}

/// One socklnd connection as `conn show` lists it ([`ConnEntry::socklnd`]).
fn sock_conn(ni: Nid, c: &lnd::iface::sock::SockConnView) -> ConnEntry {
    ConnEntry::socklnd(
        ni.to_string(),
        c.peer.map_or_else(String::new, |p| p.to_string()),
        c.state.into(),
        if c.active { "active" } else { "passive" },
        SockConnDetail {
            ctype: c.ctype.to_ascii_uppercase(),
            local: c.local.to_string(),
            remote: c.remote.to_string(),
            queued_bytes: c.queued_bytes,
            zc_acks_sent: c.zc_acks_sent,
            zc_acks_received: c.zc_acks_received,
        },
    )
}

/// `stats show`.
pub fn stats_show(node: &LnetNode) -> StatsShow {
    let s = node.stats();
    StatsShow {
        statistics: Statistics {
            msgs_alloc: s.msgs_alloc,
            msgs_max: s.msgs_max,
            rst_alloc: 0,
            errors: s.errors,
            send_count: s.send_count,
            resend_count: s.resend_count,
            response_timeout_count: s.response_timeout_count,
            local_interrupt_count: s.local_interrupt_count,
            local_dropped_count: s.local_dropped_count,
            local_aborted_count: s.local_aborted_count,
            local_no_route_count: s.local_no_route_count,
            local_timeout_count: s.local_timeout_count,
            local_error_count: s.local_error_count,
            remote_dropped_count: s.remote_dropped_count,
            remote_error_count: s.remote_error_count,
            remote_timeout_count: s.remote_timeout_count,
            network_timeout_count: s.network_timeout_count,
            failed_resends: s.failed_resends,
            successful_resends: s.successful_resends,
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
        .lnd(NiIndex(0))
        .map_or(lnd::engine::Tunables::default().timeout, |l| l.timeout())
        .as_secs();
    let g = node.globals();
    let get = |name: &str| {
        g.get(name)
            .map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX))
    };
    GlobalShow {
        global: Globals {
            numa_range: get("numa_range"),
            max_interfaces: get("max_interfaces"),
            discovery: get("discovery"),
            drop_asym_route: get("drop_asym_route"),
            retry_count: get("retry_count"),
            transaction_timeout: u64::from(get("transaction_timeout")),
            health_sensitivity: get("health_sensitivity"),
            recovery_interval: get("recovery_interval"),
            router_sensitivity: get("router_sensitivity"),
            lnd_timeout,
            response_tracking: get("response_tracking"),
            recovery_limit: get("recovery_limit"),
            max_recovery_ping_interval: get("max_recovery_ping_interval"),
            routing: u32::from(node.routing_enabled()),
            pid: node.pid(),
            // The daemon says (a node does not know).
            selftest: 0,
        },
    }
}

// ---------------------------------------------------------------------------------- routes

fn parse_net(s: &str) -> Result<Net, ControlError> {
    s.trim().parse().map_err(|e: lnd::wire::NidParseError| {
        // The parser speaks of NIDs ("bad NID 'x': ..."): the reason alone, once.
        let why = e.to_string();
        let why = why
            .strip_prefix(&format!("bad NID '{}': ", s.trim()))
            .unwrap_or(&why);
        ControlError::new(errno::EINVAL, format!("bad net '{s}': {why}"))
    })
}

fn parse_gateway(s: &str) -> Result<Nid, ControlError> {
    s.trim()
        .parse()
        .map_err(|e| ControlError::new(errno::EINVAL, format!("bad gateway '{s}': {e}")))
}

fn route_error(e: &RouteError) -> ControlError {
    ControlError::new(-e.errno(), e.to_string())
}

/// `route show`: every route (only those to `net` and through `gateway`, when given). The
/// state is the gateway's as this node sees it; a route whose gateway another runtime of the
/// daemon watches has no state here (the daemon merges the runtimes' answers).
pub fn route_show(
    node: &LnetNode,
    net: Option<&str>,
    gateway: Option<&str>,
    verbose: bool,
) -> Result<RouteShow, ControlError> {
    let net = net.map(parse_net).transpose()?;
    let gateway = gateway.map(parse_gateway).transpose()?;
    let route = node
        .routes()
        .routes()
        .filter(|r| net.is_none_or(|n| n == r.net) && gateway.is_none_or(|g| g == r.gateway))
        .map(|r| RouteEntry {
            net: r.net.to_string(),
            gateway: r.gateway.to_string(),
            hop: verbose.then(|| r.hops_shown()),
            priority: verbose.then_some(r.priority),
            health_sensitivity: verbose.then_some(1),
            state: if verbose {
                node.route_state(r)
                    .map(|up| if up { "up" } else { "down" }.to_string())
            } else {
                None
            },
            kind: verbose.then(|| {
                if r.effective_hops() > 1 {
                    "multi-hop"
                } else {
                    "single-hop"
                }
                .to_string()
            }),
        })
        .collect();
    Ok(RouteShow { route })
}

/// `route add`: checked as lnet_add_route checks (`RouteError`), then added.
pub fn route_add(
    now: Instant,
    node: &mut LnetNode,
    net: &str,
    gateway: &str,
    hop: Option<i64>,
    priority: Option<u32>,
) -> Result<(), ControlError> {
    let net = parse_net(net)?;
    let gateway = parse_gateway(gateway)?;
    let hops = match hop {
        None | Some(-1) => None,
        Some(h) => match u8::try_from(h) {
            Ok(v) if v >= 1 => Some(v),
            _ => return Err(route_error(&RouteError::BadHops(h))),
        },
    };
    let r = RouteConfig {
        net,
        gateway,
        hops,
        priority: priority.unwrap_or(0),
    };
    let mut table = node.routes().clone();
    table
        .add(r, node.node_nids())
        .map_err(|e| route_error(&e))?;
    node.set_routes(now, table);
    Ok(())
}

/// `route del`: the routes to `net` (through `gateway` only, when given).
pub fn route_del(
    now: Instant,
    node: &mut LnetNode,
    net: &str,
    gateway: Option<&str>,
) -> Result<(), ControlError> {
    let net = parse_net(net)?;
    let gateway = gateway.map(parse_gateway).transpose()?;
    let mut table = node.routes().clone();
    table.remove(net, gateway).map_err(|e| route_error(&e))?;
    node.set_routes(now, table);
    Ok(())
}

/// `routing show` of this node: one CPT.
pub fn routing_show(node: &LnetNode) -> RoutingShow {
    let info = node.routing_info();
    let pool = |c: PoolClass| {
        info.pools
            .iter()
            .find(|p| p.class == c)
            .map(|p| PoolShow {
                npages: p.npages,
                nbuffers: p.nbuffers,
                credits: p.credits,
                mincredits: p.min_credits,
            })
            .unwrap_or_default()
    };
    let s = &info.stats;
    RoutingShow {
        cpts: vec![CptPools {
            tiny: pool(PoolClass::Tiny),
            small: pool(PoolClass::Small),
            large: pool(PoolClass::Large),
        }],
        enable: u32::from(info.enabled),
        forwarding: ForwardingCounts {
            received: s.received,
            forwarded: s.forwarded,
            forwarded_bytes: s.forwarded_bytes,
            in_flight: s.in_flight,
            dropped: s.dropped(),
            dropped_by_reason: FwdDrop::ALL
                .iter()
                .map(|&d| (d.name().to_string(), s.dropped_for(d)))
                .collect(),
            waited_rtr_credit: s.waited_rtr_credit,
            waited_buffer: s.waited_buffer,
            waited_unproven: s.waited_unproven,
            scrubbed: s.scrubbed,
            scrubbed_bytes: s.scrubbed_bytes,
        },
        router_checks: Some({
            let g = node.gateway_health();
            RouterChecks {
                alive_router_check_interval: g.check_interval.as_secs(),
                router_ping_timeout: g.ping_timeout.as_secs(),
                avoid_asym_router_failure: u32::from(g.avoid_asym),
            }
        }),
    }
}

/// The `routing:` module parameters given, on this node: each in the configuration's range
/// (a `router_ping_timeout` of 0 is 1 s, as in the configuration), all or nothing.
pub fn set_router_checks(
    now: Instant,
    node: &mut LnetNode,
    interval: Option<u32>,
    ping_timeout: Option<u32>,
    avoid_asym: Option<bool>,
) -> Result<(), ControlError> {
    use lnd::time::Duration;
    let range = 0..=crate::gateway::MAX_ROUTER_CHECK_SECS;
    for (key, v) in [
        ("alive_router_check_interval", interval),
        ("router_ping_timeout", ping_timeout),
    ] {
        if let Some(v) = v.filter(|v| !range.contains(v)) {
            return Err(ControlError::new(
                errno::EINVAL,
                crate::config::out_of_range(key, v, &range),
            ));
        }
    }
    let mut g = node.gateway_health();
    if let Some(s) = interval {
        g.check_interval = Duration::from_secs(u64::from(s));
    }
    if let Some(s) = ping_timeout {
        g.ping_timeout = Duration::from_secs(u64::from(s.max(1)));
    }
    if let Some(a) = avoid_asym {
        g.avoid_asym = a;
    }
    node.set_gateway_health(now, g);
    Ok(())
}

/// `set tiny_buffers|small_buffers|large_buffers N` on this node (`pool`: `tiny`, `small`,
/// `large`, or the lnetctl key).
pub fn set_buffers(
    now: Instant,
    node: &mut LnetNode,
    pool: &str,
    count: u32,
) -> Result<(), ControlError> {
    let class = match pool.trim_end_matches("_buffers") {
        "tiny" => PoolClass::Tiny,
        "small" => PoolClass::Small,
        "large" => PoolClass::Large,
        other => {
            return Err(ControlError::new(
                errno::EINVAL,
                format!("no buffer pool '{other}' (tiny, small or large)"),
            ))
        }
    };
    // The configuration's range: what `set` takes, an export writes back and a restart loads.
    if !crate::config::BUFFERS_RANGE.contains(&count) {
        return Err(ControlError::new(
            errno::EINVAL,
            crate::config::out_of_range(
                &format!("{}_buffers", pool.trim_end_matches("_buffers")),
                count,
                &crate::config::BUFFERS_RANGE,
            ),
        ));
    }
    node.set_buffers(now, class, count);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::node;
    use super::*;
    use crate::control::{Control, Request, Response};

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
        // The listen address, as the daemon bound it, only when it says.
        assert_eq!(ni.ulnet.as_ref().unwrap().listen, None);
        let x = NiExtras {
            listen: Some("127.0.0.1:40123".parse().unwrap()),
            ..NiExtras::default()
        };
        let s = net_show(&n, &[x], true);
        let u = s.net[1].local_nis[0].ulnet.as_ref().unwrap();
        assert_eq!(u.listen.as_deref(), Some("127.0.0.1:40123"));
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
}
