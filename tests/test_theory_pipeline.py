"""analysis.theory + report.theory_plots: the `posbias theory` synthetic-figure pipeline, on a small size."""

import json
import math

import pytest
import torch

from posbias.analysis import theorems_pe as PE
from posbias.analysis import theory as T
from posbias.analysis.checks import format_summary
from posbias.errors import PosbiasError
from posbias.report.theory_plots import FIGURES

N, DEPTH = 24, 6
SECTIONS = {"params", "masks", "rollouts", "first_token", "prefix", "decay", "rope", "checks", "summary", "figures"}


pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: one thread is faster


@pytest.fixture(scope="module")
def run(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("theory")
    data = T.run_theory(T.TheoryConfig(seed=0, n_tokens=N, depth=DEPTH), out).record
    return out, data


def test_files_written_and_json_complete(run):
    out, data = run
    for name in FIGURES:
        assert (out / name).stat().st_size > 10_000, name
    assert not list(out.glob("*.tmp*"))
    saved = json.loads((out / T.THEORY_JSON).read_text())
    assert saved == data
    assert set(saved) == SECTIONS
    assert saved["figures"] == list(FIGURES)
    assert set(saved["checks"]) == {"4.1", "4.2", "4.3", "4.4-4.5", "4.6-4.7", "I.1-I.2", "PINE"}
    assert [s["theorem"] for s in saved["summary"]] == list(saved["checks"])
    assert all(s["holds"] and not s["failed"] for s in saved["summary"])
    assert len(format_summary(saved["summary"]).splitlines()) == 7
    assert saved["params"]["check_params"]["4.1"]["n"] == 32  # no check sizes given: the checks' own defaults


def test_rollouts_are_row_stochastic(run):
    _, data = run
    names = [m["name"] for m in data["masks"]]
    assert names == ["full", "causal", "window_4", "window_8", "window_16", "prefix_4"]
    assert data["rollouts"]["depths"] == [0, 2, DEPTH - 1]
    for name in names:
        p = torch.tensor(data["rollouts"]["P"][name], dtype=torch.float64)  # (depths, N, N)
        assert p.shape == (3, N, N) and (p >= 0).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(3, N, dtype=torch.float64), rtol=0, atol=1e-6)
    causal = torch.tensor(data["rollouts"]["P"]["causal"][0])
    assert (causal.triu(1) == 0).all()
    for row in data["decay"] + data["rope"]:  # a profile is a whole (flipped) rollout row
        assert len(row["profile"]) == N and math.fsum(row["profile"]) == pytest.approx(1.0, abs=1e-6)


def test_mass_curves(run):
    _, data = run
    ft, pre = data["first_token"], data["prefix"]
    assert ft["t"] == list(range(DEPTH))
    causal = ft["min"]["causal"]
    assert all(a <= b + 1e-12 for a, b in zip(causal, causal[1:]))  # Thm 4.1: monotone sink
    assert ft["min"]["window_4"][0] == 0.0  # the first token is out of the window of late queries
    assert all(0 <= v <= 1 + 1e-12 for v in pre["mass_min"] + pre["mass_mean"])
    assert len(pre["token_mean"]) == DEPTH and len(pre["token_mean"][0]) == pre["k"] == 4
    assert math.fsum(pre["share_mean"][-1]) == pytest.approx(1.0, abs=1e-9)
    assert data["masks"][-1]["centers"] == [0, 1, 2, 3]


def test_marked_critical_distances_follow_the_formulas(run):
    _, data = run
    depths = [1, 4, DEPTH - 1]
    assert sorted({r["t"] for r in data["decay"]}) == depths
    for r in data["decay"]:  # Thm 4.5
        assert r["x_star"] == pytest.approx(r["t"] / (math.exp(r["m"]) - 1), rel=1e-12)
        assert r["argmax"] == max(range(N), key=r["profile"].__getitem__)
    for r in data["rope"]:  # Thm 4.7 / App. H, with the instance's fitted c
        assert r["theta1"] == pytest.approx(r["fraction"] * math.pi / (N - 1 + 3 * T.ROPE_SPREAD), rel=1e-12)
        assert r["x_star"] == pytest.approx(PE.rope_critical_distance(r["t"], r["theta1"], r["c"]), rel=1e-12)
        assert math.log1p(r["t"] / r["x_star"]) == pytest.approx(2 * r["c"] * r["theta1"] ** 2 * r["x_star"], rel=1e-6)
        assert 0 <= r["x_tight"] <= r["x_loose"] < N


def test_deterministic_and_stale_json_replaced(run, tmp_path):
    out, _ = run
    (tmp_path / T.THEORY_JSON).write_text("{}")  # a stale result must not survive a new run
    T.run_theory(T.TheoryConfig(seed=0, n_tokens=N, depth=DEPTH), tmp_path)
    assert (tmp_path / T.THEORY_JSON).read_text() == (out / T.THEORY_JSON).read_text()
    no_files = T.run_theory(T.TheoryConfig(seed=1, n_tokens=N, depth=DEPTH)).record
    assert no_files["figures"] == [] and no_files["params"]["seed"] == 1
    assert no_files["rollouts"] != json.loads((out / T.THEORY_JSON).read_text())["rollouts"]


def test_cli_tokens_and_depth_reach_the_checks(tmp_path):
    from typer.testing import CliRunner

    from posbias.cli import app

    r = CliRunner().invoke(app, ["theory", "--no-real", "--tokens", "32", "--depth", "8", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert len([line for line in r.output.splitlines() if line.startswith("Thm ")]) == 6
    params = json.loads((tmp_path / T.THEORY_JSON).read_text())["params"]
    assert params["n_tokens"] == params["check_tokens"] == 32 and params["depth"] == params["check_depth"] == 8
    used = params["check_params"]
    assert {p["n"] for p in used.values()} == {32} and used["4.1"]["n_layers"] == used["4.2"]["n_layers"] == 8
    assert used["4.6-4.7"]["depths"] == used["I.1-I.2"]["depths"] == [1, 2, 4, 7]
    bad = CliRunner().invoke(app, ["theory", "--no-real", "--tokens", "32", "--depth", "4", "--out", str(tmp_path / "x")])
    assert isinstance(bad.exception, PosbiasError) and "--depth 8" in bad.exception.fix  # main() makes it exit 2
    assert not (tmp_path / "x").exists()  # raised before anything is written


@pytest.mark.parametrize("kw", [dict(prefix_k=0), dict(windows=(1,)), dict(n_tokens=3), dict(decay_ms=(0.0,)),
                                dict(check_tokens=8), dict(check_depth=4)])
def test_bad_config_raises(kw):
    with pytest.raises(PosbiasError):
        T.run_theory(T.TheoryConfig(**{"n_tokens": N, "depth": DEPTH, **kw}))
