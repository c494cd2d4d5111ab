"""The ``hexicore`` console script: Hydra entry points per command (docs/cli.md).

``hexicore COMMAND [overrides...]`` — COMMAND picks the task, everything after it is Hydra's
(``key=value``, groups, ``-m``, ``--cfg job``, ``--help``). Before Hydra runs, a preflight
composes the config once so that an unknown group option or a bad override becomes one line on
stderr and exit status 2; every :class:`HexicoreError` raised by a command does too.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
from typing import Any, Callable, Sequence

from hexicore.app.config_schema import GROUPS
from hexicore.core.errors import HexicoreError

COMMANDS = {
    "plan": "solve for a plan on a cluster and model; print it; write the plan JSON",
    "evaluate": "validate a plan JSON from any source and re-estimate it",
    "simulate": "generate a schedule's action lists and simulate them (makespan, bubbles, timeline)",
    "train": "run training from a plan (or one pipeline, or parallel=none) with torch.distributed",
    "profile": "measure the cluster's devices and links (blocks, head, p2p, all-reduce); write a profile file",
    "prepare-data": "tokenize text / JSON-lines files with a Hugging Face tokenizer into a token file",
    "plugins": "list every registered solver, partitioner, schedule, cost model and runtime",
    "gpus": "list the GPU catalog (TFLOPS, memory, usual link, price) a cluster file's gpu: names choose from",
}
log = logging.getLogger("hexicore")

USAGE = """usage: hexicore COMMAND [key=value ...] [-m] [--cfg job] [--help]

Plan and run LLM training on heterogeneous GPU clusters.

commands:
{commands}

examples:
  eval "$(hexicore --shell-completion bash)"     # tab completion of commands, groups and keys
  hexicore plan                                   # paper case, Llama-2 13B, default solver
  hexicore plan cluster=hetero1 model=llama2_7b train.global_batch=64 out=plan.json
  hexicore evaluate plan_file=plan.json
  hexicore plan -m solver=megatron cluster=paper_case,hetero1
  hexicore plugins

