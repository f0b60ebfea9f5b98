"""The Engram compressed token map phi of a tokenizer.json (spec deepseek-v41.md §4.2).

For each token id alone: decode it with the raw `tokenizers` backend keeping special tokens; if
the text contains U+FFFD the key is the raw vocabulary string; otherwise the key is the text
normalised NFKC -> NFD -> strip accents -> lowercase -> runs of space/tab/CR/LF collapsed to one
space -> (a lone space is protected) -> strip, falling back to the raw text when that is empty.
Ids with equal keys share a compressed id, numbered in order of first occurrence.

Writes {"compressed_vocab_size": n, "pad_id": phi(2), "token_map": [...]} as JSON; the C++
engine reads it (model_v41::load_engram_token_map) because it has no NFKC tables of its own.

Usage: python tools/reference/v41/engram_token_map.py TOKENIZER_JSON VOCAB_SIZE OUT_JSON
"""

from __future__ import annotations

import json
import sys

from tokenizers import Regex, Tokenizer, normalizers

PROTECT = "\ue000"  # a private-use character standing in for a lone space during Strip


def key_normalizer():
    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), PROTECT),
            normalizers.Strip(),
            normalizers.Replace(PROTECT, " "),
        ]
    )


def token_map(tok: Tokenizer, vocab_size: int):
    norm = key_normalizer()
    ids, keys = [], {}
    for i in range(vocab_size):
        text = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(i)
        else:
            key = norm.normalize_str(text) or text
        ids.append(keys.setdefault(key, len(keys)))
    return ids, len(keys)


def main():
    path, vocab, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    tok = Tokenizer.from_file(path)
    phi, n = token_map(tok, vocab)
    with open(out, "w") as f:
        json.dump({"compressed_vocab_size": n, "pad_id": phi[2], "token_map": phi}, f)
    print(f"{path}: {vocab} ids -> {n} compressed ids (phi(2) = {phi[2]})")


if __name__ == "__main__":
    main()
