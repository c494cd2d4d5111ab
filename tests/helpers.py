"""Builders that several test modules share: the hand-computed cost fixtures, a sample profile,
plans, CP-SAT problems, random clusters, a tiny Hugging Face checkpoint, the 6-device CPU cluster's
plans and worker specs, multi-process comparisons (each section names the test module it was
first written for; those modules import the names back)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import pytest

from hexicore.core.cluster import parse_cluster
from hexicore.core.model import ModelSpec
from hexicore.core.plan import Pipeline, Plan, Stage
from hexicore.core.profile import Profile, parse_profile
from hexicore.core.settings import TrainSettings
from hexicore.cost.analytic import AnalyticCostModel
from hexicore.planner.problem import Problem
from hexicore.registry import Registry
from hexicore_plugins.runtimes.torch.parallel.assignment import StageGroup, schedule_actions
from hexicore_plugins.solvers.cpsat import CpSatSolver
from tests.conftest import model_preset


# ------------------------------------------------------------ from test_cost.py
# Two machines: A has 2 GPUs of 100 TFLOPS (10 GB/s, 10 us), B has 2 of 50 TFLOPS (5 GB/s, 20 us);
# 1 GB/s, 100 us between them. Round numbers so every term can be checked by hand.
HAND_CLUSTER = parse_cluster({
    "name": "hand", "inter": {"bandwidth_gbs": 1.0, "latency_us": 100},
    "machines": [{"name": "A", "gpu": "fast", "count": 2, "bandwidth_gbs": 10, "latency_us": 10},
                 {"name": "B", "gpu": "slow", "count": 2, "bandwidth_gbs": 5, "latency_us": 20}],
    "gpus": {"fast": {"tflops": 100, "memory_gb": 40}, "slow": {"tflops": 50, "memory_gb": 16}},
}, "hand")
HAND_MODEL = ModelSpec("m", layers=4, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=1000, seq_len=512)
HAND_TRAIN = TrainSettings(global_batch=4, micro_batch=1, seq_len=512, dtype="bf16", recompute=True)
HAND_COST = AnalyticCostModel(default_efficiency=0.5, reserve_gb=0.0)
HAND_H, HAND_S, HAND_F, HAND_V, HAND_B = 1024, 512, 4096, 1000, 1
HAND_LAYER_PARAMS = 4 * HAND_H * HAND_H + 3 * HAND_H * HAND_F + 2 * HAND_H        # llama block
HAND_LAYER_FLOPS_TOKEN = 2 * (4 * HAND_H * HAND_H + 3 * HAND_H * HAND_F) + 4 * HAND_S * HAND_H


# ------------------------------------------------------------ from test_plan.py
def make_plan(paper_case, llama13b, **train):
    t = TrainSettings(**{"global_batch": 24, "micro_batch": 1, "seq_len": 4096, **train})
    return Plan(llama13b, paper_case, t, (
        Pipeline(14, (Stage(("A.0", "A.1"), 2, (0, 22)), Stage(("A.2",), 1, (22, 40)))),
        Pipeline(10, (Stage(("B.0",), 1, (0, 10)), Stage(("B.1",), 1, (10, 20)), Stage(("B.2",), 1, (20, 30)),
                      Stage(("C.0", "C.1"), 2, (30, 40)))),
    ))


# ------------------------------------------------------------ from test_profiled_cost.py
SAMPLE_CLUSTER = parse_cluster({"name": "two", "inter": {"bandwidth_gbs": 1.0, "latency_us": 50},
                         "machines": [{"name": "A", "gpu": "rtx4090", "count": 2, "bandwidth_gbs": 32, "latency_us": 10},
                                      {"name": "B", "gpu": "rtx3090", "count": 2, "bandwidth_gbs": 16,
                                       "latency_us": 10}]}, "test")
SAMPLE_MODEL = ModelSpec("m", 4, 64, 4, 4, 176, 256, 32)
SAMPLE_SHAPE = {"hidden": 64, "ffn": 176, "heads": 4, "kv_heads": 4}


def sample_profile(**extra) -> Profile:
    return parse_profile(sample_raw_profile(**extra), "p.yaml")


def sample_raw_profile(**extra) -> dict:
    return {
        "format": "hexicore.profile/1",
        "devices": {"rtx4090": {"blocks": [
            {"micro_batch": 1, "tp": 1, "seq_len": 32, **SAMPLE_SHAPE, "forward_s": 0.010, "backward_s": 0.020,
             "recompute_s": 0.010},
            {"micro_batch": 4, "tp": 1, "seq_len": 32, **SAMPLE_SHAPE, "forward_s": 0.025, "backward_s": 0.050,
             "recompute_s": 0.025},
            {"micro_batch": 1, "tp": 2, "seq_len": 32, **SAMPLE_SHAPE, "forward_s": 0.008, "backward_s": 0.016}]}},
        "links": [{"between": ["A", "B"], "latency_s": 1e-4, "bandwidth_gbs": 0.5},
                  {"between": ["A", "A"], "latency_s": 2e-5, "bandwidth_gbs": 20.0}],
        **extra}


# ------------------------------------------------------------ from test_cpsat.py
CPSAT_WORKERS = 2  # CP-SAT's search workers in the tests


def cpsat_cluster(machines, inter_gbs=1.0, gpus=None):
    d = {"name": "t", "inter": {"bandwidth_gbs": inter_gbs, "latency_us": 50},
         "machines": [{"name": n, "gpu": g, "count": c, "bandwidth_gbs": bw, "latency_us": 10}
                      for n, g, c, bw in machines]}
    if gpus:
        d["gpus"] = gpus
    return parse_cluster(d, "test")


def cpsat_small_llama(layers, seq_len=1024):
    return replace(model_preset("llama2_7b"), layers=layers, seq_len=seq_len)


def cpsat_problem(c, m, global_batch, micro_batch=1, warm_start=None, schedule=None, cost=None):
    """A problem priced as the CP-SAT model prices it: App. A's step-end sync (``dp_overlap=false``)."""
    t = TrainSettings(global_batch=global_batch, micro_batch=micro_batch, seq_len=m.seq_len, dp_overlap=False)
    return Problem(c, m, t, cost or AnalyticCostModel(state_bytes_per_param=8), schedule or {"name": "1f1b"}, warm_start=warm_start)


