#!/bin/bash
# Same placements as another revision: `gpuslice simulate --json` for every registered policy
# (oracle workload), the learning policies online, and the replay with departures, on seeds 42-46,
# run from REV's source and from the working tree, compared byte for byte once the per-run
# wall_seconds field is dropped (the only field that measures time).
#   bash bench/ab/simulate.sh REV [OUT_DIR]
set -euo pipefail
rev=$1
out=${2:-out/ab-simulate}
root=$(git rev-parse --show-toplevel)
py=$root/.venv/bin/python
base=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$base"' EXIT
git -C "$root" worktree add -q --detach "$base" "$rev"
mkdir -p "$out"
all=$(PYTHONPATH=$root/src $py -c "from gpuslice.framework import registry; print(','.join(registry.names()))")
for side in base new; do
  if [ $side = base ]; then src=$base/src; else src=$root/src; fi
  PYTHONPATH=$src $py -m gpuslice simulate --policy "$all" --seeds 42-46 --tune 1.3 --json --jobs 2 > "$out/$side-oracle.json"
  PYTHONPATH=$src $py -m gpuslice simulate --policy fgd,fgd-lookahead,binpack --seeds 42-46 --tune 1.3 \
    --workload online --json --jobs 2 > "$out/$side-online.json"
  PYTHONPATH=$src $py -m gpuslice simulate --replay --replay-policy binpack,bestfit,fgd,fgd-lookahead,balanced,topology-aware \
    --seeds 42-46 --load 0.9 --json --jobs 2 > "$out/$side-replay.json"
done
status=0
for k in oracle online replay; do
  for side in base new; do sed -E 's/, "wall_seconds": [0-9.]+//g' "$out/$side-$k.json" > "$out/$side-$k.nowall.json"; done
  if cmp -s "$out/base-$k.nowall.json" "$out/new-$k.nowall.json"; then
    echo "$k: identical apart from wall_seconds ($(wc -c < "$out/new-$k.json") bytes)"
  else
    echo "$k: DIFFERENT"; status=1
  fi
done
exit $status
