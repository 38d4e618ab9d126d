"""What moved between the torch releases the recipes run on (2.11, the GPU nodes' often, to the newest): each
name once, here, so that a recipe reads as the newest torch writes it."""

import torch.distributed as dist

# gather equal tensors from every rank into one: torch 2.11 names it all_gather_into_tensor, later releases
# all_gather_single (and warn that the old name is deprecated)
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
