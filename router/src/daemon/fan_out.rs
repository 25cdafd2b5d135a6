//! Control requests to the NI loops ([`Loops`]): each goes to the loops it concerns (a ping to
//! the NI on the target's net, a show to every NI) and their answers are merged; a change of
//! the node-wide settings goes to the template node, which every NI then follows.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use crate::control::{errno, ControlError, NetChange, Request, Response};
use lnd::wire::Nid;
use tracing::info;

use super::state::{lock, shutting_down, Daemon, Members};

/// The daemon as the control side reaches it: every NI's loop (as [`NiSet`](super::state::NiSet) has them now) and
/// the template node that keeps the node-wide settings.
#[derive(Clone)]
pub(super) struct Loops {
    pub(super) daemon: Arc<Daemon>,
    /// One import at a time: each compares the daemon's state with its document, then changes
    /// it; two at once would each see the other's half.
    pub(super) import: Arc<Mutex<()>>,
}

pub(super) fn no_ni() -> ControlError {
    ControlError::new(
        errno::ENETDOWN,
        "the daemon runs no NI (add one: lnetctl net add, or lnetctl import a configuration)",
    )
}

impl Loops {
    pub(super) fn members(&self) -> Arc<Members> {
        self.daemon.set.snapshot()
    }

    /// Asks the loops in `which` of `m` at once (each is woken), then waits for every answer.
    pub(super) fn ask(&self, m: &Members, which: &[usize], req: &Request) -> Vec<Response> {
        let mut pending = Vec::new();
        for &i in which {
            let (tx, rx) = mpsc::sync_channel(1);
            match m.list.get(i).map(|l| l.submit(req.clone(), tx)) {
                Some(Ok(())) => pending.push(Ok(rx)),
                Some(Err(e)) => pending.push(Err(e)),
                None => pending.push(Err(no_ni())),
            }
        }
        pending
            .into_iter()
            .map(|p| match p {
                Ok(rx) => rx.recv().unwrap_or_else(|_| shutting_down()),
                Err(e) => Response::Error(e),
            })
            .collect()
    }

    /// A request for the whole node: a ping goes to the NI on each target's net, `global show`
    /// to the first NI, the other shows to every NI, merged; a change of node-wide settings
    /// goes to the template, which every NI then follows. With no NI, the template answers.
    pub(super) fn call(&self, req: Request) -> Response {
        let peers = matches!(req, Request::NetShow { verbose: true });
        let mut resp = self.call_nodes(req);
        match &mut resp {
            // What the daemon keeps, not its nodes: where peers listen, whether selftest runs.
            Response::Net(n) if peers => {
                let mut table: Vec<_> = self
                    .daemon
                    .peers
                    .all()
                    .into_iter()
                    .map(|(nid, addr)| crate::control::PeerAddress {
                        nid: nid.to_string(),
                        address: addr.to_string(),
                    })
                    .collect();
                table.sort_by(|a, b| a.nid.cmp(&b.nid));
                n.peers = table;
            }
            Response::Global(g) => g.global.selftest = u32::from(self.daemon.base.selftest),
            _ => {}
        }
        resp
    }

    /// [`Loops::call`] as the NI loops (or the template) answer it.
    pub(super) fn call_nodes(&self, req: Request) -> Response {
        let m = self.members();
        let all: Vec<usize> = (0..m.list.len()).collect();
        match req {
            req @ (Request::RouteAdd { .. }
            | Request::RouteDel { .. }
            | Request::SetGlobals { .. }
            | Request::SetRouting { .. }
            | Request::SetBuffers { .. }
            | Request::SetRouterChecks { .. }) => self.daemon.change_settings(req),
            Request::Import { yaml, op, nets } => {
                let _one = lock(&self.import);
                // The NIs as they are once this import has the lock.
                let own = self.members().nids();
                drop(m);
                crate::control::import(
                    &yaml,
                    op,
                    nets.as_deref(),
                    &own,
                    |r| self.call(r),
                    |change| match change {
                        NetChange::Add { net, ni, doc } => {
                            self.daemon.add_ni(net, ni, doc).map(|()| 1)
                        }
                        NetChange::Del(nid) => {
                            self.daemon.del_nis(&format!("net del {nid}"), |x| x == nid)
                        }
                        NetChange::Addresses { given, apply: true } => {
                            Ok(self.daemon.peers.merge(given))
                        }
                        NetChange::Addresses {
                            given,
                            apply: false,
                        } => Ok(self.daemon.peers.differ(given)),
                    },
                    |batch| self.daemon.change_routes(&batch),
                )
            }
            Request::NetDel { net, nid } => self.net_del(net, nid),
            Request::LnetConfigure { all: false } => Response::Done,
            Request::LnetConfigure { all: true } => {
                drop(m);
                self.configure_all()
            }
            req @ (Request::Selftest { .. } | Request::CaptureStart { .. })
                if m.list.is_empty() =>
            {
                let _ = req;
                Response::Error(no_ni())
            }
            req if m.list.is_empty() => self.daemon.on_template(req),
            Request::Ping {
                nids,
                timeout_secs,
                source,
            } => self.ping(&m, nids, timeout_secs, source),
            Request::GlobalShow => self.ask(&m, &[0], &Request::GlobalShow).remove(0),
            // The console is the first NI's: one session per daemon, one console NID.
            req @ Request::Selftest { .. } => self.ask(&m, &[0], &req).remove(0),
            req => merge(self.ask(&m, &all, &req)),
        }
    }