`hexicore COMMAND --help` shows the config groups and the keys the command reads, each with what
it is (`--cfg job`: every key of the composed config; `--hydra-help`: Hydra's own help)."""


def fail(exc: BaseException | str) -> int:
    """One line on stderr, exit status 2 (bad input, docs/cli.md)."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"hexicore: error: {msg}", file=sys.stderr)
    return 2


def _group_options(group: str, registry: Any = None) -> list[str]:
    """Options of a config group: YAML files shipped in hexicore.conf plus structured configs
    (those in Hydra's ConfigStore, or with ``registry`` only those of its plugins)."""
    from importlib import resources

    names = set()
    try:
        for f in resources.files("hexicore.conf").joinpath(group).iterdir():
            if f.name.endswith(".yaml"):
                names.add(f.name[:-5])
    except (ModuleNotFoundError, FileNotFoundError):
        pass
    if registry is not None:
        from hexicore.hookspecs import KINDS

        kinds = [k for k, (_, g) in KINDS.items() if g == group]
        names.update(n for k in kinds for n, e in registry.entries[k].items() if e.spec.config is not None)
        return sorted(names)
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo.get(group, {})
    names.update(k[:-5] if k.endswith(".yaml") else k for k in repo)
    return sorted(names)


#: Hydra's own options that take a value (``--cfg job``, ``-p solver``); never overrides.
_VALUED_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                 "--config-dir", "-cd", "--experimental-rerun", "--info", "-i"}
_INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def hydra_overrides(args: Sequence[str]) -> list[str]:
    """The ``key=value`` overrides among a command line's arguments (Hydra's flags removed)."""
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a.startswith("-"):
            if "=" not in a and a in _VALUED_FLAGS and i + 1 < len(args):
                nxt = args[i + 1]
                skip = a not in ("--info", "-i") or nxt in _INFO_TOPICS
            continue
        out.append(a)
    return out


def _multirun(args: Sequence[str]) -> bool:
    return any(a in ("-m", "--multirun") or a.replace(" ", "") == "hydra.mode=MULTIRUN" for a in args)


def preflight(overrides: Sequence[str], *, library: bool = False) -> list[str]:
    """Check group choices and compose once (first value of each sweep); every other value of a
    sweep is composed too (a value of the wrong type would stop Hydra before any job runs);
    raise HexicoreError. Several values without ``-m`` (or in the library) are refused. Returns
    the first job's overrides (each sweep at its first value, Hydra's own keys included)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    plain = hydra_overrides(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except HydraException as exc:
        raise HexicoreError(str(exc).splitlines()[0], source="command line") from None
    except ValueError as exc:  # a number too long to convert (Python's 4300-digit limit)
        raise HexicoreError(f"a value cannot be read: {str(exc).split(';')[0]}", source="command line") from None
    multirun = not library and _multirun(overrides)
    trial, sweeps, hydra_keys = [], [], []
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra"):
            if not o.is_sweep_override():
                hydra_keys.append(o.input_line)
            continue
        if o.is_sweep_override() and not multirun:
            hint = "give one value" if library else "add -m to run one job per value"
            raise HexicoreError(f"{o.input_line} has several values (a sweep); {hint}",
                                source=None if library else "command line", field=key)
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        if multirun and key == "out":
            from hexicore.app.sweep import check_out

            check_out(o.input_line, values)
        if key in GROUPS and o.package is None and not o.is_delete():
            options = _group_options(key)
            for v in values:
                if v not in options:
                    label = "cost model" if key == "cost" else key
                    raise HexicoreError(f"unknown {label} {v!r}; choose one of: {', '.join(options)}",
                                        source="command line", field=key)
        left = o.input_line.split("=", 1)[0]
        trial.append(f"{left}={values[0]}" if values else o.input_line)
        sweeps += [(len(trial) - 1, f"{left}={v}") for v in values[1:]]  # group options too: keys differ
    cfg = _compose(trial)
    for i, line in dict.fromkeys(sweeps):  # each other value of a sweep, the rest at their first
        try:
            _compose(trial[:i] + [line] + trial[i + 1:])
        except HexicoreError as exc:
            raise HexicoreError(f"sweep value {line}: {exc.message}", source="command line", field=exc.field) from None
    from hexicore.app.config_schema import check_config

    check_config(cfg, [o.key_or_group for o in parsed])
    return trial + hydra_keys


def _compose(overrides: list[str]) -> Any:
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from hexicore.app.compose import config_from_overrides

    try:
        cfg = config_from_overrides(overrides)
        OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves (none refers to itself)
        return cfg
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise _config_error(exc) from None


def _config_error(exc: BaseException) -> HexicoreError:
    """One line from a Hydra/OmegaConf composition error: the value's problem and its key."""
    cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
    lines = [ln.strip() for ln in str(cause).strip().splitlines() if ln.strip()]
    key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), None)
    message = "; ".join(ln for ln in lines[:3] if not ln.startswith(("full_key:", "object_type=", "reference_type=")))
    if re.match(r"Key '[^']+' (?:is )?not in ", message):
        message = "unknown key (hexicore COMMAND --help lists the command's keys, --cfg job every key)"
    return HexicoreError(message or str(exc), source="command line", field=key or None)


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # no Hydra job (library use)
        return False


def _per_job_out(cfg: Any) -> None:
    """Inside a sweep, ``out=`` belongs to one job: a relative path is resolved under the job's
    output directory; one outside it (absolute, or ``../x``) is refused (other jobs could write it)."""
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    out = cfg.get("out")
    if not out:
        return
    from hexicore.app.sweep import outside_job_dir

    hc = HydraConfig.get()
    if outside_job_dir(str(out)):
        raise HexicoreError(f"out={out} lies outside the job's directory: other jobs of the sweep could write it; "
                            "give a relative path (resolved under each job's directory) that stays inside it",
                            source="command line", field="out")
    cfg.out = str(Path(hc.runtime.output_dir) / str(out))


