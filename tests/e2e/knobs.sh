#!/usr/bin/env bash
# docs/knobs.md is chorus-knobs' output (regenerate: build/release/chorus-knobs > docs/knobs.md),
# and every CHORUS_ variable the sources read from the environment is on it.
source "$(dirname "$0")/lib.sh"
"$build/chorus-knobs" >"$work/knobs.md"
diff -u "$source_dir/docs/knobs.md" "$work/knobs.md" ||
  fail "docs/knobs.md is stale: regenerate it with chorus-knobs > docs/knobs.md"
# Variables read with getenv / setenv / firstEnv anywhere in the sources (test scripts excluded).
grep -rhoE '(getenv|firstEnv|setenv)\(\{?"CHORUS_[A-Z0-9_]+"' "$source_dir"/src "$source_dir"/kernels \
  "$source_dir"/tools "$source_dir"/bench "$source_dir"/include --include='*.cc' --include='*.h' --include='*.hpp' |
  grep -oE 'CHORUS_[A-Z0-9_]+' | sort -u >"$work/read.txt"
[ -s "$work/read.txt" ] || fail "found no variable read in the sources"
missing=0
while read -r name; do
  grep -q "| \`$name\` |" "$work/knobs.md" || { echo "not on docs/knobs.md: $name"; missing=1; }
done <"$work/read.txt"
[ "$missing" = 0 ] || fail "variables read by the sources are missing from src/base/knob_table.h"
echo "docs/knobs.md lists all $(grep -c '^| `CHORUS_' "$work/knobs.md") variables; $(wc -l <"$work/read.txt") are read directly by name"
