//! Flags of the serving subcommands: `serve`, `worker`, `client` and `bench serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use gateway::admission::AdmissionLimits;
use gateway::server::ServerConfig;
use gateway::supervisor::WorkerCommand;
use worker::backend::switches::KernelSwitches;
use worker::backend::{BackendOptions, Device};
use worker::config::ModelConfig;
use worker::engine::EngineConfig;
use worker::quant::Quantization;
use worker::quant::kv::KvCacheDtype;
use worker::serve::launch::{WorkerDevice, WorkerOptions, run_joined_worker, run_worker};
use worker::serve::tp::{TpOptions, check_model};
use worker::tp::TpCollectives;

use crate::LogFormat;
use crate::engine_cli::{DtypeFlag, compute_dtype};
use crate::scale_cli::{ServeScaleFlags, WorkerLifeFlags};
use crate::security_cli::{ClientSecurityFlags, ServerSecurityFlags};

/// Engine knobs shared by `serve` and `worker` (vLLM's flag names).
#[derive(Args, Debug, Clone)]
pub struct ServingEngineFlags {
    /// Where the model runs: cpu, cuda, cuda:N, or null (no math: measures the serving path).
    #[arg(long, default_value = "cpu")]
    pub device: WorkerDevice,
    /// Context length limit (default: the model's, capped by the KV cache).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Sequences running at once at most, per worker.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Tokens computed per step at most (prefill chunks + decodes).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Prompt tokens a step may carry when it also decodes running sequences (default: up to
    /// --max-num-batched-tokens). Lower bounds the streams' inter-token latency under load; prompts
    /// take more steps to prefill.
    #[arg(long)]
    pub max_prefill_tokens_while_decoding: Option<usize>,
    /// Reuse KV blocks of equal prompt prefixes across requests.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_prefix_caching: bool,
    /// Fraction of GPU memory a CUDA worker may use.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f32,
    /// Ranks per model replica (tensor parallelism across worker processes). Must divide the
    /// attention heads and the intermediate size.
    #[arg(long, visible_alias = "tp", default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// How CUDA tensor-parallel ranks exchange activations: nccl (one GPU per rank, CUDA graphs)
    /// or host (through host memory; slow, ranks may share a GPU). The CPU backend always uses
    /// shared memory.
    #[arg(long, default_value = "nccl")]
    pub tp_collectives: TpCollectives,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV blocks per worker (default: sized from memory).
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,
    /// Capacity of each request and response ring, in MiB (a power of two).
    #[arg(long, default_value_t = 4)]
    pub ring_mib: usize,
    /// Compute type of a CUDA worker (default bfloat16; the CPU backend is always float32).
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeFlag>,
    /// Quantize the linear layers: `fp8` (E4M3 weights with per-channel scales, per-token dynamic
    /// activations; vLLM's meaning; CPU and CUDA sm_89+). `awq`, `gptq` (or `awq_marlin`,
    /// `gptq_marlin`) only check that the checkpoint is one. Quantized checkpoints (FP8, AWQ,
    /// GPTQ, compressed-tensors) are detected from their config without it.
    #[arg(long)]
    pub quantization: Option<Quantization>,
    /// The KV cache's element type: `auto` (the compute type) or `fp8` / `fp8_e4m3` (E4M3 with
    /// one scale per layer for K and one for V: the checkpoint's `k_scale` / `v_scale`, else 1.0,
    /// as vLLM; CUDA: half the KV memory and decode-attention reads, sm_89+ and bfloat16).
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// CUDA: run every step eagerly (no CUDA graphs for decode steps).
    #[arg(long)]
    pub enforce_eager: bool,
    /// CUDA: make each sequence's results independent of the batch it runs in (fixed-shape
    /// GEMMs; costs ~1.3-1.8 ms per decode step on the 8B shape).
    #[arg(long)]
    pub batch_invariant: bool,
    /// Plan and launch the next decode step while the GPU runs this one (its input tokens taken
    /// from this step's draws on the device), so the host's work between steps leaves the GPU
    /// busy; the same tokens. Decode steps 1-2 % shorter, but a new request joins a step later:
    /// under load, TTFT rises. CUDA, steps whose requests sample on the device; not with
    /// tensor parallelism.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub async_scheduling: bool,
}

