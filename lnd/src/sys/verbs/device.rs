//! The RDMA devices librdmacm knows: their contexts, names and limits.

use super::*;

impl DeviceList {
    /// The devices librdmacm sees (an empty list when there are none).
    pub fn new() -> io::Result<Arc<DeviceList>> {
        let mut n: libc::c_int = 0;
        // SAFETY: valid out-pointer; a null result means failure (errno set) or no devices.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        let list = NonNull::new(list).ok_or_else(|| {
            let e = last_err();
            if e.raw_os_error().unwrap_or(0) == 0 {
                io::Error::from_raw_os_error(libc::ENODEV)
            } else {
                e
            }
        })?;
        Ok(Arc::new(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        }))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn ctx(&self, i: usize) -> Option<*mut sys::ibv_context> {
        if i >= self.len {
            return None;
        }
        // SAFETY: `i` is within the `len` entries rdma_get_devices returned.
        let p = unsafe { *self.list.as_ptr().add(i) };
        (!p.is_null()).then_some(p)
    }

    /// The key of device `i` (compare with [`CmId::device_key`]).
    pub fn key(&self, i: usize) -> Option<usize> {
        self.ctx(i).map(|p| p as usize)
    }

    /// The index of the device whose key is `key`.
    pub fn index_of(&self, key: usize) -> Option<usize> {
        (0..self.len).find(|&i| self.key(i) == Some(key))
    }

    /// The name of device `i` (e.g. `rxe0`).
    pub fn name(&self, i: usize) -> Option<String> {
        let ctx = self.ctx(i)?;
        // SAFETY: a live context; `device` is set by ibv_open_device and the name is a
        // NUL-terminated string inside it.
        let p = unsafe { sys::ibv_get_device_name((*ctx).device) };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null NUL-terminated string owned by the device.
        Some(
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// The limits of device `i`.
    pub fn limits(&self, i: usize) -> io::Result<DeviceLimits> {
        let ctx = self
            .ctx(i)
            .ok_or_else(|| io::Error::other("no such device"))?;
        // SAFETY: plain old data, zeroes valid.
        let mut a: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-pointer.
        check(unsafe { sys::ibv_query_device(ctx, &mut a) })?;
        let u = |v: libc::c_int| u32::try_from(v).unwrap_or(0);
        Ok(DeviceLimits {
            max_qp_wr: u(a.max_qp_wr),
            max_cqe: u(a.max_cqe),
            max_sge: u(a.max_sge),
            max_mr_size: a.max_mr_size,
        })
    }

    /// A protection domain on device `i`; it keeps the list (and so the context) alive.
    pub fn alloc_pd(self: &Arc<Self>, i: usize) -> io::Result<Arc<ProtectionDomain>> {
        let ctx = self
            .ctx(i)
            .ok_or_else(|| io::Error::other("no such device"))?;
        // SAFETY: a live context of the list, which the PD keeps alive.
        let raw = unsafe { sys::ibv_alloc_pd(ctx) };
        Ok(Arc::new(ProtectionDomain {
            raw: NonNull::new(raw).ok_or_else(last_err)?,
            _devices: Some(Arc::clone(self)),
        }))
    }
}
