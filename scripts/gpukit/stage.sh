#!/usr/bin/env bash
# On the GPU machine, repo root: copy one carried part of the vLLM 0.33.0 kit into /tmp/kit33 (kept
# while the machine stays warm). Part p01 brings this script; the others run it from /tmp/kit33.
set -e
part="${1:?usage: stage.sh pNN}"
mkdir -p /tmp/kit33
cp -r ".gpukit033/$part/." /tmp/kit33/
echo "staged $part: $(ls /tmp/kit33 | wc -l) files, $(du -sh /tmp/kit33 | cut -f1)"
