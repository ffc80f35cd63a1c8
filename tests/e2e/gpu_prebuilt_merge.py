#!/usr/bin/env python3
"""gpu_prebuilt_merge.py BUILD PACK: the GPU machine's half of the prebuilt fallback, run here.

On a GPU machine whose build failed in part, tools/gpu-check puts the pack's prebuilt programs
where the build lacks them and keeps everything the machine built. CI otherwise runs only the
no-device form (an empty build folder, everything from the pack). Here a configured build made
by `tools/gpu-check --no-device` (BUILD) is copied to a folder of its own, as if configured there,
and three of its targets are taken out as a failed build leaves them (the program gone, and for a
test program its discovered test list too): tests/device_collectives_test, bench/collbench and
libchorus_nccl. Then gpu-check's use_prebuilt must put back exactly those, from the pack,
leave every program the "machine" built untouched, write the missing test list naming this
folder, and the placed programs must start (finding their libraries in this folder).
"""
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build, pack = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
loader = importlib.machinery.SourceFileLoader("gpu_check", os.path.join(ROOT, "tools", "gpu-check"))
spec = importlib.util.spec_from_loader("gpu_check", loader)
gpu_check = importlib.util.module_from_spec(spec)
loader.exec_module(gpu_check)

problems = []


def check(ok, what):
    if not ok:
        problems.append(what)


copy = build + "-merge"
shutil.rmtree(copy, ignore_errors=True)
# Programs as hard links (no copy of 200 MB); the test lists as files of their own, naming the copy.
subprocess.run(["cp", "-al", build, copy], check=True)
for folder, _, names in os.walk(copy):
    for name in names:
        if name.endswith(gpu_check.TEST_LISTS):
            path = os.path.join(folder, name)
            text = gpu_check.naming(build).sub(copy, open(path, errors="replace").read())
            os.remove(path)
            with open(path, "w") as f:
                f.write(text)

# The failed targets.
failed = ["tests/device_collectives_test", "bench/collbench"]
failed += sorted(n for n in os.listdir(copy) if n.startswith("libchorus_nccl.so"))
lists = [n for n in os.listdir(os.path.join(copy, "tests")) if n.startswith("device_collectives_test[")
         and n.endswith("_tests.cmake")]
check(len(failed) >= 4 and lists, f"the build lacks what the test takes out: {failed}, {lists}")
for rel in failed + [os.path.join("tests", n) for n in lists]:
    os.remove(os.path.join(copy, rel))
kept = "chorus-train"
kept_inode = os.stat(os.path.join(copy, kept)).st_ino

part = {"rows": [], "notes": []}
check(gpu_check.use_prebuilt(part, pack, copy), f"use_prebuilt refused: {part['rows']}")
placed = part.get("placed", [])
check(sorted(placed) == sorted(failed), f"placed {placed}, expected exactly {failed}")
check(os.stat(os.path.join(copy, kept)).st_ino == kept_inode, f"{kept}, built here, was replaced")
for n in lists:
    path = os.path.join(copy, "tests", n)
    text = open(path).read() if os.path.exists(path) else ""
    check(copy + "/tests/device_collectives_test" in text and build + "/" not in text,
          f"tests/{n}: not written, or naming another build than {copy}")

# ctest lists the device tests again (not CMake's stand-in test for an unbuilt target, named
# <target>_NOT_BUILT), and the placed programs run.
out = subprocess.run(["ctest", "--test-dir", copy, "-N", "-L", "gpu"], capture_output=True, text=True).stdout
check("DeviceCollectivesTest" in out and "NOT_BUILT" not in out, "ctest does not list the device tests")
run = subprocess.run([os.path.join(copy, "bench", "collbench"), "--help"], capture_output=True, text=True)
check(run.returncode == 0 and "nccl-tests" in run.stdout, f"the placed collbench does not start: {run.stderr[-300:]}")
run = subprocess.run(["ctest", "--test-dir", copy, "-R", "DeviceCollectivesTest", "-L", "gpu", "-I", "1,1"],
                     capture_output=True, text=True)
check(run.returncode == 0 and ("Skipped" in run.stdout or "Passed" in run.stdout),
      f"a placed device test did not start:\n{run.stdout[-600:]}")
shutil.rmtree(copy, ignore_errors=True)

for p in problems:
    print("gpu_prebuilt_merge: " + p, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"gpu_prebuilt_merge: a build missing {len(failed)} targets got exactly those from the pack; "
      f"{kept} kept; the device tests listed and started")
