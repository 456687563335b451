#!/usr/bin/env bash
# Build the virtual environment that runs ferret-xai 0.4.2 for benchmarks/reproduce_ferret.py.
# ferret needs transformers < 5 and numpy < 2 (attnaudit's venv has transformers 5), so it gets
# its own environment (~2.4 GB). Never run from `make test`.
# Usage: benchmarks/ferret_venv.sh DIR   (python3.11 on PATH, or PYTHON=/path/to/python3.11)
set -euo pipefail
dir="${1:?usage: benchmarks/ferret_venv.sh DIR}"
"${PYTHON:-python3.11}" -m venv "$dir"
"$dir/bin/pip" install torch==2.13.0
# without the pyarrow pin ferret's import fails: "pyarrow requires NumPy 2.0 or newer"
"$dir/bin/pip" install ferret-xai==0.4.2 "pyarrow<26" "transformers==4.57.6"
"$dir/bin/python" -c "import ferret, transformers, numpy; print('ferret venv ready:', transformers.__version__, numpy.__version__)"
