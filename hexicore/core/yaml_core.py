"""How hexicore reads its YAML files (cluster, model, profile): the YAML 1.2 core schema's plain
scalars, not YAML 1.1's, so no value changes meaning behind the user's back.

PyYAML resolves plain scalars by YAML 1.1, where ``1:30`` is the sexagesimal number 90, ``on``,
``yes`` and ``off`` are booleans, ``017`` is octal 15, ``0b101`` binary and ``1_000`` a thousand.
Here only these are resolved, everything else is text:

* null: ``~``, ``null``, ``Null``, ``NULL`` and the empty value;
* booleans: ``true``/``false`` (also ``True``, ``TRUE``, ``False``, ``FALSE``);
* integers: decimal without leading zeros (``0``, ``-12``) and hexadecimal ``0x1F`` (the forms
  YAML 1.1 and 1.2 read alike);
* floats: with a dot or an exponent (``1.5``, ``.5``, ``1e3``, ``1.0e-05``), ``.inf``, ``.nan``.

A numeric or boolean field given one of the other forms is therefore text, which its reader
refuses with one line naming the field (:func:`hexicore.core.schema.number`), rather than a
number the file did not say. The merge key ``<<`` keeps working.
"""

from __future__ import annotations

import re

import yaml

_RESOLVERS = (
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?(?:0|[1-9][0-9]*)|0x[0-9a-fA-F]+)$", "-+0123456789"),
    ("tag:yaml.org,2002:float", r"^(?:[-+]?(?:(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)"
                                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", "-+0123456789."),
    ("tag:yaml.org,2002:merge", r"^(?:<<)$", "<"),
)


class CoreLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with the plain-scalar resolution of the module docstring."""

    yaml_implicit_resolvers: dict = {}


for _tag, _pattern, _first in _RESOLVERS:
    CoreLoader.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))


def yaml11_reading(text: str) -> object | None:
    """What YAML 1.1 (PyYAML's default) makes of the plain scalar ``text`` where it is a number or
    a boolean that :class:`CoreLoader` reads as text (``'1:30'`` -> 90, ``'on'`` -> True); else None."""
    if not isinstance(text, str) or len(text) > 40 or "\n" in text:  # a scalar a number field could mean
        return None
    try:
        value = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError):
        return None
    return value if isinstance(value, (bool, int, float)) else None
