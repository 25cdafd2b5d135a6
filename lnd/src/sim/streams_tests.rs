//! The stream network's model, each rule of the module documentation by itself.

use super::*;
use crate::handle::HandleSlab;
use crate::mem::SharedMem;

// What a host heard, owned.
use crate::stream::StreamReport as Heard;

struct Harness {
    net: StreamNet,
    heard: Vec<Vec<(Instant, Heard)>>,
    ids: HandleSlab<(), crate::stream::StreamTag>,
}

const A: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 2);

impl Harness {
    fn new(cfg: StreamNetConfig) -> (Harness, HostId, HostId) {
        let mut net = StreamNet::new(cfg);
        let a = net.add_host(A);
        let b = net.add_host(B);
        let h = Harness {
            net,
            heard: vec![Vec::new(), Vec::new()],
            ids: HandleSlab::new(),
        };
        (h, a, b)
    }

    /// A network whose connections carry at most `window` unread bytes a direction.
    fn with_window(window: usize) -> (Harness, HostId, HostId) {
        Harness::new(StreamNetConfig {
            window,
            ..StreamNetConfig::default()
        })
    }

    fn stream(&mut self) -> StreamId {
        self.ids.insert(())
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.net.now() + d;
        loop {
            self.drain();
            match self.net.next_event_at() {
                Some(t) if t <= until => self.net.advance(t),
                _ => break,
            }
        }
        self.net.advance(until);
        self.drain();
    }

    fn drain(&mut self) {
        let heard = &mut self.heard;
        self.net.deliver(|h, now, ev| {
            heard[h.0 as usize].push((now, Heard::from(ev)));
        });
    }

    fn heard(&self, h: HostId) -> Vec<Heard> {
        self.heard[h.0 as usize]
            .iter()
            .map(|(_, e)| e.clone())
            .collect()
    }

    fn take(&mut self, h: HostId) -> Vec<Heard> {
        std::mem::take(&mut self.heard[h.0 as usize])
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    }

    /// `a` dials `b`'s listener on 988, `b` adopts: the two streams.
    fn connect(&mut self, a: HostId, b: HostId) -> (StreamId, StreamId) {
        self.net.apply(b, listen(8));
        let (sa, sb, peer) = self.dial_and_adopt(a, b);
        assert_eq!(peer, SocketAddrV4::new(A, 1023), "dialled from 1023 down");
        assert!(self
            .take(a)
            .contains(&Heard::Connected(sa, SocketAddrV4::new(A, 1023))));
        (sa, sb)
    }

    /// Another connection to `b`'s listener (there already), dialled from 1023 down and adopted:
    /// the two streams and the address `b` saw it come from. What `a` heard stays unread.
    fn dial_and_adopt(&mut self, a: HostId, b: HostId) -> (StreamId, StreamId, SocketAddrV4) {
        let sa = self.stream();
        self.net.apply(a, dial(sa, 1023, 512));
        self.run_for(Duration::from_millis(1));
        let (incoming, peer) = self
            .take(b)
            .into_iter()
            .find_map(|e| match e {
                Heard::Incoming { incoming, peer, .. } => Some((incoming, peer)),
                _ => None,
            })
            .expect("an incoming connection");
        let sb = self.stream();
        self.net.apply(
            b,
            StreamAction::Adopt {
                incoming,
                stream: sb,
            },
        );
        (sa, sb, peer)
    }

    /// Whether `h` heard anything that passes `test`.
    fn heard_that(&self, h: HostId, test: impl Fn(&Heard) -> bool) -> bool {
        self.heard[h.0 as usize].iter().any(|(_, e)| test(e))
    }

    /// A new stream of `a` dials B:988 from any port; the network runs for `d`.
    fn dial_and_run(&mut self, a: HostId, d: Duration) -> StreamId {
        let s = self.stream();
        self.net.apply(a, dial(s, 0, 0));
        self.run_for(d);
        s
    }

    /// All `Data` bytes `h` heard on `s`, in order.
    fn data(&self, h: HostId, s: StreamId) -> Vec<u8> {
        self.heard(h)
            .into_iter()
            .filter_map(|e| match e {
                Heard::Data(x, b) if x == s => Some(b),
                _ => None,
            })
            .flatten()
            .collect()
    }
}

