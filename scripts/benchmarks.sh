#!/usr/bin/env bash
# Runs the benches and prints BENCHMARKS.md: the machine, its load before and
# after, and each bench's table (every figure a ratio against a reference
# measured in the same run). `make bench` writes its output to BENCHMARKS.md;
# each bench's table also goes to stderr as it finishes.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
BENCHES=${BENCHES:-io_throughput offload_inspect_search compact_history codemode fleet}

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u +%Y-%m-%dT%H:%MZ)
mkdir -p "${SPILLWAY_BENCH_DIR:-target}"
fs=$(df -hT "${SPILLWAY_BENCH_DIR:-target}" 2>/dev/null | awk 'NR == 2 {print $2 ", " $3 " total"}' || true)

body=$(mktemp)
trap 'rm -f "$body"' EXIT
for bench in $BENCHES; do
	$CARGO bench --locked --quiet --bench "$bench" | tee -a "$body" >&2
	echo >>"$body"
done

cat <<HEADER
# Benchmarks

Produced by \`make bench\` (scripts/benchmarks.sh: \`cargo bench --bench NAME\` for
$BENCHES), started $started, commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src benches || echo ' plus uncommitted changes').

Machine: $cpu, $(nproc) cores, $mem RAM, Linux $(uname -r), $(rustc --version | cut -d' ' -f1-2);
data on ${fs:-unknown file system}. Load average (1, 5, 15 min) $load_before before the run and
$(cut -d' ' -f1-3 /proc/loadavg) after: the machine is shared, so other work competes for the
cores; the references run in the same process and the same minutes, which is why each figure is
reported as a ratio.

HEADER
# Each bench's headings move down one level, under this file's title.
sed 's/^#/##/' "$body"
