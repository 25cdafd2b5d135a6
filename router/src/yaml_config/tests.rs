use super::*;
use lnd::engine::config::DEFAULT_PEER_LIMIT;
use lnd::engine::Tunables;
use lnd::time::Duration;
use lnd::wire::Nid;

use crate::config::BufferCounts;
use crate::routes::RouteConfig;

const GOOD: &str = include_str!("fixtures/good.yaml");

/// GOOD with `extra` (whole lines) added to its first NI's keys.
fn good_with_ni_keys(extra: &str) -> String {
    GOOD.replace(
        "          listen: 127.0.0.1:9870\n",
        &format!("          listen: 127.0.0.1:9870\n{extra}"),
    )
}

/// What `y`, read from file `file`, is refused with, as printed.
fn refused(y: &str, file: &str) -> String {
    DaemonConfig::parse(y, file).unwrap_err().to_string()
}

/// The error `y` is refused with, which names line `line`.
fn error_at(y: &str, line: u64) -> ConfigError {
    let e = DaemonConfig::parse(y, "c.yaml").unwrap_err();
    assert_eq!(e.line, Some(line), "{e}");
    e
}

#[test]
fn good_config_parses() {
    let c = DaemonConfig::parse(GOOD, "t.yaml").unwrap();
    assert_eq!(c.nets.len(), 1);
    let (net, ni) = c.nis().next().unwrap();
    assert_eq!(net.fabric, FabricKind::Tcp);
    assert_eq!(ni.ni.nid.to_string(), "10.0.0.1@o2ib");
    assert_eq!(ni.listen, Some("127.0.0.1:9870".parse().unwrap()));
    assert_eq!(ni.busy_poll_us, DEFAULT_BUSY_POLL_US);
    assert_eq!((ni.ni.credits, ni.ni.peer_credits), (512, 16));
    assert_eq!(ni.ni.tunables.peer_credits, 16);
    assert_eq!(ni.ni.tunables.peer_credits_hiw, 8);
    assert_eq!(ni.ni.tunables.concurrent_sends, 16);
    assert_eq!(ni.ni.tunables.timeout, Duration::from_secs(40));
    assert_eq!(ni.ni.tunables.keepalive, Duration::from_secs(90));
    assert_eq!(ni.ni.tunables.conns_per_peer, 1, "o2iblnd's default");
    assert_eq!(ni.line, 5);
    // o2iblnd's conns_per_peer: 0 is its default of 1, 127 at most (kiblnd_nl_set).
    for (v, want) in [
        ("0", Ok(1)),
        ("4", Ok(4)),
        ("127", Ok(127)),
        ("128", Err(())),
    ] {
        let y = GOOD.replace(
            "              keepalive: 90\n",
            &format!("              keepalive: 90\n              conns_per_peer: {v}\n"),
        );
        match (DaemonConfig::parse(&y, "t.yaml"), want) {
            (Ok(c), Ok(n)) => {
                assert_eq!(c.nis().next().unwrap().1.ni.tunables.conns_per_peer, n)
            }
            (Err(e), Err(())) => {
                let e = e.to_string();
                assert!(e.contains("t.yaml:18: conns_per_peer"), "{e}");
            }
            (got, want) => panic!("conns_per_peer {v}: {:?} for {want:?}", got.is_ok()),
        }
    }
    let peer: Nid = "10.0.0.2@o2ib".parse().unwrap();
    assert_eq!(c.peers[&peer], "127.0.0.1:9871".parse().unwrap());
    let node = c.node_config(77);
    assert_eq!(node.nis.len(), 1);
    assert_eq!(node.nis[0].incarnation, 77);
}

#[test]
fn defaults_apply() {
    let y =
        "net:\n  - net type: tcp1\n    fabric: sim\n    local NI(s):\n      - nid: 1.2.3.4@tcp1\n";
    let c = DaemonConfig::parse(y, "t.yaml").unwrap();
    let (_, ni) = c.nis().next().unwrap();
    assert_eq!((ni.ni.credits, ni.ni.peer_credits), (256, 8));
    assert_eq!(ni.ni.tunables, Tunables::default());
    assert_eq!(ni.peer_timeout, 180);
}

#[test]
fn unknown_key_names_line_and_suggests() {
    assert_eq!(
        refused(
            &GOOD.replace("peer_credits: 16", "peer_credit: 16"),
            "config.yaml"
        ),
        "config.yaml:10: unknown key 'peer_credit' (did you mean peer_credits?)"
    );
}

