//! The CUDA backend's side of a tensor-parallel group: the all-reduce after the row-split `o_proj`
//! and `down_proj`, through NCCL or through host memory ([`TpCollectives`]), and the start-up
//! agreements (NCCL's unique id, the KV block count) over the group's host communicator.
//!
//! NCCL runs on the backend's one stream, so its all-reduces are ordered with the kernels and are
//! captured into the decode CUDA graphs like any kernel; every rank captures and replays the same
//! sequence, because every rank runs the same steps (rank 0's plans). The host path downloads the
//! activations, sums them over the [`Communicator`] in rank order (f32) and uploads the sum: it
//! synchronises the stream, so a backend using it runs eagerly.

use std::ffi::CStr;

use cudarc::nccl::sys as nccl;
use half::bf16;

use super::device::{Buf, DType, Gpu};
use crate::backend::BackendError;
use crate::tp::{Communicator, TpCollectives, TpShard, broadcast_bytes};

/// A CUDA backend's place in a TP group.
pub struct CudaTp {
    pub shard: TpShard,
    /// Host-side collectives between the ranks (the group's shared-memory communicator): start-up
    /// agreements, and the data path of [`TpCollectives::Host`].
    pub host: Box<dyn Communicator>,
    pub collectives: TpCollectives,
}

impl std::fmt::Debug for CudaTp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaTp")
            .field("shard", &self.shard)
            .field("collectives", &self.collectives)
            .finish_non_exhaustive()
    }
}

fn nccl_err(call: &str, r: nccl::ncclResult_t) -> BackendError {
    // SAFETY: ncclGetErrorString returns a pointer to a static NUL-terminated string for any
    // result code.
    let text = unsafe { CStr::from_ptr(nccl::ncclGetErrorString(r)) };
    BackendError::Device(format!("{call}: {r:?} ({})", text.to_string_lossy()))
}

fn check(call: &str, r: nccl::ncclResult_t) -> Result<(), BackendError> {
    match r {
        nccl::ncclResult_t::ncclSuccess => Ok(()),
        other => Err(nccl_err(call, other)),
    }
}

