#!/bin/bash
# Device side (the lent H200), from the checkout's root. Steps, one device call each, each
# within 30 s of the last (a warm machine keeps /tmp, not the ignored folders of the checkout):
#   deps       carry [".whl"]          unpack the pipeline's deps into /tmp/expdeps, then run
#                                      the contract tests on the simulator under Python 3.12
#   warm       carry [".real-sglang"]  unpack SGLang into /tmp/real-sglang-rt, start the 27B
#                                      once (kernel JIT and triton caches land in /tmp), run
#                                      the live contract tests against it (input_ids)
#   warm35     carry [".real-sglang"]  start the 35B-A3B once (JIT) so `tune` starts warm
#   e2e ROWS   carry [".real-sglang"]  the restart cycle: job_27b_restart.toml, ROWS prompts
#   e2elong ROWS carry [".real-sglang"] the long-output restart cycle: job_27b_long.toml, ROWS
#                                      prompts with lognormal per-row max_new_tokens
#   pools PLAN [NAME] carry [".real-sglang"] start-up pools of many configurations, each server
#                                      killed once its pools are final (probe_pools.py)
#   fleet      carry [".real-sglang"]  the tiny model alone (OpenAI answers, live contract
#                                      tests with text and with the `openai` client), then 3
#                                      servers on the one GPU
#   canary N   carry [".real-sglang"]  a canary cycle on 3 tiny servers sharing the GPU
#                                      (job_tiny_canary.toml, N prompts)
#   outputs N  carry [".real-sglang"]  n=2, stop, JSON schema per row, integer ids and an
#                                      extra column through real SGLang with xgrammar
#   affinity G [--set K=V …]
#              carry [".real-sglang"]  G groups of 4 prompts sharing a long prefix, 3 servers:
#                                      prefix affinity off, then on (job_tiny_affinity.toml);
#                                      AFF_MODES=on runs only the second
#   limits [S] carry [".real-sglang"]  retraction under a small KV pool and prefix-cache reuse
#                                      under each mamba strategy (probe_limits.py)
#   vsbench TOML NAME ROWS IN OUT RATIO CONC
#              carry [".real-sglang", ".whlx"] (after deps) the pipeline against
#                                      `sglang.benchmark.serving` on the same server, prompts
#                                      and concurrency (vs_bench.py): one JSON line
#   tune ROWS [TIMEOUT_S] carry [".real-sglang", ".whlx"] (after deps) the tuner on the 35B-A3B
#                                      from SGLang's defaults (job_35b_tune.toml); again to resume
#   long PLAN [NAME] [BUDGET_S]
#              carry [".real-sglang"]  the servers and closed-loop workloads of a plan
#                                      (bench/real_sglang/plans/*.json, probe_long.py): long
#                                      mixed outputs, retraction, the cap's steady rate; needs
#                                      no deps (httpx comes with SGLang's runtime)
# Results go to $OUT (at most 8 files come back): logs and tars of the output folders.
set -uo pipefail
D=/tmp/expdeps; ROOT=$PWD; RT=/tmp/real-sglang-rt
export PYTHONUNBUFFERED=1 PREFECT_HOME=/tmp/prefect-home PREFECT_UI_ENABLED=false
# run.sh keeps its runtime next to the checkout, which does not survive between calls: the
# same script with the runtime (and its JIT caches) in /tmp, and SGLang's own environment
# for the pipeline's `python` setting.
sed -e "s#^H=.*#H=$ROOT/.real-sglang#" -e "s#^R=.*#R=$RT; mkdir -p \"\$R\"#" \
  .real-sglang/run.sh > /tmp/run-sglang.sh 2>/dev/null
printf '#!/bin/bash\nunset PYTHONPATH\nexec bash /tmp/run-sglang.sh python3 "$@"\n' > /tmp/sglpy
chmod +x /tmp/sglpy
need_deps() { [ -d $D/prefect ] || { echo "no /tmp/expdeps: run 'deps' first on this machine"; exit 5; }; }
# asyncpg (Prefect's server imports it) rides in .whlx/ with .real-sglang: unpack it when carried
[ -d $D ] && [ ! -d $D/asyncpg ] && ls .whlx/asyncpg-*.whl >/dev/null 2>&1 &&
  python3 -c "import zipfile,glob; [zipfile.ZipFile(f).extractall('$D') for f in glob.glob('.whlx/asyncpg-*.whl')]"
