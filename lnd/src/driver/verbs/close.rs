//! Ending connections: rdma_disconnect, destroy, and abandoning the whole fabric.

use super::*;

impl VerbsFabric {
    pub(super) fn disconnect(&mut self, conn: ConnId) {
        let Some(vc) = self.known(conn) else {
            return;
        };
        // What the engine posted before the disconnect goes first.
        self.flush(vc);
        let c = &mut self.conns[vc];
        let was = c.phase;
        c.phase = Phase::Closing;
        let r = match (was, c.id.as_mut()) {
            (Phase::Established | Phase::Accepting | Phase::Connecting, Some(id)) => {
                id.disconnect()
            }
            _ => Err(io::Error::other("not connected")),
        };
        if let Err(e) = r {
            debug!(?conn, error = %e, "verbs fabric: rdma_disconnect; reporting disconnected");
            if !c.reported_down {
                c.reported_down = true;
                let why = c.broken.unwrap_or(DisconnectReason::Closed);
                self.out.push_back(Report::Disconnected(conn, why));
            }
        }
    }

    /// The fabric failed for good and is polled no more ([`crate::driver::Driver::abandon`]):
    /// each connection is disconnected (a DREQ, so the peer learns at once rather than at its
    /// keepalive horizon: the 3FS #426 lesson) and each request not yet answered is rejected,
    /// without posting what is queued: the failed machinery is not trusted with more work.
    /// Best effort: on a dead HCA nothing leaves, and the peer's own timeouts end them. The
    /// listener is destroyed, so that a peer's later connect is refused by the CM at once (a
    /// REJ, "no listener": its sends fail ConnectRefused) instead of reaching a listener whose
    /// events nobody reads and waiting out its connect deadline, as the tcp fabric closes its
    /// listening socket. Destroying it does not wait: every event of it read was acked on the
    /// spot (`EventChannel::next_event`), and those not read are the kernel's to discard.
    pub fn abandon(&mut self) {
        drop(self.listener.take());
        for vc in self.conns.handles() {
            let c = &mut self.conns[vc];
            let was = c.phase;
            c.phase = Phase::Closing;
            let Some(id) = c.id.as_mut() else { continue };
            let r = match was {
                Phase::Established | Phase::Accepting | Phase::Connecting => id.disconnect(),
                Phase::RequestPending => id.reject(&[]),
                Phase::ResolvingAddr | Phase::ResolvingRoute | Phase::Closing => Ok(()),
            };
            if let Err(e) = r {
                debug!(error = %e, "verbs fabric: abandoning a connection");
            }
        }
    }

    pub(super) fn destroy(&mut self, conn: ConnId) {
        let Some(vc) = self.by_conn.remove(&conn) else {
            self.stats.unknown_actions += 1;
            return;
        };
        let mut c = self
            .conns
            .remove(vc)
            .expect("a mapped connection is in the table");
        // QP (releasing what its outstanding work pinned), then CQ and its channel, then the
        // cm_id, then the connection's buffers; the PD is the fabric's.
        if let Some(id) = c.id.as_mut() {
            id.destroy_qp();
        }
        let res = c.res.take();
        let bufs = res.map(|Resources { cq, chan, rx, tx }| {
            drop(cq);
            drop(chan);
            (rx, tx)
        });
        drop(c.id.take());
        drop(bufs);
        self.injected
            .retain(|_, (c, st)| *c != conn || st.is_some());
        self.out.retain(|r| r.conn() != conn);
    }
}
