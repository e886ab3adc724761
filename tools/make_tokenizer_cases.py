#!/usr/bin/env python3
# Makes the tokenizer fixtures under tests/fixtures/tokenizer-seq/: trains tiny byte-level BPE tokenizers with the
# Hugging Face `tokenizers` package (pip install tokenizers) using real-model-style pipelines, and records what
# `tokenizers` itself computes for a set of texts. Python is only used to make fixtures, never by strata.
#
#   python3 tools/make_tokenizer_cases.py --out tests/fixtures/tokenizer-seq
#   python3 tools/make_tokenizer_cases.py --out /tmp/fuzz --fuzz 3000   # many random texts, for local checks
import argparse
import json
import os
import random

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import AddedToken

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.", "I'm sure they'll say it's fine, we've done it.",
    "HE'S SAYING THEY'LL COME, DON'T WORRY.", "def main(argv):\n    return run(argv[1:]) or 0\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }", "SELECT id, name FROM users WHERE age >= 21;",
    "Prices rose 3.5% to $1,234.56 in 2024; 10000000 units shipped.", "Ciao! Come posso aiutarti oggi? perché così",
    "Über die Brücke gehen Mädchen und Jungen.", "Le café était très bon, n'est-ce pas ?",
    "日本語のテキストと中文混合の文章です。", "我们今天去公园散步，天气很好。", "カタカナとひらがなを混ぜる",
    "Тест на русском языке, и ещё немного текста.", "عربي نص مع بعض الكلمات", "한국어 문장도 조금 넣습니다.",
    "emoji 😊🚀 mixed ✓ ok 👩‍💻 family 👨‍👩‍👧", "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ and ①②③ ½ ﬁ ligature",
    "tabs\tand\r\nwindows newlines\n\n\nend", "  leading   and trailing spaces  ",
    "math: ∑ x_i² ≤ ∞, α+β=γ, ℌ𝔢𝔩𝔩𝔬", "İstanbul ıı ß ſ K Å", "snake_case and camelCase and kebab-case",
    "<think>\nreasoning here\n</think>\nanswer", "https://example.com/path?q=1&r=two#frag",
]

SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|im_start|>", "<|im_end|>"]


def corpus(rng):
    words = " ".join(SENTENCES).split()
    out = list(SENTENCES) * 20
    for _ in range(3000):
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))))
    return out


def byte_level_trainer(vocab_size, specials):
    return trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def added_tokens():
    # Non-special added tokens with the matching options that exist (normalized ones are matched after
    # normalization, the others in the raw text).
    return [AddedToken("<think>", special=False, normalized=False),
            AddedToken("</think>", special=False, normalized=False),
            AddedToken("<tool>", special=False, lstrip=True, rstrip=True, normalized=False),
            AddedToken("NOTE", special=False, single_word=True, normalized=True),
            AddedToken("[mask]", special=True, lstrip=True, normalized=True)]


def deepseek_v3(rng):
    """DeepSeek-V3's pipeline: empty normalizer sequence, three Split pre-tokenizers + ByteLevel, BOS template."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex("[一-龥\u3040-ゟ゠-ヿ]+"), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
                                   "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
                             behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(rng), byte_level_trainer(1200, SPECIAL[:2]))
    tok.add_tokens(added_tokens())
    bos = SPECIAL[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def llama3_style(rng):
    """NFKC + Lowercase normalizers, Digits + ByteLevel(prefix space, GPT-2 regex), ignore_merges, a
    Sequence[ByteLevel, TemplateProcessing] post-processor with BOS and EOS, merges written as "a b" strings."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
    ])
    tok.decoder = decoders.Sequence([decoders.ByteLevel()])
    tok.train_from_iterator(corpus(rng), byte_level_trainer(900, SPECIAL[2:]))
    tok.add_tokens(added_tokens())
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|im_start|> $A <|im_end|>", special_tokens=[
            ("<|im_start|>", tok.token_to_id("<|im_start|>")), ("<|im_end|>", tok.token_to_id("<|im_end|>"))]),
    ])
    return tok


