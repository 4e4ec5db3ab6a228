"""What the Hugging Face interop peer tests share: an llm.c token file, gpt2-train's first loss, and
the comparison with transformers' loss."""
import json
import subprocess

import numpy as np

TOL = 1e-5


def write_tokens(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())


def coshard_loss(train, data, batch, seq, *args):
    """gpt2-train's loss at step 1 (before any update) on one thread, and its output."""
    r = subprocess.run([train, "--data", str(data), "--steps", "1", "--batch", str(batch), "--seq", str(seq),
                        "--metrics-port", "0", "--samples", "0", "--threads", "1", "--log-json", "-", *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"gpt2-train {' '.join(args)} failed:\n{r.stdout}{r.stderr}"
    return json.loads(next(l for l in r.stdout.splitlines() if l.startswith('{"step"')))["loss"], r.stdout


def close(a, b, what):
    rel = abs(a - b) / abs(b)
    print(f"{what}: coshard {a:.9f}, transformers {b:.9f}, relative difference {rel:.1e}")
    assert rel <= TOL, f"{what}: relative difference {rel:.2e} over {TOL}"
