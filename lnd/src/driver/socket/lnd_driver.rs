//! The socket driver as an NI's loop drives it: under a socklnd engine, through the LND
//! interface ([`LndDriver`]), as every o2ib fabric driver is under an o2ib endpoint.

use super::SocketDriver;
use crate::driver::LndDriver;
use crate::sock::SockEngine;

impl LndDriver for SocketDriver {
    lnd_driver_serving!(self, SocketDriver, SockEngine, "a socket driver");
    forward_driver_methods!(self, SocketDriver, self, self);
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
    forward_driver_methods!(self, LndDriver, &mut self.driver, &self.driver, lnd);
    fn registry(&mut self) -> Option<&mut dyn crate::fabric::Registry> {
        Some(&mut self.regions)
    }
    fn sees_writes(&self) -> bool {
        true
    }
}
