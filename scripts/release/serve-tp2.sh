#!/usr/bin/env bash
# Qwen3.8-27B release launcher: ninfer-serve --profile 27b (see _serve-profile.sh).
exec "$(dirname "${BASH_SOURCE[0]}")/_serve-profile.sh" 27b "$@"
