//! Bulk data by RDMA rendezvous through the engine on a real RDMA device (run it inside the
//! Soft-RoCE guest: tests/rxe/run.sh).
//!
//! 1. Sizes 1 B to 1 MiB (odd ones among them), from and into non-zero offsets: A PUTs into a
//!    sink B registered (PUT_REQ, PUT_ACK, RDMA write, PUT_DONE) and GETs from a source B
//!    registered (GET_REQ, RDMA write, GET_DONE). Every byte lands, nothing around the range
//!    changes, each side reports each transfer once, on the one connection.
//! 2. A sink that lies about its memory: B answers a PUT with a descriptor running past its
//!    registration. A's write fails at B's HCA (remote access error), which costs A that PUT and
//!    the connection; B's memory beyond its registration is never reached and its region is
//!    unchanged. A new connection then carries a PUT intact.
//! 3. A router's buffer: memory registered with two fabrics at once (B's and a third node
//!    C's, `SharedMem`). A PUTs into it through B; C PUTs it on to A from its own
//!    registration of the same memory. A gets back exactly what it sent.
//! 4. Graceful close; no queue pair left, every registration released.
//!
//! Exit 0 on success, 1 with the failed checks otherwise.
//! Usage: verbs_bulk [IP]   (default 10.0.0.1; ports 9874, 9875 and 9876)

#[path = "verbs_common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::{ip_arg, nid, run_until, shutdown_all, Answer, Checks, Node};
use lnd::engine::RdmaSink;
use lnd::fabric::Registry;
use lnd::wire::{LnetHdr, RdmaFrag};

const MIB: usize = 1 << 20;

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// `from` starts a PUT of `src` by rendezvous to `to` (header match bits `bits`), whose LNet
/// answers with `sink`; both sides report the transfer under `cookie`.
fn start_put(
    from: &mut Node,
    to: &mut Node,
    src: lnd::fabric::LocalFrag,
    sink: RdmaSink,
    cookie: u64,
    bits: u64,
) -> Result<(), String> {
    to.answers.push_back(Answer::Accept(sink, cookie));
    let (from_nid, to_nid) = (from.ep.nid(), to.ep.nid());
    let now = from.now();
    let h = LnetHdr::put(from_nid, to_nid, src.len, 4, bits);
    from.ep
        .send_put_rdma(now, to_nid, h, vec![src], cookie)
        .map_err(|e| format!("send_put_rdma: {e}"))
}

fn main() {
    let ip = ip_arg(std::env::args().nth(1));
    let mut checks = Checks::new("verbs_bulk");
    let r = run(ip, &mut checks);
    checks.step(r);
    checks.finish();
}

