//! A real `lnet-router` on the tcp fabric between an in-process client and server: a client
//! whose RDMA writes are short, missing or doubled (its PUT_DONE claims the whole 1 MiB) never
//! makes the router pass on bytes the client did not write. The router's large buffer held
//! another PUT's data just before; the transfer fails at the router (`rdma_short_writes`,
//! `bulk_short`), nothing reaches the server, and honest PUTs still cross afterwards.
//!
//! Bounded: every wait has a limit; the daemon is killed by its guard.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use lnd::driver::tamper::{Rewrite, ShortWrite as Write, Tamper};
use lnd::driver::tcp::TcpFabric;
use lnd::driver::{Driver, MonotonicClock};
use lnd::fabric::Registration;
use lnd::wire::Nid;
use router::control::{Request, Response};
use router::runtime::NiRuntime;
use router::{BulkBuf, LnetEvent, LnetNode, NiConfig, NiIndex, NodeConfig, RouteConfig};

const CLIENT: &str = "10.0.0.1@o2ib";
const SERVER: &str = "10.1.0.2@o2ib1";
const R_A: &str = "10.0.0.254@o2ib";
const R_B: &str = "10.1.0.254@o2ib1";
const MIB: usize = 1 << 20;

/// The client's rewrite of its RDMA writes, as `how` says at the time (a write swallowed
/// whole is reported done all the same).
fn client_writes(how: Arc<Mutex<Write>>) -> Rewrite {
    Box::new(move |action| how.lock().unwrap().rewrite(action))
}

type Book = Arc<Mutex<HashMap<Nid, SocketAddr>>>;

use testkit::nid;

fn fabric(book: &Book) -> TcpFabric {
    let b = Arc::clone(book);
    TcpFabric::bind("127.0.0.1:0".parse().unwrap(), move |n| {
        b.lock().unwrap().get(&n).copied()
    })
    .unwrap()
}

fn runtime<D: Driver>(me: &str, routes: Vec<RouteConfig>, driver: D, inc: u64) -> NiRuntime<D> {
    let mut cfg = NodeConfig::new(vec![NiConfig::new(nid(me), inc)]);
    cfg.routes = routes;
    let clock = MonotonicClock::new();
    let node = LnetNode::new(cfg, clock.now());
    NiRuntime::new(node, driver, clock).unwrap().0
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8 ^ seed)
        .collect()
}

fn bulk_drops(d: &Daemon, why: &str) -> u64 {
    match call(d, Request::RoutingShow) {
        Response::Routing(r) => r
            .forwarding
            .dropped_by_reason
            .iter()
            .find(|(k, _)| k == why)
            .map_or(0, |(_, n)| *n),
        other => panic!("routing show: {other:?}"),
    }
}

struct Ends {
    client: NiRuntime<Tamper<TcpFabric>>,
    server: NiRuntime<TcpFabric>,
    /// BulkPut results at the server by match bits.
    landed: HashMap<u64, Result<u32, router::LnetError>>,
}

impl Ends {
    fn turn(&mut self) {
        for _ in 0..20 {
            self.client.turn(Duration::from_millis(1)).unwrap();
            self.server.turn(Duration::from_millis(1)).unwrap();
        }
        while self.client.node_mut().poll_event().is_some() {}
        while let Some(e) = self.server.node_mut().poll_event() {
            if let LnetEvent::BulkPut {
                match_bits, result, ..
            } = e
            {
                self.landed.insert(match_bits, result);
            }
        }
    }

    fn until(&mut self, what: &str, mut cond: impl FnMut(&mut Ends) -> bool) {
        let t0 = Instant::now();
        while !cond(self) {
            assert!(t0.elapsed() < WAIT, "{what}: not within {WAIT:?}");
            self.turn();
        }
    }

    /// A sink of the server's, posted for match bits `bits`, holding 0xee.
    fn sink(&mut self, bits: u64) -> Registration {
        let (node, drv) = self.server.parts();
        let reg = drv.registry().unwrap().register(vec![0xee; MIB]).unwrap();
        node.post_sink(
            4,
            bits,
            BulkBuf::new(NiIndex(0), &reg, 0, MIB as u32).unwrap(),
        );
        reg
    }

    /// The client PUTs `bytes` to the server's sink `bits` (retrying while its route is still
    /// being checked).
    fn put(&mut self, bits: u64, bytes: Vec<u8>) {
        let (_, drv) = self.client.parts();
        let reg = drv.registry().unwrap().register(bytes).unwrap();
        let buf = BulkBuf::new(NiIndex(0), &reg, 0, MIB as u32).unwrap();
        let t0 = Instant::now();
        loop {
            let now = self.client.now();
            if self
                .client
                .node_mut()
                .send_put_bulk(now, nid(SERVER), 4, bits, buf.clone())
                .is_ok()
            {
                return;
            }
            assert!(t0.elapsed() < WAIT, "the client's route never came up");
            self.turn();
        }
    }

