//! The engine that runs inside every worker process: model configuration and memory-mapped weights,
//! the paged KV block manager with prefix caching, the continuous-batching scheduler, the sampler, and
//! the compute backends (`cpu`, the f32 reference; `cuda` behind the `cuda` feature) behind one trait.
//!
//! The engine knows nothing about gRPC; the ring-serving loop and offline `generate` drive it.

pub mod backend;
pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod constrain;
pub mod demo;
pub mod engine;
pub mod generate;
pub mod kv;
pub mod open;
pub mod quant;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod serve;
pub mod tp;
