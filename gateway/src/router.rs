//! Routing: each request goes to the live worker with the least outstanding work.

use std::sync::{Arc, RwLock};

use crate::link::WorkerLink;

/// The workers requests can be routed to, one slot per supervised worker.
#[derive(Debug, Default)]
pub struct Router {
    slots: RwLock<Vec<Option<Arc<WorkerLink>>>>,
}

impl Router {
    /// A router with `n` empty slots.
    pub fn new(n: usize) -> Self {
        Self {
            slots: RwLock::new(vec![None; n]),
        }
    }

    /// Puts a ready worker into its slot.
    pub fn set(&self, slot: usize, link: Option<Arc<WorkerLink>>) {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        if slot >= slots.len() {
            slots.resize(slot + 1, None);
        }
        slots[slot] = link;
    }

    /// The live worker with the least outstanding work (ties: the lowest slot).
    pub fn pick(&self) -> Option<Arc<WorkerLink>> {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        slots
            .iter()
            .flatten()
            .filter(|l| l.is_alive())
            .min_by_key(|l| l.outstanding())
            .cloned()
    }

    /// Number of live workers.
    pub fn live(&self) -> usize {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        slots.iter().flatten().filter(|l| l.is_alive()).count()
    }

    /// Any live worker (for the model's limits).
    pub fn any(&self) -> Option<Arc<WorkerLink>> {
        self.pick()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protos::records::HelloInfo;

    fn link(slot: usize) -> Arc<WorkerLink> {
        let info = HelloInfo {
            pid: 1,
            num_kv_blocks: 8,
            block_size: 16,
            max_model_len: 64,
            vocab_size: 32,
            max_num_seqs: 4,
        };
        // The link only needs a producer; the segment lives as long as it does.
        let ring = ringbuf::create(&ringbuf::unique_name("rs-router-test"), 4096).unwrap();
        WorkerLink::new(slot, info, ring.producer().unwrap())
    }

    #[test]
    fn picks_the_least_loaded_live_worker() {
        let r = Router::new(3);
        assert!(r.pick().is_none());
        let (a, b, c) = (link(0), link(1), link(2));
        a.add_outstanding(100);
        b.add_outstanding(10);
        c.add_outstanding(50);
        r.set(0, Some(a.clone()));
        r.set(1, Some(b.clone()));
        r.set(2, Some(c.clone()));
        assert_eq!(r.pick().unwrap().slot, 1);
        b.mark_dead();
        assert_eq!(r.pick().unwrap().slot, 2);
        assert_eq!(r.live(), 2);
        r.set(2, None);
        assert_eq!(r.pick().unwrap().slot, 0);
    }
}
