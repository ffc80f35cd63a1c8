#!/usr/bin/env bash
# chorus-topo as a user runs it: this machine's graph agrees with lstopo (NUMA nodes, cores) and
# sysfs (network devices); CHORUS_TOPO_FILE replaces discovery; --xml writes a file that reads back
# to the same graph; --ranks prints rings and trees; a bad file fails naming the file; chorus-plan
# takes its devices and links from a topology file.
source "$(dirname "$0")/lib.sh"
topo="$build/chorus-topo"
data="$source_dir/tests/data/topology"

"$topo" | tee "$work/here.txt"
numa=$(lstopo-no-graphics --only numanode | wc -l)
cores=$(lstopo-no-graphics --only core | wc -l)
[ "$(grep -c '(cpu): ' "$work/here.txt")" -eq "$numa" ] || fail "chorus-topo shows a CPU node count other than lstopo's $numa NUMA nodes"
shown=$(grep -o '[0-9]* cores' "$work/here.txt" | awk '{s += $1} END {print s}')
[ "$shown" -eq "$cores" ] || fail "chorus-topo shows $shown cores, lstopo $cores"
for dev in /sys/class/net/*; do
  [ -e "$dev/device/class" ] && grep -q '^0x02' "$dev/device/class" || continue
  grep -q "(nic): $(basename "$dev")" "$work/here.txt" || fail "network device $(basename "$dev") is not shown as a NIC"
done

CHORUS_TOPO_FILE="$data/dgx-h100.nccl.xml" "$topo" --ranks gpus --xml "$work/dgx.xml" | tee "$work/dgx.txt"
grep -q '^ring 0: 450 GB/s$' "$work/dgx.txt" || fail "the NVSwitch server's ring is not at 450 GB/s"
grep -q '^ring 1' "$work/dgx.txt" && fail "the NVSwitch server got a second ring"
"$topo" --file "$work/dgx.xml" --ranks gpus >"$work/back.txt"
cmp "$work/dgx.txt" "$work/back.txt" || fail "the written XML reads back to another graph or plan"

"$topo" --file "$data/dgx-h100-cluster4.chorus.xml" --ranks gpus --quiet | tee "$work/cluster.txt"
[ "$(grep -c '^ring [0-7]: 50 GB/s, through dgx0/nic\([0-7]\), dgx1/nic\1, dgx2/nic\1, dgx3/nic\1$' "$work/cluster.txt")" -eq 8 ] ||
  fail "the cluster did not get 8 rail-aligned rings"

echo '<chorus-topology version="1"><host name="a"><node id="c" kind="cpu"/><link a="c" b="x" kind="pcie"/></host></chorus-topology>' >"$work/bad.xml"
if "$topo" --file "$work/bad.xml" 2>"$work/err.txt"; then fail "a bad file was accepted"; fi
grep -q "bad.xml:1: <link>: b=\"x\" names no node" "$work/err.txt" || { cat "$work/err.txt"; fail "the error does not name the file and link"; }
echo "topo: OK"

# chorus-plan takes its devices and links from a topology file: 4 hosts of 8 H100s, NVLink within
# a host faster than the network between hosts.
"$build/chorus-plan" --model gpt2-124m --micro 4 --global 128 --topology "$data/dgx-h100-cluster4.chorus.xml" \
  --json >"$work/plan.json" || fail "chorus-plan --topology failed"
/usr/bin/python3 - "$work/plan.json" <<'PY' || fail "chorus-plan read the topology file wrongly"
import json, sys
m = json.load(open(sys.argv[1]))["machine"]
print(f"chorus-plan on dgx-h100-cluster4: {m['devices']} devices, {m['devices_per_node']} per node, "
      f"{m['intra_node_gbps']} GB/s within a node, {m['inter_node_gbps']} GB/s between nodes")
assert m["devices"] == 32 and m["devices_per_node"] == 8, m
assert m["intra_node_gbps"] > m["inter_node_gbps"] > 0, m
PY
