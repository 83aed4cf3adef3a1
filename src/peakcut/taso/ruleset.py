"""The rule set file: verified substitutions as versioned JSON (one rule a line), written by
`python -m bench.taso` and read by whatever applies them; the package ships it as rules.json.

A rule holds its two graphs as term text ("mm(a, t(c))": op keys of the header's "ops"
table, which gives each key's ATen op and parameters), the symbolic shapes of its inputs (its
shape condition: any sizes of the terms m, n, k; "1" is a broadcast dim), and whether it is
exact in floating point (neither side adds, multiplies or reduces) or holds over the reals
(then equal within the dtype's rounding). src reads every input dst reads; when both read the same inputs the
rule applies both ways ("both_ways").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from peakcut.taso.ops import OPS, Shape
from peakcut.taso.term import Term, input_names, parse, text

VERSION = 1
FILE = "rules.json"


@dataclass(frozen=True)
class Rule:
    """One verified substitution: src and dst compute the same function of `inputs`."""

    name: str
    src: Term
    dst: Term
    inputs: Mapping[str, Shape]
    float_exact: bool

    def describe(self) -> str:
        return f"{self.name}: {text(self.src)} => {text(self.dst)}"

    @property
    def both_ways(self) -> bool:
        return input_names(self.src) == input_names(self.dst)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "src": text(self.src), "dst": text(self.dst),
            "inputs": {k: [list(d) for d in s] for k, s in sorted(self.inputs.items())},
            "float_exact": self.float_exact, "both_ways": self.both_ways,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Rule:
        try:
            inputs = {str(k): (tuple(v[0]), tuple(v[1])) for k, v in data["inputs"].items()}
            rule = Rule(str(data["name"]), parse(data["src"]), parse(data["dst"]),
                        inputs, bool(data["float_exact"]))
        except (KeyError, TypeError, IndexError) as e:
            raise ValueError(f"malformed rule {data.get('name', '?')!r}: {e}") from e
        missing = set(input_names(rule.src)) - set(inputs)
        if missing:
            raise ValueError(f"rule {rule.name!r}: inputs {sorted(missing)} have no shape")
        return rule


@dataclass(frozen=True)
class RuleSet:
    """The rules, with how they were generated (`generator`) and the counts of each step."""

    rules: Sequence[Rule]
    generator: Mapping[str, Any] = field(default_factory=dict)
    counts: Mapping[str, Any] = field(default_factory=dict)
    version: int = VERSION


def dumps(rs: RuleSet) -> str:
    """The JSON text: header keys sorted, then one rule a line (small diffs on regeneration)."""
    ops = {o.key: {"aten": o.aten, "arity": o.arity, "params": dict(o.params)} for o in OPS}
    head = json.dumps({"version": rs.version, "generator": rs.generator, "counts": rs.counts,
                       "ops": ops}, sort_keys=True)
    lines = ",\n".join(json.dumps(r.to_json(), sort_keys=True) for r in rs.rules)
    return head[:-1] + ', "rules": [\n' + lines + "\n]}\n"


def loads(text_: str, where: str = "rule set") -> RuleSet:
    try:
        data = json.loads(text_)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e})") from e
    version = data.get("version") if isinstance(data, dict) else None
    if version != VERSION:
        raise ValueError(f"{where}: version {version!r}, this peakcut reads version {VERSION}")
    return RuleSet([Rule.from_json(r) for r in data.get("rules", [])],
                   data.get("generator", {}), data.get("counts", {}), version)


def save(rs: RuleSet, path: str | Path) -> None:
    Path(path).write_text(dumps(rs))


def load(path: str | Path | None = None) -> RuleSet:
    """The rule set at `path`, or the one the package ships (rules.json) when None."""
    if path is None:
        source = resources.files("peakcut.taso").joinpath(FILE)
        return loads(source.read_text(), f"peakcut/taso/{FILE}")
    return loads(Path(path).read_text(), str(path))
