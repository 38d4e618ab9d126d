"""Run the parameter-server recipe and write down what its validators decide, push by push: to find out why
a rule rejects honest updates or trains worse than the plain mean (scripts/figures/ps/why.py).

    torchrun --nproc_per_node=10 scripts/figures/ps/why_probe.py --judgements runs/why/probe -- recipes/ps/train.py
    data/mnist5k ...

Each validator appends JSON lines to <judgements>/rank<R>.jsonl, one for each judgement of rules.py:
  zenops sync   one per pushed tensor: the round, the sender's rank, the tensor, its size, cos(u_t, v_t),
                mean(u_t v_t) / mean(v_t^2) and mean(u_t^2) / mean(v_t^2) (what the sign test and the norm
                test compare with eta and 1 + rho)
  zenops async  one per push: cos(u_t, v_t) and ||u_t|| / ||v_t|| of each tensor; and what the rule applies
                (alpha u_t clipped to ||v_t||, times cos where cos < eta): its norm over ||alpha u||, and its
                projection on alpha u (the scale c that fits it best as c alpha u)
  zeno++        one per push: ||g||, ||v||, cos(g, v), whether it was accepted, whether it was a lie (an
                attack's), the validator's loss on its batch where v was last computed, and how many of server
                0's versions the weights g was computed on are behind those of v (negative: g's are the newer)
--zeno-plus-plus-step g | at-most-v: what the servers apply of an accepted gradient, instead of Zeno++'s g
rescaled to ||v||: g as pushed, or g rescaled only where that shrinks it. The test is Zeno++'s in both: the
step alone changes, to measure what the rescaling does (not a rule of its authors). --zenops-async-step alpha-u:
async zenops' validators forward alpha u, as naive-async's servers apply it, whatever their rule says: the
validators' path (their delay) without their rule.
"""

import argparse
import json
import os
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from recipes.common import pushpull
from recipes.ps import rules, steps, validators


def cos(a, b):
    return (a @ b).item() / max(a.norm().item() * b.norm().item(), 1e-30)


def applied(g, v, rescaled, how):
    """What the servers apply of an accepted g: Zeno++'s g rescaled to ||v|| (how None), g as pushed ("g"), or g
    rescaled to ||v|| only where that shrinks it ("at-most-v")."""
    if how == "g":
        return g
    if how == "at-most-v":
        return g * min(1.0, v.norm().item() / max(g.norm().item(), 1e-30))
    return rescaled


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judgements", required=True, help="a folder for the validators' JSON lines")
    parser.add_argument("--zeno-plus-plus-step", choices=["g", "at-most-v"],
                        help="apply an accepted gradient as pushed, or rescaled to ||v|| only where that shrinks it")
    parser.add_argument("--zenops-async-step", choices=["alpha-u"],
                        help="forward alpha u as naive-async applies it: the validators' path without their rule")
    parser.add_argument("script", help="recipes/ps/train.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the recipe's arguments")
    args = parser.parse_args()
    Path(args.judgements).mkdir(parents=True, exist_ok=True)
    log = open(Path(args.judgements) / f"rank{os.environ.get('RANK', 0)}.jsonl", "a", buffering=1)
    state = {"round": -1, "senders": [], "judged": 0}  # (a sync validator: v once a round, then each push)
    seen = {"lie": False, "v_loss": None, "v_version": -1, "g_version": -1}  # (the async validator's latest)

    def write(**line):
        log.write(json.dumps({"round": state["round"], **line}) + "\n")

    local_update, recv_candidate, pull, split_lies = (steps.local_update, pushpull.recv_candidate, pushpull.pull,
                                                      validators.split_lies)

    def v_of_the_round(*a, **k):  # a validator's v: sync zenops computes it once a round, before the pushes
        state.update(round=state["round"] + 1, senders=[], judged=0)
        v, stats = local_update(*a, **k)
        seen["v_loss"] = (stats[0] / stats[3]).item()  # (loss x n over n)
        return v, stats

    def candidate(*a, **k):  # who pushed, in the order their updates are judged
        received = recv_candidate(*a, **k)
        if received[-1] is not None:
            state["senders"].append(received[1])
            seen["g_version"] = int(received[2][0])  # (the version of server 0's shard that g started from)
        return received

    def pulled(vector, chunks, versions, *a, **k):  # (an async validator pulls only to compute v)
        answer = pull(vector, chunks, versions, *a, **k)
        seen["v_version"] = int(versions[0])
        return answer

    def lies_of(u, sizes):
        u, lies = split_lies(u, sizes)
        seen["lie"] = any(lies)
        return u, lies

    zenops_sync, zenops_async, zeno_plus_plus = rules.zenops_sync, rules.zenops_async, rules.zeno_plus_plus

    def judged_sync(u, v, sizes, eta, rho):
        sender = state["senders"][state["judged"]]  # (the pushes are judged in the order they came)
        state["judged"] += 1
        for t, (u_t, v_t) in enumerate(zip(u.split(sizes), v.split(sizes))):
            v2 = max((v_t * v_t).mean().item(), 1e-30)
            write(rule="zenops", sender=sender, tensor=t, numel=u_t.numel(), cos=cos(u_t, v_t),
                  dot=(u_t * v_t).mean().item() / v2, square=(u_t * u_t).mean().item() / v2)
        return zenops_sync(u, v, sizes, eta, rho)

    def judged_async(u, v, sizes, eta, alpha):
        pairs = list(zip(u.split(sizes), v.split(sizes)))
        update, passed = zenops_async(u, v, sizes, eta, alpha)
        write(rule="zenops async", cos=[cos(u_t, v_t) for u_t, v_t in pairs],
              ratio=[u_t.norm().item() / max(v_t.norm().item(), 1e-30) for u_t, v_t in pairs],
              step=update.norm().item() / max(alpha * u.norm().item(), 1e-30),
              along=(update @ u).item() / max(alpha * (u @ u).item(), 1e-30))  # (a reversed tensor counts against)
        return (alpha * u if args.zenops_async_step == "alpha-u" else update), passed

    def judged_plus_plus(g, v, base_lr, rho, eps):
        rescaled, accepted = zeno_plus_plus(g, v, base_lr, rho, eps)
        write(rule="zeno++", g=g.norm().item(), v=v.norm().item(), cos=cos(g, v), accepted=bool(accepted),
              lie=seen["lie"], v_loss=seen["v_loss"], behind=seen["v_version"] - seen["g_version"])
        return applied(g, v, rescaled, args.zeno_plus_plus_step), accepted

    steps.local_update, pushpull.recv_candidate, pushpull.pull, validators.split_lies = (v_of_the_round, candidate,
                                                                                      pulled, lies_of)
    rules.zenops_sync, rules.zenops_async, rules.zeno_plus_plus = judged_sync, judged_async, judged_plus_plus
    sys.argv = [args.script, *(a for a in args.args if a != "--")]
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
