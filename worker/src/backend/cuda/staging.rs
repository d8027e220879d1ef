//! Streaming host bytes (weights from the memory map) to the device through pinned buffers.
//!
//! A copy from pageable memory makes the driver stage it through its own small pinned buffer,
//! one piece at a time, with the host and the DMA engine taking turns. Here the host fills one
//! of [`BUFFERS`] page-locked chunks (with all cores: the memory map is read in parallel) while
//! the device copies the previous ones, so the copy runs near the link's bandwidth.

use std::time::Instant;

use cudarc::driver::{CudaEvent, PinnedHostSlice};
use rayon::prelude::*;

use super::device::{Buf, Gpu};
use crate::backend::BackendError;

/// Pinned chunks in flight.
pub const BUFFERS: usize = 3;
/// Bytes per pinned chunk.
pub const CHUNK_BYTES: usize = 64 << 20;
/// Bytes one thread copies at a time while filling a chunk.
const PIECE_BYTES: usize = 1 << 20;

/// Pinned chunks, each with the event recorded after the device's last copy out of it.
pub struct Staging {
    chunks: Vec<(PinnedHostSlice<u8>, CudaEvent)>,
    next: usize,
    bytes: usize,
    started: Instant,
}

/// What a staged upload moved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyStats {
    pub bytes: usize,
    pub seconds: f64,
}

impl CopyStats {
    /// Host-to-device bandwidth in GB/s (10^9 bytes).
    pub fn gb_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

impl Staging {
    /// Allocates [`BUFFERS`] pinned chunks of [`CHUNK_BYTES`].
    pub fn new(gpu: &Gpu) -> Result<Self, BackendError> {
        let mut chunks = Vec::with_capacity(BUFFERS);
        for _ in 0..BUFFERS {
            // SAFETY: the chunk's bytes are uninitialised; they are only ever read by a device copy
            // of a prefix that `write` filled first.
            let host = unsafe { gpu.ctx.alloc_pinned::<u8>(CHUNK_BYTES) }?;
            let event = gpu.ctx.new_event(None)?;
            chunks.push((host, event));
        }
        Ok(Self {
            chunks,
            next: 0,
            bytes: 0,
            started: Instant::now(),
        })
    }

    /// Queues a copy of `bytes` into `dst` at byte `offset`; returns once every byte is in a
    /// pinned chunk (the device copies finish later, in stream order).
    pub fn write(
        &mut self,
        gpu: &Gpu,
        dst: &mut Buf,
        offset: usize,
        bytes: &[u8],
    ) -> Result<(), BackendError> {
        let end = offset.checked_add(bytes.len());
        if end.is_none_or(|e| e > dst.bytes()) {
            return Err(BackendError::Weights(format!(
                "staged write of {} bytes at {offset} into a {}-byte buffer",
                bytes.len(),
                dst.bytes()
            )));
        }
        let mut at = offset;
        for piece in bytes.chunks(CHUNK_BYTES) {
            let (host, event) = &mut self.chunks[self.next];
            self.next = (self.next + 1) % BUFFERS;
            // The device's last copy out of this chunk must be done before it is overwritten.
            event.synchronize()?;
            // (`as_mut_slice` waits on cudarc's own event, which this module never records.)
            let host = &mut host.as_mut_slice()?[..piece.len()];
            host.par_chunks_mut(PIECE_BYTES)
                .zip(piece.par_chunks(PIECE_BYTES))
                .for_each(|(d, s)| d.copy_from_slice(s));
            // SAFETY: `dst` holds `dst.bytes()` bytes from `dst.ptr()` and `at + piece.len() <=
            // offset + bytes.len() <= dst.bytes()` (checked above), so the destination range is
            // inside the allocation, which lives until the backend drops it, after the stream
            // finished. The source is this pinned chunk, which is neither written (the event
            // below is waited on first) nor freed (`Drop` waits on every event) before the
            // asynchronous copy has read it.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    dst.ptr() + at as u64,
                    &*host,
                    gpu.stream.cu_stream(),
                )
            }?;
            event.record(&gpu.stream)?;
            at += piece.len();
        }
        self.bytes += bytes.len();
        Ok(())
    }

    /// Waits for every queued copy; returns what was moved since [`Staging::new`].
    pub fn finish(self, gpu: &Gpu) -> Result<CopyStats, BackendError> {
        gpu.sync()?;
        Ok(CopyStats {
            bytes: self.bytes,
            seconds: self.started.elapsed().as_secs_f64(),
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // A copy may still read a chunk (an error path left early): wait before freeing it.
        // Nothing can be done about a failed wait here; the context records the error.
        for (_, event) in &self.chunks {
            let _ = event.synchronize();
        }
    }
}
