"""Summarise the suite's compile profile (tests/conftest.py's CompileProfile).

Run the suite with DYNJAX_COMPILE_PROFILE=PREFIX, then
``python scripts/compile_profile.py PREFIX [--top N]``: compile (or cache load) seconds per
test file, per test and per program name, largest first.
"""
from dynjax.runtime import setup  # one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse  # noqa: E402
import collections  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", help="the DYNJAX_COMPILE_PROFILE value the suite ran with")
    ap.add_argument("--top", type=int, default=25, help="rows per table")
    args = ap.parse_args()
    tests = {}
    for path in glob.glob(f"{args.prefix}.*.json"):
        with open(path) as f:
            tests.update(json.load(f))
    files, programs = collections.Counter(), collections.Counter()
    for node, t in tests.items():
        files[node.split("::")[0]] += t["compile_s"]
        for name, s in t["programs"].items():
            programs[name] += s
    total = sum(t["compile_s"] for t in tests.values())
    print(f"compile or cache load: {total:.1f} s, {sum(t['compiles'] for t in tests.values())} "
          f"programs, {sum(t['cache_hits'] for t in tests.values())} from the cache; trace and "
          f"lower {sum(t.get('trace_lower_s', 0) for t in tests.values()):.1f} s")
    for title, rows in (("file", files.most_common(args.top)),
                        ("test", sorted(((n, t["compile_s"]) for n, t in tests.items()),
                                        key=lambda r: -r[1])[:args.top]),
                        ("program", programs.most_common(args.top))):
        print(f"\n{'seconds':>8}  {title}")
        for name, s in rows:
            print(f"{s:8.1f}  {name}")


if __name__ == "__main__":
    main()
