//! [`Hello`]: the worker's first record.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{
    Preamble, RecordKind, WireError, check_exact, check_preamble, out_of, preamble, read_header,
};

/// Worker → gateway, once: the worker is attached, its model loaded and its engine ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Hello {
    preamble: Preamble,
    /// The worker's process id.
    pub pid: u32,
    /// KV blocks the engine manages (the null block included).
    pub num_kv_blocks: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Longest prompt + completion the engine accepts.
    pub max_model_len: u32,
    /// The model's vocabulary size.
    pub vocab_size: u32,
    /// Most sequences the engine runs at once.
    pub max_num_seqs: u32,
}
const _: () = assert!(size_of::<Hello>() == 32);

/// The engine facts a worker announces in its [`Hello`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloInfo {
    pub pid: u32,
    pub num_kv_blocks: u32,
    pub block_size: u32,
    pub max_model_len: u32,
    pub vocab_size: u32,
    pub max_num_seqs: u32,
}

impl Hello {
    /// Encoded size.
    pub const LEN: usize = size_of::<Hello>();

    /// A hello record.
    pub fn new(info: HelloInfo) -> Self {
        Self {
            preamble: preamble(RecordKind::Hello, 0),
            pid: info.pid,
            num_kv_blocks: info.num_kv_blocks,
            block_size: info.block_size,
            max_model_len: info.max_model_len,
            vocab_size: info.vocab_size,
            max_num_seqs: info.max_num_seqs,
        }
    }

    /// Writes the record into `out`, returning its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        out_of(out, Self::LEN)?.copy_from_slice(self.as_bytes());
        Ok(Self::LEN)
    }

    /// Decodes and checks a hello record.
    pub fn decode(bytes: &[u8]) -> Result<HelloInfo, WireError> {
        let h: Hello = read_header(bytes, "hello")?;
        check_preamble(&h.preamble, RecordKind::Hello)?;
        check_exact(bytes, Self::LEN, "hello")?;
        if h.block_size == 0 {
            return Err(WireError::Invalid {
                what: "hello block_size",
                value: 0,
            });
        }
        Ok(HelloInfo {
            pid: h.pid,
            num_kv_blocks: h.num_kv_blocks,
            block_size: h.block_size,
            max_model_len: h.max_model_len,
            vocab_size: h.vocab_size,
            max_num_seqs: h.max_num_seqs,
        })
    }
}
