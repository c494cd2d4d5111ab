"""Builders that several test modules share: the hand-computed cost fixtures, a sample profile,
plans, CP-SAT problems, random clusters, a tiny Hugging Face checkpoint (each section names the
test module it serves first)."""

from __future__ import annotations

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
    t = TrainSettings(global_batch=global_batch, micro_batch=micro_batch, seq_len=m.seq_len)
    return Problem(c, m, t, cost or AnalyticCostModel(state_bytes_per_param=8), schedule or {"name": "1f1b"}, warm_start=warm_start)


def cpsat_solve(p, time_limit=20.0, **kw):
    return CpSatSolver(workers=CPSAT_WORKERS, **kw).solve(p, time_limit=time_limit, seed=0)


# ------------------------------------------------------------ from test_schedule_aware.py
SEARCH_FAST = {"iterations": 6, "polish_rounds": 2, "polish_evals": 30}
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
