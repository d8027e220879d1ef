//! The step-plan broadcast: rank 0's scheduler plans each step; [`PlanEncoder`] turns the plan into
//! a diff record for ranks 1..T-1, and [`PlanMirror`] on each follower rebuilds the step's batch
//! from those diffs alone (vLLM V1's `SchedulerOutput` does the same: a new request's data once,
//! then per step only counts, new block ids and finished ids). The record's layout, encoding and
//! checked decoding live with the other shared-memory records, in [`protos::plan`].
//!
//! `new_tokens` are the tokens the follower has not seen yet, up to the end of this step's range:
//! the whole prompt (or chunk) the first time, then the one token rank 0 sampled last step. A
//! follower therefore never needs the sampler.

use std::collections::HashMap;

use thiserror::Error;

pub use protos::plan::{PlanMsg, PlanSeq, PlanWireError, encode_shutdown};

use crate::backend::{ForwardBatch, SeqInput};
use crate::kv::SeqId;
use crate::scheduler::StepPlan;

/// A plan record that cannot be decoded or applied.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    /// The record itself is malformed.
    #[error(transparent)]
    Wire(#[from] PlanWireError),
    /// The plan disagrees with what this follower mirrored from earlier plans.
    #[error("plan does not fit the mirrored state: {0}")]
    Inconsistent(String),
}

/// Rank 0's side: remembers how many tokens of each sequence the followers already hold.
#[derive(Debug, Default)]
pub struct PlanEncoder {
    sent: HashMap<SeqId, usize>,
    step: u64,
}

impl PlanEncoder {
    /// Encodes `plan` into `out` (cleared first). `tokens_of` gives a scheduled sequence's tokens
    /// (prompt + output so far).
    pub fn encode<'a>(
        &mut self,
        plan: &StepPlan,
        tokens_of: impl Fn(SeqId) -> Option<&'a [u32]>,
        out: &mut Vec<u8>,
    ) -> Result<(), PlanError> {
        let preempted: Vec<u64> = plan.preempted.iter().map(|id| id.0).collect();
        let finished: Vec<u64> = plan.finished.iter().map(|id| id.0).collect();
        protos::plan::begin_step(out, self.step, plan.seqs.len(), &preempted, &finished)?;
        self.step += 1;
        for id in &plan.finished {
            self.sent.remove(id);
        }
        for s in &plan.seqs {
            let end = s.num_computed + s.num_tokens;
            let tokens = tokens_of(s.seq).filter(|t| t.len() >= end).ok_or_else(|| {
                PlanError::Inconsistent(format!("sequence {} has no tokens up to {end}", s.seq.0))
            })?;
            let sent = self.sent.entry(s.seq).or_insert(0);
            let new_tokens = &tokens[(*sent).min(end)..end];
            *sent = end.max(*sent);
            let new_blocks: Vec<u32> = s.new_blocks.iter().map(|b| b.0).collect();
            protos::plan::push_seq(
                out,
                s.seq.0,
                s.num_computed,
                s.num_tokens,
                s.sample,
                &new_blocks,
                new_tokens,
            )?;
        }
        Ok(())
    }
}

/// Decodes one plan record; every count is checked against the record's length.
pub fn decode(bytes: &[u8]) -> Result<PlanMsg, PlanError> {
    Ok(protos::plan::decode(bytes)?)
}

#[derive(Debug, Default)]
struct Mirrored {
    tokens: Vec<u32>,
    table: Vec<u32>,
}

/// A follower's copy of the sequences' tokens and block tables, kept from plans alone.
#[derive(Debug, Default)]
pub struct PlanMirror {
    seqs: HashMap<u64, Mirrored>,
    next_step: u64,
}

/// The flattened inputs of one step, owned (a [`ForwardBatch`] borrows from it).
#[derive(Debug, Default)]
pub struct StepInputs {
    token_ids: Vec<u32>,
    positions: Vec<u32>,
    tables: Vec<Vec<u32>>,
    seqs: Vec<(usize, usize, usize, bool)>,
}

impl StepInputs {
    /// Whether the step computes nothing (a plan that only frees sequences).
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The step's sequences as backend inputs; pass them to [`ForwardBatch`] with
    /// `StepInputs::token_ids` and `StepInputs::positions`.
    pub fn seq_inputs(&self) -> Vec<SeqInput<'_>> {
        self.seqs
            .iter()
            .zip(&self.tables)
            .map(
                |(&(query_start, query_len, context_len, sample), table)| SeqInput {
                    query_start,
                    query_len,
                    context_len,
                    block_table: table,
                    sample,
                },
            )
            .collect()
    }

    /// Runs `f` with the step's batch.
    pub fn with_batch<R>(&self, f: impl FnOnce(&ForwardBatch<'_>) -> R) -> R {
        let seqs = self.seq_inputs();
        f(&ForwardBatch {
            token_ids: &self.token_ids,
            positions: &self.positions,
            seqs: &seqs,
        })
    }
}

impl PlanMirror {
    /// Sequences currently mirrored.
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// Whether no sequence is mirrored.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Applies one step record: frees finished sequences, resets preempted ones' tables, appends
    /// new blocks and tokens, and returns the step's inputs.
    pub fn apply(
        &mut self,
        step: u64,
        seqs: &[PlanSeq],
        preempted: &[u64],
        finished: &[u64],
    ) -> Result<StepInputs, PlanError> {
        let bad = |m: String| Err(PlanError::Inconsistent(m));
        if step != self.next_step {
            return bad(format!("step {step}, expected {}", self.next_step));
        }
        self.next_step += 1;
        for id in finished {
            self.seqs.remove(id);
        }
        for id in preempted {
            if let Some(m) = self.seqs.get_mut(id) {
                m.table.clear();
            }
        }
        let mut inputs = StepInputs::default();
        for s in seqs {
            let m = self.seqs.entry(s.seq).or_default();
            m.table.extend_from_slice(&s.new_blocks);
            m.tokens.extend_from_slice(&s.new_tokens);
            let (start, len) = (s.num_computed as usize, s.num_tokens as usize);
            let end = start + len;
            if len == 0 || m.tokens.len() < end {
                return bad(format!(
                    "sequence {} computes {start}..{end} but {} tokens are known",
                    s.seq,
                    m.tokens.len()
                ));
            }
            let query_start = inputs.token_ids.len();
            inputs.token_ids.extend_from_slice(&m.tokens[start..end]);
            inputs.positions.extend(start as u32..end as u32);
            inputs.tables.push(m.table.clone());
            inputs.seqs.push((query_start, len, end, s.sample));
        }
        Ok(inputs)
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