wait_health() {  # URL SECONDS
  python3 - "$1" "$2" <<'PY'
import sys, time, urllib.request
end = time.time() + float(sys.argv[2])
while time.time() < end:
    try:
        if urllib.request.urlopen(sys.argv[1] + "/health", timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(1)
sys.exit(1)
PY
}
stop_server() { kill -TERM -- "-$1" 2>/dev/null; wait "$1" 2>/dev/null; }
live_contract() {  # URL LOG TOKENIZED NAME
  EXPANSION_CONTRACT_URL=$1 EXPANSION_CONTRACT_LOG=$2 EXPANSION_CONTRACT_TOKENIZED=$3 \
    PYTHONPATH=$D:$ROOT python3 -m pytest -q -p no:cacheprovider tests/contract/test_live.py \
    2>&1 | tee "$OUT/contract-live-$4.log"
}
rows_json() {  # FOLDER (in /tmp): its shards' rows, distinct ids, columns and rows per config
  PYTHONPATH=$D:$ROOT python3 - "$1" <<'PY' | tee "$OUT/$1-rows.json"
import glob, json, sys
import polars as pl
files = sorted(glob.glob(f"/tmp/{sys.argv[1]}/shards/*.parquet"))
df = pl.concat([pl.read_parquet(f) for f in files]) if files else pl.DataFrame()
print(json.dumps({"rows": df.height, "unique_ids": df["id"].n_unique() if files else 0,
                  "columns": df.columns,
                  "by_config": df.group_by("config").len().to_dicts() if files else []}))
PY
}
SGL_COMMON=(--load-format dummy --attention-backend triton --sampling-backend pytorch
            --grammar-backend none --enable-metrics --host 127.0.0.1)
case "${1:-}" in
deps)
  mkdir -p $D && tar -xJf .whl/rest.tar.xz -C $D && tar -xJf .whl/polars.tar.xz -C $D &&
    python3 -c "import zipfile,glob; [zipfile.ZipFile(f).extractall('$D') for f in glob.glob('.whl/asyncpg-*.whl')]" || exit 3
  # (the openai client is not among these deps: its contract test runs in the fleet step)
  PYTHONPATH=$D:$ROOT python3 -m pytest -q -p no:cacheprovider tests/contract \
    --ignore=tests/contract/test_openai_client.py 2>&1 | tee $OUT/deps-tests.log
  ;;
warm)
  need_deps; t0=$(date +%s)
  setsid /tmp/sglpy -m sglang.launch_server --model-path .real-sglang/models/qwen3.6-27b-text \
    "${SGL_COMMON[@]}" --skip-tokenizer-init --mem-fraction-static 0.9 \
    --mamba-radix-cache-strategy extra_buffer --mamba-full-memory-ratio 0.3 --port 30000 \
    > /tmp/q27-warm.log 2>&1 & pid=$!
  wait_health http://127.0.0.1:30000 400; echo "27B healthy after $(( $(date +%s)-t0 )) s" | tee $OUT/warm.txt
  live_contract http://127.0.0.1:30000 /tmp/q27-warm.log 1 q27b
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/server_info').read().decode())" > $OUT/q27b-ratio03.server_info.json
  stop_server $pid; cp /tmp/q27-warm.log $OUT/q27b-warm.server.log
  ;;
warm35)
  # the 35B-A3B once at SGLang's defaults (its kernels JIT-compiled into /tmp): the tune step's
  # first start is then a warm one, and the restart its payback rule charges is too
  t0=$(date +%s)
  setsid /tmp/sglpy -m sglang.launch_server --model-path bench/real_sglang/models/qwen3.6-35b-a3b-text \
    "${SGL_COMMON[@]}" --skip-tokenizer-init --port 30000 > /tmp/q35-warm.log 2>&1 & pid=$!
  wait_health http://127.0.0.1:30000 400; echo "35B healthy after $(( $(date +%s)-t0 )) s" | tee $OUT/warm35.txt
  stop_server $pid; gzip -c /tmp/q35-warm.log > $OUT/q35-warm.server.log.gz
  ;;
e2e)
  need_deps
  PYTHONPATH=$D:$ROOT python3 bench/real_sglang/make_prompts.py --rows "${2:-2500}" --out /tmp/p27.jsonl
  rm -rf /tmp/e2e
  PYTHONPATH=$D:$ROOT timeout 565 python3 -m expansion.cli run --config bench/real_sglang/job_27b_restart.toml \
    --prompts /tmp/p27.jsonl --output /tmp/e2e --set python=/tmp/sglpy 2>&1 | tee $OUT/e2e.log
  nvidia-smi > $OUT/nvidia-smi-after.txt 2>&1; tar -czf $OUT/e2e-output.tar.gz -C /tmp e2e
  ;;
