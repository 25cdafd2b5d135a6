//! The daemon's NIs and node-wide settings changed at run time: a loop made and started for an
//! NI (`net add`, an import), NIs stopped (`net del`), settings judged by the template node,
//! then adopted by every loop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use crate::alive::NetAlive;
use crate::bulk_pool::MAX_BULK_BUFFERS;
use crate::control::{errno, Control, ControlError, NiExtras, Request, Response};
use crate::relay::{ChannelLink, Relay};
use crate::runtime::NiRuntime;
use crate::selftest::Selftest;
use crate::yaml_config::{DaemonConfig, FabricKind};
use crate::{Handover, LnetNode};
use lnd::driver::{LndDriver, WakeHandle};
use lnd::wire::Nid;
use tracing::{error, info, warn};

use super::args::NiThreads;
use super::capture::LoopCapture;
use super::config::{choose_fabric, extras_of, listen_of, listens_clash};
use super::events::PeerLog;
use super::fabric::{fabric_supported, start_fabric};
use super::handovers::{Handovers, MemberLinks};
use super::metrics::snapshot::LoopMetrics;
use super::ni_loop::{LoopBulk, NiLoop};
use super::selftest::NiSelftest;
use super::state::{
    lock, ControlMsg, Daemon, Member, NiThread, NodeSettings, ADOPT_BOUND, SHUTDOWN_BOUND,
};

/// Control requests that may wait for the loop at once.
pub(super) const CONTROL_QUEUE: usize = 64;
/// Handovers (forwarded messages and their releases) that may wait for an NI's loop at once.
/// A full channel never blocks the sender: what does not fit waits in the sender's outbox
/// (bounded by its router buffers) and goes at its next turn.
pub(super) const HANDOVER_QUEUE: usize = 4096;
impl Daemon {
    /// A loop for `rt`, and the member the others reach it by.
    pub(super) fn make_loop(
        self: &Arc<Self>,
        rt: NiRuntime<Box<dyn LndDriver + Send>>,
        wake: WakeHandle,
        kind: FabricKind,
        extras: NiExtras,
    ) -> (NiLoop, Member) {
        let nid = rt.node().nids()[0];
        let id = self.next_loop.fetch_add(1, Ordering::Relaxed);
        let (tx, req_rx) = mpsc::sync_channel::<ControlMsg>(CONTROL_QUEUE);
        let (hand_tx, hand_rx) = crossbeam_channel::bounded::<Handover>(HANDOVER_QUEUE);
        let stop = Arc::new(AtomicBool::new(false));
        let adopted = Arc::new(AtomicU64::new(0));
        let running = Arc::new(AtomicBool::new(true));
        let metrics = LoopMetrics::new(self.base.metrics.map(|m| m.top_peers));
        let member = Member {
            nid,
            id,
            kind,
            listen: extras.listen,
            ctl: tx,
            wake: wake.clone(),
            hand: ChannelLink {
                tx: hand_tx,
                wake: (self.threading == NiThreads::PerNi).then(|| wake.clone()),
            },
            stop: Arc::clone(&stop),
            adopted: Arc::clone(&adopted),
            running: Arc::clone(&running),
            metrics: Arc::clone(&metrics.slot),
        };
        let incarnation = rt
            .node()
            .endpoint(crate::NiIndex(0))
            .map_or(0, |e| e.incarnation());
        let l = NiLoop {
            nid,
            rt,
            kind,
            control: Control::new(vec![extras]),
            req_rx,
            hands: Handovers {
                rx: hand_rx,
                links: MemberLinks::default(),
                relay: Relay::new(),
            },
            daemon: Arc::clone(self),
            adopted,
            running,
            applied: None,
            stop,
            removed_at: None,
            shutdown_deadline: None,
            failed: false,
            capture: LoopCapture::default(),
            peer_log: PeerLog::default(),
            bulk: LoopBulk::new(id),
            metrics,
            lst: NiSelftest {
                st: self.base.selftest.then(|| {
                    Selftest::new(
                        crate::NiIndex(0),
                        nid,
                        incarnation,
                        crate::selftest::DEFAULT_BUFFER_LIMIT,
                    )
                }),
                pending: HashMap::new(),
            },
        };
        (l, member)
    }