def cpsat_solve(p, time_limit=20.0, **kw):
    return CpSatSolver(workers=CPSAT_WORKERS, **kw).solve(p, time_limit=time_limit, seed=0)


# ------------------------------------------------------------ from test_schedule_aware.py
SEARCH_FAST = {"iterations": 6, "polish_rounds": 2, "polish_evals": 30, "time_budget": None}  # complete searches
SEARCH_GPUS = ["rtx4090", "rtx3090", "a100-80g", "rtx3080ti", "v100-32g"]


def search_random_cluster(rng):
    machines = [{"name": f"m{i}", "gpu": rng.choice(SEARCH_GPUS), "count": rng.randint(1, 4),
                 "bandwidth_gbs": rng.choice([16.0, 32.0, 200.0]), "latency_us": 5}
                for i in range(rng.randint(2, 4))]
    return parse_cluster({"name": "r", "inter": {"bandwidth_gbs": rng.choice([0.7, 1.0, 10.0]), "latency_us": 50},
                          "machines": machines}, "random")


# ------------------------------------------------------------ from test_hf_final.py
HF_WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex the pipeline".split()
HF_IDS = dict(bos_token_id=1, eos_token_id=[2, 3], pad_token_id=3)


def hf_make_tokenizer(vocab: int, specials=("<unk>", "<s>", "</s>", "<pad>"), seed_words=HF_WORDS):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    docs = [" ".join(seed_words[i:] + seed_words[:i]) for i in range(len(seed_words))]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials)))
    return tok


