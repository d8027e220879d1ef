//! The `null` device: a backend that does no math and emits deterministic tokens, so the serving
//! path (gateway, rings, streaming) can be measured alone.
//!
//! The next token of a sequence is a fixed function of its last token and position (never an EOS
//! id), so a request's output does not depend on what it was batched with. [`Backend::forward`]
//! returns logits that put all the mass on that token, so host-side sampling, penalties and
//! logprobs agree with [`Backend::forward_sampled`]. It takes launched steps too (async
//! scheduling, [`Backend::launch_sampled`]), so the serving path can be measured with them.

use crate::backend::launches::HostLaunches;
use crate::backend::{Backend, BackendError, DeviceSampling, ForwardBatch, Logits, TokenFeed};

/// A backend with no weights and no KV memory.
#[derive(Debug, Clone)]
pub struct NullBackend {
    vocab: usize,
    eos: Vec<u32>,
    block_size: usize,
    num_kv_blocks: usize,
    /// Launched steps' draws (async scheduling).
    launches: HostLaunches,
}

impl NullBackend {
    /// A null backend for a vocabulary of `vocab` tokens that never emits one of `eos`.
    pub fn new(vocab: usize, eos: Vec<u32>, block_size: usize, num_kv_blocks: usize) -> Self {
        Self {
            vocab: vocab.max(2),
            eos,
            block_size,
            num_kv_blocks,
            launches: HostLaunches::default(),
        }
    }

    /// The token that follows `last` at `position`.
    pub fn next_token(&self, last: u32, position: u32) -> u32 {
        let v = self.vocab as u64;
        let mut t = (u64::from(last) * 31 + u64::from(position) * 7 + 11) % v;
        while self.eos.contains(&(t as u32)) {
            t = (t + 1) % v;
        }
        t as u32
    }

    fn sampled(&self, batch: &ForwardBatch<'_>) -> Result<Vec<u32>, BackendError> {
        let mut out = Vec::with_capacity(batch.num_samples());
        for s in batch.seqs.iter().filter(|s| s.sample) {
            let last = s.query_start + s.query_len;
            if s.query_len == 0 || last > batch.token_ids.len() || last > batch.positions.len() {
                return Err(BackendError::InvalidBatch(format!(
                    "sequence tokens {}..{last} outside the batch of {}",
                    s.query_start,
                    batch.token_ids.len()
                )));
            }
            out.push(self.next_token(batch.token_ids[last - 1], batch.positions[last - 1]));
        }
        Ok(out)
    }
}

impl Backend for NullBackend {
    fn name(&self) -> &'static str {
        "null"
    }

    fn num_kv_blocks(&self) -> usize {
        self.num_kv_blocks
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<Logits, BackendError> {
        let tokens = self.sampled(batch)?;
        let mut data = vec![-100.0f32; tokens.len() * self.vocab];
        for (row, t) in tokens.iter().enumerate() {
            data[row * self.vocab + *t as usize] = 0.0;
        }
        Ok(Logits {
            vocab: self.vocab,
            data,
        })
    }

    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch<'_>,
        _sampling: &[DeviceSampling],
    ) -> Result<Option<Vec<u32>>, BackendError> {
        self.sampled(batch).map(Some)
    }

    /// Draws at once and keeps the tokens until collected; a fed step's input tokens are the
    /// last launched step's draws.
    fn launch_sampled(
        &mut self,
        batch: &ForwardBatch<'_>,
        _sampling: &[DeviceSampling],
        feed: TokenFeed<'_>,
    ) -> Result<bool, BackendError> {
        let mut launches = std::mem::take(&mut self.launches);
        let launched = launches.launch(batch, feed, |b| self.sampled(b));
        self.launches = launches;
        launched.map(|()| true)
    }

    fn collect_sampled(&mut self) -> Result<Vec<u32>, BackendError> {
        self.launches.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SeqInput;

    #[test]
    fn tokens_are_deterministic_avoid_eos_and_match_the_logits() {
        let mut b = NullBackend::new(16, vec![2], 16, 8);
        let table = [1u32];
        let seqs = [
            SeqInput {
                query_start: 0,
                query_len: 3,
                context_len: 3,
                block_table: &table,
                sample: true,
            },
            SeqInput {
                query_start: 3,
                query_len: 1,
                context_len: 5,
                block_table: &table,
                sample: true,
            },
        ];
        let batch = ForwardBatch {
            token_ids: &[5, 6, 7, 9],
            positions: &[0, 1, 2, 4],
            seqs: &seqs,
        };
        let sampled = b.forward_sampled(&batch, &[]).unwrap().unwrap();
        assert_eq!(sampled, vec![b.next_token(7, 2), b.next_token(9, 4)]);
        let logits = b.forward(&batch).unwrap();
        for (i, t) in sampled.iter().enumerate() {
            let row = logits.row(i);
            let argmax = (0..16).max_by(|&x, &y| row[x].total_cmp(&row[y])).unwrap();
            assert_eq!(argmax as u32, *t);
        }
        for last in 0..16 {
            for pos in 0..40 {
                assert_ne!(b.next_token(last, pos), 2);
            }
        }
    }
}
