//! The daemon's running configuration as the operator sees and changes it: `lnetctl export`
//! gives back every setting the configuration took (a restart from it is the same daemon),
//! `set` takes exactly the configuration's ranges and says when it cannot do what it is
//! asked, and `import` applies or refuses each `routing:` and `selftest:` key, saying which.

mod common;

use common::*;
use router::control::{errno, Request, Response};
use router::yaml_config::DaemonConfig;

const NID_R1: &str = "10.1.0.1@o2ib1";

/// A router (two NIs, routing on, large buffers registered) with every key of ulnet's
/// configuration away from its default, in a scratch directory named `test`; its peer's
/// address is a port the test holds. The directory, the held port, the daemon and its YAML.
fn configured(test: &str) -> (Scratch, std::net::TcpListener, Daemon, String) {
    let dir = Scratch::new(test);
    let (held, peer_port) = held_port();
    let yaml = format!(
        "\
net:
    - net type: o2ib
      fabric: tcp
      local NI(s):
        - nid: {NID_A}
          listen: 127.0.0.1:0
          busy poll us: 0
          handshake limit: 10
    - net type: o2ib1
      fabric: tcp
      local NI(s):
        - nid: {NID_R1}
          listen: 127.0.0.1:0
          busy poll us: 7
          handshake limit: 0
routing:
    enable: 1
    alive_router_check_interval: 15
    router_ping_timeout: 7
    avoid_asym_router_failure: 0
buffers:
    tiny: 64
    small: 64
    large: 8
peers:
    - nid: {NID_B}
      address: 127.0.0.1:{peer_port}
selftest:
    enable: 1
"
    );
    let r = start_yaml(&dir.0, "r", &yaml, Opts::default());
    (dir, held, r, yaml)
}

/// Writes `text` to the file `name` in `dir`, for lnetctl to import: its path.
fn write_doc(dir: &Scratch, name: &str, text: &str) -> String {
    let file = dir.0.join(name);
    std::fs::write(&file, text).unwrap();
    file.to_str().unwrap().to_string()
}

/// What a restart takes from a configuration (the listen ports aside: port 0 is bound).
fn settings(c: &DaemonConfig) -> String {
    let nis: Vec<String> = c
        .nis()
        .map(|(_, ni)| {
            format!(
                "{} busy={} hs={} credits={}",
                ni.ni.nid, ni.busy_poll_us, ni.handshake_limit, ni.ni.credits
            )
        })
        .collect();
    let mut peers: Vec<String> = c.peers.iter().map(|(n, a)| format!("{n}={a}")).collect();
    peers.sort();
    format!(
        "{nis:?} peers={peers:?} health={:?} selftest={} routing={:?}",
        c.gateway_health, c.selftest, c.routing
    )
}

/// Audit §3: export (plain and --backup) writes the `peers:` table, `selftest: enable`, the
/// router pinger's module parameters and each NI's `busy poll us` and `handshake limit`; the
/// export parses to the configuration the daemon started from, and imports back as a no-op.
/// They show at run time too (`net show -v 5`, `routing show`, `global show -v`).
#[test]
fn export_gives_back_every_setting() {
    let (dir, held, r, yaml) = configured("export_every_setting");
    let peer_port = held.local_addr().unwrap().port();
    let want = settings(&DaemonConfig::parse(&yaml, "r.yaml").unwrap());
    let run = |args: &[&str]| out(&lnetctl(&r, args));
    let file = dir.0.join("export.yaml");
    let f = file.to_str().unwrap();
    for args in [&["export"][..], &["export", "--backup"]] {
        let (code, text, err) = run(args);
        assert_eq!(code, Some(0), "{err}");
        let c = DaemonConfig::parse(&text, "export").unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(settings(&c), want, "{args:?}:\n{text}");
        std::fs::write(&file, &text).unwrap();
        assert_eq!(
            run(&["import", f]),
            (Some(0), String::new(), String::new()),
            "{args:?}: export | import is a no-op"
        );
    }
    let (_, net, _) = run(&["net", "show", "-v", "5"]);
    for want in [
        "busy poll us: 0\n",
        "handshake limit: 10\n",
        "busy poll us: 7\n",
        "handshake limit: 0\n",
        &format!("peers:\n-     nid: {NID_B}\n      address: 127.0.0.1:{peer_port}\n"),
    ] {
        assert!(net.contains(want), "{want:?} not in\n{net}");
    }
    let (_, routing, _) = run(&["routing", "show"]);
    assert!(
        routing.contains(
            "router_checks:\n    alive_router_check_interval: 15\n    router_ping_timeout: 7\n    \
             avoid_asym_router_failure: 0\n"
        ),
        "{routing}"
    );
    assert!(run(&["global", "show", "-v"])
        .1
        .contains("    selftest: 1\n"));
}