fn dial(stream: StreamId, from: u16, to: u16) -> StreamAction {
    StreamAction::Dial {
        stream,
        local: A,
        ports_from: from,
        ports_to: to,
        remote: SocketAddrV4::new(B, 988),
    }
}

fn send(stream: StreamId, id: u64, head: &[u8], payload: SendPayload) -> StreamAction {
    StreamAction::Send {
        stream,
        id: SendId(id),
        head: head.to_vec(),
        payload,
    }
}

fn recv(stream: StreamId, max: u32) -> StreamAction {
    StreamAction::Recv {
        stream,
        target: RecvTarget::Bytes { max },
    }
}

/// Says what was heard when `e` was not.
#[track_caller]
fn assert_heard(heard: &[Heard], e: Heard) {
    assert!(heard.contains(&e), "{e:?} not in {heard:?}");
}

/// A connection from A to B whose A side has a 10 s TCP_USER_TIMEOUT, A's direction stalled:
/// the harness, the hosts and the two streams.
fn stalled_connection() -> (Harness, HostId, HostId, StreamId, StreamId) {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    let (sa, sb) = h.connect(a, b);
    h.net.apply(a, user_timeout(sa, Duration::from_secs(10)));
    h.net.stall(a, b);
    (h, a, b, sa, sb)
}

/// B listens on 988.
fn listen(backlog: u32) -> StreamAction {
    StreamAction::Listen {
        addr: SocketAddrV4::new(B, 988),
        backlog,
    }
}

fn close(stream: StreamId, mode: CloseMode) -> StreamAction {
    StreamAction::Close { stream, mode }
}

/// Keepalive 30/5/5, as ksocklnd sets it.
fn keepalive(stream: StreamId) -> StreamAction {
    let opts = SockOpts {
        keepalive: Some((30, 5, 5)),
        ..SockOpts::default()
    };
    StreamAction::Configure { stream, opts }
}

/// TCP_USER_TIMEOUT.
fn user_timeout(stream: StreamId, t: Duration) -> StreamAction {
    let opts = SockOpts {
        user_timeout: Some(t),
        ..SockOpts::default()
    };
    StreamAction::Configure { stream, opts }
}

#[test]
fn bytes_cross_both_ways_in_order_and_sends_complete() {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    let (sa, sb) = h.connect(a, b);
    h.net.apply(
        a,
        send(sa, 1, b"hello ", SendPayload::Bytes(b"world".to_vec())),
    );
    h.net.apply(b, send(sb, 7, b"back", SendPayload::None));
    h.run_for(Duration::from_millis(1));
    assert!(h.heard(a).contains(&Heard::Sent(sa, SendId(1), Ok(()))));
    assert!(h.heard(b).contains(&Heard::Sent(sb, SendId(7), Ok(()))));
    // Nothing read before a receive is posted.
    assert!(h.data(b, sb).is_empty());
    for _ in 0..4 {
        h.net.apply(b, recv(sb, 4));
        h.net.apply(a, recv(sa, 64));
        h.run_for(Duration::from_millis(1));
    }
    assert_eq!(h.data(b, sb), b"hello world");
    assert_eq!(h.data(a, sa), b"back");
}

