//! The selftest console (conrpc.c and console.c in Lustre, lst's kernel half, in our words):
//! a session over groups of nodes, batches of tests, and the framework RPCs that set them up
//! on the nodes, run and stop them, and read their counters. The daemon runs it beside one
//! NI's selftest; `lnetctl selftest` (lst's commands) drives it over the control socket.
//!
//! Each command that talks to nodes is one transaction: one RPC per node, all in parallel,
//! and its answer once every node answered or failed (per node: its status, or why not).
//! While a session is open the console pings its nodes every [`PING_INTERVAL`] (a session
//! query, lstcon_rpc_pinger), which keeps their sessions alive and shows which are down.

use std::collections::BTreeMap;

use lnd::fabric::Registry;
use lnd::time::{Duration, Instant};
use lnd::wire::errno;
use lnd::wire::{ByteOrder, Nid};

use super::console_types::*;
use super::service::Selftest;
use super::srpc::{BulkDir, Owner, RpcDone, RpcError};
use super::wire::*;
use crate::LnetNode;

fn parse_nids(list: &[String]) -> Result<Vec<Nid>, LstError> {
    let mut out = Vec::new();
    for item in list
        .iter()
        .flat_map(|s| s.split([',', ' ']))
        .filter(|s| !s.is_empty())
    {
        for expanded in expand_range(item)? {
            let nid: Nid = expanded
                .parse()
                .map_err(|e| LstError::new(errno::EINVAL, format!("{expanded}: {e}")))?;
            if !out.contains(&nid) {
                out.push(nid);
            }
        }
    }
    if out.is_empty() {
        return Err(LstError::new(errno::EINVAL, "no NID given"));
    }
    Ok(out)
}

/// lst's NID ranges in one place of the address: `10.0.0.[1-4]@tcp`, `10.0.0.[1,3,5-6]@tcp`.
fn expand_range(s: &str) -> Result<Vec<String>, LstError> {
    let bad = || LstError::new(errno::EINVAL, format!("{s}: bad NID range"));
    let Some(open) = s.find('[') else {
        return Ok(vec![s.to_string()]);
    };
    let close = s[open..].find(']').map(|c| c + open).ok_or_else(bad)?;
    let (head, tail) = (&s[..open], &s[close + 1..]);
    let mut out = Vec::new();
    for part in s[open + 1..close].split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let a: u32 = a.trim().parse().map_err(|_| bad())?;
        let b: u32 = b.trim().parse().map_err(|_| bad())?;
        if a > b || b - a > 4096 {
            return Err(bad());
        }
        out.extend((a..=b).map(|n| format!("{head}{n}{tail}")));
    }
    Ok(out)
}

fn errno_name(e: u32) -> String {
    // Statuses are positive Linux errnos on the wire (u32 there).
    match i32::try_from(e) {
        Ok(0) => "ok".into(),
        Ok(errno::ENOENT) => "ENOENT".into(),
        Ok(errno::ESRCH) => "ESRCH (no such session)".into(),
        Ok(errno::EIO) => "EIO".into(),
        Ok(errno::ENOMEM) => "ENOMEM".into(),
        Ok(errno::EBUSY) => "EBUSY (in another session)".into(),
        Ok(errno::EINVAL) => "EINVAL".into(),
        Ok(errno::EPROTO) => "EPROTO".into(),
        Ok(errno::EBADMSG) => "EBADMSG".into(),
        Ok(errno::EALREADY) => "EALREADY (running)".into(),
        _ => format!("errno {e}"),
    }
}

/// The destinations client `i` of `nclients` gets among `ndst` (lst's --distribute D:S: each
/// run of D clients shares a window of S destinations, the windows walking through the
/// destination group; lstcon_dstnodes_prep).
fn distribute(i: usize, ndst: usize, d: u32, s: u32) -> Vec<usize> {
    let (d, s) = (d.max(1) as usize, (s.max(1) as usize).min(ndst.max(1)));
    let start = (i / d) * s;
    (0..s).map(|k| (start + k) % ndst.max(1)).collect()
}

/// A command done at once, with the line lst prints for it.
fn said(message: String) -> ConsoleStart {
    ConsoleStart::Done(Ok(LstReply {
        message,
        ..LstReply::default()
    }))
}

