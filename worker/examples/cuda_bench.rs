//! CUDA backend benchmarks and checks on a real-size model (run on the GPU machine; see
//! `scripts/gpu_bench.sh`): start-up, decode ms/step per batch and context, prefill tokens/s,
//! attention and GEMV kernels alone, a logits dump for the accuracy comparison with
//! HuggingFace (`scripts/accuracy_vs_hf.py`), and greedy batch invariance (alone vs 64).
//!
//! usage: cuda_bench MODEL_DIR OUT_JSON LOGITS_DUMP PROMPTS_JSON
//!        cuda_bench accuracy MODEL_DIR LOGITS_DUMP PROMPTS_JSON (only the two logits dumps)
//!        (any mode that loads a model: `--kv-cache-dtype=fp8` for an FP8 KV cache,
//!        `--quantization=fp8` for FP8 linear layers)
//!        cuda_bench attention CASE   (one attention case alone, for profiling)
//!        cuda_bench decode MODEL_DIR BATCHES CTX STEPS (decode ms/step only, e.g. under a profiler;
//!                                    BATCHES comma-separated)
//!        cuda_bench gemv OUT_JSON    (GEMV kernel vs cuBLAS at the 8B shapes, batch 1-8, no model)
//!        cuda_bench kernels OUT_JSON (every attention case alone at the 8B shape, no model)
//!        cuda_bench int4 OUT_JSON [BATCHES] (the INT4 GEMVs, the tensor-core product and
//!                                    dequantization + cuBLAS at the 8B shapes, batch 1-256 or the
//!                                    comma-separated BATCHES, groups of 128, no model)
//!        cuda_bench int4one SHAPE M KERNEL (one INT4 tile or tensor-core kernel launched thrice,
//!                                    for ncu)

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};
use worker::backend::cuda::ops::{self, Attention, Linear};
use worker::backend::cuda::{CudaBackend, CudaOptions, DType, Gpu, PrefillKernel};
use worker::backend::switches::KernelSwitches;
use worker::backend::{Backend, DeviceSampling, ForwardBatch, SeqInput};
use worker::checkpoint::Checkpoint;
use worker::engine::{Engine, EngineConfig};
use worker::kv::SeqId;
use worker::request::Request;
use worker::sampler::SamplingParams;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const GREEDY: DeviceSampling = DeviceSampling::GREEDY;

/// Deterministic prompt tokens in [10, 120000).
fn prompt(len: usize, salt: u64) -> Vec<u32> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ salt.wrapping_mul(0x1234_5677);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            10 + (x % 119_990) as u32
        })
        .collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Runs decode steps for `batch` sequences whose contexts grow from `ctx` (or stay at it with
/// `CUDA_BENCH_FIXED_CTX=1`); returns ms/step.
fn time_decode(b: &mut CudaBackend, batch: usize, ctx: usize, steps: usize) -> Res<f64> {
    let bs = b.block_size();
    let per_seq = (ctx + steps + 8).div_ceil(bs);
    // Block ids: contiguous per sequence, or (CUDA_BENCH_TABLES) each sequence's in descending
    // order ("reversed", as blocks freed last come back first), a fixed permutation of them all
    // ("scattered"), or as the engine allocates them ("engine": the blocks the prompt fills
    // contiguous per sequence, then the decode blocks interleaved across the batch, one per
    // sequence whenever its context crosses a block), to see what the physical layout of a decode
    // batch's KV costs.
    let n = batch * per_seq;
    let prompt_blocks = ctx.div_ceil(bs).min(per_seq);
    let layout = std::env::var("CUDA_BENCH_TABLES").unwrap_or_default();
    let block = |q: usize| -> u32 {
        let (s, j) = (q / per_seq, q % per_seq);
        let p = match layout.as_str() {
            "reversed" => s * per_seq + (per_seq - 1 - j),
            "scattered" if gcd(7919, n) == 1 => q * 7919 % n,
            "engine" if j < prompt_blocks => s * prompt_blocks + j,
            "engine" => batch * prompt_blocks + (j - prompt_blocks) * batch + s,
            _ => q,
        };
        (1 + p) as u32
    };
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|s| (0..per_seq).map(|j| block(s * per_seq + j)).collect())
        .collect();
    // The context's KV written by a real prefill first (in chunks of at most 8,192 tokens), as the
    // engine's would be; CUDA_BENCH_ZERO_KV=1 leaves it zero, as runs before 12m timed it.
    if std::env::var("CUDA_BENCH_ZERO_KV").as_deref() != Ok("1") && ctx > 1 {
        let per_chunk = (8192 / (ctx - 1)).max(1);
        for first in (0..batch).step_by(per_chunk) {
            let group: Vec<usize> = (first..batch.min(first + per_chunk)).collect();
            let mut ids = Vec::new();
            let mut pos = Vec::new();
            for &s in &group {
                ids.extend(prompt(ctx - 1, s as u64));
                pos.extend(0..(ctx - 1) as u32);
            }
            let seqs: Vec<SeqInput<'_>> = group
                .iter()
                .enumerate()
                .map(|(i, &s)| SeqInput {
                    query_start: i * (ctx - 1),
                    query_len: ctx - 1,
                    context_len: ctx - 1,
                    block_table: &tables[s],
                    sample: true,
                })
                .collect();
            let batch_in = ForwardBatch {
                token_ids: &ids,
                positions: &pos,
                seqs: &seqs,
            };
            b.forward_sampled(&batch_in, &vec![GREEDY; group.len()])?;
        }
    }
    let mut ids: Vec<u32> = (0..batch as u32).map(|i| 1000 + i).collect();
    let sampling = vec![GREEDY; batch];
    // CUDA_BENCH_FIXED_CTX=1: every step decodes at context `ctx` (rewriting the same KV slot),
    // so a long run's step time changes only with the GPU's state (clocks under the power cap),
    // not with a growing context.
    let fixed = std::env::var("CUDA_BENCH_FIXED_CTX").as_deref() == Ok("1");
    // CUDA_BENCH_FEED=1: each step's input tokens are the previous step's sampled ones, as in
    // generation, instead of the same ids every step.
    let feed = std::env::var("CUDA_BENCH_FEED").as_deref() == Ok("1");
    let run = |b: &mut CudaBackend, step: usize, ids: &[u32]| -> Res<Vec<u32>> {
        let context = if fixed { ctx } else { ctx + step };
        let pos: Vec<u32> = vec![(context - 1) as u32; batch];
        let seqs: Vec<SeqInput<'_>> = (0..batch)
            .map(|s| SeqInput {
                query_start: s,
                query_len: 1,
                context_len: context,
                block_table: &tables[s],
                sample: true,
            })
            .collect();
        let sampled = b.forward_sampled(
            &ForwardBatch {
                token_ids: ids,
                positions: &pos,
                seqs: &seqs,
            },
            &sampling,
        )?;
        Ok(sampled.unwrap_or_default())
    };
    let mut t = Instant::now();
    for s in 0..3 + steps {
        if s == 3 {
            b.gpu().sync()?;
            t = Instant::now();
        }
        let sampled = run(b, s, &ids)?;
        if feed && sampled.len() == batch {
            ids = sampled;
        }
    }
    b.gpu().sync()?;
    Ok(t.elapsed().as_secs_f64() * 1e3 / steps as f64)
}