impl ServingEngineFlags {
    fn check(&self) -> anyhow::Result<()> {
        if !self.ring_mib.is_power_of_two() {
            bail!("--ring-mib {} must be a power of two", self.ring_mib);
        }
        Ok(())
    }

    /// The same flags as arguments of `ringserve worker` (except `--tensor-parallel-size`, which
    /// the supervisor gives each rank together with `--rank` and `--tp-group`).
    fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "--device".into(),
            self.device.to_string(),
            "--max-num-seqs".into(),
            self.max_num_seqs.to_string(),
            "--max-num-batched-tokens".into(),
            self.max_num_batched_tokens.to_string(),
            "--enable-prefix-caching".into(),
            self.enable_prefix_caching.to_string(),
            "--gpu-memory-utilization".into(),
            self.gpu_memory_utilization.to_string(),
            "--block-size".into(),
            self.block_size.to_string(),
            "--ring-mib".into(),
            self.ring_mib.to_string(),
            "--tp-collectives".into(),
            self.tp_collectives.to_string(),
        ];
        if let Some(n) = self.max_prefill_tokens_while_decoding {
            a.extend(["--max-prefill-tokens-while-decoding".into(), n.to_string()]);
        }
        if self.async_scheduling {
            a.extend(["--async-scheduling".into(), "true".into()]);
        }
        if let Some(n) = self.max_model_len {
            a.extend(["--max-model-len".into(), n.to_string()]);
        }
        if let Some(n) = self.num_kv_blocks {
            a.extend(["--num-kv-blocks".into(), n.to_string()]);
        }
        if let Some(d) = self.dtype {
            let name = d.to_possible_value().map(|v| v.get_name().to_owned());
            a.extend(["--dtype".into(), name.unwrap_or_default()]);
        }
        if let Some(q) = self.quantization {
            a.extend(["--quantization".into(), q.to_string()]);
        }
        if self.kv_cache_dtype != KvCacheDtype::Auto {
            a.extend(["--kv-cache-dtype".into(), self.kv_cache_dtype.to_string()]);
        }
        if self.enforce_eager {
            a.push("--enforce-eager".into());
        }
        if self.batch_invariant {
            a.push("--batch-invariant".into());
        }
        a
    }

    /// The backend these flags describe (its device is set by the worker from `--device`); the
    /// CUDA kernel switches come from the environment ([`KernelSwitches::from_env`]).
    fn backend_options(&self) -> anyhow::Result<BackendOptions> {
        let device = match self.device {
            WorkerDevice::Model(d) => d,
            WorkerDevice::Null => Device::Cpu,
        };
        Ok(BackendOptions {
            device,
            dtype: compute_dtype(self.dtype, device),
            block_size: self.block_size,
            num_kv_blocks: self.num_kv_blocks,
            gpu_memory_utilization: self.gpu_memory_utilization,
            enforce_eager: self.enforce_eager,
            batch_invariant: self.batch_invariant,
            kernels: KernelSwitches::from_env()?,
            quantization: self.quantization,
            kv_cache_dtype: self.kv_cache_dtype,
        })
    }
}

