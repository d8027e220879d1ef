//! Every CUDA kernel against a plain CPU reference, on random non-zero inputs, at several shapes
//! (including sizes that are not multiples of the tiles), in f32 and bf16.
//!
//! Run on a GPU machine with `cargo test --release --features cuda -- --include-ignored`; without a
//! device these tests fail (Gpu::new errors), they never skip.
#![cfg(feature = "cuda")]

use half::bf16;
use worker::backend::cuda::ops::{self, AddRmsNorm, Attention, Linear, RopeKv, SampleRow};
use worker::backend::cuda::{DType, Gpu, PrefillKernel};
use worker::backend::switches::KernelSwitches;
use worker::quant::fp8;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1), never exactly zero.
    fn f(&mut self) -> f32 {
        let v = (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        if v == 0.0 { 0.5 } else { v }
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn gpu() -> Gpu {
    Gpu::new(0, &KernelSwitches::default())
        .unwrap_or_else(|e| panic!("a CUDA device is required: {e}"))
}

/// Rounds through the storage type, so the CPU reference sees exactly what the GPU holds.
fn q(v: &[f32], dt: DType) -> Vec<f32> {
    match dt {
        DType::Bf16 => v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect(),
        _ => v.to_vec(),
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f32], abs: f32, rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0.0f32, 0usize);
    // Every element out of tolerance, so a failure shows its pattern, not only the first.
    let mut bad = Vec::new();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        let within = err <= abs + rel * w.abs(); // false for NaN
        if !within {
            bad.push(i);
        }
        if err > worst.0 {
            worst = (err, i);
        }
    }
    let show: Vec<String> = bad
        .iter()
        .take(8)
        .map(|&i| format!("[{i}] got {} want {}", got[i], want[i]))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} of {} out of tolerance {abs} + {rel}·|want|, first: {}",
        bad.len(),
        got.len(),
        show.join(", ")
    );
    eprintln!("{what}: max abs err {:.3e} at {}", worst.0, worst.1);
}

const DTYPES: [DType; 2] = [DType::F32, DType::Bf16];

