//! Parity of the CPU backend with HuggingFace transformers on `tests/fixtures/tiny-llama`: the
//! last-position logits within 1e-4 and the 24 greedy tokens identical, for every case, whether the
//! prompt is fed whole, in chunks, or batched with the other cases.

use std::path::PathBuf;

use worker::backend::cpu::{CpuBackend, CpuOptions};
use worker::backend::{Backend, ForwardBatch, SeqInput};
use worker::checkpoint::Checkpoint;

const BLOCK_SIZE: usize = 4;
const BLOCKS_PER_SEQ: usize = 24;

struct Case {
    prompt: Vec<u32>,
    last_logits: Vec<f32>,
    greedy: Vec<u32>,
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-llama")
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixture_dir().join("expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: ids(&c["prompt"]),
            last_logits: c["last_logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect(),
            greedy: ids(&c["greedy"]),
        })
        .collect()
}

fn backend(num_seqs: usize) -> CpuBackend {
    let (config, ckpt) = Checkpoint::load(&fixture_dir()).unwrap();
    let options = CpuOptions {
        block_size: BLOCK_SIZE,
        num_kv_blocks: 1 + num_seqs * BLOCKS_PER_SEQ,
        quantization: None,
        kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
    };
    CpuBackend::new(&config, &ckpt, options).unwrap()
}

/// One sequence being driven by hand: its tokens so far, how many are in the cache, its blocks.
struct Seq {
    tokens: Vec<u32>,
    cached: usize,
    table: Vec<u32>,
    generated: Vec<u32>,
    first_logits: Option<Vec<f32>>,
}

impl Seq {
    fn new(prompt: &[u32], index: usize) -> Self {
        // Blocks handed out in reverse so that tables are not the identity.
        let table = (0..BLOCKS_PER_SEQ)
            .rev()
            .map(|b| (1 + index * BLOCKS_PER_SEQ + b) as u32)
            .collect();
        Self {
            tokens: prompt.to_vec(),
            cached: 0,
            table,
            generated: Vec::new(),
            first_logits: None,
        }
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Runs steps until every sequence has `steps` greedy tokens. Each step feeds each sequence at most
/// `chunk` uncached tokens; a sequence samples when its chunk reaches the end of its tokens.
fn run(backend: &mut CpuBackend, seqs: &mut [Seq], chunk: usize, steps: usize) {
    while seqs.iter().any(|s| s.generated.len() < steps) {
        let mut token_ids = Vec::new();
        let mut positions = Vec::new();
        let mut spans = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            if s.generated.len() >= steps {
                continue;
            }
            let len = (s.tokens.len() - s.cached).min(chunk);
            let start = token_ids.len();
            for p in s.cached..s.cached + len {
                token_ids.push(s.tokens[p]);
                positions.push(p as u32);
            }
            spans.push((i, start, len));
        }
        let inputs: Vec<SeqInput<'_>> = spans
            .iter()
            .map(|&(i, start, len)| {
                let s = &seqs[i];
                SeqInput {
                    query_start: start,
                    query_len: len,
                    context_len: s.cached + len,
                    block_table: &s.table,
                    sample: s.cached + len == s.tokens.len(),
                }
            })
            .collect();
        let batch = ForwardBatch {
            token_ids: &token_ids,
            positions: &positions,
            seqs: &inputs,
        };
        let logits = backend.forward(&batch).unwrap();
        assert_eq!(logits.rows(), batch.num_samples());
        let sampling: Vec<bool> = inputs.iter().map(|s| s.sample).collect();
        drop(inputs);
        let mut row = 0;
        for (&(i, _, len), sample) in spans.iter().zip(sampling) {
            let s = &mut seqs[i];
            s.cached += len;
            if sample {
                let r = logits.row(row);
                row += 1;
                if s.first_logits.is_none() {
                    s.first_logits = Some(r.to_vec());
                }
                let next = argmax(r);
                s.generated.push(next);
                s.tokens.push(next);
            }
        }
    }
}

fn check(seqs: &[Seq], cases: &[Case], label: &str) {
    for (i, (s, c)) in seqs.iter().zip(cases).enumerate() {
        let logits = s.first_logits.as_ref().unwrap();
        assert_eq!(logits.len(), c.last_logits.len());
        let max_abs = logits
            .iter()
            .zip(&c.last_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            max_abs < 1e-4,
            "{label}: case {i}: max |logit diff| = {max_abs}"
        );
        assert_eq!(s.generated, c.greedy, "{label}: case {i}: greedy tokens");
    }
}

#[test]
fn each_case_alone_matches_hf() {
    let cases = cases();
    assert_eq!(cases.len(), 4);
    for (i, c) in cases.iter().enumerate() {
        let mut be = backend(1);
        let mut seqs = vec![Seq::new(&c.prompt, 0)];
        run(&mut be, &mut seqs, usize::MAX, c.greedy.len());
        check(&seqs, std::slice::from_ref(c), &format!("alone {i}"));
    }
}

#[test]
fn chunked_prefill_matches_hf() {
    let cases = cases();
    for chunk in [1, 3, 7] {
        for (i, c) in cases.iter().enumerate() {
            let mut be = backend(1);
            let mut seqs = vec![Seq::new(&c.prompt, 0)];
            run(&mut be, &mut seqs, chunk, c.greedy.len());
            check(
                &seqs,
                std::slice::from_ref(c),
                &format!("chunk {chunk} case {i}"),
            );
        }
    }
}

#[test]
fn all_cases_batched_match_hf() {
    let cases = cases();
    let steps = cases[0].greedy.len();
    for chunk in [usize::MAX, 5] {
        let mut be = backend(cases.len());
        let mut seqs: Vec<Seq> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| Seq::new(&c.prompt, i))
            .collect();
        run(&mut be, &mut seqs, chunk, steps);
        check(&seqs, &cases, &format!("batched, chunk {chunk}"));
    }
}