/// One prefill step of `batch` prompts of `len` tokens; returns seconds.
fn time_prefill(b: &mut CudaBackend, batch: usize, len: usize) -> Res<f64> {
    let bs = b.block_size();
    let per_seq = len.div_ceil(bs);
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|s| (0..per_seq).map(|j| (1 + s * per_seq + j) as u32).collect())
        .collect();
    let mut ids = Vec::new();
    let mut pos = Vec::new();
    for s in 0..batch {
        ids.extend(prompt(len, s as u64));
        pos.extend(0..len as u32);
    }
    let seqs: Vec<SeqInput<'_>> = (0..batch)
        .map(|s| SeqInput {
            query_start: s * len,
            query_len: len,
            context_len: len,
            block_table: &tables[s],
            sample: true,
        })
        .collect();
    let sampling = vec![GREEDY; batch];
    let batch_in = ForwardBatch {
        token_ids: &ids,
        positions: &pos,
        seqs: &seqs,
    };
    b.forward_sampled(&batch_in, &sampling)?;
    b.gpu().sync()?;
    let reps = 3;
    let t = Instant::now();
    for _ in 0..reps {
        b.forward_sampled(&batch_in, &sampling)?;
    }
    b.gpu().sync()?;
    Ok(t.elapsed().as_secs_f64() / reps as f64)
}

/// Times `f` (already warmed) over `reps` runs, in ms.
fn time_ms(g: &Gpu, reps: usize, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
    f()?;
    g.sync()?;
    let t = Instant::now();
    for _ in 0..reps {
        f()?;
    }
    g.sync()?;
    Ok(t.elapsed().as_secs_f64() * 1e3 / reps as f64)
}

/// The attention cases timed: (batch, query tokens per sequence, context).
const ATTN_CASES: [(usize, usize, usize); 6] = [
    (8, 2048, 2048),
    (1, 1, 2048),
    (1, 1, 512),
    (8, 1, 2048),
    (128, 1, 2048),
    (128, 1, 512),
];

/// Decode split sizes (keys per block) `attention_alone` times.
const DECODE_SWEEP: [usize; 6] = [32, 64, 128, 256, 512, 1024];

/// The attention kernel alone: causal prefill 8×32 heads×2048×128 and decodes at 2048 and 512
/// (`only`: just that case of [`ATTN_CASES`], e.g. under a profiler).
fn attention_alone(g: &Gpu, only: Option<usize>) -> Res<Value> {
    let (hq, hkv, d, bs) = (32usize, 8usize, 128usize, 16usize);
    let mut out = serde_json::Map::new();
    for (i, &(batch, qlen, ctx)) in ATTN_CASES.iter().enumerate() {
        if only.is_some_and(|o| o != i) {
            continue;
        }
        let n = batch * qlen;
        let stride = ctx.div_ceil(bs);
        let blocks = 1 + batch * stride;
        let cache_len = blocks * hkv * bs * d;
        // Zeroed caches: the kernel's time does not depend on the values.
        let kc = g.alloc(DType::Bf16, cache_len)?;
        let vc = g.alloc(DType::Bf16, cache_len)?;
        let qv: Vec<f32> = (0..n * hq * d)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let q = g.upload_f32(&qv, DType::Bf16)?;
        let o = g.alloc(DType::Bf16, n * hq * d)?;
        let tables: Vec<u32> = (1..blocks as u32).collect();
        let mut seqs = Vec::new();
        for s in 0..batch {
            seqs.extend([(s * qlen) as i32, qlen as i32, ctx as i32, 0]);
        }
        let tile = if qlen == 1 {
            1
        } else {
            ops::attention_tile_tokens(DType::Bf16, d, hq / hkv)
        };
        let items = ops::attention_items(&vec![qlen; batch], tile);
        let num_items = items.len() / 2;
        // Decodes: every split size of DECODE_SWEEP, or (one case alone, for a profiler) the one
        // the backend picks.
        let split_sizes: Vec<usize> = if qlen == 1 && only.is_some() {
            vec![worker::backend::cuda::step::decode_split(
                batch, hkv, ctx, g.sms,
            )]
        } else if qlen == 1 {
            DECODE_SWEEP.iter().copied().filter(|&s| s <= ctx).collect()
        } else {
            vec![1 << 30]
        };
        let max_splits = ctx.div_ceil(split_sizes[0]).max(1);
        let po = g.alloc(DType::F32, num_items * hq * max_splits * d)?;
        let pml = g.alloc(DType::F32, num_items * hq * max_splits * 2)?;
        let (sb, ib, tb) = (
            g.upload_i32(&seqs)?,
            g.upload_i32(&items)?,
            g.upload_u32(&tables)?,
        );
        for split_size in split_sizes {
            let splits = if qlen == 1 {
                ctx.div_ceil(split_size)
            } else {
                1
            };
            let a = Attention {
                q: &q,
                k_cache: &kc,
                v_cache: &vc,
                out: &o,
                part_o: &po,
                part_ml: &pml,
                seqs: &sb,
                items: &ib,
                block_tables: &tb,
                num_seqs: batch,
                num_items,
                table_stride: stride,
                n,
                hq,
                hkv,
                d,
                block_size: bs,
                split_size,
                num_splits: splits,
                scale: 1.0 / (d as f32).sqrt(),
                kv_scales: None,
                decode: qlen == 1,
                combine_fp8: None,
            };
            // Prefill: every kernel this device runs, each also under its own key; the plain key
            // is the one the backend picks (the first). Decodes: also the CUDA-core kernel when
            // the tensor-core one is the default (key suffix `_cudacore`).
            let prefills: &[Option<PrefillKernel>] = if qlen > 1 {
                &[None, Some(PrefillKernel::Mma), Some(PrefillKernel::Wgmma)]
            } else {
                &[None]
            };
            let decode_mma = g.decode_mma;
            let decode_kernels: &[bool] = if qlen == 1 && decode_mma {
                &[true, false]
            } else {
                &[decode_mma]
            };
            for (&prefill, &mma) in prefills
                .iter()
                .flat_map(|p| decode_kernels.iter().map(move |m| (p, m)))
            {
                if prefill.is_some_and(|k| !PrefillKernel::available(&g.arch).contains(&k)) {
                    continue;
                }
                let kernel = prefill.unwrap_or(g.prefill);
                let ms = time_ms(g, 10, || {
                    // SAFETY: seqs/items/tables built consistently above; every table entry <
                    // blocks; the partials hold `max_splits >= splits` per item and head.
                    Ok(unsafe { ops::attention_with(g, &a, kernel, mma) }?)
                })?;
                let flops = if qlen > 1 {
                    4.0 * (batch * hq) as f64 * (qlen * ctx) as f64 * d as f64 / 2.0
                } else {
                    4.0 * (batch * hq * ctx * d) as f64
                };
                let kv_bytes = (batch * ctx * hkv * d * 2 * 2) as f64;
                let mut key = format!("b{batch}_q{qlen}_ctx{ctx}");
                if qlen == 1 && split_size != worker::backend::cuda::step::DECODE_SPLIT {
                    key.push_str(&format!("_split{split_size}"));
                }
                if let Some(k) = prefill {
                    key.push_str(if k == PrefillKernel::Mma {
                        "_mma"
                    } else {
                        "_wgmma"
                    });
                }
                if mma != decode_mma {
                    key.push_str("_cudacore");
                }
                println!(
                    "attention {key}: {ms:.3} ms, {:.1} TFLOP/s, KV read {:.0} GB/s",
                    flops / ms / 1e9,
                    kv_bytes / ms / 1e6
                );
                let mut row =
                    json!({"ms": ms, "tflops": flops / ms / 1e9, "kv_gb_s": kv_bytes / ms / 1e6});
                if qlen > 1 {
                    row["kernel"] = json!(kernel.name());
                }
                out.insert(key, row);
            }
        }
    }
    Ok(Value::Object(out))
}

