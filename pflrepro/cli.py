"""Command line: `python -m pflrepro {run,list,data,partition,claims,report,train,render,cost,tune,prune,explain}` (also
the `pflrepro` script). `python -m pflrepro VERB -h` describes each.

    python -m pflrepro run algorithm=fedprox hparams.mu=0.01 dataset=fmnist rounds=20
    python -m pflrepro run --config my.yaml seed=1
    python -m pflrepro list
    python -m pflrepro data fmnist
    python -m pflrepro partition partition=dirichlet partition_params.alpha=0.1 --out fig.png
    python -m pflrepro claims [--results DIR] [--paper pfedsd] [--on-paper-numbers] [--format markdown]
    python -m pflrepro report [--results DIR] [--figures DIR] [--out DIR]
    python -m pflrepro train pfedsd_table2 pfedsd_table3 --out results/train/pfedsd.json [--jobs 2] [--executor ray]
    python -m pflrepro render pfedsd_table2 pfedsd_table4 [--jobs 2]
    python -m pflrepro cost pfedsd_table2 [--profile paper]
    python -m pflrepro tune perfed_ckt_table1 --profile mini [--methods fedavg] [--apply]
    python -m pflrepro prune [--results DIR] [--dry-run]

`train`, `cost` and `tune` take `run`'s key=value settings too, applied to every run of their grids (the last
layer, pflrepro.pipeline.experiments.grid), and `seeds=[0,1]` for the profile's seeds:

    python -m pflrepro train pfedsd_table2 --profile paper device=cuda rounds=3 seeds=[0]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .params import MAX_YAML_DEPTH, ConfigError, load_yaml


def parse_overrides(pairs: list[str]) -> dict:
    """`a=1 b.c=x` -> {"a": 1, "b": {"c": "x"}}; values parsed as YAML scalars/lists (`params.load_yaml`). A pair that
    is not key=value, or whose value is not run settings, is a ConfigError naming it."""
    out: dict = {}
    for p in pairs:
        key, eq, val = p.partition("=")
        if not eq or not key:
            raise ConfigError(f"expected key=value, got {p[:200]!r}")
        node = out
        *parents, leaf = key.split(".")
        if len(parents) >= MAX_YAML_DEPTH:
            raise ConfigError(f"{key[:60]}...: nested more than {MAX_YAML_DEPTH} levels deep: not run settings")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}={val}: {part} is set to a value, not settings, by an earlier override")
        node[leaf] = load_yaml(val, f"{key}={val if len(val) <= 60 else val[:60] + '...'}")
    return out


def _gather_overrides(a, extras: list[str]) -> list[str]:
    """A verb with `overrides` collects every key=value of its command line, wherever it stands: argparse gives a
    `names` (nargs="+") the ones after the names, and leaves those after an option unparsed. Returns the rest."""
    if not hasattr(a, "overrides"):
        return extras
    pairs = [x for x in getattr(a, "names", None) or () if "=" in x]
    if pairs:
        a.names = [x for x in a.names if "=" not in x]
    pairs += a.overrides + [x for x in extras if "=" in x and not x.startswith("-")]
    a.overrides = pairs
    return [x for x in extras if "=" not in x or x.startswith("-")]


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _add_run(sub) -> None:
    r = sub.add_parser("run", help="run one config (or return its stored result)")
    r.add_argument("--config", help="YAML file with run settings")
    r.add_argument("--force", action="store_true", help="rerun even if a stored result exists")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--yes", action="store_true", help="run even if the estimated cost is absurd (over 30 days)")
    r.add_argument("overrides", nargs="*", help="key=value settings")


def _add_explain(sub) -> None:
    e = sub.add_parser("explain", help="every setting of one run of a notebook, and the params file and layer it "
                       "comes from (as git config --show-origin)")
    e.add_argument("name", help="notebook (params/<name>.yaml)")
    e.add_argument("method", nargs="?", help="default: the profile's first method")
    e.add_argument("setting", nargs="?", help="default: the profile's first setting")
    e.add_argument("--profile", help="default: the params file's own")
    e.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="command-line settings, as `run`")


def _explain(a) -> int:
    from .pipeline import explain
    pairs = [x for x in (a.method, a.setting) if x and "=" in x]      # key=value where a method or setting stands
    method, setting = [x if x and "=" not in x else None for x in (a.method, a.setting)]
    print(explain.text(a.name, method, setting, a.profile, parse_overrides(pairs + a.overrides) or None))
    return 0


def _add_list(sub) -> None:
    sub.add_parser("list", help="list algorithms, models, datasets, partitioners, splits and run settings")


def _add_data(sub) -> None:
    d = sub.add_parser("data", help="load a dataset and print where it came from and its checks")
    d.add_argument("name")
    d.add_argument("--download", action="store_true")
    d.add_argument("--save", help="also write a tensor cache (.pt, weights_only-loadable) here")


def _add_partition(sub) -> None:
    p = sub.add_parser("partition", help="draw a partition (clients x classes bubble chart)")
    p.add_argument("--out", required=True)
    p.add_argument("overrides", nargs="*")


def _add_claims(sub) -> None:
    from .reporting import claims
    claims.add_arguments(sub.add_parser("claims", help="check the papers' claims on reproduced tables "
                                        "(holds/partial/fails/inconclusive/underpowered/by design/not run)"))


def _add_report(sub) -> None:
    from .reporting import replication
    replication.add_arguments(sub.add_parser("report", help="one report (HTML with figures embedded, markdown, "
                                             "summary): every stage, its provenance and compute, the claims"))


GRID_OVERRIDES = ("run settings as for `run` (device=cuda, rounds=3, hparams.mu=0.1, clock.sigma=1), applied to every "
                  "run; seeds=[0,1] replaces the profile's seeds (seed and algorithm are the grid's own); an hparams.X "
                  "only suits grids whose algorithms all have X")


def _add_train(sub) -> None:
    t = sub.add_parser("train", help="train every run some notebooks need, as one queue (their default profiles); "
                       "write the manifest of their runs")
    t.add_argument("names", nargs="+", help="notebook names (params/<name>.yaml)")
    t.add_argument("--out", help="write the manifest (JSON) here")
    t.add_argument("--profile", help="instead of each params file's default profile")
    t.add_argument("--jobs", help="runs at once ('auto' or an integer; default $PFLREPRO_JOBS or auto)")
    t.add_argument("--executor", help="where missing runs train: local (default: $PFLREPRO_EXECUTOR or local), "
                   "stacked[:runs=N] (one process, clients of several runs trained together: for a GPU), "
                   "ray, ray:ADDRESS[,cpus=N,gpus=F,shared] (pflrepro.pipeline.executors)")
    t.add_argument("--progress", default="log", choices=["log", "bars", "none"])
    t.add_argument("--stop-on-error", action="store_true", help="stop at the first run that fails (default: name it "
                   "and train the others)")
    t.add_argument("overrides", nargs="*", metavar="key=value", help=GRID_OVERRIDES)


def _add_cost(sub) -> None:
    c = sub.add_parser("cost", help="what the notebooks' runs cost before they run: training FLOPs, time on this "
                       "machine (measured rate) and on a GPU (stated rate)")
    c.add_argument("names", nargs="+", help="notebook names (params/<name>.yaml)")
    c.add_argument("--profile", default="paper", help="profile to cost (default: paper)")
    c.add_argument("--jobs", type=int, help="runs at once on this machine (default: auto)")
    c.add_argument("--missing", action="store_true", help="count only runs not in the store yet")
    c.add_argument("overrides", nargs="*", metavar="key=value", help=GRID_OVERRIDES)


def _add_prune(sub) -> None:
    p = sub.add_parser("prune", help="delete the checkpoints of finished runs that no later stage reads (a store written "
                       "before runs dropped them); unfinished runs keep theirs")
    p.add_argument("--results", help="run store (default: $PFLREPRO_RESULTS/runs, i.e. results/runs)")
    p.add_argument("--dry-run", action="store_true", help="only say what would go")


def _add_render(sub) -> None:
    from .pipeline import notebooks
    notebooks.add_arguments(sub.add_parser("render", help="render notebooks through papermill, several at a time "
                                           "(results/<name>/<name>.ipynb): a paper's render stage"))


def _render(a) -> int:
    from .pipeline import notebooks
    return notebooks.main(a)


def _add_tune(sub) -> None:
    from .pipeline import tune
    tune.add_arguments(sub.add_parser("tune", help="grid search over a notebook's methods (params/tune/<name>.yaml), "
                                      "the best point per method; --apply records it in params/<name>.yaml"))


def _config(a):
    """The run config of `run` and `partition`: --config YAML, then key=value overrides, validated."""
    from .federation.config import RunConfig
    cfg_dict: dict = {}
    if getattr(a, "config", None) is not None:
        if not a.config.strip():
            raise ConfigError("--config '': an empty path; name a YAML file of run settings, or leave --config out")
        try:
            with open(a.config, encoding="utf-8") as f:
                cfg_dict = load_yaml(f.read(), f"--config {a.config}") or {}
        except OSError as e:
            raise ConfigError(f"--config {a.config}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"--config {a.config}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if not isinstance(cfg_dict, dict):
            raise ConfigError(f"--config {a.config}: expected a mapping of run settings, got {type(cfg_dict).__name__}")
    return RunConfig.from_dict(_merge(cfg_dict, parse_overrides(a.overrides)))


SAY_HOURS = 1 / 6        # a run estimated above 10 minutes says what it will cost before it starts
ABSURD_HOURS = 24 * 30   # above 30 days (a lower bound, on this machine or the stated GPU rate) it needs --yes


def _run_cost(cfg) -> tuple[dict, float]:
    """A run's estimated cost (pflrepro.pipeline.budget.grid_cost) and training hours, a lower bound: on this machine,
    or at the stated GPU rate for a run on a GPU."""
    from .pipeline import budget
    cost = budget.grid_cost([cfg], jobs=1)
    return cost, cost["total"]["wall_hours" if cfg.device == "cpu" else "gpu_hours"]


def _settings_to_blame(cfg) -> list[str]:
    """The numeric settings (as key=value) each of which alone makes a run absurd: set back to its default (or to 1,
    where the default is refused, e.g. public.size=0 for FedDF) the estimate falls under ABSURD_HOURS. Runs only on
    the refusal path: each try is a cost estimate (milliseconds; a new batch size measures its rate once)."""
    from . import algorithms
    from .federation.config import PUBLIC_SCHEMA, RUN_SCHEMA, RunConfig
    d = cfg.to_dict()
    blame = []
    for section, schema in (("", RUN_SCHEMA), ("hparams", algorithms.ALGORITHMS[cfg.algorithm].HPARAMS),
                            ("public", PUBLIC_SCHEMA)):
        given = d[section] if section else d
        for k, p in schema.items():
            if p.type not in (int, float) or given.get(k) == p.default or p.default is None:
                continue
            for v in (p.default, 1):
                tried = {**d, section: {**given, k: v}} if section else {**d, k: v}
                try:
                    if _run_cost(RunConfig.from_dict(tried))[1] <= ABSURD_HOURS:
                        blame.append(f"{section + '.' if section else ''}{k}={given[k]!r}")
                    break
                except ConfigError:
                    continue
    return blame


def _check_cost(cfg, yes: bool) -> None:
    """Say what a long run costs before it starts (pflrepro.pipeline.budget: training FLOPs at the rate measured here,
    a lower bound); refuse an absurd one (e.g. rounds=1e9) unless --yes, in one line that names the settings to
    blame (issue 33: the cost went to a line of its own, above the error)."""
    from .pipeline import budget
    cost, hours = _run_cost(cfg)
    said = budget.describe(cost, "run").splitlines()[0]
    if hours > ABSURD_HOURS and not yes:
        blame = _settings_to_blame(cfg)
        why = (", ".join(blame) + (" alone makes it so: lower it" if len(blame) == 1 else " each alone make it so: "
               "lower them") if blame else "check rounds, local_epochs, n_clients and the hparams' epochs")
        raise ConfigError(f"this run would train for at least {budget.hours(hours)} ({said}): {why}, or pass --yes "
                          "to run it anyway")
    if hours > SAY_HOURS:
        print(said, file=sys.stderr)


def _check_data(cfg) -> None:
    """The datasets a run reads are on this machine (loaded now; the run reuses them): one that is not is a config
    error naming its key, before the run's folder exists (issue 33: a traceback, and a folder left with config.json)."""
    from .data.datasets import DatasetUnavailable
    from .federation.build import public_indices, raw_dataset
    public = cfg.public["dataset"] if cfg.public["size"] else ""
    for key, name in (("dataset", cfg.dataset), ("public.dataset", public)):
        try:
            if name:
                raw_dataset(name)
        except DatasetUnavailable as e:
            raise ConfigError(f"{key}={name!r}: " + " ".join(line.strip() for line in str(e).splitlines())) from None
    if cfg.public["size"]:
        public_indices(cfg)   # a public set larger than what the run leaves: refused before the cost is said