#[test]
fn a_payload_lands_in_memory_byte_exact_through_partial_reads() {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    h.net.set_partial_io(0.5);
    let (sa, sb) = h.connect(a, b);
    let src = SharedMem::new(1 << 20);
    src.with(|m| {
        for (i, x) in m.iter_mut().enumerate() {
            *x = (i * 7 % 251) as u8;
        }
    });
    h.net.apply(
        a,
        send(
            sa,
            1,
            &[0xc1; 24],
            SendPayload::Mem {
                mem: src.clone(),
                offset: 0,
                len: 1 << 20,
            },
        ),
    );
    let mut head = Vec::new();
    while head.len() < 24 {
        h.net.apply(b, recv(sb, 24 - head.len() as u32));
        h.run_for(Duration::from_millis(1));
        head = h.data(b, sb);
    }
    assert_eq!(head, [0xc1; 24]);
    let sink = SharedMem::new((1 << 20) + 16);
    h.net.apply(
        b,
        StreamAction::Recv {
            stream: sb,
            target: RecvTarget::Mem {
                mem: sink.clone(),
                offset: 16,
                len: 1 << 20,
            },
        },
    );
    h.run_for(Duration::from_millis(50));
    let filled: Vec<u32> = h
        .heard(b)
        .into_iter()
        .filter_map(|e| match e {
            Heard::Filled(s, n) if s == sb => Some(n),
            _ => None,
        })
        .collect();
    assert_eq!(filled.iter().map(|n| *n as u64).sum::<u64>(), 1 << 20);
    assert!(filled.len() > 1, "partial reads split the payload");
    assert_eq!(sink.to_vec()[16..], src.to_vec()[..]);
    assert!(
        sink.to_vec()[..16].iter().all(|x| *x == 0),
        "nothing before the offset"
    );
    assert!(h.heard(a).contains(&Heard::Sent(sa, SendId(1), Ok(()))));
}

#[test]
fn a_reader_that_posts_nothing_stops_the_sender_at_the_window() {
    let (mut h, a, b) = Harness::with_window(10_000);
    let (sa, sb) = h.connect(a, b);
    for id in 0..5 {
        h.net
            .apply(a, send(sa, id, &[id as u8; 4000], SendPayload::None));
    }
    h.run_for(Duration::from_secs(1));
    let sent = |h: &Harness| {
        h.heard(a)
            .iter()
            .filter(|e| matches!(e, Heard::Sent(_, _, Ok(()))))
            .count()
    };
    // 8,000 bytes fit whole, the third send only in part: two sends done.
    assert_eq!(sent(&h), 2);
    for _ in 0..10 {
        h.net.apply(b, recv(sb, 4096));
        h.run_for(Duration::from_millis(1));
    }
    assert_eq!(sent(&h), 5, "reading let the rest go");
    assert_eq!(h.data(b, sb).len(), 20_000);
}

#[test]
fn a_graceful_close_is_heard_as_eof_after_every_byte() {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    let (sa, sb) = h.connect(a, b);
    h.net
        .apply(a, send(sa, 1, b"last words", SendPayload::None));
    h.net.apply(a, close(sa, CloseMode::Graceful));
    h.run_for(Duration::from_millis(1));
    for _ in 0..3 {
        h.net.apply(b, recv(sb, 64));
        h.run_for(Duration::from_millis(1));
    }
    let heard = h.heard(b);
    assert_eq!(h.data(b, sb), b"last words");
    assert_eq!(heard.last(), Some(&Heard::Ended(sb, EndReason::Eof)));
    // The closer hears nothing more of its stream, and lets go of it once both FINs are out.
    h.net.apply(b, close(sb, CloseMode::Graceful));
    h.run_for(Duration::from_secs(3));
    assert!(!h.heard_that(a, |e| matches!(e, Heard::Ended(..))));
    assert_eq!(h.net.ends_of(a) + h.net.ends_of(b), 0);
}

#[test]
fn an_abort_is_heard_as_reset_at_once_and_fails_what_was_queued() {
    let (mut h, a, b) = Harness::with_window(100);
    let (sa, sb) = h.connect(a, b);
    // Stuck behind a full window.
    h.net.apply(b, send(sb, 1, &[1; 150], SendPayload::None));
    h.net.apply(b, send(sb, 2, &[2; 10], SendPayload::None));
    h.net.apply(a, close(sa, CloseMode::Abort));
    h.run_for(Duration::from_millis(1));
    assert_eq!(
        h.heard(b),
        vec![
            Heard::Sent(sb, SendId(1), Err(EndReason::Reset)),
            Heard::Sent(sb, SendId(2), Err(EndReason::Reset)),
            Heard::Ended(sb, EndReason::Reset),
        ]
    );
    assert_eq!(h.net.stats().aborts, 1);
}

