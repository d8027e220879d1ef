//! The CUDA backend's kernel switches: one typed struct, part of the backend's options, read from
//! the environment in exactly one place ([`KernelSwitches::from_env`], called by the command line
//! at start-up) so that tests and tools set them through the same struct.
//!
//! Every switch defaults to what measured fastest on the H200 (docs/benchmarks.md); turning one
//! off is for measuring the alternative. The struct exists in every build (the CPU backend
//! ignores it), so call sites need no `cfg`.

use std::fmt;

/// The environment variables [`KernelSwitches::from_env`] reads, with what each accepts.
pub const KERNEL_SWITCH_VARS: [(&str, &str); 16] = [
    ("RINGSERVE_CUDA_PREFILL", "mma or wgmma"),
    ("RINGSERVE_CUDA_DECODE_MMA", "0 or 1"),
    ("RINGSERVE_CUDA_DECODE_SHARE", "0 or 1"),
    ("RINGSERVE_CUDA_PDL", "0, quantized (or fp8) or 1"),
    ("RINGSERVE_CUDA_GEMV", "0, 1, or a weight size in elements"),
    ("RINGSERVE_CUDA_FUSE_ROPE", "0 or 1"),
    ("RINGSERVE_CUDA_FUSE_O_QUANT", "0 or 1"),
    ("RINGSERVE_CUDA_FUSE_SILU", "0 or 1"),
    ("RINGSERVE_CUDA_L2_PREFETCH", "0 or 1"),
    ("RINGSERVE_CUDA_GEMM_TUNE", "0 or 1"),
    ("RINGSERVE_CUDA_INT4_TILES", "0 or 1"),
    ("RINGSERVE_CUDA_GGUF_INT4", "0 or 1"),
    ("RINGSERVE_CUDA_INT4_MMA", "0 or 1"),
    ("RINGSERVE_CUDA_INT4_MMA_SCALED", "0 or 1"),
    (
        "RINGSERVE_CUDA_INT4_WGMMA",
        "0, 1 or a kernel's name (s3, p3, ...)",
    ),
    (
        "RINGSERVE_CUDA_FP8_GEMV",
        "auto, r16 or a tile kernel's name (t16_d2x_b4, ...)",
    ),
];

/// Largest weight (elements) the GEMV kernel takes by default. On the H200 it beats cuBLAS on the
/// 8B shape's q/k/v (25.2 M elements, 3.10 vs 2.80 TB/s at one row) and o (16.8 M, 2.75 vs
/// 1.98 TB/s), and loses on down, gate/up and the LM head (≥ 58.7 M, 3.5–3.9 vs 3.6–4.2 TB/s).
pub const GEMV_MAX_WEIGHT: usize = 1 << 25;

/// Which kernel runs bf16 head-size-128 prefill attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillChoice {
    /// The architecture's best: wgmma on compute capability 9.0 (`sm_90a`), mma.sync elsewhere.
    #[default]
    Auto,
    /// mma.sync, every architecture.
    Mma,
    /// Hopper's wgmma; an error on other architectures.
    Wgmma,
}

/// Which small-batch products (at most `GEMV_CROSSOVER_ROWS` rows) take the GEMV kernel instead
/// of cuBLAS. Ignored in batch-invariant mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvChoice {
    /// None: every product on cuBLAS.
    Off,
    /// bf16 weights of at most this many elements ([`GEMV_MAX_WEIGHT`] by default).
    UpTo(usize),
    /// Every shape the kernel supports (for measuring).
    All,
}

impl Default for GemvChoice {
    fn default() -> Self {
        Self::UpTo(GEMV_MAX_WEIGHT)
    }
}

/// Which decode graphs (of at most the CUDA backend's `PDL_MAX_ROWS` sequences, on sm_90+) let
/// the kernels of `kernels::PDL_KERNELS` launch while the kernel before them finishes
/// (programmatic dependent launch): the FP8 tile GEMV streams its first weights meanwhile, the
/// others are resident when their inputs are ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PdlChoice {
    /// None.
    Off,
    /// Those of models with quantized linear layers, FP8 or AWQ / GPTQ INT4 (whose tile GEMVs load
    /// their first weights before they wait): batch 1 3.4–3.8 % faster with FP8 on two H200s
    /// (run 42), 2.1–2.5 % with INT4 on an H100 (run 55). bf16's batch 1 (whose GEMVs wait on
    /// entry) was 1.9 % faster on one machine and 3.4 % slower on another.
    #[default]
    Quantized,
    /// Every model's (for measuring, and for testing the kernels under it).
    All,
}

