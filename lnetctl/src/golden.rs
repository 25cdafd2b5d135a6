//! Golden outputs: what lnetctl prints for a known state, each expected document written by
//! hand from Lustre's lnetctl (the file and function each key list and layout come from is
//! cited above it) and sanity-lnet.sh's expectations, not from our own output. Where ulnet
//! differs on purpose (a key it does not have, a value that is ulnet's true one), the comment
//! says so.

use lnd::time::{Duration, Instant};
use lnd::wire::Nid;
use router::control::*;
use router::{LnetNode, NiConfig, NodeConfig};

use crate::render::{yaml, yaml_at};

/// One o2ib NI (10.0.0.1@o2ib) at its defaults; a ping sent to 10.0.0.2@o2ib (not answered
/// yet), so one peer; a route to o2ib1 through 10.0.0.3@o2ib.
fn node() -> LnetNode {
    let nid: Nid = "10.0.0.1@o2ib".parse().unwrap();
    let mut n = LnetNode::new(
        NodeConfig::new(vec![NiConfig::new(nid, 1)]),
        Instant::from_secs(1),
    );
    let now = Instant::from_secs(2);
    n.ping(
        now,
        "10.0.0.2@o2ib".parse().unwrap(),
        Duration::from_secs(5),
    )
    .unwrap();
    route_add(now, &mut n, "o2ib1", "10.0.0.3@o2ib", None, None).unwrap();
    n
}

/// `lnetctl ping`: libyaml's default indent (2); `peer_ni` with an underscore and
/// `Multi-Rail` as true/false (the netlink keys, api-ni.c ping_props_list); failures under
/// `manage:` as an empty `- ping:` with errno and descr beside it (lnetctl.c,
/// yaml_lnet_ping_display). 0@lo is never listed. ulnet quotes a descr that holds `: `
/// (lnetctl leaves libyaml to quote it and tag it `!`).
#[test]
fn golden_ping() {
    let p = PingShow {
        ping: vec![PingPeer {
            primary_nid: "10.0.0.2@o2ib".into(),
            multi_rail: false,
            peer_ni: vec!["10.0.0.2@o2ib".into()],
        }],
        manage: vec![PingFailure {
            ping: "10.0.0.9@o2ib".into(),
            errno: -113,
            descr: "failed to ping 10.0.0.9@o2ib: No route to host".into(),
        }],
    };
    assert_eq!(
        yaml(&Response::Ping(p)).unwrap(),
        "\
ping:
- primary nid: 10.0.0.2@o2ib
  Multi-Rail: false
  peer_ni:
  - nid: 10.0.0.2@o2ib
manage:
- ping:
  errno: -113
  descr: \"failed to ping 10.0.0.9@o2ib: No route to host\"
"
    );
}

/// `lnetctl net show` and `net show -v`: libyaml's indent 6 (sanity-lnet test 108's expected
/// lines); per NI `nid`, `status`, then with -v `statistics` (send, recv, drop), `tunables`
/// (peer_timeout, peer_credits, peer_buffer_credits, credits) and `lnd tunables`, in the
/// kernel's key-table order (api-ni.c, local_ni_list). ulnet has no `interfaces` (an NI is its
/// NID), no `sent_stats`/`health stats`/`dev cpt`/`CPT`, and its o2ib `lnd tunables` are the
/// ones it has (peercredits_hiw and concurrent_sends in effect, timeout) plus keepalive; the
/// loopback NI has no tunables.
#[test]
fn golden_net_show() {
    let n = node();
    assert_eq!(
        yaml_at(&Response::Net(net_show(&n, &[], false)), 0).unwrap(),
        include_str!("fixtures/net-show.yaml")
    );
    assert_eq!(
        yaml_at(&Response::Net(net_show(&n, &[], true)), 1).unwrap(),
        net_show_v_head(1) + include_str!("fixtures/ni-tunables.yaml")
    );
}

/// `net show -v` of the test nodes' NIs (0@lo, 10.0.0.1@o2ib) up to the o2ib NI's statistics, which count `o2ib_sends`
/// sends (the loopback NI has no tunables, so it ends there).
pub(crate) fn net_show_v_head(o2ib_sends: u64) -> String {
    format!(
        "\
net:
-     net type: lo
      local NI(s):
      -     nid: 0@lo
            status: up
            statistics:
                  send_count: 0
                  recv_count: 0
                  drop_count: 0
-     net type: o2ib
      local NI(s):
      -     nid: 10.0.0.1@o2ib
            status: up
            statistics:
                  send_count: {o2ib_sends}
                  recv_count: 0
                  drop_count: 0
"
    )
}

