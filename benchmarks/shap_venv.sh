#!/usr/bin/env bash
# Build the virtual environment that runs shap's KernelExplainer for benchmarks/compare_shap.py and
# tests/explain/test_shap_agreement.py (through benchmarks/shap_worker.py). shap is no dependency of
# attnaudit, so it gets its own environment. torch first and pinned (RECIPES); shap 0.51.0 is the last
# release for Python 3.11 (0.52+ need 3.12); transformers pinned to attnaudit's, so both load a model
# folder alike. Never run from `make test`.
# Usage: benchmarks/shap_venv.sh DIR   (python3.11 on PATH, or PYTHON=/path/to/python3.11)
set -euo pipefail
dir="${1:?usage: benchmarks/shap_venv.sh DIR}"
"${PYTHON:-python3.11}" -m venv "$dir"
"$dir/bin/pip" install torch==2.13.0
"$dir/bin/pip" install shap==0.51.0 transformers==5.23.0
"$dir/bin/python" -c "import shap, transformers, torch, numpy; print('shap venv ready: shap', shap.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
