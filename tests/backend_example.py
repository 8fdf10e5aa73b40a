"""A whole backend in one file (docs/architecture.md, "A new backend"): a transformers model directory answering
posbias's requests one at a time, as a served engine answers them. tests/test_backend_seam.py registers it with
one line, `register_backend(LocalServed)`, and then `local:DIR` runs sweeps, comparisons and order tasks through
the served protocols (teacher forcing by greedy generation or by prompt logprobs, generation, labels from top
logprobs), with no other change anywhere."""

from __future__ import annotations

from typing import Iterator

import torch

from posbias.backends import Capabilities, Reply, Request, ServedBackend
from posbias.backends.base import prompt_steps


class LocalServed(ServedBackend):
    name = "local"
    description = "a transformers model directory answering requests one at a time (the tests' example backend)"
    ARGS = {"teacher_forcing": "generate (default) | prompt_logprobs"}

    def __init__(self, args: dict):
        from posbias.models.load import load_model

        loaded = load_model(str(args["model"]), "fp32", "cpu", progress=False)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.caps = self.capabilities(args)
        self.info = {"backend": self.name, "name": f"local:{args['model']}", "context_window": loaded.info["context_window"]}
        self.counts = {"requests": 0}

    @classmethod
    def capabilities(cls, args: dict) -> Capabilities:
        route = str(args.get("teacher_forcing", "generate"))
        return Capabilities(prompt_logprobs=route == "prompt_logprobs", token_prompts=True, methods=False,
                            prefix_sharing=False, batching="requests", top_logprobs=True, teacher_forcing=route)

    @classmethod
    def open(cls, args: dict, dtype: str, device: str, progress: bool, device_map: str | None) -> "LocalServed":
        return cls(args)

    def decoding(self) -> dict:
        return {"rule": "greedy", "request": "argmax of fp32 logits"}

    def counters(self) -> dict:
        return dict(self.counts)

    @torch.inference_mode()
    def run(self, requests: list[Request]) -> Iterator[tuple[int, Reply]]:
        for i, q in enumerate(requests):
            self.counts["requests"] += 1
            yield i, self._logprobs(q) if q.kind == "logprobs" else self._generate(q)

    def _next(self, ids: list[int]) -> torch.Tensor:
        return torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)

    def _logprobs(self, q: Request) -> Reply:
        lp = self._next(q.ids)
        positions = [None] + [_listed(lp[j - 1], 2) | {q.ids[j]: float(lp[j - 1, q.ids[j]])} for j in range(1, len(q.ids))]
        return Reply(tokens=prompt_steps(positions, q))

    def _generate(self, q: Request) -> Reply:
        ids, steps, finish = list(q.ids), [], "length"
        for _ in range(q.max_tokens):
            lp = self._next(ids)[-1]
            t = int(lp.argmax())
            if t == self.tokenizer.eos_token_id:
                finish = "stop"
                break
            steps.append((t, float(lp[t]), _listed(lp, max(q.top, 1))))
            ids.append(t)
            if q.stop_newline and "\n" in self.tokenizer.decode([t]):
                finish = "stop"
                break
        text = self.tokenizer.decode([s[0] for s in steps])
        return Reply(tokens=steps if q.top else [], text=text.split("\n")[0] if q.stop_newline else text, finish=finish)


def _listed(lp: torch.Tensor, k: int) -> dict:
    vals, top = lp.topk(k)
    return {int(t): float(v) for v, t in zip(vals, top)}
