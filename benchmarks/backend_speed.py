"""posbias in process against vLLM's offline engine on the same rows, every path cold, costed in CPU seconds.

Run it from the vLLM venv (make vllm-env), which holds posbias too; it exports SmolLM2 to a model directory first:

    .venv-vllm/bin/python benchmarks/backend_speed.py [--n 10] [--rounds 3] [--task kv-lookup] [--threads 1]

On a GPU (no vLLM there; weights cannot travel to a lent machine), posbias's in-process paths and the floor alone, on
the conformance matrix's tiny Llama or on SmolLM2's config and tokenizer with random weights, costed in wall seconds:

    python benchmarks/backend_speed.py --device cuda --model tiny --dtype fp32 --rounds 3
    python benchmarks/backend_speed.py --device cuda --model-dir DIR --random-weights --rounds 3   # DIR: config + tokenizer

Rows: the task's prompts (kv-lookup: 10 facts) x every slot x `--n` examples, built once by posbias's Scorer; every
path scores exactly these token ids. Paths:

  (a) posbias in process, teacher-forced, prefix-shared     (b) the same, plain path (prefix_sharing=False)
  (c) posbias in process, generate, prefix-shared           (d) the same, plain path
  (e) vLLM teacher forcing via prompt_logprobs=1, max_tokens=1: one request per accepted answer (prompt + answer);
      greedy iff no listed token is more likely than the answer token (or as likely with a lower id)
  (f) vLLM teacher forcing via greedy generation: one request per row, temperature 0, max_tokens = the longest
      accepted answer in tokens, no stop strings; correct iff the generated ids begin with an accepted answer's ids
      (every answer token is the greedy choice; ties aside)
  (g) vLLM generate: greedy, the task's max_new_tokens, newline stop, judged by the task's metric on the first line
  (F) the raw-forward floor of each protocol (benchmarks/floor.py): one plain forward over the unique tokens the
      rows need (teacher forcing: prompts and answers; generation: prompts and what (c) generated), the least any
      engine on this build of torch can spend on them; every path's "x floor" is its CPU s per row over this
The vLLM paths call `LLM.generate` directly with token prompts, 64 requests per call, on an engine started with
posbias's vllm backend's arguments (prefix caching on, seed 0, the dtype of every path: --dtype, auto by default, bf16
on a CPU with native bf16, else fp32), so they do not depend on which teacher-forcing route that backend takes by
default.

Cold. vLLM's prefix cache is reset (`LLM.reset_prefix_cache()`) before every path and round, and its counters
(vllm:prefix_cache_queries / vllm:prefix_cache_hits, in tokens) are read around each run: hits after a reset come
from rows of the same path sharing a prompt prefix (the engine's own prefix sharing, as (a) and (c) share within an
example). vLLM never reads its cache for a request with prompt_logprobs (SamplingParams.skip_reading_prefix_cache),
so (e) queries nothing, but it writes its blocks: without the reset a later generation pass finds them. The last
line of the table is that warm case: (g) once more without a reset. posbias's in-process paths hold no cache
across rows of different examples, nor across paths.

CPU. "CPU s" is the user + system time of this process and every descendant (vLLM's EngineCore and its worker run
in child processes), per process sampled with psutil right before and right after the run: the figure to compare on
a shared 2-core machine. "child" is the share of it spent in child processes. posbias runs with `--threads` torch
threads (default 1); vLLM keeps its CPU default (its worker's OMP threads on the cores it does not reserve for its
front end; the header prints what it got).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import psutil

PROTOCOL = {"a": "teacher-forced", "b": "teacher-forced", "c": "generate", "d": "generate", "e": "teacher-forced",
            "f": "teacher-forced", "g": "generate", "g*": "generate", "Ftf": "teacher-forced", "Fgen": "generate"}
CHUNK = 64  # requests per LLM.generate call, as posbias's vllm backend sends them
ENGINE = {"enable_prefix_caching": True, "seed": 0, "max_model_len": 2048,
          "disable_log_stats": False}  # posbias's vllm backend's engine arguments; stats on: the cache counters
LABEL = {"a": "(a) posbias prefix-shared", "b": "(b) posbias plain", "c": "(c) posbias prefix-shared",
         "d": "(d) posbias plain", "e": "(e) vLLM prompt_logprobs", "f": "(f) vLLM greedy-gen TF",
         "g": "(g) vLLM generate", "g*": "(g) vLLM, NO reset (control)", "Ftf": "(F) raw forward, unique tokens",
         "Fgen": "(F) raw forward, unique tokens"}


def proc_cpu() -> dict[int, tuple[float, bool]]:
    """pid -> (user + system CPU seconds, incl. its waited-for children; is it a descendant) for this process and
    every live descendant."""
    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[p.pid] = (t.user + t.system + t.children_user + t.children_system, p.pid != me.pid)
    return out


def sync() -> None:
    """Wait for the GPU's queued work (a no-op on the CPU), so wall time covers it."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def measure(fn) -> dict:
    """Run fn(); its wall seconds (the GPU's queued work included), CPU seconds of the whole process tree, and the
    part in child processes."""
    sync()
    before = proc_cpu()
    t0 = time.perf_counter()
    result = fn()
    sync()
    wall = time.perf_counter() - t0
    after = proc_cpu()
    cpu = child = 0.0
    for pid, (sec, is_child) in after.items():
        d = sec - before.get(pid, (0.0, False))[0]
        cpu += d
        child += d if is_child else 0.0
    gone = set(before) - set(after)
    if gone:
        print(f"  note: {len(gone)} process(es) ended during the run; their CPU time after the first sample is lost")
    return {"wall": wall, "cpu": cpu, "child": child, "result": result}


