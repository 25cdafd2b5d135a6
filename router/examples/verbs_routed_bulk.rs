//! Bulk PUTs through an `lnet-router` daemon over real verbs (run inside the Soft-RoCE guest:
//! tests/rxe/daemons-suite.sh starts the router, then this).
//!
//! A client node on o2ib and a server node on o2ib1, each an `LnetNode` on its own verbs fabric
//! (the daemon's runtime, `NiRuntime`), both in this process, each with a route to the other net
//! through the router. Once the client's route is up (a routed ping answers), the server posts
//! one sink per size and the client PUTs 1 B to 1 MiB (odd sizes, non-zero offsets) from its
//! registered memory: through the router they go as the client's PUT_REQ into a router buffer,
//! then the router's own rendezvous into the server's sink. Every PUT must end `Ok` at the
//! client, land byte for byte at the server, and nothing around the sinks change.
//!
//! Then the client turns hostile (issue 31): its RDMA writes carry only the first half of each
//! 1 MiB PUT while its PUT_DONE claims it all. On verbs the router cannot see that (a write is
//! one-sided), so it forwards the whole buffer; what must reach the server for the unwritten
//! half is zeros (the router scrubs a large buffer before lending it again), never the bytes
//! the earlier PUTs left in the router's buffers.
//!
//! Usage: verbs_routed_bulk CLIENT_NID SERVER_NID ROUTER_NID_ON_O2IB ROUTER_NID_ON_O2IB1
//! Every NI listens on its NID's address, port 987, as o2iblnd does. Exit 0 on success.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use lnd::driver::tamper::{Rewrite, Tamper};
use lnd::driver::verbs::{MonotonicClock, VerbsConfig, VerbsFabric};
use lnd::driver::Driver;
use lnd::fabric::{FabricAction, LocalFrag, Registration, RemoteFrag};
use lnd::time::Duration;
use lnd::wire::Nid;
use router::runtime::NiRuntime;
use router::{BulkBuf, LnetEvent, LnetNode, NiConfig, NiIndex, NodeConfig, RouteConfig};

const MIB: usize = 1 << 20;
const PORTAL: u32 = 16;

type Rt = NiRuntime<Tamper<VerbsFabric>>;

/// The client's RDMA writes carry only their first half while `short` is set (a hostile
/// sender: its PUT_DONE still claims the whole PUT).
fn halving(short: Arc<AtomicBool>) -> Rewrite {
    Box::new(move |action| match action {
        FabricAction::RdmaWrite {
            conn,
            wr,
            local,
            remote,
        } if short.load(Ordering::Relaxed) && local.len() == 1 && remote.len() == 1 => {
            let n = local[0].len / 2;
            Some(FabricAction::RdmaWrite {
                conn,
                wr,
                local: vec![LocalFrag { len: n, ..local[0] }],
                remote: vec![RemoteFrag {
                    len: n,
                    ..remote[0]
                }],
            })
        }
        other => Some(other),
    })
}

fn addr(nid: Nid) -> SocketAddr {
    SocketAddr::new(Ipv4Addr::from(nid.addr()).into(), 987)
}

fn node(
    me: Nid,
    gw: Nid,
    inc: u64,
    clock: &MonotonicClock,
    short: &Arc<AtomicBool>,
) -> Result<Rt, String> {
    let cfg = VerbsConfig {
        listen: addr(me),
        ..VerbsConfig::default()
    };
    let fabric = VerbsFabric::new(cfg, |n: Nid| Some(addr(n))).map_err(|e| format!("{me}: {e}"))?;
    let mut c = NodeConfig::new(vec![NiConfig::new(me, inc)]);
    c.routes = vec![RouteConfig {
        net: if me.net() == gw.net() {
            // The route is to the other net, through the gateway on ours.
            other_net(me)
        } else {
            return Err(format!("gateway {gw} is not on {me}'s net"));
        },
        gateway: gw,
        hops: Some(1),
        priority: 0,
    }];
    c.gateway_health.check_interval = Duration::from_secs(1);
    c.gateway_health.ping_timeout = Duration::from_secs(2);
    let n = LnetNode::new(c, clock.now());
    let mut fabric = Tamper::new(fabric);
    fabric.set(Some(halving(Arc::clone(short))));
    let (rt, _wake) = NiRuntime::new(n, fabric, *clock).map_err(|e| e.to_string())?;
    Ok(rt)
}

