#!/usr/bin/env bash
# Bring vime's Python stack to a GPU machine that has no package registry, as wheels in
# ≤54 MiB chunk folders that travel one per call (see README.md beside this file).
#
# Here (a machine with PyPI):
#   bash scripts/device/wheels.sh stage               # both sets: trainer, then vllm
#   bash scripts/device/wheels.sh stage trainer       # megatron-core and vime's missing deps
# There (the GPU machine; the repository root is the working directory):
#   bash scripts/device/wheels.sh install             # keep the carried chunks, install complete sets
#   export PYTHONPATH=/tmp/site:$PWD
#   bash scripts/device/wheels.sh venv                # .venv for scripts/main.sh: the image's
#                                                     # venv (or one on its Python) + vime -e
#
# Layout: .device/wheels/<set>/chunk-NN/ (ignored by git). chunk-00 of each set holds its
# MANIFEST (sha256 and name of every wheel). A wheel over the chunk size is cut with
# `split` into NAME.part-aa, NAME.part-ab, … and joined again by `install`.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/scripts/device"
stage_dir="$root/.device/wheels"
# On the GPU machine: where carried chunks are kept between calls (a carried folder that the
# next call does not name is removed there), and where the wheels are installed.
keep=${VIME_WHEEL_CACHE:-/tmp/vime-wheels}
site=${VIME_SITE:-/tmp/site}
# 54, not 60: a device call carries the working tree and the chunk together, 64 MiB in all;
# a 60 MiB chunk plus the tree (≈4 MiB of files) went over it. 54 leaves ~6 MiB for the
# tree to grow. Raise VIME_CHUNK_MIB only where the limit is larger.
chunk_mib=${VIME_CHUNK_MIB:-54}
pip=(${PIP:-python3 -m pip})
say() { printf '[wheels] %s\n' "$*"; }

# pip matches manylinux tags exactly: name every glibc level a wheel of this stack uses.
platforms=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 \
  manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done

requirements() { grep -v '^\s*#' "$here/requirements-$1.txt" | grep -v '^\s*$'; }

download() { # download SET into DIR
  local set=$1 dir=$2 req
  mkdir -p "$dir"
  while read -r req; do
    if [ "$req" = "antlr4-python3-runtime==4.9.3" ]; then
      # Only an sdist exists; it is pure Python, so a wheel built here runs there.
      "${pip[@]}" wheel -q --no-deps --no-binary :all: -w "$dir" "$req"
    else
      "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --abi cp312 --abi abi3 --abi none "${platforms[@]}" \
        -d "$dir" "$req"
    fi
  done < <(requirements "$set") 2> >(grep -v "is ignored: it is neither a file" >&2)
  local want have
  want=$(requirements "$set" | wc -l)
  have=$(find "$dir" -maxdepth 1 -name '*.whl' | wc -l)
  [ "$want" = "$have" ] || { say "$set: $have wheels for $want requirements in $dir"; exit 1; }
}

layout() { # cut the wheels of SET (in DIR) into chunk folders under $stage_dir/SET
  local set=$1 dir=$2 out="$stage_dir/$1"
  rm -rf "$out" "$dir/parts"
  mkdir -p "$out/chunk-00"
  : > "$out/chunk-00/PARTS"
  (cd "$dir" && sha256sum -- *.whl) > "$out/chunk-00/MANIFEST"
  python3 - "$dir" "$out" "$chunk_mib" <<'PY'
import os, shutil, subprocess, sys
src, out, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
limit = mib * 1024 * 1024
manifest = os.path.getsize(os.path.join(out, "chunk-00", "MANIFEST")) + 4096  # and PARTS
items = []  # (size, path) of whole wheels and of the parts of big ones
for name in sorted(os.listdir(src)):
    path = os.path.join(src, name)
    if not name.endswith(".whl"):
        continue
    if os.path.getsize(path) <= limit - manifest:
        items.append((os.path.getsize(path), path))
        continue
    parts = os.path.join(src, "parts")
    os.makedirs(parts, exist_ok=True)
    subprocess.run(["split", "-b", f"{mib}M", path, os.path.join(parts, name + ".part-")], check=True)
    mine = sorted(p for p in os.listdir(parts) if p.startswith(name + ".part-"))
    with open(os.path.join(out, "chunk-00", "PARTS"), "a") as f:
        f.write(f"{name} {len(mine)}\n")  # install joins only once all parts are there
    for p in mine:
        q = os.path.join(parts, p)
        items.append((os.path.getsize(q), q))
# First fit, largest first: few chunks, each under the limit.
chunks = [[manifest, []]]
for size, path in sorted(items, reverse=True):
    for c in chunks:
        if c[0] + size <= limit:
            break
    else:
        c = [0, []]
        chunks.append(c)
    c[0] += size
    c[1].append(path)
for i, (size, paths) in enumerate(chunks):
    folder = os.path.join(out, f"chunk-{i:02d}")
    os.makedirs(folder, exist_ok=True)
    for p in paths:
        shutil.copy2(p, folder)
    print(f"[wheels] {os.path.basename(out)}/chunk-{i:02d}: {len(paths)} files, {size / 2**20:.1f} MiB")
PY
}

