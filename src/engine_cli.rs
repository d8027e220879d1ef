//! Flags of the engine's subcommands: `generate` and `bench engine`.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use worker::backend::switches::KernelSwitches;
use worker::backend::{BackendOptions, ComputeDtype, Device};
use worker::engine::EngineConfig;
use worker::generate::{self, OnError};
use worker::open::open_model;
use worker::quant::Quantization;
use worker::quant::kv::KvCacheDtype;

/// Engine and KV cache knobs (vLLM's flag names).
#[derive(Args, Debug, Clone)]
pub struct EngineFlags {
    /// Where the model runs: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Tokens computed per step at most (prefill chunks + decodes).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Prompt tokens a step may carry when it also decodes running sequences (default: up to
    /// --max-num-batched-tokens); bounds the streams' inter-token latency under load.
    #[arg(long)]
    pub max_prefill_tokens_while_decoding: Option<usize>,
    /// Sequences running at once at most.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Context length limit (default: the model's, capped by the KV cache).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Reuse KV blocks of equal prompt prefixes across requests (`--enable-prefix-caching false`
    /// or `--no-enable-prefix-caching` turns it off).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off.
    #[arg(long, conflicts_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV blocks to allocate (default: sized from memory).
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,
    /// Fraction of GPU memory to use (CUDA).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f32,
    /// Seed for requests that bring none (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Compute type of the CUDA backend (default bfloat16; the CPU backend is always float32).
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
    /// busy; the same tokens. On by default here, as in vLLM's offline `LLM` (decode steps 1-2 %
    /// shorter); `serve` leaves it off for TTFT. CUDA, steps whose requests sample on the device.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub async_scheduling: bool,
}

/// `--dtype` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeFlag {
    Float32,
    Bfloat16,
}

/// The compute type `--dtype` asks for, or the device's default (CUDA: bfloat16, CPU: float32).
pub fn compute_dtype(flag: Option<DtypeFlag>, device: Device) -> ComputeDtype {
    match (flag, device) {
        (Some(DtypeFlag::Float32), _) | (None, Device::Cpu) => ComputeDtype::Float32,
        (Some(DtypeFlag::Bfloat16), _) | (None, Device::Cuda(_)) => ComputeDtype::BFloat16,
    }
}

impl EngineFlags {
    /// The backend these flags describe; the CUDA kernel switches come from the environment
    /// ([`KernelSwitches::from_env`]).
    pub fn backend_options(&self) -> anyhow::Result<BackendOptions> {
        Ok(BackendOptions {
            device: self.device,
            block_size: self.block_size,
            num_kv_blocks: self.num_kv_blocks,
            gpu_memory_utilization: self.gpu_memory_utilization,
            dtype: compute_dtype(self.dtype, self.device),
            enforce_eager: self.enforce_eager,
            batch_invariant: self.batch_invariant,
            kernels: KernelSwitches::from_env()?,
            quantization: self.quantization,
            kv_cache_dtype: self.kv_cache_dtype,
        })
    }

    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_prefill_tokens_while_decoding: self.max_prefill_tokens_while_decoding,
            max_num_seqs: self.max_num_seqs,
            max_model_len: self.max_model_len,
            enable_prefix_caching: self.enable_prefix_caching && !self.no_enable_prefix_caching,
            seed: self.seed,
            async_scheduling: self.async_scheduling,
        }
    }
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum OnErrorFlag {
    /// Report a bad line and go on without it.
    Skip,
    /// Stop at the first bad line, before generating anything.
    Fail,
}

/// `ringserve generate`: offline batch generation over JSONL.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A HuggingFace model folder, a `.gguf` file or a Hub id (as `serve --model`).
    #[arg(long)]
    pub model: PathBuf,
    /// The GGUF file of a Hub repository given as --model.
    #[arg(long)]
    pub gguf_file: Option<String>,
    /// Requests, one JSON object per line.
    #[arg(long)]
    pub input: PathBuf,
    /// Results, one JSON object per line, in input order.
    #[arg(long)]
    pub output: PathBuf,
    /// What a bad input line does.
    #[arg(long, value_enum, default_value = "skip")]
    pub on_error: OnErrorFlag,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub engine: EngineFlags,
}