def _run(a) -> int:
    from .pipeline.store import is_finished, run, run_dir
    cfg = _config(a)
    if a.force or not is_finished(run_dir(cfg)):
        _check_data(cfg)
        _check_cost(cfg, a.yes)
    res = run(cfg, progress=not a.quiet, force=a.force)
    print(json.dumps({"path": str(res.path), "summary": res.summary}, indent=2))
    return 0


def allowed(p) -> str:
    """What a `Param`'s check accepts, in words: the type, and the choices or the range."""
    if p.choices is not None:
        return "one of " + ", ".join(map(repr, p.choices))
    lo = "" if p.low is None else f"{'>' if p.low_open else '>='} {p.low:g}"
    hi = "" if p.high is None else f"<= {p.high:g}"
    return p.type.__name__ + (f" {lo}" if lo else "") + (f", {hi}" if lo and hi else f" {hi}" if hi else "")


def _settings(schema: dict, indent: str = "    ") -> list[str]:
    """One line per setting: name, default, what is allowed, help."""
    return [f"{indent}{k:<18} default={p.default!r:<10} {allowed(p):<22} {p.help}" for k, p in schema.items()]


def _list(a) -> int:
    from . import algorithms
    from .data import datasets, models, partition
    from .federation.config import RUN_SCHEMA
    print("models:    ", ", ".join(sorted(models.MODELS)))
    print("datasets:  ", ", ".join(datasets.DATASETS))
    print("\nalgorithms (hparams.<name>=...):")
    for name, cls in sorted(algorithms.ALGORITHMS.items()):
        print(f"  {name}" + ("" if cls.HPARAMS else "  (no settings)"))
        print("\n".join(_settings(cls.HPARAMS)) if cls.HPARAMS else "", end="\n" if cls.HPARAMS else "")
    print("\npartitions (partition_params.<name>=...):")
    for name in sorted(partition.PARTITIONERS):
        print(f"  {name}", *_settings(partition.PARTITION_SCHEMAS[name]), sep="\n")
    print("\nsplits (split_params.<name>=...):")
    for name in sorted(partition.SPLITS):
        print(f"  {name}", *_settings(partition.SPLIT_SCHEMAS[name]), sep="\n")
    print("\nrun settings:")
    print("\n".join(_settings(RUN_SCHEMA, "  ")))
    return 0


