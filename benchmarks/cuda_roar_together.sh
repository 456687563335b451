#!/usr/bin/env bash
# `run roar --together` on a GPU beside the same test one retrain at a time (issue #44: retraining fast enough to be
# used, and "works on CUDA"). Trains the synthetic BiLSTM without dropout or clipping (2 epochs), copies it, and runs
# `run roar` (recursive, attention and gradient, ratios 30 and 60, 2 seeds, 1 epoch a retrain) on DEV once one retrain
# at a time and once with --together (each copy keeps its own sub-runs), then copies both JSONs to
# OUT/DEV-alone.json and OUT/DEV-together.json with the scratch folder written as RUNS.
# Run: DEV=cuda OUT=benchmarks/results/cuda_roar_together PYTHONPATH=src bash benchmarks/cuda_roar_together.sh
A() { python3 -c "import sys; from attnaudit.cli import main; sys.argv[0]='attnaudit'; sys.exit(main())" "$@"; }
D=${DEV:-cuda}; O=${OUT:-/tmp/dcout}; S=$(mktemp -d); mkdir -p "$O"
A train --task synthetic --model bilstm --dropout 0 --clip none --out "$S/alone" --device "$D" --epochs 2 > /dev/null || echo "train failed"
cp -r "$S/alone" "$S/together"
for W in alone together; do
  F=(); [ "$W" = together ] && F=(--together)
  A run roar "$S/$W" --methods attention,gradient --ratios 30,60 --recursive --seeds 2 --epochs 1 --device "$D" \
    --out "$S/$W-roar" "${F[@]}" > "$S/$W.log" 2>&1 && echo "$W roar ok" || tail -5 "$S/$W.log"
  [ -f "$S/$W-roar/roar.json" ] && sed "s|$S/|RUNS/|g" "$S/$W-roar/roar.json" > "$O/$D-$W.json"
done
