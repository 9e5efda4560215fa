#!/usr/bin/env bash
# Adaptive speculation against fixed-length speculation and against none, side by side: output tokens/s
# of `m3serve generate --input` (offline batch through the engine) at concurrency 1 and 8
# (--max-num-seqs), the three alternated in every round so the host's noise falls on all alike.
# Usage: tools/spec_adaptive_bench.sh [m3serve] [model] [label=verification JSON fragment]...
#   e.g. tools/spec_adaptive_bench.sh build/m3serve models/demo 'trained="rejection_sample_method":"block"'
#        tools/spec_adaptive_bench.sh build/m3serve /tmp/mid-m31 \
#          'AL2.3="rejection_sample_method":"synthetic","synthetic_acceptance_length":2.3'
#   ROUNDS=2, K=7 (num_speculative_tokens), N=16 requests, TOKENS=128 each, TEMP=0.7, CONCS="1 8";
#   EXTRA: more keys for both speculative runs, e.g. EXTRA=',"draft_activations":"bf16"'.
# Prompts: the demo's fixed prompts and held-out passages (token ids below every vocabulary here).
set -euo pipefail
. "$(dirname "$0")/lib/spec_generate.sh"
spec_init "1 8" "$@"
run() { spec_run "$@"; }  # conc spec-json-or-empty -> "tok/s AL"
spec_rounds fixed ',"adaptive_num_speculative_tokens":false}' adaptive '}' "${SETTINGS[@]}"
