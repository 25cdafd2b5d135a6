//! `lnetctl import`: a document as `lnetctl export` or lnet.conf writes it, checked as the
//! daemon's configuration file is ([`DaemonConfig::parse_import`], errors name the line), then
//! applied to the running daemon item by item through the same requests `lnetctl route
//! add`, `set` and friends send (its routes judged one by one as `route add` would, then
//! applied as one change), so an import changes exactly what those commands would and
//! nothing else: connections it does not concern stay up.
//!
//! Lustre's import walks the document's sections and reports each item that failed in an
//! `add:` / `del:` block with its errno (lnetctl.c, jt_import; liblnetconfig.c,
//! lustre_yaml_config / lustre_yaml_del). We do the same, and also count what was already as
//! the document says, so `lnetctl export | lnetctl import` on the same daemon is a clean no-op.
//!
//! Nets are added and removed through the daemon ([`NetChange`]): an NI added starts its own
//! loop with the daemon's current routes, routing and globals; one removed closes its
//! connections gracefully first. Nothing else is touched.

use std::collections::HashMap;
use std::net::SocketAddr;

use lnd::time::Instant;
use lnd::wire::Nid;

use super::protocol::{
    errno, ControlError, ImportFailure, ImportOp, ImportReport, Request, Response, RouterChecks,
};
use crate::yaml_config::{DaemonConfig, NetSettings, NiSettings};
use crate::{BufferCounts, LnetNode, RouteConfig, RouteError};

/// What an import asks of the daemon's NIs, which only the daemon can do (it starts and stops
/// their threads and fabrics).
pub enum NetChange<'a> {
    /// Start this NI of `net`; `doc` is the whole document (its `peers:` say where peers
    /// listen).
    Add {
        net: &'a NetSettings,
        ni: &'a NiSettings,
        doc: &'a DaemonConfig,
    },
    /// Stop this NI (gracefully: its connections are closed first).
    Del(Nid),
    /// Where these peers listen (ulnet's `peers:`), for every NI's next connect to them,
    /// running NIs included (`apply` false: only count). The daemon answers how many
    /// addresses are new or different.
    Addresses {
        given: &'a HashMap<Nid, SocketAddr>,
        apply: bool,
    },
}

/// What to do with a document's routes, all at once ([`apply_routes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutesOp {
    /// Add each (one already there as given is left alone).
    Add,
    /// Remove each.
    Del,
    /// Say what `Add` would do, changing nothing (`--show`).
    Check,
}

/// What became of one route of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteOutcome {
    Applied,
    /// There already, with the same hop and priority.
    Unchanged,
    Failed(ControlError),
}

/// A document's routes, for the daemon to apply in one change ([`apply_routes`] on the node
/// that keeps its routes, then one publish to every NI): a route at a time, each a publish
/// that every NI loop adopts before the next, cost 1-2 ms a route (19,444 routes took 41 s).
pub struct RouteBatch<'a> {
    pub routes: &'a [RouteConfig],
    pub op: RoutesOp,
    /// NIDs the document adds, which `Check` counts as the node's (`Add` runs after they were
    /// added; `--show` adds nothing).
    pub adding: &'a [Nid],
}

