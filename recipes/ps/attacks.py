"""What a Byzantine worker pushes instead of its update u (a gradient, or with --local-steps H the
change of its weights over H steps), as the Zeno papers attack:

  --byzantine K     workers 0..K-1 lie at every push, every tensor (Zeno's model: 8 of 20 workers in
                    its runs; here each flips its own update, where Zeno's all send -1 x the first
                    one's gradient: icml2019_zeno byzantine.py 14-18);
  --attack-prob q   every worker lies with probability q, drawn per tensor of each push by default
                    (ZenoPS's model, q = 0.2: zeno_ps byteps/mxnet/__init__.py 406 sync, 850 async: one
                    draw per tensor, so most pushes carry some poisoned tensors and few are poisoned
                    whole); --attack-draw push draws once per push, for every tensor of it (Zeno++'s:
                    AsyncByzGrad train_cifar10.py 259-265, q = nbyz / 10);
  signflip          -s u_t (ZenoPS: s = 6 sync, 2 async; Zeno++: 10; Zeno: 1);
  gaussian          N(0, s^2) in place of u_t (ZenoPS: s = 1);
  random            a random direction at s times ||u_t|| (ZenoPS: s = 8);
  labelflip         u computed on labels c -> C-1-c, a whole push (--attack-scale unused);
  alie              A Little Is Enough (Baruch et al., NeurIPS 2019), as its authors' code runs it: every
                    liar pushes mean - z std, coordinate-wise, of the liars' own honest updates of the round
                    (the population std: attacking_distributed_learning malicious.py 18-19, 35; the
                    paper's attackers estimate both from their own data; --byzantine K >= 2, sync). z is
                    --attack-scale, by default the paper's z_max for n workers of which m lie: s =
                    floor(n / 2 + 1) - m, z = Phi^-1((n - s) / n), 1.15 for 4 of 8 (their code's flag
                    defaults to 1.5). A lie within the spread of the honest updates, coordinate by
                    coordinate, against distance and median rules; pushes here are x - x_local, the sign
                    of a gradient, so "minus" is their direction. byzfl's ALittleIsEnough adds tau std
                    (ddof 1) instead: the other direction, longer for as many liars.
Each attack acts tensor by tensor (u_t: one parameter tensor of u), as ZenoPS's attacks.py 39-52.

IPM is not here: it is omniscient (computed from the honest workers' updates of the step), which
workers that see only their own batches cannot be; byzfl's benchmark, run by
scripts/figures/ps/byzfl_reference.py, measures it with that knowledge.
"""

import statistics

import torch
import torch.distributed as dist

from recipes.common import faults

COUNTS = 16  # the numbers of counts(), in the push headers and summed by the servers; in them:
PUSHED_REJECTED, PARAMS, FAILED_TESTS = slice(0, 12), slice(8, 12), slice(12, 16)  # (by pushes, tensors,
# parameters; by parameters alone; the parameters failing zenops' tests)