    /// Runs `l` on a thread of its own, unless a stop was asked.
    pub(super) fn spawn(&self, l: NiLoop) -> Result<(), String> {
        let nid = l.nid;
        let mut threads = lock(&self.set.threads);
        if self.shared.stop.load(Ordering::Relaxed) {
            return Err("the daemon is shutting down".into());
        }
        let t = std::thread::Builder::new()
            .name(format!("ni {nid}"))
            .spawn(move || l.run())
            .map_err(|e| format!("cannot start the thread of NI {nid}: {e}"))?;
        threads.push(NiThread {
            nid: Some(nid),
            handle: t,
        });
        Ok(())
    }

    pub(super) fn fixed_nis(&self, what: &str) -> Option<ControlError> {
        (self.threading == NiThreads::Shared).then(|| {
            ControlError::new(
                errno::EOPNOTSUPP,
                format!(
                    "{what}: this daemon runs every NI on one thread (--ni-threads shared), \
                     fixed at start; change its configuration and restart it, or run it \
                     with --ni-threads per-ni"
                ),
            )
        })
    }

    /// The template node answers `req` (in the calling thread: it has no fabric).
    pub(super) fn on_template(&self, req: Request) -> Response {
        let clock = self.clock;
        crate::control::call_local(&mut lock(&self.template), req, || clock.now())
    }

    /// A change of the node-wide settings (`route add|del`, `set`, `routing`, buffers): the
    /// template checks and keeps it (its answer is the answer), then every NI adopts the
    /// settings as they now are. One change at a time, and never halfway through an NI's
    /// start, so that no NI misses one.
    pub(super) fn change_settings(&self, req: Request) -> Response {
        let _one = lock(&self.set.change);
        if let Some(e) = self.beyond_registered(&req) {
            return Response::Error(e);
        }
        let resp = self.on_template(req);
        if matches!(resp, Response::Done) {
            let m = self.set.snapshot();
            self.publish(m.list.clone(), m.leaving.clone(), m.board.clone());
        }
        resp
    }

    /// An import's routes as one change of the node-wide settings: the template judges and
    /// takes each ([`crate::control::apply_routes`]), then every NI adopts them in one publish (a
    /// publish per route, each waiting for every loop, cost 1-2 ms a route). Other clients
    /// are served meanwhile: only changes of the settings wait for this one.
    pub(super) fn change_routes(
        &self,
        batch: &crate::control::RouteBatch<'_>,
    ) -> Vec<crate::control::RouteOutcome> {
        let _one = lock(&self.set.change);
        let now = self.clock.now();
        let out = crate::control::apply_routes(now, &mut lock(&self.template), batch);
        let changed = out.contains(&crate::control::RouteOutcome::Applied);
        if changed && batch.op != crate::control::RoutesOp::Check {
            let m = self.set.snapshot();
            self.publish(m.list.clone(), m.leaving.clone(), m.board.clone());
        }
        out
    }

    /// `set large_buffers N` above what the daemon registers ([`MAX_BULK_BUFFERS`]): refused
    /// with ENOMEM, as Lustre's `set large_buffers` is when it cannot allocate them
    /// (lnet_rtrpools_adjust), naming the cap, rather than accepted and capped where only the
    /// log would say so.
    pub(super) fn beyond_registered(&self, req: &Request) -> Option<ControlError> {
        let Request::SetBuffers { pool, count } = req else {
            return None;
        };
        let cap = MAX_BULK_BUFFERS;
        (pool.trim_end_matches("_buffers") == "large" && *count > cap).then(|| {
            ControlError::new(
                errno::ENOMEM,
                format!(
                    "large_buffers: {count} is more than the {cap} this daemon registers (each \
                     is 1 MiB of memory registered with every NI's fabric, pinned on verbs): \
                     set at most {cap}"
                ),
            )
        })
    }

