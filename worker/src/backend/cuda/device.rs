//! The device: a CUDA context with one stream, the NVRTC-compiled kernel module, cuBLAS, and
//! untyped device buffers tagged with their element type.
//!
//! Everything runs on one stream, so cudarc's per-allocation event tracking is switched off (it
//! also breaks CUDA-graph capture with `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice,
};
use cudarc::nvrtc::Ptx;
use half::bf16;

use crate::backend::BackendError;
use crate::backend::switches::{KernelSwitches, PrefillChoice};

/// Element type of a device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    Bf16,
    /// Bytes: FP8 E4M3 codes.
    U8,
    U32,
    I32,
    I64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::Bf16 => 2,
            DType::F32 | DType::U32 | DType::I32 => 4,
            DType::I64 => 8,
        }
    }

    /// The kernel-name suffix of a float type.
    pub fn suffix(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

/// A device allocation of `len` elements of `dtype`.
#[derive(Debug)]
pub struct Buf {
    mem: CudaSlice<u8>,
    ptr: u64,
    len: usize,
    dtype: DType,
}

impl Buf {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The device address, by reference (for kernel argument lists).
    pub fn dptr(&self) -> &u64 {
        &self.ptr
    }

    /// The device address of element `i` (which must be `<= len`).
    pub fn ptr_at(&self, i: usize) -> u64 {
        debug_assert!(i <= self.len);
        self.ptr + (i * self.dtype.size()) as u64
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.mem.len()
    }

    /// Fails unless this buffer has `dtype` and at least `len` elements.
    pub fn check(&self, what: &str, dtype: DType, len: usize) -> Result<(), BackendError> {
        if self.dtype != dtype || self.len < len {
            return Err(BackendError::InvalidBatch(format!(
                "{what}: need {len} x {dtype:?}, buffer holds {} x {:?}",
                self.len, self.dtype
            )));
        }
        Ok(())
    }
}

impl From<cudarc::driver::DriverError> for BackendError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        BackendError::DeviceLibrary(Box::new(e))
    }
}

impl From<cudarc::cublas::result::CublasError> for BackendError {
    fn from(e: cudarc::cublas::result::CublasError) -> Self {
        BackendError::DeviceLibrary(Box::new(e))
    }
}

impl From<cudarc::cublaslt::result::CublasError> for BackendError {
    fn from(e: cudarc::cublaslt::result::CublasError) -> Self {
        BackendError::DeviceLibrary(Box::new(e))
    }
}

/// The kernel that runs bf16 head-size-128 prefill attention; both take the same work items of
/// [`kernels::PREFILL_MMA_TOKENS`] query tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillKernel {
    /// `attn_prefill_bf16_d128`: mma.sync, every architecture.
    Mma,
    /// `attn_prefill_wgmma_bf16_d128`: Hopper's wgmma, `sm_90a` only.
    Wgmma,
}

impl PrefillKernel {
    /// The kernel's name in [`kernels::KERNELS`].
    pub fn name(self) -> &'static str {
        match self {
            PrefillKernel::Mma => "attn_prefill_bf16_d128",
            PrefillKernel::Wgmma => "attn_prefill_wgmma_bf16_d128",
        }
    }

    /// Threads per block.
    pub fn threads(self) -> u32 {
        match self {
            PrefillKernel::Mma => kernels::PREFILL_MMA_THREADS,
            PrefillKernel::Wgmma => kernels::PREFILL_WGMMA_THREADS,
        }
    }

    /// Dynamic shared memory per block (bytes).
    pub fn smem_bytes(self) -> usize {
        match self {
            PrefillKernel::Mma => kernels::PREFILL_MMA_SMEM_BYTES,
            PrefillKernel::Wgmma => kernels::PREFILL_WGMMA_SMEM_BYTES,
        }
    }

    /// The kernels that run on code compiled for `arch`, the default first: wgmma needs
    /// `sm_90a` (elsewhere its body is compiled out and traps).
    pub fn available(arch: &str) -> &'static [PrefillKernel] {
        if arch == "sm_90a" {
            &[PrefillKernel::Wgmma, PrefillKernel::Mma]
        } else {
            &[PrefillKernel::Mma]
        }
    }

    /// The kernel `choice` asks for on `arch` (its default for [`PrefillChoice::Auto`]).
    pub fn select(arch: &str, choice: PrefillChoice) -> Result<Self, BackendError> {
        let available = Self::available(arch);
        let kernel = match choice {
            PrefillChoice::Auto => return Ok(available[0]),
            PrefillChoice::Mma => PrefillKernel::Mma,
            PrefillChoice::Wgmma => PrefillKernel::Wgmma,
        };
        if !available.contains(&kernel) {
            return Err(BackendError::InvalidOptions(format!(
                "the wgmma prefill kernel (RINGSERVE_CUDA_PREFILL=wgmma) needs a compute \
                 capability 9.0 device (kernels for sm_90a); this one compiles for {arch}"
            )));
        }
        Ok(kernel)
    }
}