impl Selftest {
    /// Runs one console command; see [`ConsoleStart`].
    pub fn console(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        reg: &mut dyn Registry,
        cmd: LstCommand,
    ) -> ConsoleStart {
        let r = self.console_inner(now, node, reg, cmd);
        // What the command set off at once (loopback RPCs to this node) is taken now.
        self.run(now, node, reg);
        r
    }

    /// The answer of a pending command, once it has one.
    pub fn poll_console(&mut self) -> Option<(u64, Result<LstReply, LstError>)> {
        self.console.done.pop_front()
    }

    /// When the console next pings its nodes.
    pub fn console_timeout(&self) -> Option<Instant> {
        self.console.session.as_ref().map(|s| s.next_ping)
    }

    /// The console's periodic work: the ping that keeps its nodes' sessions.
    pub fn console_tick(&mut self, now: Instant, node: &mut LnetNode, reg: &mut dyn Registry) {
        let due = self
            .console
            .session
            .as_ref()
            .is_some_and(|s| s.next_ping <= now);
        if !due {
            return;
        }
        let busy = self
            .console
            .txns
            .values()
            .any(|t| matches!(t.kind, TxnKind::KeepAlive));
        let Some(s) = self.console.session.as_mut() else {
            return;
        };
        s.next_ping = now.saturating_add(PING_INTERVAL);
        if busy {
            return;
        }
        let nodes: Vec<Nid> = s.state.keys().copied().collect();
        if !nodes.is_empty() {
            let _ = self.transaction(now, node, reg, TxnKind::KeepAlive, nodes);
        }
    }

