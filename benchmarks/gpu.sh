#!/usr/bin/env bash
# Measure the jlearngene ViT training step on a GPU against the chip's measured matmul peak,
# at 32 px (DeiT-Ti and -S, patch 4). The 224-px run (ViT-S/16 and ViT-B/16, bfloat16 and
# float32, against torch eager and torch.compile, the methods' overhead) is
# benchmarks/gpu_224.py; see benchmarks/README.md.
#
#   bash benchmarks/gpu.sh                 # float32 rows + bfloat16 rows, results in benchmarks/results_gpu.json
#   BATCH_SCALE=8 bash benchmarks/gpu.sh   # larger batches (default 8: Ti-12 at 1024, S-12 at 512)
#   QUICK=1 bash benchmarks/gpu.sh         # fewer steps
#   PYTHON=python3.12 bash benchmarks/gpu.sh   # interpreter (default: python3)
#
# Needs a CUDA build of jax in the active environment (`pip install "jax[cuda12]==<the pinned
# jax version>"`). It first checks the model's loss and gradients on the GPU against the host
# CPU (benchmarks/gpu_parity.py; strict float32, TF32 default and bfloat16 differences), then
# runs benchmarks/run.py with GPU-sized settings:
#   * matmul peak measured in float32 AND bfloat16 (square matmuls up to 8192), so the
#     utilisation of the bfloat16 rows can be read against the bfloat16 peak;
#   * the exact float32 model (headline) and an extra bfloat16-compute row per shape
#     (ViTConfig.dtype='bfloat16': parameters stay float32, activations/matmuls in bf16);
#   * torch rows: the reference's model moved to the GPU by benchmarks/torch_on_device.py
#     (TF32 allowed, as in XLA), when torch sees a CUDA device and the reference script is at
#     --torch-ref (default ../shared/bench/torch_vit_reference.py; pass another path after the
#     script's name when that folder is not beside the checkout);
#   * Aux-Net overhead and compile time vs depth as on CPU.
# Note: XLA on GPU computes float32 matmuls with TF32 by default on Ampere and later
# (jax_default_matmul_precision); set JAX_DEFAULT_MATMUL_PRECISION=highest for strict float32.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # works without installing the package

PY=${PYTHON:-python3}
if ! "$PY" -c 'import jax, sys; sys.exit(0 if jax.default_backend() == "gpu" else 1)' 2>/dev/null; then
  echo "gpu.sh: jax does not see a GPU (jax.default_backend() != 'gpu'); install a CUDA build of jax" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv || true

# Keep XLA from grabbing 75% of GPU memory up front so the per-case peak is meaningful.
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}

ARGS=(--torch-device cuda --batch-scale "${BATCH_SCALE:-8}" --dtype bfloat16 --extra-rows dtype
      --peak-sizes 4096,8192 --json "${JSON:-benchmarks/results_gpu.json}")
if [[ -n "${QUICK:-}" ]]; then
  ARGS+=(--quick)
else
  ARGS+=(--steps 20 --warmup 3)
fi
echo "== parity: GPU vs CPU (loss, logits, gradients of Ti-12) =="
parity_rc=0
"$PY" benchmarks/gpu_parity.py || parity_rc=$?
echo "== benchmark =="
"$PY" benchmarks/run.py "${ARGS[@]}" "$@"
if (( parity_rc )); then echo "gpu.sh: the parity check failed (exit $parity_rc)" >&2; exit "$parity_rc"; fi
