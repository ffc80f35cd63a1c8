#!/usr/bin/python3
"""gpt_torch.py: repeats tests/reference/gpt_reference's run in PyTorch and compares.

Builds the same GPT-2 (learned positions, pre-LN blocks, tied head, tanh GELU) from PyTorch's own
layers, loads the parameters chorus wrote, runs the same batch and checks the logits and loss
(relative error <= 1e-5) and every parameter's gradient (<= 1e-4), then runs the same AdamW steps
with torch.optim.AdamW and checks each step's loss (<= 1e-5). The relative error of a tensor is
||chorus - torch|| / ||torch||. Usage: gpt_torch.py DIR (the directory gpt_reference wrote).
Exits 1 naming what disagrees.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from torch_gpt import Gpt  # noqa: E402


def relative_error(ours, theirs):
    ours = np.asarray(ours, dtype=np.float64).ravel()
    theirs = np.asarray(theirs, dtype=np.float64).ravel()
    return float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30))


def main():
    folder = sys.argv[1]
    meta = json.load(open(f"{folder}/meta.json"))
    cfg, B, T = meta["config"], meta["batch"], meta["seq"]
    params = np.fromfile(f"{folder}/params.f32", dtype=np.float32)
    grads = np.fromfile(f"{folder}/grads.f32", dtype=np.float32)
    tokens = torch.from_numpy(np.fromfile(f"{folder}/tokens.i32", dtype=np.int32).astype(np.int64)).view(-1, B, T)
    targets = torch.from_numpy(np.fromfile(f"{folder}/targets.i32", dtype=np.int32).astype(np.int64)).view(-1, B, T)
    logits_ours = np.fromfile(f"{folder}/logits.f32", dtype=np.float32)

    torch.manual_seed(0)
    model = Gpt(cfg["layers"], cfg["heads"], cfg["width"], cfg["context"], cfg["vocab"])
    named = dict(model.named_parameters())
    if set(named) != {t["name"] for t in meta["tensors"]}:
        sys.exit(f"gpt_torch: parameter names differ: {sorted(set(named) ^ {t['name'] for t in meta['tensors']})}")
    with torch.no_grad():
        for t in meta["tensors"]:
            count = int(np.prod(t["shape"]))
            named[t["name"]].copy_(torch.from_numpy(params[t["offset"]:t["offset"] + count].reshape(t["shape"])))

    failures = []

    def check(what, error, limit):
        mark = "ok" if error <= limit else "FAIL"
        print(f"  {what:40s} relative error {error:.3e} (limit {limit:g}) {mark}")
        if error > limit:
            failures.append(what)

    logits, loss = model(tokens[0], targets[0])
    loss.backward()
    print(f"gpt_torch: loss chorus {meta['loss']:.7f} torch {loss.item():.7f}")
    check("logits", relative_error(logits_ours, logits.detach().numpy()), 1e-5)
    check("loss", abs(meta["loss"] - loss.item()) / abs(loss.item()), 1e-5)
    for t in meta["tensors"]:
        count = int(np.prod(t["shape"]))
        check(f"grad {t['name']}", relative_error(grads[t["offset"]:t["offset"] + count], named[t["name"]].grad), 1e-4)

    adam = meta["adamw"]
    groups = [
        {"params": [named[t["name"]] for t in meta["tensors"] if t["decay"]], "weight_decay": adam["weight_decay"]},
        {"params": [named[t["name"]] for t in meta["tensors"] if not t["decay"]], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=adam["lr"], betas=(adam["beta1"], adam["beta2"]), eps=adam["eps"],
                            foreach=False)
    for step in range(1, meta["steps"] + 1):
        opt.zero_grad()
        _, loss = model(tokens[step], targets[step])
        loss.backward()
        opt.step()
        ours = meta["step_losses"][step - 1]
        check(f"AdamW step {step} loss {ours:.6f}", abs(ours - loss.item()) / abs(loss.item()), 1e-5)
    after = np.fromfile(f"{folder}/after.f32", dtype=np.float32)
    theirs = np.concatenate([named[t["name"]].detach().numpy().ravel() for t in meta["tensors"]])
    print(f"  parameters after {meta['steps']} steps: relative error {relative_error(after, theirs):.3e}")

    if failures:
        sys.exit(f"gpt_torch: chorus and PyTorch disagree on: {', '.join(failures)}")
    print("gpt_torch: chorus and PyTorch agree")


if __name__ == "__main__":
    main()