    /// PUTs `bytes` to sink `bits` until the router takes it (its sender's strikes get it
    /// refused for a while after each hostile PUT: `bulk_refused`) and `done(router)` holds.
    fn put_past_refusals(
        &mut self,
        r: &Daemon,
        bits: u64,
        bytes: Vec<u8>,
        mut done: impl FnMut(&mut Ends, &Daemon) -> bool,
    ) {
        let t0 = Instant::now();
        loop {
            let refused0 = bulk_drops(r, "bulk_refused");
            self.put(bits, bytes.clone());
            let mut refused = false;
            self.until("the router's verdict on a PUT", |e| {
                refused = bulk_drops(r, "bulk_refused") > refused0;
                refused || done(e, r)
            });
            if !refused {
                return;
            }
            assert!(t0.elapsed() < WAIT, "refused for {WAIT:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn contents(&mut self, reg: &Registration) -> Vec<u8> {
        self.server
            .driver_mut()
            .registry()
            .unwrap()
            .contents(reg)
            .unwrap()
    }
}

#[test]
fn short_missing_or_doubled_writes_never_reach_the_server_through_a_router() {
    let dir = Scratch::new("bulk-hostile-tcp");
    let book = Book::default();
    let server_fabric = fabric(&book);
    let server_addr = server_fabric.local_addr();
    // One large buffer per router NI, so the client's PUTs all go through the same one.
    let yaml = format!(
        "net:
    - net type: o2ib
      fabric: tcp
      local NI(s):
        - nid: {R_A}
          listen: 127.0.0.1:0
    - net type: o2ib1
      fabric: tcp
      local NI(s):
        - nid: {R_B}
          listen: 127.0.0.1:0
routing:
    enable: 1
buffers:
    large: 2
peers:
    - nid: {SERVER}
      address: {server_addr}
"
    );
    let r = start_yaml(&dir.0, "router", &yaml, Opts::default());
    let ra: SocketAddr = format!("127.0.0.1:{}", listen_port(&r, R_A))
        .parse()
        .unwrap();
    book.lock().unwrap().insert(nid(R_A), ra);
    let how = Arc::new(Mutex::new(Write::Honest));
    let mut client = Tamper::new(fabric(&book));
    client.set(Some(client_writes(Arc::clone(&how))));
    let route = RouteConfig {
        net: "o2ib1".parse().unwrap(),
        gateway: nid(R_A),
        hops: Some(1),
        priority: 0,
    };
    let mut ends = Ends {
        client: runtime(CLIENT, vec![route], client, 10),
        server: runtime(SERVER, Vec::new(), server_fabric, 20),
        landed: HashMap::new(),
    };

    // An honest PUT first: the router's buffer now holds its bytes.
    let first = ends.sink(1);
    ends.put(1, pattern(1, MIB));
    ends.until("the honest PUT", |e| e.landed.contains_key(&1));
    assert_eq!(ends.landed[&1], Ok(MIB as u32));
    assert_eq!(ends.contents(&first), pattern(1, MIB));

    let mut sinks = Vec::new();
    for (i, mode) in [Write::Half, Write::Nothing, Write::HalfTwice]
        .into_iter()
        .enumerate()
    {
        let bits = 10 + i as u64;
        let short0 = bulk_drops(&r, "bulk_short");
        *how.lock().unwrap() = mode;
        let sink = ends.sink(bits);
        ends.put_past_refusals(&r, bits, pattern(20 + i as u8, MIB), |e, r| {
            assert!(
                !e.landed.contains_key(&bits),
                "{mode:?}: reached the server"
            );
            bulk_drops(r, "bulk_short") > short0
        });
        sinks.push((bits, sink));
    }
    *how.lock().unwrap() = Write::Honest;

    // Honest again: it crosses (the router reconnects), and by then nothing of the hostile
    // PUTs reached the server's sinks.
    let last = ends.sink(99);
    ends.put_past_refusals(&r, 99, pattern(99, MIB), |e, _| e.landed.contains_key(&99));
    assert_eq!(ends.landed[&99], Ok(MIB as u32));
    assert_eq!(ends.contents(&last), pattern(99, MIB));
    for (bits, sink) in &sinks {
        assert!(
            !ends.landed.contains_key(bits),
            "PUT {bits} reached the server"
        );
        assert!(ends.contents(sink).iter().all(|&b| b == 0xee), "PUT {bits}");
    }
    let lnd = lnd_counters(&r, R_A);
    assert_eq!(lnd.counters.get("rdma_short_writes"), Some(3), "{lnd:?}");
    assert_eq!(bulk_drops(&r, "bulk_short"), 3);
    assert_eq!(bulk_drops(&r, "send_failed"), 0);
}
