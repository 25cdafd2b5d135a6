//! Memory LNet lends to its LNDs for bulk payloads: a region registered with a fabric
//! ([`Registration`], named locally by its [`RegionId`]), and memory several fabrics share
//! ([`SharedMem`]: a router's large buffers). Below both the LND interface (`crate::iface`) and
//! the fabric boundary (`crate::fabric`), which re-exports these types; depends on nothing.

/// A local buffer registered with the fabric for RDMA (an LNet MD's pages, or a bounce buffer):
/// the source of an [`FabricAction::RdmaWrite`](crate::fabric::FabricAction::RdmaWrite), or, advertised to the peer as a key and an
/// address (`RemoteRegion`), the sink of the peer's writes. The fabric's local name for a
/// [`Registration`], which owns the registration.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u64);

/// What a peer needs to write into a registered region, and the fabric's local name for it: an
/// owned memory registration (ibv_reg_mr), made by [`Registry::register`](crate::fabric::Registry::register) and ended by
/// [`Registry::deregister`](crate::fabric::Registry::deregister), which consumes it. Not `Clone`: one owner deregisters it once.
/// Dropped without being deregistered, the region stays registered until its fabric goes away.
#[must_use = "a registration is only released by Registry::deregister"]
#[derive(Debug, PartialEq, Eq)]
pub struct Registration {
    pub(crate) id: RegionId,
    pub(crate) key: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
}

impl Registration {
    /// Made by a fabric's [`Registry::register`](crate::fabric::Registry::register), and only there (also by fabrics outside this
    /// crate, such as a test harness's): it names memory that fabric holds.
    pub fn new(id: RegionId, key: u32, addr: u64, len: u64) -> Registration {
        Registration { id, key, addr, len }
    }

    /// The local name (the source of a write: [`LocalFrag::region`](crate::fabric::LocalFrag::region)).
    pub fn id(&self) -> RegionId {
        self.id
    }

    /// The rkey a peer writes under (an RdmaDesc's key).
    pub fn key(&self) -> u32 {
        self.key
    }

    /// The virtual address of the region's first byte (an RdmaFrag's addr for offset 0).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The region's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a region of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Memory that several fabrics register at once: a router's large buffers, written by the
/// ingress NI's fabric (the sender's RDMA write lands there) and read by the egress NI's (its own
/// write onward goes from there), with no copy between them. Shared ownership, one user at a
/// time: each fabric takes the lock only while it copies bytes in or out, and LNet hands a
/// buffer from the ingress to the egress only once the data is in.
#[derive(Clone, Debug)]
pub struct SharedMem(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl SharedMem {
    /// `len` zeroed bytes (left to the kernel to back as they are first written).
    pub fn new(len: usize) -> SharedMem {
        SharedMem(std::sync::Arc::new(std::sync::Mutex::new(vec![0; len])))
    }

    /// Runs `f` on the bytes, holding the lock. A panic of another holder does not make the
    /// bytes unreachable (they are plain bytes: nothing to repair).
    pub fn with<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }

    /// The memory of `bytes`, taken over.
    pub fn from_vec(bytes: Vec<u8>) -> SharedMem {
        SharedMem(std::sync::Arc::new(std::sync::Mutex::new(bytes)))
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.with(|b| b.len())
    }

    /// True for no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `other` is this very memory (not a copy of its bytes).
    pub fn same(&self, other: &SharedMem) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }

    /// A copy of the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with(|b| b.to_vec())
    }
}

/// Two handles are equal when they share the memory, not when their bytes happen to match.
impl PartialEq for SharedMem {
    fn eq(&self, other: &SharedMem) -> bool {
        self.same(other)
    }
}

impl Eq for SharedMem {}
