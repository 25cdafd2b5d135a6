//! A rendezvous completes only if its data all arrived: a hostile source that writes less than
//! its PUT_DONE or GET_DONE accounts for (half, nothing, or the same bytes twice) fails the
//! transfer at the sink, which closes the connection, so memory lent before (a router's large
//! buffer) is never passed on holding its previous user's bytes.

use super::*;
// How the hostile source writes (shared with the router's hostile-bulk process test).
use crate::driver::tamper::{Rewrite, ShortWrite as Write};
use crate::engine::RdmaSink;
use crate::mem::Registration;
use crate::wire::errno::EPROTO;

/// A rewrite of every RDMA write of the node as `how` says (each is of one fragment: the
/// engine writes a contiguous sink in one piece).
fn tamper(how: Write) -> Rewrite {
    Box::new(move |a| {
        if let FabricAction::RdmaWrite { local, remote, .. } = &a {
            if how != Write::Honest {
                assert_eq!((local.len(), remote.len()), (1, 1), "one fragment each");
            }
        }
        how.rewrite(a)
    })
}

const LEN: u32 = 64 * 1024 + 3;
/// What the sink's memory holds before: its previous user's bytes.
const OLD: u8 = 0xee;

/// A's source of `LEN` bytes of `pattern(seed)`, and B's sink of `LEN` old bytes.
fn src_and_sink(a: &mut Node, b: &mut Node, seed: u32) -> (Registration, Registration) {
    let src = a.fabric.register(pattern(seed, LEN as usize)).unwrap();
    let sink = b.fabric.register(vec![OLD; LEN as usize]).unwrap();
    (src, sink)
}

/// A starts a PUT of `LEN` bytes (pattern `seed`) into a sink at B (holding `OLD`) under
/// `cookie`: the sink.
fn start_put_len(
    a: &mut Node,
    b: &mut Node,
    clock: &MonotonicClock,
    seed: u32,
    cookie: u64,
) -> Registration {
    let (src, sink) = src_and_sink(a, b, seed);
    let into = RdmaSink::of(&sink, 0, LEN);
    start_put(a, b, clock, src.local_frag(0, LEN), into, cookie);
    sink
}

/// Turns both nodes until B's side of the transfer `cookie` has ended, however it ended;
/// whether it did within [`MIN_WAIT`].
fn b_transfer_ends(a: &mut Node, b: &mut Node, clock: &MonotonicClock, cookie: u64) -> bool {
    run_until(&mut [a, b], clock, |n| n[1].rdma_done.contains_key(&cookie))
}

/// A PUTs `LEN` bytes into B's sink, writing them as `how` says; B's outcome, B's LND
/// counters, and B's sink afterwards.
fn put_through(how: Write) -> (Result<u32, TxError>, crate::engine::LndStats, Vec<u8>) {
    let (clock, _book, mut a, mut b) = connected_pair();
    a.fabric.set(Some(tamper(how)));
    let sink = start_put_len(&mut a, &mut b, &clock, 3, 77);
    assert!(
        b_transfer_ends(&mut a, &mut b, &clock, 77),
        "{how:?}: the sink's transfer did not end"
    );
    let bytes = b.fabric.contents(&sink).unwrap();
    let out = (b.rdma_done[&77], b.ep.stats().clone(), bytes);
    a.fabric.set(None);
    shut_down_both(&mut a, &mut b, &clock);
    out
}

#[test]
fn a_put_whose_data_did_not_all_arrive_fails_at_the_sink() {
    let (ok, st, bytes) = put_through(Write::Honest);
    assert_eq!(ok, Ok(LEN));
    assert_eq!(st.rdma_short_writes, 0);
    assert_eq!(bytes, pattern(3, LEN as usize));
    for how in [
        Write::Half,
        Write::Nothing,
        Write::HalfTwice,
        Write::AllButOne,
    ] {
        let (result, st, bytes) = put_through(how);
        assert_eq!(result, Err(TxError::Rdma(-EPROTO)), "{how:?}");
        assert_eq!(st.rdma_short_writes, 1, "{how:?}");
        assert_eq!(st.rdma_puts_received, 0, "{how:?}");
        assert_eq!(st.conns_lost, 1, "{how:?}: the connection is closed");
        // The unwritten part still holds the old bytes: that is what must never be passed
        // on, and the failure says so.
        assert!(bytes.contains(&OLD), "{how:?}");
    }
}

