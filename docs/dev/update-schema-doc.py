#!/usr/bin/env python3
"""Regenerates the column tables of docs/schema.md from `zcta schema`.

usage: docs/dev/update-schema-doc.py [ZCTA_BINARY]   (default: target/debug/zcta)

Each "## `table`" section of docs/schema.md starts with its column table; that table
is replaced by the one `zcta schema` prints for the table. The prose around the
tables is kept. A table `zcta schema` knows that the document lacks is reported, not
added (where it goes is a writer's choice).
"""
import re
import subprocess
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
binary = sys.argv[1] if len(sys.argv) > 1 else str(root / "target" / "debug" / "zcta")
out = subprocess.run([binary, "schema"], check=True, capture_output=True, text=True).stdout

tables = {}
for m in re.finditer(r"^## `([a-z_]+)`\n\n((?:\|.*\n)+)", out, re.M):
    tables[m.group(1)] = m.group(2)

doc_path = root / "docs" / "schema.md"
doc = doc_path.read_text()
missing = []
for name, table in tables.items():
    pat = re.compile(r"(^## `" + re.escape(name) + r"`\n\n)((?:\|.*\n)+)", re.M)
    if not pat.search(doc):
        missing.append(name)
        continue
    doc = pat.sub(lambda m: m.group(1) + table, doc, count=1)
doc_path.write_text(doc)
if missing:
    sys.exit("docs/schema.md has no section for: " + ", ".join(missing))
