#!/usr/bin/env python3
"""Static SASS report of CUDA kernels, built here without a GPU: per kernel, its registers and spills, and
its loops that hold tensor-core instructions (size, the shortest path through their MMA, global loads,
spill loads/stores inside, and optionally the instruction mix).

    tools/sass_loops.py plugins/cuda/kernels/layer_q4g64_tc.cu            # every kernel of the file
    tools/sass_loops.py plugins/cuda/kernels/layer_q4g64_tc.cu -k ILi1ELb0ELb1E --mix
    tools/sass_loops.py some.cubin

A .cu file is compiled as the plugin's build does (nvcc -O3 -DNDEBUG, -I plugins/cuda -I core/include,
machine code for --arch, default sm_90). The disassembler is nvdisasm: from $NVDISASM, from PATH, or else
fetched once from PyPI (the wheel nvidia-cuda-nvdisasm, a development tool only) into build/tools/nvdisasm.

What it answers: whether a change put spill traffic or extra code inside a kernel's main loop, and how many
instructions a loop iteration issues per tensor-core instruction; nothing about speed (that needs the GPU).
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MMA_OPS = ("IMMA", "HMMA", "QMMA", "HGMMA", "IGMMA")


def nvdisasm_path():
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    found = shutil.which("nvdisasm")
    if found:
        return found
    cache = os.path.join(ROOT, "build", "tools", "nvdisasm")
    hits = glob.glob(os.path.join(cache, "**", "bin", "nvdisasm"), recursive=True)
    if hits:
        return hits[0]
    os.makedirs(cache, exist_ok=True)
    print("fetching nvdisasm from PyPI (nvidia-cuda-nvdisasm) into " + cache, file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", cache, "nvidia-cuda-nvdisasm"],
                   check=True)
    wheels = glob.glob(os.path.join(cache, "nvidia_cuda_nvdisasm-*.whl"))
    if not wheels:
        sys.exit("sass_loops: pip fetched no nvidia_cuda_nvdisasm wheel into " + cache)
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(cache)
    hits = glob.glob(os.path.join(cache, "**", "bin", "nvdisasm"), recursive=True)
    if not hits:
        sys.exit("sass_loops: the wheel " + wheels[0] + " holds no bin/nvdisasm")
    os.chmod(hits[0], 0o755)
    return hits[0]


def compile_cu(src, arch, workdir):
    """The cubin of src and ptxas' per-kernel resource lines (name -> text)."""
    cubin = os.path.join(workdir, "k.cubin")
    cmd = ["nvcc", "-O3", "-DNDEBUG", "-std=c++17", "--generate-code=arch=compute_%s,code=[%s]" % (arch[3:], arch),
           "-I", os.path.join(ROOT, "plugins", "cuda"), "-I", os.path.join(ROOT, "core", "include"),
           "-Xptxas=-v", "-cubin", "-o", cubin, src]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("sass_loops: nvcc failed:\n" + r.stdout + r.stderr)
    res, name = {}, None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line) or re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            res.setdefault(name, [])
        elif name and ("registers" in line or "spill" in line):
            res[name].append(re.sub(r"^ptxas info\s*:\s*", "", line.strip()))
    return cubin, res


def parse(sass_text):
    """{kernel: [(address, label-or-None, text)]}"""
    kernels, cur = collections.OrderedDict(), None
    for line in sass_text.splitlines():
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            cur = m.group(1)
            kernels[cur] = []
            continue
        if cur is None:
            continue
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            kernels[cur].append((None, m.group(1), ""))
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s*(.*?;)", line)
        if m:
            kernels[cur].append((int(m.group(1), 16), None, m.group(2).strip()))
    return kernels


def opcode(text):
    t = re.sub(r"^@!?U?P[T0-9]+\s+", "", text)
    return t.split()[0] if t else ""


