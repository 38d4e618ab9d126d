"""Where this recipe departs from SD-PIPE's code, and why: the one list of them. The modules' docstrings point
here, and docs/results/pipeline.md renders it as a table (scripts/figures/pipeline/render.py).

The authors' code is Hsword/VLDB2023_SDPipe at AUTHORS_COMMIT. Each row names the files and lines there that
show what they do (`where`, in the short names of FILES), and quotes one of those lines (`shows`: file, line,
a piece of it), which `python scripts/checks/authors_lines.py pipeline CLONE` checks against a clone of their
code.
"""

AUTHORS_COMMIT = "2ced65fc2adc97f1f7e1bf64354cf327ac2ce4a6"

FILES = {
    "subexecutor": "python/hetu/gpu_ops/pipedream_subexecutor.py",
    "preduce_handler": "ps-lite/src/preduce_handler.cc",
    "ps_communicate": "python/hetu/gpu_ops/ParameterServerCommunicate.py",
    "train_resnet": "artifacts/pipeline/train_resnet.py",
    "train_bert": "artifacts/pipeline/train_bert.py",
}

DEVIATIONS = [
    dict(here="every epoch ends with one model saved, replica 0's, after `preduce` averages all replicas (each "
              "replica scores its own weights on its share of the validation set, pooled, as theirs)",
         theirs="each pipeline evaluates its own weights on its 1/R of the validation set, and the results are "
                "averaged; no model is saved, and no average taken at an epoch's end",
         where="train_resnet 14-26, 74, 134-136; artifacts/pipeline/reduce_result.py 14-17",
         shows=("train_resnet", 136, "val_loss, val_acc = reduce_result([val_loss, val_acc])"),
         why="the checkpoint every recipe reads holds one model; `preduce`'s average makes it the model all its "
             "replicas scored"),
    dict(here="the count of updates, and the connectivity sync it makes due, starts again at each epoch",
         theirs="one count per stage for the whole run",
         where="preduce_handler 80-87, 259",
         shows=("preduce_handler", 80, "size_t accum = accumulated_updates_ + ready_workers_.size();"),
         why="the epoch's average has just connected every replica"),
    dict(here="stage 0 claims each minibatch from a counter of the epoch's R x steps updates, so the minibatches "
              "in flight that the drain finishes were claimed (and each joins a group)",
         theirs="the last stage's scheduler arms the stop when the count crosses a multiple of R x steps, and "
                "each replica stops at its next arrival; each pipeline then drains S - 1 minibatches that are "
                "not counted, each stage updating with no partner",
         where="preduce_handler 17, 29-35, 83-86; subexecutor 322-324, 512-516",
         shows=("subexecutor", 516, "self.preduce_partner = (self.nccl_comm.rank,)"),
         why="an epoch of exactly R x steps updates; the decision sits where the batches are loaded"),
    dict(here="a group waits for the replicas still in the epoch (R less those out of it), and a replica that "
              "leaves the epoch ends a connectivity wait under way",
         theirs="a group waits for all R until its deadline; no connectivity sync starts while a replica is "
                "stopped, and one that is due stays due",
         where="preduce_handler 29-35, 40-41, 54-62, 71-72, 78",
         shows=("preduce_handler", 40, "if (avail_workers_.size() < max_workers_)"),
         why="a replica out of the epoch can never join: waiting for it only runs out the deadline"),
    dict(here="a replica queues as ready once its host has queued its update",
         theirs="it asks for its group at its first weight gradient, before any update",
         where="subexecutor 182-184, 413-414",
         shows=("subexecutor", 183, "self.preduce_partner = self.preduce.get_partner(sync=True)"),
         why="the update is averaged as one vector once it is whole (next row); no host synchronisation per step"),
    dict(here="a stage's weights are averaged as one vector after its whole backward and update; then its "
              "gradient goes on to the stage before",
         theirs="each weight tensor is updated, then averaged on the NCCL stream, as the backward reaches it; "
                "the gradient is sent after all the averages",
         where="subexecutor 91-102, 186-193, 458-460, 481-484",
         shows=("subexecutor", 191, "self.preduce.preduce(self.config.placeholder_to_arr_map[weight_node],"),
         why="one collective per minibatch, which gloo and NCCL both run"),
    dict(here="a gradient's receive is a group of its own",
         theirs="each send is grouped with the next receive (a forward's send with the next backward's receive)",
         where="subexecutor 416-447; python/hetu/gpu_ops/PipelineSend.py 21-22; "
               "python/hetu/gpu_ops/PipelineReceive.py 25-26",
         shows=("python/hetu/gpu_ops/PipelineSend.py", 22, "GroupStart()"),
         why="a stop after any backward leaves no receive unmatched"),
    dict(here="a stage copies its weights for a forward when an update came since the last copy",
         theirs="one buffer per minibatch in flight, refilled with the newest weights",
         where="subexecutor 235-252, 275-292, 364-371",
         shows=("subexecutor", 289, "dst_tensor._async_copyfrom(src_tensor, self.comp_stream)"),
         why="the same count of versions"),
    dict(here="stragglers are drawn from `--seed`; under gpipe and 1f1b before the first forward and the first "
              "backward of each step",
         theirs="unseeded `random`; under pipedream a draw before every forward and every backward; two a step "
                "in their data-parallel executor",
         where="subexecutor 32-34, 342-343; python/hetu/gpu_ops/executor.py 941-943",
         shows=("subexecutor", 343, 'random_wait(0.1, float(os.environ["DEBUG_HETERO"]))'),
         why="every rank can count who waited for whom; the synchronous schedules draw as their data-parallel "
             "one does"),
    dict(here="`allreduce` and `adpsgd` check every 10th step, with an allreduce of every rank read at the next, "
              "whether a rank received SIGTERM or saw a non-finite loss, and all stop at the same step; `preduce` "
              "and `hetpipe` check at the epoch's end",
         theirs="no stop but the epoch's: an AD-PSGD replica counts its own batches to the epoch's end and waits "
                "only for its partner at each",
         where="python/hetu/preduce.py 123-135; subexecutor 175, 184",
         shows=("python/hetu/preduce.py", 128, "self._control_flag = (self._batch_id % self.sync_every) == 0"),
         why="a preemption saves every stage at the same step; a check holds back only a rank 10 steps ahead of "
             "another"),
    dict(here="`adpsgd` lets one replica sit out a step when R is odd",
         theirs="it asks for an even R",
         where="python/hetu/preduce.py 121",
         shows=("python/hetu/preduce.py", 121, "assert len(self.same_group_worker) % 2 == 0"),
         why="any R runs"),
    dict(here="`hetpipe`'s last pull of an epoch waits for every replica's whole epoch, the others for nobody "
              "(with `--staleness D`, HetPipe's bound: until the puller is at most D waves ahead)",
         theirs="ResNet: every pull an ordinary one, unbounded; BERT: every pull waits for the same wave of "
                "every replica (a bound of 0)",
         where="train_resnet 84-85; train_bert 76; ps_communicate 37-41, 199-204",
         shows=("train_bert", 76, "bsp = 0, seed=0"),
         why="one model to evaluate and save at the epoch's end; `--staleness 0` runs their BERT's rule"),
    dict(here="`hetpipe`: a server per stage, on the last S ranks (W / S - 1 replicas train)",
         theirs="one server process for the job, beside the workers",
         where="artifacts/pipeline/config/w0_w1.yml 3, 7",
         shows=("artifacts/pipeline/config/w0_w1.yml", 3, "servers: 1"),
         why="torchrun launches the servers as ranks; each stage's pushes go to a process of their own"),
    dict(here="the model is cut into stages of about equal forward FLOPs (bert_tiny as their BERT: [1, 2, 2, 1] "
              "of its 6 layers)",
         theirs="fixed cuts, set by hand per model",
         where="artifacts/pipeline/resnet.py 156-169; train_bert 50",
         shows=("train_bert", 50, "model_partition = [2, 4, 4, 2]"),
         why="any `--arch` and `--stages` split, with no table of cuts"),
    dict(here="`--lr` for a global batch of 256, scaled to -b x R, with the project's schedules",
         theirs="the learning rate whatever R (0.01 at -b 64); a one-epoch linear warmup, which set_learning_rate "
                "replaces after each epoch with lr x 0.2^(epoch // 30) (ImageNet; CIFAR-100: 0.1^(epoch // 60)), "
                "so the scheduler's own steps never apply; BERT: 2,000 warm-up steps, then constant",
         where="train_resnet 63, 76-81, 129-132; train_bert 70; artifacts/README.md 48",
         shows=("train_resnet", 132, "opt.set_learning_rate(args.learning_rate * (0.2 ** (iteration // 30)))"),
         why="the project's contract, so that `allreduce` trains DDP's model; the bert part warms up for one "
             "epoch, then decays along a cosine as the other parts do"),
    dict(here="replica r reads ddp's rank r's shard of train/ (DistributedSampler: the shards are disjoint), "
              "reshuffled each epoch; under `preduce` a replica that ends its shard before the epoch's updates "
              "are taken reads it again (`shard_again`), so a lasting straggler's shard is read less; on a stream "
              "it reads on, and its next epoch starts where its share of the stream starts",
         theirs="each pipeline streams the whole training set, shuffled by a generator seeded with its rank, "
                "epoch after epoch, each reading on from where it is (ImageNet); BERT: each reads its own files of "
                "the corpus in turn",
         where="artifacts/pipeline/datasets/imagenet.py 91-97, 105-111; artifacts/pipeline/models/wiki.py 23-30",
         shows=("artifacts/pipeline/datasets/imagenet.py", 94, "gen.manual_seed(rank)"),
         why="replica r sees what ddp's rank r would, so that `allreduce` trains DDP's model; `--replica-data "
             "stream` reads as theirs do (seeded with --seed and the replica), and `measure.py --parts data` "
             "measures the difference at 8 x 1 (the section on the data each replica reads)"),
    dict(here="the time part also scores the model as it was every T seconds of training, T a quarter of "
              "allreduce's epoch without stragglers (on the virtual cluster, of a replica's epoch computing alone) "
              "(`--snapshot-every`: weights copied without a stop, scored at "
              "the epoch's end), and times training alone",
         theirs="each epoch's end is scored, with the epoch's training time (time.time() around the train run only)",
         where="train_resnet 95-109, 134-141; artifacts/README.md 48",
         shows=("train_resnet", 134, "val_loss, val_acc = validate(executor, val_batch_num)"),
         why="their 100 ImageNet epochs (--epochs 100) give the time to a target at a fine grain; here 5 epochs "
             "would give it in steps of a fifth of the run"),
    dict(here="the bert part: bert_tiny, 6 post-LN layers of width 64, a vocabulary of the 2,386 words and marks of "
              "Python's pydoc topics, sequences of 64, the masked-LM loss alone; masks drawn once per sequence",
         theirs="BERT-base: 12 layers of width 768, a vocabulary of 30,522, sequences of 128, English Wikipedia, "
                "the masked-LM and next-sentence losses; masks drawn once, in their data files",
         where="train_bert 58-68; artifacts/pipeline/models/hetu_bert.py 505-569; "
               "artifacts/pipeline/models/wiki.py 36-43",
         shows=("train_bert", 58, "config = BertConfig(vocab_size=30522,"),
         why="a CPU trains it in minutes, on a text every Python ships (no download); the cut, AdamW and the "
             "heavy end stages are theirs"),
]
