"""``hexicore gpus [cluster_file=PATH]``: the GPU catalog a cluster file's ``gpu:`` names choose
from — each type's peak dense BF16/FP16 TFLOPS, memory, usual intra-machine link (the default of
a machine's ``bandwidth_gbs``), price per GPU-hour and where each figure comes from; with
``cluster_file=``, the catalog with that file's ``gpus:`` section merged over it. Like
``hexicore plugins``, it takes no Hydra config."""

from __future__ import annotations

from typing import Sequence

USAGE = ("usage: hexicore gpus [cluster_file=PATH]\n\nList the GPU types a cluster file's machines may name "
         "(gpu:): peak dense BF16/FP16 TFLOPS, memory (GB), the usual intra-machine link in GB/s (a machine's "
         "bandwidth_gbs when the file gives none), $ per GPU-hour, and the sources. With cluster_file=PATH, the "
         "types of that file's gpus: section too.")


def gpus_command(args: Sequence[str] = ()) -> int:
    """The catalog as a table (module docstring); ``--help`` says so; any other argument than
    ``cluster_file=PATH`` is refused in one line."""
    from hexicore.app.report import console, rows_table
    from hexicore.core import schema
    from hexicore.core.errors import HexicoreError
    from hexicore.core.gpus import parse_gpu_types

    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    given = dict(a.split("=", 1) for a in args if a.startswith("cluster_file="))
    other = [a for a in args if not a.startswith("cluster_file=")]
    if other:
        raise HexicoreError(f"hexicore gpus takes only cluster_file=PATH, got {' '.join(other)!r}",
                            source="command line")
    extra, source = None, None
    if given:
        source = given["cluster_file"]
        extra = schema.as_mapping(schema.load_yaml(source, "cluster"), source, None).get("gpus")
    catalog = parse_gpu_types(extra, source, "gpus")
    rows = [(g.name, f"{g.tflops:g}", f"{g.memory_gb:g}", f"{g.intra_gbs:g}",
             "-" if g.price_per_hour is None else f"{g.price_per_hour:.2f}", g.source)
            for g in sorted(catalog.values(), key=lambda g: g.name)]
    console().print(rows_table("GPU types (a cluster file's gpu: names one; its gpus: section adds or overrides)",
                               ("gpu", "TFLOPS (bf16 dense)", "memory (GB)", "link GB/s (default bandwidth_gbs)",
                                "$/GPU-hour", "source"), rows))
    return 0
