//! A router's large buffers for bulk data as one pool for the whole node, following its NIs and
//! its settings at run time.
//!
//! Each buffer is [`SharedMem`] of LNET_MTU that every NI's fabric registers under its own key
//! (see [`BulkBuffers`]), and that one NI runtime at a time lends out (its owner). The pool is
//! planned here, without I/O; the daemon publishes each [`BulkPlan`] with its NI set, and every NI
//! loop registers the buffers with its own fabric (a driver's registry belongs to its thread),
//! reports what it registered ([`BulkPool::set_registered`]) and gives its node the table and
//! its share (`LnetNode::set_bulk_buffers`). A plan takes a few rounds: the buffers first, then,
//! once every NI has registered them, the table that names them. So:
//! - an NI added at run time registers every buffer before it appears in the table (until then
//!   bulk through it is refused as `no_bulk_buffer`, as it is when its registration fails);
//! - the pool exists once routing is on (Lustre's lnet_rtrpools_enable allocates the router
//!   pools when `set routing 1` comes: on verbs the buffers are pinned, so a node that never
//!   routes pins nothing), and stays when routing goes off again;
//! - `set large_buffers` grows it by new buffers, or shrinks it: a buffer taken back from its
//!   owner is released only once no forward holds it, then retired (every NI deregisters it);
//! - a share that moves from one NI to another (an NI added or removed) moves as the buffers
//!   are released, new ones made only for what is still lent.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use lnd::fabric::SharedMem;
use lnd::wire::Nid;

use crate::forward::{BulkBuffers, BulkRegion};

/// An NI loop, as the pool knows it: unique for the daemon's life (a NID removed and added again
/// is another loop, with another fabric).
pub type LoopId = u64;

/// The most large buffers the pool registers (64 GiB of LNET_MTU buffers): `set large_buffers`
/// takes up to 10,000,000 as Lustre's does, but each buffer here is memory registered with every
/// NI's fabric, pinned on verbs.
pub const MAX_BULK_BUFFERS: u32 = 65_536;

/// What every NI loop does with the pool at one epoch.
#[derive(Debug, Default)]
pub struct BulkPlan {
    /// Every buffer the NIs should have registered (`k`, its memory).
    pub slots: Vec<(usize, SharedMem)>,
    /// The buffers as each NI that registered all of them sees them.
    pub table: Arc<BulkBuffers>,
    /// The buffers each loop lends out (none for a loop not in the table).
    pub owned: HashMap<LoopId, Vec<usize>>,
    /// Changes with `table` or `owned`: a loop hands its node the table again only then.
    pub rev: u64,
    /// Changes with the node's NIs or settings only: a loop whose registration failed tries
    /// again at the next one, not at every round.
    pub gen: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum State {
    /// Its owner lends it out.
    Owned,
    /// Taken back from its owner, which still lends it until it is free.
    Releasing,
    /// Nobody's: taken by a loop that needs one, else retired at the end of the plan.
    Spare,
    /// Its owner ended while a forward still held it (an NI removed under load): never lent
    /// again, registered until the daemon stops.
    Stranded,
}

#[derive(Debug)]
struct Slot {
    mem: SharedMem,
    owner: Option<LoopId>,
    state: State,
    /// Handed to its owner in a published plan (else taking it back is immediate).
    handed: bool,
    /// Named by the table.
    in_table: bool,
}

#[derive(Debug)]
struct Registered {
    views: HashMap<usize, BulkRegion>,
    failed: bool,
}

/// The node's large buffers, where each one is, and what each NI registered.
#[derive(Debug)]
pub struct BulkPool {
    buf_len: usize,
    slots: Vec<Option<Slot>>,
    regs: HashMap<LoopId, Registered>,
    plan: Arc<BulkPlan>,
    /// Something came back from a loop since the last plan (a registration, a release).
    dirty: bool,
}

impl Default for BulkPool {
    fn default() -> BulkPool {
        BulkPool::new(lnd::wire::lnet::LNET_MTU as usize)
    }
}

impl BulkPool {
    /// An empty pool of buffers of `buf_len` bytes.
    pub fn new(buf_len: usize) -> BulkPool {
        BulkPool {
            buf_len,
            slots: Vec::new(),
            regs: HashMap::new(),
            plan: Arc::default(),
            dirty: false,
        }
    }

