//! The tensor-parallel step-plan record: rank 0 of a group sends one per engine step to each of
//! ranks 1..T-1 over a shared-memory ring. It carries diffs (a new sequence's tokens once, then
//! per step only counts, new block ids and finished ids); `worker::tp::plan` computes the diffs
//! and mirrors them back into batches.
//!
//! # Layout (little-endian u32 words; ids are two words, low first)
//!
//! ```text
//! magic "RSPL" | version | kind (1 step, 2 shutdown) | step (u64)
//! num_seqs | num_preempted | num_finished
//! preempted ids (u64 each) | finished ids (u64 each)
//! per seq: id (u64) | num_computed | num_tokens | sample (0/1) | num_new_blocks | num_new_tokens
//!          | new_blocks … | new_tokens …
//! ```

use thiserror::Error;

const MAGIC: u32 = u32::from_le_bytes(*b"RSPL");
/// Layout version; bump on any change to the layout above.
pub const VERSION: u32 = 1;
const KIND_STEP: u32 = 1;
const KIND_SHUTDOWN: u32 = 2;

/// A plan record that cannot be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanWireError {
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

fn count(n: usize, what: &'static str) -> Result<u32, PlanWireError> {
    u32::try_from(n).map_err(|_| PlanWireError::Invalid {
        what,
        value: n as u64,
    })
}

/// Encodes the shutdown record into `out` (cleared first).
pub fn encode_shutdown(out: &mut Vec<u8>) {
    out.clear();
    put(out, MAGIC);
    put(out, VERSION);
    put(out, KIND_SHUTDOWN);
    put64(out, 0);
}

/// Starts a step record in `out` (cleared first); follow with exactly `num_seqs` calls of
/// [`push_seq`].
pub fn begin_step(
    out: &mut Vec<u8>,
    step: u64,
    num_seqs: usize,
    preempted: &[u64],
    finished: &[u64],
) -> Result<(), PlanWireError> {
    out.clear();
    put(out, MAGIC);
    put(out, VERSION);
    put(out, KIND_STEP);
    put64(out, step);
    put(out, count(num_seqs, "sequence count")?);
    put(out, count(preempted.len(), "preempted count")?);
    put(out, count(finished.len(), "finished count")?);
    preempted.iter().for_each(|&id| put64(out, id));
    finished.iter().for_each(|&id| put64(out, id));
    Ok(())
}

/// Appends one sequence to the step record [`begin_step`] started.
pub fn push_seq(
    out: &mut Vec<u8>,
    seq: u64,
    num_computed: usize,
    num_tokens: usize,
    sample: bool,
    new_blocks: &[u32],
    new_tokens: &[u32],
) -> Result<(), PlanWireError> {
    put64(out, seq);
    put(out, count(num_computed, "num_computed")?);
    put(out, count(num_tokens, "num_tokens")?);
    put(out, u32::from(sample));
    put(out, count(new_blocks.len(), "block count")?);
    put(out, count(new_tokens.len(), "token count")?);
    new_blocks.iter().for_each(|&b| put(out, b));
    new_tokens.iter().for_each(|&t| put(out, t));
    Ok(())
}

/// A bounds-checked reader over a record.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn u32(&mut self, what: &'static str) -> Result<u32, PlanWireError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<4>()
            .ok_or(PlanWireError::Truncated { what })?;
        self.bytes = rest;
        Ok(u32::from_le_bytes(*head))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, PlanWireError> {
        let lo = self.u32(what)?;
        let hi = self.u32(what)?;
        Ok(u64::from(lo) | (u64::from(hi) << 32))
    }

    /// `n` words, checking first that they fit (so a corrupt count never allocates much).
    fn u32s(&mut self, n: u32, what: &'static str) -> Result<Vec<u32>, PlanWireError> {
        if self.bytes.len() / 4 < n as usize {
            return Err(PlanWireError::Truncated { what });
        }
        (0..n).map(|_| self.u32(what)).collect()
    }

    fn u64s(&mut self, n: u32, what: &'static str) -> Result<Vec<u64>, PlanWireError> {
        if self.bytes.len() / 8 < n as usize {
            return Err(PlanWireError::Truncated { what });
        }
        (0..n).map(|_| self.u64(what)).collect()
    }
}

/// Decodes one plan record; every count is checked against the record's length.
pub fn decode(bytes: &[u8]) -> Result<PlanMsg, PlanWireError> {
    let mut r = Reader { bytes };
    let magic = r.u32("magic")?;
    if magic != MAGIC {
        return Err(PlanWireError::BadMagic(magic));
    }
    let version = r.u32("version")?;
    if version != VERSION {
        return Err(PlanWireError::Version(version));
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
                return Err(PlanWireError::Truncated { what: "sequences" });
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
                        return Err(PlanWireError::Invalid {
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
            return Err(PlanWireError::Invalid {
                what: "record kind",
                value: other.into(),
            });
        }
    };
    if !r.bytes.is_empty() {
        return Err(PlanWireError::TrailingBytes(r.bytes.len()));
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_and_a_shutdown_round_trip() {
        let mut out = Vec::new();
        begin_step(&mut out, 7, 2, &[3], &[1, 2]).unwrap();
        push_seq(&mut out, 9, 0, 3, true, &[4, 5], &[10, 11, 12]).unwrap();
        push_seq(&mut out, 1 << 40, 3, 1, false, &[], &[13]).unwrap();
        let want = PlanMsg::Step {
            step: 7,
            seqs: vec![
                PlanSeq {
                    seq: 9,
                    num_computed: 0,
                    num_tokens: 3,
                    sample: true,
                    new_blocks: vec![4, 5],
                    new_tokens: vec![10, 11, 12],
                },
                PlanSeq {
                    seq: 1 << 40,
                    num_computed: 3,
                    num_tokens: 1,
                    sample: false,
                    new_blocks: vec![],
                    new_tokens: vec![13],
                },
            ],
            preempted: vec![3],
            finished: vec![1, 2],
        };
        assert_eq!(decode(&out), Ok(want));
        for len in 0..out.len() {
            assert!(
                matches!(decode(&out[..len]), Err(PlanWireError::Truncated { .. })),
                "{len}"
            );
        }
        encode_shutdown(&mut out);
        assert_eq!(decode(&out), Ok(PlanMsg::Shutdown));
    }

    #[test]
    fn a_count_past_u32_is_an_error() {
        let mut out = Vec::new();
        assert_eq!(
            begin_step(&mut out, 0, usize::MAX, &[], &[]),
            Err(PlanWireError::Invalid {
                what: "sequence count",
                value: usize::MAX as u64
            })
        );
    }
}