def _task(command: str, restore: Any = None) -> Callable:
    """The Hydra task of ``command``. In a sweep a failing job is recorded in the sweep summary
    with its one-line error and the sweep goes on (the command exits 1 at the end). A refused
    single run leaves nothing: what Hydra wrote for it is undone (``restore``,
    :func:`hexicore.app.hydra_output.roll_back`)."""
    module = importlib.import_module(f"hexicore.app.commands.{command.replace('-', '_')}")

    def task(cfg: Any) -> int:
        multirun = _in_multirun()
        log.info("hexicore %s %s", command, " ".join(_job_overrides()))
        try:
            if multirun:
                from hexicore.app.sweep import claim_output_dir

                claim_output_dir()  # before anything is written: no other job of the sweep writes there
                _per_job_out(cfg)
            code = module.run(cfg)
        except (HexicoreError, OSError) as exc:  # OSError: the file system refused a path mid-run (disk full)
            msg = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename else \
                str(exc) or type(exc).__name__
            if not multirun:
                if restore is not None:
                    from hexicore.app.hydra_output import roll_back

                    roll_back(restore)
                else:
                    log.info("refused: %s", msg)
                sys.exit(fail(msg))
            return _failed_job(command, msg)
        except Exception as exc:  # noqa: BLE001 - a sweep outlives one job's bug; reported as one line
            if not multirun:
                raise
            return _failed_job(command, f"{type(exc).__name__}: {exc}".splitlines()[0])
        log.info("%s finished with exit status %s", command, code or 0)
        if code:
            if multirun:
                return _failed_job(command, f"exit status {code}")
            sys.exit(code)
        if multirun:
            _ok_job(command)
        return code

    return task


def _job_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


def _ok_job(command: str) -> None:
    """A successful job whose command recorded no row of its own still gets one in the summary."""
    from hexicore.app.sweep import record, recorded

    if not recorded():
        record({"command": command})


def _failed_job(command: str, message: str) -> int:
    from hexicore.app.sweep import record

    log.error("%s failed: %s", command, message)
    record({"command": command, "outcome": "failed", "error": message})
    return 1


BASH_COMPLETION = """# hexicore bash completion: eval "$(hexicore --shell-completion bash)"
_hexicore_complete() {
    local IFS=$'\\n'
    COMPREPLY=($(hexicore __complete "${COMP_LINE:0:COMP_POINT}" 2>/dev/null))
}
complete -o nospace -o default -F _hexicore_complete hexicore
"""


def complete_line(line: str) -> list[str]:
    """Completion replies for a bash command line up to the cursor. Bash splits words at ``=``,
    so after ``key=`` only the value part is replied."""
    words = line.split()[1:] + ([""] if not line or line[-1].isspace() else [])
    found = completions(words)
    if words and "=" in words[-1]:
        return [c.split("=", 1)[1] for c in found]
    return found


def completions(words: Sequence[str]) -> list[str]:
    """Candidates for the last of ``words`` (the words after ``hexicore``): a command first,
    then ``group=option`` and ``key=`` / ``section.key=`` names of the composed config."""
    words = list(words) or [""]
    if len(words) == 1:
        return [c for c in COMMANDS if c.startswith(words[0])]
    word = words[-1]
    if "=" in word:
        key, _, prefix = word.partition("=")
        if key in GROUPS:
            return [f"{key}={o}" for o in _group_options(key) if o.startswith(prefix)]
        return []
    from omegaconf import OmegaConf

    from hexicore.app.compose import config_from_overrides

    cfg = config_from_overrides([])
    names = [f"{g}=" for g in GROUPS]
    for k, v in cfg.items():
        if OmegaConf.is_dict(v) and k not in GROUPS:
            names += [f"{k}.{sub}=" for sub in v.keys()]
        elif k not in GROUPS:
            names.append(f"{k}=")
    for g in GROUPS:
        names += [f"{g}.{sub}=" for sub in (cfg.get(g) or {}).keys() if sub != "name"]
    return sorted(n for n in names if n.startswith(word))
#: Hydra's modes, of which a command line takes one (flag -> the name an error shows)
_MODES = {"-m": "-m", "--multirun": "-m", "--cfg": "--cfg", "-c": "--cfg", "--info": "--info", "-i": "--info",
          "--run": "--run", "-r": "--run", "--shell-completion": "--shell-completion", "-sc": "--shell-completion"}


