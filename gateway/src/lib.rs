//! The gateway process: the tonic `Inference` service, tokenization and chat templates, admission
//! control, routing to workers over shared-memory rings, per-request streams, metrics, health, and the
//! supervisor of worker processes.
#![forbid(unsafe_code)]
