#!/usr/bin/env bash
# The layer rule, both ways it is enforced: tools/check-layers passes on this tree and names file
# and line of an upward include planted in a copy (and a table row whose arrow points up); the
# build's layer views refuse the same include, and take it in the layer allowed to make it.
# Arguments: the source root, the build folder, the C++ compiler, then extra -I folders (fmt's).
set -euo pipefail
root=$1 build=$2 cxx=$3
shift 3
extra=()
IFS=';' read -ra dirs <<<"$*"  # CMake hands a list joined by semicolons
for dir in "${dirs[@]}"; do [ -n "$dir" ] && extra+=("-I$dir"); done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$root/tools/check-layers" --root "$root" || fail "check-layers fails on the tree itself"

# A copy with a transport including the bootstrap (the core, above it).
mkdir -p "$work/tree"
cp -r "$root/docs" "$root/src" "$root/kernels" "$root/include" "$root/bench" "$root/tests" "$root/tools" "$work/tree/"
sed -i '1i #include "src/core/bootstrap.h"' "$work/tree/src/transport/self.cc"
if "$root/tools/check-layers" --root "$work/tree" >"$work/out.txt" 2>&1; then
  cat "$work/out.txt"; fail "check-layers passed a transport including src/core/bootstrap.h"
fi
grep -q "^src/transport/self.cc:1: includes src/core/bootstrap.h" "$work/out.txt" ||
  { cat "$work/out.txt"; fail "check-layers did not name src/transport/self.cc:1"; }
echo "check-layers names the planted include: $(head -n 1 "$work/out.txt")"

# A table whose transport row names the core (an arrow pointing up).
sed -i '1d' "$work/tree/src/transport/self.cc"
sed -i 's#^\(| `src/transport/` |.*| \)`src/base/`#\1`src/core/` `src/base/`#' "$work/tree/docs/architecture.md"
if "$root/tools/check-layers" --root "$work/tree" >"$work/out.txt" 2>&1; then
  cat "$work/out.txt"; fail "check-layers passed a table whose transport row names src/core/"
fi
grep -q "the row of src/transport/ names src/core/" "$work/out.txt" || { cat "$work/out.txt"; fail "upward row not named"; }
echo "check-layers names the upward row"

# The build: the transport's view has no src/core, the core's has.
printf '#include "src/core/bootstrap.h"\n' >"$work/planted.cc"
if "$cxx" -std=c++20 -fsyntax-only "${extra[@]}" -I"$build/layers/src_transport" "$work/planted.cc" >"$work/cc.txt" 2>&1; then
  fail "the transport layer's view compiled an include of src/core/bootstrap.h"
fi
grep -q "src/core/bootstrap.h: No such file" "$work/cc.txt" || { cat "$work/cc.txt"; fail "the compiler failed for another reason"; }
"$cxx" -std=c++20 -fsyntax-only "${extra[@]}" -I"$build/layers/src_core" "$work/planted.cc" ||
  fail "the core layer's view did not compile its own include"
echo "the transport's view refuses src/core/bootstrap.h; the core's takes it"