e2elong)
  need_deps
  PYTHONPATH=$D:$ROOT python3 bench/real_sglang/make_prompts.py --rows "${2:-480}" \
    --input-range 128 1024 --out-mean 800 --out-p99 4000 --out-max 4096 --out /tmp/p27long.jsonl
  rm -rf /tmp/e2elong
  PYTHONPATH=$D:$ROOT timeout "${3:-565}" python3 -m expansion.cli run --config bench/real_sglang/job_27b_long.toml \
    --prompts /tmp/p27long.jsonl --output /tmp/e2elong --set python=/tmp/sglpy 2>&1 | tee $OUT/e2elong.log
  tar -czf $OUT/e2elong-output.tar.gz --exclude='*.parquet' -C /tmp e2elong
  rows_json e2elong
  ;;
tune)
  # the tuner from SGLang's defaults on the 35B-A3B shapes (job_35b_tune.toml); run it again
  # with the same ROWS to resume the same output folder (kept in /tmp while the machine is warm)
  need_deps
  [ -f /tmp/p35.jsonl ] || PYTHONPATH=$D:$ROOT python3 bench/real_sglang/make_prompts.py \
    --rows "${2:-14000}" --input-len 1024 --vocab 240000 --out /tmp/p35.jsonl
  PYTHONPATH=$D:$ROOT timeout "${3:-550}" python3 -m expansion.cli run --config bench/real_sglang/job_35b_tune.toml \
    --prompts /tmp/p35.jsonl --output /tmp/tune35 --set python=/tmp/sglpy 2>&1 | tee $OUT/tune35.log
  tar -czf $OUT/tune35-output.tar.gz --exclude='*.parquet' -C /tmp tune35
  rows_json tune35
  ;;
pools)
  cp -r bench/real_sglang/models/. .real-sglang/models/
  timeout 595 bash /tmp/run-sglang.sh python3 bench/real_sglang/probe_pools.py --plan "$2" \
    --out $OUT --name "${3:-pools}" --budget-s "${4:-560}" 2>&1 | tee $OUT/${3:-pools}.log
  ;;
fleet)
  need_deps; M=.real-sglang/models/tiny-qwen3-next; t0=$(date +%s)
  setsid /tmp/sglpy -m sglang.launch_server --model-path $M "${SGL_COMMON[@]}" \
    --mem-fraction-static 0.3 --cuda-graph-max-bs 32 --disable-prefill-cuda-graph \
    --mamba-radix-cache-strategy extra_buffer --port 30100 > /tmp/tiny.log 2>&1 & pid=$!
  wait_health http://127.0.0.1:30100 300; echo "tiny healthy after $(( $(date +%s)-t0 )) s" | tee $OUT/tiny.txt
  PYTHONPATH=$D:$ROOT python3 bench/real_sglang/capture_answers.py http://127.0.0.1:30100 $M $OUT/tiny-answers.json
  live_contract http://127.0.0.1:30100 /tmp/tiny.log 0 tiny
  # the official client against real SGLang (openai comes with SGLang's runtime)
  EXPANSION_CONTRACT_URL=http://127.0.0.1:30100 PYTHONPATH=$D:$ROOT:$RT/site python3 -m pytest \
    -q -p no:cacheprovider tests/contract/test_openai_client.py 2>&1 | tee "$OUT/contract-openai-tiny.log"
  stop_server $pid; cp /tmp/tiny.log $OUT/tiny.server.log
  python3 - <<'PY' > /tmp/tiny.jsonl
import json
for i in range(3000):
    print(json.dumps({"id": i, "prompt": f"Write a short note number {i} about state caches."}))
PY
  rm -rf /tmp/fleet
  PYTHONPATH=$D:$ROOT timeout 300 python3 -m expansion.cli run --config bench/real_sglang/job_tiny_fleet.toml \
    --prompts /tmp/tiny.jsonl --output /tmp/fleet --set python=/tmp/sglpy 2>&1 | tee $OUT/fleet.log
  tar -czf $OUT/fleet-output.tar.gz -C /tmp fleet
  ;;
canary)
  need_deps
  python3 - "${2:-12000}" <<'PY' > /tmp/tiny-canary.jsonl
import json, sys
for i in range(int(sys.argv[1])):
    print(json.dumps({"id": i, "prompt": f"Write a short note number {i} about state caches."}))
PY
  rm -rf /tmp/canary
  PYTHONPATH=$D:$ROOT timeout 560 python3 -m expansion.cli run --config bench/real_sglang/job_tiny_canary.toml \
    --prompts /tmp/tiny-canary.jsonl --output /tmp/canary --set python=/tmp/sglpy "${@:3}" 2>&1 | tee $OUT/canary.log
  nvidia-smi > $OUT/nvidia-smi-after-canary.txt 2>&1; tar -czf $OUT/canary-output.tar.gz -C /tmp canary
  ;;
