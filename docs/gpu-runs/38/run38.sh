#!/usr/bin/env bash
# Run 38: decodes that share prefix blocks read them once (issue 24's shared-prefix job).
# Calls on one warm H200, each carrying .gpu38/peer (../shared/peers/vllm without its parts and
# wheels) and one part of vLLM as .peer-vllm/carry/…, plus:
#   a (+ part00, .gpu38/ringserve.tar.xz: ringserve built with --features cuda, stripped): the
#      random 8B model and the job (scripts/shared_prefix_job.py); `ringserve generate` on the job
#      with split sharing on, off, on (RINGSERVE_CUDA_DECODE_SHARE), per-step debug lines summed by
#      scripts/step_log_summary.py, and the three outputs compared token for token
#   b (+ part01, .gpu38/tests.tar.xz: the cuda_kernels and cuda_backend tests): vLLM installed;
#      vLLM's LLM.generate on the job (scripts/vllm_generate_job.py); ringserve on the job again,
#      sharing on three times and off once; then every cuda_kernels and cuda_backend test
#   c (.gpu38/ringserve.tar.xz of the build with `bench engine`'s peer-method prefill column; no
#      vLLM): bf16 prefill and long-context decode by step budget (--max-num-batched-tokens 8,192,
#      16,384, 32,768: vLLM's offline default is 16,384), and ncu's per-kernel time of one prefill
#      step (16 × 512, 2 × 3,900 tokens; FP8 16 × 512)
#   d (+ part00, .gpu38/tests.tar.xz of the build with rope_kv_write a warp a head (sin/cos once a
#      token) and the FP8 gate/up product's scaling folded into SiLU·mul's quantization:
#      cuda_kernels, cuda_backend, cuda_fp8): every test of the three; the model made
#   e (+ part01, .gpu38/ringserve.tar.xz of that build): vLLM installed; vLLM bf16 at 512-token
#      prompts (batches 1, 128) and at 3,900 (32, 64); ringserve bf16 the same, --peer-decode
#   f: vLLM --quantization fp8 (batches 1, 128) and ringserve --quantization fp8, --peer-decode
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b38; P=.gpu38/peer; M=/tmp/llama8b; J=/tmp/spj
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B
for t in .gpu38/*.tar.xz; do [ -f "$t" ] && tar xJf "$t" -C $B; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-38 FIXTURES_DIR=$PWD/tests/fixtures
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
install_vllm() {
  (mkdir -p /tmp/vllm_parts; cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $P/install.sh) > "$OUT/install_$1.log" 2>&1
  echo "vllm install rc=$? ($(tail -1 "$OUT/install_$1.log"))"
}
job() {  # tag share(0|1)
  RINGSERVE_CUDA_DECODE_SHARE=$2 RUST_LOG=worker=debug $B/ringserve generate --model $M --device cuda \
    --max-model-len 4096 --input $J/job.jsonl --output $J/out_$1.jsonl --quiet 2> $OUT/gen_$1.log > /dev/null
  echo "== $1 (share $2): $(grep -E 'requests,' $OUT/gen_$1.log | tail -1)"
  python3 scripts/step_log_summary.py $OUT/gen_$1.log | grep -E "steps,|decode only|bucket" | head -6
}
same() {  # tag tag: the two outputs' token ids equal?
  python3 - $J/out_$1.jsonl $J/out_$2.jsonl <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
key = lambda r: json.dumps(r.get("token_ids") or r.get("output_token_ids") or r.get("text"))
diff = sum(key(x) != key(y) for x, y in zip(a, b))
print(f"{sys.argv[1]} vs {sys.argv[2]}: {len(a)}/{len(b)} requests, {diff} differ")
PY
}
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  install_vllm a &
  python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  python3 scripts/shared_prefix_job.py $J > /dev/null
  wait
  job a1 1; job a2 0; job a3 1
  same a1 a2; same a1 a3
  head -c 300 $J/out_a1.jsonl; echo ;;
b)
  install_vllm b
  PYTHONPATH=/tmp/site timeout 300 python3 scripts/vllm_generate_job.py $M $J/job.json > $OUT/vllm_job.log 2>&1
  echo "vllm rc=$?: $(grep -E 'vllm job:' $OUT/vllm_job.log || tail -5 $OUT/vllm_job.log)"
  job b1 1; job b2 1; job b3 0; job b4 1
  same a1 b1; same b1 b3
  for t in cuda_kernels cuda_backend; do
    timeout 300 $B/$t --include-ignored --test-threads 1 > $OUT/$t.log 2>&1
    echo "$t rc $?: $(grep -E "test result" $OUT/$t.log)"; grep -E "panicked|FAILED|^test .*ok$" $OUT/$t.log | head -30
  done ;;
c)
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1
  E="$B/ringserve bench engine --model $M --device cuda --max-model-len 4096 --output-len 65 --peer-decode"
  for b in 8192 16384 32768; do
    echo "== budget $b" | tee -a $OUT/bench.txt
    timeout 120 $E --max-num-batched-tokens $b --batch-sizes 128 --prompt-lens 512 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
    timeout 200 $E --max-num-batched-tokens $b --batch-sizes 32,64 --prompt-lens 3900 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  done
  N="ncu --clock-control none --cache-control none --csv --page raw --print-units base --metrics gpu__time_duration.sum"
  P="$B/ringserve bench engine --model $M --device cuda --max-model-len 4096 --output-len 1 --no-warmup"
  timeout 150 $N $P --batch-sizes 16 --prompt-lens 512 > $OUT/ncu_512.txt 2>&1; echo "ncu 512 rc $?"
  timeout 150 $N $P --batch-sizes 2 --prompt-lens 3900 > $OUT/ncu_3900.txt 2>&1; echo "ncu 3900 rc $?"
  timeout 150 $N $P --batch-sizes 16 --prompt-lens 512 --quantization fp8 > $OUT/ncu_fp8_512.txt 2>&1; echo "ncu fp8 rc $?"
  for f in $OUT/ncu_*.txt; do python3 scripts/ncu_summary.py $f | head -25; done ;;
d)
  install_vllm d &
  [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 &
  for t in cuda_kernels cuda_backend cuda_fp8; do
    timeout 300 $B/$t --include-ignored --test-threads 1 > $OUT/$t.log 2>&1
    echo "$t rc $?: $(grep -E "test result" $OUT/$t.log)"; grep -E "panicked|FAILED" $OUT/$t.log | head -5
  done
  wait; ls $M ;;
e|f)
  install_vllm $1
  V="timeout 280 python3 $P/bench_vllm.py $M"
  E="$B/ringserve bench engine --model $M --device cuda --max-model-len 4096 --output-len 65 --peer-decode"
  if [ $1 = e ]; then
    PYTHONPATH=/tmp/site $V $OUT/vllm_512.json --batches 128 > $OUT/vllm_512.log 2>&1; echo "vllm 512 rc $?"
    PYTHONPATH=/tmp/site $V $OUT/vllm_3900.json --prompt-len 3900 --batches 32,64 --max-model-len 4096 > $OUT/vllm_3900.log 2>&1; echo "vllm 3900 rc $?"
    grep -hE "prefill|decode|batch1" $OUT/vllm_512.log $OUT/vllm_3900.log | grep -v Warn | tail -12
    timeout 100 $E --batch-sizes 1,128 --prompt-lens 512 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
    timeout 200 $E --batch-sizes 32,64 --prompt-lens 3900 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  else
    PYTHONPATH=/tmp/site $V $OUT/vllm_fp8.json --batches 128 --quantization fp8 > $OUT/vllm_fp8.log 2>&1; echo "vllm fp8 rc $?"
    grep -hE "prefill|decode|batch1" $OUT/vllm_fp8.log | grep -v Warn | tail -6
    timeout 150 $E --batch-sizes 1,128 --prompt-lens 512 --quantization fp8 2>>$OUT/bench.err | grep -E "^\| [0-9]" | tee -a $OUT/bench.txt
  fi ;;
esac
