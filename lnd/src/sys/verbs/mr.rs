//! Registered memory regions: ibv_reg_mr, and the copies in and out of a region.

use super::*;

impl MemoryRegion {
    /// Allocates `len` zeroed bytes and registers them for local write (and remote write when
    /// `remote_write`).
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        len: usize,
        remote_write: bool,
    ) -> io::Result<Arc<MemoryRegion>> {
        let len = len.max(1);
        let boxed: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        let buf = NonNull::new(Box::into_raw(boxed).cast::<u8>()).expect("Box is non-null");
        // SAFETY: `buf` points at `len` bytes we own until drop (after dereg).
        match unsafe { reg_mr(pd, buf, len, remote_write) } {
            Ok(mr) => Ok(Arc::new(MemoryRegion {
                mr,
                buf,
                len,
                copying: std::sync::atomic::AtomicBool::new(false),
                _pd: Arc::clone(pd),
                shared: None,
            })),
            Err(e) => {
                // SAFETY: re-creates the Box leaked above, exactly once.
                drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(buf.as_ptr(), len)) });
                Err(e)
            }
        }
    }

    /// Registers memory that other fabrics register too (a router's large buffers): the bytes
    /// stay `mem`'s, which this region keeps alive until it is deregistered. `mem` never
    /// reallocates (it hands out slices, never its vector), so its address is stable.
    pub fn shared(
        pd: &Arc<ProtectionDomain>,
        mem: &crate::fabric::SharedMem,
        remote_write: bool,
    ) -> io::Result<Arc<MemoryRegion>> {
        let (ptr, len) = mem.with(|b| (b.as_mut_ptr(), b.len()));
        let Some(buf) = NonNull::new(ptr).filter(|_| len > 0) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot register empty memory",
            ));
        };
        // SAFETY: `buf` points at `len` bytes that `mem` owns and keeps in place for as long as
        // the clone of it stored below lives, which is until after ibv_dereg_mr.
        let mr = unsafe { reg_mr(pd, buf, len, remote_write) }?;
        Ok(Arc::new(MemoryRegion {
            mr,
            buf,
            len,
            copying: std::sync::atomic::AtomicBool::new(false),
            _pd: Arc::clone(pd),
            shared: Some(mem.clone()),
        }))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The protection domain the region is registered on.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self._pd
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { self.mr.as_ref().lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { self.mr.as_ref().rkey }
    }

    /// The address of byte `offset` (for SGEs and remote descriptors).
    pub fn addr(&self, offset: usize) -> u64 {
        self.buf.as_ptr() as u64 + offset as u64
    }

    /// Runs `f` with the region's copy flag held (see the `copying` field).
    pub(super) fn exclusive<R>(&self, f: impl FnOnce() -> R) -> R {
        use std::sync::atomic::Ordering;
        while self
            .copying
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        let r = f();
        self.copying.store(false, Ordering::Release);
        r
    }

    /// Copies `out.len()` bytes at `offset` out (the range must not be posted for receive).
    /// Panics if out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset.checked_add(out.len()).is_some_and(|e| e <= self.len));
        if let Some(mem) = &self.shared {
            // Other fabrics copy under the memory's own lock: take that one.
            return mem.with(|b| out.copy_from_slice(&b[offset..offset + out.len()]));
        }
        self.exclusive(|| {
            // SAFETY: in bounds (checked above); a raw byte copy with the copy flag held, so no
            // other thread copies into these bytes meanwhile (see `Sync`).
            unsafe {
                ptr::copy_nonoverlapping(self.buf.as_ptr().add(offset), out.as_mut_ptr(), out.len())
            }
        });
    }

    /// Copies `data` in at `offset` (the range must not be posted for send). Panics if out of
    /// bounds.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset
            .checked_add(data.len())
            .is_some_and(|e| e <= self.len));
        if let Some(mem) = &self.shared {
            return mem.with(|b| b[offset..offset + data.len()].copy_from_slice(data));
        }
        self.exclusive(|| {
            // SAFETY: in bounds (checked above); a raw byte copy into memory we own, with the
            // copy flag held, so no other thread reads or writes these bytes meanwhile.
            unsafe {
                ptr::copy_nonoverlapping(data.as_ptr(), self.buf.as_ptr().add(offset), data.len())
            }
        });
    }
}
