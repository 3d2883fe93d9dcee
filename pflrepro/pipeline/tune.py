"""Grid search over a notebook's methods, as PerFed-CKT's appendix E tuned every baseline, and the choice recorded
in the notebook's params.

    python -m pflrepro tune perfed_ckt_table1 --profile mini [--methods fedavg,perfed_ckt_c1] [--apply] [rounds=2 ..]

The search space is data: `params/tune/<notebook>.yaml` gives, per profile, a `space` every method searches
(dotted run settings: `lr`, `batch_size`, `hparams.tau`, ...) and `per_method` spaces added for methods whose
name matches a pattern (fnmatch: `perfed_ckt_*` also searches b' and lambda). Every grid point is one ordinary run
of the notebook's grid with the method's settings overridden, so it lands in the content-addressed store
(`results/runs`): a point equal to the params' current setting is the table's own run, trains once, and a search
interrupted halfway resumes where it stopped. A method's score at a point is the notebook's `metric` (best round,
as the tables report it) averaged over its seeds and settings; the best point per method wins (ties: the first in
grid order). The scores go to `results/tune/<notebook>-<profile>/scores.csv` and `chosen.yaml`; `--apply` writes
each method's chosen values into `params/<notebook>.yaml` under that profile's `methods`, comments kept.

Appendix E selected on test accuracy ("to find the hyper-parameters with the highest test accuracy"); so does this
search, by default, since that is the protocol the paper's numbers come from (docs/fidelity.md).
"""
from __future__ import annotations

import fnmatch
import itertools
import json
from pathlib import Path

import pandas as pd
import yaml

from ..core.training import Divergence
from ..params import ConfigError
from ..paths import REPO_ROOT, results_root
from .experiments import grid, load_profile, merge, run_grid
from .store import is_finished, run_dir


def load_space(name: str, profile: str) -> dict:
    """params/tune/<name>.yaml's block for `profile`: {"space": {key: [values]}, "per_method": {pattern: {...}}}."""
    path = REPO_ROOT / "params" / "tune" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"params/tune/{name}.yaml does not exist: it holds the search space of `tune {name}`")
    doc = (yaml.safe_load(path.read_text()) or {}).get("profiles", {})
    if profile not in doc:
        raise ConfigError(f"profile={profile!r}: params/tune/{name}.yaml defines {', '.join(doc) or 'no profile'}")
    spec = {"space": {}, "per_method": {}, **doc[profile]}
    unknown = sorted(set(spec) - {"space", "per_method", "methods"})
    if unknown:
        raise ConfigError(f"params/tune/{name}.yaml:{profile}.{unknown[0]}: unknown key; allowed: space, per_method, "
                          "methods")
    for key, values in [*spec["space"].items(), *(kv for s in spec["per_method"].values() for kv in s.items())]:
        if not isinstance(values, list) or not values:
            raise ConfigError(f"params/tune/{name}.yaml:{profile}: {key}={values!r}: expected a non-empty list")
    return spec


def points(space: dict) -> list[dict]:
    """Every combination of the space's values, in grid order: {"lr": [1, 2], "b": [3]} -> [{lr: 1, b: 3}, {lr: 2, b: 3}]."""
    keys = list(space)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(space[k] for k in keys))]


def nest(point: dict) -> dict:
    """Dotted keys to nested run settings: {"hparams.lam": 2, "lr": 0.1} -> {"hparams": {"lam": 2}, "lr": 0.1}."""
    out: dict = {}
    for key, value in point.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def method_space(spec: dict, method: str) -> dict:
    space = dict(spec["space"])
    for pattern, extra in spec["per_method"].items():
        if fnmatch.fnmatch(method, pattern):
            space.update(extra)
    return space


def only(P: dict, method: str, spec: dict) -> dict:
    """P with `method` (set to `spec`) its only method: settings that list their own `methods` keep it where they
    list it and are left out where they do not (Fig. 4's "S=5" runs FedAvg, FedRep and FedBSD only)."""
    settings = {}
    for name, s in (P.get("settings") or {}).items():
        if s and "methods" in s:
            if method not in s["methods"]:
                continue
            s = {**s, "methods": [method]}
        settings[name] = s
    return {**P, "methods": {method: spec}, **({"settings": settings} if "settings" in P else {})}


