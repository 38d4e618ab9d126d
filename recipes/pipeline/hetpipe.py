"""HetPipe (Park et al., USENIX ATC 2020) as SD-PIPE runs it as its baseline (pipedream_subexecutor.py,
update_gradient_local 294-316 and the ParameterServerCommunicate branch 464-473): each stage's
parameter server holds the stage's global weights on the CPU; a replica applies each update to its
own weights, and pushes it, divided by R, to the server after every minibatch; every --wave W
minibatches (their batch_id % 10, and the epoch's last) it pulls the global weights in place of its
own. The push is the local step's change / R: with --momentum the momentum step, as the authors push
it (their optimizer writes the momentum step into the gradient it pushes: python/hetu/optimizer.py
306-315, src/ops/Optimizers.cu 81-89; pipedream_subexecutor.py 299-316). No bound on how far a
replica runs ahead, as in their ResNet script (train_resnet.py 84-85); HetPipe's own wave-synchronous
bound is --staleness D: a pull waits until the puller is at most D waves ahead of the slowest replica
(their BERT script's is 0: train_bert.py 76, bsp = 0). The push copies the stage's weights to the CPU
after every minibatch (on a GPU the host waits for them: a parameter server's push does). Where the
rules depart from the authors' code, with their files and lines: deviations.py.

The replicas' side is a --sync method (HetPipe, sync.py's hooks); the server's, run_server. The stage's
global weights live on the CPU, as BytePS's and SD-PIPE's servers hold them. Each push is added to them;
a pull is answered at once, or with --staleness D once the puller is at most D waves of --wave minibatches
ahead of the slowest replica; at an epoch's end, once every replica has pushed the whole epoch. A server
evaluates and saves with the others at each epoch's end (and scores --snapshot-every's copies with them, holding
none itself).
"""

from torch.nn.utils import parameters_to_vector

from recipes.common import metrics, pushpull
from recipes.pipeline import snapshots
from recipes.pipeline.sync import Sync


class HetPipe(Sync):
    """A replica's side: its stage's server, the weights it last pushed or pulled (on the CPU: vector) and their
    version."""
    has_servers = True

    def __init__(self, replicas, vector, wave):
        super().__init__(replicas)
        self.server, self.wave = replicas.layout.server(replicas.stage), wave
        self.vector, self.versions = vector, [-1]

    @classmethod
    def join(cls, args, replicas, params):
        return cls(replicas, parameters_to_vector(params).detach().cpu(), args.wave)

    def after_step(self, params, epoch, step, straggled, tally):
        """Push the update (its change over the weights after the last push or pull, on the CPU), divided by R, to
        the stage's server; every --wave steps and at the epoch's last (that pull waits until every replica has
        pushed it all), then take the global weights into this replica's copy and into the stage's weights."""
        current = parameters_to_vector(params).detach().cpu()
        pushpull.send(pushpull.header(pushpull.PUSH, self.versions[0]), self.server,
                      (current - self.vector) / self.replicas.count)
        self.vector.copy_(current)
        if (step + 1) % self.wave == 0 or step + 1 == self.replicas.steps_per_epoch:
            pushpull.pull(self.vector, [[(0, self.vector.numel())]], self.versions, ranks=[self.server])
            pushpull.copy_into(params, self.vector)
        return False

    def end_epoch(self, params, run, tally):
        tally.connected()  # (the epoch's last pull took in every replica's whole epoch)


def run_server(args, run, weights, clients, steps_per_epoch, val_loader, tally):
    start = run.checkpoint.epoch * steps_per_epoch + run.checkpoint.step
    bound = float("inf") if args.staleness is None else args.staleness * args.wave  # (in pushes)
    clock = dict.fromkeys(clients, start)  # the pushes (minibatches) each replica has made
    seen = dict(clock)  # the slowest replica's clock when each replica last pulled
    version = 0
    for epoch in run.epochs():
        end = (epoch + 1) * steps_per_epoch
        pending, held = {}, set()  # pulls not yet answered; those counted as waits
        done = {client for client in clients if clock[client] == end}  # (resumed at the epoch's end: all)
        while len(done) < len(clients):
            message, sender = pushpull.recv_header_from_any()
            if message[pushpull.KIND] == pushpull.PUSH:
                weights += pushpull.recv_payload(sender, weights.numel(), weights.dtype)
                version += 1
                tally.oldest = max(tally.oldest, clock[sender] - seen[sender])  # its staleness, in pushes
                clock[sender] += 1
                tally.partial_syncs += 1
            else:
                pending[sender] = message
            slowest = min(clock.values())
            for client, request in list(pending.items()):
                if clock[client] - slowest <= (0 if clock[client] == end else bound):
                    pushpull.answer_pull(request, client, weights, version, 0.0)
                    seen[client] = slowest
                    del pending[client]
                    held.discard(client)
                    if clock[client] == end:
                        done.add(client)
                elif client not in held:
                    held.add(client)
                    tally.waits += 1
        run.meter = metrics.EpochMeter(run.device)  # (a server trains on nothing itself)
        train_stats = run.meter.summary()  # (a collective, as the replicas' at their epoch's end)
        snapshots.score(None, run, val_loader)  # (--snapshot-every: it holds no copies, it evaluates a share)
        if run.end_epoch(train_stats, val_loader):  # (with the replicas: a SIGTERM is acted on here)
            break