#[test]
#[ignore = "requires a CUDA device"]
fn embedding_gathers_rows() {
    let g = gpu();
    let mut r = Rng(1);
    for dt in DTYPES {
        for (vocab, hidden, n) in [(50, 64, 7), (1000, 333, 130)] {
            let table = q(&r.vec(vocab * hidden), dt);
            let ids: Vec<u32> = (0..n).map(|_| r.below(vocab) as u32).collect();
            let tb = g.upload_f32(&table, dt).unwrap();
            let ib = g.upload_u32(&ids).unwrap();
            let out = g.alloc(dt, n * hidden).unwrap();
            // SAFETY: every id is < vocab.
            unsafe { ops::embedding(&g, &out, &tb, &ib, (n, hidden)) }.unwrap();
            let want: Vec<f32> = ids
                .iter()
                .flat_map(|&i| table[i as usize * hidden..(i as usize + 1) * hidden].to_vec())
                .collect();
            // A copy: exact.
            assert_close("embedding", &g.download_f32(&out).unwrap(), &want, 0.0, 0.0);
        }
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn add_rmsnorm_matches_cpu() {
    let g = gpu();
    let mut r = Rng(2);
    for dt in DTYPES {
        // 64, 4096, 1000: 16-byte vector path; 1001 (not whole 16-byte chunks) and 40,000 (more
        // than NORM_CHUNKS chunks a thread): the scalar loop.
        for (rows, hidden, with_delta) in [
            (3, 64, false),
            (5, 4096, true),
            (2, 1000, true),
            (2, 1001, true),
            (1, 40_000, true),
        ] {
            let res = q(&r.vec(rows * hidden), dt);
            let delta = q(&r.vec(rows * hidden), dt);
            let w = q(&r.vec(hidden), dt);
            let (rb, db, wb) = (
                g.upload_f32(&res, dt).unwrap(),
                g.upload_f32(&delta, dt).unwrap(),
                g.upload_f32(&w, dt).unwrap(),
            );
            let out = g.alloc(dt, rows * hidden).unwrap();
            ops::add_rmsnorm(
                &g,
                &AddRmsNorm {
                    residual: &rb,
                    delta: with_delta.then_some(&db),
                    weight: &wb,
                    out: &out,
                    rows,
                    hidden,
                    eps: 1e-5,
                    fp8: None,
                    delta_scales: None,
                },
            )
            .unwrap();
            let new_res: Vec<f32> = if with_delta {
                q(
                    &res.iter()
                        .zip(&delta)
                        .map(|(a, b)| a + b)
                        .collect::<Vec<_>>(),
                    dt,
                )
            } else {
                res.clone()
            };
            let mut want = vec![0.0; rows * hidden];
            for i in 0..rows {
                let row = &new_res[i * hidden..(i + 1) * hidden];
                let ms = row.iter().map(|v| (v * v) as f64).sum::<f64>() / hidden as f64;
                let s = 1.0 / (ms + 1e-5).sqrt();
                for j in 0..hidden {
                    want[i * hidden + j] = (row[j] as f64 * s * w[j] as f64) as f32;
                }
            }
            // The residual sum is rounded once to the storage type on both sides: exact.
            assert_close(
                "residual",
                &g.download_f32(&rb).unwrap(),
                &new_res,
                0.0,
                0.0,
            );
            // f32: summation order only (~1e-6 relative). bf16: one final rounding (2^-8 relative).
            let (abs, rel) = if dt == DType::F32 {
                (1e-5, 1e-5)
            } else {
                (1e-3, 8e-3)
            };
            assert_close("rmsnorm", &g.download_f32(&out).unwrap(), &want, abs, rel);
            if with_delta && dt == DType::Bf16 {
                raw_delta_is_scaled_as_the_scaling_pass(&g, (&res, &delta, &wb), (rows, hidden));
            }
            if !AddRmsNorm::fuses_fp8(hidden, dt) {
                continue;
            }
            // Again from the same residual, also quantizing the output for an FP8 product: the
            // same output bits, and the codes and scales the CPU quantizer gives that output.
            let normed = g.download_f32(&out).unwrap();
            let rb2 = g.upload_f32(&res, dt).unwrap();
            let out2 = g.alloc(dt, rows * hidden).unwrap();
            let codes = g.alloc(DType::U8, rows * hidden).unwrap();
            let scales = g.alloc(DType::F32, rows).unwrap();
            for static_scale in [0.0f32, 0.02] {
                ops::add_rmsnorm(
                    &g,
                    &AddRmsNorm {
                        residual: &rb2,
                        delta: with_delta.then_some(&db),
                        weight: &wb,
                        out: &out2,
                        rows,
                        hidden,
                        eps: 1e-5,
                        fp8: Some(ops::NormFp8 {
                            q: &codes,
                            scales: &scales,
                            static_scale,
                            codes_only: false,
                            amax_reset: None,
                        }),
                        delta_scales: None,
                    },
                )
                .unwrap();
                // Only the first launch adds delta to the fresh copy of the residual.
                if static_scale == 0.0 {
                    assert_eq!(bits(&g.download_f32(&out2).unwrap()), bits(&normed));
                    let (want_q, want_s) = fp8_reference(&normed, hidden);
                    assert_eq!(g.download_f32(&scales).unwrap(), want_s, "{hidden}: scales");
                    assert_eq!(g.download_bytes(&codes, rows * hidden).unwrap(), want_q);
                } else {
                    let got = g.download_bytes(&codes, rows * hidden).unwrap();
                    let want: Vec<u8> = g
                        .download_f32(&out2)
                        .unwrap()
                        .iter()
                        .map(|&v| worker::quant::fp8::quantize(v, static_scale))
                        .collect();
                    assert_eq!(got, want, "{hidden}: static codes");
                }
            }
            // Codes only (the backend's FP8 layers, whose products read the codes): the same
            // residual, codes and scales, and the bf16 output left as it was.
            let rb3 = g.upload_f32(&res, dt).unwrap();
            let out3 = g.alloc(dt, rows * hidden).unwrap();
            ops::add_rmsnorm(
                &g,
                &AddRmsNorm {
                    residual: &rb3,
                    delta: with_delta.then_some(&db),
                    weight: &wb,
                    out: &out3,
                    rows,
                    hidden,
                    eps: 1e-5,
                    fp8: Some(ops::NormFp8 {
                        q: &codes,
                        scales: &scales,
                        static_scale: 0.0,
                        codes_only: true,
                        amax_reset: None,
                    }),
                    delta_scales: None,
                },
            )
            .unwrap();
            let (want_q, want_s) = fp8_reference(&normed, hidden);
            assert_eq!(
                g.download_f32(&scales).unwrap(),
                want_s,
                "{hidden}: codes only"
            );
            assert_eq!(g.download_bytes(&codes, rows * hidden).unwrap(), want_q);
            let res3 = bits(&g.download_f32(&rb3).unwrap());
            // rb: the residual after one addition of delta (the first launch of this test).
            assert_eq!(
                res3,
                bits(&g.download_f32(&rb).unwrap()),
                "codes only: residual"
            );
            assert!(g.download_f32(&out3).unwrap().iter().all(|&v| v == 0.0));
            eprintln!("add_rmsnorm + fp8 rows {rows} hidden {hidden}: codes equal the CPU's");
        }
    }
}

/// `add_rmsnorm` with `delta_scales` on a raw FP8 product gives the bits of the product scaled as
/// `scale_fp8_out_bf16` does (bf16((raw * row scale) * column scale)) and added plainly; with the
/// FP8 output too, its row scales in the buffer the delta's row scales are read from.
fn raw_delta_is_scaled_as_the_scaling_pass(
    g: &Gpu,
    (res, raw, wb): (&[f32], &[f32], &worker::backend::cuda::Buf),
    (rows, hidden): (usize, usize),
) {
    let dt = DType::Bf16;
    let rs: Vec<f32> = (0..rows).map(|i| 0.01 + 0.003 * i as f32).collect();
    let cs: Vec<f32> = (0..hidden).map(|j| 0.5 + (j % 7) as f32 * 0.1).collect();
    let scaled: Vec<f32> = raw
        .iter()
        .enumerate()
        .map(|(i, d)| d * rs[i / hidden] * cs[i % hidden])
        .collect();
    let scaled = q(&scaled, dt);
    let (rsb, csb) = (
        g.upload_f32(&rs, DType::F32).unwrap(),
        g.upload_f32(&cs, DType::F32).unwrap(),
    );
    let (sb, rawb) = (
        g.upload_f32(&scaled, dt).unwrap(),
        g.upload_f32(raw, dt).unwrap(),
    );
    let fp8 = AddRmsNorm::fuses_fp8(hidden, dt);
    let mut outs = Vec::new();
    for in_kernel in [false, true] {
        let rb = g.upload_f32(res, dt).unwrap();
        let out = g.alloc(dt, rows * hidden).unwrap();
        let codes = g.alloc(DType::U8, rows * hidden).unwrap();
        // With the FP8 output, its scales overwrite the delta's row scales (a copy of them).
        let row_scales = g.upload_f32(&rs, DType::F32).unwrap();
        let (delta, delta_scales) = if in_kernel {
            (&rawb, Some((if fp8 { &row_scales } else { &rsb }, &csb)))
        } else {
            (&sb, None)
        };
        ops::add_rmsnorm(
            g,
            &AddRmsNorm {
                residual: &rb,
                delta: Some(delta),
                weight: wb,
                out: &out,
                rows,
                hidden,
                eps: 1e-5,
                fp8: fp8.then_some(ops::NormFp8 {
                    q: &codes,
                    scales: &row_scales,
                    static_scale: 0.0,
                    codes_only: false,
                    amax_reset: None,
                }),
                delta_scales,
            },
        )
        .unwrap();
        let mut got = vec![
            bits(&g.download_f32(&rb).unwrap()),
            bits(&g.download_f32(&out).unwrap()),
        ];
        if fp8 {
            got.push(bits(&g.download_f32(&row_scales).unwrap()));
            got.push(
                g.download_bytes(&codes, rows * hidden)
                    .unwrap()
                    .into_iter()
                    .map(u32::from)
                    .collect(),
            );
        }
        outs.push(got);
    }
    for (i, what) in ["residual", "output", "fp8 scales", "fp8 codes"]
        .iter()
        .take(outs[0].len())
        .enumerate()
    {
        assert!(
            outs[0][i] == outs[1][i],
            "rows {rows} hidden {hidden}: {what} differs with the delta scaled in the kernel"
        );
    }
    eprintln!(
        "add_rmsnorm rows {rows} hidden {hidden} fp8 {fp8}: a raw delta scaled in the kernel, bit for bit"
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn silu_mul_matches_cpu() {
    let g = gpu();
    let mut r = Rng(3);
    for dt in DTYPES {
        // 1001: not whole 16-byte chunks, the scalar path.
        for (rows, inter) in [(1, 176), (9, 1000), (4, 14336), (3, 1001)] {
            let gu: Vec<f32> = q(
                &r.vec(rows * 2 * inter)
                    .iter()
                    .map(|v| v * 4.0)
                    .collect::<Vec<_>>(),
                dt,
            );
            let gb = g.upload_f32(&gu, dt).unwrap();
            let out = g.alloc(dt, rows * inter).unwrap();
            ops::silu_mul(&g, &gb, &out, (rows, inter)).unwrap();
            let mut want = Vec::new();
            for i in 0..rows {
                for j in 0..inter {
                    let (a, b) = (
                        gu[i * 2 * inter + j] as f64,
                        gu[i * 2 * inter + inter + j] as f64,
                    );
                    want.push((a / (1.0 + (-a).exp()) * b) as f32);
                }
            }
            // f32: expf is within 2 ulp; bf16: one final rounding.
            let (abs, rel) = if dt == DType::F32 {
                (1e-6, 1e-5)
            } else {
                (1e-3, 8e-3)
            };
            assert_close("silu_mul", &g.download_f32(&out).unwrap(), &want, abs, rel);
        }
    }
}

/// The CPU reference of rope_kv_write: returns (q_out, k_cache, v_cache).
struct RopeCase {
    n: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    bs: usize,
    blocks: usize,
}

#[test]
#[ignore = "requires a CUDA device"]
fn rope_kv_write_matches_cpu() {
    let g = gpu();
    let mut r = Rng(4);
    for dt in DTYPES {
        for c in [
            RopeCase {
                n: 5,
                hq: 4,
                hkv: 2,
                d: 16,
                bs: 16,
                blocks: 4,
            },
            RopeCase {
                n: 37,
                hq: 32,
                hkv: 8,
                d: 128,
                bs: 16,
                blocks: 9,
            },
            // 56 heads: the second block of 32 starts with q heads 32..39, which the token
            // without a slot still writes, and ends 8 heads short
            RopeCase {
                n: 7,
                hq: 40,
                hkv: 8,
                d: 64,
                bs: 8,
                blocks: 3,
            },
            // 15 heads (less than one block), head size 64
            RopeCase {
                n: 6,
                hq: 9,
                hkv: 3,
                d: 64,
                bs: 16,
                blocks: 2,
            },
            // an odd number of pairs (9): one pair at a time
            RopeCase {
                n: 4,
                hq: 2,
                hkv: 1,
                d: 18,
                bs: 4,
                blocks: 3,
            },
        ] {
            let width = (c.hq + 2 * c.hkv) * c.d;
            let qkv = q(&r.vec(c.n * width), dt);
            let bias = q(&r.vec(width), dt);
            let positions: Vec<u32> = (0..c.n).map(|_| r.below(8000) as u32).collect();
            let inv_freq: Vec<f32> = (0..c.d / 2)
                .map(|i| 500000f32.powf(-(2.0 * i as f32) / c.d as f32))
                .collect();
            // Distinct slots, in shuffled blocks; one token skipped (slot -1).
            let mut slots: Vec<i64> = (0..c.n as i64)
                .map(|i| (i * 7) % (c.blocks * c.bs) as i64)
                .collect();
            slots[c.n / 2] = -1;
            let cache_len = c.blocks * c.hkv * c.bs * c.d;
            let kc0 = q(&r.vec(cache_len), dt);
            let vc0 = q(&r.vec(cache_len), dt);
            for use_bias in [false, true] {
                let qb = g.upload_f32(&qkv, dt).unwrap();
                let bb = g.upload_f32(&bias, dt).unwrap();
                let pb = g.upload_u32(&positions).unwrap();
                let fb = g.upload_f32(&inv_freq, DType::F32).unwrap();
                let sb = g.upload_i64(&slots).unwrap();
                let qo = g.alloc(dt, c.n * c.hq * c.d).unwrap();
                let kc = g.upload_f32(&kc0, dt).unwrap();
                let vc = g.upload_f32(&vc0, dt).unwrap();
                let args = RopeKv {
                    qkv: &qb,
                    bias: use_bias.then_some(&bb),
                    positions: &pb,
                    inv_freq: &fb,
                    slots: &sb,
                    q_out: &qo,
                    k_cache: &kc,
                    v_cache: &vc,
                    n: c.n,
                    hq: c.hq,
                    hkv: c.hkv,
                    d: c.d,
                    block_size: c.bs,
                    kv_scales: None,
                    raw_scales: None,
                };
                // SAFETY: every slot is < blocks * bs or negative.
                unsafe { ops::rope_kv_write(&g, &args) }.unwrap();
                let (mut wq, mut wk, mut wv) =
                    (vec![0f32; c.n * c.hq * c.d], kc0.clone(), vc0.clone());
                let half = c.d / 2;
                for t in 0..c.n {
                    let row: Vec<f32> = (0..width)
                        .map(|i| {
                            let x = qkv[t * width + i];
                            if use_bias {
                                q(&[x + bias[i]], dt)[0]
                            } else {
                                x
                            }
                        })
                        .collect();
                    let cache_at = |h: usize| {
                        let s = slots[t] as usize;
                        (((s / c.bs) * c.hkv + h) * c.bs + s % c.bs) * c.d
                    };
                    for h in 0..c.hq + c.hkv {
                        for j in 0..half {
                            let ang = positions[t] as f32 * inv_freq[j];
                            let (s, co) = ((ang as f64).sin(), (ang as f64).cos());
                            let (x1, x2) =
                                (row[h * c.d + j] as f64, row[h * c.d + j + half] as f64);
                            let (y1, y2) = ((x1 * co - x2 * s) as f32, (x2 * co + x1 * s) as f32);
                            if h < c.hq {
                                wq[(t * c.hq + h) * c.d + j] = y1;
                                wq[(t * c.hq + h) * c.d + j + half] = y2;
                            } else if slots[t] >= 0 {
                                let at = cache_at(h - c.hq);
                                wk[at + j] = y1;
                                wk[at + j + half] = y2;
                            }
                        }
                    }
                    if slots[t] >= 0 {
                        for h in 0..c.hkv {
                            let at = cache_at(h);
                            for j in 0..c.d {
                                wv[at + j] = row[(c.hq + c.hkv + h) * c.d + j];
                            }
                        }
                    }
                }
                // f32: sincosf of the same f32 angle is within ~2 ulp of the f64 value.
                // bf16: the single final rounding (2^-8 relative) plus the bias rounding.
                let (abs, rel) = if dt == DType::F32 {
                    (2e-6, 1e-5)
                } else {
                    (2e-2, 8e-3)
                };
                assert_close(
                    "rope q",
                    &g.download_f32(&qo).unwrap(),
                    &q(&wq, dt),
                    abs,
                    rel,
                );
                assert_close(
                    "rope k cache",
                    &g.download_f32(&kc).unwrap(),
                    &q(&wk, dt),
                    abs,
                    rel,
                );
                assert_close(
                    "v cache",
                    &g.download_f32(&vc).unwrap(),
                    &q(&wv, dt),
                    abs,
                    rel,
                );
            }
        }
    }
}

/// rope_kv_write on a raw FP8 q/k/v product with its row and column scales (`raw_scales`) gives
/// the bits of the product scaled as `scale_fp8_out_bf16` scales it (bf16((raw * row scale) *
/// column scale)) and then rotated: q, both caches (bf16, and FP8 codes), with and without a bias,
/// on the vector path (head sizes 128 and 16) and one pair at a time (18), a token without a slot.
#[test]
#[ignore = "requires a CUDA device"]
fn rope_kv_write_scales_a_raw_fp8_product_as_the_scaling_pass() {
    let g = gpu();
    let mut r = Rng(21);
    let dt = DType::Bf16;
    for (n, hq, hkv, d, bs, blocks) in [
        (37, 32, 8, 128, 16, 9),
        (5, 4, 2, 16, 16, 4),
        (4, 2, 1, 18, 4, 3),
    ] {
        let width = (hq + 2 * hkv) * d;
        let raw = q(
            &r.vec(n * width)
                .iter()
                .map(|v| v * 300.0)
                .collect::<Vec<_>>(),
            dt,
        );
        let rs: Vec<f32> = (0..n).map(|i| 0.001 + 0.0007 * i as f32).collect();
        let cs: Vec<f32> = (0..width).map(|j| 0.3 + (j % 11) as f32 * 0.05).collect();
        let scaled: Vec<f32> = raw
            .iter()
            .enumerate()
            .map(|(i, x)| x * rs[i / width] * cs[i % width])
            .collect();
        let scaled = q(&scaled, dt);
        let bias = q(&r.vec(width), dt);
        let positions: Vec<u32> = (0..n).map(|_| r.below(8000) as u32).collect();
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 500000f32.powf(-(2.0 * i as f32) / d as f32))
            .collect();
        let mut slots: Vec<i64> = (0..n as i64)
            .map(|i| (i * 5) % (blocks * bs) as i64)
            .collect();
        slots[n / 2] = -1;
        let cache_len = blocks * hkv * bs * d;
        let (pb, fb, sb) = (
            g.upload_u32(&positions).unwrap(),
            g.upload_f32(&inv_freq, DType::F32).unwrap(),
            g.upload_i64(&slots).unwrap(),
        );
        let (rsb, csb, bb) = (
            g.upload_f32(&rs, DType::F32).unwrap(),
            g.upload_f32(&cs, DType::F32).unwrap(),
            g.upload_f32(&bias, dt).unwrap(),
        );
        for kv_scales in [None, Some((0.05f32, 0.02f32))] {
            let ct = if kv_scales.is_some() { DType::U8 } else { dt };
            for use_bias in [false, true] {
                let mut outs = Vec::new();
                for in_kernel in [false, true] {
                    let qkv = g
                        .upload_f32(if in_kernel { &raw } else { &scaled }, dt)
                        .unwrap();
                    let qo = g.alloc(dt, n * hq * d).unwrap();
                    let (kc, vc) = (
                        g.alloc(ct, cache_len).unwrap(),
                        g.alloc(ct, cache_len).unwrap(),
                    );
                    let args = RopeKv {
                        qkv: &qkv,
                        bias: use_bias.then_some(&bb),
                        positions: &pb,
                        inv_freq: &fb,
                        slots: &sb,
                        q_out: &qo,
                        k_cache: &kc,
                        v_cache: &vc,
                        n,
                        hq,
                        hkv,
                        d,
                        block_size: bs,
                        kv_scales,
                        raw_scales: in_kernel.then_some((&rsb, &csb)),
                    };
                    // SAFETY: every slot is < blocks * bs or negative.
                    unsafe { ops::rope_kv_write(&g, &args) }.unwrap();
                    let cache = |b: &worker::backend::cuda::Buf| -> Vec<u32> {
                        if kv_scales.is_some() {
                            g.download_bytes(b, cache_len)
                                .unwrap()
                                .into_iter()
                                .map(u32::from)
                                .collect()
                        } else {
                            bits(&g.download_f32(b).unwrap())
                        }
                    };
                    outs.push([bits(&g.download_f32(&qo).unwrap()), cache(&kc), cache(&vc)]);
                }
                for (i, what) in ["q", "k cache", "v cache"].iter().enumerate() {
                    assert!(
                        outs[0][i] == outs[1][i],
                        "d {d}, fp8 cache {}, bias {use_bias}: {what} differs with the raw product scaled in the kernel",
                        kv_scales.is_some()
                    );
                }
            }
        }
        eprintln!("rope_kv_write d {d}: a raw FP8 product scaled in the kernel, bit for bit");
    }
}

/// rope_kv_write into an FP8 cache stores, for every written K and V element, the E4M3 code of
/// the bf16 value a bf16 cache gets (checked against `rope_kv_write_matches_cpu`'s kernel) divided
/// by the layer's scale, the CPU quantizer's code bit for bit; other slots keep their bytes. Also
/// through the fused q/k/v GEMV's epilogue, which shares the store.
#[test]
#[ignore = "requires a CUDA device"]
fn rope_kv_write_into_an_fp8_cache_stores_the_codes_of_the_bf16_values() {
    let g = gpu();
    let mut r = Rng(14);
    let dt = DType::Bf16;
    let (n, hq, hkv, d, bs, blocks) = (37, 32, 8, 128, 16, 9);
    let (ks, vs) = (0.013f32, 0.0071f32);
    let width = (hq + 2 * hkv) * d;
    let qkv = q(&r.vec(n * width), dt);
    let positions: Vec<u32> = (0..n).map(|_| r.below(8000) as u32).collect();
    let inv_freq: Vec<f32> = (0..d / 2)
        .map(|i| 500000f32.powf(-(2.0 * i as f32) / d as f32))
        .collect();
    let mut slots: Vec<i64> = (0..n as i64)
        .map(|i| (i * 7) % (blocks * bs) as i64)
        .collect();
    slots[n / 2] = -1;
    let cache_len = blocks * hkv * bs * d;
    let qb = g.upload_f32(&qkv, dt).unwrap();
    let pb = g.upload_u32(&positions).unwrap();
    let fb = g.upload_f32(&inv_freq, DType::F32).unwrap();
    let sb = g.upload_i64(&slots).unwrap();
    let qo = g.alloc(dt, n * hq * d).unwrap();
    let (kb, vb) = (
        g.alloc(dt, cache_len).unwrap(),
        g.alloc(dt, cache_len).unwrap(),
    );
    let fill: Vec<u8> = (0..cache_len).map(|i| (i % 251) as u8).collect();
    let (k8, v8) = (
        g.upload_bytes(&fill, DType::U8).unwrap(),
        g.upload_bytes(&fill, DType::U8).unwrap(),
    );
    let args = RopeKv {
        qkv: &qb,
        bias: None,
        positions: &pb,
        inv_freq: &fb,
        slots: &sb,
        q_out: &qo,
        k_cache: &kb,
        v_cache: &vb,
        n,
        hq,
        hkv,
        d,
        block_size: bs,
        kv_scales: None,
        raw_scales: None,
    };
    // SAFETY: every slot is < blocks * bs or negative.
    unsafe { ops::rope_kv_write(&g, &args) }.unwrap();
    let (kf, vf) = (g.download_f32(&kb).unwrap(), g.download_f32(&vb).unwrap());
    let written: std::collections::HashSet<usize> = slots
        .iter()
        .filter(|&&s| s >= 0)
        .flat_map(|&s| {
            let s = s as usize;
            (0..hkv).flat_map(move |h| {
                let at = (((s / bs) * hkv + h) * bs + s % bs) * d;
                at..at + d
            })
        })
        .collect();
    let check = |what: &str, k: &[u8], v: &[u8]| {
        for i in 0..cache_len {
            let (wk, wv) = if written.contains(&i) {
                (fp8::quantize(kf[i], ks), fp8::quantize(vf[i], vs))
            } else {
                (fill[i], fill[i])
            };
            assert_eq!((k[i], v[i]), (wk, wv), "{what}: cache byte {i}");
        }
    };
    let fp8_args = RopeKv {
        k_cache: &k8,
        v_cache: &v8,
        kv_scales: Some((ks, vs)),
        raw_scales: None,
        ..args
    };
    // SAFETY: as above.
    unsafe { ops::rope_kv_write(&g, &fp8_args) }.unwrap();
    check(
        "rope_kv_write",
        &g.download_bytes(&k8, cache_len).unwrap(),
        &g.download_bytes(&v8, cache_len).unwrap(),
    );
    // The fused q/k/v GEMV (batch <= 8) with the same epilogue, against its own bf16 run.
    let (m, hidden) = (5, 256);
    let x = g.upload_f32(&q(&r.vec(m * hidden), dt), dt).unwrap();
    let w = g.upload_f32(&q(&r.vec(width * hidden), dt), dt).unwrap();
    let y = g.alloc(dt, m * width).unwrap();
    let lin = Linear {
        x: &x,
        w: &w,
        y: &y,
        m,
        n: width,
        k: hidden,
    };
    let (kb2, vb2) = (
        g.alloc(dt, cache_len).unwrap(),
        g.alloc(dt, cache_len).unwrap(),
    );
    let (k82, v82) = (
        g.upload_bytes(&fill, DType::U8).unwrap(),
        g.upload_bytes(&fill, DType::U8).unwrap(),
    );
    let sb5 = g.upload_i64(&slots[..m]).unwrap();
    let pb5 = g.upload_u32(&positions[..m]).unwrap();
    let bf = RopeKv {
        qkv: &y,
        positions: &pb5,
        slots: &sb5,
        k_cache: &kb2,
        v_cache: &vb2,
        n: m,
        ..args
    };
    // SAFETY: as above (the first m slots).
    unsafe { ops::gemv_rope_kv(&g, &lin, &bf) }.unwrap();
    let (kf2, vf2) = (g.download_f32(&kb2).unwrap(), g.download_f32(&vb2).unwrap());
    let f8 = RopeKv {
        k_cache: &k82,
        v_cache: &v82,
        kv_scales: Some((ks, vs)),
        raw_scales: None,
        ..bf
    };
    // SAFETY: as above.
    unsafe { ops::gemv_rope_kv(&g, &lin, &f8) }.unwrap();
    let (k, v) = (
        g.download_bytes(&k82, cache_len).unwrap(),
        g.download_bytes(&v82, cache_len).unwrap(),
    );
    let mut checked = 0;
    for &s in slots[..m].iter().filter(|&&s| s >= 0) {
        let s = s as usize;
        for h in 0..hkv {
            let at = (((s / bs) * hkv + h) * bs + s % bs) * d;
            for i in at..at + d {
                assert_eq!(k[i], fp8::quantize(kf2[i], ks), "fused: k byte {i}");
                assert_eq!(v[i], fp8::quantize(vf2[i], vs), "fused: v byte {i}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, m * hkv * d);
}

/// One sequence of an attention test: (query_len, context_len).
struct AttnCase {
    hq: usize,
    hkv: usize,
    d: usize,
    bs: usize,
    seqs: Vec<(usize, usize)>,
    split_size: usize,
    num_splits: usize,
}

#[test]
#[ignore = "requires a CUDA device"]
fn attention_matches_cpu() {
    let g = gpu();
    let mut r = Rng(5);
    let cases = [
        // tiny-llama shape: prefill from scratch, chunk after a prefix, decode
        AttnCase {
            hq: 4,
            hkv: 2,
            d: 16,
            bs: 16,
            seqs: vec![(5, 5), (7, 40), (1, 33)],
            split_size: 1 << 20,
            num_splits: 1,
        },
        // 8B shape, prefill with prior context, non-multiples of 16/32
        AttnCase {
            hq: 32,
            hkv: 8,
            d: 128,
            bs: 16,
            seqs: vec![(37, 37), (50, 333), (1, 1), (130, 200)],
            split_size: 1 << 20,
            num_splits: 1,
        },
        // tensor-core prefill: several 128-token items per sequence, 128-key tiles with
        // partial ends, prior context, a one-token item, blocks of 3 keys
        AttnCase {
            hq: 32,
            hkv: 8,
            d: 128,
            bs: 3,
            seqs: vec![(300, 300), (129, 700), (1, 9), (64, 64)],
            split_size: 1 << 20,
            num_splits: 1,
        },
        // tensor-core prefill, MHA, blocks of 32: tile-aligned lengths and a chunk after a prefix
        AttnCase {
            hq: 4,
            hkv: 4,
            d: 128,
            bs: 32,
            seqs: vec![(256, 256), (200, 600), (128, 384)],
            split_size: 1 << 20,
            num_splits: 1,
        },
        // decodes with a split context (flash-decoding), some splits empty
        AttnCase {
            hq: 32,
            hkv: 8,
            d: 128,
            bs: 16,
            seqs: vec![(1, 700), (1, 31), (1, 257), (1, 100)],
            split_size: 64,
            num_splits: 12,
        },
        // tiny-llama shape, split decodes (general kernel: no decode kernel for d 16)
        AttnCase {
            hq: 4,
            hkv: 2,
            d: 16,
            bs: 16,
            seqs: vec![(1, 40), (1, 3), (1, 77)],
            split_size: 32,
            num_splits: 3,
        },
        // decode kernel with groups of 8 (d 64) and 2 (d 128), split
        AttnCase {
            hq: 16,
            hkv: 2,
            d: 64,
            bs: 16,
            seqs: vec![(1, 300), (1, 5), (1, 129)],
            split_size: 128,
            num_splits: 3,
        },
        AttnCase {
            hq: 4,
            hkv: 2,
            d: 128,
            bs: 16,
            seqs: vec![(1, 64), (1, 200), (1, 1)],
            split_size: 64,
            num_splits: 4,
        },
        // groups of 3 (SmolLM2: 9 heads over 3, d 64), prefill and split decodes
        AttnCase {
            hq: 9,
            hkv: 3,
            d: 64,
            bs: 16,
            seqs: vec![(20, 45), (1, 96)],
            split_size: 1 << 20,
            num_splits: 1,
        },
        AttnCase {
            hq: 9,
            hkv: 3,
            d: 64,
            bs: 16,
            seqs: vec![(1, 100), (1, 7), (1, 33)],
            split_size: 32,
            num_splits: 4,
        },
        // MHA (group 1), d 64
        AttnCase {
            hq: 8,
            hkv: 8,
            d: 64,
            bs: 16,
            seqs: vec![(20, 45), (1, 96)],
            split_size: 1 << 20,
            num_splits: 1,
        },
        // MHA decodes, split
        AttnCase {
            hq: 8,
            hkv: 8,
            d: 64,
            bs: 16,
            seqs: vec![(1, 45), (1, 96), (1, 1)],
            split_size: 32,
            num_splits: 3,
        },
        // decode kernel: splits longer than its K/V ring (refills, a second set of cached rows),
        // blocks of 7 and 32 keys, partial last tiles, empty splits
        AttnCase {
            hq: 32,
            hkv: 8,
            d: 128,
            bs: 7,
            seqs: vec![(1, 517), (1, 130), (1, 1), (1, 300)],
            split_size: 256,
            num_splits: 3,
        },
        AttnCase {
            hq: 4,
            hkv: 4,
            d: 64,
            bs: 32,
            seqs: vec![(1, 1000), (1, 33)],
            split_size: 512,
            num_splits: 2,
        },
        // tensor-core decode kernel, groups of 1 and 8 (d 128): a split shorter than a tile, one
        // of several tiles, blocks of 5 keys
        AttnCase {
            hq: 4,
            hkv: 4,
            d: 128,
            bs: 5,
            seqs: vec![(1, 90), (1, 7), (1, 33)],
            split_size: 32,
            num_splits: 3,
        },
        AttnCase {
            hq: 16,
            hkv: 2,
            d: 128,
            bs: 16,
            seqs: vec![(1, 1), (1, 250), (1, 129)],
            split_size: 128,
            num_splits: 2,
        },
        // 1024-key splits (the graphs' choice at batch 128 for contexts of 513-1024)
        AttnCase {
            hq: 32,
            hkv: 8,
            d: 128,
            bs: 16,
            seqs: vec![(1, 1500), (1, 700), (1, 3), (1, 1024)],
            split_size: 1024,
            num_splits: 2,
        },
    ];
    // f32, bf16, and bf16 over an FP8 (E4M3) cache with K and V scales of 1/64 and 1/32.
    let variants = [
        (DType::F32, None),
        (DType::Bf16, None),
        (DType::Bf16, Some((1.0 / 64.0, 1.0 / 32.0))),
    ];
    for (dt, kv_scales) in variants {
        for c in &cases {
            let max_ctx = c.seqs.iter().map(|s| s.1).max().unwrap();
            let stride = max_ctx.div_ceil(c.bs) + 1;
            let nseq = c.seqs.len();
            let blocks = 1 + nseq * stride;
            // Block tables: a shuffled permutation of 1..blocks.
            let mut perm: Vec<u32> = (1..blocks as u32).collect();
            for i in (1..perm.len()).rev() {
                perm.swap(i, r.below(i + 1));
            }
            let tables: Vec<u32> = perm[..nseq * stride].to_vec();
            let n: usize = c.seqs.iter().map(|s| s.0).sum();
            let qv = q(&r.vec(n * c.hq * c.d), dt);
            let cache_len = blocks * c.hkv * c.bs * c.d;
            let (kc, vc) = (r.vec(cache_len), r.vec(cache_len));
            // The cache as the kernels read it (kb, vb) and the values it holds (kc, vc).
            let ((kb, kc), (vb, vc)) = match kv_scales {
                None => {
                    let up = |x: Vec<f32>| {
                        let x = q(&x, dt);
                        (g.upload_f32(&x, dt).unwrap(), x)
                    };
                    (up(kc), up(vc))
                }
                Some((ks, vs)) => {
                    let up = |x: Vec<f32>, s: f32| {
                        let codes: Vec<u8> = x.iter().map(|&v| fp8::quantize(v, s)).collect();
                        let held = codes.iter().map(|&c| fp8::e4m3_to_f32(c) * s).collect();
                        (g.upload_bytes(&codes, DType::U8).unwrap(), held)
                    };
                    (up(kc, ks), up(vc, vs))
                }
            };
            let kc: Vec<f32> = kc;
            let vc: Vec<f32> = vc;
            let mut seqs = Vec::new();
            let mut start = 0;
            for &(ql, ctx) in &c.seqs {
                seqs.extend([start as i32, ql as i32, ctx as i32, 0]);
                start += ql;
            }
            let group = c.hq / c.hkv;
            let all_decode = c.seqs.iter().all(|s| s.0 == 1);
            // Split launches take one token per item; prefill tiles depend on the kernel.
            let tile = if c.num_splits > 1 {
                1
            } else {
                ops::attention_tile_tokens(dt, c.d, group)
            };
            let items = ops::attention_items(&c.seqs.iter().map(|s| s.0).collect::<Vec<_>>(), tile);
            let qb = g.upload_f32(&qv, dt).unwrap();
            let out = g.alloc(dt, n * c.hq * c.d).unwrap();
            let po = g
                .alloc(DType::F32, items.len() / 2 * c.hq * c.num_splits * c.d)
                .unwrap();
            let pml = g
                .alloc(DType::F32, items.len() / 2 * c.hq * c.num_splits * 2)
                .unwrap();
            let sb = g.upload_i32(&seqs).unwrap();
            let ib = g.upload_i32(&items).unwrap();
            let tb = g.upload_u32(&tables).unwrap();
            let scale = 1.0 / (c.d as f32).sqrt();
            let args = Attention {
                q: &qb,
                k_cache: &kb,
                v_cache: &vb,
                out: &out,
                part_o: &po,
                part_ml: &pml,
                seqs: &sb,
                items: &ib,
                block_tables: &tb,
                num_seqs: nseq,
                num_items: items.len() / 2,
                table_stride: stride,
                n,
                hq: c.hq,
                hkv: c.hkv,
                d: c.d,
                block_size: c.bs,
                split_size: c.split_size,
                num_splits: c.num_splits,
                scale,
                kv_scales,
                decode: c.num_splits > 1,
                combine_fp8: None,
            };
            // Through every prefill kernel this device runs (mma.sync; wgmma on sm_90a): the
            // kernel only matters for bf16 head size 128, the other cases just run twice there.
            let got: Vec<(PrefillKernel, Vec<f32>)> = PrefillKernel::available(&g.arch)
                .iter()
                .map(|&k| {
                    let out = g.alloc(dt, n * c.hq * c.d).unwrap();
                    let args = Attention { out: &out, ..args };
                    // SAFETY: seqs/items/tables built consistently above; every table entry <
                    // blocks.
                    unsafe { ops::attention_with(&g, &args, k, g.decode_mma) }.unwrap();
                    (k, g.download_f32(&out).unwrap())
                })
                .collect();
            // Decode-only batches also through the decode kernels (their items: one per token):
            // for bf16 head size 128 both the tensor-core and the CUDA-core one.
            let decode_kernels: &[bool] = match (all_decode && tile == 1, dt, c.d) {
                (false, _, _) => &[],
                (true, DType::Bf16, 128) if kv_scales.is_none() => &[true, false],
                (true, _, _) => &[false],
            };
            let got_decode: Vec<(bool, Vec<f32>)> = decode_kernels
                .iter()
                .map(|&mma| {
                    let out2 = g.alloc(dt, n * c.hq * c.d).unwrap();
                    let args = Attention {
                        out: &out2,
                        decode: true,
                        ..args
                    };
                    // SAFETY: as above, and every sequence has one query token.
                    unsafe { ops::attention_with(&g, &args, g.prefill, mma) }.unwrap();
                    (mma, g.download_f32(&out2).unwrap())
                })
                .collect();
            let mut want = vec![0f32; n * c.hq * c.d];
            for (s, &(ql, ctx)) in c.seqs.iter().enumerate() {
                let qs = seqs[4 * s] as usize;
                for t in 0..ql {
                    let pos = ctx - ql + t;
                    for h in 0..c.hq {
                        let kvh = h / group;
                        let at = |p: usize| {
                            ((tables[s * stride + p / c.bs] as usize * c.hkv + kvh) * c.bs
                                + p % c.bs)
                                * c.d
                        };
                        let qr = &qv[((qs + t) * c.hq + h) * c.d..][..c.d];
                        let scores: Vec<f64> = (0..=pos)
                            .map(|p| {
                                qr.iter()
                                    .zip(&kc[at(p)..at(p) + c.d])
                                    .map(|(a, b)| (a * b) as f64)
                                    .sum::<f64>()
                                    * scale as f64
                            })
                            .collect();
                        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                        let z: f64 = e.iter().sum();
                        for j in 0..c.d {
                            let v: f64 = (0..=pos).map(|p| e[p] * vc[at(p) + j] as f64).sum();
                            want[((qs + t) * c.hq + h) * c.d + j] = (v / z) as f32;
                        }
                    }
                }
            }
            // Outputs are convex combinations of values in [-1, 1]. f32: exp2f and summation
            // order, ~1e-6. bf16: the final rounding (≤ 2^-9 absolute for |out| < 1) dominates;
            // the tensor-core kernels also round the softmax weights to bf16 (2^-9 relative each,
            // errors of both signs that largely cancel over the keys).
            let (abs, rel) = if dt == DType::F32 {
                (2e-5, 1e-5)
            } else {
                (4e-3, 8e-3)
            };
            let fp8 = if kv_scales.is_some() {
                " FP8 cache"
            } else {
                ""
            };
            for (k, got) in &got {
                let what = format!(
                    "attention {dt:?}{fp8} hq{} d{} bs{} ({k:?})",
                    c.hq, c.d, c.bs
                );
                assert_close(&what, got, &want, abs, rel);
            }
            for (mma, got) in &got_decode {
                let kernel = if *mma { "tensor cores" } else { "CUDA cores" };
                let what = format!(
                    "decode attention {dt:?}{fp8} hq{} d{} ({kernel})",
                    c.hq, c.d
                );
                assert_close(&what, got, &want, abs, rel);
            }
        }
    }
}

/// Decodes sharing prefix blocks, grouped by `step::share_decode_splits` so that the tensor-core
/// decode kernels compute a shared split once for several sequences, give bit for bit what each
/// sequence's own blocks give — bf16 and FP8 caches, groups of 4, 2 and 1 query heads (2, 4 and 8
/// sequences a block), splits of 64 and 1024 keys, blocks of 16 and 4 keys.
#[test]
#[ignore = "requires a CUDA device"]
fn shared_decode_splits_equal_unshared_bit_for_bit() {
    use worker::backend::cuda::step::{HostStep, share_decode_splits};
    let g = gpu();
    let mut r = Rng(11);
    // (hq, hkv, block size, split, shared prefix blocks, contexts)
    let cases: [(usize, usize, usize, usize, usize, Vec<usize>); 4] = [
        (32, 8, 16, 64, 9, vec![150, 145, 300, 147, 40, 160, 151]),
        (16, 8, 16, 64, 8, vec![129, 200, 128, 131, 90]),
        (
            8,
            8,
            4,
            64,
            40,
            vec![210, 205, 201, 260, 203, 202, 230, 211, 209, 64],
        ),
        (32, 8, 16, 1024, 130, vec![2112, 2150, 2080, 2300, 900]),
    ];
    let d = 128;
    for kv_scales in [None, Some((1.0f32 / 64.0, 1.0f32 / 32.0))] {
        for (hq, hkv, bs, split, prefix, ctxs) in &cases {
            let (hq, hkv, bs, split, prefix) = (*hq, *hkv, *bs, *split, *prefix);
            let nseq = ctxs.len();
            let stride = ctxs.iter().max().unwrap().div_ceil(bs);
            // Every sequence but the last holds blocks 1..=prefix first, then its own.
            let mut next = prefix as u32 + 1;
            let mut tables = vec![0u32; nseq * stride];
            for (s, &ctx) in ctxs.iter().enumerate() {
                for b in 0..ctx.div_ceil(bs) {
                    tables[s * stride + b] = if b < prefix && s + 1 < nseq {
                        b as u32 + 1
                    } else {
                        next += 1;
                        next - 1
                    };
                }
            }
            let blocks = next as usize;
            let cache_len = blocks * hkv * bs * d;
            let (kb, vb) = match kv_scales {
                None => (
                    g.upload_f32(&q(&r.vec(cache_len), DType::Bf16), DType::Bf16)
                        .unwrap(),
                    g.upload_f32(&q(&r.vec(cache_len), DType::Bf16), DType::Bf16)
                        .unwrap(),
                ),
                Some((ks, vs)) => {
                    let mut up = |s: f32| {
                        let codes: Vec<u8> = r
                            .vec(cache_len)
                            .iter()
                            .map(|&v| fp8::quantize(v, s))
                            .collect();
                        g.upload_bytes(&codes, DType::U8).unwrap()
                    };
                    (up(ks), up(vs))
                }
            };
            let mut st = HostStep {
                stride,
                ..Default::default()
            };
            for (s, &ctx) in ctxs.iter().enumerate() {
                st.seqs.extend([s as i32, 1, ctx as i32, 0]);
                st.items_decode.extend([s as i32, 0]);
                st.max_decode_ctx = st.max_decode_ctx.max(ctx);
            }
            st.tables = tables.clone();
            let plain = st.items_decode.clone();
            share_decode_splits(&mut st, split, bs, kernels::DECODE_MMA_ROWS / (hq / hkv));
            let shared_items = st.items_decode.clone();
            assert!(
                shared_items.chunks(2).filter(|i| i[1] != 0).count() >= 2,
                "hq{hq} split {split}: some decodes share a split ({shared_items:?})"
            );
            let num_splits = st.decode_splits(split);
            let qv = q(&r.vec(nseq * hq * d), DType::Bf16);
            let qb = g.upload_f32(&qv, DType::Bf16).unwrap();
            let sb = g.upload_i32(&st.seqs).unwrap();
            let tb = g.upload_u32(&tables).unwrap();
            let run = |items: &[i32]| {
                let out = g.alloc(DType::Bf16, nseq * hq * d).unwrap();
                let po = g.alloc(DType::F32, nseq * hq * num_splits * d).unwrap();
                let pml = g.alloc(DType::F32, nseq * hq * num_splits * 2).unwrap();
                let ib = g.upload_i32(items).unwrap();
                let args = Attention {
                    q: &qb,
                    k_cache: &kb,
                    v_cache: &vb,
                    out: &out,
                    part_o: &po,
                    part_ml: &pml,
                    seqs: &sb,
                    items: &ib,
                    block_tables: &tb,
                    num_seqs: nseq,
                    num_items: nseq,
                    table_stride: stride,
                    n: nseq,
                    hq,
                    hkv,
                    d,
                    block_size: bs,
                    split_size: split,
                    num_splits,
                    scale: 1.0 / (d as f32).sqrt(),
                    kv_scales,
                    decode: true,
                    combine_fp8: None,
                };
                // SAFETY: seqs, items (a permutation of the sequences, share codes only for the
                // tensor-core kernel, which this launch takes) and tables built consistently;
                // every table entry < blocks.
                unsafe { ops::attention_with(&g, &args, g.prefill, true) }.unwrap();
                g.download_f32(&out).unwrap()
            };
            let (want, got) = (run(&plain), run(&shared_items));
            let cache = if kv_scales.is_some() { "FP8" } else { "bf16" };
            assert_eq!(
                bits(&got),
                bits(&want),
                "{cache} cache, hq{hq} hkv{hkv} bs{bs} split {split}: shared splits differ"
            );
            assert!(want.iter().all(|v| v.is_finite()));
        }
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn gemv_and_gemm_match_cpu() {
    let g = gpu();
    let mut r = Rng(6);
    for dt in DTYPES {
        // k % 32 of 0, 8 and 24 (the GEMV's last 32-wide k-step full or partial, after one or
        // more rounds of 8 warps x 4 steps), n not a multiple of the 16/32-row blocks, m = 1..8
        // and one m above the GEMV's limit.
        for (m, n, k) in [
            (1, 64, 64),
            (3, 1000, 4096),
            (8, 4096, 14336),
            (5, 7, 40),
            (2, 33, 280),
            (6, 50, 1048),
            (37, 300, 512),
        ] {
            let x = q(&r.vec(m * k), dt);
            let w = q(&r.vec(n * k), dt);
            let xb = g.upload_f32(&x, dt).unwrap();
            let wb = g.upload_f32(&w, dt).unwrap();
            let mut want = vec![0f32; m * n];
            let mut mag = vec![0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    let (mut s, mut a) = (0f64, 0f64);
                    for t in 0..k {
                        let p = x[i * k + t] as f64 * w[j * k + t] as f64;
                        s += p;
                        a += p.abs();
                    }
                    want[i * n + j] = s as f32;
                    mag[i * n + j] = a as f32;
                }
            }
            for out_f32 in [false, true] {
                let yt = if out_f32 { DType::F32 } else { dt };
                let y = g.alloc(yt, m * n).unwrap();
                let l = Linear {
                    x: &xb,
                    w: &wb,
                    y: &y,
                    m,
                    n,
                    k,
                };
                let mut runs = vec![(
                    "gemm".to_string(),
                    ops::gemm(&g, &l).map(|_| g.download_f32(&y).unwrap()),
                )];
                if l.gemv_ok() {
                    for &rows in kernels::GEMV_BF16_ROWS {
                        runs.push((
                            format!("gemv r{rows}"),
                            ops::gemv_rows(&g, &l, rows).map(|_| g.download_f32(&y).unwrap()),
                        ));
                    }
                }
                let mut gemv_bits: Option<Vec<u32>> = None;
                for (name, res) in runs {
                    let got = res.unwrap();
                    for i in 0..m * n {
                        // f32 accumulation error grows with sum|x·w| (~k ulps worst case, far
                        // less in practice); bf16 output adds one rounding, 2^-8 relative.
                        let tol = 1e-5 * mag[i]
                            + if yt == DType::Bf16 {
                                8e-3 * want[i].abs()
                            } else {
                                0.0
                            };
                        assert!(
                            (got[i] - want[i]).abs() <= tol + 1e-6,
                            "{name} {dt:?} m{m} n{n} k{k} [{i}]: got {} want {} tol {tol}",
                            got[i],
                            want[i]
                        );
                    }
                    if name.starts_with("gemv") {
                        // Every block height sums in the same order: the same bits.
                        let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                        if let Some(first) = &gemv_bits {
                            assert!(*first == bits, "{name} {dt:?} m{m} n{n} k{k}: bits differ");
                        }
                        gemv_bits = Some(bits);
                    }
                }
                // Batch invariance: each row alone gives the bits it got in the batch.
                if let Some(bits) = gemv_bits {
                    let y1 = g.alloc(yt, n).unwrap();
                    for i in 0..m {
                        let x1 = g.upload_f32(&x[i * k..(i + 1) * k], dt).unwrap();
                        let l1 = Linear {
                            x: &x1,
                            w: &wb,
                            y: &y1,
                            m: 1,
                            n,
                            k,
                        };
                        ops::gemv(&g, &l1).unwrap();
                        let alone: Vec<u32> = g
                            .download_f32(&y1)
                            .unwrap()
                            .iter()
                            .map(|v| v.to_bits())
                            .collect();
                        assert!(
                            alone == bits[i * n..(i + 1) * n],
                            "gemv {dt:?} m{m} n{n} k{k} out_f32 {out_f32}: row {i} alone differs"
                        );
                    }
                }
            }
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The q/k/v product fused with RoPE and the KV write gives exactly the bits of the GEMV followed
/// by `rope_kv_write` (each checked against the CPU in the tests above), for every batch size the
/// GEMV takes, with and without a bias, with a skipped slot.
#[test]
#[ignore = "requires a CUDA device"]
fn gemv_rope_kv_matches_the_unfused_kernels() {
    let g = gpu();
    let mut r = Rng(11);
    let dt = DType::Bf16;
    // (batch, hq, hkv, d, k): head sizes 16 (one block a head) and 128 (the 8B shape), k with a
    // partial last k-step (40) and the 8B hidden size.
    for (b, hq, hkv, d, k) in [
        (1, 4, 2, 16, 40),
        (3, 4, 2, 16, 64),
        (1, 32, 8, 128, 4096),
        (5, 32, 8, 128, 4096),
        (8, 8, 8, 64, 256),
    ] {
        let (bs, blocks) = (16, 4);
        let width = (hq + 2 * hkv) * d;
        let x = q(&r.vec(b * k), dt);
        let w: Vec<f32> = r.vec(width * k).iter().map(|v| v * 0.05).collect();
        let bias = q(&r.vec(width), dt);
        let positions: Vec<u32> = (0..b).map(|_| r.below(8000) as u32).collect();
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 500000f32.powf(-(2.0 * i as f32) / d as f32))
            .collect();
        let mut slots: Vec<i64> = (0..b as i64)
            .map(|i| (i * 5 + 3) % (blocks * bs) as i64)
            .collect();
        if b > 1 {
            slots[b / 2] = -1;
        }
        let cache_len = blocks * hkv * bs * d;
        let kc0 = q(&r.vec(cache_len), dt);
        let vc0 = q(&r.vec(cache_len), dt);
        let (xb, wb) = (g.upload_f32(&x, dt).unwrap(), g.upload_f32(&w, dt).unwrap());
        let (pb, fb, sb) = (
            g.upload_u32(&positions).unwrap(),
            g.upload_f32(&inv_freq, DType::F32).unwrap(),
            g.upload_i64(&slots).unwrap(),
        );
        let bb = g.upload_f32(&bias, dt).unwrap();
        for use_bias in [false, true] {
            let mut outs = Vec::new();
            for fused in [false, true] {
                let qkv = g.alloc(dt, b * width).unwrap();
                let qo = g.alloc(dt, b * hq * d).unwrap();
                let kc = g.upload_f32(&kc0, dt).unwrap();
                let vc = g.upload_f32(&vc0, dt).unwrap();
                let l = Linear {
                    x: &xb,
                    w: &wb,
                    y: &qkv,
                    m: b,
                    n: width,
                    k,
                };
                let rope = RopeKv {
                    qkv: &qkv,
                    bias: use_bias.then_some(&bb),
                    positions: &pb,
                    inv_freq: &fb,
                    slots: &sb,
                    q_out: &qo,
                    k_cache: &kc,
                    v_cache: &vc,
                    n: b,
                    hq,
                    hkv,
                    d,
                    block_size: bs,
                    kv_scales: None,
                    raw_scales: None,
                };
                assert!(ops::gemv_rope_fits(&l, &rope), "b{b} d{d} k{k}: should fit");
                // SAFETY: every slot is < blocks * bs or negative.
                unsafe {
                    if fused {
                        ops::gemv_rope_kv(&g, &l, &rope).unwrap();
                    } else {
                        ops::gemv(&g, &l).unwrap();
                        ops::rope_kv_write(&g, &rope).unwrap();
                    }
                }
                outs.push([qo, kc, vc].map(|buf| bits(&g.download_f32(&buf).unwrap())));
            }
            if b == 1 && d == 16 && !use_bias {
                // RoPE buffers of another type than the weights: refused, nothing launched.
                let (qkv32, qo32) = (
                    g.alloc(DType::F32, b * width).unwrap(),
                    g.alloc(DType::F32, b * hq * d).unwrap(),
                );
                let (kc32, vc32) = (
                    g.alloc(DType::F32, cache_len).unwrap(),
                    g.alloc(DType::F32, cache_len).unwrap(),
                );
                let y = g.alloc(dt, b * width).unwrap();
                let l = Linear {
                    x: &xb,
                    w: &wb,
                    y: &y,
                    m: b,
                    n: width,
                    k,
                };
                let rope = RopeKv {
                    qkv: &qkv32,
                    bias: None,
                    positions: &pb,
                    inv_freq: &fb,
                    slots: &sb,
                    q_out: &qo32,
                    k_cache: &kc32,
                    v_cache: &vc32,
                    n: b,
                    hq,
                    hkv,
                    d,
                    block_size: bs,
                    kv_scales: None,
                    raw_scales: None,
                };
                assert!(
                    !ops::gemv_rope_fits(&l, &rope),
                    "f32 RoPE buffers should not fit"
                );
                // SAFETY: every slot is < blocks * bs or negative (and nothing is launched).
                let err = unsafe { ops::gemv_rope_kv(&g, &l, &rope) }.unwrap_err();
                assert!(err.to_string().contains("gemv_rope_kv"), "{err}");
            }
            for (i, what) in ["q", "k cache", "v cache"].iter().enumerate() {
                assert!(
                    outs[0][i] == outs[1][i],
                    "b{b} hq{hq} hkv{hkv} d{d} k{k} bias {use_bias}: fused {what} differs"
                );
            }
        }
    }
}

fn run_sampler(g: &Gpu, logits: &[f32], vocab: usize, rows: &[SampleRow]) -> Vec<u32> {
    let lb = g.upload_f32(logits, DType::F32).unwrap();
    let pb = g
        .upload_bytes(bytemuck::cast_slice(rows), DType::U32)
        .unwrap();
    let out = g.alloc(DType::U32, rows.len()).unwrap();
    let scratch = g
        .alloc(DType::U32, rows.len() * kernels::SAMPLE_SCRATCH_WORDS)
        .unwrap();
    ops::sample(g, &lb, &pb, &out, &scratch, (rows.len(), vocab)).unwrap();
    // Twice on the same scratch: the kernel must leave its counters zeroed for the next launch.
    let again = g.alloc(DType::U32, rows.len()).unwrap();
    ops::sample(g, &lb, &pb, &again, &scratch, (rows.len(), vocab)).unwrap();
    let first = g.download_u32(&out, rows.len()).unwrap();
    assert_eq!(first, g.download_u32(&again, rows.len()).unwrap());
    first
}

#[test]
#[ignore = "requires a CUDA device"]
fn sampling_on_device() {
    let g = gpu();
    let mut r = Rng(7);
    let greedy = SampleRow {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 0,
        step: 0,
    };
    // 10 and 512: one slice a row; 5,000: two uneven ones; 128,256: 32. 10 and 5,001 are not
    // whole float4s (the scalar loop); 12,292's four 16-byte-rounded slices leave the last short.
    for vocab in [10, 512, 5_000, 5_001, 12_292, 128_256] {
        let rows = 6;
        let logits: Vec<f32> = r.vec(rows * vocab).iter().map(|v| v * 8.0).collect();
        let argmax: Vec<u32> = (0..rows)
            .map(|i| {
                let row = &logits[i * vocab..(i + 1) * vocab];
                let mut best = 0;
                for (j, &v) in row.iter().enumerate() {
                    if v > row[best] {
                        best = j;
                    }
                }
                best as u32
            })
            .collect();
        assert_eq!(
            run_sampler(&g, &logits, vocab, &vec![greedy; rows]),
            argmax,
            "greedy"
        );
        let k1 = SampleRow {
            temperature: 1.0,
            top_k: 1,
            ..greedy
        };
        assert_eq!(
            run_sampler(&g, &logits, vocab, &vec![k1; rows]),
            argmax,
            "top_k 1"
        );
        // top-k 5: every draw is among the 5 largest.
        let k5: Vec<SampleRow> = (0..rows)
            .map(|i| SampleRow {
                temperature: 1.5,
                top_k: 5,
                seed: 9,
                step: i as u64,
                ..greedy
            })
            .collect();
        let got = run_sampler(&g, &logits, vocab, &k5);
        for i in 0..rows {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let mut sorted = row.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let kth = sorted[5.min(vocab) - 1];
            assert!(row[got[i] as usize] >= kth, "top-k 5 drew rank > 5");
        }
        // Same seed and step: same token.
        assert_eq!(
            got,
            run_sampler(&g, &logits, vocab, &k5),
            "seeded draws repeat"
        );
        // min_p 0.5: p >= 0.5 p_max, i.e. logit >= max + T ln 0.5.
        let mp: Vec<SampleRow> = (0..rows)
            .map(|i| SampleRow {
                temperature: 1.0,
                min_p: 0.5,
                seed: 3,
                step: i as u64,
                ..greedy
            })
            .collect();
        let got = run_sampler(&g, &logits, vocab, &mp);
        for i in 0..rows {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            assert!(
                row[got[i] as usize] >= mx + 0.5f32.ln() - 1e-5,
                "min_p violated"
            );
        }
    }
    // Distribution: 4 tokens, many draws (different steps), frequencies near softmax / top-p.
    let logits = [0.0f32, 1.0, 2.0, -1.0];
    let probs: Vec<f64> = {
        let e: Vec<f64> = logits.iter().map(|&l| (l as f64).exp()).collect();
        let z: f64 = e.iter().sum();
        e.iter().map(|v| v / z).collect()
    };
    let draws = 4000;
    let rows: Vec<SampleRow> = (0..draws)
        .map(|i| SampleRow {
            temperature: 1.0,
            seed: 42,
            step: i as u64,
            ..greedy
        })
        .collect();
    let tiled: Vec<f32> = (0..draws).flat_map(|_| logits).collect();
    let got = run_sampler(&g, &tiled, 4, &rows);
    for (t, &p) in probs.iter().enumerate() {
        let f = got.iter().filter(|&&x| x == t as u32).count() as f64 / draws as f64;
        // 4000 draws: standard error ≤ 0.008, so 0.04 is 5 sigma.
        assert!((f - p).abs() < 0.04, "token {t}: frequency {f} vs p {p}");
    }
    // top_p 0.8: probs sorted are 0.644, 0.237, ...: keeps tokens 2 and 1 only.
    let rows: Vec<SampleRow> = rows
        .iter()
        .map(|r| SampleRow { top_p: 0.8, ..*r })
        .collect();
    let got = run_sampler(&g, &tiled, 4, &rows);
    assert!(
        got.iter().all(|&t| t == 2 || t == 1),
        "top-p kept a token outside the nucleus"
    );
    let f2 = got.iter().filter(|&&x| x == 2).count() as f64 / draws as f64;
    let want2 = probs[2] / (probs[2] + probs[1]);
    assert!(
        (f2 - want2).abs() < 0.04,
        "top-p renormalised: {f2} vs {want2}"
    );
}

/// The device sampler and the host sampler make the same draw for the same (seed, step) and walk
/// the kept tokens in the same (vocabulary) order, so they pick the same token.
#[test]
#[ignore = "requires a CUDA device"]
fn device_sampling_matches_the_host_sampler() {
    use worker::sampler::{SamplingParams, sample_with, uniform};
    let g = gpu();
    let mut r = Rng(11);
    let modes = [
        (1.0, 0, 1.0, 0.0),
        (0.7, 0, 1.0, 0.05),
        (1.2, 40, 1.0, 0.0),
        (0.9, 0, 0.9, 0.0),
        (1.0, 50, 0.95, 0.02),
    ];
    let mut total = 0;
    let mut mismatched = 0;
    for vocab in [37, 1000, 32_000] {
        let rows = 64;
        let logits: Vec<f32> = r.vec(rows * vocab).iter().map(|v| v * 4.0).collect();
        for &(temperature, top_k, top_p, min_p) in &modes {
            let params = SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                ..SamplingParams::default()
            };
            let device_rows: Vec<SampleRow> = (0..rows)
                .map(|i| SampleRow {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    seed: 1234 + i as u64,
                    step: 7 * i as u64,
                })
                .collect();
            let got = run_sampler(&g, &logits, vocab, &device_rows);
            for (i, row) in device_rows.iter().enumerate() {
                let host = sample_with(
                    &logits[i * vocab..(i + 1) * vocab],
                    &params,
                    uniform(row.seed, row.step),
                );
                total += 1;
                if host != got[i] {
                    mismatched += 1;
                    let row_logits = &logits[i * vocab..(i + 1) * vocab];
                    eprintln!(
                        "vocab {vocab} mode {:?} row {i}: u {} host {host} (logit {}) device {} (logit {})",
                        (temperature, top_k, top_p, min_p),
                        uniform(row.seed, row.step),
                        row_logits[host as usize],
                        got[i],
                        row_logits[got[i] as usize]
                    );
                }
            }
        }
    }
    // The device sums the CDF in f32 in a different order than the host's f64: a draw within
    // rounding (~1e-6 relative) of a boundary may land on the neighbour. That is rare (expected
    // well under one in these 960 draws); anything more is a real difference.
    assert!(
        mismatched <= 2,
        "{mismatched} of {total} seeded draws differ between device and host"
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn sampling_scratch_survives_calls_with_different_row_counts() {
    // One scratch for 64 rows, as the backend's workspace holds; calls of 1, then 16, then 64, then
    // 5 rows. A call with few rows once left its slices' results where a later call with more rows
    // reads its done-counters, which then fired early (or never): stale or wrong tokens.
    use worker::sampler::argmax;
    let g = gpu();
    let mut r = Rng(31);
    let vocab = 128_256;
    let scratch = g
        .alloc(DType::U32, 64 * kernels::SAMPLE_SCRATCH_WORDS)
        .unwrap();
    for rows in [1usize, 16, 64, 5, 64] {
        let logits: Vec<f32> = r.vec(rows * vocab).iter().map(|v| v * 4.0).collect();
        let greedy = SampleRow {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            step: 0,
        };
        let lb = g.upload_f32(&logits, DType::F32).unwrap();
        let pb = g
            .upload_bytes(bytemuck::cast_slice(&vec![greedy; rows]), DType::U32)
            .unwrap();
        let out = g.alloc(DType::U32, rows).unwrap();
        ops::sample(&g, &lb, &pb, &out, &scratch, (rows, vocab)).unwrap();
        let got = g.download_u32(&out, rows).unwrap();
        for (i, &t) in got.iter().enumerate() {
            assert_eq!(
                t,
                argmax(&logits[i * vocab..(i + 1) * vocab]),
                "{rows} rows, row {i}"
            );
        }
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn masked_device_sampling_draws_only_allowed_tokens_as_the_host_does() {
    use worker::sampler::{SamplingParams, argmax, sample_with, uniform};
    let g = gpu();
    let mut r = Rng(23);
    let mut total = 0;
    let mut mismatched = 0;
    for vocab in [37usize, 1000, 32_000, 128_256] {
        let rows = 16;
        let words = vocab.div_ceil(32);
        let logits: Vec<f32> = r.vec(rows * vocab).iter().map(|v| v * 4.0).collect();
        // Odd rows are masked: a random tenth of the vocabulary (at least one token), never the
        // row's own argmax, so a draw that ignored the mask would show.
        let mut masked_rows = Vec::new();
        let mut packed = Vec::new();
        let mut allowed = vec![vec![true; vocab]; rows];
        for row in (1..rows).step_by(2) {
            let own = argmax(&logits[row * vocab..(row + 1) * vocab]) as usize;
            let mut bits = vec![0u32; words];
            for (t, ok) in allowed[row].iter_mut().enumerate() {
                *ok = t != own && (r.f().abs() < 0.1 || t == (own + 1) % vocab);
                if *ok {
                    bits[t / 32] |= 1 << (t % 32);
                }
            }
            masked_rows.push(row as u32);
            packed.extend(bits);
        }
        for (temperature, top_k, top_p, min_p) in [
            (0.0, 0, 1.0, 0.0),
            (1.0, 0, 1.0, 0.0),
            (0.8, 40, 1.0, 0.0),
            (1.0, 0, 0.9, 0.0),
            (1.0, 20, 0.95, 0.05),
        ] {
            let lb = g.upload_f32(&logits, DType::F32).unwrap();
            let mb = g
                .upload_bytes(bytemuck::cast_slice(&packed), DType::U32)
                .unwrap();
            let mut rb = g.alloc(DType::U32, masked_rows.len()).unwrap();
            ops::mask_logits(&g, &lb, &mb, &mut rb, &masked_rows, (rows, vocab)).unwrap();
            let masked = g.download_f32(&lb).unwrap();
            for (i, (&m, &l)) in masked.iter().zip(&logits).enumerate() {
                let want = if allowed[i / vocab][i % vocab] {
                    l
                } else {
                    f32::NEG_INFINITY
                };
                assert_eq!(m.to_bits(), want.to_bits(), "vocab {vocab} logit {i}");
            }
            let params = SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                ..SamplingParams::default()
            };
            let device_rows: Vec<SampleRow> = (0..rows)
                .map(|i| SampleRow {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    seed: 99 + i as u64,
                    step: i as u64,
                })
                .collect();
            let pb = g
                .upload_bytes(bytemuck::cast_slice(&device_rows), DType::U32)
                .unwrap();
            let out = g.alloc(DType::U32, rows).unwrap();
            let scratch = g
                .alloc(DType::U32, rows * kernels::SAMPLE_SCRATCH_WORDS)
                .unwrap();
            ops::sample(&g, &lb, &pb, &out, &scratch, (rows, vocab)).unwrap();
            let got = g.download_u32(&out, rows).unwrap();
            for (i, row) in device_rows.iter().enumerate() {
                assert!(
                    allowed[i][got[i] as usize],
                    "vocab {vocab} row {i} drew masked {}",
                    got[i]
                );
                let host_logits = &masked[i * vocab..(i + 1) * vocab];
                let host = if temperature == 0.0 {
                    argmax(host_logits)
                } else {
                    sample_with(host_logits, &params, uniform(row.seed, row.step))
                };
                total += 1;
                if host != got[i] {
                    mismatched += 1;
                    eprintln!(
                        "vocab {vocab} mode {:?} row {i}: host {host} device {}",
                        (temperature, top_k, top_p, min_p),
                        got[i]
                    );
                }
            }
        }
    }
    // As in device_sampling_matches_the_host_sampler: f32 CDF rounding may move a rare draw.
    assert!(
        mismatched <= 2,
        "{mismatched} of {total} masked draws differ between device and host"
    );
}

/// E4M3 codes and scales of `rows × k` values, by the CPU reference quantizer.
fn fp8_reference(v: &[f32], k: usize) -> (Vec<u8>, Vec<f32>) {
    let q = worker::quant::fp8::Fp8Rows::quantize(v, k);
    (q.codes, q.scales)
}

/// The f64 product of E4M3 codes `xq` [m, k] (row scales `xs`) and `wq` [n, k] (row scales `ws`),
/// y[i, j] = Σ x·w · xs[i] · ws[j], and the same sum of magnitudes (for a tolerance), both [m, n].
fn fp8_product_reference(
    (xq, xs): (&[u8], &[f32]),
    (wq, ws): (&[u8], &[f32]),
    (m, n, k): (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    let table = worker::quant::fp8::decode_table();
    let (mut want, mut mag) = (vec![0f32; m * n], vec![0f32; m * n]);
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut a) = (0f64, 0f64);
            for t in 0..k {
                let p = f64::from(table[xq[i * k + t] as usize])
                    * f64::from(table[wq[j * k + t] as usize]);
                s += p;
                a += p.abs();
            }
            let sc = f64::from(xs[i]) * f64::from(ws[j]);
            want[i * n + j] = (s * sc) as f32;
            mag[i * n + j] = (a * sc) as f32;
        }
    }
    (want, mag)
}

/// The CPU quantizer's codes and scales of rows of `k` values: each row's own scale, or
/// `static_scale` for every row when it is positive.
fn fp8_expected(v: &[f32], k: usize, static_scale: f32) -> (Vec<u8>, Vec<f32>) {
    if static_scale > 0.0 {
        let codes = v.iter().map(|&x| fp8::quantize(x, static_scale)).collect();
        (codes, vec![static_scale; v.len() / k])
    } else {
        fp8_reference(v, k)
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn fp8_row_quantization_equals_the_cpu_quantizer() {
    use worker::backend::cuda::fp8::{QuantRows, quant_rows};
    let g = gpu();
    let mut r = Rng(11);
    // k a multiple of 8 (the 16-byte path; 20,000 passes the values a thread keeps in registers)
    // and not (100: one value a thread at a time).
    for (m, k) in [
        (1, 64),
        (3, 4096),
        (8, 14336),
        (5, 40),
        (37, 1000),
        (4, 100),
        (2, 20000),
    ] {
        // Rows of very different magnitudes, one all zero (the minimum scale).
        let mut x: Vec<f32> = (0..m * k)
            .map(|i| r.f() * [1e-3, 0.7, 30.0, 900.0][(i / k) % 4])
            .collect();
        if m > 2 {
            x[k..2 * k].iter_mut().for_each(|v| *v = 0.0);
        }
        let x = q(&x, DType::Bf16);
        let xb = g.upload_f32(&x, DType::Bf16).unwrap();
        let codes = g.alloc(DType::U8, m * k).unwrap();
        let scales = g.alloc(DType::F32, m).unwrap();
        for static_scale in [0.0f32, 0.01] {
            let a = QuantRows {
                x: &xb,
                q: &codes,
                scales: &scales,
                m,
                k,
                static_scale,
            };
            quant_rows(&g, &a).unwrap();
            let got_q = g.download_bytes(&codes, m * k).unwrap();
            let got_s = g.download_f32(&scales).unwrap();
            let (want_q, want_s) = fp8_expected(&x, k, static_scale);
            assert_eq!(got_s, want_s, "m{m} k{k} static {static_scale}: scales");
            let diff = got_q.iter().zip(&want_q).filter(|(a, b)| a != b).count();
            assert_eq!(
                diff, 0,
                "m{m} k{k} static {static_scale}: {diff} codes differ"
            );
        }
        eprintln!("fp8 quantization m{m} k{k}: codes and scales equal the CPU's");
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn fused_silu_mul_quantization_equals_silu_mul_then_the_cpu_quantizer() {
    use worker::backend::cuda::fp8::{SiluQuantKernel, silu_mul_quant, silu_mul_quant_with};
    let g = gpu();
    // The backend's choice: wide blocks up to a row an SM, narrow ones beyond.
    assert_eq!(SiluQuantKernel::choose(&g, g.sms), SiluQuantKernel::Wide);
    assert_eq!(SiluQuantKernel::choose(&g, g.sms + 1), SiluQuantKernel::Row);
    let mut r = Rng(13);
    // Both kernels on every shape.
    for (m, k) in [
        (1, 14336),
        (3, 4096),
        (8, 1000),
        (2, 20000),
        (5, 40),
        (300, 520),
        (7, 14336),
    ] {
        // Gate/up values of a few magnitudes per row, so that rows' scales differ.
        let gate_up: Vec<f32> = (0..m * 2 * k)
            .map(|i| r.f() * [0.05, 2.0, 9.0][(i / (2 * k)) % 3])
            .collect();
        let gate_up = q(&gate_up, DType::Bf16);
        let gu = g.upload_f32(&gate_up, DType::Bf16).unwrap();
        let act = g.alloc(DType::Bf16, m * k).unwrap();
        ops::silu_mul(&g, &gu, &act, (m, k)).unwrap();
        let act = g.download_f32(&act).unwrap();
        let codes = g.alloc(DType::U8, m * k).unwrap();
        let scales = g.alloc(DType::F32, m).unwrap();
        // The same product left raw (unscaled): the kernel scales each value as the scaling
        // pass would, bf16((x · row scale) · column scale), first. Its row scales are read from
        // the buffer it writes its own scales to, as the backend passes them.
        let row_s: Vec<f32> = (0..m).map(|i| 0.5 + 0.25 * i as f32).collect();
        let col_s: Vec<f32> = (0..2 * k).map(|c| 0.01 + 0.001 * (c % 97) as f32).collect();
        let raw: Vec<f32> = (0..m * 2 * k)
            .map(|i| gate_up[i] / (row_s[i / (2 * k)] * col_s[i % (2 * k)]))
            .collect();
        let raw = q(&raw, DType::Bf16);
        let scaled: Vec<f32> = (0..m * 2 * k)
            .map(|i| raw[i] * row_s[i / (2 * k)] * col_s[i % (2 * k)])
            .collect();
        let scaled = q(&scaled, DType::Bf16);
        let sb = g.upload_f32(&scaled, DType::Bf16).unwrap();
        let raw_act = g.alloc(DType::Bf16, m * k).unwrap();
        ops::silu_mul(&g, &sb, &raw_act, (m, k)).unwrap();
        let (raw_want_q, raw_want_s) = fp8_expected(&g.download_f32(&raw_act).unwrap(), k, 0.0);
        let rb = g.upload_f32(&raw, DType::Bf16).unwrap();
        let cols = g.upload_f32(&col_s, DType::F32).unwrap();
        for kernel in SiluQuantKernel::ALL {
            for static_scale in [0.0f32, 0.02] {
                let out = (&codes, &scales);
                assert!(
                    silu_mul_quant_with(&g, kernel, &gu, out, (m, k), static_scale, None).unwrap()
                );
                let got_q = g.download_bytes(&codes, m * k).unwrap();
                let got_s = g.download_f32(&scales).unwrap();
                let (want_q, want_s) = fp8_expected(&act, k, static_scale);
                let case = format!("{kernel:?} m{m} k{k} static {static_scale}");
                assert_eq!(got_s, want_s, "{case}: scales");
                let diff = got_q.iter().zip(&want_q).filter(|(a, b)| a != b).count();
                assert_eq!(diff, 0, "{case}: {diff} codes differ");
            }
            let inout = g.upload_f32(&row_s, DType::F32).unwrap();
            let raw_scales = Some((&inout, &cols));
            let out = (&codes, &inout);
            assert!(silu_mul_quant_with(&g, kernel, &rb, out, (m, k), 0.0, raw_scales).unwrap());
            let case = format!("{kernel:?} m{m} k{k} raw");
            assert_eq!(
                g.download_f32(&inout).unwrap(),
                raw_want_s,
                "{case}: scales"
            );
            let got_q = g.download_bytes(&codes, m * k).unwrap();
            let diff = got_q
                .iter()
                .zip(&raw_want_q)
                .filter(|(a, b)| a != b)
                .count();
            assert_eq!(diff, 0, "{case}: {diff} codes differ");
        }
        eprintln!(
            "silu·mul + fp8 quantization m{m} k{k}: every kernel gives the codes of silu_mul's output, raw too"
        );
    }
    // k not a multiple of 8: the caller runs the two kernels instead.
    let gu = g.alloc(DType::Bf16, 2 * 12).unwrap();
    let (codes, scales) = (
        g.alloc(DType::U8, 12).unwrap(),
        g.alloc(DType::F32, 1).unwrap(),
    );
    assert!(!silu_mul_quant(&g, &gu, (&codes, &scales), (1, 12), 0.0, None).unwrap());
}

/// The FP8 MLP pair (`fp8_silu`: SiLU·mul in the gate/up tile GEMV's epilogue, the down tile
/// GEMV quantizing that output as it loads it) gives the bits of the gate/up tile GEMV,
/// `silu_mul` / `silu_mul_quant` and the down tile GEMV on the same variant — its h, its row
/// maxima and its y, with dynamic and static scales — at one row, on the 8B shape and on shapes
/// whose tiles are not a multiple of the grid; it declines more rows than `FP8_SILU_MAX_ROWS`.
#[test]
#[ignore = "requires a CUDA device"]
fn fused_fp8_silu_pair_equals_the_unfused_kernels() {
    use worker::backend::cuda::fp8::{Fp8Linear, gemv_fp8_tiles, silu_mul_quant};
    use worker::backend::cuda::fp8_silu::{
        FP8_SILU_MAX_ROWS, Fp8XqLinear, fits, gemv_fp8_silu, gemv_fp8_xq,
    };
    use worker::backend::switches::{FP8_TILE_LARGE, FP8_TILE_SMALL, Fp8GemvChoice};
    let g = gpu();
    let mut r = Rng(21);
    for (m, h, inter) in [
        (1, 4096, 14336),
        (2, 4096, 14336),
        (1, 64, 320),
        (2, 192, 1088),
        (1, 1024, 4096),
        (3, 64, 320),
    ] {
        let (xq, xs) = fp8_reference(&r.vec(m * h), h);
        let (guq, gus) = fp8_reference(&r.vec(2 * inter * h), h);
        let (dq, ds) = fp8_reference(&r.vec(h * inter), inter);
        let up = |b: &[u8]| g.upload_bytes(b, DType::U8).unwrap();
        let (xb, gub, db) = (up(&xq), up(&guq), up(&dq));
        let xsb = g.upload_f32(&xs, DType::F32).unwrap();
        let gusb = g.upload_f32(&gus, DType::F32).unwrap();
        let dsb = g.upload_f32(&ds, DType::F32).unwrap();
        let gu_y = g.alloc(DType::Bf16, m * 2 * inter).unwrap();
        let act = g.alloc(DType::Bf16, m * inter).unwrap();
        let (codes, scales) = (
            g.alloc(DType::U8, m * inter).unwrap(),
            g.alloc(DType::F32, m).unwrap(),
        );
        let (want_y, got_y) = (
            g.alloc(DType::Bf16, m * h).unwrap(),
            g.alloc(DType::Bf16, m * h).unwrap(),
        );
        let (hb, amax) = (
            g.alloc(DType::Bf16, m * inter).unwrap(),
            g.alloc(DType::U32, m).unwrap(),
        );
        let gu = Fp8Linear {
            x: &xb,
            x_scales: &xsb,
            w: &gub,
            w_scales: &gusb,
            y: &gu_y,
            m,
            n: 2 * inter,
            k: h,
        };
        let down_of = |static_scale: f32| Fp8XqLinear {
            h: &hb,
            amax: &amax,
            static_scale,
            w: &db,
            w_scales: &dsb,
            y: &got_y,
            m,
            n: h,
            k: inter,
        };
        let choices = [
            Fp8GemvChoice::Auto,
            Fp8GemvChoice::Tile(FP8_TILE_SMALL),
            Fp8GemvChoice::Tile(FP8_TILE_LARGE),
        ];
        if m > FP8_SILU_MAX_ROWS {
            assert!(choices.iter().all(|&c| !fits(&gu, &down_of(0.0), c)));
            assert!(gemv_fp8_xq(&g, &down_of(0.0), Fp8GemvChoice::Auto).is_err());
            continue;
        }
        for choice in choices {
            assert!(fits(&gu, &down_of(0.0), choice), "m{m} h{h} inter{inter}");
            gemv_fp8_tiles(&g, &gu, choice).unwrap();
            ops::silu_mul(&g, &gu_y, &act, (m, inter)).unwrap();
            let want_h = bits(&g.download_f32(&act).unwrap());
            // The row maxima start at zero (the norm before zeroes them in the backend).
            g.overwrite(&amax, &vec![0u8; 4 * m]).unwrap();
            g.overwrite(&hb, &vec![0xff; m * inter * 2]).unwrap();
            gemv_fp8_silu(&g, &gu, &hb, &amax, choice).unwrap();
            let case = format!("{} m{m} h{h} inter{inter}", choice.name());
            let got_h = bits(&g.download_f32(&hb).unwrap());
            let diff = got_h.iter().zip(&want_h).filter(|(a, b)| a != b).count();
            assert_eq!(diff, 0, "{case}: {diff} of h differ");
            let got_max: Vec<f32> = g
                .download_bytes(&amax, 4 * m)
                .unwrap()
                .chunks(4)
                .map(|c| f32::from_bits(u32::from_le_bytes(c.try_into().unwrap())))
                .collect();
            let want_max: Vec<f32> = want_h
                .chunks(inter)
                .map(|row| {
                    row.iter()
                        .map(|&b| f32::from_bits(b).abs())
                        .fold(0.0, f32::max)
                })
                .collect();
            assert_eq!(got_max, want_max, "{case}: row maxima");
            for static_scale in [0.0f32, 0.02] {
                let down = Fp8Linear {
                    x: &codes,
                    x_scales: &scales,
                    w: &db,
                    w_scales: &dsb,
                    y: &want_y,
                    m,
                    n: h,
                    k: inter,
                };
                let out = (&codes, &scales);
                assert!(silu_mul_quant(&g, &gu_y, out, (m, inter), static_scale, None).unwrap());
                gemv_fp8_tiles(&g, &down, choice).unwrap();
                g.overwrite(&got_y, &vec![0xff; m * h * 2]).unwrap();
                gemv_fp8_xq(&g, &down_of(static_scale), choice).unwrap();
                let want = bits(&g.download_f32(&want_y).unwrap());
                let got = bits(&g.download_f32(&got_y).unwrap());
                let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert_eq!(diff, 0, "{case} static {static_scale}: {diff} of y differ");
            }
        }
        eprintln!(
            "fp8 SiLU·mul pair m{m} h{h} inter{inter}: h, row maxima and y equal the unfused kernels', every variant"
        );
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn gemv_fp8_matches_cpu() {
    use worker::backend::cuda::fp8::{Fp8Linear, GEMV_FP8_ROWS, gemv_fp8, gemv_fp8_tiles};
    use worker::backend::switches::{FP8_TILE_KERNELS, Fp8GemvChoice};
    let g = gpu();
    let mut r = Rng(12);
    // k % 64 of 0, 16, 48 and 32 (the last 64-wide step full or partial); n not a multiple of
    // the 16/32-row blocks; m = 1..8. The tile kernels take k % 64 == 0: fewer steps than warps
    // (192), more tiles than blocks fit at once (28,672 rows: the register ring runs on across a
    // block's tiles), a partial last tile.
    for (m, n, k) in [
        (7, 40, 192),
        (1, 28672, 128),
        (2, 1003, 640),
        (1, 64, 64),
        (3, 1000, 4096),
        (8, 4096, 14336),
        (5, 7, 48),
        (2, 33, 272),
        (6, 50, 1040),
        (4, 6144, 4096),
    ] {
        let (xq, xs) = fp8_reference(&r.vec(m * k), k);
        let (wq, ws) = fp8_reference(&r.vec(n * k), k);
        let xb = g.upload_bytes(&xq, DType::U8).unwrap();
        let wb = g.upload_bytes(&wq, DType::U8).unwrap();
        let xsb = g.upload_f32(&xs, DType::F32).unwrap();
        let wsb = g.upload_f32(&ws, DType::F32).unwrap();
        let y = g.alloc(DType::Bf16, m * n).unwrap();
        let l = Fp8Linear {
            x: &xb,
            x_scales: &xsb,
            w: &wb,
            w_scales: &wsb,
            y: &y,
            m,
            n,
            k,
        };
        assert!(l.gemv_ok());
        let (want, mag) = fp8_product_reference((&xq, &xs), (&wq, &ws), (m, n, k));
        // y's bits, once checked within bf16 rounding of the f64 reference.
        let checked = |what: &str| {
            let got = g.download_f32(&y).unwrap();
            let bad: Vec<usize> = (0..m * n)
                .filter(|&i| {
                    let err = (got[i] - want[i]).abs();
                    err.is_nan() || err > 8e-3 * want[i].abs() + 1e-5 * mag[i]
                })
                .collect();
            assert!(
                bad.is_empty(),
                "gemv_fp8 {what} m{m} n{n} k{k}: {} of {} off, first [{}] got {} want {}",
                bad.len(),
                m * n,
                bad[0],
                got[bad[0]],
                want[bad[0]]
            );
            bits(&got)
        };
        let mut first: Option<Vec<u32>> = None;
        for &rows in GEMV_FP8_ROWS {
            gemv_fp8(&g, &l, rows).unwrap();
            let b = checked(&format!("r{rows}"));
            if let Some(f) = &first {
                assert_eq!(f, &b, "block heights differ: m{m} n{n} k{k}");
            }
            first = Some(b);
        }
        if !l.tiles_ok() {
            eprintln!(
                "gemv_fp8 m{m} n{n} k{k}: within bf16 rounding, every block height bit for bit"
            );
            continue;
        }
        let mut first: Option<Vec<u32>> = None;
        for choice in FP8_TILE_KERNELS.map(Fp8GemvChoice::Tile) {
            g.overwrite(&y, &vec![0xff; m * n * 2]).unwrap(); // NaN: every output must be written
            gemv_fp8_tiles(&g, &l, choice).unwrap();
            let b = checked(choice.name());
            if let Some(f) = &first {
                assert_eq!(
                    f,
                    &b,
                    "tile kernels differ: {} m{m} n{n} k{k}",
                    choice.name()
                );
            }
            first = Some(b);
        }
        eprintln!(
            "gemv_fp8 m{m} n{n} k{k}: within bf16 rounding, every block height bit for bit, \
             every tile kernel bit for bit"
        );
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn gemm_fp8_matches_cpu() {
    use worker::backend::cuda::fp8::{Fp8Gemm, Fp8Linear};
    let g = gpu();
    let gemm = Fp8Gemm::new(&g).unwrap();
    // Another instance whose every shape is tuned first (the fastest of cuBLASLt's candidates,
    // as decode graphs' shapes are): the same product within the same bound.
    let tuned = Fp8Gemm::new(&g).unwrap();
    let mut r = Rng(13);
    for (m, n, k) in [
        (9, 64, 64),
        (37, 296, 512),
        (128, 1000, 4096),
        (300, 72, 1040),
        (16, 4096, 14336),
    ] {
        let (xq, xs) = fp8_reference(&r.vec(m * k), k);
        let (wq, ws) = fp8_reference(&r.vec(n * k), k);
        let xb = g.upload_bytes(&xq, DType::U8).unwrap();
        let wb = g.upload_bytes(&wq, DType::U8).unwrap();
        let xsb = g.upload_f32(&xs, DType::F32).unwrap();
        let wsb = g.upload_f32(&ws, DType::F32).unwrap();
        let y = g.alloc(DType::Bf16, m * n).unwrap();
        let l = Fp8Linear {
            x: &xb,
            x_scales: &xsb,
            w: &wb,
            w_scales: &wsb,
            y: &y,
            m,
            n,
            k,
        };
        let t = tuned
            .tune(&g, &l)
            .unwrap_or_else(|e| panic!("tuning m{m} n{n} k{k}: {e}"));
        assert_eq!(
            tuned.tune(&g, &l).unwrap(),
            t,
            "a tuned shape is timed once"
        );
        // A later process on this GPU model (here a fresh instance) takes the choice from the
        // disk cache: the same algorithm, so the same bits, with the time measured then.
        if g.cache_dir.is_some() {
            let later = Fp8Gemm::new(&g).unwrap();
            let lt = later.tune(&g, &l).unwrap();
            assert!(
                lt.from_cache,
                "m{m} n{n} k{k}: not taken from the disk cache"
            );
            assert!(
                (lt.kept_us - t.kept_us).abs() < 1e-3,
                "{lt:?} against {t:?}"
            );
            let mut outs = Vec::new();
            for gemm in [&tuned, &later] {
                gemm.run(&g, &l).unwrap();
                outs.push(bits(&g.download_f32(&y).unwrap()));
            }
            assert_eq!(
                outs[0], outs[1],
                "m{m} n{n} k{k}: the cached algorithm differs"
            );
        } else {
            eprintln!("no kernel cache directory: the FP8 tuning's disk cache is not checked");
        }
        let (want, mag) = fp8_product_reference((&xq, &xs), (&wq, &ws), (m, n, k));
        for (what, gemm) in [("heuristic", &gemm), ("tuned", &tuned)] {
            gemm.run(&g, &l)
                .unwrap_or_else(|e| panic!("m{m} n{n} k{k}: {e}"));
            let got = g.download_f32(&y).unwrap();
            let bad: Vec<_> = (0..m * n)
                .filter(|&i| {
                    let err = (got[i] - want[i]).abs();
                    err.is_nan() || err > 1e-2 * want[i].abs() + 1e-4 * mag[i]
                })
                .map(|i| (i / n, i % n, got[i], want[i]))
                .collect();
            assert!(
                bad.is_empty(),
                "fp8 gemm ({what}) m{m} n{n} k{k}: {} off, first {:?}",
                bad.len(),
                bad[0]
            );
        }
        eprintln!("fp8 gemm m{m} n{n} k{k}: within tolerance, heuristic and tuned ({t:?})");
    }
    // A shape cuBLASLt's FP8 path does not take is refused before any launch.
    let (x, w) = (
        g.alloc(DType::U8, 16 * 64).unwrap(),
        g.alloc(DType::U8, 300 * 64).unwrap(),
    );
    let (xs, ws, y) = (
        g.alloc(DType::F32, 16).unwrap(),
        g.alloc(DType::F32, 300).unwrap(),
        g.alloc(DType::Bf16, 16 * 300).unwrap(),
    );
    let odd = Fp8Linear {
        x: &x,
        x_scales: &xs,
        w: &w,
        w_scales: &ws,
        y: &y,
        m: 16,
        n: 300,
        k: 64,
    };
    let err = gemm.run(&g, &odd).unwrap_err();
    assert!(err.to_string().contains("n of 8"), "{err}");
}

#[test]
#[ignore = "requires a CUDA device"]
fn fp8_combine_quantizes_what_the_combine_stores() {
    use worker::backend::cuda::ops::CombineFp8;
    let g = gpu();
    let mut r = Rng(21);
    // (hq, hkv, d, block size, split, contexts): the 8B shape on the tensor-core decode kernel
    // (one sequence, as a batch-1 step; and five), and head size 64 on the CUDA-core one, with a
    // context shorter than a split (its later splits empty).
    let cases = [
        (32, 8, 128, 16, 128, vec![517usize]),
        (32, 8, 128, 16, 256, vec![1030, 40, 700, 256, 999]),
        (4, 2, 64, 16, 64, vec![200, 33, 129]),
    ];
    for kv_scales in [None, Some((1.0f32 / 64.0, 1.0f32 / 32.0))] {
        for (hq, hkv, d, bs, split, ctxs) in &cases {
            let (hq, hkv, d, bs, split) = (*hq, *hkv, *d, *bs, *split);
            if kv_scales.is_some() && d != 128 {
                continue; // the FP8 cache's decode kernel is head size 128's
            }
            let nseq = ctxs.len();
            let stride = ctxs.iter().max().unwrap().div_ceil(bs);
            let blocks = nseq * stride;
            let tables: Vec<u32> = (0..blocks as u32).collect();
            let cache_len = blocks * hkv * bs * d;
            let (kb, vb) = match kv_scales {
                None => (
                    g.upload_f32(&q(&r.vec(cache_len), DType::Bf16), DType::Bf16)
                        .unwrap(),
                    g.upload_f32(&q(&r.vec(cache_len), DType::Bf16), DType::Bf16)
                        .unwrap(),
                ),
                Some((ks, vs)) => {
                    let mut up = |s: f32| {
                        let codes: Vec<u8> = r
                            .vec(cache_len)
                            .iter()
                            .map(|&v| fp8::quantize(v, s))
                            .collect();
                        g.upload_bytes(&codes, DType::U8).unwrap()
                    };
                    (up(ks), up(vs))
                }
            };
            let mut seqs = Vec::new();
            for (s, &ctx) in ctxs.iter().enumerate() {
                seqs.extend([s as i32, 1, ctx as i32, 0]);
            }
            // Items in reverse order: item i's token is not token i.
            let items: Vec<i32> = (0..nseq as i32).rev().flat_map(|s| [s, 0]).collect();
            let num_splits = ctxs.iter().max().unwrap().div_ceil(split);
            let row = hq * d;
            // Queries of very different magnitudes per sequence.
            let qv: Vec<f32> = (0..nseq * row)
                .map(|i| r.f() * [0.5, 3.0, 0.05][(i / row) % 3])
                .collect();
            let qb = g.upload_f32(&q(&qv, DType::Bf16), DType::Bf16).unwrap();
            let (sb, ib, tb) = (
                g.upload_i32(&seqs).unwrap(),
                g.upload_i32(&items).unwrap(),
                g.upload_u32(&tables).unwrap(),
            );
            let out = g.alloc(DType::Bf16, nseq * row).unwrap();
            let po = g.alloc(DType::F32, nseq * hq * num_splits * d).unwrap();
            let pml = g.alloc(DType::F32, nseq * hq * num_splits * 2).unwrap();
            let codes = g.alloc(DType::U8, nseq * row).unwrap();
            let scales = g.alloc(DType::F32, nseq).unwrap();
            let args = Attention {
                q: &qb,
                k_cache: &kb,
                v_cache: &vb,
                out: &out,
                part_o: &po,
                part_ml: &pml,
                seqs: &sb,
                items: &ib,
                block_tables: &tb,
                num_seqs: nseq,
                num_items: nseq,
                table_stride: stride,
                n: nseq,
                hq,
                hkv,
                d,
                block_size: bs,
                split_size: split,
                num_splits,
                scale: 1.0 / (d as f32).sqrt(),
                kv_scales,
                decode: true,
                combine_fp8: None,
            };
            assert!(ops::combine_fp8_fits(DType::Bf16, d, num_splits));
            // SAFETY: seqs, items (a permutation of the sequences) and tables built
            // consistently, every table entry < blocks, every sequence one query token.
            unsafe { ops::attention(&g, &args) }.unwrap();
            let stored = g.download_f32(&out).unwrap();
            for static_scale in [0.0f32, 0.004] {
                g.overwrite(&codes, &vec![0x7f; nseq * row]).unwrap();
                let fused = Attention {
                    combine_fp8: Some(CombineFp8 {
                        q: &codes,
                        scales: &scales,
                        static_scale,
                    }),
                    ..args
                };
                // SAFETY: as above.
                unsafe { ops::attention(&g, &fused) }.unwrap();
                let got_q = g.download_bytes(&codes, nseq * row).unwrap();
                let got_s = g.download_f32(&scales).unwrap();
                let (want_q, want_s) = fp8_expected(&stored, row, static_scale);
                let what = format!(
                    "hq{hq} d{d} split {split} ctxs {ctxs:?} fp8 cache {} static {static_scale}",
                    kv_scales.is_some()
                );
                assert_eq!(got_s, want_s, "{what}: scales");
                let diff = got_q.iter().zip(&want_q).filter(|(a, b)| a != b).count();
                assert_eq!(diff, 0, "{what}: {diff} codes differ");
                eprintln!(
                    "fp8 combine {what}: codes and scales equal the CPU quantizer's of the combine's bf16 output"
                );
            }
        }
    }
    // Refused by name where it does not apply: one split.
    assert!(!ops::combine_fp8_fits(DType::Bf16, 128, 1));
    assert!(!ops::combine_fp8_fits(DType::F32, 128, 4));
}

#[test]
#[ignore = "requires a CUDA device"]
fn gemv_fp8_rope_kv_matches_the_unfused_kernels() {
    use worker::backend::cuda::fp8::{
        Fp8Linear, gemv_fp8_rope_kernel, gemv_fp8_rope_kv, gemv_fp8_tiles,
    };
    use worker::backend::switches::{FP8_TILE_LARGE, FP8_TILE_SMALL, Fp8GemvChoice};
    let g = gpu();
    let mut r = Rng(23);
    let dt = DType::Bf16;
    // (batch, hq, hkv, d, k): head size 16 (one tile a head), 64, 128 (the 8B shape).
    for (b, hq, hkv, d, k) in [
        (1, 4, 2, 16, 64),
        (3, 4, 2, 64, 192),
        (1, 32, 8, 128, 4096),
        (5, 32, 8, 128, 4096),
        (8, 8, 8, 64, 256),
    ] {
        let (bs, blocks) = (16, 4);
        let width = (hq + 2 * hkv) * d;
        let (xq, xs) = fp8_reference(&r.vec(b * k), k);
        let (wq, wsc) = fp8_reference(&r.vec(width * k), k);
        let (xb, xsb) = (
            g.upload_bytes(&xq, DType::U8).unwrap(),
            g.upload_f32(&xs, DType::F32).unwrap(),
        );
        let (wb, wsb) = (
            g.upload_bytes(&wq, DType::U8).unwrap(),
            g.upload_f32(&wsc, DType::F32).unwrap(),
        );
        let bias = g.upload_f32(&q(&r.vec(width), dt), dt).unwrap();
        let positions: Vec<u32> = (0..b).map(|_| r.below(8000) as u32).collect();
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 500000f32.powf(-(2.0 * i as f32) / d as f32))
            .collect();
        let mut slots: Vec<i64> = (0..b as i64)
            .map(|i| (i * 5 + 3) % (blocks * bs) as i64)
            .collect();
        if b > 1 {
            slots[b / 2] = -1;
        }
        let cache_len = blocks * hkv * bs * d;
        let (pb, fb, sb) = (
            g.upload_u32(&positions).unwrap(),
            g.upload_f32(&inv_freq, DType::F32).unwrap(),
            g.upload_i64(&slots).unwrap(),
        );
        for kernel in [FP8_TILE_SMALL, FP8_TILE_LARGE] {
            let choice = Fp8GemvChoice::Tile(kernel);
            for (use_bias, kv_scales) in [
                (false, None),
                (true, None),
                (false, Some((1.0f32 / 16.0, 1.0f32 / 8.0))),
            ] {
                let mut outs = Vec::new();
                for fused in [false, true] {
                    let qkv = g.alloc(dt, b * width).unwrap();
                    let qo = g.alloc(dt, b * hq * d).unwrap();
                    let (kc, vc) = match kv_scales {
                        None => (
                            g.upload_f32(&q(&vec![0.25; cache_len], dt), dt).unwrap(),
                            g.upload_f32(&q(&vec![-0.5; cache_len], dt), dt).unwrap(),
                        ),
                        Some(_) => (
                            g.upload_bytes(&vec![3; cache_len], DType::U8).unwrap(),
                            g.upload_bytes(&vec![5; cache_len], DType::U8).unwrap(),
                        ),
                    };
                    let l = Fp8Linear {
                        x: &xb,
                        x_scales: &xsb,
                        w: &wb,
                        w_scales: &wsb,
                        y: &qkv,
                        m: b,
                        n: width,
                        k,
                    };
                    let rope = RopeKv {
                        qkv: &qkv,
                        bias: use_bias.then_some(&bias),
                        positions: &pb,
                        inv_freq: &fb,
                        slots: &sb,
                        q_out: &qo,
                        k_cache: &kc,
                        v_cache: &vc,
                        n: b,
                        hq,
                        hkv,
                        d,
                        block_size: bs,
                        kv_scales,
                        raw_scales: None,
                    };
                    assert_eq!(gemv_fp8_rope_kernel(&l, &rope, choice), Some(kernel));
                    // SAFETY: every slot is < blocks * bs or negative.
                    unsafe {
                        if fused {
                            gemv_fp8_rope_kv(&g, &l, &rope, choice).unwrap();
                        } else {
                            gemv_fp8_tiles(&g, &l, choice).unwrap();
                            ops::rope_kv_write(&g, &rope).unwrap();
                        }
                    }
                    let caches = match kv_scales {
                        None => [&kc, &vc].map(|c| bits(&g.download_f32(c).unwrap())),
                        Some(_) => [&kc, &vc].map(|c| {
                            let v = g.download_bytes(c, cache_len).unwrap();
                            v.into_iter().map(u32::from).collect()
                        }),
                    };
                    let [kbits, vbits] = caches;
                    outs.push([bits(&g.download_f32(&qo).unwrap()), kbits, vbits]);
                }
                for (i, what) in ["q", "k cache", "v cache"].iter().enumerate() {
                    assert!(
                        outs[0][i] == outs[1][i],
                        "{kernel} b{b} hq{hq} hkv{hkv} d{d} k{k} bias {use_bias} fp8 cache {}: \
                         fused {what} differs",
                        kv_scales.is_some()
                    );
                }
                eprintln!(
                    "gemv_fp8_rope_kv {kernel} b{b} hq{hq} hkv{hkv} d{d} k{k} bias {use_bias} fp8 \
                     cache {}: q and caches bit for bit",
                    kv_scales.is_some()
                );
            }
        }
    }
    // A head size that is not a multiple of 16: refused by name, nothing launched.
    let (b, hq, hkv, d, k) = (1, 2, 1, 24, 64);
    let width = (hq + 2 * hkv) * d;
    let u8buf = |n: usize| g.alloc(DType::U8, n).unwrap();
    let f32buf = |n: usize| g.alloc(DType::F32, n).unwrap();
    let (xb, wb, xsb, wsb) = (u8buf(b * k), u8buf(width * k), f32buf(b), f32buf(width));
    let (qkv, qo) = (
        g.alloc(dt, b * width).unwrap(),
        g.alloc(dt, b * hq * d).unwrap(),
    );
    let (kc, vc) = (
        g.alloc(dt, 16 * hkv * d).unwrap(),
        g.alloc(dt, 16 * hkv * d).unwrap(),
    );
    let (pb, fb, sb) = (
        g.upload_u32(&[0]).unwrap(),
        g.upload_f32(&vec![1.0; d / 2], DType::F32).unwrap(),
        g.upload_i64(&[0]).unwrap(),
    );
    let l = Fp8Linear {
        x: &xb,
        x_scales: &xsb,
        w: &wb,
        w_scales: &wsb,
        y: &qkv,
        m: b,
        n: width,
        k,
    };
    let rope = RopeKv {
        qkv: &qkv,
        bias: None,
        positions: &pb,
        inv_freq: &fb,
        slots: &sb,
        q_out: &qo,
        k_cache: &kc,
        v_cache: &vc,
        n: b,
        hq,
        hkv,
        d,
        block_size: 16,
        kv_scales: None,
        raw_scales: None,
    };
    assert_eq!(gemv_fp8_rope_kernel(&l, &rope, Fp8GemvChoice::Auto), None);
    // SAFETY: the one slot is 0 (and nothing is launched).
    let err = unsafe { gemv_fp8_rope_kv(&g, &l, &rope, Fp8GemvChoice::Auto) }.unwrap_err();
    assert!(err.to_string().contains("gemv_fp8_rope_kv"), "{err}");
}
