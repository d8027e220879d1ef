//! The CUDA backend: NVRTC-compiled kernels from the `kernels` crate, cuBLAS GEMMs, a paged KV
//! cache on the device. Built with the `cuda` feature; CUDA itself is loaded at run time.

pub mod device;
pub mod ops;

pub use device::{Buf, DType, Gpu};
