"""Stand-ins for `run_recipe` in sweep processes (importable by a spawned worker): a run that
kills its own process, one that sleeps, one that returns at once."""

import os
import signal
import time
from pathlib import Path


def fake_run(recipe, **options):
    """A card-like dict for ``recipe``; "die" in its name kills the worker after
    0.5 s, "slow" sleeps a minute, "fine" 0.4 s."""
    name = Path(recipe).stem
    if "die" in name:
        time.sleep(0.5)  # let the other run start first
        os.kill(os.getpid(), signal.SIGKILL)
    if "slow" in name:
        time.sleep(60)
    if "fine" in name:
        time.sleep(0.4)
    return {"name": name, "pid": os.getpid()}