def cache_counters(llm) -> tuple[int, int]:
    """(queries, hits) of vLLM's prefix cache so far, in tokens (summed over engines)."""
    q = h = 0
    for m in llm.get_metrics():
        if m.name == "vllm:prefix_cache_queries":
            q += int(m.value)
        elif m.name == "vllm:prefix_cache_hits":
            h += int(m.value)
    return q, h


def verdicts(results: list[dict]) -> dict:
    return {(r["example_id"], str(r["position"])): bool(r["correct"]) for r in results}


def scorer_path(loaded, task, engine: str, prefix: bool, rows, what: str, make_scorer):
    """A path that scores `rows` with posbias's Scorer in process (make_scorer: Scorer with the benchmark's batch
    settings bound), checked to take the scoring path asked for (prefix-shared or plain)."""
    scorer = make_scorer(loaded, task, engine, prefix_sharing=prefix)
    if scorer.path()[0] != prefix:
        raise SystemExit(f"{what}: posbias took the {'prefix-shared' if not prefix else 'plain'} path, not the one asked")

    def run() -> dict:
        run.results = scorer.score(rows)  # in row order; (c)'s predictions give the generation floor its tokens
        return verdicts(run.results)

    return run


def in_order(llm, prompts: list[list[int]], params: list) -> list:
    """vLLM's outputs for token prompts, CHUNK requests per LLM.generate call (as posbias's vllm backend sends)."""
    from vllm.inputs import TokensPrompt

    outs = []
    for lo in range(0, len(prompts), CHUNK):
        batch = [TokensPrompt(prompt_token_ids=p) for p in prompts[lo:lo + CHUNK]]
        outs += llm.generate(batch, params[lo:lo + CHUNK], use_tqdm=False)
    return outs


def row_key(row) -> tuple:
    return row.key[0], str(row.key[1])


