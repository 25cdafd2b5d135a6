//! A flood of connect requests from distinct forged NIDs against a daemon: the LND's and LNet's
//! peer tables stop at the NI's `peer limit` (the excess refused NO_RESOURCES, counted), and
//! once the forged peers are gone both tables go back to their baseline: the LND forgets a peer
//! when its last connection is reaped (as o2iblnd unlinks it), LNet after `peer_timeout` without
//! traffic. Loopback only; every socket and process is closed by the end (guards on panic).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use lnd::wire::kib::EmitOpts;
use lnd::wire::{ConnParams, KibBody, KibMsg, Nid};
use router::control::{NetShow, Request, Response, StatsShow};

const LIMIT: usize = 64;
const FLOOD: usize = 200;

/// A CONNREQ frame of the tcp fabric (kind 1) from `from` to B.
fn connreq_frame(from: Nid) -> Vec<u8> {
    let msg = KibMsg::v2(
        (from, 0x5eed),
        (NID_B.parse().unwrap(), 0),
        KibBody::ConnReq(ConnParams {
            queue_depth: 8,
            max_frags: 257,
            max_msg_size: 4096,
        }),
    );
    let mut body = vec![0u8; msg.wire_len()];
    let n = msg.emit(&mut body, EmitOpts::default()).unwrap();
    let mut f = ((n + 1) as u32).to_le_bytes().to_vec();
    f.push(1);
    f.extend_from_slice(&body[..n]);
    f
}

fn forged(i: usize) -> Nid {
    format!("10.9.{}.{}@o2ib", i / 250, 2 + i % 250)
        .parse()
        .unwrap()
}

/// The kind of the first frame B answers with (2 CONNACK, 3 REJECT), or 0 if none came.
fn reply_kind(s: &mut TcpStream) -> u8 {
    let mut head = [0u8; 5];
    match s.read_exact(&mut head) {
        Ok(()) => head[4],
        Err(_) => 0,
    }
}

fn lnd_peers(d: &Daemon) -> u64 {
    match call(d, Request::NetShow { verbose: true }) {
        Response::Net(NetShow { net, .. }) => net
            .iter()
            .flat_map(|n| n.local_nis.iter())
            .filter_map(|ni| ni.ulnet.as_ref())
            .map(|u| u.peers)
            .sum(),
        other => panic!("{other:?}"),
    }
}

fn lnet_table(d: &Daemon, key: &str) -> u64 {
    match call(d, Request::StatsShow) {
        Response::Stats(StatsShow {
            peer_table: Some(t),
            ..
        }) => t.get(key).unwrap(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn forged_peer_flood_is_bounded_and_ages_out() {
    let dir = Scratch::new("peerflood");
    // NID_A is never started: its address is a port the test holds.
    let (_a, pa) = held_port();
    let (b, pb) = start_on_any_port(
        &dir.0,
        "b",
        NID_B,
        Some((NID_A, pa)),
        Opts {
            ni_yaml: format!(
                "          peer limit: {LIMIT}\n          tunables:\n              peer_timeout: 2\n"
            ),
            ..Opts::default()
        },
    );
    assert_eq!((lnd_peers(&b), lnet_table(&b, "peers")), (0, 0));
    let rejects0 = lnd_counters(&b, NID_B)
        .rejects_sent
        .get("no_resources")
        .unwrap();

    // All at once: every socket stays open until every answer is in.
    let mut socks: Vec<TcpStream> = (0..FLOOD)
        .map(|i| {
            let mut s = TcpStream::connect(("127.0.0.1", pb)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(&connreq_frame(forged(i))).unwrap();
            s
        })
        .collect();
    let kinds: Vec<u8> = socks.iter_mut().map(reply_kind).collect();
    let acks = kinds.iter().filter(|&&k| k == 2).count();
    let rejects = kinds.iter().filter(|&&k| k == 3).count();
    assert_eq!(acks + rejects, FLOOD, "every request answered: {kinds:?}");
    assert_eq!(acks, LIMIT, "accepted up to the limit, no more");
    let c = lnd_counters(&b, NID_B);
    assert_eq!(
        c.rejects_sent.get("no_resources").unwrap() - rejects0,
        rejects as u64,
        "the refusals were NO_RESOURCES: {c:?}"
    );
    assert_eq!(c.counters.get("peer_table_full"), Some(rejects as u64));
    assert_eq!(lnd_peers(&b), LIMIT as u64);
    assert!(lnet_table(&b, "peers") <= LIMIT as u64);

    // The forged peers go away; both tables empty again.
    drop(socks);
    let back = wait_for(WAIT, || lnd_peers(&b) == 0 && lnet_table(&b, "peers") == 0);
    assert!(
        back.is_some(),
        "tables not back to baseline: LND {} peers, LNet {} peers",
        lnd_peers(&b),
        lnet_table(&b, "peers")
    );
    let c = lnd_counters(&b, NID_B);
    assert!(
        c.counters.get("peers_forgotten").unwrap() >= LIMIT as u64,
        "{c:?}"
    );
    assert!(lnet_table(&b, "peers_aged") >= 1);

    // Room again: a new peer is accepted.
    let mut s = TcpStream::connect(("127.0.0.1", pb)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&connreq_frame(forged(FLOOD + 1))).unwrap();
    assert_eq!(
        reply_kind(&mut s),
        2,
        "a new peer after the flood was refused"
    );
}