    /// `net add` (an import's new NI): starts NI `ni` of `net` on its own thread with the
    /// node-wide settings as they are, and tells every other loop its NID. As
    /// lnet_add_net_common: a NID already running is EEXIST, and a net that a route leads to
    /// is EUSERS (adding it would invalidate the routing configuration). The NI registers the
    /// router buffers for bulk data before the answer (the publish's rounds), so it forwards
    /// bulk at once.
    pub(super) fn add_ni(
        self: &Arc<Self>,
        net: &crate::yaml_config::NetSettings,
        ni: &crate::yaml_config::NiSettings,
        doc: &DaemonConfig,
    ) -> Result<(), ControlError> {
        let nid = ni.ni.nid;
        let what = format!("net add {nid}");
        if let Some(e) = self.fixed_nis(&what) {
            return Err(e);
        }
        let _one = lock(&self.set.change);
        let m = self.set.snapshot();
        if m.list.iter().any(|x| x.nid == nid) {
            return Err(ControlError::new(
                errno::EEXIST,
                format!("{what}: the NI exists"),
            ));
        }
        if let Some(e) = self.routes_through(&what, nid) {
            return Err(e);
        }
        let mut nids = m.nids();
        nids.push(nid);
        let board = m.board.carried(&m.nids(), &nids);
        let incarnation = self.next_incarnation.fetch_add(1, Ordering::Relaxed);
        let mut net = net.clone();
        let mut ni = ni.clone();
        // A `tcp` NI added at run time takes the daemon's acceptor (its port, its `accept`)
        // unless the document gave one of its own.
        if let crate::LndSettings::Sock(s) = &mut ni.ni.lnd {
            let acceptor = if doc.given.acceptor {
                &doc.acceptor
            } else {
                &self.base.acceptor
            };
            crate::yaml_config::apply_acceptor(acceptor, s);
        }
        let ni = &ni;
        net.nis = vec![ni.clone()];
        let node_cfg = self.added_node_config(&net, incarnation, &nids, &board);
        if !net.fabric_given {
            choose_fabric(&mut net);
        }
        if !fabric_supported(net.fabric) {
            return Err(ControlError::new(
                errno::EINVAL,
                format!(
                    "{what}: fabric '{}' is not available in this lnet-router",
                    net.fabric.as_str()
                ),
            ));
        }
        // Another NI of ours on its listen address: refused at once (binding it would wait
        // 10 s for an address that is not going away).
        let listen = listen_of(ni);
        if let Some(other) = m
            .list
            .iter()
            .find(|x| x.kind == net.fabric && x.listen.is_some_and(|a| listens_clash(a, listen)))
        {
            return Err(ControlError::new(
                errno::EADDRINUSE,
                format!(
                    "{what}: NI {} of this daemon already listens on {listen} (give another \
                     --listen address or port)",
                    other.nid
                ),
            ));
        }
        // Where peers listen: every document's `peers:` so far, this one's last.
        self.peers.merge(&doc.peers);
        let stopping = || self.shared.stop.load(Ordering::Relaxed);
        let f = start_fabric(&self.peers, net.fabric, ni, &stopping).map_err(|e| {
            // start_fabric names the NI ("NI NID: ..."), which `what` names already.
            let e = e.strip_prefix(&format!("NI {nid}: ")).unwrap_or(&e);
            ControlError::new(errno::EADDRNOTAVAIL, format!("{what}: {e}"))
        })?;
        let node = LnetNode::new(node_cfg, self.clock.now());
        let (rt, wake) = NiRuntime::new(node, f.driver, self.clock)
            .map_err(|e| ControlError::new(errno::EIO, format!("{what}: {e}")))?;
        let (l, member) = self.make_loop(rt, wake, f.kind, extras_of(ni, f.listen));
        // Running first, published next: nobody hands it anything before it runs, and a
        // failed start leaves nothing to undo. Its first turn may adopt the set without it
        // (its own NID stays its own), then this one.
        self.spawn(l)
            .map_err(|e| ControlError::new(errno::ESHUTDOWN, format!("{what}: {e}")))?;
        lock(&self.template).set_node_nids(nids, board.clone());
        let mut list = m.list.clone();
        list.push(member);
        self.publish(list, m.leaving.clone(), board);
        info!(%nid, fabric = f.kind.as_str(), listen = %f.listen, "NI added");
        Ok(())
    }

    /// A route that leads to `nid`'s net, or through `nid`: adding the NI would invalidate it,
    /// so `net add` is refused with EUSERS, as lnet_add_net_common refuses it.
    fn routes_through(&self, what: &str, nid: Nid) -> Option<ControlError> {
        let t = lock(&self.template);
        let why = if !t.routes().to_net(nid.net()).is_empty() {
            Some(format!("a route leads to {}", nid.net()))
        } else {
            t.routes()
                .routes()
                .find(|r| r.gateway == nid)
                .map(|r| format!("it is the gateway of the route to {}", r.net))
        };
        why.map(|why| {
            ControlError::new(
                errno::EUSERS,
                format!(
                    "{what}: {why}; adding it would invalidate the routing configuration \
                     (delete the route first)"
                ),
            )
        })
    }

