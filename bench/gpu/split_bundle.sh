#!/usr/bin/env bash
# Re-splits the vLLM bundle that build-bundle.sh writes (DEST/p1, p2, p3: parts of up to 57 MB)
# into parts a device call can carry beside this tree. A call carries the working tree (about
# 50 MiB, most of it bench/results/gpu_raw) plus its carry paths within 64 MiB, so a 57 MB part
# never fits; parts of PART_MB do, one a call (by default what the tree leaves of the 64 MiB,
# less 2 MiB; 10 outside a git checkout).
#
#     bash bench/gpu/split_bundle.sh [DEST]        # DEST: .gpu-bundle (git-ignored)
#
# Writes DEST/e00, e01, ... (one part each, named part.NN so device-setup.sh's `cat part.*`
# joins them in order) and DEST/j (device-setup.sh, the checksum, the tokenizer maker, models/,
# and what else p3 held but its part: the tabletune wheel and wheels/ when put there), then
# removes p1..p3. On the device: each eNN copied to /tmp/stage in turn, then
# `source .gpu-bundle/j/device-setup.sh` (docs: bench/README.md, "On the device machine").
# The joined parts are checked against p3's bundle.sha256 before anything is removed.
set -euo pipefail
dest=${1:-.gpu-bundle}
tree_bytes() {  # what a device call carries of this checkout: tracked and untracked-not-ignored
  git ls-files -z --cached --others --exclude-standard 2>/dev/null | xargs -0 -r du -cb 2>/dev/null \
    | tail -1 | cut -f1
}
if [[ -z ${PART_MB:-} ]]; then
  tree=$(tree_bytes || true)
  if [[ $tree =~ ^[0-9]+$ ]] && (( tree > 0 )); then
    PART_MB=$(( (64 * 1048576 - tree) / 1048576 - 2 ))
    (( PART_MB >= 1 )) || { echo "the tree ($tree bytes) leaves no room in a device call's 64 MiB" >&2; exit 2; }
  else
    PART_MB=10
  fi
fi
part_mb=$PART_MB
[[ $part_mb =~ ^[1-9][0-9]*$ ]] || { echo "PART_MB must be a positive integer, got '$part_mb'" >&2; exit 2; }
for p in p1 p2 p3; do
  [[ -d $dest/$p ]] || { echo "no $dest/$p: run build-bundle.sh first (or it was split already)" >&2; exit 2; }
done
[[ -f $dest/p3/bundle.sha256 ]] || { echo "no $dest/p3/bundle.sha256" >&2; exit 2; }
work=$(mktemp -d "$dest/.split.XXXXXX")
trap 'rm -rf "$work"' EXIT
cat "$dest"/p1/part.* "$dest"/p2/part.* "$dest"/p3/part.* > "$work/bundle.tar"
[[ $(sha256sum "$work/bundle.tar" | cut -d' ' -f1) == "$(cat "$dest/p3/bundle.sha256")" ]] \
  || { echo "the parts in $dest/p1..p3 do not join to the bundle bundle.sha256 names" >&2; exit 1; }
mkdir "$work/parts" "$work/j"
(cd "$work/parts" && split -b "${part_mb}M" -d -a 2 ../bundle.tar part.)
for f in "$work"/parts/part.*; do
  mkdir "$work/e${f##*.}" && mv "$f" "$work/e${f##*.}/"
done
find "$dest/p3" -mindepth 1 -maxdepth 1 ! -name 'part.*' -exec cp -r {} "$work/j/" \;
rm -rf "$dest"/p1 "$dest"/p2 "$dest"/p3 "$dest"/j "$dest"/e[0-9][0-9]
mv "$work"/e[0-9][0-9] "$work/j" "$dest/"
ls -d "$dest"/e[0-9][0-9] | wc -l | xargs -I{} echo "{} parts of ${part_mb} MB in $dest/eNN, the rest in $dest/j"