outputs)
  need_deps
  PYTHONPATH=$D:$ROOT python3 bench/real_sglang/check_outputs.py make /tmp/outputs-in.jsonl "${2:-400}"
  rm -rf /tmp/outputs
  PYTHONPATH=$D:$ROOT timeout 500 python3 -m expansion.cli run --config bench/real_sglang/job_tiny_outputs.toml \
    --prompts /tmp/outputs-in.jsonl --output /tmp/outputs --set python=/tmp/sglpy 2>&1 | tee $OUT/outputs.log
  PYTHONPATH=$D:$ROOT python3 bench/real_sglang/check_outputs.py check /tmp/outputs-in.jsonl /tmp/outputs \
    | tee $OUT/outputs-check.json
  tar -czf $OUT/outputs-output.tar.gz -C /tmp outputs
  ;;
affinity)
  need_deps
  python3 - "${2:-1200}" <<'PY' > /tmp/affinity.jsonl
import json, random, sys
words = ("state cache request token batch decode prefill memory slot pool server shard plan "
         "queue mamba attention layer kernel graph prompt answer reason data train value").split()
for g in range(int(sys.argv[1])):
    rng = random.Random(g)
    doc = " ".join(rng.choice(words) for _ in range(700))
    for k in range(4):
        print(json.dumps({"id": 4 * g + k, "prompt": f"Document {g}: {doc}\n\nQuestion {k}: "
                          f"what does line {k} say about {rng.choice(words)}?"}))
PY
  for mode in ${AFF_MODES:-off on}; do  # AFF_MODES=on: only the affinity run
    chars=1024; [ $mode = off ] && chars=0
    rm -rf /tmp/aff-$mode
    PYTHONPATH=$D:$ROOT timeout 280 python3 -m expansion.cli run --config bench/real_sglang/job_tiny_affinity.toml \
      --prompts /tmp/affinity.jsonl --output /tmp/aff-$mode --set python=/tmp/sglpy \
      --set client.prefix_affinity_chars=$chars "${@:3}" 2>&1 | tee $OUT/affinity-$mode.log
    PYTHONPATH=$D:$ROOT python3 - /tmp/aff-$mode <<'PY' | tee $OUT/affinity-$mode.json
import glob, json, sys
import polars as pl
df = pl.concat([pl.read_parquet(f) for f in sorted(glob.glob(sys.argv[1] + "/shards/*.parquet"))])
print(json.dumps({"rows": df.height, "unique_ids": df["id"].n_unique(),
                  "prompt_tokens": int(df["prompt_tokens"].sum()),
                  "cached_tokens": int(df["cached_tokens"].sum()),
                  "cached_share": round(df["cached_tokens"].sum() / df["prompt_tokens"].sum(), 4),
                  "by_server": df.group_by("server").agg(pl.len(), pl.col("cached_tokens").sum(),
                                                        pl.col("prompt_tokens").sum()).sort("server").to_dicts()}))
PY
    tar -czf $OUT/aff-$mode.tar.gz --exclude='*.parquet' -C /tmp aff-$mode
  done
  ;;
limits)
  need_deps
  PYTHONPATH=$D:$ROOT timeout 590 python3 bench/real_sglang/probe_limits.py --out $OUT \
    --budget-s "${2:-540}" "${@:3}" 2>&1 | tee $OUT/limits.log
  ;;
vsbench)
  need_deps
  mkdir -p /tmp/benchdeps && python3 -c "import zipfile,glob; [zipfile.ZipFile(f).extractall('/tmp/benchdeps') for f in glob.glob('.whlx/bench/*.whl')]"
  PYTHONPATH=$D:$ROOT timeout 590 python3 bench/real_sglang/vs_bench.py --config "$2" --name "$3" \
    --rows "$4" --input-len "$5" --output-len "$6" --ratio "$7" --conc "$8" --out "/tmp/vs-$3" \
    2> >(tee "$OUT/vs-$3.stderr" >&2) | tee "$OUT/vs-$3.json"
  tar -czf "$OUT/vs-$3.tar.gz" --exclude='*.parquet' --exclude=prompts.jsonl -C /tmp "vs-$3"
  ;;
long)
  cp -r bench/real_sglang/models/. .real-sglang/models/  # configs of shapes SGLang's copy lacks
  timeout 595 bash /tmp/run-sglang.sh python3 bench/real_sglang/probe_long.py --plan "$2" \
    --out $OUT --name "${3:-long}" --budget-s "${4:-560}" 2>&1 | tee $OUT/${3:-long}.log
  nvidia-smi > $OUT/nvidia-smi-${3:-long}.txt 2>&1
  ;;
*) echo "usage: device.sh deps|warm|e2e ROWS|fleet|canary ROWS|outputs ROWS|limits [BUDGET_S]|long PLAN [NAME] [BUDGET_S]"; exit 2;;
esac
