//! An ungraceful peer death over real verbs (run it in the Soft-RoCE guest: tests/rxe/run.sh).
//!
//! The parent (A, 10.0.0.2@o2ib) starts a copy of itself as a child process (B, 10.0.0.1@o2ib).
//! A sends 64 messages; B takes the first 4 and then holds every message it gets, so it returns
//! no more credits and A's messages pile up on the connection. Then the parent SIGKILLs the child
//! (no close, no DREQ from B's code) and measures how long A takes to notice: the connection goes
//! (a disconnect from the kernel's cm, or error completions), A reports B down and fails every
//! message still queued with a TxError, all within keepalive + timeout (2 s + 4 s here).
//!
//! Then, in the parent alone, a fabric that fails for good (the daemon's `lose_fabric`): C and
//! D connect, D's fabric is abandoned and D is turned no more; C must learn it from the
//! disconnect abandon sends, long before its keepalive + timeout (6 s) would tell it.
//!
//! Exit 0 on success, 1 with the failed checks otherwise.
//! Usage: verbs_kill [IP]       (the child is `verbs_kill child IP PORT`)

#[path = "verbs_common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{ip_arg, nid, payload, run_until, Checks, Node};
use lnd::engine::EndpointConfig;

const TOTAL: u64 = 64;
const TAKE: u64 = 4;
const PORT: u16 = 9900;

fn tune(c: &mut EndpointConfig) {
    c.tunables.keepalive = Duration::from_secs(2).into();
    c.tunables.timeout = Duration::from_secs(4).into();
}

fn book(ip: IpAddr) -> HashMap<lnd::wire::Nid, SocketAddr> {
    [
        (nid("10.0.0.2@o2ib"), SocketAddr::new(ip, PORT + 1)),
        (nid("10.0.0.1@o2ib"), SocketAddr::new(ip, PORT)),
    ]
    .into()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("child") {
        let ip: IpAddr = args.get(1).and_then(|s| s.parse().ok()).expect("child IP");
        if let Err(e) = child(ip) {
            eprintln!("verbs_kill child: {e}");
            std::process::exit(1);
        }
        return;
    }
    let ip = ip_arg(args.first().cloned());
    let mut checks = Checks::new("verbs_kill");
    let r = parent(ip, &mut checks);
    checks.step(r);
    let r = abandoned(ip, &mut checks);
    checks.step(r);
    let r = woken_while_spinning(ip, &mut checks);
    checks.step(r);
    checks.finish();
}

/// A wake-up from another thread (a router's forward handed to this NI) ends the fabric's
/// busy-poll in the round it comes (the doorbell), rather than when the spin budget is spent:
/// E spins for up to 10 s, woken after 50 ms.
fn woken_while_spinning(ip: IpAddr, checks: &mut Checks) -> Result<(), String> {
    use lnd::driver::{Driver, Waker};
    let e_nid = nid("10.0.0.5@o2ib");
    let addr = SocketAddr::new(ip, PORT + 4);
    let mut e = Node::new("E", e_nid, 11, addr, [(e_nid, addr)].into(), tune)?;
    let spin = Duration::from_secs(10);
    e.fabric.set_busy_poll(spin);
    let (waker, handle) = Waker::new().map_err(|e| format!("waker: {e}"))?;
    Driver::set_waker(&mut e.fabric, waker.fd());
    Driver::set_doorbell(&mut e.fabric, waker.doorbell());
    let t0 = Instant::now();
    let kick = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        handle.wake();
    });
    let Node {
        fabric, ep, clock, ..
    } = &mut e;
    fabric
        .poll(Some(spin), ep, || clock.now())
        .map_err(|e| format!("E: poll: {e}"))?;
    let took = t0.elapsed();
    let _ = kick.join();
    println!(
        "verbs_kill: WOKEN_WHILE_SPINNING after_ms={:.1}",
        took.as_secs_f64() * 1e3
    );
    checks.check(
        took < spin / 2,
        format!("a wake-up ended a 10 s busy-poll at once, not at its end ({took:?})"),
    );
    Ok(())
}