/// `ringserve serve`: the gateway and its worker processes.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A HuggingFace model folder, a `.gguf` file, or a Hub id (`org/name`, `org/name@revision`,
    /// `org/name:QUANT` for a GGUF repository's file), fetched into the HuggingFace cache (default:
    /// the built-in demo model, on the CPU).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The GGUF file of a Hub repository given as --model (or of a local folder).
    #[arg(long)]
    pub gguf_file: Option<String>,
    /// Worker processes (default: 1, or one group of --tensor-parallel-size, or one per --gpus
    /// GPU). With tensor parallelism they form workers / T groups of T ranks.
    #[arg(long)]
    pub workers: Option<usize>,
    /// GPUs to serve on, comma-separated (e.g. 0,1,2,3): one worker per GPU, each seeing only its
    /// own through CUDA_VISIBLE_DEVICES (needs --device cuda).
    #[arg(long, value_delimiter = ',')]
    pub gpus: Vec<String>,
    /// gRPC listen address (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: SocketAddr,
    /// Prometheus /metrics listen address.
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub metrics_addr: SocketAddr,
    /// The OpenAI-compatible HTTP API's listen address (`/v1/completions`, `/v1/chat/completions`,
    /// ...), or `off`.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub http_addr: ListenAddr,
    /// The model's name in ModelInfo, `/v1/models` and the `model` field of OpenAI requests
    /// (default: the --model argument as given, as vLLM does; `demo` for the demo model).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Requests admitted at once; more get RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 1024)]
    pub max_in_flight: usize,
    /// Prompt tokens admitted but not yet prefilled; more get RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 262_144)]
    pub max_queued_prompt_tokens: usize,
    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// Seconds a request whose worker died waits for a live worker to resume on, then UNAVAILABLE.
    #[arg(long, default_value_t = 30.0)]
    pub failover_timeout: f64,
    #[command(flatten)]
    pub engine: ServingEngineFlags,
    #[command(flatten)]
    pub scale: ServeScaleFlags,
    #[command(flatten)]
    pub life: WorkerLifeFlags,
    #[command(flatten)]
    pub security: ServerSecurityFlags,
}

/// A listen address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenAddr(pub Option<SocketAddr>);

impl std::str::FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" | "none" => Ok(Self(None)),
            _ => s
                .parse()
                .map(|a| Self(Some(a)))
                .map_err(|e| format!("{s:?} is not an address like 127.0.0.1:8000 or `off`: {e}")),
        }
    }
}

/// `ringserve worker`: one engine on one device, serving a gateway's rings.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// A HuggingFace model folder, a `.gguf` file or a Hub id (as `serve --model`).
    #[arg(long)]
    pub model: PathBuf,
    /// The GGUF file of a Hub repository given as --model.
    #[arg(long)]
    pub gguf_file: Option<String>,
    /// Prefix of the ring names (`PREFIX-req`, `PREFIX-resp`); attached, or created if absent.
    /// Required, except on ranks 1.. of a tensor-parallel group (they have no gateway rings).
    #[arg(long, conflicts_with = "join")]
    pub rings: Option<String>,
    /// This worker's rank in its tensor-parallel group (0 schedules and serves the rings).
    #[arg(long, default_value_t = 0)]
    pub rank: usize,
    /// Prefix of the tensor-parallel group's shared-memory segments (plan rings, communicator);
    /// the same on every rank of a group.
    #[arg(long)]
    pub tp_group: Option<String>,
    /// Join the running gateway started with `serve --name NAME` (its model loaded first); the
    /// gateway creates the rings and routes to this worker until it leaves.
    #[arg(long, value_name = "NAME")]
    pub join: Option<String>,
    /// Seed for requests that bring none.
    #[arg(long)]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub engine: ServingEngineFlags,
    #[command(flatten)]
    pub life: WorkerLifeFlags,
}

/// The model folder to serve: `--model`, or the demo model (created on first use).
fn model_dir(model: Option<PathBuf>, gguf_file: Option<&str>) -> anyhow::Result<PathBuf> {
    match model {
        Some(dir) => crate::resolve_model(&dir, gguf_file),
        None => crate::demo_model_dir(),
    }
}

