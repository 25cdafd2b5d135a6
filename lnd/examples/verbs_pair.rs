//! Two verbs-fabric endpoints in one process over a real RDMA device (run it inside the Soft-RoCE
//! guest: tests/rxe/run.sh).
//!
//! 1. A (10.0.0.2@o2ib) connects to B (10.0.0.1@o2ib) and sends N IMMEDIATE messages; B sends its
//!    own N once the first arrived. Every message arrives intact and in order; credits flow back
//!    on the messages themselves.
//! 2. One way: A sends 200 more and B sends nothing, so B can only return credits with NOOPs
//!    (its `credit_noops` must grow, or A's sends would stall on credits).
//! 3. Idle for 2.6 s with keepalive = 1 s: both sides send keepalive NOOPs and nobody is declared
//!    silent (keepalive + timeout = 11 s).
//! 4. A shuts down gracefully: B sees the disconnect (PeerDown, reason Closed) and shuts down;
//!    both fabrics end with no connection.
//!
//! Exit 0 on success, 1 with the failed checks otherwise.
//! Usage: verbs_pair [IP] [N]   (defaults: 10.0.0.1, 1000; ports 9870 and 9871)

#[path = "verbs_common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::{check_payload, ip_arg, nid, payload, run_until, Checks, Node};
use lnd::engine::DownReason;

const ONE_WAY: u64 = 200;

fn main() {
    let mut args = std::env::args().skip(1);
    let ip = ip_arg(args.next());
    let n: u64 = args.next().map_or(1000, |s| s.parse().expect("N"));
    let mut checks = Checks::new("verbs_pair");
    let r = run(ip, n, &mut checks);
    checks.step(r);
    checks.finish();
}

