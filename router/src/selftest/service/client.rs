//! The selftest client side: the tests this node runs against servers as a console asked
//! (lnet_selftest's sfw_run_batch and sfw_test_unit_done: each test's units sent at the
//! concurrency given, their replies checked and counted, the results for `lst stat`).

use super::*;

impl Selftest {
    pub(super) fn start_test(&mut self, now: Instant, node: &mut LnetNode, key: u64) {
        let Some(t) = self.tests.get_mut(&key) else {
            return;
        };
        t.running = true;
        let lc = t.loop_count;
        for u in &mut t.units {
            u.left = lc;
        }
        for i in 0..t.units.len() {
            self.unit_next(now, node, key, i);
        }
    }

    /// Sends unit `i`'s next RPC if its test runs and it has loops left.
    pub(super) fn unit_next(&mut self, now: Instant, node: &mut LnetNode, key: u64, i: usize) {
        let Some(t) = self.tests.get_mut(&key) else {
            return;
        };
        let (kind, features) = (t.kind, t.features);
        let Some(u) = t.units.get_mut(i) else {
            return;
        };
        if !t.running || u.rpc.is_some() || u.left == Some(0) {
            if t.running && t.units.iter().all(|u| u.rpc.is_none() && u.left == Some(0)) {
                t.running = false;
            }
            return;
        }
        if let Some(l) = u.left.as_mut() {
            *l -= 1;
        }
        let dest = u.dest;
        let slot = u.slot;
        let owner = Owner::Unit { test: key, unit: i };
        let sent = match kind {
            TestKind::Ping => {
                self.ping_seq = self.ping_seq.wrapping_add(1);
                let seq = self.ping_seq;
                let ns = now.as_nanos();
                self.srpc.call(
                    now,
                    node,
                    dest,
                    ServiceId::Ping,
                    |rpyid, _| {
                        PingRequest {
                            rpyid,
                            magic: LST_PING_TEST_MAGIC,
                            seq,
                            time_sec: ns / 1_000_000_000,
                            time_nsec: ns % 1_000_000_000,
                        }
                        .into()
                    },
                    None,
                    TEST_RPC_TIMEOUT,
                    owner,
                    Some(features),
                )
            }
            TestKind::Brw {
                op,
                check,
                len,
                off,
            } => {
                let Some(slot) = slot else { return };
                let Some(span) = self.srpc.buffers.span(slot, off as usize, len as usize) else {
                    return;
                };
                let (magic, dir) = match op {
                    BrwOp::Write => (BRW_MAGIC, BulkDir::Source),
                    BrwOp::Read => (BRW_POISON, BulkDir::Sink),
                };
                if check != BrwCheck::None && check != BrwCheck::Discard {
                    let r = off as usize..(off + len) as usize;
                    let _ = self.srpc.buffers.with(slot, |b| {
                        pattern::fill(
                            &mut b[r],
                            off as usize,
                            PAGE_SIZE_4K,
                            check,
                            magic,
                            ByteOrder::Little,
                        )
                    });
                }
                // Bytes in either layout (a v0 test's length is whole pages already).
                let wire_len = len;
                self.srpc.call(
                    now,
                    node,
                    dest,
                    ServiceId::Brw,
                    |rpyid, bulkid| {
                        BrwRequest {
                            rpyid,
                            bulkid,
                            rw: op as u32,
                            len: wire_len,
                            flags: check as u32,
                        }
                        .into()
                    },
                    Some((span, dir)),
                    TEST_RPC_TIMEOUT,
                    owner,
                    Some(features),
                )
            }
        };
        let Some(t) = self.tests.get_mut(&key) else {
            return;
        };
        match sent {
            Ok(rpyid) => {
                if let Some(u) = t.units.get_mut(i) {
                    u.rpc = Some(rpyid);
                }
            }
            Err(e) => {
                tracing::debug!(%dest, %e, "selftest RPC not sent");
                t.errors += 1;
                match kind {
                    TestKind::Ping => self.ping_errors += 1,
                    TestKind::Brw { .. } => self.brw_errors += 1,
                }
                // A unit that cannot send stops (no busy loop against a missing route).
                if let Some(u) = t.units.get_mut(i) {
                    u.left = Some(0);
                }
                if t.units.iter().all(|u| u.rpc.is_none() && u.left == Some(0)) {
                    t.running = false;
                }
            }
        }
    }

    pub(super) fn unit_done(
        &mut self,
        now: Instant,
        reg: &mut dyn Registry,
        key: u64,
        i: usize,
        done: RpcDone,
    ) {
        let Some(t) = self.tests.get_mut(&key) else {
            return;
        };
        if let Some(u) = t.units.get_mut(i) {
            u.rpc = None;
        }
        if t.dead {
            self.reap(key);
            self.trim_if_idle(reg);
            return;
        }
        let kind = t.kind;
        let ok = match &done.result {
            Err(e) => {
                tracing::debug!(dst = %done.dst, %e, "selftest RPC failed");
                false
            }
            Ok((body, order)) => match (kind, body) {
                (TestKind::Ping, SrpcBody::PingReply(p)) => {
                    p.status == 0 && p.magic == LST_PING_TEST_MAGIC
                }
                (
                    TestKind::Brw {
                        op,
                        check,
                        len,
                        off,
                    },
                    SrpcBody::BrwReply(b),
                ) => {
                    b.status == 0
                        && (op == BrwOp::Write || {
                            let slot = t.units.get(i).and_then(|u| u.slot);
                            let r = off as usize..(off + len) as usize;
                            done.bulk_len == len
                                && slot.is_some_and(|s| {
                                    matches!(
                                        self.srpc.buffers.with(s, |b| pattern::check(
                                            &b[r],
                                            off as usize,
                                            PAGE_SIZE_4K,
                                            check,
                                            BRW_MAGIC,
                                            *order
                                        )),
                                        Some(Ok(()))
                                    )
                                })
                        })
                }
                _ => false,
            },
        };
        let Some(t) = self.tests.get_mut(&key) else {
            return;
        };
        if ok {
            let us = now.saturating_duration_since(done.started).as_micros();
            self.latency.record(kind, us);
        } else {
            t.errors += 1;
            match kind {
                TestKind::Ping => self.ping_errors += 1,
                TestKind::Brw { .. } => self.brw_errors += 1,
            }
            if t.stop_onerr {
                if let Some(u) = t.units.get_mut(i) {
                    u.left = Some(0);
                }
            }
        }
        self.next_units.push((key, i));
    }
}
