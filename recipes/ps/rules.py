"""How the servers and validators combine or judge the workers' updates, written out.

u is a pushed update (a gradient; with --local-steps H, the change of a worker's weights over its
H steps), v the validator's own update of the same kind on its held-out data. mean(.) averages
over coordinates; <.,.> and ||.|| are over the whole vector unless a rule works per tensor.

  zenops sync   per tensor: accept u_t when mean(u_t v_t) > eta mean(v_t^2) and mean(u_t^2) <
                (1 + rho) mean(v_t^2); each tensor is the mean of the pushes accepted for it
                (ZenoPS, Xie et al. 2022; zeno_ps validator.py: eta -0.001, rho 0.6).
  zenops async  per tensor: clip u_t to ||v_t||, s = cos(u_t, v_t); s >= eta applies alpha u_t,
                otherwise alpha s u_t, which turns a flipped update round (eta -0.02, alpha 0.4).
  zeno          the n - b best of score(g) = f(x) - f(x - lr g) - (lr / rho_ratio) mean(g^2), f the
                loss on one scoring batch shared by every candidate (Zeno, Xie et al. ICML 2019:
                rho_ratio 200).
  zeno++        g rescaled to ||v|| is accepted when lr0 <g', v> - rho ||g||^2 + lr0 eps >= 0, lr0 the
                base (unscheduled) learning rate, the penalty on g before rescaling (Zeno++, Xie et
                al. ICML 2020: eps 0, rho 0.001 at lr 0.1; v refreshed every k = 10 arrivals).
  phocas        coordinate-wise, the mean of the n - b values nearest the trimmed mean (Xie et al. 2018).
  naive-async   alpha u for every push: ZenoPS's asynchronous baseline, the rule its async zenops is
                read against (zeno_ps validator.py 172-183, NaiveAsyncValidator; alpha 0.4). With
                --validators it runs in them, as ZenoPS's (a hop between worker and server, which adds
                staleness); without, on the servers.
The other robust rules are byzfl's (median, trimmed mean, Krum, centered clipping).
"""

import torch

ZENOPS_SYNC_ETA, ZENOPS_RHO = -0.001, 0.6
ZENOPS_ASYNC_ETA, ZENOPS_ALPHA = -0.02, 0.4
ZENO_RHO_RATIO = 200
ZENO_PLUS_PLUS_RHO_PER_LR, ZENO_PLUS_PLUS_EPS, ZENO_PLUS_PLUS_K = 0.01, 0.0, 10


def per_tensor(vector, sizes):
    """A flat vector cut into its parameter tensors (views)."""
    return vector.split(sizes)


def zenops_sync(u, v, sizes, eta, rho):
    """ZenoPS's synchronous tests of u against v, tensor by tensor: (the sign test passed, the norm test passed)
    for each tensor; a tensor passes when both do."""
    tests = []
    for u_t, v_t in zip(per_tensor(u, sizes), per_tensor(v, sizes)):
        v2 = (v_t * v_t).mean()
        tests.append((bool((u_t * v_t).mean() > eta * v2), bool((u_t * u_t).mean() < (1 + rho) * v2)))
    return tests


def accepted_part(u, passed, sizes):
    """u with the tensors that did not pass set to zero: what a validator adds to its sum (the servers divide
    each tensor by how many passed, validators.accepted_mean)."""
    return torch.cat([u_t if ok else torch.zeros_like(u_t) for u_t, ok in zip(per_tensor(u, sizes), passed)])


def zenops_async(u, v, sizes, eta, alpha):
    """ZenoPS's asynchronous rule, tensor by tensor. Returns (the update to apply, which tensors had s >= eta)."""
    pieces, passed = [], []
    for u_t, v_t in zip(per_tensor(u, sizes), per_tensor(v, sizes)):
        u_t = u_t * min(1.0, (v_t.norm() / u_t.norm().clamp_min(1e-12)).item())
        score = (u_t @ v_t / (u_t.norm() * v_t.norm()).clamp_min(1e-12)).item()
        passed.append(score >= eta)
        pieces.append(alpha * u_t if score >= eta else alpha * score * u_t)
    return torch.cat(pieces), passed


def naive_async(u, alpha):
    """ZenoPS's naive-async: every push applied, scaled by alpha."""
    return alpha * u


def zeno_scores(loss_at, x, candidates, lr, rho_ratio):
    """Zeno: how much a step along each g lowers the loss of the scoring batch (loss_at(weights)), less a
    penalty that scales with the learning rate and, through the mean over coordinates, with 1 / dimension."""
    f_x = loss_at(x)
    return [f_x - loss_at(x - lr * g) - lr / rho_ratio * (g * g).mean().item() for g in candidates]


def zeno_keep(scores, b):
    """Zeno keeps the n - b highest-scoring candidates (their indices, in order)."""
    ranked = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    return sorted(ranked[:len(scores) - b])


def zeno_plus_plus(g, v, base_lr, rho, eps):
    """Zeno++: rescale g to ||v||; accept when base_lr <g', v> - rho ||g||^2 + base_lr eps >= 0, ||g|| before the
    rescaling. Returns (rescaled g, accepted)."""
    g_squared = (g @ g).item()
    rescaled = g * (v.norm() / g.norm().clamp_min(1e-12))
    return rescaled, base_lr * (rescaled @ v).item() - rho * g_squared + base_lr * eps >= 0


def phocas(vectors, b):
    """Phocas, coordinate-wise: the trimmed mean drops the b largest and b smallest values; Phocas averages
    the n - b values nearest to that trimmed mean."""
    n = vectors.shape[0]
    ordered = vectors.sort(dim=0).values
    trimmed_mean = ordered[b:n - b].mean(dim=0)
    nearest = (vectors - trimmed_mean).abs().argsort(dim=0)[:n - b]
    return torch.gather(vectors, 0, nearest).mean(dim=0)


def clipping(rule):
    """byzfl's centered clipping keeps its centre from round to round: one per server (tau 10), or None."""
    if rule != "centered-clipping":
        return None
    import byzfl

    return byzfl.CenteredClipping(tau=10.0)


def aggregate(rule, updates, b, clipping=None, trim_ratio=None):
    """The servers' rule over the workers' pushes of one sync step (no validators). A round with fewer pushes
    (--worker-subsample) trims at most what it can: b below half of them (krum: n > 2 b + 2). trim_ratio r:
    b from each round's n instead, as ZenoPS's trimmed mean and phocas (zeno_ps byteps/mxnet/validator.py
    66-90): int(min((n - 2) // 2, r n)) and int(max(1, r n)), and no update at all from 2 pushes or fewer."""
    stacked, n = torch.stack(updates), len(updates)
    if trim_ratio is not None:
        if n <= 2:
            return torch.zeros_like(stacked[0])
        b = int(min((n - 2) // 2, n * trim_ratio)) if rule == "trimmed-mean" else int(max(1, n * trim_ratio))
    b = max(0, min(b, (n - 3) // 2 if rule == "krum" else (n - 1) // 2))
    if rule == "mean":
        return stacked.mean(dim=0)
    if rule == "phocas":
        return phocas(stacked, b)
    if rule == "centered-clipping":
        return clipping(stacked)
    import byzfl  # only the robust rules need it (seconds to import)

    return {"median": byzfl.Median(), "trimmed-mean": byzfl.TrMean(f=b), "krum": byzfl.Krum(f=b)}[rule](stacked)