/// The architecture the kernels are compiled for on a device of compute capability
/// `major.minor`: `sm_90a` on 9.0 (wgmma and setmaxnreg exist only in the arch-specific target,
/// which runs on 9.0 devices alone), `sm_<major><minor>` elsewhere.
pub fn arch_for(major: i32, minor: i32) -> String {
    if (major, minor) == (9, 0) {
        "sm_90a".to_string()
    } else {
        format!("sm_{major}{minor}")
    }
}

/// The context, stream, kernels and cuBLAS handle of one GPU.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// A second stream for work beside the main one: only L2 prefetches of weights, forked from
    /// and joined back into `stream` (also inside CUDA-graph captures, as a parallel branch).
    pub side: Arc<CudaStream>,
    pub blas: CudaBlas,
    funcs: HashMap<&'static str, CudaFunction>,
    /// `sm_XY`, or `sm_90a` (see [`arch_for`]).
    pub arch: String,
    /// Compute capability `(major, minor)`.
    pub capability: (i32, i32),
    /// The kernel [`crate::backend::cuda::ops::attention`] launches for bf16 head-size-128
    /// prefill.
    pub prefill: PrefillKernel,
    /// Whether bf16 head-size-128 decode attention runs on the tensor-core kernel
    /// ([`kernels::DECODE_MMA_KERNEL`]); [`KernelSwitches::decode_mma`].
    pub decode_mma: bool,
    /// Streaming multiprocessors.
    pub sms: usize,
    /// Seconds spent compiling (or loading from cache) and loading the kernels.
    pub kernel_load_s: f64,
    /// Whether the kernels came from the disk cache.
    pub kernels_from_cache: bool,
    /// The disk cache the kernels came from or went to (also where cuBLASLt tuning choices are
    /// kept, `lt_cache.rs`); `None` without one.
    pub cache_dir: Option<std::path::PathBuf>,
    /// The device's name, as the driver reports it.
    pub name: String,
}

