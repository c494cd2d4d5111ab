"""Hugging Face I/O: ``prepare-data`` throughput, and per-rank checkpoint loading (time, peak RSS).

    python bench/hf_io.py            # ~4 MB of text; a ~270 MB Llama checkpoint
    python bench/hf_io.py --quick    # ~1 MB of text; a ~70 MB checkpoint

1. ``hexicore prepare-data`` (the CLI, run as a subprocess, so tokenizer start-up is included in
   the wall time; its own printed throughput is reported too) on generated text with a BPE
   tokenizer of 8,000 ids trained locally by ``tokenizers``.
2. A random Llama checkpoint written by ``transformers``' ``save_pretrained``, once as one
   ``model.safetensors`` and once sharded (``max_shard_size``), is loaded the way ``hexicore train
   init_from=DIR`` loads it, for every rank of a 4-rank run (2 pipeline stages x TP 2): each rank
   in a fresh process builds its stage chunk and reads only its tensors' TP slices
   (:class:`hexicore_plugins.runtimes.torch.checkpoint.hugging_face.SafeTensors`). Reported per rank: load time, the
   bytes it read, and the growth of its peak resident memory (``ru_maxrss``) over the process
   after imports (peak RSS reset through ``/proc/self/clear_refs``) — its parameters plus what
   reading cost. The baseline row loads the whole file
   with ``safetensors.torch.load_file`` in one process.

Writes the ``## Hugging Face I/O`` section of docs/results.md (bench/results.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADING = "## Hugging Face I/O"
WORDS = ("pipeline stage tensor parallel gradient optimizer checkpoint token window batch layer "
         "attention rotary embedding cluster heterogeneous schedule bubble wave device memory").split()


def rss_mb() -> float:
    """Peak resident memory of this process since the last :func:`reset_peak` (VmHWM, MiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_mb(key: str = "VmRSS") -> float:
    """A current memory figure of this process from /proc/self/status (MiB): VmRSS, RssAnon, RssFile."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def reset_peak() -> None:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux: ``/proc/self/clear_refs`` = 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def make_corpus(folder: Path, mb: float) -> tuple[Path, Path]:
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = np.random.default_rng(0)
    lines, size = [], 0
    while size < mb * 2**20:
        doc = " ".join(rng.choice(WORDS, size=int(rng.integers(20, 200)))) + f" {int(rng.integers(0, 10**6))}"
        lines.append(json.dumps({"text": doc}))
        size += len(doc)
    data = folder / "corpus.jsonl"
    data.write_text("\n".join(lines) + "\n")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator((json.loads(x)["text"] for x in lines[:2000]),
                            trainers.BpeTrainer(vocab_size=8000, special_tokens=["<unk>", "</s>"]))
    tok.save(str(folder / "tokenizer.json"))
    return data, folder / "tokenizer.json"


def bench_prepare(folder: Path, mb: float) -> dict:
    data, tok = make_corpus(folder, mb)
    exe = Path(sys.executable).with_name("hexicore")
    t0 = time.perf_counter()
    run = subprocess.run([str(exe), "prepare-data", f"input={data}", f"tokenizer={tok}", f"out={folder / 'x.bin'}",
                          f"hydra.run.dir={folder / 'run'}"], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    meta = json.loads((folder / "x.bin.json").read_text())
    printed = [ln for ln in run.stdout.splitlines() if "│" in ln and any(c.isdigit() for c in ln)]
    own = printed[-1].split("│")[-2].strip() if printed else "?"
    return {"mb": data.stat().st_size / 2**20, "docs": meta["documents"], "tokens": meta["tokens"], "wall": wall,
            "tps_wall": meta["tokens"] / wall, "tps_own": own, "cores": os.cpu_count()}


def make_checkpoint(folder: Path, quick: bool) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=16000, hidden_size=512 if quick else 768, intermediate_size=1536 if quick else 2048,
                      num_hidden_layers=4 if quick else 6, num_attention_heads=8, num_key_value_heads=4,
                      max_position_embeddings=256)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(folder / "single", max_shard_size="20GB")
    model.save_pretrained(folder / "sharded", max_shard_size="40MB")


def worker(folder: str, rank: int) -> None:
    """One rank of a 2-stage x TP-2 run loads its chunk (prints one JSON line)."""
    import torch

    from hexicore.core.hf_config import load_hf_config
    from hexicore.registry import Registry
    from hexicore_plugins.runtimes.torch.checkpoint.hugging_face import SafeTensors
    from hexicore_plugins.runtimes.torch.parallel.assignment import single_pipeline_layout
    from hexicore_plugins.runtimes.torch.model.stage_module import build_stages
    from hexicore_plugins.runtimes.torch.parallel.tensor import TPGroup

    model = load_hf_config(folder)
    lay = single_pipeline_layout(model, {"name": "1f1b"}, 2, registry=Registry.default(), global_batch=2,
                                 micro_batch=1, seq_len=128, tp=2)
    role = lay.role(rank)
    reset_peak()
    base, anon = current_mb(), current_mb("RssAnon")
    t0 = time.perf_counter()
    src = SafeTensors.directory(folder)
    stages = build_stages(model, lay.pipelines[0], role.pipe_rank, TPGroup(role.tp_rank, 2), full=src,
                          recompute=False, device=torch.device("cpu"))
    dt = time.perf_counter() - t0
    params = sum(p.numel() * 4 for st in stages.values() for p in st.module.parameters())
    print(json.dumps({"rank": rank, "s": dt, "read_mb": sum(b for _, b in src.reads) / 2**20,
                      "params_mb": params / 2**20, "rss_mb": rss_mb() - base,
                      "anon_mb": current_mb("RssAnon") - anon}))


def whole(folder: str) -> None:
    from safetensors.torch import load_file

    reset_peak()
    base, anon = current_mb(), current_mb("RssAnon")
    t0 = time.perf_counter()
    state = load_file(str(Path(folder) / "model.safetensors"))
    for t in state.values():  # make sure every byte is really in memory (not a lazy mapping)
        t.add_(0)
    dt = time.perf_counter() - t0
    mb = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    print(json.dumps({"rank": "-", "s": dt, "read_mb": mb, "params_mb": mb, "rss_mb": rss_mb() - base,
                      "anon_mb": current_mb("RssAnon") - anon}))


def bench_load(folder: Path, quick: bool) -> tuple[float, list[tuple[str, dict]]]:
    make_checkpoint(folder, quick)
    size = sum(f.stat().st_size for f in (folder / "single").glob("*.safetensors")) / 2**20
    rows = []
    for kind in ("single", "sharded"):
        for r in range(4):
            out = subprocess.run([sys.executable, __file__, "--worker", str(folder / kind), str(r)],
                                 capture_output=True, text=True, check=True)
            rows.append((kind, json.loads(out.stdout.strip().splitlines()[-1])))
    out = subprocess.run([sys.executable, __file__, "--whole", str(folder / "single")], capture_output=True,
                         text=True, check=True)
    rows.append(("single, whole file (load_file)", json.loads(out.stdout.strip().splitlines()[-1])))
    return size, rows


def section(prep: dict, size: float, rows: list[tuple[str, dict]], largest: float) -> str:
    lines = [
        "Measured by `bench/hf_io.py` on this machine (2 shared CPU cores; numbers vary with the other jobs).",
        "",
        f"**prepare-data**: {prep['mb']:.1f} MB of generated JSON-lines text, {prep['docs']:,} documents, a BPE "
        f"tokenizer of 8,000 ids: {prep['tokens']:,} tokens in {prep['wall']:.2f} s wall "
        f"(`hexicore prepare-data` as a subprocess, start-up included) = **{prep['tps_wall']:,.0f} tokens/s**; "
        f"the command's own throughput line: {prep['tps_own']} tokens/s.",
        "",
        f"**Loading a Hugging Face checkpoint per rank** ({size:.0f} MB fp32 Llama, `init_from` path): each rank "
        "of a 2-stage x TP-2 run, in a fresh process, builds its chunk and reads only its tensors' TP slices. "
        "Peak RSS growth is over the process after imports; besides private memory it counts the pages "
        "of the memory-mapped safetensors file that a read touched (each tensor is read through its own "
        "`safe_open` handle, so those pages are unmapped after it). *Private after* is the anonymous "
        "memory the rank holds once loaded (its parameters). What the peak adds to the parameters is "
        "about one tensor in flight — at most the largest one, here the embedding "
        f"({largest:.0f} MB, read whole: it is not TP-sharded). The last row loads the whole file in "
        "one process for comparison.",
        "",
        "| checkpoint | rank | load s | read MB | its parameters MB | peak RSS growth MB | private after MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, r in rows:
        lines.append(f"| {kind} | {r['rank']} | {r['s']:.2f} | {r['read_mb']:.1f} | {r['params_mb']:.1f} | "
                     f"{r['rss_mb']:.1f} | {r['anon_mb']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--worker", nargs=2, metavar=("DIR", "RANK"))
    p.add_argument("--whole", metavar="DIR")
    p.add_argument("--no-docs", action="store_true", help="do not touch docs/results.md")
    a = p.parse_args()
    if a.worker:
        return worker(a.worker[0], int(a.worker[1]))
    if a.whole:
        return whole(a.whole)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "p").mkdir()
        prep = bench_prepare(d / "p", 1.0 if a.quick else 4.0)
        size, rows = bench_load(d / "ckpt", a.quick)
        from hexicore_plugins.runtimes.torch.checkpoint.hugging_face import checkpoint_shapes

        largest = max(4 * math.prod(s) for s in checkpoint_shapes(d / "ckpt" / "single").values()) / 2**20
    text = section(prep, size, rows, largest)
    print(text)
    if not a.no_docs:
        sys.path.insert(0, str(HERE))
        from results import write_section

        write_section(HEADING, text)


if __name__ == "__main__":
    main()