/// Batch sizes `cuda_bench gemv` times (to place the GEMV/cuBLAS crossover).
const GEMV_BATCHES: [usize; 4] = [1, 2, 4, 8];

/// Bytes of weight copies the GEMV timing cycles through, several times the H200's 50 MB L2, so
/// that every call streams its weights from HBM as a decode step does (one 32 MB matrix timed
/// back to back would partly stay in L2).
const GEMV_ROTATE_BYTES: usize = 256 << 20;

/// GEMV (both bf16 block heights, and the one `ops::gemv` picks) vs cuBLAS at the 8B shapes for
/// [`GEMV_BATCHES`] rows; GB/s counts weight bytes only. lm_head writes f32 logits, as the model.
/// The 8B shapes at batch and prefill sizes: bf16 cuBLAS against cuBLASLt FP8 (with the
/// activations' quantization timed apart).
fn fp8_gemm_alone(g: &Gpu, out: &mut serde_json::Map<String, Value>) -> Res<()> {
    use worker::backend::cuda::fp8::{Fp8Gemm, Fp8Linear, QuantRows, quant_rows};
    let gemm8 = Fp8Gemm::new(g)?;
    for (name, n, k) in [
        ("qkv", 6144usize, 4096usize),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
    ] {
        let (w16, w8) = (g.alloc(DType::Bf16, n * k)?, g.alloc(DType::U8, n * k)?);
        let ws = g.upload_f32(&vec![1e-3; n], DType::F32)?;
        for m in [64usize, 128, 256, 4096] {
            let x = g.upload_f32(&vec![0.01; m * k], DType::Bf16)?;
            let (xq, xs) = (g.alloc(DType::U8, m * k)?, g.alloc(DType::F32, m)?);
            let y = g.alloc(DType::Bf16, m * n)?;
            let l16 = Linear {
                x: &x,
                w: &w16,
                y: &y,
                m,
                n,
                k,
            };
            let bf16_ms = time_ms(g, 20, || Ok(ops::gemm(g, &l16)?))?;
            let quant = QuantRows {
                x: &x,
                q: &xq,
                scales: &xs,
                m,
                k,
                static_scale: 0.0,
            };
            let q_ms = time_ms(g, 20, || Ok(quant_rows(g, &quant)?))?;
            let l8 = Fp8Linear {
                x: &xq,
                x_scales: &xs,
                w: &w8,
                w_scales: &ws,
                y: &y,
                m,
                n,
                k,
            };
            let fp8_ms = time_ms(g, 20, || Ok(gemm8.run(g, &l8)?))?;
            let tflops = |ms: f64| 2.0 * (m * n * k) as f64 / ms / 1e9;
            println!(
                "gemm {name} m{m}: bf16 cublas {bf16_ms:.4} ms ({:.0} TFLOP/s), fp8 cublaslt {fp8_ms:.4} ms \
                 ({:.0} TFLOP/s) + quantization {q_ms:.4} ms",
                tflops(bf16_ms),
                tflops(fp8_ms)
            );
            out.insert(
                format!("{name}_m{m}_gemm"),
                json!({"bf16_ms": bf16_ms, "fp8_ms": fp8_ms, "quant_ms": q_ms}),
            );
        }
    }
    Ok(())
}