#[test]
fn dials_fail_with_the_reason_a_real_stack_gives() {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    // Nobody listens.
    let s1 = h.stream();
    h.net.apply(a, dial(s1, 0, 0));
    // Nobody at that address.
    let s2 = h.stream();
    h.net.apply(
        a,
        StreamAction::Dial {
            stream: s2,
            local: A,
            ports_from: 0,
            ports_to: 0,
            remote: SocketAddrV4::new(Ipv4Addr::new(10, 9, 9, 9), 988),
        },
    );
    h.run_for(Duration::from_secs(5));
    let heard = h.take(a);
    assert_heard(&heard, Heard::DialFailed(s1, DialError::Refused));
    assert_heard(&heard, Heard::DialFailed(s2, DialError::Unreachable));
    // Every port of a one-port range toward the same listener is taken: NoPorts; toward
    // another remote the same port is shared (SO_REUSEPORT).
    h.net.apply(b, listen(8));
    let (s3, s4) = (h.stream(), h.stream());
    h.net.apply(a, dial(s3, 1023, 1023));
    h.net.apply(a, dial(s4, 1023, 1023));
    h.run_for(Duration::from_millis(1));
    let heard = h.take(a);
    assert!(heard.contains(&Heard::Connected(s3, SocketAddrV4::new(A, 1023))));
    assert!(heard.contains(&Heard::DialFailed(s4, DialError::NoPorts)));
    assert_eq!(h.net.stats().dials_no_ports, 1);
}

#[test]
fn a_full_backlog_drops_the_dial() {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    h.net.apply(b, listen(2));
    let ids: Vec<StreamId> = (0..3).map(|_| h.stream()).collect();
    for s in &ids {
        h.net.apply(a, dial(*s, 0, 0));
    }
    h.run_for(Duration::from_secs(5));
    let heard = h.heard(a);
    assert!(heard.contains(&Heard::DialFailed(ids[2], DialError::Unreachable)));
    let incoming = h
        .heard(b)
        .iter()
        .filter(|e| matches!(e, Heard::Incoming { .. }))
        .count();
    assert_eq!(incoming, 2);
}

#[test]
fn a_crashed_peer_is_found_by_keepalive_or_by_reset_once_it_is_back() {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    let (sa, _sb) = h.connect(a, b);
    // A second connection, with keepalive 30/5/5 as ksocklnd sets it.
    let (sa2, _, _) = h.dial_and_adopt(a, b);
    h.net.apply(a, keepalive(sa2));
    h.take(a);
    h.net.crash(b);
    h.run_for(Duration::from_secs(54));
    assert!(h.heard(a).is_empty(), "nothing before keepalive gives up");
    h.run_for(Duration::from_secs(2));
    assert_eq!(h.take(a), vec![Heard::Ended(sa2, EndReason::TimedOut)]);
    // The other connection (no keepalive) hears nothing until it sends; B is back by then and
    // answers with RST.
    h.net.restart(b);
    h.net.apply(a, send(sa, 1, b"anyone?", SendPayload::None));
    h.run_for(Duration::from_millis(1));
    assert_eq!(
        h.take(a),
        vec![
            Heard::Sent(sa, SendId(1), Ok(())),
            Heard::Ended(sa, EndReason::Reset)
        ]
    );
}

#[test]
fn a_partition_holds_bytes_and_a_heal_delivers_them() {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    let (sa, sb) = h.connect(a, b);
    h.net.partition(a, b);
    h.net.apply(a, send(sa, 1, b"held", SendPayload::None));
    h.net.apply(b, recv(sb, 16));
    h.run_for(Duration::from_secs(1));
    assert!(h.data(b, sb).is_empty());
    h.net.heal(a, b);
    h.run_for(Duration::from_millis(1));
    assert_eq!(h.data(b, sb), b"held");
}

#[test]
fn a_run_is_a_function_of_its_seed() {
    let trace = |seed| {
        let cfg = StreamNetConfig {
            seed,
            ..StreamNetConfig::default()
        };
        let (mut h, a, b) = Harness::new(cfg);
        h.net.set_partial_io(0.7);
        let (sa, sb) = h.connect(a, b);
        h.net.apply(a, send(sa, 1, &[9; 5000], SendPayload::None));
        for _ in 0..50 {
            h.net.apply(b, recv(sb, 4096));
            h.run_for(Duration::from_micros(100));
        }
        h.heard[b.0 as usize].clone()
    };
    assert_eq!(trace(3), trace(3));
    assert_ne!(trace(3), trace(4));
}

