#!/usr/bin/env bash
# Speculation against none with and without extra engine flags, side by side: output tokens/s of
# `m3serve generate --input` without speculation, with the dspark config as given ("default"), and with
# it plus B_FLAGS ("flags"), the three alternated in every round.
# Usage: B_FLAGS="--step-latency-tail-share 0" tools/spec_flags_bench.sh [m3serve] [model] [label=fragment]...
#   e.g. B_FLAGS="--step-latency-tail-share 0" CONCS="8 32" N=32 tools/spec_flags_bench.sh build/m3serve \
#          /tmp/mid-m31 'AL4.04="rejection_sample_method":"synthetic","synthetic_acceptance_length":4.04'
#   ROUNDS=2, K=7, N=16 requests, TOKENS=128, TEMP=0.7, CONCS="8"; EXTRA: more dspark keys for both.
set -euo pipefail
[ -n "${B_FLAGS:-}" ] || { echo "set B_FLAGS to the engine flags of the second speculative run" >&2; exit 2; }
. "$(dirname "$0")/lib/spec_generate.sh"
spec_init "8" "$@"
run() {  # conc spec-json-or-empty -> "tok/s AL"; a config ending in #flags runs with B_FLAGS
  if [[ "${2:-}" == *"#flags" ]]; then
    RUN_FLAGS="$B_FLAGS" spec_run "$1" "${2%#flags}"
  else
    spec_run "$@"
  fi
}
spec_rounds default '}' flags '}#flags' "${SETTINGS[@]}"