    fn console_inner(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        reg: &mut dyn Registry,
        cmd: LstCommand,
    ) -> ConsoleStart {
        use ConsoleStart::Done;
        let no_session = || Done(Err(LstError::new(3, "no session: run new_session first")));
        match cmd {
            LstCommand::NewSession {
                name,
                timeout,
                force,
            } => {
                if LstName::new(&name).is_none() || name.is_empty() {
                    return Done(Err(LstError::new(22, "session name: 1 to 31 bytes")));
                }
                if let Some(s) = &self.console.session {
                    if !force {
                        return Done(Err(LstError::new(
                            17,
                            format!("session {} is open: end_session it, or --force", s.name),
                        )));
                    }
                }
                let stamp = (self.console.seed / 1000).wrapping_add(now.as_nanos() / 1_000_000);
                self.console.session = Some(ConsoleSession {
                    name: name.clone(),
                    sid: LstSid {
                        nid: self.srpc.own(),
                        stamp: stamp as i64,
                    },
                    timeout: timeout.unwrap_or(DEFAULT_RPC_TIMEOUT).max(1),
                    features: LST_FEATS_MASK,
                    force,
                    groups: BTreeMap::new(),
                    state: BTreeMap::new(),
                    batches: BTreeMap::new(),
                    next_bid: 1,
                    next_ping: now.saturating_add(PING_INTERVAL),
                });
                said(format!("session {name} opened by {}", self.srpc.own()))
            }
            LstCommand::ShowSession => match &self.console.session {
                None => no_session(),
                Some(s) => Done(Ok(LstReply {
                    message: format!(
                        "{} ID: {}@{} timeout: {} groups: {} batches: {}",
                        s.name,
                        s.sid.stamp,
                        s.sid.nid,
                        s.timeout,
                        s.groups.len(),
                        s.batches.len()
                    ),
                    ..LstReply::default()
                })),
            },
            LstCommand::EndSession => {
                let Some(s) = &self.console.session else {
                    return no_session();
                };
                let nodes: Vec<Nid> = s.state.keys().copied().collect();
                if nodes.is_empty() {
                    self.console.session = None;
                    return said("session ended".into());
                }
                self.transaction(now, node, reg, TxnKind::EndSession, nodes)
            }
            LstCommand::AddGroup { name, nids } => {
                let Some(s) = &self.console.session else {
                    return no_session();
                };
                if name.is_empty() || LstName::new(&name).is_none() {
                    return Done(Err(LstError::new(22, "group name: 1 to 31 bytes")));
                }
                if s.groups.contains_key(&name) {
                    return Done(Err(LstError::new(17, format!("group {name} exists"))));
                }
                let nids = match parse_nids(&nids) {
                    Ok(n) => n,
                    Err(e) => return Done(Err(e)),
                };
                self.transaction(now, node, reg, TxnKind::AddGroup { name }, nids)
            }
            LstCommand::DelGroup { name } => {
                let Some(s) = self.console.session.as_mut() else {
                    return no_session();
                };
                let used = s
                    .batches
                    .values()
                    .flat_map(|b| &b.tests)
                    .any(|t| t.from == name || t.to == name);
                if used {
                    return Done(Err(LstError::new(
                        16,
                        format!("group {name} is used by a test"),
                    )));
                }
                let Some(members) = s.groups.get(&name) else {
                    return Done(Err(LstError::new(2, format!("no group {name}"))));
                };
                // Its nodes in no other group leave the session (lstcon_group_del).
                let only_here: Vec<Nid> = members
                    .iter()
                    .filter(|n| !s.groups.iter().any(|(g, ns)| *g != name && ns.contains(n)))
                    .copied()
                    .collect();
                if only_here.is_empty() {
                    s.groups.remove(&name);
                    return said(format!("group {name} deleted"));
                }
                self.transaction(now, node, reg, TxnKind::DelGroup { name }, only_here)
            }
            LstCommand::ListGroup => {
                let Some(s) = &self.console.session else {
                    return no_session();
                };
                let groups = s
                    .groups
                    .iter()
                    .map(|(g, nids)| LstGroupInfo {
                        name: g.clone(),
                        nodes: nids
                            .iter()
                            .map(|n| LstNodeResult {
                                nid: n.to_string(),
                                state: s
                                    .state
                                    .get(n)
                                    .copied()
                                    .unwrap_or(NodeState::Unknown)
                                    .as_str()
                                    .into(),
                                status: None,
                                error: None,
                                detail: None,
                                active: None,
                            })
                            .collect(),
                    })
                    .collect();
                Done(Ok(LstReply {
                    groups,
                    ..LstReply::default()
                }))
            }
            LstCommand::AddBatch { name } => {
                let Some(s) = self.console.session.as_mut() else {
                    return no_session();
                };
                if name.is_empty() || LstName::new(&name).is_none() {
                    return Done(Err(LstError::new(22, "batch name: 1 to 31 bytes")));
                }
                if s.batches.contains_key(&name) {
                    return Done(Err(LstError::new(17, format!("batch {name} exists"))));
                }
                let bid = LstBid(s.next_bid);
                s.next_bid += 1;
                s.batches.insert(
                    name.clone(),
                    ConsoleBatch {
                        bid,
                        tests: Vec::new(),
                    },
                );
                said(format!("batch {name} added"))
            }
            LstCommand::ListBatch => {
                let Some(s) = &self.console.session else {
                    return no_session();
                };
                let batches = s
                    .batches
                    .iter()
                    .map(|(n, b)| LstBatchInfo {
                        name: n.clone(),
                        tests: b.tests.iter().map(describe).collect(),
                    })
                    .collect();
                Done(Ok(LstReply {
                    batches,
                    ..LstReply::default()
                }))
            }
            LstCommand::AddTest {
                batch,
                loop_count,
                concurrency,
                distribute,
                from,
                to,
                stop_onerr,
                test,
            } => {
                let Some(s) = &self.console.session else {
                    return no_session();
                };
                if !s.batches.contains_key(&batch) {
                    return Done(Err(LstError::new(2, format!("no batch {batch}"))));
                }
                let (Some(clients), Some(servers)) = (s.groups.get(&from), s.groups.get(&to))
                else {
                    return Done(Err(LstError::new(2, format!("no group {from} or {to}"))));
                };
                if loop_count == Some(0)
                    || loop_count.is_some_and(|l| l < -1 || l > i64::from(u32::MAX - 1))
                {
                    return Done(Err(LstError::new(
                        22,
                        "--loop: -1 (until stopped) or 1 to 4294967294",
                    )));
                }
                let concurrency = concurrency.unwrap_or(1);
                if concurrency == 0 || concurrency > LST_MAX_CONCUR {
                    return Done(Err(LstError::new(
                        22,
                        format!("concurrency: 1 to {LST_MAX_CONCUR}"),
                    )));
                }
                if let TestSpec::Brw { size, off, .. } = test {
                    if size == 0 || size > LNET_MTU || off % 8 != 0 || off as usize >= PAGE_SIZE_4K
                    {
                        return Done(Err(LstError::new(
                            22,
                            "brw: size 1 to 1M, off a multiple of 8 below 4096",
                        )));
                    }
                }
                let (d, sp) = distribute.unwrap_or((1, 1));
                if d == 0 || sp == 0 {
                    return Done(Err(LstError::new(22, "--distribute D:S, both at least 1")));
                }
                let nservers = servers.len();
                let nodes: Vec<Nid> = servers.iter().chain(clients).copied().collect();
                let t = ConsoleTest {
                    from,
                    to,
                    spec: test,
                    concurrency,
                    loop_count,
                    distribute: (d, sp),
                    stop_onerr,
                };
                let kind = TxnKind::AddTest {
                    batch,
                    test: t,
                    nservers,
                };
                self.transaction(now, node, reg, kind, nodes)
            }
            LstCommand::Run { batch } => {
                self.batch_txn(now, node, reg, &batch, SRPC_BATCH_OPC_RUN, 0)
            }
            LstCommand::Stop { batch, force } => self.batch_txn(
                now,
                node,
                reg,
                &batch,
                SRPC_BATCH_OPC_STOP,
                u32::from(force),
            ),
            LstCommand::Query { batch } => {
                self.batch_txn(now, node, reg, &batch, SRPC_BATCH_OPC_QUERY, 0)
            }
            LstCommand::Stat { groups } => {
                let Some(s) = &self.console.session else {
                    return no_session();
                };
                let mut nodes = Vec::new();
                for g in &groups {
                    let Some(ns) = s.groups.get(g) else {
                        return Done(Err(LstError::new(2, format!("no group {g}"))));
                    };
                    nodes.extend(ns.iter().copied());
                }
                self.transaction(now, node, reg, TxnKind::Stat { groups }, nodes)
            }
            LstCommand::Ping { group } => {
                let Some(s) = &self.console.session else {
                    return no_session();
                };
                let Some(ns) = s.groups.get(&group).cloned() else {
                    return Done(Err(LstError::new(2, format!("no group {group}"))));
                };
                self.transaction(now, node, reg, TxnKind::Ping, ns)
            }
            LstCommand::Latency => {
                let l = self.latency();
                let mk = |name: &str, h: &hdrhistogram::Histogram<u64>| LstLatency {
                    test: name.into(),
                    count: h.len(),
                    p50_us: h.value_at_quantile(0.5),
                    p99_us: h.value_at_quantile(0.99),
                    p999_us: h.value_at_quantile(0.999),
                    max_us: h.max(),
                };
                let latency = [
                    mk("ping", &l.ping),
                    mk("brw read", &l.brw_read),
                    mk("brw write", &l.brw_write),
                ]
                .into_iter()
                .filter(|x| x.count > 0)
                .collect();
                Done(Ok(LstReply {
                    latency,
                    ..LstReply::default()
                }))
            }
        }
    }