class Attacker:
    """Decides which tensors of one worker's pushes lie, and what they push. Reproducible: each round's draws
    come from a generator seeded by --seed, the worker's index and the round (counted from the run's start,
    so that a resumed run draws on as the straight one). clean_rounds: the rounds in which nobody lies."""

    def __init__(self, args, index, sizes, clean_rounds=0, liars=None):
        self.liars = liars  # alie: the liars' gloo group, over which they share their honest updates
        self.attack, self.scale, self.prob, self.sizes = args.attack, args.attack_scale, args.attack_prob, sizes
        self.always, self.seed, self.index = index < args.byzantine, args.seed or 0, index
        self.clean_rounds = clean_rounds
        self.per_tensor = args.attack_draw == "tensor" and args.attack not in ("labelflip", "alie")  # (whole)
        self.generator = torch.Generator().manual_seed(1_000_003 * self.seed + index)  # (reseeded each round)
        self.shares_updates = args.attack == "alie" and self.always  # (every round, pushing or not: poison())

    def next_push(self, round_):
        """Which tensors of this worker's push in round `round_` lie, one bool each (one draw per push, or per
        tensor, whatever the answer)."""
        self.generator.manual_seed((1_000_003 * self.seed + self.index) * 1_000_003 + round_)
        if round_ < self.clean_rounds:
            return [False] * len(self.sizes)
        draws = torch.rand(len(self.sizes) if self.per_tensor else 1, generator=self.generator) < self.prob
        lies = [self.attack != "none" and (self.always or bool(draw)) for draw in draws.tolist()]
        return lies if self.per_tensor else lies * len(self.sizes)

    def relabel(self, lies, num_classes):
        """The labels a lying worker trains on, as a function of the true ones (labelflip: c -> C-1-c); else None."""
        return (lambda target: num_classes - 1 - target) if self.attack == "labelflip" and any(lies) else None

    def poison(self, update, lies):
        """The pushed vector: each lying tensor in place of the honest one (labelflip: already computed on
        flipped labels). alie: every liar calls it every round, pushing or not (they share their updates)."""
        if self.shares_updates:  # alie's liars (an honest worker is not in their group)
            every = [torch.empty_like(update) for _ in range(dist.get_world_size(self.liars))]
            with faults.waiting_for("the other liars' updates"):
                dist.all_gather(every, update, group=self.liars)
            every = torch.stack(every)
            return every.mean(dim=0) - self.scale * every.std(dim=0, correction=0) if any(lies) else update
        if self.attack == "labelflip" or not any(lies):
            return update
        return torch.cat([self.poison_tensor(u_t) if lie else u_t for u_t, lie in zip(update.split(self.sizes), lies)])

    def poison_tensor(self, u_t):
        if self.attack == "signflip":
            return -self.scale * u_t
        if self.attack == "gaussian":
            return self.scale * torch.randn(u_t.shape, generator=self.generator)
        direction = torch.randn(u_t.shape, generator=self.generator)  # random
        return direction * (self.scale * u_t.norm() / direction.norm().clamp_min(1e-12))


def counts(lies, sizes, passed=None, tests=None):
    """One push's update counts for the summary (COUNTS numbers): by pushes (honest pushed, byzantine pushed, honest
    rejected, byzantine rejected; a push is byzantine when any of its tensors lies, and rejected counts the share
    of its tensors that did not pass), then the same four by tensors, then by parameters; then the parameters that
    failed each of zenops' tests (tests: per tensor, (the sign test passed, the norm test passed)): honest failing
    the norm test, honest failing the sign test, byzantine failing the norm test, byzantine failing the sign test
    (a tensor failing both counts in both)."""
    passed = [True] * len(lies) if passed is None else passed
    tests = [(True, True)] * len(lies) if tests is None else tests
    byzantine, share = any(lies), 1 - sum(passed) / len(passed)
    values = [not byzantine, byzantine, 0 if byzantine else share, share if byzantine else 0]
    for weights in ([1] * len(sizes), sizes):
        values += [sum(w for w, lie in zip(weights, lies) if not lie), sum(w for w, lie in zip(weights, lies) if lie),
                   sum(w for w, lie, ok in zip(weights, lies, passed) if not lie and not ok),
                   sum(w for w, lie, ok in zip(weights, lies, passed) if lie and not ok)]
    for lying in (False, True):
        values += [sum(w for w, lie, (_, norm) in zip(sizes, lies, tests) if lie == lying and not norm),
                   sum(w for w, lie, (sign, _) in zip(sizes, lies, tests) if lie == lying and not sign)]
    return torch.tensor(values, dtype=torch.float64)


def alie_z_max(workers, liars):
    """Baruch et al.'s z_max: the largest z at which the lie still looks closer to the mean than some honest
    workers do (their section 3: s = floor(n / 2 + 1) - m workers it needs on its side, z = Phi^-1((n - s) / n))."""
    needed = max(workers // 2 + 1 - liars, 1)  # (a majority of liars needs nobody: one, so that Phi^-1 is finite)
    return statistics.NormalDist().inv_cdf((workers - needed) / workers)


def describe(args):
    """Who lies, in words, for a run's first line."""
    if args.attack == "none":
        return "no attack"
    drawn = "tensor of every push" if args.attack_draw == "tensor" and args.attack not in ("labelflip", "alie") \
        else "push"
    who = " and ".join(([f"workers 0..{args.byzantine - 1} always"] if args.byzantine else []) +
                       ([f"every {drawn} with probability {args.attack_prob:g}"] if args.attack_prob else []))
    what = f"(mean - {args.attack_scale:.3g} std of the liars' updates)" if args.attack == "alie" else \
        f"x {args.attack_scale:g}"
    return f"--attack {args.attack} {what} by {who}"
