#!/usr/bin/env bash
# cmake --install gives libchorus.so, the headers, collbench (and chorus-tune, chorus-sim, which its
# --calibrate and --simulate run), chorusrun, chorus-train, chorus-plan, chorus-plot, a CMake
# package, a pkg-config file and (with the CUDA toolkit's nccl.h) libchorus_nccl.so; the examples
# (examples/: find_package, pkg-config, an NCCL program) are built against the installed copy and
# run, and the installed chorus-train runs a short job on 2 ranks and draws its loss curve with the
# installed chorus-plot.
source "$(dirname "$0")/lib.sh"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/chorus/chorus.h include/chorus/chorus.hpp include/chorus/chorus_mpi.h bin/collbench bin/chorusrun \
  bin/chorus-tune bin/chorus-sim bin/chorus-train bin/chorus-plan bin/chorus-plot bin/chorus-knobs bin/chorus-trace; do
  [ -e "$prefix/$f" ] || fail "missing $f"
done
libdir=$(dirname "$(find "$prefix" -name 'libchorus.so' | head -n 1)")
[ -n "$libdir" ] || fail "libchorus.so not installed"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# examples/find_package: CMake package
cmake -S "$source_dir/examples/find_package" -B "$work/find_package" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/find_package" >/dev/null
"$prefix/bin/chorusrun" -n 2 "$work/find_package/allgather" | tee "$work/cxx.txt"
[ "$(grep -c 'example ok' "$work/cxx.txt")" = 2 ] || fail "examples/find_package did not pass on both ranks"
# examples/pkg_config: C, with pkg-config
PKG_CONFIG_PATH="$libdir/pkgconfig" make -s -C "$source_dir/examples/pkg_config" OUT="$work/allreduce_c" >/dev/null
"$prefix/bin/chorusrun" -n 3 "$work/allreduce_c" | tee "$work/c.txt"
[ "$(grep -c 'example ok' "$work/c.txt")" = 3 ] || fail "examples/pkg_config did not pass on every rank"
# examples/nccl: an NCCL program linked to the installed libchorus_nccl
nccl_header=$(ls /usr/local/cuda/include/nccl.h 2>/dev/null || true)
if [ -n "$nccl_header" ] && [ -e "$build/libchorus_nccl.so" ]; then
  [ -e "$libdir/libchorus_nccl.so" ] || fail "libchorus_nccl.so not installed"
  cc -std=c11 -Wall -Werror "$source_dir/examples/nccl/allreduce.c" -I"$(dirname "$nccl_header")" -L"$libdir" \
    -lchorus_nccl -o "$work/allreduce_nccl"
  "$work/allreduce_nccl" | tee "$work/nccl.txt"
  grep -q "example ok (NCCL API" "$work/nccl.txt" || fail "examples/nccl did not pass"
fi
# The installed torch.distributed backend, imported from the prefix, on 2 processes.
if [ -d "$libdir/python3/dist-packages/chorus_torch" ]; then
  cat >"$work/torch_check.py" <<'PY'
import torch, torch.distributed as dist, torch.multiprocessing as mp, socket
import chorus_torch
assert chorus_torch.__file__.startswith(__import__("os").environ["PYTHONPATH"]), chorus_torch.__file__
def run(rank, port):
    dist.init_process_group("chorus", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 4, t
    dist.destroy_process_group()
if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(run, args=(port,), nprocs=2, join=True)
    print("installed chorus_torch ok")
PY
  PYTHONPATH="$libdir/python3/dist-packages" /usr/bin/python3 "$work/torch_check.py" 2>&1 | grep -v semaphore |
    grep -q "installed chorus_torch ok" || fail "the installed chorus_torch failed"
fi
"$prefix/bin/collbench" -g 2 -b 1K -e 1K >/dev/null || fail "installed collbench failed"
"$prefix/bin/collbench" --simulate -g 64 -b 1K -e 1K >"$work/simulate.txt" 2>&1 || true
grep -q "simulate op: allreduce  nranks: 64" "$work/simulate.txt" ||
  { cat "$work/simulate.txt"; fail "installed collbench --simulate did not run the installed chorus-sim"; }
"$prefix/bin/chorus-plan" --model gpt2-124m --devices 8 --micro 4 --global 32 | grep -q "fits in memory" ||
  fail "installed chorus-plan failed"
train_out="$work/train"
"$prefix/bin/chorus-train" "$source_dir/tests/data/jobs/parity.toml" --ranks 2 --steps 3 --out "$train_out" \
  >"$work/train.log" 2>&1 || { cat "$work/train.log"; fail "installed chorus-train failed"; }
grep -q "drawn by $prefix/bin/chorus-plot" "$work/train.log" || { cat "$work/train.log"; fail "chorus-train did not use the installed chorus-plot"; }
[ -s "$train_out/loss.png" ] || fail "no loss curve from the installed chorus-train"
echo "install ok"
