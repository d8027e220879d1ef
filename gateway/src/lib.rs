//! The gateway process: the tonic `ringserve.v1.Inference` service, tokenization and chat templates,
//! validation, admission control, routing to worker processes over shared-memory rings, per-request
//! streams with incremental detokenization and stop strings, metrics, health, graceful shutdown, and
//! the supervisor that starts and restarts worker processes.
//!
//! The gateway never runs the model: it writes token ids into a worker's request ring and streams
//! back what the worker writes into its response ring.
#![forbid(unsafe_code)]

pub mod admission;
pub mod auth;
pub mod bench;
mod bench_openai;
pub mod bench_plot;
pub mod chat;
pub mod client;
pub mod connect;
pub mod detok;
pub mod group;
pub mod guard;
pub mod health;
pub mod join;
pub mod link;
pub mod metrics;
pub mod openai;
pub mod pipeline;
pub mod router;
pub mod server;
pub mod service;
pub mod stop;
pub mod stream;
pub mod supervisor;
pub mod tokenizer;
pub mod validate;
