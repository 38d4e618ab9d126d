"""Partial reduce as SD-PIPE runs it (Miao et al., PVLDB 16(9), 2023; the authors' code,
Hsword/VLDB2023_SDPipe: ps-lite/src/preduce_handler.cc and python/hetu/preduce.py).

Groups: after its local step a stage's replica queues as ready. The first to arrive leads the
next group: it waits until every replica still in the epoch has arrived (at most --preduce-size
of them, when given) or its deadline has passed, and the group is all those that came. The
deadline adapts, per process: it starts at 1 ms, doubles (to at most 10 ms) after a group of
fewer than 2 and shrinks x 0.9 (to at least 0.01 ms) otherwise. The group averages its weights
with one all-reduce over a process group of its members, made by them alone the first time that
membership forms, then cached (at most 2^R - R - 1 of them, as SD-PIPE caches its NCCL
communicators). With more than 8 replicas a group averages in pairs, in order, and the pairs
join no union for the staleness bound, so a connectivity sync then waits for every replica
(preduce_handler.cc 94-178, getPartnerPairWise, chosen at 313-314).

Staleness bound: each group adds its size to a count of updates. When the count crosses a multiple
of 10 R (preduce_handler.cc 16, 80-82: ssp_bound x R), a connectivity sync is due: the next group waits
without a deadline until the groups since the last one connect every replica (a union-find), if
every replica is still in the epoch and no other stage is in such a sync (stages waiting on each
other's replicas would deadlock): SD-PIPE's rule; a group that cannot run one leaves it to the next.

Epochs: an epoch is R x (steps of one shard) updates of all replicas together. Stage 0 of each
replica claims each of its steps from a counter and tells its other stages, so a fast replica
does more of the epoch than a slow one (its shard again, reshuffled, if it runs out).

The ready queue is the c10d store: arrival n reads its part from the key member/n, which the
leader of its group writes (its group, or "lead"); only a leader reads and writes the counts and
the union-find, one leader at a time.
Where this departs from the authors' code, with their files and lines: deviations.py.
"""

import itertools
import time

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from recipes.common import distributed, faults
from recipes.pipeline.sync import Sync, average_weights, flagged

FIRST_WAIT, LONGEST_WAIT, SHORTEST_WAIT = 0.001, 0.010, 0.00001  # seconds (SD-PIPE's 1, 10 and 0.01 ms)
CHECK_EVERY = 10  # x R updates: a connectivity sync is due at each multiple (SD-PIPE's ssp_bound)
PAIRS_BEYOND = 8  # replicas


def next_wait(wait, size):
    """The adaptive deadline after a group of `size`: double after a group of one, else x 0.9."""
    return min(2 * wait, LONGEST_WAIT) if size < 2 else max(0.9 * wait, SHORTEST_WAIT)


def pair_of(members, replica, replicas, connecting):
    """Whom the replica averages with in its group: all of it, or beyond 8 replicas (but in a connectivity sync)
    its pair, in order, as SD-PIPE's getPartnerPairWise pairs them (the last alone when the group is odd)."""
    if replicas <= PAIRS_BEYOND or connecting:
        return members
    i = members.index(replica) // 2 * 2
    return members[i:i + 2]


def find(parents, i):
    while parents[i] != i:
        i = parents[i]
    return i


def connects_all(parents):
    return len({find(parents, i) for i in range(len(parents))}) == 1


def shard_again(loader, epoch):
    """This replica's shard, then again (reshuffled) for as long as the epoch has updates for it."""
    for again in itertools.count():
        if again:
            loader.sampler.set_epoch(epoch + 1_000_003 * again)
        yield from loader