fn other_net(me: Nid) -> lnd::wire::Net {
    let s = if me.net().to_string() == "o2ib" {
        "o2ib1"
    } else {
        "o2ib"
    };
    s.parse().expect("a net")
}

fn short_never() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

fn pattern_seeded(seed: u8, len: usize) -> Vec<u8> {
    pattern(len).into_iter().map(|b| b ^ seed).collect()
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 12) as u8)
        .collect()
}

/// Turns both runtimes until `done` holds or `limit` passes; events go to `seen`.
fn run(
    rts: &mut [&mut Rt; 2],
    seen: &mut [Vec<LnetEvent>; 2],
    limit: StdDuration,
    what: &str,
    mut done: impl FnMut(&[Vec<LnetEvent>; 2]) -> bool,
) -> Result<(), String> {
    let t0 = StdInstant::now();
    while !done(seen) {
        if t0.elapsed() > limit {
            return Err(format!("{what}: not done after {limit:?}"));
        }
        for (i, rt) in rts.iter_mut().enumerate() {
            rt.turn(StdDuration::from_millis(1))
                .map_err(|e| format!("fabric: {e}"))?;
            while let Some(ev) = rt.node_mut().poll_event() {
                seen[i].push(ev);
            }
        }
    }
    Ok(())
}

fn main() {
    let args: Vec<Nid> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a NID"))
        .collect();
    let [client, server, gw_a, gw_b] = args[..] else {
        eprintln!("usage: verbs_routed_bulk CLIENT SERVER ROUTER_ON_O2IB ROUTER_ON_O2IB1");
        std::process::exit(2);
    };
    match go(client, server, gw_a, gw_b) {
        Ok(()) => println!("verbs_routed_bulk: PASS"),
        Err(e) => {
            println!("verbs_routed_bulk: FAILED: {e}");
            std::process::exit(1);
        }
    }
}

