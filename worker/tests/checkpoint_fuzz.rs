//! Hostile checkpoints, generated: a fixture's `config.json` with a field set to an absurd value,
//! or one of its tensors reshaped, retyped, dropped or joined by a stranger, loaded and run through
//! the CPU backend. Every case must end in a value or a typed error, never a panic or an abort.

mod common;

use common::{Tensors, edited};
use proptest::prelude::*;
use safetensors::Dtype as StDtype;
use serde_json::{Value, json};
use worker::backend::cpu::{CpuBackend, CpuOptions};
use worker::backend::{Backend, ForwardBatch, SeqInput};
use worker::checkpoint::Checkpoint;

/// The config fields a model's shape comes from.
const FIELDS: [&str; 12] = [
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "vocab_size",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "rope_parameters",
    "eos_token_id",
];

fn absurd(i: usize) -> Value {
    [
        json!(0),
        json!(1),
        json!(-1),
        json!(3),
        json!(1u64 << 31),
        json!(1u64 << 62),
        json!(u64::MAX),
        json!(1e300),
        json!(0.5),
        json!("64"),
        Value::Null,
        json!(true),
        json!([64]),
        json!({"rope_type": "llama3", "factor": -2.0}),
    ][i % 14]
        .clone()
}

/// Edits tensor `pick` (of the sorted names) as `how` says, keeping each tensor serializable.
fn mutate_tensor(t: &mut Tensors, pick: usize, how: u8, n: usize) {
    let mut names: Vec<String> = t.keys().cloned().collect();
    names.sort();
    let name = names[pick % names.len()].clone();
    match how % 6 {
        0 => {
            t.remove(&name);
        }
        1 => {
            // Transposed (same element count, other shape).
            let e = t.get_mut(&name).unwrap();
            e.1.reverse();
        }
        2 => {
            // Flattened to one dimension, or given a leading 1.
            let e = t.get_mut(&name).unwrap();
            e.1 = if n.is_multiple_of(2) {
                vec![e.1.iter().product()]
            } else {
                [vec![1], e.1.clone()].concat()
            };
        }
        3 => {
            // Another dtype of the same byte size per element, or of another size (data resized).
            let e = t.get_mut(&name).unwrap();
            let dtypes = [
                StDtype::F16,
                StDtype::BF16,
                StDtype::I32,
                StDtype::U8,
                StDtype::F64,
                StDtype::I64,
            ];
            let dtype = dtypes[n % dtypes.len()];
            let numel: usize = e.1.iter().product();
            e.0 = dtype;
            e.2.resize(numel * dtype.bitsize() / 8, 0x7f);
        }
        4 => {
            // One row fewer or more (data resized).
            let e = t.get_mut(&name).unwrap();
            let per_row: usize = e.1[1..].iter().product::<usize>() * e.0.bitsize() / 8;
            e.1[0] = if n.is_multiple_of(2) {
                e.1[0].saturating_sub(1).max(1)
            } else {
                e.1[0] + 1
            };
            e.2.resize(e.1[0] * per_row, 0);
        }
        _ => {
            // A stranger beside the model's own tensors.
            t.insert(
                format!("model.layers.{}.self_attn.extra.weight", n % 4),
                (StDtype::F32, vec![2, 2], vec![0; 16]),
            );
        }
    }
}

/// Loads the folder and, when it loads, builds the CPU backend and runs one prompt.
fn load_and_run(dir: &std::path::Path) {
    let Ok((config, ckpt)) = Checkpoint::load(dir) else {
        return;
    };
    let options = CpuOptions {
        block_size: 16,
        num_kv_blocks: 8,
        quantization: None,
        kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
    };
    let Ok(mut backend) = CpuBackend::new(&config, &ckpt, options) else {
        return;
    };
    let prompt = [1u32, 5, 9];
    let table = [1u32];
    let seqs = [SeqInput {
        query_start: 0,
        query_len: 3,
        context_len: 3,
        block_table: &table,
        sample: true,
    }];
    let _ = backend.forward(&ForwardBatch {
        token_ids: &prompt,
        positions: &[0, 1, 2],
        seqs: &seqs,
    });
}

/// Every field of [`FIELDS`] with every value of [`absurd`]: 168 folders.
#[test]
fn absurd_config_values_are_errors_or_run() {
    for field in FIELDS {
        for value in 0..14 {
            eprintln!("{field} = {}", absurd(value));
            let dir = edited("tiny-llama", |c, _| c[field] = absurd(value));
            load_and_run(dir.path());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn reshaped_retyped_missing_or_stray_tensors_are_errors_or_run(
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<usize>()), 1..3),
    ) {
        let dir = edited("tiny-llama", |_, t| {
            for (pick, how, n) in edits {
                mutate_tensor(t, pick, how, n);
            }
        });
        load_and_run(dir.path());
    }
}
