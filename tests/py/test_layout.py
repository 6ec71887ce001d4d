#!/usr/bin/env python3
"""The layout rules of CONTRIBUTING.md (scripts/check_layout.py): folder graph, function
and file lengths. Fails with the script's list of violations."""
import os
import subprocess
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
r = subprocess.run([sys.executable, "scripts/check_layout.py"], cwd=root, text=True,
                   capture_output=True)
print(r.stdout, end="")
print(r.stderr, end="", file=sys.stderr)
sys.exit(0 if r.returncode == 0 else 1)