def hf_make_source(folder: Path, *, tokenizer: bool = True, generation: bool = True) -> Path:
    """A tiny Llama saved as ``save_pretrained`` saves it: config with special ids (eos a list),
    ``generation_config.json``, and a fast tokenizer (``tokenizer.json``, ``tokenizer_config.json``)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **HF_IDS)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    if generation:
        model.generation_config = transformers.GenerationConfig(**HF_IDS, do_sample=False, max_new_tokens=7)
    model.save_pretrained(folder)
    if not generation:
        (folder / "generation_config.json").unlink(missing_ok=True)
    if tokenizer:
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=hf_make_tokenizer(60), bos_token="<s>",
                                                    eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
        fast.save_pretrained(folder)
    return folder


# ------------------------------------------------------------ from test_asymmetric.py
CPU6_SEQ, CPU6_TOL = 32, 1e-5
CPU6_CLUSTER = {"name": "cpu6", "inter": {"bandwidth_gbs": 0.7, "latency_us": 50},
           "machines": [{"name": "M", "gpu": "rtx4090", "count": 6, "bandwidth_gbs": 32, "latency_us": 10}]}


#: the issue's acceptance plan: pipeline 1 = tp=2 [0,5) + tp=1 [5,8), batch 5; pipeline 2 = three tp=1 stages
CPU6_ACCEPTANCE = [(5, "1f1b", [(2, 5), (1, 3)]), (3, "gpipe", [(1, 3), (1, 3), (1, 2)])]
CPU6_PLANS = {
    "acceptance: tp2+tp1 (1f1b, b=5) | 3 x tp1 (gpipe, b=3)": CPU6_ACCEPTANCE,
    "3 pipelines: tp2 (gpipe) | 2 stages (hanayo) | tp1 whole model (1f1b)":
        [(2, "gpipe", [(2, 8)]), (4, {"name": "hanayo", "waves": 1}, [(1, 6), (1, 2)]), (2, "1f1b", [(1, 8)])],
    "chimera (copies, REDUCE) | tp2 whole model | zb_h1 (I/W split)":
        [(4, "chimera", [(1, 4), (1, 4)]), (2, "1f1b", [(2, 8)]), (2, "zb_h1", [(1, 3), (1, 5)])],
    "tp mixes at different cuts: interleaved 1f1b | 1f1b":
        [(6, {"name": "interleaved_1f1b", "chunks": 2}, [(1, 2), (2, 6)]), (2, "1f1b", [(2, 7), (1, 1)])],
}


def tiny() -> ModelSpec:
    return model_preset("tiny")


def plan_of(pipelines: list[tuple[int, str | dict, list[tuple[int, int]]]], global_batch: int = 8) -> Plan:
    """A plan JSON over devices M.0.. in order: ``(batch, schedule, [(tp, layers), ...])`` per pipeline."""
    m, dev, out = tiny(), 0, []
    for batch, sched, stages in pipelines:
        ss, lo = [], 0
        for tp, n in stages:
            ss.append({"devices": [f"M.{dev + i}" for i in range(tp)], "tp": tp, "layers": [lo, lo + n]})
            dev, lo = dev + tp, lo + n
        out.append({"batch": batch, "schedule": sched if isinstance(sched, dict) else {"name": sched}, "stages": ss})
    d = {"format": "hexicore.plan/1",
         "model": {k: getattr(m, k) for k in ("name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab",
                                              "seq_len")},
         "cluster": CPU6_CLUSTER,
         "train": {"global_batch": global_batch, "micro_batch": 1, "seq_len": CPU6_SEQ, "dtype": "fp32",
                   "recompute": False},
         "pipelines": out}
    return Plan.from_dict(d, source="test plan")


def layout_of(pipelines, **kw):
    from hexicore_plugins.runtimes.torch.parallel.assignment import plan_layout

    plan = plan_of(pipelines, **kw)
    return plan_layout(plan, [p.schedule for p in plan.pipelines], registry=Registry.default(), seq_len=CPU6_SEQ)


def worker_spec(layout, **settings):
    """A ``WorkerSpec`` of ``layout`` from flat keywords: the worker's own fields (``zero``,
    ``machines``, ``return_state``, ...) or a setting named as the last part of its config key
    (``steps``, ``dtype``, ``lr``, ``data_file``, ``checkpoint_every``, ``out``, ``timeout_s``, ...),
    each given to the settings object that holds it; the train settings' batch and sequence
    length are the layout's, every other value is its class's default."""
    from dataclasses import fields

    from hexicore.core.settings import (CheckpointSettings, DataSettings, OptimizerSettings, OutputSettings,
                                        TrainSettings)
    from hexicore_plugins.runtimes.torch.launch.settings import LaunchSettings
    from hexicore_plugins.runtimes.torch.train.trainer import WorkerSpec

    parts = {"train": TrainSettings, "optimizer": OptimizerSettings, "data": DataSettings,
             "checkpoint": CheckpointSettings, "output": OutputSettings, "launch": LaunchSettings}
    own = {k: settings.pop(k) for k in [f.name for f in fields(WorkerSpec)] if k in settings and k not in parts}
    given = {part: {} for part in parts}
    given["train"] = {"global_batch": layout.global_batch, "micro_batch": layout.micro_batch, "seq_len": layout.seq_len}
    for part, cls in parts.items():
        for f in fields(cls):
            key = (f.metadata.get("key") or f.name).rpartition(".")[2]
            if key in settings:
                given[part][f.name] = settings.pop(key)
    assert not settings, f"no setting is named {sorted(settings)}"
    return WorkerSpec(layout=layout, **{part: cls(**given[part]) for part, cls in parts.items()}, **own)


# ------------------------------------------------------------------ multi-process
def _max_rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def _max_abs(state, ref):
    assert set(state) == set(ref)
    return max((state[k] - ref[k]).abs().max().item() for k in ref)


# ------------------------------------------------------------ from test_runtime_dist.py
DIST_GB, DIST_SEQ, DIST_WORLD = 6, 32, 3
DIST_TOL = 1e-5


def dist_spec(layout, steps=3, recompute=False, **kw):
    return worker_spec(layout, steps=steps, seed=11, dtype="fp32", recompute=recompute, progress=False,
                       return_state=True, **kw)


def dist_pipeline(schedule: dict, groups: list[StageGroup], batch: int = DIST_GB, micro_batch: int = 1):
    return batch, groups, schedule_actions(schedule, len(groups), batch // micro_batch, Registry.default())


def dist_equal_stages(ranks: int, tp: int = 1) -> list[StageGroup]:
    n = tiny().layers // ranks
    return [StageGroup(tuple(range(q * tp, (q + 1) * tp)), n + (1 if q < tiny().layers % ranks else 0))
            for q in range(ranks)]


# ------------------------------------------------------------ from test_placement.py
#: plans of the tiny model (8 blocks) on one pipeline: (batch, schedule, [(tp, layers), ...])
PLACEMENT_PLANS = {
    "chimera P=3": [(8, "chimera", [(1, 2), (1, 3), (1, 3)])],
    "hanayo W=2": [(8, {"name": "hanayo", "waves": 2}, [(1, 4), (1, 4)])],
    "hanayo W=1 P=3": [(8, {"name": "hanayo", "waves": 1}, [(1, 2), (1, 3), (1, 3)])],
    "zb_v": [(8, "zb_v", [(1, 5), (1, 3)])],
    "dualpipe_v": [(8, "dualpipe_v", [(1, 5), (1, 3)])],
    "interleaved": [(8, {"name": "interleaved_1f1b", "chunks": 2}, [(1, 4), (1, 4)])],
    "looped_bfs": [(8, {"name": "looped_bfs", "chunks": 2}, [(1, 4), (1, 4)])],
    "1f1b": [(8, "1f1b", [(1, 5), (1, 3)])],
    "gpipe tp=2": [(8, "gpipe", [(2, 5), (1, 3)])],
}


# ------------------------------------------------------------ from test_tied.py
#: two pipelines, two stages each (ZeRO-1/2 at the step)
TWO_BY_TWO = [(5, "1f1b", [(1, 3), (1, 5)]), (3, "gpipe", [(1, 3), (1, 5)])]


def tied_plan(pipelines, zero: int = 0, tied: bool = True) -> Plan:
    from tests.helpers import plan_of
    p = plan_of(pipelines)
    p = dataclasses.replace(p, model=dataclasses.replace(p.model, tied_embeddings=tied))
    return Plan(p.model, p.cluster, TrainSettings(**{**p.train.to_dict(), "zero": zero}), p.pipelines)


# ------------------------------------------------------------ from test_zero_runtime_state.py
#: hybrid: M.0 whole | M.1 [0,3) + M.2 [3,8) | N.0 whole — layer chunks held by two holders in
#: machine M and one in machine N (different holder counts per machine)
HYBRID = [(3, "1f1b", [(1, 8)]), (3, "gpipe", [(1, 3), (1, 5)]), (2, "1f1b", [(1, 8)])]
#: hybrid ZeRO-3 (one stage per pipeline): M.0 | M.1 + M.2 (TP 2) | N.0 — a TP half is held by
#: two ranks in M and one in N, a replicated tensor by three in M and one in N
HYBRID3 = [(3, "1f1b", [(1, 8)]), (3, "gpipe", [(2, 8)]), (2, "1f1b", [(1, 8)])]


def _hybrid_plan(zero: int, scope: str = "machine", pipelines=HYBRID) -> Plan:
    from tests.helpers import plan_of
    d = plan_of(pipelines).to_dict()
    d.pop("estimate", None)
    d["cluster"] = {**CPU6_CLUSTER, "machines": [{"name": "M", "gpu": "rtx4090", "count": 3, "bandwidth_gbs": 32},
                                            {"name": "N", "gpu": "a100-80g", "count": 1, "bandwidth_gbs": 32}]}
    d["pipelines"][2]["stages"][0]["devices"] = ["N.0"]
    d["train"].update({"zero": zero, "zero_scope": scope})
    return Plan.from_dict(d, "hybrid plan")