fn go(client: Nid, server: Nid, gw_a: Nid, gw_b: Nid) -> Result<(), String> {
    let clock = MonotonicClock::new();
    let short = Arc::new(AtomicBool::new(false));
    let mut c = node(client, gw_a, 0x0c11_e000, &clock, &short)?;
    let mut s = node(server, gw_b, 0x5e77_e000, &clock, &short_never())?;
    let mut seen = [Vec::new(), Vec::new()];

    // The route comes up once the client's pinger heard the router; then a routed ping answers.
    let t0 = StdInstant::now();
    loop {
        let now = c.now();
        if let Ok(id) = c.node_mut().ping(now, server, Duration::from_secs(5)) {
            run(
                &mut [&mut c, &mut s],
                &mut seen,
                StdDuration::from_secs(15),
                "ping",
                |e| {
                    e[0].iter()
                        .any(|ev| matches!(ev, LnetEvent::PingDone { id: i, .. } if *i == id))
                },
            )?;
            let ok = seen[0].iter().any(
                |ev| matches!(ev, LnetEvent::PingDone { id: i, result: Ok(_), .. } if *i == id),
            );
            if ok {
                break;
            }
        }
        if t0.elapsed() > StdDuration::from_secs(60) {
            return Err("no routed ping answered within 60 s".into());
        }
        run(
            &mut [&mut c, &mut s],
            &mut seen,
            StdDuration::from_millis(300),
            "wait",
            |_| false,
        )
        .ok();
    }
    println!(
        "verbs_routed_bulk: route up after {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let reg = |rt: &mut Rt, bytes: Vec<u8>| -> Result<Registration, String> {
        rt.driver_mut()
            .registry()
            .ok_or("no registry")?
            .register(bytes)
            .map_err(|e| format!("register: {e}"))
    };
    let bytes = pattern(MIB + 64);
    let src = reg(&mut c, bytes.clone())?;
    let sizes = [1u32, 3977, 65_537, 300_001, MIB as u32 - 5, MIB as u32];
    let mut sinks = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let sink = reg(&mut s, vec![0xee; MIB + 64])?;
        let b = BulkBuf::new(NiIndex(0), &sink, 9, len).ok_or("sink range")?;
        s.node_mut().post_sink(PORTAL, i as u64, b);
        sinks.push(sink);
    }
    let t1 = StdInstant::now();
    let now = c.now();
    let mut ids = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let b = BulkBuf::new(NiIndex(0), &src, 5 + i as u64, len).ok_or("source range")?;
        let id = c
            .node_mut()
            .send_put_bulk(now, server, PORTAL, i as u64, b)
            .map_err(|e| format!("send_put_bulk: {e}"))?;
        ids.push(id);
    }
    run(
        &mut [&mut c, &mut s],
        &mut seen,
        StdDuration::from_secs(90),
        "the PUTs",
        |e| {
            let puts = e[1]
                .iter()
                .filter(|ev| matches!(ev, LnetEvent::BulkPut { .. }))
                .count();
            let done = e[0]
                .iter()
                .filter(|ev| matches!(ev, LnetEvent::PutDone { id, .. } if ids.contains(id)))
                .count();
            puts == sizes.len() && done == sizes.len()
        },
    )?;
    let dt = t1.elapsed();
    let mut bad = Vec::new();
    for ev in &seen[0] {
        if let LnetEvent::PutDone { id, result } = ev {
            if ids.contains(id) && result.is_err() {
                bad.push(format!("{id:?}: {result:?}"));
            }
        }
    }
    for (i, &len) in sizes.iter().enumerate() {
        let landed = seen[1].iter().any(|ev| {
            matches!(ev, LnetEvent::BulkPut { match_bits, result: Ok(n), .. }
                if *match_bits == i as u64 && *n == len)
        });
        let got = s
            .driver_mut()
            .registry()
            .and_then(|r| r.contents(&sinks[i]))
            .unwrap_or_default();
        let want = &bytes[5 + i..5 + i + len as usize];
        let exact = got.len() == MIB + 64
            && got[9..9 + len as usize] == *want
            && got[..9].iter().all(|&x| x == 0xee)
            && got[9 + len as usize..].iter().all(|&x| x == 0xee);
        if !landed || !exact {
            bad.push(format!("size {len}: landed {landed}, bytes exact {exact}"));
        }
    }
    let total: u64 = sizes.iter().map(|&n| u64::from(n)).sum();
    println!(
        "verbs_routed_bulk: {} PUTs, {total} bytes through the router in {:.1} ms",
        sizes.len(),
        dt.as_secs_f64() * 1e3
    );

    // The hostile phase: more short-written 1 MiB PUTs than the router has large buffers on
    // the client's NI, one at a time, so each reuses a buffer an earlier PUT filled.
    short.store(true, Ordering::Relaxed);
    const SHORT_PUTS: u64 = 6;
    let hostile = pattern_seeded(0x5a, MIB);
    let hsrc = reg(&mut c, hostile.clone())?;
    for k in 0..SHORT_PUTS {
        let bits = 100 + k;
        let sink = reg(&mut s, vec![0xee; MIB])?;
        let b = BulkBuf::new(NiIndex(0), &sink, 0, MIB as u32).ok_or("sink range")?;
        s.node_mut().post_sink(PORTAL, bits, b);
        let now = c.now();
        let b = BulkBuf::new(NiIndex(0), &hsrc, 0, MIB as u32).ok_or("source range")?;
        c.node_mut()
            .send_put_bulk(now, server, PORTAL, bits, b)
            .map_err(|e| format!("send_put_bulk: {e}"))?;
        run(
            &mut [&mut c, &mut s],
            &mut seen,
            StdDuration::from_secs(30),
            "a short-written PUT",
            |e| {
                e[1].iter().any(
                    |ev| matches!(ev, LnetEvent::BulkPut { match_bits, .. } if *match_bits == bits),
                )
            },
        )?;
        let got = s
            .driver_mut()
            .registry()
            .and_then(|r| r.contents(&sink))
            .unwrap_or_default();
        let half = MIB / 2;
        let own = got.len() == MIB && got[..half] == hostile[..half];
        let zeros = got.len() == MIB && got[half..].iter().all(|&x| x == 0);
        if !own || !zeros {
            let foreign = got[half..].iter().filter(|&&x| x != 0).count();
            bad.push(format!(
                "short PUT {k}: its own half intact {own}, {foreign} unwritten bytes not zero                  (a previous user's data passed on)"
            ));
        }
    }
    println!("verbs_routed_bulk: {SHORT_PUTS} short-written PUTs checked at the server");
    short.store(false, Ordering::Relaxed);
    for rt in [&mut c, &mut s] {
        let now = rt.now();
        rt.node_mut().shutdown(now);
    }
    run(
        &mut [&mut c, &mut s],
        &mut seen,
        StdDuration::from_secs(10),
        "shutdown",
        |_| false,
    )
    .ok();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; "))
    }
}
