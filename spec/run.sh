#!/usr/bin/env bash
# Explore the Quint model of the protocol (docs/protocol-model.md).
#
#   spec/run.sh                  typecheck, witness tests, random exploration of every
#                                invariant under the new rules (what `make model` runs)
#   spec/run.sh counterexamples  the review's findings: each search EXPECTS a violation
#                                with the old rule, prints the trace it found, then runs
#                                the same search with the new rules, which must find none
#
# Quint is installed locally from spec/package-lock.json (npm ci). Simulation uses the
# TypeScript backend: the default Rust one downloads a binary at run time. Without
# node/npm the whole thing is skipped with one line. Knobs (environment):
#   MODEL_SAMPLES (600)  MODEL_STEPS (40)  MODEL_SEED (20261202)  traces of the safety run
#   MODEL_FAILOVER_SAMPLES (300)                                  traces of the failover run
#   MODEL_LIVE_SAMPLES (100)                                      traces of the liveness run
#   MODEL_CX_SAMPLES (20000)  MODEL_CX_NEW_SAMPLES (600)           counterexample searches
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "model: skipped (node and npm are needed to run the Quint model; none found)"
  exit 0
fi

mode=${1:-check}
SAMPLES=${MODEL_SAMPLES:-600}
FAILOVER_SAMPLES=${MODEL_FAILOVER_SAMPLES:-300}
STEPS=${MODEL_STEPS:-40}
SEED=${MODEL_SEED:-20261202}
LIVE_SAMPLES=${MODEL_LIVE_SAMPLES:-100}
CX_SAMPLES=${MODEL_CX_SAMPLES:-20000}
CX_NEW_SAMPLES=${MODEL_CX_NEW_SAMPLES:-600}

# Keep in step with params.qnt: a liveness trace is CHAOS_STEPS steps, the switch to
# calm, then CALM_BOUND calm rounds (and one more to check after the last).
CHAOS_STEPS=30
CALM_BOUND=16
LIVE_STEPS=$((CHAOS_STEPS + 1 + CALM_BOUND + 1))

SAFETY="ExclusiveGrant ProcessUnderValidGrant FencingTokenMonotone FenceNeverRegresses NoEntryLost ProducerInLayout HonestNeverInvalid"
WITNESSES="sawDuplicate sawTimeout sawDropRequest sawDropResponse sawPauseResume sawKill
  sawFailover sawClockStep sawRogue sawCasLost sawStaleIgnored sawFenceRefused sawShardMoved
  sawClaim sawDrainingRead sawQuarantine sawExpiry sawRetired sawScaleOut sawTrim
  sawDeadLetter sawLeave"

# npm ci only when the lockfile changed since the last install.
stamp="node_modules/.installed-$(cksum package-lock.json | cut -d' ' -f1)"
if [ ! -e "$stamp" ]; then
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
  touch "$stamp"
fi
QUINT=(node node_modules/@informalsystems/quint/dist/src/cli.js)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

started=$SECONDS
say() { printf 'model: %s\n' "$*"; }

# quint run, keeping only its verdict lines; stores the full output in $out/$1.log.
simulate() {
  local name=$1
  shift
  local t0=$SECONDS rc=0
  "${QUINT[@]}" run protocol.qnt --backend typescript --verbosity 1 "$@" >"$out/$name.log" 2>&1 || rc=$?
  grep -E '^\[(ok|violation|error)\]|❌|witnessed' "$out/$name.log" | sed "s/^/  [$name] /" || true
  echo "  [$name] $((SECONDS - t0)) s wall" >>"$out/$name.log"
  return $rc
}

