//! Small-message round trips and RDMA writes through our verbs fabric (run it in the Soft-RoCE
//! guest: tests/rxe/run.sh, which puts the figures beside perftest's ib_send_lat / ib_write_bw).
//!
//! B (10.0.0.1@o2ib) runs in its own thread: it echoes PING messages, registers a 4 MiB sink
//! region whose (rkey, address) it hands to A, and checks the sink's bytes when asked (CHECK).
//! A (10.0.0.2@o2ib, the main thread):
//! 1. ping-pong: 64-byte IMMEDIATE messages through both engines, 200 warm-up then `ITERS` timed
//!    round trips (median and p99), first with the fabric's default wait (busy-poll 50 us,
//!    then block on the completion channel), then with both sides spinning (as perftest does);
//! 2. RDMA write, checked: 257 writes of 4 KiB (one descriptor's worth of fragments) from A's
//!    source region into B's sink, then a CHECK message behind them on the same connection: B
//!    must find the data in place when the message arrives (RC ordering);
//! 3. RDMA write, raw rate: `WRITES` writes of 64 KiB, 128 in flight, into the sink (cycling);
//! 4. refusals: a write outside A's own region fails at once (`Error`, nothing posted); a write
//!    past the end of B's region fails at B's HCA (REM_ACCESS_ERR, `Error`).
//!
//! Prints `BENCH rtt_median_us=.. rtt_p99_us=.. half_rtt_us=.. spin_half_rtt_us=.. write_mib_s=..`
//! for the table.
//! Exit 0 on success, 1 with the failed checks otherwise.
//! Usage: verbs_bench [IP] [ITERS] [WRITES]   (defaults 10.0.0.1, 1000, 2000; ports 9910, 9911)

#[path = "verbs_common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{ip_arg, nid, run_until, Checks, Node};
use lnd::driver::verbs::VerbsConfig;
use lnd::fabric::{Registry, RemoteRegion, WcStatus};

const REGION: usize = 4 << 20;
const FRAG: usize = 4096;
const FRAGS: usize = 257;
const BIG: usize = 64 << 10;
const WINDOW: usize = 128;
/// A busy-poll budget that amounts to spinning (perftest's way of waiting).
const SPIN: std::time::Duration = std::time::Duration::from_secs(3600);

/// The byte at `k` of A's source region.
fn pattern(k: usize) -> u8 {
    ((k / FRAG) as u8).wrapping_mul(31) ^ (k as u8)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let ip = ip_arg(args.next());
    let iters: usize = args.next().map_or(1000, |s| s.parse().expect("ITERS"));
    let writes: usize = args.next().map_or(2000, |s| s.parse().expect("WRITES"));
    let mut checks = Checks::new("verbs_bench");
    let (a_nid, b_nid) = (nid("10.0.0.2@o2ib"), nid("10.0.0.1@o2ib"));
    let book: HashMap<_, _> = [
        (a_nid, SocketAddr::new(ip, 9911)),
        (b_nid, SocketAddr::new(ip, 9910)),
    ]
    .into();
    let (tx, rx) = mpsc::channel();
    let book_b = book.clone();
    let server = std::thread::spawn(move || serve(b_nid, book_b, tx));
    let result = match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(remote)) => client(a_nid, b_nid, book, remote, iters, writes, &mut checks),
        Ok(Err(e)) => Err(format!("B: {e}")),
        Err(_) => Err("B did not start".into()),
    };
    checks.step(result);
    match server.join() {
        Ok(Ok(s)) => println!("verbs_bench: B {s}"),
        Ok(Err(e)) => checks.fail(format!("B: {e}")),
        Err(_) => checks.fail("B panicked"),
    }
    checks.finish();
}