def tf_logprobs(llm, rows):
    """Path (e): one request per accepted answer (prompt + answer), prompt_logprobs=1, max_tokens=1; an answer token
    is greedy iff no listed token is more likely, or as likely with a lower id (the in-process argmax)."""
    from vllm import SamplingParams

    reqs = [(i, a) for i, r in enumerate(rows) for a in r.answer_ids]
    params = [SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1, detokenize=False)] * len(reqs)

    def run() -> dict:
        out = {row_key(r): False for r in rows}
        for (i, ans), o in zip(reqs, in_order(llm, [rows[i].prompt_ids + list(a) for i, a in reqs], params)):
            n = len(rows[i].prompt_ids)
            greedy = all(all(x.logprob < e[t].logprob or (x.logprob == e[t].logprob and u >= t) for u, x in e.items())
                         for t, e in zip(ans, o.prompt_logprobs[n:]))
            out[row_key(rows[i])] |= greedy
        return out

    return run


def tf_greedy(llm, rows):
    """Path (f): teacher forcing read off greedy generation, one request per row: temperature 0, max_tokens = the
    longest accepted answer, no stop strings; correct iff the generated ids begin with an accepted answer's ids."""
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=max(map(len, r.answer_ids)), detokenize=False) for r in rows]

    def run() -> dict:
        outs = in_order(llm, [r.prompt_ids for r in rows], params)
        return {row_key(r): any(list(o.outputs[0].token_ids[:len(a)]) == list(a) for a in r.answer_ids)
                for r, o in zip(rows, outs)}

    return run


def generate(llm, rows, task, max_new_tokens: int):
    """Path (g): greedy generation, the task's max_new_tokens, newline stop; judged like posbias's generate engine
    (the task's metric on the first line)."""
    from vllm import SamplingParams

    from posbias.core.metrics import METRICS, first_line

    stop = None if task.multiline else ["\n"]
    params = [SamplingParams(temperature=0, max_tokens=max_new_tokens, stop=stop)] * len(rows)

    def run() -> dict:
        outs = in_order(llm, [r.prompt_ids for r in rows], params)
        return {row_key(r): bool(METRICS[task.metric](o.outputs[0].text.strip() if task.multiline else
                                                  first_line(o.outputs[0].text), r.prompt.answers))
                for r, o in zip(rows, outs)}

    return run


def run_rounds(paths: dict, rounds: int, llm=None) -> list[dict]:
    """Each path `rounds` times (round-major); with a vLLM engine its prefix cache is reset before every run."""
    recs = []
    for rnd in range(rounds):
        for key, fn in paths.items():
            recs.append(run_one(key, fn, rnd, llm, reset=True))
    return recs


def run_one(key: str, fn, rnd: int, llm, reset: bool) -> dict:
    q0 = h0 = q1 = h1 = None
    if llm is not None:
        if reset and not llm.reset_prefix_cache():
            raise SystemExit("vLLM refused to reset its prefix cache (requests still running?)")
        q0, h0 = cache_counters(llm)
    m = measure(fn)
    if llm is not None:
        q1, h1 = cache_counters(llm)
    rec = {"key": key, "round": rnd, "rows": len(m["result"]), "verdicts": m.pop("result"), **m,
           "queries": None if q0 is None else q1 - q0, "hits": None if h0 is None else h1 - h0}
    cache = "" if q0 is None else f", prefix cache hits {rec['hits']} of {rec['queries']} tokens queried"
    if llm is not None and rec["child"] < 0.5 * rec["cpu"]:
        print("  WARNING: under half of this vLLM run's CPU time is in child processes: is the engine's time counted?")
    print(f"  {LABEL[key]} round {rnd + 1}: wall {rec['wall']:.1f} s, CPU {rec['cpu']:.1f} s "
          f"(children {rec['child']:.1f} s){cache}")
    return rec