    /// `lnet configure -a`: as Lustre's (`lnetctl lnet configure --all` configures LNet from its
    /// module parameters, its `networks` then its `routes`: LNetNIInit), what the daemon's
    /// configuration file named, as loaded at start, and no longer runs comes back: each NI as
    /// a `net add` would start it, then each route as a `route add`. What runs already is left
    /// as it is (counted unchanged), so that after `lnet unconfigure` an operator gets the
    /// router back as its file describes it, and on a running router it changes nothing.
    pub(super) fn configure_all(&self) -> Response {
        let _one = lock(&self.import);
        let base = &self.daemon.base;
        let mut report = crate::control::ImportReport {
            op: crate::control::ImportOp::Add,
            applied: 0,
            unchanged: 0,
            failed: Vec::new(),
        };
        let mut fail = |section: &str, e: &ControlError| {
            report.failed.push(crate::control::ImportFailure {
                section: section.to_string(),
                errno: -e.errno,
                descr: e.message.clone(),
                line: None,
            });
        };
        let mut applied = 0;
        let mut unchanged = 0;
        for (net, ni) in base.nis() {
            if self.members().list.iter().any(|x| x.nid == ni.ni.nid) {
                unchanged += 1;
                continue;
            }
            match self.daemon.add_ni(net, ni, base) {
                Ok(()) => applied += 1,
                Err(e) => fail("net", &e),
            }
        }
        for r in base.routes.iter().map(|r| r.route) {
            let known = lock(&self.daemon.template)
                .routes()
                .routes()
                .any(|x| x.net == r.net && x.gateway == r.gateway);
            if known {
                unchanged += 1;
                continue;
            }
            let req = Request::RouteAdd {
                net: r.net.to_string(),
                gateway: r.gateway.to_string(),
                hop: r.hops.map(i64::from),
                priority: Some(r.priority),
            };
            match self.daemon.change_settings(req) {
                Response::Done => applied += 1,
                Response::Error(e) => fail("route", &e),
                other => fail(
                    "route",
                    &ControlError::new(errno::EIO, format!("unexpected answer {other:?}")),
                ),
            }
        }
        report.applied = applied;
        report.unchanged = unchanged;
        if applied > 0 {
            info!(
                applied,
                unchanged, "lnet configure -a: the configuration's NIs and routes back"
            );
        }
        Response::Import(report)
    }

    /// `net del --net NET` (every NI of it) or `--nid NID`.
    pub(super) fn net_del(&self, net: Option<String>, nid: Option<String>) -> Response {
        let bad = |what: &str, v: &str| {
            Response::Error(ControlError::new(
                errno::EINVAL,
                format!("net del: bad {what} '{}'", crate::text::excerpt(v, 64)),
            ))
        };
        let r = match (net, nid) {
            (_, Some(nid)) => match nid.trim().parse::<Nid>() {
                Ok(n) if n == Nid::LO_0 => {
                    return Response::Error(ControlError::new(
                        errno::EINVAL,
                        "net del: lo cannot be removed",
                    ))
                }
                Ok(n) => self.daemon.del_nis(&format!("net del {n}"), |x| x == n),
                Err(_) => return bad("NID", &nid),
            },
            // lo is LNet's own (lnet_dyn_del_net refuses LOLND with EINVAL).
            (Some(net), None) if net.trim() == "lo" => {
                return Response::Error(ControlError::new(
                    errno::EINVAL,
                    "net del: lo cannot be removed",
                ))
            }
            (Some(net), None) => match net.trim().parse::<lnd::wire::Net>() {
                Ok(n) => self
                    .daemon
                    .del_nis(&format!("net del {n}"), |x| x.net() == n),
                Err(_) => return bad("net", &net),
            },
            (None, None) => {
                return Response::Error(ControlError::new(
                    errno::EINVAL,
                    "net del: give the net or the NID",
                ))
            }
        };
        match r {
            Ok(_) => Response::Done,
            Err(e) => Response::Error(e),
        }
    }