fn linear_alone(g: &Gpu) -> Res<Value> {
    let mut out = serde_json::Map::new();
    if worker::backend::cuda::fp8::has_fp8(g.capability) {
        fp8_gemm_alone(g, &mut out)?;
    }
    for (name, n, k) in [
        ("qkv", 6144usize, 4096usize),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
        ("lm_head", 128_256, 4096),
    ] {
        let bytes = n * k * 2;
        let copies = GEMV_ROTATE_BYTES.div_ceil(bytes).max(1);
        let ws = (0..copies)
            .map(|_| g.alloc(DType::Bf16, n * k))
            .collect::<Result<Vec<_>, _>>()?;
        let yt = if name == "lm_head" {
            DType::F32
        } else {
            DType::Bf16
        };
        let picked = if n >= ops::GEMV_TALL_ROWS { 32 } else { 16 };
        // The same product with E4M3 weights and activations (half the weight bytes).
        let fp8 = (name != "lm_head" && worker::backend::cuda::fp8::has_fp8(g.capability))
            .then(|| {
                let copies8 = GEMV_ROTATE_BYTES.div_ceil(n * k).max(1);
                let w8 = (0..copies8)
                    .map(|_| g.alloc(DType::U8, n * k))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok::<_, worker::backend::BackendError>((
                    w8,
                    g.upload_f32(&vec![1e-3; n], DType::F32)?,
                ))
            })
            .transpose()?;
        for m in GEMV_BATCHES {
            let x = g.upload_f32(&vec![0.01; m * k], DType::Bf16)?;
            let y = g.alloc(yt, m * n)?;
            let lin = |i: usize| Linear {
                x: &x,
                w: &ws[i % copies],
                y: &y,
                m,
                n,
                k,
            };
            let time = |f: &dyn Fn(&Linear<'_>) -> Res<()>| {
                let mut i = 0;
                time_ms(g, 100, || {
                    i += 1;
                    f(&lin(i))
                })
            };
            let r16 = time(&|l| Ok(ops::gemv_rows(g, l, 16)?))?;
            let r32 = time(&|l| Ok(ops::gemv_rows(g, l, 32)?))?;
            let gemm = time(&|l| Ok(ops::gemm(g, l)?))?;
            let gemv = if picked == 32 { r32 } else { r16 };
            let gb = bytes as f64 / 1e6;
            if let Some((w8, w8s)) = &fp8 {
                use worker::backend::cuda::fp8::{
                    Fp8Linear, QuantRows, gemv_fp8, gemv_fp8_choice, quant_rows,
                };
                use worker::backend::switches::{FP8_TILE_KERNELS, Fp8GemvChoice};
                let (xq, xs) = (g.alloc(DType::U8, m * k)?, g.alloc(DType::F32, m)?);
                let yb = g.alloc(DType::Bf16, m * n)?;
                let quant = QuantRows {
                    x: &x,
                    q: &xq,
                    scales: &xs,
                    m,
                    k,
                    static_scale: 0.0,
                };
                let q_ms = time_ms(g, 100, || Ok(quant_rows(g, &quant)?))?;
                let l8 = |i: usize| Fp8Linear {
                    x: &xq,
                    x_scales: &xs,
                    w: &w8[i % w8.len()],
                    w_scales: w8s,
                    y: &yb,
                    m,
                    n,
                    k,
                };
                let mut i = 0;
                let r32 = time_ms(g, 100, || {
                    i += 1;
                    Ok(gemv_fp8(g, &l8(i), 32)?)
                })?;
                let mut line = format!(
                    "linear {name} m{m}: fp8 gemv r32 {r32:.4} ms ({:.0} GB/s)",
                    gb / 2.0 / r32
                );
                let mut entry = serde_json::Map::new();
                entry.insert("gemv_r32_ms".into(), json!(r32));
                entry.insert("quant_ms".into(), json!(q_ms));
                let choices = FP8_TILE_KERNELS.map(Fp8GemvChoice::Tile);
                for choice in [Fp8GemvChoice::Rows16].iter().chain(&choices).copied() {
                    let mut i = 0;
                    let ms = time_ms(g, 100, || {
                        i += 1;
                        Ok(gemv_fp8_choice(g, &l8(i), choice)?)
                    })?;
                    line += &format!(", {} {ms:.4} ms ({:.0} GB/s)", choice.name(), gb / 2.0 / ms);
                    entry.insert(format!("gemv_{}_ms", choice.name()), json!(ms));
                }
                println!("{line}, activation quantization {q_ms:.4} ms");
                out.insert(format!("{name}_m{m}_fp8"), Value::Object(entry));
            }
            println!(
                "linear {name} m{m}: gemv r16 {r16:.4} ms ({:.0} GB/s), r32 {r32:.4} ms ({:.0} GB/s), \
                 cublas {gemm:.4} ms ({:.0} GB/s)",
                gb / r16,
                gb / r32,
                gb / gemm
            );
            out.insert(
                format!("{name}_m{m}"),
                json!({
                    "gemv_ms": gemv, "gemv_gb_s": gb / gemv, "gemv_rows_per_block": picked,
                    "gemv_r16_ms": r16, "gemv_r16_gb_s": gb / r16,
                    "gemv_r32_ms": r32, "gemv_r32_gb_s": gb / r32,
                    "cublas_ms": gemm, "cublas_gb_s": gb / gemm,
                }),
            );
        }
    }
    Ok(Value::Object(out))
}

/// Per-call time in ms of `calls` calls of `f(i)` captured into one CUDA graph and replayed
/// (after one warm-up replay), so that launches cost what they cost in a decode step's graph.
fn time_graph_ms(g: &Gpu, calls: usize, mut f: impl FnMut(usize) -> Res<()>) -> Res<f64> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    f(0)?; // loads the kernel outside the capture
    g.sync()?;
    g.stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let launched = (0..calls).try_for_each(&mut f);
    let graph = g
        .stream
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY);
    launched?;
    let graph = graph?.ok_or("capture produced no graph")?;
    graph.launch()?;
    g.sync()?;
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        graph.launch()?;
    }
    g.sync()?;
    Ok(t.elapsed().as_secs_f64() * 1e3 / (reps * calls) as f64)
}

