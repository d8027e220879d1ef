//! Routing: each request goes to the live worker with the least outstanding work, unless a worker
//! likely holds the request's prompt prefix in its KV cache and is not much busier.
//!
//! Prefix affinity: the workers cache KV blocks of full prompt blocks under chained block hashes.
//! The router hashes a prompt's full blocks the same way (a block's hash covers every token before
//! it, block size from the workers' Hello) and remembers, in a bounded LRU map, which worker slot
//! each prefix block was last sent to. A new prompt goes to the slot of its longest remembered
//! prefix when that worker is *not much busier* than the least-loaded live worker:
//!
//! `outstanding(affine) <= least + slack_tokens + least * slack_ratio`
//!
//! (outstanding work in tokens, see [`WorkerLink::outstanding`]); otherwise it spills to the least
//! loaded worker, which then becomes the prefix's home. A slot's entries are forgotten whenever its
//! worker changes (died, restarted, left). A draining worker gets no new requests.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, RwLock};

use protos::records::Submit;
use tokio::sync::mpsc;

use crate::link::{Event, LinkError, WorkerLink};
use crate::metrics as m;

/// A request in a worker's ring: where it went, its events, and the work it counts there.
#[derive(Debug)]
pub struct Placed {
    pub link: Arc<WorkerLink>,
    pub events: mpsc::Receiver<Event>,
    /// Outstanding work (prompt + budget, in tokens) added to the worker.
    pub work: i64,
}

/// A request could not be placed.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    /// No worker takes requests now.
    #[error("no worker is ready")]
    NoWorker,
    /// The picked worker died or began draining before the request was in its ring (picking
    /// again may succeed).
    #[error("worker {slot}: {source}")]
    Link { slot: usize, source: LinkError },
}

/// How prefix affinity trades cache hits against load balance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffinityConfig {
    /// Slack at any load, in outstanding tokens.
    pub slack_tokens: i64,
    /// Slack that grows with load: this fraction of the least-loaded worker's outstanding tokens.
    pub slack_ratio: f64,
    /// Prefix blocks remembered at most (least recently used are forgotten first); 0 turns
    /// affinity off.
    pub max_entries: usize,
}

impl AffinityConfig {
    /// Default [`AffinityConfig::slack_tokens`]: about one long prompt.
    pub const DEFAULT_SLACK_TOKENS: i64 = 2048;
    /// Default [`AffinityConfig::slack_ratio`].
    pub const DEFAULT_SLACK_RATIO: f64 = 0.5;
    /// Default [`AffinityConfig::max_entries`] (a few MiB of map).
    pub const DEFAULT_MAX_ENTRIES: usize = 1 << 16;

    /// Whether a worker with `affine` outstanding tokens may take a request although the least
    /// loaded one has `least`.
    pub fn within_slack(&self, affine: i64, least: i64) -> bool {
        let scaled = (least.max(0) as f64 * self.slack_ratio) as i64;
        affine
            <= least
                .saturating_add(self.slack_tokens)
                .saturating_add(scaled)
    }
}

impl Default for AffinityConfig {
    fn default() -> Self {
        Self {
            slack_tokens: Self::DEFAULT_SLACK_TOKENS,
            slack_ratio: Self::DEFAULT_SLACK_RATIO,
            max_entries: Self::DEFAULT_MAX_ENTRIES,
        }
    }
}

/// The chained hashes of a prompt's full blocks of `block_size` tokens (the last one covers the
/// longest full-block prefix).
pub fn prefix_hashes(prompt: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut parent = 0x5bd1_e995_u64;
    prompt
        .chunks_exact(block_size)
        .map(|block| {
            let mut h = std::hash::DefaultHasher::new();
            parent.hash(&mut h);
            block.hash(&mut h);
            parent = h.finish();
            parent
        })
        .collect()
}

/// A bounded map from prefix-block hash to worker slot, least recently used forgotten first.
#[derive(Debug, Default)]
struct PrefixLru {
    /// Hash → (slot, the tick it was last touched).
    map: HashMap<u64, (usize, u64)>,
    /// Touches in order; an element is stale when its tick is no longer the entry's.
    order: VecDeque<(u64, u64)>,
    tick: u64,
}

impl PrefixLru {
    fn get(&self, hash: u64) -> Option<usize> {
        self.map.get(&hash).map(|&(slot, _)| slot)
    }

