"""Found-in-the-Middle attention calibration (Hsieh et al., Findings ACL 2024), as a training-free Method.

Each item's relevance is its attention minus the attention a content-free item gets at the same slot (Sec. 3.2,
Eq. 4: rel(x_k) = Attn(x_k, k) - Attn(x_dum, k); the paper's Eq. 4 adds rel(x_dum), the same at every slot, which
changes no ranking and no softmax over the slots); the answer-producing attention of the last half of the layers is
then redistributed over the items in proportion to softmax(rel / t), t = 5e-5 (Sec. 4.1; models/calibration.py).
Attn is the mean per-token attention from the last prompt token, averaged over every layer and head (the
unnumbered definition of Sec. 2.1; scoring/relevance.py), measured on the unmodified model before each batch is scored.

    calib:prompt[:T]     the paper: the dummy measured in every prompt, at every slot (n_items extra prefills a row)
    calib:DIR[:T]        the cpu preset: the positional prior a `posbias analyze prior` folder measured once per model
                         and prompt template, on examples disjoint from the evaluation (1 extra prefill a row)

T is the temperature (default 5e-5). A prior from another model, task or template, or measured on the examples a
comparison evaluates, is refused.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from ..errors import PosbiasError
from ..models.load import Loaded
from ..tasks import Task
from ..tasks.arrange import with_dummy
from .base import Active, Method, refuse_without_items
from .registry import register_method

PRIOR = "prior.json"
TEMPERATURE = 5e-5  # Sec. 4.1, every experiment of the paper


def read_prior(path: str | Path) -> dict:
    """The record of a `posbias analyze prior` folder (or its prior.json), checked."""
    p = Path(path)
    f = p / PRIOR if p.is_dir() else p
    if not f.is_file():
        raise PosbiasError(f"no positional prior at {f}", "measure one with `posbias analyze prior --out DIR` and pass DIR")
    try:
        rec = json.loads(f.read_text())
        rec["prior"], rec["model"], rec["task"]  # noqa: B018 - the fields every prior has
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise PosbiasError(f"{f} is not a positional prior ({type(e).__name__})", "measure it again into a fresh folder") from None
    rec["sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return rec


@register_method
class Calibration(Method):
    """Attention calibration: items reweighted by their calibrated relevance in the last half of the layers."""

    name = "calib"
    usage = "calib:prompt[:T]|calib:DIR[:T]"
    prefix_note = "calibration reweights attention by each prompt's own items"
    reads_attention = True

    def __init__(self, prior: str | Path = "prompt", t: float = TEMPERATURE, layers: list[int] | None = None):
        if not t > 0:
            raise PosbiasError(f"the calibration temperature must be positive, got {t}", "write calib:prompt:5e-5")
        self.prior_path, self.t, self.layers = str(prior), t, layers
        self.record = None if self.prior_path == "prompt" else read_prior(prior)
        self.fitted_on = (self.record or {}).get("fitted_on")

    @classmethod
    def from_spec(cls, arg: str) -> "Calibration":
        if not arg:
            raise PosbiasError("calib needs a prior", f"write it as {cls.spec_forms()} (prompt: measured in every prompt)")
        where, _, t = arg.rpartition(":") if _is_float(arg.rpartition(":")[2]) else (arg, "", "")
        return cls(where, float(t) if t else TEMPERATURE)

    @property
    def label(self) -> str:
        return f"calib:{'prompt' if self.record is None else Path(self.prior_path).name}"

    def config(self) -> dict:
        return {"name": self.name, "prior": self.prior_path, "sha256": (self.record or {}).get("sha256"), "t": self.t,
                "layers": self.layers}

    def check_task(self, task: Task, positions: list, engine: str) -> None:
        refuse_without_items(self, task)

    def for_task(self, task: Task) -> "Calibration":
        if self.record is not None and self.record["task"] != task.config():
            raise PosbiasError(f"the prior in {self.prior_path} was measured on {self.record['task']}, not on "
                               f"{task.config()}", "measure a prior for this task and template with `posbias analyze prior`")
        return self

    def check(self, loaded: Loaded) -> None:
        from ..models.calibration import check_layers

        n = loaded.model.config.num_hidden_layers
        check_layers(loaded.model, self.chosen(n))
        if self.record is not None and self.record["model"] != loaded.info.get("name"):
            raise PosbiasError(f"the prior in {self.prior_path} belongs to model {self.record['model']}, not "
                               f"{loaded.info.get('name')}", "measure a prior for this model with `posbias analyze prior`")

    def chosen(self, n_layers: int) -> list[int]:
        """The calibrated layers: the given ones, else the last half (the paper: the last 16 of 32)."""
        return self.layers if self.layers is not None else list(range(n_layers // 2, n_layers))

    def prior_for(self, prompts, view) -> torch.Tensor:
        """[P, n] the content-free item's attention at each slot: from the file, or measured in each prompt."""
        if self.record is not None:
            if self.record.get("chat") is not None and self.record["chat"] != view.chat:
                raise PosbiasError(f"the prior in {self.prior_path} was measured with chat={self.record['chat']}",
                                   "measure it with the same `chat` setting as the sweep")
            prior = torch.tensor(self.record["prior"])
            if prior.shape[0] != len(prompts[0].items):
                raise PosbiasError(f"the prior has {prior.shape[0]} slots, the prompts {len(prompts[0].items)}",
                                   "measure a prior for this task with `posbias analyze prior`")
            return prior.expand(len(prompts), -1)
        task = view.task
        n = len(prompts[0].items)
        dummies = [with_dummy(p, k, task.slot_label, task.dummy) for p in prompts for k in range(n)]
        measured = torch.tensor(view.item_attention(dummies)).view(len(prompts), n, n)  # [P, dummy slot, item]
        return measured.diagonal(dim1=1, dim2=2)  # the dummy's own attention at its slot

    @contextmanager
    def apply(self, loaded: Loaded) -> Iterator[Active]:
        from ..models.calibration import calibration

        with calibration(loaded.model, self.chosen(loaded.model.config.num_hidden_layers)) as st:
            yield _CalibActive(self, st)


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