/// An NCCL communicator, aborted on drop.
struct NcclComm(nccl::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; it lives inside the backend and is used only through `&mut CudaBackend` (or during
// construction), so uses are serialised.
unsafe impl Send for NcclComm {}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: the handle came from ncclCommInitRank and is destroyed once. Abort (not
        // destroy): it does not wait for peers that may already be gone.
        unsafe {
            nccl::ncclCommAbort(self.0);
        }
    }
}

/// The group as the forward pass sees it.
pub(super) struct DeviceGroup {
    host: Box<dyn Communicator>,
    nccl: Option<NcclComm>,
    /// Host copy of the activations on the host path.
    scratch: Vec<f32>,
}

impl DeviceGroup {
    /// Joins the group: with NCCL, rank 0 makes the unique id, the host communicator carries it to
    /// the others and every rank initialises its communicator on `gpu` (blocking until all have).
    pub fn new(gpu: &Gpu, tp: CudaTp) -> Result<Self, BackendError> {
        let CudaTp {
            shard,
            mut host,
            collectives,
        } = tp;
        if host.world_size() != shard.world || host.rank() != shard.rank {
            return Err(BackendError::InvalidOptions(format!(
                "communicator is rank {} of {}, shard says {} of {}",
                host.rank(),
                host.world_size(),
                shard.rank,
                shard.world
            )));
        }
        let nccl = match collectives {
            TpCollectives::Host => None,
            TpCollectives::Nccl => Some(init_nccl(gpu, shard, host.as_mut())?),
        };
        Ok(Self {
            host,
            nccl,
            scratch: Vec::new(),
        })
    }

    /// Whether the all-reduce can be captured into a CUDA graph.
    pub fn capturable(&self) -> bool {
        self.nccl.is_some()
    }

    /// The host communicator (start-up agreements).
    pub fn host(&mut self) -> &mut dyn Communicator {
        self.host.as_mut()
    }

    /// Replaces the first `len` elements of `buf` on every rank with their sum over the group,
    /// queued on `gpu`'s stream (NCCL) or done before returning (host path).
    pub fn all_reduce(&mut self, gpu: &Gpu, buf: &Buf, len: usize) -> Result<(), BackendError> {
        buf.check("all-reduce buffer", buf.dtype(), len)?;
        if let Some(comm) = &self.nccl {
            let dtype = match buf.dtype() {
                DType::F32 => nccl::ncclDataType_t::ncclFloat32,
                DType::Bf16 => nccl::ncclDataType_t::ncclBfloat16,
                other => {
                    return Err(BackendError::InvalidOptions(format!(
                        "all-reduce of {other:?}"
                    )));
                }
            };
            let ptr = buf.ptr() as *mut std::ffi::c_void;
            // SAFETY: `buf` holds at least `len` elements of `dtype` (checked above) and stays
            // allocated while the stream runs (the backend owns it and synchronises before
            // dropping it); in-place all-reduce (send == recv) is allowed by NCCL. The stream
            // belongs to the context current on this thread, which is the communicator's device.
            let r = unsafe {
                nccl::ncclAllReduce(
                    ptr,
                    ptr,
                    len,
                    dtype,
                    nccl::ncclRedOp_t::ncclSum,
                    comm.0,
                    gpu.stream.cu_stream() as nccl::cudaStream_t,
                )
            };
            return check("ncclAllReduce", r);
        }
        let bytes = gpu.download_bytes(buf, len)?;
        self.scratch.clear();
        match buf.dtype() {
            DType::Bf16 => self.scratch.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            ),
            _ => self.scratch.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
        }
        self.host.all_reduce_sum(&mut self.scratch)?;
        let out: Vec<u8> = match buf.dtype() {
            DType::Bf16 => self
                .scratch
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                .collect(),
            _ => self.scratch.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        gpu.overwrite(buf, &out)
    }
}

/// Creates this rank's NCCL communicator: rank 0's unique id reaches the others through `host`.
fn init_nccl(
    gpu: &Gpu,
    shard: TpShard,
    host: &mut dyn Communicator,
) -> Result<NcclComm, BackendError> {
    // SAFETY: only tries to dlopen NCCL's candidate library names.
    if !unsafe { nccl::is_culib_present() } {
        return Err(BackendError::Device(
            "NCCL (libnccl.so.2) is not installed or not on the library path; install NCCL or \
             use --tp-collectives host"
                .into(),
        ));
    }
    let mut id = nccl::ncclUniqueId { internal: [0; 128] };
    if shard.rank == 0 {
        // SAFETY: `id` is a valid out-pointer for the 128-byte id.
        check("ncclGetUniqueId", unsafe { nccl::ncclGetUniqueId(&mut id) })?;
    }
    let mut bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
    broadcast_bytes(host, &mut bytes)?;
    for (dst, &b) in id.internal.iter_mut().zip(&bytes) {
        *dst = b as std::ffi::c_char;
    }
    gpu.ctx.bind_to_thread()?;
    let world = i32::try_from(shard.world)
        .map_err(|_| BackendError::InvalidOptions("tensor-parallel size too large".into()))?;
    let mut comm: nccl::ncclComm_t = std::ptr::null_mut();
    // SAFETY: `comm` is a valid out-pointer; `id` is the group's id, identical on every rank; the
    // rank is below the world size (TpShard invariant checked by LocalDims). The call blocks until
    // every rank has called it.
    check("ncclCommInitRank", unsafe {
        nccl::ncclCommInitRank(&mut comm, world, id, shard.rank as i32)
    })?;
    tracing::info!(
        rank = shard.rank,
        world = shard.world,
        "NCCL communicator ready"
    );
    Ok(NcclComm(comm))
}
