"""What scripts/gpu_bundle.sh (`make gpu-bundle`) carries to a GPU node that has no network: the wheels of the
dependency tree pip resolved for the node's platform (``pins``), less the big ones the node's image already
holds (``trim``: each one left out is printed, with what needs it and in which versions, because the node's
version may not fit), within a size limit (a lent machine takes 64 MiB of working tree in all).

Small wheels are carried even when the node has the package: pip installs one only if the node's version does
not satisfy the tree (pip install --no-index --find-links, as the check's deps step runs it). Standard library
only: ``python -m horovod_train.gpucheck.bundle pins|trim ...``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

SMALL_BYTES = 2**20  # carried even when the node has the package: version insurance at little cost
MIB = 2**20


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_names(path: Path) -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {normalized(line) for line in lines if line}


def installs(report: Path) -> list[dict[str, Any]]:
    """The packages of pip's --report (``pip install --dry-run --ignore-installed --report``)."""
    return [item["metadata"] for item in json.loads(report.read_text())["install"]]


def pins(report: Path) -> list[str]:
    return [f"{meta['name']}=={meta['version']}" for meta in installs(report)]


def requirements_on(report: Path, name: str) -> list[str]:
    """What the tree asks of package ``name`` ("datasets: pyarrow>=24.0.0"), markers for extras left out."""
    found = []
    for meta in installs(report):
        for requirement in meta.get("requires_dist", []):
            spec, _, marker = requirement.partition(";")
            match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(\[[^]]*])?\s*\(?([^)]*)\)?", spec)
            if match and normalized(match[1]) == name and "extra" not in marker:
                found.append(f"{meta['name']}: {match[1]}{match[3].strip() or ' (any version)'}")
    return found


def wheel_name(path: Path) -> str:
    """The distribution a wheel or sdist file holds (its name before the version)."""
    return normalized(re.split(r"-\d", path.name, maxsplit=1)[0])


def left_out(dest: Path, on_node: set[str], carried: set[str], small_bytes: float = SMALL_BYTES) -> list[Path]:
    """The wheels of packages the node has, but those under ``small_bytes`` and those asked for."""
    return [
        path
        for path in sorted(dest.glob("*.whl"))
        if wheel_name(path) in on_node and wheel_name(path) not in carried and path.stat().st_size >= small_bytes
    ]


def trim(args: argparse.Namespace) -> int:
    on_node, carried = read_names(args.on_node), {normalized(n) for n in args.carry.split()}
    for path in left_out(args.dest, on_node, carried, args.small_mib * MIB):
        needs = "; ".join(requirements_on(args.report, wheel_name(path))) or "no version of it (outside extras)"
        size = path.stat().st_size / MIB
        print(f"[bundle] left out {path.name} ({size:.1f} MiB): the node has {wheel_name(path)} "
              f"({args.on_node.name}); the tree asks {needs}. If the node's version does not fit (the check's "
              f"environment step prints it), carry it: HVT_BUNDLE_WITH={wheel_name(path)}")  # fmt: skip
        path.unlink()
    files = sorted(args.dest.iterdir(), key=lambda p: p.stat().st_size)
    for path in files:
        print(f"{path.stat().st_size / MIB:8.1f} MiB  {path.name}")
    total = sum(p.stat().st_size for p in files)
    print(f"[bundle] {args.dest}: {total / MIB:.1f} MiB in {len(files)} files (limit {args.max_mib:g} MiB)")
    if total > args.max_mib * MIB:
        print(f"error: the bundle is {total / MIB:.1f} MiB, over {args.max_mib:g} MiB; fix: carry less "
              "(HVT_BUNDLE_WITH), or raise HVT_BUNDLE_MAX_MIB and carry it alone", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m horovod_train.gpucheck.bundle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    pin = commands.add_parser("pins", help="name==version of every package in pip's report")
    pin.add_argument("report", type=Path)
    cut = commands.add_parser("trim", help="leave out the big wheels the node has; sizes; the limit")
    cut.add_argument("dest", type=Path)
    cut.add_argument("--report", type=Path, required=True)
    cut.add_argument("--on_node", type=Path, required=True, help="the node's packages, one pip name a line")
    cut.add_argument("--carry", default="", help="names to carry even though the node has them")
    cut.add_argument("--max_mib", type=float, default=50.0)
    cut.add_argument("--small_mib", type=float, default=SMALL_BYTES / MIB,
                     help="wheels under this are carried even when the node has the package (0: none)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "pins":
        print("\n".join(pins(args.report)))
        return 0
    return trim(args)


if __name__ == "__main__":
    sys.exit(main())
