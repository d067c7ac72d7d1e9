#!/usr/bin/env bash
# On the GPU machine, repo root: copy one carried part of a vLLM kit into its staging folder
# (/tmp/kit34 for 0.34.0; kept while the machine stays warm). Part p01 brings this script and
# kit.env (the version's folders); the others run it from the staging folder.
set -e
part="${1:?usage: stage.sh pNN}"
source "$(dirname "${BASH_SOURCE[0]}")/kit.env"
mkdir -p "$KIT_DIR"
cp -r "$KIT_PARTS/$part/." "$KIT_DIR/"
echo "staged $part: $(ls "$KIT_DIR" | wc -l) files, $(du -sh "$KIT_DIR" | cut -f1)"
