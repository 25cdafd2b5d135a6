//! Bulk streams (PUTs and GETs of registered memory by rendezvous) and the hostile
//! attackers that pin a router's large buffers while one runs.

use super::*;

/// The bytes of the bulk buffers: position-dependent, so a misplaced or torn transfer shows.
pub(crate) fn bulk_pattern(len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8)
        .collect()
}

/// The match bits of every bulk transfer (B's MDs are taken oldest first).
pub(crate) const BULK_BITS: u64 = 0xb01c;

/// B in a bulk mode: `2 x window` sinks (for A's PUTs) and as many sources (for A's GETs) of
/// `size` bytes stay posted, each reposted as it is used; counts completed transfers of the full
/// size. At the end it checks the last sink a PUT filled.
pub(crate) fn serve_bulk(d: &mut Driver, opts: &Opts, shared: &Shared) -> Result<(), String> {
    let size = opts.size;
    let slots = 2 * opts.window;
    let sinks = d.register(vec![0; slots * size as usize])?;
    let source = d.register(bulk_pattern(size as usize))?;
    let ni = NiIndex(0);
    let sink_buf = |k: usize| sinks.buf(ni, (k * size as usize) as u64, size);
    let source_buf = source.buf(ni, 0, size).ok_or("source range")?;
    let mut slot_of = HashMap::new();
    for k in 0..slots {
        let md = d
            .node()
            .post_sink(BENCH_PORTAL, BULK_BITS, sink_buf(k).ok_or("sink range")?);
        slot_of.insert(md, k);
        d.node()
            .post_source(BENCH_PORTAL, BULK_BITS, source_buf.clone());
    }
    let mut last_sink = None;
    let mut failed = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        d.turn(d.max_wait)?;
        let mut n = 0;
        while let Some(ev) = d.node().poll_event() {
            match ev {
                LnetEvent::BulkPut { md, result, .. } => {
                    let k = slot_of.remove(&md).ok_or("a sink we did not post")?;
                    match result {
                        Ok(len) if len == size => {
                            n += 1;
                            last_sink = Some(k);
                        }
                        _ => failed += 1,
                    }
                    let md = d.node().post_sink(
                        BENCH_PORTAL,
                        BULK_BITS,
                        sink_buf(k).ok_or("sink range")?,
                    );
                    slot_of.insert(md, k);
                }
                LnetEvent::BulkGetServed { result, .. } => {
                    match result {
                        Ok(len) if len == size => n += 1,
                        _ => failed += 1,
                    }
                    d.node()
                        .post_source(BENCH_PORTAL, BULK_BITS, source_buf.clone());
                }
                _ => {}
            }
        }
        if n > 0 {
            shared.received.fetch_add(n, Ordering::Relaxed);
        }
    }
    let st = d.node().stats().clone();
    eprintln!(
        "INFO node B bulk: {} received, {failed} failed, {} dropped (no MD)",
        shared.received.load(Ordering::Relaxed),
        st.drop_count
    );
    if let Some(k) = last_sink {
        check_sink(d, &sinks, k, size, "PUT")?;
    }
    if failed > 0 || st.drop_count > 0 {
        return Err(format!(
            "{failed} transfers failed, {} dropped",
            st.drop_count
        ));
    }
    Ok(())
}

/// That sink slot `k` of `sinks` (slots of `size` bytes) holds the bulk pattern: the data of the
/// last `what` (PUT or GET) that landed there arrived whole.
fn check_sink(
    d: &mut Driver,
    sinks: &Region,
    k: usize,
    size: u32,
    what: &str,
) -> Result<(), String> {
    let mut got = vec![0; size as usize];
    let off = (k * size as usize) as u64;
    if !d.read(sinks, off, &mut got) || got != bulk_pattern(size as usize) {
        return Err(format!(
            "the last {what}'s sink (slot {k}) does not hold the data"
        ));
    }
    Ok(())
}

