#!/usr/bin/env bash
# Adaptive verification with the draft's confidence head against adaptive speculation without it, and
# against no speculation, side by side: output tokens/s of `m3serve generate --input` (offline batch)
# at each concurrency (--max-num-seqs), the three alternated in every round so the host's noise falls on
# all alike. Prints the speculative runs' acceptance length and the drafts the head cut.
# Usage: tools/spec_confidence_bench.sh [m3serve] [model] [label=verification JSON fragment]...
#   e.g. tools/spec_confidence_bench.sh build/m3serve models/demo 'trained="rejection_sample_method":"block"'
#   ROUNDS=2, K=7, N=16 requests, TOKENS=128 each, TEMP=0.7, CONCS="1 8" (as tools/spec_adaptive_bench.sh);
#   VARIANT: the keys the third run adds (default ',"enable_adaptive_verification":true'), e.g.
#   VARIANT=',"dspark_draft_topk":64' to time the candidate-pruned Markov head instead.
set -euo pipefail
VARIANT=${VARIANT:-',"enable_adaptive_verification":true'}
. "$(dirname "$0")/lib/spec_generate.sh"
spec_init "1 8" "$@"
run() {  # conc spec-json-or-empty -> "tok/s AL[/cutN]"
  local tps al cut
  read -r tps al < <(spec_run "$@")
  cut=$(sed -n 's/.*; \([0-9]*\) drafts cut by the confidence head.*/\1/p' "$TMP/err")
  [ -n "$cut" ] && al="$al/cut$cut"
  echo "$tps $al"
}
EXTRA=  # this benchmark takes its variant from VARIANT only
spec_rounds adaptive '}' +variant "$VARIANT}" "${SETTINGS[@]}"
