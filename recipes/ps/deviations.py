"""Where this recipe, and the table that measures it (scripts/figures/ps/table.py), depart from their authors' code,
and why: the one list of them. docs/results/ps.md renders it as a table (scripts/figures/ps/render.py).

The authors' code is four repositories, each at its commit in AUTHORS_COMMITS: ZenoPS (xcgoner/zeno_ps), Zeno
(xcgoner/icml2019_zeno), Zeno++ (xcgoner/AsyncByzGrad) and A Little Is Enough (moranant/attacking_distributed_learning).
Each row names the files and lines there that show what they do (`where`, in the short names of FILES, each a
repository and a path), and quotes one of those lines (`shows`: file, line, a piece of it), which
`python scripts/checks/authors_lines.py ps CLONE...` checks against clones of their code.
"""

AUTHORS_COMMITS = {
    "xcgoner/zeno_ps": "02312e763dc4fa4278d5c3e0dda96b4ce2c6a349",
    "xcgoner/icml2019_zeno": "3a999dd65b66b425d56837905db6fe9ef57922cf",
    "xcgoner/AsyncByzGrad": "4ea5a5dde24c6b75deb0aff049c129845613aa2a",
    "moranant/attacking_distributed_learning": "7c4f5eba8e4f6b26c03dac5104c4d4c805b1897a",
}

ZENOPS, ZENO, ZENO_PLUS_PLUS, ALIE = AUTHORS_COMMITS

FILES = {
    "zenops_trainers": (ZENOPS, "byteps/mxnet/__init__.py"),
    "zenops_rules": (ZENOPS, "byteps/mxnet/validator.py"),
    "zenops_server": (ZENOPS, "byteps/server/server.cc"),
    "zenops_worker": (ZENOPS, "example/mxnet/train_cifar10_byteps_zeno_worker.py"),
    "zenops_validator": (ZENOPS, "example/mxnet/train_cifar10_byteps_zeno_validator.py"),
    "zenops_serveronly": (ZENOPS, "example/mxnet/train_cifar10_serveronly.py"),
    "zenops_sync_1v": (ZENOPS, "launcher/experiments_sync_single_validator.sh"),
    "zenops_sync_2v": (ZENOPS, "launcher/experiments_sync_two_validators.sh"),
    "zenops_async_1v": (ZENOPS, "launcher/experiments_async_single_validator.sh"),
    "zenops_async_2v": (ZENOPS, "launcher/experiments_async_two_validators.sh"),
    "zeno_attack": (ZENO, "byzantine.py"),
    "zeno_train": (ZENO, "mxnet_cnn_cifar10_impl.py"),
    "zeno_rules": (ZENO, "nd_aggregation.py"),
    "zeno_run": (ZENO, "test_zeno_1.sh"),
    "zeno++_train": (ZENO_PLUS_PLUS, "train_cifar10.py"),
    "zeno++_split": (ZENO_PLUS_PLUS, "convert_cifar10.py"),
    "zeno++_run": (ZENO_PLUS_PLUS, "exp_17.sh"),
    "zeno++_run_delay_5": (ZENO_PLUS_PLUS, "exp_1.sh"),
    "alie_attack": (ALIE, "malicious.py"),
    "alie_main": (ALIE, "main.py"),
}

