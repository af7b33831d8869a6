#!/usr/bin/env bash
# Fetches into .whl/ the wheels that the lent GPU machine lacks for scripts/gpu_check.py, so
# that its run starts with one install line (issue 55). Run here, from anywhere in the checkout:
#
#     bash scripts/gpu_wheels.sh
#
# The machine (/work/.library/device/KINDS.md: Python 3.12, x86-64, no package registry) has
# torch, jax with its CUDA plugin, flax, optax, equinox, einops, numba, numpy, scipy, h5py,
# tqdm, pyyaml, matplotlib, rich, typing-extensions, pytest and hypothesis. It lacks netket
# 3.23 and these of its requirements: igraph (and igraph's texttable), orjson, plum-dispatch
# (and its beartype) and sparse; and vitqs itself, built here from the working tree. The
# versions are those the CPU machine runs netket 3.23 with; one version of each, since two
# stop the whole install. About 9 MiB in all.
#
# On the GPU machine (the device tool's run, carry [".whl"]):
#
#     python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#         --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
#
# The wheels are never committed: .whl/ is in .gitignore (and in .git/info/exclude if not).
set -euo pipefail

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$root"
wheels="$root/.whl"

# netket and its pure-Python or manylinux requirements that the GPU image has not
packages=(
    netket==3.23.0
    igraph==1.0.0
    texttable==1.7.2
    orjson==3.13.0
    plum-dispatch==2.10.1
    beartype==0.23.1
    sparse==0.19.3
)

if ! git check-ignore -q .whl/probe.whl; then
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    echo '/.whl/' >>"$exclude"
fi
rm -rf "$wheels"
mkdir -p "$wheels"

python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$wheels" "${packages[@]}"

# vitqs from the working tree as it is (uncommitted edits included), built in a copy so that
# no build/ or egg-info lands in the checkout
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
git ls-files -z --cached --others --exclude-standard |
    tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$build"
python3 -m pip wheel --no-deps --no-build-isolation -q "$build" -w "$wheels"

ls -l "$wheels"
du -sh "$wheels"