/// Both [`SiluQuantKernel`]s on the 8B shape's raw gate/up product (k = 14,336) of a prefill step
/// and of decode steps, µs a launch.
fn silu_quant_alone(g: &Gpu) -> Res<()> {
    use worker::backend::cuda::fp8::{SiluQuantKernel, silu_mul_quant_with};
    let k = 14336;
    for m in [8176usize, 2048, 256, 128] {
        let gu = g.alloc(DType::Bf16, m * 2 * k)?;
        let xs = g.upload_f32(&vec![1.0; m], DType::F32)?;
        let ws = g.upload_f32(&vec![1.0; 2 * k], DType::F32)?;
        let (q, scales) = (g.alloc(DType::U8, m * k)?, g.alloc(DType::F32, m)?);
        let mut line = format!("silu-quant m {m} k {k}:");
        for kernel in SiluQuantKernel::ALL {
            let run = || -> Res<()> {
                silu_mul_quant_with(g, kernel, &gu, (&q, &scales), (m, k), 0.0, Some((&xs, &ws)))?;
                Ok(())
            };
            match time_ms(g, 50, run) {
                Ok(ms) => line += &format!(" {kernel:?} {:.1} us", ms * 1e3),
                Err(e) => line += &format!(" {kernel:?} ({e})"),
            }
        }
        println!("{line}");
    }
    Ok(())
}

/// Batch sizes `cuda_bench int4` times.
const INT4_BATCHES: [usize; 8] = [1, 4, 8, 16, 32, 64, 128, 256];

/// The INT4 products alone at the 8B shapes, groups of 128, random codes: the per-weight GEMV
/// (16 or 32 rows a block, as the backend picks; up to 32 batch rows), the 16-row tile GEMV
/// (32 batch rows a launch; up to 8 rows, its variants too), the tensor-core products
/// `gemm_int4_mma_*` (32 rows and more) and dequantization + cuBLAS, each call on another copy of
/// the weights (more than the L2 holds in all), timed inside a CUDA graph, at `batches` rows.
/// GB/s counts the codes, scales and zero points a call reads.
fn int4_alone(g: &Gpu, batches: &[usize]) -> Res<Value> {
    use worker::backend::cuda::int4::{
        Int4Linear, Int4Packed, Int4Scales, MMA_KERNELS, TILE_VARIANTS, WGMMA_KERNELS,
        dequant_int4, gemv_int4, launch_mma, launch_tile, launch_wgmma, split_scale, tile_scales,
    };
    let mut out = serde_json::Map::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let gs = 128;
    for (name, n, k) in [
        ("qkv", 6144usize, 4096usize),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
    ] {
        let groups = k / gs;
        let bytes = n * k / 2 + n * groups * 5;
        let copies = GEMV_ROTATE_BYTES.div_ceil(bytes).max(2);
        let mut ws = Vec::new();
        for _ in 0..copies {
            let sc: Vec<f32> = (0..n * groups)
                .map(|_| half::f16::from_f32(0.001 + (next() % 1000) as f32 * 2e-6).to_f32())
                .collect();
            let zeros: Vec<u8> = (0..n * groups).map(|_| (next() % 17) as u8).collect();
            let packed = Int4Packed {
                n,
                k,
                group_size: gs,
                groups,
                words: (0..n * k / 8).map(|_| next() as u32).collect(),
                scales: sc
                    .iter()
                    .map(|&s| {
                        let (hi, lo) = split_scale(s);
                        u32::from(hi.to_bits()) | (u32::from(lo.to_bits()) << 16)
                    })
                    .collect(),
                tile_scales: tile_scales(n, groups, &sc, &zeros),
                zeros,
                perm: None,
                mins: None,
            };
            ws.push(Int4Scales::upload(g, &packed)?);
        }
        let wdq = g.alloc(DType::Bf16, n * k)?;
        let rows = if n >= ops::GEMV_TALL_ROWS { 32 } else { 16 };
        for &m in batches {
            let x = g.upload_f32(&vec![0.01; m * k], DType::Bf16)?;
            let y = g.alloc(DType::Bf16, m * n)?;
            let lin = |i: usize| Int4Linear {
                x: &x,
                w: &ws[i % copies].0,
                s: &ws[i % copies].1,
                y: &y,
                m,
                n,
                k,
            };
            let calls = 4 * copies;
            let mut row = serde_json::Map::new();
            let gb = |ms: f64| bytes as f64 / ms / 1e6;
            let tiles = time_graph_ms(g, calls, |i| Ok(gemv_int4(g, &lin(i), rows, true)?))?;
            row.insert("tiles_ms".into(), json!(tiles));
            let mut line = format!(
                "int4 {name} m{m}: tiles {tiles:.4} ms ({:.0} GB/s)",
                gb(tiles)
            );
            if m <= 8 {
                for v in &TILE_VARIANTS {
                    let ms = time_graph_ms(g, calls, |i| Ok(launch_tile(g, &lin(i), v, 0, m)?))?;
                    row.insert(format!("{}_ms", v.name), json!(ms));
                    line += &format!(", {} {ms:.4} ms ({:.0} GB/s)", v.name, gb(ms));
                }
            }
            if m <= 32 {
                let per_weight =
                    time_graph_ms(g, calls, |i| Ok(gemv_int4(g, &lin(i), rows, false)?))?;
                row.insert("per_weight_ms".into(), json!(per_weight));
                line += &format!(
                    ", per-weight r{rows} {per_weight:.4} ms ({:.0} GB/s)",
                    gb(per_weight)
                );
            }
            if m >= 32 {
                for kern in &MMA_KERNELS {
                    let ms = time_graph_ms(g, calls, |i| Ok(launch_mma(g, &lin(i), kern, &wdq)?))?;
                    row.insert(format!("{}_ms", kern.name), json!(ms));
                    let tf = 2.0 * (m * n * k) as f64 / ms / 1e9;
                    line += &format!(", {} {ms:.4} ms ({tf:.0} TFLOP/s)", kern.name);
                }
            }
            if m > 32 && g.arch == "sm_90a" {
                for kern in &WGMMA_KERNELS {
                    let ms =
                        time_graph_ms(g, calls, |i| Ok(launch_wgmma(g, &lin(i), kern, &wdq)?))?;
                    row.insert(format!("{}_ms", kern.name), json!(ms));
                    let tf = 2.0 * (m * n * k) as f64 / ms / 1e9;
                    line += &format!(", {} {ms:.4} ms ({tf:.0} TFLOP/s)", kern.name);
                }
            }
            if m >= 8 {
                let deq = time_graph_ms(g, calls, |i| {
                    let l = lin(i);
                    dequant_int4(g, &l, &wdq)?;
                    Ok(ops::gemm(
                        g,
                        &Linear {
                            x: &x,
                            w: &wdq,
                            y: &y,
                            m,
                            n,
                            k,
                        },
                    )?)
                })?;
                row.insert("dequant_cublas_ms".into(), json!(deq));
                line += &format!(", dequant + cuBLAS {deq:.4} ms");
            }
            println!("{line}");
            out.insert(format!("{name}_m{m}"), Value::Object(row));
        }
    }
    Ok(Value::Object(out))
}

