#!/usr/bin/env bash
# Runs the GPU evidence in named steps, each resumable, inside one wall-clock limit.
#
#   STEPS="tests unseen fill" LIMIT=550 OUT=/tmp/out bash experiments/gpu_steps.sh
#
# Made for a machine that cuts every command at a fixed limit and keeps nothing between
# commands: everything a step needs to go on lives under runs/ (sweep directories, probe
# outputs, and runs/.done/<step> once a step has finished), runs/state.tgz is unpacked first
# when present, and the end of every call packs runs/ into $OUT/state.tgz. Hand that archive
# back as runs/state.tgz and the next call skips what is done and resumes what was cut. The
# archive is also refreshed every PACK_EVERY seconds (default 60), so a call cut from outside
# before the end still hands back what it had done up to the last refresh.
# Logs: $OUT/logs/<step>.log.
#
# Steps (run in the order STEPS names them; a step cut by the limit ends the call):
#   tests   python -m pytest -m gpu over GPU_TESTS (';'-separated node ids; default: all)
#   unseen  search.sweep over experiments/unseen, population 8, 5 rounds (resumed when cut)
#   lib     search.sweep over the built-in library, population 8, 5 rounds (resumed when cut);
#           LIB_KERNELS (space-separated names) sweeps only those: one part of a library swept in
#           parts, reported as one by experiments.sweep_results <part dirs...>
#   NAME=k1,k2,...  (NAME starting with "lib") the same over the kernels listed, under runs/NAME:
#           several parts in one call or over several calls, e.g. "lib2a=rotary_embedding_neox,topk_softmax"
#           (SWEEP_ARGS, e.g. "--compile-ahead", are added to every new sweep)
#   search  search.run, population 8, 5 rounds, one GPU (resumed when cut)
#   diag    experiments.timing_truth --per-peer (the baseline beside each peer alone) into
#           runs/diag/timing-truth.json
#   fisetup experiments.flashinfer_setup (FlashInfer's set-up per fresh process: import, each op's
#           first call per shape, modules built or rebuilt) into runs/diag/flashinfer-setup.json;
#           FI_KERNELS (space-separated) and FI_ROUNDS (fresh processes per kernel, default 2)
#           choose what it probes: FI_ROUNDS=1 over a sweep's kernels builds their FlashInfer
#           modules before the sweep
#   coordesc  experiments.coordesc_probe (does a loop that loads its torch.compile programs from a
#           compile-ahead folder run coordinate descent again, and why) into runs/diag/coordesc.json,
#           with the torch sources it reads from into runs/diag/torch-src.tgz; CD_KERNELS
#           (space-separated) and CD_VARIANTS (comma-separated) choose what it probes
#   evalprof  experiments.eval_profile (where one evaluation's time goes: validation, the timing
#           loop's host and GPU work) into runs/diag/eval-profile.json
#   neighbours  experiments.timing_neighbours (what a neighbour in the loop does to the baseline's
#           time: event window, kernel duration, gap) into runs/diag/neighbours.json
#   h2h     experiments.head_to_head --old $H2H_OLD --new $H2H_NEW (default: the committed sweep's
#           best kernels) into runs/h2h/head-to-head.{json,md}; H2H_KERNELS (space-separated)
#           limits it to those kernels
#   fill    experiments.codegen_probe --compare-fill --loops 3 --no-peers, one kernel folder at
#           a time (FILL: space-separated folders; each tried once, its probe.json kept)
#   eor=cold,warm,...  experiments.end_of_run_bench, the default command with a cold or warm peer
#           cache, one run per mode listed; each call writes a new part runs/eor/part-N.json (the
#           first part on a machine is marked first), merged by
#           `python -m experiments.end_of_run_bench --report runs/eor/part-*.json --md FILE`; a
#           list already run is done (eor=cold,warm then eor=warm,cold,warm for more runs); EOR_ARGS
#           (e.g. "--peers-beside-search") are added to every run's command
#   rewardbench  experiments.reward_bench on one GPU, 32 clients, RB_DURATION s (default 300)
#           of requests with the adversarial fixtures mixed in, into runs/rewardbench/
#   explore=k1,k2,...  experiments.explore_recipes for each kernel named, into
#           runs/explore/<kernel>/explore-<kernel>.{md,json}; a kernel done is not run again
set -uo pipefail
: "${OUT:?OUT: the folder whose files come back}"
LIMIT=${LIMIT:-550}        # seconds this call may use, packing included
RESERVE=${RESERVE:-25}     # seconds kept for packing the state
MIN_STEP=${MIN_STEP:-30}   # a step is not started with less time than this left
STEPS=${STEPS:-"tests"}
PY=${PY:-python3}
start=$(date +%s)
mkdir -p runs/.done "$OUT/logs"
# Every failing test's traceback lands here as it happens (tests/conftest.py), so a step cut by
# the limit still tells why its failures failed.
export KERNEL_SEARCH_FAILURE_LOG="$OUT/logs/failures.log"
if [ -f runs/state.tgz ]; then
  tar xzf runs/state.tgz -C runs && rm -f runs/state.tgz
