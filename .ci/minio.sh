#!/usr/bin/env bash
# Installs the MinIO server the S3 repository tests run against, unless it is
# already installed, and prints its path. The binary is built from the Go
# module proxy (about two minutes on 2 cores) into a per-user cache directory
# that survives between CI runs on the same machine:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/warmstart/bin/minio
# Tests look for it there, in $WARMSTART_MINIO, or on PATH, and skip
# (naming this script) when it is missing.
#
# Usage from .ci/run:   export WARMSTART_MINIO="$(.ci/minio.sh)"
set -euo pipefail

MINIO_MODULE="github.com/minio/minio"
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"

bin_dir="${XDG_CACHE_HOME:-$HOME/.cache}/warmstart/bin"
minio="$bin_dir/minio"
stamp="$bin_dir/minio.version"

if [[ -x "$minio" && -f "$stamp" && "$(cat "$stamp")" == "$MINIO_VERSION" ]]; then
  echo "$minio"
  exit 0
fi

mkdir -p "$bin_dir"
echo "installing MinIO $MINIO_VERSION into $bin_dir (about 2 minutes)" >&2
# Outside any module, so the repository's go.mod is neither read nor changed.
(cd / && GOFLAGS=-mod=mod GOBIN="$bin_dir" go install "$MINIO_MODULE@$MINIO_VERSION") >&2
echo "$MINIO_VERSION" >"$stamp"
echo "$minio"
