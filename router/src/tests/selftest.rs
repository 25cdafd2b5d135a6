//! The selftest service and console between whole nodes: sessions, tests, data checks, direct
//! and through a router, over the unit-test fabric (instant, lossless, with memory).

use super::routing::{give_bulk_buffers, node, route};
use super::*;
use crate::selftest::{CheckSpec, LstCommand, LstNodeStat, LstReply, TestSpec};

const C: &str = "10.0.0.1@o2ib";
const S1: &str = "10.0.0.2@o2ib";
const RA: &str = "10.0.0.254@o2ib";
const RB: &str = "10.1.0.254@o2ib1";
const S2: &str = "10.1.0.2@o2ib1";

const LIMIT: Duration = Duration::from_secs(120);

/// A console and client (0), a server on its net (1), a router (2), a server beyond it (3);
/// selftest on 0, 1 and 3; a session with groups `c` = [0] and `s` = [1, 3].
fn three_nets() -> Fabric {
    let c = node(&[C], &[route("o2ib1", RA)], false, 10);
    let s1 = node(&[S1], &[route("o2ib1", RA)], false, 20);
    let r = node(&[RA, RB], &[], true, 30);
    let s2 = node(&[S2], &[route("o2ib", RB)], false, 40);
    let mut f = Fabric::from_configs(vec![c, s1, r, s2]);
    give_bulk_buffers(&mut f, &[2], 16);
    for n in [0, 1, 3] {
        f.start_selftest(n);
    }
    ok(f.lst(0, new_session("t"), LIMIT));
    let r = ok(f.lst(0, group("c", &[C]), LIMIT));
    assert!(r.nodes.iter().all(|n| n.state == "ok"), "{r:?}");
    let r = ok(f.lst(0, group("s", &[S1, S2]), LIMIT));
    assert!(r.nodes.iter().all(|n| n.state == "ok"), "{r:?}");
    f
}

fn ok(r: Result<LstReply, crate::selftest::LstError>) -> LstReply {
    r.unwrap_or_else(|e| panic!("lst: {e}"))
}

fn new_session(name: &str) -> LstCommand {
    LstCommand::NewSession {
        name: name.into(),
        timeout: Some(10),
        force: false,
    }
}

fn group(name: &str, nids: &[&str]) -> LstCommand {
    LstCommand::AddGroup {
        name: name.into(),
        nids: nids.iter().map(|s| s.to_string()).collect(),
    }
}

fn add_test(batch: &str, test: TestSpec, loops: i64, concurrency: u32) -> LstCommand {
    LstCommand::AddTest {
        batch: batch.into(),
        loop_count: Some(loops),
        concurrency: Some(concurrency),
        distribute: Some((1, 2)),
        from: "c".into(),
        to: "s".into(),
        stop_onerr: false,
        test,
    }
}

/// Runs `batch` until no node has it active, then reads every node's counters.
fn run_to_end(f: &mut Fabric, batch: &str) -> Vec<LstNodeStat> {
    ok(f.lst(
        0,
        LstCommand::Run {
            batch: batch.into(),
        },
        LIMIT,
    ));
    for _ in 0..1000 {
        f.run_for(Duration::from_millis(50));
        let q = ok(f.lst(
            0,
            LstCommand::Query {
                batch: batch.into(),
            },
            LIMIT,
        ));
        if q.nodes.iter().all(|n| n.active == Some(0)) {
            let s = ok(f.lst(
                0,
                LstCommand::Stat {
                    groups: vec!["c".into(), "s".into()],
                },
                LIMIT,
            ));
            return s.stats;
        }
    }
    panic!("batch {batch} never ended");
}

fn stat<'a>(stats: &'a [LstNodeStat], nid: &str) -> &'a LstNodeStat {
    stats
        .iter()
        .find(|s| s.nid == nid)
        .expect("a stat per node")
}