    fn insert(&mut self, hash: u64, slot: usize, cap: usize) {
        self.tick += 1;
        self.map.insert(hash, (slot, self.tick));
        self.order.push_back((hash, self.tick));
        while self.map.len() > cap {
            let Some((h, t)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&h).is_some_and(|&(_, tick)| tick == t) {
                self.map.remove(&h);
            }
        }
        // Stale touches are dropped lazily; keep the queue within a small multiple of the map.
        if self.order.len() > 2 * cap.max(16) {
            let map = &self.map;
            self.order
                .retain(|(h, t)| map.get(h).is_some_and(|&(_, tick)| tick == *t));
        }
    }

    fn forget_slot(&mut self, slot: usize) {
        self.map.retain(|_, &mut (s, _)| s != slot);
        let map = &self.map;
        self.order.retain(|(h, _)| map.contains_key(h));
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// The workers requests can be routed to, one slot per worker (supervised or joined).
#[derive(Debug, Default)]
pub struct Router {
    slots: RwLock<Vec<Option<Arc<WorkerLink>>>>,
    affinity: AffinityConfig,
    prefixes: Mutex<PrefixLru>,
}

impl Router {
    /// A router with `n` empty slots and the default affinity policy.
    pub fn new(n: usize) -> Self {
        Self::with_affinity(n, AffinityConfig::default())
    }

    /// A router with `n` empty slots and the given affinity policy.
    pub fn with_affinity(n: usize, affinity: AffinityConfig) -> Self {
        Self {
            slots: RwLock::new(vec![None; n]),
            affinity,
            prefixes: Mutex::new(PrefixLru::default()),
        }
    }

    /// Puts a ready worker into its slot (or empties it); the slot's prefix entries are forgotten.
    pub fn set(&self, slot: usize, link: Option<Arc<WorkerLink>>) {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        if slot >= slots.len() {
            slots.resize(slot + 1, None);
        }
        slots[slot] = link;
        self.prefixes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget_slot(slot);
    }

    /// The worker for a request with this prompt: its prefix's worker when that one is live, not
    /// draining and within the slack of the least loaded; otherwise the least loaded (ties: the
    /// lowest slot). `None` when no worker takes requests.
    pub fn pick(&self, prompt: &[u32]) -> Option<Arc<WorkerLink>> {
        let chosen = self.choose(prompt)?;
        metrics::counter!(m::ROUTED, "worker" => chosen.slot.to_string()).increment(1);
        Some(chosen)
    }

    fn choose(&self, prompt: &[u32]) -> Option<Arc<WorkerLink>> {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        let least = Self::least_loaded(&slots)?;
        if self.affinity.max_entries == 0 {
            return Some(least);
        }
        let hashes = prefix_hashes(prompt, least.info.block_size as usize);
        if hashes.is_empty() {
            return Some(least);
        }
        let mut lru = self.prefixes.lock().unwrap_or_else(|e| e.into_inner());
        let affine = hashes
            .iter()
            .rev()
            .find_map(|&h| lru.get(h))
            .and_then(|slot| slots.get(slot).cloned().flatten())
            .filter(|l| l.takes_requests());
        let chosen = match affine {
            Some(a)
                if a.slot == least.slot
                    || self
                        .affinity
                        .within_slack(a.outstanding(), least.outstanding()) =>
            {
                metrics::counter!(m::AFFINITY_HITS).increment(1);
                a
            }
            _ => least,
        };
        for h in hashes {
            lru.insert(h, chosen.slot, self.affinity.max_entries);
        }
        Some(chosen)
    }

    fn least_loaded(slots: &[Option<Arc<WorkerLink>>]) -> Option<Arc<WorkerLink>> {
        slots
            .iter()
            .flatten()
            .filter(|l| l.takes_requests())
            .min_by_key(|l| l.outstanding())
            .cloned()
    }

    /// Places a request: picks a worker for its prompt, registers it there, counts its work and
    /// writes its Submit record. A failure after the pick rolls all of that back, so a caller may
    /// simply try again.
    pub async fn place(&self, submit: &Submit) -> Result<Placed, PlaceError> {
        let link = self.pick(&submit.prompt).ok_or(PlaceError::NoWorker)?;
        let slot = link.slot;
        let id = submit.request_id;
        let events = link
            .register(id, submit.max_tokens)
            .map_err(|source| PlaceError::Link { slot, source })?;
        let work = (submit.prompt.len() + submit.max_tokens as usize) as i64;
        link.add_outstanding(work);
        if let Err(source) = link.submit(submit.clone()).await {
            link.unregister(id);
            link.add_outstanding(-work);
            return Err(PlaceError::Link { slot, source });
        }
        Ok(Placed { link, events, work })
    }

    /// Number of live workers (draining ones included: they still serve their streams).
    pub fn live(&self) -> usize {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        slots.iter().flatten().filter(|l| l.is_alive()).count()
    }

    /// Any worker that takes requests (for the model's limits).
    pub fn any(&self) -> Option<Arc<WorkerLink>> {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        Self::least_loaded(&slots)
    }

    /// Prefix blocks remembered (for tests and debugging).
    pub fn remembered_prefixes(&self) -> usize {
        self.prefixes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protos::records::HelloInfo;

    const BLOCK: usize = 16;

    fn info() -> HelloInfo {
        HelloInfo {
            pid: 1,
            num_kv_blocks: 8,
            block_size: BLOCK as u32,
            max_model_len: 64,
            vocab_size: 32,
            max_num_seqs: 4,
        }
    }

    fn link(slot: usize) -> Arc<WorkerLink> {
        // The link only needs a producer; the segment lives as long as it does.
        let ring = ringbuf::create(&ringbuf::unique_name("rs-router-test"), 4096).unwrap();
        WorkerLink::new(slot, info(), ring.producer().unwrap())
    }

    fn router(n: usize) -> (Router, Vec<Arc<WorkerLink>>) {
        let r = Router::new(n);
        let links: Vec<_> = (0..n).map(link).collect();
        for (i, l) in links.iter().enumerate() {
            r.set(i, Some(l.clone()));
        }
        (r, links)
    }

    /// A prompt of `blocks` full blocks whose first `shared` blocks are the same for every `seed`.
    fn prompt(seed: u32, shared: usize, blocks: usize) -> Vec<u32> {
        (0..blocks * BLOCK)
            .map(|i| {
                if i < shared * BLOCK {
                    i as u32
                } else {
                    1000 + seed * 7919 + i as u32
                }
            })
            .collect()
    }

    #[test]
    fn picks_the_least_loaded_live_worker() {
        let r = Router::new(3);
        assert!(r.pick(&[]).is_none());
        let (a, b, c) = (link(0), link(1), link(2));
        a.add_outstanding(100);
        b.add_outstanding(10);
        c.add_outstanding(50);
        r.set(0, Some(a.clone()));
        r.set(1, Some(b.clone()));
        r.set(2, Some(c.clone()));
        assert_eq!(r.pick(&[]).unwrap().slot, 1);
        b.mark_dead();
        assert_eq!(r.pick(&[]).unwrap().slot, 2);
        assert_eq!(r.live(), 2);
        r.set(2, None);
        assert_eq!(r.pick(&[]).unwrap().slot, 0);
    }

    #[test]
    fn hashes_chain_over_full_blocks() {
        let a = prefix_hashes(&prompt(1, 2, 3), BLOCK);
        let b = prefix_hashes(&prompt(2, 2, 3), BLOCK);
        assert_eq!(a.len(), 3);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // A partial block has no hash; the same block after another prefix hashes differently.
        assert!(prefix_hashes(&[1; BLOCK - 1], BLOCK).is_empty());
        let shifted: Vec<u32> = std::iter::once(9).chain(prompt(1, 2, 3)).collect();
        assert_ne!(prefix_hashes(&shifted, BLOCK)[1], a[1]);
    }

    #[test]
    fn a_shared_prefix_goes_to_the_same_worker() {
        let (r, links) = router(3);
        let first = r.pick(&prompt(1, 4, 6)).unwrap();
        // Make the first worker a little busier than the others: affinity still wins.
        first.add_outstanding(300);
        for seed in 2..10 {
            let w = r.pick(&prompt(seed, 4, 6)).unwrap();
            assert_eq!(w.slot, first.slot, "seed {seed}");
            w.add_outstanding(10);
        }
        assert!(r.remembered_prefixes() > 0);
        drop(links);
    }

    #[test]
    fn a_much_busier_worker_spills_to_the_least_loaded() {
        let (r, links) = router(2);
        let home = r.pick(&prompt(1, 4, 4)).unwrap();
        let other = &links[1 - home.slot];
        // Within the slack: still the home.
        home.add_outstanding(AffinityConfig::DEFAULT_SLACK_TOKENS);
        assert_eq!(r.pick(&prompt(2, 4, 4)).unwrap().slot, home.slot);
        // Beyond it: the least loaded.
        home.add_outstanding(1);
        assert_eq!(r.pick(&prompt(3, 4, 4)).unwrap().slot, other.slot);
        // The slack scales with load: at 10k tokens on the least loaded, 4k more is still fine.
        other.add_outstanding(10_000);
        home.add_outstanding(14_000 - home.outstanding());
        let cfg = AffinityConfig::default();
        assert!(cfg.within_slack(14_000, 10_000));
        assert!(!cfg.within_slack(10_000 + 2048 + 5001, 10_000));
        // The spilled prefix now lives on `other`; a new one with `home`'s prefix goes to `other`
        // too (it was re-homed by the spill).
        assert_eq!(r.pick(&prompt(4, 4, 4)).unwrap().slot, other.slot);
    }

    #[test]
    fn a_dead_workers_prefixes_are_forgotten() {
        let (r, links) = router(2);
        let p = prompt(1, 4, 4);
        let home = r.pick(&p).unwrap();
        let other = links[1 - home.slot].clone();
        // The home is busier but within slack, so affinity holds...
        home.add_outstanding(100);
        assert_eq!(r.pick(&p).unwrap().slot, home.slot);
        // ...while it lives: dead, it is skipped at once.
        home.mark_dead();
        assert_eq!(r.pick(&[]).unwrap().slot, other.slot);
        // Its slot is emptied and refilled by a restarted worker, a little busier than the other:
        // had the old entries survived, affinity would send the prefix to the new worker.
        r.set(home.slot, None);
        assert_eq!(r.remembered_prefixes(), 0);
        let fresh = link(home.slot);
        fresh.add_outstanding(100);
        r.set(home.slot, Some(fresh.clone()));
        assert_eq!(r.pick(&p).unwrap().slot, other.slot);
    }

    #[test]
    fn unrelated_prompts_go_to_the_least_loaded() {
        let (r, links) = router(3);
        links[0].add_outstanding(30);
        links[1].add_outstanding(20);
        links[2].add_outstanding(10);
        for seed in 0..5 {
            let w = r.pick(&prompt(seed, 0, 3)).unwrap();
            assert_eq!(w.slot, 2);
        }
        links[2].add_outstanding(100);
        assert_eq!(r.pick(&prompt(99, 0, 3)).unwrap().slot, 1);
    }

    #[test]
    fn the_map_stays_bounded() {
        let r = Router::with_affinity(
            1,
            AffinityConfig {
                max_entries: 8,
                ..AffinityConfig::default()
            },
        );
        r.set(0, Some(link(0)));
        for seed in 0..100 {
            r.pick(&prompt(seed, 0, 3));
            assert!(r.remembered_prefixes() <= 8);
        }
    }

    #[tokio::test]
    async fn place_writes_the_submit_and_counts_its_work_where_it_went() {
        let ring = ringbuf::create(&ringbuf::unique_name("rs-router-place"), 4096).unwrap();
        let mut worker_end = ring.consumer().unwrap();
        let r = Router::new(2);
        let submit = Submit {
            request_id: 9,
            sampling: Default::default(),
            max_tokens: 5,
            min_tokens: 0,
            logprobs: 0,
            ignore_eos: false,
            stop_token_ids: vec![],
            prompt: vec![1, 2, 3],
            prior_output_len: 0,
            grammar: None,
        };
        assert!(matches!(r.place(&submit).await, Err(PlaceError::NoWorker)));
        let live = WorkerLink::new(1, info(), ring.producer().unwrap());
        r.set(1, Some(live.clone()));
        let placed = r.place(&submit).await.unwrap();
        assert_eq!(placed.link.slot, 1);
        assert_eq!(placed.work, 8);
        assert_eq!(live.outstanding(), 8);
        assert_eq!(live.in_flight(), 1);
        let record = worker_end
            .try_pop()
            .unwrap()
            .expect("the Submit is in the ring");
        assert_eq!(Submit::decode(&record).unwrap(), submit);
        drop(record);
        // A worker that is draining takes nothing new.
        live.set_draining();
        assert!(matches!(r.place(&submit).await, Err(PlaceError::NoWorker)));
        assert_eq!(live.outstanding(), 8);
    }
}
