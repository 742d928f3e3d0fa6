"""The built-in tiny trainer: a seeded Qwen3-architecture model with LoRA, learning 2-digit addition.

Used by `hilo produce` (a standalone producer process) and `hilo demo`. No downloads: the model is
built from a config and its base weights from a seed, so every machine builds the same one.
"""
import time

import torch


TOKENS = list("0123456789+=;") + ["<pad>"]
PAD = len(TOKENS) - 1
STOI = {t: i for i, t in enumerate(TOKENS)}


def build_base(seed: int = 0, hidden: int = 256, layers: int = 4):
    """A tiny Qwen3 causal LM whose weights come from `seed` (the same on every machine)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(TOKENS), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=32,
                      tie_word_embeddings=True, pad_token_id=PAD, bos_token_id=PAD, eos_token_id=STOI[";"])
    model = Qwen3ForCausalLM(cfg)
    model.name_or_path = f"hilo/tiny-qwen3-s{seed}-h{hidden}-l{layers}"  # what PEFT records as base_model_name_or_path
    return model


def build_tokenizer():
    """A character-level tokenizer for TOKENS, as a transformers tokenizer (TRL and vLLM need one)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=STOI, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[0-9+=;]"), "isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token=";", bos_token=None,
                                   padding_side="left", model_max_length=32)


def build_model(seed: int = 0, rank: int = 16, hidden: int = 256, layers: int = 4):
    """build_base(seed) wrapped in a PEFT LoRA of `rank` on all 7 projections."""
    return with_lora(build_base(seed, hidden, layers), rank)


def with_lora(base, rank: int = 16):
    """`base` wrapped in a PEFT LoRA of `rank` on all 7 projections, B drawn small and seeded (not zero)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(base, lora)
    with torch.no_grad():  # PEFT starts B at zero; a small random B makes every block's gradient non-trivial
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)
    return model


def batch(gen: torch.Generator, size: int = 32):
    """(input_ids, labels) for 'ab+cd=sum;' with loss on the answer only."""
    a = torch.randint(0, 100, (size,), generator=gen)
    b = torch.randint(0, 100, (size,), generator=gen)
    rows = [f"{x:02d}+{y:02d}={x + y:03d};" for x, y in zip(a.tolist(), b.tolist())]
    ids = torch.tensor([[STOI[c] for c in r] for r in rows])
    labels = ids.clone()
    labels[:, :6] = -100  # prompt "ab+cd=" is not predicted
    return ids, labels


def train(producer, steps: int, lr: float = 3e-3, seed: int = 0, on_step=None):
    """Run `steps` training steps through `producer` (a HiLoProducer); returns the final loss."""
    gen = torch.Generator().manual_seed(seed + 1000 * producer.version)  # a resumed trainer draws fresh batches
    model = producer.model
    model.train()
    loss = float("nan")
    for _ in range(steps):
        t0 = time.perf_counter()
        ids, labels = batch(gen)
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        compute_s = time.perf_counter() - t0
        loss = float(out.loss.detach())
        version = producer.step(lr=lr, meta={"loss": round(loss, 5)})
        if on_step:
            on_step(version, loss, compute_s, producer.last_step)
    return loss


def save_base(out_dir, seed: int = 0, hidden: int = 256, layers: int = 4) -> str:
    """build_base(...) and its tokenizer as a normal transformers directory (what vLLM loads); returns the dir."""
    return save_for_vllm(build_base(seed, hidden, layers), out_dir)


def save_for_vllm(model, out_dir) -> str:
    """A base model and the tokenizer as a transformers directory (what vLLM loads), written whole or not at all."""
    import os
    import pathlib
    out = pathlib.Path(out_dir)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    model.generation_config.pad_token_id = PAD
    model.save_pretrained(tmp)
    build_tokenizer().save_pretrained(tmp)
    tmp.rename(out)
    return str(out)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="Save the tiny Qwen3 base model (and tokenizer) as a transformers "
                                             "directory.")
    ap.add_argument("out", help="directory to write")
    ap.add_argument("--seed", type=int, default=0, help="base weights seed (default: %(default)s)")
    ap.add_argument("--hidden", type=int, default=256, help="hidden size (default: %(default)s)")
    ap.add_argument("--layers", type=int, default=4, help="layers (default: %(default)s)")
    a = ap.parse_args()
    print(save_base(a.out, a.seed, a.hidden, a.layers))