    fn batch_txn(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        reg: &mut dyn Registry,
        batch: &str,
        opc: u32,
        arg: u32,
    ) -> ConsoleStart {
        let Some(s) = &self.console.session else {
            return ConsoleStart::Done(Err(LstError::new(3, "no session: run new_session first")));
        };
        let Some(b) = s.batches.get(batch) else {
            return ConsoleStart::Done(Err(LstError::new(2, format!("no batch {batch}"))));
        };
        let mut nodes: Vec<Nid> = Vec::new();
        for t in &b.tests {
            for n in s.groups.get(&t.from).into_iter().flatten() {
                if !nodes.contains(n) {
                    nodes.push(*n);
                }
            }
        }
        if nodes.is_empty() {
            return ConsoleStart::Done(Err(LstError::new(2, format!("batch {batch} has no test"))));
        }
        let bid = b.bid;
        self.transaction(now, node, reg, TxnKind::Batch { opc, bid, arg }, nodes)
    }

    /// Sends one framework RPC per node of `nodes` for `kind`.
    fn transaction(
        &mut self,
        now: Instant,
        node: &mut LnetNode,
        reg: &mut dyn Registry,
        kind: TxnKind,
        nodes: Vec<Nid>,
    ) -> ConsoleStart {
        let Some(s) = &self.console.session else {
            return ConsoleStart::Done(Err(LstError::new(3, "no session")));
        };
        let (sid, features, timeout, force) = (s.sid, s.features, s.timeout, u32::from(s.force));
        let name = LstName::new(&s.name).unwrap_or(LstName::EMPTY);
        let id = self.console.next_txn;
        self.console.next_txn += 1;
        let n = nodes.len();
        let mut txn = Txn {
            sid,
            kind,
            nodes: nodes.clone(),
            results: (0..n).map(|_| None).collect(),
            left: n,
            slots: Vec::new(),
        };
        let timeout = Duration::from_secs(u64::from(timeout));
        let active: Vec<bool> = match (&txn.kind, &self.console.session) {
            (TxnKind::AddGroup { .. }, Some(s)) => nodes
                .iter()
                .map(|n| s.state.get(n) == Some(&NodeState::Active))
                .collect(),
            _ => vec![false; n],
        };
        for (i, dst) in nodes.iter().copied().enumerate() {
            let owner = Owner::Console { op: id, node: i };
            if active[i] {
                // In our session already (another group): not made again, as
                // lstcon_sesrpc_condition skips active nodes (a kernel node counts each
                // MAKE_SESSION and one REMOVE_SESSION would not end it).
                let ok = MakeSessionReply {
                    status: 0,
                    sid,
                    timeout: 0,
                    name,
                };
                txn.results[i] = Some(Ok((ok.into(), ByteOrder::Little)));
                txn.left -= 1;
                continue;
            }
            // What to ask this node: the service, the request's body (given its reply and
            // bulk ids) and, for a client's test, the destination list it reads.
            type Make = Box<dyn FnOnce(u64, u64) -> SrpcBody>;
            let (service, make, bulk): (ServiceId, Make, _) = match &txn.kind {
                TxnKind::AddGroup { .. } => (
                    ServiceId::MakeSession,
                    Box::new(move |rpyid, _| {
                        MakeSessionRequest {
                            rpyid,
                            sid,
                            force,
                            name,
                        }
                        .into()
                    }),
                    None,
                ),
                TxnKind::EndSession | TxnKind::DelGroup { .. } => (
                    ServiceId::RemoveSession,
                    Box::new(move |rpyid, _| RemoveSessionRequest { rpyid, sid }.into()),
                    None,
                ),
                TxnKind::Ping | TxnKind::KeepAlive => (
                    ServiceId::Debug,
                    Box::new(move |rpyid, _| {
                        DebugRequest {
                            rpyid,
                            sid,
                            flags: 0,
                        }
                        .into()
                    }),
                    None,
                ),
                TxnKind::Stat { .. } => (
                    ServiceId::QueryStat,
                    Box::new(move |rpyid, _| {
                        StatRequest {
                            rpyid,
                            sid,
                            stat_type: 0,
                        }
                        .into()
                    }),
                    None,
                ),
                TxnKind::Batch { opc, bid, arg } => {
                    let (bid, arg, opc) = (*bid, *arg, *opc);
                    (
                        ServiceId::Batch,
                        Box::new(move |rpyid, _| {
                            BatchRequest {
                                rpyid,
                                sid,
                                bid,
                                opc,
                                testidx: 0,
                                arg,
                            }
                            .into()
                        }),
                        None,
                    )
                }
                TxnKind::AddTest {
                    batch,
                    test,
                    nservers,
                } if i < *nservers => {
                    // The server side: its test service for the batch (lnet_selftest posts
                    // its request buffers then: one per client unit it may serve).
                    let s = self.console.session.as_ref();
                    let bid = s
                        .and_then(|s| s.batches.get(batch))
                        .map_or(LstBid(0), |b| b.bid);
                    let nclients = (nodes.len() - nservers) as u32;
                    let params = test_params(test.spec);
                    let concur = test.concurrency;
                    let stop_onerr = test.stop_onerr;
                    (
                        ServiceId::Test,
                        Box::new(move |rpyid, _| {
                            TestRequest {
                                rpyid,
                                bulkid: 0,
                                sid,
                                bid,
                                loop_count: concur.saturating_mul(nclients.max(1)),
                                concur,
                                is_client: false,
                                stop_onerr,
                                ndest: 0,
                                params,
                            }
                            .into()
                        }),
                        None,
                    )
                }
                TxnKind::AddTest {
                    batch,
                    test,
                    nservers,
                } => {
                    let ci = i - *nservers;
                    let s = self.console.session.as_ref();
                    let bid = s
                        .and_then(|s| s.batches.get(batch))
                        .map_or(LstBid(0), |b| b.bid);
                    let dst_group: Vec<Nid> = s
                        .and_then(|s| s.groups.get(&test.to))
                        .cloned()
                        .unwrap_or_default();
                    let pick =
                        distribute(ci, dst_group.len(), test.distribute.0, test.distribute.1);
                    let ids: Vec<ProcessId> = pick
                        .iter()
                        .filter_map(|&k| dst_group.get(k))
                        .map(|&nid| ProcessId {
                            nid,
                            pid: lnd::wire::lnet::LNET_PID_LUSTRE,
                        })
                        .collect();
                    let len = dest_ids_len(ids.len(), PAGE_SIZE_4K, features).max(1);
                    let slot = match self.srpc.buffers.take(reg, len) {
                        Ok(sl) => sl,
                        Err(e) => {
                            txn.results[i] = Some(Err(RpcError::BadReply(format!(
                                "no buffer for the destination list: {e:?}"
                            ))));
                            txn.left -= 1;
                            continue;
                        }
                    };
                    txn.slots.push(slot);
                    let _ = self.srpc.buffers.with(slot, |b| {
                        emit_dest_ids(&ids, PAGE_SIZE_4K, b, ByteOrder::Little)
                    });
                    let Some(span) = self.srpc.buffers.span(slot, 0, len) else {
                        txn.left -= 1;
                        txn.results[i] = Some(Err(RpcError::Aborted));
                        continue;
                    };
                    let params = test_params(test.spec);
                    let stop_onerr = test.stop_onerr;
                    let loop_count = match test.loop_count {
                        None => u32::MAX,
                        Some(n) if n < 0 => u32::MAX,
                        Some(n) => u32::try_from(n).unwrap_or(u32::MAX - 1),
                    };
                    let (concur, ndest) = (test.concurrency, ids.len() as u32);
                    (
                        ServiceId::Test,
                        Box::new(move |rpyid, bulkid| {
                            TestRequest {
                                rpyid,
                                bulkid,
                                sid,
                                bid,
                                loop_count,
                                concur,
                                is_client: true,
                                stop_onerr,
                                ndest,
                                params,
                            }
                            .into()
                        }),
                        Some((span, BulkDir::Source)),
                    )
                }
            };
            let sent = self
                .srpc
                .call(now, node, dst, service, make, bulk, timeout, owner, None);
            if let Err(e) = sent {
                txn.results[i] = Some(Err(e));
                txn.left -= 1;
            }
        }
        if txn.left == 0 {
            let r = self.finish_txn(txn);
            return ConsoleStart::Done(r);
        }
        self.console.txns.insert(id, txn);
        ConsoleStart::Pending(id)
    }

