#!/usr/bin/env python3
# Trains strata's bundled model from scratch: a small glm_moe_dsa MoE (16 experts, top-4, MLA + DSA indexer) on
# the Python sources of permissively licensed installed packages, with its own byte-level BPE tokenizer and a
# chat template; then snaps the routed experts to the Q4_G64 grid and records transformers' greedy tokens as
# the oracle for strata's tests. Runs on the GPU machine (torch + transformers + tokenizers), one device call:
#
#   python3 tools/train_bundled_model.py --out $OUT/strata-nano --budget-s 560
#
# Writes OUT/hf (the Hugging Face checkpoint, F32 with BF16-exact dense weights and grid-exact experts),
# OUT/expected.json (prompts, their ids, transformers' greedy continuations and margins), OUT/loss.csv,
# OUT/corpus.json (what the model was trained on, with licences) and OUT/train.log.
# `--smoke` trains a few steps on a tiny corpus (CPU is fine) to check the script end to end.
import argparse, ast, csv, importlib.metadata as md, json, math, os, random, sys, sysconfig, time

T0 = time.time()
ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--budget-s", type=float, default=560.0, help="wall time for the whole script")
ap.add_argument("--smoke", action="store_true")
ap.add_argument("--seed", type=int, default=20261202)
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
LOG = open(os.path.join(args.out, "train.log"), "w")


def log(*a):
    s = f"[{time.time() - T0:7.1f}s] " + " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.write(s + "\n")
    LOG.flush()


import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, GlmMoeDsaConfig
import transformers

random.seed(args.seed)
torch.manual_seed(args.seed)
dev = "cuda" if torch.cuda.is_available() else "cpu"
log("torch", torch.__version__, "transformers", transformers.__version__, "device", dev)

# ---------------------------------------------------------------------------------------------------------------
# 1. Corpus: .py files of the standard library and of installed distributions whose licence is permissive.
PERMISSIVE = ("mit", "bsd", "apache", "psf", "python software foundation", "isc", "zlib", "mpl")


def licence_of(dist):
    m = dist.metadata
    text = " ".join(filter(None, [m.get("License-Expression"), m.get("License")] +
                               [c for c in (m.get_all("Classifier") or []) if c.startswith("License ::")]))
    return text.strip()


def permissive(text):
    t = text.lower()
    return any(p in t for p in PERMISSIVE) and "gpl" not in t.replace("lgpl", "") and "lgpl" not in t


sources = []  # (label, licence, [files])
stdlib = sysconfig.get_paths()["stdlib"]
std_files = []
for root, dirs, files in os.walk(stdlib):
    dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "test", "tests", "idlelib",
                                                  "__pycache__", "lib2to3", "turtledemo", "ensurepip"))
    std_files += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
