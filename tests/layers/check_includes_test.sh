#!/usr/bin/env bash
# tools/check-includes passes on this tree, and names the file, the name and the header of a
# standard header left out of a copy (std::sort with <algorithm> removed), and of a name used with
# no header at all; the project's own headers count (a file gets what its own header includes).
set -euo pipefail
root=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$root/tools/check-includes" --root "$root" || fail "check-includes fails on the tree itself"

mkdir -p "$work/tree/src/core"
cat >"$work/tree/src/core/a.h" <<'CC'
#pragma once
#include <vector>
CC
cat >"$work/tree/src/core/a.cc" <<'CC'
#include "src/core/a.h"

#include <algorithm>

void f(std::vector<int>& v) { std::sort(v.begin(), v.end()); }  // std::printf in a comment
CC
"$root/tools/check-includes" --root "$work/tree" || fail "a file whose vector comes from its own header was refused"
sed -i '/#include <algorithm>/d' "$work/tree/src/core/a.cc"
echo 'const char* g() { return std::getenv("HOME"); }' >>"$work/tree/src/core/a.cc"
if "$root/tools/check-includes" --root "$work/tree" >"$work/out.txt" 2>&1; then
  cat "$work/out.txt"; fail "check-includes passed std::sort without <algorithm>"
fi
cat "$work/out.txt"
grep -q "^src/core/a.cc: uses std::sort without including <algorithm>$" "$work/out.txt" || fail "std::sort not named"
grep -q "^src/core/a.cc: uses std::getenv without including <cstdlib>$" "$work/out.txt" || fail "std::getenv not named"
if grep -q "printf" "$work/out.txt"; then fail "a name in a comment was counted"; fi
echo "check-includes names both misses"