/// The FP8 tile GEMV kernels (`gemv_fp8_<name>` in `fp8.cu`): [`FP8_TILE_SMALL`] and
/// [`FP8_TILE_LARGE`] first, then the variants `cuda_bench gemv` times beside them.
pub const FP8_TILE_KERNELS: [&str; 7] = [
    FP8_TILE_SMALL,
    FP8_TILE_LARGE,
    "t16_d3x",
    "t16_d4x",
    "t16_d6x_b2",
    "t16_d8x",
    "t16_d4",
];
/// The tile kernel [`Fp8GemvChoice::Auto`] runs on products of at most [`FP8_TILE_SMALL_MAX`]
/// weights (2 k-steps in flight, 4 blocks an SM): on the H200 (run 41) the fastest at q/k/v and o
/// of the 8B shape (9.6 and 7.9 µs at one row against 11.0 and 8.5 for `gemv_fp8_r16`).
pub const FP8_TILE_SMALL: &str = "t16_d2x_b4";
/// The tile kernel [`Fp8GemvChoice::Auto`] runs on larger products (4 k-steps in flight, 2 blocks
/// an SM): the fastest at gate/up and down (32.2 and 18.5 µs against 37.9 and 20.1).
pub const FP8_TILE_LARGE: &str = "t16_d4x_b2";
/// Largest product (weights) [`FP8_TILE_SMALL`] takes under [`Fp8GemvChoice::Auto`].
pub const FP8_TILE_SMALL_MAX: usize = 1 << 25;

/// The Hopper INT4 products `gemm_int4_wgmma_<name>` (sm_90a only), by the name
/// `RINGSERVE_CUDA_INT4_WGMMA` takes: `s` and the stages of its ring (`p`: the next k-step's
/// weights dequantized while a wgmma runs). (`s4`, `s6`, the four-warpgroup `_w4` kernels of runs
/// 52–54, and run 55's rotated k-steps (`p3r`, `p4r`) and one-warpgroup blocks (`p3_w1`), none
/// faster than `p3`, are built no more.)
pub const INT4_WGMMA_KERNELS: [&str; 5] = ["s3", "p3", "p4", "p4_b256", "p6_b256"];
/// The one [`Int4WgmmaChoice::Auto`] runs: with the group constants staged in the ring (run 56e,
/// H100), the 128 × 512 AWQ step takes 9.21–9.22 ms against `p3`'s 9.28 and `s3`'s 9.29–9.32.
pub const INT4_WGMMA_DEFAULT: &str = "p4";
/// The one [`Int4WgmmaChoice::Auto`] runs past 128 rows: 256 activation rows a block, each weight
/// dequantized once for all of them (run 58e, H100): the 256 × 512 AWQ step 15.43–15.44 ms against
/// `p4`'s 15.94–15.95 (`p4_b256` 15.49).
pub const INT4_WGMMA_WIDE_DEFAULT: &str = "p6_b256";

/// Whether INT4 products of more than `kernels::INT4_MMA_BATCH` rows whose groups hold whole
/// 64-wide k-steps run on Hopper's wgmma (`gemm_int4_wgmma_*`, on compute capability 9.0 only;
/// elsewhere the mma.sync families take them). On by default since run 52 (docs/quantization.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Int4WgmmaChoice {
    /// Never: the mma.sync families take them.
    Off,
    /// [`INT4_WGMMA_DEFAULT`] on compute capability 9.0, the mma.sync families elsewhere.
    #[default]
    Auto,
    /// One kernel of [`INT4_WGMMA_KERNELS`] (for measuring).
    Kernel(&'static str),
}

impl Int4WgmmaChoice {
    /// The kernels' names less `gemm_int4_wgmma_`, up to 128 rows and past them, if any.
    pub fn kernels(self) -> Option<(&'static str, &'static str)> {
        match self {
            Self::Off => None,
            Self::Auto => Some((INT4_WGMMA_DEFAULT, INT4_WGMMA_WIDE_DEFAULT)),
            Self::Kernel(name) => Some((name, name)),
        }
    }

