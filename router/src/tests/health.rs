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

/// Client, server, router; the client's health as given, its router pinger idle (so that only
/// recovery pings can bring the gateway back), the router as node 2.
fn fabric(sensitivity: i64) -> Fabric {
    let mut client = node(&[CLIENT], &[route("o2ib1", R_A)], false, 10);
    client
        .globals
        .set_all(&[
            ("health_sensitivity", sensitivity),
            ("transaction_timeout", 10),
        ])
        .unwrap();
    client.gateway_health.check_interval = Duration::from_secs(0);
    let server = node(&[SERVER], &[route("o2ib", R_B)], false, 20);
    let router = node(&[R_A, R_B], &[], true, 30);
    Fabric::from_configs(vec![client, server, router])
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
    f.run_for(Duration::from_secs(60));
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
    f.run_for(Duration::from_secs(60));
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
