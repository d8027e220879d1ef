//! INT4 linear layers on the CUDA backend: the kernels against the CPU reference at shapes that are
//! not tile multiples (dequantization bit for bit against the twin's weights rounded to bf16; the
//! GEMV kernels — per-weight and 16-row tiles — for 1–40 rows and every tensor-core product shape
//! for 33–257 rows (the Hopper wgmma kernels too, on sm_90a), k split and not, within bf16
//! rounding of an f64 product, act order included), and whole models (the AWQ, GPTQ and
//! compressed-tensors fixtures) against the CPU INT4 reference, eager and not, with the tile and
//! tensor-core kernels (wgmma and mma.sync) and without.
//!
//! Run on a GPU machine: `cargo test --release --features cuda --test cuda_int4 --
//! --include-ignored` (set `FIXTURES_DIR` when the fixtures are not at their source path).
#![cfg(feature = "cuda")]

mod common;

use common::{cuda_options, fixture, greedy_of, last_logits, rel_l2};
use half::bf16;
use worker::backend::cpu::{CpuBackend, CpuOptions};
use worker::backend::cuda::int4::{
    Int4Linear, Int4Scales, MMA_KERNELS, MmaChoice, TILE_VARIANTS, WGMMA_KERNELS, dequant_int4,
    gemm_int4, gemv_int4, launch_mma, launch_tile, launch_wgmma, pack, permute_cols, tile_step,
    wgmma_fits,
};
use worker::backend::cuda::{CudaBackend, CudaOptions, DType, Gpu};
use worker::backend::switches::{
    INT4_WGMMA_DEFAULT, INT4_WGMMA_WIDE_DEFAULT, Int4WgmmaChoice, KernelSwitches,
};
use worker::checkpoint::Checkpoint;
use worker::quant::int4::Int4Weight;

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// The INT4 products the kernel test runs.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kernel {
    PerWeight,
    Tiles,
    Mma {
        split: bool,
    },
    /// `MMA_KERNELS[i]`, k split where it takes it.
    MmaVariant(usize),
    /// `WGMMA_KERNELS[i]` (sm_90a only), k split or not.
    Wgmma {
        v: usize,
        split: bool,
    },
}