/// Applies `batch` to `node`'s route table as one change (one `set_routes`), judging each
/// route as `lnetctl route add|del` would (lnet_add_route's checks, EEXIST for a route there
/// with another hop or priority, ENOENT for one to delete that is not there), so that a bad
/// route fails alone. One outcome per route, in order.
pub fn apply_routes(
    now: Instant,
    node: &mut LnetNode,
    batch: &RouteBatch<'_>,
) -> Vec<RouteOutcome> {
    let mut table = node.routes().clone();
    let mut own = node.node_nids().to_vec();
    if batch.op == RoutesOp::Check {
        own.extend(
            batch
                .adding
                .iter()
                .filter(|n| !own.contains(n))
                .collect::<Vec<_>>(),
        );
    }
    let failed = |e: RouteError| RouteOutcome::Failed(ControlError::new(-e.errno(), e.to_string()));
    let mut changed = false;
    let out = batch
        .routes
        .iter()
        .map(|r| {
            let there = table
                .to_net(r.net)
                .iter()
                .find(|x| x.gateway == r.gateway)
                .copied();
            match (batch.op, there) {
                (RoutesOp::Del, Some(_)) => match table.remove(r.net, Some(r.gateway)) {
                    Ok(_) => {
                        changed = true;
                        RouteOutcome::Applied
                    }
                    Err(e) => failed(e),
                },
                (RoutesOp::Del, None) => {
                    RouteOutcome::Failed(ControlError::new(errno::ENOENT, "no such route"))
                }
                (_, Some(x)) if x.hops == r.hops && x.priority == r.priority => {
                    RouteOutcome::Unchanged
                }
                // As lnet_add_route: the same gateway to the same net is EEXIST, whatever
                // else differs.
                (_, Some(x)) => RouteOutcome::Failed(ControlError::new(
                    errno::EEXIST,
                    format!(
                        "there already with hop {} and priority {} (delete it first to change \
                         them)",
                        x.hops.map_or(-1, i64::from),
                        x.priority
                    ),
                )),
                (_, None) => match table.add(*r, &own) {
                    Ok(()) => {
                        changed = true;
                        RouteOutcome::Applied
                    }
                    Err(e) => failed(e),
                },
            }
        })
        .collect();
    if changed && batch.op != RoutesOp::Check {
        node.set_routes(now, table);
    }
    out
}