/// ulnet's own NI settings at the test node's defaults, each line after `indent`: under `ulnet:`
/// in `net show -v 5` (`peers` follows them there) and among an export's NI keys.
pub(crate) fn ulnet_defaults(indent: &str) -> String {
    [
        "checksum: \"off\"",
        "checksum default: none",
        "race order: nidhash",
        "connect hedge ms: 1000",
        "grant timeout ms: 1000",
        "peer limit: 131072",
    ]
    .iter()
    .map(|line| format!("{indent}{line}\n"))
    .collect()
}

/// `lnetctl peer show -v`: libyaml's indent 6; per peer `primary nid`, `Multi-Rail`, `peer ni`;
/// per peer NI `nid`, `state` (NA: not a gateway and not routing, peer.c), then with -v the
/// credits (max_ni_tx_credits = the net's peer_credits; available_tx_credits one less, the
/// ping's GET holds one; min_tx_credits its low-water mark), `tx_q_num_of_buf`, router credits
/// and `statistics` (api-ni.c, lnet_peer_ni_keys). ulnet has no `refcount`, sent/received/
/// dropped stats or `health stats`.
#[test]
fn golden_peer_show() {
    let n = node();
    assert_eq!(
        yaml(&Response::Peer(peer_show(&n, None, false).unwrap())).unwrap(),
        include_str!("fixtures/peer-show.yaml")
    );
    assert_eq!(
        yaml_at(&Response::Peer(peer_show(&n, None, true).unwrap()), 1).unwrap(),
        include_str!("fixtures/peer-show-v.yaml")
    );
}

/// `lnetctl stats show`: cYAML; the 26 counters of liblnetconfig.c's lustre_lnet_show_stats
/// in its order. One message allocated (the ping's GET, not answered), one send of it; every
/// health and resend counter 0 (nothing failed; no resends to a single-rail peer).
#[test]
fn golden_stats_show() {
    let n = node();
    assert_eq!(
        yaml_at(&Response::Stats(stats_show(&n)), 0).unwrap(),
        "\
statistics:
    msgs_alloc: 1
    msgs_max: 1
    rst_alloc: 0
    errors: 0
    send_count: 1
    resend_count: 0
    response_timeout_count: 0
    local_interrupt_count: 0
    local_dropped_count: 0
    local_aborted_count: 0
    local_no_route_count: 0
    local_timeout_count: 0
    local_error_count: 0
    remote_dropped_count: 0
    remote_error_count: 0
    remote_timeout_count: 0
    network_timeout_count: 0
    failed_resends: 0
    successful_resends: 0
    recv_count: 0
    route_count: 0
    drop_count: 0
    send_length: 0
    recv_length: 0
    route_length: 0
    drop_length: 0
"
    );
}

/// `lnetctl global show`: cYAML; the 13 keys of lnetctl.c's jt_show_global in its order. The
/// values are ulnet's true ones where the kernel's default names a mechanism ulnet lacks
/// (discovery 0, retry_count 0, health_sensitivity 0, router_sensitivity 0,
/// response_tracking 0), max_interfaces is how many NIs a ping reply of ours can list, and
/// transaction_timeout is lnd_timeout * (retry_count + 1) + 1 (Lustre's relation, with the
/// NI's LND timeout of 50 s).
#[test]
fn golden_global_show() {
    let n = node();
    assert_eq!(
        yaml_at(&Response::Global(global_show(&n)), 0).unwrap(),
        include_str!("fixtures/global-show.yaml")
    );
}

