#!/usr/bin/env bash
# Shared body of the release wrappers: exec ninfer-serve with a profile.
#   serve-<profile>.sh [ARTIFACT] [extra flags...]
# Environment: NINFER_HOST, NINFER_PORT, NINFER_DEVICES, NINFER_MAX_CONTEXT, NINFER_MODEL_ID,
# NINFER_VISION (1 = --vision, 0 = --no-vision). Extra flags after the artifact are appended
# last, so they win over the profile and the environment.
set -euo pipefail
profile="$1"; shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
serve="${NINFER_SERVE:-$here/ninfer-serve}"

args=()
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  args+=("$1"); shift
fi
args+=(--profile "$profile")
[ -n "${NINFER_HOST:-}" ] && args+=(--host "$NINFER_HOST")
[ -n "${NINFER_PORT:-}" ] && args+=(--port "$NINFER_PORT")
[ -n "${NINFER_DEVICES:-}" ] && args+=(--devices "$NINFER_DEVICES")
[ -n "${NINFER_MAX_CONTEXT:-}" ] && args+=(--max-context "$NINFER_MAX_CONTEXT")
[ -n "${NINFER_MODEL_ID:-}" ] && args+=(--model-id "$NINFER_MODEL_ID")
case "${NINFER_VISION:-}" in
  "") ;;
  1) args+=(--vision) ;;
  0) args+=(--no-vision) ;;
  *) echo "$(basename "$0"): NINFER_VISION must be 0 or 1, got '$NINFER_VISION'" >&2; exit 1 ;;
esac
exec "$serve" "${args[@]}" "$@"
