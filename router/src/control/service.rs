//! [`Control`]: answers requests against an [`LnetNode`], the daemon's (driven by its loop, with
//! a token to route each reply) or one in this process ([`call_local`], what `lnetctl ping` does
//! when no daemon runs). Show commands are answered at once; a ping is answered when its
//! [`LnetEvent::PingDone`]s arrive through [`Control::on_event`].

use std::collections::HashMap;

use lnd::time::{Duration, Instant};
use lnd::wire::Nid;
use tracing::warn;

use super::protocol::*;
use super::views::{
    conn_show, global_show, net_show, peer_show, route_add, route_del, route_show, routing_show,
    set_buffers, set_router_checks, stats_show, NiExtras,
};
use crate::{LnetError, LnetEvent, LnetNode, PingId};

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
            // What only the daemon around a node can do, asked of a bare node.
            Request::CaptureStart { .. } | Request::CaptureStop { .. } => {
                Response::Error(daemon_only(
                    "capture needs the lnet-router daemon (its driver streams the records)",
                ))
            }
            Request::Selftest { .. } => Response::Error(daemon_only(
                "selftest needs the lnet-router daemon (its NI loops run the selftest)",
            )),
            Request::Import { .. } => Response::Error(daemon_only(
                "import needs the lnet-router daemon (it reads the document as its config)",
            )),
            Request::NetDel { .. } => Response::Error(daemon_only(
                "net del needs the lnet-router daemon (it runs the NIs)",
            )),
            Request::LnetConfigure { .. } => Response::Error(daemon_only(
                "lnet configure needs the lnet-router daemon (it runs the NIs)",
            )),
            Request::PeerShow { nid, verbose } => match peer_show(node, nid.as_deref(), verbose) {
                Ok(p) => Response::Peer(p),
                Err(e) => Response::Error(e),
            },
            Request::ConnShow => Response::Conn(conn_show(node, now)),
            Request::StatsShow => Response::Stats(stats_show(node)),
            Request::StatsReset => {
                node.reset_stats();
                Response::Done
            }
            Request::GlobalShow => Response::Global(global_show(node)),
            Request::RouteShow {
                net,
                gateway,
                verbose,
            } => match route_show(node, net.as_deref(), gateway.as_deref(), verbose) {
                Ok(r) => Response::Route(r),
                Err(e) => Response::Error(e),
            },
            Request::RouteAdd {
                net,
                gateway,
                hop,
                priority,
            } => match route_add(now, node, &net, &gateway, hop, priority) {
                Ok(()) => Response::Done,
                Err(e) => Response::Error(e),
            },
            Request::RouteDel { net, gateway } => {
                match route_del(now, node, &net, gateway.as_deref()) {
                    Ok(()) => Response::Done,
                    Err(e) => Response::Error(e),
                }
            }
            Request::RoutingShow => Response::Routing(routing_show(node)),
            Request::DebugRecovery { local } => Response::Recovery(RecoveryShow {
                local,
                nids: node
                    .recovery_queue(local)
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            }),
            Request::SetGlobals { values } => match node.set_globals(&values) {
                Ok(()) => Response::Done,
                Err(e) => Response::Error(ControlError::new(e.errno(), e.to_string())),
            },
            Request::SetRouting { enable } => {
                node.set_routing(now, enable);
                Response::Done
            }
            Request::SetBuffers { pool, count } => match set_buffers(now, node, &pool, count) {
                Ok(()) => Response::Done,
                Err(e) => Response::Error(e),
            },
            Request::SetRouterChecks {
                alive_router_check_interval,
                router_ping_timeout,
                avoid_asym_router_failure,
            } => match set_router_checks(
                now,
                node,
                alive_router_check_interval,
                router_ping_timeout,
                avoid_asym_router_failure,
            ) {
                Ok(()) => Response::Done,
                Err(e) => Response::Error(e),
            },
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
        // As LNet's ping (api-ni.c): a timeout that is not positive means the default, and
        // none is longer than the default.
        let secs = timeout_secs
            .filter(|&t| t > 0)
            .unwrap_or(MAX_PING_TIMEOUT_SECS)
            .min(MAX_PING_TIMEOUT_SECS);
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
        LnetError::NoRoute(_) | LnetError::PeerDown(_) => errno::EHOSTUNREACH,
        LnetError::PayloadTooLarge { .. } => errno::EMSGSIZE,
        LnetError::Timeout | LnetError::Lnd(TxError::Timeout) => errno::ETIMEDOUT,
        LnetError::Lnd(TxError::ConnectFailed | TxError::ConnectRefused) => errno::ECONNREFUSED,
        LnetError::Lnd(TxError::PeerUnreachable) => errno::EHOSTUNREACH,
        LnetError::Shutdown | LnetError::Lnd(TxError::Shutdown) => errno::ESHUTDOWN,
        LnetError::BadReply(_) => errno::EPROTO,
        _ => errno::EIO,
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

/// The refusal of a request only the lnet-router daemon serves (EOPNOTSUPP).
fn daemon_only(what: &'static str) -> ControlError {
    ControlError::new(errno::EOPNOTSUPP, what)
}
#[cfg(test)]
mod tests {
    use super::super::testutil::node;
    use super::*;
    use crate::NodeConfig;

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
            let back: Response = decode_response(line.as_bytes()).unwrap();
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

    /// The operator audit: `ping --timeout 0` failed after 1 s; in lnetctl 2.16 a timeout
    /// that is not positive leaves LNet's default (180 s).
    #[test]
    fn ping_timeout_zero_means_the_default() {
        let outcome_at = |timeout_secs, at| {
            let mut n = node();
            let mut c: Control<u8> = Control::default();
            let req = Request::Ping {
                nids: vec!["10.0.0.2@o2ib".into()],
                timeout_secs,
                source: None,
            };
            assert!(c.handle(Instant::from_secs(2), &mut n, req, 9).is_none());
            while n.poll_action().is_some() {}
            n.handle_timeout(Instant::from_secs(at));
            let mut done = None;
            while let Some(ev) = n.poll_event() {
                done = done.or(c.on_event(&ev));
            }
            done.is_some()
        };
        // (Later, the LND's own connect timeout may end it first: not the ping's.)
        assert!(!outcome_at(Some(0), 10), "timeout 0 is not 1 s");
        assert!(!outcome_at(None, 10));
        assert!(outcome_at(Some(1), 4), "1 s is still 1 s");
        assert!(outcome_at(Some(10_000), 2 + MAX_PING_TIMEOUT_SECS + 1));
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
}
