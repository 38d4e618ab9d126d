"""Push and pull between parameter servers and their clients, on point-to-point send/recv.

The model's parameters, flattened into one vector (torch.nn.utils.parameters_to_vector
order), are cut into chunks of about --partition-bytes; each server owns some chunks
and keeps their values (its "shard", the chunks end to end) and a version that it
bumps at every update. A client (worker or validator) keeps a full copy of the vector.

Every message is a header (HEADER float64 numbers: what it is, the sender's version,
the training statistics and update counts it carries), then, for a push or a changed
pull, the payload: a slice of the flat vector. Headers have one size, so a server can
take them from any source in arrival order (dist.recv without src); the payload then
comes from that source. torch.distributed.rpc is in maintenance mode upstream; this
needs nothing but send/recv.

All of it is CPU tensors over the control group (gloo), as BytePS's servers keep
their shards in host memory: NCCL has no receive from any source, and gloo no send
or receive of a CUDA tensor. A client on a GPU copies its gradient to the CPU to push
it, and the weights it pulled to the GPU (copy_into).
"""

import math

import torch
import torch.distributed as dist

from recipes.common import RecipeError, distributed, faults

PUSH, SKIP, PULL, BYE = 0, 1, 2, 3  # a gradient; a worker's step with no gradient (rejected, or sat out); a request;
# leaving
HEADER = 27
# header fields: kind; version (of the weights a gradient was computed on; in a pull, of the client's copy);
# age (a pull: send the shard once it is this many versions newer); the sender's training statistics
# (loss x images, top-1 hits, top-5 hits, images, seconds its workers waited for data); update counts
# (honest pushed, byzantine pushed, honest rejected, byzantine rejected: by pushes, by tensors, by
# parameters; then the parameters failing zenops' norm and sign tests, honest and byzantine);
# stop and lr (a pull's answer: training is over; the server's learning rate); sigterm (the
# sender has received SIGTERM: the receiver stops as if it had, so that the servers save and stop,
# faults.request_stop)
KIND, VERSION, AGE, STATS, COUNTS, STOP, LR, SIGTERM = 0, 1, 2, slice(3, 8), slice(8, 24), 24, 25, 26


