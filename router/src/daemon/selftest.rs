//! lnet_selftest in an NI loop ([`NiSelftest`]): its service, test client and console, and the
//! console commands still running.

use std::collections::HashMap;
use std::sync::mpsc::SyncSender;
use std::time::Duration as StdDuration;

use crate::control::{errno, ControlError, Response};
use crate::runtime::NiRuntime;
use crate::selftest::{ConsoleStart, Selftest};
use lnd::driver::LndDriver;

/// A registry for a driver that registers nothing: the selftest then answers brw with
/// ENOMEM rather than moving data.
pub(super) struct NoRegistry;

impl lnd::fabric::Registry for NoRegistry {
    fn register(&mut self, _: Vec<u8>) -> std::io::Result<lnd::fabric::Registration> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this fabric registers no memory",
        ))
    }

    fn read(&self, _: &lnd::fabric::Registration, _: u64, _: &mut [u8]) -> bool {
        false
    }

    fn deregister(&mut self, _: lnd::fabric::Registration) -> Option<Vec<u8>> {
        None
    }
}

/// The driver's memory registration, or `none`'s refusals for a driver that has none.
pub(super) fn registry<'a>(
    driver: &'a mut Box<dyn LndDriver + Send>,
    none: &'a mut NoRegistry,
) -> &'a mut dyn lnd::fabric::Registry {
    match driver.registry() {
        Some(r) => r,
        None => none,
    }
}

/// One NI loop's selftest: the service, test client and console (none unless the config
/// says `selftest: enable: 1`), and the control requests whose console command is still
/// running.
pub(super) struct NiSelftest {
    pub(super) st: Option<Selftest>,
    pub(super) pending: HashMap<u64, SyncSender<Response>>,
}

impl NiSelftest {
    /// Bounds a turn's wait by the selftest's next deadline.
    pub(super) fn bound(
        &self,
        wait: StdDuration,
        rt: &NiRuntime<Box<dyn LndDriver + Send>>,
    ) -> StdDuration {
        let Some(st) = &self.st else {
            return wait;
        };
        let now = rt.now();
        [st.poll_timeout(), st.console_timeout()]
            .into_iter()
            .flatten()
            .map(|d| StdDuration::from(d.saturating_duration_since(now)))
            .fold(wait, StdDuration::min)
    }

    /// Runs the selftest's timers that are due, and answers finished console commands.
    pub(super) fn tick(&mut self, rt: &mut NiRuntime<Box<dyn LndDriver + Send>>) {
        let Some(st) = self.st.as_mut() else {
            return;
        };
        let now = rt.now();
        let due = [st.poll_timeout(), st.console_timeout()]
            .into_iter()
            .flatten()
            .any(|d| d <= now);
        if due {
            let (node, driver) = rt.parts();
            let mut none = NoRegistry;
            let reg = registry(driver, &mut none);
            st.handle_timeout(now, node, reg);
            st.console_tick(now, node, reg);
        }
        self.answer();
    }

    /// Runs a console command: answered now, or once its transaction ends.
    pub(super) fn command(
        &mut self,
        rt: &mut NiRuntime<Box<dyn LndDriver + Send>>,
        cmd: crate::selftest::LstCommand,
        reply: SyncSender<Response>,
    ) {
        let Some(st) = self.st.as_mut() else {
            let _ = reply.try_send(Response::Error(ControlError::new(
                errno::EOPNOTSUPP,
                "lnet_selftest is not enabled on this daemon ('selftest: enable: 1' in its \
                 config, as a Lustre node loads lnet_selftest)",
            )));
            return;
        };
        let now = rt.now();
        let (node, driver) = rt.parts();
        let mut none = NoRegistry;
        let reg = registry(driver, &mut none);
        match st.console(now, node, reg, cmd) {
            ConsoleStart::Done(r) => {
                let _ = reply.try_send(lst_response(r));
            }
            ConsoleStart::Pending(id) => {
                self.pending.insert(id, reply);
            }
        }
        self.answer();
    }

    pub(super) fn answer(&mut self) {
        let Some(st) = self.st.as_mut() else {
            return;
        };
        while let Some((id, r)) = st.poll_console() {
            if let Some(reply) = self.pending.remove(&id) {
                let _ = reply.try_send(lst_response(r));
            }
        }
    }
}

pub(super) fn lst_response(
    r: Result<crate::selftest::LstReply, crate::selftest::LstError>,
) -> Response {
    match r {
        Ok(r) => Response::Selftest(r),
        Err(e) => Response::Error(ControlError::new(e.errno, e.message)),
    }
}
