"""`posbias report`: the page built from real run folders (tiny models) opens in headless Chromium with
every image decoded and no console error; the checker itself catches a broken image and a console
error; bad input is one line and writes nothing; strings from the runs are escaped.

The browser is the system's chromium (Debian package; .ci/run installs it). Without one the browser
tests skip, except under CI (CI set), where a missing browser fails.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from browser import check_page, embedded_png_problems, find_chromium
from conftest import tiny_model
from posbias import GridConfig, Loaded, PosbiasError, SweepConfig, build_report, hidden, run_compare, run_grid, run_sweep, synth
from posbias.cli import main
from posbias.distill import DistillConfig, run_distill
from posbias.explain import AttentionConfig, ShiftingConfig, TheoryConfig, run_attention, run_shifting, run_theory
from posbias.lpes import GAConfig, SearchConfig, run_search

pytestmark = pytest.mark.usefixtures("one_thread")
KV = {"facts": 4, "digits": 3}


@pytest.fixture(scope="module")
def chromium():
    binary = find_chromium()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium binary under CI (apt-get install chromium)")
        pytest.skip("no chromium binary (apt-get install chromium); under CI this fails")
    return binary


KINDS = {"sweep": "sweep", "compare": "comparison", "search": "search", "distill": "distillation", "theory": "theory run",
         "shifting": "shifting analysis", "synth": "synth sinks grid", "grid": "grid", "attention": "attention analysis",
         "other": "mystery analysis", "order": "sweep", "order-compare": "comparison", "hidden": "hidden-search"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, model_dir, loaded):
    """Finished run folders from the real pipelines on the tiny model (a grid and a kind without a renderer by hand)."""
    root = tmp_path_factory.mktemp("report-runs")
    cfg = SweepConfig(model=str(model_dir), task_options=KV, positions="0,2,3", n=4, dtype="fp32", max_batch=8)
    run_sweep(cfg, root / "sweep", loaded=loaded, progress=False)
    run_compare(cfg, ["none", "pi:1.5"], root / "compare", loaded=loaded, progress=False)
    order = SweepConfig(model=str(model_dir), task="judge-kv", task_options={"facts": 2, "digits": 3}, n=4, dtype="fp32",
                        method="pride:2")  # an order task: its figures table and order.png (with PriDe's prior)
    run_sweep(order, root / "order", loaded=loaded, progress=False)
    run_compare(replace(order, method="none"), ["none", "swap"], root / "order-compare", loaded=loaded, progress=False)
    ga = GAConfig(pop_size=5, n_parents=2, n_crossover=1, n_mutation=2, generations=2, n_points=2, y_min=1.0, y_max=2.0,
                  y_step=0.25, y_init=1.25, my=0.5, mx=1)
    run_search(SearchConfig(model=str(model_dir), task_options=KV, n=2, skip=100, dtype="fp32", ga=ga), root / "search",
               loaded=loaded, progress=False)
    run_distill(DistillConfig(model=str(model_dir), task_options=KV, n=1, k=2, correct_only=False, dtype="fp32",
                              max_steps=2, save_steps=2), root / "distill", progress=False)
    run_theory(TheoryConfig(seed=0, n_tokens=24, depth=6), root / "theory")
    run_shifting(ShiftingConfig(model=str(model_dir), task="kv-2hop", task_options={"facts": 5, "digits": 3}, n=2,
                                positions="0:1,3:4,2:0", dtype="fp32"), root / "shifting", loaded=loaded, progress=False)
    run_attention(AttentionConfig(model=str(model_dir), task_options=KV, n=2, positions="0,3", dtype="fp32", rollout=True,
                                  scales=[1.0, 1.5]), root / "attention", loaded=loaded, progress=False)
    over = dict(iters=4, seeds=1, eval_seqs=20, sink_seqs=10, position_seqs=4, curve_seqs=8, log_points=2, n_classes=64,
                n_labels=8, burstiness=2, n_items=4, dim=16, masks=["causal", "window3"])
    synth.run_grid("sinks", synth.grid_runs("sinks", "quick", **over), root / "synth", progress=False)
    run_grid(GridConfig(model=str(model_dir), task_options={"digits": 3}, sizes="3,5", depths="0%,50%,100%", n=2,
                        dtype="fp32"), root / "grid", loaded=loaded, progress=False)
    deeper = Loaded(tiny_model("llama", len(loaded.tokenizer), layers=6), loaded.tokenizer, {"name": "tiny-llama-6", "context_window": 2048})
    hidden.run_search(hidden.SearchConfig(model="tiny", task_options=KV, n=2, skip=100, dtype="fp32", samples=4, length=64,
                                          top_k=1, scales=(0.0,)), root / "hidden", loaded=deeper, progress=False)
    _hand_made(root, root / "sweep" / "curve.png")
    return root


def _hand_made(root: Path, png: Path) -> None:
    """A kind with no renderer of its own (the generic section), with a string that must be escaped."""
    for name, kind, result in [("other", "mystery analysis", {"sink_share": 0.5, "note": "<img src=x onerror=alert(1)>",
                                                                "rows": [{"layer": 0, "mass": 0.25}]})]:
        (root / name).mkdir()
        (root / name / "run.json").write_text(json.dumps({"kind": kind, "fingerprint": {}}))
        (root / name / "mystery.json").write_text(json.dumps(result))
        shutil.copy(png, root / name / "mass.png")


def _pngs(root: Path) -> int:
    """PNGs the report should embed: each folder's own (a compare's sub-sweeps are not sections)."""
    return sum(len(list((root / d).glob("*.png"))) for d in KINDS)


def test_every_kind_of_run_reports(runs, tmp_path):
    """A report over every pipeline's folder (a hidden-channel search used to be refused: the report derived
    `hidden-search.json` from its kind, and the pipeline writes hidden.json; run.json now names the result file)."""
    res = build_report([runs / d for d in sorted(KINDS)], tmp_path / "all.html")
    assert sorted(res.kinds) == sorted(KINDS.values())
    assert json.loads((runs / "hidden" / "run.json").read_text())["result"] == "hidden.json"


def test_report_of_real_runs_opens_clean_in_chromium(runs, tmp_path, chromium):
    out = tmp_path / "report.html"
    folders = [runs / d for d in KINDS] + [runs / "compare" / "none"]
    res = build_report(folders, out, title="report <test>")
    assert res.kinds == list(KINDS.values())  # the compare's sub-sweep passed as well is not shown twice
    text = out.read_text(encoding="utf-8")
    assert res.images == text.count("data:image/png;base64,") == _pngs(runs) + 1  # + the drawn training curve
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)  # self-contained
    assert "<img src=x" not in text and "&lt;img src=x" in text  # strings from JSON are escaped
    assert "report &lt;test&gt;" in text
    command = json.loads((runs / "sweep" / "run.json").read_text())["command"]  # provenance: run.json records it
    assert command and html.escape(command) in text
    assert embedded_png_problems(text) == []
    check = check_page(out)
    assert len(check.images) == res.images
    assert check.broken_images == [] and all(i["w"] > 0 for i in check.images)
    assert check.errors == []


def test_checker_catches_broken_images_and_a_console_error(runs, tmp_path, chromium):
    """The checks can fail: an image that is not a PNG (the browser cannot decode it), a truncated PNG (the
    browser shows it partially, without an error: the static check catches it), an error on the console."""
    good = base64.b64encode((runs / "sweep" / "curve.png").read_bytes()).decode()
    garbage = base64.b64encode(b"this is not a PNG at all" * 8).decode()
    page = tmp_path / "broken.html"
    page.write_text(f'<!DOCTYPE html><html><body><img src="data:image/png;base64,{good}" alt="good">'
                    f'<img src="data:image/png;base64,{garbage}" alt="garbage">'
                    f'<img src="data:image/png;base64,{good[:2000]}" alt="truncated">'
                    '<script>console.error("boom from the page")</script></body></html>')
    check = check_page(page)
    assert [i["alt"] for i in check.broken_images] == ["garbage"]
    assert any("boom from the page" in e for e in check.errors), check.errors
    problems = embedded_png_problems(page.read_text())
    assert [p.split(":")[0] for p in problems] == ["image 1", "image 2"], problems


def test_bad_input_is_one_error_and_writes_nothing(runs, tmp_path):
    out = tmp_path / "r.html"
    unfinished = tmp_path / "unfinished"
    shutil.copytree(runs / "sweep", unfinished)
    (unfinished / "sweep.json").unlink()
    (tmp_path / "empty").mkdir()
    cases = [([runs / "sweep" / "curve.png"], out, "is not a folder"), ([tmp_path / "empty"], out, "is not a run folder"),
             ([unfinished], out, "resume the command recorded in its run.json"), ([runs / "sweep"], tmp_path, "is a directory"),
             ([], out, "no run folders")]
    for paths, where, message in cases:
        with pytest.raises(PosbiasError, match=message):
            build_report(paths, where)
        assert not out.exists()


def test_cli_report_prints_path_and_sections(runs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "cli.html"
    monkeypatch.setattr(sys, "argv", ["posbias", "report", str(runs), "--out", str(out), "--title", "all"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 0
    assert f"wrote {out} ({len(KINDS)} sections" in capsys.readouterr().out  # the parent folder: each run folder inside it
    monkeypatch.setattr(sys, "argv", ["posbias", "report", str(runs / "nope"), "--out", str(tmp_path / "x.html")])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "is not a folder" in err[0]
    assert not (tmp_path / "x.html").exists()