def posbias_paths(model_dir: Path, task, examples, placements, a) -> tuple[list, dict, int]:
    """The rows (built once, by posbias's Scorer), paths (a)-(d) and the task's max_new_tokens; one untimed warm-up
    example per protocol."""
    import functools

    import torch

    from posbias import load_model
    from posbias.measure import Scorer

    torch.set_num_threads(a.threads)
    loaded = load_model(str(model_dir), a.dtype, a.device, progress=False)
    make = functools.partial(Scorer, batch_tokens=a.batch_tokens, max_batch=a.max_batch)
    rows = make(loaded, task, "teacher-forced").rows(examples, placements)
    warm = task.examples(1, 0, len(examples))  # an example outside the measured rows
    for engine in ("teacher-forced", "generate"):
        s = make(loaded, task, engine)
        s.score(s.rows(warm, placements[:2]))
    paths = {k: scorer_path(loaded, task, PROTOCOL[k], prefix, rows, LABEL[k], make)
             for k, prefix in (("a", True), ("b", False), ("c", True), ("d", False))}
    if any(r.option_ids or r.prompt.options for r in rows):
        raise SystemExit("paths (e) and (f) score answer tokens; this task's rows are option labels (an order task)")
    return loaded, rows, paths, make(loaded, task, "generate").max_new_tokens


def floor_rounds(loaded, rows, generated: list[str], rounds: int, batch: int = 1) -> tuple[list[dict], dict]:
    """(F): per protocol, one raw forward over the unique tokens the rows need, `rounds` times (benchmarks/floor.py);
    -> the records and the floor's runs by key."""
    from floor import raw_forward, unique_tokens

    tf, _, length = unique_tokens(rows, "teacher-forced")
    tokens = {"Ftf": tf, "Fgen": unique_tokens(rows, "generate", generated, loaded.tokenizer)[0]}
    recs = []
    fns = {key: (lambda t=t: raw_forward(loaded.model, t, length, batch)) for key, t in tokens.items()}
    for rnd in range(rounds):
        for key, fn in fns.items():
            m = measure(fn)
            forwards = m.pop("result")
            recs.append({"key": key, "round": rnd, "rows": len(rows), "verdicts": None, "hits": None, "queries": None,
                         "tokens": len(tokens[key]), **m})
            print(f"  {LABEL[key]} ({PROTOCOL[key]}, {len(tokens[key])} unique tokens in {forwards} forwards of up to "
                  f"{batch} x {length}) round {rnd + 1}: wall {m['wall']:.1f} s, CPU {m['cpu']:.1f} s")
    return recs, fns


