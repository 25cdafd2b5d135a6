//! Completion channels and queues: arming, waiting, polling work completions.

use super::*;

impl CompChannel {
    /// The descriptor to poll(2).
    pub fn fd(&self) -> RawFd {
        // SAFETY: live channel.
        unsafe { self.raw.as_ref().fd }
    }

    /// Reads and acks every pending notification (non-blocking); returns how many there were.
    pub fn drain(&self) -> usize {
        let mut n = 0;
        loop {
            let mut cq: *mut sys::ibv_cq = ptr::null_mut();
            let mut ctx: *mut libc::c_void = ptr::null_mut();
            // SAFETY: live non-blocking channel, valid out-pointers.
            let rc = unsafe { sys::ibv_get_cq_event(self.raw.as_ptr(), &mut cq, &mut ctx) };
            if rc != 0 || cq.is_null() {
                return n;
            }
            // SAFETY: `cq` is the live CQ the event is for (a CQ holds an Arc of its channel and
            // cannot have been destroyed with an un-acked event); acked exactly once.
            unsafe { sys::ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }
}

impl CompletionQueue {
    /// Arms the CQ: the channel fires at the next completion.
    pub fn req_notify(&self) -> io::Result<()> {
        // SAFETY: live CQ.
        check(unsafe { sys::ibv_req_notify_cq(self.raw.as_ptr(), 0) })
    }

    /// Polls up to `max` raw completions (`(wr_id, status, byte_len)`) into `out`; returns how
    /// many. Private: only [`CmId::poll_cq`] polls, so that it sees every send-queue completion
    /// and can release what the work request pinned.
    pub(super) fn poll_raw(&self, out: &mut Vec<(u64, u32, u32)>, max: usize) -> io::Result<usize> {
        const BATCH: usize = 32;
        // SAFETY: ibv_wc is plain old data; zeroes are valid.
        let mut wcs: [sys::ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
        let n = max.min(BATCH) as i32;
        // SAFETY: live CQ; `wcs` has room for `n` entries.
        let got = unsafe { sys::ibv_poll_cq(self.raw.as_ptr(), n, wcs.as_mut_ptr()) };
        if got < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq failed ({got})")));
        }
        let got = got as usize;
        out.extend(wcs[..got].iter().map(|w| (w.wr_id, w.status, w.byte_len)));
        Ok(got)
    }
}
