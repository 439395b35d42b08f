"""Write results/run_id_migration.json: each earlier cell and context hash of the given campaigns'
records mapped to the hash the current run spec gives the same config (`dcp_bench.run_ids`).

    python scripts/migrate_run_ids.py runs/reproduce results/cpu_train [--out PATH]

Every run folder (config.yaml and run.json) under the given folders is read; its config is parsed
as a sweep parses it and its recorded hashes are mapped to the parsed spec's (rerun it whenever
the run identity changes: the records read replace their entries, others are kept). An earlier
hash that would map to two current ones is refused. Records whose hashes are current add nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from dcp_bench.files import atomic_write_json
from dcp_bench.records import read_summary
from dcp_bench.run.spec import parse_run_spec
from dcp_bench.run_ids import MIGRATION_TABLE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=MIGRATION_TABLE)
    args = parser.parse_args(argv)
    kept: dict[str, dict[str, str]] = {"cells": {}, "contexts": {}}
    if args.out.exists():
        old = json.loads(args.out.read_text())
        kept = {"cells": dict(old["cells"]), "contexts": dict(old["contexts"])}
    table: dict[str, dict[str, str]] = {"cells": {}, "contexts": {}}
    runs = 0
    for folder in args.folders:
        for config in sorted(folder.rglob("config.yaml")):
            summary = read_summary(config.parent)
            if summary is None:
                continue
            spec = parse_run_spec(yaml.safe_load(config.read_text()), seed=summary.seed)
            runs += 1
            pairs = [("cells", summary.config_hash, spec.config_hash)]
            if summary.context is not None:
                pairs.append(("contexts", summary.context.context_hash, spec.context_hash))
            for kind, earlier, current in pairs:
                if earlier == current:
                    continue
                known = table[kind].setdefault(earlier, current)
                if known != current:
                    sys.stderr.write(
                        f"{config.parent}: {kind[:-1]} hash {earlier} maps to {known} and to "
                        f"{current}; refusing an ambiguous table\n"
                    )
                    return 1
    # the records read now decide their entries; entries of records not read are kept
    table = {kind: {**kept[kind], **table[kind]} for kind in table}
    atomic_write_json(
        args.out,
        {
            "about": "earlier run-id hashes of committed campaigns -> current ones "
            "(dcp_bench/run_ids.py; written by scripts/migrate_run_ids.py)",
            "cells": dict(sorted(table["cells"].items())),
            "contexts": dict(sorted(table["contexts"].items())),
        },
    )
    print(
        f"{runs} runs read; {len(table['cells'])} cell and {len(table['contexts'])} context hashes"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