DEVIATIONS = [
    dict(here="8 workers, lenet on 5,000 digits for 5 epochs at a batch of 8",
         theirs="ZenoPS: 16 workers sync, 8 async, ResNet-20 on CIFAR-10 at a batch of 32 sync, 64 async; Zeno: 20 "
                "at 100, Zeno++: 10 at 128, a CNN on CIFAR-10; up to 200 epochs",
         where="zenops_sync_1v 32, 34; zenops_async_1v 32, 34; zeno_run 7; zeno++_run 53",
         shows=("zenops_sync_1v", 32, "--num-workers 16"),
         why="what 2 cores train in the bench's time"),
    dict(here="`--lr` 0.1 for 256 images, scaled to what an update averages over (sync: 0.025 a local step; async: "
              "0.0031), cosine after a warm-up epoch; Zeno++'s rows at its authors' rate an image (`--lr` 0.2 for "
              "256, no momentum)",
         theirs="ZenoPS: 0.2 a local step at a batch of 32 (sync), 0.4 x (1 / 9)^1/2 at 64 (async), stepped down "
                "x 0.1 (sync) and x 0.2 (async) at epochs 100 and 150 of 200: scaled linearly to a batch of 8, 0.05 "
                "and 0.017, 2x and 5x the rates here",
         where="zenops_sync_1v 34; zenops_async_1v 34; zenops_worker 247, 276-278",
         shows=("zenops_async_1v", 34, "--batch-size 64 --wd 0.0001 --lr 0.4 --lr-decay 0.2"),
         why="the project's contract: every row, ddp's included, trains on one rule; not measured at the authors' "
             "rates"),
    dict(here="local steps take the recipes' SGD with momentum",
         theirs="Nesterov's accelerated gradient",
         where="zenops_worker 61-64",
         shows=("zenops_worker", 61, "default='nag'"),
         why="one optimizer in every recipe"),
    dict(here="every tensor of a push is sent",
         theirs="each tensor is skipped with probability 0.2 (the launchers' `--sparse-rate`) and reaches the "
                "validator as zeros, which pass and dilute the mean; a skipped tensor is not poisoned, a poisoning "
                "rate of 0.16, not 0.2",
         where="zenops_trainers 393-409, 602-620; zenops_sync_1v 34",
         shows=("zenops_trainers", 393, "if random.uniform(0, 1) < self.sparse_rate:"),
         why="the skipping saves communication, which these runs do not measure"),
    dict(here="the servers apply the mean of every push the validators accepted, each weighing the same",
         theirs="each validator pushes its own mean, and the servers average the validators' means: a push weighs "
                "1 / (V x the pushes its validator accepted)",
         where="zenops_rules 115-125; zenops_trainers 640-641; zenops_server 552-556",
         shows=("zenops_trainers", 641, "param.list_data()[0][:] /= validator_size()"),
         why="one mean of the accepted pushes, whichever validator judged them"),
    dict(here="where one of two validators accepts no push for a tensor, the other's mean of it applies at full "
              "weight",
         theirs="that validator's mean is 0, and the average of the two halves the tensor's step",
         where="zenops_rules 121-125; zenops_trainers 640-641",
         shows=("zenops_rules", 125, "result[:] = 0"),
         why="what was accepted moves the model, wherever it was judged"),
    dict(here="asynchronous workers train at the recipe's rate, the learning rate of one worker's batch, and push "
              "their change",
         theirs="they scale the learning rate by (W + 1)^-1/2 and pull their weights 20 % back towards the last "
                "pulled after each local step (a proximal rho 0.2)",
         where="zenops_worker 247, 252; zenops_trainers 806-811",
         shows=("zenops_worker", 247, "optimizer_params['learning_rate'] *= math.sqrt(1./(worker_size()+1))"),
         why="every async row on one rule, so that the rows compare rules"),
    dict(here="an asynchronous validator computes v as a worker computes its push, at the servers' learning rate",
         theirs="its validator scales its learning rate by (W + 1)^-1/2 as well and pulls 20 % back after each "
                "step (rho 0.2)",
         where="zenops_validator 240, 245; zenops_trainers 1036-1041",
         shows=("zenops_validator", 245, "rho = 0.2"),
         why="v is the update an honest worker would push, as in sync"),
    dict(here="alpha stays at `--zeno-alpha` 0.4 for the whole run",
         theirs="the validators halve alpha once, at epoch 100 of 200: the launchers ask for 100 and 150, but the "
                "decay advances the learning rate's count, not alpha's",
         where="zenops_validator 275-284; zenops_async_1v 35",
         shows=("zenops_validator", 284, "lr_decay_count += 1"),
         why="5 epochs here, and the recipe's schedule in place of their steps"),
    dict(here="`--trim-ratio` 0.2: no update from a round of 2 pushes or fewer, as theirs; with 8 workers each "
              "pushing with probability 0.5, 14.5 % of the one-validator rounds, and in 49 % (3 or 4 pushes) the "
              "trimmed mean trims nothing",
         theirs="16 workers: 0.2 % of the rounds apply nothing, and in 3.6 % the trimmed mean trims nothing",
         where="zenops_rules 66-67, 73, 87-88; zenops_sync_1v 34",
         shows=("zenops_rules", 66, "if validation_info['num_tensors'] <= 2:"),
         why="the scale: 8 workers, not 16"),
    dict(here="without validators the servers trim every push of the round at once (in the two-validator runs, "
              "b = 1 either way)",
         theirs="the trimmed mean and phocas run inside each validator, over its own workers' pushes, and the "
                "servers average the validators' results",
         where="zenops_trainers 579-580, 638-641; zenops_rules 73, 90",
         shows=("zenops_trainers", 580, "if j % validator_size() == rank():"),
         why="a rule on the servers needs no validators; the validators here run the Zeno rules"),
    dict(here="the synchronous two-validator rows have 1 server",
         theirs="2 servers (the asynchronous two-validator rows have their 2 here too)",
         where="zenops_sync_2v 32; zenops_async_2v 32",
         shows=("zenops_sync_2v", 32, "--num-servers 2"),
         why="in sync, 2 servers apply the same updates"),
    dict(here="the \"validation data only\" baseline is nd on the held-out share, at one worker's batch for as many "
              "steps as one worker takes, at half the workers' per-step learning rate",
         theirs="a script of its own, at its default `--lr` 0.1 against the workers' 0.2",
         where="zenops_serveronly 56; zenops_sync_1v 34",
         shows=("zenops_serveronly", 56, "'--lr', type=float, default=0.1"),
         why="nd is the project's trainer of one process; the rate at their ratio"),
    dict(here="Zeno's rows: 3 of 8 workers each flip their own gradient x 4",
         theirs="8 of 20 liars all send minus the first worker's gradient, at scale 1",
         where="zeno_attack 14-18; zeno_run 7",
         shows=("zeno_attack", 17, "v[i][:] = -v[0]"),
         why="flipped x 1, 3 of 8 leave the mean (5 - 3) / 8 of the honest one in expectation, still a descent, as "
             "Zeno's 8 of 20 leave (12 - 8) / 20; x 4 makes the mean fail (not measured at x 1 here)"),
    dict(here="Zeno's rows train with the recipe's momentum and schedule",
         theirs="plain SGD at a constant learning rate",
         where="zeno_train 128, 135-176; zeno_rules 93-97",
         shows=("zeno_rules", 97, "param.set_data(param_net[j] - lr * g_aggregated"),
         why="the rows beside them train so"),
    dict(here="zeno scores on 4 x the workers' batch (32 at a batch of 8) from the held-out share, and in one row "
              "of the zeno table on Zeno's own 4",
         theirs="a scoring batch of 4 images from all of train/",
         where="zeno_train 88, 116-117; zeno_run 7",
         shows=("zeno_train", 116, "CIFAR10('/data/cx2', train=True"),
         why="a gradient of 8 images is noisy; the held-out data, as the other rules'"),
    dict(here="Zeno's penalty is lr / 200 x mean(g^2) on mean gradients",
         theirs="its gradients are sums over its batch, applied at lr / B: in mean-gradient terms its penalty is B "
                "times the one here",
         where="zeno_train 128; zeno_rules 74, 84",
         shows=("zeno_train", 128, "lr = args.lr / batch_size"),
         why="the recipe's gradients are means"),
    dict(here="Zeno++'s rho is kept as its ratio to the base learning rate, 0.01; v is computed on 4 x the workers' "
              "batch, so ||g||^2 / ||v||^2 is above 1 and its bar on cos(g, v) higher than its authors'",
         theirs="rho 0.001 at lr 0.1, on sums over equal batches of 128 (workers and v)",
         where="zeno++_run 35, 43, 53; zeno++_train 24, 47, 346",
         shows=("zeno++_run", 43, "for rho in 0.001"),
         why="a gradient of 8 images has 4 times the variance of one of 32"),
    dict(here="Zeno++'s staleness is the processes' own; the recipe's learning-rate warm-up stands for the "
              "sequential epoch, and `--clean-epochs 1` keeps 1 of 5 epochs free of attacks, the warm-up's",
         theirs="one process simulates it: each gradient at a model drawn from the last 5 to 20, after a "
                "sequential warm-up epoch at lr 0.01; its first epoch of 200 is free of attacks",
         where="zeno++_train 172-185, 243-251, 259; zeno++_run_delay_5 39; zeno++_run 39",
         shows=("zeno++_train", 259, "epoch > 0"),
         why="the recipe's workers run asynchronously"),
    dict(here="Zeno++'s v is refreshed every k pushes counted from the run's start",
         theirs="every k arrivals counted from each epoch's start (its i)",
         where="zeno++_train 233, 302",
         shows=("zeno++_train", 302, "if i % zeno_max_delay == 0:"),
         why="the validators count pushes, not the epoch's batches"),
    dict(here="the validators hold a ninth of train/, as the other parts'",
         theirs="Zeno++'s validation share is a 20th",
         where="zeno++_split 125",
         shows=("zeno++_split", 125, "n_val = round(len(x_train_list) / 20)"),
         why="one held-out share for every row"),
    dict(here="with `--local-steps 1`, a tensor no validator accepted, and a round in which every worker sat out, "
              "still moves by the servers' momentum and weight decay",
         theirs="on local steps, each validator adds 0 to the weights it pushes: the tensor stays where it is",
         where="zenops_rules 121-125; zenops_trainers 629-641",
         shows=("zenops_trainers", 640, "param.list_data()[0][:] += cached_update_list[0]"),
         why="the servers' SGD steps with every update, as every recipe's"),
    dict(here="ALIE's liars push mean - z std of their own updates (the population std), z by default the paper's "
              "z_max for the workers and liars, 1.15 for 4 of 8",
         theirs="the same rule, z from a flag that defaults to 1.5",
         where="alie_attack 18-19, 35; alie_main 55-56, 96",
         shows=("alie_main", 96, "'--num_std', default=1.5"),
         why="the paper's z, which keeps the lie within the honest updates' spread for these counts"),
    dict(here="the async tables run naive-async in the validators, as ZenoPS, and on the servers, without the hop",
         theirs="in the validator processes only (alpha u, forwarded)",
         where="zenops_rules 172-183; zenops_async_1v 35",
         shows=("zenops_rules", 183, "result[:] = update * self.alpha"),
         why="the hop adds staleness: the two rows show what it costs"),
    dict(here="async-1v and async-2v run without `--worker-delay` (the sleep; a worker pulls at once after its "
              "push): their asynchrony is that of 9 to 12 processes on 2 cores; async-delay's workers sleep up to "
              "0.1 s x the workers, before the rounds they push in, and do not wait for the timestamp",
         theirs="each worker sleeps up to 1 s x the number of workers before a push, and waits for the server's "
                "timestamp to move past its last pull",
         where="zenops_trainers 821, 855-858",
         shows=("zenops_trainers", 821, "time.sleep(1.0 * worker_size() * random.uniform(0, 1))"),
         why="a delay many times a round's compute, as theirs, would multiply each async run's time: a tenth of "
             "it, in one part"),
]
