//! Memory registration for a fabric without RDMA (the socket driver under socklnd): a region is
//! the memory itself, named for LNet's books, read and written by the LND's own copies from and
//! to the stream. Nothing is pinned or published to peers: the key and address are names only.

use std::collections::HashMap;
use std::io;

use super::Registry;
use crate::mem::{RegionId, Registration, SharedMem};

/// Regions as plain shared memory (see the module documentation).
#[derive(Debug, Default)]
pub struct LocalRegistry {
    regions: HashMap<u64, Region>,
    next: u64,
}

#[derive(Debug)]
struct Region {
    mem: SharedMem,
    /// Registered by [`Registry::register`]: its bytes are given back at deregistration.
    owned: bool,
}

impl LocalRegistry {
    /// An empty registry.
    pub fn new() -> LocalRegistry {
        LocalRegistry::default()
    }

    /// Regions held now.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    fn add(&mut self, mem: SharedMem, owned: bool) -> Registration {
        self.next += 1;
        let id = self.next;
        let len = mem.len() as u64;
        self.regions.insert(id, Region { mem, owned });
        // The key and address are only names here; made distinct so that a mix-up shows.
        Registration::new(RegionId(id), id as u32, id << 32, len)
    }
}

impl Registry for LocalRegistry {
    fn register(&mut self, bytes: Vec<u8>) -> io::Result<Registration> {
        Ok(self.add(SharedMem::from_vec(bytes), true))
    }

    fn read(&self, reg: &Registration, offset: u64, out: &mut [u8]) -> bool {
        let Some(r) = self.regions.get(&reg.id().0) else {
            return false;
        };
        r.mem.with(|m| {
            let Ok(at) = usize::try_from(offset) else {
                return false;
            };
            match at.checked_add(out.len()).filter(|end| *end <= m.len()) {
                Some(end) => {
                    out.copy_from_slice(&m[at..end]);
                    true
                }
                None => false,
            }
        })
    }

    fn deregister(&mut self, reg: Registration) -> Option<Vec<u8>> {
        let r = self.regions.remove(&reg.id().0)?;
        Some(if r.owned { r.mem.to_vec() } else { Vec::new() })
    }

    fn register_shared(&mut self, mem: &SharedMem) -> io::Result<Registration> {
        Ok(self.add(mem.clone(), false))
    }

    fn shared(&self, reg: &Registration) -> Option<SharedMem> {
        self.regions.get(&reg.id().0).map(|r| r.mem.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_is_its_memory_and_comes_back_whole() {
        let mut r = LocalRegistry::new();
        let reg = r.register(vec![1, 2, 3, 4]).unwrap();
        let mut two = [0; 2];
        assert!(r.read(&reg, 2, &mut two));
        assert_eq!(two, [3, 4]);
        assert!(!r.read(&reg, 3, &mut two), "past the end");
        let mem = r.shared(&reg).unwrap();
        mem.with(|m| m[0] = 9);
        assert_eq!(r.contents(&reg).unwrap(), vec![9, 2, 3, 4]);
        assert_eq!(r.deregister(reg).unwrap(), vec![9, 2, 3, 4]);
        assert!(r.is_empty());

        let shared = SharedMem::new(8);
        let reg = r.register_shared(&shared).unwrap();
        assert!(r.shared(&reg).unwrap().same(&shared));
        assert_eq!(
            r.deregister(reg).unwrap(),
            Vec::<u8>::new(),
            "shared bytes stay"
        );
        assert!(r
            .shared(&Registration::new(RegionId(99), 0, 0, 0))
            .is_none());
    }
}