fn run(ip: IpAddr, n: u64, checks: &mut Checks) -> Result<(), String> {
    let (a_nid, b_nid) = (nid("10.0.0.2@o2ib"), nid("10.0.0.1@o2ib"));
    let (addr_a, addr_b) = (SocketAddr::new(ip, 9871), SocketAddr::new(ip, 9870));
    let book: HashMap<_, _> = [(a_nid, addr_a), (b_nid, addr_b)].into();
    let tune = |c: &mut lnd::engine::EndpointConfig| {
        c.tunables.keepalive = Duration::from_secs(1).into();
        c.tunables.timeout = Duration::from_secs(10).into();
    };
    let mut b = Node::new("B", b_nid, 2, addr_b, book.clone(), tune)?;
    let mut a = Node::new("A", a_nid, 1, addr_a, book, tune)?;
    println!(
        "verbs_pair: device {}, A {} <-> B {}",
        a.fabric.device_name(),
        a.fabric.local_addr(),
        b.fabric.local_addr()
    );

    // 1. N each way.
    let t0 = std::time::Instant::now();
    for i in 0..n {
        a.send(b_nid, payload(1, i), i)?;
    }
    let mut b_started = false;
    let (mut a_seq, mut b_seq) = (InOrder::default(), InOrder::default());
    let mut corrupt = Vec::new();
    run_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(60),
        "N each way",
        |ns| {
            let (a, b) = ns.split_at_mut(1);
            let (a, b) = (&mut *a[0], &mut *b[0]);
            // B starts its half once A's first message is in.
            if b_seq.take(b, 1, &mut corrupt) > 0 && !b_started {
                b_started = true;
                for i in 0..n {
                    if let Err(e) = b.send(a_nid, payload(2, i), i) {
                        corrupt.push(e);
                    }
                }
            }
            a_seq.take(a, 2, &mut corrupt);
            let fin = |x: &common::Node| x.sent_ok + x.send_failed.len() as u64 == n;
            (a.received == n && b.received == n && fin(a) && fin(b)) || !corrupt.is_empty()
        },
    )?;
    let dt = t0.elapsed();
    checks.check(corrupt.is_empty(), format!("payloads intact ({corrupt:?})"));
    checks.check(
        a.sent_ok == n && b.sent_ok == n,
        format!(
            "{n} sends each way completed ok (A {}, B {})",
            a.sent_ok, b.sent_ok
        ),
    );
    checks.check(
        a.received == n && b.received == n && a_seq.in_order && b_seq.in_order,
        format!("{n} received each way, in order"),
    );
    println!(
        "verbs_pair: {} messages in {:.2} s ({:.0} msg/s)",
        2 * n,
        dt.as_secs_f64(),
        (2 * n) as f64 / dt.as_secs_f64()
    );

    // 2. One way: B returns credits only with NOOPs.
    let b_noops = b.ep.stats().credit_noops;
    let b_sent_msgs = b.ep.stats().msgs_sent;
    for i in 0..ONE_WAY {
        a.send(b_nid, payload(1, n + i), n + i)?;
    }
    run_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(30),
        "one way",
        |ns| ns[0].sent_ok == n + ONE_WAY && ns[1].received == n + ONE_WAY,
    )?;
    b.inbox.clear();
    let noops = b.ep.stats().credit_noops - b_noops;
    checks.check(
        noops > 0,
        format!(
            "B returned credits with {noops} NOOPs while receiving {ONE_WAY} with nothing to send \
             ({} messages sent by B in all, all NOOPs)",
            b.ep.stats().msgs_sent - b_sent_msgs
        ),
    );

    // 3. Idle: keepalives on both sides.
    let (ka, kb) = (a.ep.stats().keepalives, b.ep.stats().keepalives);
    let idle = std::time::Instant::now();
    run_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "idle",
        |_| idle.elapsed() >= Duration::from_millis(2600),
    )?;
    let (ka, kb) = (a.ep.stats().keepalives - ka, b.ep.stats().keepalives - kb);
    checks.check(
        ka > 0 && kb > 0,
        format!("keepalive NOOPs during 2.6 s idle (keepalive 1 s): A {ka}, B {kb}"),
    );
    checks.check(
        a.downs.is_empty() && b.downs.is_empty() && a.established().len() == 1,
        "the idle link stayed up on one connection",
    );

    // 4. A closes gracefully; B sees it and follows.
    let now = a.now();
    a.ep.shutdown(now);
    let closed_at = std::time::Instant::now();
    run_until(
        &mut [&mut a, &mut b],
        Duration::from_secs(10),
        "B sees A go",
        |ns| !ns[1].downs.is_empty() && ns[0].ep.is_shut_down(),
    )?;
    let seen = b.downs[0].2.duration_since(closed_at);
    checks.check(
        b.downs[0].1 == DownReason::Closed && b.fabric.stats().disconnects >= 1,
        format!(
            "B saw A's graceful close as a disconnect ({:?}) after {:.1} ms",
            b.downs[0].1,
            seen.as_secs_f64() * 1e3
        ),
    );
    common::shutdown_all(&mut [&mut a, &mut b], Duration::from_secs(10))?;
    checks.check(
        a.ep.stats().graceful_closes >= 1 && a.ep.stats().ungraceful_drops == 0,
        format!(
            "A closed gracefully ({} graceful closes)",
            a.ep.stats().graceful_closes
        ),
    );
    checks.check(
        a.fabric.connections() == 0 && b.fabric.connections() == 0,
        "both fabrics hold no connection at the end",
    );
    println!("verbs_pair: A engine {:?}", a.ep.stats());
    println!("verbs_pair: B engine {:?}", b.ep.stats());
    println!("verbs_pair: A fabric {:?}", a.fabric.stats());
    println!("verbs_pair: B fabric {:?}", b.fabric.stats());
    Ok(())
}

/// One direction of the exchange as its receiver sees it: the next index due, and whether every
/// payload so far came in order.
struct InOrder {
    next: u64,
    in_order: bool,
}

impl Default for InOrder {
    fn default() -> InOrder {
        InOrder {
            next: 0,
            in_order: true,
        }
    }
}

impl InOrder {
    /// Takes everything in `node`'s inbox, payloads of `tag`: an intact one must carry the next
    /// index, a corrupt one goes to `corrupt`. How many were taken.
    fn take(&mut self, node: &mut Node, tag: u64, corrupt: &mut Vec<String>) -> usize {
        let mut taken = 0;
        while let Some((_, p)) = node.inbox.pop_front() {
            taken += 1;
            match check_payload(tag, &p) {
                Ok(i) => {
                    self.in_order &= i == self.next;
                    self.next += 1;
                }
                Err(e) => corrupt.push(e),
            }
        }
        taken
    }
}
