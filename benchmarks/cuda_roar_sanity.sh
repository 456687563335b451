#!/usr/bin/env bash
# The roar and sanity tests on a GPU, beside the same commands on the CPU (issue #44: "works on CUDA").
# Trains the synthetic BiLSTM and a synthetic Transformer with sparsemax (2 epochs each), then runs
# `run sanity` (cascading and independent randomisation, 20 instances) and `run roar` (recursive, ratios
# 30 and 60, 2 seeds, 1 epoch a retrain) on each, on DEV (cuda or cpu), and copies each test's JSON to
# OUT/<run>-<test>.json with the scratch folder written as RUNS. The two devices train different models
# (other kernels), so the verdicts and RACU are compared, not the digits.
# Run: DEV=cuda OUT=benchmarks/results/cuda_roar_sanity PYTHONPATH=src bash benchmarks/cuda_roar_sanity.sh
# (the files there are named cuda-* and cpu-*: rename after each device's run).
A() { python3 -c "import sys; from attnaudit.cli import main; sys.argv[0]='attnaudit'; sys.exit(main())" "$@"; }
D=${DEV:-cuda}; O=${OUT:-/tmp/dcout}; S=$(mktemp -d); mkdir -p "$O"
A train --task synthetic --model bilstm --out "$S/syn" --device "$D" --epochs 2 > /dev/null || echo "train bilstm failed"
A train --task synthetic --model transformer --attention sparsemax --out "$S/sparse" --device "$D" --epochs 2 > /dev/null || echo "train sparse failed"
for R in syn sparse; do
  M=attention,gradient,loo; [ "$R" = syn ] && M=$M,input_gradient  # the Transformer refuses input_gradient (LayerNorm)
  A run sanity "$S/$R" --methods "$M" --variants cascading,independent --limit 20 --epochs 1 --device "$D" --out "$S/$R-sanity" > "$S/$R-sanity.log" 2>&1 && echo "$R sanity ok" || tail -5 "$S/$R-sanity.log"
  A run roar "$S/$R" --methods attention,gradient --ratios 30,60 --recursive --seeds 2 --epochs 1 --device "$D" --out "$S/$R-roar" > "$S/$R-roar.log" 2>&1 && echo "$R roar ok" || tail -5 "$S/$R-roar.log"
  for T in sanity roar; do
    [ -f "$S/$R-$T/$T.json" ] && sed "s|$S/|RUNS/|g" "$S/$R-$T/$T.json" > "$O/$R-$T.json"
  done
done
