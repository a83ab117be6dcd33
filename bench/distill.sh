#!/usr/bin/env bash
# Issue 73's measurement: `rcpipe distill`'s student beside its teacher ensemble and the best
# member, on the article split of SQuAD dev (v1.1), one base (train.seed) a run.
#
#   bash bench/distill.sh SEED [STUDENT] [MINUTES] [METHOD] [T:ALPHA ...]
#
# 1. the five members as bench/accuracy.py trains them (--preset cpu, --minutes 3, seed SEED);
# 2. a workspace (bench/out/distill/seed-SEED/) holding their model files, where the product's
#    own commands run: `rcpipe evaluate` each (test F1 at the held-out thresholds), `rcpipe
#    ensemble` (ensemble.method METHOD, default selected, params.yaml's: the members' mean
#    weighted on the held-out slice, the distribution the student then learns);
# 3. for each T:ALPHA (default 1:0.5, params.yaml's), a copy of that workspace and `rcpipe distill` (STUDENT,
#    default bidaf, for MINUTES, default 3, train.seed SEED): its checkpoints ranked on the
#    held-out slice, its test F1 at its held-out threshold. Where several T:ALPHA are given,
#    the one with the best held-out F1 is the result (the test articles choose nothing);
# 4. the equal-cost single model: STUDENT alone, the same seed and MINUTES, gold spans only
#    (bench/accuracy.py --variants STUDENT --tag equal-SEED): the teacher's share of the gain.
# Each step's output is kept; a rerun skips what its files say is done. The summary lines
# are in bench/out/distill/seed-SEED/summary.json. Nothing else should run beside it: the
# members' and the student's budgets are minutes (their steps are in the summary).
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=${1:?usage: bash bench/distill.sh SEED [STUDENT] [MINUTES] [METHOD] [T:ALPHA ...]}
STUDENT=${2:-bidaf}
MINUTES=${3:-3}
METHOD=${4:-selected}
shift $(( $# < 4 ? $# : 4 ))
CONFIGS=("${@:-1:0.5}")
PY=$PWD/.venv/bin/python  # not realpath: the venv's python is a symlink out of it
RC=$PWD/.venv/bin/rcpipe
SPLIT=../shared/data/squad-split
ACC=bench/out/accuracy/cpu/v1.1
WS=bench/out/distill/seed-$SEED
TRAIN=$(realpath "$SPLIT/train-v1.1.json")
TEST=$(realpath "$SPLIT/test-v1.1.json")
VARIANTS=(bidaf bidaf_selfattn rnet rnet_mult qanet)

# 1. the members (bench/accuracy.py's cpu preset: params.demo.yaml's widths, one thread each)
if [ ! -f "bench/out/accuracy-members-$SEED.json" ]; then
  $PY bench/accuracy.py --preset cpu --minutes 3 --versions 1.1 --first-seed "$SEED" \
    --tag "members-$SEED"
fi
PREPARED=$(realpath "$ACC/prepared")
SETS=(--params "$(realpath params.demo.yaml)" --set "data.train_file=$TRAIN" --set "data.dev_file=$TEST"
      --set "data.out_dir=$PREPARED" --set "data.cache_dir=$(realpath "$ACC")/cache"
      --set data.word_vectors=null --set train.threads=1 --set train.num_workers=1
      --set "ensemble.method=$METHOD")

# 2. the product's evaluate and ensemble over them
mkdir -p "$WS/base"
for v in "${VARIANTS[@]}"; do
  mkdir -p "$WS/base/models/$v"
  cp -u "$ACC/members-$SEED/$v/model.pt" "$WS/base/models/$v/model.pt"
  (cd "$WS/base" && "$RC" evaluate "$v" "${SETS[@]}")
done
(cd "$WS/base" && "$RC" ensemble "${SETS[@]}")

# 3. the student, for each T:ALPHA
for config in "${CONFIGS[@]}"; do
  T=${config%%:*} ALPHA=${config##*:}
  here="$WS/T$T-a$ALPHA"
  [ -d "$here" ] || cp -a "$WS/base" "$here"
  # the workspace's settings whole, written once: distill reads them, and so does
  # bench/serve.py --workdir "$here" --params "$here/params.yaml"
  (cd "$here" && "$RC" config "${SETS[@]}" --set "distill.student=$STUDENT" \
    --set "distill.temperature=$T" --set "distill.alpha=$ALPHA" --set "train.seed=$SEED" \
    --set train.epochs=1000 --set train.eval_every=50 --set train.max_steps=0 \
    --set "models.$STUDENT.max_steps=0" --set "train.max_minutes=$MINUTES" \
    --set "models.$STUDENT.max_minutes=$MINUTES" > params.yaml)
  (cd "$here" && "$RC" distill --params params.yaml)
done

# 4. the same network alone for the student's minutes, gold spans only (at 3 minutes, the
#    member itself: the same network, seed and minutes)
EQUAL=bench/out/accuracy-equal-$SEED.json
[ "$MINUTES" = 3 ] && EQUAL=bench/out/accuracy-members-$SEED.json
if [ ! -f "$EQUAL" ]; then
  $PY bench/accuracy.py --preset cpu --minutes "$MINUTES" --versions 1.1 --first-seed "$SEED" \
    --variants "$STUDENT" --tag "equal-$SEED"
fi

$PY - "$WS" "$STUDENT" "$EQUAL" "${CONFIGS[@]}" <<'EOF'
import json, sys
from pathlib import Path

ws, student, equal_file, configs = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
read = lambda p: json.loads(Path(p).read_text())
members = {v: read(ws / "base" / "metrics" / f"{v}.json")["f1"]
           for v in ("bidaf", "bidaf_selfattn", "rnet", "rnet_mult", "qanet")}
ensemble = read(ws / "base" / "metrics" / "ensemble.json")  # ensemble.method's scores
how = read(ws / "base" / "metrics" / "ensemble.methods.json")  # and every method's
students = {}
for c in configs:
    t, a = c.split(":")
    here = ws / f"T{t}-a{a}"
    s = read(here / "models" / "student" / "summary.json")
    students[c] = {"test_f1": read(here / "metrics" / "student.json")["f1"],
                   "heldout_f1": s.get("best_heldout_f1"), "steps": s["steps"],
                   "train_minutes": round(s["train_seconds"] / 60, 2)}
chosen = max(students, key=lambda c: students[c]["heldout_f1"] or 0)  # on held-out alone
equal = read(equal_file)["versions"]["1.1"]["variants"][student]
best = max(members.values())
teacher = ensemble["f1"]
out = {"members": members, "best_member": best, "ensemble_method": how["method"],
       "teacher_f1": teacher, "methods_f1": {m: x["f1"] for m, x in how["methods"].items()}, "students": students, "chosen_on_heldout": chosen,
       "student_f1": students[chosen]["test_f1"],
       "equal_cost": {"test_f1": equal["best_test_f1"]["mean"], "steps": equal["steps"]["mean"]},
       "student_minus_teacher": students[chosen]["test_f1"] - teacher,
       "student_minus_best_member": students[chosen]["test_f1"] - best}
(ws / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
EOF
