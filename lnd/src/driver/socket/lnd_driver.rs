//! The socket driver as an NI's loop drives it: under a socklnd engine, through the LND
//! interface ([`LndDriver`]), as every o2ib fabric driver is under an o2ib endpoint.

use std::io;
use std::os::fd::RawFd;

use super::SocketDriver;
use crate::driver::{Doorbell, LndDriver};
use crate::iface::Lnd;
use crate::sock::SockEngine;
use crate::time::Instant;

/// The error of a socket driver handed an LND that is not a socklnd engine.
fn wrong_lnd(name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("a socket driver under a {name} LND"),
    )
}

impl LndDriver for SocketDriver {
    fn apply_from(&mut self, now: Instant, lnd: &mut dyn Lnd) {
        if let Some(engine) = lnd.as_any_mut().downcast_mut::<SockEngine>() {
            while let Some(a) = engine.poll_action() {
                self.apply(now, a);
            }
        }
    }

    fn poll_into(
        &mut self,
        timeout: Option<std::time::Duration>,
        lnd: &mut dyn Lnd,
        now: &dyn Fn() -> Instant,
    ) -> io::Result<()> {
        let name = lnd.name();
        match lnd.as_any_mut().downcast_mut::<SockEngine>() {
            Some(engine) => self.poll(timeout, engine, now),
            None => Err(wrong_lnd(name)),
        }
    }

    fn set_waker(&mut self, fd: RawFd) {
        SocketDriver::set_waker(self, fd)
    }
    fn set_doorbell(&mut self, bell: Doorbell) {
        SocketDriver::set_doorbell(self, bell)
    }
    fn readiness_fd(&self) -> Option<RawFd> {
        SocketDriver::readiness_fd(self)
    }
    fn watch(&mut self, fd: RawFd) -> bool {
        SocketDriver::watch(self, fd)
    }
    fn has_queued_work(&self) -> bool {
        SocketDriver::has_queued_work(self)
    }
    fn take_woken(&mut self) -> bool {
        SocketDriver::take_woken(self)
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        SocketDriver::counters(self)
    }
    fn abandon(&mut self) {
        SocketDriver::abandon(self)
    }
    /// Nothing to register: a stream reads and writes LNet's memory itself.
    fn registry(&mut self) -> Option<&mut dyn crate::fabric::Registry> {
        None
    }
    /// Every byte of a payload is read by the driver: a short one is seen.
    fn sees_writes(&self) -> bool {
        true
    }
}

/// What a socklnd NI's loop drives: the socket driver and the registry of the memory LNet lends
/// the LND (router buffers, selftest buffers), which here is plain shared memory: the LND reads
/// and writes it itself, nothing is registered with a device.
pub struct SockFabric {
    pub driver: SocketDriver,
    pub regions: crate::fabric::local::LocalRegistry,
}

impl SockFabric {
    /// `driver` with an empty registry.
    pub fn new(driver: SocketDriver) -> SockFabric {
        SockFabric {
            driver,
            regions: crate::fabric::local::LocalRegistry::new(),
        }
    }
}

impl LndDriver for SockFabric {
    fn apply_from(&mut self, now: Instant, lnd: &mut dyn Lnd) {
        self.driver.apply_from(now, lnd)
    }
    fn poll_into(
        &mut self,
        timeout: Option<std::time::Duration>,
        lnd: &mut dyn Lnd,
        now: &dyn Fn() -> Instant,
    ) -> io::Result<()> {
        self.driver.poll_into(timeout, lnd, now)
    }
    fn set_waker(&mut self, fd: RawFd) {
        LndDriver::set_waker(&mut self.driver, fd)
    }
    fn set_doorbell(&mut self, bell: Doorbell) {
        LndDriver::set_doorbell(&mut self.driver, bell)
    }
    fn readiness_fd(&self) -> Option<RawFd> {
        LndDriver::readiness_fd(&self.driver)
    }
    fn watch(&mut self, fd: RawFd) -> bool {
        LndDriver::watch(&mut self.driver, fd)
    }
    fn has_queued_work(&self) -> bool {
        LndDriver::has_queued_work(&self.driver)
    }
    fn take_woken(&mut self) -> bool {
        LndDriver::take_woken(&mut self.driver)
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        LndDriver::counters(&self.driver)
    }
    fn abandon(&mut self) {
        LndDriver::abandon(&mut self.driver)
    }
    fn registry(&mut self) -> Option<&mut dyn crate::fabric::Registry> {
        Some(&mut self.regions)
    }
    fn sees_writes(&self) -> bool {
        true
    }
}
