#!/bin/bash
# Here (the CPU machine): pack the pipeline's runtime dependencies for the device's Python
# 3.12 into .whl/ (ignored): rest.tar.xz (~25 MB), polars.tar.xz (~31 MB), the asyncpg wheel
# (prefect's server module imports it). Together ~57 MB: one device call carries them.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=$(mktemp -d); mkdir -p .whl
PL="--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
python3 -m uv export --frozen --no-dev --no-hashes --no-emit-project | grep -v '^ *#' \
  | grep -v '^ ' | sed 's/ ;.*//' | grep -v -E '^(pywin32|pyarrow)==' > "$T/req.txt"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp $PL -d "$T/w" -r "$T/req.txt"
mkdir "$T/site"; for f in "$T"/w/*.whl; do python3 -m zipfile -e "$f" "$T/site"; done
rm -rf "$T"/site/*.data; find "$T/site" -name __pycache__ -prune -exec rm -rf {} +
(cd "$T/site/botocore/data" && for d in */; do case $d in s3/|sts/|sso/|sso-oidc/) ;; *) rm -rf "$d";; esac; done)
mv "$T"/w/asyncpg-*.whl .whl/
tar -C "$T/site" --exclude='./_polars_runtime_32*' --exclude='./polars_runtime_32*' \
  --exclude='./asyncpg*' -cf - . | xz -T0 -9 > .whl/rest.tar.xz
(cd "$T/site" && tar -cf - _polars_runtime_32 polars_runtime_32-*) | xz -T0 -9 > .whl/polars.tar.xz
ls -la .whl; rm -rf "$T"
