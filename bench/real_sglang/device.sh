#!/bin/bash
# Device side (the lent H200), from the checkout's root. Steps, one device call each, each
# within 30 s of the last (a warm machine keeps /tmp, not ignored folders of the checkout):
#   deps       carry [".whl"]          unpack the pipeline's deps into /tmp/expdeps, then run
#                                      the contract tests on the simulator under Python 3.12
#   e2e ROWS   carry [".real-sglang"]  the 27B job (job_27b.toml) on real SGLang, ROWS prompts
#   fleet      carry [".real-sglang"]  3 tiny-model servers on the one GPU through the
#                                      pipeline, then the live contract tests against one
# Results go to $OUT (at most 8 files come back): logs and a tar of the output folder.
set -uo pipefail
D=/tmp/expdeps; ROOT=$PWD
export PYTHONUNBUFFERED=1 PREFECT_HOME=/tmp/prefect-home
printf '#!/bin/bash\nunset PYTHONPATH\nexec bash %s/.real-sglang/run.sh python3 "$@"\n' "$ROOT" > /tmp/sglpy
chmod +x /tmp/sglpy
case "${1:-}" in
deps)
  mkdir -p $D && tar -xJf .whl/rest.tar.xz -C $D && tar -xJf .whl/polars.tar.xz -C $D &&
    python3 -c "import zipfile,glob; [zipfile.ZipFile(f).extractall('$D') for f in glob.glob('.whl/asyncpg-*.whl')]" || exit 3
  PYTHONPATH=$D:$ROOT python3 -m pytest -q -p no:cacheprovider tests/contract tests/unit 2>&1 | tee $OUT/deps-tests.log
  ;;
e2e)
  [ -d $D/prefect ] || { echo "no /tmp/expdeps: run 'deps' first on this machine"; exit 5; }
  PYTHONPATH=$D:$ROOT python3 bench/real_sglang/make_prompts.py --rows "${2:-2000}" --out /tmp/p27.jsonl
  rm -rf /tmp/e2e
  PYTHONPATH=$D:$ROOT timeout 560 python3 -m expansion.cli run --config bench/real_sglang/job_27b_restart.toml \
    --prompts /tmp/p27.jsonl --output /tmp/e2e --set python=/tmp/sglpy 2>&1 | tee $OUT/e2e.log
  nvidia-smi > $OUT/nvidia-smi-after.txt 2>&1; tar -czf $OUT/e2e-output.tar.gz -C /tmp e2e
  ;;
fleet)
  [ -d $D/prefect ] || { echo "no /tmp/expdeps: run 'deps' first on this machine"; exit 5; }
  python3 - <<'PY' > /tmp/tiny.jsonl
import json
for i in range(3000):
    print(json.dumps({"id": i, "prompt": f"Write a short note number {i} about state caches."}))
PY
  rm -rf /tmp/fleet
  PYTHONPATH=$D:$ROOT timeout 400 python3 -m expansion.cli run --config bench/real_sglang/job_tiny_fleet.toml \
    --prompts /tmp/tiny.jsonl --output /tmp/fleet --set python=/tmp/sglpy 2>&1 | tee $OUT/fleet.log
  tar -czf $OUT/fleet-output.tar.gz -C /tmp fleet
  ;;
*) echo "usage: device.sh deps|e2e ROWS|fleet"; exit 2;;
esac
