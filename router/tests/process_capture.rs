//! `lnetctl capture` against a real daemon: A captures while A pings B (both through the lnetctl
//! binary), then tshark decodes the file, and what it shows must be what was sent: the CONNREQ
//! and CONNACK of the connection the ping made, an IMMEDIATE carrying the ping's GET from A to B
//! and one carrying the REPLY from B to A (with the NIDs of A and B in both the o2iblnd and the
//! LNet headers, and the IPv4 addresses of those NIDs in the frames), and nothing else but NOOPs.
//! Also: one capture at a time, and a capture whose lnetctl is killed ends in the daemon.
//!
//! Without tshark the test is skipped with a notice, unless `CI` is set, where it fails (as in
//! `tests/tests/tshark_decodes.rs`). `TSHARK` names another tshark binary.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

/// A running `lnetctl capture`, killed and reaped on drop.
struct Capture {
    child: Child,
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `lnetctl capture --file F` against `d` and waits (bounded) for its "capturing on"
/// notice, which it prints once the daemon confirmed the start.
fn start_capture(d: &Daemon, nid: &str, file: &Path, extra: &[&str]) -> Capture {
    let mut child = Command::new(lnetctl_bin())
        .arg("--socket")
        .arg(&d.socket)
        .arg("capture")
        .arg("--file")
        .arg(file)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stderr).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("lnetctl capture did not start within 10 s");
    assert!(line.contains(&format!("capturing on {nid}")), "{line}");
    Capture { child }
}

/// Waits (bounded) for the capture to exit; its exit code and stdout.
fn finish(mut c: Capture, bound: Duration) -> (Option<i32>, String) {
    let status = testkit::wait_exit(&mut c.child, bound)
        .unwrap_or_else(|| panic!("lnetctl capture did not end within {bound:?}"));
    let mut out = String::new();
    if let Some(mut o) = c.child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut o, &mut out);
    }
    (status.code(), out)
}

/// One frame as tshark dissected it.
#[derive(Debug, Default)]
struct Frame {
    protocols: String,
    ip_src: String,
    ip_dst: String,
    /// `lnet.ib.type`, e.g. `0xd1`.
    ib_type: String,
    /// `lnet.msg_type` (LNet header), e.g. `2` for GET.
    msg_type: Option<String>,
    /// Every `Src nid: X` / `Dest nid: X` in order: the o2iblnd header's, then the LNet header's.
    src_nids: Vec<String>,
    dst_nids: Vec<String>,
}

/// The value of attribute `name` in one PDML tag.
fn attr<'a>(tag: &'a str, name: &str) -> &'a str {
    let key = format!(" {name}=\"");
    tag.find(&key)
        .and_then(|i| {
            let rest = &tag[i + key.len()..];
            rest.find('"').map(|j| &rest[..j])
        })
        .unwrap_or("")
}

/// Frames out of tshark's PDML: enough of it for these checks (fields are single tags).
fn parse_pdml(pdml: &str) -> Vec<Frame> {
    let mut frames = Vec::new();
    for packet in pdml.split("<packet>").skip(1) {
        let mut f = Frame::default();
        for tag in packet.split('<').filter(|t| t.starts_with("field ")) {
            let show = attr(tag, "show");
            let showname = attr(tag, "showname");
            match attr(tag, "name") {
                "frame.protocols" => f.protocols = show.to_string(),
                "ip.src" => f.ip_src = show.to_string(),
                "ip.dst" => f.ip_dst = show.to_string(),
                "lnet.ib.type" => f.ib_type = show.to_string(),
                "lnet.msg_type" => f.msg_type = Some(show.to_string()),
                "lnet.src_nid" => f.src_nids.push(nid_of(showname)),
                "lnet.dest_nid" => f.dst_nids.push(nid_of(showname)),
                _ => {}
            }
        }
        frames.push(f);
    }
    frames
}

/// `Src nid: 10.0.0.1@o2ib0` -> `10.0.0.1@o2ib` (tshark prints net 0 with its number).
fn nid_of(showname: &str) -> String {
    let nid = showname.rsplit(": ").next().unwrap_or("");
    nid.strip_suffix("0")
        .filter(|n| n.ends_with("@o2ib"))
        .unwrap_or(nid)
        .to_string()
}

