"""Settings of the HexiScale search (conf/solver/hexiscale.yaml), checked on construction:
a parameter of the wrong type or out of range is a one-line :class:`HexicoreError`."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from hexicore.core.fields import is_number, is_whole
from hexicore.core.errors import HexicoreError


@dataclass(frozen=True)
class SearchConfig:
    """``partitioner``/``refiner``/``orderer``/``cost_model``: registry names (``refiner``
    null = none; ``cost_model`` null = the problem's). ``tau``: the orderer's top-tau; ``orders``: how many of its best paths the
    cost model chooses from.
    ``max_balance``: phase-1 balance factor limit (§4.2); ``group_balance``: phase 2's.
    ``iterations``: candidates of the loop (§4.4; the paper uses 50). ``dp_min``/``dp_max``:
    the range of D_dp (null = automatic). ``k_shifts``: offsets of k_i from the number of
    machines in a part tried by the walk. ``ema``: weight of the newest candidate in the moving
    averages; ``explore``: chance of trying the other cut. ``max_tp``: largest TP degree.
    ``strategy_passes``: coordinate-descent passes over the groups' strategies.
    ``polish_rounds``/``polish_evals``: polishing rounds and estimates at most (the stages' order, then their boundaries; 0 rounds: no polish). ``align_templates``: pipelines tried as the
    template of the machine-aligned variants. ``seeds``: solvers whose plans seed the
    search. ``replan_iterations``: with a ``warm_start`` plan, two-phase candidates tried after
    repairing it (:mod:`hexicore.planner.replan`); null = ignore the repair and run the full search.
    ``use_all_devices``: plan on every device (no allocation); ``allocation_exhaustive``: solve
    every sub-cluster of whole machines when there are at most this many, else descend greedily
    (:mod:`hexicore.planner.allocation`); ``allocation_screen_above``: on clusters with more
    devices, a greedy neighbour is searched in full only when a short search on it (a tenth of
    the iterations, no polishing) already beats the best plan so far or the same short search on
    the sub-cluster the step starts from, at most two per step (the best screens first). ``workers``: processes
    the independent pieces of a search may use (the screens of one greedy step, the first step's
    beside the whole cluster's search; 0 = one per
    core this process may use, 1 = no other process; the plan is the same either way).
    ``machine_graph_above``: on clusters with more devices, phase 1 partitions the machines
    (whole machines per pipeline) instead of the devices, whose complete graph grows as
    devices^2. ``time_budget``: seconds the whole solve (allocation, search, exact pricing of
    the final plan) may take when the caller gives no ``time_limit``: the search is anytime, it
    returns the best plan found by then, with the FLOPs lower bound (``bound``, the gap beside
    it); ``auto`` = :meth:`budget`'s rule by cluster size; null = no limit (every iteration runs:
    the plan depends on the seed alone, not on the machine's speed)."""

    partitioner: str = "metis"
    refiner: str | None = "kl"
    orderer: str = "top_tau"
    cost_model: str | None = None
    tau: int = 2
    orders: int = 4
    max_balance: float = 1.2
    group_balance: float = 2.0
    iterations: int = 50
    dp_min: int = 1
    dp_max: int | None = None
    k_shifts: tuple[int, ...] = (-1, 0, 0, 1, 2)
    ema: float = 0.5
    explore: float = 0.2
    max_tp: int = 8
    strategy_passes: int = 2
    polish_rounds: int = 20
    polish_evals: int = 200
    align_templates: int = 4
    seeds: tuple[str, ...] = ("megatron",)
    replan_iterations: int | None = 2
    use_all_devices: bool = False
    allocation_exhaustive: int = 8
    allocation_screen_above: int = 16
    workers: int = 0
    machine_graph_above: int = 128
    time_budget: float | str | None = "auto"

    #: ``time_budget=auto``: seconds at these cluster sizes (devices), linear in between and
    #: constant past either end: about 90% of the search times the planner aims at (8 GPUs: 1 s;
    #: 16-32 GPUs: 5 s; 320: 10 s; 1024: 30 s; clusters between 32 and 320 GPUs have no target:
    #: 64 GPUs get 7 s), 15% of it kept for the exact pricing and final schedules that follow the
    #: searches (:data:`hexicore.planner.hexiscale.FINAL_SHARE`). 8 GPUs get 0.9 s, about their
    #: searches' own work on this machine with every option on (with 1 s the paper case's answer
    #: came at 0.94-1.03 s): on a loaded host their plan may then depend on the load
    #: (``solver.time_budget=null``: on the seed alone)
    BUDGET_POINTS = ((8, 0.9), (16, 4.5), (32, 4.5), (64, 7.0), (320, 7.5), (1024, 25.0))

    def budget(self, devices: int) -> float | None:
        """The seconds of :attr:`time_budget` for a cluster of ``devices`` (None: no limit):
        ``auto`` interpolates :data:`BUDGET_POINTS` (8 GPUs: 0.9 s, 16-32: 4.5 s, 64: 7 s, 320:
        7.5 s, 1024 and more: 25 s), so the search answers in about the same time on any load; a number is
        that many seconds."""
        if self.time_budget is None:
            return None
        if self.time_budget == "auto":
            points = self.BUDGET_POINTS
            if devices <= points[0][0]:
                return points[0][1]
            for (n0, s0), (n1, s1) in zip(points, points[1:]):
                if devices <= n1:
                    return s0 + (s1 - s0) * (devices - n0) / (n1 - n0)
            return points[-1][1]
        return float(self.time_budget)

    def __post_init__(self) -> None:
        def bad(key: str, what: str) -> HexicoreError:
            return HexicoreError(f"{key} must be {what}, got {getattr(self, key)!r}", field=f"solver.{key}")

        for key in ("partitioner", "orderer"):
            if not isinstance(getattr(self, key), str):
                raise bad(key, "a plugin name")
        for key in ("refiner", "cost_model"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), str):
                raise bad(key, "a plugin name or null")
        for key in ("tau", "orders", "iterations", "dp_min", "max_tp", "strategy_passes"):
            v = getattr(self, key)
            if not is_whole(v) or v < 1:
                raise bad(key, "an integer >= 1")
        if self.time_budget is not None and self.time_budget != "auto" and (
                not is_number(self.time_budget) or self.time_budget <= 0):
            raise bad("time_budget", "a positive number of seconds, auto or null")
        if not isinstance(self.use_all_devices, bool):
            raise bad("use_all_devices", "true or false")
        for key in ("polish_rounds", "polish_evals", "align_templates", "allocation_exhaustive",
                    "allocation_screen_above", "workers", "machine_graph_above"):
            v = getattr(self, key)
            if not is_whole(v) or v < 0:
                raise bad(key, "an integer >= 0")
        if self.replan_iterations is not None and (not is_whole(self.replan_iterations)
                                                   or self.replan_iterations < 0):
            raise bad("replan_iterations", "an integer >= 0 or null")
        if self.dp_max is not None and (not is_whole(self.dp_max)
                                        or self.dp_max < 1):
            raise bad("dp_max", "an integer >= 1 or null")
        for key in ("max_balance", "group_balance"):
            v = getattr(self, key)
            if not is_number(v) or v < 1:
                raise bad(key, "a number >= 1")
        for key in ("ema", "explore"):
            v = getattr(self, key)
            if not is_number(v) or not 0 <= v <= 1:
                raise bad(key, "a number in [0, 1]")
        if not all(is_whole(k) for k in self.k_shifts) or not self.k_shifts:
            raise bad("k_shifts", "a non-empty list of integers")
        if not all(isinstance(s, str) for s in self.seeds):
            raise bad("seeds", "a list of solver names")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "SearchConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise HexicoreError(f"unknown hexiscale option(s) {', '.join(unknown)}; choose from: "
                                f"{', '.join(sorted(known))}", field=f"solver.{unknown[0]}")
        kw = dict(params)
        for key in ("k_shifts", "seeds"):
            if key in kw:
                v = kw[key]
                if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
                    raise HexicoreError(f"{key} must be a list, got {v!r}", field=f"solver.{key}")
                kw[key] = tuple(v)
        return cls(**kw)
