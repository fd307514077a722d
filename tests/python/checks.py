"""What the client tests share: where the server is, and named checks counted to an exit code."""

import os
import sys

BASE = os.environ["CORELM_BASE_URL"]
MODEL = os.environ["CORELM_MODEL_ID"]
failures = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f": {detail}"))
    if not cond:
        failures.append(name)


def finish():
    """Print the count of failed checks and exit with 1 if there were any."""
    print(f"{len(failures)} failure(s)" + (f": {failures}" if failures else ""))
    sys.exit(1 if failures else 0)