/// B: takes TAKE messages, then holds everything; runs until killed.
fn child(ip: IpAddr) -> Result<(), String> {
    let book = book(ip);
    let me = nid("10.0.0.1@o2ib");
    let mut b = Node::new("B", me, 7, book[&me], book, tune)?;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "READY");
    let _ = out.flush();
    let mut holding = false;
    loop {
        b.turn(Duration::from_millis(5))?;
        if !holding && b.received >= TAKE {
            holding = true;
            b.hold = true;
            let _ = writeln!(out, "HOLDING");
            let _ = out.flush();
        }
        b.inbox.clear();
    }
}

fn parent(ip: IpAddr, checks: &mut Checks) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut kid = Command::new(exe)
        .args(["child", &ip.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning the child: {e}"))?;
    let (tx, rx) = mpsc::channel();
    let stdout = kid.stdout.take().ok_or("no child stdout")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let wait_line = |want: &str, limit: Duration| -> Result<(), String> {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l == want => return Ok(()),
                Ok(_) => {}
                Err(_) => return Err(format!("the child never said {want}")),
            }
        }
    };
    let result = (|| -> Result<(), String> {
        wait_line("READY", Duration::from_secs(20))?;
        let book = book(ip);
        let (me, peer) = (nid("10.0.0.2@o2ib"), nid("10.0.0.1@o2ib"));
        let mut a = Node::new("A", me, 8, book[&me], book, tune)?;
        for i in 0..TOTAL {
            a.send(peer, payload(1, i), i)?;
        }
        // Until the child holds and A's sends stop completing (credits gone).
        let mut held = false;
        let mut stable_since = Instant::now();
        let mut last = 0;
        run_until(
            &mut [&mut a],
            Duration::from_secs(20),
            "credits run out",
            |ns| {
                if rx.try_recv().is_ok_and(|l| l == "HOLDING") {
                    held = true;
                }
                if ns[0].sent_ok != last {
                    last = ns[0].sent_ok;
                    stable_since = Instant::now();
                }
                held && stable_since.elapsed() > Duration::from_millis(300)
            },
        )?;
        let queued = a.queued_on_conns();
        let ok_before = a.sent_ok;
        checks.check(
            queued > 0 && a.established().len() == 1,
            format!("before the kill: {ok_before} delivered, {queued} queued waiting for credits"),
        );
        // SIGKILL.
        kid.kill().map_err(|e| format!("kill: {e}"))?;
        let t0 = Instant::now();
        let disc0 = a.fabric.stats().disconnects;
        let mut disc_at = None;
        let bound = Duration::from_secs(6);
        run_until(
            &mut [&mut a],
            bound + Duration::from_secs(4),
            "detect the dead peer",
            |ns| {
                if disc_at.is_none() && ns[0].fabric.stats().disconnects > disc0 {
                    disc_at = Some(t0.elapsed());
                }
                !ns[0].downs.is_empty() && ns[0].sent_ok + ns[0].send_failed.len() as u64 == TOTAL
            },
        )?;
        let down_at = a.downs[0].2.duration_since(t0);
        let all_failed_at = t0.elapsed();
        println!(
            "verbs_kill: DETECTION disconnect_event_ms={} peer_down_ms={:.1} queued_failed_ms={:.1} reason={:?}",
            disc_at.map_or("none".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3)),
            down_at.as_secs_f64() * 1e3,
            all_failed_at.as_secs_f64() * 1e3,
            a.downs[0].1
        );
        checks.check(
            down_at <= bound,
            format!(
                "A reported B down {:.1} ms after the SIGKILL (bound: keepalive + timeout = {bound:?})",
                down_at.as_secs_f64() * 1e3
            ),
        );
        let mut kinds: HashMap<String, u64> = HashMap::new();
        for (_, e) in &a.send_failed {
            *kinds.entry(format!("{e:?}")).or_default() += 1;
        }
        checks.check(
            a.send_failed.len() as u64 >= queued as u64
                && a.sent_ok + a.send_failed.len() as u64 == TOTAL,
            format!(
                "every undelivered message failed with a status: {} failed {kinds:?}, {} delivered",
                a.send_failed.len(),
                a.sent_ok
            ),
        );
        common::shutdown_all(&mut [&mut a], Duration::from_secs(10))?;
        checks.check(
            a.fabric.connections() == 0,
            "A reclaimed the dead connection (fabric holds none)",
        );
        println!("verbs_kill: A engine {:?}", a.ep.stats());
        println!("verbs_kill: A fabric {:?}", a.fabric.stats());
        Ok(())
    })();
    let _ = kid.kill();
    match kid.wait() {
        Ok(st) => {
            use std::os::unix::process::ExitStatusExt;
            checks.check(
                st.signal() == Some(9),
                format!("the child died of SIGKILL ({st})"),
            );
        }
        Err(e) => checks.fail(format!("wait for the child: {e}")),
    }
    result
}

