//! LNet health on the unit-test fabric (lnet_health_check for single-rail peers): a gateway
//! that fails loses health and gets recovery pings until it answers; with health off nothing
//! moves; a plain peer's health is judged only while routing, the local NI's always.

use super::routing::{node, route};
use super::*;

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
    // The local NI took the network timeouts too.
    assert_eq!(f.nodes[0].recovery_queue(true), vec![nid(CLIENT)]);
    assert!(f.nodes[0].stats().network_timeout_count >= 1);

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
    // The local NI is judged.
    let ni = f.nodes[0].nets()[0].health;
    assert!(ni.value < 1000, "{ni:?}");
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