sources.append(("python-stdlib " + sys.version.split()[0], "PSF-2.0", std_files))
if not args.smoke:
    seen = set()
    for dist in sorted(md.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        name = dist.metadata["Name"]
        if not name or name.lower() in seen:
            continue
        seen.add(name.lower())
        lic = licence_of(dist)
        if not permissive(lic):
            continue
        files = sorted(str(dist.locate_file(f)) for f in (dist.files or []) if str(f).endswith(".py")
                       and "/tests/" not in str(f) and "/test/" not in str(f))
        files = [f for f in files if os.path.isfile(f)]
        if files:
            sources.append((f"{name} {dist.version}", lic[:120], files))

MAX_BYTES = 2_000_000 if args.smoke else 64_000_000
docs, corpus_meta, total = [], [], 0
for label, lic, files in sources:
    n, b = 0, 0
    for f in files:
        try:
            text = open(f, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        if not (200 <= len(text) <= 400_000) or total + len(text) > MAX_BYTES:
            continue
        docs.append(text)
        n, b, total = n + 1, b + len(text), total + len(text)
    if n:
        corpus_meta.append({"source": label, "licence": lic, "files": n, "bytes": b})
log(f"corpus: {len(docs)} files, {total / 1e6:.1f} MB from {len(corpus_meta)} sources")

# Chat samples: "write the function" requests answered with the function's source, taken from the corpus.
SPECIALS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = ("[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def render_chat(messages, add_generation_prompt):
    s = "[gMASK]<sop>" + "".join(f"<|{m['role']}|>\n{m['content']}" for m in messages)
    return s + ("<|assistant|>\n" if add_generation_prompt else "")


chats, t_chat = [], time.time()
for text in random.sample(docs, len(docs)):
    if len(chats) >= 20000 or time.time() - t_chat > 25:
        break
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        continue
    lines = text.splitlines(keepends=True)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.col_offset != 0:
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 20:
            continue
        src = "".join(lines[node.lineno - 1:node.end_lineno])
        if not (120 <= len(src) <= 1600):
            continue
        first = doc.strip().splitlines()[0].strip().rstrip(".")
        ask = random.choice(["Write a Python function `{n}` that does this: {d}.",
                             "Implement `{n}` in Python. {d}.", "{d}. Write it as a function named `{n}`."])
        chats.append(render_chat([{"role": "user", "content": ask.format(n=node.name, d=first)},
                                  {"role": "assistant", "content": src.rstrip() + "\n"}], False) + "<|endoftext|>")
random.shuffle(chats)
log(f"chat samples: {len(chats)}")

# Held-out files for validation loss (by file, fixed seed).
order = list(range(len(docs)))
random.shuffle(order)
n_val = max(4, len(docs) // 100)
val_docs = [docs[i] for i in order[:n_val]]
train_docs = [docs[i] for i in order[n_val:]]

# ---------------------------------------------------------------------------------------------------------------
# 2. Tokenizer: byte-level BPE (GPT-2 split regex), vocab 4096, the chat markers as special tokens.
VOCAB = 1024 if args.smoke else 4096
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, min_frequency=2,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok_sample = train_docs[: max(1, len(train_docs) // 4)]
tok.train_from_iterator(tok_sample, trainer=trainer)
assert tok.get_vocab_size() <= VOCAB
EOT = tok.token_to_id("<|endoftext|>")
log(f"tokenizer: vocab {tok.get_vocab_size()} trained on {sum(map(len, tok_sample)) / 1e6:.1f} MB; eot {EOT}")


def encode_stream(texts):
    ids = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(EOT)
    return torch.tensor(ids, dtype=torch.int32)


mix = train_docs + chats  # chat samples are ~1 in 5 documents; shuffled together
random.shuffle(mix)
train_ids = encode_stream(mix)
val_ids = encode_stream(val_docs)
log(f"tokens: train {train_ids.numel() / 1e6:.2f} M ({sum(map(len, mix)) / train_ids.numel():.2f} bytes/token),"
    f" val {val_ids.numel() / 1e6:.3f} M")

# ---------------------------------------------------------------------------------------------------------------
# 3. The model.
SEQ = 128 if args.smoke else 512
cfg = GlmMoeDsaConfig(
    vocab_size=VOCAB, hidden_size=128 if args.smoke else 256, num_hidden_layers=4, intermediate_size=768,
    moe_intermediate_size=64 if args.smoke else 192, n_routed_experts=16, num_experts_per_tok=4,
    n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
    first_k_dense_replace=1, mlp_layer_types=["dense"] + ["sparse"] * 3,
    num_attention_heads=4, num_key_value_heads=4, q_lora_rank=128, kv_lora_rank=64,
    qk_rope_head_dim=16, qk_nope_head_dim=48, v_head_dim=64, head_dim=16,
    index_n_heads=4, index_head_dim=32, index_topk=256, indexer_types=["full"] * 4,
    max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    rms_norm_eps=1e-5, initializer_range=0.02, tie_word_embeddings=False, attention_bias=False,
    bos_token_id=None, eos_token_id=[EOT, tok.token_to_id("<|user|>")], pad_token_id=EOT)
model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().to(dev)
n_params = sum(p.numel() for p in model.parameters())
n_routed = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
log(f"model: {n_params / 1e6:.2f} M parameters ({n_routed / 1e6:.2f} M in routed experts)")

attn_mods = [m for m in model.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "indexer")]
moe_mods = [m for m in model.modules() if type(m).__name__.endswith("MoE")]
assert len(attn_mods) == 4 and len(moe_mods) == 3, (len(attn_mods), len(moe_mods))
# Training runs dense attention (the indexer selects every key); the indexer learns to predict the attention
# (KL to the heads' summed attention, as DeepSeek-V3.2's dense warm-up does); the saved model keeps topk 256.
for m in attn_mods:
    m.indexer.index_topk = 1 << 30

indexer_losses, expert_load = [], [torch.zeros(16, device=dev) for _ in moe_mods]


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos.unsqueeze(2) + torch.cat((-x[..., h:], x[..., :h]), -1) * sin.unsqueeze(2)


def indexer_hook(mod, a, kw, out):
    hs = (kw["hidden_states"] if "hidden_states" in kw else a[0]).detach().float()
    cos, sin = kw["position_embeddings"] if "position_embeddings" in kw else a[1]
    attn = out[1]
    if attn is None or not torch.is_grad_enabled():
        return
    idx = mod.indexer
    B, S, _ = hs.shape
    with torch.no_grad():
        q_resid = mod.q_a_layernorm(mod.q_a_proj(hs)).float()
    q = idx.wq_b(q_resid).view(B, S, idx.n_heads, idx.head_dim).float()
    r = idx.qk_rope_head_dim
    q = torch.cat([rope(q[..., :r], cos.float(), sin.float()), q[..., r:]], -1)
    k = idx.k_norm(idx.wk(hs)).float()
    k = torch.cat([rope(k[..., :r].unsqueeze(2), cos.float(), sin.float()).squeeze(2), k[..., r:]], -1)
    w = idx.weights_proj(hs).float() * idx.n_heads ** -0.5
    sc = F.relu(torch.einsum("bshd,btd->bsht", q, k) * idx.softmax_scale)
    logits = torch.einsum("bsht,bsh->bst", sc, w)
    causal = torch.ones(S, S, dtype=torch.bool, device=hs.device).tril()
    logits = logits.masked_fill(~causal, float("-inf"))
    target = attn.detach().float().sum(1)
    target = target / target.sum(-1, keepdim=True).clamp_min(1e-20)
    logq = torch.log_softmax(logits, -1).masked_fill(~causal, 0.0)
    kl = (torch.xlogy(target, target) - target * logq).sum(-1).mean()
    indexer_losses.append(kl)


def router_hook(mod, a, out):
    i = router_index[id(mod)]
    with torch.no_grad():
        if isinstance(out, tuple):  # newer transformers: the router returns (logits, weights, indices)
            top = out[2]
        else:
            top = (out.float().sigmoid() + mod.e_score_correction_bias).topk(moe_mods[i].top_k, -1).indices
        expert_load[i] += torch.bincount(top.flatten(), minlength=16).float()


for m in attn_mods:
    m.register_forward_hook(indexer_hook, with_kwargs=True)
router_index = {id(m.gate): i for i, m in enumerate(moe_mods)}
for m in moe_mods:
    m.gate.register_forward_hook(router_hook)

decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "indexer" not in n]
no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "indexer" in n]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=2e-3, betas=(0.9, 0.95), eps=1e-8, fused=(dev == "cuda"))
BATCH = 4 if args.smoke else 32
PEAK, WARM = 2e-3, 150
train_end = T0 + args.budget_s - (30 if args.smoke else 110)  # leave time for the oracle and saving
train_start = time.time()
gen = torch.Generator().manual_seed(args.seed)


def batch_from(ids, n):
    starts = torch.randint(0, ids.numel() - SEQ - 1, (n,), generator=gen)
    x = torch.stack([ids[s:s + SEQ + 1] for s in starts.tolist()]).long().to(dev)
    return x[:, :-1], x[:, 1:]


val_batches = [batch_from(val_ids, 8) for _ in range(4)]


def val_loss():
    model.eval()
    with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16, enabled=(dev == "cuda")):
        ls = [F.cross_entropy(model(x).logits.float().flatten(0, 1), y.flatten()).item() for x, y in val_batches]
    model.train()
    return sum(ls) / len(ls)


curve = open(os.path.join(args.out, "loss.csv"), "w", newline="")
cw = csv.writer(curve)
cw.writerow(["step", "seconds", "tokens", "lr", "train_loss", "indexer_kl", "val_loss", "load_max_over_mean"])
model.train()
step, tokens, ema = 0, 0, None
while True:
    now = time.time()
    if now >= train_end or (args.smoke and step >= 12):
        break
    frac = (now - train_start) / max(1.0, train_end - train_start)
    lr = PEAK * min(1.0, (step + 1) / WARM) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
    for g in opt.param_groups:
        g["lr"] = lr
    x, y = batch_from(train_ids, BATCH)
    indexer_losses.clear()
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=(dev == "cuda")):
        logits = model(x).logits
    lm = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    ikl = torch.stack(indexer_losses).mean() if indexer_losses else torch.zeros((), device=dev)
    opt.zero_grad(set_to_none=True)
    (lm + ikl).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    # Auxiliary-loss-free balancing (DeepSeek-V3): nudge each expert's correction bias against its load.
    with torch.no_grad():
        imb = 0.0
        for i, m in enumerate(moe_mods):
            load = expert_load[i]
            m.gate.e_score_correction_bias += 1e-3 * torch.sign(load.mean() - load)
            imb = max(imb, (load.max() / load.mean().clamp_min(1)).item())
            load.zero_()
    step += 1
    tokens += x.numel()
    l = lm.item()
    ema = l if ema is None else 0.98 * ema + 0.02 * l
    if step % 25 == 0 or step == 1:
        vl = val_loss() if step % 200 == 0 or step == 1 else ""
        cw.writerow([step, f"{time.time() - train_start:.1f}", tokens, f"{lr:.2e}", f"{ema:.4f}",
                     f"{ikl.item():.4f}", f"{vl:.4f}" if vl != "" else "", f"{imb:.2f}"])
        curve.flush()
        log(f"step {step} tokens {tokens / 1e6:.1f}M lr {lr:.2e} loss {ema:.4f} indexer_kl {ikl.item():.4f}"
            f" load max/mean {imb:.2f}" + (f" val {vl:.4f}" if vl != "" else ""))
