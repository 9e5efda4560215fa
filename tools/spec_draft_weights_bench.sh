#!/usr/bin/env bash
# The draft's wide matrices, side by side: output tokens/s of `m3serve generate --input` without
# speculation, with the draft's fc and the target's lm_head as loaded ("draft_weights":"checkpoint") and
# with the draft's MXFP8 copies of them ("mxfp8"), the three alternated in every round; each speculative
# run's measured draft pass and draft context go to stderr.
# Usage: tools/spec_draft_weights_bench.sh [m3serve] [model] [label=verification fragment]...
#   e.g. tools/spec_draft_weights_bench.sh build/m3serve /tmp/mid-m31 \
#          'AL4.04="rejection_sample_method":"synthetic","synthetic_acceptance_length":4.04'
#   ROUNDS=2, K=7, N=16 requests, TOKENS=128, TEMP=0.7, CONCS="1"; EXTRA: more keys for both.
set -euo pipefail
. "$(dirname "$0")/lib/spec_generate.sh"
spec_init "1" "$@"
run() {  # conc spec-json-or-empty -> "tok/s AL"; the draft costs it measured on stderr (read before the
  # result line goes out: the caller starts the next run, which rewrites $TMP/err, once it has that line)
  local r w
  r=$(spec_run "$@")
  if [ -n "${2:-}" ]; then
    w=${2##*draft_weights\":\"}
    echo "${w%%\"*}: $(grep -o "draft pass .*" "$TMP/err" | tr -d '\n')" >&2 || true
  fi
  echo "$r"
}
spec_rounds checkpoint ',"draft_weights":"checkpoint"}' mxfp8 ',"draft_weights":"mxfp8"}' "${SETTINGS[@]}"
