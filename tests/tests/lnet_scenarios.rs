//! LNet-level scenarios: `router::LnetNode`s (the LNet layer the daemon runs, one NI each) hosted
//! by the deterministic simulator, pinging each other through its fault model. Each prints its
//! seed on failure; rerun with the same seed to replay it.

use lnd::sim::{NodeId, PeerEvent, SimConfig, World};
use lnd::time::{Duration, Instant};
use lnd::wire::Nid;
use router::{LnetError, LnetEvent, LnetNode, NiConfig, NodeConfig, PingId};

/// Every ping's timeout.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// CM messages lost and delayed, throughout.
const CM_LOSS: f64 = 0.1;
const CM_DELAY: Duration = Duration::from_micros(200);

fn nid(i: usize) -> Nid {
    format!("10.0.0.{i}@o2ib").parse().expect("valid NID")
}

/// When in the scenario a ping was sent.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    Warm,
    Partitioned,
    Healed,
    TargetDown,
    Rebooted,
}

/// One ping handed to a node.
#[derive(Clone, Debug)]
struct Ping {
    from: NodeId,
    to: NodeId,
    id: PingId,
    at: Instant,
    phase: Phase,
}

/// One line of the event trace: what a node's LNet reported, or a peer up/down the world booked.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Traced {
    Lnet(LnetEvent),
    Peer(PeerEvent),
}

struct Run {
    seed: u64,
    w: World<LnetNode>,
    nodes: Vec<NodeId>,
    pings: Vec<Ping>,
}

impl Run {
    /// `n` nodes; each outgoing connect is stuck (never completes) with probability `stuck`.
    fn new(seed: u64, n: usize, stuck: f64) -> Run {
        let mut w: World<LnetNode> = World::hosting(SimConfig::with_seed(seed));
        let nodes: Vec<NodeId> = (1..=n)
            .map(|i| w.add_node(NodeConfig::new(vec![NiConfig::new(nid(i), i as u64)])))
            .collect();
        w.cm_loss(CM_LOSS);
        w.cm_delay(CM_DELAY);
        for &x in &nodes {
            w.stuck_connects(x, stuck);
        }
        Run {
            seed,
            w,
            nodes,
            pings: Vec::new(),
        }
    }

    /// Every running node pings every other node once, now.
    fn ping_round(&mut self, phase: Phase) {
        for &a in &self.nodes {
            for &b in &self.nodes {
                if a == b {
                    continue;
                }
                let to = self.w.nid_of(b);
                let Some(r) = self.w.with_node(a, |n, now| n.ping(now, to, PING_TIMEOUT)) else {
                    continue; // a is down
                };
                let id = r.unwrap_or_else(|e| panic!("seed {}: ping refused: {e}", self.seed));
                let at = self.w.now();
                self.pings.push(Ping {
                    from: a,
                    to: b,
                    id,
                    at,
                    phase,
                });
            }
        }
    }

    /// `n` ping rounds, one every `every`.
    fn rounds(&mut self, phase: Phase, n: usize, every: Duration) {
        for _ in 0..n {
            self.ping_round(phase);
            self.w.run_for(every);
        }
    }

    /// Runs past every pending ping's deadline: none may be left.
    fn settle(&mut self) {
        self.w.run_for(PING_TIMEOUT + Duration::from_millis(1));
        for &x in &self.nodes {
            if let Some(n) = self.w.node(x) {
                assert_eq!(
                    n.pending_pings(),
                    0,
                    "seed {}: ping past its deadline",
                    self.seed
                );
            }
        }
    }

    /// How ping `p` ended: its `PingDone`, when, and with what.
    fn outcome(&self, p: &Ping) -> Option<(Instant, Result<(), LnetError>)> {
        let target = self.w.nid_of(p.to);
        self.w
            .node_events(p.from)
            .iter()
            .find_map(|(at, ev)| match ev {
                LnetEvent::PingDone {
                    id,
                    target: t,
                    result,
                } if *id == p.id && *at >= p.at => {
                    assert_eq!(
                        *t, target,
                        "seed {}: ping done for another target",
                        self.seed
                    );
                    Some((*at, result.as_ref().map(|_| ()).map_err(|e| *e)))
                }
                _ => None,
            })
    }

    fn ok(&self, p: &Ping) -> bool {
        matches!(self.outcome(p), Some((_, Ok(()))))
    }

    /// Whether some ping of `phase` from `a` to `b` got its reply.
    fn pair_ok(&self, phase: Phase, a: NodeId, b: NodeId) -> bool {
        self.pings
            .iter()
            .any(|p| p.phase == phase && p.from == a && p.to == b && self.ok(p))
    }

    /// Every node's events, merged in (time, node) order.
    fn trace(&self) -> Vec<(Instant, NodeId, Traced)> {
        let mut t: Vec<(Instant, NodeId, Traced)> = Vec::new();
        for &x in &self.nodes {
            t.extend(
                self.w
                    .node_events(x)
                    .iter()
                    .map(|(at, ev)| (*at, x, Traced::Lnet(ev.clone()))),
            );
            t.extend(
                self.w
                    .peer_events(x)
                    .iter()
                    .map(|p| (p.at, x, Traced::Peer(*p))),
            );
        }
        t.sort_by_key(|(at, x, _)| (*at, *x));
        t
    }
}