check() {
  say "typecheck"
  "${QUINT[@]}" typecheck protocol_test.qnt
  say "witness tests (quint test)"
  if ! "${QUINT[@]}" test protocol_test.qnt --backend typescript --seed 1 --max-samples 1 \
    >"$out/test.log" 2>&1; then
    cat "$out/test.log"
    say "FAILED: a witness test failed"
    exit 1
  fi
  grep -E 'passing' "$out/test.log" | sed 's/^ */  /'

  say "safety: $SAMPLES traces x $STEPS steps (seed $SEED), failovers: $FAILOVER_SAMPLES x $STEPS," \
    "liveness: $LIVE_SAMPLES x $LIVE_STEPS"
  local rc=0
  # The explorations run side by side (CI has two cores). `step` interleaves every
  # action and fault; `stepFailoverSearch` goes deep into grants, moves and failovers
  # (the search that finds counterexample c with the old rules).
  simulate safety --init init --step step --max-samples "$SAMPLES" --max-steps "$STEPS" \
    --seed "$SEED" --invariants $SAFETY --witnesses $WITNESSES &
  local safety=$!
  simulate failovers --init init --step stepFailoverSearch --max-samples "$FAILOVER_SAMPLES" \
    --max-steps "$STEPS" --seed "$((SEED + 2))" --invariants $SAFETY &
  local failovers=$!
  simulate liveness --init init --step stepLive --max-samples "$LIVE_SAMPLES" \
    --max-steps "$LIVE_STEPS" --seed "$((SEED + 1))" --invariant BoundedDelivery &
  local liveness=$!
  wait "$safety" || rc=1
  wait "$failovers" || rc=1
  wait "$liveness" || rc=1
  if [ "$rc" -ne 0 ]; then
    cat "$out"/safety.log "$out"/failovers.log "$out"/liveness.log | tail -n 80
    say "FAILED: an invariant was violated (rerun with the seed above; spec/trace.py prints an --out-itf trace)"
    exit 1
  fi
  say "ok in $((SECONDS - started)) s"
}

# name | init with the old rule | step | invariant | what it shows
CASES=(
  "a-epoch-brick|initOldEpochBrick|step|HonestNeverInvalid|an unknown member's huge epoch bricks the group"
  "b-stale-heartbeat|initOldUnsequenced|step|ExclusiveGrant|a delayed or duplicated heartbeat hands a shard to a second owner"
  "c-failover-sync|initOldSyncGrants|stepFailoverSearch|FencingTokenMonotone|after a failover that lost writes a member reads under an older token"
  "d-clock-step|initOldClock|step|ExclusiveGrant|an undetected Redis TIME step expires a member whose lease is valid"
  "e-no-wait|initAsyncWrites|stepFailoverSearch|ExclusiveGrant|without WAIT a failover forgets a member that still holds its shards"
  "e-no-wait-layout|initAsyncWrites|step|ProducerInLayout|without WAIT a lost layout commit leaves a shard producers write to"
)

counterexamples() {
  local failed=0
  for case in "${CASES[@]}"; do
    IFS='|' read -r name init stepname invariant what <<<"$case"
    say "$name: $what"
    if simulate "$name-old" --init "$init" --step "$stepname" --invariant "$invariant" \
      --max-samples "$CX_SAMPLES" --max-steps "$STEPS" --seed "$SEED" --out-itf "$out/$name.itf.json"; then
      say "$name: NOT reproduced with $init in $CX_SAMPLES traces"
      failed=1
      continue
    fi
    if ! grep -q 'Invariant violated' "$out/$name-old.log"; then
      tail -n 20 "$out/$name-old.log"
      failed=1
      continue
    fi
    python3 trace.py "$out/$name.itf.json" | sed 's/^/    /'
    if simulate "$name-new" --init init --step "$stepname" --invariant "$invariant" \
      --max-samples "$CX_NEW_SAMPLES" --max-steps "$STEPS" --seed "$SEED"; then
      say "$name: gone with the new rules ($CX_NEW_SAMPLES traces)"
    else
      tail -n 20 "$out/$name-new.log"
      say "$name: STILL violated with the new rules"
      failed=1
    fi
  done
  # Without WAIT the other new rules still keep tokens from going back (the token
  # source survives a failover and SYNC_METADATA grants nothing): this search finds
  # nothing, where c-failover-sync finds a decrease with the old rules.
  say "c-without-wait: every new rule but WAIT, the same search: no token decrease"
  if simulate c-without-wait --init initAsyncWrites --step stepFailoverSearch \
    --invariant FencingTokenMonotone --max-samples "$CX_NEW_SAMPLES" --max-steps "$STEPS" \
    --seed "$SEED"; then
    say "c-without-wait: none found ($CX_NEW_SAMPLES traces)"
  else
    tail -n 20 "$out/c-without-wait.log"
    failed=1
  fi
  say "counterexamples done in $((SECONDS - started)) s"
  exit "$failed"
}

case "$mode" in
  check) check ;;
  counterexamples) counterexamples ;;
  *)
    echo "usage: spec/run.sh [check|counterexamples]" >&2
    exit 2
    ;;
esac
