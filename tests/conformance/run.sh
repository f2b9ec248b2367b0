#!/usr/bin/env bash
# Runs the pinned MCP conformance suite's server scenarios against a URL and
# prints JSON lines (see run.mjs for the options and the output format), on
# the Node 22 that `make conformance` installs beside the suite: in
# target/conformance (0.1.16), or in the folder `--suite-dir DIR` names
# (target/conformance-2026: 0.2.0-alpha.12, with the 2026-07-28 scenarios).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
suite="${CONFORMANCE_SUITE_DIR:-$here/../../target/conformance}"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [ "${args[i]}" = "--suite-dir" ] && [ $((i + 1)) -lt ${#args[@]} ]; then
    suite="${args[i + 1]}"
  fi
done
node="$suite/node_modules/node/bin/node"
if [ ! -x "$node" ]; then
  echo "run.sh: $node is missing: run \`make conformance\`" >&2
  exit 2
fi
exec "$node" "$here/run.mjs" "$@"
