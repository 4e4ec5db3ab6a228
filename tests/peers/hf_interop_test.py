"""Hugging Face interop, both ways, against transformers itself (peer environment).

1. transformers writes a GPT2LMHeadModel with save_pretrained(); gpt2-train --init DIR trains from
   it: coshard's first loss equals transformers' loss on the same tokens.
2. gpt2-train --save-hf DIR writes a model; GPT2LMHeadModel.from_pretrained(DIR) loads it with no
   missing or unexpected weights and gives the loss coshard gives on the same weights and tokens.
3. A config.json of another shape, or of a GPT-2 variant coshard does not compute, is refused
   before training, naming the key.

usage: <peer venv>/bin/python hf_interop_test.py GPT2_TRAIN_BIN
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop  # noqa: E402
from interop import close, write_tokens  # noqa: E402

B, T = 2, 32
SHAPE = dict(n_layer=2, n_head=4, n_embd=96, vocab_size=256, n_positions=64)
MODEL = "layers=2,heads=4,width=96,vocab=256,context=64"


def hf_loss(model_dir, tokens):
    m, info = GPT2LMHeadModel.from_pretrained(model_dir, output_loading_info=True, attn_implementation="eager")
    bad = {k: v for k, v in info.items() if v}  # missing, unexpected or mismatched weights, errors
    assert not bad, f"from_pretrained({model_dir}) reported {bad}"
    assert torch.equal(m.lm_head.weight, m.transformer.wte.weight), "the LM head is not tied to wte"
    rows = torch.tensor(np.stack([tokens[i * T:i * T + T + 1] for i in range(B)]), dtype=torch.long)
    with torch.no_grad():
        return m.eval()(rows, labels=rows).loss.item()


def coshard_loss(train, data, *args):
    return interop.coshard_loss(train, data, B, T, "--model", MODEL, *args)


def main():
    train = sys.argv[1]
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp(prefix="coshard-hf-"))
    try:
        tokens = np.random.default_rng(1).integers(0, 256, size=B * T + 1)
        data = work / "tokens.bin"
        write_tokens(data, tokens)

        theirs = work / "theirs"
        GPT2LMHeadModel(GPT2Config(**SHAPE)).save_pretrained(theirs)
        ours_loss, _ = coshard_loss(train, data, "--init", str(theirs))
        close(ours_loss, hf_loss(theirs, tokens), "transformers' save_pretrained -> gpt2-train --init")

        ours = work / "ours"
        _, out = coshard_loss(train, data, "--init", str(theirs), "--save-hf", str(ours))
        assert "Hugging Face" in out, out
        again, _ = coshard_loss(train, data, "--init", str(ours))
        close(again, hf_loss(ours, tokens), "gpt2-train --save-hf -> from_pretrained")

        cfg = json.loads((ours / "config.json").read_text())
        for key, value, words in (("n_layer", 3, "give --model layers=3,heads=4,width=96,vocab=256,context=64"),
                                  ("activation_function", "relu", "\"activation_function\" is \"relu\""),
                                  ("scale_attn_by_inverse_layer_idx", True, "\"scale_attn_by_inverse_layer_idx\" is true")):
            (work / "bad").mkdir(exist_ok=True)
            shutil.copy(ours / "model.safetensors", work / "bad" / "model.safetensors")
            (work / "bad" / "config.json").write_text(json.dumps({**cfg, key: value}))
            r = subprocess.run([train, "--model", MODEL, "--data", str(data), "--steps", "1", "--metrics-port", "0",
                                "--init", str(work / "bad")], capture_output=True, text=True)
            assert r.returncode != 0 and words in r.stderr, f"{key}={value}: rc {r.returncode}\n{r.stdout}{r.stderr}"
            assert '"step"' not in r.stdout, f"{key}={value}: training started:\n{r.stdout}"
            print(f"config.json with {key} = {value}: refused ({words})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("hf interop: PASS")


if __name__ == "__main__":
    main()