impl Gpu {
    /// Opens GPU `ordinal`, compiles (or loads) the kernels for its architecture, and picks the
    /// attention kernels `switches` ask for.
    pub fn new(ordinal: usize, switches: &KernelSwitches) -> Result<Self, BackendError> {
        // SAFETY: only tries to dlopen the driver library's candidate names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(BackendError::Device(
                "libcuda.so (the NVIDIA driver) was not found".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: event tracking orders cudarc's allocations across streams. This backend does
        // all its work on one stream; the side stream only reads weights, which nothing writes
        // after loading, after an explicit join (an event) on the main stream, and is joined
        // back before anything follows that could free them. So the tracking is never needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let side = ctx.new_stream()?;
        let name = ctx.name()?;
        let (major, minor) = ctx.compute_capability()?;
        let arch = arch_for(major, minor);
        let prefill = PrefillKernel::select(&arch, switches.prefill)?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?
            .max(1) as usize;
        let t = Instant::now();
        let compile = kernels::CompileOptions::for_arch(&arch);
        let compiled =
            kernels::compile(&compile).map_err(|e| BackendError::Device(e.to_string()))?;
        let module = ctx.load_module(Ptx::from_binary(compiled.cubin))?;
        let mut funcs = HashMap::new();
        for &name in kernels::KERNELS {
            funcs.insert(name, module.load_function(name)?);
        }
        for dt in ["f32", "bf16", "bf16_kv8"] {
            let f = &funcs[format!("attention_{dt}").as_str()];
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                kernels::attention_smem_bytes(kernels::ATTN_MAX_HEAD_DIM) as i32,
            )
            ?;
        }
        // The decode kernels' K/V rings: above the default 48 KiB, and as much of each SM's
        // L1/shared memory as shared memory as possible (their copies bypass L1).
        use cudarc::driver::sys::CUfunction_attribute as Attr;
        for (dt, size) in [("f32", 4), ("bf16", 2)] {
            for &d in kernels::DECODE_HEAD_DIMS {
                for &g in kernels::DECODE_GROUPS {
                    let f = &funcs[format!("attn_decode_{dt}_d{d}_g{g}").as_str()];
                    let smem = kernels::decode_smem_bytes(size, d) as i32;
                    f.set_attribute(Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)?;
                    f.set_attribute(
                        Attr::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                        100,
                    )?;
                }
            }
        }
        for (name, smem) in [
            (
                kernels::DECODE_MMA_KERNEL,
                kernels::decode_smem_bytes(2, 128),
            ),
            (
                kernels::DECODE_MMA_KV8_KERNEL,
                kernels::DECODE_KV8_SMEM_BYTES,
            ),
            // The tensor-core prefill kernels' K/V ring and Q tile: 96 KiB, two blocks per SM.
            ("attn_prefill_bf16_d128", kernels::PREFILL_MMA_SMEM_BYTES),
            (
                kernels::PREFILL_MMA_KV8_KERNEL,
                kernels::PREFILL_MMA_SMEM_BYTES,
            ),
        ] {
            let f = &funcs[name];
            f.set_attribute(
                Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )?;
            f.set_attribute(
                Attr::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            )?;
        }
        // The scaled INT4 tensor-core products' rings: above 48 KiB for 128 and 256 rows a block.
        for k in super::int4::MMA_KERNELS.iter().filter(|k| k.scaled) {
            funcs[k.name].set_attribute(
                Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                kernels::int4_mmas_smem_bytes(k.rows) as i32,
            )?;
        }
        // The Hopper INT4 products' rings (61-145 KiB), where their bodies are compiled.
        if arch == "sm_90a" {
            for k in &super::int4::WGMMA_KERNELS {
                let f = &funcs[k.name];
                f.set_attribute(
                    Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    k.smem_bytes() as i32,
                )?;
                f.set_attribute(
                    Attr::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    100,
                )?;
            }
        }
        // The Hopper prefill kernel's Q tile and K/V rings: 161 KiB, one block per SM. Only where
        // its body is compiled: other devices may not allow that much.
        if PrefillKernel::available(&arch).contains(&PrefillKernel::Wgmma) {
            let f = &funcs[PrefillKernel::Wgmma.name()];
            f.set_attribute(
                Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                kernels::PREFILL_WGMMA_SMEM_BYTES as i32,
            )?;
            f.set_attribute(
                Attr::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            )?;
        }
        let blas = CudaBlas::new(stream.clone())?;
        Ok(Self {
            ctx,
            stream,
            side,
            blas,
            funcs,
            arch,
            capability: (major, minor),
            prefill,
            decode_mma: switches.decode_mma,
            sms,
            kernel_load_s: t.elapsed().as_secs_f64(),
            kernels_from_cache: compiled.from_cache,
            cache_dir: compile.cache_dir,
            name,
        })
    }

    /// The kernel named `name` (one of [`kernels::KERNELS`]).
    pub fn func(&self, name: &str) -> Result<&CudaFunction, BackendError> {
        self.funcs
            .get(name)
            .ok_or_else(|| BackendError::Device(format!("no kernel named {name}")))
    }

    /// A zeroed buffer.
    pub fn alloc(&self, dtype: DType, len: usize) -> Result<Buf, BackendError> {
        let mem = self.stream.alloc_zeros::<u8>((len * dtype.size()).max(1))?;
        Ok(self.wrap(mem, len, dtype))
    }

    fn wrap(&self, mem: CudaSlice<u8>, len: usize, dtype: DType) -> Buf {
        let ptr = {
            let (ptr, _guard) = mem.device_ptr(&self.stream);
            ptr
        };
        Buf {
            ptr,
            mem,
            len,
            dtype,
        }
    }

    /// Uploads raw bytes holding `len` elements of `dtype`.
    pub fn upload_bytes(&self, bytes: &[u8], dtype: DType) -> Result<Buf, BackendError> {
        let len = bytes.len() / dtype.size();
        let mem = if bytes.is_empty() {
            self.stream.alloc_zeros::<u8>(1)?
        } else {
            self.stream.clone_htod(bytes)?
        };
        Ok(self.wrap(mem, len, dtype))
    }

    /// Uploads floats as `dtype` (F32 or Bf16, rounding to nearest even).
    pub fn upload_f32(&self, data: &[f32], dtype: DType) -> Result<Buf, BackendError> {
        match dtype {
            DType::F32 => self.upload_bytes(&f32_bytes(data), dtype),
            DType::Bf16 => {
                let bytes: Vec<u8> = data
                    .iter()
                    .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                    .collect();
                self.upload_bytes(&bytes, dtype)
            }
            other => Err(BackendError::Device(format!("upload_f32 into {other:?}"))),
        }
    }

    /// Uploads u32s.
    pub fn upload_u32(&self, data: &[u32]) -> Result<Buf, BackendError> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.upload_bytes(&bytes, DType::U32)
    }

    /// Uploads i32s.
    pub fn upload_i32(&self, data: &[i32]) -> Result<Buf, BackendError> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.upload_bytes(&bytes, DType::I32)
    }

    /// Uploads i64s.
    pub fn upload_i64(&self, data: &[i64]) -> Result<Buf, BackendError> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.upload_bytes(&bytes, DType::I64)
    }

    /// Copies `bytes` into the start of `dst` (asynchronously on the stream; `bytes` is copied
    /// before this returns).
    pub fn write_bytes(&self, dst: &mut Buf, bytes: &[u8]) -> Result<(), BackendError> {
        if bytes.len() > dst.mem.len() {
            return Err(BackendError::InvalidBatch(format!(
                "write of {} bytes into a {}-byte buffer",
                bytes.len(),
                dst.mem.len()
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let mut view = dst.mem.slice_mut(0..bytes.len());
        Ok(self.stream.memcpy_htod(bytes, &mut view)?)
    }

    /// Copies `bytes` into `dst` starting at byte `offset`.
    pub fn write_bytes_at(
        &self,
        dst: &mut Buf,
        offset: usize,
        bytes: &[u8],
    ) -> Result<(), BackendError> {
        let end = offset
            .checked_add(bytes.len())
            .filter(|&e| e <= dst.mem.len());
        let Some(end) = end else {
            return Err(BackendError::InvalidBatch(format!(
                "write of {} bytes at {offset} into a {}-byte buffer",
                bytes.len(),
                dst.mem.len()
            )));
        };
        if bytes.is_empty() {
            return Ok(());
        }
        let mut view = dst.mem.slice_mut(offset..end);
        Ok(self.stream.memcpy_htod(bytes, &mut view)?)
    }

    /// Copies `bytes` into the start of `dst` in stream order and waits for the copy, for buffers
    /// that kernels also write through shared references (activations).
    pub fn overwrite(&self, dst: &Buf, bytes: &[u8]) -> Result<(), BackendError> {
        if bytes.len() > dst.mem.len() {
            return Err(BackendError::InvalidBatch(format!(
                "write of {} bytes into a {}-byte buffer",
                bytes.len(),
                dst.mem.len()
            )));
        }
        // SAFETY: the destination range lies inside `dst`'s allocation (checked above), which
        // outlives the copy (we synchronise before returning, so `bytes` also outlives it); the
        // copy is ordered on the one stream after every kernel queued so far.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst.ptr, bytes, self.stream.cu_stream())
        }?;
        self.sync()
    }

    /// Downloads the first `len` elements as raw bytes.
    pub fn download_bytes(&self, buf: &Buf, len: usize) -> Result<Vec<u8>, BackendError> {
        let n = (len * buf.dtype.size()).min(buf.mem.len());
        let mut out = vec![0u8; n];
        if n > 0 {
            self.stream.memcpy_dtoh(&buf.mem.slice(0..n), &mut out)?;
        }
        self.stream.synchronize()?;
        Ok(out)
    }

    /// Downloads a float buffer as f32.
    pub fn download_f32(&self, buf: &Buf) -> Result<Vec<f32>, BackendError> {
        let bytes = self.download_bytes(buf, buf.len)?;
        Ok(match buf.dtype {
            DType::Bf16 => bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            _ => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        })
    }

    /// Downloads the first `len` elements of an f32 buffer.
    pub fn download_f32_prefix(&self, buf: &Buf, len: usize) -> Result<Vec<f32>, BackendError> {
        if buf.dtype != DType::F32 {
            return Err(BackendError::Device(
                "download_f32_prefix of a non-f32 buffer".into(),
            ));
        }
        let bytes = self.download_bytes(buf, len)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Downloads a u32 buffer.
    pub fn download_u32(&self, buf: &Buf, len: usize) -> Result<Vec<u32>, BackendError> {
        let bytes = self.download_bytes(buf, len)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Copies `len` elements of `src` from element `src_at` into `dst` from element `dst_at`, on
    /// the device, in stream order.
    pub fn copy_range(
        &self,
        src: &Buf,
        src_at: usize,
        dst: &mut Buf,
        dst_at: usize,
        len: usize,
    ) -> Result<(), BackendError> {
        let size = src.dtype.size();
        if src.dtype != dst.dtype || src_at + len > src.len || dst_at + len > dst.len {
            return Err(BackendError::InvalidBatch(format!(
                "copy of {len} x {:?} from element {src_at} of a buffer of {} into element \
                 {dst_at} of one of {} x {:?}",
                src.dtype, src.len, dst.len, dst.dtype
            )));
        }
        if len == 0 {
            return Ok(());
        }
        let mut view = dst.mem.slice_mut(dst_at * size..(dst_at + len) * size);
        Ok(self.stream.memcpy_dtod(
            &src.mem.slice(src_at * size..(src_at + len) * size),
            &mut view,
        )?)
    }

    /// Page-locked host memory for `len` u32s, zeroed, that [`Gpu::start_readback`] fills
    /// without waiting.
    pub fn readback(&self, len: usize) -> Result<Readback, BackendError> {
        let bytes = 4 * len.max(1);
        // SAFETY: the allocation is uninitialised; it is zeroed through the raw pointer below
        // before any reference to its bytes exists.
        let mut host = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }?;
        let ptr = host.as_mut_ptr()?;
        // SAFETY: `ptr` is the start of this allocation of `bytes` bytes, and nothing else
        // refers to it yet.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        let done = self.ctx.new_event(None)?;
        Ok(Readback {
            host,
            done,
            filled: 0,
        })
    }

    /// Starts copying the first `len` u32s of `buf` into `rb` in stream order (behind the work
    /// queued so far); [`Readback::wait`] returns them once the copy is done.
    pub fn start_readback(
        &self,
        buf: &Buf,
        len: usize,
        rb: &mut Readback,
    ) -> Result<(), BackendError> {
        buf.check("readback source", DType::U32, len)?;
        if 4 * len > rb.host.len() {
            return Err(BackendError::InvalidBatch(format!(
                "readback of {len} values into a host buffer of {} bytes",
                rb.host.len()
            )));
        }
        rb.filled = len;
        if len > 0 {
            self.stream
                .memcpy_dtoh(&buf.mem.slice(0..4 * len), &mut rb.host)?;
        }
        // Our own event: with cudarc's event tracking off (Gpu::new), the pinned slice records
        // none of its own, and waiting on it would not wait for this copy.
        Ok(rb.done.record(&self.stream)?)
    }

    /// Waits for all queued work.
    pub fn sync(&self) -> Result<(), BackendError> {
        Ok(self.stream.synchronize()?)
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), BackendError> {
        Ok(cudarc::driver::result::mem_get_info()?)
    }
}

/// Page-locked host memory that a step's draws are copied into while later work is queued
/// ([`Gpu::readback`]).
pub struct Readback {
    host: PinnedHostSlice<u8>,
    /// Recorded behind the copy.
    done: CudaEvent,
    /// u32 values the last [`Gpu::start_readback`] copies.
    filled: usize,
}

impl Readback {
    /// u32 values it holds at most.
    pub fn capacity(&self) -> usize {
        self.host.len() / 4
    }

    /// Waits for the copy [`Gpu::start_readback`] started and returns its values.
    pub fn wait(&self) -> Result<Vec<u32>, BackendError> {
        self.done.synchronize()?;
        Ok(self.host.as_slice()?[..4 * self.filled]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Little-endian bytes of floats.
pub fn f32_bytes(data: &[f32]) -> Vec<u8> {
    data.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_capability_9_0_compiles_for_sm_90a() {
        assert_eq!(arch_for(9, 0), "sm_90a");
        assert_eq!(arch_for(8, 9), "sm_89");
        assert_eq!(arch_for(8, 0), "sm_80");
        assert_eq!(arch_for(10, 0), "sm_100");
    }

    #[test]
    fn prefill_kernel_defaults_to_wgmma_on_sm_90a_only() {
        assert_eq!(
            PrefillKernel::select("sm_90a", PrefillChoice::Auto).unwrap(),
            PrefillKernel::Wgmma
        );
        assert_eq!(
            PrefillKernel::select("sm_89", PrefillChoice::Auto).unwrap(),
            PrefillKernel::Mma
        );
        assert_eq!(
            PrefillKernel::select("sm_90", PrefillChoice::Auto).unwrap(),
            PrefillKernel::Mma
        );
        assert_eq!(
            PrefillKernel::select("sm_90a", PrefillChoice::Mma).unwrap(),
            PrefillKernel::Mma
        );
        assert_eq!(
            PrefillKernel::select("sm_90a", PrefillChoice::Wgmma).unwrap(),
            PrefillKernel::Wgmma
        );
        let err = PrefillKernel::select("sm_80", PrefillChoice::Wgmma)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sm_90a") && err.contains("sm_80"), "{err}");
    }

    #[test]
    fn every_prefill_kernel_is_compiled() {
        for k in [PrefillKernel::Mma, PrefillKernel::Wgmma] {
            assert!(kernels::KERNELS.contains(&k.name()), "{}", k.name());
        }
    }
}
