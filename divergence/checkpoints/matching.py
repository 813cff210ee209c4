"""Pairing the tensors of two checkpoints by name.

Names are normalized in three steps before they are matched:

1. wrapper components that never name a real module are dropped wherever they occur:
   ``_orig_mod`` (torch.compile), ``_fsdp_wrapped_module`` (FSDP),
   ``_checkpoint_wrapped_module`` (activation checkpointing), and reported with the stripped
   prefix of step 2 (``stripped_a``: ``_orig_mod.`` for a compiled model's state dict); a file
   holding two names that become one (``w`` and ``_orig_mod.w``) is refused, as a ``--map`` that
   renames two tensors to one is;
2. a leading component that every name on one side shares (``model.`` from a Lightning
   module, ``module.`` from DDP, ``unet.``) is stripped from that side when doing so matches
   more names with the other side; repeated while it helps;
3. explicit ``--map PATTERN=REPLACEMENT`` rules (Python regular expressions) rename the
   tensors of both sides.

Names that match an ``--exclude PATTERN`` (a Python regular expression, found anywhere in
the normalized name with ``re.search``) are set aside before anything else is checked and
returned as skipped. Names present on one side only, and pairs whose shapes differ, are an
error listing the first few and the count, unless ``intersection=True``: then they are
returned as skipped. Entries a reader found that are not tensors (``TensorSource.skipped``: a
module's ``_extra_state`` in a ``.ckpt``) are returned as skipped too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from divergence.checkpoints.source import TensorSource
from divergence.errors import CheckpointError, UserInputError

WRAPPER_COMPONENTS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
_SHOW = 5


@dataclass
class Match:
    """Matched tensor names: ``pairs`` as (name, name in A, name in B), plus what was skipped."""

    pairs: list[tuple[str, str, str]]
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    shape_mismatch: list[tuple[str, tuple, tuple]] = field(default_factory=list)
    excluded: list[tuple[str, str]] = field(default_factory=list)  # (name, the pattern it matched)
    not_tensors: list[tuple[str, str, str]] = field(default_factory=list)  # (name, side, type) the readers left out
    stripped_a: str = ""
    stripped_b: str = ""

    @property
    def skipped(self) -> list[dict]:
        return (
            [{"name": n, "reason": "only in A"} for n in self.only_a]
            + [{"name": n, "reason": "only in B"} for n in self.only_b]
            + [{"name": n, "reason": f"shape {list(sa)} in A, {list(sb)} in B"} for n, sa, sb in self.shape_mismatch]
            + [{"name": n, "reason": f"excluded by --exclude {p}"} for n, p in self.excluded]
            + [{"name": n, "reason": f"in {side}: a {kind}, not a tensor"} for n, side, kind in self.not_tensors]
        )


def parse_maps(rules, flag: str = "--map") -> list[tuple[re.Pattern, str]]:
    """Renaming rules as ``(compiled pattern, replacement)``, from ``["PATTERN=REPLACEMENT", ...]``,
    ``{pattern: replacement}`` or ``(pattern, replacement)`` pairs; a bad rule is a UserInputError
    naming ``flag`` (``maps`` for the Python API)."""
    compiled = []
    for rule in rules.items() if isinstance(rules, dict) else rules or []:
        if isinstance(rule, str):
            if "=" not in rule:
                raise UserInputError(f"{flag} {rule!r}: expected PATTERN=REPLACEMENT, e.g. 'attn\\.q=attn.to_q'")
            rule = rule.split("=", 1)
        pattern, replacement = rule
        try:
            compiled.append((re.compile(pattern), replacement))
        except re.error as err:
            raise UserInputError(f"{flag}: {pattern!r} is not a valid regular expression ({err})") from None
    return compiled


def match_tensors(
    a: TensorSource, b: TensorSource, maps=None, intersection: bool = False, exclude: list[str] | None = None
) -> Match:
    rules = parse_maps(maps)
    excludes = []
    for pattern in exclude or []:
        try:
            excludes.append(re.compile(pattern))
        except re.error as err:
            raise UserInputError(f"--exclude {pattern!r}: not a valid regular expression ({err})") from None
    names_a, names_b = _without_wrappers(a), _without_wrappers(b)
    names_a, names_b, stripped_a, stripped_b = _strip_common_prefixes(names_a, names_b)
    names_a, names_b = _apply_maps(names_a, rules, a), _apply_maps(names_b, rules, b)
    match = Match(pairs=[], stripped_a=_wrappers(a.names) + stripped_a, stripped_b=_wrappers(b.names) + stripped_b)
    match.not_tensors = [(n, side, k) for side, s in (("A", a), ("B", b)) for n, k in s.skipped.items()]
    for name in list(dict.fromkeys([*names_a, *names_b])):  # set aside before anything is checked
        pattern = next((p for p in excludes if p.search(name)), None)
        if pattern is not None:
            match.excluded.append((name, pattern.pattern))
            names_a.pop(name, None)
            names_b.pop(name, None)
    for name, original_a in names_a.items():
        if name not in names_b:
            match.only_a.append(name)
            continue
        original_b = names_b[name]
        shape_a, shape_b = a.info(original_a).shape, b.info(original_b).shape
        if shape_a != shape_b:
            match.shape_mismatch.append((name, shape_a, shape_b))
        else:
            match.pairs.append((name, original_a, original_b))
    match.only_b = [n for n in names_b if n not in names_a]
    if not intersection:
        check_complete(match, a, b)
    if not match.pairs and match.excluded:
        raise UserInputError(f"--exclude leaves no tensor to compare ({len(match.excluded)} excluded)")
    if not match.pairs:
        raise CheckpointError(f"{a.path} and {b.path}: no tensor names in common; are these the same model?")
    return match


def _without_wrappers(source: TensorSource) -> dict:
    """``{name without wrapper components: original name}``; two names that become one (``w`` and
    ``_orig_mod.w`` in one file) are refused, as ``--map`` renaming two tensors to one is: keeping
    either would compare a tensor chosen by key order."""
    names: dict[str, str] = {}
    for original in source.names:
        name = ".".join(p for p in original.split(".") if p not in WRAPPER_COMPONENTS)
        if name in names:
            raise CheckpointError(
                f"{source.path}: holds both {names[name]!r} and {original!r}, which are the same tensor "
                f"{name!r} once wrapper components ({', '.join(WRAPPER_COMPONENTS)}) are dropped; "
                "save one model's state dict per file"
            )
        names[name] = original
    return names


def _wrappers(names) -> str:
    """The wrapper components dropped from ``names``, reported as a stripped prefix is (``_orig_mod.``)."""
    found = {p for name in names for p in name.split(".") if p in WRAPPER_COMPONENTS}
    return "".join(f"{w}." for w in WRAPPER_COMPONENTS if w in found)


def _strip_common_prefixes(names_a: dict, names_b: dict):
    """Strip shared leading components from one or both sides while that increases the overlap."""
    stripped_a = stripped_b = ""
    while True:
        prefix_a, prefix_b = _common_first_component(names_a), _common_first_component(names_b)
        cut_a, cut_b = _cut(names_a, prefix_a), _cut(names_b, prefix_b)
        overlap = len(names_a.keys() & names_b.keys())
        options = [
            (cut_a, names_b, prefix_a, None),
            (names_a, cut_b, None, prefix_b),
            (cut_a, cut_b, prefix_a, prefix_b),
        ]
        best = max(
            options, key=lambda o: len(o[0].keys() & o[1].keys()) if o[0] is not None and o[1] is not None else -1
        )
        if best[0] is None or best[1] is None or len(best[0].keys() & best[1].keys()) <= overlap:
            return names_a, names_b, stripped_a, stripped_b
        names_a, names_b = best[0], best[1]
        stripped_a += f"{best[2]}." if best[2] else ""
        stripped_b += f"{best[3]}." if best[3] else ""


def _cut(names: dict, prefix: str | None) -> dict | None:
    if prefix is None:
        return None
    return {n[len(prefix) + 1 :]: o for n, o in names.items()}


def _common_first_component(names: dict) -> str | None:
    firsts = {n.split(".", 1)[0] for n in names}
    if len(firsts) == 1 and all("." in n for n in names):
        return firsts.pop()
    return None


def _apply_maps(names: dict, rules, source: TensorSource) -> dict:
    renamed = {}
    for name, original in names.items():
        new = name
        for pattern, replacement in rules:
            new = pattern.sub(replacement, new)
        if new in renamed:
            raise UserInputError(f"{source.path}: --map renames both {renamed[new]!r} and {original!r} to {new!r}")
        renamed[new] = original
    return renamed


def check_complete(
    match: Match,
    a: TensorSource,
    b: TensorSource,
    what: str = "the checkpoints",
    fix: str = "Use --map PATTERN=REPLACEMENT for renamed tensors or --intersection to compare the common ones",
) -> None:
    """Names only one side has, or shapes that differ (first few named), are an error that ends with ``fix``."""
    problems = []
    if match.only_a:
        problems.append(f"{len(match.only_a)} only in {a.path} ({_first(match.only_a)})")
    if match.only_b:
        problems.append(f"{len(match.only_b)} only in {b.path} ({_first(match.only_b)})")
    if match.shape_mismatch:
        shown = ", ".join(f"{n} {list(sa)} vs {list(sb)}" for n, sa, sb in match.shape_mismatch[:_SHOW])
        problems.append(f"{len(match.shape_mismatch)} with different shapes ({shown})")
    if problems:
        raise CheckpointError(f"{what} do not match: " + "; ".join(problems) + f". {fix}")


def _first(names: list[str]) -> str:
    more = f", ... {len(names) - _SHOW} more" if len(names) > _SHOW else ""
    return ", ".join(names[:_SHOW]) + more