def dotted(tree: dict, prefix: str = "") -> list[str]:
    """`nest`'s inverse, keys only: {"hparams": {"lam": 2}, "lr": 0.1} -> ["hparams.lam", "lr"]."""
    return [k for key, v in tree.items()
            for k in (dotted(v, f"{prefix}{key}.") if isinstance(v, dict) and v else [f"{prefix}{key}"])]


def search_configs(P: dict, spec: dict, methods: list[str] | None = None,
                   overrides: dict | None = None) -> tuple[dict, dict]:
    """({(label, setting, seed): RunConfig}, {label: (method, point as JSON)}) for every method's every grid point,
    every config validated first; a label reads "method @ point" in progress lines. `overrides` (the command line's
    run settings, experiments.grid) apply to every point; one that sets a searched key is refused (every point would
    be the same run)."""
    methods = methods or spec.get("methods") or list(P["methods"])
    unknown = sorted(set(methods) - set(P["methods"]))
    if unknown:
        raise ConfigError(f"methods {unknown} are not in params/{P['name']}.yaml:{P['profile']} "
                          f"({', '.join(P['methods'])})")
    searched = {k for method in methods for k in method_space(spec, method)}
    clash = [k for k in dotted(overrides or {}) if k in searched or any(s.startswith(k + ".") for s in searched)]
    if clash:
        raise ConfigError(f"[{P['name']}/{P['profile']}] {clash[0]}: `tune` searches it (params/tune/{P['name']}.yaml:"
                          f"{P['profile']}); an override may set only what the search leaves fixed")
    configs, meta = {}, {}
    for method in methods:
        for pt in points(method_space(spec, method)):
            label = f"{method} @ " + " ".join(f"{k}={v}" for k, v in pt.items())
            meta[label] = (method, json.dumps(pt, sort_keys=True))
            Q = only(P, method, merge(P["methods"][method] or {}, nest(pt)))
            for (_, setting, seed), cfg in grid(Q, overrides).items():
                configs[(label, setting, seed)] = cfg
    return configs, meta


def diverged_runs(exc: BaseException, configs: dict, root: Path) -> list:
    """The keys of `configs` a Divergence stopped: started (their config is in the store) but unfinished. After a
    failed grid the other runs in training have finished (parallel.train_all stops handing out runs and waits), so
    these are the runs that raised. Empty when `exc` is not a divergence (a worker's is its traceback's text)."""
    if not isinstance(exc, Divergence) and "pflrepro.core.training.Divergence" not in str(exc):
        return []
    return [k for k, c in configs.items()
            if (run_dir(c, root) / "config.json").exists() and not is_finished(run_dir(c, root))]


def run_tolerating_divergence(configs: dict, root: Path, **kw) -> tuple[dict, dict]:
    """run_grid over `configs`, where a point whose run diverges (appendix E's grid reaches lr 0.1) is set aside and
    the rest of the grid goes on: ({key: RunResult} of the runs that finished, {key: RunConfig} of the diverged)."""
    todo, diverged = dict(configs), {}
    while True:
        try:
            return run_grid(todo, root=root, **kw), diverged
        except Exception as e:  # noqa: BLE001 - re-raised unless it is a divergence of identifiable runs
            bad = diverged_runs(e, todo, root)
            if not bad:
                raise
            for k in bad:
                diverged[k] = todo.pop(k)
            print(f"[tune] diverged, scored as failed: {', '.join(' / '.join(map(str, k)) for k in bad)}", flush=True)


def scores(results: dict, meta: dict, metric: str, stat: str = "best", diverged: dict | None = None) -> pd.DataFrame:
    """One row per run: method, point, setting, seed, score (the run's `metric` summary `stat`; NaN for a run that
    diverged), diverged."""
    rows = [{"method": meta[label][0], "point": meta[label][1], "setting": s, "seed": seed,
             "score": res.summary[metric][stat], "diverged": False} for (label, s, seed), res in results.items()]
    rows += [{"method": meta[label][0], "point": meta[label][1], "setting": s, "seed": seed,
              "score": float("nan"), "diverged": True} for (label, s, seed) in (diverged or {})]
    return pd.DataFrame(rows)


