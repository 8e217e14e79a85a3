#!/usr/bin/env bash
# Launch qwen3 moe
# Written by qmgui.
# estimated VRAM: 1 GiB
# Usage: PORT=8081 ./qwen3.sh [more arguments for the engine]
set -eo pipefail

PORT="${PORT:-8081}"
export HIP_VISIBLE_DEVICES=1
exec /opt/llama.cpp/bin/llama-server \
  -m '<MODELS>/qwen3 moe.gguf' \
  -c 8192 \
  -fa auto \
  --n-cpu-moe 2 \
  --host 127.0.0.1 \
  --port "$PORT" \
  -lv 4 \
  "$@"