    /// The loop that sends to `t`: the NI on its net; for a remote net, the NI on the net of
    /// one of its routes' gateways (the first such route; that loop's node then picks the
    /// best of its routes); else the first.
    pub(super) fn loop_for(&self, m: &Members, t: Nid) -> usize {
        if t == Nid::LO_0 || m.list.iter().any(|l| l.nid == t) {
            return 0;
        }
        if let Some(i) = m.list.iter().position(|l| l.nid.net() == t.net()) {
            return i;
        }
        let t_net = t.net();
        let template = lock(&self.daemon.template);
        template
            .routes()
            .to_net(t_net)
            .iter()
            .find_map(|r| m.list.iter().position(|l| l.nid.net() == r.gateway.net()))
            .unwrap_or(0)
    }

    /// Each target pinged by the loop of the NI on its net (our own NIDs and `0@lo` by the
    /// first, which knows them all), all at once: one request per loop carrying all of its
    /// targets (a request per NID filled the loop's control queue at 64: the operator audit's
    /// 70-NID ping was "busy"); the answers in the order asked.
    pub(super) fn ping(
        &self,
        m: &Members,
        nids: Vec<String>,
        timeout_secs: Option<u64>,
        source: Option<String>,
    ) -> Response {
        let targets: Result<Vec<Nid>, _> = nids.iter().map(|s| s.trim().parse::<Nid>()).collect();
        let targets = match targets {
            Ok(t) if !t.is_empty() => t,
            // The first loop says what is wrong with the request, as a single node would.
            _ => {
                let req = Request::Ping {
                    nids,
                    timeout_secs,
                    source,
                };
                return self.ask(m, &[0], &req).remove(0);
            }
        };
        let by_loop: Vec<usize> = targets.iter().map(|t| self.loop_for(m, *t)).collect();
        let mut groups: Vec<(usize, Vec<Nid>)> = Vec::new();
        for (t, &i) in targets.iter().zip(&by_loop) {
            match groups.iter_mut().find(|g| g.0 == i) {
                Some(g) => g.1.push(*t),
                None => groups.push((i, vec![*t])),
            }
        }
        let pending: Vec<_> = groups
            .iter()
            .map(|(i, ts)| {
                let req = Request::Ping {
                    nids: ts.iter().map(Nid::to_string).collect(),
                    timeout_secs,
                    source: source.clone(),
                };
                let (tx, rx) = mpsc::sync_channel(1);
                m.list[*i].submit(req, tx).map(|()| rx)
            })
            .collect();
        let mut answers = Vec::new();
        for p in pending {
            let r = match p {
                Ok(rx) => rx.recv().unwrap_or_else(|_| shutting_down()),
                Err(e) => Response::Error(e),
            };
            match r {
                Response::Ping(one) => answers.push((one.ping.into_iter(), one.manage.into_iter())),
                other => return other,
            }
        }
        // Back in the order asked: a loop answers its targets in its order, each a success
        // (`ping`) or a failure naming the target (`manage`).
        let mut out = crate::control::PingShow::default();
        let mut next_fail: Vec<_> = answers.iter_mut().map(|a| a.1.next()).collect();
        for (t, i) in targets.iter().zip(by_loop) {
            let g = groups.iter().position(|g| g.0 == i).unwrap_or(0);
            if next_fail[g]
                .as_ref()
                .is_some_and(|f| f.ping == t.to_string())
            {
                out.manage.extend(next_fail[g].take());
                next_fail[g] = answers[g].1.next();
            } else {
                out.ping.extend(answers[g].0.next());
            }
        }
        for (g, a) in answers.iter_mut().enumerate() {
            out.ping.extend(a.0.by_ref());
            out.manage.extend(next_fail[g].take());
            out.manage.extend(a.1.by_ref());
        }
        Response::Ping(out)
    }
}

