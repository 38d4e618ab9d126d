"""Why three kinds of the parameter server's targets miss (scripts/figures/ps/table.py's table), each measured on the
table's own flags with the recipe run under scripts/figures/ps/why_probe.py, which writes down every judgement of its
validators.

    python scripts/figures/ps/why.py     # figures/data/ps_why.csv (scripts/figures/ps/measure.py runs it too, after
                                         its table)

  rejections  sync zenops without an attack (sync-1v; sync-2v at a batch of 8 and of 32, as
              scripts/figures/ps/table.py's batch part scales it): the honest parameters that fail ZenoPS's sign test
              (mean(u v) <= eta mean(v^2)) and its norm test (mean(u^2) >= (1 + rho) mean(v^2)); in the first and the
              last third of the rounds; with one validator, the pushes that follow a round their worker sat out
              (which ZenoPS's worker starts from the new weights plus its sat-out change) apart from the others.
  zeno++      without an attack, with 2 more seeds (its runs vary from run to run as much as from seed to
              seed): the mean; Zeno++ as its authors wrote it (an accepted g applied at the length of v), also
              with v on the workers' batch (its authors' ratio: both on 128); the same test with g applied as
              pushed, and at v's length only where that shortens it; the accepted pushes that v's length
              lengthened, and the longest step the servers applied over the median one. At a batch of 32 (3
              seeds: each run is 4 x as long), the mean, Zeno++ and g as pushed, and the latter two under the
              sign flip x 10 at p 0.2: those rows at 5 x its authors' learning rate an image (--lr 1.0 for
              256; at 32, the same rate a step). And the mean and Zeno++ at its authors' rate an image (0.1 for
              128, the zeno++ table's), also for 4 x the epochs (3 seeds), and at a batch of 32, also under the
              sign flip.
  signflip    Zeno++ at a batch of 32 and its authors' learning rate an image, with and without the sign flip
              x 10 at p 0.2, 8 seeds each (how often a run ends under 90 %), and for 4 x the epochs (3 seeds): the
              lies it accepted, and the validator's highest loss (where it computed v) with the lies before it.
  async-2v    zenops and naive-async for 4 x the table's epochs; what zenops applies of each push (clipped to
              ||v_t||, times cos where cos < eta) against naive-async's alpha u: by norm, and projected on alpha u;
              and naive-async at alpha times that mean projection: naive-async's direction at zenops' mean step
              along it; zenops at eta -1, which reverses nothing (cos >= -1): its clipping alone; and alpha u
              forwarded by zenops' validators (scripts/figures/ps/why_probe.py --zenops-async-step alpha-u): their path,
              not their rule.
Every row for each seed (3 by default); --studies: only those, the others' rows kept as ps_why.csv holds them.
Run directories go to runs/figures/ps-why/<name>-seed<S> (with the probe's lines under probe/); a run whose
summary.json is complete is not trained again.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from recipes.ps import rules, steps  # noqa: E402
from scripts.figures.ps import table as ps_table  # noqa: E402
from scripts.figures import measuring  # noqa: E402

# (study, label, scripts/figures/ps/table.py's part, aggregate and attack labels, the probe's flags, more recipe flags,
# epochs x the table's)
PLUS_PLUS, AS_PUSHED, SIGN_FLIP = "zeno++, 1 step", ["--zeno-plus-plus-step", "g"], "signflip x10, p 0.2 per push"
AUTHORS_LR = ["--lr", str(ps_table.ZENO_PP_LR)]  # 0.1 for 128 images (AsyncByzGrad exp_*.sh), as the zeno++ table
AUTHORS = "at its authors' learning rate an image"
FIVE_X = ["--lr", "1.0"]  # the other zeno++ rows: 5 x its authors' rate an image (10 x --lr 0.1, the momentum's
FIVE_X_32 = ["--lr", "0.25"]  # 1 / (1 - 0.9)), at 32 the same rate a step as at 8
RUNS = [("rejections", "sync-1v", "sync-1v", "zenops", "none", [], [], 1),
        ("rejections", "sync-2v", "sync-2v", "zenops", "none", [], [], 1),
        ("rejections", "sync-2v, batch 32", "sync-2v", "zenops, batch 32", "none", [], [], 1),
        ("zeno++", "mean", "zeno++", "mean, 1 step", "none", [], FIVE_X, 1),
        ("zeno++", "g at the length of v (Zeno++)", "zeno++", PLUS_PLUS, "none", [], FIVE_X, 1),
        ("zeno++", "g at the length of v, v on the workers' batch of 8 (its authors' ratio)", "zeno++", PLUS_PLUS,
         "none", [], ["--validator-batch", "8", *FIVE_X], 1),
        ("zeno++", "g as pushed", "zeno++", PLUS_PLUS, "none", AS_PUSHED, FIVE_X, 1),
        ("zeno++", "g at the length of v where that shortens it", "zeno++", PLUS_PLUS, "none",
         ["--zeno-plus-plus-step", "at-most-v"], FIVE_X, 1),
        ("zeno++", f"mean, {AUTHORS}", "zeno++", "mean, 1 step", "none", [], AUTHORS_LR, 1),
        ("zeno++", f"g at the length of v (Zeno++), {AUTHORS}", "zeno++", PLUS_PLUS, "none", [], AUTHORS_LR, 1),
        ("zeno++", f"mean, {AUTHORS}, 20 epochs", "zeno++", "mean, 1 step", "none", [], AUTHORS_LR, 4),
        ("zeno++", f"g at the length of v (Zeno++), {AUTHORS}, 20 epochs", "zeno++", PLUS_PLUS, "none", [],
         AUTHORS_LR, 4),
        ("zeno++", "mean, batch 32", "zeno++", "mean, 1 step, batch 32", "none", [], FIVE_X_32, 1),
        ("zeno++", "g at the length of v (Zeno++), batch 32", "zeno++", f"{PLUS_PLUS}, batch 32", "none", [], FIVE_X_32,
         1),
        ("zeno++", "g as pushed, batch 32", "zeno++", f"{PLUS_PLUS}, batch 32", "none", AS_PUSHED, FIVE_X_32, 1),
        ("zeno++", f"g at the length of v (Zeno++), batch 32, {SIGN_FLIP}", "zeno++", f"{PLUS_PLUS}, batch 32",
         SIGN_FLIP, [], FIVE_X_32, 1),
        ("zeno++", f"g as pushed, batch 32, {SIGN_FLIP}", "zeno++", f"{PLUS_PLUS}, batch 32", SIGN_FLIP, AS_PUSHED,
         FIVE_X_32, 1),
        ("zeno++", f"mean, batch 32, {AUTHORS}", "zeno++", "mean, 1 step, batch 32", "none", [], AUTHORS_LR, 1),
        ("zeno++", f"g at the length of v (Zeno++), batch 32, {AUTHORS}", "zeno++", f"{PLUS_PLUS}, batch 32", "none",
         [], AUTHORS_LR, 1),
        ("zeno++", f"g at the length of v (Zeno++), batch 32, {AUTHORS}, {SIGN_FLIP}", "zeno++",
         f"{PLUS_PLUS}, batch 32", SIGN_FLIP, [], AUTHORS_LR, 1),
        ("signflip", f"Zeno++, batch 32, {AUTHORS}", "zeno++", f"{PLUS_PLUS}, batch 32", "none", [], AUTHORS_LR, 1),
        ("signflip", f"Zeno++, batch 32, {AUTHORS}, {SIGN_FLIP}", "zeno++", f"{PLUS_PLUS}, batch 32", SIGN_FLIP, [],
         AUTHORS_LR, 1),
        ("signflip", f"Zeno++, batch 32, {AUTHORS}, 4 x the epochs", "zeno++", f"{PLUS_PLUS}, batch 32", "none", [],
         AUTHORS_LR, 4),
        ("signflip", f"Zeno++, batch 32, {AUTHORS}, 4 x the epochs, {SIGN_FLIP}", "zeno++", f"{PLUS_PLUS}, batch 32",
         SIGN_FLIP, [], AUTHORS_LR, 4),
        ("async-2v", "zenops", "async-2v", "zenops", "none", [], [], 4),
        ("async-2v", "naive-async", "async-2v", "naive-async", "none", [], [], 4),
        ("async-2v", "naive-async at zenops' mean step", "async-2v", "naive-async", "none", [], [], 4),
        ("async-2v", "zenops at eta -1: clipped, nothing reversed", "async-2v", "zenops", "none", [],
         ["--zeno-eta", "-1"], 4),
        ("async-2v", "alpha u through the validators (their path, not their rule)", "async-2v", "zenops", "none",
         ["--zenops-async-step", "alpha-u"], [], 4)]
QUICK = ["sync-1v", "g as pushed", "zenops", "naive-async at zenops' mean step"]  # (a row of each study)
FIELDS = ["study", "label", "seed", "epochs", "top1", "diverged", "honest_params_rejected", "sign_failed",
          "norm_failed", "first_third_rejected", "last_third_rejected", "after_sit_out_rejected",
          "after_push_rejected", "accepted", "lengthened", "longest_step", "lies_pushed", "lies_accepted", "peak_loss",
          "lies_before_peak", "mean_step", "mean_along", "alpha",
          "cpu", "cores", "gpu", "torch"]


def probe_lines(out):
    return [json.loads(line) for path in sorted((out / "probe").glob("rank*.jsonl")) for line in path.open()]


def percent(part, whole):
    return round(100 * part / whole, 1) if whole else ""


def rejections(lines, seed, subsample):
    """Honest parameters failing each of sync zenops' tests (%), by third of the rounds and by what the pushing
    worker did the round before (--worker-subsample: sat out or pushed; sync-1v's server and validator are ranks
    0 and 1)."""
    tensors = [t for t in lines if t["rule"] == "zenops"]
    rounds = max(t["round"] for t in tensors) + 1
    drawn = argparse.Namespace(seed=seed, worker_subsample=subsample)

    def sign_fails(t):
        return t["dot"] <= rules.ZENOPS_SYNC_ETA

    def norm_fails(t):
        return t["square"] >= 1 + rules.ZENOPS_RHO

    def share(subset, fails=lambda t: sign_fails(t) or norm_fails(t)):
        return percent(sum(t["numel"] for t in subset if fails(t)), sum(t["numel"] for t in subset))

    def sat_out(t):  # the draw of the worker's previous round (its index: its rank less 1 server, 1 validator)
        return t["round"] > 0 and not steps.joins(drawn, t["sender"] - 2, t["round"] - 1)
    row = {"honest_params_rejected": share(tensors), "sign_failed": share(tensors, sign_fails),
           "norm_failed": share(tensors, norm_fails),
           "first_third_rejected": share([t for t in tensors if t["round"] < rounds / 3]),
           "last_third_rejected": share([t for t in tensors if t["round"] >= 2 * rounds / 3])}
    if subsample < 1:  # (round 0 follows nothing)
        row.update(after_sit_out_rejected=share([t for t in tensors if sat_out(t)]),
                   after_push_rejected=share([t for t in tensors if t["round"] > 0 and not sat_out(t)]))
    return row


def zeno_plus_plus(lines, step):
    """Zeno++'s pushes accepted (%), those of them whose rescaling to ||v|| lengthened (%), and the longest step the
    servers applied over the median one (step: the probe's --zeno-plus-plus-step: which length they applied)."""
    accepted = [p for p in lines if p["rule"] == "zeno++" and p["accepted"]]
    if not accepted:
        return {"accepted": 0.0} if lines else {}
    lengths = [p["g"] if step == "g" else min(p["g"], p["v"]) if step == "at-most-v" else p["v"] for p in accepted]
    row = {"accepted": percent(len(accepted), sum(p["rule"] == "zeno++" for p in lines)),
           "lengthened": percent(sum(p["v"] > p["g"] for p in accepted), len(accepted)),
           "longest_step": round(max(lengths) / max(statistics.median(lengths), 1e-30), 1)}
    judged = [p for p in lines if p["rule"] == "zeno++"]
    if "lie" in judged[0]:  # the lies pushed and accepted; the validator's highest loss after its first tenth of
        later = judged[len(judged) // 10:]  # pushes (where v was computed), and the lies accepted before it
        peak = max(range(len(later)), key=lambda i: later[i]["v_loss"])
        row.update(lies_pushed=sum(p["lie"] for p in judged), lies_accepted=sum(p["lie"] for p in accepted),
                   peak_loss=round(later[peak]["v_loss"], 2),
                   lies_before_peak=sum(p["lie"] and p["accepted"] for p in judged[:len(judged) // 10 + peak]))
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/mnist5k")
    parser.add_argument("--epochs", type=int, default=5, help="the table's epochs")
    parser.add_argument("--quick", action="store_true", help="lenet at 16 px, one row of each study, for tests")
    parser.add_argument("--seeds", type=int, nargs="+", default=measuring.SEEDS)
    parser.add_argument("--studies", nargs="+", choices=list(dict.fromkeys(run[0] for run in RUNS)),
                        help="run only these; the other studies' rows stay as ps_why.csv holds them")
    parser.add_argument("--runs", default="runs/figures/ps-why", help="where the run directories go")
    parser.add_argument("--figures-data", default="figures/data", help="where ps_why.csv goes")
    args = parser.parse_args()
    measuring.require_digits(args.data)
    run(args.data, args.runs, args.figures_data, args.seeds, args.epochs, args.quick, args.studies)


def run(data, runs, figures_data, seeds, epochs, quick=False, studies=None):
    """Every row, seed by seed, into <figures_data>/ps_why.csv (scripts/figures/ps/measure.py runs it after its table);
    studies: only those, the other studies' rows kept as ps_why.csv holds them."""
    machine, rows, pushed_steps, csv_path = measuring.hardware(), [], [], Path(figures_data) / "ps_why.csv"
    plan = [run for run in RUNS if (not quick or run[1] in QUICK) and (not studies or run[0] in studies)]
    order = list(dict.fromkeys(run[0] for run in RUNS))
    kept = ([r for r in measuring.read_csv(csv_path) if r["study"] not in studies] if studies and csv_path.exists()
            else [])
    for study, label, part, aggregate, attack, probe, extra, more in plan:
        more_seeds = 0 if quick or more > 1 else 2 if study == "zeno++" and "batch 32" not in label else (
            5 if study == "signflip" else 0)  # (5 seeds at a batch of 8; 8 for how often a run collapses)
        mode, table = ps_table.PARTS[part][0], argparse.Namespace(quick=quick, epochs=epochs * more, data=data,
                                                                  runs=runs)
        for seed in seeds + [max(seeds) + 1 + i for i in range(more_seeds)]:
            _, processes, flags = ps_table.flags_of(part, mode, aggregate, attack, None, seed, table)
            flags += extra
            alpha = rules.ZENOPS_ALPHA if study == "async-2v" else ""
            if label == "naive-async at zenops' mean step":  # (zenops' runs come first)
                alpha = round(rules.ZENOPS_ALPHA * statistics.mean(pushed_steps), 3)
                flags += ["--zeno-alpha", str(alpha)]
            name = f"{study}-{label}".replace("||", "").replace("'", "")
            out = Path(runs) / f"{''.join(c if c.isalnum() or c in '.+-' else '_' for c in name)}-seed{seed}"
            launcher = [ROOT / "scripts" / "figures" / "ps" / "why_probe.py", "--judgements", out / "probe", *probe,
                        "--"]
            summary = measuring.train("ps", processes, flags, out, threads=1, forked=True, check=False,
                                      launcher=launcher)
            row = {"study": study, "label": label, "seed": seed, "epochs": epochs * more, "alpha": alpha,
                   **machine}
            if summary is None:
                ps_table.require_diverged(out, name, seed)
                rows.append({**row, "diverged": 1})
                continue
            lines = probe_lines(out)
            row.update(diverged=0, top1=round(summary["top1"], 2), epochs=summary["epochs"])  # (batch 32: more)
            if study == "rejections":
                row.update(rejections(lines, seed, 0.5 if part == "sync-1v" else 1.0))
            elif study in ("zeno++", "signflip"):
                row.update(zeno_plus_plus(lines, probe[1] if probe else None))
            elif not probe:  # (async; with alpha-u the rule's update is not what was applied)
                pushed = [line for line in lines if line["rule"] == "zenops async"]
                pushed_steps += [line["along"] for line in pushed] if label == "zenops" else []
                if pushed:
                    row.update(mean_step=round(statistics.mean(line["step"] for line in pushed), 3),
                               mean_along=round(statistics.mean(line["along"] for line in pushed), 3))
            rows.append(row)
            print(f"{study}, {label}, seed {seed}: top-1 {row['top1']} %", flush=True)
            measuring.write_csv(csv_path, FIELDS, sorted(kept + rows, key=lambda r: order.index(r["study"])))


if __name__ == "__main__":
    main()