    /// A console RPC ended.
    pub(crate) fn console_rpc_done(&mut self, done: RpcDone) {
        let Owner::Console { op, node: i } = done.owner else {
            return;
        };
        let Some(txn) = self.console.txns.get_mut(&op) else {
            return;
        };
        if let Some(slot) = txn.results.get_mut(i) {
            if slot.is_none() {
                *slot = Some(done.result);
                txn.left -= 1;
            }
        }
        if txn.left == 0 {
            if let Some(txn) = self.console.txns.remove(&op) {
                let quiet = matches!(txn.kind, TxnKind::KeepAlive);
                let r = self.finish_txn(txn);
                if !quiet {
                    self.console.done.push_back((op, r));
                }
            }
        }
    }

    /// A transaction every node of which answered or failed: its answer, and what it changes
    /// in the console's state.
    fn finish_txn(&mut self, txn: Txn) -> Result<LstReply, LstError> {
        for s in &txn.slots {
            self.srpc.buffers.give(*s);
        }
        let at_ms = 0;
        let Some(sess) = self.console.session.as_mut().filter(|s| s.sid == txn.sid) else {
            return Err(LstError::new(3, "the session ended meanwhile"));
        };
        let our_sid = sess.sid;
        let (own, own_console_rpcs) = (self.srpc.own(), self.own_stat_console_rpcs);
        let mut nodes = Vec::new();
        let mut stats = Vec::new();
        let mut failed = 0usize;
        for (nid, r) in txn.nodes.iter().zip(&txn.results) {
            let mut res = LstNodeResult {
                nid: nid.to_string(),
                state: String::new(),
                status: None,
                error: None,
                detail: None,
                active: None,
            };
            match r {
                None | Some(Err(_)) => {
                    let e = match r {
                        Some(Err(e)) => e.to_string(),
                        _ => "no answer".into(),
                    };
                    res.state = "down".into();
                    res.error = Some(e.clone());
                    failed += 1;
                    sess.state.insert(*nid, NodeState::Down);
                    if let TxnKind::Stat { .. } = txn.kind {
                        stats.push(LstNodeStat {
                            nid: nid.to_string(),
                            error: Some(e),
                            ..LstNodeStat::default()
                        });
                    }
                }
                Some(Ok((body, _))) => {
                    let mut status = super::srpc::reply_status(body);
                    // A session query is answered with whatever session the node is in
                    // (sfw_debug_session): another console's is "busy", none "unknown".
                    let foreign =
                        matches!(body, SrpcBody::DebugReply(d) if status == 0 && d.sid != our_sid);
                    if foreign {
                        status = errno::EBUSY as u32;
                    }
                    res.status = Some(status);
                    res.state = errno_name(status);
                    if status != 0 {
                        failed += 1;
                    }
                    let st = match (i32::try_from(status), &txn.kind) {
                        (Ok(0), _) => NodeState::Active,
                        (Ok(errno::EBUSY), _) => NodeState::Busy,
                        (Ok(errno::ESRCH), TxnKind::Ping | TxnKind::KeepAlive) => {
                            NodeState::Unknown
                        }
                        (Ok(errno::ESRCH), _) => NodeState::Busy,
                        _ => NodeState::Active,
                    };
                    if !matches!(txn.kind, TxnKind::EndSession) {
                        sess.state.insert(*nid, st);
                    }
                    match body {
                        SrpcBody::BatchReply(b) => res.active = Some(b.active),
                        SrpcBody::DebugReply(d) => {
                            res.detail = Some(format!(
                                "session {} of {}, {} batches",
                                d.name.to_string_lossy(),
                                d.sid.nid,
                                d.nbatch
                            ))
                        }
                        SrpcBody::MakeSessionReply(m) if status != 0 => {
                            res.detail = Some(format!(
                                "session {} of {}",
                                m.name.to_string_lossy(),
                                m.sid.nid
                            ))
                        }
                        SrpcBody::StatReply(s) if status == 0 => {
                            stats.push(LstNodeStat {
                                nid: nid.to_string(),
                                group: String::new(),
                                error: None,
                                running_ms: s.fw.running_ms,
                                active_batches: s.fw.active_batches,
                                brw_errors: s.fw.brw_errors,
                                ping_errors: s.fw.ping_errors,
                                rpc_errors: s.rpc.errors,
                                rpcs_sent: s.rpc.rpcs_sent,
                                rpcs_rcvd: s.rpc.rpcs_rcvd,
                                rpcs_dropped: s.rpc.rpcs_dropped,
                                rpcs_expired: s.rpc.rpcs_expired,
                                bulk_get: s.rpc.bulk_get,
                                bulk_put: s.rpc.bulk_put,
                                console_rpcs: if *nid == own { own_console_rpcs } else { 0 },
                                send_count: s.lnet.send_count,
                                recv_count: s.lnet.recv_count,
                                send_length: s.lnet.send_length,
                                recv_length: s.lnet.recv_length,
                            });
                        }
                        SrpcBody::StatReply(_) => stats.push(LstNodeStat {
                            nid: nid.to_string(),
                            error: Some(errno_name(status)),
                            ..LstNodeStat::default()
                        }),
                        _ => {}
                    }
                }
            }
            nodes.push(res);
        }
        let total = txn.nodes.len();
        let message = match txn.kind {
            TxnKind::AddGroup { name } => {
                sess.groups.insert(name.clone(), txn.nodes.clone());
                if failed == 0 {
                    format!("{total} node(s) added to group {name}")
                } else {
                    format!(
                        "group {name}: {} of {total} node(s) active, {failed} not",
                        total - failed
                    )
                }
            }
            TxnKind::AddTest { batch, test, .. } => {
                if failed == 0 {
                    let d = describe(&test);
                    if let Some(b) = sess.batches.get_mut(&batch) {
                        b.tests.push(test);
                    }
                    format!("test {d} added to batch {batch}")
                } else {
                    return Err(LstError::new(
                        5,
                        format!(
                            "add_test failed on {failed} of {total} node(s): {}",
                            first_failure(&nodes)
                        ),
                    ));
                }
            }
            TxnKind::Batch { opc, .. } => {
                let verb = match opc {
                    SRPC_BATCH_OPC_RUN => "started",
                    SRPC_BATCH_OPC_STOP => "stopped",
                    _ => "queried",
                };
                if failed == 0 {
                    format!("batch {verb} on {total} node(s)")
                } else {
                    format!(
                        "batch {verb} on {} of {total} node(s); {failed} failed: {}",
                        total - failed,
                        first_failure(&nodes)
                    )
                }
            }
            TxnKind::Stat { groups } => {
                // Which group each node was asked for, in order.
                let mut order = Vec::new();
                for g in &groups {
                    for n in sess.groups.get(g).into_iter().flatten() {
                        order.push((g.clone(), n.to_string()));
                    }
                }
                for (st, (g, _)) in stats.iter_mut().zip(order) {
                    st.group = g;
                }
                if failed == 0 {
                    String::new()
                } else {
                    format!("Failed to stat on {failed} node(s)")
                }
            }
            TxnKind::Ping => format!("{} of {total} node(s) answered", total - failed),
            TxnKind::KeepAlive => String::new(),
            TxnKind::DelGroup { name } => {
                sess.groups.remove(&name);
                for n in &txn.nodes {
                    sess.state.remove(n);
                }
                if failed == 0 {
                    format!("group {name} deleted; {total} node(s) left the session")
                } else {
                    format!("group {name} deleted; {failed} node(s) did not answer")
                }
            }
            TxnKind::EndSession => {
                self.console.session = None;
                if failed == 0 {
                    "session ended".to_string()
                } else {
                    format!("session ended; {failed} node(s) did not answer")
                }
            }
        };
        Ok(LstReply {
            message,
            nodes,
            stats,
            at_ms,
            ..LstReply::default()
        })
    }
}

