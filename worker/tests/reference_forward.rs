//! The CPU backend against a plain f64 transformer written from the Llama equations (dense causal
//! attention, no paging, no fusion), on models the HF fixture does not cover: the demo model (bf16,
//! tied embeddings, Llama-3 RoPE scaling, head_dim 64) over a long prompt fed in odd chunks through a
//! scrambled block table, and a Qwen2-style model (q/k/v bias, linear RoPE, 4:1 GQA); and the
//! CPU backend's FP8 KV cache (`--kv-cache-dtype fp8`) against the same reference with every K and
//! V value rounded to E4M3 by a nearest-value search written here.

use std::path::Path;

use serde_json::json;
use worker::backend::cpu::{CpuBackend, CpuOptions};
use worker::backend::{Backend, ForwardBatch, SeqInput};
use worker::checkpoint::Checkpoint;
use worker::checkpoint::names::{self, expected_tensors, layer, layer_tensor};
use worker::config::ModelConfig;
use worker::quant::kv::KvCacheDtype;

/// A weight as f64, `[rows × cols]` row-major.
fn get(ckpt: &Checkpoint, name: &str) -> Vec<f64> {
    ckpt.tensor_f32(name)
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

/// `w · x` for an HF linear weight `w` of shape `[out × x.len()]`.
fn linear(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * inv * w).collect()
}

/// Rotates each `d`-wide head: pair (i, i + d/2) by `pos * inv_freq[i]`.
fn rope(x: &mut [f64], d: usize, pos: usize, inv_freq: &[f32]) {
    for head in x.chunks_exact_mut(d) {
        for i in 0..d / 2 {
            let angle = pos as f64 * f64::from(inv_freq[i]);
            let (c, s) = (angle.cos(), angle.sin());
            let (a, b) = (head[i], head[i + d / 2]);
            head[i] = a * c - b * s;
            head[i + d / 2] = b * c + a * s;
        }
    }
}

/// Every finite non-negative E4M3 value, by code (0..=126), from the format's definition.
fn e4m3_values() -> Vec<f64> {
    (0u8..=126)
        .map(|c| {
            let (e, m) = (i32::from(c >> 3), f64::from(c & 7));
            if e == 0 {
                m / 8.0 * 2f64.powi(-6)
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 7)
            }
        })
        .collect()
}

/// `x · (1 / scale)` rounded to the nearest E4M3 value (ties to the even code, saturating at
/// 448) and scaled back: what an FP8 KV cache with `scale` reads back.
fn fp8_kv(x: f64, scale: f64, values: &[f64]) -> f64 {
    let a = (x / scale).abs();
    let mut best = 0usize;
    for (c, v) in values.iter().enumerate() {
        let (d, bd) = ((v - a).abs(), (values[best] - a).abs());
        if d < bd || (d == bd && c % 2 == 0) {
            best = c;
        }
    }
    values[best].copysign(x) * scale
}

/// Logits after every token of `tokens`, computed densely in f64.
fn reference_logits(cfg: &ModelConfig, ckpt: &Checkpoint, tokens: &[u32]) -> Vec<Vec<f64>> {
    reference_logits_kv(cfg, ckpt, tokens, &|x| x)
}

