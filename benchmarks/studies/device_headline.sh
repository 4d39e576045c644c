#!/usr/bin/env bash
# The headline comparison on one GPU in under 9 minutes: GiGPO (at GRPO's advantage scale) against GRPO and the
# shuffled-advantage control on Sokoban, at the goal scale's rollouts a step (the measured gradient noise scale)
# and held-out size (400 rooms: se <= 0.025), with fewer steps than the goal (STEPS). Writes the same result file
# as `agentgym study gigpo_vs_grpo` (benchmarks/results/study_gigpo_vs_grpo.json and .png), labelled
# "goal, N steps", then regenerates the research pages.
#
#   bash benchmarks/studies/device_headline.sh              # defaults: 1 seed, 2 steps, BC warm start <= 400 steps
#   SEEDS=3 STEPS=4 bash benchmarks/studies/device_headline.sh
#
# The runs go JOBS at a time (default 3: one seed's three runs together), each in its own spawned process on the one
# GPU with the CPU cores shared evenly: the tiny model leaves the GPU mostly idle, so one run at a time would wait on
# its own Python, not on the GPU.
#
# Measured on an H200 with 256 episodes in flight and a 200-step warm start: the smoke took 47 s, BC 0.22 s a step
# (checks included), each step of the three runs side by side 170 s (rollouts 138 s, update 31 s), 469 s in all.
# 200 BC steps reached only 0.125 greedy training success (400 reach 0.45 on a CPU), which left most groups without
# signal, so the warm start now gets 400; runs on a GPU keep 1,024 episodes in flight (1.45x the rollouts/s of 256).
#
# A warm start built elsewhere is reused: run `python benchmarks/studies/run.py gigpo_vs_grpo --agreement` on a CPU
# first (it clones the warm start into runs/studies/warm-sokoban, about 20 minutes on 2 cores), then send that
# folder along with the checkout (the device tool's `carry: ["runs/studies/warm-sokoban"]`): the GPU run skips BC.
#
# Results go to RESULTS_DIR (default benchmarks/results, where the research pages read them; another folder skips
# regenerating the pages).
#
# First a smoke run on the GPU (about half a minute) checks the CUDA path, so a broken setup fails in seconds, not
# after minutes. The whole script stops at BUDGET_S seconds (default 530) whatever happens, leaving time for a
# rerun within a 15-minute device lease.
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${SEEDS:-1}
STEPS=${STEPS:-2}
BC_STEPS=${BC_STEPS:-400}
JOBS=${JOBS:-3}
BUDGET_S=${BUDGET_S:-530}
RESULTS_DIR=${RESULTS_DIR:-benchmarks/results}
WORKDIR=${WORKDIR:-runs/studies}
start=$(date +%s)
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
timeout 120 python benchmarks/studies/run.py gigpo_vs_grpo --scale smoke --seeds 1 --device cuda \
    --out "$WORKDIR/device-smoke" --workdir "$WORKDIR"
left=$(( BUDGET_S - ($(date +%s) - start) ))
echo "smoke on cuda passed; ${left} s left for the headline run"
timeout "$left" python benchmarks/studies/run.py gigpo_vs_grpo --scale goal --device cuda --seeds "$SEEDS" \
    --steps "$STEPS" --max-bc-steps "$BC_STEPS" --jobs "$JOBS" --out "$RESULTS_DIR" --workdir "$WORKDIR"
if [ "$RESULTS_DIR" = benchmarks/results ]; then
    python benchmarks/studies/research_pages.py
fi
echo "done in $(( $(date +%s) - start )) s"
