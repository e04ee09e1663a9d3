#!/bin/sh
# Usage: check_free_space.sh DIR MIN_GIB
# Fails with one line when the filesystem that will hold DIR has under MIN_GIB GiB free: a venv with
# PyPI's CUDA build of torch takes about 7 GiB, and pip stopping half-way with "[Errno 28] No space left
# on device" leaves a venv that neither works nor says why.
dir=$1
need=$2
probe=$dir
while [ ! -d "$probe" ]; do probe=$(dirname "$probe"); done
free_kib=$(df -Pk "$probe" | awk 'NR == 2 { print $4 }')
free_gib=$((free_kib / 1048576))
if [ "$free_gib" -lt "$need" ]; then
    echo "error: $free_gib GiB free on the filesystem of $dir, and the venv needs about $need GiB (torch's wheels): free some space (old clones, runs/, data_cache/) or make venv VENV=<a path on a larger disk>" >&2
    exit 1
fi
