#![allow(unsafe_code)]
//! A [`SocketAddr`] as the C `sockaddr_storage` both io_uring (connect, bind) and rdma_cm
//! (resolve, bind) take.

use std::net::SocketAddr;

/// `addr` written into a zeroed `sockaddr_storage`, and the length of the `sockaddr_in` or
/// `sockaddr_in6` in it.
pub(crate) fn sockaddr_storage(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero bytes are a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is at least as large as, and aligned for, every sockaddr
            // type (that is its purpose); the pointer comes from a live local.
            unsafe {
                core::ptr::addr_of_mut!(storage)
                    .cast::<libc::sockaddr_in>()
                    .write(sin);
            }
            core::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe {
                core::ptr::addr_of_mut!(storage)
                    .cast::<libc::sockaddr_in6>()
                    .write(sin6);
            }
            core::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}
