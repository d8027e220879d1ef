//! The CUDA backend: NVRTC-compiled kernels from the `kernels` crate, cuBLAS GEMMs, a paged KV
//! cache on the device. Built with the `cuda` feature; CUDA itself is loaded at run time.

mod backend;
pub mod device;
pub mod fp8;
pub mod fp8_silu;
mod graph;
pub mod int4;
pub mod lt;
mod lt_cache;
pub mod ops;
pub mod staging;
pub mod step;
mod tp;
mod weights;
mod workspace;

pub use backend::{
    CudaBackend, CudaOptions, GEMV_CROSSOVER_ROWS, INT4_FUSED_MIN_ROWS, INT4_GEMV_MAX_ROWS,
    INVARIANT_CHUNK, MAX_GRAPH_BATCH, PDL_MAX_ROWS,
};
pub use device::{Buf, DType, Gpu, PrefillKernel};
pub use tp::CudaTp;
