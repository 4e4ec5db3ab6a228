#!/usr/bin/env bash
# Runs a Python script with the peer environment's interpreter (scripts/setup --peers), or skips
# (ctest's SKIP_RETURN_CODE 77) naming what is missing: CI has no peer environment.
venv=$("$(dirname "$0")/../../scripts/peers/venv-path")
if [[ ! -x "$venv/bin/python" ]]; then
  echo "skip: no peer environment in $venv (scripts/setup --peers makes it; COSHARD_PEERS_VENV points elsewhere)"
  exit 77
fi
exec "$venv/bin/python" "$@"