/// Three LNet nodes under CM loss and delay (and stuck connects with probability `stuck`): they
/// ping each other every second, node 1 is cut from nodes 2 and 3 and healed, node 3 reboots
/// with a new incarnation. Returns the run for [`check`].
fn partition_heal_reboot(seed: u64, stuck: f64) -> Run {
    let mut r = Run::new(seed, 3, stuck);
    let (a, b, c) = (r.nodes[0], r.nodes[1], r.nodes[2]);
    let second = Duration::from_secs(1);

    r.rounds(Phase::Warm, 5, second);
    r.settle();

    // Cut: pings only in the first 3 s, every deadline falls before the heal.
    let cut = r.w.partition(&[a], &[b, c]);
    r.rounds(Phase::Partitioned, 3, second);
    r.settle();
    r.w.heal_partition(cut);
    r.rounds(Phase::Healed, 15, second);
    r.settle();

    // Reboot of c: down long enough that every ping to it while down has its deadline first.
    r.w.reboot(c, PING_TIMEOUT + Duration::from_secs(3), 100 + seed);
    r.rounds(Phase::TargetDown, 2, second);
    r.settle();
    r.w.run_for(Duration::from_secs(3));
    assert!(
        r.w.node(c).is_some(),
        "seed {seed}: node 3 is back after its reboot"
    );
    r.rounds(Phase::Rebooted, 15, second);
    r.settle();

    // Quiescence: longer than the LND's tx timeout, so whatever an LND still held has finished.
    r.w.run_for(Duration::from_secs(60));
    r
}

/// What every run must show: every ping ends with a status (OK or an LND error or a timeout)
/// within its timeout; nothing crosses the partition or reaches the down node; every ordered pair
/// gets a reply again after the heal and after the reboot; nothing is left in flight.
fn check(r: &Run) {
    let seed = r.seed;
    let (a, b, c) = (r.nodes[0], r.nodes[1], r.nodes[2]);

    // Every ping ends with a status, within its timeout.
    for p in &r.pings {
        let Some((at, result)) = r.outcome(p) else {
            panic!("seed {seed}: {p:?} never finished");
        };
        assert!(
            at - p.at <= PING_TIMEOUT,
            "seed {seed}: {p:?} finished after {} (timeout {PING_TIMEOUT})",
            at - p.at
        );
        if let Err(e) = result {
            assert!(
                matches!(e, LnetError::Timeout | LnetError::Lnd(_)),
                "seed {seed}: {p:?} failed with {e:?}"
            );
        }
    }

    // Across the cut nothing gets through; the side that stays together keeps talking.
    for p in r.pings.iter().filter(|p| p.phase == Phase::Partitioned) {
        if (p.from == a) != (p.to == a) {
            assert!(!r.ok(p), "seed {seed}: {p:?} crossed the partition");
        }
    }
    assert!(r.pair_ok(Phase::Partitioned, b, c) && r.pair_ok(Phase::Partitioned, c, b));

    // A crashed host answers nothing.
    for p in r.pings.iter().filter(|p| p.phase == Phase::TargetDown) {
        assert!(p.from != c, "seed {seed}: a down node pinged");
        if p.to == c {
            assert!(!r.ok(p), "seed {seed}: {p:?} answered by a down node");
        }
    }

    // Every ordered pair recovers after the heal and after the reboot.
    for &x in &r.nodes {
        for &y in &r.nodes {
            if x != y {
                for phase in [Phase::Healed, Phase::Rebooted] {
                    assert!(
                        r.pair_ok(phase, x, y),
                        "seed {seed}: no ping {x:?} -> {y:?} succeeded in {phase:?}"
                    );
                }
            }
        }
    }

    // Nothing is left in flight.
    for &x in &r.nodes {
        let n = r.w.node(x).expect("every node runs at the end");
        assert_eq!(
            n.messages_in_flight(),
            0,
            "seed {seed}: {x:?} holds messages"
        );
        assert_eq!(n.pending_pings(), 0, "seed {seed}: {x:?} has pending pings");
    }
    assert_eq!(
        r.w.invalid_transitions(),
        0,
        "seed {seed}: a connection state change outside the table"
    );
}

#[test]
fn lnet_pings_end_within_their_timeout_and_recover_after_partition_heal_and_reboot() {
    let mut cm_lost = 0;
    for seed in 1..=16 {
        let r = partition_heal_reboot(seed, 0.0);
        check(&r);
        cm_lost += r.w.stats().cm_lost;
        let failed = r.pings.iter().filter(|p| !r.ok(p)).count();
        eprintln!(
            "seed {seed}: {} pings, {failed} failed, {} CM messages lost, {} stuck connects",
            r.pings.len(),
            r.w.stats().cm_lost,
            r.w.stats().stuck_connects
        );
    }
    assert!(cm_lost > 0, "the fault model lost no CM message");
}

#[test]
fn lnet_scenario_replays_the_same_event_trace_from_its_seed() {
    for seed in [3, 11] {
        let first = partition_heal_reboot(seed, 0.02).trace();
        let second = partition_heal_reboot(seed, 0.02).trace();
        assert!(!first.is_empty());
        assert_eq!(first, second, "seed {seed}: two runs of one seed diverged");
    }
}

/// Found by this scenario (seed 4): with stuck connects as well, node 2's connect to node 1
/// came up on node 2's side while node 1 gave up its side and its close was lost; node 2 held
/// that connection with its credits spent and its messages queued, and when node 1 connected
/// again node 2 kept sending on the dead one until the LND timeout (50 s). Now a connect request
/// from a peer we hold connections of ours to makes us probe them with a keepalive NOOP: a dead
/// one fails at once. Every seed of 1..=40 recovers within the scenario's phases.
#[test]
fn lnet_pings_recover_after_a_stuck_connect_during_a_partition() {
    for seed in 1..=40 {
        check(&partition_heal_reboot(seed, 0.02));
    }
}