/// `lnetctl route show [-v]`: libyaml's indent 6; `net`, `gateway`, then with -v `hop` (-1:
/// not given), `priority`, `state`, `type` (api-ni.c, route_props_list; `health_sensitivity`
/// is in the table but the kernel's dump never fills it). The gateway counts as up until the
/// router pinger says otherwise (router.c, a new route's gateway starts alive).
#[test]
fn golden_route_show() {
    let n = node();
    assert_eq!(
        yaml(&Response::Route(route_show(&n, None, None, false).unwrap())).unwrap(),
        "\
route:
-     net: o2ib1
      gateway: 10.0.0.3@o2ib
"
    );
    assert_eq!(
        yaml(&Response::Route(route_show(&n, None, None, true).unwrap())).unwrap(),
        "\
route:
-     net: o2ib1
      gateway: 10.0.0.3@o2ib
      hop: -1
      priority: 0
      state: up
      type: single-hop
"
    );
    assert_eq!(
        yaml(&Response::Route(RouteShow::default())).unwrap(),
        "route: []\n"
    );
}

/// `lnetctl export --backup`: net, route, peer in libyaml's indent 6, then routing (a mapping
/// with `enable`), buffers (each pool's total) and global in cYAML (lnetctl.c, jt_export; the
/// kernel's backup dumps leave out the loopback net, status, statistics, a route's state and
/// type, and a peer NI's state). ulnet keeps each NI's `nid` and its lnd `timeout` (see
/// export.rs) and adds its own NI keys after them, and the router pinger's module parameters
/// after `enable`.
#[test]
fn golden_export() {
    let n = node();
    let running = crate::export::Running {
        net: net_show(&n, &[], true),
        peer: peer_show(&n, None, true).unwrap(),
        route: route_show(&n, None, None, true).unwrap(),
        routing: routing_show(&n),
        global: global_show(&n),
    };
    assert_eq!(
        crate::export::to_text(&crate::export::export(&running, true)),
        String::from(
            "\
net:
-     net type: o2ib
      local NI(s):
      -     nid: 10.0.0.1@o2ib
"
        ) + include_str!("fixtures/ni-tunables.yaml")
            + &ulnet_defaults("            ")
            + concat!(
                "\
route:
-     net: o2ib1
      gateway: 10.0.0.3@o2ib
      hop: -1
      priority: 0
peer:
-     primary nid: 10.0.0.2@o2ib
      Multi-Rail: false
      peer ni:
      -     nid: 10.0.0.2@o2ib
routing:
    enable: 0
    alive_router_check_interval: 60
    router_ping_timeout: 50
    avoid_asym_router_failure: 1
buffers:
    tiny: 2048
    small: 16384
    large: 1024
",
                include_str!("fixtures/global-show.yaml")
            )
    );
    // A plain export adds the state: the loopback net, status, statistics, a route's state
    // and type, the peer NI's credits, and routing as `routing show` prints it.
    let full = crate::export::to_text(&crate::export::export(&running, false));
    for want in [
        "-     net type: lo\n",
        "            status: up\n",
        "      state: up\n      type: single-hop\n",
        "            available_tx_credits: 7\n",
        "routing:\n    - cpt[0]:\n          tiny:\n",
        "    - enable: 0\n      alive_router_check_interval: 60\n      router_ping_timeout: 50\n      \
         avoid_asym_router_failure: 1\nbuffers:\n",
    ] {
        assert!(full.contains(want), "{want:?} not in\n{full}");
    }
}

/// `peer show -v 2` and `net show -v 2`: `health stats` after `statistics` (api-ni.c's key
/// tables: the peer NI's `health value, dropped, timeout, error, network timeout, ping_count,
/// next_ping`; the local NI's `fatal_error, health value, interrupts, dropped, aborted, no
/// route, timeouts, error, ping_count, next_ping`), at the maximum (1000) with health off.
#[test]
fn golden_health_stats() {
    let n = node();
    let peer = yaml_at(&Response::Peer(peer_show(&n, None, true).unwrap()), 2).unwrap();
    assert!(
        peer.ends_with(
            "            statistics:
                  send_count: 1
                  recv_count: 0
                  drop_count: 0
            health stats:
                  health value: 1000
                  dropped: 0
                  timeout: 0
                  error: 0
                  network timeout: 0
                  ping_count: 0
                  next_ping: 0
"
        ),
        "{peer}"
    );
    let net = yaml_at(&Response::Net(net_show(&n, &[], true)), 2).unwrap();
    assert!(
        net.contains(concat!(
            "                  drop_count: 0\n",
            include_str!("fixtures/ni-health.yaml"),
            "            tunables:\n"
        )),
        "{net}"
    );
}
