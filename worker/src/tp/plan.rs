//! The step-plan broadcast: rank 0's scheduler plans each step; [`PlanEncoder`] turns the plan into a
//! fixed-layout diff record for ranks 1..T-1, and [`PlanMirror`] on each follower rebuilds the
//! step's batch from those diffs alone (vLLM V1's `SchedulerOutput` does the same: a new request's
//! data once, then per step only counts, new block ids and finished ids).
//!
//! # Record layout (little-endian u32 words; ids are two words, low first)
//!
//! ```text
//! magic "RSPL" | version | kind (1 step, 2 shutdown) | step (u64)
//! num_seqs | num_preempted | num_finished
//! preempted ids (u64 each) | finished ids (u64 each)
//! per seq: id (u64) | num_computed | num_tokens | sample (0/1) | num_new_blocks | num_new_tokens
//!          | new_blocks … | new_tokens …
//! ```
//!
//! `new_tokens` are the tokens the follower has not seen yet, up to the end of this step's range:
//! the whole prompt (or chunk) the first time, then the one token rank 0 sampled last step. A
//! follower therefore never needs the sampler.

use std::collections::HashMap;

use thiserror::Error;

use crate::backend::{ForwardBatch, SeqInput};
use crate::kv::SeqId;
use crate::scheduler::StepPlan;

const MAGIC: u32 = u32::from_le_bytes(*b"RSPL");
const VERSION: u32 = 1;
const KIND_STEP: u32 = 1;
const KIND_SHUTDOWN: u32 = 2;

/// A plan record that cannot be decoded or applied.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    #[error("plan record truncated while reading {what}")]
    Truncated { what: &'static str },
    #[error("plan record has {0} trailing bytes")]
    TrailingBytes(usize),
    #[error("not a plan record (magic {0:#x})")]
    BadMagic(u32),
    #[error("plan record version {0}, this build reads {VERSION}")]
    Version(u32),
    #[error("plan record: invalid {what} ({value})")]
    Invalid { what: &'static str, value: u64 },
    /// The plan disagrees with what this follower mirrored from earlier plans.
    #[error("plan does not fit the mirrored state: {0}")]
    Inconsistent(String),
}

/// One sequence's share of a broadcast step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSeq {
    pub seq: u64,
    pub num_computed: u32,
    pub num_tokens: u32,
    pub sample: bool,
    pub new_blocks: Vec<u32>,
    pub new_tokens: Vec<u32>,
}

/// A decoded plan record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanMsg {
    /// Run one step.
    Step {
        step: u64,
        seqs: Vec<PlanSeq>,
        preempted: Vec<u64>,
        finished: Vec<u64>,
    },
    /// Rank 0 is stopping; followers exit cleanly.
    Shutdown,
}

fn put(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put64(out: &mut Vec<u8>, v: u64) {
    put(out, v as u32);
    put(out, (v >> 32) as u32);
}

fn count(n: usize, what: &'static str) -> Result<u32, PlanError> {
    u32::try_from(n).map_err(|_| PlanError::Invalid {
        what,
        value: n as u64,
    })
}

/// Encodes the shutdown record.
pub fn encode_shutdown(out: &mut Vec<u8>) {
    out.clear();
    put(out, MAGIC);
    put(out, VERSION);
    put(out, KIND_SHUTDOWN);
    put64(out, 0);
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
        out.clear();
        put(out, MAGIC);
        put(out, VERSION);
        put(out, KIND_STEP);
        put64(out, self.step);
        self.step += 1;
        put(out, count(plan.seqs.len(), "sequence count")?);
        put(out, count(plan.preempted.len(), "preempted count")?);
        put(out, count(plan.finished.len(), "finished count")?);
        for id in &plan.preempted {
            put64(out, id.0);
        }
        for id in &plan.finished {
            put64(out, id.0);
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
            put64(out, s.seq.0);
            put(out, count(s.num_computed, "num_computed")?);
            put(out, count(s.num_tokens, "num_tokens")?);
            put(out, u32::from(s.sample));
            put(out, count(s.new_blocks.len(), "block count")?);
            put(out, count(new_tokens.len(), "token count")?);
            s.new_blocks.iter().for_each(|b| put(out, b.0));
            new_tokens.iter().for_each(|&t| put(out, t));
        }
        Ok(())
    }
}

