//! The Hopper INT4 product (`gemm_int4_wgmma_*`, `kernels/src/int4_wgmma.cu`, `sm_90a` only):
//! the kernels by name, which one a device takes, how a product's k-steps split across blocks,
//! and the launch. [`super::gemm_int4`] takes it past [`kernels::INT4_MMA_BATCH`] rows.

use cudarc::driver::PushKernelArg;

use super::super::device::{Buf, Gpu};
use super::super::ops::{cfg, dim};
use super::{Int4Linear, check_words_and_scratch, reduce_splits, split_params};
use crate::backend::BackendError;
use crate::backend::switches::{INT4_WGMMA_DEFAULT, INT4_WGMMA_WIDE_DEFAULT, Int4WgmmaChoice};

/// A kernel of the Hopper family `gemm_int4_wgmma_*` (`sm_90a` only; `kernels/src/int4_wgmma.cu`):
/// 64 weight rows a warpgroup and `batch` activation rows a block (one wgmma of
/// [`kernels::INT4_WGMMA_BATCH`] columns per 128), the weights dequantized in registers to
/// [`super::dequant_int4`]'s bits as wgmma's A operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgmmaKernel {
    pub name: &'static str,
    /// The name `RINGSERVE_CUDA_INT4_WGMMA` takes (the kernel's, less `gemm_int4_wgmma_`).
    pub short: &'static str,
    /// k-steps of 64 its shared-memory ring holds.
    pub stages: usize,
    /// Warpgroups (128 threads) a block.
    pub warpgroups: usize,
    /// Blocks an SM (its launch bounds).
    pub blocks_per_sm: usize,
    /// Activation rows a block: [`kernels::INT4_WGMMA_BATCH`], or twice that (two accumulator
    /// sets, each weight dequantized once for both).
    pub batch: usize,
}

impl WgmmaKernel {
    /// Weight rows a block.
    pub const fn rows(&self) -> usize {
        64 * self.warpgroups
    }

    /// Dynamic shared memory a block.
    pub const fn smem_bytes(&self) -> usize {
        kernels::int4_wgmma_smem_bytes(self.stages, self.warpgroups, self.batch)
    }
}

const fn wgmma(
    name: &'static str,
    short: &'static str,
    (stages, warpgroups, blocks_per_sm, batch): (usize, usize, usize, usize),
) -> WgmmaKernel {
    WgmmaKernel {
        name,
        short,
        stages,
        warpgroups,
        blocks_per_sm,
        batch,
    }
}

/// The Hopper kernels, one per name of [`crate::backend::switches::INT4_WGMMA_KERNELS`].
pub const WGMMA_KERNELS: [WgmmaKernel; 5] = [
    wgmma("gemm_int4_wgmma_s3", "s3", (3, 2, 2, 128)),
    wgmma("gemm_int4_wgmma_p3", "p3", (3, 2, 2, 128)),
    wgmma("gemm_int4_wgmma_p4", "p4", (4, 2, 2, 128)),
    wgmma("gemm_int4_wgmma_p4_b256", "p4_b256", (4, 2, 1, 256)),
    wgmma("gemm_int4_wgmma_p6_b256", "p6_b256", (6, 2, 1, 256)),
];

/// The kernel of [`WGMMA_KERNELS`] named `short`.
pub fn wgmma_kernel(short: &str) -> Option<&'static WgmmaKernel> {
    WGMMA_KERNELS.iter().find(|k| k.short == short)
}

/// The Hopper kernels a device runs: one for steps of up to [`kernels::INT4_WGMMA_BATCH`] rows,
/// one past them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgmmaKernels {
    pub narrow: &'static WgmmaKernel,
    pub wide: &'static WgmmaKernel,
}

impl WgmmaKernels {
    /// The kernel for a step of `m` rows.
    pub fn for_rows(&self, m: usize) -> &'static WgmmaKernel {
        if m > kernels::INT4_WGMMA_BATCH {
            self.wide
        } else {
            self.narrow
        }
    }
}

/// The Hopper kernels `choice` asks for on a device whose kernels compile for `arch`: none when
/// off, or under `Auto` off `sm_90a`; naming one off `sm_90a` is an error. `Auto` takes
/// [`INT4_WGMMA_DEFAULT`] up to 128 rows and [`INT4_WGMMA_WIDE_DEFAULT`] past them; a kernel named
/// takes every step.
pub fn wgmma_select(
    arch: &str,
    choice: Int4WgmmaChoice,
) -> Result<Option<WgmmaKernels>, BackendError> {
    let hopper = arch == "sm_90a";
    match choice {
        Int4WgmmaChoice::Off => Ok(None),
        Int4WgmmaChoice::Auto if !hopper => Ok(None),
        Int4WgmmaChoice::Kernel(name) if !hopper => Err(BackendError::InvalidOptions(format!(
            "RINGSERVE_CUDA_INT4_WGMMA={name}: the wgmma INT4 product needs a compute \
             capability 9.0 device (kernels for sm_90a); this one compiles for {arch}"
        ))),
        _ => {
            let (narrow, wide) = match choice {
                Int4WgmmaChoice::Kernel(name) => (name, name),
                _ => (INT4_WGMMA_DEFAULT, INT4_WGMMA_WIDE_DEFAULT),
            };
            let kernel = |name: &str| {
                wgmma_kernel(name).ok_or_else(|| {
                    BackendError::InvalidOptions(format!("no INT4 wgmma kernel named {name}"))
                })
            };
            Ok(Some(WgmmaKernels {
                narrow: kernel(narrow)?,
                wide: kernel(wide)?,
            }))
        }
    }
}