/// The number of worker processes `serve` starts: checks `--workers`, `--tensor-parallel-size`,
/// `--device` and `--gpus` against each other.
fn serve_workers(
    workers: Option<usize>,
    tp: usize,
    device: WorkerDevice,
    gpus: &[String],
) -> anyhow::Result<usize> {
    if tp == 0 {
        bail!("--tensor-parallel-size must be at least 1");
    }
    let n = if gpus.is_empty() {
        workers.unwrap_or(tp)
    } else {
        match device {
            WorkerDevice::Model(Device::Cuda(0)) => {}
            WorkerDevice::Model(Device::Cuda(n)) => bail!(
                "--gpus: each worker sees its one GPU as cuda:0; use --device cuda, not cuda:{n}"
            ),
            _ => bail!("--gpus needs --device cuda"),
        }
        for (i, gpu) in gpus.iter().enumerate() {
            if gpu.trim().is_empty() {
                bail!("--gpus: entry {} is empty", i + 1);
            }
            if gpus[..i].contains(gpu) {
                bail!("--gpus: GPU {gpu} is listed twice");
            }
        }
        match workers {
            Some(w) if w != gpus.len() => bail!(
                "--workers {w} does not match the {} GPUs of --gpus (one worker per GPU)",
                gpus.len()
            ),
            _ => gpus.len(),
        }
    };
    if n == 0 {
        bail!("--workers must be at least 1");
    }
    if !n.is_multiple_of(tp) {
        bail!("--workers {n} must be a multiple of --tensor-parallel-size {tp}");
    }
    if tp > 1 {
        // The device rules of a rank (null has nothing to shard).
        TpOptions {
            world: tp,
            rank: 0,
            group: Some("serve".into()),
            ..TpOptions::default()
        }
        .check(device, true)?;
    }
    Ok(n)
}

/// NCCL needs one GPU per rank: a CUDA group with NCCL collectives must place its ranks with
/// `--gpus` (without it every worker would open `cuda:0`).
fn check_cuda_tp(
    tp: usize,
    device: WorkerDevice,
    collectives: TpCollectives,
    gpus: &[String],
) -> anyhow::Result<()> {
    if tp > 1
        && matches!(device, WorkerDevice::Model(Device::Cuda(_)))
        && collectives == TpCollectives::Nccl
        && gpus.is_empty()
    {
        bail!(
            "--tensor-parallel-size {tp} with --device cuda: NCCL needs one GPU per rank; list them \
             with --gpus (e.g. --gpus 0,1), or use --tp-collectives host to run the ranks through \
             host memory (they may then share a GPU)"
        );
    }
    Ok(())
}

