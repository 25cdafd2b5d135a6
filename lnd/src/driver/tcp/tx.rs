//! The send side: message frames and RDMA writes queued into the two alternating write buffers,
//! and what runs when their bytes are written (markers: completions, established, close).

use super::*;

impl TcpFabric {
    /// Queues a MSG frame; gives `bytes` back unless they wait in the backlog.
    pub(super) fn send(&mut self, conn: ConnId, wr: WrId, bytes: Vec<u8>) -> Option<Vec<u8>> {
        let Some(sock) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return Some(bytes);
        };
        if bytes.is_empty() || bytes.len() > MSG_SIZE {
            self.stats.bad_sends += 1;
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Error));
            return Some(bytes);
        }
        let s = &mut self.socks[sock];
        if !s.can_post() {
            self.out
                .push_back(Report::SendDone(conn, wr, WcStatus::Flushed));
            return Some(bytes);
        }
        if !s.backlog.is_empty() || s.faulted {
            s.backlog.push_back(Tx::Msg(wr, bytes));
            return None;
        }
        s.queue_frame(FrameKind::Msg, &bytes, Some(Done::Send(wr)));
        self.stats.msgs_tx += 1;
        self.defer_send(sock);
        Some(bytes)
    }

    pub(super) fn write(&mut self, conn: ConnId, w: TxWrite) {
        let Some(sock) = self.lookup(conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let s = &mut self.socks[sock];
        if !s.can_post() {
            self.out
                .push_back(Report::SendDone(conn, w.wr, WcStatus::Flushed));
            return;
        }
        s.backlog.push_back(Tx::Write(w));
        self.defer_send(sock);
    }

    /// Copies backlogged work into the write buffer, in order, until it holds `WQ_FILL` bytes:
    /// messages whole, writes a frame of at most `WRITE_CHUNK` data bytes at a time. A write whose
    /// local side is not (or no longer) inside a registered region becomes a `Done::Fault`.
    pub(super) fn fill(&mut self, sock: SockId) {
        let s = &mut self.socks[sock];
        while !s.faulted && s.wq.len() < WQ_FILL {
            let Some(front) = s.backlog.front_mut() else {
                break;
            };
            match front {
                Tx::Msg(..) => {
                    let Some(Tx::Msg(wr, bytes)) = s.backlog.pop_front() else {
                        unreachable!("front is a message")
                    };
                    s.queue_frame(FrameKind::Msg, &bytes, Some(Done::Send(wr)));
                    self.stats.msgs_tx += 1;
                    self.spare.push(bytes);
                }
                Tx::Disconnect => {
                    s.backlog.pop_front();
                    s.queue_frame(FrameKind::Disconnect, &[], Some(Done::ShutWr));
                }
                Tx::Write(w) => {
                    // A malformed write, or one with a local fragment outside its region, is
                    // refused before its first frame (nothing of it is sent); the current piece
                    // is checked again each frame, in case its region went away.
                    let regions = &mut self.regions;
                    let keys = self.keys;
                    let region_len = |regions: &HashMap<u32, Region>, id: RegionId| {
                        regions
                            .get(&keys.key(id.0))
                            .filter(|r| r.id == id.0)
                            .map(Region::len)
                    };
                    let whole_ok = w.len.is_some()
                        && (w.sent > 0
                            || w.local.iter().all(|f| {
                                region_len(regions, f.region).is_some_and(|len| {
                                    span(len, f.offset, u64::from(f.len)).is_some()
                                })
                            }));
                    let next = whole_ok
                        .then(|| rdma_pieces(&w.local, &w.remote).nth(w.piece))
                        .flatten()
                        .and_then(|p| {
                            let n = u64::from(p.len - w.piece_sent).min(WRITE_CHUNK as u64);
                            let off = p.offset.checked_add(u64::from(w.piece_sent))?;
                            let range = span(region_len(regions, p.region)?, off, n)?;
                            Some((p, range))
                        });
                    let Some((p, range)) = next else {
                        let wr = w.wr;
                        s.backlog.pop_front();
                        s.faulted = true;
                        s.markers.push_back((s.queued, Done::Fault(wr)));
                        self.stats.rdma_local_errors += 1;
                        debug!(
                            ?sock,
                            ?wr,
                            "tcp fabric: RDMA write malformed or outside the local region"
                        );
                        enlist(&mut s.in_ready, &mut self.ready, sock);
                        break;
                    };
                    let at = p.addr.wrapping_add(u64::from(w.piece_sent));
                    let n = range.len();
                    frame::push_write_head(&mut s.wq, p.key, at, n);
                    let wq = &mut s.wq;
                    if let Some(r) = regions.get_mut(&keys.key(p.region.0)) {
                        r.with(|b| wq.extend_from_slice(&b[range]));
                    }
                    s.queued += (HEAD_LEN + WRITE_HEAD_LEN + n) as u64;
                    w.sent += n as u32;
                    w.piece_sent += n as u32;
                    if w.piece_sent == p.len {
                        w.piece += 1;
                        w.piece_sent = 0;
                    }
                    if Some(w.sent) == w.len {
                        let (wr, len) = (w.wr, w.sent);
                        s.backlog.pop_front();
                        s.markers.push_back((s.queued, Done::Write(wr, len)));
                    }
                }
            }
        }
    }

    pub(super) fn on_send(
        &mut self,
        sock: SockId,
        res: i32,
        buf: Option<Vec<u8>>,
        sink: &mut dyn FabricSink,
        now: Instant,
    ) {
        let Some(mut buf) = buf else {
            return;
        };
        let s = &mut self.socks[sock];
        if s.shut || s.tx_dead {
            buf.clear();
            s.spare = Some(buf);
            return;
        }
        if res <= 0 {
            buf.clear();
            s.spare = Some(buf);
            let errno = -res;
            if errno == libc::ECANCELED {
                return;
            }
            let status = self.count_errno(errno);
            debug!(errno, "tcp fabric: send failed");
            return self.broken(
                sock,
                status,
                (ConnectFailure::Unreachable, TRANSPORT),
                sink,
                now,
            );
        }
        let n = res as usize;
        self.stats.bytes_tx += n as u64;
        s.written += n as u64;
        s.w_off += n;
        if s.w_off < buf.len() {
            // Short write: the rest of the same buffer.
            let t = tag(OpTag::Send, sock);
            if let Some(stream) = &s.stream {
                let off = s.w_off;
                self.ring.send(stream.as_fd(), buf, off, t);
                s.ops += 1;
                s.send_armed = true;
            }
        } else {
            buf.clear();
            s.spare = Some(buf);
            s.w_off = 0;
        }
        self.run_markers(sock, sink, now);
        self.arm_send(sock);
    }

    /// Acts on every marker whose bytes are all written.
    pub(super) fn run_markers(&mut self, sock: SockId, sink: &mut dyn FabricSink, now: Instant) {
        loop {
            let Some(s) = self.socks.get_mut(sock) else {
                return;
            };
            let Some(&(pos, done)) = s.markers.front() else {
                return;
            };
            if pos > s.written {
                return;
            }
            if let Done::Fault(_) = done {
                // Completes `Error` (first in the queue now), the rest flushes.
                return self.broken(
                    sock,
                    WcStatus::Error,
                    (ConnectFailure::Error, TRANSPORT),
                    sink,
                    now,
                );
            }
            s.markers.pop_front();
            let conn = s.live_conn();
            match done {
                Done::Send(wr) => {
                    if let Some(c) = conn {
                        complete_wr(&mut self.wc_log, sink, now, c, wr, WcStatus::Success);
                    }
                }
                Done::Write(wr, len) => {
                    self.stats.rdma_writes_tx += 1;
                    self.stats.rdma_bytes_tx += u64::from(len);
                    if let Some(c) = conn {
                        complete_wr(&mut self.wc_log, sink, now, c, wr, WcStatus::Success);
                    }
                }
                Done::Fault(_) => unreachable!("handled above"),
                Done::Established => {
                    s.established = true;
                    self.stats.established += 1;
                    if let Some(c) = conn {
                        sink.handle_established(now, c, &[]);
                    }
                }
                Done::ShutWr => {
                    if let Some(st) = &s.stream {
                        let _ = st.shutdown(Shutdown::Write);
                    }
                }
                Done::RejectSent => self.shut(sock),
            }
        }
    }
}