/// One answer from the answers of every NI loop to the same show request: the first error if
/// any, else their union (the `lo` NI once, its loopback counts summed; counters summed).
pub(super) fn merge(mut answers: Vec<Response>) -> Response {
    if let Some(i) = answers.iter().position(|r| matches!(r, Response::Error(_))) {
        // `peer show --nid` is an error on every NI but the one that knows the peer.
        if let Some(ok) = answers
            .iter()
            .position(|r| !matches!(r, Response::Error(_)))
        {
            if matches!(answers[ok], Response::Peer(_)) {
                return answers.swap_remove(ok);
            }
        }
        return answers.swap_remove(i);
    }
    let mut it = answers.into_iter();
    let Some(first) = it.next() else {
        return Response::Error(ControlError::new(errno::ESHUTDOWN, "the daemon runs no NI"));
    };
    it.fold(first, |acc, r| match (acc, r) {
        (Response::Net(mut a), Response::Net(b)) => {
            merge_nets(&mut a, b);
            Response::Net(a)
        }
        (Response::Peer(mut a), Response::Peer(b)) => {
            // A peer two of our NIs talk to (two NIs on one net) is one peer, as in Lustre:
            // one entry per primary NID (an export listed it twice, which no lnetctl loads).
            for e in b.peer {
                match a.peer.iter_mut().find(|x| x.primary_nid == e.primary_nid) {
                    Some(x) => merge_peer(x, e),
                    None => a.peer.push(e),
                }
            }
            Response::Peer(a)
        }
        (Response::Recovery(mut a), Response::Recovery(b)) => {
            a.nids.extend(b.nids);
            Response::Recovery(a)
        }
        (Response::Conn(mut a), Response::Conn(b)) => {
            a.conn.extend(b.conn);
            Response::Conn(a)
        }
        (Response::Stats(a), Response::Stats(b)) => Response::Stats(sum_stats(a, b)),
        (Response::Route(mut a), Response::Route(b)) => {
            // Every loop lists every route; the state comes from the loop that watches the
            // route's gateway (the others have none).
            for e in b.route {
                match a
                    .route
                    .iter_mut()
                    .find(|x| x.net == e.net && x.gateway == e.gateway)
                {
                    Some(x) => {
                        if x.state.is_none() {
                            x.state = e.state;
                        }
                    }
                    None => a.route.push(e),
                }
            }
            Response::Route(a)
        }
        (Response::Routing(mut a), Response::Routing(b)) => {
            merge_routing(&mut a, b);
            Response::Routing(a)
        }
        (a, _) => a,
    })
}

/// Every NI's nets as one `net show`: an NI's net joins the entry of its type, and the
/// loopback NI's counters are summed into one `lo`.
fn merge_nets(a: &mut crate::control::NetShow, b: crate::control::NetShow) {
    // Every tcp NI has the same acceptor settings: the first NI that has any says them.
    a.acceptor = a.acceptor.take().or(b.acceptor);
    for e in b.net {
        if e.net_type == "lo" {
            if let (Some(lo), Some(x)) = (
                a.net.iter_mut().find(|n| n.net_type == "lo"),
                e.local_nis.first(),
            ) {
                if let (Some(s), Some(t)) = (
                    lo.local_nis.first_mut().and_then(|n| n.statistics.as_mut()),
                    x.statistics.as_ref(),
                ) {
                    s.send_count += t.send_count;
                    s.recv_count += t.recv_count;
                    s.drop_count += t.drop_count;
                }
            }
            continue;
        }
        match a.net.iter_mut().find(|n| n.net_type == e.net_type) {
            Some(n) => n.local_nis.extend(e.local_nis),
            None => a.net.push(e),
        }
    }
}

/// Every NI's `routing show` as one: each NI's CPTs listed, the forwarding counters summed.
fn merge_routing(a: &mut crate::control::RoutingShow, b: crate::control::RoutingShow) {
    a.cpts.extend(b.cpts);
    a.enable = a.enable.max(b.enable);
    let (x, y) = (&mut a.forwarding, &b.forwarding);
    x.received += y.received;
    x.forwarded += y.forwarded;
    x.forwarded_bytes += y.forwarded_bytes;
    x.in_flight += y.in_flight;
    x.dropped += y.dropped;
    for (slot, (_, n)) in x.dropped_by_reason.iter_mut().zip(&y.dropped_by_reason) {
        slot.1 += n;
    }
    x.waited_rtr_credit += y.waited_rtr_credit;
    x.waited_buffer += y.waited_buffer;
    x.waited_unproven += y.waited_unproven;
    x.scrubbed += y.scrubbed;
    x.scrubbed_bytes += y.scrubbed_bytes;
}