/// B GETs `LEN` bytes from A, whose reply A writes as `how` says: B's outcome and counters.
fn get_from(how: Write) -> (Result<u32, TxError>, crate::engine::LndStats) {
    let (clock, _book, mut a, mut b) = connected_pair();
    a.fabric.set(Some(tamper(how)));
    let (an, bn) = (a.ep.nid(), b.ep.nid());
    let (src, sink) = src_and_sink(&mut a, &mut b, 4);
    a.answers
        .push_back(Answer::Reply(vec![src.local_frag(0, LEN)], 88));
    let into = RdmaSink::of(&sink, 0, LEN);
    b.ep.send_get_rdma(clock.now(), an, hdr(bn, an, 0), into, 88)
        .unwrap();
    assert!(
        b_transfer_ends(&mut a, &mut b, &clock, 88),
        "{how:?}: the GET did not end"
    );
    let out = (b.rdma_done[&88], b.ep.stats().clone());
    a.fabric.set(None);
    shut_down_both(&mut a, &mut b, &clock);
    out
}

#[test]
fn a_get_whose_reply_did_not_all_arrive_fails_at_the_requester() {
    assert_eq!(get_from(Write::Honest).0, Ok(LEN));
    for how in [Write::Half, Write::Nothing, Write::HalfTwice] {
        let (result, st) = get_from(how);
        assert_eq!(result, Err(TxError::Rdma(-EPROTO)), "{how:?}");
        assert_eq!(st.rdma_short_writes, 1, "{how:?}");
        assert_eq!(st.rdma_gets_received, 0, "{how:?}");
    }
}

/// A source that never writes nor completes: the sink reclaims its grant after
/// `grant_timeout`, not the LND timeout, and a write that comes later is refused (it would
/// land in memory given back).
#[test]
fn a_grant_nobody_fills_is_reclaimed_and_a_late_write_refused() {
    let (clock, _book, mut a, mut b) = connected_pair();
    // A holds back its write and the PUT_DONE behind it (its LND is told they left).
    let held: Arc<Mutex<Vec<FabricAction>>> = Arc::default();
    let h = Arc::clone(&held);
    a.fabric.set(Some(Box::new(move |act| {
        let stall = matches!(act, FabricAction::RdmaWrite { .. })
            || matches!(&act, FabricAction::Send { .. } if !h.lock().unwrap().is_empty());
        if stall {
            h.lock().unwrap().push(act);
            return None;
        }
        Some(act)
    })));
    let sink = start_put_len(&mut a, &mut b, &clock, 5, 99);
    assert!(
        b_transfer_ends(&mut a, &mut b, &clock, 99),
        "the grant was not reclaimed"
    );
    assert_eq!(b.rdma_done[&99], Err(TxError::GrantExpired));
    assert_eq!(b.ep.stats().grants_reclaimed, 1);
    // The tcp fabric enforces the revoke: the connection itself stays.
    assert_eq!(b.ep.stats().conns_lost, 0);
    let ungranted = b.fabric.stats().rdma_ungranted;
    // Now A writes: refused, nothing lands, and it costs A the connection.
    a.fabric.set(None);
    let now = clock.now();
    for act in std::mem::take(&mut *held.lock().unwrap()) {
        a.fabric.apply(now, act);
    }
    assert!(
        run_until(&mut [&mut a, &mut b], &clock, |n| n[1]
            .fabric
            .stats()
            .rdma_ungranted
            > ungranted),
        "the late write was not refused"
    );
    assert!(b.fabric.contents(&sink).unwrap().iter().all(|&x| x == OLD));
    a.fabric.set(None);
    shut_down_both(&mut a, &mut b, &clock);
}
