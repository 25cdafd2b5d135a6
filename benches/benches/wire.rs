//! Encode and decode cost of the messages on the hot path: an IMMEDIATE (small LNet messages,
//! routed traffic) and a PUT_ACK (every RDMA PUT), at their largest.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lnd::wire::kib::{EmitOpts, MAX_INLINE};
use lnd::wire::{KibBody, KibMsg, LnetHdr, Nid, RdmaDesc, RdmaFrag};
use std::hint::black_box;
use std::time::Duration;

fn hdr(len: u32) -> LnetHdr {
    LnetHdr::put(
        "10.0.0.1@o2ib".parse().unwrap(),
        "10.0.0.2@o2ib".parse().unwrap(),
        len,
        4,
        0x1234,
    )
}

fn msg<'a>(body: KibBody<'a>) -> KibMsg<'a> {
    KibMsg {
        version: 0x12,
        credits: 3,
        src_nid: Nid::from_raw(0x0005_0000_0a00_0001),
        src_stamp: 1,
        dst_nid: Nid::from_raw(0x0005_0000_0a00_0002),
        dst_stamp: 2,
        body,
    }
}

fn bench(c: &mut Criterion) {
    let payload_small = [0xabu8; 64];
    let payload_full = [0xcdu8; MAX_INLINE];
    let frags: Vec<RdmaFrag> = (0..257u64)
        .map(|i| RdmaFrag {
            nob: 4096,
            addr: 0x7f00_0000_0000 + i * 4096,
        })
        .collect();
    let cases: [(&str, KibMsg<'_>); 4] = [
        (
            "immediate_64B",
            msg(KibBody::Immediate {
                hdr: hdr(64),
                payload: &payload_small,
            }),
        ),
        (
            "immediate_3976B",
            msg(KibBody::Immediate {
                hdr: hdr(MAX_INLINE as u32),
                payload: &payload_full,
            }),
        ),
        (
            "put_ack_1frag",
            msg(KibBody::PutAck {
                src_cookie: 1,
                dst_cookie: 2,
                rd: RdmaDesc::new(7, &frags[..1]),
            }),
        ),
        (
            "put_ack_257frags",
            msg(KibBody::PutAck {
                src_cookie: 1,
                dst_cookie: 2,
                rd: RdmaDesc::new(7, &frags),
            }),
        ),
    ];
    let mut g = c.benchmark_group("kib");
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(500));
    for (name, m) in &cases {
        let mut buf = vec![0u8; 4096];
        let n = m.emit(&mut buf, EmitOpts::default()).unwrap();
        g.throughput(Throughput::Bytes(n as u64));
        g.bench_function(format!("encode/{name}"), |b| {
            b.iter(|| black_box(m).emit(black_box(&mut buf), EmitOpts::default()))
        });
        let wire = buf[..n].to_vec();
        g.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| KibMsg::parse(black_box(&wire)).map(|(m, _)| m.credits))
        });
        // Decoding includes walking the fragments, as the RDMA path will.
        if matches!(m.body, KibBody::PutAck { .. }) {
            g.bench_function(format!("decode+walk/{name}"), |b| {
                b.iter(|| match KibMsg::parse(black_box(&wire)) {
                    Ok((
                        KibMsg {
                            body: KibBody::PutAck { rd, .. },
                            ..
                        },
                        _,
                    )) => rd.frags.iter().map(|f| u64::from(f.nob)).sum::<u64>(),
                    _ => 0,
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