/// B: echo PINGs, answer CHECKs about the sink region, stop when A goes.
fn serve(
    me: lnd::wire::Nid,
    book: HashMap<lnd::wire::Nid, SocketAddr>,
    tx: mpsc::Sender<Result<RemoteRegion, String>>,
) -> Result<String, String> {
    let mut b = match Node::new("B", me, 2, book[&me], book, |_| {}) {
        Ok(b) => b,
        Err(e) => {
            let _ = tx.send(Err(e.clone()));
            return Err(e);
        }
    };
    let sink = b
        .fabric
        .register(vec![0; REGION])
        .map_err(|e| format!("register: {e}"))?;
    let _ = tx.send(Ok(sink.remote()));
    let mut cookie = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while b.downs.is_empty() {
        if Instant::now() > deadline {
            return Err("A never went away".into());
        }
        b.turn(Duration::from_millis(50))?;
        while let Some((from, p)) = b.inbox.pop_front() {
            cookie += 1;
            if p.starts_with(b"PING") {
                b.send(from, p, cookie)?;
            } else if p == b"SPIN" {
                b.fabric.set_busy_poll(SPIN);
            } else if p == b"NOSPIN" {
                b.fabric.set_busy_poll(VerbsConfig::default().busy_poll);
            } else if let Some(len) = p.strip_prefix(b"CHECK ") {
                let len: usize = std::str::from_utf8(len)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let mut got = vec![0u8; len];
                let reply = if !b.fabric.read(&sink, 0, &mut got) {
                    "BAD read".to_string()
                } else {
                    match (0..len).find(|&k| got[k] != pattern(k)) {
                        None => "OK".to_string(),
                        Some(k) => format!("BAD at byte {k}"),
                    }
                };
                b.send(from, reply.into_bytes(), cookie)?;
            }
        }
    }
    common::shutdown_all(&mut [&mut b], Duration::from_secs(10))?;
    let _ = b.fabric.deregister(sink);
    Ok(format!("fabric {:?}", b.fabric.stats()))
}

