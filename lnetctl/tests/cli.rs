//! The lnetctl binary as a script sees it: output and exit codes.

use std::process::{Command, Output};

use testkit::Scratch;

fn lnetctl(args: &[&str]) -> Output {
    // A socket path nobody listens on, so no real daemon on this machine interferes.
    let sock =
        std::env::temp_dir().join(format!("ulnet-cli-test-{}/none.sock", std::process::id()));
    lnetctl_at(&sock, args)
}

/// `lnetctl --socket sock args...`.
fn lnetctl_at(sock: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lnetctl"))
        .arg("--socket")
        .arg(sock)
        .args(args)
        .output()
        .expect("run lnetctl")
}

/// `lnetctl args...`, no socket given.
fn lnetctl_bare(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lnetctl"))
        .args(args)
        .output()
        .expect("run lnetctl")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The standard output of `run(args)`, which must exit 0 (the failure says `args` and the
/// stderr).
fn stdout_ok(run: fn(&[&str]) -> Output, args: &[&str]) -> String {
    let o = run(args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{args:?}: stderr: {}",
        text(&o.stderr)
    );
    text(&o.stdout)
}

#[test]
fn ping_lo_without_daemon_succeeds() {
    assert_eq!(
        stdout_ok(lnetctl, &["ping", "0@lo"]),
        "ping:\n- primary nid: 0@lo\n  Multi-Rail: false\n  peer_ni: []\n"
    );
}

#[test]
fn ping_lo_json() {
    let o = lnetctl(&["--json", "ping", "0@lo", "--timeout", "2"]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ping"][0]["primary nid"], "0@lo");
}

#[test]
fn ping_remote_without_daemon_fails_clearly() {
    // Exit 3, "no daemon", as every other command without one (the operator audit: it was 1).
    let o = lnetctl(&["ping", "10.0.0.2@o2ib"]);
    assert_eq!(o.status.code(), Some(3));
    // The error block on stderr, as Lustre 2.16's lnetctl (issue 32, item 5): nothing on stdout.
    assert_eq!(text(&o.stdout), "");
    let err = text(&o.stderr);
    assert!(
        err.starts_with("manage:\n- ping:\n  errno: -113\n"),
        "{err}"
    );
    assert!(err.contains("no route to 10.0.0.2@o2ib"), "{err}");
    assert!(err.contains("no lnet-router daemon at"), "{err}");
}

/// Issue 32, item 5: lnetctl printed its `manage:` error blocks on stdout, where Lustre 2.16's
/// lnetctl prints them on stderr (lnetctl.c, yaml_lnet_print_error), so a script reading
/// stdout took a failure for output. The NIDs that answered stay on stdout; the failures go to
/// stderr, in YAML and in JSON.
#[test]
fn ping_failures_go_to_stderr_and_answers_to_stdout() {
    let o = lnetctl(&["ping", "0@lo", "10.0.0.2@o2ib"]);
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(
        text(&o.stdout),
        "ping:\n- primary nid: 0@lo\n  Multi-Rail: false\n  peer_ni: []\n"
    );
    let err = text(&o.stderr);
    assert!(
        err.starts_with("manage:\n- ping:\n  errno: -113\n  descr: "),
        "{err}"
    );
    assert_eq!(err.matches("manage:").count(), 1, "{err}");
    let o = lnetctl(&["--json", "ping", "0@lo", "10.0.0.2@o2ib"]);
    assert_eq!(o.status.code(), Some(3));
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(out["ping"][0]["primary nid"], "0@lo");
    assert!(out.get("manage").is_none(), "{out}");
    let err: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
    assert_eq!(err["manage"][0]["errno"], -113);
    assert!(err.get("ping").is_none(), "{err}");
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        &["frobnicate"][..],
        &[],
        &["ping"],
        &["ping", "0@lo", "--timeout", "soon"],
        &["net"],
        &["net", "show", "--frob"],
        &["peer", "show", "--nid"],
        &["stats", "show", "--frob"],
        &["capture"],
        &["capture", "--file"],
        &["capture", "--file", "x.pcap", "--duration", "0"],
        &["capture", "--file", "x.pcap", "--duration", "soon"],
    ] {
        let o = lnetctl(args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        // clap's message: the usage, or where to find it.
        assert!(
            err.contains("Usage: lnetctl") || err.contains("try '--help'"),
            "{args:?}: {err}"
        );
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    assert!(!std::path::Path::new("x.pcap").exists());
    assert_eq!(lnetctl(&["--help"]).status.code(), Some(0));
    assert_eq!(lnetctl(&["capture", "--help"]).status.code(), Some(0));
}

#[test]
fn capture_without_daemon_exits_3_and_leaves_no_file() {
    let dir = Scratch::new("cli-capture");
    let f = dir.join("c.pcap");
    let o = lnetctl(&["capture", "--file", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("no lnet-router daemon at"));
    assert!(!f.exists(), "an empty capture file was left behind");

    // An existing file is not overwritten without --force (checked before the daemon is asked).
    std::fs::write(&f, b"keep me").unwrap();
    let o = lnetctl(&["capture", "--file", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("exists; pass --force to overwrite it"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
    // With --force it gets as far as the daemon (none here: exit 3), and a capture that never
    // started leaves the existing file as it was.
    let o = lnetctl(&["capture", "--file", f.to_str().unwrap(), "--force"]);
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
}

#[test]
fn help_documents_exit_codes() {
    let o = lnetctl(&["--help"]);
    let out = text(&o.stdout);
    assert!(out.contains("3  no daemon"), "{out}");
    assert!(
        out.contains("4  a NID on the command line is malformed"),
        "{out}"
    );
}

#[test]
fn bad_nid_exits_4() {
    let o = lnetctl(&["ping", "10.0.0.2@ib0"]);
    assert_eq!(o.status.code(), Some(4));
    assert!(
        text(&o.stderr).contains("bad NID '10.0.0.2@ib0'"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        lnetctl(&["peer", "show", "--nid", "nonsense"])
            .status
            .code(),
        Some(4)
    );
    assert_eq!(
        lnetctl(&["ping", "0@lo", "--source", "x@y"]).status.code(),
        Some(4)
    );
}

#[test]
fn no_daemon_exits_3_naming_the_path() {
    let o = lnetctl_at("/nonexistent".as_ref(), &["peer", "show"]);
    assert_eq!(o.status.code(), Some(3));
    let err = text(&o.stderr);
    assert!(
        err.contains("no lnet-router daemon at /nonexistent"),
        "{err}"
    );
    for cmd in [
        &["net", "show"][..],
        &["conn", "show"],
        &["stats", "show"],
        &["global", "show"],
    ] {
        assert_eq!(lnetctl(cmd).status.code(), Some(3), "{cmd:?}");
    }
}

#[test]
fn demo_still_works() {
    let out = stdout_ok(lnetctl_bare, &["demo"]);
    assert!(
        out.contains("ping:\n    - primary nid: 10.0.0.2@o2ib\n"),
        "{out}"
    );
}

/// `lnetctl peer show | head`: the reader may go away before lnetctl writes. lnetctl neither
/// panics nor fails (Rust ignores SIGPIPE, so a write returns EPIPE instead of killing the
/// process). The read end is closed before lnetctl can write anything, so every write breaks.
#[test]
fn output_into_a_closed_pipe_is_no_panic() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_lnetctl"))
        .arg("demo")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(0), "{err}");
}

/// lnetctl's short options for ping: `-t` (timeout) and `-s` (source).
#[test]
fn ping_takes_lnetctls_short_options() {
    let o = lnetctl(&["ping", "-t", "2", "0@lo"]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", text(&o.stderr));
    let o = lnetctl(&["ping", "-s", "0@lo", "-t", "2", "0@lo"]);
    // Without a daemon the only NID is 0@lo: the source is accepted or refused with a
    // message, never a usage error.
    assert_ne!(o.status.code(), Some(2), "stderr: {}", text(&o.stderr));
}

/// A daemon that speaks another control protocol version: lnetctl says so in one line on
/// stderr and exits 1.
#[test]
fn a_daemon_of_another_protocol_version_is_named_plainly() {
    use std::io::{BufRead, BufReader, Write};
    let dir = Scratch::new("cli-version");
    let sock = dir.join("old.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        (&s).write_all(b"{\"v\":9,\"resp\":\"done\"}\n").unwrap();
        line
    });
    let o = lnetctl_at(&sock, &["global", "show"]);
    let sent = server.join().unwrap();
    assert!(sent.starts_with("{\"v\":1,\"req\":"), "{sent}");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("control protocol mismatch: lnet-router speaks version 9"),
        "{err}"
    );
}

/// The manual page and completion scripts come from lnetctl's own command definitions.
#[test]
fn man_page_and_completions_are_generated() {
    let man = stdout_ok(lnetctl, &["man"]);
    assert!(
        man.starts_with(".ie \\n(.g .ds Aq"),
        "{}",
        &man[..80.min(man.len())]
    );
    assert!(man.contains(".TH lnetctl 8"), "{man}");
    for cmd in ["ping", "selftest", "route", "capture"] {
        assert!(man.contains(cmd), "{cmd} not in the man page");
    }
    for shell in ["bash", "zsh", "fish"] {
        let s = stdout_ok(lnetctl, &["completions", shell]);
        assert!(
            s.contains("lnetctl") && s.contains("selftest"),
            "{shell}: {s}"
        );
    }
}

/// What ulnet cannot do is refused with one line that says what to do instead, exit status
/// 1; a debug recovery without a queue named, or a net add|del whose options name no NI, is a
/// usage error.
#[test]
fn commands_ulnet_refuses_say_what_to_do_instead() {
    for (args, want) in [
        (
            &["net", "add", "--net", "o2ib1", "--ip2net", "o2ib1 10.*.*.*"][..],
            "--net and --if",
        ),
        (
            &["net", "del", "--net", "o2ib1", "--if", "ib1"],
            "give --nid",
        ),
        (
            &["peer", "add", "--prim_nid", "10.0.0.5@o2ib"],
            "Multi-Rail",
        ),
        (
            &["peer", "del", "--prim_nid", "10.0.0.5@o2ib"],
            "Multi-Rail",
        ),
    ] {
        let o = lnetctl(args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(o.stdout.is_empty());
    }
    assert_eq!(lnetctl(&["debug", "recovery"]).status.code(), Some(2));
    // net add / del: options that make no NI are usage errors, named as lnetctl names them.
    for (args, want) in [
        (&["net", "add", "--if", "ib0"][..], "'network'"),
        (&["net", "add", "--net", "o2ib"], "at least one interface"),
        (
            &["net", "add", "--net", "o2ib", "--nid", "10.0.0.1@o2ib"],
            "--net is invalid with --nid",
        ),
        (&["net", "del"], "--net or --nid"),
        (
            &["net", "del", "--net", "o2ib", "--nid", "10.0.0.1@o2ib"],
            "--net is invalid with --nid",
        ),
    ] {
        let o = lnetctl(args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // Without a daemon, the commands that need one say so (exit 3).
    for args in [
        &["lnet", "configure"][..],
        &["discover", "10.0.0.2@o2ib"],
        &["debug", "recovery", "--local"],
        &["export"],
        &["import", "-"],
        &["lnet", "unconfigure"],
        &["net", "add", "--nid", "10.0.0.1@o2ib"],
        &["net", "del", "--nid", "10.0.0.1@o2ib"],
    ] {
        assert_eq!(lnetctl(args).status.code(), Some(3), "{args:?}");
    }
}

/// lnetctl's `PID-NID` (libcfs_strid): PID 12345, the one LNet pings, is taken; another PID
/// is refused in one line rather than pinged at 12345 (operator audit: refused as a bad NID).
#[test]
fn ping_takes_pid_nid() {
    for t in ["12345-0@lo", "4294967295-0@lo"] {
        let out = stdout_ok(lnetctl, &["ping", t]);
        assert!(out.contains("primary nid: 0@lo"), "{t}");
    }
    let o = lnetctl(&["ping", "54321-0@lo"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("PID 12345 only"),
        "{}",
        text(&o.stderr)
    );
    assert!(o.stdout.is_empty());
    // A malformed NID behind the PID is still a bad NID.
    assert_eq!(lnetctl(&["ping", "12345-x@y"]).status.code(), Some(4));
    assert_eq!(lnetctl(&["discover", "12345-0@lo"]).status.code(), Some(3));
}

/// `--timeout 0` is lnetctl 2.16's "the default", not 1 s (0@lo answers either way; the
/// daemon's side is tested in router's control::service).
#[test]
fn ping_timeout_zero_is_accepted() {
    let o = lnetctl(&["ping", "--timeout", "0", "0@lo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let help = text(&lnetctl(&["ping", "--help"]).stdout);
    assert!(help.contains("0: the default"), "{help}");
}

/// The operator audit: a 100 kB NID gave a 200 kB error line (quoted whole, twice). The
/// argument is cut as the daemon's config errors cut it.
#[test]
fn an_absurdly_long_argument_is_cut_in_errors() {
    let long = format!("{}@o2ib", "1".repeat(100_000));
    for args in [
        vec!["ping", long.as_str()],
        vec!["peer", "show", "--nid", long.as_str()],
        vec!["route", "add", "--net", "o2ib1", "--gateway", long.as_str()],
    ] {
        let o = lnetctl(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(4), "{err}");
        assert!(err.len() < 600, "{} bytes: {}", err.len(), &err[..600]);
        assert!(err.contains("bad NID '1111"), "{err}");
        assert!(err.contains('…'), "{err}");
    }
    let o = lnetctl(&["ping", &format!("54321-{}", "1".repeat(1000))]);
    assert!(text(&o.stderr).len() < 600, "{}", text(&o.stderr));
}

/// lnetctl's route options parse (the operator audit: `-n`, `-g`, `-c`, `-p` were usage
/// errors); without a daemon they get as far as the socket: exit 3.
#[test]
fn route_takes_lnetctls_options() {
    for args in [
        &["route", "add", "-n", "o2ib2", "-g", "10.0.0.9@o2ib"][..],
        &[
            "route",
            "add",
            "--net",
            "X",
            "--gateway",
            "10.0.0.9@o2ib",
            "-c",
            "2",
            "-p",
            "1",
        ],
        &[
            "route",
            "add",
            "--net",
            "o2ib2",
            "--gateway",
            "10.0.0.9@o2ib",
            "--hop-count",
            "-1",
        ],
        &[
            "route",
            "add",
            "-n",
            "o2ib2",
            "-g",
            "10.0.0.9@o2ib",
            "--health_sensitivity",
            "1",
        ],
        &["route", "del", "-n", "o2ib2", "-g", "10.0.0.9@o2ib"],
        &["route", "show", "-n", "o2ib1"],
        &["route", "show", "--hop", "1"],
        &[
            "route",
            "show",
            "-c",
            "1",
            "-p",
            "2",
            "-g",
            "10.0.0.9@o2ib",
            "-v",
        ],
        &["route", "show", "--priority", "0"],
    ] {
        let o = lnetctl(args);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {}", text(&o.stderr));
    }
}

/// `global show -v`'s `pid` is the LNet PID, which the help says (not the process id).
#[test]
fn global_show_help_says_lnet_pid() {
    let help = text(&lnetctl(&["global", "--help"]).stdout);
    assert!(help.contains("LNet PID"), "{help}");
}