pub fn serve(args: ServeArgs, log_format: LogFormat) -> anyhow::Result<()> {
    args.engine.check()?;
    let security = args.security.security()?;
    let tp = args.engine.tensor_parallel_size;
    let workers = serve_workers(args.workers, tp, args.engine.device, &args.gpus)?;
    check_cuda_tp(
        tp,
        args.engine.device,
        args.engine.tp_collectives,
        &args.gpus,
    )?;
    let given = args.model.as_ref().map(|m| m.display().to_string());
    let dir = model_dir(args.model, args.gguf_file.as_deref())?;
    let dir = dir
        .canonicalize()
        .with_context(|| format!("model folder {}", dir.display()))?;
    if tp > 1 {
        let model = ModelConfig::load(&dir).with_context(|| format!("model {}", dir.display()))?;
        check_model(tp, &model)?;
    }
    let model_name = args
        .served_model_name
        .or(given)
        .unwrap_or_else(|| "demo".to_owned());
    let mut worker_args = vec![
        "worker".to_owned(),
        "--model".into(),
        dir.display().to_string(),
    ];
    worker_args.extend(args.engine.to_args());
    worker_args.extend(args.life.to_args());
    worker_args.extend(log_format.to_args());
    args.life.lifecycle()?;
    let config = ServerConfig {
        model_dir: dir,
        model_name,
        addr: args.addr,
        metrics_addr: Some(args.metrics_addr),
        http_addr: args.http_addr.0,
        workers,
        worker: WorkerCommand {
            exe: std::env::current_exe().context("locating the ringserve binary")?,
            args: worker_args,
            ring_capacity: args.engine.ring_mib << 20,
            ring_prefix: String::new(),
            tensor_parallel_size: tp,
            gpus: args.gpus,
            heartbeat_timeout: args.scale.heartbeat_timeout()?,
        },
        admission: AdmissionLimits {
            max_in_flight: args.max_in_flight,
            max_queued_prompt_tokens: args.max_queued_prompt_tokens,
        },
        drain_timeout: Duration::from_secs_f64(args.drain_timeout.max(0.0)),
        failover_timeout: Duration::from_secs_f64(args.failover_timeout.max(0.0)),
        name: args.scale.name.clone(),
        shm_prefix: args.scale.shm_prefix()?,
        affinity: args.scale.affinity()?,
        security,
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(gateway::server::run(config))?;
    Ok(())
}

pub fn worker(mut args: WorkerArgs) -> anyhow::Result<()> {
    args.engine.check()?;
    args.model = crate::resolve_model(&args.model, args.gguf_file.as_deref())?;
    let e = &args.engine;
    let opts = WorkerOptions {
        model: args.model.clone(),
        device: e.device,
        backend: e.backend_options()?,
        engine: EngineConfig {
            max_num_batched_tokens: e.max_num_batched_tokens,
            max_prefill_tokens_while_decoding: e.max_prefill_tokens_while_decoding,
            max_num_seqs: e.max_num_seqs,
            max_model_len: e.max_model_len,
            enable_prefix_caching: e.enable_prefix_caching,
            seed: args.seed,
            async_scheduling: e.async_scheduling,
        },
        rings: args.rings.clone(),
        ring_capacity: e.ring_mib << 20,
        tp: TpOptions {
            world: e.tensor_parallel_size,
            rank: args.rank,
            group: args.tp_group,
            collectives: e.tp_collectives,
        },
        lifecycle: args.life.lifecycle()?,
    };
    // SIGTERM drains (finish the streams, tell the gateway, exit 0) instead of killing.
    worker::serve::lifecycle::install_sigterm_drain().context("installing the SIGTERM handler")?;
    let stop = Arc::new(AtomicBool::new(false));
    let exit = match &args.join {
        Some(name) => run_joined_worker(&opts, name, stop)
            .with_context(|| format!("worker for {} joining {name:?}", args.model.display()))?,
        None => run_worker(&opts, stop)
            .with_context(|| format!("worker for {}", args.model.display()))?,
    };
    tracing::info!(?exit, "worker stopped");
    Ok(())
}

/// `ringserve client`: stream a completion to the terminal.
#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The prompt (a user message with --chat; token ids with --token-ids).
    pub prompt: String,
    /// Server address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// Send the prompt as a chat message (rendered with the model's chat template).
    #[arg(long)]
    pub chat: bool,
    /// A system message (with --chat).
    #[arg(long)]
    pub system: Option<String>,
    /// The prompt is token ids, comma- or space-separated.
    #[arg(long)]
    pub token_ids: bool,
    /// Print generated token ids instead of text.
    #[arg(long)]
    pub print_ids: bool,
    /// Tokens to generate at most (the stream also ends at the model's end-of-sequence token).
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// Sampling temperature (0: greedy; default 1).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Nucleus sampling threshold.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Top-k sampling (0: off).
    #[arg(long, default_value_t = 0)]
    pub top_k: i32,
    /// Seed of the request's random stream.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop strings (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub security: ClientSecurityFlags,
}

