"""Hugging Face Llama interop, both ways, against transformers itself (peer environment).

1. transformers writes a LlamaForCausalLM with save_pretrained(); gpt2-train --init DIR, with no
   --model (the directory says what it is), trains from it: coshard's first loss equals
   transformers' loss on the same tokens.
2. gpt2-train --save-hf DIR writes the model after a step; LlamaForCausalLM.from_pretrained(DIR)
   loads it with no missing or unexpected weights and gives the loss coshard gives on it.
Both for an untied model with grouped-query attention and for a tied one with one key/value head
and Llama 3.1's rope scaling (its original context shorter than the sequence, so that it acts).
3. A config.json with a key coshard does not compute is refused before training, naming the key.

usage: <peer venv>/bin/python hf_llama_test.py GPT2_TRAIN_BIN
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop  # noqa: E402
from interop import close, write_tokens  # noqa: E402

B, T, VOCAB = 2, 32, 300
# Queries and keys scaled up so that attention, and with it RoPE (theta, the llama3 scaling), moves
# the loss well beyond the tolerance: with rope_theta read wrong the loss moved 1.5e-6 at the initial
# scale, inside it.
QK_SCALE = 30.0
SHAPES = {
    "untied, 2 key/value heads": dict(num_key_value_heads=2, tie_word_embeddings=False),
    "tied, 1 key/value head, llama3 rope scaling": dict(
        num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16}),
}
COMMON = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=100, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64, rms_norm_eps=1e-5)


def hf_loss(model_dir, tokens, tied):
    m, info = LlamaForCausalLM.from_pretrained(model_dir, output_loading_info=True, attn_implementation="eager",
                                               dtype=torch.float32)
    bad = {k: v for k, v in info.items() if v}  # missing, unexpected or mismatched weights, errors
    assert not bad, f"from_pretrained({model_dir}) reported {bad}"
    assert torch.equal(m.lm_head.weight, m.model.embed_tokens.weight) == tied, "the LM head's tying is not the config's"
    rows = torch.tensor(np.stack([tokens[i * T:i * T + T + 1] for i in range(B)]), dtype=torch.long)
    with torch.no_grad():
        return m.eval()(rows, labels=rows).loss.item()


def coshard_loss(train, data, *args):
    return interop.coshard_loss(train, data, B, T, *args)


def main():
    train = sys.argv[1]
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp(prefix="coshard-hf-llama-"))
    try:
        tokens = np.random.default_rng(1).integers(0, VOCAB, size=B * T + 1)
        data = work / "tokens.bin"
        write_tokens(data, tokens)
        for name, extra in SHAPES.items():
            tied = extra["tie_word_embeddings"]
            theirs, ours = work / "theirs", work / "ours"
            model = LlamaForCausalLM(LlamaConfig(**COMMON, **extra))
            with torch.no_grad():  # at the initial 0.02 scale attention is near uniform and RoPE barely counts
                for layer in model.model.layers:
                    layer.self_attn.q_proj.weight.mul_(QK_SCALE)
                    layer.self_attn.k_proj.weight.mul_(QK_SCALE)
            model.save_pretrained(theirs)
            ours_loss, _ = coshard_loss(train, data, "--init", str(theirs))
            close(ours_loss, hf_loss(theirs, tokens, tied), f"{name}: save_pretrained -> gpt2-train --init")
            _, out = coshard_loss(train, data, "--init", str(theirs), "--save-hf", str(ours))
            assert "LlamaForCausalLM.from_pretrained" in out, out
            again, _ = coshard_loss(train, data, "--init", str(ours))
            close(again, hf_loss(ours, tokens, tied), f"{name}: gpt2-train --save-hf -> from_pretrained")
            shutil.rmtree(theirs)
            shutil.rmtree(ours)

        LlamaForCausalLM(LlamaConfig(**COMMON, attention_bias=True)).save_pretrained(work / "bad")
        r = subprocess.run([train, "--data", str(data), "--steps", "1", "--metrics-port", "0", "--init",
                            str(work / "bad")], capture_output=True, text=True)
        words = "\"attention_bias\" is true"
        assert r.returncode != 0 and words in r.stderr, f"attention_bias: rc {r.returncode}\n{r.stdout}{r.stderr}"
        assert '"step"' not in r.stdout, f"attention_bias: training started:\n{r.stdout}"
        print(f"config.json with attention_bias = true: refused ({words})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("hf llama interop: PASS")


if __name__ == "__main__":
    main()