def gpu_busy(fns: dict, recs: list[dict]) -> None:
    """Each path once more under torch's profiler: the GPU's kernel time and kernel launches against the path's best
    unprofiled wall time. A path whose kernels fill a small share of its wall time waits on the host (Python, kernel
    launches, synchronisations), not on the GPU's arithmetic."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    print("GPU busy (one more profiled run per path; the kernels' own time, summed, one stream):")
    for key, fn in fns.items():
        best = min(r["wall"] for r in recs if r["key"] == key)
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            sync()
        kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]  # not the ops that launch them
        busy = sum(e.self_device_time_total for e in kernels) / 1e6
        launches = sum(e.count for e in kernels)
        print(f"  {LABEL[key]:31s} {PROTOCOL[key]:14s} kernels {busy * 1e3:8.1f} ms of its best wall "
              f"{best * 1e3:8.1f} ms ({busy / best:4.0%} busy), {launches} kernel launches")


def start_vllm(model_dir: Path, dtype: str):
    """vLLM's offline engine on the exported model, as posbias's vllm backend starts it, in `dtype` (bf16 | fp32)."""
    from vllm import LLM

    from posbias.backends.vllm import DTYPES

    m = measure(lambda: LLM(model=str(model_dir), dtype=DTYPES[dtype], **ENGINE))
    llm = m["result"]
    kids = psutil.Process().children(recursive=True)
    desc = ", ".join(f"{p.name()} pid {p.pid} on cores {p.cpu_affinity()} ({p.num_threads()} threads)" for p in kids)
    idle = measure(lambda: time.sleep(5.0))
    print(f"vLLM engine start: wall {m['wall']:.1f} s, CPU {m['cpu']:.1f} s; processes: {desc}")
    print(f"vLLM idle for 5 s: {idle['cpu']:.2f} CPU s ({idle['child']:.2f} s in its children)")
    return llm


def header(a, label: str) -> None:
    import torch
    import transformers

    import posbias
    from posbias.models.compat import attention_record

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    la = os.getloadavg()
    print(f"command: {' '.join(shlex.quote(x) for x in [sys.executable, *sys.argv])}")
    print(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}; host {platform.node()}")
    print(f"machine: {cpu} ({torch.backends.cpu.get_cpu_capability()}), {os.cpu_count()} logical cores "
          f"({len(os.sched_getaffinity(0))} usable), {psutil.virtual_memory().total / 2**30:.0f} GiB")
    if a.device == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}; costs below are WALL seconds (the GPU's "
              "work; CPU seconds are printed beside them)")
    print(f"load average at start (1/5/15 min): {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} "
          f"({'other load present' if la[0] > 0.5 else 'quiet'})")
    vllm = "" if a.no_vllm else f"vllm {__import__('vllm').__version__}, "
    print(f"versions: {vllm}torch {torch.__version__}, transformers {transformers.__version__}, "
          f"posbias {getattr(posbias, '__version__', '?')}; model {label} ({a.dtype} on {a.device}: {a.dtype_why}"
          + ("" if a.no_vllm else "; vLLM's engine the same") + ")")
    print("posbias's grouped-query attention (models/compat.py): "
          + "; ".join(f"{k} {v}" for k, v in attention_record().items()))
    print(f"posbias: {a.threads} torch thread(s), batches of at most {a.max_batch} rows / {a.batch_tokens} tokens"
          + ("" if a.no_vllm else f"; VLLM_CPU_KVCACHE_SPACE={os.environ['VLLM_CPU_KVCACHE_SPACE']} GiB"))


def model_source(a) -> tuple[Path, str]:
    """The model directory the paths load, and what it is: SmolLM2 exported now, the conformance matrix's tiny Llama,
    or --model-dir (with --random-weights: its config and tokenizer, weights drawn at random with seed 0, saved in a
    temporary directory)."""
    if a.model_dir is not None and not a.random_weights:
        return Path(a.model_dir), a.model_dir
    out = Path(tempfile.mkdtemp())
    if a.model == "tiny":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from tiny import save_tiny_llama

        return save_tiny_llama(out / "tiny"), ("the conformance matrix's tiny Llama (tests/tiny.py: 2 layers of width "
                                              "64, char tokenizer)")
    if a.model_dir is None:
        from posbias.measure import export_model

        return export_model("smollm2-135m", out / "smollm2"), "smollm2-135m"
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(a.model_dir)).save_pretrained(out / "random")
    AutoTokenizer.from_pretrained(a.model_dir).save_pretrained(out / "random")
    return out / "random", f"{a.model_dir}'s config and tokenizer, RANDOM weights (seed 0): costs only, verdicts mean nothing"


def main() -> None:
    from posbias.scoring.encode import BATCH_TOKENS, MAX_BATCH

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10, help="examples; rows = n x the task's slots (default 10: 100 rows)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of every path (min-max printed)")
    ap.add_argument("--task", default="kv-lookup")
    ap.add_argument("--threads", type=int, default=1, help="posbias's torch threads")
    ap.add_argument("--model-dir", default=None, help="an exported model directory (default: export SmolLM2 now)")
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2",
                    help="tiny: the conformance matrix's tiny Llama (no vLLM paths)")
    ap.add_argument("--random-weights", action="store_true",
                    help="with --model-dir: its config and tokenizer, random weights (a machine the weights cannot reach)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="posbias's device (cuda: no vLLM paths)")
    ap.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto",
                    help="every path's dtype (default auto: posbias's rule, bf16 on a CPU with native bf16, else fp32; "
                         "vLLM's engine takes the same)")
    ap.add_argument("--max-batch", type=int, default=MAX_BATCH, help=f"posbias's rows per batch (default {MAX_BATCH})")
    ap.add_argument("--batch-tokens", type=int, default=BATCH_TOKENS, help=f"padded tokens per batch ({BATCH_TOKENS})")
    ap.add_argument("--floor-batch", type=int, default=None, help="sequences per raw forward (default 1 on the CPU, "
                    "--max-batch on a GPU, where batch 1 is no floor)")
    ap.add_argument("--no-vllm", action="store_true", help="posbias's paths and the floor only")
    ap.add_argument("--gpu-busy", action="store_true", help="profile each in-process path once: kernel time / wall")
    a = ap.parse_args()
    if a.random_weights and not a.model_dir:
        ap.error("--random-weights needs --model-dir (a directory with the config and tokenizer)")
    a.no_vllm = a.no_vllm or a.device == "cuda" or a.model == "tiny" or a.random_weights
    a.floor_batch = a.floor_batch or (a.max_batch if a.device == "cuda" else 1)
    sys.stdout.reconfigure(line_buffering=True)  # vLLM's workers must not inherit (and repeat) buffered lines
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from posbias import get_task

    t_start = time.perf_counter()
    from posbias.measure import choose_dtype

    a.dtype, a.dtype_why = choose_dtype(a.dtype, a.device)  # each path in its fastest dtype, vLLM's engine included
    task = get_task(a.task)
    model_dir, label = model_source(a)
    header(a, label)
    loaded, rows, paths, max_new = posbias_paths(model_dir, task, task.examples(a.n, 0, 0), task.placements("all"), a)
    print(f"rows: {len(rows)} ({a.task}, every slot x {a.n} examples), "
          f"{sum(len(r.prompt_ids) for r in rows)} prompt tokens; every path below scores these token ids; "
          "posbias warmed up on one other example (untimed)"
          + ("" if a.no_vllm else ", vLLM warms up (compiles) during its start"))
    recs = run_rounds(paths, a.rounds)
    floor, floor_fns = floor_rounds(loaded, rows, [r["prediction"] for r in paths["c"].results], a.rounds, a.floor_batch)
    recs += floor
    if not a.no_vllm:
        llm = start_vllm(model_dir, a.dtype)
        vpaths = {"e": tf_logprobs(llm, rows), "f": tf_greedy(llm, rows), "g": generate(llm, rows, task, max_new)}
        recs += run_rounds(vpaths, a.rounds, llm)
        recs.append(run_one("g*", vpaths["g"], 0, llm, reset=False))
    same = sum(x["prediction"] == y["prediction"] for x, y in zip(paths["c"].results, paths["d"].results))
    print(f"generated texts, (c) prefix-shared vs (d) plain, round 1: {same} of {len(rows)} identical")
    if a.device == "cuda":
        import torch

        print(f"GPU memory: peak {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB allocated by torch")
    if a.gpu_busy:
        gpu_busy({**paths, **floor_fns}, recs)
    report(recs, a, time.perf_counter() - t_start)


def span(xs: list[float], fmt: str) -> str:
    lo, hi = min(xs), max(xs)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{format(lo, fmt)}-{format(hi, fmt)}"


UNIT = {"cpu": ("CPU s/row", 1), "wall": ("wall ms/row", 1000)}  # a cost basis's column name and scale


def table(recs: list[dict], basis: str) -> None:
    """basis: the cost every ratio reads, "cpu" (CPU seconds, on the CPU) or "wall" (wall seconds, on a GPU)."""
    keys = list(dict.fromkeys(r["key"] for r in recs))
    by = {k: [r for r in recs if r["key"] == k] for k in keys}
    best = {}  # per protocol: the lowest CPU s per row of a cold vLLM route (its best round)
    for k in ("e", "f", "g"):
        if k in by:
            v = min(r[basis] / r["rows"] for r in by[k])
            best[PROTOCOL[k]] = min(best.get(PROTOCOL[k], v), v)
    floor = {PROTOCOL[k]: min(r[basis] / r["rows"] for r in by[k]) for k in ("Ftf", "Fgen") if k in by}  # its best
    print(f"{'path':31s} {'protocol':14s} {'cache':13s} {'rows':>4s} {'wall s':>11s} {'CPU s':>11s} {'child':>7s} "
          f"{UNIT[basis][0]:>11s} {'x best vLLM':>11s} {'x floor':>9s} {'prefix-cache hits/queried':>26s}")
    for k in keys:
        rs = by[k]
        cpr = [r[basis] / r["rows"] for r in rs]
        ratio = span([c / best[PROTOCOL[k]] for c in cpr], ".2f") if PROTOCOL[k] in best else "-"
        over = span([c / floor[PROTOCOL[k]] for c in cpr], ".2f") if PROTOCOL[k] in floor else "-"
        cache = "warm" if k == "g*" else "cold (reset)" if k in ("e", "f", "g") else "none held"
        pc = f"{rs[0]['tokens']} unique tokens" if k.startswith("F") else "in process: no cache" if rs[0]["hits"] is None else (
            f"{span([r['hits'] for r in rs], 'd')}/{span([r['queries'] for r in rs], 'd')}")
        child = span([r["child"] / r["cpu"] for r in rs if r["cpu"] > 0] or [0.0], ".0%")
        wall, cpu = span([r["wall"] for r in rs], ".1f"), span([r["cpu"] for r in rs], ".1f")
        print(f"{LABEL[k]:31s} {PROTOCOL[k]:14s} {cache:13s} {rs[0]['rows']:4d} {wall:>11s} {cpu:>11s} {child:>7s} "
              f"{span([c * UNIT[basis][1] for c in cpr], '.3f'):>11s} {ratio:>11s} {over:>9s} {pc:>26s}")


def agreement(recs: list[dict]) -> None:
    first = {}
    for r in recs:
        if r["key"] in first and r["verdicts"] != first[r["key"]]:
            print(f"note: {LABEL[r['key']]} round {r['round'] + 1} changed verdicts against its round 1")
        first.setdefault(r["key"], r["verdicts"])
    for x, y in (("f", "e"), ("f", "a"), ("e", "a"), ("a", "b"), ("g", "c"), ("c", "d")):
        if x in first and y in first:
            vx, vy = first[x], first[y]
            diff = sum(vx[k] != vy[k] for k in vy)
            acc = (sum(vx.values()) / len(vx), sum(vy.values()) / len(vy))
            print(f"agreement {x} vs {y}: {1 - diff / len(vy):.3f} of verdicts ({diff} of {len(vy)} rows differ); "
                  f"accuracy {acc[0]:.3f} vs {acc[1]:.3f}")


def report(recs: list[dict], a, total: float) -> None:
    la = os.getloadavg()
    print()
    print(f"== {a.task}, {recs[0]['rows']} rows, {a.rounds} round(s) per path (min-max over rounds) ==")
    basis = "wall" if a.device == "cuda" else "cpu"
    table(recs, basis)
    print("cache: 'cold (reset)': vLLM's prefix cache reset before every run, hits are rows of the same run sharing a "
          "prefix; (e) never reads the cache (prompt_logprobs); 'none held': posbias in process keeps no cache across "
          "paths or examples; 'warm': (g) rerun without a reset, excluded from 'x best vLLM'")
    print("CPU s: user+system of this process and all its descendants; child: the share in child processes (vLLM's "
          "EngineCore and worker); x best vLLM: CPU s/row over the cheapest cold vLLM route of the same protocol; "
          f"x floor: {basis} s/row over the raw forward of the protocol's unique tokens (F, its best round"
          f"{'; sequences batched ' + str(a.floor_batch) + ' at a time' if a.floor_batch > 1 else ''})")
    agreement(recs)
    print(f"load average at end (1/5/15 min): {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}; total run {total:.0f} s")


if __name__ == "__main__":  # vLLM spawns its workers: the guard is required
    main()