fi

left() { echo $(( LIMIT - RESERVE - ($(date +%s) - start) )); }

# snapshot: runs/ into $OUT/state.tgz through a temporary file, so that a kill in the middle of
# packing leaves the previous snapshot whole rather than an empty archive. tar's status 1 ("a
# file changed as we read it": a record appended meanwhile) still gives a usable archive: the
# readers of the records drop a torn last line.
snapshot() {
  tar czf "$OUT/state.tgz.part" -C runs --exclude=./state.tgz . 2>/dev/null
  [ $? -le 1 ] && mv -f "$OUT/state.tgz.part" "$OUT/state.tgz"
  ls runs/.done > "$OUT/done.txt"
}

# A snapshot every PACK_EVERY seconds as well as at the end: the machine's own limit can cut
# the whole command (a call whose device time ran short gets less than LIMIT), and what ran
# until the last snapshot then still comes back.
# Stopped by TERM, the loop lets a snapshot under way finish first (bash runs a trap once the
# command in the foreground is done), so the last snapshot never races it for the temporary
# file; the sleep runs in the background, where the trap interrupts the wait at once and ends
# it. The loop's output goes nowhere: a sleep left holding the caller's pipe would keep a
# caller reading it waiting.
PACK_EVERY=${PACK_EVERY:-60}
( trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do sleep "$PACK_EVERY" & nap=$!; wait "$nap"; snapshot; done ) >/dev/null 2>&1 &
snapshots=$!

pack() {
  kill "$snapshots" 2>/dev/null; wait "$snapshots" 2>/dev/null
  snapshot
  echo "[steps] packed $(du -h "$OUT/state.tgz" | cut -f1) after $(( $(date +%s) - start )) s; done: $(ls runs/.done | tr '\n' ' ')"
}
trap pack EXIT

# run NAME CMD...: runs CMD under what is left of the limit, logging to logs/NAME.log.
# Returns the command's status; 124 means the limit cut it.
run() {
  local name=$1; shift
  local t; t=$(left)
  if [ "$t" -lt "$MIN_STEP" ]; then echo "[steps] $name: no time left"; return 124; fi
  echo "[steps] $name: $* (limit ${t} s)"
  timeout -k 10 "$t" "$@" 2>&1 | tee -a "$OUT/logs/$name.log" | tail -n 40
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 137 ] && rc=124
  echo "[steps] $name: rc $rc"
  return "$rc"
}

# sweep NAME ARGS...: a new sweep under runs/NAME, or the resumption of the one already there.
sweep() {
  local name=$1; shift
  local dir; dir=$(ls -d runs/"$name"/sweep-* 2>/dev/null | head -n 1)
  if [ -z "$dir" ]; then
    # SWEEP_ARGS (e.g. "--compile-ahead") go to every new sweep; a resumed one keeps its config.
    # shellcheck disable=SC2086
    run "$name" "$PY" -m search.sweep "$@" --population 8 --budget-rounds 5 ${SWEEP_ARGS:-} --out runs/"$name"
  else
    run "$name" "$PY" -m search.sweep --resume "$dir"
  fi
}

