#!/usr/bin/env python3
"""Checks the layering of ../shared/DESIGN.md: a folder under src/ includes only from itself and
from lower layers. Usage: check_layers.py SRC_DIR. Exits 1 listing every violation."""
import pathlib
import re
import sys

LAYERS = {
    "base": 0, "tensor": 1, "kernels": 2, "comm": 2, "data": 2, "io": 2, "checkpoint": 3,
    "nn": 4, "optim": 4, "parallel": 5, "models": 6, "planner": 7, "serve": 7,
    "engine": 8, "cli": 9,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main() -> int:
    src = pathlib.Path(sys.argv[1])
    errors = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".h", ".cpp", ".cu", ".cuh"):
            continue
        folder = path.relative_to(src).parts[0]
        if folder not in LAYERS:
            errors.append(f"{path}: folder '{folder}' is not in the layer table")
            continue
        for inc in INCLUDE.findall(path.read_text()):
            target = inc.split("/")[0]
            if target not in LAYERS:
                continue  # a system or third-party header in quotes
            if target != folder and LAYERS[target] >= LAYERS[folder]:
                errors.append(f"{path}: includes \"{inc}\" — {target} (L{LAYERS[target]}) is not "
                              f"below {folder} (L{LAYERS[folder]})")
    for e in errors:
        print(e)
    print(f"layering: {len(errors)} violation(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
