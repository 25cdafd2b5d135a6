//! Shared by the verbs_* examples (included with `#[path]`): an engine endpoint on a verbs
//! fabric that records what happens, a loop that turns several of them, and payload checks.
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use lnd::driver::verbs::{turn, MonotonicClock, VerbsConfig, VerbsFabric};
use lnd::engine::{DownReason, Endpoint, EndpointConfig, LndEvent, RdmaSink, RxToken, TxError};
use lnd::fabric::{ConnId, LocalFrag};
use lnd::iface::Lnd;
use lnd::time::Instant;
use lnd::wire::{LnetHdr, Nid, RejectReason};

/// One endpoint on its own verbs fabric, and what it saw.
pub struct Node {
    pub name: String,
    pub fabric: VerbsFabric,
    pub ep: Endpoint,
    pub clock: MonotonicClock,
    /// Received payloads not yet taken, with their sender.
    pub inbox: VecDeque<(Nid, Vec<u8>)>,
    pub received: u64,
    pub sent_ok: u64,
    pub send_failed: Vec<(u64, TxError)>,
    pub ups: Vec<(Nid, std::time::Instant)>,
    pub downs: Vec<(Nid, DownReason, std::time::Instant)>,
    /// While set, received messages are kept (their slots unposted, their credits unreturned).
    pub hold: bool,
    pub held: Vec<RxToken>,
    /// How this node's "LNet" answers the next rendezvous requests (none left: nothing matched).
    pub answers: VecDeque<Answer>,
    /// Transfers into this node's memory that ended: (cookie, bytes or why not).
    pub rdma_done: Vec<(u64, Result<u32, TxError>)>,
    /// Cookies of sends and GET replies that completed ok.
    pub done_ok: Vec<u64>,
}

/// How a node answers a peer's rendezvous request.
pub enum Answer {
    /// PUT_ACK with this sink; the transfer's outcome under this cookie.
    Accept(RdmaSink, u64),
    /// Write these fragments for a GET; its outcome under this cookie.
    Reply(Vec<LocalFrag>, u64),
}

impl Node {
    /// A node `me` (incarnation `inc`) listening on `listen`; `book` maps peer NIDs to addresses.
    pub fn new(
        name: &str,
        me: Nid,
        inc: u64,
        listen: SocketAddr,
        book: HashMap<Nid, SocketAddr>,
        tune: impl FnOnce(&mut EndpointConfig),
    ) -> Result<Node, String> {
        if std::env::var_os("VERBS_LOG").is_some() {
            // Bring-up aid: every cm event and fabric action, through tracing.
            let _ = tracing_subscriber::fmt()
                .with_env_filter("lnd=trace")
                .with_writer(std::io::stderr)
                .try_init();
        }
        let cfg = VerbsConfig {
            listen,
            ..VerbsConfig::default()
        };
        let fabric = VerbsFabric::new(cfg, move |nid| book.get(&nid).copied())
            .map_err(|e| format!("{name}: {e}"))?;
        let clock = MonotonicClock::new();
        let mut ec = EndpointConfig::new(me, inc);
        tune(&mut ec);
        let ep = Endpoint::new(ec, clock.now());
        Ok(Node {
            name: name.to_string(),
            fabric,
            ep,
            clock,
            inbox: VecDeque::new(),
            received: 0,
            sent_ok: 0,
            send_failed: Vec::new(),
            ups: Vec::new(),
            downs: Vec::new(),
            hold: false,
            held: Vec::new(),
            answers: VecDeque::new(),
            rdma_done: Vec::new(),
            done_ok: Vec::new(),
        })
    }

    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    pub fn nid(&self) -> Nid {
        self.ep.nid()
    }

    /// Queues an IMMEDIATE message to `to`.
    pub fn send(&mut self, to: Nid, payload: Vec<u8>, cookie: u64) -> Result<(), String> {
        let now = self.now();
        let hdr = LnetHdr::put(self.nid(), to, payload.len() as u32, 4, 7);
        self.ep
            .send(now, to, hdr, payload, cookie)
            .map_err(|e| format!("{}: send: {e}", self.name))
    }

    /// One turn of the loop, waiting at most `wait`.
    pub fn turn(&mut self, wait: Duration) -> Result<(), String> {
        let Node {
            fabric,
            ep,
            clock,
            inbox,
            received,
            sent_ok,
            send_failed,
            ups,
            downs,
            hold,
            held,
            name,
            answers,
            rdma_done,
            done_ok,
        } = self;
        turn(fabric, ep, clock, wait, &mut |ep, now, ev| match ev {
            LndEvent::Received {
                from, payload, rx, ..
            } => {
                *received += 1;
                inbox.push_back((from, payload));
                if *hold {
                    held.push(rx);
                } else {
                    ep.recv_done(now, rx);
                }
            }
            LndEvent::SendDone { cookie, result, .. } => match result {
                Ok(()) => {
                    *sent_ok += 1;
                    done_ok.push(cookie);
                }
                Err(e) => send_failed.push((cookie, e)),
            },
            LndEvent::BulkRequest { rx, .. } => match answers.pop_front() {
                Some(Answer::Accept(sink, cookie)) => ep.accept_put_rdma(now, rx, sink, cookie),
                Some(Answer::Reply(src, cookie)) => ep.reply_get_rdma(now, rx, src, cookie),
                None => ep.recv_done(now, rx),
            },
            LndEvent::BulkDone { cookie, result, .. } => rdma_done.push((cookie, result)),
            LndEvent::PeerUp { nid } => ups.push((nid, std::time::Instant::now())),
            LndEvent::PeerDown { nid, reason } => {
                downs.push((nid, reason, std::time::Instant::now()))
            }
        })
        .map_err(|e| format!("{name}: fabric poll: {e}"))
    }

