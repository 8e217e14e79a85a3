#!/usr/bin/env pwsh
# Launch qwen3 moe
# Written by qmgui.
# estimated VRAM: 1 GiB
# Usage: .\qwen3.ps1 [-Port 8081] [more arguments for the engine]
param([int]$Port = 8081)
$ErrorActionPreference = 'Stop'
$PSNativeCommandArgumentPassing = 'Standard'

$env:HIP_VISIBLE_DEVICES = '1'
& /opt/llama.cpp/bin/llama-server `
  -m '<MODELS>/qwen3 moe.gguf' `
  -c 8192 `
  -fa auto `
  --n-cpu-moe 2 `
  --host '127.0.0.1' `
  --port $Port `
  -lv 4 `
  @args
exit $LASTEXITCODE
