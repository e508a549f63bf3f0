#!/usr/bin/env bash
# Qwen3.8-Flash-Next release launcher: ninfer-serve --profile flash-next (see _serve-profile.sh).
exec "$(dirname "${BASH_SOURCE[0]}")/_serve-profile.sh" flash-next "$@"
