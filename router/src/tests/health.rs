//! LNet health on the unit-test fabric (lnet_health_check for single-rail peers): a gateway
//! that fails loses health and gets recovery pings until it answers; with health off nothing
//! moves; a plain peer's health is judged only while routing, the local NI's always.

use super::routing::{node, put_results, puts, route};
use super::*;
use crate::health::MAX_HEALTH;

const CLIENT: &str = "10.0.0.1@o2ib";
const R_A: &str = "10.0.0.254@o2ib";
const R_B: &str = "10.1.0.254@o2ib1";
const SERVER: &str = "10.1.0.2@o2ib1";
const DIRECT: &str = "10.0.0.9@o2ib";

/// Client, server, router; the client's (and the router's) globals as given, the client's LND
/// timeout 5 s, its router pinger idle (so that only recovery pings can bring the gateway back), the router as
/// node 2.
fn fabric_with(client_globals: &[(&str, i64)], router_globals: &[(&str, i64)]) -> Fabric {
    let mut client = node(&[CLIENT], &[route("o2ib1", R_A)], false, 10);
    client.globals.set_all(client_globals).unwrap();
    // Sends to a dead peer fail after 5 s rather than o2iblnd's 50.
    client.nis[0].tunables.timeout = Duration::from_secs(5);
    client.gateway_health.check_interval = Duration::from_secs(0);
    let server = node(&[SERVER], &[route("o2ib", R_B)], false, 20);
    let mut router = node(&[R_A, R_B], &[], true, 30);
    router.globals.set_all(router_globals).unwrap();
    Fabric::from_configs(vec![client, server, router])
}

fn fabric(sensitivity: i64) -> Fabric {
    fabric_with(
        &[
            ("health_sensitivity", sensitivity),
            ("transaction_timeout", 10),
        ],
        &[],
    )
}

/// Runs `f` for `d` in 100 ms steps; the most pings node 0 had out at once.
fn run_watching_pings(f: &mut Fabric, d: Duration) -> usize {
    let mut most = 0;
    let end = f.now + d;
    while f.now < end {
        f.run_for(Duration::from_millis(100));
        most = most.max(f.nodes[0].pending_pings());
    }
    most
}

fn send_puts(f: &mut Fabric, to: &str, n: u64) {
    let now = f.now;
    for i in 0..n {
        let _ = f.nodes[0].send_put(now, nid(to), 7, i, vec![1; 64]);
    }
}

#[test]
fn a_failed_gateway_loses_health_and_recovery_pings_bring_it_back() {
    let mut f = fabric(100);
    send_puts(&mut f, SERVER, 1);
    f.run_for(Duration::from_secs(1));
    let gw = nid(R_A);
    assert_eq!(f.nodes[0].peer(gw).unwrap().health.value, 1000);

    f.kill(2);
    send_puts(&mut f, SERVER, 3);
    // One recovery ping out at a time (LNET_PEER_NI_RECOVERY_PENDING).
    assert_eq!(run_watching_pings(&mut f, Duration::from_secs(100)), 1);
    let p = f.nodes[0].peer(gw).unwrap();
    assert!(p.health.value < 1000, "{p:?}");
    assert!(p.hstats.network_timeout >= 1, "{:?}", p.hstats);
    assert_eq!(f.nodes[0].recovery_queue(false), vec![gw]);
    assert!(
        p.health.ping_count >= 3,
        "recovery pings went out: {:?}",
        p.health
    );
    // The network timeouts are counted against the local NI too, but a node with one NI has
    // no other path, so Lustre 2.16 does not judge its NI (lnet_health_check,
    // lnet_ping_at_least_two_entries): no local recovery.
    assert!(f.nodes[0].stats().network_timeout_count >= 1);
    assert!(f.nodes[0].recovery_queue(true).is_empty());
    assert_eq!(f.nodes[0].nets()[0].health.value, 1000);

    // Back: the next recovery ping is answered, and a gateway's answer restores it in full.
    let router = node(&[R_A, R_B], &[], true, 30);
    f.restart(2, router, 300);
    f.run_for(Duration::from_secs(70));
    let p = f.nodes[0].peer(gw).unwrap();
    assert_eq!(p.health.value, 1000, "{p:?}");
    assert!(f.nodes[0].recovery_queue(false).is_empty());
    // And the client's NI recovers as messages work again.
    send_puts(&mut f, SERVER, 20);
    f.run_for(Duration::from_secs(2));
    assert!(
        f.nodes[0].recovery_queue(true).is_empty(),
        "{:?}",
        f.nodes[0].nets()[0].health
    );
}