/// `cuda_bench int4one SHAPE M KERNEL`: one INT4 product of an 8B shape (qkv, o, gate_up, down;
/// groups of 128, random codes) at M rows on kernel KERNEL (a name from `TILE_KERNELS`,
/// `TILE_VARIANTS`, `MMA_KERNELS` or `WGMMA_KERNELS`), launched three times: for a profiler (ncu
/// -k KERNEL).
fn int4_one(g: &Gpu, shape: &str, m: usize, kernel: &str) -> Res<()> {
    use worker::backend::cuda::int4::{
        Int4Linear, Int4Packed, Int4Scales, MMA_KERNELS, TILE_KERNELS, TILE_VARIANTS,
        WGMMA_KERNELS, launch_mma, launch_tile, launch_wgmma, tile_scales,
    };
    let (n, k) = match shape {
        "qkv" => (6144, 4096),
        "o" => (4096, 4096),
        "gate_up" => (28672, 4096),
        "down" => (4096, 14336),
        other => return Err(format!("unknown shape {other}").into()),
    };
    let tk = TILE_KERNELS
        .iter()
        .chain(TILE_VARIANTS.iter())
        .find(|t| t.name == kernel);
    let mk = MMA_KERNELS.iter().find(|t| t.name == kernel);
    let wk = WGMMA_KERNELS.iter().find(|t| t.name == kernel);
    let groups = k / 128;
    let packed = Int4Packed {
        n,
        k,
        group_size: 128,
        groups,
        words: (0..n * k / 8)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761))
            .collect(),
        scales: vec![0x3b80; n * groups],
        zeros: vec![8; n * groups],
        perm: None,
        mins: None,
        tile_scales: tile_scales(
            n,
            groups,
            &vec![2f32.powi(-8); n * groups],
            &vec![8; n * groups],
        ),
    };
    let (w, s) = Int4Scales::upload(g, &packed)?;
    let x = g.upload_f32(&vec![0.01; m * k], DType::Bf16)?;
    let y = g.alloc(DType::Bf16, m * n)?;
    let l = Int4Linear {
        x: &x,
        w: &w,
        s: &s,
        y: &y,
        m,
        n,
        k,
    };
    let scratch = g.alloc(DType::Bf16, n * k)?;
    for _ in 0..3 {
        match (tk, mk, wk) {
            (Some(tk), _, _) => launch_tile(g, &l, tk, 0, m)?,
            (_, Some(mk), _) => launch_mma(g, &l, mk, &scratch)?,
            (_, _, Some(wk)) => launch_wgmma(g, &l, wk, &scratch)?,
            (None, None, None) => return Err(format!("unknown INT4 kernel {kernel}").into()),
        }
    }
    g.sync()?;
    println!("int4one {shape} m{m} {kernel}: ok");
    Ok(())
}

/// The logits of the last token of every chunk: the 4 prompts are fed together, step `i` taking
/// `chunks[i]` tokens of each over the context the earlier steps cached.
fn logits_by_chunks(b: &mut CudaBackend, prompts: &[Vec<u32>], chunks: &[usize]) -> Res<Vec<f32>> {
    let len: usize = chunks.iter().sum();
    let blocks = len.div_ceil(b.block_size());
    let tables: Vec<Vec<u32>> = (0..prompts.len())
        .map(|s| (0..blocks).map(|j| (1 + s * blocks + j) as u32).collect())
        .collect();
    let mut rows: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
    let mut start = 0;
    for &c in chunks {
        let ids: Vec<u32> = prompts
            .iter()
            .flat_map(|pr| pr[start..start + c].to_vec())
            .collect();
        let pos: Vec<u32> = prompts
            .iter()
            .flat_map(|_| (start..start + c).map(|p| p as u32))
            .collect();
        let seqs: Vec<SeqInput<'_>> = tables
            .iter()
            .enumerate()
            .map(|(s, table)| SeqInput {
                query_start: s * c,
                query_len: c,
                context_len: start + c,
                block_table: table,
                sample: true,
            })
            .collect();
        let l = b.forward(&ForwardBatch {
            token_ids: &ids,
            positions: &pos,
            seqs: &seqs,
        })?;
        for (s, row) in rows.iter_mut().enumerate() {
            row.extend_from_slice(l.row(s));
        }
        start += c;
    }
    Ok(rows.concat())
}

fn write_f32s(path: &Path, values: &[f32]) -> Res<()> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(std::fs::write(path, bytes)?)
}

/// Logits at every position of 4 prompts of 64 tokens, decoded one token at a time in one batch
/// (the decode path).
fn dump_logits(b: &mut CudaBackend, dump: &Path, prompts_json: &Path) -> Res<()> {
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(64, 100 + i)).collect();
    std::fs::write(prompts_json, serde_json::to_string(&prompts)?)?;
    write_f32s(dump, &logits_by_chunks(b, &prompts, &[1; 64])?)
}

/// Chunk lengths of [`dump_prefill_logits`]: a first chunk of several 128-token prefill items, then
/// 63 chunks of 1–19 tokens over a growing cached context.
fn prefill_chunks() -> Vec<usize> {
    std::iter::once(300)
        .chain((0..63).map(|i| 1 + (i * 7) % 19))
        .collect()
}

