#!/usr/bin/env bash
# Run 49: the FP8 MLP's SiLU·mul inside its two tile GEMVs at one and two rows (fp8_silu), then
# issue 18's batch-1 / decode / prefill ratios and its serving goal beside vLLM 0.26 FP8, on one
# machine kept warm between calls. .gpu49/new.tar.xz: ringserve, cuda_bench and the test binaries
# (built with --features cuda, stripped); .gpu49/peer: ../shared/peers/vllm without its parts.
#   a: carry .gpu49/new.tar.xz .gpu49/peer: the 8B model; the GPU tests; fused against unfused
#      (RINGSERVE_CUDA_FUSE_SILU=1/0, one binary) in cuda_bench decode and bench engine, alternating
#   b: carry .peer-vllm/carry/vllm-site.tar.xz.part00: part 00 stashed; the vLLM tokenizer
#   c: carry .peer-vllm/carry/vllm-site.tar.xz.part01 .gpu49/peer: vLLM installed; ringserve FP8 /
#      vLLM FP8 / ringserve FP8 (bench engine --peer-decode and bench_vllm.py)
#   d: serving, vllm bench serve 512 -> 128 at 128 and 1 clients: ringserve serve --quantization fp8,
#      then vllm serve --quantization fp8
#   e: again at 128 clients: ringserve (default, and prefill chunks capped at 1,024 tokens while
#      streams decode), vLLM, ringserve
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=/tmp/b49; M=/tmp/llama8b; TOK=/tmp/vllm_tok; P=/tmp/peer49; R=/tmp/r49
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" $B $R
[ -d $P ] || { [ -d .gpu49/peer ] && cp -r .gpu49/peer $P; }
[ -f .gpu49/new.tar.xz ] && tar xJf .gpu49/new.tar.xz -C $B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-49 FIXTURES_DIR=$PWD/tests/fixtures
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
install_vllm() {
  (mkdir -p /tmp/vllm_parts; cp .peer-vllm/carry/vllm-site.tar.xz.part* /tmp/vllm_parts/ 2>/dev/null; bash $P/install.sh) > "$OUT/install_$1.log" 2>&1
  echo "vllm install rc=$? ($(tail -1 "$OUT/install_$1.log"))"
}
E="$B/ringserve bench engine --model $M --device cuda --output-len 65 --peer-decode --prompt-lens 512"
ours() {  # tag, flags...
  local tag=$1; shift
  timeout 150 $E "$@" 2>>$OUT/${tag}_bench.err | grep -E "^\| [0-9]" | sed "s/^/$tag /" | tee -a $OUT/bench.txt
}
peer() {  # tag, flags...
  local tag=$1; shift
  PYTHONPATH=/tmp/site timeout 240 python3 $P/bench_vllm.py $M $OUT/vllm_$tag.json --batches 128,256 "$@" > $OUT/vllm_$tag.log 2>&1; echo "vllm $tag rc $?"
  grep -hE "prefill|decode|batch1" $OUT/vllm_$tag.log | grep -v Warn | tail -8
}
health() { python3 -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2).status == 200 else 1)" 2>/dev/null; }
VLLM=(env PYTHONPATH=/tmp/site python3 -m vllm.entrypoints.cli.main)
serve_up() {  # tag, flags...
  local tag=$1; shift
  $B/ringserve serve --model $M --device cuda --max-model-len 2048 --enable-prefix-caching false \
    --addr 127.0.0.1:50062 --http-addr 127.0.0.1:8012 --metrics-addr 127.0.0.1:9092 "$@" > "$R/serve_$tag.out" 2> "$R/serve_$tag.log" &
  S=$!; local t0=$(date +%s)
  until health 8012; do sleep 0.5; kill -0 $S 2>/dev/null || { tail -20 "$R/serve_$tag.log"; return 2; }; done
  echo "ringserve $tag ($*) healthy after $(( $(date +%s) - t0 )) s"
}
serve_down() { kill $S; wait $S 2>/dev/null; sleep 1; }
vllm_bench() {  # port name concurrency num_prompts
  "${VLLM[@]}" bench serve --backend openai --base-url "http://127.0.0.1:$1" --model $M \
    --tokenizer $TOK --dataset-name random --random-input-len 512 --random-output-len 128 \
    --num-prompts "$4" --max-concurrency "$3" --ignore-eos --seed 0 --num-warmups 0 \
    --save-result --result-dir "$R" --result-filename "$2.json" --disable-tqdm > "$R/$2.log" 2>&1
  echo "== vllm bench serve, $2"; grep -E "Successful|duration|Output token throughput|Mean TTFT|Median TTFT|P99 TTFT|Mean TPOT|Median ITL|P99 ITL" "$R/$2.log"
}
vllm_up() {  # extra flags...
  "${VLLM[@]}" serve $M --tokenizer $TOK --dtype bfloat16 --max-model-len 2048 \
    --gpu-memory-utilization 0.85 --no-enable-prefix-caching --seed 0 \
    --host 127.0.0.1 --port 8011 "$@" > "$R/vllm_server.log" 2>&1 &
  V=$!; local t0=$(date +%s)
  until health 8011; do sleep 2; kill -0 $V || { tail -30 "$R/vllm_server.log"; return 2; }; [ $(( $(date +%s) - t0 )) -gt 300 ] && { echo "vllm not healthy"; kill $V; return 2; }; done
  echo "vllm serve $* healthy after $(( $(date +%s) - t0 )) s"
}
vllm_down() { kill $V; sleep 5; kill -9 $V 2>/dev/null; wait $V 2>/dev/null; sleep 3; }
case "$1" in
a)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  timeout 300 $B/cuda_kernels --include-ignored --test-threads=1 > $OUT/a_kernels.log 2>&1; echo "cuda_kernels rc=$?"
  grep -E "test result|panicked|FAILED|SiLU·mul pair" $OUT/a_kernels.log | head -20
  timeout 300 $B/cuda_fp8 --include-ignored --test-threads=1 > $OUT/a_fp8.log 2>&1; echo "cuda_fp8 rc=$?"
  grep -E "test result|panicked|FAILED|fused FP8 SiLU" $OUT/a_fp8.log | head
  timeout 200 $B/cuda_backend --include-ignored --test-threads=1 > $OUT/a_backend.log 2>&1; echo "cuda_backend rc=$?"
  grep -E "test result|panicked|FAILED" $OUT/a_backend.log | head
  wait
  cat $M/*.safetensors > /dev/null
  for round in 1 2; do for f in 1 0; do
    echo "fuse_silu=$f: $(RINGSERVE_CUDA_FUSE_SILU=$f timeout 100 $B/cuda_bench decode $M 1,2,8 512 40 --quantization=fp8 2>&1 | grep 'decode batch' | tr '\n' ' ')" | tee -a $OUT/a_timeline.txt
  done; done
  for f in 1 0 1 0; do RINGSERVE_CUDA_FUSE_SILU=$f ours silu$f --quantization fp8 --batch-sizes 1,2; done ;;
b)
  install_vllm b
  mkdir -p $TOK; python3 $P/tokenizer/make_tokenizer.py $TOK --check > "$OUT/tok.log" 2>&1 || { tail -5 "$OUT/tok.log"; exit 1; }
  cp $TOK/tokenizer.json $M/tokenizer.json; echo "tokenizer ok"
  ours fp8 --quantization fp8 --batch-sizes 1,128,256 ;;
c)
  install_vllm c
  ours fp8 --quantization fp8 --batch-sizes 1,128,256
  peer fp8 --quantization fp8
  ours fp8 --quantization fp8 --batch-sizes 1,128,256 ;;
d)
  serve_up fp8 --quantization fp8 && { vllm_bench 8012 rs_fp8_c128 128 640; vllm_bench 8012 rs_fp8_c1 1 8; serve_down; }
  vllm_up --quantization fp8 || exit 2
  vllm_bench 8011 vllm_fp8_c128 128 640
  vllm_bench 8011 vllm_fp8_c1 1 8
  vllm_down
  tar czf "$OUT/r49d.tgz" -C $R --exclude='*.out' . ;;
e)
  serve_up fp8b --quantization fp8 && { vllm_bench 8012 rs_fp8b_c128 128 640; serve_down; }
  serve_up fp8cap --quantization fp8 --max-prefill-tokens-while-decoding 1024 && { vllm_bench 8012 rs_fp8cap_c128 128 640; serve_down; }
  vllm_up --quantization fp8 || exit 2
  vllm_bench 8011 vllm_fp8b_c128 128 640
  vllm_down
  serve_up fp8c --quantization fp8 && { vllm_bench 8012 rs_fp8c_c128 128 640; serve_down; }
  tar czf "$OUT/r49e.tgz" -C $R --exclude='*.out' . ;;
esac
# f (after the pair was limited to one row): carry .gpu49/tests.tar.xz: that commit's cuda_kernels
#   and cuda_fp8
if [ "$1" = f ]; then
  mkdir -p /tmp/t49; tar xJf .gpu49/tests.tar.xz -C /tmp/t49
  nvidia-smi --query-gpu=name --format=csv,noheader
  for t in cuda_kernels cuda_fp8; do
    timeout 300 /tmp/t49/$t --include-ignored --test-threads=1 > $OUT/f_$t.log 2>&1; echo "$t rc=$?"
    grep -E "test result|panicked|FAILED|SiLU" $OUT/f_$t.log | head
  done
fi
# g (the FP8 tuning on disk): carry .gpu49/g.tar.xz (ringserve and the test binaries of that
#   commit): the tests; serve --quantization fp8 started four times: 0 compiles the kernels, the
#   tuning file is removed before 1; time to healthy and the tuning's debug lines
if [ "$1" = g ]; then
  mkdir -p /tmp/g49; tar xJf .gpu49/g.tar.xz -C /tmp/g49
  nvidia-smi --query-gpu=name --format=csv,noheader
  ( [ -f $M/config.json ] || python3 scripts/make_random_llama8b.py $M > $OUT/make_model.log 2>&1 ) &
  for t in cuda_kernels cuda_fp8 cuda_backend; do
    timeout 300 /tmp/g49/$t --include-ignored --test-threads=1 > $OUT/g_$t.log 2>&1; echo "$t rc=$?"
    grep -E "test result|panicked|FAILED|SiLU|disk cache" $OUT/g_$t.log | head
  done
  wait
  B=/tmp/g49; export RINGSERVE_KERNEL_CACHE=/tmp/kc-49g
  for run in 0 1 2 3; do
    [ $run = 1 ] && rm -f /tmp/kc-49g/*.tsv
    t0=$(date +%s.%N)
    RUST_LOG=info,worker::backend::cuda=debug serve_up start$run --quantization fp8 || continue
    t1=$(date +%s.%N)
    echo "start $run: healthy after $(python3 -c "print(round($t1 - $t0, 2))") s; fp8 tuning lines: $(grep -c 'fp8 cuBLASLt tuning' $R/serve_start$run.log), from the cache: $(grep 'fp8 cuBLASLt tuning' $R/serve_start$run.log | grep -c 'from_cache=true'); tuning file lines: $(cat /tmp/kc-49g/*.tsv 2>/dev/null | wc -l)"
    serve_down
  done
  grep -h "fp8 cuBLASLt tuning" $R/serve_start1.log | head -3; grep -h "fp8 cuBLASLt tuning" $R/serve_start2.log | head -3
fi
# h (the device time nearly spent): carry .gpu49/g.tar.xz: the tests of the two changes only
if [ "$1" = h ]; then
  mkdir -p /tmp/g49; tar xJf .gpu49/g.tar.xz -C /tmp/g49
  timeout 80 /tmp/g49/cuda_kernels --include-ignored --test-threads=1 gemm_fp8_matches_cpu fused_fp8_silu 2>&1 | grep -E "^test |test result|panicked|disk cache"
  timeout 40 /tmp/g49/cuda_fp8 --include-ignored fused_fp8_silu 2>&1 | grep -E "^test |test result|panicked"
fi
