"""What a pipeline schedule is built for: P ranks, M micro-batches, per-rank times (forward,
backward and the split backward's input and weight gradients), transfer times and the blocks
each rank holds (:class:`ScheduleSpec`). Times follow the cost model's units
(:mod:`hexicore.pipeline.schedule`): a stage time is forward + backward through a rank's share,
split ``T_F : T_B = 1 : 2`` (HexiScale App. A), a hop time a round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hexicore.pipeline.actions import ActionList
from hexicore.pipeline.simulate import Timing


@dataclass(frozen=True)
class ScheduleSpec:
    """What a schedule is built for. ``forward``/``backward`` are per-rank T_F/T_B (one
    micro-batch through the rank's whole share; default 1 and 2), ``hops`` one transfer between
    ranks r and r+1 (default 0); ``input_grad``/``weight_grad`` the split backward's per-rank
    T_I/T_W (zero-bubble ``I``/``W``; default half of T_B each, so the defaults are
    T_F = T_I = T_W = 1). Time-driven orders (greedy) use them; fixed orders ignore them."""

    ranks: int
    micro_batches: int
    forward: tuple[float, ...] = ()
    backward: tuple[float, ...] = ()
    hops: tuple[float, ...] = ()
    input_grad: tuple[float, ...] = ()
    weight_grad: tuple[float, ...] = ()
    #: blocks each rank holds (empty: not known); a schedule choosing its own chunk count
    #: (Hanayo's ``waves=auto``) gives no rank more chunks than the fewest of these
    rank_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        p = self.ranks
        if not self.forward:
            object.__setattr__(self, "forward", (1.0,) * p)
        if not self.backward:
            object.__setattr__(self, "backward", tuple(2.0 * f for f in self.forward))
        if not self.hops:
            object.__setattr__(self, "hops", (0.0,) * max(p - 1, 0))

    @classmethod
    def from_pieces(cls, stage_times: Sequence[float], hop_times: Sequence[float], n_mb: int,
                    rank_layers: Sequence[int] = ()) -> "ScheduleSpec":
        """The planner's pieces (cost-model units, see the module docstring) as a spec."""
        return cls(len(stage_times), int(n_mb), tuple(t / 3.0 for t in stage_times),
                   tuple(2.0 * t / 3.0 for t in stage_times), tuple(h / 2.0 for h in hop_times),
                   rank_layers=tuple(int(x) for x in rank_layers))

    def timing(self, al: ActionList) -> Timing:
        return Timing.from_ranks(al, self.forward, self.backward, self.hops,
                                 input_grad=self.input_grad, weight_grad=self.weight_grad)

    def split_times(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-rank (T_I, T_W): the given ones, else half of T_B each."""
        half = tuple(b / 2 for b in self.backward)
        return self.input_grad or half, self.weight_grad or half

    def equal_split(self) -> float | None:
        """T where every rank has T_F = T_I = T_W = T and free transfers (zero-bubble papers), else None."""
        i, w = self.split_times()
        vals = set(self.forward) | set(i) | set(w)
        return self.forward[0] if len(vals) == 1 and not any(self.hops) else None