#[test]
fn partial_writes_split_a_send_into_segments_a_reader_sees_in_pieces() {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    h.net.set_partial_writes(1.0);
    let (sa, sb) = h.connect(a, b);
    let msg: Vec<u8> = (0..4000u32).map(|i| (i % 253) as u8).collect();
    h.net.apply(
        a,
        send(sa, 1, &msg[..100], SendPayload::Bytes(msg[100..].to_vec())),
    );
    // A reader with a read posted for the whole message gets it a segment at a time.
    let mut reads = 0;
    while h.data(b, sb).len() < msg.len() && reads < 4000 {
        h.net.apply(b, recv(sb, 8192));
        let before = h.data(b, sb).len();
        for _ in 0..1000 {
            if h.data(b, sb).len() > before {
                break;
            }
            h.run_for(Duration::from_nanos(500));
        }
        reads += 1;
    }
    assert_eq!(h.data(b, sb), msg);
    assert!(reads > 1, "one send arrived in {reads} pieces");
    assert_eq!(
        h.heard(a)
            .iter()
            .filter(|e| matches!(e, Heard::Sent(..)))
            .count(),
        1,
        "one Sent for the whole send"
    );
}

#[test]
fn a_stall_holds_one_direction_and_a_user_timeout_ends_it() {
    let (mut h, a, b, sa, sb) = stalled_connection();
    h.net.apply(a, send(sa, 1, b"held", SendPayload::None));
    h.net.apply(b, send(sb, 2, b"flows", SendPayload::None));
    h.net.apply(a, recv(sa, 64));
    h.net.apply(b, recv(sb, 64));
    h.run_for(Duration::from_secs(9));
    assert_eq!(h.data(a, sa), b"flows");
    assert!(h.data(b, sb).is_empty());
    assert!(!h.heard_that(a, |e| matches!(e, Heard::Sent(_, SendId(1), _))));
    assert_eq!(h.net.in_flight(), 0, "a stalled send is not work in flight");
    h.run_for(Duration::from_secs(2));
    let heard = h.heard(a);
    assert_eq!(
        heard[heard.len() - 2..],
        [
            Heard::Sent(sa, SendId(1), Err(EndReason::TimedOut)),
            Heard::Ended(sa, EndReason::TimedOut)
        ]
    );
    assert_eq!(h.net.stats().timeouts, 1);
}

#[test]
fn a_stall_ended_in_time_lets_the_bytes_go_and_stalls_stack() {
    let (mut h, a, b, sa, sb) = stalled_connection();
    h.net.stall(a, b);
    h.net.apply(a, send(sa, 1, b"late", SendPayload::None));
    h.net.apply(b, recv(sb, 64));
    h.run_for(Duration::from_secs(5));
    h.net.unstall(a, b);
    h.run_for(Duration::from_secs(1));
    assert!(h.data(b, sb).is_empty(), "still held by the second stall");
    h.net.unstall(a, b);
    h.run_for(Duration::from_secs(20));
    assert_eq!(h.data(b, sb), b"late");
    assert!(h.heard(a).contains(&Heard::Sent(sa, SendId(1), Ok(()))));
    assert!(!h.heard_that(a, |e| matches!(e, Heard::Ended(..))));
}

#[test]
fn partitions_stack_and_a_syn_sent_before_one_is_lost() {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    h.net.apply(b, listen(8));
    let s = h.stream();
    h.net.apply(a, dial(s, 0, 0));
    h.net.partition(a, b);
    h.net.partition(a, b);
    h.run_for(Duration::from_secs(5));
    assert!(h
        .heard(a)
        .contains(&Heard::DialFailed(s, DialError::Unreachable)));
    assert!(!h.heard_that(b, |e| matches!(e, Heard::Incoming { .. })));
    h.net.heal(a, b);
    let s2 = h.dial_and_run(a, Duration::from_secs(5));
    assert!(h
        .heard(a)
        .contains(&Heard::DialFailed(s2, DialError::Unreachable)));
    h.net.heal(a, b);
    let s3 = h.dial_and_run(a, Duration::from_millis(1));
    assert!(h.heard_that(a, |e| matches!(e, Heard::Connected(x, _) if *x == s3)));
}

