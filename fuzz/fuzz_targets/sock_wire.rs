//! socklnd wire formats (`lnd::wire::sock`): no parser panics on any bytes; what parses re-emits
//! to bytes that parse to the same value; ZC-ACK NOOP sets decode back to the cookies encoded.
//! The first byte picks the byte order and version of the HELLO body parser, the rest is input.
//! Seed corpus: `lnd/tests/corpus/sock_wire/` (replayed by `lnd/tests/sock_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lnd::wire::sock::{
    classify_acceptor, hello_head, zc_ack_noops, AcceptorMagic, ConnReq, Hello, HelloHead,
    HelloVersion, KsockHdr, ZcAcks,
};
use lnd::wire::ByteOrder;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, data)) = data.split_first() else {
        return;
    };
    let order = if sel & 1 == 0 {
        ByteOrder::Little
    } else {
        ByteOrder::Big
    };

    // The acceptor: classify, then the request in the order its magic says.
    if let Some(first4) = data.get(..4) {
        let mut m = [0u8; 4];
        m.copy_from_slice(first4);
        if let AcceptorMagic::Acceptor { order } = classify_acceptor(m) {
            if let Ok(req) = ConnReq::parse(order, data) {
                if req.version == 1 {
                    assert_eq!(ConnReq::parse(ByteOrder::Little, &req.emit()), Ok(req));
                }
            }
        }
    }
    let _ = ConnReq::parse(order, data);

    // HELLO: the head, then its body; also the body parser for the version `sel` picks.
    if let Some(h8) = data.get(..8) {
        let mut h = [0u8; 8];
        h.copy_from_slice(h8);
        if let Ok(head) = hello_head(&h) {
            let rest = data.get(8..).unwrap_or_default();
            if let Ok(hello) = Hello::parse_body(&head, rest) {
                let ips = rest.get(head.body_len()..).unwrap_or_default();
                let _ = Hello::check_ips(&head, ips);
                if let Ok(out) = hello.emit() {
                    let back = hello_head(&[
                        out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7],
                    ])
                    .and_then(|h| Hello::parse_body(&h, &out[8..]));
                    assert_eq!(back, Ok(Hello { nips: 0, ..hello }));
                }
            }
        }
    }
    let version = match (sel >> 1) & 3 {
        0 => HelloVersion::V1,
        1 => HelloVersion::V2,
        2 => HelloVersion::V3,
        _ => HelloVersion::V4,
    };
    let head = HelloHead { version, order };
    let _ = Hello::parse_body(&head, data);
    let _ = Hello::check_ips(&head, data);

    // KSOCK header: round trip in its order; ACK sets re-encode to the same cookies.
    if let Ok(k) = KsockHdr::parse_in(order, data) {
        assert_eq!(KsockHdr::parse_in(order, &k.emit_in(order)), Ok(k));
        let acks = ZcAcks::from_hdr(&k);
        if let ZcAcks::One(c) | ZcAcks::Pair(c, _) = acks {
            assert!(acks.contains(c));
        }
        // Small sets only: a range can span 2^64 cookies.
        if acks.count() <= 64 {
            let mut cookies: Vec<u64> = match acks {
                ZcAcks::One(c) => vec![c],
                ZcAcks::Pair(a, b) => vec![a, b],
                ZcAcks::Range(a, b) => (a..=b).collect(),
                _ => vec![],
            };
            cookies.retain(|&c| c > 1);
            let want = cookies.clone();
            let noops = zc_ack_noops(&mut cookies);
            for c in want {
                let n = noops
                    .iter()
                    .filter(|h| ZcAcks::from_hdr(h).contains(c))
                    .count();
                assert_eq!(n, 1);
            }
        }
    }
});
