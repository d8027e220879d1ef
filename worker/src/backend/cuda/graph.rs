//! Decode-step CUDA graphs, captured from the stream, with programmatic dependent launch (PDL)
//! between kernels that allow it: a kernel of [`kernels::PDL_KERNELS`] whose only dependency is
//! another kernel gets a programmatic edge, so that its blocks launch while that kernel finishes
//! and run up to their `pdl_wait()` (common.cuh) — address arithmetic, a GEMV's first weight
//! loads — instead of starting after the whole predecessor has drained. The kernels order their
//! own reads behind the wait; every other edge of the graph stays a full dependency.

use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUgraph, CUgraphExec, CUgraphInstantiate_flags, CUgraphNode, CUgraphNodeType,
    CUstreamCaptureMode,
};
use cudarc::driver::{CudaStream, DriverError, result};

use crate::backend::BackendError;

/// The kernels ([`kernels::PDL_KERNELS`], loaded) whose dependencies a capture makes
/// programmatic; empty: none.
#[derive(Default)]
pub struct PdlKernels(Vec<sys::CUfunction>);

// SAFETY: the handles are only compared with graph nodes' functions, never launched through.
unsafe impl Send for PdlKernels {}

impl PdlKernels {
    pub fn new(funcs: Vec<sys::CUfunction>) -> Self {
        Self(funcs)
    }
}

/// An instantiated graph and the stream it launches on.
pub struct DecodeGraph {
    graph: CUgraph,
    exec: CUgraphExec,
    stream: Arc<CudaStream>,
    /// Edges made programmatic.
    pub programmatic_edges: usize,
}

// SAFETY: the handles are only used through `&mut CudaBackend` (launch) or dropped with it, so
// uses are serialised; the stream's context is bound to the calling thread before every launch.
unsafe impl Send for DecodeGraph {}

fn check(r: sys::CUresult) -> Result<(), BackendError> {
    r.result()
        .map_err(|e: DriverError| BackendError::Device(format!("CUDA graph: {e:?}")))
}

impl DecodeGraph {
    /// Captures what `launch` queues on `stream` (which must queue at least one node) and
    /// instantiates it, the single kernel-to-kernel dependencies of `pdl`'s kernels made
    /// programmatic.
    pub fn capture(
        stream: &Arc<CudaStream>,
        pdl: &PdlKernels,
        launch: impl FnOnce() -> Result<(), BackendError>,
    ) -> Result<Self, BackendError> {
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let launched = launch();
        // End the capture whatever happened, so the stream is usable again.
        // SAFETY: the stream is live and capturing (begun above, on this thread).
        let graph = unsafe { result::stream::end_capture(stream.cu_stream()) }?;
        if graph.is_null() {
            launched?;
            return Err(BackendError::Device(
                "CUDA graph capture produced no graph".into(),
            ));
        }
        let mut this = Self {
            graph,
            exec: std::ptr::null_mut(),
            stream: stream.clone(),
            programmatic_edges: 0,
        };
        launched?;
        if !pdl.0.is_empty() {
            this.programmatic_edges = this.make_programmatic(&pdl.0)?;
        }
        let flags = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
        // SAFETY: the graph is live and complete (capture ended); `this` destroys it on error.
        this.exec = unsafe { result::graph::instantiate(this.graph, flags) }?;
        Ok(this)
    }

    /// Queues the graph on its stream.
    pub fn launch(&self) -> Result<(), BackendError> {
        self.stream.context().bind_to_thread()?;
        // SAFETY: exec was instantiated from this graph on this stream's context and lives as
        // long as self.
        unsafe { result::graph::launch(self.exec, self.stream.cu_stream()) }?;
        Ok(())
    }

    /// The kernel a node runs, or `None` for a node of another kind.
    fn kernel_of(node: CUgraphNode) -> Result<Option<sys::CUfunction>, BackendError> {
        let mut ty = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: node belongs to the live graph; ty is a live out-parameter.
        check(unsafe { sys::cuGraphNodeGetType(node, &mut ty) })?;
        if ty != CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
            return Ok(None);
        }
        // SAFETY: plain data, filled by the call below.
        let mut params: sys::CUDA_KERNEL_NODE_PARAMS_v2 = unsafe { std::mem::zeroed() };
        // SAFETY: node is a kernel node of the live graph; params is a live v2 struct.
        check(unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut params) })?;
        Ok(Some(params.func))
    }

    /// Turns each edge into a kernel of `pdl` from its only dependency, itself a kernel, into a
    /// programmatic edge (the dependency's programmatic port: the kernel may launch once every
    /// block of the dependency has triggered or exited). Returns how many.
    fn make_programmatic(&mut self, pdl: &[sys::CUfunction]) -> Result<usize, BackendError> {
        let mut n = 0usize;
        // SAFETY: the graph is live; null arrays ask for the count only.
        check(unsafe {
            sys::cuGraphGetEdges_v2(
                self.graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut n,
            )
        })?;
        let mut from = vec![std::ptr::null_mut(); n];
        let mut to = vec![std::ptr::null_mut(); n];
        // SAFETY: plain data.
        let mut data: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; n];
        // SAFETY: each array holds n entries, the count passed.
        check(unsafe {
            sys::cuGraphGetEdges_v2(
                self.graph,
                from.as_mut_ptr(),
                to.as_mut_ptr(),
                data.as_mut_ptr(),
                &mut n,
            )
        })?;
        let mut made = 0;
        for i in 0..n {
            let (f, t) = (from[i], to[i]);
            if to.iter().filter(|&&x| x == t).count() != 1 || data[i].type_ != 0 {
                continue;
            }
            let (Some(_), Some(func)) = (Self::kernel_of(f)?, Self::kernel_of(t)?) else {
                continue;
            };
            if !pdl.contains(&func) {
                continue;
            }
            // SAFETY: plain data.
            let mut edge: sys::CUgraphEdgeData = unsafe { std::mem::zeroed() };
            edge.from_port = sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8;
            edge.type_ = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
            // SAFETY: f -> t is an edge of the live graph with data[i]; the new one joins the
            // same two kernel nodes.
            unsafe {
                check(sys::cuGraphRemoveDependencies_v2(
                    self.graph, &f, &t, &data[i], 1,
                ))?;
                check(sys::cuGraphAddDependencies_v2(self.graph, &f, &t, &edge, 1))?;
            }
            made += 1;
        }
        Ok(made)
    }
}

impl Drop for DecodeGraph {
    fn drop(&mut self) {
        // SAFETY: each handle was created here (exec may be null after a failed instantiation)
        // and is destroyed once; launches already queued keep what they need alive.
        unsafe {
            if !self.exec.is_null() {
                let _ = result::graph::exec_destroy(self.exec);
            }
            let _ = result::graph::destroy(self.graph);
        }
    }
}
