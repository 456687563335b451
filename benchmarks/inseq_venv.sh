#!/usr/bin/env bash
# Build the virtual environment that runs inseq 0.7.1 (generation attribution) for
# benchmarks/compare_inseq.py (through benchmarks/inseq_worker.py). inseq pins its own transformers and
# captum, so it gets its own environment. Installing torch first keeps pip from choosing another build
# (RECIPES: torch 2.13.0, then inseq 0.7.1: nothing else needed pinning). Never run from `make test`.
# Usage: benchmarks/inseq_venv.sh DIR   (python3.11 on PATH, or PYTHON=/path/to/python3.11)
set -euo pipefail
dir="${1:?usage: benchmarks/inseq_venv.sh DIR}"
"${PYTHON:-python3.11}" -m venv "$dir"
"$dir/bin/pip" install torch==2.13.0
"$dir/bin/pip" install inseq==0.7.1
"$dir/bin/python" -c "import importlib.metadata, transformers, torch, captum, inseq; print('inseq venv ready: inseq', importlib.metadata.version('inseq'), 'transformers', transformers.__version__, 'torch', torch.__version__, 'captum', captum.__version__)"