    /// The plan published last.
    pub fn current(&self) -> Arc<BulkPlan> {
        Arc::clone(&self.plan)
    }

    /// Whether a loop reported something since the last plan.
    pub fn dirty(&self) -> bool {
        self.dirty
    }

    /// How many buffers are registered (every live one, stranded included).
    pub fn live(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Plans the next round for `members` (the NI loops in the set, in order) and `leaving` (NI
    /// loops removed but still running), with routing on or off and `total` large buffers for
    /// the node. `change`: the NIs or the settings changed (not a round of the same change).
    /// `None` when nothing would change for any loop.
    pub fn plan(
        &mut self,
        members: &[(LoopId, Nid)],
        leaving: &[LoopId],
        routing: bool,
        total: u32,
        change: bool,
    ) -> Option<Arc<BulkPlan>> {
        self.dirty = false;
        let running: HashSet<LoopId> = members
            .iter()
            .map(|m| m.0)
            .chain(leaving.iter().copied())
            .collect();
        // A loop gone is gone with its fabric's registrations.
        self.regs.retain(|id, _| running.contains(id));
        for s in self.slots.iter_mut().flatten() {
            if let Some(o) = s.owner {
                if !running.contains(&o) && matches!(s.state, State::Owned | State::Releasing) {
                    // Ended without saying what it held ([`BulkPool::end`]): kept as stranded.
                    s.owner = None;
                    s.state = State::Stranded;
                }
            }
        }
        let enabled = routing || self.live() > 0;
        let n = members.len();
        let share = if enabled && n > 0 {
            let total = total.min(MAX_BULK_BUFFERS) as usize;
            (total / n).max(1)
        } else {
            0
        };
        for s in self.slots.iter_mut().flatten() {
            if s.owner.is_some_and(|o| leaving.contains(&o)) && s.state == State::Owned {
                s.state = State::Releasing;
            }
        }
        // First what each loop has beyond its share goes back (a loop whose registration failed
        // has none), then the loops short of their share take what they can.
        let target = |pool: &BulkPool, id: LoopId| {
            if pool.regs.get(&id).is_some_and(|r| r.failed) {
                0
            } else {
                share
            }
        };
        for &(id, _) in members {
            let mut mine = self.owned_by(id, State::Owned);
            let t = target(self, id);
            if mine.len() <= t {
                continue;
            }
            for k in mine.split_off(t) {
                if let Some(s) = self.slots[k].as_mut() {
                    if s.handed {
                        s.state = State::Releasing;
                    } else {
                        s.owner = None;
                        s.state = State::Spare;
                    }
                }
            }
        }
        // On the first round of a change, what other loops are giving back comes first: new
        // buffers only for the rest (their idle ones come back in this very round).
        let mut reusable = if change {
            self.live_where(|s| s.state == State::Releasing).len()
        } else {
            0
        };
        // Where new buffers go: the holes retired ones left, then the end.
        let mut holes: std::collections::VecDeque<usize> = (0..self.slots.len())
            .filter(|&k| self.slots[k].is_none())
            .collect();
        for &(id, _) in members {
            let t = target(self, id);
            let mut need = t.saturating_sub(self.owned_by(id, State::Owned).len());
            // Its own, not let go yet; then spare ones; then new ones.
            for k in self.owned_by(id, State::Releasing) {
                if need == 0 {
                    break;
                }
                if let Some(s) = self.slots[k].as_mut() {
                    s.state = State::Owned;
                    reusable = reusable.saturating_sub(1);
                    need -= 1;
                }
            }
            for s in self.slots.iter_mut().flatten() {
                if need == 0 {
                    break;
                }
                if s.state == State::Spare {
                    s.owner = Some(id);
                    s.state = State::Owned;
                    s.handed = false;
                    need -= 1;
                }
            }
            let wait = need.min(reusable);
            reusable -= wait;
            need -= wait;
            for _ in 0..need {
                let slot = Slot {
                    mem: SharedMem::new(self.buf_len),
                    owner: Some(id),
                    state: State::Owned,
                    handed: false,
                    in_table: false,
                };
                match holes.pop_front() {
                    Some(k) => self.slots[k] = Some(slot),
                    None => self.slots.push(Some(slot)),
                }
            }
        }
        // Spare buffers nobody took are retired: no forward holds them.
        for s in self.slots.iter_mut() {
            if s.as_ref().is_some_and(|s| s.state == State::Spare) {
                *s = None;
            }
        }
        while self.slots.last().is_some_and(Option::is_none) {
            self.slots.pop();
        }

        // The table: the NIs that registered every buffer it names, and every buffer they all
        // registered. A buffer once named stays named until it is retired (a forward may be
        // writing from it); an NI joins once it has caught up.
        let named: Vec<usize> = self.live_where(|s| s.in_table);
        let registered = |id: &LoopId, k: usize| -> bool {
            self.regs
                .get(id)
                .is_some_and(|r| !r.failed && r.views.contains_key(&k))
        };
        let complete: Vec<(LoopId, Nid)> = members
            .iter()
            .copied()
            .filter(|(id, _)| {
                !self.regs.get(id).is_some_and(|r| r.failed)
                    && named.iter().all(|&k| registered(id, k))
            })
            .collect();
        let in_table: Vec<usize> = if complete.is_empty() {
            Vec::new()
        } else {
            self.live_where(|_| true)
                .into_iter()
                .filter(|&k| complete.iter().all(|(id, _)| registered(id, k)))
                .collect()
        };
        let mut table = BulkBuffers::default();
        for &k in &in_table {
            if table.bufs.len() <= k {
                table.bufs.resize(k + 1, Vec::new());
            }
            table.bufs[k] = complete
                .iter()
                .filter_map(|(id, nid)| Some((*nid, *self.regs.get(id)?.views.get(&k)?)))
                .collect();
            // Its memory, for scrubbing it before it is lent again.
            if table.mem.len() <= k {
                table.mem.resize(k + 1, None);
            }
            table.mem[k] = self
                .slots
                .get(k)
                .and_then(|s| s.as_ref())
                .map(|s| s.mem.clone());
        }
        let named: HashSet<usize> = in_table.iter().copied().collect();
        let complete_ids: HashSet<LoopId> = complete.iter().map(|c| c.0).collect();
        // Each complete loop lends its own buffers that the table names (in order of k).
        let mut owned: HashMap<LoopId, Vec<usize>> = HashMap::new();
        for (k, s) in self.slots.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            s.in_table = named.contains(&k);
            match s.owner {
                Some(o) if s.state == State::Owned && s.in_table && complete_ids.contains(&o) => {
                    owned.entry(o).or_default().push(k);
                    s.handed = true;
                }
                _ => {}
            }
        }
        let slots: Vec<(usize, SharedMem)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(k, s)| s.as_ref().map(|s| (k, s.mem.clone())))
            .collect();
        let old = &self.plan;
        let same_slots =
            old.slots.len() == slots.len() && old.slots.iter().zip(&slots).all(|(a, b)| a.0 == b.0);
        let same_table = old.table.bufs == table.bufs && old.owned == owned;
        if same_slots && same_table && !change {
            return None;
        }
        let rev = old.rev + u64::from(!same_table);
        self.plan = Arc::new(BulkPlan {
            slots,
            table: if same_table {
                Arc::clone(&old.table)
            } else {
                Arc::new(table)
            },
            owned,
            rev,
            gen: old.gen + u64::from(change),
        });
        Some(self.current())
    }

