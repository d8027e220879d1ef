//! What the engine costs on top of the model: one scheduler step (plan + update) at a steady state
//! of 256 decoding sequences, and the host sampler on a Llama-3-sized (128,256-token) logits row.
//!
//! `cargo bench -p worker --bench engine_overhead`

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;

use worker::kv::SeqId;
use worker::request::Request;
use worker::sampler::{History, SampleRequest, SamplingParams, sample_row};
use worker::scheduler::{Scheduler, SchedulerConfig};

fn scheduler_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("scheduler_step");
    for seqs in [32usize, 256] {
        let mut s = Scheduler::new(SchedulerConfig {
            max_num_batched_tokens: 8192,
            max_prefill_tokens_while_decoding: None,
            max_num_seqs: seqs,
            max_model_len: 4096,
            num_kv_blocks: 1 + seqs * 20,
            block_size: 16,
            enable_prefix_caching: true,
            eos_token_ids: vec![],
        });
        let mut next = 0u64;
        let mut add = |s: &mut Scheduler| {
            let mut req = Request::new(
                SeqId(next),
                (0..128)
                    .map(|i| (i * 7 + next as u32 % 64) % 1000)
                    .collect(),
                64,
            );
            req.ignore_eos = true;
            s.add(req, next);
            next += 1;
        };
        for _ in 0..seqs {
            add(&mut s);
        }
        group.bench_function(BenchmarkId::from_parameter(seqs), |b| {
            b.iter(|| {
                let plan = s.schedule().expect("schedule");
                let n = plan.seqs.iter().filter(|e| e.sample).count();
                let updates = s.update(&plan, &vec![5; n]).expect("update");
                // Keep the batch full: every finished request is replaced.
                for _ in updates.iter().filter(|u| u.finish.is_some()) {
                    add(&mut s);
                }
                black_box(plan.seqs.len())
            })
        });
    }
    group.finish();
}

fn host_sampler(c: &mut Criterion) {
    let vocab = 128_256;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let logits: Vec<f32> = (0..vocab)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 * 20.0 - 10.0
        })
        .collect();
    let output: Vec<u32> = (0..200).map(|i| i * 37).collect();
    let cases = [
        ("greedy", SamplingParams::greedy(), None),
        ("temperature", SamplingParams::default(), None),
        (
            "top_p_0.9",
            SamplingParams {
                top_p: 0.9,
                ..Default::default()
            },
            None,
        ),
        (
            "top_k_50",
            SamplingParams {
                top_k: 50,
                ..Default::default()
            },
            None,
        ),
        (
            "penalties",
            SamplingParams {
                repetition_penalty: 1.1,
                frequency_penalty: 0.3,
                ..Default::default()
            },
            None,
        ),
        ("greedy_logprobs_5", SamplingParams::greedy(), Some(5)),
    ];
    let mut group = c.benchmark_group("host_sample_128k");
    for (name, params, logprobs) in cases {
        group.bench_function(name, |b| {
            let mut i = 0u64;
            b.iter(|| {
                i += 1;
                let req = SampleRequest {
                    params: &params,
                    seed: 7,
                    output_index: i,
                    history: History {
                        prompt: &[1, 2, 3],
                        output: &output,
                    },
                    logprobs,
                    banned: &[],
                    allowed: None,
                };
                black_box(sample_row(black_box(&logits), &req))
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // No plots: the workspace builds plotters without font rendering, which criterion's plots need.
    config = Criterion::default().without_plots();
    targets = scheduler_step, host_sampler
}
criterion_main!(benches);