/// Applies `yaml` to the daemon whose NIs are `running`, asking it through `call` for what
/// the requests do, through `net` for NIs to start or stop and peers' addresses (`net`
/// answers how many things it changed), and through `routes` to apply the document's routes
/// at once ([`apply_routes`] on its node-wide settings). `nets` (under `--show` only) is the
/// `net:` section of the document this one is a part of: its NIs count as the daemon's when
/// the part's routes are checked, and nothing of it is applied or counted (lnetctl sends a
/// big document in parts, each within [`MAX_REQUEST`](super::MAX_REQUEST)).
pub fn import(
    yaml: &str,
    op: ImportOp,
    nets: Option<&str>,
    running: &[Nid],
    mut call: impl FnMut(Request) -> Response,
    mut net: impl FnMut(NetChange<'_>) -> Result<usize, ControlError>,
    mut routes: impl FnMut(RouteBatch<'_>) -> Vec<RouteOutcome>,
) -> Response {
    let cfg = match DaemonConfig::parse_import(yaml, "import", running) {
        Ok(c) => c,
        Err(e) => return Response::Error(ControlError::new(errno::EINVAL, e.to_string())),
    };
    // The NIs this document (or the one it is a part of, under --show) adds.
    let mut adding: Vec<Nid> = cfg.nis().map(|(_, ni)| ni.ni.nid).collect();
    if op == ImportOp::Show {
        if let Some(Ok(whole)) = nets.map(|n| DaemonConfig::parse_import(n, "import", running)) {
            adding.extend(whole.nis().map(|(_, ni)| ni.ni.nid));
        }
    }
    let mut rep = ImportReport {
        op,
        ..ImportReport::default()
    };
    let dry = op == ImportOp::Show;
    let del = op == ImportOp::Del;
    let fail = |rep: &mut ImportReport, section: &str, errno: i32, descr: String| {
        rep.failed.push(ImportFailure {
            section: section.to_string(),
            errno: -errno,
            descr,
            line: None,
        });
    };

    // `peer:` entries with one NI (Multi-Rail ones were refused by the parser): ulnet creates
    // a peer when it first talks to it, as discovery would; nothing to apply. ulnet's
    // `peers:` say where peers listen: for the next connect of every NI, running ones
    // included, and before the nets so that an NI this document adds connects where it says.
    if !del {
        rep.unchanged += cfg.given.peers as u32;
        if !cfg.peers.is_empty() {
            let given = cfg.peers.len() as u32;
            match net(NetChange::Addresses {
                given: &cfg.peers,
                apply: !dry,
            }) {
                Ok(changed) => {
                    let changed = (changed as u32).min(given);
                    rep.applied += changed;
                    rep.unchanged += given - changed;
                }
                Err(e) => fail(&mut rep, "peers", e.errno, e.message),
            }
        }
    }

    // Nets first on add (routes and buffers then see the new NIs), last on del (Lustre removes
    // routes before the nets they go through).
    let mut running = running.to_vec();
    let mut nets = |rep: &mut ImportReport| {
        for (settings, ni) in cfg.nis() {
            let nid = ni.ni.nid;
            let here = running.contains(&nid);
            let change = match (here, del) {
                (true, false) => {
                    rep.unchanged += 1;
                    continue;
                }
                (false, true) => {
                    fail(
                        rep,
                        "net",
                        errno::ENOENT,
                        format!("net del {nid}: no such NI"),
                    );
                    continue;
                }
                (false, false) => NetChange::Add {
                    net: settings,
                    ni,
                    doc: &cfg,
                },
                (true, true) => NetChange::Del(nid),
            };
            if dry {
                rep.applied += 1;
                continue;
            }
            match net(change) {
                Ok(_) => {
                    rep.applied += 1;
                    if del {
                        running.retain(|&n| n != nid);
                    } else {
                        running.push(nid);
                    }
                }
                Err(e) => fail(rep, "net", e.errno, e.message),
            }
        }
    };
    if !del {
        nets(&mut rep);
    }
    // What the daemon has now, to tell a change from what is already so.
    let Running {
        routing: routing_now,
        buffers: buffers_now,
        globals: globals_now,
        router_checks: checks_now,
        selftest: selftest_now,
    } = match now(&mut call) {
        Ok(s) => s,
        Err(e) => return Response::Error(e),
    };
    let mut apply = |rep: &mut ImportReport, section: &str, req: Request| {
        if dry {
            rep.applied += 1;
            return;
        }
        match call(req) {
            Response::Done => rep.applied += 1,
            Response::Error(e) => rep.failed.push(ImportFailure {
                section: section.to_string(),
                errno: -e.errno,
                descr: e.message,
                line: None,
            }),
            other => rep.failed.push(ImportFailure {
                section: section.to_string(),
                errno: -errno::EPROTO,
                descr: format!("unexpected answer from the daemon: {other:?}"),
                line: None,
            }),
        }
    };

    // The routes in one change: each judged alone (a bad one fails with its line, the others
    // apply), then one publish for all.
    if !cfg.routes.is_empty() {
        let list: Vec<RouteConfig> = cfg.routes.iter().map(|r| r.route).collect();
        let outcomes = routes(RouteBatch {
            routes: &list,
            op: match op {
                ImportOp::Add => RoutesOp::Add,
                ImportOp::Del => RoutesOp::Del,
                ImportOp::Show => RoutesOp::Check,
            },
            adding: &adding,
        });
        for (r, o) in cfg.routes.iter().zip(outcomes) {
            match o {
                RouteOutcome::Applied => rep.applied += 1,
                RouteOutcome::Unchanged => rep.unchanged += 1,
                RouteOutcome::Failed(e) => rep.failed.push(ImportFailure {
                    section: "route".to_string(),
                    errno: -e.errno,
                    descr: format!(
                        "route to {} via {}: {}",
                        r.route.net, r.route.gateway, e.message
                    ),
                    line: Some(r.line),
                }),
            }
        }
    }
    if del {
        nets(&mut rep);
        // Peers, routing, buffers and globals have nothing to remove: they are settings.
        return Response::Import(rep);
    }
    if cfg.given.routing {
        if cfg.routing.enabled == routing_now {
            rep.unchanged += 1;
        } else {
            apply(
                &mut rep,
                "routing",
                Request::SetRouting {
                    enable: cfg.routing.enabled,
                },
            );
        }
    }
    // The router pinger's module parameters: set at run time (as under /sys in Lustre), the
    // ones the document gives, each an item.
    let g = cfg.given.router_checks;
    let want = RouterChecks {
        alive_router_check_interval: g
            .alive_router_check_interval
            .map_or(checks_now.alive_router_check_interval, u64::from),
        // 0 is 1 s, as in the configuration.
        router_ping_timeout: g
            .router_ping_timeout
            .map_or(checks_now.router_ping_timeout, |s| u64::from(s.max(1))),
        avoid_asym_router_failure: g
            .avoid_asym_router_failure
            .map_or(checks_now.avoid_asym_router_failure, u32::from),
    };
    let differ = [
        g.alive_router_check_interval.is_some()
            && want.alive_router_check_interval != checks_now.alive_router_check_interval,
        g.router_ping_timeout.is_some()
            && want.router_ping_timeout != checks_now.router_ping_timeout,
        g.avoid_asym_router_failure.is_some()
            && want.avoid_asym_router_failure != checks_now.avoid_asym_router_failure,
    ]
    .iter()
    .filter(|&&d| d)
    .count();
    rep.unchanged += (g.count() - differ) as u32;
    if differ > 0 {
        let before = rep.applied;
        apply(
            &mut rep,
            "routing",
            Request::SetRouterChecks {
                alive_router_check_interval: g.alive_router_check_interval,
                router_ping_timeout: g.router_ping_timeout,
                avoid_asym_router_failure: g.avoid_asym_router_failure,
            },
        );
        if rep.applied > before {
            rep.applied += differ as u32 - 1;
        }
    }
    // lnet_selftest starts with the daemon: a change is a restart, said as for an NI that
    // cannot be added at run time (and by `--show` too, which knows it already).
    if let Some(on) = cfg.given.selftest {
        if on == selftest_now {
            rep.unchanged += 1;
        } else {
            let want = u8::from(on);
            fail(
                &mut rep,
                "selftest",
                errno::EOPNOTSUPP,
                format!(
                    "selftest: enable: {want}: restart needed (lnet_selftest starts with the \
                     daemon: put 'selftest: enable: {want}' in its configuration and restart it)"
                ),
            );
        }
    }
    if cfg.given.buffers {
        // The node's total as the daemon keeps it: an equal share per NI, at least one.
        let want = cfg.routing.buffers.share(running.len().max(1));
        let n = running.len().max(1) as u32;
        let want = BufferCounts {
            tiny: want.tiny * n,
            small: want.small * n,
            large: want.large * n,
        };
        for (pool, w, n) in [
            ("tiny", want.tiny, buffers_now.tiny),
            ("small", want.small, buffers_now.small),
            ("large", want.large, buffers_now.large),
        ] {
            if w == n {
                rep.unchanged += 1;
            } else {
                apply(
                    &mut rep,
                    "buffers",
                    Request::SetBuffers {
                        pool: pool.to_string(),
                        count: w,
                    },
                );
            }
        }
    }
    // The section at once: a kernel export lists retry_count before health_sensitivity, and
    // only the whole satisfies the rules that tie them.
    let changed: Vec<(String, i64)> = cfg
        .given
        .globals
        .iter()
        .filter(|(name, value)| {
            // Compared as the kernel would keep it (discovery 7 is 1, recovery_interval is
            // ignored), so that an import that changes nothing says so.
            match crate::globals::stored(name, *value) {
                None => false,
                Some(value) => !globals_now.iter().any(|(n, v)| n == name && *v == value),
            }
        })
        .cloned()
        .collect();
    rep.unchanged += (cfg.given.globals.len() - changed.len()) as u32;
    if !changed.is_empty() {
        let n = changed.len() as u32;
        let before = rep.applied;
        apply(&mut rep, "global", Request::SetGlobals { values: changed });
        if rep.applied > before {
            rep.applied += n - 1;
        }
    }
    Response::Import(rep)
}

/// What the daemon has now, of what an import may change (its routes: [`apply_routes`]).
struct Running {
    routing: bool,
    /// The node's totals.
    buffers: BufferCounts,
    globals: Vec<(String, i64)>,
    router_checks: RouterChecks,
    selftest: bool,
}

/// The daemon's routing switch and router pinger, router buffers, globals, selftest.
fn now(call: &mut impl FnMut(Request) -> Response) -> Result<Running, ControlError> {
    let unexpected = |r: Response| match r {
        Response::Error(e) => e,
        other => ControlError::new(errno::EPROTO, format!("unexpected answer: {other:?}")),
    };
    let (routing, buffers, router_checks) = match call(Request::RoutingShow) {
        Response::Routing(r) => {
            let sum = |f: fn(&super::CptPools) -> u32| r.cpts.iter().map(f).sum::<u32>();
            (
                r.enable == 1,
                BufferCounts {
                    tiny: sum(|c| c.tiny.nbuffers),
                    small: sum(|c| c.small.nbuffers),
                    large: sum(|c| c.large.nbuffers),
                },
                r.router_checks.clone().unwrap_or_default(),
            )
        }
        other => return Err(unexpected(other)),
    };
    let (globals, selftest) = match call(Request::GlobalShow) {
        Response::Global(g) => {
            let v = serde_json::to_value(&g.global).unwrap_or_default();
            let globals = crate::globals::TUNABLES
                .iter()
                .filter_map(|t| {
                    v.get(t.name)
                        .and_then(|x| x.as_i64())
                        .map(|x| (t.name.to_string(), x))
                })
                .collect();
            (globals, g.global.selftest == 1)
        }
        other => return Err(unexpected(other)),
    };
    Ok(Running {
        routing,
        buffers,
        globals,
        router_checks,
        selftest,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{nid, node};
    use super::*;

    fn route(net: &str, gateway: &str, hops: Option<u8>) -> RouteConfig {
        RouteConfig {
            net: net.parse().unwrap(),
            gateway: nid(gateway),
            hops,
            priority: 0,
        }
    }

    fn errnos(out: &[RouteOutcome]) -> Vec<i32> {
        out.iter()
            .map(|o| match o {
                RouteOutcome::Applied => 1,
                RouteOutcome::Unchanged => 0,
                RouteOutcome::Failed(e) => -e.errno,
            })
            .collect()
    }

    /// Each route of a batch is judged as `route add` would judge it alone; the good ones
    /// land in one table change, `Check` changes nothing, `Del` removes what is there.
    #[test]
    fn a_batch_judges_each_route_alone() {
        let mut n = node();
        let now = Instant::from_secs(2);
        let gw = "10.0.0.2@o2ib";
        let batch = [
            route("o2ib5", gw, Some(1)),
            // To our own net: EEXIST, as lnet_add_route says of a local net.
            route("o2ib", gw, None),
            // Through a gateway on no net of ours: EHOSTUNREACH.
            route("o2ib6", "10.0.0.2@tcp", None),
            // Twice in the document, the same: already so the second time.
            route("o2ib5", gw, Some(1)),
            route("o2ib7", gw, None),
        ];
        let run = |n: &mut LnetNode, routes: &[RouteConfig], op, adding: &[Nid]| {
            apply_routes(now, n, &RouteBatch { routes, op, adding })
        };
        let out = run(&mut n, &batch, RoutesOp::Add, &[]);
        assert_eq!(errnos(&out), [1, -17, -113, 0, 1]);
        assert_eq!(n.routes().routes().count(), 2);
        // The same net and gateway with another hop count: EEXIST, as `route add`.
        let other = [route("o2ib5", gw, Some(2))];
        assert_eq!(errnos(&run(&mut n, &other, RoutesOp::Add, &[])), [-17]);
        // --show: a gateway on a net the document adds is judged as if it were there; nothing
        // changes.
        let tcp = [route("o2ib6", "10.0.0.2@tcp", None)];
        let adding = [nid("10.0.0.1@tcp")];
        assert_eq!(errnos(&run(&mut n, &tcp, RoutesOp::Check, &adding)), [1]);
        assert_eq!(errnos(&run(&mut n, &tcp, RoutesOp::Check, &[])), [-113]);
        assert_eq!(n.routes().routes().count(), 2);
        let del = [route("o2ib5", gw, Some(1)), route("o2ib9", gw, None)];
        assert_eq!(errnos(&run(&mut n, &del, RoutesOp::Del, &[])), [1, -2]);
        let left: Vec<String> = n.routes().routes().map(|r| r.net.to_string()).collect();
        assert_eq!(left, ["o2ib7"]);
    }
}
