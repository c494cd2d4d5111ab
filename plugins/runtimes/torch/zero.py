"""Sharded training state in the torch runtime: ZeRO-2/3 per micro-batch (ZeRO-2 for every
pipeline shape, ZeRO-3 where every pipeline is one stage or the pipelines mirror each other,
:func:`zero3_runs`).

ZeRO (Rajbhandari et al., SC'20) over the chunk groups of :mod:`.dp_sync` (the ranks that hold
the same chunks of the same parameters, HexiScale §3.2). A group's flat bucket is cut into units
(:mod:`.zero_units`: the embedding, each block, the final norm with the head) and member ``i``
owns a slice of every unit (:func:`.zero_units.apportion`): even, or (``zero_split=memory``,
Cephalo-style) proportional to its device memory, within one element of the cost model's
``n * w_i / sum w``. At the step each member updates its slices with AdamW; ZeRO-2 then
all-gathers the updated weights unit by unit.

:class:`ShardedState`: during every backward action that finishes a gradient (``B``, or ``W``),
as soon as a unit's gradients are all accumulated (a post-accumulate-grad hook per parameter),
the unit's gradient is summed among the group (posted asynchronously, collected when done, at
the latest before the optimizer step) and each member adds its piece to a persistent gradient
shard; the unit's local gradients are freed. So about one unit's full gradient exists at a time,
and between micro-batches a rank holds ``1/n`` of the gradients, whatever its chunks (Chimera's
copies each add their own micro-batches'). Units are summed in the order the layout predicts
(:func:`.zero_units.reduce_needs`); what is left is summed when the action ends.

Stage 3 also keeps only its piece of the fp32 weights and gathers them unit by unit, as FSDP
wraps a transformer: a forward pre-hook gathers a unit just before its forward and a forward hook
frees it after (``untyped_storage().resize_(0)`` through ``.data``: autograd's saved references
stay valid); a hook on the unit's output gradient fires when its backward starts, frees the unit
before it and gathers this one again (not the embedding: its gradient reads no weight). So one
unit is gathered at a time, with recomputation and the ``I``/``W`` split too; no prefetch.

The step has two phases (:mod:`.grad_norm`): :meth:`ShardedState.prepare` collects every summed
gradient piece, :meth:`ShardedState.apply` updates once the global gradient norm is known.

Hybrid sharding (``zero_scope=machine``, ZeRO-3; :mod:`.hybrid`): a bucket's members are the
group's holders in this rank's machine; at the step the pieces are summed across machines
(:func:`.hybrid.sum_across`), then AdamW runs identically on every machine.

Collectives of ranks whose schedules differ pair up in rounds (:mod:`.zero_units`); before the
step every rank runs the rounds left up to the most any member of its group has.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from hexicore.pipeline.actions import Op

from .grad_norm import squares
from .hybrid import atom_cross, counted, peers_of, sum_across
from .zero_units import (EMBED_UNIT, Bucket, adamw_, gather_needs, gather_pieces, gather_round, make_bucket, post_reduce,
                         mirrored, one_stage_per_pipeline, post_sum, reduce_needs, rounds, shard_bounds, stage_units,
                         sum_piece, unit_of, zero3_runs)

__all__ = ["ShardedState", "adamw_", "gather_pieces", "mirrored", "one_stage_per_pipeline", "post_sum", "shard_bounds",
           "sum_piece", "zero3_runs"]

GATHER_OPS = frozenset((Op.F, Op.B, Op.I, Op.W))
REDUCE_OPS = frozenset((Op.B, Op.W))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _contributes(c, h) -> bool:
    """Whether holder ``h`` puts its gradient of chunk ``c`` into a sum: a TP-split chunk has one
    holder per stage; a replicated one is equal on every TP rank, TP rank 0 puts it in."""
    return c.dim is not None or h.tp_rank == 0


class ShardedState:
    """ZeRO-2 (``stage=2``, every layout) or ZeRO-3 (``stage=3``, :func:`zero3_runs` layouts)
    for one rank (module docstring). ``params[(stage, name)]`` are the rank's
    parameters, full and initialised; ``weights`` the shard weight of every global rank (None:
    even); ``layout`` tells every rank's needs; ``stages`` (ZeRO-3) the modules to hook;
    ``machines`` (hybrid ZeRO-3) the machine of every global rank."""

    def __init__(self, sync, params: dict, *, stage: int, weights: Sequence[float] | None, layout,
                 stages: dict | None = None, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 machines: Sequence[str] | None = None):
        self.sync, self.params, self.stage, self.layers = sync, params, stage, layout.model.layers
        self.adam = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self.t = 0
        everyone = range(layout.world)
        gneeds = {r: gather_needs(layout, r) for r in everyone} if stage == 3 else {}
        rneeds = {r: reduce_needs(layout, r) for r in everyone}
        self.gneeds, self.rneeds = gneeds.get(sync.rank, []), rneeds[sync.rank]
        self.buckets: list[Bucket] = []
        self.pieces: list[tuple[torch.Tensor, ...]] = []  # per bucket: weights (ZeRO-3), grad, avg, sq
        self.units: dict[int, dict[int, torch.nn.Parameter]] = {}  # unit -> its local sharded parameters
        self.by_stage: dict[tuple[int, int], dict[int, torch.nn.Parameter]] = {}  # (stage, unit) -> its parameters
        for members, _, chunks in sync.items:
            peers = peers_of(members, sync.rank, machines)  # hybrid: the holders in this rank's machine
            atoms = [(u,) for u in sorted({unit_of(c.name, self.layers) for c, _, _ in chunks})]
            b = make_bucket(peers, sync.handle(peers), sync.gather_handles.get(peers), chunks, atoms, self.layers,
                            peers.index(sync.rank), None if weights is None else [weights[r] for r in peers])
            b.counted = counted(members, sync.rank, machines)
            if machines is not None:
                b.cross = atom_cross(members, [e - s for s, e in b.span], sync.rank, weights, machines)
            atom_of = {u: a for a, us in enumerate(atoms) for u in us}
            b.gathers = rounds(gneeds, peers, atom_of) if stage == 3 else []
            b.reduces = rounds(rneeds, peers, atom_of)
            piece = self._my_weights(b)
            zeros = torch.zeros_like(piece)
            self.pieces.append((piece if stage == 3 else piece[:0].clone(), zeros, zeros.clone(), zeros.clone()))
            self.buckets.append(b)
            for c, mine, _ in chunks:
                for h in mine:
                    p = params[(h.stage, c.name)]
                    self.units.setdefault(unit_of(c.name, self.layers), {})[id(p)] = p
                    self.by_stage.setdefault((h.stage, unit_of(c.name, self.layers)), {})[id(p)] = p
        self.local = {k: p for ps in self.units.values() for k, p in ps.items()}
        role = layout.role(sync.rank)
        part = layout.pipelines[role.pipeline]
        self.stage_units = {s: stage_units(part, s, self.layers) for s in part.actions.stages_of(role.pipe_rank)}
        self.cur: int | None = None  # stage of the backward action running
        self.act_end: int | None = None  # reduce needs done when it ends
        self.arrived: dict[tuple[int, int], set[int]] = {}  # (stage, unit) -> parameters whose gradient is in
        for key, ps in self.by_stage.items():
            for p in ps.values():
                p.register_post_accumulate_grad_hook(lambda p, key=key: self._arrived(key, p))
        self.gcur = self.rcur = 0  # needs done this step (gathers, reduces)
        self.live: set[int] = set()  # units gathered now
        self.mode: str | None = None  # ZeRO-3: "forward" / "backward" during a compute action
        self.wait: Callable | None = None
        self.pending: list = []  # gradient sums posted, not yet added: (bucket index, atoms, work, read)
        self.grad_peak = 0  # most gradient bytes held after a compute action (local grads + pieces)
        self.gather_peak = 0  # most bytes of gathered unit weights alive at once (ZeRO-3)
        self.grad_live = self.grad_live_peak = 0  # full local gradient bytes not summed yet during a backward
        self.gathered = True
        if stage == 3:
            for u in list(self.units):
                self._free(u)
            self.gathered = False
            for st in (stages or {}).values():
                self._hook(st.module)

    def synced(self) -> set[tuple[int, str]]:
        """``(stage, name)`` of the local tensors this object updates (the rest: plain AdamW)."""
        return {(h.stage, c.name) for b in self.buckets for c, mine, _ in b.chunks for h in mine}

    def _my_weights(self, b: Bucket) -> torch.Tensor:
        """This rank's piece of the bucket's weights, read from its local parameters (a copy of
        the piece only, never of the whole bucket)."""
        out = []
        for a, (start, _) in enumerate(b.span):
            lo, hi = (start + x for x in b.bounds[a][b.i])
            k = start
            for c, mine, _ in b.chunks_of(a):
                if k < hi and k + c.numel > lo:
                    v = self.sync._view(self.params[(mine[0].stage, c.name)].data, c, mine[0]).reshape(-1)
                    out.append(v[max(lo - k, 0): min(hi - k, c.numel)])
                k += c.numel
        if out:
            return torch.cat(out)
        c, mine, _ = b.chunks[0]
        return self.params[(mine[0].stage, c.name)].data.new_zeros(0)

    def unit_bytes(self, u: int) -> int:
        """Bytes of unit ``u``'s local parameters, gathered."""
        return sum(_nbytes(p) for p in self.units.get(u, {}).values())

    def state_bytes(self) -> int:
        """Bytes of AdamW moments this rank keeps."""
        return sum(_nbytes(avg) + _nbytes(sq) for _, _, avg, sq in self.pieces)

    def kept_bytes(self, stages: dict) -> dict[str, int]:
        """Measured bytes this rank keeps between compute actions, by part: weights (allocated
        parameter storage plus ZeRO-3 pieces), gradients (:attr:`grad_peak`), optimizer moments
        of the sharded tensors; ``unsummed``, the most bytes of full local gradients alive at once
        during a backward (units accumulated, not summed yet); ZeRO-3 adds ``gathered``, the
        most bytes of gathered unit weights alive at once during compute (:attr:`gather_peak`)."""
        params = {id(p): p for st in stages.values() for p in st.module.parameters()}.values()
        weights = sum(p.data.untyped_storage().nbytes() for p in params) + sum(_nbytes(w) for w, *_ in self.pieces)
        out = {"weights": weights, "gradients": self.grad_peak, "optimizer": self.state_bytes(),
               "unsummed": self.grad_live_peak}
        if self.stage == 3:
            out["gathered"] = self.gather_peak
        return out

    # ------------------------------------------------------------ ZeRO-3 hooks
    def _hook(self, module) -> None:
        """Gather/free hooks on every unit of a stage chunk: (first module, last module)."""
        m = module.model
        spans = [(EMBED_UNIT, m.embed_tokens, m.embed_tokens)] if hasattr(m, "embed_tokens") else []
        spans += [(int(k), blk, blk) for k, blk in m.layers.items()]
        if hasattr(m, "norm"):
            spans.append((self.layers, m.norm, module.lm_head))
        for u, first, last in spans:
            first.register_forward_pre_hook(lambda mod, args, u=u: self._pre(u))
            last.register_forward_hook(lambda mod, args, out, u=u: self._post(u, out))

    def _pre(self, u: int) -> None:
        if self.mode == "forward":
            self._need(u)
        elif u not in self.live and self.units.get(u):
            raise RuntimeError(f"ZeRO-3: unit {u} recomputed in a backward pass while not gathered")

    def _post(self, u: int, out) -> None:
        if self.mode != "forward":
            return  # a recomputation inside a backward pass: the unit stays gathered
        self._free(u)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad, u=u: self._backward_starts(u))

    def _backward_starts(self, u: int) -> None:
        """Unit ``u``'s output gradient is complete: the unit after it is done, ``u`` begins."""
        for v in list(self.live):
            self._free(v)
        if u != EMBED_UNIT:
            self._need(u)

    # ------------------------------------------------------------- weights
    def _free(self, u: int) -> None:
        for p in self.units.get(u, {}).values():
            p.data.untyped_storage().resize_(0)
        self.live.discard(u)

    @torch.no_grad()
    def _need(self, u: int) -> None:
        """Gather unit ``u``: this rank's next gather round in every group (module docstring)."""
        k = self.gcur
        if k >= len(self.gneeds) or self.gneeds[k] != (u,):
            want = self.gneeds[k] if k < len(self.gneeds) else "nothing"
            raise RuntimeError(f"ZeRO-3: gather {k} of the step fetches unit {u}, the layout expects {want}")
        for p in self.units.get(u, {}).values():
            p.data.untyped_storage().resize_(_nbytes(p))
        self._gather_round(k, u)
        self.gcur += 1
        self.live.add(u)
        self.gather_peak = max(self.gather_peak, sum(self.unit_bytes(v) for v in self.live))

    def _gather_round(self, k: int, u: int | None) -> None:
        """Round ``k`` of every group this rank is in; keep unit ``u`` (None: serve only)."""
        for b, (w, *_) in zip(self.buckets, self.pieces):
            atoms = b.gathers[k] if k < len(b.gathers) else ()
            if atoms:
                keep = [a for a in atoms if u in b.atoms[a]]
                got = gather_round(b, atoms, w, keep, self.wait, b.gather_handle)
                for a, flat in got.items():
                    self._write(b.chunks_of(a), flat)

    def _write(self, chunks, flat: torch.Tensor) -> None:
        """Copy a flat run of chunks into every local holder's view (through ``.data``)."""
        k = 0
        for c, mine, _ in chunks:
            for h in mine:
                v = self.sync._view(self.params[(h.stage, c.name)].data, c, h)
                v.copy_(flat[k: k + c.numel].view_as(v))
            k += c.numel

    def before(self, a, wait: Callable) -> None:
        """Before a compute action ``a``: ZeRO-3's hooks gather in the mode of its pass; a
        backward that finishes gradients sums them unit by unit as they arrive."""
        self.wait = wait
        if self.stage == 3 and a.op in GATHER_OPS:
            self.mode = "forward" if a.op is Op.F else "backward"
        if a.op in REDUCE_OPS:
            self.cur, self.act_end, self.arrived = a.stage, self.rcur + len(self.stage_units[a.stage]), {}

    def after(self, a, wait: Callable) -> None:
        """After a compute action: the gradients not summed yet are (a unit some of whose
        parameters got no gradient); stage 3 frees what is still gathered."""
        if a.op in REDUCE_OPS:
            self._flush(force=True)
            self.cur = self.act_end = None
        grads = {id(p): p.grad for p in self.params.values() if p.grad is not None}
        held = sum(_nbytes(t) for t in grads.values()) + sum(_nbytes(g) for _, g, _, _ in self.pieces)
        self.grad_peak = max(self.grad_peak, held)
        if self.stage == 3:
            for u in list(self.live):
                self._free(u)
            self.mode = None

    # ---------------------------------------------------------- gradients
    def _grads(self, b: Bucket, a: int, stage: int) -> torch.Tensor:
        """This rank's flat gradient of atom ``a`` from its holders on ``stage`` (zeros where it
        does not contribute)."""
        parts = []
        for c, mine, _ in b.chunks_of(a):
            h = next((h for h in mine if h.stage == stage), None)
            g = self.params[(h.stage, c.name)].grad if h is not None and _contributes(c, h) else None
            parts.append(self.sync._view(g, c, h).reshape(-1) if g is not None else
                         torch.zeros(c.numel, dtype=self.pieces[0][1].dtype, device=self.pieces[0][1].device))
        return torch.cat(parts)

    def _arrived(self, key: tuple[int, int], p) -> None:
        """A parameter's gradient of this backward is accumulated; a unit with all of them in
        is summed, in the order the layout predicts (:func:`.zero_units.reduce_needs`)."""
        if key[0] != self.cur:
            return
        got = self.arrived.setdefault(key, set())
        if id(p) not in got:
            got.add(id(p))
            self.grad_live += _nbytes(p)
            self.grad_live_peak = max(self.grad_live_peak, self.grad_live)
        self._flush(force=False)

    def _flush(self, *, force: bool) -> None:
        """Sum the predicted next units of this action whose gradients are complete (``force``:
        every one left)."""
        while self.act_end is not None and self.rcur < self.act_end:
            u = self.rneeds[self.rcur][0]
            key = (self.cur, u)
            if not force and len(self.arrived.get(key, ())) < len(self.by_stage.get(key, {})):
                break
            self.reduce(self.wait, self.cur, u)

    @torch.no_grad()
    def reduce(self, wait: Callable, stage: int | None, unit: int | None) -> None:
        """This rank's next reduce round in every group: sum ``unit``'s gradient of ``stage``
        (None: an empty round, zeros) into the pieces, then free its local gradients."""
        k = self.rcur
        for bi, b in enumerate(self.buckets):
            atoms = b.reduces[k] if k < len(b.reduces) else ()
            if not atoms:
                continue
            flats = {a: self._grads(b, a, stage) for a in atoms if unit in b.atoms[a]} if stage is not None else {}
            self._harvest(wait, everything=False)
            ref = self.pieces[bi][1]
            work, read = post_reduce(b, atoms, flats, ref.dtype, ref.device)
            self.pending.append((bi, atoms, work, read))
        self.rcur += 1
        for p in self.by_stage.get((stage, unit), {}).values():
            if id(p) in self.arrived.get((stage, unit), ()):
                self.grad_live -= _nbytes(p)
            p.grad = None

    def _harvest(self, wait: Callable, *, everything: bool) -> None:
        """Add finished gradient sums to their pieces (``everything``: wait for all of them)."""
        left = []
        for bi, atoms, work, read in self.pending:
            b = self.buckets[bi]
            if everything:
                wait([work], f"ZeRO gradient reduce-scatter with {b.what}")
            elif not work.is_completed():
                left.append((bi, atoms, work, read))
                continue
            got, at, g = read(), 0, self.pieces[bi][1]
            for a in atoms:
                n = b.size(a, b.i)
                g[b.offset(a): b.offset(a) + n] += got[at: at + n]
                at += n
        self.pending = left

    # --------------------------------------------------------------- step
    def _pad(self, wait: Callable) -> None:
        """Check this step's needs ran as the layout says; run the rounds left in each group."""
        if self.gcur != len(self.gneeds) or self.rcur != len(self.rneeds):
            raise RuntimeError(f"ZeRO: this step ran {self.gcur} gathers and {self.rcur} gradient sums, the layout "
                               f"expects {len(self.gneeds)} and {len(self.rneeds)}")
        for k in range(self.gcur, max((len(b.gathers) for b in self.buckets), default=0)):
            self._gather_round(k, None)
        while self.rcur < max((len(b.reduces) for b in self.buckets), default=0):
            self.reduce(wait, None, None)

    @torch.no_grad()
    def prepare(self, params: dict, wait: Callable) -> None:
        """Phase 1: the rounds left, every sum collected, (hybrid) pieces summed across machines."""
        self.wait = wait
        self._pad(wait)
        self._harvest(wait, everything=True)
        for b, (_, g, _, _) in zip(self.buckets, self.pieces):
            if b.cross:
                sum_across(b, g, self.sync.handle, wait)

    def sq_norm(self, device) -> torch.Tensor:
        """Sum of squares of the summed gradient pieces this rank counts (:func:`.hybrid.counted`)."""
        return squares([g for b, (_, g, _, _) in zip(self.buckets, self.pieces) if b.counted], device)

    @torch.no_grad()
    def apply(self, params: dict, wait: Callable, *, lr: float | None = None, coef: float | None = None) -> None:
        """Phase 2: AdamW on the pieces (gradient times ``coef``, at ``lr``), stage 2 gathers them."""
        self.t += 1
        adam = {**self.adam, "lr": self.adam["lr"] if lr is None else lr}
        for b, (w, g, avg, sq) in zip(self.buckets, self.pieces):
            if self.stage == 2:
                w = self._my_weights(b)
            if coef is not None:
                g.mul_(coef)
            adamw_(w, g, avg, sq, self.t, **adam)
            g.zero_()
            if self.stage == 2:  # unit by unit: never a second copy of the whole bucket
                for a in range(len(b.atoms)):
                    self._write(b.chunks_of(a), gather_round(b, (a,), w, (a,), wait, b.handle)[a])
        for p in self.local.values():
            p.grad = None
        self.gcur = self.rcur = 0

    @torch.no_grad()
    def materialize(self, wait: Callable) -> None:
        """Stage 3 after training: gather the full weights back for good (checkpoint, state)."""
        if self.stage != 3:
            return
        for p in self.local.values():
            p.data.untyped_storage().resize_(_nbytes(p))
        for b, (w, *_) in zip(self.buckets, self.pieces):
            for a in range(len(b.atoms)):
                self._write(b.chunks_of(a), gather_round(b, (a,), w, (a,), wait, b.gather_handle)[a])
        self.gathered = True