def _data(a) -> int:
    import hashlib
    from pathlib import Path

    from .data.datasets import CACHE_REBUILT, load_dataset, save_tensor_cache
    ds = load_dataset(a.name, download=a.download)   # a tensor cache that differs from the checked source: set aside,
    bad = CACHE_REBUILT.get(a.name)                   # rebuilt (data.datasets._load_tensor_cache)
    counts = ds.y_train.bincount(minlength=ds.spec.num_classes).tolist()
    info = {"dataset": a.name, "source": ds.source, "train": list(ds.x_train.shape),
            "test": list(ds.x_test.shape), "train_label_counts": counts,
            "sha256_x_train": hashlib.sha256(ds.x_train.numpy().tobytes()).hexdigest(),
            "tensor_cache": "rebuilt: it " + bad if bad else "checked" if a.name == "fmnist" else "not checked"}
    if a.save:
        info["saved"] = str(save_tensor_cache(ds, Path(a.save)))
    print(json.dumps(info, indent=2))
    return 0


def _partition(a) -> int:
    from .data.partition import label_counts, plot_partition
    from .federation.build import build_partition, raw_dataset
    cfg = _config(a)
    if not os.path.isdir(os.path.dirname(os.path.abspath(a.out))):
        raise ConfigError(f"--out {a.out}: its folder does not exist (create it first)")
    _check_data(cfg)
    split = build_partition(cfg)
    raw = raw_dataset(cfg.dataset)
    y = (raw.pooled()[1] if cfg.pool == "train+test" else raw.y_train).numpy()
    fig = plot_partition(label_counts(y, split["train"], raw.spec.num_classes),
                         title=f"{cfg.dataset} {cfg.partition} {cfg.partition_params} K={cfg.n_clients}")
    fig.savefig(a.out, dpi=120, bbox_inches="tight")
    print(a.out)
    return 0


