//! Picking and building a backend from command-line style options.

use std::fmt;
use std::str::FromStr;

use crate::backend::cpu::{CpuBackend, CpuOptions};
use crate::backend::switches::KernelSwitches;
use crate::backend::{Backend, BackendError};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::quant::Quantization;
use crate::quant::kv::KvCacheDtype;
use crate::tp::TpShard;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The f32 CPU reference backend, on all cores.
    #[default]
    Cpu,
    /// A CUDA GPU, by ordinal (`cuda` is `cuda:0`).
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// A device string that is none of `cpu`, `cuda`, `cuda:N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device `{0}` (expected cpu, cuda or cuda:N)")]
pub struct ParseDeviceError(pub String);

impl FromStr for Device {
    type Err = ParseDeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| ParseDeviceError(s.to_owned())),
        }
    }
}

/// The element type a backend computes in. The CPU backend always computes in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ComputeDtype {
    #[default]
    Float32,
    BFloat16,
}

/// How to build a backend.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendOptions {
    pub device: Device,
    /// Ignored by the CPU backend (always f32).
    pub dtype: ComputeDtype,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks (null block included); `None` sizes the cache from memory (CPU: a 1 GiB budget;
    /// CUDA: `gpu_memory_utilization` of the device).
    pub num_kv_blocks: Option<usize>,
    /// Fraction of GPU memory the CUDA backend may use (weights + KV cache + workspace).
    pub gpu_memory_utilization: f32,
    /// CUDA: no CUDA graphs.
    pub enforce_eager: bool,
    /// CUDA: run every GEMM on blocks of a fixed row count, so that a sequence's tokens do not
    /// depend on which other sequences share its step (slower; the CPU backend always is).
    pub batch_invariant: bool,
    /// CUDA: which kernels run where there is a choice (ignored by the CPU backend).
    pub kernels: KernelSwitches,
    /// `--quantization` (`None`: the checkpoint's own precision, FP8 for an FP8 checkpoint).
    pub quantization: Option<Quantization>,
    /// `--kv-cache-dtype`.
    pub kv_cache_dtype: KvCacheDtype,
}

impl Default for BackendOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            dtype: ComputeDtype::Float32,
            block_size: 16,
            num_kv_blocks: None,
            gpu_memory_utilization: 0.9,
            enforce_eager: false,
            batch_invariant: false,
            kernels: KernelSwitches::default(),
            quantization: None,
            kv_cache_dtype: KvCacheDtype::Auto,
        }
    }
}

/// KV memory the CPU backend takes when `num_kv_blocks` is not given.
pub const CPU_DEFAULT_KV_BYTES: usize = 1 << 30;

/// Tokens per step the CUDA backend's workspace is first sized for (the engine's default
/// `max_num_batched_tokens`); it grows if a step needs more.
#[cfg(feature = "cuda")]
pub const CUDA_WORKSPACE_TOKENS: usize = 8192;

/// KV blocks the CPU backend of `shard` takes when `num_kv_blocks` is not given: as many as fit
/// [`CPU_DEFAULT_KV_BYTES`] with the KV heads this rank holds (`K / T`, or one replicated head when
/// `T > K`). It depends only on the model, the block size and the group size, so every rank of a
/// tensor-parallel group computes the same number, as the plans from rank 0 require.
pub fn cpu_default_kv_blocks(config: &ModelConfig, block_size: usize, shard: TpShard) -> usize {
    let world = shard.world.max(1);
    let heads = (config.num_key_value_heads / world).max(1);
    let per_block = block_size
        .saturating_mul(heads)
        .saturating_mul(config.head_dim)
        .saturating_mul(config.num_hidden_layers)
        .saturating_mul(2 * 4)
        .max(1);
    (CPU_DEFAULT_KV_BYTES / per_block).max(2)
}

/// The CUDA backend's options for GPU `ordinal` from `options`.
#[cfg(feature = "cuda")]
pub fn cuda_options(options: &BackendOptions, ordinal: usize) -> crate::backend::cuda::CudaOptions {
    use crate::backend::cuda::{CudaOptions, DType};
    CudaOptions {
        ordinal,
        dtype: match options.dtype {
            ComputeDtype::Float32 => DType::F32,
            ComputeDtype::BFloat16 => DType::Bf16,
        },
        block_size: options.block_size,
        num_kv_blocks: options.num_kv_blocks,
        gpu_memory_utilization: options.gpu_memory_utilization,
        enforce_eager: options.enforce_eager,
        max_batch_tokens: CUDA_WORKSPACE_TOKENS,
        batch_invariant: options.batch_invariant,
        kernels: options.kernels,
        quantization: options.quantization,
        kv_cache_dtype: options.kv_cache_dtype,
    }
}

/// Builds the backend `options.device` names, with the checkpoint's weights.
pub fn load_backend(
    config: &ModelConfig,
    checkpoint: &Checkpoint,
    options: &BackendOptions,
) -> Result<Box<dyn Backend>, BackendError> {
    match options.device {
        Device::Cpu => {
            let num_kv_blocks = options.num_kv_blocks.unwrap_or_else(|| {
                cpu_default_kv_blocks(config, options.block_size, TpShard::SOLO)
            });
            let cpu = CpuOptions {
                block_size: options.block_size,
                num_kv_blocks,
                quantization: options.quantization,
                kv_cache_dtype: options.kv_cache_dtype,
            };
            Ok(Box::new(CpuBackend::new(config, checkpoint, cpu)?))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => {
            use crate::backend::cuda::CudaBackend;
            let opts = cuda_options(options, ordinal);
            Ok(Box::new(CudaBackend::new(config, checkpoint, &opts)?))
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(BackendError::NotCompiled("cuda")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!("cuda".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(Device::Cuda(3)));
        assert!("gpu".parse::<Device>().is_err());
        assert!("cuda:x".parse::<Device>().is_err());
        assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
    }
}
