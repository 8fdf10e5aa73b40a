"""The de-quantized GGUF cache (models/load.py): where it lives, what its key covers, and that a load from it is the
GGUF load, bit for bit (weights, logits, tokenizer, generation config, the run record's model block)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from posbias.models.gguf_cache import READY, cache_root, gguf_cache_dir
from posbias.models.load import load_model


def test_the_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("POSBIAS_NO_CACHE", raising=False)
    monkeypatch.setenv("POSBIAS_CACHE_DIR", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv("POSBIAS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" / "posbias"
    monkeypatch.setenv("POSBIAS_NO_CACHE", "1")
    assert cache_root() is None and gguf_cache_dir(str(tmp_path), "m.gguf", "bf16") is None


def test_the_key_changes_with_the_file_the_dtype_and_the_converter(monkeypatch, tmp_path):
    import transformers

    monkeypatch.delenv("POSBIAS_NO_CACHE", raising=False)
    monkeypatch.setenv("POSBIAS_CACHE_DIR", str(tmp_path / "c"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF1")
    key = gguf_cache_dir(str(tmp_path), "m.gguf", "bf16")
    assert key.parent == tmp_path / "c" / "gguf" and key == gguf_cache_dir(str(tmp_path), "m.gguf", "bf16")
    assert gguf_cache_dir(str(tmp_path), "m.gguf", "fp32") != key
    monkeypatch.setattr(transformers, "__version__", "0.0.1")
    assert gguf_cache_dir(str(tmp_path), "m.gguf", "bf16") != key
    monkeypatch.undo()
    monkeypatch.setenv("POSBIAS_CACHE_DIR", str(tmp_path / "c"))
    f.write_bytes(b"GGUF22")  # a new file in the same place
    assert gguf_cache_dir(str(tmp_path), "m.gguf", "bf16") != key


@pytest.mark.real
def test_a_cached_load_is_the_gguf_load_and_a_damaged_cache_is_rebuilt(monkeypatch, tmp_path):
    """One GGUF read of SmolLM2: a damaged cache directory (marked ready, config unreadable) is dropped and the GGUF
    file read; what that read gave is written; the next load comes from the cache alone (reading the GGUF file
    would fail) and equals it in every tensor, the logits, the tokenizer and the recorded model."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    monkeypatch.delenv("POSBIAS_NO_CACHE", raising=False)
    monkeypatch.setenv("POSBIAS_CACHE_DIR", str(tmp_path))
    from posbias.models.load import _source

    src, gguf, _, _ = _source("smollm2-135m")
    d = gguf_cache_dir(src, gguf, "bf16")
    d.mkdir(parents=True)
    (d / READY).write_text("1\n")
    (d / "config.json").write_text("{ not json")
    read = load_model("smollm2-135m", "bf16", "cpu", progress=False)
    assert (d / READY).exists() and (d / "model.safetensors").exists() and not list(tmp_path.glob("gguf/*.tmp-*"))

    def no_gguf(*a, **k):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", no_gguf)
    cached = load_model("smollm2-135m", "bf16", "cpu", progress=False)
    a, b = read.model.state_dict(), cached.model.state_dict()
    assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(5, 40000, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(read.model(input_ids=ids).logits, cached.model(input_ids=ids).logits)
    msgs = [{"role": "user", "content": "Document [3]: the value of key 8a7f-2b is 1234.\nWhat is the value of 8a7f-2b?"}]
    assert read.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == \
        cached.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    text = read.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert read.tokenizer(text).input_ids == cached.tokenizer(text).input_ids
    assert (read.tokenizer.pad_token_id, read.tokenizer.eos_token_id) == (cached.tokenizer.pad_token_id,
                                                                          cached.tokenizer.eos_token_id)
    assert read.model.generation_config.to_dict() == cached.model.generation_config.to_dict()
    assert read.info == cached.info and read.model.config.to_dict() == cached.model.config.to_dict()


@pytest.mark.parametrize("locked", [True, False])
def test_two_loads_started_together_read_the_gguf_file_once(monkeypatch, tmp_path, locked):
    """Two loads of one GGUF file at once (two commands on a new machine, a sweep beside a vLLM export, two test
    workers): one de-quantizes the file and writes the cache while the other waits for its lock, then reads the cache.
    The file's read is a tiny model directory standing in, slowed so that the second load starts during it; without
    the lock (locked=False) both read the file, which is what the test would catch."""
    import contextlib
    import threading
    import time

    import transformers

    import posbias.models.load as load
    from conftest import save_tiny_llama

    monkeypatch.delenv("POSBIAS_NO_CACHE", raising=False)
    monkeypatch.setenv("POSBIAS_CACHE_DIR", str(tmp_path / "c"))
    src = save_tiny_llama(tmp_path / "m")
    (src / "m.gguf").write_bytes(b"GGUF")  # the file the cache's key names
    monkeypatch.setattr(load, "_source", lambda name: (str(src), "m.gguf", "path", {}))
    if not locked:
        monkeypatch.setattr(load, "converting", lambda d, progress: contextlib.nullcontext())
    real, reads = transformers.AutoModelForCausalLM.from_pretrained, []

    def read(path, *a, **k):
        if str(path) == str(src):  # the GGUF file's read, not the cache's
            reads.append(threading.get_ident())
            time.sleep(1.0)
        return real(path, *a, **k)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", read)
    got = [None, None]

    def run(i):
        got[i] = load.load_model("m", "fp32", "cpu", progress=False)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join()
    assert len(reads) == (1 if locked else 2), reads
    assert (gguf_cache_dir(str(src), "m.gguf", "fp32") / READY).exists()
    a, b = (g.model.state_dict() for g in got)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: the 256 base tokens of a byte-level BPE vocabulary."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in keep]
    return [chr(b) for b in keep] + [chr(256 + i) for i in range(len(moved))]


def _tiny_gguf(path):
    """A 2-layer Llama GGUF file written with gguf-py: a byte-level BPE vocabulary of 264 tokens with a chat template,
    some tensors quantized to Q8_0, tied embeddings. Loads in a few seconds, through transformers' own GGUF path."""
    import gguf
    import numpy as np

    H, FF, L, NH, NKV = 32, 64, 2, 4, 2
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_chars(), "Ġt", "he", "Ġthe", "in", "Ġa"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_feed_forward_length(FF)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_dimension_count(H // NH)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    rng = np.random.default_rng(0)

    def tensor(name, *shape, q8=False):
        a = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if q8:
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)

    tensor("token_embd.weight", len(tokens), H, q8=True)
    for i in range(L):
        tensor(f"blk.{i}.attn_norm.weight", H)
        tensor(f"blk.{i}.ffn_norm.weight", H)
        tensor(f"blk.{i}.attn_q.weight", H, H, q8=True)
        tensor(f"blk.{i}.attn_k.weight", H * NKV // NH, H, q8=True)
        tensor(f"blk.{i}.attn_v.weight", H * NKV // NH, H)
        tensor(f"blk.{i}.attn_output.weight", H, H, q8=True)
        tensor(f"blk.{i}.ffn_gate.weight", FF, H, q8=True)
        tensor(f"blk.{i}.ffn_up.weight", FF, H)
        tensor(f"blk.{i}.ffn_down.weight", H, FF, q8=True)
    tensor("output_norm.weight", H)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_shared_reads_parse_the_file_once_and_load_the_same_model(monkeypatch, tmp_path):
    """models/gguf_cache.py `shared_reads`: the GGUF path's three reads of a file become one parse and one tensor-name
    map per architecture, and the model, config and tokenizer are those of transformers' own path, bit for bit; the
    gguf module's functions are its own again afterwards."""
    import gguf
    import transformers.modeling_gguf_pytorch_utils as hf_gguf

    import posbias.models.load as load

    monkeypatch.setenv("POSBIAS_NO_CACHE", "1")
    f = _tiny_gguf(tmp_path / "tiny.gguf")
    counts = {"reader": 0, "names": 0, "metadata": 0}

    def counted(module, attr, what, when=lambda *a, **k: True):
        real = getattr(module, attr)

        def call(*a, **k):
            counts[what] += bool(when(*a, **k))
            return real(*a, **k)

        monkeypatch.setattr(module, attr, call)
        return call

    funcs = [counted(gguf, "GGUFReader", "reader"), counted(gguf, "get_tensor_name_map", "names"),
             counted(hf_gguf, "load_gguf_checkpoint", "metadata", lambda p, return_tensors=False, **k: not return_tensors)]
    shared = load.load_model(str(f), "fp32", progress=False)
    seen = dict(counts)
    assert [gguf.GGUFReader, gguf.get_tensor_name_map, hf_gguf.load_gguf_checkpoint] == funcs  # put back
    monkeypatch.setattr(load, "shared_reads", contextlib.nullcontext)  # transformers' own path
    plain = load.load_model(str(f), "fp32", progress=False)
    assert seen == {"reader": 1, "names": 1, "metadata": 1}
    assert counts["reader"] - seen["reader"] == 3 and counts["names"] - seen["names"] > 3
    assert counts["metadata"] - seen["metadata"] >= 2
    a, b = shared.model.state_dict(), plain.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert shared.model.config.to_dict() == plain.model.config.to_dict()
    msgs = [{"role": "user", "content": "the value is in the text"}]
    text = plain.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert shared.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == text
    assert shared.tokenizer(text).input_ids == plain.tokenizer(text).input_ids
    assert len(plain.tokenizer(" the").input_ids) == 1  # the merges reached the tokenizer


def test_shared_reads_step_aside_when_a_library_lacks_what_they_share(monkeypatch):
    """A gguf release without get_tensor_name_map (or a transformers without load_gguf_checkpoint) loads through the
    library's own path: the block runs, nothing is swapped."""
    import gguf

    from posbias.models.gguf_cache import shared_reads

    monkeypatch.delattr(gguf, "get_tensor_name_map")
    reader = gguf.GGUFReader
    with shared_reads():
        assert gguf.GGUFReader is reader
    assert gguf.GGUFReader is reader and not hasattr(gguf, "get_tensor_name_map")