step() {
  case $1 in
    tests)
      local ids=()
      IFS=';' read -r -a ids <<< "${GPU_TESTS:-}"
      run tests "$PY" -m pytest -m gpu -q -p no:cacheprovider "${ids[@]}"
      local rc=$?; [ "$rc" = 124 ] && return 124
      return 0 ;;  # failures are results: the log says which
    unseen) sweep unseen --library experiments/unseen ;;
    lib)
      local ks=() k
      for k in ${LIB_KERNELS:-}; do ks+=(--kernel "$k"); done
      sweep lib "${ks[@]}" ;;
    lib*=*)
      local ks=() k list=${1#*=}
      for k in ${list//,/ }; do ks+=(--kernel "$k"); done
      sweep "${1%%=*}" "${ks[@]}" ;;
    search)
      local dir; dir=$(ls -d runs/search/*/ 2>/dev/null | head -n 1)
      if [ -z "$dir" ]; then
        run search "$PY" -m search.run --population 8 --rounds 5 --gpus 1 --out runs/search
      else
        run search "$PY" -m search.run --resume "${dir%/}"
      fi ;;
    diag)
      mkdir -p runs/diag
      run diag "$PY" -m experiments.timing_truth --per-peer --out runs/diag/timing-truth.json ;;
    fisetup)
      mkdir -p runs/diag
      # shellcheck disable=SC2086  # FI_KERNELS: several names, split on purpose
      run fisetup "$PY" -m experiments.flashinfer_setup --rounds "${FI_ROUNDS:-2}" --out runs/diag/flashinfer-setup.json ${FI_KERNELS:-} ;;
    coordesc)
      mkdir -p runs/diag
      tar czf runs/diag/torch-src.tgz -C "$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')" \
        _inductor/runtime _inductor/codecache.py _inductor/triton_bundler.py _inductor/async_compile.py 2>/dev/null
      # shellcheck disable=SC2086  # CD_KERNELS: several names, split on purpose
      run coordesc "$PY" -m experiments.coordesc_probe --variants "${CD_VARIANTS:-as-is,no-bundle,no-static}" \
        --out runs/diag/coordesc.json ${CD_KERNELS:-} ;;
    evalprof)
      mkdir -p runs/diag
      run evalprof "$PY" -m experiments.eval_profile --out runs/diag/eval-profile.json ;;
    neighbours)
      mkdir -p runs/diag
      run neighbours "$PY" -m experiments.timing_neighbours --out runs/diag/neighbours.json ;;
    h2h)
      local ks=() k
      for k in ${H2H_KERNELS:-}; do ks+=(--kernel "$k"); done
      run h2h "$PY" -m experiments.head_to_head --old "${H2H_OLD:?H2H_OLD: the folder of the old best kernels}" \
        --new "${H2H_NEW:-experiments/results/sweep-h200-kernels/best}" "${ks[@]}" --out runs/h2h/head-to-head --resume ;;
    fill)
      local k rc
      for k in ${FILL:-}; do
        local tag; tag=$(basename "$k")
        [ -f runs/fill/"$tag"/.tried ] && continue
        run fill "$PY" -m experiments.codegen_probe "$k" --compare-fill --loops 3 --no-peers --out runs/fill/"$tag"
        rc=$?; [ "$rc" = 124 ] && return 124
        [ "$rc" = 0 ] || echo "[steps] fill: $tag failed (rc $rc), kept going"
        mkdir -p runs/fill/"$tag" && touch runs/fill/"$tag"/.tried
      done ;;
    eor=*)
      mkdir -p runs/eor
      local n; n=$(find runs/eor -name 'part-*.json' | wc -l)
      local first=(); [ "$n" = 0 ] && first=(--first)
      # shellcheck disable=SC2086  # EOR_ARGS: options of the runs, split on purpose
      run eor "$PY" -m experiments.end_of_run_bench --runs "${1#*=}" "${first[@]}" \
        --cache runs/eor/peer-cache --out runs/eor/runs --json runs/eor/part-$((n + 1)).json ${EOR_ARGS:-} ;;
    rewardbench)
      run rewardbench "$PY" -m experiments.reward_bench --evaluator gpu --gpus 1 --clients 32 \
        --duration-s "${RB_DURATION:-300}" --grace-s 120 --fixtures tests/adversarial --out runs/rewardbench ;;
    explore=*)
      local k rc list=${1#*=}
      for k in ${list//,/ }; do
        [ -f runs/explore/"$k"/.done ] && continue
        mkdir -p runs/explore/"$k"
        run explore "$PY" -m experiments.explore_recipes --kernel "$k" --out runs/explore/"$k"/explore-"$k"
        rc=$?; [ "$rc" = 0 ] || return "$rc"
        touch runs/explore/"$k"/.done
      done ;;
    *) echo "[steps] unknown step: $1"; return 2 ;;
  esac
}

for s in $STEPS; do
  name=${s%%=*}  # a library part is known by its name
  case $s in eor=*) name=$s ;; esac  # each list of end-of-run modes is a step of its own
  if [ -f runs/.done/"$name" ]; then echo "[steps] $name: done before"; continue; fi
  step "$s"; rc=$?
  if [ "$rc" = 0 ]; then touch runs/.done/"$name"
  elif [ "$rc" = 124 ]; then echo "[steps] $name: cut by the limit; the next call resumes it"; break
  else echo "[steps] $name: failed (rc $rc)"; break
  fi
done