def _claims(a) -> int:
    from .reporting import claims
    return claims.run_cli(a)


def _report(a) -> int:
    from .reporting import replication
    return replication.run_cli(a)


def _prune(a) -> int:
    from .pipeline.store import prune_checkpoints
    n, size = prune_checkpoints(a.results, dry_run=a.dry_run)
    print(f"{'would delete' if a.dry_run else 'deleted'} {n} checkpoints of finished runs, {size / 1e9:.2f} GB")
    return 0


def _tune(a) -> int:
    from .pipeline import tune
    return tune.run_cli(a, parse_overrides(a.overrides))


def _cost(a) -> int:
    from .pipeline import budget
    from .pipeline.experiments import grid, load_profile
    from .pipeline.store import is_finished, run_dir
    overrides = parse_overrides(a.overrides)
    for name in a.names:   # a ConfigError: one line from main, like every verb's
        cfgs = [c for c in grid(load_profile(name, a.profile), overrides).values()
                if not (a.missing and is_finished(run_dir(c)))]
        print(budget.describe(budget.grid_cost(cfgs, jobs=a.jobs), " ".join([f"{name}/{a.profile}", *a.overrides])))
    return 0


def _train(a) -> int:
    from pathlib import Path

    from .pipeline.experiments import train_notebooks
    label = Path(a.out).stem if a.out else "train"
    manifest = train_notebooks(a.names, a.profile, a.jobs, {"log": "log", "bars": True, "none": False}[a.progress],
                               label=label, executor=a.executor, overrides=parse_overrides(a.overrides) or None,
                               keep_going=not a.stop_on_error)
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    n = len({d for ds in manifest["notebooks"].values() for d in ds})
    print(f"{len(a.names)} notebooks, {n} distinct runs stored" + (f"; manifest {a.out}" if a.out else ""))
    return 0