def split_behaviors(rng):
    """Every Split behavior, invert, String patterns, and the NFD / Strip / Replace / Prepend normalizers."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Replace("``", '"'),
                                           normalizers.Replace(Regex(r"\s{3,}"), "  "),
                                           normalizers.Strip(left=False, right=True), normalizers.Prepend("^")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[,.;:!?]"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"[\r\n]+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="isolated", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(rng), byte_level_trainer(700, SPECIAL[2:]))
    tok.add_tokens(added_tokens())
    return tok


def random_text(rng):
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  \t\n\r",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "'s't're've'm'll'd'S'T'LL", "éèêëàâäôöûüçñÀÉÎÕÜßæøåÅ",
        "\u0301\u0308\u0327\u20dd", "日本語中文混合漢字", "ひらがなカタカナー", "한국어문장", "Теструсский", "عربينص",
        "😊🚀👩‍💻✓★", "ＦＵＬＬｗｉｄｔｈ①½ﬁ", "\u00a0\u2003\u3000\u0085\u2028\u200b\u200d", "İıſKΣσς",
        "𝔢𝔩𝔬𝟙𝟚", "\u0660\u0661\u0966\u00b2\u2167",
    ]
    specials = SPECIAL + ["<think>", "</think>", "<tool>", "NOTE", "[mask]", "[MASK]", "``"]
    out = []
    for _ in range(rng.randint(0, 12)):
        r = rng.random()
        if r < 0.08:
            out.append(rng.choice(specials))
        else:
            pool = rng.choice(pools)
            out.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
    return "".join(out)


FIXED_TEXTS = SENTENCES + [
    "", " ", "\n", "   ", "a", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "1234567890 12 1 123456",
    "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>", "<|im_start|>user\nhi<|im_end|>\n",
    "before <tool>  after", "a NOTE here, aNOTE, NOTEb, NOTE", "x [mask] y  [MASK]", "<think></think>",
    "café cafe\u0301 Å A\u030a", "``quoted''", "trailing   \n\n", "İ is dotted", "tabs\t\tx",
]


def record(tok, texts, rng):
    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        with_special = tok.encode(text, add_special_tokens=True).ids
        cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                      "ids_special": with_special,
                      "decoded_skip": tok.decode(with_special, skip_special_tokens=True)})
    size = tok.get_vocab_size(with_added_tokens=True)
    decode_cases = []
    for _ in range(40):  # random id sequences: partial UTF-8 characters, special tokens in between
        ids = [rng.randrange(size) for _ in range(rng.randint(1, 8))]
        skip = rng.random() < 0.5
        decode_cases.append({"ids": ids, "skip_special_tokens": skip, "text": tok.decode(ids, skip_special_tokens=skip)})
    return cases, decode_cases


def legacy_merges(path):
    # Writes merges as "a b" strings, the older tokenizer.json form (byte-level tokens never contain spaces).
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--fuzz", type=int, default=0, help="record this many random texts instead of the fixed ones")
    args = ap.parse_args()
    for name, make, legacy in [("deepseek_v3", deepseek_v3, False), ("llama3_style", llama3_style, True),
                               ("split_behaviors", split_behaviors, False)]:
        rng = random.Random(1234)
        tok = make(rng)
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "tokenizer.json")
        tok.save(path)
        if legacy:
            legacy_merges(path)
        tok = Tokenizer.from_file(path)
        texts = [random_text(rng) for _ in range(args.fuzz)] if args.fuzz else \
            FIXED_TEXTS + [random_text(rng) for _ in range(30)]
        cases, decode_cases = record(tok, texts, rng)
        with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False, indent=0)
        with open(os.path.join(d, "decode_cases.json"), "w", encoding="utf-8") as f:
            json.dump(decode_cases, f, ensure_ascii=False, indent=0)
        print(f"{d}: vocab {tok.get_vocab_size()}, {len(cases)} cases, {len(decode_cases)} decode cases")


if __name__ == "__main__":
    main()