#[test]
fn with_health_off_values_stay_at_the_maximum_and_failures_are_still_counted() {
    let mut f = fabric(0);
    f.kill(2);
    send_puts(&mut f, SERVER, 3);
    assert_eq!(
        run_watching_pings(&mut f, Duration::from_secs(60)),
        0,
        "no recovery ping"
    );
    let p = f.nodes[0].peer(nid(R_A)).unwrap();
    assert_eq!((p.health.value, p.health.ping_count), (1000, 0), "{p:?}");
    assert!(p.hstats.network_timeout >= 1, "{:?}", p.hstats);
    assert!(f.nodes[0].recovery_queue(false).is_empty());
    assert!(f.nodes[0].recovery_queue(true).is_empty());
    assert_eq!(f.nodes[0].nets()[0].health.value, 1000);
}

#[test]
fn a_plain_peer_is_not_judged_unless_this_node_routes() {
    let mut f = fabric(100);
    send_puts(&mut f, DIRECT, 2);
    f.run_for(Duration::from_secs(60));
    let p = f.nodes[0].peer(nid(DIRECT)).unwrap();
    // Counted, but a single-rail peer that is no gateway keeps its health (lnet_health_check:
    // handle_remote_health is off for it), and gets no recovery ping.
    assert!(p.hstats.network_timeout >= 1, "{:?}", p.hstats);
    assert_eq!((p.health.value, p.health.ping_count), (1000, 0), "{p:?}");
    assert!(f.nodes[0].recovery_queue(false).is_empty());
    // Nor is the local NI of a node with one NI (its only path).
    let ni = f.nodes[0].nets()[0].health;
    assert_eq!(ni.value, 1000, "{ni:?}");
}

#[test]
fn setting_health_off_restores_every_value_and_empties_the_queue() {
    let mut f = fabric(100);
    f.kill(2);
    send_puts(&mut f, SERVER, 2);
    f.run_for(Duration::from_secs(60));
    assert!(!f.nodes[0].recovery_queue(false).is_empty());
    f.nodes[0]
        .set_globals(&[("health_sensitivity".into(), 0)])
        .unwrap();
    assert!(f.nodes[0].recovery_queue(false).is_empty());
    assert!(f.nodes[0].recovery_queue(true).is_empty());
    assert_eq!(f.nodes[0].peer(nid(R_A)).unwrap().health.value, 1000);
}

#[test]
fn recovery_limit_stops_the_pings_to_a_peer_silent_that_long() {
    let mut f = fabric_with(
        &[
            ("health_sensitivity", 100),
            ("transaction_timeout", 10),
            ("recovery_limit", 20),
        ],
        &[],
    );
    // A routed ping: its REPLY comes in from the gateway, which is then last heard at ~0 s.
    let now = f.now;
    f.nodes[0]
        .ping(now, nid(SERVER), Duration::from_secs(5))
        .unwrap();
    f.run_for(Duration::from_secs(1));
    f.kill(2);
    send_puts(&mut f, SERVER, 2);
    f.run_for(Duration::from_secs(15));
    assert_eq!(f.nodes[0].recovery_queue(false), vec![nid(R_A)]);
    // Heard from last at about 0 s: past 20 s it is given up, its value left where it is.
    f.run_for(Duration::from_secs(60));
    let p = f.nodes[0].peer(nid(R_A)).unwrap();
    assert!(f.nodes[0].recovery_queue(false).is_empty(), "{p:?}");
    assert!(p.health.value < 1000 && p.health.ping_count == 0, "{p:?}");
    assert_eq!(f.nodes[0].pending_pings(), 0);
}