fn client(
    me: lnd::wire::Nid,
    peer: lnd::wire::Nid,
    book: HashMap<lnd::wire::Nid, SocketAddr>,
    remote: RemoteRegion,
    iters: usize,
    writes: usize,
    checks: &mut Checks,
) -> Result<(), String> {
    let mut a = Node::new("A", me, 1, book[&me], book, |_| {})?;

    // 1. Ping-pong.
    let ping = |a: &mut Node, i: usize| -> Result<Duration, String> {
        let mut p = b"PING".to_vec();
        p.resize(64, i as u8);
        let t = Instant::now();
        a.send(peer, p, i as u64)?;
        while a.inbox.is_empty() {
            a.turn(Duration::from_millis(100))?;
            if t.elapsed() > Duration::from_secs(20) {
                return Err(format!("no pong {i}"));
            }
        }
        let rtt = t.elapsed();
        let (_, back) = a.inbox.pop_front().ok_or("no pong")?;
        if back.len() != 64 || !back.starts_with(b"PING") {
            return Err(format!("bad pong {i}"));
        }
        Ok(rtt)
    };
    let mut measure = |a: &mut Node, what: &str| -> Result<(Duration, Duration), String> {
        for i in 0..200 {
            ping(a, i)?;
        }
        let mut rtts: Vec<Duration> = (0..iters).map(|i| ping(a, i)).collect::<Result<_, _>>()?;
        rtts.sort();
        let median = rtts[rtts.len() / 2];
        let p99 = rtts[(rtts.len() * 99 / 100).min(rtts.len() - 1)];
        checks.check(
            rtts.len() == iters,
            format!(
                "{iters} ping-pongs ({what}): median RTT {:.1} us, p99 {:.1} us",
                common::us(median),
                common::us(p99)
            ),
        );
        Ok((median, p99))
    };
    let (median, p99) = measure(&mut a, "busy-poll 50 us, then block")?;
    // Both sides spinning, as perftest waits.
    a.send(peer, b"SPIN".to_vec(), 1 << 41)?;
    a.fabric.set_busy_poll(SPIN);
    let (spin_median, _) = measure(&mut a, "spinning")?;
    a.fabric.set_busy_poll(VerbsConfig::default().busy_poll);
    a.send(peer, b"NOSPIN".to_vec(), 1 << 42)?;

    // 2. 257 fragments, then a message behind them.
    let conn = a.conn_to(peer).ok_or("no connection to B")?;
    let src_bytes: Vec<u8> = (0..REGION).map(pattern).collect();
    let src = a
        .fabric
        .register(src_bytes)
        .map_err(|e| format!("register: {e}"))?;
    println!(
        "verbs_bench: send queue capacity {} work requests",
        a.fabric.send_queue_capacity(conn)
    );
    // One write of 257 local fragments onto 257 remote ones with other boundaries (the first
    // remote fragment is 1000 bytes): every remote fragment but the first spans two local ones.
    let local: Vec<_> = (0..FRAGS)
        .map(|f| src.local_frag((f * FRAG) as u64, FRAG as u32))
        .collect();
    let mut remote_frags = vec![remote.frag(1000)];
    let mut off = 1000u64;
    for _ in 0..FRAGS - 2 {
        remote_frags.push(remote.at(off).frag(FRAG as u32));
        off += FRAG as u64;
    }
    remote_frags.push(remote.at(off).frag((FRAGS * FRAG) as u32 - off as u32));
    let wrs = [a.fabric.rdma_write(conn, &local, &remote_frags)];
    a.send(
        peer,
        format!("CHECK {}", FRAGS * FRAG).into_bytes(),
        1 << 40,
    )?;
    run_until(
        &mut [&mut a],
        Duration::from_secs(30),
        "CHECK reply",
        |ns| !ns[0].inbox.is_empty(),
    )?;
    let (_, reply) = a.inbox.pop_front().ok_or("no reply")?;
    let statuses: Vec<Option<WcStatus>> = wrs.iter().map(|&w| a.fabric.rdma_status(w)).collect();
    checks.check(
        statuses.iter().all(|s| *s == Some(WcStatus::Success)),
        format!("one write of {FRAGS} fragments a side completed Success"),
    );
    checks.check(
        reply == b"OK",
        format!(
            "the message posted behind them found the data in place at B ({})",
            String::from_utf8_lossy(&reply)
        ),
    );
    a.fabric.take_rdma_completions();

    // 3. Raw write rate.
    let slots = REGION / BIG;
    let (mut posted, mut done, mut bad) = (0usize, 0usize, 0usize);
    let db0 = (a.fabric.stats().doorbells, a.fabric.stats().wrs_posted);
    let t0 = Instant::now();
    while done < writes {
        while posted < writes && posted - done < WINDOW {
            let off = ((posted % slots) * BIG) as u64;
            a.fabric.rdma_write(
                conn,
                &[src.local_frag(off, BIG as u32)],
                &[remote.at(off).frag(BIG as u32)],
            );
            posted += 1;
        }
        a.turn(Duration::from_millis(100))?;
        for (_, st) in a.fabric.take_rdma_completions() {
            done += 1;
            bad += usize::from(st != WcStatus::Success);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return Err(format!("write loop: {done} of {writes} after 60 s"));
        }
    }
    let dt = t0.elapsed();
    let mib_s = (writes * BIG) as f64 / dt.as_secs_f64() / (1u64 << 20) as f64;
    let (db, wr) = (
        a.fabric.stats().doorbells - db0.0,
        a.fabric.stats().wrs_posted - db0.1,
    );
    checks.check(
        bad == 0,
        format!(
            "{writes} writes of 64 KiB, {WINDOW} in flight: {mib_s:.0} MiB/s, {wr} work requests \
             in {db} doorbells, {bad} failed"
        ),
    );

    // 4. Refusals.
    let w = a.fabric.rdma_write(
        conn,
        &[src.local_frag((REGION - 100) as u64, FRAG as u32)],
        &[remote.frag(FRAG as u32)],
    );
    a.turn(Duration::from_millis(10))?;
    checks.check(
        a.fabric.rdma_status(w) == Some(WcStatus::Error) && a.conn_to(peer) == Some(conn),
        format!(
            "a write outside our own region is refused before the device ({:?}), the connection stays",
            a.fabric.rdma_status(w)
        ),
    );
    let w = a.fabric.rdma_write(
        conn,
        &[src.local_frag(0, FRAG as u32)],
        &[remote.at((REGION - 100) as u64).frag(FRAG as u32)],
    );
    run_until(
        &mut [&mut a],
        Duration::from_secs(20),
        "remote access error",
        |ns| ns[0].fabric.rdma_status(w).is_some(),
    )?;
    checks.check(
        a.fabric.rdma_status(w) == Some(WcStatus::Error),
        format!(
            "a write past the end of B's region fails at B's HCA ({:?})",
            a.fabric.rdma_status(w)
        ),
    );
    println!(
        "BENCH rtt_median_us={:.2} rtt_p99_us={:.2} half_rtt_us={:.2} spin_half_rtt_us={:.2} write_mib_s={:.1}",
        common::us(median),
        common::us(p99),
        common::us(median) / 2.0,
        common::us(spin_median) / 2.0,
        mib_s
    );
    common::shutdown_all(&mut [&mut a], Duration::from_secs(10))?;
    let _ = a.fabric.deregister(src);
    checks.check(
        a.fabric.stats().regions == 0 && a.fabric.connections() == 0,
        "A deregistered its region and holds no connection",
    );
    println!("verbs_bench: A fabric {:?}", a.fabric.stats());
    Ok(())
}
