//! `lnetctl export [--backup] [FILE]`: the daemon's running configuration as one YAML document in
//! the layout `lnetctl export` writes (lnetctl.c, jt_export): net, route and peer as the kernel's
//! netlink dumps re-emitted by libyaml (indent 6), then routing, buffers and global from
//! lnetctl's cYAML tree; `lnet-router --config` loads it and `lnetctl import` applies it.
//!
//! `--backup` keeps what reconfigures a node and drops its state, as the kernel's backup dumps
//! do: no loopback net, no status or statistics, routes without state and type, peers with
//! their NIDs only, `routing: enable:` as a mapping. Two differences, both because ulnet's NI
//! is named by its NID and not by a network interface: each NI keeps its `nid` (Lustre's backup
//! has `interfaces` instead), and its `lnd tunables` keep `timeout` (ulnet's LND timeout is per
//! NI configuration; Lustre derives it from the globals).
//!
//! ulnet's own keys (`fabric` per net; `listen`, `checksum`, `checksum default`, `race order`,
//! `connect hedge ms`, `peer limit`, `busy poll us`, `handshake limit` per NI; `acceptor:` when
//! not lnet's defaults; the router
//! pinger's `alive_router_check_interval`, `router_ping_timeout` and
//! `avoid_asym_router_failure` beside `routing: enable`; the `peers:` address table; `selftest:
//! enable: 1` when on) are written where the daemon's configuration takes them, so an export
//! restarts the daemon as it runs; a kernel lnetctl's import ignores keys it does not know.

use router::control::{
    AcceptorShow, CptPools, GlobalShow, NetShow, NiEntry, PeerShow, Request, Response, RouteShow,
    RoutingShow,
};

use crate::render;
use crate::tree::{to_json, to_yaml_as, Map, Node, Style, NETLINK};

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
            verbose: true,
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
    /// the error (a daemon error, usually), said in one line.
    pub fn from_answers(answers: Vec<Response>) -> Result<Running, String> {
        let mut it = answers.into_iter();
        let mut next = || it.next().unwrap_or(Response::Done);
        let other = |r: Response| match r {
            Response::Error(e) => e.to_string(),
            r => format!("unexpected answer from the daemon: {r:?}"),
        };
        // Each answer in the order of the requests, or the error that came in its place.
        macro_rules! answer {
            ($show:ident) => {
                match next() {
                    Response::$show(s) => s,
                    r => return Err(other(r)),
                }
            };
        }
        Ok(Running {
            net: answer!(Net),
            peer: answer!(Peer),
            route: answer!(Route),
            routing: answer!(Routing),
            global: answer!(Global),
        })
    }
}

/// The export document: its sections in order, each with the printer lnetctl uses for it.
pub fn export(r: &Running, backup: bool) -> Vec<(Map, Style)> {
    let nets: Vec<Map> = r
        .net
        .net
        .iter()
        .filter(|net| !(backup && net.net_type == "lo"))
        .map(|net| {
            // A tcp net is ksocklnd on the socket fabric unless it says `sim`: lnet.conf has
            // no `fabric:` there (an `o2ib` net's `fabric:` is ours, always written).
            let tcp = net.net_type.starts_with("tcp");
            let fabric = net
                .local_nis
                .iter()
                .find_map(|ni| ni.fabric.as_ref().map(|f| f.kind.clone()))
                .filter(|k| !tcp || k == "sim");
            let nis: Vec<Map> = net
                .local_nis
                .iter()
                .map(|ni| export_ni(ni, backup))
                .collect();
            Map::new()
                .with("net type", &net.net_type)
                .with_opt("fabric", fabric)
                .with("local NI(s)", nis)
        })
        .collect();
    let routes: Vec<Map> = r
        .route
        .route
        .iter()
        .map(|e| {
            let m = Map::new()
                .with("net", &e.net)
                .with("gateway", &e.gateway)
                .with("hop", e.hop.unwrap_or(-1))
                .with("priority", e.priority.unwrap_or(0));
            if backup {
                m
            } else {
                m.with_opt("state", e.state.as_ref())
                    .with_opt("type", e.kind.as_ref())
            }
        })
        .collect();
    let peers: Vec<Map> = r
        .peer
        .peer
        .iter()
        .map(|p| {
            render::peer_entry(p, |ni| {
                let m = Map::new().with("nid", &ni.nid);
                match (&ni.detail, backup) {
                    (_, true) => m,
                    (None, false) => m.with("state", &ni.state),
                    (Some(d), false) => render::peer_ni_detail(m.with("state", &ni.state), d)
                        .with("health stats", render::peer_health(&d.health_stats)),
                }
            })
        })
        .collect();
    let mut out = Vec::new();
    // Sections with nothing in them are left out, as Lustre's export does.
    for (key, items) in [("net", nets), ("route", routes), ("peer", peers)] {
        if !items.is_empty() {
            out.push((Map::new().with(key, items), NETLINK));
        }
    }
    let sum = |f: fn(&CptPools) -> u32| -> u32 { r.routing.cpts.iter().map(f).sum() };
    // `enable`, then the router pinger's module parameters under their Lustre names (a
    // kernel lnetctl's import reads `enable` and ignores them).
    let mut enable = Map::new().with("enable", r.routing.enable);
    if let Some(c) = &r.routing.router_checks {
        enable = enable
            .with("alive_router_check_interval", c.alive_router_check_interval)
            .with("router_ping_timeout", c.router_ping_timeout)
            .with("avoid_asym_router_failure", c.avoid_asym_router_failure);
    }
    let routing = if backup {
        Node::from(enable)
    } else {
        // As `routing show` prints it: each CPT's pools, then `enable` (with ours).
        let mut items = render::routing_items(&r.routing);
        items.pop();
        items.push(enable);
        Node::from(items)
    };
    let tail = Map::new()
        .with("routing", routing)
        .with(
            "buffers",
            Map::new()
                .with("tiny", sum(|c| c.tiny.nbuffers))
                .with("small", sum(|c| c.small.nbuffers))
                .with("large", sum(|c| c.large.nbuffers)),
        )
        .with("global", render::lnetctl_globals(&r.global.global));
    out.push((tail, Style::Cyaml));
    // Ours, where the configuration takes them: the acceptor when not the default, where
    // peers listen, and selftest when on.
    let mut ours = Map::new();
    if let Some(a) = r
        .net
        .acceptor
        .as_ref()
        .filter(|a| **a != default_acceptor())
    {
        ours.push(
            "acceptor",
            Map::new()
                .with("accept", &a.accept)
                .with("port", u32::from(a.port))
                .with("backlog", a.backlog)
                .with("timeout", a.timeout)
                .with("source ports", &a.source_ports),
        );
    }
    if !r.net.peers.is_empty() {
        let peers: Vec<Map> = r
            .net
            .peers
            .iter()
            .map(|p| Map::new().with("nid", &p.nid).with("address", &p.address))
            .collect();
        ours.push("peers", peers);
    }
    if r.global.global.selftest != 0 {
        ours.push(
            "selftest",
            Map::new().with("enable", r.global.global.selftest),
        );
    }
    if !ours.0.is_empty() {
        out.push((ours, Style::Cyaml));
    }
    out
}

