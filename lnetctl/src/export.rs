//! `lnetctl export [--backup] [FILE]`: the daemon's running configuration as one YAML document in
//! the layout `lnetctl export` writes (lnetctl.c, jt_export: each show's tree merged, in the
//! order net, peer, route, routing, buffers, global), which `lnet-router --config` loads and
//! `lnetctl import` applies. `--backup` leaves out what is state rather than configuration
//! (statistics, status), as Lustre's backup flag does.
//!
//! ulnet's own keys (`fabric` per net; `listen`, `checksum`, `checksum default`, `race order`,
//! `peer limit` per NI) are written where the daemon's configuration takes them, so an export
//! restarts the daemon as it runs; a kernel lnetctl ignores them.

use router::control::{
    GlobalShow, NetShow, PeerShow, Request, Response, RouteShow, RoutingShow,
};

use crate::tree::Map;

/// What an export needs from the daemon.
pub struct Running {
    pub net: NetShow,
    pub peer: PeerShow,
    pub route: RouteShow,
    pub routing: RoutingShow,
    pub global: GlobalShow,
}

/// The requests, in order, whose answers make a [`Running`].
pub fn requests() -> [Request; 5] {
    [
        Request::NetShow { verbose: true },
        Request::PeerShow {
            nid: None,
            verbose: false,
        },
        Request::RouteShow {
            net: None,
            gateway: None,
            verbose: true,
        },
        Request::RoutingShow,
        Request::GlobalShow,
    ]
}

impl Running {
    /// Puts the answers to [`requests`] together; the first that is not the expected show is
    /// returned as the error (a daemon error, usually).
    pub fn from_answers(answers: Vec<Response>) -> Result<Running, Response> {
        let mut it = answers.into_iter();
        let mut next = || it.next().unwrap_or(Response::Done);
        let net = match next() {
            Response::Net(n) => n,
            other => return Err(other),
        };
        let peer = match next() {
            Response::Peer(p) => p,
            other => return Err(other),
        };
        let route = match next() {
            Response::Route(r) => r,
            other => return Err(other),
        };
        let routing = match next() {
            Response::Routing(r) => r,
            other => return Err(other),
        };
        let global = match next() {
            Response::Global(g) => g,
            other => return Err(other),
        };
        Ok(Running {
            net,
            peer,
            route,
            routing,
            global,
        })
    }
}

/// The export document.
pub fn export(r: &Running, backup: bool) -> Map {
    let nets: Vec<Map> = r
        .net
        .net
        .iter()
        .map(|net| {
            let fabric = net
                .local_nis
                .iter()
                .find_map(|ni| ni.fabric.as_ref().map(|f| f.kind.clone()));
            let nis: Vec<Map> = net
                .local_nis
                .iter()
                .map(|ni| {
                    let mut m = Map::new().with("nid", &ni.nid);
                    if !backup {
                        m.push("status", &ni.status);
                        if let Some(c) = &ni.statistics {
                            m.push(
                                "statistics",
                                Map::new()
                                    .with("send_count", c.send_count)
                                    .with("recv_count", c.recv_count)
                                    .with("drop_count", c.drop_count),
                            );
                        }
                    }
                    if let Some(t) = &ni.tunables {
                        m.push(
                            "tunables",
                            Map::new()
                                .with("peer_timeout", t.peer_timeout)
                                .with("peer_credits", t.peer_credits)
                                .with("peer_buffer_credits", t.peer_buffer_credits)
                                .with("credits", t.credits),
                        );
                    }
                    if let Some(l) = &ni.lnd_tunables {
                        m.push(
                            "lnd tunables",
                            Map::new()
                                .with("peercredits_hiw", l.peercredits_hiw)
                                .with("concurrent_sends", l.concurrent_sends)
                                .with("timeout", l.timeout)
                                .with("keepalive", l.keepalive),
                        );
                    }
                    // ulnet's own keys, where the daemon's configuration takes them.
                    if let Some(u) = &ni.ulnet {
                        m = m
                            .with_opt("listen", u.listen.as_ref())
                            .with("checksum", &u.checksum)
                            .with("checksum default", &u.checksum_default)
                            .with("race order", &u.race_order)
                            .with("peer limit", u.peer_limit);
                    }
                    m
                })
                .collect();
            Map::new()
                .with("net type", &net.net_type)
                .with_opt("fabric", fabric)
                .with("local NI(s)", nis)
        })
        .collect();
    let peers: Vec<Map> = r
        .peer
        .peer
        .iter()
        .map(|p| {
            let nis: Vec<Map> = p
                .peer_ni
                .iter()
                .map(|ni| {
                    let m = Map::new().with("nid", &ni.nid);
                    if backup {
                        m
                    } else {
                        m.with("state", &ni.state)
                    }
                })
                .collect();
            Map::new()
                .with("primary nid", &p.primary_nid)
                .with("Multi-Rail", p.multi_rail)
                .with("peer ni", nis)
        })
        .collect();
    let routes: Vec<Map> = r
        .route
        .route
        .iter()
        .map(|e| {
            Map::new()
                .with("net", &e.net)
                .with("gateway", &e.gateway)
                .with("hop", e.hop.unwrap_or(-1))
                .with("priority", e.priority.unwrap_or(0))
                .with("health_sensitivity", e.health_sensitivity.unwrap_or(1))
        })
        .collect();
    let sum = |f: fn(&router::control::CptPools) -> u32| -> u32 {
        r.routing.cpts.iter().map(f).sum()
    };
    let g = &r.global.global;
    let mut doc = Map::new().with("net", nets);
    if !peers.is_empty() {
        doc.push("peer", peers);
    }
    if !routes.is_empty() {
        doc.push("route", routes);
    }
    doc.push("routing", Map::new().with("enable", r.routing.enable));
    doc.push(
        "buffers",
        Map::new()
            .with("tiny", sum(|c| c.tiny.nbuffers))
            .with("small", sum(|c| c.small.nbuffers))
            .with("large", sum(|c| c.large.nbuffers)),
    );
    doc.push(
        "global",
        Map::new()
            .with("numa_range", g.numa_range)
            .with("max_interfaces", g.max_interfaces)
            .with("discovery", g.discovery)
            .with("drop_asym_route", g.drop_asym_route)
            .with("retry_count", g.retry_count)
            .with("transaction_timeout", g.transaction_timeout)
            .with("health_sensitivity", g.health_sensitivity)
            .with("recovery_interval", g.recovery_interval)
            .with("router_sensitivity", g.router_sensitivity)
            .with("lnd_timeout", g.lnd_timeout)
            .with("response_tracking", g.response_tracking)
            .with("recovery_limit", g.recovery_limit)
            .with("max_recovery_ping_interval", g.max_recovery_ping_interval),
    );
    doc
}