#[test]
fn bad_nid_names_line_with_lnd_message() {
    let e = error_at(&GOOD.replace("nid: 10.0.0.2@o2ib", "nid: 10.0.0.2@ib0"), 20);
    assert!(
        e.message
            .contains("bad NID '10.0.0.2@ib0': unknown network type 'ib'"),
        "{e}"
    );
}

#[test]
fn bad_values_name_line_and_value() {
    // (GOOD's text, what replaces it, the line named, what the message says if checked)
    let cases = [
        ("credits: 512", "credits: lots", 12, "credits: lots"),
        ("fabric: tcp", "fabric: ib", 3, ""),
        ("listen: 127.0.0.1:9870", "listen: nowhere", 6, ""),
    ];
    for (good, bad, line, says) in cases {
        let e = error_at(&GOOD.replace(good, bad), line);
        assert!(e.message.contains(says), "{e}");
    }
    assert_eq!(
        refused(
            &GOOD.replace("peer_credits: 16", "peer_credits: 300"),
            "c.yaml"
        ),
        "c.yaml:10: peer_credits: 300 is out of range 1..=255"
    );
}

#[test]
fn semantic_errors_name_line() {
    let e = error_at(
        &GOOD.replace("nid: 10.0.0.1@o2ib", "nid: 10.0.0.1@o2ib1"),
        5,
    );
    assert!(e.message.contains("not on net type o2ib"), "{e}");

    // Without `listen`, the NI listens where o2iblnd would (its address, port 987: the
    // daemon's default), and a net without `fabric` is tcp.
    let y = GOOD.replace("          listen: 127.0.0.1:9870\n", "");
    let c = DaemonConfig::parse(&y, "c.yaml").unwrap();
    assert_eq!(c.nis().next().unwrap().1.listen, None);
    let y = GOOD.replace("      fabric: tcp\n", "");
    let c = DaemonConfig::parse(&y, "c.yaml").unwrap();
    assert_eq!(
        (c.nets[0].fabric, c.nets[0].fabric_given),
        (FabricKind::Tcp, false)
    );
}

