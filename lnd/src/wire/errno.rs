//! The errno values ulnet puts on the wire and in its answers: Linux's numbers under Linux's
//! names, positive, whatever the host. One table for the workspace.
//!
//! How each protocol carries them:
//! - o2iblnd completion statuses (PUT_NAK, PUT_DONE, GET_DONE: `kib::Completion::status`) and
//!   the statuses LNet hands back to an LND carry them negated (kiblnd_handle_completion,
//!   kiblnd_recv: `-ENODATA`, `-EPROTO`);
//! - lnet_selftest replies carry them in their u32 status fields, positive as Lustre's
//!   srpc_* handlers fill them (`status = ESRCH`), and the console reports them so;
//! - the control protocol between `lnetctl` and the daemon carries them positive in
//!   `ControlError::errno` (and negated in the per-item results that mirror Lustre's netlink
//!   replies, as lnetctl's YAML prints them).

/// No such file or entry (a route, peer or session that is not there).
pub const ENOENT: i32 = 2;
/// No such process: lnet_selftest's "no such session" (srpc's session checks).
pub const ESRCH: i32 = 3;
pub const EIO: i32 = 5;
pub const ENOMEM: i32 = 12;
pub const EBUSY: i32 = 16;
pub const EEXIST: i32 = 17;
pub const EINVAL: i32 = 22;
/// The GET_DONE status of a GET that matched nothing (kiblnd_recv).
pub const ENODATA: i32 = 61;
/// A protocol violation: the status of a rendezvous completion that fails one message for a
/// protocol reason, a malformed control request, a selftest RPC of the wrong version.
pub const EPROTO: i32 = 71;
/// A selftest brw whose data check failed.
pub const EBADMSG: i32 = 74;
pub const EUSERS: i32 = 87;
/// A write needing more fragments than the connection allows (kiblnd_init_rdma); a control
/// request over its size cap.
pub const EMSGSIZE: i32 = 90;
pub const EPROTONOSUPPORT: i32 = 93;
pub const EOPNOTSUPP: i32 = 95;
pub const EADDRINUSE: i32 = 98;
pub const EADDRNOTAVAIL: i32 = 99;
pub const ENETDOWN: i32 = 100;
pub const ESHUTDOWN: i32 = 108;
pub const ETIMEDOUT: i32 = 110;
pub const ECONNREFUSED: i32 = 111;
pub const EHOSTUNREACH: i32 = 113;
/// A selftest batch that is already running.
pub const EALREADY: i32 = 114;

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The table is Linux's, name for name: a typo here would put a wrong status on the wire.
    #[test]
    fn values_are_linux_errnos() {
        let table = [
            ("ENOENT", super::ENOENT, libc::ENOENT),
            ("ESRCH", super::ESRCH, libc::ESRCH),
            ("EIO", super::EIO, libc::EIO),
            ("ENOMEM", super::ENOMEM, libc::ENOMEM),
            ("EBUSY", super::EBUSY, libc::EBUSY),
            ("EEXIST", super::EEXIST, libc::EEXIST),
            ("EINVAL", super::EINVAL, libc::EINVAL),
            ("ENODATA", super::ENODATA, libc::ENODATA),
            ("EPROTO", super::EPROTO, libc::EPROTO),
            ("EBADMSG", super::EBADMSG, libc::EBADMSG),
            ("EUSERS", super::EUSERS, libc::EUSERS),
            ("EMSGSIZE", super::EMSGSIZE, libc::EMSGSIZE),
            (
                "EPROTONOSUPPORT",
                super::EPROTONOSUPPORT,
                libc::EPROTONOSUPPORT,
            ),
            ("EOPNOTSUPP", super::EOPNOTSUPP, libc::EOPNOTSUPP),
            ("EADDRINUSE", super::EADDRINUSE, libc::EADDRINUSE),
            ("EADDRNOTAVAIL", super::EADDRNOTAVAIL, libc::EADDRNOTAVAIL),
            ("ENETDOWN", super::ENETDOWN, libc::ENETDOWN),
            ("ESHUTDOWN", super::ESHUTDOWN, libc::ESHUTDOWN),
            ("ETIMEDOUT", super::ETIMEDOUT, libc::ETIMEDOUT),
            ("ECONNREFUSED", super::ECONNREFUSED, libc::ECONNREFUSED),
            ("EHOSTUNREACH", super::EHOSTUNREACH, libc::EHOSTUNREACH),
            ("EALREADY", super::EALREADY, libc::EALREADY),
        ];
        for (name, ours, linux) in table {
            assert_eq!(ours, linux, "{name}");
        }
    }
}
