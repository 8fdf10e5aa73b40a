"""The conformance matrix's tiny models, apart from the fixtures: a character tokenizer and small random causal LMs
built from configs (no weights to download). conftest.py re-exports them for the tests; benchmarks/backend_speed.py
imports this module directly (it runs where pytest and the test plugin are not installed)."""

from __future__ import annotations

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def char_tokenizer(chat: bool = True):
    """A character-level fast tokenizer (printable ASCII + newline), no files needed."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<bos>", "<eos>"]
    chars = ["\n"] + [chr(i) for i in range(32, 127)]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    )
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_model(arch: str, vocab: int, max_pos: int = 2048, seed: int = 0, layers: int = 2, kv_heads: int = 2):
    """A small random causal LM of the given family (2 layers, 4 query heads over `kv_heads` KV heads by default),
    fp32, eval mode."""
    import transformers as tf

    common = dict(vocab_size=vocab, pad_token_id=0, bos_token_id=2, eos_token_id=3)
    if arch == "gpt2":
        cfg = tf.GPT2Config(n_embd=64, n_layer=layers, n_head=4, n_positions=max_pos, **common)
    else:
        cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig, "gemma3": tf.Gemma3TextConfig}[arch]
        extra = {} if arch != "gemma3" else dict(  # Gemma-3's two RoPE kinds; a window short enough to matter
            head_dim=16, sliding_window=8, layer_types=(["sliding_attention"] * (layers - 1) + ["full_attention"]),
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})
        cfg = cls(**extra,
            hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=kv_heads, max_position_embeddings=max_pos, **common,
        )
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    # Random init gives near-uniform logits; scale the output layer so greedy choices are decisive.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)
    return model


def save_tiny_llama(d):
    """A tiny Llama with q.k sharpened x16 (so the gold position changes the output), saved as an HF dir."""
    lo = tiny_loaded("llama")
    with torch.no_grad():
        for layer in lo.model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4)
            layer.self_attn.k_proj.weight.mul_(4)
    lo.model.save_pretrained(d)
    lo.tokenizer.save_pretrained(d)
    return d


def tiny_loaded(arch: str = "llama", chat: bool = True, max_pos: int = 2048):
    from posbias.models.compat import install_grouped_sdpa
    from posbias.models.load import Loaded

    install_grouped_sdpa()  # as load_model and wrap_model do: a test on this model runs alone as in the suite
    tok = char_tokenizer(chat)
    model = tiny_model(arch, len(tok), max_pos)
    info = {"name": f"tiny-{arch}", "context_window": max_pos, "dtype": "fp32", "device": "cpu"}
    return Loaded(model=model, tokenizer=tok, info=info)
