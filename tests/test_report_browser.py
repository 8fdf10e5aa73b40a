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
from pathlib import Path

import pytest

from browser import check_page, embedded_png_problems, find_chromium
from posbias import DistillConfig, PosbiasError, SweepConfig, TheoryConfig, build_report, run_compare, run_distill, run_sweep
from posbias import run_theory
from posbias.cli import main

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


@pytest.fixture(scope="module")
def runs(tmp_path_factory, model_dir, loaded):
    """Finished run folders from the real pipelines on the tiny model, plus a kind without a renderer."""
    root = tmp_path_factory.mktemp("report-runs")
    cfg = SweepConfig(model=str(model_dir), task_options=KV, positions="0,2,3", n=4, dtype="fp32", max_batch=8)
    run_sweep(cfg, root / "sweep", loaded=loaded, progress=False)
    run_compare(cfg, ["none", "pi:1.5"], root / "compare", loaded=loaded, progress=False)
    run_theory(TheoryConfig(seed=0, n_tokens=24, depth=6), root / "theory")
    run_distill(DistillConfig(model=str(model_dir), task_options=KV, n=1, k=2, correct_only=False, dtype="fp32",
                              max_steps=2, save_steps=2), root / "distill", progress=False)
    other = root / "other"  # a kind the report has no renderer for: the generic section
    other.mkdir()
    (other / "run.json").write_text(json.dumps({"kind": "attention analysis", "fingerprint": {}}))
    (other / "attention.json").write_text(json.dumps({"sink_share": 0.5, "note": "<img src=x onerror=alert(1)>",
                                                      "rows": [{"layer": 0, "mass": 0.25}]}))
    shutil.copy(root / "sweep" / "curve.png", other / "mass.png")
    return root


def _pngs(root: Path) -> int:
    """PNGs the report should embed: each folder's own (a compare's sub-sweeps are not sections)."""
    return sum(len(list((root / d).glob("*.png"))) for d in ("sweep", "compare", "theory", "distill", "other"))


def test_report_of_real_runs_opens_clean_in_chromium(runs, tmp_path, chromium):
    out = tmp_path / "report.html"
    folders = [runs / d for d in ("sweep", "compare", "theory", "distill", "other")] + [runs / "compare" / "none"]
    res = build_report(folders, out, title="report <test>")
    assert res.sections == 5  # the compare's sub-sweep passed as well is not shown twice
    assert res.kinds == ["sweep", "comparison", "theory run", "distillation", "attention analysis"]
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
             ([unfinished], out, "run it again with --resume"), ([runs / "sweep"], tmp_path, "is a directory"),
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
    assert f"wrote {out} (5 sections" in capsys.readouterr().out  # the parent folder: each run folder inside it
    monkeypatch.setattr(sys, "argv", ["posbias", "report", str(runs / "nope"), "--out", str(tmp_path / "x.html")])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "is not a folder" in err[0]
    assert not (tmp_path / "x.html").exists()