fn run(ip: IpAddr, checks: &mut Checks) -> Result<(), String> {
    let (a_nid, b_nid, c_nid) = (
        nid("10.0.0.2@o2ib"),
        nid("10.0.0.1@o2ib"),
        nid("10.0.0.3@o2ib"),
    );
    let (addr_a, addr_b) = (SocketAddr::new(ip, 9875), SocketAddr::new(ip, 9874));
    let addr_c = SocketAddr::new(ip, 9876);
    let book: HashMap<_, _> = [(a_nid, addr_a), (b_nid, addr_b), (c_nid, addr_c)].into();
    let tune = |c: &mut lnd::engine::EndpointConfig| {
        c.tunables.timeout = Duration::from_secs(20).into();
    };
    let mut b = Node::new("B", b_nid, 2, addr_b, book.clone(), tune)?;
    let mut c = Node::new("C", c_nid, 3, addr_c, book.clone(), tune)?;
    let mut a = Node::new("A", a_nid, 1, addr_a, book, tune)?;
    println!("verbs_bulk: device {}", a.fabric.device_name());
    let reg = |n: &mut Node, bytes: Vec<u8>| {
        n.fabric
            .register(bytes)
            .map_err(|e| format!("{}: register: {e}", n.name))
    };
    let a_bytes = pattern(MIB + 256, 7);
    let b_bytes = pattern(MIB + 256, 8);
    let a_src = reg(&mut a, a_bytes.clone())?;
    let b_src = reg(&mut b, b_bytes.clone())?;

    // 1. The sweep.
    let sizes = testkit::BULK_SWEEP;
    let mut bad = Vec::new();
    let t0 = std::time::Instant::now();
    for (i, &len) in sizes.iter().enumerate() {
        let (src_off, sink_off) = (3 + 11 * i as u64, 1 + 5 * i as u64);
        let b_sink = reg(&mut b, vec![0xee; MIB + 64])?;
        let a_sink = reg(&mut a, vec![0xee; MIB + 64])?;
        let (put, get) = (1000 + i as u64, 2000 + i as u64);
        let into = RdmaSink::of(&b_sink, sink_off, len);
        start_put(&mut a, &mut b, a_src.local_frag(src_off, len), into, put, 7)?;
        b.answers
            .push_back(Answer::Reply(vec![b_src.local_frag(src_off, len)], get));
        let now = a.now();
        let h = LnetHdr::put(a_nid, b_nid, 0, 4, 8);
        let into = RdmaSink::of(&a_sink, sink_off, len);
        a.ep.send_get_rdma(now, b_nid, h, into, get)
            .map_err(|e| format!("send_get_rdma: {e}"))?;
        run_until(
            &mut [&mut a, &mut b],
            Duration::from_secs(60),
            &format!("size {len}"),
            |ns| {
                let ended = |n: &Node, c: u64| {
                    n.done_ok.contains(&c)
                        || n.send_failed.iter().any(|f| f.0 == c)
                        || n.rdma_done.iter().any(|d| d.0 == c)
                };
                ended(ns[0], put) && ended(ns[0], get) && ended(ns[1], put) && ended(ns[1], get)
            },
        )?;
        let ok = a.done_ok.contains(&put)
            && b.done_ok.contains(&get)
            && a.rdma_done.contains(&(get, Ok(len)))
            && b.rdma_done.contains(&(put, Ok(len)));
        if !ok {
            bad.push(format!(
                "size {len}: outcomes A {:?} {:?} B {:?} {:?}",
                a.send_failed, a.rdma_done, b.send_failed, b.rdma_done
            ));
        }
        let range = sink_off as usize..(sink_off + u64::from(len)) as usize;
        let src_range = src_off as usize..(src_off + u64::from(len)) as usize;
        for (who, got, want) in [
            (
                "B's sink",
                b.fabric.contents(&b_sink),
                &a_bytes[src_range.clone()],
            ),
            (
                "A's sink",
                a.fabric.contents(&a_sink),
                &b_bytes[src_range.clone()],
            ),
        ] {
            let Some(got) = got else {
                bad.push(format!("size {len}: {who} unreadable"));
                continue;
            };
            if got[range.clone()] != *want
                || got[..range.start].iter().any(|&x| x != 0xee)
                || got[range.end..].iter().any(|&x| x != 0xee)
            {
                bad.push(format!("size {len}: {who} does not hold exactly the data"));
            }
        }
        b.fabric.deregister(b_sink);
        a.fabric.deregister(a_sink);
    }
    let dt = t0.elapsed();
    checks.check(
        bad.is_empty(),
        format!(
            "{} PUTs and {} GETs of 1 B..1 MiB land byte for byte ({bad:?})",
            sizes.len(),
            sizes.len()
        ),
    );
    let total: u64 = sizes.iter().map(|&n| u64::from(n)).sum();
    checks.check(
        a.ep.stats().rdma_bytes_sent == total && b.ep.stats().rdma_bytes_sent == total,
        format!(
            "rendezvous bytes counted: A wrote {}, B wrote {} (want {total} each)",
            a.ep.stats().rdma_bytes_sent,
            b.ep.stats().rdma_bytes_sent
        ),
    );
    checks.check(
        a.ep.stats().established + b.ep.stats().established == 2,
        "one connection throughout",
    );
    println!(
        "verbs_bulk: sweep {:.1} ms ({} bytes each way)",
        dt.as_secs_f64() * 1e3,
        total
    );

    // 2. A sink running past its registration: 8 KiB advertised from a 4 KiB region.
    let small = reg(&mut b, vec![0x5a; 4096])?;
    let lie = RdmaSink {
        key: small.key(),
        frags: vec![RdmaFrag {
            nob: 8192,
            addr: small.addr(),
        }],
    };
    let b_writes_before = b.fabric.stats().rdma_writes;
    start_put(&mut a, &mut b, a_src.local_frag(0, 8192), lie, 3000, 9)?;
    run_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(60),
        "the lying sink",
        |ns| {
            ns[0].send_failed.iter().any(|f| f.0 == 3000)
                && ns[1].rdma_done.iter().any(|d| d.0 == 3000)
        },
    )?;
    checks.check(
        b.fabric.contents(&small) == Some(vec![0x5a; 4096]),
        "the victim's region is unchanged",
    );
    checks.check(
        b.fabric.stats().rdma_writes == b_writes_before,
        "the victim posted no write of its own",
    );
    checks.check(
        a.fabric.stats().rdma_write_errors >= 1,
        format!(
            "the writer's write failed at the device (rdma_write_errors {})",
            a.fabric.stats().rdma_write_errors
        ),
    );
    checks.check(
        b.rdma_done.iter().any(|d| d.0 == 3000 && d.1.is_err()),
        format!("B's side of it failed too ({:?})", b.rdma_done.last()),
    );
    // A new connection carries the next PUT.
    let sink = reg(&mut b, vec![0xee; 8192])?;
    let into = RdmaSink::of(&sink, 0, 5000);
    start_put(&mut a, &mut b, a_src.local_frag(0, 5000), into, 3001, 10)?;
    run_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(60),
        "the PUT after",
        |ns| {
            (ns[0].done_ok.contains(&3001) || ns[0].send_failed.iter().any(|f| f.0 == 3001))
                && ns[1].rdma_done.iter().any(|d| d.0 == 3001)
        },
    )?;
    let got = b.fabric.contents(&sink).unwrap_or_default();
    checks.check(
        a.done_ok.contains(&3001) && got.get(..5000) == Some(&a_bytes[..5000]),
        "a PUT on a new connection lands intact",
    );

    // 3. A router buffer shared by two fabrics: in through B, out through C.
    let len = MIB as u32 - 3;
    let mem = lnd::fabric::SharedMem::new(MIB);
    let at_b = b
        .fabric
        .register_shared(&mem)
        .map_err(|e| format!("B: register_shared: {e}"))?;
    let at_c = c
        .fabric
        .register_shared(&mem)
        .map_err(|e| format!("C: register_shared: {e}"))?;
    let into = RdmaSink::of(&at_b, 0, len);
    start_put(&mut a, &mut b, a_src.local_frag(100, len), into, 4000, 11)?;
    run_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(60),
        "into the shared buffer",
        |ns| ns[1].rdma_done.iter().any(|d| d.0 == 4000),
    )?;
    let want = &a_bytes[100..100 + len as usize];
    checks.check(
        b.rdma_done.contains(&(4000, Ok(len))) && mem.with(|m| m[..len as usize] == *want),
        "a PUT lands in memory registered with two fabrics",
    );
    let back = reg(&mut a, vec![0xee; MIB])?;
    let into = RdmaSink::of(&back, 0, len);
    start_put(&mut c, &mut a, at_c.local_frag(0, len), into, 4001, 12)?;
    run_until(
        &mut [&mut a, &mut c],
        Duration::from_secs(60),
        "out of the shared buffer",
        |ns| {
            ns[0].rdma_done.iter().any(|d| d.0 == 4001)
                && (ns[1].done_ok.contains(&4001) || ns[1].send_failed.iter().any(|f| f.0 == 4001))
        },
    )?;
    let got = a.fabric.contents(&back).unwrap_or_default();
    checks.check(
        c.done_ok.contains(&4001)
            && a.rdma_done.contains(&(4001, Ok(len)))
            && got.get(..len as usize) == Some(want)
            && got[len as usize..].iter().all(|&x| x == 0xee),
        "written on from the other fabric's registration of it, A gets back what it sent",
    );
    b.fabric.deregister(at_b);
    c.fabric.deregister(at_c);
    a.fabric.deregister(back);

    // 4. Close.
    for r in [small, sink, b_src] {
        b.fabric.deregister(r);
    }
    a.fabric.deregister(a_src);
    shutdown_all(&mut [&mut a, &mut b, &mut c], Duration::from_secs(20))?;
    checks.check(
        a.fabric.stats().regions == 0
            && b.fabric.stats().regions == 0
            && c.fabric.stats().regions == 0,
        "every registration released",
    );
    checks.check(
        a.established().is_empty() && b.established().is_empty(),
        "no connection left",
    );
    Ok(())
}