pub fn generate(mut args: GenerateArgs) -> anyhow::Result<()> {
    args.model = crate::resolve_model(&args.model, args.gguf_file.as_deref())?;
    let mut opened = open_model(
        &args.model,
        &args.engine.backend_options()?,
        args.engine.engine_config(),
    )
    .with_context(|| format!("opening {}", args.model.display()))?;
    let input =
        File::open(&args.input).with_context(|| format!("opening {}", args.input.display()))?;
    let on_error = match args.on_error {
        OnErrorFlag::Skip => OnError::Skip,
        OnErrorFlag::Fail => OnError::Fail,
    };
    let prepared = generate::prepare(
        &mut opened.engine,
        opened.tokenizer.as_ref(),
        BufReader::new(input),
        on_error,
    )
    .with_context(|| format!("reading {}", args.input.display()))?;
    for bad in &prepared.skipped {
        eprintln!("{}: skipped {bad}", args.input.display());
    }
    let file = File::create(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    let mut out = BufWriter::new(file);
    let summary = generate::run(
        &mut opened.engine,
        opened.tokenizer.as_ref(),
        &prepared,
        &mut out,
        !args.quiet,
    )?;
    let skipped = match prepared.skipped.len() {
        0 => String::new(),
        n => format!(" ({n} bad lines skipped)"),
    };
    eprintln!("{summary}{skipped}");
    Ok(())
}

/// `ringserve bench engine`: offline engine throughput, prefill and decode separately.
#[derive(Args, Debug)]
pub struct BenchEngineArgs {
    /// A HuggingFace model folder, a `.gguf` file or a Hub id (default: the built-in demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The GGUF file of a Hub repository given as --model.
    #[arg(long)]
    pub gguf_file: Option<String>,
    /// Requests per batch (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 32])]
    pub batch_sizes: Vec<usize>,
    /// Prompt lengths in tokens (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [128, 512])]
    pub prompt_lens: Vec<usize>,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 32)]
    pub output_len: usize,
    /// Measure each point's first run (by default each point first runs once untimed, so that
    /// one-time costs such as CUDA-graph captures stay out of the step times).
    #[arg(long)]
    pub no_warmup: bool,
    /// Also run each point with one output token and give decode tokens/s as the vLLM peer script
    /// does: batch × (output_len − 1) / (t(output_len) − t(1)), whole-batch wall times; and prefill
    /// tokens/s as it does, batch × prompt_len / t(1).
    #[arg(long)]
    pub peer_decode: bool,
    #[command(flatten)]
    pub engine: EngineFlags,
}

pub fn bench_engine(args: BenchEngineArgs) -> anyhow::Result<()> {
    let mut config = args.engine.engine_config();
    // Distinct prompts never hit the cache; turning it off keeps the numbers about compute.
    config.enable_prefix_caching = false;
    let model = match &args.model {
        Some(dir) => crate::resolve_model(dir, args.gguf_file.as_deref())?,
        None => worker::demo::cached_demo_model_dir().context("preparing the demo model")?,
    };
    let mut opened = open_model(&model, &args.engine.backend_options()?, config)
        .with_context(|| format!("opening {}", model.display()))?;
    let stats = opened.engine.stats();
    println!(
        "engine bench: {} on {}, {} KV blocks of {} tokens, max_num_batched_tokens {}",
        model.display(),
        opened.engine.backend_name(),
        stats.kv_blocks_total,
        args.engine.block_size,
        args.engine.max_num_batched_tokens
    );
    println!("{}", worker::bench::MARKDOWN_HEADER);
    let bench = worker::bench::BenchConfig {
        batch_sizes: args.batch_sizes,
        prompt_lens: args.prompt_lens,
        output_len: args.output_len,
        warmup: !args.no_warmup,
        peer_decode: args.peer_decode,
    };
    worker::bench::run_bench(&mut opened.engine, &bench, |row| {
        println!("{}", worker::bench::markdown_row(row))
    })?;
    Ok(())
}