pub fn client(args: ClientArgs) -> anyhow::Result<()> {
    let addr = gateway::connect::with_scheme(&args.addr);
    let opts = gateway::client::ClientOptions {
        addr,
        prompt: args.prompt,
        chat: args.chat,
        system: args.system,
        token_ids: args.token_ids,
        max_tokens: Some(args.max_tokens),
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        stop: args.stop,
        print_ids: args.print_ids,
        security: args.security.security(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut out = std::io::stdout().lock();
    rt.block_on(gateway::client::run(&opts, &mut out))?;
    Ok(())
}

/// `ringserve bench serve`: load a running server and report latency and throughput.
#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// Server address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// Requests to send (per run).
    #[arg(long, default_value_t = 200)]
    pub num_requests: usize,
    /// Closed loop: clients in flight (ignored with --request-rate).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Open loop: Poisson arrivals per second.
    #[arg(long)]
    pub request_rate: Option<f64>,
    /// Mean prompt length (random token ids).
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Mean output length (generated to the end: EOS is ignored).
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Lengths are uniform in len × [1 - r, 1 + r].
    #[arg(long, default_value_t = 0.0)]
    pub range_ratio: f64,
    /// Seed of prompts, lengths and arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// gRPC connections to spread the streams over.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Send the requests through the OpenAI-compatible HTTP API at this host:port (streamed
    /// `/v1/completions`, one keep-alive connection per client) instead of gRPC; `--addr` still
    /// answers ModelInfo.
    #[arg(long)]
    pub openai_addr: Option<String>,
    /// With --openai-addr: HTTP/2 (cleartext, prior knowledge), the clients sharing
    /// --connections connections as the gRPC clients do, instead of one HTTP/1.1 connection each.
    #[arg(long, requires = "openai_addr")]
    pub openai_http2: bool,
    /// Write the report (or the sweep's reports) as JSON to this file.
    #[arg(long)]
    pub result_file: Option<PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Run once per request rate (open loop, comma-separated, e.g. 1,2,4,8) and draw the
    /// throughput-latency curve.
    #[arg(long, value_delimiter = ',')]
    pub sweep: Vec<f64>,
    /// Where --sweep draws its PNG.
    #[arg(long, default_value = "sweep.png")]
    pub plot: PathBuf,
    #[command(flatten)]
    pub security: ClientSecurityFlags,
}

pub fn bench_serve(args: BenchServeArgs) -> anyhow::Result<()> {
    let addr = gateway::connect::with_scheme(&args.addr);
    let opts = gateway::bench::BenchOptions {
        addr,
        num_requests: args.num_requests,
        concurrency: args.concurrency,
        request_rate: args.request_rate,
        input_len: args.input_len,
        output_len: args.output_len,
        range_ratio: args.range_ratio,
        seed: args.seed,
        connections: args.connections,
        progress: !args.quiet,
        openai_addr: args.openai_addr.clone(),
        openai_http2: args.openai_http2,
        security: args.security.security(),
    };
    let rt = tokio::runtime::Runtime::new()?;
    if !args.sweep.is_empty() {
        let mut reports = Vec::new();
        for &rate in &args.sweep {
            let run = gateway::bench::BenchOptions {
                request_rate: Some(rate),
                ..opts.clone()
            };
            let report = rt.block_on(gateway::bench::run(&run))?;
            print!("{report}");
            reports.push(report);
        }
        if let Some(path) = &args.result_file {
            std::fs::write(path, serde_json::to_string_pretty(&reports)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        let title = format!(
            "ringserve: throughput vs latency ({} in / {} out tokens)",
            args.input_len, args.output_len
        );
        let systems = [gateway::bench_plot::System {
            name: "ringserve",
            runs: &reports,
        }];
        gateway::bench_plot::plot_compare(&systems, &title, &args.plot)?;
        eprintln!("wrote {}", args.plot.display());
        return Ok(());
    }
    let report = rt.block_on(gateway::bench::run(&opts))?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.result_file {
        std::fs::write(path, &json).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{report}");
    }
    Ok(())
}

/// `bench plot`: the files to draw.
#[derive(Args, Debug, Clone)]
pub struct BenchPlotArgs {
    /// ringserve's runs: `bench serve --sweep … --result-file FILE` (a JSON list of reports), or
    /// one report per file; comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ringserve: Vec<PathBuf>,
    /// The peer's runs: `vllm bench serve --save-result` JSON files, one per request rate;
    /// comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub vllm: Vec<PathBuf>,
    /// Title of the plot.
    #[arg(long, default_value = "output throughput against latency")]
    pub title: String,
    /// The PNG to write.
    #[arg(long, default_value = "compare.png")]
    pub out: PathBuf,
}

pub fn bench_plot(args: BenchPlotArgs) -> anyhow::Result<()> {
    use gateway::bench::BenchReport;
    let read = |path: &PathBuf| -> anyhow::Result<serde_json::Value> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))
    };
    let mut ours: Vec<BenchReport> = Vec::new();
    for path in &args.ringserve {
        let v = read(path)?;
        let runs = if v.is_array() {
            v
        } else {
            serde_json::Value::Array(vec![v])
        };
        ours.extend(
            serde_json::from_value::<Vec<BenchReport>>(runs)
                .with_context(|| format!("{}: not `bench serve` reports", path.display()))?,
        );
    }
    let mut peer = Vec::new();
    for path in &args.vllm {
        let report = gateway::bench_plot::report_from_vllm(&read(path)?)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        peer.push(report);
    }
    for r in ours
        .iter()
        .map(|r| ("ringserve", r))
        .chain(peer.iter().map(|r| ("vLLM", r)))
    {
        println!(
            "{:<9} rate {:>5}  {:>7.0} output tok/s  TTFT p50 {:>7.1} p99 {:>7.1} ms  ITL p50 {:>6.2} p99 {:>7.2} ms",
            r.0,
            r.1.request_rate.map_or("-".into(), |x| x.to_string()),
            r.1.output_tokens_per_s,
            r.1.ttft_ms.p50,
            r.1.ttft_ms.p99,
            r.1.itl_ms.p50,
            r.1.itl_ms.p99
        );
    }
    let mut systems = vec![gateway::bench_plot::System {
        name: "ringserve",
        runs: &ours,
    }];
    if !peer.is_empty() {
        systems.push(gateway::bench_plot::System {
            name: "vLLM",
            runs: &peer,
        });
    }
    gateway::bench_plot::plot_compare(&systems, &args.title, &args.out)?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use worker::backend::ComputeDtype;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        engine: ServingEngineFlags,
    }

    fn parse(args: &[&str]) -> ServingEngineFlags {
        Flags::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .unwrap()
            .engine
    }

    #[test]
    fn serve_flags_reach_the_worker_backend() {
        let serve = parse(&[
            "--device",
            "cuda:1",
            "--dtype",
            "float32",
            "--enforce-eager",
            "--batch-invariant",
            "--gpu-memory-utilization",
            "0.5",
            "--quantization",
            "fp8",
            "--kv-cache-dtype",
            "fp8_e4m3",
        ]);
        let args = serve.to_args();
        let worker = parse(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let b = worker.backend_options().unwrap();
        assert_eq!(b, serve.backend_options().unwrap());
        assert_eq!(b.device, Device::Cuda(1));
        assert_eq!(b.dtype, ComputeDtype::Float32);
        assert!(b.enforce_eager && b.batch_invariant);
        assert_eq!(b.gpu_memory_utilization, 0.5);
        assert_eq!(b.quantization, Some(Quantization::Fp8));
        assert_eq!(b.kv_cache_dtype, KvCacheDtype::Fp8E4m3);
        assert_eq!(
            parse(&[]).backend_options().unwrap().kv_cache_dtype,
            KvCacheDtype::Auto
        );
    }

    fn gpus(list: &[&str]) -> Vec<String> {
        list.iter().map(|g| (*g).to_owned()).collect()
    }

    const CPU: WorkerDevice = WorkerDevice::Model(Device::Cpu);
    const CUDA: WorkerDevice = WorkerDevice::Model(Device::Cuda(0));

    #[test]
    fn serve_layouts() {
        assert_eq!(serve_workers(None, 1, CPU, &[]).unwrap(), 1);
        assert_eq!(serve_workers(Some(3), 1, CPU, &[]).unwrap(), 3);
        // One group by default; N must be a multiple of T.
        assert_eq!(serve_workers(None, 2, CPU, &[]).unwrap(), 2);
        assert_eq!(serve_workers(Some(4), 2, CPU, &[]).unwrap(), 4);
        let err = serve_workers(Some(3), 2, CPU, &[]).unwrap_err().to_string();
        assert!(err.contains("--tensor-parallel-size 2"), "{err}");
        let err = serve_workers(Some(0), 1, CPU, &[]).unwrap_err().to_string();
        assert!(err.contains("--workers"), "{err}");
        let err = serve_workers(None, 0, CPU, &[]).unwrap_err().to_string();
        assert!(err.contains("--tensor-parallel-size"), "{err}");
        // One worker per GPU.
        assert_eq!(
            serve_workers(None, 1, CUDA, &gpus(&["0", "1", "2", "3"])).unwrap(),
            4
        );
        assert_eq!(
            serve_workers(Some(2), 1, CUDA, &gpus(&["4", "6"])).unwrap(),
            2
        );
    }

    #[test]
    fn bad_gpu_and_device_combinations_are_refused() {
        let err = |w, tp, device, g: &[&str]| {
            serve_workers(w, tp, device, &gpus(g))
                .unwrap_err()
                .to_string()
        };
        assert!(err(None, 1, CPU, &["0"]).contains("--device cuda"));
        assert!(err(None, 1, WorkerDevice::Null, &["0"]).contains("--device cuda"));
        let e = err(None, 1, WorkerDevice::Model(Device::Cuda(2)), &["0"]);
        assert!(e.contains("cuda:0"), "{e}");
        assert!(err(Some(3), 1, CUDA, &["0", "1"]).contains("--workers 3"));
        assert!(err(None, 1, CUDA, &["0", "0"]).contains("twice"));
        assert!(err(None, 1, CUDA, &["0", ""]).contains("empty"));
        // CUDA tensor parallelism: NCCL needs a GPU per rank; the host path may share one.
        assert_eq!(serve_workers(None, 2, CUDA, &gpus(&["0", "1"])).unwrap(), 2);
        let nccl = TpCollectives::Nccl;
        check_cuda_tp(2, CUDA, nccl, &gpus(&["0", "1"])).unwrap();
        let e = check_cuda_tp(2, CUDA, nccl, &[]).unwrap_err().to_string();
        assert!(e.contains("--gpus") && e.contains("NCCL"), "{e}");
        check_cuda_tp(2, CUDA, TpCollectives::Host, &[]).unwrap();
        check_cuda_tp(1, CUDA, nccl, &[]).unwrap();
        check_cuda_tp(2, CPU, nccl, &[]).unwrap();
        let e = err(Some(2), 2, WorkerDevice::Null, &[]);
        assert!(e.contains("--device null"), "{e}");
    }

    #[derive(Parser)]
    struct WorkerCli {
        #[command(flatten)]
        worker: WorkerArgs,
    }

    #[test]
    fn worker_tp_flags_parse() {
        let w = WorkerCli::try_parse_from([
            "x",
            "--model",
            "m",
            "--tp",
            "2",
            "--rank",
            "1",
            "--tp-group",
            "g",
        ])
        .unwrap()
        .worker;
        assert_eq!(w.engine.tensor_parallel_size, 2);
        assert_eq!(w.rank, 1);
        assert_eq!(w.tp_group.as_deref(), Some("g"));
        assert_eq!(w.rings, None);
        // `serve` does not forward the size: the supervisor adds it per rank.
        assert!(!w.engine.to_args().iter().any(|a| a.contains("tensor")));
    }

    #[test]
    fn cuda_defaults_to_bf16_and_graphs() {
        let b = parse(&["--device", "cuda"]).to_args();
        let b = parse(&b.iter().map(String::as_str).collect::<Vec<_>>())
            .backend_options()
            .unwrap();
        assert_eq!(b.dtype, ComputeDtype::BFloat16);
        assert!(!b.enforce_eager && !b.batch_invariant);
        let cpu = parse(&[]).backend_options().unwrap();
        assert_eq!(cpu.dtype, ComputeDtype::Float32);
    }
}