/// Whether the Hopper kernels take this product: k a multiple of 64, every 64-wide k-step in
/// one group (groups of a multiple of 64, or one group a row), no GGUF offsets, and the tile
/// kernels' scale | zero words ([`super::Int4Scales::tile`]), which the kernels stage with the
/// codes.
pub fn wgmma_fits(l: &Int4Linear<'_>) -> bool {
    let gs = l.s.group_size;
    l.k.is_multiple_of(64)
        && (gs.is_multiple_of(64) || gs >= l.k)
        && l.s.mins.is_none()
        && l.s.tile.is_some()
}

/// How many ranges [`launch_wgmma`] splits the k-steps of an `m x n x k` product into on blocks
/// of `rows` weight rows: as many as keep every block in `slots` resident blocks (one wave), at
/// least 8 steps a range, and no more partial sums than `scratch_bytes` holds (f32 `[splits, m,
/// n]`).
pub fn wgmma_splits(
    (m, n, k): (usize, usize, usize),
    (rows, batch): (usize, usize),
    slots: usize,
    scratch_bytes: usize,
) -> usize {
    let blocks = n.div_ceil(rows) * m.div_ceil(batch);
    let fit = scratch_bytes / (4 * m * n).max(1);
    (slots / blocks.max(1))
        .min(k.div_ceil(64) / 8)
        .min(fit)
        .max(1)
}

