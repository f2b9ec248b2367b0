# Sourced by the callgrind scripts (`make bench-callgrind`): the release
# binaries, a work folder removed on exit, and the daemon under callgrind.
#
# Callgrind does not know Landlock's system calls and refuses a child's
# RLIMIT_NOFILE above its own, so the daemon runs with `landlock = "off"`
# and no rlimits: neither is on the paths measured.
BV=$(realpath "${BV:-target/release/bundlevisor}")
DEMO=$(realpath "${DEMO:-target/release/bundlevisor-demo}")
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }

work=$(mktemp -d /tmp/bv-callgrind.XXXXXX)
chmod 1777 "$work"
cleanup() {
  [ -n "${daemon:-}" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
export BUNDLEVISOR_SOCKET=$work/bv.sock

# start_daemon [TOML]: the daemon (with TOML added to its config) under
# callgrind, instrumentation off until `callgrind_control -i on`; its pid
# in $daemon, ready for the CLI.
start_daemon() {
  printf 'state_dir = "state"\nsocket = "bv.sock"\n[sandbox]\nlandlock = "off"\nmax_open_files = 0\n%s\n' \
    "${1:-}" >"$work/bv.toml"
  (cd "$work" && exec valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$work/daemon.%p.out" "$BV" daemon --config bv.toml \
    >"$work/daemon.log" 2>&1) &
  daemon=$!
  for _ in $(seq 300); do "$BV" status >/dev/null 2>&1 && return; sleep 0.1; done
  echo "the daemon did not start under callgrind: $(cat "$work/daemon.log")" >&2
  exit 1
}

# totals FILE…: the instructions counted in callgrind's output files.
totals() { grep -h '^totals:' "$@" | awk '{s += $2} END {print s}'; }
