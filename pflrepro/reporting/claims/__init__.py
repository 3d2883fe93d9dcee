"""The papers' claims about their own results, checked against what a profile reproduced.

Each paper has `paper_numbers/<paper>_claims.yaml`: the sentences its abstract and results sections say
about its own tables, each quoted exactly and given a machine-checkable form over the cells of one
table a notebook writes (`results/<stage>/<table>.csv`). `check()` evaluates every claim on a results
directory (default `results/`, or `$PFLREPRO_RESULTS`, as `experiments.output_dirs`) and returns one
row per claim: its verdict, its effect with a 95 % interval, the same effect on the paper's own printed numbers
and the verdict there, the competitors absent, the smallest per-client test set behind it, the runs it read,
and the numbers that decided it. `python -m pflrepro claims` prints it.

VERDICTS (pflrepro/reporting/verdicts.py has the statistics and the rule in full):
- **holds**: the 95 % interval of the claim's effect lies on the claimed side (for a magnitude: on the claimed
  side and consistent with the claimed magnitude); **partial**: it holds among the competitors that ran, but
  some of the paper's competitors did not run (a `best` claim over 3 of the paper's 7 methods);
- **fails**: the interval lies on the other side, or excludes the claimed magnitude, or (quantifier `all`) one
  cell is decidedly against the claim at the Bonferroni level;
- **inconclusive**: the interval straddles, and the profile could have detected the paper's own effect;
- **underpowered**: the interval straddles and the minimum detectable effect at this profile's seeds and spread
  exceeds the paper's own effect, or there is no interval (fewer than 3 seeds: no verdict from an assumed noise);
- **by design**: a quantity fixed by construction (exact byte counts, the simulated clock's speedups, code
  invariants: the claim's `by_design` says why); evaluated and shown, never counted as support;
- **not run**: its table, profile, cells or methods are not in the outputs.

EFFECTS. A form turns a claim into comparisons (each all must hold), each an effect per cell, computed per seed
over the seeds its values share (paired: seed s draws one partition and initialisation for every method; the
table's `repro_seeds` column, "seed:value;...", or `<column>_seeds` for another column), pooled over the cells
(the mean of the cells' means; a stratified bootstrap over seeds gives the interval). Values without per-seed
entries carry their std over `seeds` (or, for the papers' printed numbers, over the file's `paper_seeds`, default
3) and get a delta-method t interval. `noise: none` values are exact.

Forms (fields beyond the common ones; a *ref* is a method name or a mapping of column filters,
optionally with `column:`/`std:` to read another value column, e.g. `{tau: 3}` or
`{column: last local model}`):

- `order`      a > b (b may be a list: a > each, one comparison per b), optionally `by:` a margin in the column's
               units (a negative `by` reads "as good as": a > b - margin). Effect: a - b.
- `order_all`  every ref in `above` > every ref in `below` in a cell (`pairs: any`: at least one pair): one paired
               comparison per pair, each pooled over the cells; a pair fails the claim only at the Bonferroni level
               over the pairs (`any`: one pair holds at that level).
- `best`       a (or the best of a list, by its mean) beats every other method of the cell, or of `among` (minus
               `exclude`): one paired comparison per competitor (a - b per seed), all must hold, one decidedly
               against at the Bonferroni level over the competitors fails it; the effect shown is the closest
               competitor's. (Not "a minus each seed's best competitor": the maximum of several noisy competitors is
               above each of them, and would fail a method level with them.) Competitors the paper's own table has
               that did not run here make a holding claim `partial`.
- `trend`      a series along an ordered column (`along:` setting by default; `order:` the values, or the values
               present sorted by the number in them) is `increasing`, `decreasing` or has an interior `peak`; one
               series per ref in `series` (default: each method present), or, along `method`, one per cell. The
               series are pooled like cells. Increasing/decreasing: the effect is last - first (in the direction),
               and with `steps: all` (default) no single step may be decidedly against the direction (a guard at
               the Bonferroni level); `steps: ends`: the ends only ("tends to"). Peak: the highest interior point
               (by its mean) minus the higher end of the seed; a monotone series fails it.
- `ratio`      num / den (num may be a list: one comparison each), or a column that already is a ratio (`value:`
               ref, e.g. a speedup), against `at_least` and/or `at_most` (both: a band).
- `near`       a quantity within `tolerance` of a printed number: `value` (each cell against its `paper` column),
               `diff` (a - b), `ratio` (a / b) or `margin` (a - the other method with the best mean, paired over
               seeds) against `target`; diff,
               ratio and margin must also be on the target's side of 0 (ratio: of 1).

Common fields: id, quote (verbatim; a sentence broken by a table in the source joins its parts with
"[...]"), section, where {stage, table}, form, column (default `reproduced`), std (default
`repro_std` for `reproduced`, `<column>_std` otherwise), select {column: value or list} (the cells a claim is about;
default all), group_by (cell keys; default the key columns dataset/setting/panel/metric/method present and not used
by the refs), quantifier over cells (`all` default, `most` = the pooled effect alone, `any` = one cell at the
Bonferroni level), aggregate (`mean`: the pooled effect alone, as `most`; `max`: the cell with the largest effect,
alone), better (`higher` default / `lower`), noise (`seeds` default / `none` for exact measurements: bytes, MACs),
missing (`skip` default; `worst` or `fails`: a blank value, e.g. a target never reached, counts as the worst
possible value, so the method lost), profiles (run only on these profiles' outputs), paper_datasets (the datasets
the paper's sentence is about; other datasets are reported as a stand-in), paper_view (how the claim reads
`paper_numbers/` for the self-check, or false), note, paper_inconsistent (where the paper's own numbers contradict
its sentence: said, not hidden), by_design (why the quantity is fixed by construction), headline (an abstract or
main 'best' claim: listed first). `min_gap` (an assumed noise, no longer used) is accepted in old files.

`check(source="paper")` evaluates the same claims on the paper's own printed numbers
(`paper_numbers/<paper_table>.csv` of the stage's params file, or `paper_numbers/<stage>.csv` for a stage
not built yet; its printed std over `paper_seeds` where it has one, else the point values alone): a claim that
fails there is either mis-encoded or marked `paper_inconsistent`, and one so marked must not hold there
(tests/test_claims.py). Every reproduced row carries that paper-side effect and verdict.

The package by concern: `loading` (the files and their validation), `effects` (a cell's value, an effect per seed),
`cells` (reading a claim's cells from its table), `forms` (a claim's comparisons), `judging` (verdicts, power, what
would decide, independence), `kernel` (verdicts that another kernel path of the CPU moves), `output` (summary, text,
markdown, the `claims` verb). `CLAIMS_DIR` is read at call
time from `loading` (a test points `claims.loading.CLAIMS_DIR` at a fake paper's files).
"""
from __future__ import annotations

from . import cells, effects, forms, judging, kernel, loading, output  # noqa: F401  (the modules, by concern)
from .loading import (ClaimsError, CLAIMS_DIR, REPO_ROOT, VERDICTS, FORMS, CHOICES, COMMON, TOP, KEY_COLUMNS,
                      ACCURACY_COLUMNS, ROBUST_COLUMN, SMALL_TEST, DEFAULT_PAPER_SEEDS, claims_files, load, _validate)
from .effects import Val, Comparison, effect, _fmt, _parse_seeds
from .cells import Evaluator, NotRun
from .forms import EVALUATORS
from .judging import (Judgement, EMPTY_ROW, MAX_SEEDS, check, evaluate, judge, paper_check, paper_view_table,
                      power_at_three_seeds, seeds_needed, what_would_decide, independence, _claim_power,
                      _paper_table_name, _results_root, _undecided_by_power)
from .output import (summary, independent_tests, headline, paper_text, format_text, esc, to_markdown, cli,
                     add_arguments, run_cli, _flags)
