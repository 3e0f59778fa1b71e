#!/bin/bash
# Filter and extender latency against another revision, interleaved in one run on one machine:
# ROUNDS rounds of bench_filter.py and bench_extender.py latency from REV's tree and from the
# working tree, the order alternating each round; bench/ab/summary.py prints the medians and ratios.
#   bash bench/ab/latency.sh REV [ROUNDS] [OUT_DIR]
set -euo pipefail
rev=$1
rounds=${2:-3}
out=$(realpath -m "${3:-out/ab-latency}")
root=$(git rev-parse --show-toplevel)
py=$root/.venv/bin/python
base=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$base"' EXIT
git -C "$root" worktree add -q --detach "$base" "$rev"
mkdir -p "$out"
run() {  # side kind round
  local dir=$root
  [ "$1" = base ] && dir=$base
  if [ "$2" = filter ]; then
    (cd "$dir" && PYTHONPATH=$dir/src $py bench/bench_filter.py --reps 300 --out "$out/$1-filter-$3.json" > "$out/$1-filter-$3.txt" 2>&1)
  else
    (cd "$dir" && mkdir -p out && PYTHONPATH=$dir/src $py bench/bench_extender.py latency \
      --policies binpack,bestfit,fgd,topology-aware,balanced --pods 20000 --reps 300 > "$out/$1-ext-$3.txt" 2>&1 \
      && cp out/bench_extender_latency.json "$out/$1-ext-$3.json")
  fi
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then a=base; b=new; else a=new; b=base; fi
  run $a filter "$r"; run $b filter "$r"; run $b ext "$r"; run $a ext "$r"
  echo "round $r done $(date +%T)"
done
$py "$root/bench/ab/summary.py" "$out"