/// `y = x · wᵀ` on the Hopper kernel `kernel`; with k split ([`wgmma_splits`]), the f32 partial
/// sums go to `scratch` and `gemm_int4_reduce` adds them into `y`.
pub fn launch_wgmma(
    gpu: &Gpu,
    l: &Int4Linear<'_>,
    kernel: &WgmmaKernel,
    scratch: &Buf,
) -> Result<(), BackendError> {
    l.check()?;
    if gpu.arch != "sm_90a" {
        return Err(BackendError::InvalidOptions(format!(
            "{} needs a compute capability 9.0 device (kernels for sm_90a); this one compiles \
             for {}",
            kernel.name, gpu.arch
        )));
    }
    if !wgmma_fits(l) {
        return Err(BackendError::InvalidBatch(format!(
            "{}: k {} with groups of {} (k must be a multiple of 64 and each 64-wide step in one \
             group, without GGUF offsets, with the tile kernels' scale words)",
            kernel.name, l.k, l.s.group_size
        )));
    }
    if l.n == 0 || l.m == 0 {
        return Ok(());
    }
    check_words_and_scratch(l, scratch, kernel.name)?;
    let slots = kernel.blocks_per_sm * gpu.sms;
    let splits = wgmma_splits(
        (l.m, l.n, l.k),
        (kernel.rows(), kernel.batch),
        slots,
        scratch.bytes(),
    );
    let (p, splits) = split_params(l, splits, scratch)?;
    let grid = (
        dim(l.n.div_ceil(kernel.rows()), "n")?,
        dim(l.m.div_ceil(kernel.batch), "m")?,
        dim(splits, "splits")?,
    );
    let mut b = gpu.stream.launch_builder(gpu.func(kernel.name)?);
    b.arg(&p);
    // SAFETY: check() gave words >= n*k/8 u32 (16-byte aligned; k a multiple of 64, so every
    // row's step of 8 words is 16-byte aligned), the tile words (present: wgmma_fits) >=
    // ceil(n/16)*groups*16 u32 with groups = ceil(k / group_size) (a device allocation, so 16-byte
    // aligned, as is each tile's 16 words of a group), x >= m*k and y >= m*n bf16 (x 16-byte
    // aligned); n*k/8 fits in u32 (tested above). wgmma_fits gave k a multiple of 64 and each step
    // s < k / 64 in group s / (group_size / 64) = 64 s / group_size < groups (group_size >= 64:
    // a multiple of 64, or >= k >= 64). With R = kernel.rows() (64 per warpgroup) and X =
    // kernel.batch (the kernel's own), block (bx, by, bz) reads weight rows min(R bx + r, n - 1)
    // at words 8 s .. 8 s + 7, the tile words of tiles min(R bx / 16 + i, ceil(n/16) - 1), i < R /
    // 16, at that group, and x rows min(X by + r, m - 1) at elements 64 s .. 64 s + 63, for s
    // in [bz*steps, +steps) clipped to k / 64; it stores y[bb, r] for bb < m, r < n, or with
    // splits > 1 the f32 part[bz, bb, r], where scratch holds splits*m*n f32 (wgmma_splits caps
    // splits by its bytes) and is 16-byte aligned.
    // Every thread reaches each step's barrier and every warpgroup issues each wgmma whole (the
    // step loop is the same for the whole block). The kernel was compiled for sm_90a (checked
    // above: elsewhere its body is empty), assumes 128 threads per warpgroup, and its dynamic
    // shared memory, smem_bytes(), is what Gpu::new allowed it.
    unsafe {
        b.launch(cfg(
            grid,
            128 * kernel.warpgroups as u32,
            kernel.smem_bytes(),
        ))
    }?;
    if splits > 1 {
        reduce_splits(gpu, l, &p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wgmma_switch_name_has_a_kernel_and_hopper_alone_runs_them() {
        use crate::backend::switches::INT4_WGMMA_KERNELS;
        for short in INT4_WGMMA_KERNELS {
            let k = wgmma_kernel(short).expect("a kernel for each name");
            assert_eq!(k.name, format!("gemm_int4_wgmma_{short}"));
            assert!(kernels::KERNELS.contains(&k.name), "{}", k.name);
            let chosen = wgmma_select("sm_90a", Int4WgmmaChoice::Kernel(short)).unwrap();
            assert_eq!(
                chosen.map(|c| (c.for_rows(65), c.for_rows(256))),
                Some((k, k))
            );
            assert!(wgmma_select("sm_89", Int4WgmmaChoice::Kernel(short)).is_err());
            // Its blocks an SM fit Hopper's 227 KiB of shared memory.
            assert!(k.blocks_per_sm * k.smem_bytes() <= 227 * 1024, "{}", k.name);
        }
        assert_eq!(WGMMA_KERNELS.len(), INT4_WGMMA_KERNELS.len());
        let auto = wgmma_select("sm_90a", Int4WgmmaChoice::Auto)
            .unwrap()
            .unwrap();
        assert_eq!(auto.for_rows(65).short, INT4_WGMMA_DEFAULT);
        assert_eq!(auto.for_rows(128).short, INT4_WGMMA_DEFAULT);
        assert_eq!(auto.for_rows(129).short, INT4_WGMMA_WIDE_DEFAULT);
        assert_eq!(auto.for_rows(129).batch, 2 * kernels::INT4_WGMMA_BATCH);
        assert_eq!(wgmma_select("sm_90", Int4WgmmaChoice::Auto).unwrap(), None);
        assert_eq!(wgmma_select("sm_90a", Int4WgmmaChoice::Off).unwrap(), None);
    }

    #[test]
    fn wgmma_splits_fill_one_wave_of_blocks() {
        // The 8B shapes at 128 rows on 132 SMs, two blocks an SM: q/k/v 48 blocks of 128 rows
        // x 5 splits, o 32 x 8, down 32 x 8 (of 28 steps), gate/up 224 blocks unsplit.
        let scratch = 1 << 30;
        assert_eq!(wgmma_splits((128, 6144, 4096), (128, 128), 264, scratch), 5);
        assert_eq!(wgmma_splits((128, 4096, 4096), (128, 128), 264, scratch), 8);
        assert_eq!(
            wgmma_splits((128, 4096, 14336), (128, 128), 264, scratch),
            8
        );
        assert_eq!(
            wgmma_splits((128, 28672, 4096), (128, 128), 264, scratch),
            1
        );
        // One block an SM of 256 rows: q/k/v 24 x 5, gate/up 112 unsplit.
        assert_eq!(wgmma_splits((128, 6144, 4096), (256, 128), 132, scratch), 5);
        assert_eq!(
            wgmma_splits((128, 28672, 4096), (256, 128), 132, scratch),
            1
        );
        // 256 activation rows a block, one block an SM, at 256 rows: gate/up 224 blocks
        // unsplit, down 32 x 4.
        assert_eq!(
            wgmma_splits((256, 28672, 4096), (128, 256), 132, scratch),
            1
        );
        assert_eq!(
            wgmma_splits((256, 4096, 14336), (128, 256), 132, scratch),
            4
        );
        // At least 8 steps a range, and no more partial sums than the scratch holds.
        assert_eq!(wgmma_splits((128, 4096, 1024), (128, 128), 264, scratch), 2);
        assert_eq!(
            wgmma_splits((128, 4096, 4096), (128, 128), 264, 3 * 4 * 128 * 4096),
            3
        );
    }
}
