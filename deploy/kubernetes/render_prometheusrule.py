#!/usr/bin/env python3
"""Write base/prometheusrule.yaml from deploy/prometheus/rules/tabletune.rules.yml.

The rules file is the one source: Prometheus reads it directly (systemd layout), and the
Prometheus Operator gets the same groups wrapped in a PrometheusRule. kustomize cannot embed a
file from outside its folder into a resource's spec, hence this small generator.

    python3 deploy/kubernetes/render_prometheusrule.py           # rewrite
    python3 deploy/kubernetes/render_prometheusrule.py --check   # exit 1 if out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE.parent / "prometheus" / "rules" / "tabletune.rules.yml"
OUTPUT = HERE / "base" / "prometheusrule.yaml"
HEADER = (
    "# GENERATED from deploy/prometheus/rules/tabletune.rules.yml by\n"
    "# deploy/kubernetes/render_prometheusrule.py: edit the rules file, then re-run it.\n"
    "# Your Prometheus selects PrometheusRules by label (ruleSelector): add yours below.\n"
)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(rules_text: str) -> str:
    groups: Any = yaml.safe_load(rules_text)["groups"]
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "tabletune", "labels": {"app.kubernetes.io/name": "tabletune"}},
        "spec": {"groups": groups},
    }
    body = yaml.dump(resource, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the output is stale")
    args = parser.parse_args(argv)
    wanted = render(RULES.read_text())
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != wanted:
            print(f"{OUTPUT} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