final_val = val_loss()
cw.writerow([step, f"{time.time() - train_start:.1f}", tokens, "", f"{ema:.4f}", "", f"{final_val:.4f}", ""])
curve.close()
log(f"trained {step} steps, {tokens / 1e6:.1f} M tokens in {time.time() - train_start:.0f} s; val loss {final_val:.4f}")

# ---------------------------------------------------------------------------------------------------------------
# 4. Snap to what the strata container stores: routed experts on the Q4_G64 grid (s = absmax/7, q = rint(w/s)),
# every other weight rounded to BF16 (the container's --dense-format bf16; embeddings, kv_b and F32-kept
# tensors then hold BF16-exact values too). The checkpoint is saved in F32 so the oracle runs on these values.
model.eval()
for m in attn_mods:
    m.indexer.index_topk = cfg.index_topk


def q4g64_snap(w, gs=64):
    o, i = w.shape
    g = w.reshape(o, i // gs, gs)
    s = (g.abs().amax(-1, keepdim=True) / 7.0).clamp_min(1e-8)
    return (torch.clamp(torch.round(g / s), -8, 7) * s).reshape(o, i)


with torch.no_grad():
    for n, p in model.named_parameters():
        if ".mlp.experts." in n:
            for e in range(p.shape[0]):
                p.data[e].copy_(q4g64_snap(p.data[e].float()))
        else:
            p.data.copy_(p.data.to(torch.bfloat16).float())
model = model.float().cpu()
hf_dir = os.path.join(args.out, "hf")
model.config.index_topk = cfg.index_topk
model.save_pretrained(hf_dir)
from transformers import PreTrainedTokenizerFast

tok.save(os.path.join(hf_dir, "tokenizer.json"))
fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(hf_dir, "tokenizer.json"), eos_token="<|endoftext|>",
                               pad_token="<|endoftext|>")