#[test]
fn a_process_exit_closes_what_it_left_reset_where_bytes_were_unread() {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    let (sa, _sb) = h.connect(a, b);
    let (sa2, sb2, _) = h.dial_and_adopt(a, b);
    // B never reads the second connection: its bytes sit unread when B's process exits.
    h.net.apply(a, send(sa2, 1, b"unread", SendPayload::None));
    h.run_for(Duration::from_millis(1));
    let _ = sb2;
    h.net.close_host(b);
    h.net.apply(a, recv(sa, 64));
    h.net.apply(a, recv(sa2, 64));
    h.run_for(Duration::from_millis(1));
    let heard = h.heard(a);
    assert_heard(&heard, Heard::Ended(sa, EndReason::Eof));
    assert_heard(&heard, Heard::Ended(sa2, EndReason::Reset));
    // The host is up but nothing listens: a dial is refused, and B hears nothing more.
    let s = h.dial_and_run(a, Duration::from_millis(1));
    assert!(h
        .heard(a)
        .contains(&Heard::DialFailed(s, DialError::Refused)));
    assert!(!h
        .take(b)
        .iter()
        .any(|e| matches!(e, Heard::Ended(..) | Heard::Data(..))));
    h.run_for(Duration::from_secs(3));
    h.net.apply(a, close(sa, CloseMode::Graceful));
    h.net.apply(a, close(sa2, CloseMode::Graceful));
    h.run_for(Duration::from_secs(3));
    assert_eq!(h.net.ends_of(a) + h.net.ends_of(b), 0);
}

#[test]
fn work_in_flight_counts_bytes_and_reports_not_timers() {
    let (mut h, a, b) = Harness::new(StreamNetConfig::default());
    let (sa, sb) = h.connect(a, b);
    assert_eq!(h.net.in_flight(), 0);
    h.net.apply(a, send(sa, 1, b"x", SendPayload::None));
    assert!(h.net.in_flight() > 0, "a segment and a Sent report");
    h.run_for(Duration::from_millis(1));
    assert_eq!(h.net.in_flight(), 0, "arrived, unread, reported");
    h.net.apply(b, recv(sb, 8));
    h.run_for(Duration::from_millis(1));
    assert_eq!(h.data(b, sb), b"x");
    h.net.apply(a, keepalive(sa));
    h.net.crash(b);
    assert_eq!(h.net.in_flight(), 0, "a keepalive give-up is a timer");
    assert!(h.net.next_event_at().is_some());
}

#[test]
fn a_deaf_host_fills_the_window_without_a_tcp_timeout_and_reads_again() {
    let (mut h, a, b) = Harness::with_window(10_000);
    let (sa, sb) = h.connect(a, b);
    h.net.apply(a, user_timeout(sa, Duration::from_secs(10)));
    h.net.set_deaf(b, true);
    h.net.apply(b, recv(sb, 65536));
    for id in 0..3 {
        h.net
            .apply(a, send(sa, id, &[id as u8; 4000], SendPayload::None));
    }
    h.run_for(Duration::from_secs(60));
    assert!(h.data(b, sb).is_empty(), "a posted read, not served");
    let sent = |h: &Harness| {
        h.heard(a)
            .iter()
            .filter(|e| matches!(e, Heard::Sent(_, _, Ok(()))))
            .count()
    };
    assert_eq!(sent(&h), 2, "the window holds two sends");
    assert!(!h.heard_that(a, |e| matches!(e, Heard::Ended(..))));
    h.net.set_deaf(b, false);
    for _ in 0..4 {
        h.run_for(Duration::from_millis(1));
        h.net.apply(b, recv(sb, 65536));
    }
    assert_eq!(h.data(b, sb).len(), 12_000);
    assert_eq!(sent(&h), 3);
}
