#!/usr/bin/env python3
"""Writes tests/fixtures/gguf-spm/: a SentencePiece-style GGUF vocabulary (`tokenizer.ggml.model =
llama`, what Llama 2, Mistral v0.1 and TinyLlama files carry) and the token ids the original
SentencePiece library gives for a few hard strings through it, which worker/tests/gguf.rs requires
ringserve's to equal.

The vocabulary is a 1,000-piece BPE model trained here with the `sentencepiece` package on this
repository's docs, with Llama 2's settings (BPE, byte fallback, digits split, a dummy prefix, no
whitespace folding, identity normalisation). It is written as llama.cpp's converter
(`convert_hf_to_gguf.py`, `_set_vocab_sentencepiece`) writes a `tokenizer.model`: every piece with
its score and type (normal, unknown, control, byte), BOS/EOS/UNK ids, add-BOS on, add-space-prefix
from the model's normaliser. SentencePiece's own encoding (no BOS; ringserve's tokenizer adds BOS
only through its post-processor) is the reference.

    pip install --target /tmp/spm_py sentencepiece gguf
    PYTHONPATH=/tmp/spm_py python3 scripts/make_gguf_spm.py
"""
import json
import pathlib
import tempfile

import gguf
import sentencepiece as spm

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/fixtures/gguf-spm"
CORPUS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
TEXTS = [
    "Hello world! It's 2026; DON'T you think 1234567 > 89?",
    "  leading spaces,\ttabs\n\nand\r\nnewlines   trailing  ",
    "Ünïcödé café — naïve 日本語 🎉 x²+y²",
    "the tokenizer streams tokens through shared-memory rings",
    " ",
    "",
    "ring\u00a0buffer",
]
DUMMY_PREFIX = True  # Llama 2's: a space before the text
# llama.cpp's token types.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = f"{tmp}/spm"
        spm.SentencePieceTrainer.train(
            input=",".join(str(p) for p in CORPUS), model_prefix=prefix, vocab_size=1000,
            model_type="bpe", byte_fallback=True, split_digits=True, add_dummy_prefix=DUMMY_PREFIX,
            remove_extra_whitespaces=False, normalization_rule_name="identity",
            character_coverage=0.9995, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            allow_whitespace_only_pieces=True, minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i)
                     else UNUSED if sp.is_unused(i) else BYTE if sp.is_byte(i) else NORMAL)
    w = gguf.GGUFWriter(str(OUT / "vocab.gguf"), "llama")
    w.add_name("ringserve SentencePiece vocabulary fixture")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(DUMMY_PREFIX)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ids = [sp.encode(t) for t in TEXTS]
    (OUT / "expected.json").write_text(json.dumps({
        "made_by": f"sentencepiece {spm.__version__}", "texts": TEXTS, "ids": ids,
        "pieces": [[sp.id_to_piece(i) for i in x] for x in ids]}, ensure_ascii=False, indent=1) + "\n")
    print(OUT / "vocab.gguf", (OUT / "vocab.gguf").stat().st_size, "bytes;", ids[0])


if __name__ == "__main__":
    main()