    /// The node of an NI added on `net` (its one NI), knowing `nids` on `board`: the node as
    /// it is now; the loop adopts the settings again at its first turn.
    fn added_node_config(
        &self,
        net: &crate::yaml_config::NetSettings,
        incarnation: u64,
        nids: &[Nid],
        board: &NetAlive,
    ) -> crate::NodeConfig {
        let t = lock(&self.template);
        let settings = NodeSettings::of(&t);
        let single = DaemonConfig {
            nets: vec![net.clone()],
            ..self.base.clone()
        };
        let mut c = single.node_config(incarnation);
        c.routes = settings.routes;
        c.globals = settings.globals;
        c.gateway_health = settings.gateway_health;
        c.routing = crate::RoutingConfig {
            enabled: settings.routing,
            buffers: settings.buffers.share(nids.len()),
            ..c.routing
        };
        c.node_nids = nids.to_vec();
        c.net_alive = Some(board.clone());
        c
    }

    /// `net del`: stops the NIs `which` picks, after every other loop has stopped counting on
    /// them, each closing its connections gracefully (within the shutdown bound); returns how
    /// many. When a net loses its last NI, the routes through it go too, as in Lustre
    /// (lnet_shutdown_lndnet -> lnet_peer_tables_cleanup deletes the routes of the gateways on
    /// that net).
    pub(super) fn del_nis(
        &self,
        what: &str,
        which: impl Fn(Nid) -> bool,
    ) -> Result<usize, ControlError> {
        if let Some(e) = self.fixed_nis(what) {
            return Err(e);
        }
        let _one = lock(&self.set.change);
        let m = self.set.snapshot();
        let (gone, stay): (Vec<Member>, Vec<Member>) =
            m.list.iter().cloned().partition(|x| which(x.nid));
        if gone.is_empty() {
            return Err(ControlError::new(
                errno::ENOENT,
                format!("{what}: no such NI"),
            ));
        }
        let nids: Vec<Nid> = stay.iter().map(|x| x.nid).collect();
        let board = m.board.carried(&m.nids(), &nids);
        let dead: Vec<crate::RouteConfig> = lock(&self.template)
            .routes()
            .routes()
            .filter(|r| !nids.iter().any(|n| n.net() == r.gateway.net()))
            .copied()
            .collect();
        for r in dead {
            let _ = self.on_template(Request::RouteDel {
                net: r.net.to_string(),
                gateway: Some(r.gateway.to_string()),
            });
            info!(net = %r.net, gateway = %r.gateway, "route removed with the last NI of its gateway's net");
        }
        lock(&self.template).set_node_nids(nids, board.clone());
        let mut leaving = m.leaving.clone();
        leaving.extend(gone.iter().cloned());
        self.publish(stay, leaving, board);
        for g in &gone {
            g.stop.store(true, Ordering::Release);
            g.wake.wake();
        }
        // Each ends within the shutdown bound; waited for here so that the NID and its port are
        // free when the answer comes (a `net add` of it may follow at once). The handle stays
        // in the list until it is joined, so a stop meanwhile still waits for it.
        let bound = StdDuration::from_nanos(SHUTDOWN_BOUND.as_nanos()) + ADOPT_BOUND * 2;
        let started = std::time::Instant::now();
        for g in &gone {
            self.join_removed(g, started, bound);
            info!(nid = %g.nid, "NI removed");
        }
        // Ended: owed nothing more.
        let m = self.set.snapshot();
        let leaving: Vec<Member> = m
            .leaving
            .iter()
            .filter(|x| x.running.load(Ordering::Acquire))
            .cloned()
            .collect();
        if leaving.len() != m.leaving.len() {
            self.publish(m.list.clone(), leaving, m.board.clone());
        }
        Ok(gone.len())
    }

    /// Waits (until `started` + `bound`) for the thread of `g`, an NI removed, to end, and
    /// joins it; one the main thread joined already (a stop) is not waited for.
    fn join_removed(&self, g: &Member, started: std::time::Instant, bound: StdDuration) {
        loop {
            let finished = {
                let mut threads = lock(&self.set.threads);
                let i = threads.iter().position(|t| t.nid == Some(g.nid));
                match i {
                    Some(i) if threads[i].handle.is_finished() => {
                        Some(Some(threads.swap_remove(i)))
                    }
                    Some(_) => None,
                    // The main thread joined it (a stop).
                    None => Some(None),
                }
            };
            match finished {
                Some(Some(t)) => {
                    if t.handle.join().is_err() {
                        error!(nid = %g.nid, "the thread of the NI removed panicked");
                    }
                    break;
                }
                Some(None) => break,
                None if started.elapsed() >= bound => {
                    warn!(nid = %g.nid, "the NI removed has not finished closing; left to end by itself");
                    break;
                }
                None => std::thread::sleep(StdDuration::from_millis(5)),
            }
        }
    }
}
