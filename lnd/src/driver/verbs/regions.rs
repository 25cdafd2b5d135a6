//! Registered memory: ibv_reg_mr regions under their keys, and the Registry the engine uses.

use super::*;

/// Registration on the NI's device: ibv_reg_mr with LOCAL_WRITE | REMOTE_WRITE on the fabric's
/// protection domain, the bytes copied into the registered buffer. Deregistering copies the bytes
/// back out and drops the fabric's hold on the MR: later writes from it are refused, later writes
/// to its key fail at the HCA; ibv_dereg_mr happens once no posted write reads from it any more,
/// and if it fails the buffer is leaked (rather than freed while a peer may still write into it)
/// and counted ([`v::dereg_failures`]).
impl Registry for VerbsFabric {
    fn register(&mut self, bytes: Vec<u8>) -> io::Result<Registration> {
        let pd = self.pd(self.home)?;
        let mr = MemoryRegion::new(&pd, bytes.len(), true)?;
        mr.write(0, &bytes);
        Ok(self.insert_region(mr, bytes.len()))
    }

    fn register_shared(&mut self, mem: &SharedMem) -> io::Result<Registration> {
        let pd = self.pd(self.home)?;
        let mr = MemoryRegion::shared(&pd, mem, true)?;
        let len = mr.len();
        Ok(self.insert_region(mr, len))
    }

    fn read(&self, reg: &Registration, offset: u64, out: &mut [u8]) -> bool {
        let Some(r) = self.region_of(reg) else {
            return false;
        };
        let Ok(offset) = usize::try_from(offset) else {
            return false;
        };
        if offset.checked_add(out.len()).is_none_or(|e| e > r.len()) {
            return false;
        }
        r.read(offset, out);
        true
    }

    fn deregister(&mut self, reg: Registration) -> Option<Vec<u8>> {
        let bytes = self.contents(&reg);
        let found = self.regions.remove(&reg.id().0).is_some();
        if found {
            self.stats.regions_deregistered += 1;
            self.stats.regions = self.regions.len() as u64;
        }
        bytes
    }
}

impl VerbsFabric {
    /// Keeps a new memory region under the next key and counts it: its registration, `len`
    /// bytes long (an empty buffer is registered as one byte, and is still empty).
    fn insert_region(&mut self, mr: Arc<MemoryRegion>, len: usize) -> Registration {
        self.next_region += 1;
        let id = self.next_region;
        let reg = Registration::new(RegionId(id), mr.rkey(), mr.addr(0), len as u64);
        self.regions.insert(id, mr);
        self.stats.regions_registered += 1;
        self.stats.regions = self.regions.len() as u64;
        reg
    }

    pub(super) fn region_of(&self, reg: &Registration) -> Option<&Arc<MemoryRegion>> {
        self.regions.get(&reg.id().0)
    }

    /// Copies `data` into a region at `offset` (do not change a range a posted write reads).
    pub fn write_region(&self, reg: &Registration, offset: usize, data: &[u8]) -> bool {
        let Some(r) = self.region_of(reg) else {
            return false;
        };
        if offset.checked_add(data.len()).is_none_or(|e| e > r.len()) {
            return false;
        }
        r.write(offset, data);
        true
    }
}
