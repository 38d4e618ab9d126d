"""HetPipe's parameter server for one stage (the replicas' side is sync.push_and_pull).

The stage's global weights live on the CPU, as BytePS's and SD-PIPE's servers hold them. Each push
(a replica's update of one minibatch, divided by R) is added to them; a pull is answered at once
(SD-PIPE's ResNet baseline has no bound), or with --staleness D (their BERT's: 0) once the puller is at most D waves of
--wave minibatches ahead of the slowest replica (HetPipe's wave-synchronous parallel); at an epoch's
end, once every replica has pushed the whole epoch. Evaluates and saves with the others at each
epoch's end.
"""

from recipes.common import metrics, pushpull


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
                tally["oldest"] = max(tally["oldest"], clock[sender] - seen[sender])  # its staleness, in pushes
                clock[sender] += 1
                tally["partial_syncs"] += 1
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
                    tally["waits"] += 1
        run.meter = metrics.EpochMeter(run.device)  # (a server trains on nothing itself)
        if run.end_epoch(run.meter.summary(), val_loader):  # (with the replicas: a SIGTERM is acted on here)
            break