/// A bounds-checked reader over a record.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn u32(&mut self, what: &'static str) -> Result<u32, PlanError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<4>()
            .ok_or(PlanError::Truncated { what })?;
        self.bytes = rest;
        Ok(u32::from_le_bytes(*head))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, PlanError> {
        let lo = self.u32(what)?;
        let hi = self.u32(what)?;
        Ok(u64::from(lo) | (u64::from(hi) << 32))
    }

    /// `n` words, checking first that they fit (so a corrupt count never allocates much).
    fn u32s(&mut self, n: u32, what: &'static str) -> Result<Vec<u32>, PlanError> {
        if self.bytes.len() / 4 < n as usize {
            return Err(PlanError::Truncated { what });
        }
        (0..n).map(|_| self.u32(what)).collect()
    }

    fn u64s(&mut self, n: u32, what: &'static str) -> Result<Vec<u64>, PlanError> {
        if self.bytes.len() / 8 < n as usize {
            return Err(PlanError::Truncated { what });
        }
        (0..n).map(|_| self.u64(what)).collect()
    }
}

/// Decodes one plan record; every count is checked against the record's length.
pub fn decode(bytes: &[u8]) -> Result<PlanMsg, PlanError> {
    let mut r = Reader { bytes };
    let magic = r.u32("magic")?;
    if magic != MAGIC {
        return Err(PlanError::BadMagic(magic));
    }
    let version = r.u32("version")?;
    if version != VERSION {
        return Err(PlanError::Version(version));
    }
    let kind = r.u32("kind")?;
    let step = r.u64("step")?;
    let msg = match kind {
        KIND_SHUTDOWN => PlanMsg::Shutdown,
        KIND_STEP => {
            let num_seqs = r.u32("sequence count")?;
            let num_preempted = r.u32("preempted count")?;
            let num_finished = r.u32("finished count")?;
            let preempted = r.u64s(num_preempted, "preempted ids")?;
            let finished = r.u64s(num_finished, "finished ids")?;
            // Each sequence takes at least 8 words.
            if r.bytes.len() / 32 < num_seqs as usize {
                return Err(PlanError::Truncated { what: "sequences" });
            }
            let mut seqs = Vec::with_capacity(num_seqs as usize);
            for _ in 0..num_seqs {
                let seq = r.u64("sequence id")?;
                let num_computed = r.u32("num_computed")?;
                let num_tokens = r.u32("num_tokens")?;
                let sample = match r.u32("sample flag")? {
                    0 => false,
                    1 => true,
                    v => {
                        return Err(PlanError::Invalid {
                            what: "sample flag",
                            value: v.into(),
                        });
                    }
                };
                let nb = r.u32("block count")?;
                let nt = r.u32("token count")?;
                seqs.push(PlanSeq {
                    seq,
                    num_computed,
                    num_tokens,
                    sample,
                    new_blocks: r.u32s(nb, "new blocks")?,
                    new_tokens: r.u32s(nt, "new tokens")?,
                });
            }
            PlanMsg::Step {
                step,
                seqs,
                preempted,
                finished,
            }
        }
        other => {
            return Err(PlanError::Invalid {
                what: "record kind",
                value: other.into(),
            });
        }
    };
    if !r.bytes.is_empty() {
        return Err(PlanError::TrailingBytes(r.bytes.len()));
    }
    Ok(msg)
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
    /// [`StepInputs::token_ids`] and [`StepInputs::positions`].
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
