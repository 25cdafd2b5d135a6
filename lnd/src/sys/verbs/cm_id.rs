//! An rdma_cm id and its queue pair: resolving, connecting, accepting, posting receives, sends
//! and RDMA writes, disconnecting.

use super::*;

impl CmId {
    pub(super) fn from_raw(raw: NonNull<sys::rdma_cm_id>) -> CmId {
        CmId { raw, qp: None }
    }

    /// A new RDMA_PS_TCP id on `ch`, whose events carry `token`.
    pub fn new(ch: &EventChannel, token: u64) -> io::Result<CmId> {
        let mut id: *mut sys::rdma_cm_id = ptr::null_mut();
        // SAFETY: live channel, valid out-pointer; the context is an opaque integer.
        check(unsafe {
            sys::rdma_create_id(
                ch.raw.as_ptr(),
                &mut id,
                token as *mut libc::c_void,
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        })?;
        let raw = NonNull::new(id).ok_or_else(|| io::Error::other("rdma_create_id gave null"))?;
        Ok(CmId::from_raw(raw))
    }

    /// Sets the token carried by this id's events.
    pub fn set_token(&mut self, token: u64) {
        // SAFETY: live id; `context` is ours to set.
        unsafe { (*self.raw.as_ptr()).context = token as *mut libc::c_void };
    }

    pub fn bind(&mut self, addr: SocketAddr) -> io::Result<()> {
        let mut ss = to_sockaddr(addr);
        // SAFETY: live id; `ss` is a valid sockaddr for the call's duration.
        check(unsafe { sys::rdma_bind_addr(self.raw.as_ptr(), ptr::addr_of_mut!(ss).cast()) })
    }

    pub fn listen(&mut self, backlog: i32) -> io::Result<()> {
        // SAFETY: live, bound id.
        check(unsafe { sys::rdma_listen(self.raw.as_ptr(), backlog) })
    }

    /// The port the id is bound to (host order).
    pub fn src_port(&self) -> u16 {
        // SAFETY: live id.
        u16::from_be(unsafe { sys::rdma_get_src_port(self.raw.as_ptr()) })
    }

    pub fn resolve_addr(&mut self, dst: SocketAddr, timeout_ms: i32) -> io::Result<()> {
        let mut ss = to_sockaddr(dst);
        // SAFETY: live id; `ss` outlives the call (librdmacm copies it).
        check(unsafe {
            sys::rdma_resolve_addr(
                self.raw.as_ptr(),
                ptr::null_mut(),
                ptr::addr_of_mut!(ss).cast(),
                timeout_ms,
            )
        })
    }

    pub fn resolve_route(&mut self, timeout_ms: i32) -> io::Result<()> {
        // SAFETY: live id with a resolved address.
        check(unsafe { sys::rdma_resolve_route(self.raw.as_ptr(), timeout_ms) })
    }

    pub(super) fn verbs(&self) -> io::Result<*mut sys::ibv_context> {
        // SAFETY: live id; `verbs` is set once the address is bound/resolved.
        let v = unsafe { self.raw.as_ref().verbs };
        if v.is_null() {
            Err(io::Error::other("cm_id has no device yet"))
        } else {
            Ok(v)
        }
    }

    /// The key of this id's device (its context), once bound or resolved; see
    /// [`DeviceList::key`].
    pub fn device_key(&self) -> Option<usize> {
        self.verbs().ok().map(|p| p as usize)
    }

    /// A protection domain on this id's device.
    pub fn alloc_pd(&self) -> io::Result<Arc<ProtectionDomain>> {
        let ctx = self.verbs()?;
        // SAFETY: `ctx` is the id's open device context (kept open by librdmacm).
        let raw = unsafe { sys::ibv_alloc_pd(ctx) };
        Ok(Arc::new(ProtectionDomain {
            raw: NonNull::new(raw).ok_or_else(last_err)?,
            _devices: None,
        }))
    }

    /// A non-blocking completion channel on this id's device.
    pub fn comp_channel(&self) -> io::Result<Arc<CompChannel>> {
        let ctx = self.verbs()?;
        // SAFETY: open device context.
        let raw = unsafe { sys::ibv_create_comp_channel(ctx) };
        let ch = CompChannel {
            raw: NonNull::new(raw).ok_or_else(last_err)?,
        };
        set_nonblocking(ch.fd())?;
        Ok(Arc::new(ch))
    }

    /// A CQ of `entries` on this id's device, notifying `channel`.
    pub fn create_cq(
        &self,
        entries: u32,
        channel: &Arc<CompChannel>,
    ) -> io::Result<Arc<CompletionQueue>> {
        let ctx = self.verbs()?;
        // SAFETY: open device context and a live channel of the same device.
        let raw = unsafe {
            sys::ibv_create_cq(
                ctx,
                entries as libc::c_int,
                ptr::null_mut(),
                channel.raw.as_ptr(),
                0,
            )
        };
        Ok(Arc::new(CompletionQueue {
            raw: NonNull::new(raw).ok_or_else(last_err)?,
            _channel: Arc::clone(channel),
        }))
    }

    /// Creates the id's RC QP (send and receive on `cq`, one SGE each); `pd` must be on the id's
    /// device. Returns the capacities created (at least those asked for).
    pub fn create_qp(
        &mut self,
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        send_wr: u32,
        recv_wr: u32,
    ) -> io::Result<QpCaps> {
        if self.qp.is_some() {
            return Err(io::Error::other("QP exists already"));
        }
        // SAFETY: plain old data, zeroes valid.
        let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.raw.as_ptr();
        attr.recv_cq = cq.raw.as_ptr();
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = send_wr;
        attr.cap.max_recv_wr = recv_wr;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        // SAFETY: live id, PD and CQ of the id's device; `attr` valid for the call.
        check(unsafe { sys::rdma_create_qp(self.raw.as_ptr(), pd.raw.as_ptr(), &mut attr) })?;
        self.qp = Some(QpDeps {
            _pd: Arc::clone(pd),
            cq: Arc::clone(cq),
            regions: Vec::new(),
            inflight: std::collections::VecDeque::new(),
            next_seq: 0,
            sges: Vec::new(),
            wrs: Vec::new(),
            raw_wcs: Vec::new(),
        });
        // rdma_create_qp writes the capacities it actually created back into `attr.cap`.
        Ok(QpCaps {
            send_wr: attr.cap.max_send_wr.max(send_wr),
            recv_wr: attr.cap.max_recv_wr.max(recv_wr),
        })
    }

    pub(super) fn qp_for(&mut self, mr: &Arc<MemoryRegion>) -> io::Result<*mut sys::ibv_qp> {
        let deps = self.qp.as_mut().ok_or_else(|| io::Error::other("no QP"))?;
        if !deps.regions.iter().any(|r| Arc::ptr_eq(r, mr)) {
            deps.regions.push(Arc::clone(mr));
        }
        // SAFETY: live id with a QP (created above, not destroyed since `qp` is Some).
        Ok(unsafe { self.raw.as_ref().qp })
    }

    /// Posts a receive of `len` bytes at `offset` of `mr`.
    pub fn post_recv(
        &mut self,
        mr: &Arc<MemoryRegion>,
        offset: usize,
        len: u32,
        wr_id: u64,
    ) -> io::Result<()> {
        if offset
            .checked_add(len as usize)
            .is_none_or(|e| e > mr.len())
        {
            return Err(io::Error::other("receive outside its region"));
        }
        if wr_id & SQ_BIT != 0 {
            return Err(io::Error::other("receive wr_id with the top bit set"));
        }
        let qp = self.qp_for(mr)?;
        let mut sge = sys::ibv_sge {
            addr: mr.addr(offset),
            length: len,
            lkey: mr.lkey(),
        };
        // SAFETY: plain old data, zeroes valid.
        let mut wr: sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
        // SAFETY: live QP; the SGE names memory of a registered region the QP keeps alive (Arc
        // pinned in `qp_for`), in bounds (checked); `wr` and `sge` live for the call.
        check(unsafe { sys::ibv_post_recv(qp, &mut wr, &mut bad) })
    }

    /// Posts a signaled IBV_WR_SEND of `len` bytes at `offset` of `mr`.
    pub fn post_send(
        &mut self,
        mr: &Arc<MemoryRegion>,
        offset: usize,
        len: u32,
        wr_id: u64,
    ) -> io::Result<()> {
        self.post_sends(&[SendWr {
            wr_id,
            mr,
            offset,
            len,
            op: SendOp::Send,
        }])
        .map_err(|e| e.error)
    }

    /// Posts `wrs` as one chain (one doorbell), every request signaled. Each must lie inside its
    /// region and its region must be on the QP's protection domain; the first that does not, and
    /// everything after it, is not posted. Each request pins its region until
    /// [`CmId::poll_cq`] returns its completion.
    pub fn post_sends(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let fail = |posted, e: io::Error| PostError { posted, error: e };
        let qp = match self.qp_ptr() {
            Ok(qp) => qp,
            Err(e) => return Err(fail(0, e)),
        };
        let deps = self.qp.as_mut().expect("qp_ptr checked");
        // Validate first: only a valid prefix is handed to the device.
        let valid = wrs
            .iter()
            .position(|w| {
                w.offset
                    .checked_add(w.len as usize)
                    .is_none_or(|e| e > w.mr.len())
                    || !Arc::ptr_eq(w.mr.pd(), &deps._pd)
            })
            .unwrap_or(wrs.len());
        let wrs_ok = &wrs[..valid];
        let mut result = Ok(());
        if !wrs_ok.is_empty() {
            deps.sges.clear();
            deps.wrs.clear();
            let first_seq = deps.next_seq;
            for (k, w) in wrs_ok.iter().enumerate() {
                deps.sges.push(sys::ibv_sge {
                    addr: w.mr.addr(w.offset),
                    length: w.len,
                    lkey: w.mr.lkey(),
                });
                // SAFETY: plain old data, zeroes valid.
                let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
                wr.wr_id = SQ_BIT | ((first_seq + k as u64) & !SQ_BIT);
                wr.num_sge = if w.len == 0 { 0 } else { 1 };
                wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
                match w.op {
                    SendOp::Send => wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND,
                    SendOp::Write { remote_addr, rkey } => {
                        wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                        wr.wr.rdma = sys::rdma_t { remote_addr, rkey };
                    }
                }
                deps.wrs.push(wr);
            }
            // Link the chain now that neither vector will move again.
            let n = deps.wrs.len();
            let sge_base = deps.sges.as_mut_ptr();
            let wr_base = deps.wrs.as_mut_ptr();
            for k in 0..n {
                // SAFETY: `k` and `k + 1` index the `n` elements just pushed (k + 1 only when
                // k + 1 < n); the vectors are not resized until the post below returns.
                unsafe {
                    let wr = &mut *wr_base.add(k);
                    wr.sg_list = sge_base.add(k);
                    wr.next = if k + 1 < n {
                        wr_base.add(k + 1)
                    } else {
                        ptr::null_mut()
                    };
                }
            }
            let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
            // SAFETY: live QP; every SGE names memory inside a region registered on the QP's PD
            // (checked above), which stays pinned in `inflight` until its completion is polled
            // or the QP is destroyed; the chain and its SGEs live until the call returns (the
            // provider copies them).
            let rc = unsafe { sys::ibv_post_send(qp, wr_base, &mut bad) };
            let posted = if rc == 0 {
                n
            } else if bad.is_null() {
                0
            } else {
                // SAFETY: on failure `bad` points into the chain we passed.
                usize::try_from(unsafe { bad.offset_from(wr_base) })
                    .unwrap_or(0)
                    .min(n)
            };
            for (k, w) in wrs_ok[..posted].iter().enumerate() {
                deps.inflight
                    .push_back((first_seq + k as u64, w.wr_id, Arc::clone(w.mr)));
            }
            deps.next_seq = first_seq + posted as u64;
            if rc != 0 {
                let e = if rc > 0 {
                    io::Error::from_raw_os_error(rc)
                } else {
                    last_err()
                };
                result = Err(fail(posted, e));
            }
        }
        result?;
        if valid < wrs.len() {
            return Err(fail(
                valid,
                io::Error::other("work request outside its region or on another PD"),
            ));
        }
        Ok(())
    }

    /// Polls up to `max` completions of this QP's CQ into `out`; returns how many. Send-queue
    /// completions carry the caller's wr_id back and release what their request pinned.
    pub fn poll_cq(&mut self, out: &mut Vec<Wc>, max: usize) -> io::Result<usize> {
        let Some(deps) = self.qp.as_mut() else {
            return Ok(0);
        };
        deps.raw_wcs.clear();
        let got = deps.cq.poll_raw(&mut deps.raw_wcs, max)?;
        for &(wr_id, status, byte_len) in &deps.raw_wcs {
            if wr_id & SQ_BIT == 0 {
                out.push(Wc {
                    wr_id,
                    status,
                    is_send: false,
                    byte_len,
                });
                continue;
            }
            let seq = wr_id & !SQ_BIT;
            // In order: anything older than `seq` completed too (all are signaled, so there is
            // none unless the provider misbehaves).
            let mut user = None;
            while let Some(&(s, u, _)) = deps.inflight.front() {
                if s > seq {
                    break;
                }
                deps.inflight.pop_front();
                if s == seq {
                    user = Some(u);
                    break;
                }
            }
            if let Some(wr_id) = user {
                out.push(Wc {
                    wr_id,
                    status,
                    is_send: true,
                    byte_len,
                });
            }
        }
        Ok(got)
    }

    /// Send-queue work requests posted and not yet completed.
    pub fn sends_outstanding(&self) -> usize {
        self.qp.as_ref().map_or(0, |d| d.inflight.len())
    }

    /// Arms the QP's CQ (see [`CompletionQueue::req_notify`]).
    pub fn req_notify(&self) -> io::Result<()> {
        match self.qp.as_ref() {
            Some(d) => d.cq.req_notify(),
            None => Ok(()),
        }
    }

    pub(super) fn qp_ptr(&self) -> io::Result<*mut sys::ibv_qp> {
        if self.qp.is_none() {
            return Err(io::Error::other("no QP"));
        }
        // SAFETY: live id with a QP (created, not destroyed since `qp` is Some).
        Ok(unsafe { self.raw.as_ref().qp })
    }

    pub(super) fn conn_param(private: &[u8], p: ConnParam) -> sys::rdma_conn_param {
        // SAFETY: plain old data, zeroes valid.
        let mut cp: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
        cp.private_data = private.as_ptr().cast();
        cp.private_data_len = private.len().min(255) as u8;
        cp.responder_resources = 0;
        cp.initiator_depth = 0;
        cp.flow_control = 1;
        cp.retry_count = p.retry_count;
        cp.rnr_retry_count = p.rnr_retry_count;
        cp
    }

    pub fn connect(&mut self, private: &[u8], p: ConnParam) -> io::Result<()> {
        let mut cp = CmId::conn_param(private, p);
        // SAFETY: live id with a resolved route and a QP; `private` outlives the call.
        check(unsafe { sys::rdma_connect(self.raw.as_ptr(), &mut cp) })
    }

    pub fn accept(&mut self, private: &[u8], p: ConnParam) -> io::Result<()> {
        let mut cp = CmId::conn_param(private, p);
        // SAFETY: live id of a connect request, with a QP; `private` outlives the call.
        check(unsafe { sys::rdma_accept(self.raw.as_ptr(), &mut cp) })
    }

    pub fn reject(&mut self, private: &[u8]) -> io::Result<()> {
        // SAFETY: live id of a connect request; `private` outlives the call.
        check(unsafe {
            sys::rdma_reject(
                self.raw.as_ptr(),
                private.as_ptr().cast(),
                private.len().min(255) as u8,
            )
        })
    }

    pub fn disconnect(&mut self) -> io::Result<()> {
        // SAFETY: live id.
        check(unsafe { sys::rdma_disconnect(self.raw.as_ptr()) })
    }

    /// Tells the CM the connection is up although its RTU has not come: a message arrived on
    /// the accepted queue pair (InfiniBand's COMM_EST). The CM then reports ESTABLISHED rather
    /// than fail the accept if the RTU is lost (o2iblnd: kiblnd_qp_event calls rdma_notify).
    pub fn notify_established(&mut self) -> io::Result<()> {
        // SAFETY: live id of an accepted connection, with a QP.
        check(unsafe {
            sys::rdma_notify(self.raw.as_ptr(), sys::ibv_event_type::IBV_EVENT_COMM_EST)
        })
    }

    /// Destroys the QP (if any), then releases what it pinned (CQ, MRs, PD references).
    pub fn destroy_qp(&mut self) {
        if self.qp.is_some() {
            // SAFETY: live id with a QP; after this no work request references any region.
            unsafe { sys::rdma_destroy_qp(self.raw.as_ptr()) };
            // Only now: the pins (regions, CQ, PD) may be the last references to them.
            self.qp = None;
        }
    }
}