#[test]
fn a_router_judges_the_plain_peers_it_forwards_to() {
    let mut f = fabric_with(&[], &[("health_sensitivity", 100)]);
    send_puts(&mut f, SERVER, 1);
    f.run_for(Duration::from_secs(1));
    f.kill(1);
    send_puts(&mut f, SERVER, 3);
    f.run_for(Duration::from_secs(60));
    // The server is no gateway, but the router routes: its health is judged there.
    let r = &f.nodes[2];
    let p = r.peer(nid(SERVER)).unwrap();
    assert!(p.health.value < 1000, "{p:?}");
    assert_eq!(r.recovery_queue(false), vec![nid(SERVER)]);
    // The client, health off, judged nothing.
    assert_eq!(f.nodes[0].peer(nid(R_A)).unwrap().health.value, 1000);
}

/// Resends (lib-msg.c lnet_health_check / lnet_attempt_msg_resend): a node with two NIs
/// sends more PUTs than its peer has credits for, and the peer goes silent. The connection
/// times out: what was posted fails (REMOTE_DROPPED or a network timeout: the peer may have
/// it, never resent), what was still queued fails LOCAL_TIMEOUT (never sent) and, with
/// `retry_count` 2, is sent again over a new connection to the peer, back meanwhile as a new
/// instance, and arrives once. With `retry_count` 0, or on a node with one NI (Lustre resends
/// a local failure only when it has another NI), the queued ones fail too.
#[test]
fn messages_queued_on_a_connection_that_timed_out_are_resent_on_a_node_with_two_nis() {
    let run = |nis: &[&str], retry: i64| {
        let mut a = node(nis, &[], false, 10);
        a.globals
            .set_all(&[
                ("health_sensitivity", 100),
                ("retry_count", retry),
                ("transaction_timeout", 30),
            ])
            .unwrap();
        for ni in &mut a.nis {
            ni.tunables.timeout = Duration::from_secs(5);
        }
        let b = node(&[DIRECT], &[], false, 20);
        let mut f = Fabric::from_configs(vec![a, b.clone()]);
        send_puts(&mut f, DIRECT, 1);
        f.run_for(Duration::from_secs(1));
        assert_eq!(put_results(&f.take_events(0)), vec![Ok(())]);
        assert_eq!(puts(&f.take_events(1)).len(), 1);
        // The peer goes silent with 20 PUTs coming: some go to the LND (posted, or queued there
        // for a credit), the rest wait in LNet for a peer credit.
        f.kill(1);
        send_puts(&mut f, DIRECT, 20);
        f.run_for(Duration::from_secs(3));
        // It comes back as a new instance before the connection times out.
        f.restart(1, b, 40);
        f.run_for(Duration::from_secs(30));
        let results = put_results(&f.take_events(0));
        assert_eq!(results.len(), 20, "every PUT ends: {results:?}");
        let ok = results.iter().filter(|r| r.is_ok()).count();
        // No PUT arrived twice (each has its own match bits).
        let arrived: Vec<u64> = puts(&f.take_events(1)).iter().map(|p| p.1).collect();
        let distinct: std::collections::BTreeSet<u64> = arrived.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            arrived.len(),
            "a PUT arrived twice: {arrived:?}"
        );
        // Every credit came back.
        for p in f.nodes[0].peers() {
            assert_eq!(p.available_tx_credits, p.max_ni_tx_credits, "{}", p.nid);
        }
        assert_eq!(f.nodes[0].messages_in_flight(), 0);
        (ok, f.nodes[0].stats().clone(), arrived.len())
    };
    let (ok, s, arrived) = run(&[CLIENT, "10.1.0.1@o2ib1"], 2);
    assert!(ok < 20, "the posted ones fail: {s:?}");
    assert_eq!(
        arrived, ok,
        "each PUT that succeeded arrived once, none twice"
    );
    assert!(s.resend_count >= 1, "{s:?}");
    assert_eq!(s.successful_resends, s.resend_count, "{s:?}");
    assert_eq!(
        s.local_timeout_count, s.resend_count,
        "each resent attempt counted: {s:?}"
    );
    assert_eq!(s.failed_resends, 0);
    assert_eq!(s.msgs_alloc, 0, "nothing left allocated: {s:?}");

    // The same run without resends: exactly the resent ones fail, as LOCAL_TIMEOUT.
    for (nis, retry) in [(&[CLIENT, "10.1.0.1@o2ib1"][..], 0), (&[CLIENT][..], 2)] {
        let (ok_c, s_c, arrived_c) = run(nis, retry);
        assert_eq!(
            ok_c + s.resend_count as usize,
            ok,
            "{nis:?} {retry}: {s_c:?}"
        );
        assert_eq!(arrived_c, ok_c);
        assert_eq!(
            (s_c.resend_count, s_c.successful_resends),
            (0, 0),
            "{nis:?} {retry}"
        );
        assert_eq!(
            s_c.local_timeout_count, s.resend_count,
            "{nis:?} {retry}: {s_c:?}"
        );
    }
}