def through_path(body, labels):
    """The fewest instructions from the loop's head to its back branch on a path through every MMA of the
    body, in address order, forward edges only: a lower bound of one iteration's issued instructions (code a
    branch can skip is not counted, also where the steady iteration runs it), which tells a loop that holds
    code for its last iterations only (skipped) from one whose every iteration got longer."""
    index = {a: i for i, (a, _) in enumerate(body)}
    succ = []
    for i, (a, t) in enumerate(body):
        op, nxt = opcode(t), []
        unconditional = op.startswith(("BRA", "EXIT", "RET")) and not t.startswith("@")
        if not unconditional and i + 1 < len(body):
            nxt.append(i + 1)
        m = re.search(r"BRA\s+`?\(?(\.L_x_\d+)", t)
        if m and labels.get(m.group(1)) in index and index[labels[m.group(1)]] > i:
            nxt.append(index[labels[m.group(1)]])
        succ.append(nxt)
    stops = [0] + [i for i, (_, t) in enumerate(body) if opcode(t).startswith(MMA_OPS)] + [len(body) - 1]
    total = 0
    for a, b in zip(stops, stops[1:]):
        if a == b:
            continue
        inf = float("inf")
        dist = [inf] * len(body)
        dist[a] = 0
        for i in range(a, b):
            if dist[i] == inf:
                continue
            for j in succ[i]:
                if j <= b and dist[i] + 1 < dist[j]:
                    dist[j] = dist[i] + 1
        if dist[b] == inf:
            return None
        total += dist[b]
    return total + 1


def report(name, rows, resources, mix):
    instrs = [(a, t) for a, lab, t in rows if a is not None]
    labels, pending = {}, []
    for a, lab, t in rows:
        if lab:
            pending.append(lab)
        elif a is not None:
            for p in pending:
                labels[p] = a
            pending = []
    n_mma = sum(opcode(t).startswith(MMA_OPS) for _, t in instrs)
    spills = [(a, t) for a, t in instrs if opcode(t).startswith(("STL", "LDL"))]
    print("== %s: %d instructions, %d MMA, %d spill instructions" % (name, len(instrs), n_mma, len(spills)))
    for line in resources.get(name, []):
        print("   ptxas: " + line)
    loops = []
    for a, t in instrs:
        m = re.search(r"BRA\s+`?\(?(\.L_x_\d+)", t)
        if m and labels.get(m.group(1)) is not None and labels[m.group(1)] <= a:
            lo = labels[m.group(1)]
            body = [(b, u) for b, u in instrs if lo <= b <= a]
            mmas = sum(opcode(u).startswith(MMA_OPS) for _, u in body)
            if mmas:
                loops.append((lo, a, body, mmas))
    # innermost first: a loop that contains another MMA loop is reported as outer
    for lo, hi, body, mmas in sorted(loops, key=lambda L: L[0]):
        inner = not any(lo <= l2 and h2 <= hi and (l2, h2) != (lo, hi) for l2, h2, _, _ in loops)
        if not inner:
            continue
        ldg = sum(opcode(u).startswith("LDG") for _, u in body)
        spl = [u for _, u in body if opcode(u).startswith(("STL", "LDL"))]
        path = through_path(body, labels)
        print("   loop %#07x-%#07x: %4d instructions (%s on the shortest path through its MMA: %s per MMA), "
              "%2d MMA, %3d LDG, %d spill" % (lo, hi, len(body), path, "%.1f" % (path / mmas) if path else "?",
                                              mmas, ldg, len(spl)))
        for u in spl:
            print("      spill in loop: " + u)
        if mix:
            c = collections.Counter(opcode(u) for _, u in body)
            print("      " + ", ".join("%s %d" % (k, v) for k, v in c.most_common()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="a .cu file (compiled here) or a .cubin")
    ap.add_argument("--arch", default="sm_90", help="machine code to build and read (default sm_90)")
    ap.add_argument("-k", "--kernel", default="", help="only kernels whose mangled name contains this")
    ap.add_argument("--mix", action="store_true", help="the instruction mix of each loop")
    args = ap.parse_args()
    if not os.path.exists(args.input):
        sys.exit("sass_loops: no such file: " + args.input)
    with tempfile.TemporaryDirectory() as work:
        resources = {}
        cubin = args.input
        if args.input.endswith(".cu"):
            cubin, resources = compile_cu(os.path.abspath(args.input), args.arch, work)
        elif not args.input.endswith(".cubin"):
            sys.exit("sass_loops: expected a .cu or a .cubin file, got " + args.input)
        r = subprocess.run([nvdisasm_path(), cubin], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("sass_loops: nvdisasm failed: " + r.stderr.strip())
    kernels = parse(r.stdout)
    shown = 0
    for name, rows in kernels.items():
        if args.kernel in name:
            report(name, rows, resources, args.mix)
            shown += 1
    if shown == 0:
        sys.exit("sass_loops: no kernel matches '%s' (kernels: %s)" % (args.kernel, ", ".join(kernels) or "none"))


if __name__ == "__main__":
    main()