/// A in a bulk mode: keeps `window` transfers outstanding (PUTs from one registered source, or
/// GETs into `window` registered sinks) until told to stop, then lets them finish (bounded).
/// Returns (started, completed, failed).
pub(crate) fn stream_bulk(
    d: &mut Driver,
    opts: &Opts,
    shared: &Shared,
    tx: &Sender<Report>,
    dst: Nid,
    get: bool,
) -> Result<(u64, u64, u64), String> {
    let size = opts.size;
    let ni = NiIndex(0);
    let source = d.register(bulk_pattern(size as usize))?;
    let sinks = d.register(vec![0; opts.window * size as usize])?;
    let source_buf = source.buf(ni, 0, size).ok_or("source range")?;
    let sink_buf = |k: usize| sinks.buf(ni, (k * size as usize) as u64, size);
    let mut free: Vec<usize> = (0..opts.window).rev().collect();
    let mut slot_of = HashMap::new();
    let (mut sent, mut done, mut errors) = (0u64, 0u64, 0u64);
    let mut last_get = None;
    let mut drain = Drain::new(StdDuration::from_secs(10));
    let mut streaming = false;
    loop {
        let stopping = drain.stopping(shared);
        if !stopping {
            let now = d.rt.now();
            while let Some(k) = free.pop() {
                let id = if get {
                    let b = sink_buf(k).ok_or("sink range")?;
                    d.node().send_get_bulk(now, dst, BENCH_PORTAL, BULK_BITS, b)
                } else {
                    d.node()
                        .send_put_bulk(now, dst, BENCH_PORTAL, BULK_BITS, source_buf.clone())
                }
                .map_err(|e| format!("bulk send: {e}"))?;
                slot_of.insert(id, k);
                sent += 1;
            }
            if !streaming {
                streaming = true;
                let _ = tx.send(Report::Streaming);
            }
        }
        d.turn(d.max_wait)?;
        while let Some(ev) = d.node().poll_event() {
            let (id, ok) = match ev {
                LnetEvent::PutDone { id, result } => {
                    if let Err(e) = &result {
                        if errors == 0 {
                            eprintln!("WARN the first failed bulk PUT: {e}");
                        }
                    }
                    (id, result.is_ok())
                }
                LnetEvent::GetDone { id, result } => {
                    if result != Ok(size) && errors == 0 {
                        eprintln!("WARN the first failed bulk GET: {result:?}");
                    }
                    (id, result == Ok(size))
                }
                LnetEvent::PeerDown { nid, reason, .. } => {
                    eprintln!("WARN peer {nid} down during the stream: {reason:?}");
                    continue;
                }
                _ => continue,
            };
            let Some(k) = slot_of.remove(&id) else {
                continue;
            };
            free.push(k);
            if ok {
                done += 1;
                shared.received.fetch_add(1, Ordering::Relaxed);
                if get {
                    last_get = Some(k);
                }
            } else {
                errors += 1;
            }
        }
        if drain.over(slot_of.is_empty()) {
            break;
        }
    }
    if let Some(k) = last_get {
        check_sink(d, &sinks, k, size, "GET")?;
    }
    Ok((sent, done, errors))
}

/// Attacker `i`'s NID (a fresh one: the router has never seen it bring a PUT in whole).
pub(crate) fn attacker_nid(i: usize) -> Nid {
    nid(&format!("10.0.3.{}@o2ib", i + 1))
}

/// An attacker's fabric: the tcp fabric, but its RDMA writes and its PUT_DONEs never leave;
/// both are reported done at the next poll, so its LND goes on as if it had written. The
/// router's grant to it is never filled nor completed: it holds the buffer until the router
/// reclaims it (a peer taking every grant it is given).
pub(crate) fn hostile(fabric: TcpFabric) -> lnd::driver::tamper::Tamper<TcpFabric> {
    use lnd::fabric::FabricAction;
    use lnd::wire::kib::{KibBody, KibMsg};
    let mut t = lnd::driver::tamper::Tamper::new(fabric);
    t.set(Some(Box::new(|action| match &action {
        FabricAction::RdmaWrite { .. } => None,
        FabricAction::Send { bytes, .. }
            if matches!(KibMsg::parse(bytes), Ok((m, _)) if matches!(m.body, KibBody::PutDone(_))) =>
        {
            None
        }
        _ => Some(action),
    })));
    t
}