fast.chat_template = CHAT_TEMPLATE
fast.model_max_length = 2048
fast.save_pretrained(hf_dir)
tok.save(os.path.join(hf_dir, "tokenizer.json"))  # the tokenizers library's own file, as trained
gcfg = {"eos_token_id": [EOT, tok.token_to_id("<|user|>")], "pad_token_id": EOT, "do_sample": False}
json.dump(gcfg, open(os.path.join(hf_dir, "generation_config.json"), "w"), indent=1)
json.dump({"sources": corpus_meta, "files": len(docs), "bytes": total, "chat_samples": len(chats),
           "train_tokens": train_ids.numel(), "val_tokens": val_ids.numel(), "tokens_seen": tokens,
           "steps": step, "batch": BATCH, "seq": SEQ, "final_val_loss": final_val, "parameters": n_params,
           "routed_parameters": n_routed, "torch": torch.__version__, "transformers": transformers.__version__},
          open(os.path.join(args.out, "corpus.json"), "w"), indent=1)
for conv in ([{"role": "user", "content": "hi"}], [{"role": "system", "content": "Be brief.\n"},
             {"role": "user", "content": "x = 1\n"}, {"role": "assistant", "content": "ok\n"}]):
    want = render_chat(conv, True)
    got = fast.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert want == got, (want, got)

