"""What a Byzantine worker pushes instead of its update u (a gradient, or with --local-steps H the
change of its weights over H steps), as the Zeno papers attack:

  --byzantine K     workers 0..K-1 lie at every push (Zeno's model: 8 of 20 workers in its runs,
                    all sending -1 x the first one's gradient; x 4 here makes 2 of 8 break the mean);
  --attack-prob q   every worker's push is poisoned with probability q, drawn per push (ZenoPS's
                    model, q = 0.2; Zeno++ flips with probability q/10);
  signflip          -s u (ZenoPS: s = 6 sync, 2 async; Zeno++: 10; Zeno: 1);
  gaussian          N(0, s^2) in place of u (ZenoPS: s = 1);
  random            a random direction at s times ||u|| (ZenoPS: s = 8);
  labelflip         u computed on labels c -> C-1-c (--attack-scale unused).

ALIE and IPM are not here: they are omniscient (computed from the honest workers' updates of the
step), which workers that see only their own batches cannot be; byzfl's benchmark, run by
scripts/bench_ps_byzfl.py, measures them with that knowledge.
"""

import torch


class Attacker:
    """Decides which of one worker's pushes lie, and what they push. Reproducible: the draws come from a
    generator of the worker's own, seeded by --seed and its index."""

    def __init__(self, args, index):
        self.attack, self.scale, self.prob = args.attack, args.attack_scale, args.attack_prob
        self.always = index < args.byzantine
        self.generator = torch.Generator().manual_seed(1_000_003 * (args.seed or 0) + index)

    def next_push_lies(self):
        """Whether this worker's next push is poisoned (one draw per push, whatever the answer)."""
        draw = torch.rand((), generator=self.generator).item()
        return self.attack != "none" and (self.always or draw < self.prob)

    def labels(self, target, num_classes, lying):
        return num_classes - 1 - target if lying and self.attack == "labelflip" else target

    def poison(self, update):
        """The pushed vector in place of the honest update (labelflip: already computed on flipped labels)."""
        if self.attack == "signflip":
            return -self.scale * update
        if self.attack == "gaussian":
            return self.scale * torch.randn(update.shape, generator=self.generator)
        if self.attack == "random":
            direction = torch.randn(update.shape, generator=self.generator)
            return direction * (self.scale * update.norm() / direction.norm().clamp_min(1e-12))
        return update


def describe(args):
    """Who lies, in words, for a run's first line."""
    if args.attack == "none":
        return "no attack"
    who = " and ".join(([f"workers 0..{args.byzantine - 1} always"] if args.byzantine else []) +
                       ([f"every push with probability {args.attack_prob:g}"] if args.attack_prob else []))
    return f"--attack {args.attack} x {args.attack_scale:g} by {who}"