/// Bound on one attackers' round: the thread sleeps at most this long in the first runtime
/// (less when any has work), so that 64 attackers share one thread without spinning a core.
pub(crate) const ATTACK_ROUND: StdDuration = StdDuration::from_millis(1);

/// The `--attackers` nodes on one thread (a [`router::runtime::Swarm`]): bound now (their
/// addresses go to the router's peers), idle but for their router pings until `go`, then from
/// `attack` each keeps one bulk PUT of `--size` to B outstanding until the clients stop.
pub(crate) fn spawn_attackers(
    opts: &Opts,
    shared: &Arc<Shared>,
) -> Result<JoinHandle<Result<(), String>>, String> {
    use lnd::fabric::Registry;
    let mut runtimes = Vec::new();
    let mut sources = Vec::new();
    for i in 0..opts.attackers {
        let me = attacker_nid(i);
        let sh = Arc::clone(shared);
        let tcp = lnd::driver::tcp::TcpConfig {
            // The swarm polls every runtime each round already.
            busy_poll: StdDuration::ZERO,
            ..Default::default()
        };
        let fabric = TcpFabric::bind_with(
            "127.0.0.1:0".parse().expect("address"),
            move |n| sh.peer(n),
            tcp,
        )
        .map_err(|e| format!("cannot bind the tcp fabric: {e}"))?;
        shared.add_peer(me, fabric.local_addr());
        let clock = MonotonicClock::new();
        let mut ni = NiConfig::new(me, 0xa77a_0000 + i as u64);
        ni.peer_credits = opts.peer_credits;
        ni.tunables.peer_credits = opts.peer_credits.min(255) as u16;
        let mut cfg = NodeConfig::new(vec![ni]);
        cfg.routes = vec![RouteConfig {
            net: opts.server_net.net(Side::Server).parse().expect("a net"),
            gateway: router_a(opts),
            hops: Some(1),
            priority: 0,
        }];
        let node = LnetNode::new(cfg, clock.now());
        let mut driver = hostile(fabric);
        // Never read: nothing is written from it.
        let reg = driver
            .register(vec![0xa5; opts.size as usize])
            .map_err(|e| format!("register: {e}"))?;
        sources.push(router::BulkBuf::new(NiIndex(0), &reg, 0, opts.size).ok_or("source range")?);
        let (rt, _wake) = NiRuntime::new(node, driver, clock)
            .map_err(|e| format!("cannot make the node's waker: {e}"))?;
        runtimes.push(rt);
    }
    let mut swarm = router::runtime::Swarm::new(runtimes)
        .map_err(|e| format!("the attackers cannot share a thread: {e}"))?;
    let shared = Arc::clone(shared);
    let dst = server_nid(opts);
    std::thread::Builder::new()
        .name("attackers".into())
        .spawn(move || {
            while !shared.go.load(Ordering::Relaxed) {
                if shared.stop_client.load(Ordering::Relaxed) {
                    return Ok(());
                }
                std::thread::sleep(StdDuration::from_millis(1));
            }
            let mut outstanding = vec![None; sources.len()];
            while !shared.stop_client.load(Ordering::Relaxed) {
                swarm
                    .turn(ATTACK_ROUND)
                    .map_err(|e| format!("fabric: {e}"))?;
                let attack = shared.attack.load(Ordering::Relaxed);
                for (i, rt) in swarm.runtimes_mut().iter_mut().enumerate() {
                    while let Some(ev) = rt.node_mut().poll_event() {
                        if let LnetEvent::PutDone { id, result } = ev {
                            if outstanding[i] == Some(id) {
                                outstanding[i] = None;
                                let n = if result.is_ok() {
                                    &shared.attack_done
                                } else {
                                    &shared.attack_failed
                                };
                                n.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    if attack && outstanding[i].is_none() {
                        let now = rt.now();
                        match rt.node_mut().send_put_bulk(
                            now,
                            dst,
                            BENCH_PORTAL,
                            BULK_BITS,
                            sources[i].clone(),
                        ) {
                            Ok(id) => {
                                outstanding[i] = Some(id);
                                shared.attack_sent.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {
                                shared.attack_unsent.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            }
            Ok(())
        })
        .map_err(|e| format!("spawn: {e}"))
}
