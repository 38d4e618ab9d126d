"""For scripts/checks/test_times.py only (on PYTHONPATH while it measures): marks this Python's start (<pid>.exec) and
the end of its start-up, its first parse_args call (<pid>.ready), in $TEST_TIMES_MARKS; a process it forks
after that is past its start-up too."""

import os

MARKS = os.environ.get("TEST_TIMES_MARKS")


def mark(kind):
    try:
        open(os.path.join(MARKS, f"{os.getpid()}.{kind}"), "w").close()
    except OSError:  # the measuring run is over
        pass


if MARKS:
    import argparse

    mark("exec")
    parse_known_args, ready = argparse.ArgumentParser.parse_known_args, []

    def parse_known_args_marked(self, *args, **kwargs):
        if not ready:
            ready.append(True)
            mark("ready")
        return parse_known_args(self, *args, **kwargs)

    argparse.ArgumentParser.parse_known_args = parse_known_args_marked
    os.register_at_fork(after_in_child=lambda: ready and mark("ready"))
