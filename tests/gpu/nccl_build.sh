#!/usr/bin/env bash
# Builds an NCCL release from source for the GPU in this machine, for running zcta
# under an NCCL newer than torch's wheel (tests/gpu/newer_nccl.sh uses it). Only the
# device functions a one-GPU machine runs are compiled (a one-rank collective takes
# NCCL's one-rank path; send/recv to itself runs the SendRecv kernel), for the local
# GPU's architecture alone, so the build fits in a few minutes on 16 cores.
#   git -C NCCL_REPO archive --prefix=nccl/ v2.30.7-1 | gzip > .carry/nccl-2.30.7.tar.gz
#   bash tests/gpu/nccl_build.sh .carry/nccl-2.30.7.tar.gz DEST
# DEST/lib/libnccl.so.2 afterwards. Env: ONLY_FUNCS (NCCL's own filter, default
# "SendRecv|AllReduce Sum f32 * *"), JOBS (default: all cores), ARCH (default: the
# first GPU's compute capability, e.g. 90).
set -euo pipefail
tarball=$(realpath "$1")
dest=$(realpath -m "$2")
arch=${ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')}
work=$(mktemp -d)
tar xzf "$tarball" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)
cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
echo "building $(basename "$tarball") for sm_$arch with $(nvcc --version | tail -1)"
make -C "$src" -j"${JOBS:-$(nproc)}" src.build CUDA_HOME="$cuda_home" \
  NVCC_GENCODE="-gencode=arch=compute_$arch,code=sm_$arch" \
  ONLY_FUNCS="${ONLY_FUNCS:-SendRecv|AllReduce Sum f32 * *}" BUILDDIR="$dest"
ls -la "$dest/lib"
