"""Text files to llm.c token files (scripts/prepare-data is the entry point and says how to call it).

bytes: one token per byte, with the standard library only. bpe: Hugging Face tokenizers' byte-level
BPE trained on the files (the GPT-2 scheme: bytes mapped to printable characters, then merges),
with <|endoftext|> (the last id) between files, as GPT-2 separates documents.
"""
import argparse
import array
import os
import struct
import sys

# llm.c's two formats (its dev/data/data_common.py): GPT-2's uint16 tokens and Llama 3's uint32.
U16 = (20240520, 1, "H")
U32 = (20240801, 7, "I")
EOT = "<|endoftext|>"


def fail(msg):
    print(f"prepare-data: {msg}", file=sys.stderr)
    sys.exit(2)


def write_llmc(path, tokens, vocab):
    """llm.c's format: 256 int32 header (magic, version, count), then the tokens, uint16 when the
    vocabulary's ids fit them, else uint32; atomic."""
    magic, version, code = U16 if vocab <= 1 << 16 else U32
    body = array.array(code, tokens)
    assert body.itemsize == (2 if code == "H" else 4)
    if sys.byteorder != "little":
        body.byteswap()
    header = struct.pack("<3i", magic, version, len(tokens)) + bytes(4 * 253)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(body.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def bpe_tokens(files, texts, vocab_size, out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train(files, trainer)
    tok.add_special_tokens([EOT])
    eot = tok.token_to_id(EOT)
    tokens = []
    for text in texts:
        tokens += tok.encode(text).ids + [eot]
    tok.save(os.path.join(out, "tokenizer.json"))
    return tokens, tok.get_vocab_size()


def main():
    ap = argparse.ArgumentParser(prog="scripts/prepare-data")
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--tokenizer", choices=["bytes", "bpe"], default="bytes")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--val-fraction", type=float, default=0.1)
    a = ap.parse_args()
    if not 0 <= a.val_fraction < 1:
        fail(f"--val-fraction {a.val_fraction} is not in [0, 1)")
    if a.tokenizer == "bpe" and not 257 <= a.vocab_size <= 1 << 24:
        fail(f"--vocab-size {a.vocab_size} is not in [257, 16777216]")
    texts = []
    for f in a.files:
        try:
            with open(f, "rb") as fh:
                texts.append(fh.read())
        except OSError as e:
            fail(f"cannot read {f}: {e.strerror}")
    os.makedirs(a.out, exist_ok=True)
    if a.tokenizer == "bytes":
        tokens, vocab = [b for t in texts for b in t], 256
    else:
        decoded = [t.decode("utf-8", errors="replace") for t in texts]
        tokens, vocab = bpe_tokens(a.files, decoded, a.vocab_size, a.out)
    n_val = int(len(tokens) * a.val_fraction)
    train, val = tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]
    if len(train) < 2:
        fail(f"{len(tokens)} tokens in all: too few to train on")
    write_llmc(os.path.join(a.out, "train.bin"), train, vocab)
    flags = f"--model tiny,vocab={vocab} --data {a.out}/train.bin"
    if val:
        write_llmc(os.path.join(a.out, "val.bin"), val, vocab)
        flags += f" --val-data {a.out}/val.bin --eval-every 100"
    if a.tokenizer == "bpe":
        flags += f" --tokenizer {a.out}/tokenizer.json"
    print(f"prepare-data: {sum(map(len, texts))} bytes in {len(a.files)} file(s) -> {len(train)} training and "
          f"{len(val)} validation tokens ({a.tokenizer}, vocabulary {vocab}) in {a.out}")
    print(f"train with: gpt2-train {flags}")


if __name__ == "__main__":
    main()
