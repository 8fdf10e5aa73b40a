"""The public API a notebook uses (docs/python-api.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import posbias


def test_drawing_a_figure_leaves_the_sessions_matplotlib_backend_alone(tmp_path):
    """A run draws its PNGs outside pyplot: a notebook's backend (inline plots) is as it was afterwards."""
    code = ("import sys, matplotlib; matplotlib.use('svg')\n"
            "from posbias.report.plots import plot_curve\n"
            "plot_curve([{'position': 0, 'accuracy': 0.5, 'ci_low': 0.2, 'ci_high': 0.8}], 't', sys.argv[1])\n"
            "print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(posbias.__file__).parents[1])}
    env.pop("MPLBACKEND", None)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.png")], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["svg", "False"] and (tmp_path / "c.png").stat().st_size > 1000