/// The parameters a TEST request carries for `spec` (v1 brw layout: our sessions have
/// LST_FEAT_BULK_LEN).
fn test_params(spec: TestSpec) -> TestParams {
    match spec {
        TestSpec::Ping => TestParams::Ping { size: 0, flags: 0 },
        TestSpec::Brw {
            write,
            size,
            check,
            off,
        } => TestParams::BulkV1 {
            opc: if write {
                BrwOp::Write as u16
            } else {
                BrwOp::Read as u16
            },
            flags: match check {
                CheckSpec::None => BrwCheck::None as u16,
                CheckSpec::Simple => BrwCheck::Simple as u16,
                CheckSpec::Full => BrwCheck::Full as u16,
            },
            len: size,
            offset: off,
        },
    }
}

fn first_failure(nodes: &[LstNodeResult]) -> String {
    nodes
        .iter()
        .find(|n| n.state != "ok")
        .map(|n| {
            format!(
                "{} {}",
                n.nid,
                n.error.clone().unwrap_or_else(|| n.state.clone())
            )
        })
        .unwrap_or_default()
}

fn describe(t: &ConsoleTest) -> String {
    let what = match t.spec {
        TestSpec::Ping => "ping".to_string(),
        TestSpec::Brw {
            write,
            size,
            check,
            off,
        } => format!(
            "brw {} size={} check={} off={}",
            if write { "write" } else { "read" },
            size,
            match check {
                CheckSpec::None => "none",
                CheckSpec::Simple => "simple",
                CheckSpec::Full => "full",
            },
            off
        ),
    };
    format!(
        "{what} --from {} --to {} --concurrency {} --distribute {}:{} --loop {}",
        t.from,
        t.to,
        t.concurrency,
        t.distribute.0,
        t.distribute.1,
        t.loop_count.unwrap_or(-1)
    )
}
