//! Registered memory: regions keyed by an unpredictable rkey, what the peer may write into.

use super::*;

impl TcpFabric {
    /// Keeps a new region of `len` bytes (`bytes`, or `shared` memory) under the next number's
    /// key, at the next address with a page of room after it: its registration.
    fn insert_region(
        &mut self,
        len: usize,
        bytes: Vec<u8>,
        shared: Option<SharedMem>,
    ) -> Registration {
        self.next_region = self.next_region.wrapping_add(1);
        let id = self.next_region;
        let key = self.keys.key(id);
        let addr = self.next_region_addr;
        let len = len as u64;
        let pages = len.div_ceil(PAGE) + 1;
        self.next_region_addr = self.next_region_addr.wrapping_add(pages * PAGE);
        self.regions.insert(
            key,
            Region {
                id,
                addr,
                bytes,
                shared,
            },
        );
        Registration::new(RegionId(id), key, addr, len)
    }

    /// The contents of region `id`, to fill a write's source. A region must not change while a
    /// write from it (or a peer's write into it) is in progress. `None` for shared memory
    /// (reach it through its [`SharedMem`]).
    pub fn region_mut(&mut self, reg: &Registration) -> Option<&mut [u8]> {
        let id = reg.id();
        self.regions
            .get_mut(&self.keys.key(id.0))
            .filter(|r| r.id == id.0 && r.shared.is_none())
            .map(|r| &mut r.bytes[..])
    }

    /// Test hook: raw bytes on a connection's stream, after what is queued (garbage frames).
    #[cfg(test)]
    pub(super) fn inject_raw(&mut self, conn: ConnId, bytes: &[u8]) {
        let sock = self.lookup(conn).expect("a known connection");
        let s = &mut self.socks[sock];
        s.wq.extend_from_slice(bytes);
        s.queued += bytes.len() as u64;
        self.arm_send(sock);
    }

    pub(super) fn region_ref(&self, id: RegionId) -> Option<&Region> {
        self.regions
            .get(&self.keys.key(id.0))
            .filter(|r| r.id == id.0)
    }

    /// The contents of a region (no copy; [`Registry::read`] copies). `None` for shared memory.
    pub fn region(&self, reg: &Registration) -> Option<&[u8]> {
        self.region_ref(reg.id())
            .filter(|r| r.shared.is_none())
            .map(|r| &r.bytes[..])
    }
}

/// The tcp fabric's ibv_reg_mr: a region is a buffer in a table keyed by its remote key.
/// Keys are a secret per-instance permutation of region numbers (`RegionKeys`), unique within
/// the fabric for 2^32 registrations, so a key of a deregistered region does not match a new
/// one, and a peer cannot compute a region's key from the keys it was shown (a router's
/// buffers serve many peers); addresses never repeat. A region lives until it is deregistered or
/// the fabric is dropped. Deregistering never fails: later writes into it are refused by this
/// fabric (the writer's connection is closed), a write from it that has not been copied out yet
/// fails like a write outside the local region.
impl Registry for TcpFabric {
    fn register(&mut self, bytes: Vec<u8>) -> io::Result<Registration> {
        let len = bytes.len();
        Ok(self.insert_region(len, bytes, None))
    }

    fn register_shared(&mut self, mem: &SharedMem) -> io::Result<Registration> {
        Ok(self.insert_region(mem.len(), Vec::new(), Some(mem.clone())))
    }

    fn read(&self, reg: &Registration, offset: u64, out: &mut [u8]) -> bool {
        let Some(r) = self.region_ref(reg.id()) else {
            return false;
        };
        let copy = |b: &mut [u8]| match span(b.len(), offset, out.len() as u64) {
            Some(range) => {
                out.copy_from_slice(&b[range]);
                true
            }
            None => false,
        };
        match &r.shared {
            Some(m) => m.with(copy),
            None => span(r.bytes.len(), offset, out.len() as u64)
                .map(|range| out.copy_from_slice(&r.bytes[range]))
                .is_some(),
        }
    }

    fn deregister(&mut self, reg: Registration) -> Option<Vec<u8>> {
        self.region_ref(reg.id())?;
        self.regions.remove(&reg.key()).map(|r| r.bytes)
    }
}

#[cfg(test)]
mod key_tests {
    use super::*;

    /// Keys are a permutation (no two region numbers share one) and unrelated between
    /// instances and between neighbours: no constant step, no shared key for the same number.
    #[test]
    fn region_keys_are_distinct_and_unpredictable() {
        let (a, b) = (RegionKeys::new(), RegionKeys::new());
        let ka: Vec<u32> = (1000..3000).map(|i| a.key(i)).collect();
        let mut sorted = ka.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ka.len(), "distinct numbers, distinct keys");
        let steps: std::collections::HashSet<u32> =
            ka.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        assert!(
            steps.len() > 1900,
            "no arithmetic progression: {} steps",
            steps.len()
        );
        let same = (1000..3000).filter(|&i| a.key(i) == b.key(i)).count();
        assert!(same < 5, "two instances agree on {same} keys");
        // Not the identity, nor the previous fixed multiplier.
        assert!((1000..3000).filter(|&i| a.key(i) == i as u32).count() < 5);
        let old = (1000..3000u64)
            .filter(|&i| a.key(i) == (i as u32).wrapping_mul(0x9e37_79b1))
            .count();
        assert!(old < 5);
    }
}