/// lnet_recover_local_nis: an NI whose health fell on local failures (messages queued on a
/// connection that timed out) is pinged back to the maximum and leaves the queue `debug
/// recovery --local` shows. Lustre pings the NI's own NID through its own LND; ours never
/// does (LU-7646's first fix deadlocked on a self-ping): the ping goes through the NI to the
/// live peer on its net heard from most recently, here a second peer, never to the dead one
/// and never to ourselves. With health off, nothing is pinged.
#[test]
fn a_local_ni_that_failed_recovers_through_a_live_peer_never_its_own_nid() {
    const OTHER: &str = "10.0.0.8@o2ib";
    let run = |sensitivity: i64| {
        let mut a = node(&[CLIENT, "10.1.0.1@o2ib1"], &[], false, 10);
        a.globals
            .set_all(&[
                ("health_sensitivity", sensitivity),
                ("transaction_timeout", 30),
                ("max_recovery_ping_interval", 2),
            ])
            .unwrap();
        for ni in &mut a.nis {
            ni.tunables.timeout = Duration::from_secs(5);
        }
        let b = node(&[DIRECT], &[], false, 20);
        let c = node(&[OTHER], &[], false, 30);
        let mut f = Fabric::from_configs(vec![a, b, c]);
        send_puts(&mut f, OTHER, 1);
        send_puts(&mut f, DIRECT, 1);
        f.run_for(Duration::from_secs(1));
        let other_before = f.nodes[0].peer(nid(OTHER)).map_or(0, |p| p.send_count);
        f.kill(1);
        send_puts(&mut f, DIRECT, 20);
        // Until the connection times out (5 s) and what was queued on it fails.
        f.run_for(Duration::from_secs(6));
        let fell = f.nodes[0].nets()[0].health.value;
        let queued = f.nodes[0].recovery_queue(true);
        f.run_for(Duration::from_secs(60));
        let other_after = f.nodes[0].peer(nid(OTHER)).map_or(0, |p| p.send_count);
        (fell, queued, other_after - other_before, f)
    };
    let (fell, queued, pinged_other, f) = run(100);
    assert!(fell < MAX_HEALTH, "local failures cost the NI: {fell}");
    assert_eq!(queued, vec![nid(CLIENT)], "in local recovery");
    let ni = &f.nodes[0].nets()[0];
    assert_eq!(
        ni.health.value, MAX_HEALTH,
        "back at the maximum: {:?}",
        ni.health
    );
    assert!(f.nodes[0].recovery_queue(true).is_empty());
    assert!(pinged_other > 0, "the recovery pings went to the live peer");
    // Never to our own NID: no peer entry for it, no connection beyond the two peers'.
    assert!(f.nodes[0].peer(nid(CLIENT)).is_none());
    assert_eq!(f.nodes[2].stats().recv_count, 1 + pinged_other);

    let (fell, queued, pinged_other, f) = run(0);
    assert_eq!(fell, MAX_HEALTH);
    assert!(queued.is_empty());
    assert_eq!(pinged_other, 0, "no recovery ping with health off");
    assert!(f.nodes[0].peer(nid(CLIENT)).is_none());
}