/// Audit §4, §5, §16: `set` takes the configuration's range and no more (so `export | import`
/// still works after any `set`); `set large_buffers` above what the daemon registers at most is
/// refused with ENOMEM naming the cap, changing nothing; range errors quote both limits.
#[test]
fn set_takes_the_configurations_ranges_and_says_its_cap() {
    let (dir, _held, r, _) = configured("set_ranges");
    let run = |args: &[&str]| out(&lnetctl(&r, args));
    // A `set` refused with exit status `code`, its error saying `says`.
    let refused = |args: &[&str], code: i32, says: &str| {
        let (c, stdout, err) = run(args);
        assert_eq!(c, Some(code), "{args:?}: {stdout}{err}");
        assert!(err.contains(says), "{err}");
    };
    let large = |r: &Daemon| match call(r, Request::RoutingShow) {
        Response::Routing(s) => s.cpts.iter().map(|c| c.large.nbuffers).sum::<u32>(),
        other => panic!("{other:?}"),
    };

    refused(&["set", "tiny_buffers", "20000000"], 2, "1..=10000000");
    // The daemon checks too (another client, an import).
    match call(
        &r,
        Request::SetBuffers {
            pool: "small".into(),
            count: u32::MAX,
        },
    ) {
        Response::Error(e) => {
            assert_eq!(e.errno, errno::EINVAL);
            assert_eq!(
                e.message,
                "small_buffers: 4294967295 is out of range 1..=10000000"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(run(&["set", "tiny_buffers", "10000000"]).0, Some(0));

    // 8 large buffers at start (4 per NI); the pool grows and shrinks at run time, up to what
    // the daemon registers at most: above that, ENOMEM saying so, and nothing changes.
    assert_eq!(large(&r), 8);
    refused(
        &["set", "large_buffers", "65537"],
        1,
        "large_buffers: 65537 is more than the 65536 this daemon registers",
    );
    assert_eq!(large(&r), 8, "nothing changed");
    assert_eq!(
        run(&["set", "large_buffers", "12"]),
        (Some(0), String::new(), String::new())
    );
    assert_eq!(large(&r), 12);
    assert_eq!(run(&["set", "large_buffers", "4"]).0, Some(0));
    assert_eq!(large(&r), 4);
    assert_eq!(run(&["set", "large_buffers", "8"]).0, Some(0));
    assert_eq!(large(&r), 8);

    refused(
        &["set", "numa_range", "4294967296"],
        1,
        "numa_range: 4294967296 is out of range 0..=4294967295",
    );

    // Whatever `set` took, the export loads and imports back.
    let (_, text, _) = run(&["export"]);
    DaemonConfig::parse(&text, "export").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(
        run(&["import", &write_doc(&dir, "export.yaml", &text)]),
        (Some(0), String::new(), String::new())
    );
}

/// Audit §13: an import's `routing:` module parameters are applied at run time, each an item;
/// a `selftest:` it cannot apply (lnet_selftest starts with the daemon) is listed under
/// `failed:` as "restart needed", by `--show` too, and the exit status says so.
#[test]
fn import_applies_the_router_pinger_and_names_a_selftest_restart() {
    let (dir, _held, r, _) = configured("import_modparams");
    let run = |args: &[&str]| out(&lnetctl(&r, args));
    let f = &write_doc(
        &dir,
        "doc.yaml",
        "routing:\n    alive_router_check_interval: 5\n    router_ping_timeout: 3\n    \
         avoid_asym_router_failure: 0\nselftest:\n    enable: 0\n",
    );
    let (code, shown, _) = run(&["import", "--show", f]);
    assert_eq!(code, Some(1), "{shown}");
    assert!(
        shown.contains("would apply: 2\n    unchanged: 1\n"),
        "{shown}"
    );
    assert!(
        shown.contains("- selftest:\n") && shown.contains("restart needed"),
        "{shown}"
    );
    assert!(run(&["routing", "show"])
        .1
        .contains("alive_router_check_interval: 15\n"));

    let (code, stdout, err) = run(&["import", f]);
    assert_eq!(code, Some(1), "{err}");
    assert!(stdout.is_empty());
    assert!(
        err.contains("selftest: selftest: enable: 0: restart needed"),
        "{err}"
    );
    assert!(err.contains("2 applied, 1 already so, 1 failed"), "{err}");
    let routing = run(&["routing", "show"]).1;
    assert!(
        routing.contains(
            "    alive_router_check_interval: 5\n    router_ping_timeout: 3\n    \
             avoid_asym_router_failure: 0\n"
        ),
        "{routing}"
    );
    // As the daemon runs it: nothing to do.
    write_doc(
        &dir,
        "doc.yaml",
        "routing:\n    alive_router_check_interval: 5\nselftest:\n    enable: 1\n",
    );
    assert_eq!(run(&["import", f]), (Some(0), String::new(), String::new()));
    // Out of the configuration's range: refused as a document, nothing applied.
    write_doc(
        &dir,
        "doc.yaml",
        "routing:\n    router_ping_timeout: 90000\n",
    );
    let (code, _, err) = run(&["import", f]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("router_ping_timeout: 90000 is out of range 0..=86400"),
        "{err}"
    );
}

/// An import's `peers:` reach the NIs already running (they kept a copy of the addresses from
/// their start, so a peer listening elsewhere than its NID says stayed unreachable until a
/// restart); `--show` counts the address as a change until it is applied, then as already so.
#[test]
fn an_imported_peer_address_is_used_by_the_nis_already_running() {
    // Loopback NIDs: where B's NID says it listens (127.0.0.3, port 987) nobody does.
    const A: &str = "127.0.0.2@o2ib";
    const B: &str = "127.0.0.3@o2ib";
    let dir = Scratch::new("import_peer_address");
    let (_b, b_port) = start_on_any_port(&dir.0, "b", B, None, Opts::default());
    let (a, _) = start_on_any_port(&dir.0, "a", A, None, Opts::default());
    let p = ping(&a, B, 1);
    assert!(p.ping.is_empty(), "B answered at its NID's address: {p:?}");

    let run = |args: &[&str]| out(&lnetctl(&a, args));
    let peers = format!("peers:\n    - nid: {B}\n      address: 127.0.0.1:{b_port}\n");
    let f = &write_doc(&dir, "peers.yaml", &peers);
    let (code, shown, _) = run(&["import", "--show", f]);
    assert_eq!(code, Some(0), "{shown}");
    assert!(
        shown.contains("would apply: 1\n    unchanged: 0\n"),
        "{shown}"
    );
    assert_eq!(run(&["import", f]), (Some(0), String::new(), String::new()));
    ping_until_ok(&a, B, WAIT);
    let (code, shown, _) = run(&["import", "--show", f]);
    assert!(
        shown.contains("would apply: 0\n    unchanged: 1\n"),
        "{code:?} {shown}"
    );
    let net = run(&["net", "show", "-v", "5"]).1;
    assert!(net.contains(&format!("127.0.0.1:{b_port}")), "{net}");
    // A peer that is one of the daemon's own NIs is refused with its line, as in a file (it
    // would be used for every connect, and the export would not load).
    write_doc(
        &dir,
        "peers.yaml",
        &format!("peers:\n    - nid: {A}\n      address: 127.0.0.1:{b_port}\n"),
    );
    let (code, _, err) = run(&["import", f]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(":2: peer 127.0.0.2@o2ib is one of this daemon's NIs"),
        "{err}"
    );
    let export = run(&["export"]).1;
    assert!(
        export.contains("- nid: 127.0.0.3@o2ib\n      address")
            && !export.contains("- nid: 127.0.0.2@o2ib\n      address"),
        "{export}"
    );
}