class PartialReduce(Sync):
    """One process's side of its stage's partial reduce (a --sync method): the store, its deadline, the groups it
    has made."""
    counts_updates = True

    def __init__(self, args, layout, stage, replica, replica_group, root, stage_group=None):
        """replica_group: a gloo group of this replica's stages (None with one stage), for the claims; root: the
        c10d store; stage_group: the stage's replicas', for the epoch's average of all of them."""
        self.layout, self.stage, self.replica, self.cap = layout, stage, replica, args.preduce_size
        self.stage_group = stage_group
        self.store = dist.PrefixStore(f"preduce/{stage}", root)  # this stage's ready queue
        self.lock = dist.PrefixStore("preduce", root)  # one stage at a time in a connectivity sync
        self.claims = dist.PrefixStore("preduce/claims", root)
        self.replica_group = replica_group
        self.wait, self.groups = FIRST_WAIT, {}
        self.longest = 0  # the most updates of all replicas between two moments that connected every replica
        self.connections = 0  # the connectivity syncs this process led
        self.arrivals = []  # this epoch's arrival numbers of this process
        if replica == 0:  # the first arrival leads the first group; no update yet
            self.store.set("member/1", f"lead;{self.fresh_state(0)}")

    @classmethod
    def join(cls, args, replicas, params):
        """With the replica's gloo group of its stages, for the claims (none with one stage)."""
        layout = replicas.layout
        return cls(args, layout, replicas.stage, replicas.replica, replicas.pipe_control if layout.stages > 1 else None,
                   dist.distributed_c10d._get_default_store(), replicas.stage_group)

    def shard(self, loader, run):
        """This replica's shard, and again while the epoch has updates (a resumed epoch: as it was)."""
        return shard_again(loader, run.epoch) if not run.first_step else loader

    def after_step(self, params, epoch, step, straggled, tally):
        """Queue, and average with the group."""
        waited, size, _ = self.reduce(params, epoch, straggled)
        tally.groups += 1 / size  # (each group counted once over its members)
        tally.partial_syncs += (size > 1) / size
        return waited

    # ---- epochs counted in updates ----------------------------------------------------------------------

    def claim(self, epoch, steps_per_epoch):
        """Whether the epoch has an update left for this replica: stage 0 takes one from the counter of all
        replicas and tells the replica's other stages (a CPU number over its gloo group)."""
        go = torch.zeros(1)
        if self.stage == 0:
            go[0] = self.take(epoch, steps_per_epoch)
        if self.replica_group is not None:
            dist.broadcast(go, self.layout.rank(self.replica, 0), group=self.replica_group)
        if not go[0]:
            self.leave(epoch)
        return bool(go[0])

    def take(self, epoch, steps_per_epoch):
        """Stage 0: one update from the counter of all replicas; False once the epoch has none left."""
        return self.claims.add(f"{epoch}", 1) <= self.layout.replicas * steps_per_epoch

    def leave(self, epoch):
        """Out of the epoch: the leaders learn it from the queue, and wait for one replica fewer."""
        with faults.waiting_for("the partial reduce's queue"):
            self.arrive(epoch, stopping=True)

    def end_epoch(self, params, run, tally):
        """The epoch's average of all replicas (one model to evaluate and save; it connects them): then the updates
        since the last connectivity sync; and the learning-rate schedule set to the epoch's end (within the epoch
        each replica's ran by its own steps)."""
        tally.waits += average_weights(params, self.stage_group, self.layout.replicas)
        if self.store.check(["state"]):  # (none when a restart resumed at the epoch's end)
            updates, last, _, _, _ = self.state(run.epoch, self.store.get("state").decode())
            self.longest = max(self.longest, updates - last)
        for n in self.arrivals:  # this process's keys of the epoch, read by now: the store does not grow
            self.store.delete_key(f"who/{n}")
            self.store.delete_key(f"member/{n}")
        self.arrivals = []
        run.scheduler.last_epoch = (run.epoch + 1) * run.steps_per_epoch - 1
        run.scheduler.step()
        tally.connected()

    def end_training(self, tally):
        """After the last epoch: shut the groups down (torch's cleanup does not know them); counts the most updates
        between two connections and the connectivity syncs this process led."""
        for group in self.groups.values():
            group.shutdown()
        tally.unconnected, tally.connections = self.longest, self.connections

    # ---- the ready queue: arrival n reads member/n: its group, or the lead and the counts -------------------

    def arrive(self, epoch, stopping=False):
        """Queue as ready; returns the group this replica is in (its replicas, in order) and whether the group is
        a connectivity sync. A stopping replica takes no part, but passes the lead on if it has it."""
        n = self.store.add("arrivals", 1)
        self.arrivals.append(n)
        self.store.set(f"who/{n}", "stop" if stopping else str(self.replica))
        role, state = self.store.get(f"member/{n}").decode().split(";", 1)
        if role != "lead":
            return [int(r) for r in role.split(",") if r], state == "1"
        if stopping:  # (the lead passes on; the count of replicas out of the epoch grows by one)
            updates, last, stopped, parents, due = self.state(epoch, state)
            state = self.encode(epoch, updates, last, stopped + 1, parents, due)
            self.store.multi_set(["state", f"member/{n + 1}"], [state, f"lead;{state}"])
            return [], False
        return self.lead(n, epoch, state)

    def lead(self, n, epoch, state):
        """Close the group that starts at arrival n: by the deadline, or, for a connectivity sync, once the
        groups since the last one connect every replica; tell each member, and the next leader the counts."""
        replicas = self.layout.replicas
        updates, last, stopped, parents, due = self.state(epoch, state)
        connecting = due and not stopped and self.take_lock()
        members, k = [self.replica], n
        if connecting:
            while not connects_all(parents):
                k += 1
                who = self.store.get(f"who/{k}").decode()
                if who == "stop":  # (a replica left the epoch: the epoch's end connects them all instead)
                    stopped += 1
                    break
                members.append(int(who))
                parents[find(parents, int(who))] = find(parents, self.replica)
            self.lock.compare_set("connecting", str(self.stage), "")
        else:
            wanted = min(self.cap or replicas, replicas - stopped)
            deadline = time.perf_counter() + self.wait
            arrived = self.store.add("arrivals", 0)
            while arrived - n + 1 < wanted and time.perf_counter() < deadline:
                time.sleep(0.0002)
                arrived = self.store.add("arrivals", 0)
            k = min(arrived, n + wanted - 1)
            for who in (self.store.multi_get([f"who/{i}" for i in range(n + 1, k + 1)]) if k > n else []):
                if who == b"stop":  # (it counts as an arrival of this group; it takes no part)
                    stopped += 1
                    continue
                members.append(int(who))
                if replicas <= PAIRS_BEYOND:  # (pairs join no union: SD-PIPE's getPartnerPairWise, so its sync
                    parents[find(parents, int(who))] = find(parents, self.replica)  # waits for all R)
        members, before = sorted(members), updates
        updates += len(members)
        connecting = connecting and connects_all(parents)  # (not when a replica's leaving cut it short)
        if connecting:
            self.longest = max(self.longest, updates - last)
            self.connections += 1
            parents, last, due = list(range(replicas)), updates, False
        due = due or updates // (CHECK_EVERY * replicas) > before // (CHECK_EVERY * replicas)  # (a multiple crossed)
        group, state = f"{','.join(map(str, members))};{int(connecting)}", self.encode(epoch, updates, last,
                                                                                      stopped, parents, due)
        self.store.multi_set(["state", *(f"member/{i}" for i in range(n + 1, k + 2))],
                             [state, *[group] * (k - n), f"lead;{state}"])
        return members, connecting

    def state(self, epoch, state):
        """The epoch's count of updates, the count at the last connectivity sync, the replicas out of the epoch,
        the union-find since the last connectivity sync and whether one is due (only a leader writes them: the
        next reads them with its lead; the key "state" keeps them for the epoch's end)."""
        state = state.split(";")
        if int(state[0]) != epoch:
            state = self.fresh_state(epoch).split(";")
        return int(state[1]), int(state[2]), int(state[3]), [int(p) for p in state[4].split(",")], state[5] == "1"

    def fresh_state(self, epoch):
        return self.encode(epoch, 0, 0, 0, list(range(self.layout.replicas)), False)

    @staticmethod
    def encode(epoch, updates, last, stopped, parents, due):
        return f"{epoch};{updates};{last};{stopped};{','.join(map(str, parents))};{int(due)}"

    def take_lock(self):
        return self.lock.compare_set("connecting", "", str(self.stage)).decode() == str(self.stage)

    # ---- the average ------------------------------------------------------------------------------------

    def reduce(self, params, epoch, straggled):
        """Queue, then average this stage's weights with the group. Returns (whether a straggler in the group
        held this replica up, as a tensor on the device; the group's size; whether it was a connectivity sync)."""
        with faults.waiting_for("the partial reduce's group"):  # (every wait on a peer is marked: faults)
            members, connecting = self.arrive(epoch)
            members = pair_of(members, self.replica, self.layout.replicas, connecting)  # (beyond 8 replicas)
            size = len(members)
            self.wait = next_wait(self.wait, size)  # (on the pair's size beyond 8, as SD-PIPE's preduce.py 84-87)
            flat = flagged(parameters_to_vector(params).detach(), straggled)
            mine = flat[-1].clone()
            if len(members) < 2:
                return torch.zeros((), dtype=torch.bool, device=flat.device), size, connecting
            ranks = [self.layout.rank(r, self.stage) for r in members]
            if tuple(ranks) not in self.groups:
                self.groups[tuple(ranks)] = distributed.members_group(ranks)
            self.groups[tuple(ranks)].allreduce([flat]).wait()  # (a group of its own: its backend, called directly)
            vector_to_parameters(flat[:-1] / len(members), params)
            return flat[-1] > mine, size, connecting
