"""What a recipe is run under by the tests, the measuring and the checks: the one launcher (launch.py, with its fork
server) and the wrappers (NCCL's rules, injected faults)."""
