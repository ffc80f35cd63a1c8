"""pipeline_idle.py: the pipeline's idle share per rank for the e2e training scripts (on the CPU
and on a device): each stage waited for messages for part of its steps, never all of them."""
import json


def check(work, names, bad):
    """Prints each run's idle share per rank beside the schedule's formula; a share outside (0, 1) is bad."""
    for name in names:
        pipe = json.load(open(f"{work}/{name}/metrics.json"))["pipeline"]
        idle = pipe["idle_share_per_rank"]
        print(f"{name}: {pipe['schedule']}, blocks {pipe['blocks_per_chunk']}, idle share per rank "
              f"{[round(x, 3) for x in idle]}, formula {pipe['formula_idle_share']:.3f}")
        if not all(0 < x < 1 for x in idle):
            bad.append(f"{name}: idle shares {idle}")