#[test]
fn malformed_batches_are_errors() {
    let mut be = backend(1);
    let table = [1u32, 2];
    let good = SeqInput {
        query_start: 0,
        query_len: 2,
        context_len: 2,
        block_table: &table,
        sample: true,
    };
    let mut try_batch = |ids: &[u32], pos: &[u32], seq: SeqInput<'_>| {
        be.forward(&ForwardBatch {
            token_ids: ids,
            positions: pos,
            seqs: &[seq],
        })
    };
    assert!(try_batch(&[5, 6], &[0, 1], good).is_ok());
    let null_table = [0u32];
    let cases: Vec<(&[u32], &[u32], SeqInput<'_>)> = vec![
        (&[5, 6], &[0], good),          // positions length
        (&[5, 600], &[0, 1], good),     // token outside vocab
        (&[5, 6], &[0, 2], good),       // position disagrees with context_len
        (&[5, 6, 7], &[0, 1, 2], good), // token not covered by a sequence
        (
            &[5, 6],
            &[0, 1],
            SeqInput {
                context_len: 9,
                ..good
            },
        ), // table too short
        (
            &[5, 6],
            &[0, 1],
            SeqInput {
                block_table: &null_table,
                ..good
            },
        ),
        (
            &[5, 6],
            &[0, 1],
            SeqInput {
                query_len: 3,
                ..good
            },
        ),
        (
            &[5, 6],
            &[0, 1],
            SeqInput {
                query_start: 1,
                ..good
            },
        ),
        (
            &[5, 6],
            &[0, 1],
            SeqInput {
                block_table: &[99, 1],
                ..good
            },
        ),
    ];
    for (i, (ids, pos, seq)) in cases.into_iter().enumerate() {
        let err = try_batch(ids, pos, seq);
        assert!(
            matches!(err, Err(worker::backend::BackendError::InvalidBatch(_))),
            "case {i}: {err:?}"
        );
    }
}