/// C and D in this process; D's fabric fails for good (abandoned, never turned again).
fn abandoned(ip: IpAddr, checks: &mut Checks) -> Result<(), String> {
    let (c_nid, d_nid) = (nid("10.0.0.3@o2ib"), nid("10.0.0.4@o2ib"));
    let book: HashMap<_, _> = [
        (c_nid, SocketAddr::new(ip, PORT + 2)),
        (d_nid, SocketAddr::new(ip, PORT + 3)),
    ]
    .into();
    let mut c = Node::new("C", c_nid, 9, book[&c_nid], book.clone(), tune)?;
    let mut d = Node::new("D", d_nid, 10, book[&d_nid], book, tune)?;
    c.send(d_nid, payload(3, 0), 0)?;
    run_until(
        &mut [&mut c, &mut d],
        Duration::from_secs(20),
        "C reaches D",
        |ns| ns[0].sent_ok == 1 && ns[1].received == 1,
    )?;
    let disc0 = c.fabric.stats().disconnects;
    d.fabric.abandon();
    let t0 = Instant::now();
    // Less than keepalive + timeout: only D's disconnect can end it in time.
    run_until(
        &mut [&mut c],
        Duration::from_secs(5),
        "C learns that D's fabric is gone",
        |ns| !ns[0].downs.is_empty(),
    )?;
    println!(
        "verbs_kill: ABANDON peer_down_ms={:.1} reason={:?}",
        t0.elapsed().as_secs_f64() * 1e3,
        c.downs[0].1
    );
    checks.check(
        c.fabric.stats().disconnects > disc0,
        "C saw D's abandoned fabric as a disconnect, not by its keepalive",
    );
    // D's listener went with its fabric: a new connect is refused by the CM ("no listener"),
    // not left to its connect deadline (the LND timeout, 4 s here) at a listener nobody reads.
    let t1 = Instant::now();
    c.send(d_nid, payload(4, 0), 1)?;
    run_until(
        &mut [&mut c],
        Duration::from_secs(20),
        "C's send to the abandoned D ends",
        |ns| !ns[0].send_failed.is_empty(),
    )?;
    println!(
        "verbs_kill: ABANDON_RECONNECT failed_ms={:.1} error={:?}",
        t1.elapsed().as_secs_f64() * 1e3,
        c.send_failed[0].1
    );
    checks.check(
        c.send_failed[0].1 == lnd::engine::TxError::ConnectRefused,
        "C's connect to the abandoned D was refused (nothing listens), not timed out",
    );
    common::shutdown_all(&mut [&mut c], Duration::from_secs(10))?;
    checks.check(
        c.fabric.connections() == 0,
        "C reclaimed the connection (fabric holds none)",
    );
    Ok(())
}
