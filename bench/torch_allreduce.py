"""torch.distributed all_reduce with backend chorus against gloo, through the same PyTorch calls.

Every process holds two groups over the same ranks, one per backend, and the two are timed in
turns (block by block, alternating), so the machine's drift falls on both alike. Per size: each
backend's time per call (the slowest rank's, the median over the blocks), algbw and busbw as
collbench defines them (busbw = algbw * 2(n-1)/n), and gloo's time over chorus's.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_allreduce.py -n 4 [--json out.json]
"""
import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import chorus_torch  # registers "chorus"


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 4


def run(rank, n, port, args, out):
    torch.set_num_threads(1)
    dist.init_process_group("chorus", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    groups = {"chorus": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rows = []
    for size in sizes(args.min_bytes, args.max_bytes):
        t = torch.ones(size // 4, dtype=torch.float32)
        iters = max(3, min(200, (32 << 20) // size))
        times = {name: [] for name in groups}
        for name, group in groups.items():  # warm up both
            for _ in range(2):
                dist.all_reduce(t, group=group)
        for _ in range(args.blocks):
            for name, group in groups.items():
                dist.barrier(group=groups["gloo"])
                start = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t, group=group)
                elapsed = torch.tensor([(time.perf_counter() - start) / iters])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=groups["gloo"])
                times[name].append(elapsed.item())
        row = {"size_bytes": size, "nranks": n, "iters": iters, "blocks": args.blocks}
        for name in groups:
            sec = statistics.median(times[name])
            algbw = size / sec / 1e9
            row[name] = {"time_us": sec * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (n - 1) / n}
        row["gloo_over_chorus"] = row["gloo"]["time_us"] / row["chorus"]["time_us"]
        rows.append(row)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--nprocs", type=int, default=2)
    parser.add_argument("-b", "--min-bytes", type=int, default=4 << 10)
    parser.add_argument("-e", "--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--blocks", type=int, default=5, help="timed blocks per backend, alternating")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = args.json or f"/tmp/torch_allreduce_{os.getpid()}.json"
    mp.spawn(run, args=(args.nprocs, port, args, out), nprocs=args.nprocs, join=True)
    with open(out) as f:
        rows = json.load(f)
    print(f"# torch.distributed all_reduce, float32 sum, {args.nprocs} processes, chorus and gloo in turns "
          f"({args.blocks} blocks each; time: slowest rank, median block)")
    print(f"{'size':>10} {'chorus us':>11} {'busbw':>7} {'gloo us':>11} {'busbw':>7} {'gloo/chorus':>12}")
    for r in rows:
        print(f"{r['size_bytes']:>10} {r['chorus']['time_us']:>11.1f} {r['chorus']['busbw_GBps']:>7.2f} "
              f"{r['gloo']['time_us']:>11.1f} {r['gloo']['busbw_GBps']:>7.2f} {r['gloo_over_chorus']:>12.2f}")
    if not args.json:
        os.remove(out)


if __name__ == "__main__":
    main()
