#!/usr/bin/env bash
# cmake --install gives libchorus.so, the headers, collbench, chorusrun, chorus-train, chorus-plan, chorus-plot,
# a CMake package and a pkg-config file; a program built against each of the last two runs on 2
# ranks, and the installed chorus-train runs a short job on 2 ranks and draws its loss curve with the
# installed chorus-plot.
source "$(dirname "$0")/lib.sh"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/chorus/chorus.h include/chorus/chorus.hpp bin/collbench bin/chorusrun bin/chorus-train bin/chorus-plan bin/chorus-plot; do
  [ -e "$prefix/$f" ] || fail "missing $f"
done
libdir=$(dirname "$(find "$prefix" -name 'libchorus.so' | head -n 1)")
[ -n "$libdir" ] || fail "libchorus.so not installed"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# CMake package
cmake -S "$source_dir/tests/e2e/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
"$prefix/bin/chorusrun" -n 2 "$work/consumer/consumer_cxx" | tee "$work/cxx.txt"
[ "$(grep -c 'consumer ok' "$work/cxx.txt")" = 2 ] || fail "C++ consumer (find_package) did not pass on both ranks"
# pkg-config, from C
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c11 -Wall -Werror "$source_dir/tests/e2e/consumer/consumer.c" -o "$work/consumer_c" $(pkg-config --cflags --libs chorus)
"$prefix/bin/chorusrun" -n 3 "$work/consumer_c" | tee "$work/c.txt"
[ "$(grep -c 'consumer ok' "$work/c.txt")" = 3 ] || fail "C consumer (pkg-config) did not pass on every rank"
"$prefix/bin/collbench" -g 2 -b 1K -e 1K >/dev/null || fail "installed collbench failed"
"$prefix/bin/chorus-plan" --model gpt2-124m --devices 8 --micro 4 --global 32 | grep -q "fits in memory" ||
  fail "installed chorus-plan failed"
train_out="$work/train"
"$prefix/bin/chorus-train" "$source_dir/tests/data/jobs/parity.toml" --ranks 2 --steps 3 --out "$train_out" \
  >"$work/train.log" 2>&1 || { cat "$work/train.log"; fail "installed chorus-train failed"; }
grep -q "drawn by $prefix/bin/chorus-plot" "$work/train.log" || { cat "$work/train.log"; fail "chorus-train did not use the installed chorus-plot"; }
[ -s "$train_out/loss.png" ] || fail "no loss curve from the installed chorus-train"
echo "install ok"