    /// `0`, `1` or a kernel's name: what `RINGSERVE_CUDA_INT4_WGMMA` takes.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "0" => Some(Self::Off),
            "1" => Some(Self::Auto),
            _ => INT4_WGMMA_KERNELS
                .iter()
                .find(|k| **k == name)
                .map(|k| Self::Kernel(k)),
        }
    }
}

/// Which kernel runs FP8 products of at most `kernels::GEMV_MAX_BATCH` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fp8GemvChoice {
    /// `gemv_fp8_r16`: 16 weight rows a block as the mma's B operand, warps interleaved over k.
    Rows16,
    /// The 16-row tile kernels (weights as the mma's A operand, blocks looping over tiles with a
    /// register ring of weights and activations, each warp a contiguous k range), picked by the
    /// product's size: [`FP8_TILE_SMALL`] up to [`FP8_TILE_SMALL_MAX`] weights, else
    /// [`FP8_TILE_LARGE`]. Products whose k is not a multiple of 64 take `gemv_fp8_r16`.
    #[default]
    Auto,
    /// One tile kernel of [`FP8_TILE_KERNELS`] for every product (for measuring).
    Tile(&'static str),
}

impl Fp8GemvChoice {
    /// `r16`, `auto` or the tile kernel's name: what `RINGSERVE_CUDA_FP8_GEMV` takes (a kernel's
    /// name less `gemv_fp8_`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Rows16 => "r16",
            Self::Auto => "auto",
            Self::Tile(name) => name,
        }
    }

    /// The choice `name` names, if any.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "r16" => Some(Self::Rows16),
            "auto" => Some(Self::Auto),
            _ => FP8_TILE_KERNELS
                .iter()
                .find(|k| **k == name)
                .map(|k| Self::Tile(k)),
        }
    }

    /// The tile kernel this choice runs a product of `weights` weights on (`None`: `r16`).
    pub fn tile_for(self, weights: usize) -> Option<&'static str> {
        match self {
            Self::Rows16 => None,
            Self::Auto if weights <= FP8_TILE_SMALL_MAX => Some(FP8_TILE_SMALL),
            Self::Auto => Some(FP8_TILE_LARGE),
            Self::Tile(name) => Some(name),
        }
    }
}

/// The CUDA backend's kernel choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSwitches {
    /// bf16 head-size-128 prefill attention.
    pub prefill: PrefillChoice,
    /// bf16 head-size-128 decode attention on tensor cores (off: the CUDA-core kernel).
    pub decode_mma: bool,
    /// Decodes whose first attention splits read the same cache blocks (a prompt prefix held
    /// once by prefix caching) are grouped so that the tensor-core decode kernel reads those
    /// blocks once for up to 8 / (query heads per KV head) of them; off: once per sequence.
    pub decode_share: bool,
    /// Decode graphs whose kernels launch as programmatic dependents.
    pub pdl: PdlChoice,
    /// Small-batch products on the GEMV kernel.
    pub gemv: GemvChoice,
    /// Where q/k/v takes the GEMV kernel (bf16, the FP8 tile GEMV of [`FP8_TILE_SMALL`] or
    /// [`FP8_TILE_LARGE`] from `FP8_ROPE_MIN_ROWS` rows, or the INT4 tile GEMV from
    /// `INT4_FUSED_MIN_ROWS`), RoPE and the paged KV write run in its epilogue.
    pub fuse_rope: bool,
    /// In a step of decodes only whose attention is split, an FP8 o product's input is quantized
    /// by the split combine (`attn_combine_quant_fp8_bf16`) instead of a launch of its own.
    pub fuse_o_quant: bool,
    /// In an FP8 step of at most `fp8_silu::FP8_SILU_MAX_ROWS` rows, the gate/up tile GEMV
    /// applies SiLU·mul in its epilogue and the down tile GEMV quantizes that output as it loads
    /// it, instead of a `silu_mul_quant` launch between them; where INT4 gate/up runs on the tile
    /// GEMV (`INT4_FUSED_MIN_ROWS` to `INT4_GEMV_MAX_ROWS` rows), SiLU·mul runs in its epilogue
    /// instead of a `silu_mul` launch.
    pub fuse_silu: bool,
    /// bf16 on sm_90+, batch 1: each layer's o_proj weights are prefetched into L2 on a side
    /// branch of the graph while RoPE and attention run.
    pub l2_prefetch: bool,
    /// Before a decode bucket's capture, time its bf16 products through cuBLAS and cuBLASLt's
    /// heuristic algorithms and keep the fastest.
    pub gemm_tune: bool,
    /// Small-batch INT4 products whose groups are multiples of 64 (no GGUF offsets) run the
    /// 16-row tile GEMV (`gemv_int4_t16_*`: weights as the mma's A operand, up to 32 batch rows
    /// a launch, scales applied to each k-step's f32 sums); off: the per-weight kernels
    /// (`gemv_int4_r16/_r32`, 8 batch rows a launch) take them too.
    pub int4_tiles: bool,
    /// A GGUF file's layers whose linears are all `Q4_0` / `Q4_1` run on the INT4 kernels (bf16,
    /// not batch-invariant); off: every weight dequantized to the compute type at load.
    pub gguf_int4: bool,
    /// INT4 products of more rows than the GEMVs take (up to `kernels::INT4_MMA_MAX_ROWS`, or
    /// `kernels::INT4_WGMMA_MAX_ROWS` where the Hopper kernel takes them; no GGUF offsets) run
    /// the tensor-core product with weights dequantized in registers (`gemm_int4_mma_*`); off: the
    /// whole matrix is dequantized to bf16 for cuBLAS, as larger batches always are.
    pub int4_mma: bool,
    /// The tensor-core product of weights whose groups hold whole 64-wide k-steps runs
    /// `gemm_int4_mmas_*` (operands q - z, exact; scales applied to each step's f32 sums; weights
    /// through the shared-memory ring with the activations); off: `gemm_int4_mma_*` for every
    /// group size (weights dequantized to bf16 in registers, the dequantization's bits).
    pub int4_mma_scaled: bool,
    /// The tensor-core product of more than `kernels::INT4_MMA_BATCH` rows on Hopper: the
    /// weights dequantized in registers as `gemm_int4_mma_*` does, as wgmma's A operand.
    pub int4_wgmma: Int4WgmmaChoice,
    /// Small-batch FP8 products.
    pub fp8_gemv: Fp8GemvChoice,
}