/// brw read and write with check=full, 1 B to 1 MiB, lengths that are not multiples of 8 and
/// non-zero offsets, to a server on the client's net and to one through a router: every
/// transfer checks clean, and every server moved exactly what the tests asked (4 RPCs each:
/// 2 units per destination, 2 loops).
#[test]
fn brw_full_check_sweep_direct_and_routed() {
    let mut f = three_nets();
    let mut k = 0;
    let (mut put, mut get) = (0u64, 0u64);
    for size in [1u32, 7, 8, 3976, 3977, 4095, 4097, 65_537, 1 << 20] {
        for off in [0u32, 8, 4088] {
            for write in [false, true] {
                k += 1;
                let b = format!("b{k}");
                ok(f.lst(0, LstCommand::AddBatch { name: b.clone() }, LIMIT));
                let spec = TestSpec::Brw {
                    write,
                    size,
                    check: CheckSpec::Full,
                    off,
                };
                ok(f.lst(0, add_test(&b, spec, 2, 2), LIMIT));
                let stats = run_to_end(&mut f, &b);
                let c = stat(&stats, C);
                assert_eq!(
                    (c.brw_errors, c.rpc_errors, c.rpcs_expired),
                    (0, 0, 0),
                    "size {size} off {off} write {write}: {c:?}"
                );
                if write {
                    get += 4 * u64::from(size);
                } else {
                    put += 4 * u64::from(size);
                }
                for s in [S1, S2] {
                    let s = stat(&stats, s);
                    assert_eq!((s.bulk_put, s.bulk_get), (put, get), "{size} {off} {write}");
                    assert_eq!(s.rpc_errors, 0, "{s:?}");
                }
            }
        }
    }
    ok(f.lst(0, LstCommand::EndSession, LIMIT));
    // Every buffer went back and was deregistered with the session.
    for n in [1, 3] {
        assert_eq!(f.selftest(n).registered_bytes(), 0, "node {n}");
    }
    assert_eq!(f.selftest(0).rpcs_in_flight(), 0);
}

/// Data corrupted in flight fails the check on the side that checks it: the client for a
/// read, the server (EBADMSG to the client) for a write; both counted as brw errors.
#[test]
fn brw_check_catches_corrupted_data() {
    for write in [false, true] {
        let mut f = three_nets();
        f.corrupt_writes = if write { vec![1, 3] } else { vec![0] };
        ok(f.lst(0, LstCommand::AddBatch { name: "b".into() }, LIMIT));
        let spec = TestSpec::Brw {
            write,
            size: 8192,
            check: CheckSpec::Full,
            off: 0,
        };
        ok(f.lst(0, add_test("b", spec, 3, 1), LIMIT));
        let stats = run_to_end(&mut f, "b");
        assert_eq!(stat(&stats, C).brw_errors, 6, "write {write}: {stats:?}");
    }
}

/// Ping tests: every ping answered, latency recorded, nodes' counters add up.
#[test]
fn ping_test_counts_and_measures() {
    let mut f = three_nets();
    ok(f.lst(0, LstCommand::AddBatch { name: "p".into() }, LIMIT));
    ok(f.lst(0, add_test("p", TestSpec::Ping, 50, 4), LIMIT));
    let stats = run_to_end(&mut f, "p");
    let c = stat(&stats, C);
    assert_eq!(c.ping_errors, 0);
    // 2 destinations x 4 units x 50 loops, plus the console's own framework RPCs.
    assert!(c.rpcs_sent >= 400, "{c:?}");
    for s in [S1, S2] {
        assert!(stat(&stats, s).rpcs_rcvd >= 200, "{stats:?}");
    }
    let l = ok(f.lst(0, LstCommand::Latency, LIMIT));
    assert_eq!(l.latency.len(), 1);
    assert_eq!(l.latency[0].count, 400);
    assert!(l.latency[0].p50_us <= l.latency[0].p99_us);
}