# verb -> (add its parser, run it): a new verb is one entry (docs/architecture.md). A verb's runner imports what it
# runs inside itself, and `main` builds only its parser: `render` (every render stage) must not load torch or the
# reporting layer (5.7 s before its first notebook started; tests/test_render.py::test_a_verb_builds_only_its_own_parser),
# so the function-level imports of this module are deliberate (tests/test_architecture.py allows them here).
VERBS = {"run": (_add_run, _run), "list": (_add_list, _list), "data": (_add_data, _data),
         "partition": (_add_partition, _partition), "claims": (_add_claims, _claims), "report": (_add_report, _report),
         "train": (_add_train, _train), "cost": (_add_cost, _cost), "tune": (_add_tune, _tune),
         "prune": (_add_prune, _prune), "render": (_add_render, _render), "explain": (_add_explain, _explain)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="pflrepro", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    argv = sys.argv[1:] if argv is None else list(argv)
    verb = argv[0] if argv and argv[0] in VERBS else None   # only its parser: some import the reporting layer (2-5 s)
    for name, (add, _) in VERBS.items():
        if verb in (None, name):
            add(sub)
    a, extras = ap.parse_known_args(argv)
    extras = _gather_overrides(a, extras)
    if extras:
        ap.error(f"unrecognized arguments: {' '.join(extras)}")
    if getattr(a, "names", None) == []:   # only key=value pairs where notebook names belong
        ap.error(f"{a.cmd}: name at least one notebook (params/<name>.yaml) before its key=value settings")
    try:  # a setting the data refuses (n_clients above the pool's samples) is a config error too: one line
        return VERBS[a.cmd][1](a)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except OSError as e:   # a full disk, a read-only or forbidden folder, in any verb: one line (the store's own
        from .pipeline.store import UNWRITABLE   # writes say which run: pipeline.store.StoreUnwritable)
        if e.errno not in UNWRITABLE:
            raise
        print(f"storage error: {os.strerror(e.errno)}" + (f": {e.filename}" if e.filename else ""), file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # Ctrl-C: one line, no traceback; runs keep their last checkpoints and resume
        print("interrupted: runs keep their last checkpoints; the same command resumes them", file=sys.stderr)
        return 130
    except RuntimeError as e:
        from .core.engines import MemoryBudgetError, NotBatchable
        from .core.training import Divergence
        from .pipeline.parallel import GridFailed
        from .pipeline.store import StoreUnwritable
        if isinstance(e, StoreUnwritable):   # the store is full or read-only: which run, and that it resumes
            print(f"storage error: {e}", file=sys.stderr)
            return 1
        if isinstance(e, GridFailed):   # a grid whose runs failed: each named in one line (the others are stored)
            print(f"grid: {e}", file=sys.stderr)
            return 1
        if isinstance(e, (MemoryBudgetError, NotBatchable)):   # engine / memory_budget_mb refused before round 1
            print("config error: " + " ".join(str(e).split()), file=sys.stderr)
            return 2
        if isinstance(e, Divergence):   # the loss became NaN/inf (its settings, e.g. a huge lr): one line, exit 1
            print("run diverged: " + " ".join(str(e).split()), file=sys.stderr)
            return 1
        raise
