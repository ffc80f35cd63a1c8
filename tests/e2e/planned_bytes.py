"""planned_bytes.py: the planner (chorus-plan) against what chorus-train runs held, for the e2e
training scripts: each rank's state bytes (parameters, gradients and optimizer state as ZeRO counts
them; the runtime pads shards a little) within 2%, its activation bytes within 0.1%."""
import json
import subprocess


def plan(build, m):
    """chorus-plan's JSON for the run whose metrics.json is m."""
    L = m["layout"]
    args = [f"{build}/chorus-plan", "--json", "--devices", str(m["ranks"]), "--layers", str(m["model"]["layers"]),
            "--hidden", str(m["model"]["width"]), "--heads", str(m["model"]["heads"]), "--seq", str(m["seq"]),
            "--context", str(m["model"]["context"]), "--vocab", str(m["model"]["vocab"]), "--micro", str(m["micro"]),
            "--global", str(m["global_batch"]), "--tp", str(L["tp"]), "--pp", str(L["pp"]), "--cp", str(L["cp"]),
            "--zero", str(m["zero"]), "--recompute", L["recompute"]]
    if L["sequence_parallel"]:
        args.append("--sp")
    if "pipeline" in m:
        args += ["--schedule", m["pipeline"]["schedule"], "--vpp", str(m["pipeline"]["vpp"])]
    if "sync" in L:
        args += ["--sync", L["sync"]]
    if m.get("offload", {}).get("optimizer", "none") != "none":
        o = m["offload"]
        args += ["--offload", o["optimizer"], "--offload-params", o["params"]]
        if "window_bytes" in o:
            args += ["--offload-window-mb", str(o["window_bytes"] / 2**20)]
    if "precision" in m:
        args += ["--compute", m["precision"]["compute"], "--reduce", m["precision"]["reduce"]]
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def check(work, build, names, bad):
    """Compares each run in work/NAME with its plan; appends what differs too much to bad."""
    for name in names:
        m = json.load(open(f"{work}/{name}/metrics.json"))
        p, L = plan(build, m), m["layout"]
        worst_state, worst_act = 0.0, 0.0
        for r, mem in enumerate(m["memory_per_rank"]):
            stage = p["stages"][r // (L["tp"] * L["cp"] * L["dp"])]
            state = mem["params_bytes"] + mem["grads_bytes"] + mem["optimizer_bytes"]
            predicted = stage["params_bytes"] + stage["grads_bytes"] + stage["optimizer_bytes"]
            worst_state = max(worst_state, abs(state - predicted) / state)
            worst_act = max(worst_act,
                            abs(mem["activation_bytes"] - stage["activation_bytes"]) / mem["activation_bytes"])
        print(f"{name:16s} planner vs measured bytes per rank: state within {worst_state:.2e}, activations within "
              f"{worst_act:.2e}")
        if worst_state > 0.02 or worst_act > 1e-3:
            bad.append(f"{name}: the planner's bytes differ by {worst_state:.2e} (state), {worst_act:.2e} "
                       "(activations)")
