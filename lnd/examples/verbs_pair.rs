//! Two verbs-fabric endpoints in one process (one thread each), over a real RDMA device (run it
//! inside the Soft-RoCE guest: tests/rxe/run.sh).
//!
//! A (client) connects to B (server) and sends N IMMEDIATE messages; B sends its own N once the
//! first one arrived. A shuts down once its N sends
//! completed and it received B's N; B must then see A go (PeerDown after the disconnect) and
//! shuts down too. Exit 0 on success, 1 with a message otherwise.
//!
//! Usage: verbs_pair [IP] [N]   (defaults: 10.0.0.1, 1000; ports 9870 and 9871)

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::Duration;

use lnd::engine::{Endpoint, EndpointConfig, LndEvent};
use lnd::fabric::verbs::{run_endpoint, MonotonicClock, VerbsConfig, VerbsFabric};
use lnd::wire::{LnetHdr, Nid};

fn hdr(from: Nid, to: Nid, len: usize) -> LnetHdr {
    LnetHdr::put(from, to, len as u32, 4, 7)
}

/// A payload carrying its index and its sender tag, of varying size (16..=3915 bytes).
fn payload(tag: u64, i: u64) -> Vec<u8> {
    let len = 16 + (i as usize * 37) % 3900;
    let mut p: Vec<u8> = (0..len).map(|k| (k as u64 ^ i ^ tag) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p[8..16].copy_from_slice(&tag.to_le_bytes());
    p
}

fn check(tag: u64, p: &[u8]) -> Result<u64, String> {
    if p.len() < 16 {
        return Err(format!("short payload ({} bytes)", p.len()));
    }
    let i = u64::from_le_bytes(p[..8].try_into().unwrap_or_default());
    if p != &payload(tag, i)[..] {
        return Err(format!("payload {i} from {tag} corrupted"));
    }
    Ok(i)
}

#[derive(Debug, Default)]
struct Outcome {
    sent_ok: u64,
    send_failed: u64,
    received: u64,
    in_order: bool,
    peer_down: bool,
    error: Option<String>,
    fabric: String,
    engine: String,
}

#[allow(clippy::too_many_arguments)]
fn node(
    me: Nid,
    peer: Nid,
    tag: u64,
    peer_tag: u64,
    listen: SocketAddr,
    book: HashMap<Nid, SocketAddr>,
    n: u64,
    initiator: bool,
) -> Result<Outcome, String> {
    let cfg = VerbsConfig {
        listen,
        log_cm_events: std::env::var_os("VERBS_PAIR_LOG").is_some(),
        ..VerbsConfig::default()
    };
    let mut fabric =
        VerbsFabric::new(cfg, move |nid| book.get(&nid).copied()).map_err(|e| e.to_string())?;
    let clock = MonotonicClock::new();
    let mut ep = Endpoint::new(EndpointConfig::new(me, tag), clock.now());
    let mut out = Outcome {
        in_order: true,
        ..Outcome::default()
    };
    let mut started = false;
    let send_all = |ep: &mut Endpoint, now| -> Result<(), String> {
        for i in 0..n {
            let p = payload(tag, i);
            ep.send(now, peer, hdr(me, peer, p.len()), p, i)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    if initiator {
        send_all(&mut ep, clock.now())?;
        started = true;
    }
    run_endpoint(
        &mut fabric,
        &mut ep,
        &clock,
        Duration::from_millis(5),
        |ep| ep.is_shut_down(),
        |ep, now, ev| match ev {
            LndEvent::Received { payload: p, rx, .. } => {
                match check(peer_tag, &p) {
                    Ok(i) => {
                        out.in_order &= i == out.received;
                        out.received += 1;
                    }
                    Err(e) => out.error = Some(e),
                }
                ep.recv_done(now, rx);
                if !started {
                    started = true;
                    if let Err(e) = send_all(ep, now) {
                        out.error = Some(e);
                    }
                }
                if initiator && out.received == n && out.sent_ok + out.send_failed == n {
                    ep.shutdown(now);
                }
            }
            LndEvent::SendDone { result, .. } => {
                match result {
                    Ok(()) => out.sent_ok += 1,
                    Err(_) => out.send_failed += 1,
                }
                if initiator && out.received == n && out.sent_ok + out.send_failed == n {
                    ep.shutdown(now);
                }
            }
            LndEvent::PeerDown { .. } => {
                out.peer_down = true;
                ep.shutdown(now);
            }
            LndEvent::PeerUp { .. } => {}
        },
    )
    .map_err(|e| e.to_string())?;
    out.fabric = format!("{:?}", fabric.stats());
    out.engine = format!("{:?}", ep.stats());
    drop(fabric);
    Ok(out)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let ip: IpAddr = args
        .next()
        .unwrap_or_else(|| "10.0.0.1".into())
        .parse()
        .expect("IP");
    let n: u64 = args.next().map_or(1000, |s| s.parse().expect("N"));
    let (a, b): (Nid, Nid) = (
        "10.0.0.2@o2ib".parse().expect("nid"),
        "10.0.0.1@o2ib".parse().expect("nid"),
    );
    let (addr_a, addr_b) = (SocketAddr::new(ip, 9871), SocketAddr::new(ip, 9870));
    let book: HashMap<Nid, SocketAddr> = [(a, addr_a), (b, addr_b)].into();
    let (tx, rx) = mpsc::channel();
    let (tx_b, book_b) = (tx.clone(), book.clone());
    let tb = std::thread::spawn(move || {
        let _ = tx_b.send(("server", node(b, a, 2, 1, addr_b, book_b, n, false)));
    });
    std::thread::sleep(Duration::from_millis(200));
    let ta = std::thread::spawn(move || {
        let _ = tx.send(("client", node(a, b, 1, 2, addr_a, book, n, true)));
    });
    let mut failures = Vec::new();
    for _ in 0..2 {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok((who, Ok(o))) => {
                println!("verbs_pair: {who}: {o:?}");
                if let Some(e) = &o.error {
                    failures.push(format!("{who}: {e}"));
                }
                if o.sent_ok != n || o.received != n || !o.in_order {
                    failures.push(format!(
                        "{who}: sent_ok {} received {} of {n} (in order: {})",
                        o.sent_ok, o.received, o.in_order
                    ));
                }
                if who == "server" && !o.peer_down {
                    failures.push("server did not see the client's disconnect".into());
                }
            }
            Ok((who, Err(e))) => failures.push(format!("{who}: {e}")),
            Err(_) => {
                failures.push("timed out after 120 s".into());
                break;
            }
        }
    }
    if failures.is_empty() {
        let _ = ta.join();
        let _ = tb.join();
        println!("verbs_pair: OK: {n} messages each way, graceful disconnect seen");
    } else {
        for f in &failures {
            eprintln!("verbs_pair: FAIL: {f}");
        }
        std::process::exit(1);
    }
}
