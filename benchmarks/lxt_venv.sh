#!/usr/bin/env bash
# Build the virtual environment that runs lxt 2.1 (the AttnLRP authors' library) for the agreement test
# tests/explain/test_lxt_agreement.py and benchmarks/bench_lrp.py. lxt 2.1 is written for transformers 4.x
# (attnaudit's venv has transformers 5), so it gets its own environment. `--no-deps`: a plain
# `pip install lxt` pulls a CUDA torch, torchvision, bitsandbytes, open_clip_torch and zennit, none of
# which lxt.efficient needs. Never run from `make test`.
# Usage: benchmarks/lxt_venv.sh DIR   (python3.11 on PATH, or PYTHON=/path/to/python3.11)
set -euo pipefail
dir="${1:?usage: benchmarks/lxt_venv.sh DIR}"
"${PYTHON:-python3.11}" -m venv "$dir"
"$dir/bin/pip" install torch==2.13.0
"$dir/bin/pip" install "transformers==4.57.6" accelerate safetensors numpy
"$dir/bin/pip" install --no-deps lxt==2.1
"$dir/bin/python" -c "import transformers, torch; print('lxt venv ready: transformers', transformers.__version__, 'torch', torch.__version__)"