def partition(sizes, partition_bytes, servers, element_bytes=4):
    """Cut tensors of `sizes` elements, laid end to end, into chunks of at most about partition_bytes (each
    tensor into equal pieces, as BytePS does), and deal the chunks to the servers, largest first to the least
    loaded: loads then differ by at most one chunk. Returns each server's chunks, [(start, end), ...], in
    flat order."""
    chunks, start = [], 0
    for size in sizes:
        pieces = max(1, math.ceil(size * element_bytes / partition_bytes))
        bounds = [start + size * i // pieces for i in range(pieces + 1)]
        chunks += list(zip(bounds[:-1], bounds[1:]))
        start += size
    if len(chunks) < servers:
        raise RecipeError(f"the parameters make {len(chunks)} chunk(s) of --partition-bytes {partition_bytes}, "
                          f"fewer than the {servers} servers: lower --partition-bytes, or use fewer servers")
    owned, loads = [[] for _ in range(servers)], [0] * servers
    for chunk in sorted(chunks, key=lambda c: c[0] - c[1]):  # largest first
        server = loads.index(min(loads))
        owned[server].append(chunk)
        loads[server] += chunk[1] - chunk[0]
    return [sorted(chunks) for chunks in owned]


def shard_size(chunks):
    """The elements of a server's chunks together."""
    return sum(end - start for start, end in chunks)


def take(vector, chunks):
    """The server's shard: its chunks of the flat vector, end to end."""
    return torch.cat([vector[start:end] for start, end in chunks])


def put(vector, chunks, shard):
    """Write a server's shard back into its chunks of the flat vector."""
    offset = 0
    for start, end in chunks:
        vector[start:end] = shard[offset:offset + end - start]
        offset += end - start


def copy_into(params, vector):
    """The flat vector's values into the parameters, wherever they live: vector_to_parameters would instead
    make each parameter a view of the vector, moving a GPU model to the CPU."""
    offset = 0
    for p in params:
        p.data.copy_(vector[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


def header(kind, version=0, stats=None, counts=None, age=1):
    message = torch.zeros(HEADER, dtype=torch.float64)
    message[KIND], message[VERSION], message[AGE] = kind, version, age
    message[SIGTERM] = faults.sigterm_received()
    if stats is not None:
        message[STATS] = stats
    if counts is not None:
        message[COUNTS] = counts
    return message


def send(message, dst, payload=None):
    with faults.waiting_for(f"rank {dst} to take a message"):  # (every wait on a peer is marked: faults)
        dist.send(message, dst, group=distributed.control_group())
        if payload is not None:
            dist.send(payload.contiguous(), dst, group=distributed.control_group())


def recv_header(src=None):
    """The next header, from src or (None) from whoever sends first; returns (header, sender). A header that
    says its sender has received SIGTERM makes this process stop as if it had too."""
    message = torch.zeros(HEADER, dtype=torch.float64)
    with faults.waiting_for(f"a message from {'any client' if src is None else f'rank {src}'}"):
        sender = dist.recv(message, src, group=distributed.control_group())
    if message[SIGTERM]:
        faults.request_stop()
    return message, sender


def recv_payload(src, numel, dtype=torch.float32):
    payload = torch.empty(numel, dtype=dtype)
    with faults.waiting_for(f"the rest of rank {src}'s message"):
        dist.recv(payload, src, group=distributed.control_group())
    return payload


def pull(vector, chunks, versions, age=1, ranks=None):
    """Ask every server for its shard: each answers with its version, and with its shard when that is at
    least `age` versions newer than this client's copy, or the client has none yet (`versions`, updated
    here). ranks: the servers' ranks (default: 0, 1, ...). Returns (training is over, the servers' learning
    rate)."""
    stop, lr = False, 0.0
    for index, server_chunks in enumerate(chunks):
        server = index if ranks is None else ranks[index]
        send(header(PULL, versions[index], age=age), server)
        answer, _ = recv_header(server)
        stop, lr = stop or bool(answer[STOP]), float(answer[LR])
        if answer[VERSION] != versions[index]:
            put(vector, server_chunks, recv_payload(server, shard_size(server_chunks), vector.dtype))
            versions[index] = int(answer[VERSION])
    return stop, lr


def answer_pull(request, client, shard, version, lr, stop=False):
    """A server's answer to a pull: its version, and its shard when the client's copy is old enough (a shard
    not sent leaves the client's version as it was)."""
    known = int(request[VERSION])
    fresh = known >= 0 and version - known < max(1, int(request[AGE]))
    answer = header(PULL, known if fresh else version)
    answer[STOP], answer[LR] = float(stop), lr
    send(answer, client, None if fresh else shard)


def push_candidate(validator, message, versions, g):
    """A worker's push to its validator: the header, the versions of the servers' chunks it used, g."""
    send(message, validator, torch.tensor(versions, dtype=torch.float32))
    with faults.waiting_for(f"rank {validator} to take a message"):
        dist.send(g, validator, group=distributed.control_group())


def recv_candidate(src, servers, numel):
    """A validator's side of push_candidate, from src or (None) from whichever worker sends first: (header,
    sender, versions, g), or a BYE's or a SKIP's (header, sender, None, None); a worker that dies mid-message
    comes back as a BYE from it."""
    message, sender = recv_header(src) if src is not None else recv_header_from_any()
    if message[KIND] in (BYE, SKIP):
        return message, sender, None, None
    try:
        return message, sender, recv_payload(sender, servers).long().tolist(), recv_payload(sender, numel)
    except RuntimeError as error:
        if _timed_out(error):
            raise
        return header(BYE), sender, None, None


def serve(shard, version, lr, stop=False):
    """One message of a server after any client: a pull is answered here (with stop: training is over).
    Returns (header, sender, payload: a push's gradient, else None). A client that dies mid-message comes
    back as a BYE from it (what it was sending never arrived); no message within the process group's
    timeout raises."""
    message, sender = recv_header_from_any()
    try:
        kind = int(message[KIND])
        if kind == PULL:
            answer_pull(message, sender, shard, version, lr, stop)
        return message, sender, recv_payload(sender, shard.numel()) if kind == PUSH else None
    except RuntimeError as error:
        if _timed_out(error):
            raise
        return header(BYE), sender, None


def recv_header_from_any(tries=100):
    """recv_header() from any client, past headers cut off by clients that die while sending them (each
    failed header is one dead client: more failures than that are a broken network, raised)."""
    for _ in range(tries - 1):
        try:
            return recv_header()
        except RuntimeError as error:
            if _timed_out(error):
                raise
    return recv_header()


def _timed_out(error):
    return "timed out" in str(error).lower()