/// A node is in one session: a second console gets EBUSY until it forces; the first then
/// finds its session gone (ESRCH).
#[test]
fn one_session_per_node_and_force_takes_over() {
    let mut f = three_nets();
    // Node 3 as a second console, for node 1.
    ok(f.lst(3, new_session("other"), LIMIT));
    let r = ok(f.lst(3, group("g", &[S1]), LIMIT));
    assert_eq!(r.nodes[0].status, Some(16), "{r:?}");
    assert_eq!(r.nodes[0].state, "EBUSY (in another session)");
    let r = ok(f.lst(0, LstCommand::Ping { group: "s".into() }, LIMIT));
    assert!(r.nodes.iter().all(|n| n.status == Some(0)), "{r:?}");
    // Forced, it takes node 1; the first console's session there is gone.
    let force = LstCommand::NewSession {
        name: "other".into(),
        timeout: None,
        force: true,
    };
    ok(f.lst(3, force, LIMIT));
    let r = ok(f.lst(3, group("g", &[S1]), LIMIT));
    assert_eq!(r.nodes[0].status, Some(0), "{r:?}");
    let r = ok(f.lst(0, LstCommand::Ping { group: "s".into() }, LIMIT));
    let states: Vec<Option<u32>> = r.nodes.iter().map(|n| n.status).collect();
    assert_eq!(states, vec![Some(3), Some(0)], "{r:?}");
}

/// The session on a node ends when its console goes silent (the console's pings keep it
/// while the console lives), and a stat of a dead node is reported, not waited on forever.
#[test]
fn sessions_outlive_quiet_consoles_only_while_pinged() {
    let mut f = three_nets();
    f.run_for(Duration::from_secs(700));
    let r = ok(f.lst(0, LstCommand::Ping { group: "s".into() }, LIMIT));
    assert!(
        r.nodes.iter().all(|n| n.status == Some(0)),
        "pinged sessions live: {r:?}"
    );
    // The console's node dies: the servers' sessions expire.
    f.selftests[0] = None;
    f.run_for(Duration::from_secs(400));
    f.start_selftest(0);
    ok(f.lst(0, new_session("again"), LIMIT));
    let r = ok(f.lst(0, group("s", &[S1, S2]), LIMIT));
    assert!(
        r.nodes.iter().all(|n| n.state == "ok"),
        "old sessions expired: {r:?}"
    );
    f.kill(3);
    let r = ok(f.lst(
        0,
        LstCommand::Stat {
            groups: vec!["s".into()],
        },
        LIMIT,
    ));
    assert!(r.message.contains("Failed to stat on 1"), "{r:?}");
    assert!(stat(&r.stats, S2).error.is_some());
}

/// A node can be its own brw server and the console's own test client: bulk to itself is
/// copied in memory and checked like any other.
#[test]
fn loopback_tests_run_on_the_console_node() {
    let mut f = three_nets();
    ok(f.lst(0, group("me", &[C]), LIMIT));
    ok(f.lst(0, LstCommand::AddBatch { name: "l".into() }, LIMIT));
    for write in [false, true] {
        let add = LstCommand::AddTest {
            batch: "l".into(),
            loop_count: Some(3),
            concurrency: Some(2),
            distribute: None,
            from: "me".into(),
            to: "me".into(),
            stop_onerr: false,
            test: TestSpec::Brw {
                write,
                size: 10_001,
                check: CheckSpec::Full,
                off: 16,
            },
        };
        ok(f.lst(0, add, LIMIT));
    }
    ok(f.lst(0, LstCommand::Run { batch: "l".into() }, LIMIT));
    f.run_for(Duration::from_secs(1));
    let s = ok(f.lst(
        0,
        LstCommand::Stat {
            groups: vec!["me".into()],
        },
        LIMIT,
    ));
    let me = &s.stats[0];
    assert_eq!(me.brw_errors, 0, "{me:?}");
    // Two destination lists of one 12-byte id, then 6 RPCs of 10 001 bytes each way.
    assert_eq!((me.bulk_put, me.bulk_get), (60_006, 60_006 + 24), "{me:?}");
}