impl Default for KernelSwitches {
    fn default() -> Self {
        Self {
            prefill: PrefillChoice::Auto,
            decode_mma: true,
            decode_share: true,
            pdl: PdlChoice::Quantized,
            gemv: GemvChoice::default(),
            fuse_rope: true,
            fuse_o_quant: true,
            fuse_silu: true,
            l2_prefetch: true,
            gemm_tune: true,
            int4_tiles: true,
            gguf_int4: true,
            int4_mma: true,
            int4_mma_scaled: true,
            int4_wgmma: Int4WgmmaChoice::default(),
            fp8_gemv: Fp8GemvChoice::default(),
        }
    }
}

/// A switch variable holds a value it does not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: expected {expected}")]
pub struct SwitchError {
    pub var: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl KernelSwitches {
    /// The switches the `RINGSERVE_CUDA_*` variables of [`KERNEL_SWITCH_VARS`] set (unset ones
    /// keep their default); a value a variable does not take is an error naming it.
    pub fn from_env() -> Result<Self, SwitchError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`KernelSwitches::from_env`] over any source of variables.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, SwitchError> {
        let mut s = Self::default();
        for (var, expected) in KERNEL_SWITCH_VARS {
            let Some(value) = get(var) else { continue };
            let bad = || SwitchError {
                var,
                value: value.clone(),
                expected,
            };
            let flag = || match value.trim() {
                "0" => Ok(false),
                "1" => Ok(true),
                _ => Err(bad()),
            };
            match var {
                "RINGSERVE_CUDA_PREFILL" => {
                    s.prefill = match value.trim() {
                        "mma" => PrefillChoice::Mma,
                        "wgmma" => PrefillChoice::Wgmma,
                        _ => return Err(bad()),
                    }
                }
                "RINGSERVE_CUDA_DECODE_MMA" => s.decode_mma = flag()?,
                "RINGSERVE_CUDA_DECODE_SHARE" => s.decode_share = flag()?,
                "RINGSERVE_CUDA_PDL" => {
                    s.pdl = match value.trim() {
                        "0" => PdlChoice::Off,
                        "quantized" | "fp8" => PdlChoice::Quantized,
                        "1" => PdlChoice::All,
                        _ => return Err(bad()),
                    }
                }
                "RINGSERVE_CUDA_GEMV" => {
                    s.gemv = match value.trim().parse::<usize>().map_err(|_| bad())? {
                        0 => GemvChoice::Off,
                        1 => GemvChoice::All,
                        max => GemvChoice::UpTo(max),
                    }
                }
                "RINGSERVE_CUDA_FUSE_ROPE" => s.fuse_rope = flag()?,
                "RINGSERVE_CUDA_FUSE_O_QUANT" => s.fuse_o_quant = flag()?,
                "RINGSERVE_CUDA_FUSE_SILU" => s.fuse_silu = flag()?,
                "RINGSERVE_CUDA_L2_PREFETCH" => s.l2_prefetch = flag()?,
                "RINGSERVE_CUDA_INT4_TILES" => s.int4_tiles = flag()?,
                "RINGSERVE_CUDA_GGUF_INT4" => s.gguf_int4 = flag()?,
                "RINGSERVE_CUDA_INT4_MMA" => s.int4_mma = flag()?,
                "RINGSERVE_CUDA_INT4_MMA_SCALED" => s.int4_mma_scaled = flag()?,
                "RINGSERVE_CUDA_INT4_WGMMA" => {
                    s.int4_wgmma = Int4WgmmaChoice::parse(value.trim()).ok_or_else(bad)?
                }
                "RINGSERVE_CUDA_FP8_GEMV" => {
                    s.fp8_gemv = Fp8GemvChoice::parse(value.trim()).ok_or_else(bad)?
                }
                _ => s.gemm_tune = flag()?,
            }
        }
        Ok(s)
    }
}