/// Logits through the prefill path: 4 prompts fed in the chunks of [`prefill_chunks`], each
/// step's last token of each prompt sampled, so the 64 positions per prompt come from prefill
/// attention over prior context in the paged cache (chunked prefill), not from the decode kernel.
/// Writes `{"prompts", "positions"}` for `scripts/accuracy_vs_hf.py`.
fn dump_prefill_logits(b: &mut CudaBackend, dump: &Path, prompts_json: &Path) -> Res<()> {
    let chunks = prefill_chunks();
    let len: usize = chunks.iter().sum();
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(len, 200 + i)).collect();
    let positions: Vec<usize> = chunks
        .iter()
        .scan(0, |end, &c| {
            *end += c;
            Some(*end - 1)
        })
        .collect();
    std::fs::write(
        prompts_json,
        serde_json::to_string(&json!({"prompts": prompts, "positions": positions}))?,
    )?;
    write_f32s(dump, &logits_by_chunks(b, &prompts, &chunks)?)
}

/// `PATH.prefill`: where the prefill-path dump goes beside the decode-path one.
fn prefill_path(p: &str) -> String {
    format!("{p}.prefill")
}

/// Greedy tokens of request 0 alone and inside a batch of 64.
fn batch_invariance(backend: CudaBackend, model: &worker::config::ModelConfig) -> Res<Value> {
    let mut engine = Engine::new(Box::new(backend), model, EngineConfig::default())?;
    let req = |id: u64| {
        let mut r = Request::new(SeqId(id), prompt(64 + (id as usize % 7) * 9, 7 + id), 32);
        r.params = SamplingParams::greedy();
        r.ignore_eos = true;
        r
    };
    let mut run = |reqs: Vec<Request>| -> Res<HashMap<u64, Vec<u32>>> {
        for r in reqs {
            engine.add_request(r)?;
        }
        let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
        while engine.has_unfinished() {
            for ev in engine.step()? {
                out.entry(ev.id.0).or_default().push(ev.token);
            }
        }
        Ok(out)
    };
    let alone = run(vec![req(0)])?[&0].clone();
    let together = run((0..64).map(req).collect())?;
    let same = alone == together[&0];
    let agree = alone
        .iter()
        .zip(&together[&0])
        .take_while(|(a, b)| a == b)
        .count();
    println!("batch invariance: alone == in batch of 64: {same} (first {agree}/32 tokens agree)");
    Ok(
        json!({"identical": same, "agreeing_prefix": agree, "alone": alone, "in_batch": together[&0]}),
    )
}

/// What cuBLASLt tuning measured for the decode graphs' products.
fn print_gemm_tuning(b: &CudaBackend) {
    for r in b.gemm_tuning() {
        let s = r.shape;
        println!(
            "gemm tuning m {} n {} k {}: cublasGemmEx {:.1} us, best cuBLASLt {}{}",
            s.m,
            s.n,
            s.k,
            r.gemm_ex_us,
            r.best_lt_us
                .map_or("none".to_string(), |us| format!("{us:.1} us")),
            if r.chosen { " (chosen)" } else { "" }
        );
    }
}

/// The kernel switches this run measures: the `RINGSERVE_CUDA_*` variables, as the server reads
/// them.
fn switches() -> Res<KernelSwitches> {
    Ok(KernelSwitches::from_env()?)
}

/// The backend settings every model measurement here uses (the server's defaults, bf16, with the
/// command line's KV cache dtype and quantization).
fn bench_options(
    kv_cache_dtype: worker::quant::kv::KvCacheDtype,
    quantization: Option<worker::quant::Quantization>,
) -> Res<CudaOptions> {
    Ok(CudaOptions {
        ordinal: 0,
        dtype: DType::Bf16,
        block_size: 16,
        num_kv_blocks: None,
        gpu_memory_utilization: 0.9,
        enforce_eager: false,
        max_batch_tokens: 8192,
        batch_invariant: false,
        kernels: switches()?,
        quantization,
        kv_cache_dtype,
    })
}