/// [`reference_logits`] with every K and V value passed through `kv` (after RoPE), as a cache
/// that stores them approximately would.
fn reference_logits_kv(
    cfg: &ModelConfig,
    ckpt: &Checkpoint,
    tokens: &[u32],
    kv: &dyn Fn(f64) -> f64,
) -> Vec<Vec<f64>> {
    let (h, d) = (cfg.hidden_size, cfg.head_dim);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let eps = f64::from(cfg.rms_norm_eps);
    let inv_freq = cfg.rope.inv_freq(d);
    let embed = get(ckpt, names::EMBED_TOKENS);
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| embed[t as usize * h..(t as usize + 1) * h].to_vec())
        .collect();
    for l in 0..cfg.num_hidden_layers {
        let w = |s: &str| get(ckpt, &layer_tensor(l, s));
        let (wq, wk, wv, wo) = (
            w(layer::Q_PROJ),
            w(layer::K_PROJ),
            w(layer::V_PROJ),
            w(layer::O_PROJ),
        );
        let bias = |s: &str, n: usize| {
            if cfg.qkv_bias { w(s) } else { vec![0.0; n] }
        };
        let (bq, bk, bv) = (
            bias(layer::Q_BIAS, cfg.q_dim()),
            bias(layer::K_BIAS, cfg.kv_dim()),
            bias(layer::V_BIAS, cfg.kv_dim()),
        );
        let add = |mut v: Vec<f64>, b: &[f64]| {
            v.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            v
        };
        let (norm1, norm2) = (w(layer::INPUT_NORM), w(layer::POST_ATTENTION_NORM));
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let n = rms_norm(x, &norm1, eps);
            let mut q = add(linear(&wq, &n), &bq);
            let mut k = add(linear(&wk, &n), &bk);
            rope(&mut q, d, pos, &inv_freq);
            rope(&mut k, d, pos, &inv_freq);
            qs.push(q);
            ks.push(k.into_iter().map(kv).collect::<Vec<f64>>());
            vs.push(
                add(linear(&wv, &n), &bv)
                    .into_iter()
                    .map(kv)
                    .collect::<Vec<f64>>(),
            );
        }
        let (wg, wu, wd) = (w(layer::GATE_PROJ), w(layer::UP_PROJ), w(layer::DOWN_PROJ));
        for t in 0..xs.len() {
            let mut attn = vec![0.0; cfg.q_dim()];
            for head in 0..nh {
                let kvh = head / (nh / nkv);
                let q = &qs[t][head * d..(head + 1) * d];
                let scores: Vec<f64> = (0..=t)
                    .map(|j| {
                        let k = &ks[j][kvh * d..(kvh + 1) * d];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = exps.iter().sum();
                for (j, e) in exps.iter().enumerate() {
                    for i in 0..d {
                        attn[head * d + i] += e / sum * vs[j][kvh * d + i];
                    }
                }
            }
            let o = linear(&wo, &attn);
            xs[t].iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let n = rms_norm(&xs[t], &norm2, eps);
            let (g, u) = (linear(&wg, &n), linear(&wu, &n));
            let act: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let down = linear(&wd, &act);
            xs[t].iter_mut().zip(&down).for_each(|(x, o)| *x += o);
        }
    }
    let final_norm = get(ckpt, names::FINAL_NORM);
    let head = get(ckpt, names::lm_head_name(cfg));
    xs.iter()
        .map(|x| linear(&head, &rms_norm(x, &final_norm, eps)))
        .collect()
}

/// Feeds `tokens` through the backend in chunks of `chunk`, returning the logits of the last token
/// of every chunk, paired with that token's index.
fn backend_logits(
    backend: &mut CpuBackend,
    tokens: &[u32],
    chunk: usize,
    table: &[u32],
) -> Vec<(usize, Vec<f32>)> {
    let mut out = Vec::new();
    let mut done = 0;
    while done < tokens.len() {
        let len = chunk.min(tokens.len() - done);
        let positions: Vec<u32> = (done as u32..(done + len) as u32).collect();
        let seqs = [SeqInput {
            query_start: 0,
            query_len: len,
            context_len: done + len,
            block_table: table,
            sample: true,
        }];
        let logits = backend
            .forward(&ForwardBatch {
                token_ids: &tokens[done..done + len],
                positions: &positions,
                seqs: &seqs,
            })
            .unwrap();
        done += len;
        out.push((done - 1, logits.row(0).to_vec()));
    }
    out
}

/// Compares the backend, fed in chunks of each size in `chunks`, with the f64 reference.
fn compare(dir: &Path, tokens: &[u32], chunks: &[usize], block_size: usize) {
    let (cfg, ckpt) = Checkpoint::load(dir).unwrap();
    let want = reference_logits(&cfg, &ckpt, tokens);
    for &chunk in chunks {
        let diff = compare_chunked(
            &cfg,
            &ckpt,
            (tokens, &want),
            chunk,
            block_size,
            KvCacheDtype::Auto,
        );
        assert!(
            diff < 1e-4,
            "chunk {chunk}: max diff {diff} of the logits' scale"
        );
    }
}