/// A file in the shape `lnetctl export` writes (lnetctl.c and liblnetconfig.c's YAML
/// builders: the `lo` net, each NI's status, interfaces, statistics, sent/received/dropped
/// stats, health stats, tunables with the LND's, `dev cpt` and `CPT`; `route:` with
/// health_sensitivity; one-NI `peer:` entries; `global:` with 2.16's keys; `numa:`),
/// written from those sources' key lists, loads unedited; `udsp:`, `ip2nets:` and
/// Multi-Rail peers are refused, each with one line naming it.
#[test]
fn an_lnetctl_export_loads_and_unsupported_sections_are_named() {
    let export = include_str!("fixtures/lnetctl-export-2.16.yaml");
    let c = DaemonConfig::parse(export, "export.yaml").unwrap();
    let nis: Vec<_> = c
        .nis()
        .map(|(n, ni)| (n.fabric, ni.ni.nid, ni.listen))
        .collect();
    assert_eq!(
        nis,
        vec![(FabricKind::Tcp, "10.0.0.1@o2ib".parse().unwrap(), None)]
    );
    assert!(!c.nets[0].fabric_given);
    // `global:` is applied, read-only keys (lnd_timeout) skipped.
    let g = &c.node_config(1).globals;
    assert_eq!(g.get("retry_count"), Some(2));
    assert_eq!(g.get("transaction_timeout"), Some(150));
    assert_eq!(g.get("max_recovery_ping_interval"), Some(900));
    assert_eq!(g.get("discovery"), Some(1));
    for (bad, want) in [
        (
            "    health_sensitivity: 100\n",
            "    health_sensitivity: 1001\n",
        ),
        ("    numa_range: 0\n", "    numa_rnge: 0\n"),
        ("    range: 0\n", "    range: -4\n"),
    ] {
        let text = export.replace(bad, want);
        let line = text.lines().position(|l| l == want.trim_end()).unwrap() + 1;
        let e = DaemonConfig::parse(&text, "export.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("export.yaml:{line}")), "{e}");
        assert!(e.contains("global: "), "{e}");
    }
    assert!(!c.selftest, "lnet_selftest is off unless asked for");
    let on = DaemonConfig::parse(&format!("{export}selftest:\n    enable: 1\n"), "x").unwrap();
    assert!(on.selftest);
    assert_eq!(c.routes.len(), 1);
    assert_eq!(
        c.nis().next().unwrap().1.ni.tunables.timeout,
        Duration::from_secs(50)
    );

    let with = |extra: &str| format!("{export}{extra}");
    let e = DaemonConfig::parse(
        &with("udsp:\n    - src: o2ib\n      action:\n          priority: 0\n"),
        "x.yaml",
    )
    .unwrap_err();
    assert!(e.message.contains("'udsp:' is not supported"), "{e}");
    let e = DaemonConfig::parse(&with("ip2nets:\n    - net-spec: o2ib\n"), "x.yaml").unwrap_err();
    assert!(e.message.contains("'ip2nets:' is not supported"), "{e}");
    // An empty udsp list (what an export without rules writes) is fine.
    DaemonConfig::parse(&with("udsp: []\n"), "x.yaml").unwrap();
    let mr = export.replace(
            "        - nid: 10.0.0.2@o2ib\n          state: NA\n",
            "        - nid: 10.0.0.2@o2ib\n          state: NA\n        - nid: 10.0.1.2@o2ib1\n          state: NA\n",
        );
    let e = DaemonConfig::parse(&mr, "x.yaml").unwrap_err();
    assert!(
        e.message.contains("Multi-Rail peers with several NIs"),
        "{e}"
    );
    assert_eq!(e.to_string().lines().count(), 1, "{e}");
}

#[test]
fn shipped_example_parses() {
    let text = include_str!("../../examples/lnet-router.yaml");
    let c = DaemonConfig::parse(text, "lnet-router.yaml").unwrap();
    assert!(c.nis().count() >= 1);
}

#[test]
fn ulnet_keys_checksum_race_order_and_peer_limit() {
    use lnd::engine::RaceOrder;
    use lnd::wire::kib::CksumFlavour;
    let d = DaemonConfig::parse(GOOD, "t.yaml").unwrap();
    let ni = &d.nis().next().unwrap().1.ni;
    assert!(
        !ni.checksum.emit,
        "checksums are off by default, as cksum=0"
    );
    assert_eq!(ni.checksum.default_flavour, None);
    assert_eq!(ni.race_order, RaceOrder::NidHash, "2.16's order by default");
    assert_eq!(ni.peer_limit, DEFAULT_PEER_LIMIT);
    assert_eq!(
        ni.tunables.connect_hedge,
        lnd::time::Duration::from_secs(1),
        "a stuck connect gets a second attempt after 1 s by default"
    );
    let y = good_with_ni_keys(
            "          checksum: on\n          checksum default: signed\n          race order: nid\n          peer limit: 50000\n          connect hedge ms: 0\n",
        );
    let c = DaemonConfig::parse(&y, "t.yaml").unwrap();
    let ni = &c.nis().next().unwrap().1.ni;
    assert!(ni.tunables.connect_hedge.is_zero(), "0 turns it off");
    assert!(ni.checksum.emit);
    assert_eq!(ni.checksum.default_flavour, Some(CksumFlavour::Signed));
    assert_eq!(ni.race_order, RaceOrder::Nid);
    assert_eq!(ni.peer_limit, 50_000);
    let y = good_with_ni_keys("          checksum: true\n          checksum default: unsigned\n");
    let ni = DaemonConfig::parse(&y, "t.yaml")
        .unwrap()
        .nis()
        .next()
        .unwrap()
        .1
        .ni
        .clone();
    assert!(ni.checksum.emit);
    assert_eq!(ni.checksum.default_flavour, Some(CksumFlavour::Unsigned));
    // Bad values name their line and the key.
    for (bad, key) in [
        ("          race order: hash\n", "race order"),
        ("          checksum default: maybe\n", "checksum default"),
        ("          checksum: sometimes\n", "on or off"),
        ("          peer limit: 0\n", "peer limit"),
        ("          connect hedge ms: 60001\n", "connect hedge ms"),
    ] {
        let e = DaemonConfig::parse(&good_with_ni_keys(bad), "t.yaml").unwrap_err();
        assert!(e.to_string().contains(key), "{bad}: {e}");
        assert!(e.to_string().starts_with("t.yaml:"), "{bad}: {e}");
    }
}

#[test]
fn configs_without_nis_and_self_peers_are_refused() {
    for (y, line) in [
        ("", 1),
        ("# just a comment\n", 1),
        ("\nnet: []\n", 2),
        ("net:\n    - net type: lo\n", 2),
        ("net:\n    - net type: o2ib\n      local NI(s): []\n", 2),
    ] {
        let e = DaemonConfig::parse(y, "t.yaml").unwrap_err();
        assert_eq!(e.line, Some(line), "{y:?}: {e}");
        assert!(e.message.contains("no NI configured"), "{e}");
        // Asked for (--no-nis), each is a daemon with no NI yet.
        let c = DaemonConfig::parse_allowing_no_nis(y, "t.yaml").unwrap();
        assert_eq!(c.nis().count(), 0, "{y:?}");
    }
    // --no-nis still reads what the file says, and still refuses what is wrong in it.
    let c = DaemonConfig::parse_allowing_no_nis("routing:\n    enable: 1\n", "t.yaml").unwrap();
    assert!(c.routing.enabled);
    let e =
        DaemonConfig::parse_allowing_no_nis("routing:\n    enable: maybe\n", "t.yaml").unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");
    let missing = std::path::Path::new("/nonexistent/ulnet/lnet-router.yaml");
    assert_eq!(
        DaemonConfig::load_allowing_no_nis(missing)
            .unwrap()
            .nis()
            .count(),
        0
    );
    assert!(DaemonConfig::load(missing).is_err());
    assert_eq!(
        refused(
            &GOOD.replace("nid: 10.0.0.2@o2ib", "nid: 10.0.0.1@o2ib"),
            "t.yaml"
        ),
        "t.yaml:20: peer 10.0.0.1@o2ib is one of our own NIs (line 5); 'peers:' lists \
             where other daemons listen"
    );
}

#[test]
fn errors_quote_excerpts_only() {
    let big = "7".repeat(100_000);
    let y = GOOD.replace("credits: 512", &format!("credits: {big}"));
    let e = error_at(&y, 12);
    assert!(e.to_string().chars().count() < 400, "{e}");
    assert!(e.message.ends_with("…`") || e.message.ends_with('…'), "{e}");
    // (YAML's simple keys are at most 1024 characters.)
    let y = GOOD.replace(
        "peer_credits: 16",
        &format!("peer_credit{}: 16", &big[..600]),
    );
    let e = error_at(&y, 10);
    assert!(e.message.starts_with("unknown key 'peer_credit7"), "{e}");
    assert!(e.to_string().chars().count() < 400, "{e}");
    let nested = format!("net: {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
    let e = DaemonConfig::parse(&nested, "c.yaml").unwrap_err();
    assert!(e.to_string().chars().count() < 400, "{e}");
}

#[test]
fn busy_poll_is_per_ni_and_checked() {
    let y = good_with_ni_keys("          busy poll us: 0\n");
    let c = DaemonConfig::parse(&y, "t.yaml").unwrap();
    assert_eq!(c.nis().next().unwrap().1.busy_poll_us, 0);
    let y = good_with_ni_keys("          busy poll us: 2000000\n");
    let e = error_at(&y, 7);
    assert!(e.message.contains("busy poll us"), "{e}");
}

#[test]
fn handshake_limit_is_per_ni_and_checked() {
    let c = DaemonConfig::parse(GOOD, "t.yaml").unwrap();
    assert_eq!(c.nis().next().unwrap().1.handshake_limit, 4096);
    let y = good_with_ni_keys("          handshake limit: 100\n");
    let c = DaemonConfig::parse(&y, "t.yaml").unwrap();
    assert_eq!(c.nis().next().unwrap().1.handshake_limit, 100);
    let y = good_with_ni_keys("          handshake limit: -1\n");
    error_at(&y, 7);
}

/// What `lnetctl export` writes on a Lustre router (net, route, routing, buffers, peer,
/// global), plus ulnet's `fabric`/`listen`: it loads, with the routing sections read.
const ROUTER_EXPORT: &str = include_str!("fixtures/router-export.yaml");

/// `lnetctl export --backup` of a Lustre 2.16 node with one o2ib NI on an interface, one
/// route, routing on and the default globals, in the layout lnetctl writes it (libyaml's
/// indent 6 for net, route and peer; cYAML for the rest). Facts from lnetctl.c
/// (jt_export), api-ni.c (the backup dumps: no nid, no lnd `timeout`, `map_on_demand` as a
/// flag, `CPT` quoted) and liblnetconfig.c (routing/buffers/global); the interface is `lo`
/// here so that the test host has it.
const LUSTRE_BACKUP: &str = include_str!("../../tests/data/lustre-2.16-export-backup.yaml");

#[test]
fn a_lustre_backup_loads_its_ni_named_by_interface() {
    let c = DaemonConfig::parse(LUSTRE_BACKUP, "backup.yaml").unwrap();
    let nids: Vec<Nid> = c.nis().map(|(_, ni)| ni.ni.nid).collect();
    assert_eq!(nids, vec!["127.0.0.1@o2ib".parse::<Nid>().unwrap()]);
    let ni = &c.nis().next().unwrap().1.ni;
    assert_eq!((ni.credits, ni.peer_credits), (256, 8));
    assert_eq!(c.routes.len(), 1);
    assert!(c.routing.enabled);
    assert_eq!(c.routing.buffers.small, 16384);
    let g = &c.globals;
    assert_eq!(
        (
            g.get("retry_count"),
            g.get("health_sensitivity"),
            g.get("max_interfaces")
        ),
        (Some(2), Some(100), Some(4096))
    );
    assert_eq!(c.given.globals.len(), 12, "lnd_timeout is shown, not set");
    // An interface this host does not have is named, with its line.
    let e = DaemonConfig::parse(
        &LUSTRE_BACKUP.replace("0: lo\n", "0: ulnet-nosuch0\n"),
        "backup.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("backup.yaml:5") && e.contains("no interface ulnet-nosuch0"),
        "{e}"
    );
    // Neither nid nor interfaces: said plainly.
    let e = DaemonConfig::parse(
        "net:\n-     net type: o2ib\n      local NI(s):\n      -     status: up\n",
        "x",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("needs 'nid'"), "{e}");
}

/// A Lustre 2.12-2.14 `lnetctl export` (liblnetconfig.c and lnetctl.c of 2.12.9, before
/// LU-13641 and the 2.15 layout): `tcp bonding` and `dev cpt` per NI, o2iblnd's tunables
/// under `tunables:` with an empty `lnd tunables:`, and `global: max_intf:`. It loads as a
/// file and as an import, `max_intf` taken as `max_interfaces`, the LND's tunables as such.
#[test]
fn a_lustre_2_12_export_loads() {
    let export = include_str!("fixtures/lnetctl-export-2.12.yaml");
    let c = DaemonConfig::parse(export, "l212.yaml").unwrap_or_else(|e| panic!("{e}"));
    let (_, ni) = c.nis().next().unwrap();
    assert_eq!(ni.ni.nid.to_string(), "10.0.0.1@o2ib");
    assert_eq!((ni.ni.credits, ni.ni.peer_credits), (512, 16));
    let t = &ni.ni.tunables;
    assert_eq!(
        (t.peer_credits_hiw, t.concurrent_sends, t.conns_per_peer),
        (8, 16, 2),
        "the LND's tunables, from under tunables:"
    );
    assert_eq!(c.globals.get("max_interfaces"), Some(300));
    assert!(c
        .given
        .globals
        .contains(&("max_interfaces".to_string(), 300)));
    let nid = ni.ni.nid;
    let i = DaemonConfig::parse_import(export, "import", &[nid]).unwrap_or_else(|e| panic!("{e}"));
    assert!(i
        .given
        .globals
        .contains(&("max_interfaces".to_string(), 300)));
    // `lnd tunables` win over the 2.12 place when both say.
    let both = export.replace(
        "          lnd tunables:\n          dev cpt: -1",
        "          lnd tunables:\n              peercredits_hiw: 4\n          dev cpt: -1",
    );
    let c = DaemonConfig::parse(&both, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.nis().next().unwrap().1.ni.tunables.peer_credits_hiw, 4);
}

#[test]
fn a_routers_lnetctl_export_loads_with_its_routes_and_buffers() {
    let c = DaemonConfig::parse(ROUTER_EXPORT, "export.yaml").unwrap();
    assert!(c.routing.enabled);
    assert_eq!(
        c.routing.buffers,
        BufferCounts {
            tiny: 512,
            small: 4096,
            large: 256
        }
    );
    let routes: Vec<RouteConfig> = c.routes.iter().map(|r| r.route).collect();
    assert_eq!(routes.len(), 2);
    assert_eq!(routes[0].net.to_string(), "o2ib2");
    assert_eq!(routes[0].hops, Some(2));
    assert_eq!(routes[0].priority, 1);
    assert_eq!(routes[1].hops, None);
    assert_eq!(c.routes[0].line, 36);
    assert_eq!(c.routes[1].line, 41);
    let ni = &c.nis().next().unwrap().1.ni;
    assert_eq!(ni.peer_buffer_credits, 16);
    // Each NI runtime gets the routes, routing on, and its share of the buffers.
    let per_ni = c.ni_node_configs(1);
    assert_eq!(per_ni.len(), 2);
    for n in &per_ni {
        assert_eq!(n.routes, routes);
        assert!(n.routing.enabled);
        assert_eq!(n.routing.buffers.small, 2048);
    }
    // Without `routing:`, a node does not forward.
    let plain = ROUTER_EXPORT.replace("routing:\n    enable: 1\n", "");
    assert!(
        !DaemonConfig::parse(&plain, "x.yaml")
            .unwrap()
            .routing
            .enabled
    );
}

/// Each bad route is refused with its line and the reason.
#[test]
fn bad_routes_are_refused_with_their_line_and_reason() {
    let rows = [
        (
            "      gateway: 10.1.0.253@o2ib1\n",
            "      gateway: 10.9.0.1@o2ib9\n",
            "not on any local net",
        ),
        ("    - net: o2ib2\n", "    - net: o2ib1\n", "is local"),
        ("      hop: 2\n", "      hop: 0\n", "outside 1..=255"),
        ("      hop: 2\n", "      hop: 300\n", "outside 1..=255"),
        (
            "      gateway: 10.1.0.253@o2ib1\n",
            "      gateway: 10.1.0.254@o2ib1\n",
            "own NIDs",
        ),
        (
            "      gateway: 10.0.0.253@o2ib\n",
            "      gateway: 10.1.0.253@o2ib1\n      bogus: 1\n",
            "unknown",
        ),
    ];
    for (from, to, why) in rows {
        let y = ROUTER_EXPORT.replacen(from, to, 1);
        let e = DaemonConfig::parse(&y, "export.yaml").unwrap_err();
        assert!(e.message.contains(why), "{to:?}: {e}");
        assert!(
            e.line.is_some_and(|l| (36..=46).contains(&l)),
            "{to:?}: {e}"
        );
    }
    let dup = ROUTER_EXPORT.replace(
        "routing:",
        "    - net: o2ib2\n      gateway: 10.1.0.253@o2ib1\nrouting:",
    );
    let e = DaemonConfig::parse(&dup, "export.yaml").unwrap_err();
    assert!(e.message.contains("already exists"), "{e}");
    assert_eq!(e.line, Some(46), "{e}");
}

/// `metrics:` (issue 36): off unless given; `listen` required, an address with its port; the
/// bounds checked at their lines; unknown keys refused by name.
#[test]
fn metrics_section_is_checked_at_its_lines() {
    let c = DaemonConfig::parse(GOOD, "t.yaml").unwrap();
    assert_eq!(c.metrics, None, "off unless configured");
    let with = |m: &str| format!("{GOOD}metrics:\n{m}");
    let c = DaemonConfig::parse(&with("    listen: 127.0.0.1:9170\n"), "t.yaml").unwrap();
    assert_eq!(
        c.metrics,
        Some(MetricsConfig::on("127.0.0.1:9170".parse().unwrap()))
    );
    let c = DaemonConfig::parse(
        &with("    listen: 127.0.0.1:9170\n    top_peers: 0\n    max_connections: 2\n"),
        "t.yaml",
    )
    .unwrap();
    let m = c.metrics.unwrap();
    assert_eq!((m.top_peers, m.max_connections), (0, 2));
    let line = GOOD.lines().count() + 2;
    for (body, want) in [
        ("    listen: 9170\n", "not an address and port"),
        ("    listen: localhost\n", "not an address and port"),
        ("    top_peers: 3\n", "'listen' is required"),
        (
            "    listen: 127.0.0.1:9\n    max_connections: 0\n",
            "max_connections",
        ),
        (
            "    listen: 127.0.0.1:9\n    top_peer: 3\n",
            "unknown key 'top_peer'",
        ),
    ] {
        let e = DaemonConfig::parse(&with(body), "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{body:?}: {e}");
        assert!(e.starts_with("t.yaml:"), "{e}");
        if want == "not an address and port" {
            assert!(e.starts_with(&format!("t.yaml:{line}:")), "{e}");
        }
    }
}