/// Two NI loops' views of one peer, as one: its peer NIs by NID, each up if either loop has
/// it up; their counters and credits added (each loop keeps its own credits towards the peer
/// NI, so together they bound what is in flight to it); the lower health and the sooner
/// recovery ping.
pub(super) fn merge_peer(a: &mut crate::control::PeerEntry, b: crate::control::PeerEntry) {
    a.multi_rail |= b.multi_rail;
    for n in b.peer_ni {
        let Some(x) = a.peer_ni.iter_mut().find(|x| x.nid == n.nid) else {
            a.peer_ni.push(n);
            continue;
        };
        if n.state == "up" || x.state == "NA" {
            x.state = n.state;
        }
        match (&mut x.detail, n.detail) {
            (Some(d), Some(e)) => {
                d.max_ni_tx_credits += e.max_ni_tx_credits;
                d.available_tx_credits += e.available_tx_credits;
                d.min_tx_credits += e.min_tx_credits;
                d.tx_q_num_of_buf += e.tx_q_num_of_buf;
                d.available_rtr_credits += e.available_rtr_credits;
                d.min_rtr_credits += e.min_rtr_credits;
                let (c, f) = (&mut d.statistics, &e.statistics);
                c.send_count += f.send_count;
                c.recv_count += f.recv_count;
                c.drop_count += f.drop_count;
                let (h, g) = (&mut d.health_stats, &e.health_stats);
                h.health_value = h.health_value.min(g.health_value);
                h.dropped += g.dropped;
                h.timeout += g.timeout;
                h.error += g.error;
                h.network_timeout += g.network_timeout;
                h.ping_count += g.ping_count;
                h.next_ping = match (h.next_ping, g.next_ping) {
                    (0, t) | (t, 0) => t,
                    (s, t) => s.min(t),
                };
            }
            (None, Some(e)) => x.detail = Some(e),
            _ => {}
        }
    }
}

/// Two NI loops' `stats show`, added field by field ([`crate::stats::sum_counters`], so a
/// counter added to either struct is summed too).
pub(super) fn sum_stats(
    a: crate::control::StatsShow,
    b: crate::control::StatsShow,
) -> crate::control::StatsShow {
    crate::stats::sum_counters(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operator's audit: a daemon with two NIs on one net listed each peer once per NI in
    /// `peer show` and `export` (an export no lnetctl loads). One entry per primary NID, the
    /// two loops' counters and credits added.
    #[test]
    fn a_peer_two_nis_talk_to_is_shown_once() {
        use crate::control::{
            Counts, PeerEntry, PeerHealthShow, PeerNiDetail, PeerNiEntry, PeerShow,
        };
        let entry = |nid: &str, state: &str, sent: u64, health: u32| PeerEntry {
            primary_nid: nid.into(),
            multi_rail: false,
            peer_ni: vec![PeerNiEntry {
                nid: nid.into(),
                state: state.into(),
                detail: Some(PeerNiDetail {
                    max_ni_tx_credits: 8,
                    available_tx_credits: 8,
                    min_tx_credits: 7,
                    tx_q_num_of_buf: 0,
                    available_rtr_credits: 8,
                    min_rtr_credits: 8,
                    statistics: Counts {
                        send_count: sent,
                        recv_count: sent,
                        drop_count: 0,
                    },
                    health_stats: PeerHealthShow {
                        health_value: health,
                        ..PeerHealthShow::default()
                    },
                }),
            }],
        };
        let a = Response::Peer(PeerShow {
            peer: vec![entry("10.0.0.254@o2ib", "NA", 3, 1000)],
        });
        let b = Response::Peer(PeerShow {
            peer: vec![
                entry("10.0.0.254@o2ib", "up", 4, 900),
                entry("10.0.0.9@o2ib", "up", 1, 1000),
            ],
        });
        let Response::Peer(m) = merge(vec![a, b]) else {
            panic!("not a peer show")
        };
        assert_eq!(m.peer.len(), 2, "{m:?}");
        let p = &m.peer[0];
        assert_eq!(
            (p.primary_nid.as_str(), p.peer_ni.len()),
            ("10.0.0.254@o2ib", 1)
        );
        let n = &p.peer_ni[0];
        assert_eq!(n.state, "up");
        let d = n.detail.as_ref().unwrap();
        assert_eq!((d.statistics.send_count, d.max_ni_tx_credits), (7, 16));
        assert_eq!(d.health_stats.health_value, 900);
    }
}