def choose(df: pd.DataFrame) -> dict:
    """{method: {"point": {...}, "score": mean, "runs": n}}: per method the point with the highest mean score over
    its seeds and settings; ties go to the point met first; a point with a diverged run is never chosen (a method
    whose every point diverged has no choice)."""
    out = {}
    if "diverged" in df:
        bad = df[df["diverged"]].groupby(["method", "point"]).size().index
        df = df[~df.set_index(["method", "point"]).index.isin(bad)]
    for method, g in df.groupby("method", sort=False):
        means = g.groupby("point", sort=False)["score"].agg(["mean", "size"])
        best = means["mean"].idxmax()   # first maximum in grid order
        out[method] = {"point": json.loads(best), "score": float(means.loc[best, "mean"]),
                       "runs": int(means.loc[best, "size"])}
    return out


def apply(path: Path, profile: str, chosen: dict) -> None:
    """Write each method's chosen values into `path` (a params file) under profiles.<profile>.methods.<method>,
    keeping its comments and layout (ruamel round trip)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap
    y = YAML()
    y.preserve_quotes = True
    y.width = 4096   # keep the file's own line breaks (ruamel folds at 80 columns otherwise)
    doc = y.load(path.read_text())
    methods = doc["profiles"][profile]["methods"]
    for method, c in chosen.items():
        if methods.get(method) is None:
            methods[method] = CommentedMap()
        node = methods[method]
        node.fa.set_flow_style()
        for key, value in c["point"].items():
            *parents, leaf = key.split(".")
            target = node
            for part in parents:
                if target.get(part) is None:
                    target[part] = CommentedMap()
                    target[part].fa.set_flow_style()
                target = target[part]
            target[leaf] = value
    with path.open("w") as f:
        y.dump(doc, f)


def tune(name: str, profile: str, methods: list[str] | None = None, jobs=None, progress="log", executor=None,
         write: bool = False, stat: str = "best", overrides: dict | None = None) -> dict:
    """Search, score, choose; `overrides` (run settings for every point, experiments.grid) go into chosen.yaml."""
    P = load_profile(name, profile)
    spec = load_space(name, profile)
    configs, meta = search_configs(P, spec, methods, overrides)
    results, diverged = run_tolerating_divergence(configs, results_root() / "runs", progress=progress, jobs=jobs,
                                                  name=f"tune {name}", executor=executor)
    df = scores(results, meta, P["metric"], stat, diverged)
    chosen = choose(df)
    out = results_root() / "tune" / f"{name}-{profile}"
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "scores.csv", index=False)
    (out / "chosen.yaml").write_text(yaml.safe_dump({"notebook": name, "profile": profile, "metric": P["metric"],
                                                     "stat": stat, "runs": len(df), "chosen": chosen,
                                                     **({"overrides": overrides} if overrides else {})},
                                                    sort_keys=False))
    if write:
        apply(REPO_ROOT / "params" / f"{name}.yaml", profile, chosen)
    return {"chosen": chosen, "scores": df, "out": out}


def add_arguments(t) -> None:
    t.add_argument("name", help="notebook name (params/<name>.yaml; the space is params/tune/<name>.yaml)")
    t.add_argument("--profile", default="mini")
    t.add_argument("--methods", help="comma-separated methods (default: the space's `methods`, else all)")
    t.add_argument("--jobs", help="runs at once ('auto' or an integer)")
    t.add_argument("--executor", help="local (default) or ray[:ADDRESS,...] (pflrepro.pipeline.executors)")
    t.add_argument("--stat", default="best", choices=["best", "last_mean", "final"],
                   help="which summary of the metric scores a run (default: best round, as the tables)")
    t.add_argument("--apply", action="store_true", help="write the chosen values into params/<name>.yaml (a choice "
                   "made under overrides too: chosen.yaml records them)")
    t.add_argument("overrides", nargs="*", metavar="key=value",
                   help="run settings as for `run` (rounds=2, clock.sigma=1), applied to every run of the search; "
                   "seeds=[0,1] replaces the profile's seeds; a key the space searches, seed and algorithm are "
                   "refused; an hparams.X only suits grids whose algorithms all have X")


def run_cli(a, overrides: dict | None = None) -> int:
    """`tune`'s verb; `overrides`: its key=value run settings, parsed (pflrepro.cli.parse_overrides)."""
    import sys
    try:
        r = tune(a.name, a.profile, a.methods.split(",") if a.methods else None, a.jobs, "log", a.executor,
                 a.apply, a.stat, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    for method, c in r["chosen"].items():
        print(f"{method}: {c['point']}  {c['score']:.4f} (mean of {c['runs']} runs)")
    print(f"scores: {r['out'] / 'scores.csv'}" + ("; params updated" if a.apply else ""))
    return 0
