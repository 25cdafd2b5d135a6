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
    let step = Duration::from_millis(50);
    run_until_idle(f, batch, 1000, step, &["c", "s"])
        .unwrap_or_else(|| panic!("batch {batch} never ended"))
}

/// Runs `batch` and queries it every `step`, up to `steps` times, until no node has it
/// active; then the counters of the nodes of `groups`.
fn run_until_idle(
    f: &mut Fabric,
    batch: &str,
    steps: u64,
    step: Duration,
    groups: &[&str],
) -> Option<Vec<LstNodeStat>> {
    let batch = batch.to_string();
    ok(f.lst(
        0,
        LstCommand::Run {
            batch: batch.clone(),
        },
        LIMIT,
    ));
    for _ in 0..steps {
        f.run_for(step);
        let q = ok(f.lst(
            0,
            LstCommand::Query {
                batch: batch.clone(),
            },
            LIMIT,
        ));
        if q.nodes.iter().all(|n| n.active == Some(0)) {
            let groups = groups.iter().map(|g| g.to_string()).collect();
            return Some(ok(f.lst(0, LstCommand::Stat { groups }, LIMIT)).stats);
        }
    }
    None
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
    // S1 answers the session query with the other console's session: busy, for us.
    let states: Vec<Option<u32>> = r.nodes.iter().map(|n| n.status).collect();
    assert_eq!(states, vec![Some(16), Some(0)], "{r:?}");
    assert_eq!(r.nodes[0].state, "EBUSY (in another session)");
    // Our REMOVE_SESSION does not end the other console's session there (EBUSY).
    let r = ok(f.lst(0, LstCommand::EndSession, LIMIT));
    assert!(r.nodes.iter().any(|n| n.status == Some(16)), "{r:?}");
    let r = ok(f.lst(3, LstCommand::Ping { group: "g".into() }, LIMIT));
    assert_eq!(
        r.nodes[0].status,
        Some(0),
        "still in the other session: {r:?}"
    );
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

// ------------------------------------------------------------------------------------------
// Review tests: leaks, hostile peers, Lustre fidelity, liveness.
// ------------------------------------------------------------------------------------------

use crate::selftest::wire::{
    BatchRequest, BrwReply, BrwRequest, LstBid, LstName, LstSid, MakeSessionRequest, PingRequest,
    SrpcBody, SrpcMsg, TestParams, TestRequest, BRW_MAGIC, LST_FEATS_MASK, LST_FEAT_NONE,
    LST_PING_TEST_MAGIC, SRPC_BATCH_OPC_QUERY, SRPC_FRAMEWORK_REQUEST_PORTAL, SRPC_MSG_LEN,
    SRPC_RDMA_PORTAL, SRPC_REQUEST_PORTAL,
};
use crate::selftest::wire::{BrwCheck, BrwOp, ServiceId};

/// Entries of `census` that are not zero.
/// Node `n` has no MD posted, and its selftest tracks none.
fn assert_no_mds(f: &mut Fabric, n: usize) {
    assert_eq!(f.nodes[n].posted_mds(), 0);
    let c = f.selftest(n).census();
    assert_eq!(
        c.iter().find(|(k, _)| *k == "mds").map(|e| e.1),
        Some(0),
        "{c:?}"
    );
}

fn nonzero(c: &[(&'static str, usize)]) -> Vec<(&'static str, usize)> {
    c.iter().copied().filter(|(_, v)| *v != 0).collect()
}

/// A stranger on node `from` (no selftest there: a kernel node, or a hostile one) PUTs `bytes`
/// to (`to`, `portal`, `mb`), and the fabric runs a little.
fn raw_put(f: &mut Fabric, from: usize, to: &str, portal: u32, mb: u64, bytes: Vec<u8>) {
    let now = f.now;
    f.nodes[from]
        .send_put(now, nid(to), portal, mb, bytes)
        .expect("sent");
    f.run_for(Duration::from_millis(100));
}

/// A kernel node (node 2, no selftest of ours) sends srpc request `body` for `service` to
/// (`to`, `portal`), and the fabric runs a little.
fn kernel_rpc(
    f: &mut Fabric,
    to: &str,
    portal: u32,
    service: ServiceId,
    features: u32,
    body: SrpcBody,
) {
    raw_put(f, 2, to, portal, service as u64, raw_msg(features, body));
}

/// The session id of a kernel console on the router's NID.
fn kernel_sid(stamp: i64) -> LstSid {
    LstSid {
        nid: nid(RA),
        stamp,
    }
}

/// That kernel console takes `to` into its session `sid` (MAKE_SESSION `rpyid`, forced).
fn kernel_session(f: &mut Fabric, to: &str, sid: LstSid, rpyid: u64, features: u32) {
    let mk = MakeSessionRequest {
        rpyid,
        sid,
        force: 1,
        name: LstName::new("k").unwrap(),
    };
    let fw = SRPC_FRAMEWORK_REQUEST_PORTAL;
    kernel_rpc(f, to, fw, ServiceId::MakeSession, features, mk.into());
}

/// The kernel console posts, for a client's GET of bulk `bulkid`, a `len`-byte destination
/// list naming `dest`.
fn post_dest_list(f: &mut Fabric, dest: &str, len: usize, bulkid: u64) {
    use crate::selftest::wire::{emit_dest_ids, ProcessId};
    let mut list = vec![0u8; len];
    let id = ProcessId {
        nid: nid(dest),
        pid: LNET_PID_LUSTRE,
    };
    emit_dest_ids(&[id], 4096, &mut list, lnd::wire::ByteOrder::Little).unwrap();
    let reg = f.register(2, list);
    let buf = BulkBuf::new(NiIndex(0), &reg, 0, len as u32).unwrap();
    f.nodes[2].post_source(SRPC_RDMA_PORTAL, bulkid, buf);
}

/// The kernel console's client test in batch 5 of `sid` (request `rpyid`), one unit, its one
/// destination in the list at bulk `rpyid + 1` ([`post_dest_list`]).
fn kernel_client_test(sid: LstSid, rpyid: u64, loop_count: u32, params: TestParams) -> TestRequest {
    TestRequest {
        rpyid,
        bulkid: rpyid + 1,
        sid,
        bid: LstBid(5),
        loop_count,
        concur: 1,
        is_client: true,
        stop_onerr: false,
        ndest: 1,
        params,
    }
}

/// The kernel console runs batch 5 of `sid` (request `rpyid`).
fn kernel_run(sid: LstSid, rpyid: u64) -> BatchRequest {
    BatchRequest {
        rpyid,
        sid,
        bid: LstBid(5),
        opc: crate::selftest::wire::SRPC_BATCH_OPC_RUN,
        testidx: 0,
        arg: 0,
    }
}

fn raw_msg(features: u32, body: SrpcBody) -> Vec<u8> {
    let mut p = vec![0u8; SRPC_MSG_LEN];
    SrpcMsg { features, body }
        .emit(&mut p, lnd::wire::ByteOrder::Little)
        .expect("emits");
    p
}

/// The selftest replies node `n` (without a selftest) got: (rpyid, message).
fn raw_replies(f: &mut Fabric, n: usize) -> Vec<(u64, SrpcMsg)> {
    f.take_events(n)
        .into_iter()
        .filter_map(|(_, e)| match e {
            LnetEvent::Put {
                portal,
                match_bits,
                payload,
                ..
            } if portal == SRPC_RDMA_PORTAL => {
                Some((match_bits, SrpcMsg::parse(&payload).expect("a reply").0))
            }
            _ => None,
        })
        .collect()
}

/// Runs `batch` and waits (up to `secs` of virtual time) until no client has it active, then
/// reads the counters of every node.
fn run_slow_to_end(f: &mut Fabric, batch: &str, secs: u64) -> Vec<LstNodeStat> {
    run_until_idle(f, batch, secs, Duration::from_secs(1), &["c"])
        .unwrap_or_else(|| panic!("batch {batch} still active after {secs} s"))
}

/// Ending a session while a batch runs: the aborted RPCs come back after `end_session` trimmed
/// the buffers, and the units' buffers given back then are never deregistered. Memory must be
/// flat once the session is gone, and nothing may stay tracked.
#[test]
fn end_session_mid_run_leaves_nothing_behind() {
    let mut f = three_nets();
    ok(f.lst(0, group("s2", &[S2]), LIMIT));
    ok(f.lst(0, LstCommand::AddBatch { name: "b".into() }, LIMIT));
    let add = LstCommand::AddTest {
        batch: "b".into(),
        loop_count: Some(-1),
        concurrency: Some(4),
        distribute: Some((1, 1)),
        from: "c".into(),
        to: "s2".into(),
        stop_onerr: false,
        test: TestSpec::Brw {
            write: true,
            size: 65_536,
            check: CheckSpec::Full,
            off: 0,
        },
    };
    ok(f.lst(0, add, LIMIT));
    // S2 goes silent: the units' RPCs stay in flight (the fabric is instant otherwise).
    f.kill(3);
    ok(f.lst(0, LstCommand::Run { batch: "b".into() }, LIMIT));
    f.run_for(Duration::from_secs(1));
    assert_eq!(f.selftest(0).rpcs_in_flight(), 4);
    ok(f.lst(0, LstCommand::EndSession, LIMIT));
    f.run_for(Duration::from_secs(200));
    let st = f.selftest(0);
    assert_eq!(f.nodes[0].posted_mds(), 0);
    assert_eq!(nonzero(&st.census()), vec![], "the client tracks leftovers");
    assert_eq!(st.registered_bytes(), 0, "the client's memory is not flat");
}

/// A brw server whose buffer limit is reached with no server op in flight (here: the limit
/// is below one server buffer) answers the request (ENOMEM) rather than queueing it where
/// nothing would ever serve it; nothing stays queued after the session.
#[test]
fn brw_request_waiting_for_a_buffer_is_answered() {
    let mut f = three_nets();
    // S1 restarts its selftest with 1 MiB of registered memory; the console's ping finds it
    // out of the session, and a new group makes it join again.
    let own = f.nodes[1].nids()[0];
    f.selftests[1] = Some(crate::selftest::Selftest::new(
        NiIndex(0),
        own,
        2000,
        1 << 20,
    ));
    let r = ok(f.lst(0, LstCommand::Ping { group: "s".into() }, LIMIT));
    assert_eq!(r.nodes[0].status, Some(3), "S1 has no session now: {r:?}");
    ok(f.lst(0, group("s1", &[S1]), LIMIT));
    ok(f.lst(0, LstCommand::AddBatch { name: "b".into() }, LIMIT));
    let add = LstCommand::AddTest {
        batch: "b".into(),
        loop_count: Some(1),
        concurrency: Some(1),
        distribute: Some((1, 1)),
        from: "c".into(),
        to: "s1".into(),
        stop_onerr: false,
        test: TestSpec::Brw {
            write: false,
            size: 8,
            check: CheckSpec::Full,
            off: 0,
        },
    };
    ok(f.lst(0, add, LIMIT));
    let stats = run_slow_to_end(&mut f, "b", 200);
    let c = stat(&stats, C);
    assert_eq!(
        c.rpcs_expired, 0,
        "the server never answered the brw request: {c:?}"
    );
    ok(f.lst(0, LstCommand::EndSession, LIMIT));
    assert_eq!(
        nonzero(&f.selftest(1).census()),
        vec![],
        "S1 after the session"
    );
}

/// A send that fails at once (no route to the node) after the bulk was posted: the MD is
/// unlinked in the node but its entry stays in the RPC layer's `mds` map for ever.
#[test]
fn unroutable_add_test_leaks_no_md_entry() {
    let mut f = three_nets();
    let r = ok(f.lst(0, group("x", &["10.9.0.1@o2ib9"]), LIMIT));
    assert_eq!(r.nodes[0].state, "down", "{r:?}");
    ok(f.lst(0, LstCommand::AddBatch { name: "b".into() }, LIMIT));
    let add = LstCommand::AddTest {
        batch: "b".into(),
        loop_count: Some(1),
        concurrency: Some(1),
        distribute: None,
        from: "x".into(),
        to: "s".into(),
        stop_onerr: false,
        test: TestSpec::Ping,
    };
    assert!(f.lst(0, add, LIMIT).is_err());
    assert_no_mds(&mut f, 0);
}

/// A kernel node in a session without LST_FEAT_BULK_LEN (v0) sends `brw_len` in bytes, a
/// whole number of pages (brw_client_prep_rpc: `req->brw_len = len`, `len = npg * PAGE_SIZE`;
/// brw_server_handle only checks `brw_len & ~PAGE_MASK`). Our server reads it as a page count.
#[test]
fn v0_brw_len_is_bytes_as_lustre_sends_it() {
    let mut f = three_nets();
    let sid = kernel_sid(7);
    // A kernel console on the router's NID takes S1 into a v0 session.
    kernel_session(&mut f, S1, sid, 0x1000, LST_FEAT_NONE);
    let r = raw_replies(&mut f, 2);
    assert!(
        matches!(&r[..], [(0x1000, m)] if matches!(m.body, SrpcBody::MakeSessionReply(ref x) if x.status == 0)),
        "{r:?}"
    );
    // A kernel brw client of that session: one page, read, check=full; its sink is posted.
    let reg = f.register(2, vec![0u8; 4096]);
    let buf = BulkBuf::new(NiIndex(0), &reg, 0, 4096).unwrap();
    f.nodes[2].post_sink(SRPC_RDMA_PORTAL, 0x1002, buf);
    let brw = BrwRequest {
        rpyid: 0x1001,
        bulkid: 0x1002,
        rw: BrwOp::Read as u32,
        len: 4096,
        flags: BrwCheck::Full as u32,
    };
    kernel_rpc(
        &mut f,
        S1,
        SRPC_REQUEST_PORTAL,
        ServiceId::Brw,
        LST_FEAT_NONE,
        brw.into(),
    );
    let r = raw_replies(&mut f, 2);
    assert!(
        matches!(&r[..], [(0x1001, m)] if m.body == SrpcBody::BrwReply(BrwReply { status: 0 })),
        "a 4096-byte v0 brw read is valid: {r:?}"
    );
    let data = f.region(2, &reg);
    assert_eq!(&data[..8], &BRW_MAGIC.to_le_bytes(), "the page came");
}

/// Malformed and misdirected srpc messages from a stranger: nothing panics, each is counted,
/// and the node still answers.
#[test]
fn hostile_srpc_messages_are_dropped_or_answered() {
    let mut f = three_nets();
    let (fw, rq) = (SRPC_FRAMEWORK_REQUEST_PORTAL, SRPC_REQUEST_PORTAL);
    let before = f.selftest(1).counters(f.now).1;
    // Garbage, short, wrong portal for the service, match bits not a service, a reply type.
    raw_put(&mut f, 2, S1, fw, 1, vec![0xa5; 160]);
    raw_put(&mut f, 2, S1, rq, 12, vec![0; 10]);
    let ping = PingRequest {
        rpyid: 0x2000,
        magic: LST_PING_TEST_MAGIC,
        seq: 1,
        time_sec: 0,
        time_nsec: 0,
    };
    kernel_rpc(&mut f, S1, fw, ServiceId::Ping, LST_FEATS_MASK, ping.into());
    raw_put(
        &mut f,
        2,
        S1,
        rq,
        ServiceId::Ping as u64 | 1 << 40,
        raw_msg(LST_FEATS_MASK, ping.into()),
    );
    kernel_rpc(
        &mut f,
        S1,
        rq,
        ServiceId::Ping,
        LST_FEATS_MASK,
        BrwReply { status: 0 }.into(),
    );
    // A reply nobody waits for.
    raw_put(
        &mut f,
        2,
        S1,
        SRPC_RDMA_PORTAL,
        0xdead,
        raw_msg(LST_FEATS_MASK, BrwReply { status: 0 }.into()),
    );
    assert!(raw_replies(&mut f, 2).is_empty());
    let after = f.selftest(1).counters(f.now).1;
    assert_eq!(after.rpcs_dropped - before.rpcs_dropped, 6, "{after:?}");
    // brw beyond LNET_MTU (v1), no session for a stranger's sid; the node still answers pings.
    let brw = BrwRequest {
        rpyid: 0x2001,
        bulkid: 0x2002,
        rw: BrwOp::Read as u32,
        len: 2 << 20,
        flags: 0,
    };
    kernel_rpc(&mut f, S1, rq, ServiceId::Brw, LST_FEATS_MASK, brw.into());
    let sid = kernel_sid(9);
    let test = TestRequest {
        rpyid: 0x2003,
        bulkid: 0x2004,
        sid,
        bid: LstBid(1),
        loop_count: 1,
        concur: 1,
        is_client: true,
        stop_onerr: false,
        ndest: u32::MAX,
        params: TestParams::Ping { size: 0, flags: 0 },
    };
    kernel_rpc(&mut f, S1, fw, ServiceId::Test, LST_FEATS_MASK, test.into());
    let q = BatchRequest {
        rpyid: 0x2005,
        sid,
        bid: LstBid(1),
        opc: SRPC_BATCH_OPC_QUERY,
        testidx: u32::MAX,
        arg: 0,
    };
    kernel_rpc(&mut f, S1, fw, ServiceId::Batch, LST_FEATS_MASK, q.into());
    kernel_rpc(&mut f, S1, rq, ServiceId::Ping, LST_FEATS_MASK, ping.into());
    let r: Vec<(u64, u32)> = raw_replies(&mut f, 2)
        .into_iter()
        .map(|(id, m)| (id, crate::selftest::wire_status(&m.body)))
        .collect();
    assert_eq!(r, vec![(0x2001, 22), (0x2003, 3), (0x2005, 3), (0x2000, 0)]);
    assert_eq!(nonzero(&f.selftest(1).census()), vec![]);
}

/// A server dies in the middle of a brw run: its client units fail after TEST_RPC_TIMEOUT,
/// the batch becomes inactive, and the client tracks nothing for those units afterwards.
#[test]
fn dead_server_fails_units_and_the_batch_ends() {
    let mut f = three_nets();
    ok(f.lst(0, LstCommand::AddBatch { name: "b".into() }, LIMIT));
    let spec = TestSpec::Brw {
        write: false,
        size: 1 << 20,
        check: CheckSpec::Full,
        off: 0,
    };
    ok(f.lst(0, add_test("b", spec, 3, 2), LIMIT));
    f.kill(3);
    let stats = run_slow_to_end(&mut f, "b", 400);
    let c = stat(&stats, C);
    assert!(c.brw_errors >= 2 && c.brw_errors <= 6, "{c:?}");
    assert_no_mds(&mut f, 0);
}

/// A kernel console (raw, on the router's NID) drives our nodes in a v0 session (no
/// LST_FEAT_BULK_LEN): the client must send its session's features and brw_len in bytes, the
/// server must take them; 3 one-page reads move 3 pages and check clean.
#[test]
fn v0_session_from_a_kernel_console_moves_checked_data() {
    use crate::selftest::wire::StatRequest;
    let mut f = three_nets();
    let sid = kernel_sid(11);
    let fw = SRPC_FRAMEWORK_REQUEST_PORTAL;
    for (i, to) in [C, S1].into_iter().enumerate() {
        kernel_session(&mut f, to, sid, 0x3000 + i as u64, LST_FEAT_NONE);
    }
    // The destination list (v0: whole pages), posted for C's GET.
    post_dest_list(&mut f, S1, 4096, 0x3101);
    let test = kernel_client_test(
        sid,
        0x3100,
        3,
        TestParams::BulkV0 {
            opc: BrwOp::Read as u32,
            npg: 1,
            flags: BrwCheck::Full as u32,
        },
    );
    let svc = ServiceId::Test;
    kernel_rpc(&mut f, C, fw, svc, LST_FEAT_NONE, test.into());
    let run = kernel_run(sid, 0x3200);
    let svc = ServiceId::Batch;
    kernel_rpc(&mut f, C, fw, svc, LST_FEAT_NONE, run.into());
    f.run_for(Duration::from_secs(1));
    let st = StatRequest {
        rpyid: 0x3300,
        sid,
        stat_type: 0,
    };
    let svc = ServiceId::QueryStat;
    kernel_rpc(&mut f, C, fw, svc, LST_FEAT_NONE, st.into());
    let st = StatRequest {
        rpyid: 0x3301,
        ..st
    };
    kernel_rpc(&mut f, S1, fw, svc, LST_FEAT_NONE, st.into());
    let r = raw_replies(&mut f, 2);
    let status: Vec<(u64, u32)> = r
        .iter()
        .map(|(id, m)| (*id, crate::selftest::wire_status(&m.body)))
        .collect();
    assert_eq!(
        status,
        vec![
            (0x3000, 0),
            (0x3001, 0),
            (0x3100, 0),
            (0x3200, 0),
            (0x3300, 0),
            (0x3301, 0)
        ]
    );
    let stats: Vec<_> = r
        .iter()
        .filter_map(|(_, m)| match &m.body {
            SrpcBody::StatReply(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(
        (stats[0].fw.brw_errors, stats[0].rpc.errors),
        (0, 0),
        "client: {:?}",
        stats[0]
    );
    assert_eq!(stats[1].rpc.bulk_put, 3 * 4096, "server: {:?}", stats[1]);
}

/// A kernel brw server answers a small read (below IBLND_MSG_SIZE) with an IMMEDIATE PUT into
/// the client's sink (kiblnd_send sends PUTs that fit a message inline; ksocklnd sends every
/// PUT inline): the node matches it against the posted sink (`LnetEvent::BulkPutInline`) and
/// the RPC layer copies it into the buffer, so the RPC completes with its data checked.
#[test]
fn kernel_server_small_read_as_immediate_put_reaches_the_sink() {
    use crate::selftest::wire::StatRequest;
    let mut f = three_nets();
    let sid = kernel_sid(12);
    let fw = SRPC_FRAMEWORK_REQUEST_PORTAL;
    kernel_session(&mut f, C, sid, 0x4000, LST_FEATS_MASK);
    post_dest_list(&mut f, RA, 12, 0x4101);
    let test = kernel_client_test(
        sid,
        0x4100,
        1,
        TestParams::BulkV1 {
            opc: BrwOp::Read as u16,
            flags: BrwCheck::Full as u16,
            len: 1024,
            offset: 0,
        },
    );
    kernel_rpc(&mut f, C, fw, ServiceId::Test, LST_FEATS_MASK, test.into());
    let run = kernel_run(sid, 0x4200);
    kernel_rpc(&mut f, C, fw, ServiceId::Batch, LST_FEATS_MASK, run.into());
    // Node 2 as the kernel brw server: the data inline, then the reply.
    let reqs: Vec<BrwRequest> = f
        .take_events(2)
        .into_iter()
        .filter_map(|(_, e)| match e {
            LnetEvent::Put {
                portal, payload, ..
            } if portal == SRPC_REQUEST_PORTAL => match SrpcMsg::parse(&payload) {
                Ok((
                    SrpcMsg {
                        body: SrpcBody::BrwRequest(r),
                        ..
                    },
                    _,
                )) => Some(r),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(reqs.len(), 1, "one brw request");
    let data: Vec<u8> = (0..128).flat_map(|_| BRW_MAGIC.to_le_bytes()).collect();
    raw_put(&mut f, 2, C, SRPC_RDMA_PORTAL, reqs[0].bulkid, data);
    let reply = raw_msg(LST_FEATS_MASK, BrwReply { status: 0 }.into());
    raw_put(&mut f, 2, C, SRPC_RDMA_PORTAL, reqs[0].rpyid, reply);
    f.run_for(Duration::from_secs(100));
    let st = StatRequest {
        rpyid: 0x4300,
        sid,
        stat_type: 0,
    };
    kernel_rpc(
        &mut f,
        C,
        fw,
        ServiceId::QueryStat,
        LST_FEATS_MASK,
        st.into(),
    );
    let r = raw_replies(&mut f, 2);
    let s = r
        .iter()
        .find_map(|(_, m)| match &m.body {
            SrpcBody::StatReply(s) => Some(s),
            _ => None,
        })
        .expect("a stat reply");
    assert_eq!(
        (s.fw.brw_errors, s.rpc.rpcs_expired, s.rpc.rpcs_dropped),
        (0, 0, 0),
        "{s:?}"
    );
}

/// add_test sets the test up on the servers first (a server-side TEST each, as Lustre's
/// console does: a kernel server posts its test service's buffers then), then on the clients;
/// `--loop 0` is refused before anything is sent.
#[test]
fn add_test_reaches_servers_and_clients() {
    let mut f = three_nets();
    ok(f.lst(0, LstCommand::AddBatch { name: "p".into() }, LIMIT));
    let r = ok(f.lst(0, add_test("p", TestSpec::Ping, 5, 1), LIMIT));
    assert_eq!(r.nodes.len(), 3, "two servers then the client: {r:?}");
    assert_eq!(r.nodes[2].nid, C);
    let r = ok(f.lst(0, LstCommand::Ping { group: "s".into() }, LIMIT));
    for n in &r.nodes {
        assert!(
            n.detail
                .as_deref()
                .is_some_and(|d| d.ends_with("1 batches")),
            "a server knows the batch: {r:?}"
        );
    }
    let e = f
        .lst(0, add_test("p", TestSpec::Ping, 0, 1), LIMIT)
        .unwrap_err();
    assert_eq!(e.errno, 22, "{e}");
}

/// del_group ends the session on its nodes that are in no other group, and only there.
#[test]
fn del_group_releases_its_nodes_only() {
    let mut f = three_nets();
    ok(f.lst(0, group("both", &[S1, C]), LIMIT));
    ok(f.lst(0, group("far", &[S2]), LIMIT));
    // S2 is in "s" and "far": deleting "far" keeps it.
    let r = ok(f.lst(0, LstCommand::DelGroup { name: "far".into() }, LIMIT));
    assert_eq!(r.message, "group far deleted", "{r:?}");
    f.run_for(Duration::from_secs(2));
    ok(f.lst(0, LstCommand::DelGroup { name: "s".into() }, LIMIT));
    // S2 was only in "s" now: it left the session (no session: running 0); S1 stays through
    // "both".
    let now = f.now;
    assert_eq!(f.selftest(3).counters(now).0.running_ms, 0);
    assert!(f.selftest(1).counters(now).0.running_ms >= 2000);
    let r = ok(f.lst(0, group("again", &[S1, S2]), LIMIT));
    assert!(r.nodes.iter().all(|n| n.status == Some(0)), "{r:?}");
}