stage() {
  local sets=("$@")
  [ ${#sets[@]} -gt 0 ] || sets=(trainer vllm)
  for set in "${sets[@]}"; do
    [ -f "$here/requirements-$set.txt" ] || { say "no requirements-$set.txt"; exit 2; }
    local dl="$root/.device/download/$set"
    say "$set: downloading into $dl"
    download "$set" "$dl"
    layout "$set" "$dl"
  done
  say "carry one chunk folder per call; README.md says in which order"
}

install() {
  mkdir -p "$keep" "$site"
  # Keep whatever chunks this call carried.
  for chunk in "$root"/.device/wheels/*/chunk-*; do
    [ -d "$chunk" ] || continue
    local set
    set=$(basename "$(dirname "$chunk")")
    mkdir -p "$keep/$set"
    cp -f "$chunk"/* "$keep/$set/"
    say "kept $set/$(basename "$chunk")"
  done
  local status=0
  for dir in "$keep"/*/; do
    local set
    set=$(basename "$dir")
    [ -f "$site/.vime-$set" ] && { say "$set: already installed in $site"; continue; }
    [ -f "$dir/MANIFEST" ] || { say "$set: chunk-00 (the MANIFEST) not carried yet"; continue; }
    # Join the parts of cut wheels once all are here (split names them in order: aa, ab, …).
    local name count missing=0
    while read -r name count; do
      [ -f "$dir/$name" ] && continue
      if [ "$(find "$dir" -maxdepth 1 -name "$name.part-*" | wc -l)" = "$count" ]; then
        cat "$dir/$name".part-* > "$dir/$name.tmp" && mv "$dir/$name.tmp" "$dir/$name"
      fi
    done < "$dir/PARTS"
    for name in $(awk '{print $2}' "$dir/MANIFEST"); do
      [ -f "$dir/$name" ] || missing=$((missing + 1))
    done
    if [ $missing -gt 0 ]; then
      say "$set: $missing wheels still missing (carry the remaining chunks)"
      continue
    fi
    if ! (cd "$dir" && sha256sum --quiet -c MANIFEST); then
      say "$set: checksum mismatch (a chunk was cut short?)"
      status=1
      continue
    fi
    # --no-deps: the image already holds the rest, and one version of each package is kept.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" $(awk -v d="$dir" '{print d "/" $2}' "$dir/MANIFEST")
    touch "$site/.vime-$set"
    say "$set: installed $(wc -l < "$dir/MANIFEST") wheels into $site"
  done
  return $status
}

venv() {
  # scripts/setup.sh (VIME_PREINSTALLED=1) and main.sh run .venv/bin/*: point .venv at the
  # image's own venv where there is one (its torch is the CUDA build the wheels expect),
  # else make one that sees the image's packages; then install vime into it, offline.
  local image=${VIME_IMAGE_VENV:-/opt/torch/.venv}
  if [ -L "$root/.venv" ] || [ ! -e "$root/.venv" ]; then
    if [ -x "$image/bin/python" ]; then
      ln -sfn "$image" "$root/.venv"
      say ".venv -> $image"
    else
      python3 -m venv --system-site-packages "$root/.venv"
      say ".venv: a new venv over $(python3 -c 'import sys; print(sys.prefix)')"
    fi
  fi
  PYTHONPATH="$site" "$root/.venv/bin/python" -m pip install -q --no-index --no-deps \
    --no-build-isolation -e "$root"
  say "vime installed in .venv; run with PYTHONPATH=$site VIME_PREINSTALLED=1"
}

case "${1:-}" in
  stage) shift; stage "$@" ;;
  install) install ;;
  venv) venv ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
