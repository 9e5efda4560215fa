#!/usr/bin/env bash
# The draft's lm_head, side by side: output tokens/s of `m3serve generate --input` without speculation,
# with the draft's slots through the target's lm_head ("draft_lm_head":"target") and through the draft's
# own MXFP8 copy ("mxfp8"), the three alternated in every round; each speculative run's measured draft
# pass goes to stderr. Usage: tools/spec_lm_head_bench.sh [m3serve] [model] [label=verification fragment]...
#   e.g. tools/spec_lm_head_bench.sh build/m3serve /tmp/mid-m31 \
#          'AL4.04="rejection_sample_method":"synthetic","synthetic_acceptance_length":4.04'
#   ROUNDS=2, K=7, N=16 requests, TOKENS=128, TEMP=0.7, CONCS="1"; EXTRA: more keys for both.
set -euo pipefail
BIN=${1:-build/m3serve}
MODEL=${2:-models/demo}
shift 2 || true
[ $# -gt 0 ] || set -- 'block="rejection_sample_method":"block"'
ROUNDS=${ROUNDS:-2} K=${K:-7} N=${N:-16} TOKENS=${TOKENS:-128} TEMP=${TEMP:-0.7} CONCS=${CONCS:-"1"} EXTRA=${EXTRA:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/lib/spec_generate.sh"
spec_requests "$TMP/req.jsonl" "$TEMP" "$N" "$TOKENS"
run() {  # conc spec-json-or-empty -> "tok/s AL"; the draft pass it measured on stderr
  spec_run "$@"
  grep -o "draft pass [^,]*" "$TMP/err" >&2 || true
}
spec_rounds target ',"draft_lm_head":"target"}' mxfp8 ',"draft_lm_head":"mxfp8"}' "$@"