impl fmt::Display for KernelSwitches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gemv = match self.gemv {
            GemvChoice::Off => "off".to_owned(),
            GemvChoice::All => "all".to_owned(),
            GemvChoice::UpTo(n) => format!("up to {n} elements"),
        };
        write!(
            f,
            "prefill={:?} decode_mma={} decode_share={} pdl={:?} gemv={gemv} fuse_rope={} \
             fuse_o_quant={} fuse_silu={} l2_prefetch={} gemm_tune={} int4_tiles={} gguf_int4={} int4_mma={} \
             int4_mma_scaled={} int4_wgmma={} fp8_gemv={}",
            self.prefill,
            self.decode_mma,
            self.decode_share,
            self.pdl,
            self.fuse_rope,
            self.fuse_o_quant,
            self.fuse_silu,
            self.l2_prefetch,
            self.gemm_tune,
            self.int4_tiles,
            self.gguf_int4,
            self.int4_mma,
            self.int4_mma_scaled,
            match self.int4_wgmma.kernels() {
                None => "0".to_owned(),
                Some((narrow, wide)) if narrow == wide => narrow.to_owned(),
                Some((narrow, wide)) => format!("{narrow}/{wide}"),
            },
            self.fp8_gemv.name()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<KernelSwitches, SwitchError> {
        KernelSwitches::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn unset_variables_keep_the_measured_defaults() {
        let s = parse(&[]).unwrap();
        assert_eq!(s, KernelSwitches::default());
        assert_eq!(s.prefill, PrefillChoice::Auto);
        assert!(s.decode_mma && s.fuse_rope && s.l2_prefetch && s.gemm_tune && s.int4_tiles);
        assert!(s.gguf_int4 && s.int4_mma && s.decode_share && s.fuse_o_quant && s.fuse_silu);
        assert!(s.int4_mma_scaled);
        assert_eq!(s.int4_wgmma, Int4WgmmaChoice::Auto);
        assert_eq!(s.pdl, PdlChoice::Quantized);
        assert_eq!(s.gemv, GemvChoice::UpTo(GEMV_MAX_WEIGHT));
        assert_eq!(s.fp8_gemv, Fp8GemvChoice::Auto);
        assert_eq!(s.fp8_gemv.tile_for(4096 * 6144), Some(FP8_TILE_SMALL));
        assert_eq!(s.fp8_gemv.tile_for(4096 * 14336), Some(FP8_TILE_LARGE));
    }

    #[test]
    fn each_variable_sets_its_switch() {
        let s = parse(&[
            ("RINGSERVE_CUDA_PREFILL", "mma"),
            ("RINGSERVE_CUDA_DECODE_MMA", "0"),
            ("RINGSERVE_CUDA_DECODE_SHARE", "0"),
            ("RINGSERVE_CUDA_PDL", "0"),
            ("RINGSERVE_CUDA_GEMV", "1000"),
            ("RINGSERVE_CUDA_FUSE_ROPE", "0"),
            ("RINGSERVE_CUDA_FUSE_O_QUANT", "0"),
            ("RINGSERVE_CUDA_FUSE_SILU", "0"),
            ("RINGSERVE_CUDA_L2_PREFETCH", "0"),
            ("RINGSERVE_CUDA_GEMM_TUNE", "0"),
            ("RINGSERVE_CUDA_INT4_TILES", "0"),
            ("RINGSERVE_CUDA_GGUF_INT4", "0"),
            ("RINGSERVE_CUDA_INT4_MMA", "0"),
            ("RINGSERVE_CUDA_INT4_MMA_SCALED", "0"),
            ("RINGSERVE_CUDA_INT4_WGMMA", "p4"),
            ("RINGSERVE_CUDA_FP8_GEMV", "r16"),
        ])
        .unwrap();
        assert_eq!(s.int4_wgmma, Int4WgmmaChoice::Kernel("p4"));
        assert_eq!(
            parse(&[("RINGSERVE_CUDA_INT4_WGMMA", "0")])
                .unwrap()
                .int4_wgmma,
            Int4WgmmaChoice::Off
        );
        for k in INT4_WGMMA_KERNELS {
            let c = parse(&[("RINGSERVE_CUDA_INT4_WGMMA", k)])
                .unwrap()
                .int4_wgmma;
            assert_eq!(c, Int4WgmmaChoice::Kernel(k));
            assert_eq!(c.kernels(), Some((k, k)));
        }
        assert_eq!(
            parse(&[("RINGSERVE_CUDA_INT4_WGMMA", "1")])
                .unwrap()
                .int4_wgmma
                .kernels(),
            Some((INT4_WGMMA_DEFAULT, INT4_WGMMA_WIDE_DEFAULT))
        );
        assert_eq!(s.fp8_gemv, Fp8GemvChoice::Rows16);
        assert!(!s.int4_tiles && !s.gguf_int4 && !s.int4_mma && !s.decode_share);
        assert!(!s.int4_mma_scaled);
        assert!(!s.fuse_o_quant && !s.fuse_silu);
        assert_eq!(s.pdl, PdlChoice::Off);
        assert_eq!(
            parse(&[("RINGSERVE_CUDA_PDL", "1")]).unwrap().pdl,
            PdlChoice::All
        );
        for quantized in ["quantized", "fp8"] {
            assert_eq!(
                parse(&[("RINGSERVE_CUDA_PDL", quantized)]).unwrap().pdl,
                PdlChoice::Quantized
            );
        }
        assert!(parse(&[("RINGSERVE_CUDA_PDL", "yes")]).is_err());
        assert_eq!(s.prefill, PrefillChoice::Mma);
        assert!(!s.decode_mma && !s.fuse_rope && !s.l2_prefetch && !s.gemm_tune);
        assert_eq!(s.gemv, GemvChoice::UpTo(1000));
        assert_eq!(
            parse(&[("RINGSERVE_CUDA_GEMV", "0")]).unwrap().gemv,
            GemvChoice::Off
        );
        assert_eq!(
            parse(&[("RINGSERVE_CUDA_GEMV", "1")]).unwrap().gemv,
            GemvChoice::All
        );
        for k in FP8_TILE_KERNELS {
            let c = parse(&[("RINGSERVE_CUDA_FP8_GEMV", k)]).unwrap().fp8_gemv;
            assert_eq!(c, Fp8GemvChoice::Tile(k));
            assert_eq!(c.name(), k);
        }
        let w = parse(&[("RINGSERVE_CUDA_PREFILL", "wgmma")]).unwrap();
        assert_eq!(w.prefill, PrefillChoice::Wgmma);
    }

    #[test]
    fn a_value_a_switch_does_not_take_is_an_error_naming_it() {
        for (var, value) in [
            ("RINGSERVE_CUDA_PREFILL", "fast"),
            ("RINGSERVE_CUDA_DECODE_MMA", "off"),
            ("RINGSERVE_CUDA_GEMV", "-3"),
            ("RINGSERVE_CUDA_GEMM_TUNE", "yes"),
            ("RINGSERVE_CUDA_FP8_GEMV", "t16"),
            ("RINGSERVE_CUDA_INT4_WGMMA", "s5"),
        ] {
            let e = parse(&[(var, value)]).unwrap_err();
            assert_eq!(e.var, var);
            assert!(e.to_string().contains(value), "{e}");
        }
    }
}