/// The backend fed in chunks of `chunk` through a scrambled block table, against `want`: the
/// largest difference of any compared logit, relative to its row's largest magnitude.
fn compare_chunked(
    cfg: &ModelConfig,
    ckpt: &Checkpoint,
    (tokens, want): (&[u32], &[Vec<f64>]),
    chunk: usize,
    block_size: usize,
    kv_cache_dtype: KvCacheDtype,
) -> f64 {
    let blocks = tokens.len().div_ceil(block_size);
    // A scrambled table: block ids 1..=blocks in a fixed shuffled order.
    let table: Vec<u32> = (0..blocks)
        .map(|i| ((i * 7 + 3) % blocks + 1) as u32)
        .collect();
    let options = CpuOptions {
        block_size,
        num_kv_blocks: blocks + 1,
        quantization: None,
        kv_cache_dtype,
    };
    let mut backend = CpuBackend::new(cfg, ckpt, options).unwrap();
    let got = backend_logits(&mut backend, tokens, chunk, &table);
    got.iter()
        .map(|(t, row)| {
            let scale = want[*t].iter().fold(1.0f64, |m, v| m.max(v.abs()));
            let diff = row
                .iter()
                .zip(&want[*t])
                .map(|(a, b)| (f64::from(*a) - b).abs())
                .fold(0.0, f64::max);
            diff / scale
        })
        .fold(0.0, f64::max)
}

/// `--kv-cache-dtype fp8` on the demo model (scales 1.0: it has none): within 2e-3 of the f64
/// reference whose K and V are rounded to E4M3 here (the backend rounds its f32 values, so a
/// near-tie can take the other code), and clearly off the unrounded reference — the rounding is
/// applied, on both attention paths (chunks of 150 and 37: GEMM; 5: per token).
#[test]
fn fp8_kv_cache_reads_back_the_e4m3_values() {
    let dir = tempfile::tempdir().unwrap();
    worker::demo::write_demo_model(dir.path()).unwrap();
    let (cfg, ckpt) = Checkpoint::load(dir.path()).unwrap();
    let tokens: Vec<u32> = (0..150u32)
        .map(|i| (i * 37 + 11) % cfg.vocab_size as u32)
        .collect();
    let values = e4m3_values();
    let rounded = reference_logits_kv(&cfg, &ckpt, &tokens, &|x| fp8_kv(x, 1.0, &values));
    let exact = reference_logits(&cfg, &ckpt, &tokens);
    for chunk in [150, 37, 5] {
        let fp8 = KvCacheDtype::Fp8E4m3;
        let near = compare_chunked(&cfg, &ckpt, (&tokens, &rounded), chunk, 16, fp8);
        let far = compare_chunked(&cfg, &ckpt, (&tokens, &exact), chunk, 16, fp8);
        println!("chunk {chunk}: {near:.2e} from the E4M3 reference, {far:.2e} from the exact one");
        assert!(near < 2e-3, "chunk {chunk}: {near} from the E4M3 reference");
        assert!(
            far > 5.0 * near,
            "chunk {chunk}: {far} from the exact reference, {near} from E4M3"
        );
    }
}

#[test]
fn demo_model_long_prompt_in_chunks() {
    let dir = tempfile::tempdir().unwrap();
    worker::demo::write_demo_model(dir.path()).unwrap();
    let cfg = ModelConfig::load(dir.path()).unwrap();
    let tokens: Vec<u32> = (0..150u32)
        .map(|i| (i * 37 + 11) % cfg.vocab_size as u32)
        .collect();
    // Chunks of 150 and 37 take the GEMM attention path (150: three query tiles), 5 the per-token one.
    compare(dir.path(), &tokens, &[150, 37, 5], 16);
}

#[test]
fn qwen2_bias_linear_rope_gqa() {
    let config = json!({
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": 96,
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "sliding_window": 4096,
        "use_sliding_window": false,
        "tie_word_embeddings": false
    });
    let cfg = ModelConfig::from_json(Path::new("config.json"), &config, None).unwrap();
    assert!(cfg.qkv_bias);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = expected_tensors(&cfg)
        .enumerate()
        .map(|(k, (name, shape))| {
            let n: usize = shape.iter().product();
            let bytes = (0..n)
                .flat_map(|i| {
                    let x = ((i * 2654435761 + k * 40503) % 1000) as f32 / 1000.0 - 0.5;
                    let v = if shape.len() == 1 && name.contains("norm") {
                        1.0 + 0.2 * x
                    } else {
                        0.3 * x
                    };
                    v.to_le_bytes()
                })
                .collect();
            (name, shape, bytes)
        })
        .collect();
    let views = tensors.iter().map(|(name, shape, bytes)| {
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .unwrap();
        (name.clone(), view)
    });
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    let tokens: Vec<u32> = (0..41u32).map(|i| (i * 13 + 5) % 96).collect();
    compare(dir.path(), &tokens, &[41, 17, 6], 4);
}
