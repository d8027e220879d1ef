"""vLLM's log-probabilities on the prompts of a `cuda_bench accuracy` decode-path dump, for
`scripts/accuracy_vs_peer.py`: at every position of every prompt, the top-N log-probabilities of
the raw distribution (prompt logprobs for positions 0..L-2, the one generated token's logprobs for
position L-1). Run where vLLM is installed (`../shared/peers/vllm/`, PYTHONPATH=/tmp/site).

usage: vllm_logprobs.py MODEL_DIR PROMPTS_JSON OUT_JSON [--quantization fp8] [--kv-cache-dtype fp8]
       [--compiled]
OUT_JSON: {"config": {...}, "rows": [[{token_id: logprob, ...} for each position] for each prompt]}
(row p, position j: the distribution of the token after prompt p's first j + 1 tokens, the same
position as cuda_bench's logits row)."""
import argparse, json, os, time

os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

p = argparse.ArgumentParser()
p.add_argument("model_dir")
p.add_argument("prompts_json")
p.add_argument("out_json")
p.add_argument("--quantization", default=None)
p.add_argument("--kv-cache-dtype", default="auto")
p.add_argument("--top", type=int, default=20)
p.add_argument("--compiled", action="store_true", help="torch.compile and CUDA graphs (default: eager; the same kernels)")
a = p.parse_args()

from vllm import LLM, SamplingParams  # noqa: E402

prompts = json.load(open(a.prompts_json))
t0 = time.time()
llm = LLM(model=a.model_dir, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=2048,
          gpu_memory_utilization=0.85, enable_prefix_caching=False, seed=0,
          quantization=a.quantization, kv_cache_dtype=a.kv_cache_dtype, max_logprobs=a.top,
          enforce_eager=not a.compiled)
init_s = time.time() - t0
sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False,
                    prompt_logprobs=a.top, logprobs=a.top)
outs = llm.generate([{"prompt_token_ids": pr} for pr in prompts], sp, use_tqdm=False)
rows = []
for pr, o in zip(prompts, outs):
    plp = o.prompt_logprobs  # entry i: the distribution that predicted prompt token i (0: None)
    row = [{int(t): float(lp.logprob) for t, lp in plp[j + 1].items()} for j in range(len(pr) - 1)]
    row.append({int(t): float(lp.logprob) for t, lp in o.outputs[0].logprobs[0].items()})
    rows.append(row)
json.dump({"config": {"quantization": a.quantization, "kv_cache_dtype": a.kv_cache_dtype,
                      "top": a.top, "init_s": init_s}, "rows": rows}, open(a.out_json, "w"))
print(f"vllm logprobs: {len(rows)} prompts x {len(rows[0])} positions, init {init_s:.0f} s", flush=True)
