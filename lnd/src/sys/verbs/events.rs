//! The connection manager's event channel: waiting for, reading and acknowledging rdma_cm events.

use super::*;

impl EventChannel {
    /// Creates a non-blocking event channel (fails with ENODEV when there is no RDMA device).
    pub fn new() -> io::Result<EventChannel> {
        // SAFETY: no arguments; a null result means failure with errno set.
        let raw = unsafe { sys::rdma_create_event_channel() };
        let raw = NonNull::new(raw).ok_or_else(last_err)?;
        let ch = EventChannel { raw };
        set_nonblocking(ch.fd())?;
        Ok(ch)
    }

    /// The descriptor to poll(2) for readability.
    pub fn fd(&self) -> RawFd {
        // SAFETY: `raw` is a live channel for as long as `self` exists.
        unsafe { self.raw.as_ref().fd }
    }

    /// The next event, without blocking (`Ok(None)` when there is none).
    pub fn next_event(&self) -> io::Result<Option<CmEvent>> {
        let mut ev: *mut sys::rdma_cm_event = ptr::null_mut();
        // SAFETY: a live channel and a valid out-pointer; the channel is non-blocking.
        let rc = unsafe { sys::rdma_get_cm_event(self.raw.as_ptr(), &mut ev) };
        if rc != 0 {
            let e = last_err();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: on success `ev` points at an event owned by librdmacm until it is acked below;
        // we only read plain fields. `param.conn` is the active union member for connection
        // events; for others its private_data is null / len 0, which we check.
        let out = unsafe {
            let e = &*ev;
            let kind = CmEventKind::from_raw(e.event);
            let private = {
                let p = e.param.conn.private_data;
                let n = usize::from(e.param.conn.private_data_len).min(64);
                if p.is_null() || n == 0 {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(p.cast::<u8>(), n).to_vec()
                }
            };
            let (token, new_id) = if kind == CmEventKind::ConnectRequest {
                let token = if e.listen_id.is_null() {
                    0
                } else {
                    (*e.listen_id).context as u64
                };
                (token, NonNull::new(e.id).map(CmId::from_raw))
            } else if e.id.is_null() {
                (0, None)
            } else {
                ((*e.id).context as u64, None)
            };
            CmEvent {
                kind,
                status: e.status,
                token,
                new_id,
                private,
            }
        };
        // SAFETY: `ev` came from rdma_get_cm_event and is acked exactly once; we copied what we
        // need. The new id of a connect request stays valid after the ack (we own it now).
        check(unsafe { sys::rdma_ack_cm_event(ev) })?;
        Ok(Some(out))
    }
}
