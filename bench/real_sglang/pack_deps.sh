#!/bin/bash
# Here (the CPU machine): pack the pipeline's runtime dependencies for the device's Python
# 3.12 into .whl/ (ignored): rest.tar.xz and polars.tar.xz (53 MB: one call with the checkout),
# and the asyncpg wheel (prefect's server module imports it) into .whlx/, carried with
# .real-sglang (with the benchmark client's wheels: 7 MB, 55 MB with .real-sglang). Packages the device image already has (KINDS.md lists them: numpy,
# matplotlib and its own deps, pillow, pyarrow) stay out: with them the archives grew past
# what one call carries; so does Prefect's UI (device.sh runs with PREFECT_UI_ENABLED=false).
# `ls -la .whl` prints the sizes: with the checkout they must stay under one call's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=$(mktemp -d); mkdir -p .whl
PL="--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
python3 -m uv export --frozen --no-dev --no-hashes --no-emit-project | grep -v '^ *#' \
  | grep -v '^ ' | sed 's/ ;.*//' | grep -v -E '^(pywin32|pyarrow|numpy|matplotlib|pillow|contourpy|fonttools|kiwisolver|cycler|pyparsing)==' > "$T/req.txt"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp $PL -d "$T/w" -r "$T/req.txt"
mkdir "$T/site"; for f in "$T"/w/*.whl; do python3 -m zipfile -e "$f" "$T/site"; done
rm -rf "$T"/site/*.data "$T"/site/prefect/server/ui "$T"/site/prefect/server/ui-v2  # no UI there
find "$T/site" -name __pycache__ -prune -exec rm -rf {} +
(cd "$T/site/botocore/data" && for d in */; do case $d in s3/|sts/|sso/|sso-oidc/) ;; *) rm -rf "$d";; esac; done)
mkdir -p .whlx; mv "$T"/w/asyncpg-*.whl .whlx/  # rides with .real-sglang (device.sh unpacks it)
# SGLang's benchmark client (device.sh vsbench) needs aiohttp and tqdm, which neither the
# device image nor SGLang's runtime has: 3.3 MB of wheels beside asyncpg's
mkdir -p .whlx/bench; python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp $PL -d .whlx/bench aiohttp multidict yarl \
  frozenlist aiosignal propcache aiohappyeyeballs tqdm charset_normalizer
tar -C "$T/site" --exclude='./_polars_runtime_32*' --exclude='./polars_runtime_32*' \
  --exclude='./asyncpg*' -cf - . | xz -T0 -9 > .whl/rest.tar.xz
(cd "$T/site" && tar -cf - _polars_runtime_32 polars_runtime_32-*) | xz -T0 -9 > .whl/polars.tar.xz
ls -la .whl; rm -rf "$T"