fn random_weight(rng: &mut Rng, n: usize, k: usize, gs: usize, act_order: bool) -> Int4Weight {
    let groups = k.div_ceil(gs);
    let g_idx = act_order.then(|| {
        // A permutation of 0..k, then column perm[j] in group j / gs.
        let mut perm: Vec<usize> = (0..k).collect();
        for i in (1..k).rev() {
            perm.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let mut g = vec![0u32; k];
        for (j, &c) in perm.iter().enumerate() {
            g[c] = (j / gs) as u32;
        }
        g
    });
    Int4Weight {
        rows: n,
        cols: k,
        group_size: gs,
        codes: (0..n * k).map(|_| (rng.next() % 16) as u8).collect(),
        // f16 scales, as checkpoints store them.
        scales: (0..n * groups)
            .map(|_| half::f16::from_f32(0.002 + 0.01 * rng.unit().abs()).to_f32())
            .collect(),
        zeros: (0..n * groups).map(|_| (rng.next() % 17) as u8).collect(),
        g_idx,
        mins: None,
    }
}

/// `w` as GGUF's Q4_1 stores weights: `q · s + m`, zero points 0, f16 offsets.
fn with_q4_1_offsets(rng: &mut Rng, mut w: Int4Weight) -> Int4Weight {
    w.zeros.iter_mut().for_each(|z| *z = 0);
    w.mins = Some(
        w.scales
            .iter()
            .map(|&s| half::f16::from_f32(-8.0 * s * (0.5 + rng.unit().abs())).to_f32())
            .collect(),
    );
    w
}

fn bf16s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

fn upload_bf16(g: &Gpu, x: &[f32]) -> worker::backend::cuda::Buf {
    let bytes: Vec<u8> = x
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    g.upload_bytes(&bytes, DType::Bf16).expect("upload")
}

#[test]
#[ignore = "requires a CUDA device"]
fn int4_kernels_match_the_reference_at_odd_shapes() {
    let g = Gpu::new(0, &KernelSwitches::default()).expect("GPU");
    let mut rng = Rng(7);
    // (n, k, group size, act order): rows not a multiple of the 16/32-row tiles, k not a
    // multiple of the 128-wide step, the last group short, one group per row (GPTQ's -1).
    let shapes = [
        (40, 96, 32, false),
        (24, 160, 32, true),
        (264, 384, 128, false),
        (72, 448, 64, true),
        (8, 4096, 4096, false),
        (48, 320, 128, false),
        (40, 96, 96, false),
        (16392, 256, 128, false),
        // k split by the tensor-core product: a half last step, and act order.
        (136, 2080, 32, false),
        (72, 1536, 128, true),
    ];
    // Every shape as AWQ/GPTQ store it; those without act order also with Q4_1's offsets.
    let cases = shapes
        .iter()
        .flat_map(|&s| [(s, false), (s, true)])
        .filter(|&((.., act), q41)| !(act && q41));
    for ((n, k, gs, act), q41) in cases {
        eprintln!("shape {n} x {k}, groups of {gs}, act order {act}, Q4_1 offsets {q41}");
        let w = random_weight(&mut rng, n, k, gs, act);
        let w = if q41 {
            with_q4_1_offsets(&mut rng, w)
        } else {
            w
        };
        let deq = w.dequantize();
        let packed = pack(&w).expect("pack");
        let (words, scales): (_, Int4Scales) = Int4Scales::upload(&g, &packed).expect("upload");
        // Dequantization: every weight is bf16(the twin's f32 weight), in the packed column order.
        let col = |j: usize| packed.perm.as_ref().map_or(j, |p| p[j] as usize);
        let out = g.alloc(DType::Bf16, n * k).expect("alloc");
        let dummy = g.alloc(DType::Bf16, k).expect("alloc");
        let l = Int4Linear {
            x: &dummy,
            w: &words,
            s: &scales,
            y: &dummy,
            m: 0,
            n,
            k,
        };
        dequant_int4(&g, &l, &out).expect("dequant");
        let got = bf16s(&g.download_bytes(&out, n * k).expect("download"));
        for r in 0..n {
            for j in 0..k {
                let want = bf16::from_f32(deq[r * k + col(j)]).to_f32();
                assert_eq!(
                    got[r * k + j].to_bits(),
                    want.to_bits(),
                    "{n}x{k} dequant [{r}, {j}]"
                );
            }
        }
        // The GEMV, 1..=40 rows (chunks of 8 rows a launch), after act order's permutation; the
        // tensor-core product (`gemm`, no offsets) at 33..=257 rows, with k split (a scratch for
        // every split) and not (no scratch).
        let big_scratch = g.alloc(DType::F32, 8 * 257 * n).expect("alloc");
        let no_scratch = g.alloc(DType::F32, 1).expect("alloc");
        for m in [1, 3, 8, 13, 40, 33, 64, 70, 130, 257] {
            let x: Vec<f32> = (0..m * k)
                .map(|_| bf16::from_f32(rng.unit()).to_f32())
                .collect();
            let xb = upload_bf16(&g, &x);
            let y = g.alloc(DType::Bf16, m * n).expect("alloc");
            let xin = match &scales.perm {
                Some(perm) => {
                    let xp = g.alloc(DType::Bf16, m * k).expect("alloc");
                    permute_cols(&g, (&xb, perm, &xp), (m, k)).expect("permute");
                    xp
                }
                None => xb,
            };
            let l = Int4Linear {
                x: &xin,
                w: &words,
                s: &scales,
                y: &y,
                m,
                n,
                k,
            };
            // The per-weight kernel and the tile kernel where the groups allow it, up to 40 rows;
            // past 32, the tensor-core product.
            let mut variants = Vec::new();
            if m <= 40 {
                variants.push(Kernel::PerWeight);
                if tile_step(&scales, k).is_some() {
                    variants.push(Kernel::Tiles);
                }
            }
            if m > 32 && !q41 {
                variants.extend([Kernel::Mma { split: true }, Kernel::Mma { split: false }]);
                // The scaled family only where the groups hold whole 64-wide k-steps.
                let scaled_ok = tile_step(&scales, k).is_some();
                variants.extend(
                    (1..MMA_KERNELS.len())
                        .filter(|&v| scaled_ok || !MMA_KERNELS[v].scaled)
                        .map(Kernel::MmaVariant),
                );
                // The Hopper kernels where they are compiled and take the groups.
                if g.arch == "sm_90a" && wgmma_fits(&l) {
                    // Unsplit: the first kernel and the two defaults.
                    let position = |short: &str| {
                        WGMMA_KERNELS
                            .iter()
                            .position(|k| k.short == short)
                            .expect("the default wgmma kernels are listed")
                    };
                    variants.extend(
                        [
                            0,
                            position(INT4_WGMMA_DEFAULT),
                            position(INT4_WGMMA_WIDE_DEFAULT),
                        ]
                        .into_iter()
                        .map(|v| Kernel::Wgmma { v, split: false }),
                    );
                    variants
                        .extend((0..WGMMA_KERNELS.len()).map(|v| Kernel::Wgmma { v, split: true }));
                }
            }
            for &kernel in &variants {
                // Kernels that apply the scales to f32 sums: their weights are never rounded.
                let tiles = match kernel {
                    Kernel::Tiles => true,
                    Kernel::PerWeight => false,
                    Kernel::Mma { .. } => tile_step(&scales, k).is_some(),
                    Kernel::MmaVariant(v) => MMA_KERNELS[v].scaled,
                    Kernel::Wgmma { .. } => false,
                };
                match kernel {
                    Kernel::PerWeight | Kernel::Tiles => {
                        gemv_int4(&g, &l, if n >= 16384 { 32 } else { 16 }, tiles).expect("gemv")
                    }
                    Kernel::Mma { split } => {
                        let scratch = if split { &big_scratch } else { &no_scratch };
                        let choice = MmaChoice {
                            scaled: true,
                            wgmma: None,
                        };
                        gemm_int4(&g, &l, choice, scratch).expect("gemm_int4")
                    }
                    Kernel::MmaVariant(v) => {
                        launch_mma(&g, &l, &MMA_KERNELS[v], &big_scratch).expect("gemm_int4")
                    }
                    Kernel::Wgmma { v, split } => {
                        let scratch = if split { &big_scratch } else { &no_scratch };
                        launch_wgmma(&g, &l, &WGMMA_KERNELS[v], scratch).expect("gemm_int4_wgmma")
                    }
                }
                let got = bf16s(&g.download_bytes(&y, m * n).expect("download"));
                for b in 0..m {
                    for r in 0..n {
                        let (mut want, mut mag) = (0f64, 0f64);
                        for c in 0..k {
                            // The per-weight kernel and the dequantizing tensor-core family
                            // multiply bf16-rounded weights; the tile and scaled ones apply the
                            // scales to f32 sums, so their weights are never rounded.
                            let w = deq[r * k + c];
                            let wv = if tiles {
                                f64::from(w)
                            } else {
                                f64::from(bf16::from_f32(w).to_f32())
                            };
                            want += f64::from(x[b * k + c]) * wv;
                            mag += (f64::from(x[b * k + c]) * wv).abs();
                        }
                        let err = (f64::from(got[b * n + r]) - want).abs();
                        assert!(
                            err <= 4e-3 * want.abs() + 1e-5 * mag + 1e-6,
                            "{n}x{k} (groups of {gs}, act order {act}, Q4_1 {q41}, {kernel:?}) \
                             m {m} [{b}, {r}]: {} vs {want}",
                            got[b * n + r]
                        );
                    }
                }
                // The tile kernel's variants (cuda_bench's) give its bits: the same steps in the
                // same order, whatever the ring holds.
                if kernel == Kernel::Tiles && m <= 8 && tile_step(&scales, k) == Some(128) {
                    for v in &TILE_VARIANTS {
                        launch_tile(&g, &l, v, 0, m).expect("tile variant");
                        let again = bf16s(&g.download_bytes(&y, m * n).expect("download"));
                        assert!(
                            again
                                .iter()
                                .map(|v| v.to_bits())
                                .eq(got.iter().map(|v| v.to_bits())),
                            "{n}x{k} (groups of {gs}) m {m}: {} differs from the tile kernel",
                            v.name
                        );
                    }
                }
            }
        }
    }
}

#[test]
#[ignore = "requires a CUDA device"]
fn int4_models_on_cuda_match_the_cpu_reference() {
    // 5 tokens: the GEMV path; 40 and 100: the tensor-core product (its two shape rules;
    // dequantization + cuBLAS with it off); 200: the Hopper product where it runs (up to
    // kernels::INT4_WGMMA_MAX_ROWS), else dequantization + cuBLAS, as 300 always (past
    // kernels::INT4_MMA_MAX_ROWS).
    let prompts: [Vec<u32>; 5] = [
        vec![1, 17, 42, 99, 3],
        (1..=40).collect(),
        (0..100).map(|i| (i * 11 + 1) % 256).collect(),
        (0..200).map(|i| (i * 7 + 3) % 256).collect(),
        (0..300).map(|i| (i * 13 + 5) % 256).collect(),
    ];
    for name in [
        "int4-awq",
        "int4-gptq",
        "int4-gptq-sym",
        "int4-ct-sym",
        "int4-ct-asym",
        "int4-ct-group",
    ] {
        let (config, ckpt) = Checkpoint::load(&fixture(name)).expect("fixture");
        let mut cpu = CpuBackend::new(
            &config,
            &ckpt,
            CpuOptions {
                block_size: 16,
                num_kv_blocks: 64,
                quantization: None,
                kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
            },
        )
        .expect("cpu");
        // wgmma past 64 rows (on sm_90a; elsewhere Auto is off), the mma.sync families, none.
        let (auto, off) = (Int4WgmmaChoice::Auto, Int4WgmmaChoice::Off);
        for (eager, int4_tiles, int4_mma, int4_mma_scaled, int4_wgmma) in [
            (true, true, true, true, auto),
            (false, true, true, true, auto),
            (false, true, true, true, off),
            (false, true, true, false, off),
            (true, false, false, false, off),
            (false, false, false, false, off),
        ] {
            let opts = CudaOptions {
                kernels: KernelSwitches {
                    int4_tiles,
                    int4_mma,
                    int4_mma_scaled,
                    int4_wgmma,
                    ..KernelSwitches::default()
                },
                ..cuda_options(eager, None)
            };
            let mut cuda = CudaBackend::new(&config, &ckpt, &opts)
                .unwrap_or_else(|e| panic!("CUDA backend on {name}: {e}"));
            for p in &prompts {
                let (want, got) = (last_logits(&mut cpu, p), last_logits(&mut cuda, p));
                let err = rel_l2(&got, &want);
                println!(
                    "{name} eager {eager} tiles {int4_tiles} mma {int4_mma} scaled \
                     {int4_mma_scaled} wgmma {int4_wgmma:?} prompt of {}: rel L2 {err:.2e}",
                    p.len()
                );
                assert!(err < 2e-2, "{name}: rel L2 {err}");
            }
        }
    }
}

/// A GGUF file's Q4_0 and Q4_1 layers (`tests/fixtures/gguf-q4`: one layer each) on the INT4
/// kernels (`gguf_int4`, the default) and dequantized to bf16 (switch off), each against the CPU
/// backend's f32 decoding of the same file; the INT4 upload is the smaller one.
#[test]
#[ignore = "requires a CUDA device"]
fn gguf_q4_layers_on_cuda_match_the_cpu_reference() {
    let path = fixture("gguf-q4").join("model.gguf");
    let (config, ckpt) = Checkpoint::load(&path).expect("fixture");
    let mut cpu = CpuBackend::new(
        &config,
        &ckpt,
        CpuOptions {
            block_size: 16,
            num_kv_blocks: 64,
            quantization: None,
            kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
        },
    )
    .expect("cpu");
    let prompts: [Vec<u32>; 2] = [vec![1, 17, 42, 99, 3], (1..=40).collect()];
    let mut bytes = Vec::new();
    for gguf_int4 in [true, false] {
        for eager in [true, false] {
            let opts = CudaOptions {
                kernels: KernelSwitches {
                    gguf_int4,
                    ..KernelSwitches::default()
                },
                ..cuda_options(eager, None)
            };
            let mut cuda = CudaBackend::new(&config, &ckpt, &opts)
                .unwrap_or_else(|e| panic!("CUDA backend on gguf-q4: {e}"));
            bytes.push((gguf_int4, cuda.weight_bytes()));
            for p in &prompts {
                let (want, got) = (last_logits(&mut cpu, p), last_logits(&mut cuda, p));
                let err = rel_l2(&got, &want);
                println!(
                    "gguf-q4 int4 {gguf_int4} eager {eager} prompt of {}: rel L2 {err:.2e}",
                    p.len()
                );
                assert!(err < 2e-2, "gguf-q4 (int4 {gguf_int4}): rel L2 {err}");
            }
        }
    }
    println!("weight bytes on the device: {bytes:?}");
    assert!(
        bytes[0].1 < bytes[2].1,
        "INT4 layers are not smaller: {bytes:?}"
    );
}

/// Decode graphs whose kernels launch early (programmatic dependent launch, sm_90+, graphs of one
/// sequence: each prompt alone) give an INT4 model the tokens the plain graphs give: the INT4
/// tile GEMV loads its first codes and scales before its wait and reads x only after it.
#[test]
#[ignore = "requires a CUDA device"]
fn int4_decode_graphs_with_pdl_give_the_same_tokens() {
    use worker::backend::switches::PdlChoice;
    const { assert!(worker::backend::cuda::PDL_MAX_ROWS >= 1) };
    let prompts: [Vec<u32>; 3] = [
        vec![1, 17, 42, 99, 3],
        (1..=40).collect(),
        (0..100).map(|i| (i * 11 + 1) % 256).collect(),
    ];
    for name in ["int4-awq", "int4-gptq"] {
        let (config, ckpt) = Checkpoint::load(&fixture(name)).expect("fixture");
        let tokens = |pdl: PdlChoice, prompt: &[u32]| {
            let opts = CudaOptions {
                kernels: KernelSwitches {
                    pdl,
                    ..KernelSwitches::default()
                },
                ..cuda_options(false, None)
            };
            let b = CudaBackend::new(&config, &ckpt, &opts)
                .unwrap_or_else(|e| panic!("CUDA backend on {name}: {e}"));
            greedy_of(Box::new(b), &config, &[prompt.to_vec()]).remove(0)
        };
        for p in &prompts {
            let (with, without) = (tokens(PdlChoice::All, p), tokens(PdlChoice::Off, p));
            println!("{name} prompt of {}: {with:?}", p.len());
            assert_eq!(with.len(), 24);
            assert_eq!(with, without, "{name}: PDL changed the tokens");
        }
    }
}

/// The tile GEMV with RoPE and the KV write (q/k/v) and SiLU·mul (gate/up) in its epilogue
/// (`KernelSwitches::fuse_rope` and `fuse_silu`, steps of `INT4_FUSED_MIN_ROWS` to
/// `INT4_GEMV_MAX_ROWS` rows) gives the bits of the plain tile kernel followed by `rope_kv_write`
/// and `silu_mul`: the same logits after prompts of 2, 5 and 20 tokens (prefill steps on the fused
/// kernels) and the same greedy tokens decoding one prompt alone (unfused either way, a control)
/// and all three together (fused), with CUDA graphs and without, on
/// the fixtures whose groups the tile kernels take (k-steps of 64 and 128, act order), with a
/// bf16 and an FP8 KV cache.
#[test]
#[ignore = "requires a CUDA device"]
fn int4_tile_gemv_with_rope_and_silu_in_its_epilogue_gives_the_same_bits() {
    use worker::backend::cuda::int4::tile_step_for;
    use worker::quant::StoredQuant;
    use worker::quant::kv::KvCacheDtype;
    const { assert!(worker::backend::cuda::INT4_GEMV_MAX_ROWS >= 20) };
    const { assert!(worker::backend::cuda::INT4_FUSED_MIN_ROWS <= 2) };
    let prompts: [Vec<u32>; 3] = [vec![1, 17, 42, 99, 3], (1..=20).collect(), vec![7, 8]];
    for name in ["int4-gptq", "int4-gptq-sym", "int4-ct-asym"] {
        let (config, ckpt) = Checkpoint::load(&fixture(name)).expect("fixture");
        // Otherwise both runs would take the per-weight kernels and compare a path with itself.
        let Some(StoredQuant::Int4(q)) = &config.quantization else {
            panic!("{name}: not an INT4 checkpoint");
        };
        let gs = q.group_size.unwrap_or(usize::MAX);
        for k in [config.hidden_size, config.intermediate_size] {
            assert!(
                tile_step_for(k, gs).is_some(),
                "{name}: no tile kernel for k {k}"
            );
        }
        for kv_cache_dtype in [KvCacheDtype::Auto, KvCacheDtype::Fp8E4m3] {
            for eager in [true, false] {
                let backend = |fused: bool| {
                    let mut opts = cuda_options(eager, None);
                    opts.kernels.fuse_rope = fused;
                    opts.kernels.fuse_silu = fused;
                    opts.kv_cache_dtype = kv_cache_dtype;
                    CudaBackend::new(&config, &ckpt, &opts)
                        .unwrap_or_else(|e| panic!("CUDA backend on {name}: {e}"))
                };
                let (mut with, mut without) = (backend(true), backend(false));
                for p in &prompts {
                    let (a, b) = (last_logits(&mut with, p), last_logits(&mut without, p));
                    assert!(
                        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{name} {kv_cache_dtype:?} eager {eager}, prompt of {}: the fused \
                         epilogues changed the logits",
                        p.len()
                    );
                }
                drop((with, without));
                // Decode steps of one row and of three.
                let sets = [vec![prompts[0].clone()], prompts.to_vec()];
                let tokens = |fused: bool| -> Vec<_> {
                    sets.iter()
                        .map(|s| greedy_of(Box::new(backend(fused)), &config, s))
                        .collect()
                };
                let (a, b) = (tokens(true), tokens(false));
                assert_eq!(
                    a, b,
                    "{name} {kv_cache_dtype:?} eager {eager}: tokens changed"
                );
                assert!(a.iter().flatten().all(|t| t.len() == 24));
                println!(
                    "{name} {kv_cache_dtype:?} eager {eager}: the same logits (3 prompts) and \
                     tokens ({} runs)",
                    sets.len()
                );
            }
        }
    }
}
