//! The CUDA kernel sources (`*.cu`, `*.cuh`) and their compilation with NVRTC at worker start-up,
//! cached on disk by source hash, architecture and NVRTC version.