def _check_flags(args: Sequence[str]) -> None:
    """Hydra's own argument parser on ``args``, its complaint (an unknown flag, ``--cfg`` without
    one of its choices) one line instead of argparse's usage and exit."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def refuse(message: str) -> None:
        raise HexicoreError(message, source="command line")

    parser.error = refuse  # type: ignore[method-assign]
    parser.parse_args(list(args))


def hydra_args(args: Sequence[str]) -> list[str]:
    """``args`` as Hydra reads them: a bare ``--info``/``-i`` gets its default topic, ``all``
    (Hydra would read the next word, an override or the job name the CLI adds, as the topic);
    two of Hydra's modes (``-m --cfg job``) are one line (Hydra raised a ValueError); flags go
    before the overrides (``solver=x --cfg job`` and ``a=1,2 -m b=3`` were argparse errors)."""
    out = list(args)
    for i in range(len(out) - 1, -1, -1):
        if out[i] in ("--info", "-i") and (i + 1 == len(out) or out[i + 1] not in _INFO_TOPICS):
            out.insert(i + 1, "all")
    modes = sorted({_MODES[a] for a in out if a in _MODES})
    if len(modes) > 1:
        raise HexicoreError(f"{' and '.join(modes)} cannot be combined; give one of -m, --cfg, --info",
                            source="command line")
    valued = {i + 1 for i, a in enumerate(out) if a in _VALUED_FLAGS}  # the word after --cfg, -p, --info
    first = [i for i, a in enumerate(out) if a.startswith("-") or i in valued]  # Hydra takes no override after a flag
    ordered = [out[i] for i in first] + [a for i, a in enumerate(out) if i not in first]
    _check_flags(ordered)
    return ordered


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--shell-completion"]:
        if argv[1:] not in ([], ["bash"]):
            return fail("only bash completion is provided: hexicore --shell-completion bash")
        print(BASH_COMPLETION, end="")
        return 0
    if argv[:1] == ["__complete"]:
        print("\n".join(complete_line(" ".join(argv[1:]) if len(argv) != 2 else argv[1])))
        return 0
    if not argv or argv[0] in ("-h", "--help", "help"):
        width = max(map(len, COMMANDS))
        print(USAGE.format(commands="\n".join(f"  {c:<{width}}  {d}" for c, d in COMMANDS.items())))
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        return fail(f"unknown command {command!r}; choose one of: {', '.join(COMMANDS)}")
    try:
        if command == "gpus":  # no Hydra config, no plugins: the catalog only
            from hexicore.app.commands.gpus import gpus_command

            return gpus_command(argv[1:])
        from hexicore.registry import Registry

        from hexicore.app.config_schema import store_schema

        rest = hydra_args(rest) if command != "plugins" else rest  # plugins takes no argument: it says so itself
        store_schema()
        Registry.default().store_configs()
        from hexicore.app.commands.plugins import plugins_command, warn_broken_plugins

        if command == "plugins":
            return plugins_command(argv[1:])
        if any(a in ("--help", "-h") for a in rest):
            from hexicore.app.config_schema import GROUPS
            from hexicore.app.key_help import command_help

            print(command_help(command, COMMANDS[command], {g: _group_options(g) for g in GROUPS},
                               frozenset(COMMANDS)))
            return 0
        warn_broken_plugins()
        restore = None
        if not any(a in ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--version") for a in rest):
            from hexicore.app.hydra_output import prepare, sweep_jobs

            job = preflight(rest)
            multirun = _multirun(rest)
            outputs = prepare(job, command, multirun=multirun, jobs=sweep_jobs(hydra_overrides(rest)) if multirun else ())
            rest = [a for a in rest if not a.startswith(outputs.pin.split("=", 1)[0] + "=")] + [outputs.pin]
            restore = outputs.restore
        elif not any(a in ("--help", "-h", "--hydra-help", "--info", "-i", "--version") for a in rest):
            preflight(rest)
    except HexicoreError as exc:
        return fail(exc)

    import hydra

    task = _task(command, restore)
    task.__name__ = f"hexicore_{command.replace('-', '_')}"
    wrapped = hydra.main(version_base="1.3", config_path="pkg://hexicore.conf", config_name="config")(task)
    saved = sys.argv
    if not any(a.startswith("hydra.job.name=") for a in rest):
        rest = [*rest, f"hydra.job.name={command.replace('-', '_')}"]
    sys.argv = [f"hexicore {command}", *rest]
    try:
        wrapped()
    finally:
        sys.argv = saved
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().cfg = None  # the run is over: library calls after it see no Hydra job
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
