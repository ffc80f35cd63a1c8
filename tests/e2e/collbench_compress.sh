#!/usr/bin/env bash
# collbench --compress on host buffers: every compressor's row agrees with what the compressor says
# it sends (the bytes on the wire within 6% and 256 B of its payload formula's: headers are the
# rest), its ratio is fp32's bytes on the wire over those, bf16's error is its two roundings',
# every rank gets the same bits; on 2 ranks over shm and 4 over tcp. With --mem chorus the fp32
# all-reduce takes the direct path (the ranks read each other's chorusMemAlloc buffers; almost
# nothing crosses a transport), so there is no ratio of wire bytes to give: the row prints "-" and
# the JSON null. A collective other than all-reduce is refused.
source "$(dirname "$0")/lib.sh"

sweep() {  # $1 json file; the rest collbench's options
  local json=$1
  shift
  "$collbench" --op allreduce -o avg -b 64K -e 256K -f 4 -n 3 -w 1 --json "$json" "$@" >"$work/out.txt" 2>&1 ||
    { cat "$work/out.txt"; fail "collbench $*"; }
  cat "$work/out.txt"
  grep -q "Ranks that disagreed : 0 OK" "$work/out.txt" || fail "ranks disagreed: $*"
}

sweep "$work/shm.json" -g 2 --compress bf16 topk:0.01 powersgd:4 qsgd sign
CHORUS_TRANSPORT=tcp sweep "$work/tcp.json" -g 4 --compress bf16 topk:0.01
sweep "$work/direct.json" -g 2 --mem chorus --compress bf16 topk:0.01
grep -E "^ +65536 .* bf16 " "$work/out.txt" | awk '{ if ($8 != "-") exit 1 }' ||
  fail "--mem chorus: the bf16 row printed a wire ratio beside a direct fp32 all-reduce"

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def rows(name, ranks, compressors):
    doc = json.load(open(f"{work}/{name}.json"))
    assert doc["compressed"] and doc["nranks"] == ranks, doc
    got = doc["rows"]
    assert sorted({r["size_bytes"] for r in got}) == [65536, 262144], got
    assert len(got) == 2 * compressors, len(got)
    for r in got:
        assert r["ranks_differ"] == 0, r
        assert r["nranks"] == ranks, r
        if r["compressor"] == "bf16":
            # x/n rounded to bf16, the sum rounded again (chorus.h): two roundings of at most 2^-9
            # relative each; 2.4e-3 measured.
            assert 0 < r["rel_error"] < 5e-3, r
        else:
            assert 0 < r["rel_error"] < 1.0, r
    return got
for name, ranks, compressors in (("shm", 2, 5), ("tcp", 4, 2)):
    for r in rows(name, ranks, compressors):
        size, fp32 = r["size_bytes"], r["fp32"]["wire_bytes_per_rank"]
        assert fp32 >= size * (ranks - 1) / ranks, r  # the fp32 all-reduce went over the transports
        sent, payload = r["wire_bytes_per_rank"], r["payload_bytes_per_rank"]
        assert payload <= sent <= 1.06 * payload + 256, (name, r["compressor"], size, sent, payload)
        assert r["ratio"] is not None and abs(r["ratio"] - fp32 / sent) < 1e-9 * r["ratio"], r
    print(f"{name}: every compressor sent its payload formula's bytes and headers; ratios are fp32's bytes over those")
for r in rows("direct", 2, 2):
    assert r["fp32"]["wire_bytes_per_rank"] < r["size_bytes"] / 2, r  # the direct path
    assert r["ratio"] is None, r
    assert r["wire_bytes_per_rank"] > 0, r  # the compressed call still sends its bytes
print("--mem chorus: the fp32 all-reduce direct, no ratio given")
PY

if "$collbench" -g 2 --op allgather --compress bf16 -b 1K -e 1K >"$work/refused.txt" 2>&1; then
  fail "--compress with --op allgather ran"
fi
grep -q "times all-reduce of float with sum or avg, not --op allgather" "$work/refused.txt" ||
  { cat "$work/refused.txt"; fail "no message naming the refused --op"; }
echo "collbench --compress ok"