fn main() -> Res<()> {
    // `--kv-cache-dtype=VALUE` and `--quantization=VALUE` anywhere: the model's KV cache and
    // linear layers (the model-running modes).
    let mut kv_cache_dtype = worker::quant::kv::KvCacheDtype::Auto;
    let mut quantization = None;
    let mut args: Vec<String> = Vec::new();
    for a in std::env::args() {
        if let Some(v) = a.strip_prefix("--kv-cache-dtype=") {
            kv_cache_dtype = v.parse()?;
        } else if let Some(v) = a.strip_prefix("--quantization=") {
            quantization = Some(v.parse()?);
        } else {
            args.push(a);
        }
    }
    if args.len() == 3 && args[1] == "attention" {
        // `cuda_bench attention CASE`: one attention case alone, for ncu.
        let gpu = Gpu::new(0, &switches()?)?;
        attention_alone(&gpu, Some(args[2].parse()?))?;
        return Ok(());
    }
    if args.len() == 3 && args[1] == "kernels" {
        // `cuda_bench kernels OUT_JSON`: the attention kernels alone (no model).
        let gpu = Gpu::new(0, &switches()?)?;
        let res = attention_alone(&gpu, None)?;
        std::fs::write(&args[2], serde_json::to_string_pretty(&res)?)?;
        return Ok(());
    }
    if args.len() == 3 && args[1] == "gemv" {
        // `cuda_bench gemv OUT_JSON`: GEMV kernel vs cuBLAS alone (no model).
        let gpu = Gpu::new(0, &switches()?)?;
        let res = linear_alone(&gpu)?;
        std::fs::write(&args[2], serde_json::to_string_pretty(&res)?)?;
        return Ok(());
    }
    if (3..=4).contains(&args.len()) && args[1] == "int4" {
        // `cuda_bench int4 OUT_JSON [BATCHES]`: the INT4 products alone (no model).
        let gpu = Gpu::new(0, &switches()?)?;
        let batches = match args.get(3) {
            Some(list) => list
                .split(',')
                .map(|b| b.trim().parse())
                .collect::<Result<Vec<usize>, _>>()?,
            None => INT4_BATCHES.to_vec(),
        };
        let res = int4_alone(&gpu, &batches)?;
        std::fs::write(&args[2], serde_json::to_string_pretty(&res)?)?;
        return Ok(());
    }
    if args.len() == 2 && args[1] == "silu-quant" {
        // `cuda_bench silu-quant`: both FP8 SiLU·mul quantizers alone, raw product in.
        let gpu = Gpu::new(0, &switches()?)?;
        return silu_quant_alone(&gpu);
    }
    if args.len() == 5 && args[1] == "int4one" {
        let gpu = Gpu::new(0, &switches()?)?;
        return int4_one(&gpu, &args[2], args[3].parse()?, &args[4]);
    }
    if args.len() == 6 && args[1] == "decode" {
        // `cuda_bench decode MODEL_DIR BATCHES CTX STEPS`: decode steps alone (for nsys / A-B).
        let (model, ckpt) = Checkpoint::load(Path::new(&args[2]))?;
        let mut b = CudaBackend::new(&model, &ckpt, &bench_options(kv_cache_dtype, quantization)?)?;
        let (ctx, steps): (usize, usize) = (args[4].parse()?, args[5].parse()?);
        for batch in args[3].split(',') {
            let batch: usize = batch.parse()?;
            let ms = time_decode(&mut b, batch, ctx, steps)?;
            println!(
                "decode batch {batch} ctx {ctx}: {ms:.3} ms/step, {:.0} tok/s",
                batch as f64 * 1e3 / ms
            );
        }
        print_gemm_tuning(&b);
        return Ok(());
    }
    if args.len() != 5 {
        return Err("usage: cuda_bench MODEL_DIR OUT_JSON LOGITS_DUMP PROMPTS_JSON".into());
    }
    // `cuda_bench accuracy MODEL LOGITS_DUMP PROMPTS_JSON`: the dumps alone, no OUT_JSON.
    let accuracy_only = args[1] == "accuracy";
    let (model_dir, out_json) = if accuracy_only {
        (Path::new(&args[2]), None)
    } else {
        (Path::new(&args[1]), Some(Path::new(&args[2])))
    };
    let (logits_dump, prompts_json) = (&args[3], &args[4]);
    let mut res = serde_json::Map::new();
    let t0 = Instant::now();
    let (model, ckpt) = Checkpoint::load(model_dir)?;
    let opts = bench_options(kv_cache_dtype, quantization)?;
    let t1 = Instant::now();
    let mut b = CudaBackend::new(&model, &ckpt, &opts)?;
    let startup = t0.elapsed().as_secs_f64();
    let upload = t1.elapsed().as_secs_f64();
    let wb = b.weight_bytes() as f64;
    let copy = b.weight_copy();
    println!(
        "start-up {startup:.2} s (backend {upload:.2} s; kernels {:.2} s from cache: {}); weights {:.2} GB; \
         pinned copy {:.2} s = {:.1} GB/s; {} KV blocks",
        b.gpu().kernel_load_s,
        b.gpu().kernels_from_cache,
        wb / 1e9,
        copy.seconds,
        copy.gb_per_s(),
        b.num_kv_blocks()
    );
    res.insert("startup".into(), json!({"total_s": startup, "backend_s": upload, "kernels_s": b.gpu().kernel_load_s,
        "kernels_from_cache": b.gpu().kernels_from_cache, "weights_gb": wb / 1e9, "upload_gb_s": wb / 1e9 / upload,
        "copy_s": copy.seconds, "copy_gb_s": copy.gb_per_s(),
        "kv_blocks": b.num_kv_blocks()}));

    dump_logits(&mut b, Path::new(logits_dump), Path::new(prompts_json))?;
    let (dump, prompts) = (prefill_path(logits_dump), prefill_path(prompts_json));
    dump_prefill_logits(&mut b, Path::new(&dump), Path::new(&prompts))?;
    println!("logits dumped (decode path: {logits_dump}; prefill path: {dump})");
    let Some(out_json) = out_json else {
        return Ok(());
    };

    let mut decode = serde_json::Map::new();
    for ctx in [512usize, 2048] {
        for batch in [1usize, 8, 32, 128, 256] {
            let ms = time_decode(&mut b, batch, ctx, 20)?;
            println!(
                "decode batch {batch} ctx {ctx}: {ms:.3} ms/step, {:.0} tok/s",
                batch as f64 * 1e3 / ms
            );
            decode.insert(
                format!("b{batch}_ctx{ctx}"),
                json!({"ms_per_step": ms, "tok_s": batch as f64 * 1e3 / ms}),
            );
        }
    }
    res.insert("decode".into(), Value::Object(decode));
    println!("graphs captured: {}", b.num_graphs());
    print_gemm_tuning(&b);

    let mut prefill = serde_json::Map::new();
    for batch in [1usize, 8] {
        let s = time_prefill(&mut b, batch, 2048)?;
        println!(
            "prefill {batch}x2048: {:.1} ms, {:.0} tok/s",
            s * 1e3,
            (batch * 2048) as f64 / s
        );
        prefill.insert(
            format!("{batch}x2048"),
            json!({"s": s, "tok_s": (batch * 2048) as f64 / s}),
        );
    }
    res.insert("prefill".into(), Value::Object(prefill));
    res.insert("attention".into(), attention_alone(b.gpu(), None)?);
    res.insert("linear".into(), linear_alone(b.gpu())?);
    res.insert("batch_invariance".into(), batch_invariance(b, &model)?);
    // Again in batch-invariant mode (fixed-shape GEMM blocks), with its decode cost.
    let inv_opts = CudaOptions {
        batch_invariant: true,
        ..opts
    };
    let mut b = CudaBackend::new(&model, &ckpt, &inv_opts)?;
    let mut inv = serde_json::Map::new();
    for (batch, ctx) in [(1usize, 512usize), (128, 512)] {
        let ms = time_decode(&mut b, batch, ctx, 20)?;
        println!("batch-invariant mode: decode batch {batch} ctx {ctx}: {ms:.3} ms/step");
        inv.insert(format!("decode_b{batch}_ctx{ctx}_ms"), json!(ms));
    }
    inv.insert("check".into(), batch_invariance(b, &model)?);
    res.insert("batch_invariant_mode".into(), Value::Object(inv));
    std::fs::write(out_json, serde_json::to_string_pretty(&Value::Object(res))?)?;
    Ok(())
}