# ---------------------------------------------------------------------------------------------------------------
# 5. The oracle: transformers' greedy continuations (eager attention, F32) of a few prompts, reloaded from disk
# exactly as saved, with a float64 cross-check and the smallest top-2 margin per prompt.
try:
    ref = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager",
                                               experts_implementation="eager").eval()
except TypeError:
    ref = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
long_prompt = val_docs[0]
long_ids = tok.encode(long_prompt).ids[:300]
prompts = [
    ("fibonacci", "def fibonacci(n):"),
    ("imports", "import os\nimport sys\n\n\ndef main():\n"),
    ("class", "class Stack:\n    \"\"\"A last-in first-out stack.\"\"\"\n\n    def __init__(self):\n"),
    ("chat", render_chat([{"role": "user", "content": "Write a Python function `is_prime` that does this: "
                                                      "Return True if n is a prime number."}], True)),
    ("long", tok.decode(long_ids)),
]
NEW = 32
expected = {"new_tokens": NEW, "reference": "transformers eager attention, float32, greedy",
            "transformers": transformers.__version__, "torch": torch.__version__, "prompts": []}
torch.set_grad_enabled(False)
for name, text in prompts:
    ids = tok.encode(text).ids
    x = torch.tensor([ids])
    out = ref.generate(x, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, eos_token_id=None,
                       pad_token_id=EOT)
    full = out[0]
    logits = ref(full[None]).logits[0].float()
    P = len(ids)
    top2 = logits[P - 1:-1].topk(2, -1).values
    margin = (top2[:, 0] - top2[:, 1]).min().item()
    agree64 = bool((ref.double()(full[None]).logits[0][P - 1:-1].argmax(-1) == full[P:]).all())
    ref.float()
    expected["prompts"].append({"name": name, "text": text, "ids": ids, "generated": full[P:].tolist(),
                                "greedy_margin": margin, "fp64_agrees": agree64,
                                "continuation": tok.decode(full[P:].tolist())})
    log(f"oracle {name}: {P} prompt tokens, margin {margin:.4f}, fp64 agrees {agree64}:",
        repr(tok.decode(full[P:].tolist())))
json.dump(expected, open(os.path.join(args.out, "expected.json"), "w"), indent=1)
log("done")
