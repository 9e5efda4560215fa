#!/usr/bin/env bash
# Offline engine throughput: N requests of random token ids (IN tokens each, OUT greedy tokens,
# ignore_eos) through `m3serve generate --input`, at each concurrency (--max-num-seqs) given.
# Usage: tools/engine_throughput.sh MODEL_DIR [N=32] [IN=64] [OUT=16] [CONCURRENCIES="1 8 32"] [extra engine flags...]
set -euo pipefail
model=$1; n=${2:-32}; in=${3:-64}; out=${4:-16}; concs=${5:-"1 8 32"}; shift $(( $# < 5 ? $# : 5 ))
bin=${M3SERVE:-$(dirname "$0")/../build/m3serve}
vocab=$(grep -o '"vocab_size": *[0-9]*' "$model/config.json" | head -1 | grep -o '[0-9]*$')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
RANDOM=1
for ((i = 0; i < n; i++)); do
  ids=""
  for ((j = 0; j < in; j++)); do ids+="${ids:+,}$(( (RANDOM * 32768 + RANDOM) % (vocab - 300) + 256 ))"; done
  echo "{\"prompt_token_ids\": [$ids], \"max_tokens\": $out, \"temperature\": 0, \"ignore_eos\": true}"
done > "$tmp/in.jsonl"
for c in $concs; do
  echo "concurrency $c:"
  "$bin" generate --model "$model" --input "$tmp/in.jsonl" --output "$tmp/out.jsonl" --max-num-seqs "$c" "$@" 2>&1 |
    grep -E "requests|KV cache"
done