    /// Returns every held message to the engine.
    pub fn release_held(&mut self) {
        let now = self.now();
        for rx in self.held.drain(..) {
            self.ep.recv_done(now, rx);
        }
    }

    /// The established connections.
    pub fn established(&self) -> Vec<lnd::engine::ConnView> {
        self.ep
            .conns()
            .filter(|c| c.state == lnd::engine::ConnState::Established)
            .collect()
    }

    /// The established connection to `peer`.
    pub fn conn_to(&self, peer: Nid) -> Option<ConnId> {
        self.established()
            .into_iter()
            .find(|c| c.peer == peer)
            .map(|c| c.id)
    }

    pub fn rejects_sent(&self, why: RejectReason) -> u64 {
        self.ep.stats().rejects_sent[usize::from(why.code())]
    }

    pub fn rejects_received(&self, why: RejectReason) -> u64 {
        self.ep.stats().rejects_received[usize::from(why.code())]
    }

    /// Messages queued on connections (waiting for credits).
    pub fn queued_on_conns(&self) -> usize {
        self.ep.conns().map(|c| c.queued).sum()
    }
}

/// Turns every node (1 ms waits) until `done` holds; an error after `limit`.
pub fn run_until(
    nodes: &mut [&mut Node],
    limit: Duration,
    what: &str,
    mut done: impl FnMut(&mut [&mut Node]) -> bool,
) -> Result<(), String> {
    let start = std::time::Instant::now();
    loop {
        if done(nodes) {
            return Ok(());
        }
        if start.elapsed() > limit {
            let state: Vec<String> = nodes
                .iter()
                .map(|n| {
                    format!(
                        "{}: received {} sent_ok {} failed {} downs {:?} conns {:?}",
                        n.name,
                        n.received,
                        n.sent_ok,
                        n.send_failed.len(),
                        n.downs.iter().map(|d| d.1).collect::<Vec<_>>(),
                        n.ep.conns().map(|c| c.state).collect::<Vec<_>>()
                    )
                })
                .collect();
            return Err(format!(
                "{what}: not done after {limit:?} [{}]",
                state.join("; ")
            ));
        }
        for n in nodes.iter_mut() {
            n.turn(Duration::from_millis(1))?;
        }
    }
}

/// Shuts every node down gracefully and turns them until all are shut down.
pub fn shutdown_all(nodes: &mut [&mut Node], limit: Duration) -> Result<(), String> {
    for n in nodes.iter_mut() {
        let now = n.now();
        n.ep.shutdown(now);
    }
    run_until(nodes, limit, "shutdown", |ns| {
        ns.iter().all(|n| n.ep.is_shut_down())
    })?;
    // Hand the final Destroys to the fabrics.
    for n in nodes.iter_mut() {
        let now = n.now();
        while let Some(a) = n.ep.poll_action() {
            n.fabric.apply(now, a);
        }
        n.turn(Duration::ZERO)?;
    }
    Ok(())
}

/// A payload carrying its index and its sender tag, of varying size (16..=3915 bytes).
pub fn payload(tag: u64, i: u64) -> Vec<u8> {
    let len = 16 + (i as usize * 37) % 3900;
    let mut p: Vec<u8> = (0..len).map(|k| (k as u64 ^ i ^ tag) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p[8..16].copy_from_slice(&tag.to_le_bytes());
    p
}

/// The index of a [`payload`] from `tag`, or why it is not one.
pub fn check_payload(tag: u64, p: &[u8]) -> Result<u64, String> {
    if p.len() < 16 {
        return Err(format!("short payload ({} bytes)", p.len()));
    }
    let i = u64::from_le_bytes(p[..8].try_into().unwrap_or_default());
    if p != &payload(tag, i)[..] {
        return Err(format!("payload {i} from {tag} corrupted"));
    }
    Ok(i)
}

/// Collects failed assertions.
#[derive(Default)]
pub struct Checks {
    pub prog: &'static str,
    pub failures: Vec<String>,
}

impl Checks {
    pub fn new(prog: &'static str) -> Checks {
        Checks {
            prog,
            failures: Vec::new(),
        }
    }

    /// Records `what` as failed unless `ok`; prints it either way.
    pub fn check(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        if ok {
            println!("{}: ok: {what}", self.prog);
        } else {
            println!("{}: FAILED: {what}", self.prog);
            self.failures.push(what);
        }
    }

    pub fn fail(&mut self, what: impl Into<String>) {
        self.check(false, what);
    }

    /// Records a step's error, if it ended in one, as a failed check.
    pub fn step<T>(&mut self, r: Result<T, String>) {
        if let Err(e) = r {
            self.fail(e);
        }
    }

    /// Exits 0 if nothing failed, 1 otherwise.
    pub fn finish(self) -> ! {
        if self.failures.is_empty() {
            println!("{}: PASS", self.prog);
            std::process::exit(0);
        }
        for f in &self.failures {
            eprintln!("{}: FAIL: {f}", self.prog);
        }
        std::process::exit(1);
    }
}

/// The IP of the rxe device the examples bind (their first argument): 10.0.0.1 unless given, as
/// tests/rxe sets the guest up.
pub fn ip_arg(arg: Option<String>) -> IpAddr {
    arg.unwrap_or_else(|| "10.0.0.1".into())
        .parse()
        .expect("IP")
}

pub fn nid(s: &str) -> Nid {
    s.parse().expect("a valid NID")
}

/// Microseconds.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