class _CalibActive(Active):
    """Before each batch: relevance on the unmodified model, then the spans and weights of every sequence."""

    def __init__(self, method: Calibration, st):
        self.method, self.st = method, st
        self.rows: list = []

    def set_rows(self, rows, view=None) -> None:
        if view is None:  # methods/base.py HookView: task, chat, item_attention, item_spans
            return
        prompts = [r.prompt for r in rows]
        with self.st.suspended():
            attn = torch.tensor(view.item_attention(prompts))  # [R, n]
            prior = self.method.prior_for(prompts, view)
        self.alpha = torch.softmax((attn - prior) / self.method.t, dim=-1)  # alpha_k = Softmax(rel_k, t)
        self.spans = [_prompt_spans(view, r) for r in rows]
        self.rows = rows
        self.st.set(self.spans, self.alpha)  # generation: one sequence per row, the prompt ends in the last column

    def set_prompt_end(self, cols) -> None:
        if not self.rows:
            return
        per = [len(r.answer_ids) for r in self.rows]  # teacher forcing: one sequence per (row, answer)
        own = [i for i, k in enumerate(per) for _ in range(k)] if len(cols) != len(self.rows) else list(range(len(self.rows)))
        self.st.set([self.spans[i] for i in own], self.alpha[own], torch.as_tensor(cols))


def _prompt_spans(view, row) -> list[int]:
    """The span id of each prompt token (items 0..n-1, anything else n), checked against the row's tokens."""
    sp = view.item_spans(row.prompt)
    n = sp.n_items
    ids = [s if s < n else n for s in sp.span_of]
    if row.prompt_ids[: len(sp.ids)] != sp.ids:
        raise PosbiasError(f"the item spans of example {row.prompt.example_id} do not match its tokens",
                           "use the same chat setting for spans and scoring")
    return ids + [n] * (len(row.prompt_ids) - len(sp.ids))
