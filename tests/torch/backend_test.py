"""The torch.distributed backend "chorus" (python/chorus_torch), in real processes.

1. Every call torch.distributed makes on it, against closed forms: all_reduce (each type, each
   op), broadcast, reduce, all_gather (list and tensor forms), reduce_scatter, all_to_all (even
   and uneven splits, single-tensor and list forms), gather, scatter, barrier, send/recv (and
   isend/irecv posted send-first on both sides), on 2 and 4 processes.
2. DistributedDataParallel: a small model trained for 20 steps on 2 and on 4 processes with
   backend chorus and with gloo, from the same seed and data. The parameters must be bitwise
   identical on 2 processes (a sum of two is the same in any order) and within float32 rounding
   of the reduction order on 4 (gloo and chorus add the four ranks' gradients in different
   orders); and they must differ from the start and from a single process's run on its own
   quarter of the data (so the gradients were really averaged).

    PYTHONPATH=build/release/python /usr/bin/python3 tests/torch/backend_test.py
    PYTHONPATH=build/gpu/python python3 tests/torch/backend_test.py --device cuda --sizes 2

With --device cuda (a PyTorch 2 with CUDA, and chorus_torch built against it) every tensor lives on
the GPU (rank r on GPU r % GPUs: ranks may share one), and DDP trains the model there; on CUDA the
parameters must match gloo's within float32 rounding (cuBLAS may order its sums differently run to
run), not bitwise.
"""
import argparse
import faulthandler
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import chorus_torch  # registers "chorus"

faulthandler.enable()  # a crash in native code prints each process's Python stack


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEVICE = "cpu"  # --device


def device_of(rank):
    """The device rank's tensors live on; CUDA: made current and the default for new tensors."""
    if DEVICE != "cuda":
        return torch.device("cpu")
    index = rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    torch.set_default_device(f"cuda:{index}")
    return torch.device(f"cuda:{index}")


