"""Render alerts/gpuq.rules.yml as a Prometheus Operator PrometheusRule.

    python alerts/render.py            # write deploy/helm/gpuq/files/prometheusrule.yaml (`make alerts`)
    python alerts/render.py --check    # exit 1 if the committed rendering is stale

A script, not part of the installed packages: the rules file is the source, the rendering is
derived from it and committed for the Helm chart (which includes it with ``.Files.Get``; never pass
it through ``tpl``, the ``{{ }}`` in it are Prometheus templates).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "alerts" / "gpuq.rules.yml"
OUTPUT = REPO / "deploy" / "helm" / "gpuq" / "files" / "prometheusrule.yaml"
HEADER = ("# Generated from alerts/gpuq.rules.yml by `make alerts` (alerts/render.py): do not edit.\n"
          "# tests/test_alerts.py fails when it is stale.\n")


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(rules_text: str) -> str:
    rules = yaml.safe_load(rules_text)
    doc: dict[str, Any] = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpuq",
            "labels": {"app.kubernetes.io/name": "gpuq", "app.kubernetes.io/component": "alerts"},
        },
        "spec": {"groups": rules["groups"]},
    }
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed rendering is stale")
    args = ap.parse_args(argv)
    text = render(RULES.read_text())
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(REPO)} is stale: run `make alerts` and commit it", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
