"""torch's OpenMP threads sleep while they wait when biasviz runs as a command: on cores other work shares, a
spinning thread takes a core from the one doing the work. The setting is in place before torch loads (its
OpenMP runtime reads it then), and a value the user set is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a child process runs `biasviz schemes`, then loads torch if the command did not, noting OMP_WAIT_POLICY as torch
# is first imported
CHILD = """
import os, sys
seen = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("OMP_WAIT_POLICY"))
        return None
sys.meta_path.insert(0, Watch())
from biasviz.cli import main
sys.argv = ["biasviz", "schemes"]
try:
    main()
except SystemExit:
    pass
import torch
print("policy when torch loaded:", seen, file=sys.stderr)
"""


def _policy_when_torch_loads(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", CHILD], env={**env, "PYTHONPATH": str(ROOT / "src")},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    return done.stderr.strip().splitlines()[-1]


def test_the_command_makes_openmp_threads_wait_passively() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert _policy_when_torch_loads(env) == "policy when torch loaded: ['PASSIVE']"


def test_a_wait_policy_the_user_set_is_kept() -> None:
    said = _policy_when_torch_loads({**os.environ, "OMP_WAIT_POLICY": "ACTIVE"})
    assert said == "policy when torch loaded: ['ACTIVE']"


def test_nothing_is_set_once_torch_is_loaded(monkeypatch) -> None:
    import torch  # noqa: F401  (loaded: its OpenMP runtime has read the environment already)

    from biasviz.common.threads import passive_waits

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert passive_waits() is False and "OMP_WAIT_POLICY" not in os.environ