def init(backend, rank, size, port):
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def every_call(rank, size, port, device):
    global DEVICE
    DEVICE = device
    device_of(rank)
    init("chorus", rank, size, port)
    n = size
    # all_reduce: every type, every op it supports.
    types = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
             torch.int64]
    for dtype in types:
        base = torch.arange(1, 9, dtype=torch.int64) % 3 + 1  # 1..3, exact in every type
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
            t = (base + rank).to(dtype)
            dist.all_reduce(t, op=op)
            values = torch.stack([(base + r) for r in range(n)])
            if op == dist.ReduceOp.SUM:
                expect = values.sum(0)
            elif op == dist.ReduceOp.MAX:
                expect = values.max(0).values
            elif op == dist.ReduceOp.MIN:
                expect = values.min(0).values
            else:
                expect = values.prod(0)
            if dtype in (torch.int8, torch.uint8):
                expect = expect.to(torch.int64) % 256  # integer sums and products wrap
                got = t.to(torch.int64) % 256
            else:
                got = t.to(torch.int64)
            check(torch.equal(got, expect.to(torch.int64)), f"all_reduce {dtype} {op}: {got.tolist()} != {expect.tolist()}")
    avg = torch.full((6,), float(rank))
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    check(torch.allclose(avg, torch.full((6,), (n - 1) / 2)), f"all_reduce AVG {avg.tolist()}")
    # broadcast and reduce from the last rank.
    b = torch.arange(10.0) if rank == n - 1 else torch.zeros(10)
    dist.broadcast(b, src=n - 1)
    check(torch.equal(b, torch.arange(10.0)), f"broadcast {b.tolist()}")
    r = torch.full((7,), rank + 1, dtype=torch.int64)
    dist.reduce(r, dst=n - 1, op=dist.ReduceOp.SUM)
    if rank == n - 1:
        check(torch.equal(r, torch.full((7,), n * (n + 1) // 2, dtype=torch.int64)), f"reduce {r.tolist()}")
    # all_gather, list and tensor forms.
    mine = torch.full((3, 2), float(rank))
    outs = [torch.empty(3, 2) for _ in range(n)]
    dist.all_gather(outs, mine)
    for q in range(n):
        check(torch.equal(outs[q], torch.full((3, 2), float(q))), f"all_gather block {q}")
    flat = torch.empty(n * 3, 2)
    dist.all_gather_into_tensor(flat, mine)
    check(torch.equal(flat, torch.cat([torch.full((3, 2), float(q)) for q in range(n)])), "all_gather_into_tensor")
    # reduce_scatter, list and tensor forms.
    ins = [torch.full((5,), float(rank * 10 + q)) for q in range(n)]
    out = torch.empty(5)
    dist.reduce_scatter(out, ins)
    check(torch.equal(out, torch.full((5,), float(sum(p * 10 + rank for p in range(n))))), f"reduce_scatter {out}")
    out2 = torch.empty(5)
    dist.reduce_scatter_tensor(out2, torch.cat(ins))
    check(torch.equal(out2, out), "reduce_scatter_tensor")
    # all_to_all: even single-tensor, uneven single-tensor, list form.
    send = torch.arange(n * 2, dtype=torch.int32) + 100 * rank
    recv = torch.empty(n * 2, dtype=torch.int32)
    dist.all_to_all_single(recv, send)
    want = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.int32) + 100 * q for q in range(n)])
    check(torch.equal(recv, want), f"all_to_all_single {recv.tolist()} != {want.tolist()}")
    # rank r sends q + 1 rows to rank q; so rank r receives r + 1 rows from each.
    in_splits = [q + 1 for q in range(n)]
    rows = sum(in_splits)
    send = torch.full((rows, 2), float(rank))
    recv = torch.empty((rank + 1) * n, 2)
    dist.all_to_all_single(recv, send, output_split_sizes=[rank + 1] * n, input_split_sizes=in_splits)
    want = torch.cat([torch.full((rank + 1, 2), float(q)) for q in range(n)])
    check(torch.equal(recv, want), "all_to_all_single uneven")
    outs = [torch.empty(q + 1) for q in range(n)]  # from rank q: q + 1 elements
    dist.all_to_all(outs, [torch.full((rank + 1,), float(rank * 100 + q)) for q in range(n)])
    for q in range(n):
        check(torch.equal(outs[q], torch.full((q + 1,), float(q * 100 + rank))), f"all_to_all block {q}")
    # gather and scatter to / from rank 1.
    got = [torch.empty(4) for _ in range(n)] if rank == 1 else None
    dist.gather(torch.full((4,), float(rank)), gather_list=got, dst=1)
    if rank == 1:
        for q in range(n):
            check(torch.equal(got[q], torch.full((4,), float(q))), "gather")
    piece = torch.empty(4)
    dist.scatter(piece, scatter_list=[torch.full((4,), float(q * 7)) for q in range(n)] if rank == 1 else None, src=1)
    check(torch.equal(piece, torch.full((4,), float(rank * 7))), "scatter")
    dist.barrier()
    # send/recv; then isend/irecv posted send-first on both sides of every pair (a ring).
    if rank == 0:
        dist.send(torch.arange(6.0), dst=n - 1)
    if rank == n - 1:
        x = torch.empty(6)
        dist.recv(x, src=0)
        check(torch.equal(x, torch.arange(6.0)), "send/recv")
    big = 1 << 20
    out_t = torch.full((big,), float(rank))
    in_t = torch.empty(big)
    s = dist.isend(out_t, dst=(rank + 1) % n)
    r = dist.irecv(in_t, src=(rank - 1) % n)
    s.wait()
    r.wait()
    check(torch.equal(in_t, torch.full((big,), float((rank - 1) % n))), "isend/irecv ring")
    # complex tensors travel as their real view; a refused call says why (and refuses on every rank).
    c = torch.full((3,), complex(rank, 1), dtype=torch.complex64)
    dist.all_reduce(c)
    check(torch.equal(c, torch.full((3,), complex(n * (n - 1) / 2, n), dtype=torch.complex64)), "complex all_reduce")
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.bool))
        raise AssertionError("a SUM of bool tensors was accepted")
    except RuntimeError as e:
        check("not supported on bool tensors" in str(e), f"bool all_reduce: {e}")
    dist.destroy_process_group()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def train(rank, size, port, backend, out, device, steps=20):
    """20 SGD steps (momentum) under DDP; rank r takes its slice of each global batch."""
    global DEVICE
    DEVICE = device
    dev = device_of(rank)
    if backend is not None:
        init(backend, rank, size, port)
    torch.manual_seed(1234 + rank)  # different starting weights: DDP must broadcast rank 0's
    model = Net().to(dev)
    if backend is not None:
        ids = [dev.index] if dev.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=0.001)  # several buckets
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(99)
    for step in range(steps):
        x = torch.randn(8 * size, 16, generator=data, device="cpu").to(dev)
        y = torch.randn(8 * size, 4, generator=data, device="cpu").to(dev)
        lo = rank * 8
        loss = torch.nn.functional.mse_loss(model(x[lo:lo + 8]), y[lo:lo + 8])
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        state = model.module.state_dict() if backend is not None else model.state_dict()
        torch.save({k: v.cpu() for k, v in state.items()}, out)
    if backend is not None:
        dist.destroy_process_group()


def spawn(fn, size, *args):
    mp.spawn(fn, args=(size, free_port()) + args, nprocs=size, join=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--sizes", default="2,4", help="process counts, e.g. 2,4")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    if args.device == "cuda":
        check(torch.cuda.is_available(), "--device cuda: this PyTorch sees no CUDA device")
        check(chorus_torch.CUDA, "--device cuda: chorus_torch was built without CUDA tensors")
    torch.set_num_threads(1)
    for size in sizes:
        spawn(every_call, size, args.device)
        print(f"every call on {args.device}: {size} processes ok", flush=True)
    with tempfile.TemporaryDirectory() as work:
        for size in sizes:
            results = {}
            for backend in ("chorus", "gloo"):
                path = os.path.join(work, f"{backend}_{size}.pt")
                spawn(train, size, backend, path, args.device)
                results[backend] = torch.load(path)
            alone = os.path.join(work, f"alone_{size}.pt")
            train(0, size, 0, None, alone, args.device)
            alone_state = torch.load(alone)
            worst = 0.0
            for name, value in results["chorus"].items():
                other = results["gloo"][name]
                diff = (value - other).abs().max().item() / max(other.abs().max().item(), 1e-30)
                worst = max(worst, diff)
                if size == 2 and args.device == "cpu":
                    check(torch.equal(value, other), f"{size} processes: {name} differs from gloo's (rel {diff:.3g})")
                else:
                    check(diff < 1e-5, f"{size} processes: {name} differs from gloo's by {diff:.3g} (relative)")
                check(not torch.allclose(value, alone_state[name]), f"{name}: same as a single process's run")
            print(f"DDP {size} processes, 20 steps: chorus vs gloo largest relative difference {worst:.3g}"
                  f"{' (bitwise identical)' if worst == 0 else ''}", flush=True)
    print("torch backend ok")


if __name__ == "__main__":
    main()
