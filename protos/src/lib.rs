//! Wire types: the gRPC `ringserve.v1` API (tonic/prost, generated into `OUT_DIR` at build time) and
//! the fixed-layout shared-memory records ([`records`]) exchanged between gateway and workers over
//! the rings, the tensor-parallel step-plan record between worker ranks ([`plan`]), and the text
//! lines of the join rendezvous ([`join`]).
#![forbid(unsafe_code)]

#[cfg(test)]
mod fuzz_tests;
pub mod join;
pub mod plan;
pub mod records;

/// The `ringserve.v1` gRPC API, generated from `proto/inference.proto`.
pub mod v1 {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("ringserve.v1");

    /// The encoded `FileDescriptorSet` of `inference.proto`, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("ringserve_v1_descriptor");
}
