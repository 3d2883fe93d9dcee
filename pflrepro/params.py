"""The settings vocabulary every registry declares with: `Param` (type, default, range, help),
`check_params` (validate a dict against a schema, fill defaults) and `ConfigError` (one line naming
key, value and what is allowed). The bottom layer: it imports nothing of pflrepro."""
from __future__ import annotations

import difflib
import functools
import math
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A bad configuration value; the message names the key, the value and what is allowed."""


def did_you_mean(name, known) -> str:
    """' (did you mean 'x'?)' when one of `known` is close to `name` (difflib's ratio >= 0.6), else ''."""
    if not isinstance(name, str):
        return ""
    near = difflib.get_close_matches(name, [str(k) for k in known], n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


# Upper bounds of the epoch- and step-like settings (issue 33: `hparams.pm_epochs=1e9` ran for ever): far above any
# paper's value (the largest: FedRep's 10 head epochs, pFedMe's K = 5, FedDF's 10^4 distillation steps).
MAX_EPOCHS = 1000
MAX_STEPS = 10**6
# float32's smallest normal and largest finite values (numpy.finfo(numpy.float32).tiny, .max): a float setting outside
# them becomes 0 or inf inside torch (issue 33's fuzz test: lr=1e300 overflowed SGD, temperature=1e-300 divided by 0)
FLOAT32_TINY = 1.1754943508222875e-38
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class Param:
    """Declaration of one setting: type, default, allowed range/choices, help text."""
    type: type
    default: Any
    help: str = ""
    low: float | None = None          # inclusive unless low_open
    high: float | None = None         # inclusive
    low_open: bool = False
    choices: tuple | None = None

    def check(self, key: str, value: Any) -> Any:
        t = self.type
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if t is float and isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if t is tuple and isinstance(value, list):
            value = tuple(value)
        if not isinstance(value, t) or (t in (int, float) and isinstance(value, bool)):
            raise ConfigError(f"{key}={value!r}: expected {t.__name__}, got {type(value).__name__}")
        if t is float and not math.isfinite(value):  # nan passes every range check (its comparisons are False)
            raise ConfigError(f"{key}={value!r}: must be a finite number")
        if t is float and value != 0 and not FLOAT32_TINY <= abs(value) <= FLOAT32_MAX:   # torch computes in float32
            raise ConfigError(f"{key}={value!r}: not representable as a 32-bit float (|x| between "
                              f"{FLOAT32_TINY:.3g} and {FLOAT32_MAX:.3g}, or 0)")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{key}={value!r}: allowed values are {', '.join(map(repr, self.choices))}"
                              + did_you_mean(value, self.choices))
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            raise ConfigError(f"{key}={value!r}: must be {'>' if self.low_open else '>='} {self.low}")
        if self.high is not None and value > self.high:
            raise ConfigError(f"{key}={value!r}: must be <= {self.high}")
        return value


def check_params(prefix: str, given: dict, schema: dict[str, Param]) -> dict:
    """Validate a dict of settings against a schema; fill defaults."""
    if not isinstance(given, dict):
        raise ConfigError(f"{prefix}={given!r}: expected a mapping")
    unknown = sorted(set(given) - set(schema), key=str)   # a YAML file's keys may be numbers
    if unknown:
        allowed = ", ".join(sorted(schema)) or "(none)"
        name = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"{name}={given[unknown[0]]!r}: unknown key{did_you_mean(unknown[0], schema)}; "
                          f"allowed: {allowed}")
    out = {}
    for k, p in schema.items():
        # a setting whose default is None ("not set") may be given as None: a validated config re-validates
        out[k] = p.check(f"{prefix}.{k}" if prefix else k, given[k]) if k in given and not (
            given[k] is None and p.default is None) else p.default
    return out


# ---------------------------------------------------------------- settings written as YAML (--config, overrides)
MAX_YAML_VALUES = 10_000   # a run config holds a few dozen settings
MAX_YAML_VALUES_SAY = (f"more than {MAX_YAML_VALUES:,} values once its YAML aliases are expanded (a 'billion laughs' "
                       "document, whose repr in an error message never ends): not run settings")
MAX_YAML_DEPTH = 32        # a run config nests three levels (hparams, clock, schedule, public ...)


def _shape_problem(value) -> str | None:
    """Why a YAML value cannot be run settings: more than MAX_YAML_VALUES values with its aliases expanded (issue 33:
    ten nested lists of ten aliases each hung the config check), or nested deeper than MAX_YAML_DEPTH (issue 52:
    10,000 nested lists overflowed Python's stack in every later step). Iterative: it cannot overflow itself."""
    todo, seen = [(value, 1)], 0
    while todo:
        v, depth = todo.pop()
        seen += 1
        if seen > MAX_YAML_VALUES:
            return MAX_YAML_VALUES_SAY
        if depth > MAX_YAML_DEPTH:
            return f"nested more than {MAX_YAML_DEPTH} levels deep: not run settings"
        if isinstance(v, dict):
            todo += [(x, depth + 1) for x in (*v.keys(), *v.values())]
        elif isinstance(v, (list, tuple)):
            todo += [(x, depth + 1) for x in v]
    return None


class _DuplicateKey(Exception):
    def __init__(self, key, line: int):
        super().__init__(key, line)
        self.key, self.line = key, line


@functools.cache
def _strict_loader():
    """PyYAML's safe loader that refuses a repeated key (`_DuplicateKey`), built once."""
    import yaml

    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key) if isinstance(key, (str, int, float, bool)) else None
        return loader.construct_mapping(node, deep=deep)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return Strict


def load_yaml(text: str, what: str):
    """Settings written as YAML (a --config file, an override's value), refused in one line naming `what` when they
    are not YAML, repeat a key (YAML would keep the last silently: `lr: 0.05` then `lr: 0.5` trained at 0.5), nest too
    deep (PyYAML's composer recurses) or expand to too many values."""
    import yaml
    try:
        value = yaml.load(text, Loader=_strict_loader())
    except _DuplicateKey as e:
        raise ConfigError(f"{what}: the key {e.key!r} appears twice (line {e.line}); YAML would keep the last one "
                          "silently") from None
    except RecursionError:
        raise ConfigError(f"{what}: nested more than {MAX_YAML_DEPTH} levels deep: not run settings") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{what}: not valid YAML ({str(e).splitlines()[0]})") from None
    if (why := _shape_problem(value)) is not None:
        raise ConfigError(f"{what}: {why}")
    return value