    /// Loop `id` has these buffers registered with its fabric; `failed` if a registration
    /// failed (it is then left out of the table, its share idle).
    pub fn set_registered(&mut self, id: LoopId, views: HashMap<usize, BulkRegion>, failed: bool) {
        self.regs.insert(id, Registered { views, failed });
        self.dirty = true;
    }

    /// Loop `id` let these buffers go (`LnetNode::take_released_bulk`): no forward holds them.
    pub fn release(&mut self, id: LoopId, ks: &[usize]) {
        for &k in ks {
            if let Some(s) = self.slots.get_mut(k).and_then(Option::as_mut) {
                if s.owner == Some(id) && matches!(s.state, State::Owned | State::Releasing) {
                    s.owner = None;
                    s.state = State::Spare;
                }
            }
        }
        self.dirty = true;
    }

    /// Loop `id` ended with `held` still lent (`LnetNode::bulk_held`): those are stranded, the
    /// rest of its buffers free for others. Returns how many were stranded.
    pub fn end(&mut self, id: LoopId, held: &[usize]) -> usize {
        let mut stranded = 0;
        for (k, s) in self.slots.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            if s.owner != Some(id) {
                continue;
            }
            s.owner = None;
            if held.contains(&k) {
                s.state = State::Stranded;
                stranded += 1;
            } else {
                s.state = State::Spare;
            }
        }
        self.regs.remove(&id);
        self.dirty = true;
        stranded
    }

