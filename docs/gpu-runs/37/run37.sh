#!/usr/bin/env bash
# Run 37: INT4 against an implementation we did not write, and against HF float32 on the 8B shape.
# Calls on one warm H200, each carrying .gpu37/peer (../shared/peers/vllm without its parts), the
# binaries built with --features cuda and stripped (.gpu37/tests.tar.xz: cuda_bench and the cuda_int4
# and cuda_tp tests; .gpu37/ringserve.tar.xz from call b on: with a vLLM part, call a's tree would
# pass the 64 MiB a call carries) and, in a and b, one part of vLLM as .peer-vllm/carry/…:
#   a (+ part00): every cuda_int4 test and cuda_tp's host-collective tests (run 36's call f); the
#      random 8B AWQ checkpoint and its float32 twin (scripts/make_random_awq8b.py); ringserve's AWQ
#      logits (cuda_bench accuracy) against HF float32 and bf16 on the twin (accuracy_vs_hf.py)
#   b (+ part01): vLLM installed; vLLM's logprobs on the AWQ checkpoint; ringserve, vLLM and HF bf16
#      against HF float32 on the twin (accuracy_vs_peer.py); then the twin replaced by the GPTQ
#      (symmetric, what vLLM 0.26 reads) checkpoint's and ringserve's GPTQ logits
#   c: vLLM's logprobs on the GPTQ checkpoint; the same comparison
#   d: speed on the AWQ and GPTQ checkpoints, ringserve bench engine and vLLM's bench_vllm.py
#   e: where the shared-prefix job's time goes (issue 24): ringserve generate with per-step debug
#      lines (scripts/step_log_summary.py), budgets 8,192 and 16,384
#   f (+ part00, the build with cuBLASLt choices cached on disk): the job three times (the first
#      tunes and stores, the others read the choices back)
#   g (+ part01): vLLM installed; the job with vLLM's LLM.generate, then ringserve again
#   h (.gpu37/tests2.tar.xz: cuda_backend and cuda_fp8 of the final build): cuda_backend twice on
#      an empty kernel cache (the second reads back the cuBLASLt choices the first stored), cuda_fp8
#   i (.gpu37/fp8.tar.xz: ringserve, cuda_kernels, cuda_fp8 with the 16-byte FP8 quantizer and
#      SiLU·mul fused with the down product's quantization): the FP8 kernel tests, the FP8 model
#      tests, bench engine --quantization fp8 at batch 1 and 128
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b37; A=/tmp/awq8b; G=/tmp/gptq8b; T=/tmp/int4twin; P=.gpu37/peer; R=/tmp/r37
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B $R
for t in .gpu37/*.tar.xz; do [ -f "$t" ] && tar xJf "$t" -C $B; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-37 FIXTURES_DIR=$PWD/tests/fixtures
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
install_vllm() {
  # a part carried without .gpu37/peer (call f: the tree's 64 MiB) is only stashed for install.sh
  (mkdir -p /tmp/vllm_parts; cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; [ -f $P/install.sh ] && bash $P/install.sh) > "$OUT/install_$1.log" 2>&1
  echo "vllm install rc=$? ($(tail -1 "$OUT/install_$1.log"))"
}
dump() {  # name model: ringserve's logits, decode and prefill paths
  timeout 200 $B/cuda_bench accuracy $2 $R/ours_$1.bin $R/prompts.json > $R/dump_$1.log 2>&1
  echo "ringserve dump $1 rc=$?"; grep -E "start-up|error|Error" $R/dump_$1.log | head -3
}
vllm_lp() {  # name model
  PYTHONPATH=/tmp/site timeout 300 python3 scripts/vllm_logprobs.py $2 $R/prompts.json $R/vllm_$1.json > $R/vllm_lp_$1.log 2>&1
  echo "vllm logprobs $1 rc=$?"; grep -E "Using .* for|quantization|Error|error" $R/vllm_lp_$1.log | grep -v Warning | head -4; tail -1 $R/vllm_lp_$1.log
}
peer() {  # name
  timeout 300 python3 scripts/accuracy_vs_peer.py $T $R/prompts.json $R/acc_peer_$1.json $1=$R/ours_$1.bin:$R/vllm_$1.json 2> $R/acc_peer_$1.err
  echo "accuracy vs peer $1 rc=$?"; grep -vE "Warning|warn" $R/acc_peer_$1.err | tail -2
  cat $R/acc_peer_$1.json
}
engine() {  # tag model batches
  echo "== bench engine $1" | tee -a $OUT/bench.txt
  timeout 200 $B/ringserve bench engine --model $2 --device cuda --batch-sizes $3 --prompt-lens 512 \
    --output-len 64 2>>$OUT/bench.err | tee -a $OUT/bench.txt
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  install_vllm a &
  (time python3 scripts/make_random_awq8b.py $A --twin $T) > $OUT/make_awq.log 2>&1 &
  MK=$!
  timeout 300 $B/cuda_int4 --include-ignored --test-threads 1 --nocapture > $OUT/cuda_int4.log 2>&1
  echo "cuda_int4 rc $?"; grep -E "^test |panicked|test result" $OUT/cuda_int4.log | tail -8
  timeout 200 $B/cuda_tp --include-ignored --test-threads 1 host_collectives_ > $OUT/cuda_tp.log 2>&1
  echo "cuda_tp rc $?"; grep -E "^test |panicked|test result|TP=2 vs TP=1|greedy tokens" $OUT/cuda_tp.log | tail -24
  wait $MK; tail -4 $OUT/make_awq.log; du -sh $A $T; df -h /tmp | tail -1
  dump awq $A
  timeout 300 python3 scripts/accuracy_vs_hf.py $T $R/prompts.json $R/ours_awq.bin $R/acc_hf_awq.json 2> $R/acc_hf_awq.err
  echo "accuracy vs hf (decode path) rc=$?"; grep -vE "Warning|warn" $R/acc_hf_awq.err | tail -2; cat $R/acc_hf_awq.json
  timeout 300 python3 scripts/accuracy_vs_hf.py $T $R/prompts.json.prefill $R/ours_awq.bin.prefill $R/acc_hf_awq_prefill.json 2> $R/acc_hf_awq_p.err
  echo "accuracy vs hf (prefill path) rc=$?"; cat $R/acc_hf_awq_prefill.json
  wait
  cp $R/*.json $OUT/ 2>/dev/null ;;
b)
  install_vllm b
  vllm_lp awq $A
  peer awq
  rm -rf $T
  (time python3 scripts/make_random_awq8b.py $G --format gptq --sym --twin $T) > $OUT/make_gptq.log 2>&1
  tail -2 $OUT/make_gptq.log
  dump gptq $G
  cp $R/*.json $OUT/ 2>/dev/null ;;
c)
  vllm_lp gptq $G
  peer gptq
  cp $R/*.json $OUT/ 2>/dev/null ;;
d)
  engine awq $A 1,64,128
  engine gptq $G 1,128
  for m in awq gptq; do
    d=$A; [ $m = gptq ] && d=$G
    PYTHONPATH=/tmp/site timeout 280 python3 $P/bench_vllm.py $d $R/vllm_bench_$m.json --skip-256 > $R/vllm_bench_$m.log 2>&1
    echo "== vllm $m rc=$?"; grep -E "Using .* for" $R/vllm_bench_$m.log | head -2; tail -4 $R/vllm_bench_$m.log
  done
  cp $R/vllm_bench_*.json $OUT/ ;;
e)
  rm -rf $A $G $T
  M=/tmp/llama8b
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  [ -f /tmp/spj/job.json ] || python3 scripts/shared_prefix_job.py /tmp/spj > /dev/null
  for budget in 8192 16384 8192; do
    RUST_LOG=worker=debug $B/ringserve generate --model $M --device cuda --max-model-len 4096 --max-num-batched-tokens $budget \
      --input /tmp/spj/job.jsonl --output /tmp/spj/out_$budget.jsonl --quiet 2> $OUT/gen_$budget.log > /dev/null
    echo "== budget $budget: $(grep -E 'requests,' $OUT/gen_$budget.log | tail -1)"
    python3 scripts/step_log_summary.py $OUT/gen_$budget.log | head -40
  done ;;
f|g)
  M=/tmp/llama8b
  install_vllm $1 &
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  [ -f /tmp/spj/job.json ] || python3 scripts/shared_prefix_job.py /tmp/spj > /dev/null
  wait
  if [ $1 = g ]; then
    PYTHONPATH=/tmp/site timeout 300 python3 scripts/vllm_generate_job.py $M /tmp/spj/job.json > $OUT/vllm_job.log 2>&1
    echo "vllm rc=$?: $(grep -E 'vllm job:' $OUT/vllm_job.log || tail -5 $OUT/vllm_job.log)"
  fi
  for run in 1 2 3; do
    RUST_LOG=worker=debug $B/ringserve generate --model $M --device cuda --max-model-len 4096 \
      --input /tmp/spj/job.jsonl --output /tmp/spj/out_$run.jsonl --quiet 2> $OUT/gen_$1$run.log > /dev/null
    echo "== run $run: $(grep -E 'requests,' $OUT/gen_$1$run.log | tail -1)"
    python3 scripts/step_log_summary.py $OUT/gen_$1$run.log | grep -E "steps,|captured|bucket"
    grep -E "cached cuBLASLt|could not store" $OUT/gen_$1$run.log | head -3
  done
  ls -la /tmp/kc-37; head -3 /tmp/kc-37/cublaslt-tuning-* ;;
h)
  export RINGSERVE_KERNEL_CACHE=/tmp/kc-37h
  for t in cuda_backend cuda_backend cuda_fp8; do
    timeout 200 $B/$t --include-ignored --test-threads 1 > $OUT/$t.log 2>&1
    echo "$t rc $?: $(grep -E "test result" $OUT/$t.log)"; grep -E "panicked|FAILED" $OUT/$t.log | head -5
    wc -l /tmp/kc-37h/cublaslt-tuning-* 2>/dev/null
  done ;;
i)
  M=/tmp/llama8b
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 &
  timeout 100 $B/cuda_kernels --include-ignored --test-threads 1 --nocapture fp8 fused_silu > $OUT/cuda_kernels.log 2>&1
  echo "cuda_kernels fp8 rc $?: $(grep -E "test result" $OUT/cuda_kernels.log)"; grep -E "^test |panicked|codes" $OUT/cuda_kernels.log | head -20
  timeout 60 $B/cuda_fp8 --include-ignored --test-threads 1 > $OUT/cuda_fp8.log 2>&1
  echo "cuda_fp8 rc $?: $(grep -E "test result" $OUT/cuda_fp8.log)"; grep -E "panicked" $OUT/cuda_fp8.log | head -3
  wait
  timeout 120 $B/ringserve bench engine --model $M --device cuda --quantization fp8 --batch-sizes 1,128 \
    --prompt-lens 512 --output-len 64 2>$OUT/bench.err | tee $OUT/bench.txt ;;
esac
