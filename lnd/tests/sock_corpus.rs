//! Replays the socklnd corpus (`tests/corpus/sock_wire/*.bin`, also the seed corpus of the
//! `sock_wire` fuzz target) through the parsers the way a receiver meets them: the first byte is
//! the fuzz target's selector (bit 0: byte order for headers without a magic), the rest is what a
//! peer sent. What the acceptor sees first decides the parser: an acceptor request, a HELLO, or
//! (anything else) a KSOCK header. Each file must come out as this table says, and what parses
//! must re-emit to bytes that parse the same. A file without an entry here, or an entry without a
//! file, fails the test.

mod common;

use lnd::wire::sock::{
    classify_acceptor, hello_head, AcceptorMagic, ConnReq, Hello, KsockHdr, ZcAcks,
};
use lnd::wire::ByteOrder;

/// Each corpus file and what it parses to (see `describe`).
const EXPECTED: &[(&str, &str)] = &[
    ("acc-req-v1.bin", "request Little: v1 192.168.1.1@tcp"),
    ("acc-req-v1-be.bin", "request Big: v1 192.168.1.1@tcp"),
    ("acc-req-v2-ipv4.bin", "request Little: v2 192.168.1.1@tcp"),
    (
        "acc-req-v2-ipv6.bin",
        "request Little: LargeNid(WideNid(2001:db8::1@tcp))",
    ),
    ("acc-req-v3.bin", "request Little: BadVersion(3)"),
    (
        "acc-req-short.bin",
        "request Little: Short { need: 16, got: 12 }",
    ),
    ("acc-refusal.bin", "request Little: v1 0@<0:0>"),
    (
        "hello-v3.bin",
        "hello V3 Little: 192.168.1.2@tcp -> 192.168.1.1@tcp pid 12345 inc 0x180e8f0571588d15 ctype 1 nips 0 ips Ok(())",
    ),
    (
        "hello-v3-answer.bin",
        "hello V3 Little: 192.168.1.1@tcp -> 192.168.1.2@tcp pid 12345 inc 0x180e8df78f77d8b1 ctype 1 nips 0 ips Ok(())",
    ),
    (
        "hello-v3-be.bin",
        "hello V3 Big: 192.168.1.2@tcp -> 192.168.1.1@tcp pid 12345 inc 0x180e8f0571588d15 ctype 1 nips 0 ips Ok(())",
    ),
    (
        "hello-v3-refusal.bin",
        "hello V3 Little: 192.168.1.1@tcp -> 192.168.1.1@tcp pid 12345 inc 0x180e8df78f77d8b1 ctype -1 nips 0 ips Ok(())",
    ),
    (
        "hello-v2.bin",
        "hello V2 Little: 192.168.1.2@tcp -> 192.168.1.1@tcp pid 12345 inc 0x180e8f0571588d15 ctype 1 nips 0 ips Ok(())",
    ),
    (
        "hello-v1-ips.bin",
        "hello V1 Little: 192.168.1.2@tcp -> 0@<0:0> pid 12345 inc 0x180e8f0571588d15 ctype 1 nips 2 ips Ok(())",
    ),
    (
        "hello-v4-ipv6.bin",
        "hello V4 Little: LargeNid(WideNid(2001:db8::2@tcp))",
    ),
    ("hello-v5.bin", "hello head: BadVersion(5)"),
    ("hello-nips-17.bin", "hello V3 Little: TooManyIps(17)"),
    ("hello-ctype-4.bin", "hello V3 Little: BadConnType(4)"),
    ("hello-src-any.bin", "hello V3 Little: NidAny"),
    ("ksock-put.bin", "ksock Lnet csum 0 req 0 acks None"),
    ("ksock-probe-put-zc.bin", "ksock Lnet csum 0 req 2 acks None"),
    ("ksock-noop-keepalive.bin", "ksock Noop csum 0 req 0 acks Keepalive"),
    ("ksock-noop-range.bin", "ksock Noop csum 0 req 3 acks Range(3, 9)"),
    ("ksock-noop-pair.bin", "ksock Noop csum 0 req 9 acks Pair(9, 3)"),
    ("ksock-bad-type.bin", "ksock BadMsgType(194)"),
    ("other-magic.bin", "ksock BadMsgType(542393671)"),
];

/// What `data` (selector byte first) parses to, checking round trips on the way.
fn describe(data: &[u8]) -> String {
    let Some((&sel, data)) = data.split_first() else {
        return "empty".into();
    };
    let order = if sel & 1 == 0 {
        ByteOrder::Little
    } else {
        ByteOrder::Big
    };
    let mut first4 = [0u8; 4];
    let n = data.len().min(4);
    first4[..n].copy_from_slice(&data[..n]);
    match classify_acceptor(first4) {
        AcceptorMagic::Acceptor { order } => {
            let r = match ConnReq::parse(order, data) {
                Ok(req) => {
                    assert_eq!(
                        ConnReq::parse(ByteOrder::Little, &req.emit()).map(|r| r.target),
                        Ok(req.target)
                    );
                    format!("v{} {}", req.version, req.target)
                }
                Err(e) => format!("{e:?}"),
            };
            format!("request {order:?}: {r}")
        }
        AcceptorMagic::LnetProto | AcceptorMagic::V1Socknal => {
            let Some(h8) = data.get(..8) else {
                return "hello: short".into();
            };
            let head = match hello_head(h8.try_into().unwrap()) {
                Ok(h) => h,
                Err(e) => return format!("hello head: {e:?}"),
            };
            let body = &data[8..];
            let prefix = format!("hello {:?} {:?}", head.version, head.order);
            match Hello::parse_body(&head, body) {
                Ok(h) => {
                    let ips = body
                        .get(head.body_len()..head.body_len() + 4 * h.nips as usize)
                        .unwrap_or_default();
                    if let Ok(out) = h.emit() {
                        let back = hello_head(out[..8].try_into().unwrap())
                            .and_then(|hh| Hello::parse_body(&hh, &out[8..]));
                        assert_eq!(back, Ok(Hello { nips: 0, ..h }));
                    }
                    format!(
                        "{prefix}: {} -> {} pid {} inc {:#x} ctype {} nips {} ips {:?}",
                        h.src_nid,
                        h.dst_nid,
                        h.src_pid,
                        h.src_incarnation,
                        h.ctype,
                        h.nips,
                        Hello::check_ips(&head, ips)
                    )
                }
                Err(e) => format!("{prefix}: {e:?}"),
            }
        }
        AcceptorMagic::Other(_) => match KsockHdr::parse_in(order, data) {
            Ok(k) => {
                assert_eq!(KsockHdr::parse_in(order, &k.emit_in(order)), Ok(k));
                format!(
                    "ksock {:?} csum {} req {} acks {:?}",
                    k.kind,
                    k.csum,
                    k.zc_req,
                    ZcAcks::from_hdr(&k)
                )
            }
            Err(e) => format!("ksock {e:?}"),
        },
    }
}

#[test]
fn corpus_parses_as_expected() {
    let (dir, files) = common::corpus_bins("sock_wire");
    let mut want: Vec<&str> = EXPECTED.iter().map(|(f, _)| *f).collect();
    want.sort();
    assert_eq!(files, want, "corpus files and table entries differ");
    let mut errors = Vec::new();
    for (f, expect) in EXPECTED {
        let data = std::fs::read(dir.join(f)).unwrap();
        let got = describe(&data);
        if got != *expect {
            errors.push(format!("{f}: got {got:?}, want {expect:?}"));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}