/// The acceptor a configuration without `acceptor:` runs (the lnet module's defaults).
fn default_acceptor() -> AcceptorShow {
    AcceptorShow::of(&lnd::iface::sock::SockConfig::new(lnd::wire::Nid::ANY, 0))
}

/// One local NI of the export.
fn export_ni(ni: &NiEntry, backup: bool) -> Map {
    let mut m = Map::new().with("nid", &ni.nid);
    if !backup {
        m.push("status", &ni.status);
        if let Some(c) = &ni.statistics {
            m.push("statistics", render::counts(c));
        }
        if let Some(h) = &ni.health_stats {
            m.push("health stats", render::ni_health(h));
        }
    }
    if let Some(t) = &ni.tunables {
        m.push("tunables", render::ni_tunables(t));
    }
    if let Some(l) = ni.lnd_tunables.as_ref().filter(|_| ni.nid != "0@lo") {
        m.push("lnd tunables", render::lnd_tunables(l));
    }
    // ulnet's own keys, where the daemon's configuration takes them.
    if let Some(u) = &ni.ulnet {
        m = render::ulnet_settings(m, u, false);
    }
    m
}

/// The export as text: each section in its printer's layout, one YAML document.
pub fn to_text(sections: &[(Map, Style)]) -> String {
    sections.iter().map(|(m, s)| to_yaml_as(m, *s)).collect()
}

/// The export as one JSON object (the same tree).
pub fn to_json_text(sections: &[(Map, Style)]) -> String {
    let mut all = Map::new();
    for (m, _) in sections {
        all.0.extend(m.0.iter().cloned());
    }
    to_json(&all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(acceptor: Option<AcceptorShow>) -> Running {
        Running {
            net: NetShow {
                acceptor,
                ..NetShow::default()
            },
            peer: PeerShow::default(),
            route: RouteShow::default(),
            routing: RoutingShow::default(),
            global: GlobalShow::default(),
        }
    }

    /// `acceptor:` is written only when it differs from lnet's defaults (a kernel node's
    /// export has none), with the keys the configuration reads back.
    #[test]
    fn acceptor_written_only_when_not_the_default() {
        for backup in [false, true] {
            let none = to_text(&export(&running(None), backup));
            assert!(!none.contains("acceptor"), "{none}");
            let d = to_text(&export(&running(Some(default_acceptor())), backup));
            assert!(!d.contains("acceptor"), "{d}");
            let a = AcceptorShow {
                accept: "all".into(),
                port: 7988,
                ..default_acceptor()
            };
            let t = to_text(&export(&running(Some(a)), backup));
            assert!(
                t.contains(
                    "acceptor:\n    accept: all\n    port: 7988\n    backlog: 127\n    \
                     timeout: 5\n    source ports: \"1023-512\"\n"
                ),
                "{t}"
            );
        }
    }
}
