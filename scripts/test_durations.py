"""Write tests/durations.json, the seconds each test file took, from a suite run's JUnit XML.

    bash scripts/test.sh --junitxml=/tmp/suite.xml
    python scripts/test_durations.py /tmp/suite.xml

The suite runs on two workers a whole file at a time; tests/conftest.py hands out the files
longest first from this record (longest-processing-time order), so that no long file starts
last while the other worker idles. A file the record lacks goes first (it may be long).
"""
from dynjax.runtime import setup  # one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import xml.etree.ElementTree as ET  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "durations.json")


def file_seconds(paths) -> dict:
    """{test file relative to the repo: seconds} summed over its test cases (set-up, call
    and tear-down: JUnit's per-case time)."""
    seconds = collections.Counter()
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            module = case.get("classname", "").split(".")
            while module and not module[-1].startswith("test_"):
                module.pop()          # a test class: the file is the module above it
            if module:
                seconds["/".join(module) + ".py"] += float(case.get("time", 0.0))
    return dict(seconds)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", nargs="+", help="JUnit XML files of one suite run")
    args = ap.parse_args()
    seconds = file_seconds(args.junit)
    record = {"command": "bash scripts/test.sh --junitxml=suite.xml && "
                         "python scripts/test_durations.py suite.xml",
              "seconds": {k: round(v, 1) for k, v in sorted(seconds.items())}}
    tmp = OUT + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(tmp, OUT)
    print(f"{OUT}: {len(seconds)} files, {sum(seconds.values()):.0f} s")


if __name__ == "__main__":
    main()