/// Stops `cap` with SIGINT and checks its file: the ping's messages, and nothing else but NOOPs.
/// The directions are the same whichever side captured: A connects and sends the GET.
fn check_ping_capture(tshark: &Path, cap: Capture, file: &Path, who: &str) {
    let st = Command::new("kill")
        .args(["-INT", &cap.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let (code, out) = finish(cap, WAIT);
    assert_eq!(code, Some(0), "{who}: {out}");
    assert!(out.starts_with("capture:\n"), "{out}");
    assert!(
        out.contains(&format!("    file: {}\n", file.display())),
        "{out}"
    );
    assert!(out.contains("    dropped: 0\n"), "{out}");
    assert!(out.contains("    reason: stopped\n"), "{out}");
    let captured: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("    captured: "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count: {out}"));

    let o = Command::new(tshark)
        .arg("-r")
        .arg(file)
        .args(["-T", "pdml"])
        .output()
        .expect("run tshark");
    assert!(
        o.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let frames = parse_pdml(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(frames.len(), captured, "{frames:#?}");

    let ip_a = "10.0.0.1";
    let ip_b = "10.0.0.2";
    let mut seen = Vec::new();
    for f in &frames {
        assert!(
            f.protocols.ends_with(":infiniband:lnet"),
            "not decoded as LNet: {f:?}"
        );
        let (from_a, src, dst) = if f.ip_src == ip_a {
            (true, NID_A, NID_B)
        } else {
            (false, NID_B, NID_A)
        };
        assert_eq!(f.ip_dst, if from_a { ip_b } else { ip_a }, "{f:?}");
        // The o2iblnd header names the sender and the receiver.
        assert_eq!(f.src_nids.first().map(String::as_str), Some(src), "{f:?}");
        assert_eq!(f.dst_nids.first().map(String::as_str), Some(dst), "{f:?}");
        let what = match (f.ib_type.as_str(), f.msg_type.as_deref()) {
            ("0xc0", None) => "CONNREQ",
            ("0xc1", None) => "CONNACK",
            ("0xd0", None) => "NOOP",
            ("0xd1", Some("2")) => "GET",
            ("0xd1", Some("3")) => "REPLY",
            _ => panic!("a message the ping did not send: {f:?}"),
        };
        if what == "GET" || what == "REPLY" {
            // The LNet header inside names them too.
            assert_eq!(f.src_nids.get(1).map(String::as_str), Some(src), "{f:?}");
            assert_eq!(f.dst_nids.get(1).map(String::as_str), Some(dst), "{f:?}");
        }
        seen.push((what, from_a));
    }
    let without_noops: Vec<_> = seen.iter().filter(|(w, _)| *w != "NOOP").collect();
    assert_eq!(
        without_noops,
        [
            &("CONNREQ", true),
            &("CONNACK", false),
            &("GET", true),
            &("REPLY", false)
        ],
        "{who}: {frames:#?}"
    );
}

#[test]
fn capture_of_a_ping_decodes_in_tshark() {
    let tshark = find_on_path("TSHARK", "tshark");
    if !run_or_skip(
        tshark.is_some(),
        "tshark not found (apt-get install tshark)",
    ) {
        return;
    }
    let tshark = tshark.unwrap();
    let dir = Scratch::new("capture");
    // Default tunables: no keepalive NOOP within the test.
    let opts = || Opts {
        lnd: Lnd {
            timeout: 50,
            keepalive: 100,
        },
        ..Opts::default()
    };
    // B on a port the OS assigns; A, which pings B (B answers over A's connection), knows it.
    let (b, pb) = start_on_any_port(&dir.0, "b", NID_B, None, opts());
    let (a, _) = start_on_any_port(&dir.0, "a", NID_A, Some((NID_B, pb)), opts());
    let file = dir.0.join("ping.pcap");

    let cap = start_capture(&a, NID_A, &file, &[]);
    // B captures the same exchange from the passive side.
    let file_b = dir.0.join("ping-b.pcap");
    let cap_b = start_capture(&b, NID_B, &file_b, &[]);

    // One capture at a time: a second is refused, clearly, and leaves no file behind.
    let second = dir.0.join("second.pcap");
    let o = lnetctl(&a, &["capture", "--file", second.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("a capture is already running"), "{err}");
    assert!(!second.exists());

    let o = lnetctl(&a, &["ping", NID_B, "--timeout", "10"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Ctrl-C ends them cleanly, with the totals; both saw the same exchange.
    check_ping_capture(&tshark, cap, &file, "A");
    check_ping_capture(&tshark, cap_b, &file_b, "B");

    // A capture whose lnetctl dies ends in the daemon: the next one can start.
    let killed = dir.0.join("killed.pcap");
    let mut cap = start_capture(&a, NID_A, &killed, &[]);
    cap.child.kill().unwrap();
    let _ = cap.child.wait();
    let again = dir.0.join("again.pcap");
    let t0 = Instant::now();
    loop {
        let o = lnetctl(
            &a,
            &[
                "capture",
                "--file",
                again.to_str().unwrap(),
                "--duration",
                "1",
            ],
        );
        if o.status.code() == Some(0) {
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.contains("reason: duration elapsed"), "{out}");
            break;
        }
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("already running"), "{err}");
        assert!(
            t0.elapsed() < WAIT,
            "the killed capture still runs in the daemon"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(again.exists());

    // An output that cannot be written ends it at once, with no "capturing" line first (an
    // operator's audit saw the line, then the failure); the daemon's capture is stopped.
    let o = lnetctl(
        &a,
        &[
            "capture",
            "--file",
            "/nonexistent-ulnet-dir/x.pcap",
            "--duration",
            "5",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/nonexistent-ulnet-dir/x.pcap"), "{err}");
    assert!(!err.contains("capturing on"), "{err}");
}
