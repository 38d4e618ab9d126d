"""The validators' rules and Phocas, written out: each takes flat gradient vectors.

g is a candidate (a worker's pushed gradient), v the validator's own gradient on its
held-out batch; mean(.) averages over the coordinates, <.,.> and ||.|| are the dot
product and the Euclidean norm of the whole vectors.
"""

import torch


def zenops_sync(g, v, eta, rho):
    """ZenoPS (Xie et al., Algorithms 15(7), 2022), synchronous: accept g when
    mean(g v) > eta mean(v^2) and mean(g^2) < (1 + rho) mean(v^2)."""
    v2 = (v * v).mean()
    return bool((g * v).mean() > eta * v2 and (g * g).mean() < (1 + rho) * v2)


def zenops_async(g, v, eta, alpha):
    """ZenoPS, asynchronous: clip g to ||v||, score s = cos(g, v); s >= eta applies alpha g, otherwise
    alpha s g (a gradient against v is scaled down, or turned round). Returns (update, accepted: s >= eta)."""
    g = g * min(1.0, (v.norm() / g.norm().clamp_min(1e-12)).item())
    score = (g @ v / (g.norm() * v.norm()).clamp_min(1e-12)).item()
    return (alpha * g, True) if score >= eta else (alpha * score * g, False)


def zeno_scores(loss_at, x, candidates, lr, rho):
    """Zeno (Xie et al., ICML 2019): score(g) = f(x) - f(x - lr g) - rho ||g||^2, where f is the loss on the
    validator's batch (loss_at(weights) evaluates it): how much a step along g lowers it, less a penalty on
    large g."""
    f_x = loss_at(x)
    return [f_x - loss_at(x - lr * g) - rho * (g @ g).item() for g in candidates]


def zeno_keep(scores, b):
    """Zeno keeps the n - b highest-scoring candidates (their indices, in order)."""
    ranked = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    return sorted(ranked[:len(scores) - b])


def zeno_plus_plus(g, v, lr, rho, eps):
    """Zeno++ (Xie et al., ICML 2020): rescale g to ||v||, accept when lr <v, g> - rho ||g||^2 + lr eps >= 0.
    Returns (rescaled g, accepted)."""
    g = g * (v.norm() / g.norm().clamp_min(1e-12))
    return g, bool(lr * (v @ g) - rho * (g @ g) + lr * eps >= 0)


def phocas(vectors, b):
    """Phocas (Xie et al., 2018), coordinate-wise: the trimmed mean drops the b largest and b smallest
    values; Phocas averages the n - b values nearest to that trimmed mean."""
    n = vectors.shape[0]
    ordered = vectors.sort(dim=0).values
    trimmed_mean = ordered[b:n - b].mean(dim=0)
    nearest = (vectors - trimmed_mean).abs().argsort(dim=0)[:n - b]
    return torch.gather(vectors, 0, nearest).mean(dim=0)