    fn owned_by(&self, id: LoopId, state: State) -> Vec<usize> {
        self.live_where(|s| s.owner == Some(id) && s.state == state)
    }

    fn live_where(&self, f: impl Fn(&Slot) -> bool) -> Vec<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(k, s)| s.as_ref().filter(|s| f(s)).map(|_| k))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lnd::fabric::RegionId;

    use testkit::nid;

    /// Every loop registers every buffer of `plan` (a fake fabric: region k + 1000 * id).
    fn register_all(pool: &mut BulkPool, plan: &BulkPlan, members: &[(LoopId, Nid)]) {
        for &(id, _) in members {
            let views = plan
                .slots
                .iter()
                .map(|(k, _)| {
                    let r = BulkRegion {
                        region: RegionId(id * 1000 + *k as u64),
                        key: (id * 1000 + *k as u64) as u32,
                        addr: 0,
                        len: 64,
                    };
                    (*k, r)
                })
                .collect();
            pool.set_registered(id, views, false);
        }
    }

    /// Rounds until the plan settles, every loop registering all at each; the last plan.
    fn settle(
        pool: &mut BulkPool,
        members: &[(LoopId, Nid)],
        leaving: &[LoopId],
        routing: bool,
        total: u32,
    ) -> Arc<BulkPlan> {
        let mut change = true;
        for _ in 0..4 {
            match pool.plan(members, leaving, routing, total, change) {
                Some(p) => register_all(pool, &p, members),
                None => break,
            }
            change = false;
        }
        pool.current()
    }

    fn owned(p: &BulkPlan, id: LoopId) -> usize {
        p.owned.get(&id).map_or(0, Vec::len)
    }

    #[test]
    fn nothing_until_routing_is_on_then_every_ni_in_the_table() {
        let a = (1, nid("10.0.0.1@o2ib"));
        let b = (2, nid("10.1.0.1@o2ib1"));
        let mut pool = BulkPool::new(64);
        let p = settle(&mut pool, &[a, b], &[], false, 8);
        assert!(p.slots.is_empty() && p.table.bufs.is_empty());
        let p = settle(&mut pool, &[a, b], &[], true, 8);
        assert_eq!((p.slots.len(), owned(&p, 1), owned(&p, 2)), (8, 4, 4));
        assert!(p.table.bufs.iter().all(|v| v.len() == 2), "{:?}", p.table);
        // Off again: kept.
        let p = settle(&mut pool, &[a, b], &[], false, 8);
        assert_eq!(p.slots.len(), 8);
    }

    #[test]
    fn an_added_ni_takes_what_the_others_give_back_and_joins_once_registered() {
        let a = (1, nid("10.0.0.1@o2ib"));
        let b = (2, nid("10.1.0.1@o2ib1"));
        let mut pool = BulkPool::new(64);
        let p = settle(&mut pool, &[a], &[], true, 8);
        assert_eq!(owned(&p, 1), 8);
        // B added: A's share halves; nothing new is made while A gives back.
        let p = pool.plan(&[a, b], &[], true, 8, true).unwrap();
        assert_eq!((p.slots.len(), owned(&p, 1), owned(&p, 2)), (8, 4, 0));
        assert!(p.table.bufs.iter().all(|v| v.len() == 1), "B not in yet");
        // A lets its 4 idle ones go (all of them were free); B registers.
        let given_back = pool.plan.owned[&1].clone();
        let all: Vec<usize> = (0..8).filter(|k| !given_back.contains(k)).collect();
        pool.release(1, &all);
        register_all(&mut pool, &p, &[a, b]);
        let p = pool.plan(&[a, b], &[], true, 8, false).unwrap();
        assert_eq!((p.slots.len(), owned(&p, 1), owned(&p, 2)), (8, 4, 4));
        assert!(p.table.bufs.iter().all(|v| v.len() == 2));
        assert!(pool.plan(&[a, b], &[], true, 8, false).is_none(), "settled");
    }

    #[test]
    fn growing_adds_buffers_and_shrinking_retires_them_once_released() {
        let a = (1, nid("10.0.0.1@o2ib"));
        let b = (2, nid("10.1.0.1@o2ib1"));
        let mut pool = BulkPool::new(64);
        settle(&mut pool, &[a, b], &[], true, 4);
        let p = settle(&mut pool, &[a, b], &[], true, 12);
        assert_eq!((p.slots.len(), owned(&p, 1), owned(&p, 2)), (12, 6, 6));
        // Shrink to 4: each keeps 2; the rest go as their owners release them.
        let p = pool.plan(&[a, b], &[], true, 4, true).unwrap();
        assert_eq!((owned(&p, 1), owned(&p, 2)), (2, 2));
        assert_eq!(p.slots.len(), 12, "held until released");
        let keep: Vec<usize> = p.owned.values().flatten().copied().collect();
        let (a_gone, b_gone): (Vec<usize>, Vec<usize>) = (0..12)
            .filter(|k| !keep.contains(k))
            .partition(|k| pool.slots[*k].as_ref().unwrap().owner == Some(1));
        // A released all; one of B's is still lent.
        pool.release(1, &a_gone);
        pool.release(2, &b_gone[1..]);
        let p = pool.plan(&[a, b], &[], true, 4, false).unwrap();
        assert_eq!(p.slots.len(), 5);
        pool.release(2, &b_gone[..1]);
        let p = pool.plan(&[a, b], &[], true, 4, false).unwrap();
        assert_eq!(p.slots.len(), 4);
        assert_eq!(p.table.bufs.iter().filter(|v| !v.is_empty()).count(), 4);
    }

    #[test]
    fn a_failed_registration_leaves_that_ni_out_and_an_ended_loop_strands_what_it_held() {
        let a = (1, nid("10.0.0.1@o2ib"));
        let b = (2, nid("10.1.0.1@o2ib1"));
        let mut pool = BulkPool::new(64);
        let p = pool.plan(&[a, b], &[], true, 4, true).unwrap();
        register_all(&mut pool, &p, &[a]);
        pool.set_registered(2, HashMap::new(), true);
        let p = pool.plan(&[a, b], &[], true, 4, false).unwrap();
        assert_eq!((owned(&p, 1), owned(&p, 2)), (2, 0));
        assert!(p.table.bufs.iter().all(|v| v.len() == 1 && v[0].0 == a.1));
        // B removed: gone; A ends holding one of its buffers.
        let p = settle(&mut pool, &[a], &[], true, 4);
        assert_eq!(owned(&p, 1), 4);
        let held = p.owned[&1][0];
        assert_eq!(pool.end(1, &[held]), 1);
        let p = settle(&mut pool, &[], &[], true, 4);
        assert_eq!(p.slots.len(), 1, "the stranded one stays registered");
        assert!(p.owned.is_empty());
    }
}
